"""Training rounds: a chain of jobs that turns the votes so far into the next policy version, or into none.

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

When people rate a new version below a better one, the next round starts from the better one
([round] start_from = "best"), or `roll_back` registers a copy of it by hand.
"""

import os
import re
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from annotate.ratings import (
    Game, LengthControlled, Vote, WinRate, bradley_terry, head_to_head, lead_probability, length_controlled, measured_share,
)
from store import Connection, StoreError
from store.db import utcnow
from store.jobs import Job, job_metrics, metric_series, round_jobs
from store.completions import completions_of, paired_texts
from store.policies import POLICY_JOBS, Policy, add_rollback, get_policy, plan_rollback, policy_versions
from store.prompts import Prompt, prompts_to_generate
from store.reward_models import RewardModel, get_reward_model, list_reward_models
from store.rounds import (
    AVERAGE, Candidate, Round, add_candidate, add_note, add_round, finish_round, get_round, list_rounds, round_candidates, set_choice,
)
from store.stats import version_games, version_votes
from train.files import built_beside, file_digests, failure_reason
from ui.owner.config import OPTIMIZERS, TetherConfig
from train.config import RewardModelConfig
from ui.owner.jobs import (
    JobError, Run, TooFewPairs, is_held_back, reward_training, run_here, scoring_kind, steers, submit_dpo, submit_generation, submit_grpo,
    submit_ppo, submit_prediction, submit_reward_training, trust_status,
)
from ui.owner.project import Project

STAGES = {"reward_model": "reward model", "ppo": "PPO", "dpo": "DPO", "grpo": "GRPO", "predict": "predictor", "generate": "completions"}
SUBMIT_WITH_REWARD_MODEL = {"ppo": submit_ppo, "grpo": submit_grpo}


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
       candidate rated best with confidence, or none (ingest_prediction);
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


def best_rated(run: Run) -> int | None:
    """The version to start from under [round] start_from = "best": the best rated by people's votes, where they rate it
    above the newest with LEAD_CONFIDENCE; None where that is the newest, or the votes do not say so."""
    return rollback_target(run(version_games), run(get_policy, None).version)


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


def _submit_candidate(project: Project, run: Run, round_: Round, number: int) -> Job:
    """Candidate `number` (from 0) of the round, from the round's start with that candidate's data_seed: by the round's
    optimiser where the round registers their average (alike adapters average well), else the first by it and the
    others by DPO, the cheapest, so that a PPO or GRPO round has an alternative at little cost."""
    optimizer = round_.optimizer if number == 0 or project.config.round.register == "average" else "dpo"
    if optimizer == "dpo":
        # DPO on the votes alone where 'auto' chose it (the reward model does not steer), or beside another optimiser.
        pairs = "human" if round_.optimizer != "dpo" or _chosen_by_auto(round_) else None
        job = submit_dpo(project, run, round_.reward_version, round_.policy_from, round_.id, pairs=pairs, candidate=number,
                         min_pairs=project.config.round.min_pairs)
    else:
        job = SUBMIT_WITH_REWARD_MODEL[optimizer](project, run, round_.reward_version, round_.policy_from, round_.id, candidate=number)
    run(add_candidate, round_.id, job.id, optimizer, job.config[optimizer]["data_seed"])
    return job


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
    reward_pairs: int | None  # the held-out pairs it was measured on
    optimizer: str | None  # the kind of the job that trained the new policy: "ppo", "dpo" or "grpo"
    settings: dict[str, Any]  # the settings that job ran with
    policy_job: int | None
    # The registered version's KL to v0 on the predictor's answers, the one measure [round] kl_budget holds (for a round
    # from before the predictor, PPO's or GRPO's at its last step).
    kl: float | None
    kl_to_parent: float | None  # KL to the version PPO started from, on its training batch at its last step
    ended: float | None  # share of PPO's or GRPO's responses that ended within the length budget, at the last step
    score_gain: float | None  # reward-model score at PPO's or GRPO's last step minus at its first
    margin: float | None  # DPO's implicit reward margin of chosen over rejected, the mean over its steps
    pair_accuracy: float | None  # DPO's share of pairs whose chosen response has the larger implicit reward, the mean over its steps
    pairs: tuple[int, int] | None  # DPO's pairs from votes and pairs the reward model ranked
    label_smoothing: float | None  # the share of flipped labels DPO's robust loss corrected for; 0 for plain DPO
    win_rate: WinRate | None  # human votes on v+1 against v
    length_controlled: LengthControlled | None  # the same votes' win rate at equal length
    # The round's reward model's accuracy on the votes that came after it was trained (mostly on
    # v+1's answers), as the next reward-model version recorded it; None until one does.
    new_votes_accuracy: float | None
    new_votes_pairs: int | None
    reward_model_kind: str | None  # which reward model scored: "head" or "LoRA", and for kind "auto" which of the two steered
    candidates: list[Candidate]  # the policies the round trained, with the predictor's verdict on each

    @property
    def registered_average(self) -> bool:
        """The round registered its candidates' average, which has no training of its own."""
        return any(c.chosen and c.optimizer == AVERAGE for c in self.candidates)


