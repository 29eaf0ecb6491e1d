"""A training round as a state machine, in the order it happens.

A round starts from a version v (the newest, or the best rated by people), trains a reward model on a snapshot of the
comparisons (or takes a chosen version), trains [round] candidates policies, each with its own seed (by DPO a new
adapter from v0 on every vote, [dpo] refit; by PPO or GRPO from v), and lets a predictor rate their average (or each)
against v by the reward model on fresh answers to the held-back prompts. Their average, within the KL budget (pulled
back into it where past), is registered as v+1 ([round] register = "average"; or the candidate rated best, with
confidence or not, or none, and the votes carry over). Then completions of v (where it has too few) and of v+1 on the
held-back prompts, each of v+1's paired with one of v's for the annotators: the votes on those pairs are the round's
human win rate.

Its stages (store.rounds.Stage) and the moves between them (store.rounds.TRANSITIONS):

    reward_model -> candidates -> candidates ... -> predictor -> start_answers -> pairs -> done
                               \-> done (too few pairs)       \-> pairs -> done
                                                             \-> done (none registered)
    any of them -> failed, cancelled

Each stage queues one job (STAGE_JOBS); when it is done, NEXT_STAGE says which stage follows, so that the app's job
queue and `tether round` run a round the same way: `start_round`, then `advance_round` after each of its jobs. What
each job is given is ui.owner.round_jobs's; taking in what it made, the predictor's choice among the candidates,
ui.owner.ingest's; the round in words, ui.owner.round_report's.

When people rate a new version below a better one, the next round starts from the better one
([round] start_from = "best"), or `roll_back` (ui.owner.rollback) registers a copy of it by hand.
"""

import time
from collections import Counter
from typing import Callable

from annotate.ratings import Game, bradley_terry, lead_probability
from store import StoreError
from store.db import utcnow
from store.jobs import Job
from store.policies import get_policy
from store.reward_models import RewardModel, get_reward_model
from store.rounds import FINISHED, Round, Stage, add_note, add_candidate, add_round, get_round, move_round, round_candidates, set_choice
from store.stats import version_games
from train.runtime.job_configs import parse_job_config
from ui.owner.config import OPTIMIZERS, TetherConfig
from ui.owner.jobs import JobError, Run, run_here
from ui.owner.project import Project
from ui.owner.rollback import roll_back
from ui.owner.round_jobs import (SUBMIT_WITH_REWARD_MODEL, TooFewPairs, dpo_votes, held_back_prompts, newest_reward_model, reward_training,
                                 steers, submit_dpo, submit_generation, submit_prediction, submit_reward_training)
from ui.owner.round_report import JOB_NAMES, trust_status


def start_round(project: Project, run: Run, *, reward_version: int | None = None, read: Run | None = None,
                optimizer: str | None = None) -> tuple[int, Job | None]:
    """Start a round with `optimizer` ([round] optimizer by default); return its id and its first job, None where it
    ended at once (DPO on too few pairs). `read` reads the votes beside the writer, as for submit_reward_training.

    Its start is the newest version, or with [round] start_from = "best" the version people rate best, once they rate
    it above the newest with confidence (`best_rated`): a copy of it is registered as the newest first, as a rollback
    does. Its reward model trains on every vote so far, unless given a version; where the votes hold nothing the newest
    version has not trained on, with the same settings, that version is reused, and the round says so. A round whose
    optimiser would have nothing to learn is refused before anything is recorded or trained (check_something_to_learn).
    """
    optimizer = optimizer or project.config.round.optimizer
    if optimizer not in OPTIMIZERS:
        raise StoreError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    if reward_version is not None:
        run(get_reward_model, reward_version)  # fails now, not after a round was recorded
    notes, training = [], None
    if reward_version is None:
        training = reward_training(project, run, read=read)
        if (reward_version := training.reusable_version) is not None:
            notes.append(f"reward model v{reward_version} reused: the votes hold nothing it did not train on")
    best = best_rated(run) if project.config.round.start_from == "best" else None
    check_something_to_learn(project, run, optimizer, reward_version, best, read)
    if best is not None:
        newest = run(get_policy, None).version
        confidence = lead_probability(run(version_games), best, newest)
        copy = roll_back(project, run, best)
        notes.insert(0, f"starts from v{best}, which people rate above the newest, v{newest}, with {confidence:.0%} confidence "
                        f"([round] start_from = \"best\"): a copy of it is v{copy.version}")
    round_ = run(add_round, run(get_policy, None).version, reward_version, optimizer, "; ".join(notes) or None)
    try:
        if round_.stage is Stage.REWARD_MODEL:
            return round_.id, submit_reward_training(project, run, round_id=round_.id, read=read, training=training)
        return round_.id, _next_candidate(project, run, round_)
    except StoreError as e:
        run(move_round, round_.id, Stage.FAILED, utcnow(), str(e))
        raise


