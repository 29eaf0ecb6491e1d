"""Exporting votes as preference data, ready for TRL's RewardTrainer and DPOTrainer.

The preference export has one row per pair, resolved by majority vote: `prompt` is the prompt's
chat messages, `chosen` and `rejected` are one assistant message each (TRL's conversational
preference format), followed by metadata. Pairs with no majority, or whose majority is a tie
or both-bad, are left out. The raw export (`include_ties`) has one row per vote instead, every
choice included, for those who want to resolve or weight votes themselves.

A ranking of K answers ([queue] answers_per_task) is stored as a vote on each of its K(K-1)/2 pairs, so both
exports hold its pairs; `export_rankings` writes the rankings themselves, one row each.

The AI judge's votes (source 'ai') are left out unless asked for, and then only decide a pair no
person voted on: wherever people voted, their votes alone are the pair's votes, in both exports
and in training. An AI-decided row says so in its `source`.
"""

import dataclasses
import json
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from annotate.agreement import JudgeAgreement, agreement_share, agreement_with_people, majority, majority_confidence
from annotate.trust import project_reliability, weighted_label
from store import Connection, StoreError
from store.ai_votes import AI
from store.export import CastVote, VotedPair, voted_pairs
from store.gold import gold_answers
from store.rankings import ranked_task_pairs, stored_rankings
from train.common.files import built_beside
from train.common.snapshot import ID_COLUMNS, MESSAGES, SCHEMA, PreferenceRow, RankingRow, assistant, conversational

# Explicit column types, so that a column that happens to be all null (no policy versions for
# imported completions, no strengths) keeps its type in Parquet and in a datasets directory.
PREFERENCE_SCHEMA = pa.schema([
    ("prompt", MESSAGES),
    ("chosen", MESSAGES),
    ("rejected", MESSAGES),
    *(SCHEMA.field(name) for name in ID_COLUMNS),
    ("annotators", pa.list_(pa.string())),  # those who voted for the chosen completion, in vote order
    ("strengths", pa.list_(pa.string())),  # their strengths, 'slight', 'much' or null
    ("votes", pa.int64()),  # all votes on the pair
    ("agreement", pa.float64()),  # len(annotators) / votes
    ("source", pa.string()),  # how the votes came in, e.g. 'app', or 'app,simulate' when mixed
    ("time", pa.string()),  # the latest vote, ISO 8601
])

RAW_SCHEMA = pa.schema([
    ("prompt", MESSAGES),
    ("completion_a", MESSAGES),
    ("completion_b", MESSAGES),
    ("choice", pa.string()),  # 'a', 'b', 'tie' or 'both_bad'
    ("strength", pa.string()),
    ("comment", pa.string()),
    ("annotator", pa.string()),
    ("pair_id", pa.int64()),
    ("prompt_id", pa.int64()),
    ("completion_a_id", pa.int64()),
    ("completion_b_id", pa.int64()),
    ("policy_a", pa.int64()),
    ("policy_b", pa.int64()),
    ("source", pa.string()),
    ("time", pa.string()),
])


RANKING_SCHEMA = pa.schema([
    ("prompt", MESSAGES),
    ("answers", pa.list_(MESSAGES)),  # best first, each one assistant message
    ("ranks", pa.list_(pa.int64())),  # each answer's rank, 1 the best; equal ranks are a tie
    ("annotator", pa.string()),
    ("ranking_id", pa.int64()),
    ("pair_id", pa.int64()),  # the task's lead pair
    ("prompt_id", pa.int64()),
    ("completion_ids", pa.list_(pa.int64())),
    ("policies", pa.list_(pa.int64())),
    ("pairs", pa.int64()),  # the pairs it stands for: K(K-1)/2
    ("source", pa.string()),
    ("time", pa.string()),
])


class ExportError(StoreError):
    """An export that cannot be written as asked."""


@contextmanager
def _built(out: Path) -> Iterator[Path]:
    """Where to build the export, renamed to `out` once whole: a failed one (a full disk) leaves nothing behind."""
    try:
        with built_beside(out) as built:
            yield built
    except OSError as e:
        raise ExportError(f"cannot write {out}: {e.strerror or e}; nothing was written") from None


@dataclass(frozen=True)
class ExportResult:
    rows: int  # rows written: pairs in the preference export, votes in the raw one
    pairs: int  # pairs written
    resolved: int  # voted pairs whose majority is 'a' or 'b'
    unresolved: int  # voted pairs with no majority: two or more choices share first place
    tie_or_both_bad: int  # voted pairs whose majority is 'tie' or 'both_bad'
    below_agreement: int  # pairs that would have been written but for min_agreement


