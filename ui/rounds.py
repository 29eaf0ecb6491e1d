"""Training rounds: a chain of jobs that turns the votes so far into the next policy version.

A round is a reward model trained on a snapshot of the comparisons (or a chosen version), PPO
from the newest policy v on the prompts that are not held back, then completions of v (where
it has too few) and of v+1 on the held-back prompts, each of v+1's paired with one of v's for
the annotators. The votes on those pairs are the round's human win rate. Each step is a job,
queued when the one before it is done, so the app's job queue and `tether round` run a round
the same way: `start_round`, then `advance_round` after each of its jobs.
"""

import re
from dataclasses import dataclass
from typing import Any

from annotate.ratings import WinRate, bradley_terry, head_to_head
from store import StoreError
from store.db import utcnow
from store.jobs import Job, job_metrics, metric_series, round_jobs
from store.completions import paired_texts
from store.policies import get_policy
from store.prompts import Prompt, prompts_to_generate
from store.reward_models import get_reward_model
from store.rounds import Round, add_round, finish_round, get_round, list_rounds
from store.stats import version_games
from ui.jobs import Run, is_held_back, submit_generation, submit_ppo, submit_reward_training
from ui.project import Project

STAGES = {"reward_model": "reward model", "ppo": "PPO", "generate": "completions"}


def start_round(project: Project, run: Run, reward_version: int | None = None) -> Job:
    """Start a round from the newest policy, training a reward model unless given a version; return its first job."""
    if reward_version is not None:
        run(get_reward_model, reward_version)  # fails now, not after a round was recorded
    policy = run(get_policy, None)
    round_ = run(add_round, policy.version, reward_version)
    try:
        if reward_version is None:
            return submit_reward_training(project, run, round_id=round_.id)
        return submit_ppo(project, run, reward_version, policy.version, round_.id)
    except StoreError as e:
        run(finish_round, round_.id, "failed", utcnow(), str(e))
        raise


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
            return submit_ppo(project, run, round_.reward_version, round_.policy_from, round_.id)
        if job.kind == "ppo":
            missing = [p for p in _held_back(project, run, round_.policy_from) if p.completions < project.config.round.per_prompt]
            if missing:
                return submit_generation(project, run, None, project.config.round.per_prompt, round_.policy_from, missing, round_id=round_.id)
        if job.kind == "ppo" or job.config["policy_version"] == round_.policy_from:
            held_back = _held_back(project, run, round_.policy_to)
            return submit_generation(
                project, run, None, project.config.round.per_prompt, round_.policy_to, held_back, round_.policy_from, round_.id
            )
    except StoreError as e:
        run(finish_round, round_.id, "failed", utcnow(), str(e))
        raise
    run(finish_round, round_.id, "done", utcnow())
    return None


def _held_back(project: Project, run: Run, policy_version: int) -> list[Prompt]:
    share = project.config.round.held_back_share
    prompts = [p for p in run(prompts_to_generate, policy_version, None) if is_held_back(p, share)]
    if not prompts:
        raise StoreError(
            f"no active prompt is held back from PPO to compare policies on ([round] held_back_share = {share}): add prompts"
        )
    return prompts


@dataclass(frozen=True)
class RoundSummary:
    round: Round
    reward_accuracy: float | None  # held-out pairwise accuracy of the round's reward model
    ppo: dict[str, Any]  # the PPO settings it ran with
    ppo_job: int | None
    kl: float | None  # KL to the reference at PPO's last step
    score_gain: float | None  # reward-model score at PPO's last step minus at its first
    win_rate: WinRate | None  # human votes on v+1 against v


def round_history(run: Run) -> list[RoundSummary]:
    games = run(version_games)
    summaries = []
    for round_ in run(list_rounds):
        ppo_job = next((j for j in run(round_jobs, round_.id) if j.kind == "ppo"), None)
        accuracy = None
        if round_.reward_version is not None:
            accuracy = run(get_reward_model, round_.reward_version).metrics.get("eval_accuracy")
        kl = score_gain = None
        if ppo_job is not None and ppo_job.status == "done":
            kl = run(job_metrics, ppo_job.id).get("kl")
            scores = [v for _, v in run(metric_series, ppo_job.id, "score")]
            score_gain = scores[-1] - scores[0] if scores else None
        win_rate = head_to_head(games, round_.policy_to, round_.policy_from) if round_.policy_to is not None else None
        summaries.append(RoundSummary(
            round_, accuracy, ppo_job.config["ppo"] if ppo_job else {}, ppo_job.id if ppo_job else None, kl, score_gain, win_rate,
        ))
    return summaries


