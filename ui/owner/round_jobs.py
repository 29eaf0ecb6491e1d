"""What each of a round's jobs is given, and the commands that queue one such job alone (`tether rm train`, `ppo`,
`dpo`, `grpo`, `generate`): the votes a reward model or DPO trains on, the prompts PPO and GRPO sample, the candidates
the predictor rates, the completions paired for people. Each builds its kind's config (train.runtime.job_configs) and
queues it (ui.owner.jobs.submit). The round itself, which job comes when, is ui.owner.round's.
"""

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from annotate.agreement import FlipRate, project_flip_rate
from annotate.export import preference_rows, ranking_rows
from annotate.ratings import wilson_interval
from store import Connection
from store.jobs import Job, get_job
from store.policies import Policy, dpo_jobs_behind, get_policy
from store.prompts import Prompt, prompts_to_generate
from store.reward_models import RewardModel, get_reward_model, list_reward_models, snapshot_path
from store.rounds import Candidate, Round, votes_held
from store.status import project_counts
from store.votes import pairs_voted_by
from train.common.config import DPOConfig, RewardModelConfig, data_seed
from train.common.snapshot import PreferenceRow, RankingRow, preference_table, ranking_table
from train.runtime.job_configs import (CandidateAdapter, DPOJob, FlipRateUsed, GenerateJob, GRPOJob, PPOJob, PredictJob,
                                       PreviousRewardModel, RewardModelJob)
from train.runtime.jobdir import input_path
from ui.owner.jobs import JobError, Run, submit
from ui.owner.project import Project, job_dir
from ui.owner.recovery import FEATURES_DIR


class TooFewPairs(JobError):
    """A round's DPO on the votes alone would train on fewer pairs than [round] min_pairs: the round trains nothing."""


# A reward model: what it trains on, and whether it steers

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
        pairs = (read or run)(project_counts).pairs
        raise JobError(f"no resolved comparisons to train on yet: 0 of {pairs} pairs resolved by a vote it trains on; "
                       f"{_what_to_train_on(reward, read or run)}")
    previous = _previous(project, run, [r.pair_id for r in rows], [r.ranking_id for r in rankings])
    return RewardTraining(reward, flip, rate, rows, rankings, previous)


