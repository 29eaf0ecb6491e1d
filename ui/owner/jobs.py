"""Running jobs as the database's owner: write the job directory, start the worker, follow its
events, and ingest its result in one transaction. Used by the app's job queue and by the CLI.

`run(fn, *args)` runs a store function on the database: the app's one-writer `Server.db`, or
`Project.run` in the CLI, which opens the database for just that call.
"""

import contextlib
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from annotate.agreement import FlipRate, project_flip_rate
from annotate.export import preference_rows, ranking_rows
from annotate.pairs import add_completions_with_pairs
from annotate.ratings import wilson_interval
from store import Connection, StoreError, transaction
from store.ai_votes import add_ai_votes, judge_annotator, pairs_to_judge
from store.db import utcnow
from store.completions import NewCompletion, completions_to_score, set_rewards
from store.jobs import Job, add_job, add_metrics, finish_job, get_job, set_progress, start_job
from store.policies import POLICY_JOBS, add_policy, dpo_jobs_behind, get_policy, policy_versions
from store.prompts import Prompt, prompts_to_generate
from store.pref_files import read_preference_file
from store.rounds import AVERAGE, Candidate, Round, add_candidate, add_note, get_round, set_policy_to, set_reward_version, set_verdict
from store.votes import pairs_voted_by
from store.reward_models import (
    RewardModel,
    add_reward_model,
    add_snapshot,
    get_reward_model,
    list_reward_models,
    next_reward_model_version,
    snapshot_path,
)
from train.config import RewardModelConfig, data_seed
from train.jobdir import ALLOCATOR_ENV, LOG_FILE, OWNER_PID_ENV, input_path, log_tail, read_events, read_job, read_result, write_job
from train.snapshot import PreferenceRow, RankingRow, preference_table, ranking_table
from ui.owner.project import Project
from ui.owner.recovery import FEATURES_DIR, reconcile, record_worker, register_adapter

Run = Callable[..., Any]
POLL_SECONDS = 0.5
WORKER_ENV = "TETHER_WORKER"  # "here": run_here runs jobs in its own process


class JobError(StoreError):
    """A job that cannot be queued as asked."""


class TooFewPairs(JobError):
    """A round's DPO on the votes alone would train on fewer pairs than [round] min_pairs: the round trains nothing."""


def job_dir(project: Project, job_id: int) -> Path:
    return project.root / "jobs" / str(job_id)


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
    return _submit(project, run, "generate", config, {"prompts": _prompt_table(prompts)}, round_id)


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


def _prompt_table(prompts: list[Prompt]) -> pa.Table:
    if not prompts:
        raise JobError("the project has no active prompts: add some with `tether prompts import FILE`")
    return pa.Table.from_pylist([{"prompt_id": p.id, "messages": json.dumps(p.messages)} for p in prompts])


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
    return _submit(project, run, "reward_model", config, inputs, round_id)


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


# A version can be continued only by an adapter of its own shape on its own base model.
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


def submit_scoring(project: Project, run: Run, version: int | None = None) -> Job:
    """Queue scoring every policy completion with a reward model (the newest by default)."""
    reward_model = run(get_reward_model, version)
    rows = run(completions_to_score)
    if not rows:
        raise JobError("the project has no completions to score: generate some with `tether generate`")
    table = pa.Table.from_pylist([{"completion_id": i, "prompt": prompt, "text": text} for i, prompt, text in rows])
    config = {
        "model": dataclasses.asdict(project.config.model),
        "reward_model": dataclasses.asdict(project.config.reward_model),
        "version": reward_model.version,
        "reward_adapter_path": str(project.root / reward_model.adapter_path),
    }
    return _submit(project, run, "score", config, {"completions": table})


def submit_judging(project: Project, run: Run, limit: int | None = None, read: Run | None = None) -> Job:
    """Queue the AI judge ([judge]) on the pairs it has not voted on, in pair order, at most `limit` of them.
    `read` reads the pairs beside the writer, as for submit_reward_training."""
    model = project.config.judge_model()
    annotator = judge_annotator(model.name_or_path)
    pairs = (read or run)(pairs_to_judge, annotator, limit)
    if not pairs:
        raise JobError(f"{annotator} has voted on every pair already: generate new pairs first")
    table = pa.Table.from_pylist(
        [{"pair_id": p.pair_id, "prompt": json.dumps(p.prompt), "text_a": p.text_a, "text_b": p.text_b} for p in pairs]
    )
    config = {"model": dataclasses.asdict(model), "judge": dataclasses.asdict(project.config.judge), "annotator": annotator}
    return _submit(project, run, "judge", config, {"pairs": table})


