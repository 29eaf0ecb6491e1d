"""Rankings: one annotator's order of a task's K answers, stored once, and expanded into the task's pairs.

A ranking arrives as the letters its answers were shown under, best first, `>` between ranks and
`=` between answers tied: "C > A = D > B". It is stored as one `rankings` row (completions best
first, with their ranks), and as one comparison on each of the task's K(K-1)/2 pairs, written in
the same transaction: so agreement, ratings, reward-model training and the export count a
ranking as the pairwise votes it implies, and nothing downstream needs to know about rankings.
"""

import json
import string
from dataclasses import dataclass
from datetime import datetime, timedelta

from store.db import Connection, insert_values
from store.prompt_files import Messages
from store.queue import QueueError

LETTERS = string.ascii_uppercase
MAX_RANKING_CHARS = 200


@dataclass(frozen=True)
class Ranked:
    pair_id: int  # the task's lead pair
    completion_ids: list[int]  # best first
    ranks: list[int]  # 1 the best; equal ranks are a tie
    repeated: bool  # the same client token was submitted before; nothing new was stored


def answer_label(position: int) -> str:
    """The letter an answer is shown under: A for the first shown."""
    return LETTERS[position]


def parse_ranking(text: str, answers: int) -> list[list[int]]:
    """The shown positions (0 for A) in tie groups, best first, from "C > A = D > B"; refuse a ranking that
    does not name each of the task's `answers` answers exactly once."""
    if not isinstance(text, str) or len(text) > MAX_RANKING_CHARS:
        raise QueueError(f"the ranking must be text such as 'C > A = D > B', of at most {MAX_RANKING_CHARS} characters")
    if not text.strip():
        raise QueueError(f"the ranking is empty: rank all {answers} answers")
    groups = [[part.strip().upper() for part in group.split("=")] for group in text.split(">")]
    shown = list(LETTERS[:answers])
    named = [letter for group in groups for letter in group]
    for letter in named:
        if letter not in shown:
            raise QueueError(f"the ranking names {letter!r}, which is not one of the answers {', '.join(shown)}, "
                             f"as in '{' > '.join(shown)}'")
    for letter in shown:
        if named.count(letter) > 1:
            raise QueueError(f"the ranking names answer {letter} {named.count(letter)} times; name each answer once")
    if missing := [letter for letter in shown if letter not in named]:
        raise QueueError(f"the ranking leaves out answer {', '.join(missing)}: rank all {answers} answers")
    return [[shown.index(letter) for letter in group] for group in groups]


def ranks_of(groups: list[list[int]]) -> dict[int, int]:
    """Each completion's rank from tie groups of completion ids, best first: 1 for the first group, 2 for the next."""
    return {completion: rank for rank, group in enumerate(groups, start=1) for completion in group}


def outcome(rank_a: int, rank_b: int) -> str:
    """A pair's comparison choice from its completions' ranks."""
    return "a" if rank_a < rank_b else "b" if rank_a > rank_b else "tie"


def task_pairs(con: Connection, lead: int) -> list[tuple[int, int, int]]:
    """(pair id, completion a, completion b) of every pair of the task led by `lead`, the lead included."""
    return con.execute("SELECT id, completion_a, completion_b FROM pairs WHERE id = ? OR task = ? ORDER BY id", [lead, lead]).fetchall()


def ranked_task_pairs(con: Connection) -> set[int]:
    """The ids of every pair that belongs to a task of more than two answers: those answered by rankings."""
    return {row[0] for row in con.execute("SELECT id FROM pairs WHERE task IS NOT NULL OR answers IS NOT NULL").fetchall()}


def ranking_row(ranked: Ranked, prompt_id: int, annotator: str, elapsed: timedelta, token: str, source: str, now: datetime) -> tuple:
    """A ranking as insert_rankings stores it."""
    return (ranked.pair_id, prompt_id, annotator, ranked.completion_ids, ranked.ranks, int(elapsed.total_seconds() * 1000),
            token, source, now)


def insert_rankings(con: Connection, rows: list[tuple]) -> None:
    """Store rankings, each a ranking_row."""
    insert_values(con, "rankings (pair_id, prompt_id, annotator, completion_ids, ranks, elapsed_ms, client_token, source, created_at)", rows)


def earlier_ranking(con: Connection, annotator: str, token: str) -> Ranked | None:
    """The annotator's ranking already stored with this token, if any: a double submit stores nothing new."""
    row = con.execute("SELECT pair_id, completion_ids, ranks FROM rankings WHERE client_token = ? AND annotator = ?", [token, annotator]).fetchone()
    return Ranked(*row, repeated=True) if row else None


@dataclass(frozen=True)
class StoredRanking:
    """A ranking as the export writes it: its prompt, and its answers best first with their ranks."""

    id: int
    pair_id: int
    prompt_id: int
    prompt: Messages
    annotator: str
    completion_ids: list[int]
    texts: list[str]
    policies: list[int | None]
    ranks: list[int]
    source: str
    created_at: datetime


def stored_rankings(con: Connection) -> list[StoredRanking]:
    """Every ranking, in the order stored."""
    rows = con.execute(
        """
        SELECT r.id, r.pair_id, r.prompt_id, p.messages, r.annotator, r.completion_ids, r.ranks, r.source, r.created_at
        FROM rankings r JOIN prompts p ON p.id = r.prompt_id
        ORDER BY r.id
        """
    ).fetchall()
    completions = {
        id_: (text, policy) for id_, text, policy in con.execute(
            "SELECT id, text, policy_version FROM completions WHERE id IN (SELECT unnest(completion_ids) FROM rankings)"
        ).fetchall()
    }
    return [
        StoredRanking(id_, pair, prompt_id, json.loads(messages), annotator, ids, [completions[c][0] for c in ids],
                      [completions[c][1] for c in ids], ranks, source, created_at)
        for id_, pair, prompt_id, messages, annotator, ids, ranks, source, created_at in rows
    ]


def answered_texts(con: Connection, source: str) -> list[tuple[str, list[str]]]:
    """(prompt messages JSON, the answers' texts) of every vote on a pair and every ranking of a task from `source`:
    what an annotator read for each. A ranking's comparisons are its own pairs' votes, so they are counted as one."""
    rows = con.execute(
        """
        SELECT pr.messages, [ca.text, cb.text] FROM comparisons c
        JOIN pairs p ON p.id = c.pair_id JOIN prompts pr ON pr.id = p.prompt_id
        JOIN completions ca ON ca.id = p.completion_a JOIN completions cb ON cb.id = p.completion_b
        WHERE c.source = $source AND p.task IS NULL AND p.answers IS NULL
        UNION ALL
        SELECT pr.messages, list(co.text ORDER BY u.i) FROM rankings r
        JOIN prompts pr ON pr.id = r.prompt_id, unnest(r.completion_ids) WITH ORDINALITY AS u(id, i)
        JOIN completions co ON co.id = u.id
        WHERE r.source = $source GROUP BY r.id, pr.messages
        """,
        {"source": source},
    ).fetchall()
    return [(messages, texts) for messages, texts in rows]
