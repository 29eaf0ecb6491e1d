"""Votes: one comparison per annotator and pair, stored against completions, never screen sides."""

from dataclasses import dataclass
from datetime import datetime, timedelta

from store.db import Connection, insert_values
from store.queue import QueueError

SCREEN_CHOICES = ("left", "right", "tie", "both_bad")
STRENGTHS = ("slight", "much")
MAX_COMMENT_CHARS = 2_000


@dataclass(frozen=True)
class Vote:
    pair_id: int
    choice: str  # 'a' or 'b' (the pair's completions), 'tie' or 'both_bad'
    repeated: bool  # the same client token was submitted before; nothing new was stored


def checked_comment(screen_choice: str, strength: str | None, comment: str | None) -> str | None:
    """Refuse a bad choice, strength or comment; return the comment as stored."""
    if screen_choice not in SCREEN_CHOICES:
        raise QueueError(f"choice must be one of {', '.join(SCREEN_CHOICES)}, got {screen_choice!r}")
    if strength not in (None, *STRENGTHS):
        raise QueueError(f"strength must be one of {', '.join(STRENGTHS)} or none, got {strength!r}")
    if comment is not None and not isinstance(comment, str):
        raise QueueError(f"the comment must be text, got {type(comment).__name__}")
    comment = (comment or "").strip() or None
    if comment and len(comment) > MAX_COMMENT_CHARS:
        raise QueueError(f"the comment is {len(comment):,} characters; the limit is {MAX_COMMENT_CHARS:,}")
    return comment


def earlier_vote(con: Connection, annotator: str, token: str) -> Vote | None:
    """The annotator's vote already stored with this token, if any: a double submit stores nothing new."""
    row = con.execute("SELECT pair_id, choice FROM comparisons WHERE client_token = ? AND annotator = ?", [token, annotator]).fetchone()
    return Vote(*row, repeated=True) if row else None


def stored_choice(screen_choice: str, a_on_left: bool) -> str:
    """The choice against the pair's completions, from the side of the screen chosen."""
    return {"left": "a" if a_on_left else "b", "right": "b" if a_on_left else "a"}.get(screen_choice, screen_choice)


def vote_row(pair_id: int, annotator: str, choice: str, strength: str | None, comment: str | None,
             elapsed: timedelta | None, token: str | None, source: str, now: datetime) -> tuple:
    """A comparison as insert_votes stores it; the strength only goes with a preference for one side. A ranking's
    comparisons have no token (the ranking's makes it idempotent), and only the lead pair's has the time taken."""
    return (pair_id, annotator, choice, strength if choice in ("a", "b") else None, comment,
            None if elapsed is None else int(elapsed.total_seconds() * 1000), token, source, now)


def insert_votes(con: Connection, rows: list[tuple]) -> None:
    """Store comparisons, each a vote_row."""
    insert_values(con, "comparisons (pair_id, annotator, choice, strength, comment, elapsed_ms, client_token, source, created_at)", rows)


def pairs_voted_by(con: Connection, source: str) -> int:
    """How many pairs hold a vote from `source`: 'import' (imported preferences) or 'ai' (the AI judge)."""
    return con.execute("SELECT count(DISTINCT pair_id) FROM comparisons WHERE source = ?", [source]).fetchone()[0]
