"""Training rounds: which policy a round started from, and what it produced."""

from dataclasses import dataclass
from datetime import datetime

from store.db import Connection, StoreError
from store.jobs import FINISHED


@dataclass(frozen=True)
class Round:
    id: int
    status: str  # running, done, failed or cancelled
    policy_from: int
    reward_version: int | None
    policy_to: int | None
    comparisons_at_start: int
    error: str | None
    created_at: datetime
    finished_at: datetime | None
    optimizer: str  # auto (until it has chosen), ppo, dpo or grpo
    note: str | None  # what the round decided on its own, and why


_COLUMNS = "id, status, policy_from, reward_version, policy_to, comparisons_at_start, error, created_at, finished_at, optimizer, note"


def comparisons_made(con: Connection) -> int:
    """Votes cast in this project, by people or simulated annotators; imported ones and the AI judge's do not count."""
    return con.execute("SELECT count(*) FROM comparisons WHERE source NOT IN ('import', 'ai')").fetchone()[0]


def add_round(con: Connection, policy_from: int, reward_version: int | None, optimizer: str = "ppo", note: str | None = None) -> Round:
    if (running := running_round(con)) is not None:
        raise StoreError(f"round {running.id} is still running: cancel it or wait for it to finish")
    row = con.execute(
        f"""
        INSERT INTO rounds (status, policy_from, reward_version, comparisons_at_start, optimizer, note)
        VALUES ('running', ?, ?, ?, ?, ?) RETURNING {_COLUMNS}
        """,
        [policy_from, reward_version, comparisons_made(con), optimizer, note],
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


def set_reward_version(con: Connection, round_id: int, version: int) -> None:
    con.execute("UPDATE rounds SET reward_version = ? WHERE id = ?", [version, round_id])


def set_choice(con: Connection, round_id: int, optimizer: str, note: str) -> None:
    """Record what a round decided on its own: the optimiser it runs, and why."""
    con.execute("UPDATE rounds SET optimizer = ?, note = concat_ws('; ', note, ?) WHERE id = ?", [optimizer, note, round_id])


def add_note(con: Connection, round_id: int, note: str) -> None:
    """Add to what a round decided on its own."""
    con.execute("UPDATE rounds SET note = concat_ws('; ', note, ?) WHERE id = ?", [note, round_id])


def set_policy_to(con: Connection, round_id: int, version: int) -> None:
    con.execute("UPDATE rounds SET policy_to = ? WHERE id = ?", [version, round_id])


def finish_round(con: Connection, round_id: int, status: str, now: datetime, error: str | None = None) -> None:
    """Mark a running round done, failed or cancelled; a finished one stays as it is."""
    if status not in FINISHED:
        raise StoreError(f"a round finishes as one of {', '.join(FINISHED)}, not {status!r}")
    con.execute(
        "UPDATE rounds SET status = ?, error = ?, finished_at = ? WHERE id = ? AND status = 'running'",
        [status, error, now, round_id],
    )


def fail_interrupted_rounds(con: Connection, now: datetime) -> int:
    """Rounds whose jobs nobody runs any more: every job of theirs has finished, yet they have not."""
    return con.execute(
        """
        UPDATE rounds SET status = 'failed', error = 'the process running it stopped', finished_at = ?
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
