"""Training rounds: which policy a round started from, the stage it is at, and what it produced.

A round is a state machine: its stage (Stage) moves only along TRANSITIONS, by move_round. Which job each stage
queues, and which stage follows a finished job, is the owner's (ui.owner.round).
"""

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from store.db import Connection, StoreError


class Stage(StrEnum):
    REWARD_MODEL = "reward_model"  # its reward model trains
    CANDIDATES = "candidates"  # its candidate policies train, one job each
    PREDICTOR = "predictor"  # the predictor rates them against the start, and registers one or none
    START_ANSWERS = "start_answers"  # the start answers the held-back prompts it has too few answers to
    PAIRS = "pairs"  # the new version answers them, each answer paired with one of the start's for people to judge
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


FINISHED = (Stage.DONE, Stage.FAILED, Stage.CANCELLED)
# The stages that may follow each running one; any running stage may also fail or be cancelled.
TRANSITIONS: dict[Stage, tuple[Stage, ...]] = {
    Stage.REWARD_MODEL: (Stage.CANDIDATES,),
    # The next candidate, or all of them rated; done where the first cannot train (DPO on the votes alone, too few pairs).
    Stage.CANDIDATES: (Stage.CANDIDATES, Stage.PREDICTOR, Stage.DONE),
    Stage.PREDICTOR: (Stage.START_ANSWERS, Stage.PAIRS, Stage.DONE),  # done: none registered, the votes carry over
    Stage.START_ANSWERS: (Stage.PAIRS,),
    Stage.PAIRS: (Stage.DONE,),
}


def allowed(stage: Stage, to: Stage) -> bool:
    return stage not in FINISHED and (to in TRANSITIONS[stage] or to in (Stage.FAILED, Stage.CANCELLED))


@dataclass(frozen=True)
class Round:
    id: int
    status: str  # running, or the finished stage: done, failed or cancelled
    policy_from: int
    reward_version: int | None
    policy_to: int | None
    comparisons_at_start: int
    error: str | None
    created_at: datetime
    finished_at: datetime | None
    optimizer: str  # auto (until it has chosen), ppo, dpo or grpo
    note: str | None  # what the round decided on its own, and why
    stage: Stage
    chosen_by_auto: bool  # [round] optimizer = "auto" chose the optimiser, by the reward model's trust

    def __post_init__(self):
        object.__setattr__(self, "stage", Stage(self.stage))


_COLUMNS = ("id, status, policy_from, reward_version, policy_to, comparisons_at_start, error, created_at, finished_at, optimizer, "
            "note, stage, chosen_by_auto")


def comparisons_made(con: Connection) -> int:
    """Votes cast in this project, by people or simulated annotators; imported ones and the AI judge's do not count."""
    return con.execute("SELECT count(*) FROM comparisons WHERE source NOT IN ('import', 'ai')").fetchone()[0]


def votes_held(con: Connection) -> int:
    """Every vote the project holds, whoever cast it: what a round's training may rest on ([round] kl_per_vote)."""
    return con.execute("SELECT count(*) FROM comparisons").fetchone()[0]


def add_round(con: Connection, policy_from: int, reward_version: int | None, optimizer: str = "ppo", note: str | None = None) -> Round:
    """A running round; at its reward model's stage, or given a reward model, at its candidates'."""
    if (running := running_round(con)) is not None:
        raise StoreError(f"round {running.id} is still running: cancel it or wait for it to finish")
    stage = Stage.REWARD_MODEL if reward_version is None else Stage.CANDIDATES
    row = con.execute(
        f"""
        INSERT INTO rounds (status, policy_from, reward_version, comparisons_at_start, optimizer, note, stage)
        VALUES ('running', ?, ?, ?, ?, ?, ?) RETURNING {_COLUMNS}
        """,
        [policy_from, reward_version, comparisons_made(con), optimizer, note, stage],
    ).fetchone()
    return Round(*row)


def get_round(con: Connection, round_id: int) -> Round:
    row = con.execute(f"SELECT {_COLUMNS} FROM rounds WHERE id = ?", [round_id]).fetchone()
    if row is None:
        raise StoreError(f"no round {round_id}")
    return Round(*row)


def list_rounds(con: Connection) -> list[Round]:
    return [Round(*row) for row in con.execute(f"SELECT {_COLUMNS} FROM rounds ORDER BY id").fetchall()]


def running_round(con: Connection) -> Round | None:
    row = con.execute(f"SELECT {_COLUMNS} FROM rounds WHERE status = 'running'").fetchone()
    return Round(*row) if row else None


def last_round(con: Connection) -> Round | None:
    row = con.execute(f"SELECT {_COLUMNS} FROM rounds ORDER BY id DESC LIMIT 1").fetchone()
    return Round(*row) if row else None