def evaluate_reward_model(project: Project, version: RewardModel, data_file: Path, on_scored: Callable[[int], Any]) -> Any:
    """A reward model's pairwise accuracy on a preference file (a train.reward_model.PairwiseResult), scored in this process."""
    from train.models import resolve_model_path  # torch and transformers take seconds to import
    from train.reward_model import load_reward_model

    preferences = read_preference_file(data_file, project.config.server.import_limits())
    rows = [PreferenceRow(p.prompt.messages, p.chosen, p.rejected) for p in preferences]
    if not rows:
        raise JobError(f"{data_file} holds no preference pairs")
    base = project.config.model
    reward_model = load_reward_model(resolve_model_path(base.name_or_path), project.root / version.adapter_path, base)
    return reward_model.pairwise_accuracy(rows, project.config.reward_model.batch_size * 2, on_scored=on_scored)


# A round's candidate k draws its batches and samples with its optimiser's seed plus k times this (data_seed); all
# start from one initialisation (seed). Each from an initialisation of its own, two candidates' updates were orthogonal
# (median cosine 0.01 over 11 pairs) and their average kept half of each (scripts/BENCHMARKS.md).
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
    return _submit(project, run, kind, config, {"prompts": _prompt_table(prompts)}, round_id)


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
    (train.dpo.label_smoothing). With [reward_model] flip_rate = "auto" that probability is taken at the least flip
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
    return _submit(project, run, "dpo", config, inputs, round_id)


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


def _submit(
    project: Project, run: Run, kind: str, config: dict[str, Any], inputs: dict[str, pa.Table], round_id: int | None = None
) -> Job:
    from train.errors import ModelError
    from train.hardware import check_runs_here

    try:  # before the job exists: a job this machine cannot run is refused, not queued to fail
        check_runs_here(project.config.model)
    except ModelError as e:
        raise JobError(str(e)) from None
    check_gpus(project)
    job = run(add_job, kind, config, round_id)
    directory = job_dir(project, job.id)
    try:
        write_job(directory, kind, config, inputs)
    except OSError as e:
        run(finish_job, job.id, "failed", utcnow(), f"cannot write {directory}: {e}")
        raise JobError(f"cannot write the job directory {directory}: {e}") from None
    return job


def check_gpus(project: Project) -> None:
    """Refuse [worker] gpus over the GPUs this machine has, or beside a [model] device that names one GPU."""
    import torch

    processes, gpus = project.config.worker.processes(), project.config.worker.gpus
    if processes > 1 and processes > torch.cuda.device_count():
        raise JobError(f"[worker] gpus = {gpus} asks for {processes} GPUs and this machine has {torch.cuda.device_count()}: "
                       "set gpus = 1, or \"all\"")
    if processes > 1 and project.config.model.device.startswith("cuda:"):
        raise JobError(f'[worker] gpus = {gpus} gives each process its own GPU, and [model] device = '
                       f'"{project.config.model.device}" names one: set device = "auto"')


def worker_command(directory: Path, processes: int) -> list[str]:
    """The command that runs a job: the worker alone, or one worker process per GPU under accelerate launch."""
    worker = ["-m", "train.worker", str(directory)]
    if processes == 1:
        return [sys.executable, *worker]
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", *worker]


def ingest_generation(con: Connection, job: Job, directory: Path, result: dict[str, Any], project: Project) -> None:
    """Store the completions, the pairs built from them, and the job as done: all or nothing."""
    rows = pq.read_table(directory / result["completions"]).to_pylist()
    completions = [
        NewCompletion(r["prompt_id"], job.config["policy_version"], r["text"], r["token_count"], r["finished"], job.config["sampling"],
                      r.get("reward"), r.get("reward_heads"))
        for r in rows
    ]
    with transaction(con):
        stored, pairs = add_completions_with_pairs(
            con, completions, project.config.queue, job.config.get("against"), job.config.get("pairs_per_prompt"),
            set(job.config.get("unpaired_prompts", [])),
        )
        add_metrics(con, job.id, [(0, {"completions": len(stored), "pairs": len(pairs), "prompts": len({c.prompt_id for c in stored})})])
        finish_job(con, job.id, "done", utcnow())