def export_preferences(
    con: Connection, out: Path, fmt: str, include_ties: bool = False, min_agreement: float | None = None, include_ai: bool = False
) -> ExportResult:
    """Write the project's votes to `out` in `fmt`: preference pairs, or every vote with `include_ties`; the AI
    judge's votes only with `include_ai`, on pairs no person voted on.

    `min_agreement` leaves out pairs whose agreement share (annotate.agreement.agreement_share)
    is below it; in the raw export it leaves out all the votes of such pairs, those with no
    majority included. `out` must not exist: the export is built beside it and renamed into
    place once complete, so a failed export leaves nothing behind.
    """
    if fmt not in WRITERS:
        raise ExportError(f"unknown export format {fmt!r}: use one of {', '.join(WRITERS)}")
    if min_agreement is not None and not 0 <= min_agreement <= 1:
        raise ExportError(f"the minimum agreement must be between 0 and 1, got {min_agreement}")
    if out.exists():
        raise ExportError(f"{out} already exists: choose another path or remove it first")
    winners: Counter[str | None] = Counter()
    kept: list[VotedPair] = []
    below = 0
    for pair in deciding_votes(voted_pairs(con), include_ai):
        choices = [vote.choice for vote in pair.votes]
        winner = majority(choices)
        winners[winner] += 1
        if not include_ties and winner not in ("a", "b"):
            continue
        if agreement_share(choices) < (min_agreement or 0.0):
            below += 1
        else:
            kept.append(pair)
    if include_ties:
        rows, schema = [_raw_row(pair, vote) for pair in kept for vote in pair.votes], RAW_SCHEMA
    else:
        rows, schema = [_export_row(pair) for pair in kept], PREFERENCE_SCHEMA
    with _built(out) as built:
        WRITERS[fmt](rows, schema, built)
    return ExportResult(
        rows=len(rows),
        pairs=len(kept),
        resolved=winners["a"] + winners["b"],
        unresolved=winners[None],
        tie_or_both_bad=winners["tie"] + winners["both_bad"],
        below_agreement=below,
    )


def export_rankings(con: Connection, out: Path, fmt: str) -> int:
    """Write every ranking to `out` in `fmt`, one row each (RANKING_SCHEMA); return how many. Built beside `out`
    and renamed into place, as export_preferences does; its pairs are in the preference export."""
    if fmt not in WRITERS:
        raise ExportError(f"unknown export format {fmt!r}: use one of {', '.join(WRITERS)}")
    if out.exists():
        raise ExportError(f"{out} already exists: choose another path or remove it first")
    rows = [
        {"prompt": r.prompt, "answers": [assistant(text) for text in r.texts], "ranks": r.ranks, "annotator": r.annotator,
         "ranking_id": r.id, "pair_id": r.pair_id, "prompt_id": r.prompt_id, "completion_ids": r.completion_ids,
         "policies": r.policies, "pairs": len(r.ranks) * (len(r.ranks) - 1) // 2, "source": r.source,
         "time": r.created_at.isoformat()}
        for r in stored_rankings(con)
    ]
    with _built(out) as built:
        WRITERS[fmt](rows, RANKING_SCHEMA, built)
    return len(rows)


def deciding_votes(pairs: list[VotedPair], include_ai: bool) -> list[VotedPair]:
    """Each pair with the votes that decide it: people's where any voted, else with `include_ai` the AI judge's.
    Pairs left with no votes are left out."""
    decided = []
    for pair in pairs:
        people = [vote for vote in pair.votes if vote.source != AI]
        votes = people or ([vote for vote in pair.votes if vote.source == AI] if include_ai else [])
        if votes:
            decided.append(dataclasses.replace(pair, votes=votes))
    return decided


def preference_rows(
    con: Connection, include_imported: bool = True, weight_by_trust: bool = False, ai_votes: str = "off", rankings: str = "pairs",
    flip_rate: float = 0.0,
) -> list[PreferenceRow]:
    """What a reward model trains on: the majority-resolved preference rows (ties, both-bad and unresolved pairs left
    out), those the preference export writes. With `rankings` = 'plackett_luce' ([reward_model] rankings) the pairs of
    ranked tasks are left out: their rankings are fitted whole instead (ranking_rows).

    With `weight_by_trust`, each pair is resolved instead by its votes weighted by their annotators'
    estimated reliability (annotate.trust), a gold pair by its known answer, and each row carries
    the probability that its label is right. The AI judge's votes decide the pairs no person voted
    on unless `ai_votes` ([reward_model] ai_votes) is 'off'; with 'weight' such a row carries the
    judge's agreement with people as its confidence (annotate.agreement.JudgeAgreement.confidence).
    Otherwise a row resolved by its majority carries the probability that the majority is right when each vote
    picks the worse answer with probability `flip_rate` (annotate.agreement.majority_confidence).
    """
    rows = []
    gold = gold_answers(con) if weight_by_trust else {}
    reliability = {a: r.reliability for a, r in project_reliability(con).items()} if weight_by_trust else None
    judges = agreement_with_people(con) if ai_votes == "weight" else {}
    ranked = ranked_task_pairs(con) if rankings == "plackett_luce" else set()
    for pair in deciding_votes(voted_pairs(con), ai_votes != "off"):
        if pair.pair_id in ranked or (not include_imported and all(vote.source == "import" for vote in pair.votes)):
            continue
        winner = majority([vote.choice for vote in pair.votes])
        if pair.pair_id in gold:  # weighing by trust: the known answer, whoever voted
            rows.append(_resolved(pair, gold[pair.pair_id]))
        elif pair.votes[0].source == AI:  # no person voted on it
            if winner in ("a", "b"):
                rows.append(_resolved(pair, winner, _judged_confidence(pair, winner, judges) if ai_votes == "weight" else 1.0))
        elif reliability is not None:
            if label := weighted_label([(vote.annotator, vote.choice) for vote in pair.votes], reliability):
                rows.append(_resolved(pair, *label))
        elif winner in ("a", "b"):
            choices = [vote.choice for vote in pair.votes]
            loser = "b" if winner == "a" else "a"
            rows.append(_resolved(pair, winner, majority_confidence(choices.count(winner), choices.count(loser), flip_rate)))
    return rows


