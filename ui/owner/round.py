"""A training round, top to bottom in the order it happens, and what each of its jobs is given.

A round starts from a version v (the newest, or the best rated by people), trains a reward model
on a snapshot of the comparisons (or takes a chosen version), trains [round] candidates policies,
each with its own seed (by DPO a new adapter from v0 on every vote, [dpo] refit; by PPO or GRPO
from v), and lets a predictor rate their average (or each) against v by the reward model on fresh
answers to the held-back prompts. Their average, within the KL budget (pulled back into it where
past), is registered as v+1 ([round] register = "average"; or the candidate rated best, with
confidence or not, or none, and the votes carry over). Then completions of v (where it has
too few) and of v+1 on the held-back prompts, each of v+1's paired with one of v's for the
annotators: the votes on those pairs are the round's human win rate. Each step is a job, queued
when the one before it is done, so the app's job queue and `tether round` run a round the same
way: `start_round`, then `advance_round` after each of its jobs.

Every decision is made here: what the reward model trains on and whether it steers, which
optimiser runs, on which votes, from which version, and what the predictor is asked. Queuing and
running a job is ui.owner.jobs's; taking in what it made, the predictor's choice of the candidate to
keep among it, ui.owner.ingest's. The commands that queue one such job alone (`tether rm train`,
`ppo`, `dpo`, `grpo`, `generate`) are given it by the same functions as a round's.

When people rate a new version below a better one, the next round starts from the better one
([round] start_from = "best"), or `roll_back` (ui.owner.rollback) registers a copy of it by hand.
"""

import dataclasses
import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq

from annotate.agreement import FlipRate, project_flip_rate
from annotate.export import preference_rows, ranking_rows
from annotate.ratings import Game, bradley_terry, lead_probability, wilson_interval
from store import Connection, StoreError
from store.db import utcnow
from store.jobs import Job, get_job
from store.policies import POLICY_JOBS, dpo_jobs_behind, get_policy
from store.prompts import Prompt, prompts_to_generate
from store.reward_models import RewardModel, get_reward_model, list_reward_models, snapshot_path
from store.rounds import Candidate, Round, add_candidate, add_note, add_round, finish_round, get_round, round_candidates, set_choice
from store.stats import version_games
from store.votes import pairs_voted_by
from train.common.config import RewardModelConfig, data_seed
from train.common.snapshot import PreferenceRow, RankingRow, preference_table, ranking_table
from train.runtime.jobdir import input_path
from ui.owner.config import OPTIMIZERS, TetherConfig
from ui.owner.jobs import JobError, Run, run_here, submit
from ui.owner.project import Project, job_dir
from ui.owner.recovery import FEATURES_DIR
from ui.owner.rollback import roll_back

STAGES = {"reward_model": "reward model", "ppo": "PPO", "dpo": "DPO", "grpo": "GRPO", "predict": "predictor", "generate": "completions"}


class TooFewPairs(JobError):
    """A round's DPO on the votes alone would train on fewer pairs than [round] min_pairs: the round trains nothing."""


def start_round(project: Project, run: Run, reward_version: int | None = None, read: Run | None = None,
                optimizer: str | None = None) -> tuple[int, Job | None]:
    """Start a round with `optimizer` ([round] optimizer by default); return its id and its first job, None where it
    ended at once (too few pairs, 4.). The round reads in the order it happens:

    1. its start: the newest version, or with [round] start_from = "best" the version people rate best, once they rate
       it above the newest with confidence (`best_rated`): a copy of it is registered as the newest first, as a
       rollback does;
    2. its reward model: trained on every vote so far, unless given a version; where the votes hold nothing the newest
       version has not trained on, with the same settings, that version is reused, and the round says so;
    3. its optimiser: with 'auto', the one the reward model's trust allows (choose_optimizer);
    4. its candidates: [round] candidates policies, one initialisation, each its own data_seed, by the round's optimiser (with [round]
       register other than 'average', the first by it and the others by DPO) (advance_round): PPO and GRPO from the
       start, DPO from v0 on every vote ([dpo] refit) or from the start on the votes it has not learnt; none where
       DPO on the votes alone would have fewer than [round] min_pairs pairs: the round ends, and its votes carry over;
    5. the predictor: their average's win rate over the start by the reward model, or with [round] register other
       than 'average' each candidate's, a candidate past [round] kl_budget pulled back into it first
       (submit_prediction); the average registered as the next version, or with [round] register = 'confident' the
       candidate rated best with confidence, or none (ui.owner.ingest.ingest_prediction);
    6. its pairs: completions of the new version against the start's on the held-back prompts, for people to judge.

    `read` reads the votes beside the writer, as for submit_reward_training.
    """
    optimizer = optimizer or project.config.round.optimizer
    if optimizer not in OPTIMIZERS:
        raise StoreError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    if reward_version is not None:
        run(get_reward_model, reward_version)  # fails now, not after a round was recorded
    notes = []
    if reward_version is None:
        training = reward_training(project, run, read=read)
        if (reward_version := training.reusable_version) is not None:
            notes.append(f"reward model v{reward_version} reused: the votes hold nothing it did not train on")
    if project.config.round.start_from == "best" and (best := best_rated(run)) is not None:
        newest = run(get_policy, None).version
        confidence = lead_probability(run(version_games), best, newest)
        copy = roll_back(project, run, best)
        notes.insert(0, f"starts from v{best}, which people rate above the newest, v{newest}, with {confidence:.0%} confidence "
                        f"([round] start_from = \"best\"): a copy of it is v{copy.version}")
    policy = run(get_policy, None)
    round_ = run(add_round, policy.version, reward_version, optimizer, "; ".join(notes) or None)
    try:
        if round_.reward_version is None:
            return round_.id, submit_reward_training(project, run, round_id=round_.id, read=read, training=training)
        return round_.id, _after_reward_model(project, run, round_)
    except StoreError as e:
        run(finish_round, round_.id, "failed", utcnow(), str(e))
        raise


