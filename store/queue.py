"""Serving pairs to annotators: leases (assignments), skips and what is left to do.

An assignment is one serving of a pair to one annotator, a lease until `expires_at`. It is
closed by a vote or a skip; an unanswered one lapses and its pair goes back to the queue.
"""

import random
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from store.db import Connection, StoreError, insert_values, placeholders, transaction

# The pairs an annotator may be served: live, never served to them before (so never a pair
# they skipped or voted on), and short of votes counting the leases others hold now.
_SERVABLE = """
    NOT p.retired
    AND NOT EXISTS (SELECT 1 FROM assignments s WHERE s.pair_id = p.id AND s.annotator = $annotator)
    AND NOT EXISTS (SELECT 1 FROM comparisons c WHERE c.pair_id = p.id AND c.annotator = $annotator)
    AND (SELECT count(*) FROM comparisons c WHERE c.pair_id = p.id)
        + (SELECT count(*) FROM assignments s
           WHERE s.pair_id = p.id AND s.closed_at IS NULL AND s.expires_at > $now) < p.votes_wanted
"""

ORDERINGS = {
    "random": "random()",
    "newest_policy_first": "greatest(coalesce(ca.policy_version, -1), coalesce(cb.policy_version, -1)) DESC, random()",
    # Closest reward-model scores first; with no scores yet every pair ties and random() decides.
    "uncertain": "abs(ca.reward - cb.reward) ASC NULLS LAST, random()",
}


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


def serve(con: Connection, annotator: str, strategy: str, lease_seconds: int, now: datetime) -> Assignment | None:
    """The annotator's open assignment if they have one, else a new lease on the next pair."""
    with transaction(con):
        token = _open_token(con, annotator, now)
        if token is None:
            row = con.execute(
                f"""
                SELECT p.id, p.completion_a, p.completion_b
                FROM pairs p
                JOIN completions ca ON ca.id = p.completion_a
                JOIN completions cb ON cb.id = p.completion_b
                WHERE {_SERVABLE}
                ORDER BY {ORDERINGS[strategy]}
                LIMIT 1
                """,
                {"annotator": annotator, "now": now},
            ).fetchone()
            if row is None:
                return None
            pair_id, a, b = row
            token = new_token()
            insert_leases(con, [(pair_id, annotator, now, random.choice([a, b]), token, now + timedelta(seconds=lease_seconds))])
        return _assignment(con, token)


def new_token() -> str:
    """A lease's token: what the annotator's page answers with, so it must not be guessable."""
    return secrets.token_urlsafe(16)


def insert_leases(con: Connection, leases: list[tuple[int, str, datetime, int, str, datetime]]) -> None:
    """Store new leases: (pair_id, annotator, served_at, shown_left, token, expires_at) each."""
    insert_values(con, "assignments (pair_id, annotator, served_at, shown_left, token, expires_at)", leases)


def close_leases(con: Connection, tokens: list[str], now: datetime) -> None:
    if tokens:
        con.execute(f"UPDATE assignments SET closed_at = ? WHERE token IN ({placeholders(len(tokens))})", [now, *tokens])


def insert_skips(con: Connection, skips: list[tuple[int, str]], now: datetime) -> None:
    """Store skips: (pair_id, annotator) each."""
    insert_values(con, "skips (pair_id, annotator, created_at)", [(*skip, now) for skip in skips], "ON CONFLICT DO NOTHING")


def _open_token(con: Connection, annotator: str, now: datetime) -> str | None:
    row = con.execute(
        """
        SELECT s.token FROM assignments s JOIN pairs p ON p.id = s.pair_id
        WHERE s.annotator = ? AND s.closed_at IS NULL AND s.expires_at > ? AND NOT p.retired
        ORDER BY s.served_at DESC LIMIT 1
        """,
        [annotator, now],
    ).fetchone()
    return row[0] if row else None


def _assignment(con: Connection, token: str) -> Assignment:
    row = con.execute(
        """
        SELECT s.token, s.pair_id, pr.messages, cl.text, cr.text, s.served_at
        FROM assignments s
        JOIN pairs p ON p.id = s.pair_id
        JOIN prompts pr ON pr.id = p.prompt_id
        JOIN completions cl ON cl.id = s.shown_left
        JOIN completions cr ON cr.id = CASE WHEN s.shown_left = p.completion_a THEN p.completion_b ELSE p.completion_a END
        WHERE s.token = ?
        """,
        [token],
    ).fetchone()
    return Assignment(*row)


