"""The AI judge's votes: comparisons with source 'ai', one per pair and judge, kept apart from people's.

A judge votes as annotator 'ai:<model>' (a user name cannot hold ':'). Wherever votes are
counted for people (the queue's votes wanted, the scheduler, annotator figures, agreement,
win rates) these are left out; training and export take them only when asked.
"""

import json
from dataclasses import dataclass
from datetime import datetime

import pyarrow as pa

from store.db import Connection, insert_rows, transaction
from store.prompt_files import Messages

AI = "ai"
"""The vote source of the AI judge's votes."""

_VOTE_SCHEMA = pa.schema([
    ("pair_id", pa.int32()), ("annotator", pa.string()), ("choice", pa.string()), ("comment", pa.string()), ("source", pa.string()),
    ("created_at", pa.timestamp("us")),
])


def judge_annotator(model: str) -> str:
    """The annotator name a judge model votes as."""
    return f"{AI}:{model}"


@dataclass(frozen=True)
class UnjudgedPair:
    pair_id: int
    prompt: Messages
    text_a: str
    text_b: str


def pairs_to_judge(con: Connection, annotator: str, limit: int | None) -> list[UnjudgedPair]:
    """Pairs that are not retired and that this judge has not voted on, in pair order, at most `limit`."""
    rows = con.execute(
        """
        SELECT p.id, pr.messages, ca.text, cb.text
        FROM pairs p
        JOIN prompts pr ON pr.id = p.prompt_id
        JOIN completions ca ON ca.id = p.completion_a
        JOIN completions cb ON cb.id = p.completion_b
        WHERE NOT p.retired AND NOT EXISTS (SELECT 1 FROM comparisons c WHERE c.pair_id = p.id AND c.annotator = ?)
        ORDER BY p.id
        LIMIT ?
        """,
        [annotator, limit],
    ).fetchall()
    return [UnjudgedPair(pair_id, json.loads(messages), a, b) for pair_id, messages, a, b in rows]


def add_ai_votes(con: Connection, annotator: str, votes: list[tuple[int, str, float]], now: datetime) -> int:
    """Store a judge's votes, each (pair, choice, probability that a is better, kept as the comment), in one
    transaction; a pair the judge has a vote on already keeps it. Returns how many were added."""
    with transaction(con):
        voted = {row[0] for row in con.execute("SELECT pair_id FROM comparisons WHERE annotator = ?", [annotator]).fetchall()}
        rows = [
            {"pair_id": pair_id, "annotator": annotator, "choice": choice, "comment": f"p(a better) = {p_a:.4f}", "source": AI,
             "created_at": now}
            for pair_id, choice, p_a in votes if pair_id not in voted
        ]
        insert_rows(con, "comparisons", rows, _VOTE_SCHEMA)
    return len(rows)


def judged_pairs(con: Connection) -> list[tuple[str, str, list[str]]]:
    """(judge, its choice, people's choices) on every pair that a judge and at least one person voted on."""
    return con.execute(
        """
        SELECT j.annotator, j.choice, list(h.choice ORDER BY h.id)
        FROM comparisons j JOIN comparisons h ON h.pair_id = j.pair_id AND h.source <> $ai
        WHERE j.source = $ai
        GROUP BY j.id, j.annotator, j.choice
        ORDER BY j.id
        """,
        {"ai": AI},
    ).fetchall()
