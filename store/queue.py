"""The stored queue: leases (assignments), skips, and the reads the server's queue in memory is built from.

An assignment is one serving of a pair to one annotator, a lease until `expires_at`. It is
closed by a vote or a skip; an unanswered one lapses and its pair goes back to the queue.
Which pair to serve, and whether an answer is allowed, is decided by `annotate.queue.LiveQueue`.
"""

import secrets
from dataclasses import dataclass
from datetime import datetime

from store.db import Connection, StoreError, insert_values, placeholders


class QueueError(StoreError):
    """An action on an assignment that is not allowed: not yours, retired, closed."""


@dataclass(frozen=True)
class Assignment:
    token: str
    pair_id: int
    prompt_messages: str  # JSON
    left_text: str
    right_text: str
    served_at: datetime
    left_finished: bool = True  # False for an answer cut at the length limit; an imported one counts as ended
    right_finished: bool = True
    answers: tuple[tuple[str, bool], ...] = ()  # a task to rank: each answer's text and whether it ended, as shown (A first); empty for a pair


@dataclass(slots=True)
class Lease:
    """An assignment as stored: one serving of a pair to one annotator, until `expires_at`."""

    token: str
    pair_id: int
    annotator: str
    served_at: datetime
    expires_at: datetime
    shown_left: int
    closed: bool = False  # by a vote or a skip
    retired: bool = False  # its pair was retired


def new_token() -> str:
    """A lease's token: what the annotator's page answers with, so it must not be guessable."""
    return secrets.token_urlsafe(16)


def insert_leases(con: Connection, leases: list[Lease]) -> None:
    insert_values(con, "assignments (pair_id, annotator, served_at, shown_left, token, expires_at)",
                  [(x.pair_id, x.annotator, x.served_at, x.shown_left, x.token, x.expires_at) for x in leases])


def close_leases(con: Connection, tokens: list[str], now: datetime) -> None:
    if tokens:
        con.execute(f"UPDATE assignments SET closed_at = ? WHERE token IN ({placeholders(len(tokens))})", [now, *tokens])


def insert_skips(con: Connection, skips: list[tuple[int, str]], now: datetime) -> None:
    """Store skips: (pair_id, annotator) each."""
    insert_values(con, "skips (pair_id, annotator, created_at)", [(*skip, now) for skip in skips], "ON CONFLICT DO NOTHING")


def release_leases(con: Connection, now: datetime) -> int:
    """End every open lease: after a restart no browser holds one, so their pairs go back to the queue."""
    return con.execute(
        "UPDATE assignments SET expires_at = ? WHERE closed_at IS NULL AND expires_at > ?", [now, now]
    ).fetchone()[0]


# ---- for the server's queue in memory (annotate.queue.LiveQueue): point lookups and its rebuild ----

def served_texts(
    con: Connection, prompt_ids: set[int], completion_ids: set[int]
) -> tuple[dict[int, str], dict[int, tuple[str, bool]]]:
    """Prompts' messages (JSON), and completions' texts and whether they ended, by id: index lookups, not joins."""
    prompts = _by_id(con, "SELECT id, messages FROM prompts", prompt_ids)
    completions = _by_id(con, "SELECT id, text, finished IS NOT false FROM completions", completion_ids)
    return {id_: messages for id_, messages in prompts}, {id_: (text, finished) for id_, text, finished in completions}


def _by_id(con: Connection, select: str, ids: set[int]) -> list[tuple]:
    if not ids:
        return []
    return con.execute(f"{select} WHERE id IN ({placeholders(len(ids))})", list(ids)).fetchall()


_LEASES = """
    SELECT s.token, s.pair_id, s.annotator, s.served_at, s.expires_at, s.shown_left, s.closed_at IS NOT NULL, p.retired
    FROM assignments s JOIN pairs p ON p.id = s.pair_id
"""


def lease_record(con: Connection, token: str) -> Lease | None:
    """The lease with this token, closed or not: why an answer to it is refused."""
    row = con.execute(f"{_LEASES} WHERE s.token = ?", [token]).fetchone()
    return Lease(*row) if row else None


@dataclass(frozen=True)
class OpenPair:
    """A pair that still wants votes, with what each serving order sorts it by."""

    id: int
    prompt_id: int
    completion_a: int
    completion_b: int
    votes_wanted: int
    votes: int
    newest_policy: int  # -1 when neither completion is a policy's
    reward_gap: float | None  # None until a reward model has scored both
    heads_a: list[float] | None  # each reward-model head's raw score of completion a; None until scored
    heads_b: list[float] | None
    answers: list[int] | None  # a task to rank: its completions; None for a pair


def open_pairs(con: Connection, after: int = 0) -> list[OpenPair]:
    """Pairs that are not retired and have fewer votes than wanted, with ids above `after`."""
    rows = con.execute(
        """
        SELECT p.id, p.prompt_id, p.completion_a, p.completion_b, p.votes_wanted, coalesce(v.votes, 0),
               greatest(coalesce(ca.policy_version, -1), coalesce(cb.policy_version, -1)), abs(ca.reward - cb.reward),
               ca.reward_heads, cb.reward_heads, p.answers
        FROM pairs p
        JOIN completions ca ON ca.id = p.completion_a
        JOIN completions cb ON cb.id = p.completion_b
        LEFT JOIN (SELECT pair_id, count(*) AS votes FROM comparisons WHERE source <> 'ai' GROUP BY pair_id) v ON v.pair_id = p.id
        WHERE p.id > ? AND NOT p.retired AND coalesce(v.votes, 0) < p.votes_wanted
        ORDER BY p.id
        """,
        [after],
    ).fetchall()
    return [OpenPair(*row) for row in rows]


def open_leases(con: Connection) -> list[Lease]:
    """Every lease not closed by a vote or a skip, lapsed ones included (a late vote may still count)."""
    return [Lease(*row) for row in con.execute(f"{_LEASES} WHERE s.closed_at IS NULL").fetchall()]


def seen_pairs(con: Connection, after: int = 0) -> list[tuple[str, int]]:
    """(annotator, pair) for every pair served to or answered by an annotator, with pair ids above `after`."""
    return con.execute(
        """
        SELECT annotator, pair_id FROM assignments WHERE pair_id > $after
        UNION SELECT annotator, pair_id FROM comparisons WHERE pair_id > $after
        """,
        {"after": after},
    ).fetchall()


def votes_by_annotator_since(con: Connection, since: datetime) -> dict[str, int]:
    """Votes and rankings per annotator: a ranking counts once, by its comparison on the task's lead pair."""
    return dict(con.execute(
        "SELECT annotator, count(*) FROM comparisons WHERE created_at >= ? AND source <> 'ai' "
        "AND pair_id NOT IN (SELECT id FROM pairs WHERE task IS NOT NULL) GROUP BY annotator",
        [since],
    ).fetchall())


def pair_totals(con: Connection) -> tuple[int, int]:
    """How many pairs there are, and how many of them are retired; a task to rank counts once."""
    return con.execute("SELECT count(*), count(*) FILTER (WHERE retired) FROM pairs WHERE task IS NULL").fetchone()