def submit_reward_training(
    project: Project, run: Run, *, include_imported: bool | None = None, round_id: int | None = None, read: Run | None = None,
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
    config = RewardModelJob(
        model=project.config.model,
        reward_model=reward,
        flip_rate=FlipRateUsed(rate=training.rate, measured=dataclasses.asdict(training.flip), setting=reward.flip_rate),
        warm_start=_warm_start(project, reward, previous) if reward.warm_start and reward.kind != "head" else None,
        previous=_of_kind(previous, "head") if reward.kind != "lora" else None,
        features_cache=str(project.root / FEATURES_DIR) if reward.kind != "lora" else None,
    )
    inputs = {"preferences": preference_table(training.rows)} | ({"rankings": ranking_table(training.rankings)} if training.rankings else {})
    return submit(project, run, config, inputs, round_id)


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


def _of_kind(previous: dict[str, Any] | None, kind: str) -> PreviousRewardModel | None:
    """The previous version's reward model of this kind ('head' or 'lora'), with what it has not seen; None without one."""
    if previous is None:
        return None
    trained = previous["reward_model"].get("kind", "lora")  # versions before heads were all LoRA models
    if trained not in (kind, "auto"):
        return None
    path = Path(previous["version_dir"]) / kind if trained == "auto" else Path(previous["version_dir"])
    return PreviousRewardModel(version=previous["version"], adapter_path=str(path), new_pair_ids=previous["new_pair_ids"],
                               new_ranking_ids=previous["new_ranking_ids"])


def _warm_start(project: Project, reward: RewardModelConfig, previous: dict[str, Any] | None) -> PreviousRewardModel | None:
    """What a LoRA model continues from: the newest version's LoRA model and the pairs and rankings it has not seen.

    None, for training from scratch, when there is none, or it has another adapter shape than the settings now ask for.
    A LoRA model alone refuses to train again on the votes it has seen; beside a head ('auto') it starts from scratch.
    """
    lora = _of_kind(previous, "lora")
    if lora is None or any(previous["reward_model"].get(name) != getattr(reward, name) for name in ADAPTER_SETTINGS):
        return None
    if not lora.new_pair_ids and not lora.new_ranking_ids:
        if reward.kind == "auto":
            return None
        raise JobError(
            f"no new resolved comparisons since reward model v{lora.version}: collect votes first, "
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


def newest_reward_model(con: Connection) -> RewardModel | None:
    return get_reward_model(con) if list_reward_models(con) else None


def steers(reward_model: RewardModel, config: RewardModelConfig) -> bool:
    """Whether the reward model's judgement may choose pairs and rank answers ([reward_model] trust): always, or once the
    version it continued agreed with the votes cast after that version was trained at a 95% Wilson lower bound above 0.5."""
    accuracy, pairs = reward_model.metrics.get("new_votes_accuracy"), reward_model.metrics.get("new_votes_pairs")
    return config.trust == "always" or (accuracy is not None and bool(pairs) and wilson_interval(accuracy, pairs)[0] > 0.5)


CANDIDATE_SEED_STRIDE = 1000


def job_seed(seed: int, policy_version: int, candidate: int | None) -> int:
    """A policy job's seed: the setting's, offset by the version it starts from, so that each round draws its own prompt
    batches and samples, and by a round's candidate number, so that its candidates differ."""
    return seed + policy_version + CANDIDATE_SEED_STRIDE * (candidate or 0)


def submit_ppo(project: Project, run: Run, *, reward_version: int | None = None, policy_version: int | None = None,
               round_id: int | None = None, candidate: int | None = None) -> Job:
    """Queue PPO from a policy version against a reward model (the newest of each by default).

    PPO trains on the active prompts that rounds do not hold back for comparing policies. A round's
    candidate (numbered from 0) is kept in its job until the round's predictor chooses among them.
    """
    reward_model, policy, prompts = _on_prompts(project, run, reward_version, policy_version)
    ppo = project.config.ppo
    ppo = dataclasses.replace(ppo, seed=job_seed(ppo.seed, policy.version, None), data_seed=job_seed(data_seed(ppo), policy.version, candidate),
                              max_new_tokens=project.config.ppo_response_tokens())
    config = PPOJob(model=project.config.model, ppo=ppo, policy_version=policy.version, policy_adapter_path=_adapter(project, policy),
                    reward_version=reward_model.version, reward_adapter_path=str(project.root / reward_model.adapter_path),
                    candidate=candidate)
    return submit(project, run, config, {"prompts": _prompt_table(prompts)}, round_id)


def submit_grpo(project: Project, run: Run, *, reward_version: int | None = None, policy_version: int | None = None,
                round_id: int | None = None, candidate: int | None = None) -> Job:
    """Queue GRPO from a policy version against a reward model (the newest of each by default), on the prompts PPO uses."""
    reward_model, policy, prompts = _on_prompts(project, run, reward_version, policy_version)
    grpo = project.config.grpo
    grpo = dataclasses.replace(grpo, seed=job_seed(grpo.seed, policy.version, None), data_seed=job_seed(data_seed(grpo), policy.version, candidate),
                               max_new_tokens=grpo.max_new_tokens or project.config.generation.max_new_tokens)
    config = GRPOJob(model=project.config.model, grpo=grpo, policy_version=policy.version, policy_adapter_path=_adapter(project, policy),
                     reward_version=reward_model.version, reward_adapter_path=str(project.root / reward_model.adapter_path),
                     candidate=candidate)
    return submit(project, run, config, {"prompts": _prompt_table(prompts)}, round_id)


def _on_prompts(project: Project, run: Run, reward_version: int | None, policy_version: int | None) -> tuple[RewardModel, Policy, list[Prompt]]:
    """What a policy job that samples prompts and scores the answers starts from: its reward model, its policy, and the
    active prompts that rounds do not hold back."""
    policy = run(get_policy, policy_version)
    share = project.config.round.held_back_share
    return run(get_reward_model, reward_version), policy, [p for p in run(prompts_to_generate, policy.version, None) if not is_held_back(p, share)]


def _adapter(project: Project, policy: Policy) -> str | None:
    return str(project.root / policy.adapter_path) if policy.adapter_path else None


SUBMIT_WITH_REWARD_MODEL = {"ppo": submit_ppo, "grpo": submit_grpo}


def submit_dpo(project: Project, run: Run, *, reward_version: int | None = None, policy_version: int | None = None,
               round_id: int | None = None, read: Run | None = None, pairs: str | None = None, candidate: int | None = None,
               min_pairs: int = 1) -> Job:
    """Queue DPO from a policy version (the newest by default) on a frozen snapshot of the project's resolved votes
    (dpo_votes), on pairs a reward model (the newest by default) ranks, or on both, as `pairs` ([dpo] pairs by default)
    says; with 'both', the ranked pairs join only once the reward model `steers`.

    Like PPO it leaves out the prompts that rounds hold back for comparing policies. `read` reads the votes beside the
    writer, as for submit_reward_training. A round's candidate is kept as for submit_ppo. On the votes alone, fewer than
    `min_pairs` pairs is TooFewPairs.
    """
    dpo = dataclasses.replace(project.config.dpo, pairs=pairs or project.config.dpo.pairs)
    reward = project.config.reward_model
    policy = run(get_policy, policy_version)
    prompts = run(prompts_to_generate, policy.version, None)
    rows = dpo_votes(project, run, dpo, policy.version, read) if dpo.pairs != "reward_model" else []
    reward_model = None if dpo.pairs == "human" else run(get_reward_model, reward_version)
    if dpo.pairs == "both" and not steers(reward_model, reward):
        reward_model = None  # the votes alone, until the reward model has shown it predicts new ones
    if not rows and reward_model is None:
        raise JobError(f"{_no_votes_for_dpo(dpo, policy.version)} to train on yet: {_what_to_train_on(reward, read or run)}")
    if reward_model is None and len(rows) < min_pairs:
        raise TooFewPairs(f"DPO on the votes would train on {len(rows)} pairs, fewer than [round] min_pairs = {min_pairs}: "
                          f"nothing trained, and the votes carry over to the next round")
    dpo = dataclasses.replace(dpo, seed=job_seed(dpo.seed, policy.version, None), data_seed=job_seed(data_seed(dpo), policy.version, candidate))
    config = DPOJob(model=project.config.model, dpo=dpo, policy_version=policy.version, policy_adapter_path=_adapter(project, policy),
                    candidate=candidate)
    inputs = {"preferences": preference_table(rows)}
    if reward_model is not None:
        share = project.config.round.held_back_share
        training = [p for p in prompts if not is_held_back(p, share)]
        drawn = random.Random(dpo.data_seed).sample(training, min(dpo.prompts, len(training)))
        inputs["prompts"] = _prompt_table(drawn)
        config = dataclasses.replace(config, generation=project.config.generation, reward_model=reward, reward_version=reward_model.version,
                                     reward_adapter_path=str(project.root / reward_model.adapter_path))
    return submit(project, run, config, inputs, round_id)


def dpo_votes(project: Project, run: Run, dpo: DPOConfig, policy_version: int, read: Run | None = None) -> list[PreferenceRow]:
    """The votes DPO from `policy_version` trains on, outside the prompts rounds hold back.

    With [dpo] refit (the default), where there is a vote the policy's adapter has not trained on, every vote: a new
    adapter from v0 learns it with every vote before it. Without it, with [dpo] votes = "new" the votes the policy's
    adapter has not trained on (the DPO jobs behind it), with "latest" only those on pairs with a completion of that
    policy and imported ones ([reward_model] include_imported), and with "all" every vote, again each round. Each row
    carries the probability that its label is right, from which the worker sets [dpo] label_smoothing = "auto"
    (train.policy.dpo.label_smoothing). With [reward_model] flip_rate = "auto" that probability is taken at the least
    flip rate the votes allow (FlipRate.low), not at the estimate the reward model uses: robust DPO with a flip rate
    above the true one never stops pushing a pair's margin up, while with one below it the margin stops at a finite
    value.
    """
    reward = project.config.reward_model
    share = project.config.round.held_back_share
    held_back = {p.id for p in run(prompts_to_generate, policy_version, None) if is_held_back(p, share)}
    flip = (read or run)(project_flip_rate).low if reward.flip_rate == "auto" else reward.flip_rate
    learnt = set() if dpo.votes == "all" else _learnt_pair_ids(project, run, policy_version)
    votes = [r for r in (read or run)(preference_rows, reward.include_imported, False, reward.ai_votes, "pairs", flip)
             if r.prompt_id not in held_back]
    rows = [r for r in votes if dpo.votes == "all" or r.pair_id not in learnt and (
        dpo.votes == "new" or r.chosen_policy is None or policy_version in (r.chosen_policy, r.rejected_policy))]  # None: imported
    return votes if dpo.refit and rows else rows


def _no_votes_for_dpo(dpo: DPOConfig, policy_version: int) -> str:
    which = {"all": "", "new": f" that policy v{policy_version} has not trained on",
             "latest": f" on policy v{policy_version}'s completions ([dpo] votes = \"latest\")"}[dpo.votes]
    return f"no resolved votes{which} outside the held-back prompts"


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


# The predictor (ui.owner.ingest.ingest_prediction registers what it chose)


def submit_prediction(project: Project, run: Run, round_: Round, candidates: list[Candidate]) -> Job:
    """Queue the round's predictor (train.policy.predict) on its candidates, or with [round] register = 'average' on their
    average alone: each one's win rate over the round's start by the round's reward model, on fresh answers of both to
    the first [round] predictor_prompts held-back prompts (by content, the same ones every round), [round]
    predictor_answers each, and its KL to v0, held within the round's KL allowance ([round] kl_budget, kl_per_vote)."""
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
    config = PredictJob(
        model=project.config.model,
        generation=generation,
        reward_model=project.config.reward_model,
        reward_version=reward_model.version,
        reward_adapter_path=str(project.root / reward_model.adapter_path),
        start_version=start.version,
        start_adapter_path=_adapter(project, start),
        candidates=[CandidateAdapter(job=c.job, adapter_path=str(job_dir(project, c.job) / "policy")) for c in candidates],
        average=settings.register == "average" and len(candidates) > 1,
        kl_budget=settings.kl_allowance(run(votes_held)),
        confidence=settings.predictor_confidence,
        draws=PREDICTOR_DRAWS,
        seed=round_.id,
    )
    return submit(project, run, config, {"prompts": _prompt_table(prompts)}, round_.id)


PREDICTOR_DRAWS = 2000  # bootstrap draws of each candidate's win rate: its interval's ends move by under a point between runs


# The completions, paired for people to judge


def held_back_prompts(project: Project, run: Run, policy_version: int) -> list[Prompt]:
    """The active prompts no policy trains on, where rounds compare versions."""
    share = project.config.round.held_back_share
    prompts = [p for p in run(prompts_to_generate, policy_version, None) if is_held_back(p, share)]
    if not prompts:
        raise JobError(
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
    *,
    limit: int | None = None,
    per_prompt: int | None = None,
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
    newest = run(newest_reward_model) if queue.strategy == "active" else None
    reward_model = newest if newest and steers(newest, project.config.reward_model) else None
    pairs_per_prompt = None
    if reward_model is not None and within:
        pairs_per_prompt = max(1, generation.per_prompt // 2)
        generation = dataclasses.replace(generation, per_prompt=pairs_per_prompt * queue.candidates)
    elif within and 2 < queue.answers_per_task and generation.per_prompt < queue.answers_per_task:  # a task to rank wants K
        generation = dataclasses.replace(generation, per_prompt=queue.answers_per_task)
    config = GenerateJob(
        model=project.config.model,
        generation=generation,
        policy_version=policy.version,
        policy_adapter_path=_adapter(project, policy),
        against=against,
        reward_model=project.config.reward_model,
        reward_adapter_path=str(project.root / reward_model.adapter_path) if reward_model else None,
        pairs_per_prompt=pairs_per_prompt,
        unpaired_prompts=unpaired,
    )
    return submit(project, run, config, {"prompts": _prompt_table(prompts)}, round_id)
