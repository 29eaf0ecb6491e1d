"""Reading every voted pair with its prompt, both completions and all its votes, for export."""

import json
from dataclasses import dataclass
from datetime import datetime

from store.db import Connection
from store.prompt_files import Messages


@dataclass(frozen=True)
class CastVote:
    annotator: str
    choice: str  # 'a' or 'b' (the pair's completions), 'tie' or 'both_bad'
    strength: str | None
    comment: str | None
    source: str
    created_at: datetime


@dataclass(frozen=True)
class VotedPair:
    pair_id: int
    prompt_id: int
    prompt: Messages
    completion_a: int
    completion_b: int
    text_a: str
    text_b: str
    policy_a: int | None  # None for imported completions, which no policy wrote
    policy_b: int | None
    finished_a: bool  # ended with EOS rather than at the length limit; False for imported completions, whose end is unknown
    finished_b: bool
    votes: list[CastVote]  # in the order they were cast


def voted_pairs(con: Connection) -> list[VotedPair]:
    """Every pair with at least one vote, retired ones included, in pair order."""
    rows = con.execute(
        """
        SELECT p.id, p.prompt_id, pr.messages, p.completion_a, p.completion_b, ca.text, cb.text,
               ca.policy_version, cb.policy_version, coalesce(ca.finished, false), coalesce(cb.finished, false),
               list({'annotator': c.annotator, 'choice': c.choice, 'strength': c.strength, 'comment': c.comment,
                     'source': c.source, 'created_at': c.created_at} ORDER BY c.created_at, c.id)
        FROM pairs p
        JOIN prompts pr ON pr.id = p.prompt_id
        JOIN completions ca ON ca.id = p.completion_a
        JOIN completions cb ON cb.id = p.completion_b
        JOIN comparisons c ON c.pair_id = p.id
        GROUP BY ALL
        ORDER BY p.id
        """
    ).fetchall()
    return [
        VotedPair(pair_id, prompt_id, json.loads(messages), a, b, text_a, text_b, policy_a, policy_b, finished_a, finished_b,
                  [CastVote(**vote) for vote in votes])
        for pair_id, prompt_id, messages, a, b, text_a, text_b, policy_a, policy_b, finished_a, finished_b, votes in rows
    ]