def ingest_reward_model(con: Connection, job: Job, directory: Path, result: dict[str, Any], project: Project) -> None:
    """Register the trained adapter as the next reward-model version, with its snapshot and metrics."""
    version = next_reward_model_version(con)
    target = Path("reward_models") / f"v{version}"
    metrics = result["metrics"]
    steps = [e for e in read_events(directory, 0)[0] if "loss" in e]
    snapshot, snapshot_file = read_job(directory)["inputs"]["preferences"], input_path(directory, "preferences")

    def add_rows() -> None:
        add_snapshot(con, snapshot, pq.read_metadata(snapshot_file).num_rows, str(snapshot_file.relative_to(project.root)))
        add_reward_model(con, version, snapshot, str(target), {**metrics, "job": job.id})
        if job.round is not None:
            set_reward_version(con, job.round, version)
        add_metrics(con, job.id, [(event["step"], {"loss": event["loss"], "train_accuracy": event["accuracy"]}) for event in steps]
                    + [(metrics.get("steps", 0), {k: v for k, v in metrics.items() if isinstance(v, (int, float))})])
        finish_job(con, job.id, "done", utcnow())

    register_adapter(con, project, job, directory / result["adapter"], target, add_rows)


def ingest_scores(con: Connection, job: Job, directory: Path, result: dict[str, Any], project: Project) -> None:
    scores = pq.read_table(directory / result["scores"]).to_pylist()
    with transaction(con):
        set_rewards(con, {row["completion_id"]: (row["reward"], row["reward_heads"]) for row in scores})
        add_metrics(con, job.id, [(0, {"scored": len(scores)})])
        finish_job(con, job.id, "done", utcnow())


def ingest_judgements(con: Connection, job: Job, directory: Path, result: dict[str, Any], project: Project) -> None:
    """Store the judge's votes (source 'ai') and the job as done: all or nothing; a pair it has voted on keeps its vote."""
    rows = pq.read_table(directory / result["judgements"]).to_pylist()
    # How often a single order's answer was the first-placed one: 0.5 for a judge without a bias for either place.
    first_place = sum((r["p_a_first"] > 0.5) + (r["p_a_second"] < 0.5) for r in rows) / (2 * len(rows))
    with transaction(con):
        added = add_ai_votes(con, job.config["annotator"], [(r["pair_id"], r["choice"], r["p_a"]) for r in rows], utcnow())
        add_metrics(con, job.id, [(0, {
            "judged": len(rows), "votes_added": added, "first_place_share": first_place,
            "prompts_cut": sum(r["prompt_cut"] for r in rows), "answers_cut": sum(r["answers_cut"] for r in rows),
        })])
        finish_job(con, job.id, "done", utcnow())


def run_job(
    project: Project,
    run: Run,
    job: Job,
    cancelled: Callable[[], str | None] = lambda: None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    command: list[str] | None = None,
    here: bool = False,
) -> Job:
    """Run the worker to its end, following its progress; ingest its result or record its failure.

    `cancelled()` returns why the job must stop now, or None to go on. It is asked once more after
    the worker exits, so a job cancelled as its worker finished is cancelled, its result never
    taken; a cancel asked for after that finds the job done. `command` runs the job directory's
    worker some other way than [worker] gpus says (worker_command). `here` runs the worker's code
    in this process instead (run_here says when), with no progress until it ends and no cancelling.
    """
    directory = job_dir(project, job.id)
    if not run(start_job, job.id):  # cancelled while it waited in the queue
        return run(get_job, job.id)
    returncode = _run_worker_here(directory) if here else _run_worker_process(project, run, job, directory, cancelled, on_progress, command)
    if returncode is None:
        return run(get_job, job.id)
    result = read_result(directory)
    if returncode == 0 and result is not None:
        run(INGESTERS[job.kind], job, directory, result, project)
        run(add_metrics, job.id, [(0, result["peak_memory"])])
    else:
        run(finish_job, job.id, "failed", utcnow(), f"the worker exited with code {returncode}:\n{log_tail(directory)}")
    return run(get_job, job.id)