# 1. Its start


def best_rated(run: Run) -> int | None:
    """The version to start from under [round] start_from = "best": the best rated by people's votes, where they rate it
    above the newest with LEAD_CONFIDENCE; None where that is the newest, or the votes do not say so."""
    return rollback_target(run(version_games), run(get_policy, None).version)


LEAD_CONFIDENCE = 0.9  # how sure people's votes must make it that a version beats the newest, to go back to it
MIN_VOTES = 10  # a version's rating, or a round's win rate, counts from this many votes: fewer is noise


def rollback_target(games: list[Game], newest: int) -> int | None:
    """The best-rated version, when people rate the newest policy below it with LEAD_CONFIDENCE; each with
    MIN_VOTES votes or more. A lead of a few votes is noise: at 70% agreement, 10 votes on two
    equal versions split 7 to 3 one time in six."""
    votes = Counter(v for a, b, _ in games for v in (a, b))
    scores = {v: r for v, r in bradley_terry(games).items() if votes[v] >= MIN_VOTES}
    if newest not in scores:
        return None
    best = max(scores, key=scores.get)
    return best if best != newest and lead_probability(games, best, newest) >= LEAD_CONFIDENCE else None


# 2. Its reward model: what it trains on, and whether it steers


@dataclasses.dataclass(frozen=True)
class RewardTraining:
    """What a reward model of these settings would train on now, read once."""

    settings: RewardModelConfig
    flip: FlipRate  # measured from the votes
    rate: float  # the one in use
    rows: list[PreferenceRow]
    rankings: list[RankingRow]
    previous: dict[str, Any] | None  # _previous: the newest version, and what of these rows it has not seen

    @property
    def reusable_version(self) -> int | None:
        """The newest version when training now would give it nothing new: the same base and settings (trust aside),
        and no pair or ranking it did not train on."""
        previous = self.previous
        if previous is None or previous["new_pair_ids"] or previous["new_ranking_ids"]:
            return None
        return previous["version"] if _trains_as(previous["reward_model"]) == _trains_as(dataclasses.asdict(self.settings)) else None


def reward_training(project: Project, run: Run, include_imported: bool | None = None, read: Run | None = None) -> RewardTraining:
    reward = project.config.reward_model
    if include_imported is not None:
        reward = dataclasses.replace(reward, include_imported=include_imported)
    flip, rate, rows, rankings = _training_rows(reward, read or run)
    if not rows and not rankings:  # before a round is recorded: an operator's start refused changes nothing
        raise JobError(f"no resolved comparisons to train on yet: {_what_to_train_on(reward, read or run)}")
    previous = _previous(project, run, [r.pair_id for r in rows], [r.ranking_id for r in rankings])
    return RewardTraining(reward, flip, rate, rows, rankings, previous)


def submit_reward_training(
    project: Project, run: Run, include_imported: bool | None = None, round_id: int | None = None, read: Run | None = None,
    training: RewardTraining | None = None,
) -> Job:
    """Queue training a reward model of [reward_model] kind on a frozen snapshot of the project's resolved comparisons.

    Each row's label is right with the probability its votes give it at [reward_model] flip_rate (measured from the
    votes with 'auto'). A head ('head', 'auto') first measures the newest version's head on the votes it never saw,
    and reads each answer's features through the project's cache (features/). With [reward_model] warm_start, a
    LoRA model ('lora', 'auto') continues from the newest version's, training on the pairs its snapshot lacks plus a
    replay sample of those it has. `read`, where given, reads the comparisons beside the writer (the app's
    Server.snapshot): the read grows with the votes, and under the writer's lock it would hold up every annotator
    meanwhile. `training`, where given, is what reward_training has read already.
    """
    training = training or reward_training(project, run, include_imported, read)
    reward, previous = training.settings, training.previous
    config = {
        "model": dataclasses.asdict(project.config.model),
        "reward_model": dataclasses.asdict(reward),
        "flip_rate": {"rate": training.rate, "measured": dataclasses.asdict(training.flip), "setting": reward.flip_rate},
        "warm_start": _warm_start(project, reward, previous) if reward.warm_start and reward.kind != "head" else None,
        "previous": _of_kind(previous, "head") if reward.kind != "lora" else None,
        "features_cache": str(project.root / FEATURES_DIR) if reward.kind != "lora" else None,
    }
    inputs = {"preferences": preference_table(training.rows)} | ({"rankings": ranking_table(training.rankings)} if training.rankings else {})
    return submit(project, run, "reward_model", config, inputs, round_id)