def scheduled_round_due(con: Connection, every: int) -> bool:
    """Whether `every` comparisons have come in since the last round started, with no round running."""
    if every <= 0 or running_round(con) is not None:
        return False
    last = last_round(con)
    return comparisons_made(con) - (last.comparisons_at_start if last else 0) >= every


def move_round(con: Connection, round_id: int, to: Stage, now: datetime | None = None, error: str | None = None) -> bool:
    """Move a round to stage `to`, as TRANSITIONS allow (a finished stage needs `now`); False where the round had
    finished already (cancelled by an operator meanwhile), which stays as it is. A move TRANSITIONS do not allow is a
    StoreError."""
    round_ = get_round(con, round_id)
    if round_.stage in FINISHED:
        return False
    if not allowed(round_.stage, to):
        raise StoreError(f"round {round_id} cannot go from stage {round_.stage} to {to}")
    status = to.value if to in FINISHED else "running"
    return con.execute(
        "UPDATE rounds SET stage = ?, status = ?, error = coalesce(?, error), finished_at = ? WHERE id = ? AND stage = ?",
        [to, status, error, now if to in FINISHED else None, round_id, round_.stage],
    ).fetchone()[0] == 1


def set_reward_version(con: Connection, round_id: int, version: int) -> None:
    con.execute("UPDATE rounds SET reward_version = ? WHERE id = ?", [version, round_id])


def set_choice(con: Connection, round_id: int, optimizer: str, note: str) -> None:
    """Record the optimiser [round] optimizer = "auto" chose for the round, and why, beside what the round says already."""
    con.execute("UPDATE rounds SET optimizer = ?, chosen_by_auto = true, note = concat_ws('; ', note, ?) WHERE id = ?",
                [optimizer, note, round_id])


def add_note(con: Connection, round_id: int, note: str) -> None:
    """Add to what a round decided on its own."""
    con.execute("UPDATE rounds SET note = concat_ws('; ', note, ?) WHERE id = ?", [note, round_id])


def set_policy_to(con: Connection, round_id: int, version: int) -> None:
    con.execute("UPDATE rounds SET policy_to = ? WHERE id = ?", [version, round_id])


def fail_interrupted_rounds(con: Connection, now: datetime) -> int:
    """Rounds whose jobs nobody runs any more: every job of theirs has finished, yet they have not."""
    return con.execute(
        """
        UPDATE rounds SET status = 'failed', stage = 'failed', error = 'the process running it stopped', finished_at = ?
        WHERE status = 'running'
          AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.round = rounds.id AND j.status IN ('queued', 'running'))
        """,
        [now],
    ).fetchone()[0]


def current_job_id(con: Connection, round_id: int) -> int | None:
    """The round's job that is queued or running, if any."""
    row = con.execute(
        "SELECT id FROM jobs WHERE round = ? AND status IN ('queued', 'running') ORDER BY id LIMIT 1", [round_id]
    ).fetchone()
    return row[0] if row else None


@dataclass(frozen=True)
class Candidate:
    """A policy a round trained from its start, and the predictor's verdict on it (None until the predictor ran)."""

    round: int
    job: int
    optimizer: str  # ppo, dpo, grpo, or AVERAGE: the candidates' average, made by the predict job (`job`)
    seed: int | None  # None for the average
    win_rate: float | None  # predicted over the round's start
    low: float | None
    high: float | None
    kl_to_v0: float | None
    ended: float | None
    answers: int | None
    chosen: bool
    verdict: str | None


_CANDIDATE_COLUMNS = "round, job, optimizer, seed, win_rate, low, high, kl_to_v0, ended, answers, chosen, verdict"


AVERAGE = "average"


def add_candidate(con: Connection, round_id: int, job: int, optimizer: str, seed: int | None) -> None:
    con.execute("INSERT INTO candidates (round, job, optimizer, seed) VALUES (?, ?, ?, ?)", [round_id, job, optimizer, seed])


PREDICTED = ("win_rate", "low", "high", "kl_to_v0", "ended", "answers")  # the predictor's figures on a candidate


def set_verdict(con: Connection, round_id: int, job: int, figures: dict | None, chosen: bool, verdict: str) -> None:
    """The predictor's figures on a candidate (PREDICTED), or None where it did not rate it, and the round's verdict."""
    values = [None if figures is None else figures[name] for name in PREDICTED]
    con.execute(
        f"UPDATE candidates SET {', '.join(f'{name} = ?' for name in PREDICTED)}, chosen = ?, verdict = ? WHERE round = ? AND job = ?",
        [*values, chosen, verdict, round_id, job],
    )


def round_candidates(con: Connection, round_id: int | None = None) -> list[Candidate]:
    """A round's candidates in the order they were trained; every round's, in round order, when round_id is None."""
    where, args = ("WHERE round = ?", [round_id]) if round_id is not None else ("", [])
    return [Candidate(*row) for row in con.execute(f"SELECT {_CANDIDATE_COLUMNS} FROM candidates {where} ORDER BY round, job", args).fetchall()]
