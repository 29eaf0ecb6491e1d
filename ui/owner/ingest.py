"""Taking in what a job made, as the database's owner: each kind's result stored in one transaction, or an adapter
registered as a new version whole (ui.owner.recovery.register_adapter), all or nothing."""

import dataclasses
from pathlib import Path
from typing import Any, Callable

import pyarrow.parquet as pq

from annotate.pairs import add_completions_with_pairs
from store import Connection, transaction
from store.ai_votes import add_ai_votes
from store.completions import NewCompletion, set_rewards
from store.db import utcnow
from store.jobs import Job, add_metrics, finish_job, get_job
from store.policies import POLICY_JOBS, add_policy, policy_versions
from store.reward_models import add_reward_model, add_snapshot, next_reward_model_version
from store.rounds import AVERAGE, add_candidate, add_note, get_round, set_policy_to, set_reward_version, set_verdict
from train.policy.choice import Prediction, choose
from train.runtime.job_configs import DPOJob, GenerateJob, GRPOJob, PPOJob, parse_job_config
from train.runtime.jobdir import input_path, read_events, read_job
from ui.owner.project import Project, job_dir
from ui.owner.recovery import register_adapter


def ingest_generation(con: Connection, job: Job, directory: Path, result: dict[str, Any], project: Project) -> None:
    """Store the completions, the pairs built from them, and the job as done: all or nothing."""
    config: GenerateJob = parse_job_config(job.kind, job.config)
    rows = pq.read_table(directory / result["completions"]).to_pylist()
    completions = [
        NewCompletion(r["prompt_id"], config.policy_version, r["text"], r["token_count"], r["finished"], config.generation.sampling_params(),
                      r.get("reward"), r.get("reward_heads"))
        for r in rows
    ]
    with transaction(con):
        stored, pairs = add_completions_with_pairs(
            con, completions, project.config.queue, config.against, config.pairs_per_prompt, set(config.unpaired_prompts),
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
        added = add_ai_votes(con, parse_job_config(job.kind, job.config).annotator, [(r["pair_id"], r["choice"], r["p_a"]) for r in rows], utcnow())
        add_metrics(con, job.id, [(0, {
            "judged": len(rows), "votes_added": added, "first_place_share": first_place,
            "prompts_cut": sum(r["prompt_cut"] for r in rows), "answers_cut": sum(r["answers_cut"] for r in rows),
        })])
        finish_job(con, job.id, "done", utcnow())


def ingest_policy(con: Connection, job: Job, directory: Path, result: dict[str, Any], project: Project) -> None:
    """Register a PPO, DPO or GRPO job's policy adapter as the next policy version, with its per-step statistics. A
    round's candidate keeps its adapter in its job directory, for the round's predictor to choose (ingest_prediction)."""
    steps = [(stats["step"], {k: float(v) for k, v in stats.items() if k != "step"}) for stats in result["steps"]]
    if counts := {k: result[k] for k in ("pairs", "pairs_too_long", "pairs_human", "pairs_reward_model", "label_smoothing")
                  if k in result}:  # DPO's
        steps.append((0, counts))
    config: PPOJob | DPOJob | GRPOJob = parse_job_config(job.kind, job.config)
    if config.candidate is not None:
        with transaction(con):
            add_metrics(con, job.id, steps)
            finish_job(con, job.id, "done", utcnow())
        return
    version = max(policy_versions(con)) + 1
    target = Path("policies") / f"v{version}"

    def add_rows() -> None:
        add_policy(con, version, str(target), parent=config.policy_version, round=job.round, job=job.id)
        if job.round is not None:
            set_policy_to(con, job.round, version)
        add_metrics(con, job.id, steps)
        finish_job(con, job.id, "done", utcnow())

    register_adapter(con, project, job, directory / result["adapter"], target, add_rows)


def ingest_prediction(con: Connection, job: Job, directory: Path, result: dict[str, Any], project: Project) -> None:
    """Record the predictor's figures and verdict on each of the round's candidates, or on their average alone (a
    candidate of this job's, the others its parts), and register what [round] register says (train.policy.predict.choose)
    as the next policy version: their average, or the candidate rated best; or none, and the round says why. All or
    nothing."""
    settings = project.config.round
    predictions = [Prediction(**{k: v for k, v in p.items() if k not in ("job", "adapter")}) for p in result["predictions"]]
    jobs = [job.id if p["job"] is None else p["job"] for p in result["predictions"]]  # None: the average, this job's
    averaged = result["average"] is not None
    register = "average" if averaged else "best" if settings.register == "average" else settings.register
    config = parse_job_config(job.kind, job.config)
    chosen, verdicts = choose(predictions, config.kl_budget, register)  # the round's allowance, as the predictor held it
    round_ = get_round(con, job.round)
    parts = config.candidates
    candidates = len(parts)

    def add_rows() -> None:
        if averaged:
            add_candidate(con, round_.id, job.id, AVERAGE, None)
            for part in parts:
                set_verdict(con, round_.id, part.job, None, False, f"averaged into job {job.id}'s average")
        for i, (job_id, prediction, verdict) in enumerate(zip(jobs, predictions, verdicts)):
            set_verdict(con, round_.id, job_id, dataclasses.asdict(prediction), i == chosen, verdict)
        add_metrics(con, job.id, [(0, {f"start_{name}": value for name, value in result["start"].items()})])
        finish_job(con, job.id, "done", utcnow())

    if chosen is None:
        with transaction(con):
            add_rows()
            add_note(con, round_.id, f"no candidate registered: none of {candidates} was predicted better than v{round_.policy_from} "
                                     "with confidence within the round's KL allowance, so the round's votes carry over to the next"
                                     if register == "confident" else
                                     "nothing registered: over the round's KL allowance ([round] kl_budget, kl_per_vote), so the round's votes carry over to the next")
        return
    best, scaled = predictions[chosen], result["predictions"][chosen].get("adapter")  # scaled: pulled back within the budget
    if averaged:
        made_by, adapter, what = job, directory / (scaled or result["average"]), f"the average of its {candidates} candidates"
    else:
        made_by = get_job(con, jobs[chosen])
        adapter = directory / scaled if scaled else job_dir(project, made_by.id) / "policy"
        what = f"candidate {chosen + 1} of {candidates} (job {made_by.id})"
    if scaled:
        what += f" at {best.scale:.2g} of its step from v0, within the round's KL allowance"
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


INGESTERS: dict[str, Callable[..., None]] = {
    "generate": ingest_generation,
    "reward_model": ingest_reward_model,
    "score": ingest_scores,
    "judge": ingest_judgements,
    **dict.fromkeys(POLICY_JOBS, ingest_policy),
    "predict": ingest_prediction,
}