def _training_rows(reward: RewardModelConfig, read: Run) -> tuple[FlipRate, float, list[PreferenceRow], list[RankingRow]]:
    """The flip rate measured, the one in use, and the rows and rankings a reward model of these settings trains on."""
    flip = read(project_flip_rate)
    rate = flip.rate if reward.flip_rate == "auto" else reward.flip_rate
    rows = read(preference_rows, reward.include_imported, reward.weight_by_trust, reward.ai_votes, reward.rankings, rate)
    rankings = read(ranking_rows) if reward.rankings == "plackett_luce" else []
    return flip, rate, rows, rankings


def _what_to_train_on(reward: RewardModelConfig, read: Run) -> str:
    """What would give training something, in words that name only settings and commands that exist."""
    advice = ["collect votes first"]
    if not reward.include_imported and (imported := read(pairs_voted_by, "import")):
        advice.append(f"set include_imported = true in [reward_model] of tether.toml to train on the {imported} imported "
                      "preference pairs")
    if reward.ai_votes == "off" and read(pairs_voted_by, "ai"):
        advice.append('set ai_votes = "include" or "weight" in [reward_model] of tether.toml to train on the AI judge\'s votes')
    return ", or ".join(advice)


def _trains_as(settings: dict[str, Any]) -> dict[str, Any]:
    """The [reward_model] settings that shape a version, as its job's config stores them: trust only decides its use."""
    return {k: v for k, v in json.loads(json.dumps(settings)).items() if k != "trust"}


ADAPTER_SETTINGS = ("heads", "lora_r", "lora_alpha", "lora_dropout", "target_modules")


def _previous(project: Project, run: Run, pair_ids: list[int], ranking_ids: list[int]) -> dict[str, Any] | None:
    """The newest version, what it was trained with, and the pairs and rankings of the snapshot it has not seen: for a
    head to be measured on, and a LoRA model to continue from. None when there is none, or it was trained on another
    base model."""
    newest = run(_newest_training)
    if newest is None:
        return None
    version, snapshot, job_config = newest
    if job_config is None or job_config["model"]["name_or_path"] != project.config.model.name_or_path:
        return None
    seen = _ids_in(project.root / snapshot, "pair_id", version.version)
    # Frozen beside it when that version fitted rankings whole; looked up by its job, as snapshots are shared by content.
    rankings = input_path(job_dir(project, version.metrics["job"]), "rankings") if "job" in version.metrics else None
    seen_rankings = _ids_in(rankings, "ranking_id", version.version) if rankings and rankings.exists() else set()
    return {"version": version.version, "version_dir": str(project.root / version.adapter_path), "reward_model": job_config["reward_model"],
            "new_pair_ids": [i for i in pair_ids if i not in seen], "new_ranking_ids": [i for i in ranking_ids if i not in seen_rankings]}