def skip(con: Connection, annotator: str, token: str, now: datetime) -> None:
    """Close the assignment and never serve this pair to this annotator again."""
    with transaction(con):
        pair_id = _own_open_assignment(con, annotator, token)
        insert_skips(con, [(pair_id, annotator)], now)
        close_leases(con, [token], now)


def _own_open_assignment(con: Connection, annotator: str, token: str) -> int:
    row = con.execute(
        "SELECT s.pair_id, s.annotator, s.closed_at, p.retired FROM assignments s JOIN pairs p ON p.id = s.pair_id WHERE s.token = ?",
        [token],
    ).fetchone()
    if row is None or row[1] != annotator:
        raise QueueError("this pair was not served to you")
    if row[3]:
        raise QueueError("this pair was retired; here is another")
    if row[2] is not None:
        raise QueueError("you have answered this pair already")
    return row[0]


def pairs_left(con: Connection, annotator: str, now: datetime) -> int:
    """Pairs this annotator could still be served: the definition the server's queue in memory is checked against."""
    return con.execute(f"SELECT count(*) FROM pairs p WHERE {_SERVABLE}", {"annotator": annotator, "now": now}).fetchone()[0]


def release_leases(con: Connection, now: datetime) -> int:
    """End every open lease: after a restart no browser holds one, so their pairs go back to the queue."""
    return con.execute(
        "UPDATE assignments SET expires_at = ? WHERE closed_at IS NULL AND expires_at > ?", [now, now]
    ).fetchone()[0]


# ---- for the server's queue in memory (annotate.queue.LiveQueue): point lookups and its rebuild ----

def served_texts(con: Connection, prompt_ids: set[int], completion_ids: set[int]) -> tuple[dict[int, str], dict[int, str]]:
    """Prompts' messages (JSON) and completions' texts, by id: index lookups, not joins."""
    return _by_id(con, "SELECT id, messages FROM prompts", prompt_ids), _by_id(con, "SELECT id, text FROM completions", completion_ids)


def _by_id(con: Connection, select: str, ids: set[int]) -> dict[int, str]:
    if not ids:
        return {}
    return dict(con.execute(f"{select} WHERE id IN ({placeholders(len(ids))})", list(ids)).fetchall())


@dataclass(frozen=True)
class LeaseRecord:
    token: str
    pair_id: int
    annotator: str
    served_at: datetime
    expires_at: datetime
    shown_left: int
    closed: bool
    retired: bool


def lease_record(con: Connection, token: str) -> LeaseRecord | None:
    row = con.execute(
        "SELECT token, pair_id, annotator, served_at, expires_at, shown_left, closed_at IS NOT NULL FROM assignments WHERE token = ?",
        [token],
    ).fetchone()
    if row is None:
        return None
    retired = con.execute("SELECT retired FROM pairs WHERE id = ?", [row[1]]).fetchone()[0]
    return LeaseRecord(*row, retired)


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


def open_pairs(con: Connection, after: int = 0) -> list[OpenPair]:
    """Pairs that are not retired and have fewer votes than wanted, with ids above `after`."""
    rows = con.execute(
        """
        SELECT p.id, p.prompt_id, p.completion_a, p.completion_b, p.votes_wanted, coalesce(v.votes, 0),
               greatest(coalesce(ca.policy_version, -1), coalesce(cb.policy_version, -1)), abs(ca.reward - cb.reward)
        FROM pairs p
        JOIN completions ca ON ca.id = p.completion_a
        JOIN completions cb ON cb.id = p.completion_b
        LEFT JOIN (SELECT pair_id, count(*) AS votes FROM comparisons GROUP BY pair_id) v ON v.pair_id = p.id
        WHERE p.id > ? AND NOT p.retired AND coalesce(v.votes, 0) < p.votes_wanted
        ORDER BY p.id
        """,
        [after],
    ).fetchall()
    return [OpenPair(*row) for row in rows]


def open_leases(con: Connection) -> list[LeaseRecord]:
    """Every lease not closed by a vote or a skip, lapsed ones included (a late vote may still count)."""
    rows = con.execute(
        """
        SELECT s.token, s.pair_id, s.annotator, s.served_at, s.expires_at, s.shown_left, false, p.retired
        FROM assignments s JOIN pairs p ON p.id = s.pair_id WHERE s.closed_at IS NULL
        """
    ).fetchall()
    return [LeaseRecord(*row) for row in rows]


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
    return dict(con.execute("SELECT annotator, count(*) FROM comparisons WHERE created_at >= ? GROUP BY annotator", [since]).fetchall())


def pair_totals(con: Connection) -> tuple[int, int]:
    """How many pairs there are, and how many of them are retired."""
    return con.execute("SELECT count(*), count(*) FILTER (WHERE retired) FROM pairs").fetchone()
