"""Votes: one comparison per annotator and pair, stored against completions, never screen sides."""

from dataclasses import dataclass
from datetime import datetime, timedelta

from store.db import Connection, insert_values, transaction
from store.queue import QueueError, close_leases

SCREEN_CHOICES = ("left", "right", "tie", "both_bad")
STRENGTHS = ("slight", "much")
MAX_COMMENT_CHARS = 2_000


@dataclass(frozen=True)
class Vote:
    pair_id: int
    choice: str  # 'a' or 'b' (the pair's completions), 'tie' or 'both_bad'
    repeated: bool  # the same client token was submitted before; nothing new was stored


def record_vote(
    con: Connection,
    annotator: str,
    token: str,
    screen_choice: str,
    strength: str | None,
    comment: str | None,
    now: datetime,
    source: str = "app",
) -> Vote:
    """Store the annotator's answer to the assignment `token`; submitting it twice stores it once."""
    comment = checked_comment(screen_choice, strength, comment)
    with transaction(con):
        if earlier := earlier_vote(con, annotator, token):
            return earlier
        row = con.execute(
            """
            SELECT s.pair_id, s.annotator, s.closed_at, s.expires_at, s.served_at, s.shown_left = p.completion_a,
                   p.retired, p.votes_wanted,
                   (SELECT count(*) FROM comparisons c WHERE c.pair_id = p.id)
                   + (SELECT count(*) FROM assignments o
                      WHERE o.pair_id = p.id AND o.token <> s.token AND o.closed_at IS NULL AND o.expires_at > ?)
            FROM assignments s JOIN pairs p ON p.id = s.pair_id
            WHERE s.token = ?
            """,
            [now, token],
        ).fetchone()
        if row is None or row[1] != annotator:
            raise QueueError("this pair was not served to you")
        pair_id, _, closed_at, expires_at, served_at, a_on_left, retired, votes_wanted, taken = row
        if retired:
            raise QueueError("this pair was retired; here is another")
        if closed_at is not None:
            raise QueueError("you skipped this pair")
        if expires_at <= now and taken >= votes_wanted:
            raise QueueError("your time on this pair ran out and others have answered it; here is another")
        choice = stored_choice(screen_choice, a_on_left)
        insert_votes(con, [vote_row(pair_id, annotator, choice, strength, comment, now - served_at, token, source, now)])
        close_leases(con, [token], now)
    return Vote(pair_id, choice, repeated=False)


def checked_comment(screen_choice: str, strength: str | None, comment: str | None) -> str | None:
    """Refuse a bad choice, strength or comment; return the comment as stored."""
    if screen_choice not in SCREEN_CHOICES:
        raise QueueError(f"choice must be one of {', '.join(SCREEN_CHOICES)}, got {screen_choice!r}")
    if strength not in (None, *STRENGTHS):
        raise QueueError(f"strength must be one of {', '.join(STRENGTHS)} or none, got {strength!r}")
    comment = (comment or "").strip() or None
    if comment and len(comment) > MAX_COMMENT_CHARS:
        raise QueueError(f"the comment is {len(comment):,} characters; the limit is {MAX_COMMENT_CHARS:,}")
    return comment


def earlier_vote(con: Connection, annotator: str, token: str) -> Vote | None:
    """The vote already stored with this token, if any: a double submit stores nothing new."""
    earlier = con.execute("SELECT pair_id, choice, annotator FROM comparisons WHERE client_token = ?", [token]).fetchone()
    if earlier is None:
        return None
    if earlier[2] != annotator:
        raise QueueError("this pair was not served to you")
    return Vote(earlier[0], earlier[1], repeated=True)


def stored_choice(screen_choice: str, a_on_left: bool) -> str:
    """The choice against the pair's completions, from the side of the screen chosen."""
    return {"left": "a" if a_on_left else "b", "right": "b" if a_on_left else "a"}.get(screen_choice, screen_choice)


def vote_row(pair_id: int, annotator: str, choice: str, strength: str | None, comment: str | None,
             elapsed: timedelta, token: str, source: str, now: datetime) -> tuple:
    """A comparison as insert_votes stores it; the strength only goes with a preference for one side."""
    return (pair_id, annotator, choice, strength if choice in ("a", "b") else None, comment,
            int(elapsed.total_seconds() * 1000), token, source, now)


def insert_votes(con: Connection, rows: list[tuple]) -> None:
    """Store comparisons, each a vote_row."""
    insert_values(con, "comparisons (pair_id, annotator, choice, strength, comment, elapsed_ms, client_token, source, created_at)", rows)