def ranking_rows(con: Connection) -> list[RankingRow]:
    """Every ranking, each one Plackett-Luce item. Only people rank: the AI judge and imports vote on pairs."""
    return [RankingRow(r.prompt, r.texts, r.ranks, r.id, r.pair_id, r.prompt_id, r.completion_ids) for r in stored_rankings(con)]


def _judged_confidence(pair: VotedPair, winner: str, judges: dict[str, JudgeAgreement]) -> float:
    """How far to trust the AI judges' label of a pair: the mean confidence of the judges that voted for it."""
    backing = [judges.get(vote.annotator, JudgeAgreement(0, 0)).confidence for vote in pair.votes if vote.choice == winner]
    return sum(backing) / len(backing)


def _resolved(pair: VotedPair, winner: str, confidence: float = 1.0) -> PreferenceRow:
    """The pair as its chosen and rejected completions, `winner` ('a' or 'b') chosen."""
    a_won = winner == "a"
    a = (pair.text_a, pair.finished_a, pair.completion_a, pair.policy_a)
    b = (pair.text_b, pair.finished_b, pair.completion_b, pair.policy_b)
    (chosen, chosen_finished, chosen_id, chosen_policy), (rejected, rejected_finished, rejected_id, rejected_policy) = (
        (a, b) if a_won else (b, a)
    )
    return PreferenceRow(
        pair.prompt, chosen, rejected, chosen_finished, rejected_finished, pair_id=pair.pair_id, prompt_id=pair.prompt_id,
        chosen_completion_id=chosen_id, rejected_completion_id=rejected_id, chosen_policy=chosen_policy, rejected_policy=rejected_policy,
        confidence=confidence,
    )


def _export_row(pair: VotedPair) -> dict[str, Any]:
    """The resolved pair in TRL's conversational format, with its votes."""
    winner = majority([vote.choice for vote in pair.votes])
    row = _resolved(pair, winner)
    backing = [vote for vote in pair.votes if vote.choice == winner]
    return {
        **conversational(row),
        **{name: getattr(row, name) for name in ID_COLUMNS},
        "annotators": [vote.annotator for vote in backing],
        "strengths": [vote.strength for vote in backing],
        "votes": len(pair.votes),
        "agreement": len(backing) / len(pair.votes),
        "source": ",".join(sorted({vote.source for vote in pair.votes})),
        "time": max(vote.created_at for vote in pair.votes).isoformat(),
    }


def _raw_row(pair: VotedPair, vote: CastVote) -> dict[str, Any]:
    return {
        "prompt": pair.prompt,
        "completion_a": assistant(pair.text_a),
        "completion_b": assistant(pair.text_b),
        "choice": vote.choice,
        "strength": vote.strength,
        "comment": vote.comment,
        "annotator": vote.annotator,
        "pair_id": pair.pair_id,
        "prompt_id": pair.prompt_id,
        "completion_a_id": pair.completion_a,
        "completion_b_id": pair.completion_b,
        "policy_a": pair.policy_a,
        "policy_b": pair.policy_b,
        "source": vote.source,
        "time": vote.created_at.isoformat(),
    }


Writer = Callable[[list[dict[str, Any]], pa.Schema, Path], None]


def _write_hf(rows: list[dict[str, Any]], schema: pa.Schema, path: Path) -> None:
    # Imported here: datasets takes a second to import, which the other formats need not wait.
    from datasets import Dataset, Features

    Dataset.from_list(rows, features=Features.from_arrow_schema(schema)).save_to_disk(str(path))


def _write_parquet(rows: list[dict[str, Any]], schema: pa.Schema, path: Path) -> None:
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


def _write_jsonl(rows: list[dict[str, Any]], schema: pa.Schema, path: Path) -> None:
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


WRITERS: dict[str, Writer] = {"hf": _write_hf, "parquet": _write_parquet, "jsonl": _write_jsonl}
FORMATS = tuple(WRITERS)