def _run_worker_process(
    project: Project, run: Run, job: Job, directory: Path, cancelled: Callable[[], str | None],
    on_progress: Callable[[dict[str, Any]], None] | None, command: list[str] | None,
) -> int | None:
    """Start the job's worker process and follow it to its exit code; None once the job is cancelled and its worker killed."""
    with (directory / LOG_FILE).open("w") as log:
        # Its own session, so cancelling can kill the worker and anything it started. No
        # preexec_fn: Python code between fork and exec in a threaded server can deadlock, so the
        # worker itself exits when this process is gone (OWNER_PID_ENV) and lowers its priority.
        # PYTHONSAFEPATH, inherited by every process accelerate launch starts, keeps the working
        # directory off sys.path: a signal.py or json.py where tether was run would otherwise
        # shadow the standard library in the worker.
        worker = subprocess.Popen(
            # The predictor samples a few dozen answers a policy: one process does it.
            command or worker_command(directory, 1 if job.kind == "predict" else project.config.worker.processes()),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env=(ALLOCATOR_ENV if project.config.worker.release_memory else {}) | os.environ
            | {"PYTHONSAFEPATH": "1", OWNER_PID_ENV: str(os.getpid())},
        )
    try:
        record_worker(directory, worker.pid)
        offset = 0
        while True:
            exited = worker.poll() is not None
            events, offset = read_events(directory, offset)
            progress = [e for e in events if "progress" in e]
            if progress:
                run(set_progress, job.id, progress[-1]["progress"])
                if on_progress:
                    on_progress(progress[-1])
            if reason := cancelled():
                _stop(worker)
                run(finish_job, job.id, "cancelled", utcnow(), reason)
                return None
            if exited:
                return worker.returncode
            time.sleep(POLL_SECONDS)
    except BaseException:  # whoever catches this fails the job: its worker must not run on unwatched
        _stop(worker)
        raise