def round_history(run: Run) -> list[RoundSummary]:
    votes = run(version_votes)
    games = [vote[:3] for vote in votes]
    reward_models = {rm.version: rm for rm in run(list_reward_models)}
    candidates = run(round_candidates, None)
    return [_summarise(run, round_, games, votes, reward_models, [c for c in candidates if c.round == round_.id])
            for round_ in run(list_rounds)]


def round_summary(run: Run, round_id: int) -> RoundSummary:
    """One round's figures: its human win rate, raw and length-controlled, and its reward model's accuracy on the new votes."""
    return next(s for s in round_history(run) if s.round.id == round_id)


def _summarise(run: Run, round_: Round, games: list[Game], votes: list[Vote], reward_models: dict[int, RewardModel],
               candidates: list[Candidate]) -> RoundSummary:
    jobs = run(round_jobs, round_.id)
    registered = next((c for c in candidates if c.chosen), None)
    if candidates:  # the one the round registered, if any; the candidates' average stands for its first's training
        trained = None if registered is None else candidates[0].job if registered.optimizer == AVERAGE else registered.job
        policy_job = next((j for j in jobs if j.id == trained), None)
    else:  # a round from before candidates: its one policy job
        policy_job = next((j for j in jobs if j.kind in POLICY_JOBS), None)
    metrics = reward_models[round_.reward_version].metrics if round_.reward_version in reward_models else {}
    accuracy, held_out = metrics.get("eval_accuracy"), metrics.get("pairs_eval")
    kl = kl_to_parent = ended = score_gain = margin = pair_accuracy = pairs = smoothing = None
    if policy_job is not None and policy_job.status == "done":
        last = run(job_metrics, policy_job.id)
        # Over all DPO's steps, not its last batch's few pairs; in its first epoch each batch is scored before it is learnt.
        margin, pair_accuracy = (_mean([v for _, v in run(metric_series, policy_job.id, name)]) for name in ("margin", "accuracy"))
        if "pairs_human" in last:
            pairs = (int(last["pairs_human"]), int(last["pairs_reward_model"]))
        smoothing = last.get("label_smoothing")
        kl, kl_to_parent, ended = last.get("kl"), last.get("kl_to_start"), last.get("finished")
        scores = [v for _, v in run(metric_series, policy_job.id, "score")]
        score_gain = scores[-1] - scores[0] if scores else None
    if registered is not None and registered.optimizer == AVERAGE:  # a candidate's last step is not the average's
        kl_to_parent = ended = None
    if registered is not None and registered.kl_to_v0 is not None:
        kl = registered.kl_to_v0
    win_rate = controlled = None
    if round_.policy_to is not None:
        win_rate = head_to_head(games, round_.policy_to, round_.policy_from)
        controlled = length_controlled(votes, round_.policy_to, round_.policy_from)
    new_votes = _new_votes_metrics(round_.reward_version, reward_models)
    kind = None
    if round_.reward_version in reward_models:
        metrics = reward_models[round_.reward_version].metrics
        kind = SHORT_KINDS[metrics.get("kind", "lora")] + (f", {SHORT_KINDS[metrics['steering']]} steering" if metrics.get("kind") == "auto" else "")
    return RoundSummary(
        round_, accuracy, held_out, policy_job.kind if policy_job else None, policy_job.config[policy_job.kind] if policy_job else {},
        policy_job.id if policy_job else None, kl, kl_to_parent, ended,
        score_gain, margin, pair_accuracy, pairs, smoothing,
        win_rate, controlled, new_votes.get("new_votes_accuracy"), new_votes.get("new_votes_pairs"), kind, candidates,
    )


SHORT_KINDS = {"head": "head", "lora": "LoRA", "auto": "auto"}


def reward_model_note(run: Run, config: RewardModelConfig) -> str | None:
    """The newest reward model: which model scores for it and whether it steers the loop, and why, in words."""
    versions = run(list_reward_models)
    if not versions:
        return None
    return f"reward model v{versions[0].version}: {scoring_kind(versions[0])}; {trust_status(versions[0], config)}"