def _of_kind(previous: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    """The previous version's reward model of this kind ('head' or 'lora'), with what it has not seen; None without one."""
    if previous is None:
        return None
    trained = previous["reward_model"].get("kind", "lora")  # versions before heads were all LoRA models
    if trained not in (kind, "auto"):
        return None
    path = Path(previous["version_dir"]) / kind if trained == "auto" else Path(previous["version_dir"])
    return {"version": previous["version"], "adapter_path": str(path), "new_pair_ids": previous["new_pair_ids"],
            "new_ranking_ids": previous["new_ranking_ids"]}


def _warm_start(project: Project, reward: RewardModelConfig, previous: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a LoRA model continues from: the newest version's LoRA model and the pairs and rankings it has not seen.

    None, for training from scratch, when there is none, or it has another adapter shape than the settings now ask for.
    A LoRA model alone refuses to train again on the votes it has seen; beside a head ('auto') it starts from scratch.
    """
    lora = _of_kind(previous, "lora")
    if lora is None or any(previous["reward_model"].get(name) != getattr(reward, name) for name in ADAPTER_SETTINGS):
        return None
    if not lora["new_pair_ids"] and not lora["new_ranking_ids"]:
        if reward.kind == "auto":
            return None
        raise JobError(
            f"no new resolved comparisons since reward model v{lora['version']}: collect votes first, "
            "or set warm_start = false in [reward_model] of tether.toml to train again from scratch"
        )
    return lora


def _ids_in(path: Path, column: str, version: int) -> set[int]:
    """The ids in a column of what reward model `version` trained on."""
    try:
        return set(pq.read_table(path, columns=[column]).column(column).to_pylist())
    except (OSError, pa.ArrowException) as e:
        raise JobError(
            f"cannot read {path}, the snapshot reward model v{version} trained on ({' '.join(str(e).split())}): "
            "set warm_start = false in [reward_model] of tether.toml to train from scratch"
        ) from None


def _newest_training(con: Connection) -> tuple[RewardModel, str, dict[str, Any] | None] | None:
    """The newest reward model, the path of its snapshot, and the config of the job that trained it."""
    versions = list_reward_models(con)
    if not versions:
        return None
    newest = versions[0]
    job_id = newest.metrics.get("job")
    return newest, snapshot_path(con, newest.snapshot), get_job(con, job_id).config if job_id is not None else None


def _newest_reward_model(con: Connection) -> RewardModel | None:
    return get_reward_model(con) if list_reward_models(con) else None


def steers(reward_model: RewardModel, config: RewardModelConfig) -> bool:
    """Whether the reward model's judgement may choose pairs and rank answers ([reward_model] trust): always, or once the
    version it continued agreed with the votes cast after that version was trained at a 95% Wilson lower bound above 0.5."""
    accuracy, pairs = reward_model.metrics.get("new_votes_accuracy"), reward_model.metrics.get("new_votes_pairs")
    return config.trust == "always" or (accuracy is not None and bool(pairs) and wilson_interval(accuracy, pairs)[0] > 0.5)


KIND_NAMES = {"head": "a head on the base's frozen features", "lora": "a LoRA reward model"}


def scoring_kind(reward_model: RewardModel) -> str:
    """Which reward model scores for a version, and why, in words."""
    kind = reward_model.metrics.get("kind", "lora")  # versions before heads were all LoRA models
    if kind == "auto":
        return f"{KIND_NAMES[reward_model.metrics['steering']]} (kind \"auto\": {reward_model.metrics['steering_why']})"
    return f"{KIND_NAMES[kind]} (kind \"{kind}\")"


def trust_status(reward_model: RewardModel, config: RewardModelConfig) -> str:
    """Whether the version steers the loop ([reward_model] trust), and why, in words."""
    if config.trust == "always":
        return 'it steers the loop: [reward_model] trust = "always"'
    accuracy, pairs = reward_model.metrics.get("new_votes_accuracy"), reward_model.metrics.get("new_votes_pairs")
    if accuracy is None or not pairs:
        return "it does not steer the loop yet: no earlier version has been measured on votes it never saw"
    low = wilson_interval(accuracy, pairs)[0]
    measured = f"v{reward_model.metrics.get('new_votes_from')} agreed with {accuracy:.0%} of {pairs} votes it never saw (95% lower bound {low:.0%})"
    return f"it steers the loop: {measured}" if low > 0.5 else f"it does not steer the loop yet: {measured}, not above 50%"


# 3. Its optimiser


def _after_reward_model(project: Project, run: Run, round_: Round) -> Job | None:
    """The round's first candidate, once its reward model is known; with 'auto', after choosing the optimiser. None
    where DPO on the votes alone has too few pairs: the round ends, having trained nothing."""
    if round_.optimizer == "auto":
        optimizer, why = choose_optimizer(run(get_reward_model, round_.reward_version), project.config)
        run(set_choice, round_.id, optimizer, why)
        round_ = run(get_round, round_.id)
    try:
        return _submit_candidate(project, run, round_, 0)
    except TooFewPairs as e:
        run(add_note, round_.id, str(e))
        run(finish_round, round_.id, "done", utcnow())
        return None


AUTO_NOTE = "auto: "  # begins what choose_optimizer says


def choose_optimizer(reward_model: RewardModel, config: TetherConfig) -> tuple[str, str]:
    """What a round with [round] optimizer = 'auto' runs, and why in words: [round] trusted_optimizer against a reward
    model that steers ([reward_model] trust), DPO on the votes otherwise."""
    status = trust_status(reward_model, config.reward_model).removeprefix("it ")
    if not steers(reward_model, config.reward_model):
        return "dpo", f"{AUTO_NOTE}DPO on the votes, as reward model v{reward_model.version} {status}"
    chosen = config.round.trusted_optimizer
    if chosen == "dpo":
        return "dpo", (f'{AUTO_NOTE}DPO on the votes, as [round] trusted_optimizer = "dpo", '
                       f"though reward model v{reward_model.version} {status}")
    penalty = getattr(config, chosen).uncertainty_penalty
    return chosen, (f"{AUTO_NOTE}{chosen.upper()} against reward model v{reward_model.version}, which {status}; "
                    f"its reward is the heads' mean less {penalty:g} times their spread")


def chosen_by_auto(round_: Round) -> bool:
    return round_.note is not None and AUTO_NOTE in round_.note


# 4. Its candidates, and the votes each trains on


def _submit_candidate(project: Project, run: Run, round_: Round, number: int) -> Job:
    """Candidate `number` (from 0) of the round, from the round's start with that candidate's data_seed: by the round's
    optimiser where the round registers their average (alike adapters average well), else the first by it and the
    others by DPO, the cheapest, so that a PPO or GRPO round has an alternative at little cost."""
    optimizer = round_.optimizer if number == 0 or project.config.round.register == "average" else "dpo"
    if optimizer == "dpo":
        # DPO on the votes alone where 'auto' chose it (the reward model does not steer), or beside another optimiser.
        pairs = "human" if round_.optimizer != "dpo" or chosen_by_auto(round_) else None
        job = submit_dpo(project, run, round_.reward_version, round_.policy_from, round_.id, pairs=pairs, candidate=number,
                         min_pairs=project.config.round.min_pairs)
    else:
        job = SUBMIT_WITH_REWARD_MODEL[optimizer](project, run, round_.reward_version, round_.policy_from, round_.id, candidate=number)
    run(add_candidate, round_.id, job.id, optimizer, job.config[optimizer]["data_seed"])
    return job


CANDIDATE_SEED_STRIDE = 1000


def job_seed(seed: int, policy_version: int, candidate: int | None) -> int:
    """A policy job's seed: the setting's, offset by the version it starts from, so that each round draws its own prompt
    batches and samples, and by a round's candidate number, so that its candidates differ."""
    return seed + policy_version + CANDIDATE_SEED_STRIDE * (candidate or 0)


def submit_ppo(project: Project, run: Run, reward_version: int | None = None, policy_version: int | None = None,
               round_id: int | None = None, candidate: int | None = None) -> Job:
    """Queue PPO from a policy version against a reward model (the newest of each by default).

    PPO trains on the active prompts that rounds do not hold back for comparing policies. A round's
    candidate (numbered from 0) is kept in its job until the round's predictor chooses among them.
    """
    ppo = project.config.ppo

    def settings(version: int) -> dict[str, Any]:
        return {"ppo": dataclasses.asdict(ppo) | {"seed": job_seed(ppo.seed, version, None),
                                                  "data_seed": job_seed(data_seed(ppo), version, candidate),
                                                  "max_new_tokens": project.config.ppo_response_tokens()}}

    return _submit_on_prompts(project, run, "ppo", settings, reward_version, policy_version, round_id, candidate)


def submit_grpo(project: Project, run: Run, reward_version: int | None = None, policy_version: int | None = None,
                round_id: int | None = None, candidate: int | None = None) -> Job:
    """Queue GRPO from a policy version against a reward model (the newest of each by default), on the prompts PPO uses."""
    grpo = project.config.grpo

    def settings(version: int) -> dict[str, Any]:
        tokens = grpo.max_new_tokens or project.config.generation.max_new_tokens
        return {"grpo": dataclasses.asdict(grpo) | {"seed": job_seed(grpo.seed, version, None),
                                                    "data_seed": job_seed(data_seed(grpo), version, candidate), "max_new_tokens": tokens}}

    return _submit_on_prompts(project, run, "grpo", settings, reward_version, policy_version, round_id, candidate)


def _submit_on_prompts(project: Project, run: Run, kind: str, settings: Callable[[int], dict[str, Any]], reward_version: int | None,
                       policy_version: int | None, round_id: int | None, candidate: int | None) -> Job:
    """A policy job that samples the prompts rounds do not hold back and scores them with a reward model."""
    reward_model = run(get_reward_model, reward_version)
    policy = run(get_policy, policy_version)
    share = project.config.round.held_back_share
    prompts = [p for p in run(prompts_to_generate, policy.version, None) if not is_held_back(p, share)]
    config = {
        "model": dataclasses.asdict(project.config.model),
        **settings(policy.version),
        "reward_version": reward_model.version,
        "reward_adapter_path": str(project.root / reward_model.adapter_path),
        "policy_version": policy.version,
        "policy_adapter_path": str(project.root / policy.adapter_path) if policy.adapter_path else None,
        "candidate": candidate,
    }
    return submit(project, run, kind, config, {"prompts": _prompt_table(prompts)}, round_id)


SUBMIT_WITH_REWARD_MODEL = {"ppo": submit_ppo, "grpo": submit_grpo}


def submit_dpo(project: Project, run: Run, reward_version: int | None = None, policy_version: int | None = None,
               round_id: int | None = None, read: Run | None = None, pairs: str | None = None, candidate: int | None = None,
               min_pairs: int = 1) -> Job:
    """Queue DPO from a policy version (the newest by default) on a frozen snapshot of the project's resolved votes,
    on pairs a reward model (the newest by default) ranks, or on both, as `pairs` ([dpo] pairs by default) says; with
    'both', the ranked pairs join only once the reward model `steers`.

    Like PPO it leaves out the prompts that rounds hold back for comparing policies; with [dpo] refit (the default) it
    trains a new adapter from v0 on every vote, where there is one the policy's adapter has not trained on. Without it,
    with [dpo] votes = "new" it takes the votes the policy's adapter has not trained on (the DPO jobs behind it), with
    "latest" only those on pairs with a completion of that policy and imported ones ([reward_model]
    include_imported), and with "all" every vote, again each round. Each
    row carries the probability that its label is right, from which the worker sets [dpo] label_smoothing = "auto"
    (train.policy.dpo.label_smoothing). With [reward_model] flip_rate = "auto" that probability is taken at the least flip
    rate the votes allow (FlipRate.low), not at the estimate the reward model uses: robust DPO with a flip rate above
    the true one never stops pushing a pair's margin up, while with one below it the margin stops at a finite value.
    `read` reads the votes beside the writer, as for submit_reward_training. A round's candidate is kept as for
    submit_ppo. On the votes alone, fewer than `min_pairs` pairs is TooFewPairs.
    """
    dpo = dataclasses.replace(project.config.dpo, pairs=pairs or project.config.dpo.pairs)
    reward = project.config.reward_model
    policy = run(get_policy, policy_version)
    share = project.config.round.held_back_share
    prompts = run(prompts_to_generate, policy.version, None)
    held_back = {p.id for p in prompts if is_held_back(p, share)}
    rows = []
    if dpo.pairs != "reward_model":
        flip = (read or run)(project_flip_rate).low if reward.flip_rate == "auto" else reward.flip_rate
        learnt = set() if dpo.votes == "all" else _learnt_pair_ids(project, run, policy.version)
        votes = [r for r in (read or run)(preference_rows, reward.include_imported, False, reward.ai_votes, "pairs", flip)
                 if r.prompt_id not in held_back]
        rows = [r for r in votes if dpo.votes == "all" or r.pair_id not in learnt and (
            dpo.votes == "new" or r.chosen_policy is None or policy.version in (r.chosen_policy, r.rejected_policy))]  # None: imported
        if dpo.refit and rows:  # something new to learn: a new adapter from v0 learns it with every vote before it
            rows = votes
    reward_model = None if dpo.pairs == "human" else run(get_reward_model, reward_version)
    if dpo.pairs == "both" and not steers(reward_model, reward):
        reward_model = None  # the votes alone, until the reward model has shown it predicts new ones
    if not rows and reward_model is None:
        which = {"all": "", "new": f" that policy v{policy.version} has not trained on",
                 "latest": f" on policy v{policy.version}'s completions ([dpo] votes = \"latest\")"}[dpo.votes]
        raise JobError(f"no resolved votes{which} outside the held-back prompts to train on yet: {_what_to_train_on(reward, read or run)}")
    if reward_model is None and len(rows) < min_pairs:
        raise TooFewPairs(f"DPO on the votes would train on {len(rows)} pairs, fewer than [round] min_pairs = {min_pairs}: "
                          f"nothing trained, and the votes carry over to the next round")
    config = {
        "model": dataclasses.asdict(project.config.model),
        "dpo": dataclasses.asdict(dpo) | {"seed": job_seed(dpo.seed, policy.version, None),
                                          "data_seed": job_seed(data_seed(dpo), policy.version, candidate)},
        "policy_version": policy.version,
        "policy_adapter_path": str(project.root / policy.adapter_path) if policy.adapter_path else None,
        "candidate": candidate,
    }
    inputs = {"preferences": preference_table(rows)}
    if reward_model is not None:
        training = [p for p in prompts if p.id not in held_back]
        drawn = random.Random(job_seed(data_seed(dpo), policy.version, candidate)).sample(training, min(dpo.prompts, len(training)))
        inputs["prompts"] = _prompt_table(drawn)
        config |= {"generation": dataclasses.asdict(project.config.generation), "reward_model": dataclasses.asdict(reward),
                   "reward_version": reward_model.version, "reward_adapter_path": str(project.root / reward_model.adapter_path)}
    return submit(project, run, "dpo", config, inputs, round_id)


def _learnt_pair_ids(project: Project, run: Run, policy_version: int) -> set[int]:
    """The pairs a policy version's adapter has trained on: those of the DPO jobs behind it."""
    learnt: set[int] = set()
    for job_id in run(dpo_jobs_behind, policy_version):
        path = input_path(job_dir(project, job_id), "preferences")
        try:
            learnt |= set(pq.read_table(path, columns=["pair_id"]).column("pair_id").to_pylist())
        except (OSError, pa.ArrowException) as e:
            raise JobError(f"cannot read {path}, the pairs DPO job {job_id} trained policy v{policy_version}'s adapter on "
                           f"({' '.join(str(e).split())}): set votes = \"all\" in [dpo] of tether.toml") from None
    return learnt


# 5. The predictor (ui.owner.ingest.ingest_prediction registers what it chose)


def submit_prediction(project: Project, run: Run, round_: Round, candidates: list[Candidate]) -> Job:
    """Queue the round's predictor (train.policy.predict) on its candidates, or with [round] register = 'average' on their
    average alone: each one's win rate over the round's start by the round's reward model, on fresh answers of both to
    the first [round] predictor_prompts held-back prompts (by content, the same ones every round), [round]
    predictor_answers each, and its KL to v0."""
    settings = project.config.round
    start = run(get_policy, round_.policy_from)
    reward_model = run(get_reward_model, round_.reward_version)
    held_back = [p for p in run(prompts_to_generate, start.version, None) if is_held_back(p, settings.held_back_share)]
    prompts = sorted(held_back, key=lambda p: p.content_hash)[: settings.predictor_prompts]
    if not prompts:
        raise JobError(f"no active prompt is held back from training for the predictor to compare policies on "
                       f"([round] held_back_share = {settings.held_back_share}): add prompts")
    # One seed for every policy of the round: alike policies give alike answers, so their difference shows.
    generation = dataclasses.replace(project.config.generation, per_prompt=settings.predictor_answers, seed=round_.id)
    config = {
        "model": dataclasses.asdict(project.config.model),
        "generation": dataclasses.asdict(generation),
        "reward_model": dataclasses.asdict(project.config.reward_model),
        "reward_version": reward_model.version,
        "reward_adapter_path": str(project.root / reward_model.adapter_path),
        "start_version": start.version,
        "start_adapter_path": str(project.root / start.adapter_path) if start.adapter_path else None,
        "candidates": [{"job": c.job, "adapter_path": str(job_dir(project, c.job) / "policy")} for c in candidates],
        "average": settings.register == "average" and len(candidates) > 1,
        "kl_budget": settings.kl_budget,
        "confidence": settings.predictor_confidence,
        "draws": PREDICTOR_DRAWS,
        "seed": round_.id,
    }
    return submit(project, run, "predict", config, {"prompts": _prompt_table(prompts)}, round_.id)


PREDICTOR_DRAWS = 2000  # bootstrap draws of each candidate's win rate: its interval's ends move by under a point between runs


# 6. Its pairs, for people to judge


def _held_back(project: Project, run: Run, policy_version: int) -> list[Prompt]:
    share = project.config.round.held_back_share
    prompts = [p for p in run(prompts_to_generate, policy_version, None) if is_held_back(p, share)]
    if not prompts:
        raise StoreError(
            f"no active prompt is held back from PPO to compare policies on ([round] held_back_share = {share}): add prompts"
        )
    return prompts


def is_held_back(prompt: Prompt, share: float) -> bool:
    """Whether PPO leaves this prompt out, so that rounds compare policies on it; fixed by its content."""
    return int(prompt.content_hash[:8], 16) < share * 16**8


def prompts_to_pair(project: Project, run: Run, policy_version: int, limit: int | None = None) -> list[Prompt]:
    """The active prompts whose answers are paired for votes, those the version has answered least first: all but the
    held-back ones. No optimiser trains on a held-back prompt, so a vote on two answers of one version there would
    teach the policy nothing; at 48 votes a round it was a third of them (scripts/BENCHMARKS.md)."""
    share = project.config.round.held_back_share
    active = run(prompts_to_generate, policy_version, None)
    prompts = [p for p in active if not is_held_back(p, share)][:limit]
    if active and not prompts:
        raise JobError(f"every active prompt ({len(active)}) is held back to compare versions on ([round] held_back_share = "
                       f"{share}), and no policy trains on one: add prompts")
    return prompts


def _prompt_table(prompts: list[Prompt]) -> pa.Table:
    if not prompts:
        raise JobError("the project has no active prompts: add some with `tether prompts import FILE`")
    return pa.Table.from_pylist([{"prompt_id": p.id, "messages": json.dumps(p.messages)} for p in prompts])


def submit_generation(
    project: Project,
    run: Run,
    limit: int | None,
    per_prompt: int | None,
    policy_version: int | None = None,
    prompts: list[Prompt] | None = None,
    against: int | None = None,
    round_id: int | None = None,
) -> Job:
    """Queue sampling from the policy (the newest by default): for the given prompts, or the trained-on prompts it has
    sampled least (prompts_to_pair).

    The completions are paired within each prompt or, given `against`, each with one of that
    policy version's completions of its prompt; those of a held-back prompt only so. With the 'active' queue and a reward model that
    `steers`, the job also scores them, and a prompt's per_prompt / 2 pairs are chosen from
    `candidates` times as many answers (annotate.pairs.most_disputed). Otherwise, with [queue] answers_per_task
    K > 2, each prompt gets at least K completions, grouped into tasks to rank.
    """
    generation = project.config.generation
    if per_prompt is not None:
        generation = dataclasses.replace(generation, per_prompt=per_prompt)
    policy = run(get_policy, policy_version)
    if prompts is None:
        prompts = prompts_to_pair(project, run, policy.version, limit)
    unpaired = [] if against is not None else [p.id for p in prompts if is_held_back(p, project.config.round.held_back_share)]
    within = against is None and len(unpaired) < len(prompts)  # some answers are paired within their prompt
    queue = project.config.queue
    newest = run(_newest_reward_model) if queue.strategy == "active" else None
    reward_model = newest if newest and steers(newest, project.config.reward_model) else None
    pairs_per_prompt = None
    if reward_model is not None and within:
        pairs_per_prompt = max(1, generation.per_prompt // 2)
        generation = dataclasses.replace(generation, per_prompt=pairs_per_prompt * queue.candidates)
    elif within and 2 < queue.answers_per_task and generation.per_prompt < queue.answers_per_task:  # a task to rank wants K
        generation = dataclasses.replace(generation, per_prompt=queue.answers_per_task)
    config = {
        "model": dataclasses.asdict(project.config.model),
        "generation": dataclasses.asdict(generation),
        "sampling": generation.sampling_params(),
        "policy_version": policy.version,
        "adapter_path": str(project.root / policy.adapter_path) if policy.adapter_path else None,
        "against": against,
        "reward_model": dataclasses.asdict(project.config.reward_model),
        "reward_adapter_path": str(project.root / reward_model.adapter_path) if reward_model else None,
        "pairs_per_prompt": pairs_per_prompt,
        "unpaired_prompts": unpaired,
    }
    return submit(project, run, "generate", config, {"prompts": _prompt_table(prompts)}, round_id)


# From one job to the next


def advance_round(project: Project, run: Run, job: Job) -> Job | None:
    """After one of a round's jobs finished: queue the next one, or finish the round. Returns the next job."""
    round_ = run(get_round, job.round)
    if round_.status != "running":  # cancelled by an operator while this job finished
        return None
    if job.status != "done":
        run(finish_round, round_.id, "cancelled" if job.status == "cancelled" else "failed", utcnow(), f"{STAGES[job.kind]}: {job.error}")
        return None
    try:
        if job.kind == "reward_model":
            return _after_reward_model(project, run, round_)
        if job.kind in POLICY_JOBS:
            candidates = run(round_candidates, round_.id)
            if len(candidates) < project.config.round.candidates:
                try:
                    return _submit_candidate(project, run, round_, len(candidates))
                except JobError as e:  # DPO beside PPO, with no vote the start has not learnt: the candidates so far
                    run(add_note, round_.id, f"{len(candidates)} of [round] candidates = {project.config.round.candidates} trained: {e}")
            return submit_prediction(project, run, round_, candidates)
        if job.kind == "predict" and round_.policy_to is not None:
            missing = [p for p in _held_back(project, run, round_.policy_from) if p.completions < project.config.round.per_prompt]
            if missing:
                return submit_generation(project, run, None, project.config.round.per_prompt, round_.policy_from, missing, round_id=round_.id)
        if job.kind == "predict" and round_.policy_to is not None or job.kind == "generate" and job.config["policy_version"] == round_.policy_from:
            held_back = _held_back(project, run, round_.policy_to)
            return submit_generation(
                project, run, None, project.config.round.per_prompt, round_.policy_to, held_back, round_.policy_from, round_.id
            )
    except StoreError as e:
        run(finish_round, round_.id, "failed", utcnow(), str(e))
        raise
    run(finish_round, round_.id, "done", utcnow())
    return None


def run_round(project: Project, reward_version: int | None = None, optimizer: str | None = None,
              seconds: Counter | None = None) -> Round:
    """Run a round's jobs from this process, one after another, each with a progress bar; add each stage's wall
    time to `seconds`. A round that does not finish is a StoreError naming why."""
    round_id, job = start_round(project, project.run, reward_version, optimizer=optimizer)
    while job is not None:
        began = time.monotonic()
        done = run_here(project, job, STAGES[job.kind])
        if seconds is not None:
            seconds[STAGES[done.kind]] += time.monotonic() - began
        job = advance_round(project, project.run, done)
    round_ = project.run(get_round, round_id)
    if round_.status != "done":
        raise StoreError(f"round {round_id} {round_.status}: {round_.error}")
    return round_
