"""A preference snapshot: the resolved comparisons a reward-model or DPO job trains on, frozen as Parquet.

The owner resolves each voted pair to a PreferenceRow and writes the snapshot into the job
directory (and, for a reward model fitted Plackett-Luce, each ranking as a RankingRow beside it);
the worker reads it back in the same shape, and the export writes the same rows with
their votes. Token ids are not stored: completions keep only their text, and each reader
tokenises with the template it trains on.

pyarrow only, no torch: the export reads this module too.
"""

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

Messages = list[dict[str, str]]

MESSAGES = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))


@dataclass(frozen=True)
class PreferenceRow:
    """One comparison resolved to a chosen and a rejected reply. Rows read from a preference file have
    no ids, and their replies are taken as whole."""

    prompt: Messages
    chosen: str
    rejected: str
    chosen_finished: bool = True  # the reply ended with EOS rather than at the length limit
    rejected_finished: bool = True
    pair_id: int | None = None
    prompt_id: int | None = None
    chosen_completion_id: int | None = None
    rejected_completion_id: int | None = None
    chosen_policy: int | None = None  # the policy version that wrote it; None for an imported reply
    rejected_policy: int | None = None
    # The probability that `chosen` really is the better reply, given who voted: 1 for a plain vote; less where
    # the votes came from annotators whose reliability is measured below 1 ([reward_model] weight_by_trust).
    confidence: float = 1.0


SCHEMA = pa.schema([  # PreferenceRow's fields, in order
    ("prompt", MESSAGES),
    ("chosen", pa.string()),
    ("rejected", pa.string()),
    ("chosen_finished", pa.bool_()),
    ("rejected_finished", pa.bool_()),
    ("pair_id", pa.int64()),
    ("prompt_id", pa.int64()),
    ("chosen_completion_id", pa.int64()),
    ("rejected_completion_id", pa.int64()),
    ("chosen_policy", pa.int64()),
    ("rejected_policy", pa.int64()),
    ("confidence", pa.float64()),
])


@dataclass(frozen=True)
class RankingRow:
    """One annotator's ranking of a task's K answers to a prompt, fitted as one Plackett-Luce item
    ([reward_model] rankings = "plackett_luce")."""

    prompt: Messages
    texts: list[str]  # best first
    ranks: list[int]  # 1 the best; equal ranks are a tie
    ranking_id: int
    pair_id: int  # the task's lead pair
    prompt_id: int
    completion_ids: list[int]

    def pairs(self) -> list[PreferenceRow]:
        """The ranking as the preference rows it implies: one for each two answers not tied, the better chosen."""
        return [
            PreferenceRow(self.prompt, self.texts[i], self.texts[j], prompt_id=self.prompt_id,
                          chosen_completion_id=self.completion_ids[i], rejected_completion_id=self.completion_ids[j])
            for i in range(len(self.texts)) for j in range(i + 1, len(self.texts)) if self.ranks[i] < self.ranks[j]
        ]


def ranked_answers(row: PreferenceRow | RankingRow) -> tuple[list[str], list[int]]:
    """A row's answers best first, with their ranks: a pair is its chosen (1) and its rejected (2) reply."""
    if isinstance(row, RankingRow):
        return row.texts, row.ranks
    return [row.chosen, row.rejected], [1, 2]


RANKING_SCHEMA = pa.schema([  # RankingRow's fields, in order
    ("prompt", MESSAGES),
    ("texts", pa.list_(pa.string())),
    ("ranks", pa.list_(pa.int64())),
    ("ranking_id", pa.int64()),
    ("pair_id", pa.int64()),
    ("prompt_id", pa.int64()),
    ("completion_ids", pa.list_(pa.int64())),
])

# Where each row came from: the pair, its prompt, and each reply's completion and the policy that wrote it.
ID_COLUMNS = ("pair_id", "prompt_id", "chosen_completion_id", "rejected_completion_id", "chosen_policy", "rejected_policy")


def assistant(text: str) -> Messages:
    """A reply as TRL's conversational format holds it: one assistant message."""
    return [{"role": "assistant", "content": text}]


def conversational(row: PreferenceRow) -> dict[str, Messages]:
    """The row in TRL's conversational preference format, as the export writes it and TRL's trainers take it."""
    return {"prompt": row.prompt, "chosen": assistant(row.chosen), "rejected": assistant(row.rejected)}


def preference_table(rows: list[PreferenceRow]) -> pa.Table:
    """The snapshot's table, as the owner freezes it in a job directory."""
    return pa.Table.from_pylist([vars(row) for row in rows], schema=SCHEMA)


def read_preferences(path: Path) -> list[PreferenceRow]:
    """A snapshot's rows, in the order they were written."""
    return [PreferenceRow(**row) for row in pq.read_table(path, schema=SCHEMA).to_pylist()]


def ranking_table(rows: list[RankingRow]) -> pa.Table:
    """The rankings' table, frozen beside the preference snapshot."""
    return pa.Table.from_pylist([vars(row) for row in rows], schema=RANKING_SCHEMA)


def read_rankings(path: Path) -> list[RankingRow]:
    """The rankings frozen beside a snapshot, in the order they were written."""
    return [RankingRow(**row) for row in pq.read_table(path, schema=RANKING_SCHEMA).to_pylist()]