def _new_votes_metrics(reward_version: int | None, reward_models: dict[int, RewardModel]) -> dict[str, Any]:
    """The metrics of the first reward model after `reward_version` that measured it on the votes since."""
    if reward_version is None:
        return {}
    # A version trained from scratch records None: it had no previous version to measure.
    later = sorted(v for v, rm in reward_models.items() if v > reward_version and rm.metrics.get("new_votes_accuracy") is not None)
    return reward_models[later[0]].metrics if later else {}


def ratings(run: Run) -> dict[int, float]:
    """Arena-style Bradley-Terry ratings of every policy version in the cross-version votes; v0 is 1000."""
    return bradley_terry(run(version_games))


MIN_VOTES_FOR_WARNING = 10
MIN_NEW_VOTES_ACCURACY = 0.55  # below it, the reward model no longer agrees with people on the new answers
LENGTH_DRIFT = 1.5  # new mean length over old, either way
REPETITION_DRIFT = 0.10  # rise in the share of repeated word trigrams


def round_warnings(run: Run, history: list[RoundSummary], start_from: str) -> list[str]:
    """What needs an operator's eye in finished rounds: people rating the new policy below the one it
    started from, a reward model that no longer agrees with people, drift in length or repetition
    between the old and new policy's answers; and, last, a better version than the newest, which the
    next round starts from with [round] start_from = "best" and which to roll back to otherwise."""
    games = run(version_games)
    scores = bradley_terry(games)
    warnings = []
    for summary in history:
        round_ = summary.round
        if round_.policy_to is None:
            continue
        name = f"round {round_.id} (v{round_.policy_to} from v{round_.policy_from})"
        warnings += [f"{name}: {w}" for w in _warnings_of(run, summary, scores)]
    newest = run(get_policy, None).version
    if (target := rollback_target(games, newest)) is not None:
        below = f"people rate the newest policy v{newest} ({scores[newest]:.0f}) below v{target} ({scores[target]:.0f})"
        warnings.append(f"{below}: the next round starts from v{target} ([round] start_from = \"best\")" if start_from == "best" else
                        f"{below}: roll back to v{target} (`tether rollback {target}`, or Roll back in the Loop view) so the next "
                        "round starts from it")
    return warnings


def _warnings_of(run: Run, summary: RoundSummary, scores: dict[int, float]) -> list[str]:
    warnings = []
    if below := _rated_below_parent(summary, scores):
        if summary.score_gain is not None and summary.score_gain > 0:
            below += f", although the reward model's score rose by {summary.score_gain:.2f} during PPO: a sign of reward hacking"
        warnings.append(below)
    accuracy, pairs = summary.new_votes_accuracy, summary.new_votes_pairs
    if accuracy is not None and pairs is not None and pairs >= MIN_VOTES_FOR_WARNING and accuracy < MIN_NEW_VOTES_ACCURACY:
        warnings.append(
            f"reward model v{summary.round.reward_version} agrees with people on only {accuracy:.0%} of the {pairs} votes "
            f"that came after it was trained: it no longer tracks what people prefer in the new policy's answers"
        )
    return warnings + _drift_warnings(run, summary.round)


def _rated_below_parent(summary: RoundSummary, scores: dict[int, float]) -> str | None:
    """Whether people rate the round's new version below the one it started from, in words with the figures.

    Both signs need MIN_VOTES_FOR_WARNING votes on the round's pairs: a rating from a vote or two
    is noise, and Bradley-Terry's prior makes a single lost vote a gap of some 190 points.
    """
    new, old, win = summary.round.policy_to, summary.round.policy_from, summary.win_rate
    if win is None or win.votes < MIN_VOTES_FOR_WARNING:
        return None
    rated_below = new in scores and old in scores and scores[new] < scores[old]
    lost = win.rate < 0.5
    if not rated_below and not lost:
        return None
    figures = [f"won {win.rate:.0%} [{win.low:.0%}, {win.high:.0%}] of {win.votes} votes against v{old}"]
    if new in scores and old in scores:
        figures.append(f"Bradley-Terry rating {scores[new]:.0f} against v{old}'s {scores[old]:.0f}")
    return f"people rate v{new} below v{old}: it " + ", ".join(figures)


LEAD_CONFIDENCE = 0.9  # how sure people's votes must make it that a version beats the newest, to go back to it


