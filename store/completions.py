"""Completions and the pairs built from them, written together so neither is ever half-stored."""

import json
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import pyarrow as pa

from store.db import Connection, insert_rows, reserve_ids

_COMPLETION_SCHEMA = pa.schema([
    ("id", pa.int32()),
    ("prompt_id", pa.int32()),
    ("policy_version", pa.int32()),
    ("text", pa.string()),
    ("token_count", pa.int32()),
    ("finished", pa.bool_()),
    ("sampling", pa.string()),
    ("reward", pa.float64()),
    ("reward_heads", pa.list_(pa.float64())),
])

_PAIR_SCHEMA = pa.schema([
    ("prompt_id", pa.int32()),
    ("completion_a", pa.int32()),
    ("completion_b", pa.int32()),
    ("strategy", pa.string()),
    ("votes_wanted", pa.int32()),
])

_TASK_PAIR_SCHEMA = pa.schema([
    ("id", pa.int32()),
    *_PAIR_SCHEMA,
    ("answers", pa.list_(pa.int32())),
    ("task", pa.int32()),
])


@dataclass(frozen=True)
class NewCompletion:
    prompt_id: int
    policy_version: int
    text: str
    token_count: int
    finished: bool
    sampling: dict[str, Any]
    reward: float | None = None  # scored by the latest reward model as it was sampled, or not yet
    reward_heads: list[float] | None = None  # each head's raw score


@dataclass(frozen=True)
class Completion:
    id: int
    prompt_id: int
    policy_version: int
    text: str
    token_count: int
    finished: bool
    reward_heads: list[float] | None = None


@dataclass(frozen=True)
class NewPair:
    prompt_id: int
    completion_a: int
    completion_b: int
    strategy: str
    votes_wanted: int = 1


def add_completions(con: Connection, completions: list[NewCompletion]) -> list[Completion]:
    """Store the completions and return them with their ids, in the order given."""
    ids = reserve_ids(con, "completion_id", len(completions))
    rows = [
        {**vars(c), "id": id_, "sampling": json.dumps(c.sampling, sort_keys=True)}
        for id_, c in zip(ids, completions)
    ]
    insert_rows(con, "completions", rows, _COMPLETION_SCHEMA)
    return [
        Completion(id_, c.prompt_id, c.policy_version, c.text, c.token_count, c.finished, c.reward_heads)
        for id_, c in zip(ids, completions)
    ]


@dataclass(frozen=True)
class NewTask:
    """K answers to one prompt, to be ranked: served as its lead pair (the first two answers), with a pair for
    every other two of them that its rankings' outcomes are stored on."""

    prompt_id: int
    answers: list[int]  # completion ids, at least 3
    strategy: str
    votes_wanted: int = 1


def add_pairs(con: Connection, pairs: list[NewPair]) -> None:
    insert_rows(con, "pairs", [vars(p) for p in pairs], _PAIR_SCHEMA)


def add_tasks(con: Connection, tasks: list[NewTask]) -> None:
    """Store each task as its K(K-1)/2 pairs: the lead, which lists the answers and is served, and the rest,
    which point at it and want no votes of their own."""
    rows = []
    for task in tasks:
        ids = reserve_ids(con, "pair_id", len(task.answers) * (len(task.answers) - 1) // 2)
        for id_, (a, b) in zip(ids, combinations(task.answers, 2)):
            lead = id_ == ids[0]
            rows.append({"id": id_, "prompt_id": task.prompt_id, "completion_a": a, "completion_b": b, "strategy": task.strategy,
                         "votes_wanted": task.votes_wanted if lead else 0, "answers": task.answers if lead else None,
                         "task": None if lead else ids[0]})
    insert_rows(con, "pairs", rows, _TASK_PAIR_SCHEMA)



def completions_to_score(con: Connection) -> list[tuple[int, str, str]]:
    """(completion id, prompt messages JSON, text) of every completion a policy wrote."""
    return con.execute(
        """
        SELECT c.id, p.messages, c.text FROM completions c JOIN prompts p ON p.id = c.prompt_id
        WHERE c.policy_version IS NOT NULL ORDER BY c.id
        """
    ).fetchall()


def set_rewards(con: Connection, rewards: dict[int, tuple[float, list[float]]]) -> None:
    """Store reward-model scores on completions, replacing earlier ones: by id, the reward and each head's raw score."""
    batch = pa.table({"id": list(rewards), "reward": [r for r, _ in rewards.values()], "heads": [h for _, h in rewards.values()]})
    con.register("_rewards", batch)
    try:
        con.execute("UPDATE completions SET reward = r.reward, reward_heads = r.heads FROM _rewards r WHERE completions.id = r.id")
    finally:
        con.unregister("_rewards")


def completions_of(con: Connection, policy_version: int, prompt_ids: list[int]) -> list[Completion]:
    """A policy version's completions of these prompts, oldest first."""
    rows = con.execute(
        """
        SELECT id, prompt_id, policy_version, text, token_count, finished, reward_heads FROM completions
        WHERE policy_version = ? AND list_contains(?, prompt_id) ORDER BY id
        """,
        [policy_version, prompt_ids],
    ).fetchall()
    return [Completion(*row) for row in rows]


def paired_texts(con: Connection, newer: int, older: int) -> dict[int, list[tuple[int | None, str]]]:
    """(token count, text) of each version's completions in the pairs of the two versions against each other, by version.

    These answer the same prompts under the same sampling, so their lengths and wording compare fairly.
    """
    rows = con.execute(
        """
        WITH between_them AS (
            SELECT p.completion_a AS a, p.completion_b AS b FROM pairs p
            JOIN completions ca ON ca.id = p.completion_a JOIN completions cb ON cb.id = p.completion_b
            WHERE [ca.policy_version, cb.policy_version] IN ([$newer, $older], [$older, $newer])
        )
        SELECT policy_version, token_count, text FROM completions
        WHERE id IN (SELECT a FROM between_them UNION SELECT b FROM between_them) ORDER BY id
        """,
        {"newer": newer, "older": older},
    ).fetchall()
    texts: dict[int, list[tuple[int | None, str]]] = {newer: [], older: []}
    for version, tokens, text in rows:
        texts[version].append((tokens, text))
    return texts