def check_something_to_learn(project: Project, run: Run, optimizer: str, reward_version: int | None, start: int | None,
                             read: Run | None = None) -> None:
    """Refuse (JobError) a round whose optimiser would have nothing to train on: DPO on the votes alone, asked for or
    what 'auto' would choose by the trust of the reward model it would use now (the newest, without a given one), with
    fewer than [round] min_pairs votes outside the held-back prompts that the start has not learnt. PPO and GRPO learn
    from the reward model, and DPO with [dpo] pairs other than "human" from the pairs it ranks: those always start."""
    pairs = project.config.dpo.pairs
    if optimizer == "auto":
        known = run(get_reward_model, reward_version) if reward_version is not None else run(newest_reward_model)
        optimizer, pairs = ("dpo" if known is None else choose_optimizer(known, project.config)[0]), "human"
    if optimizer != "dpo" or pairs != "human":
        return
    start = start if start is not None else run(get_policy, None).version
    votes = dpo_votes(project, run, project.config.dpo, start, read)
    if len(votes) < project.config.round.min_pairs:
        raise JobError(f"DPO on the votes would train policy v{start} on {len(votes)} pairs it has not "
                       f"learnt outside the held-back prompts, fewer than [round] min_pairs = {project.config.round.min_pairs}: "
                       "collect votes on the pairs `tether generate` makes")


# The start


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



# The moves: which stage follows each stage's job, and the job each stage queues


def _after_candidates(project: Project, run: Run, round_: Round) -> Stage:
    trained = len(run(round_candidates, round_.id))
    return Stage.CANDIDATES if trained < project.config.round.candidates else Stage.PREDICTOR


def _after_predictor(project: Project, run: Run, round_: Round) -> Stage:
    if round_.policy_to is None:  # nothing registered: the votes carry over
        return Stage.DONE
    return Stage.START_ANSWERS if _start_answers_missing(project, run, round_) else Stage.PAIRS


NEXT_STAGE: dict[Stage, Callable[[Project, Run, Round], Stage]] = {
    Stage.REWARD_MODEL: lambda project, run, round_: Stage.CANDIDATES,
    Stage.CANDIDATES: _after_candidates,
    Stage.PREDICTOR: _after_predictor,
    Stage.START_ANSWERS: lambda project, run, round_: Stage.PAIRS,
    Stage.PAIRS: lambda project, run, round_: Stage.DONE,
}


def advance_round(project: Project, run: Run, job: Job) -> Job | None:
    """After one of a round's jobs finished: move the round to the stage that follows and queue its job, or end the
    round. Returns the next job."""
    round_ = run(get_round, job.round)
    if round_.stage in FINISHED:  # cancelled by an operator while this job finished
        return None
    if job.status != "done":
        ended = Stage.CANCELLED if job.status == "cancelled" else Stage.FAILED
        run(move_round, round_.id, ended, utcnow(), f"{JOB_NAMES[job.kind]}: {job.error}")
        return None
    try:
        return _enter(project, run, round_, NEXT_STAGE[round_.stage](project, run, round_))
    except StoreError as e:
        run(move_round, round_.id, Stage.FAILED, utcnow(), str(e))
        raise


def _enter(project: Project, run: Run, round_: Round, stage: Stage) -> Job | None:
    """Move the round to `stage` and queue that stage's job; None where the round ends there, or was cancelled meanwhile."""
    if not run(move_round, round_.id, stage, utcnow() if stage in FINISHED else None) or stage in FINISHED:
        return None
    return STAGE_JOBS[stage](project, run, run(get_round, round_.id))