def rollback_target(games: list[Game], newest: int) -> int | None:
    """The best-rated version, when people rate the newest policy below it with LEAD_CONFIDENCE; each with
    MIN_VOTES_FOR_WARNING votes or more. A lead of a few votes is noise: at 70% agreement, 10 votes on two
    equal versions split 7 to 3 one time in six."""
    votes = Counter(v for a, b, _ in games for v in (a, b))
    scores = {v: r for v, r in bradley_terry(games).items() if votes[v] >= MIN_VOTES_FOR_WARNING}
    if newest not in scores:
        return None
    best = max(scores, key=scores.get)
    return best if best != newest and lead_probability(games, best, newest) >= LEAD_CONFIDENCE else None


def _drift_warnings(run: Run, round_: Round) -> list[str]:
    """Drift in length or repetition between the old and new policy's answers to the round's pairs."""
    texts = run(paired_texts, round_.policy_to, round_.policy_from)
    old, new = texts[round_.policy_from], texts[round_.policy_to]
    if not old or not new:
        return []
    warnings = []
    old_length, new_length = _mean_length(old), _mean_length(new)
    if old_length and new_length and max(new_length / old_length, old_length / new_length) >= LENGTH_DRIFT:
        warnings.append(f"responses drifted in length, {old_length:.0f} to {new_length:.0f} tokens on average")
    old_repeats, new_repeats = repeated_trigram_share(old), repeated_trigram_share(new)
    if new_repeats - old_repeats >= REPETITION_DRIFT:
        warnings.append(f"repeated phrases rose from {old_repeats:.0%} to {new_repeats:.0%} of word trigrams")
    return warnings


def roll_back(project: Project, run: Run, version: int) -> Policy:
    """Register a new policy version that copies `version`, so the next round starts from it.

    Nothing is deleted: the versions given up keep their adapters, votes and ratings, and the
    new version records which one was newest when it was made.
    """
    plan = run(plan_rollback, version)
    if plan.to.adapter_path is None:  # the starting model: nothing to copy
        return run(add_rollback, plan, None)
    target = project.root / "policies" / f"v{plan.version}"
    copy = _copy_atomically(project.root / plan.to.adapter_path, target)
    try:
        return run(add_rollback, plan, str(target.relative_to(project.root)), file_digests(target))
    except BaseException:
        run(_remove_copy, target, copy)
        raise


def _copy_atomically(source: Path, target: Path) -> os.stat_result:
    """Copy a directory to `target`, built beside it and renamed into place: `target` is whole or absent. Returns the
    copy's identity, which stays with it wherever it is moved."""
    if target.exists():
        raise StoreError(f"{target} exists already: move it away, then roll back again")
    try:
        with built_beside(target) as built:
            shutil.copytree(source, built)
        return target.stat()
    except OSError as e:
        raise StoreError(f"cannot copy the adapter {source} to {target}: {failure_reason(e)}; nothing was copied") from None


def _remove_copy(con: Connection, target: Path, copy: os.stat_result) -> None:
    """Remove a rollback's copy that was not registered, if it is still at `target`.

    A job's ingest that registered the same version meanwhile has set the copy aside and put its
    own adapter there, which must stay. Run as the writer, so no ingest moves either meanwhile.
    """
    try:
        if os.path.samestat(target.stat(), copy):
            shutil.rmtree(target)
    except FileNotFoundError:
        pass


def _mean_length(completions: list[tuple[int | None, str]]) -> float | None:
    return _mean([n for n, _ in completions if n is not None])


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def repeated_trigram_share(completions: list[tuple[int | None, str]]) -> float:
    """The share of word trigrams that repeat an earlier one in the same response: a measure of degenerate loops."""
    total = repeated = 0
    for _, text in completions:
        words = re.findall(r"\w+", text.lower())
        trigrams = list(zip(words, words[1:], words[2:]))
        total += len(trigrams)
        repeated += len(trigrams) - len(set(trigrams))
    return repeated / total if total else 0.0


def round_report(run: Run, config: TetherConfig) -> list[str]:
    """The round history as a text table, the ratings, the newest reward model and the warnings, line by line."""
    history = round_history(run)
    if not history:
        return ["no rounds yet: start one with `tether round`"]
    rows = [describe(s) for s in history]
    notes = [f"round {row['round']}: {why}" for row in rows if (why := row.pop("why"))]
    widths = {k: max(len(k), *(len(str(r[k])) for r in rows)) for k in rows[0]}
    lines = ["  ".join(k.ljust(w) for k, w in widths.items())]
    lines += ["  ".join(str(row[k]).ljust(w) for k, w in widths.items()) for row in rows]
    lines += notes
    if scores := ratings(run):
        lines.append("ratings (Bradley-Terry, v0 = 1000): " + ", ".join(f"v{v} {r:.0f}" for v, r in sorted(scores.items())))
    if ended := ended_answers(run):
        lines.append("answers that ended, not cut at the length limit: "
                     + ", ".join(f"v{v} {done / total:.0%} of {total}" for v, (done, total) in ended.items()))
    if note := reward_model_note(run, config.reward_model):
        lines.append(note)
    lines += [f"warning: {warning}" for warning in round_warnings(run, history, config.round.start_from)]
    return lines