def _run_worker_here(directory: Path) -> int:
    """The worker's code in this process, its output to the job's log: the exit code a worker process would give."""
    from train import worker

    with (directory / LOG_FILE).open("w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        try:
            return worker.run(directory)
        except Exception:  # as a worker process would die of it: its traceback in the log
            traceback.print_exc()
            return 1


def run_here(project: Project, job: Job, label: str) -> Job:
    """Run a job's worker from this process, with a progress bar, after setting right what a process that died left.

    With TETHER_WORKER=here in the environment (and one worker process) the worker's code runs in this
    very process: a breakpoint in it is reached, and a caller that has imported torch already (the test
    suite) skips a worker's start of 6 to 8 s. The app always starts worker processes.
    """
    for line in project.run(reconcile, project):
        print(line, file=sys.stderr)
    here = os.environ.get(WORKER_ENV) == "here" and project.config.worker.processes() == 1
    with tqdm(total=100, desc=label, unit="%", bar_format="{l_bar}{bar}| {elapsed}") as bar:
        return run_job(project, project.run, job, on_progress=lambda e: bar.update(round(100 * e["progress"]) - bar.n), here=here)


def run_to_end(project: Project, job: Job, label: str) -> Job:
    """run_here, and a job that did not finish becomes a JobError naming its reason."""
    job = run_here(project, job, label)
    if job.status != "done":
        raise JobError(f"job {job.id} {job.status}: {job.error}")
    return job


def ingest_policy(con: Connection, job: Job, directory: Path, result: dict[str, Any], project: Project) -> None:
    """Register a PPO, DPO or GRPO job's policy adapter as the next policy version, with its per-step statistics. A
    round's candidate keeps its adapter in its job directory, for the round's predictor to choose (ingest_prediction)."""
    steps = [(stats["step"], {k: float(v) for k, v in stats.items() if k != "step"}) for stats in result["steps"]]
    if counts := {k: result[k] for k in ("pairs", "pairs_too_long", "pairs_human", "pairs_reward_model", "label_smoothing")
                  if k in result}:  # DPO's
        steps.append((0, counts))
    if job.config.get("candidate") is not None:
        with transaction(con):
            add_metrics(con, job.id, steps)
            finish_job(con, job.id, "done", utcnow())
        return
    version = max(policy_versions(con)) + 1
    target = Path("policies") / f"v{version}"

    def add_rows() -> None:
        add_policy(con, version, str(target), parent=job.config["policy_version"], round=job.round, job=job.id)
        if job.round is not None:
            set_policy_to(con, job.round, version)
        add_metrics(con, job.id, steps)
        finish_job(con, job.id, "done", utcnow())

    register_adapter(con, project, job, directory / result["adapter"], target, add_rows)


def submit_prediction(project: Project, run: Run, round_: Round, candidates: list[Candidate]) -> Job:
    """Queue the round's predictor (train.predict) on its candidates, or with [round] register = 'average' on their
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
    return _submit(project, run, "predict", config, {"prompts": _prompt_table(prompts)}, round_.id)


PREDICTOR_DRAWS = 2000  # bootstrap draws of each candidate's win rate: its interval's ends move by under a point between runs


def ingest_prediction(con: Connection, job: Job, directory: Path, result: dict[str, Any], project: Project) -> None:
    """Record the predictor's figures and verdict on each of the round's candidates, or on their average alone (a
    candidate of this job's, the others its parts), and register what [round] register says (train.predict.choose)
    as the next policy version: their average, or the candidate rated best; or none, and the round says why. All or
    nothing."""
    from train.predict import Prediction, choose

    settings = project.config.round
    predictions = [Prediction(**{k: v for k, v in p.items() if k not in ("job", "adapter")}) for p in result["predictions"]]
    jobs = [job.id if p["job"] is None else p["job"] for p in result["predictions"]]  # None: the average, this job's
    averaged = result["average"] is not None
    register = "average" if averaged else "best" if settings.register == "average" else settings.register
    chosen, verdicts = choose(predictions, settings.kl_budget, register)
    round_ = get_round(con, job.round)
    candidates = len(job.config["candidates"])

    def add_rows() -> None:
        if averaged:
            add_candidate(con, round_.id, job.id, AVERAGE, None)
            for part in job.config["candidates"]:
                set_verdict(con, round_.id, part["job"], None, False, f"averaged into job {job.id}'s average")
        for i, (job_id, prediction, verdict) in enumerate(zip(jobs, predictions, verdicts)):
            set_verdict(con, round_.id, job_id, dataclasses.asdict(prediction), i == chosen, verdict)
        add_metrics(con, job.id, [(0, {f"start_{name}": value for name, value in result["start"].items()})])
        finish_job(con, job.id, "done", utcnow())

    if chosen is None:
        with transaction(con):
            add_rows()
            add_note(con, round_.id, f"no candidate registered: none of {candidates} was predicted better than v{round_.policy_from} "
                                     "with confidence within [round] kl_budget, so the round's votes carry over to the next"
                                     if register == "confident" else
                                     f"nothing registered: over [round] kl_budget, so the round's votes carry over to the next")
        return
    best, scaled = predictions[chosen], result["predictions"][chosen].get("adapter")  # scaled: pulled back within the budget
    if averaged:
        made_by, adapter, what = job, directory / (scaled or result["average"]), f"the average of its {candidates} candidates"
    else:
        made_by = get_job(con, jobs[chosen])
        adapter = directory / scaled if scaled else job_dir(project, made_by.id) / "policy"
        what = f"candidate {chosen + 1} of {candidates} (job {made_by.id})"
    if scaled:
        what += f" at {best.scale:.2g} of its step from v0, within [round] kl_budget"
    version = max(policy_versions(con)) + 1
    target = Path("policies") / f"v{version}"

    def register_version() -> None:
        # The average's job is none of the candidates': its lineage counts every DPO job of its round (dpo_jobs_behind).
        add_policy(con, version, str(target), parent=round_.policy_from, round=round_.id, job=None if averaged else made_by.id)
        set_policy_to(con, round_.id, version)
        add_note(con, round_.id, f"{what} registered as v{version}: predicted win rate over v{round_.policy_from} "
                                 f"{best.win_rate:.0%} [{best.low:.0%}, {best.high:.0%}]")
        add_rows()

    register_adapter(con, project, made_by, adapter, target, register_version)


def _stop(worker: subprocess.Popen) -> None:
    """Kill the worker and whatever it started (accelerate's processes), and reap it."""
    try:
        os.killpg(worker.pid, signal.SIGKILL)
    except ProcessLookupError:  # the whole group has exited already
        pass
    worker.wait()


INGESTERS: dict[str, Callable[..., None]] = {
    "generate": ingest_generation,
    "reward_model": ingest_reward_model,
    "score": ingest_scores,
    "judge": ingest_judgements,
    **dict.fromkeys(POLICY_JOBS, ingest_policy),
    "predict": ingest_prediction,
}