def _next_candidate(project: Project, run: Run, round_: Round) -> Job | None:
    """The round's next candidate, from its start with that candidate's data_seed; with 'auto', the optimiser chosen first.

    By the round's optimiser where the round registers their average (alike adapters average well), else the first by
    it and the others by DPO, the cheapest, so that a PPO or GRPO round has an alternative at little cost. Where one
    cannot be trained (DPO beside PPO, with no vote the start has not learnt), the round goes on to the predictor with
    the candidates so far; where the first cannot, as DPO on the votes alone would have too few pairs, it ends.
    """
    if round_.optimizer == "auto":
        run(set_choice, round_.id, *choose_optimizer(run(get_reward_model, round_.reward_version), project.config))
        round_ = run(get_round, round_.id)
    number = len(run(round_candidates, round_.id))
    optimizer = round_.optimizer if number == 0 or project.config.round.register == "average" else "dpo"
    try:
        if optimizer == "dpo":
            # DPO on the votes alone where 'auto' chose it (the reward model does not steer), or beside another optimiser.
            pairs = "human" if round_.optimizer != "dpo" or round_.chosen_by_auto else None
            job = submit_dpo(project, run, reward_version=round_.reward_version, policy_version=round_.policy_from,
                             round_id=round_.id, pairs=pairs, candidate=number, min_pairs=project.config.round.min_pairs)
        else:
            job = SUBMIT_WITH_REWARD_MODEL[optimizer](project, run, reward_version=round_.reward_version, policy_version=round_.policy_from,
                                                      round_id=round_.id, candidate=number)
    except JobError as e:
        if number == 0 and not isinstance(e, TooFewPairs):
            raise
        wanted = project.config.round.candidates
        run(add_note, round_.id, f"{number} of [round] candidates = {wanted} trained: {e}" if number else str(e))
        return _enter(project, run, round_, Stage.PREDICTOR if number else Stage.DONE)
    run(add_candidate, round_.id, job.id, optimizer, getattr(parse_job_config(job.kind, job.config), optimizer).data_seed)
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
    reward = f"the heads' mean less {penalty:g} times their spread" if penalty else "the heads' mean"
    return chosen, f"{AUTO_NOTE}{chosen.upper()} against reward model v{reward_model.version}, which {status}; its reward is {reward}"




def _start_answers_missing(project: Project, run: Run, round_: Round) -> list:
    """The held-back prompts the round's start has fewer than [round] per_prompt completions of."""
    return [p for p in held_back_prompts(project, run, round_.policy_from) if p.completions < project.config.round.per_prompt]


STAGE_JOBS: dict[Stage, Callable[[Project, Run, Round], Job | None]] = {
    Stage.CANDIDATES: _next_candidate,
    Stage.PREDICTOR: lambda project, run, round_: submit_prediction(project, run, round_, run(round_candidates, round_.id)),
    Stage.START_ANSWERS: lambda project, run, round_: submit_generation(
        project, run, per_prompt=project.config.round.per_prompt, policy_version=round_.policy_from,
        prompts=_start_answers_missing(project, run, round_), round_id=round_.id),
    Stage.PAIRS: lambda project, run, round_: submit_generation(
        project, run, per_prompt=project.config.round.per_prompt, policy_version=round_.policy_to,
        prompts=held_back_prompts(project, run, round_.policy_to), against=round_.policy_from, round_id=round_.id),
}


def run_round(project: Project, *, reward_version: int | None = None, optimizer: str | None = None,
              seconds: Counter | None = None) -> Round:
    """Run a round's jobs from this process, one after another, each with a progress bar; add each job's wall time to
    `seconds`, by its name. A round that does not finish is a StoreError naming why."""
    round_id, job = start_round(project, project.run, reward_version=reward_version, optimizer=optimizer)
    while job is not None:
        began = time.monotonic()
        done = run_here(project, job, JOB_NAMES[job.kind])
        if seconds is not None:
            seconds[JOB_NAMES[done.kind]] += time.monotonic() - began
        job = advance_round(project, project.run, done)
    round_ = project.run(get_round, round_id)
    if round_.status != "done":
        raise StoreError(f"round {round_id} {round_.status}: {round_.error}")
    return round_