def ended_answers(run: Run) -> dict[int, tuple[int, int]]:
    """Of each policy version's answers to the active prompts, how many ended, and of how many: annotators can only
    judge an answer that ends, and a version that learned to end its answers shows here."""
    ended = {}
    for version in run(policy_versions):
        answers = run(completions_of, version, [p.id for p in run(prompts_to_generate, version, None)])
        if answers:
            ended[version] = (sum(a.finished for a in answers), len(answers))
    return ended


def describe(summary: RoundSummary) -> dict[str, Any]:
    """One row of the round history, as the CLI and the app show it."""
    round_, win, lc = summary.round, summary.win_rate, summary.length_controlled
    return {
        "round": round_.id,
        "status": round_.status,
        "policy": f"v{round_.policy_from} → v{round_.policy_to}" if round_.policy_to is not None else f"v{round_.policy_from} →",
        "ran": round_.optimizer.upper() + (" (auto)" if _chosen_by_auto(round_) else ""),
        "reward model": f"v{round_.reward_version} ({summary.reward_model_kind})" if summary.reward_model_kind else "",
        "RM accuracy": "" if summary.reward_pairs is None else measured_share(summary.reward_accuracy, summary.reward_pairs),
        "optimizer": _settings(summary),
        "KL to v0": "" if summary.kl is None else f"{summary.kl:.2f}",
        "KL to parent": "" if summary.kl_to_parent is None else f"{summary.kl_to_parent:.2f}",
        "ended": _percent(summary.ended),
        "win rate": "" if win is None or win.rate is None else f"{win.rate:.0%} [{win.low:.0%}, {win.high:.0%}]",
        "length-controlled": "" if lc is None else f"{lc.rate:.0%} [{lc.low:.0%}, {lc.high:.0%}]",
        "votes": 0 if win is None else win.votes,
        "RM on new votes": "" if summary.new_votes_accuracy is None else measured_share(summary.new_votes_accuracy, summary.new_votes_pairs, "votes"),
        "candidates": candidates_text(summary.candidates),
        "why": round_.note or "",
    }


def candidates_text(candidates: list[Candidate]) -> str:
    """The predictor's verdict on a round's candidates in one line: each one's predicted win rate over the round's
    start, the registered one marked."""
    if not candidates:
        return ""
    if all(c.win_rate is None for c in candidates):
        return f"{len(candidates)} trained, not yet rated"
    shown = [f"{c.optimizer.upper()} {c.win_rate:.0%} [{c.low:.0%}, {c.high:.0%}]" + (" registered" if c.chosen else "")
             for c in candidates if c.win_rate is not None]
    return ", ".join(shown) + ("" if any(c.chosen for c in candidates) else "; none registered")


def _chosen_by_auto(round_: Round) -> bool:
    return round_.note is not None and AUTO_NOTE in round_.note


# The settings the round history shows for each optimiser.
SHOWN_SETTINGS = {
    "ppo": ("steps", "batch_size", "learning_rate", "kl_coef", "target_kl"),
    "dpo": ("pairs", "beta", "votes", "epochs", "batch_size", "learning_rate"),
    "grpo": ("steps", "prompts_per_step", "group_size", "learning_rate", "beta"),
}


def _settings(summary: RoundSummary) -> str:
    if summary.optimizer is None:
        return ""
    shown = ", ".join(f"{k} {summary.settings[k]}" for k in SHOWN_SETTINGS[summary.optimizer] if k in summary.settings)
    if summary.label_smoothing is not None:
        shown += f", label_smoothing {summary.label_smoothing:.2f}" + (" (auto)" if summary.settings.get("label_smoothing") == "auto" else "")
    if summary.pairs is not None:
        shown += f"; trained on {summary.pairs[0]} human pairs and {summary.pairs[1]} ranked by the reward model"
    return f"{summary.optimizer.upper()}: {shown}"


def _percent(value: float | None) -> str:
    return "" if value is None else f"{value:.1%}"