def ratings(run: Run) -> dict[int, float]:
    """Arena-style Bradley-Terry ratings of every policy version in the cross-version votes; v0 is 1000."""
    return bradley_terry(run(version_games))


MIN_VOTES_FOR_WARNING = 10
LENGTH_DRIFT = 1.5  # new mean length over old, either way
REPETITION_DRIFT = 0.10  # rise in the share of repeated word trigrams


def hacking_warnings(run: Run, history: list[RoundSummary]) -> list[str]:
    """The signs of reward hacking in finished rounds: reward up while people do not prefer the result,
    and drift in length or repetition between the old and new policy's answers to the round's pairs."""
    warnings = []
    for summary in history:
        round_, win = summary.round, summary.win_rate
        if round_.policy_to is None:
            continue
        name = f"round {round_.id} (v{round_.policy_to} from v{round_.policy_from})"
        if summary.score_gain is not None and summary.score_gain > 0 and win is not None and win.votes >= MIN_VOTES_FOR_WARNING and win.rate <= 0.5:
            warnings.append(
                f"{name}: the reward model's score rose by {summary.score_gain:.2f} during PPO, but annotators preferred "
                f"the new policy in only {win.rate:.0%} of {win.votes} votes"
            )
        texts = run(paired_texts, round_.policy_to, round_.policy_from)
        old, new = texts[round_.policy_from], texts[round_.policy_to]
        if not old or not new:
            continue
        old_length, new_length = _mean_length(old), _mean_length(new)
        if old_length and new_length and max(new_length / old_length, old_length / new_length) >= LENGTH_DRIFT:
            warnings.append(f"{name}: responses drifted in length, {old_length:.0f} to {new_length:.0f} tokens on average")
        old_repeats, new_repeats = repeated_trigram_share(old), repeated_trigram_share(new)
        if new_repeats - old_repeats >= REPETITION_DRIFT:
            warnings.append(f"{name}: repeated phrases rose from {old_repeats:.0%} to {new_repeats:.0%} of word trigrams")
    return warnings


def _mean_length(completions: list[tuple[int | None, str]]) -> float | None:
    counts = [n for n, _ in completions if n is not None]
    return sum(counts) / len(counts) if counts else None


def repeated_trigram_share(completions: list[tuple[int | None, str]]) -> float:
    """The share of word trigrams that repeat an earlier one in the same response: a measure of degenerate loops."""
    total = repeated = 0
    for _, text in completions:
        words = re.findall(r"\w+", text.lower())
        trigrams = list(zip(words, words[1:], words[2:]))
        total += len(trigrams)
        repeated += len(trigrams) - len(set(trigrams))
    return repeated / total if total else 0.0


def describe(summary: RoundSummary) -> dict[str, Any]:
    """One row of the round history, as the CLI and the app show it."""
    round_, win = summary.round, summary.win_rate
    return {
        "round": round_.id,
        "status": round_.status,
        "policy": f"v{round_.policy_from} → v{round_.policy_to}" if round_.policy_to is not None else f"v{round_.policy_from} →",
        "reward model": f"v{round_.reward_version}" if round_.reward_version is not None else "",
        "RM accuracy": _percent(summary.reward_accuracy),
        "PPO": ", ".join(f"{k} {summary.ppo[k]}" for k in ("steps", "batch_size", "learning_rate", "kl_coef", "target_kl") if k in summary.ppo),
        "KL": "" if summary.kl is None else f"{summary.kl:.2f}",
        "win rate": "" if win is None or win.rate is None else f"{win.rate:.0%} [{win.low:.0%}, {win.high:.0%}]",
        "votes": 0 if win is None else win.votes,
    }


def _percent(value: float | None) -> str:
    return "" if value is None else f"{value:.1%}"
