"""Gold pairs: pairs whose better answer is known, and the votes that measure each annotator against them.

A gold pair is served to every annotator once, mixed in among the pairs that want votes
([queue] gold_share). It comes from a gold file (a preference file: its chosen reply is the
answer), from pairs people agreed on, or from an operator's word on one pair.
"""

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from store.db import Connection, StoreError, placeholders, transaction
from store.input_files import ImportLimits
from store.pref_files import read_preference_file
from store.preferences import add_preference_pairs
from store.prompts import ImportResult

GOLD = "gold"
"""The pair strategy of pairs imported as gold."""

ORIGINS = ("import", "agreed", "operator")

# Votes that measure a person: imported votes are a dataset's, and 'ai' a model's.
_PEOPLE = "source NOT IN ('import', 'ai')"
# A pair of a task of K answers to rank (store.rankings): served as a ranking, so never as a gold pair.
_OF_A_TASK = "(answers IS NOT NULL OR task IS NOT NULL)"


@dataclass(frozen=True)
class GoldPair:
    pair_id: int
    prompt_id: int
    completion_a: int
    completion_b: int
    answer: str  # 'a' or 'b'


def import_gold_file(con: Connection, path: Path, actor: str, now: datetime, limits: ImportLimits = ImportLimits()) -> ImportResult:
    """Add the gold pairs of a preference file, its chosen reply the answer; read and check the whole file first,
    so a bad row adds nothing. Pairs imported as gold before are skipped."""
    preferences = read_preference_file(path, limits)
    with transaction(con):
        pair_ids = add_preference_pairs(con, preferences, GOLD, votes_wanted=0)
        mark_gold(con, dict.fromkeys(pair_ids, "a"), "import", actor, now)
    return ImportResult(added=len(pair_ids), duplicates=len(preferences) - len(pair_ids))


def mark_gold(con: Connection, answers: dict[int, str], origin: str, actor: str, now: datetime) -> int:
    """Mark these pairs gold with their answers, in one transaction; how many were marked.

    A pair marked again takes the new answer. Each pair's own votes_wanted is cut to the votes it
    has, so that the ordinary queue stops serving it and only the gold share does.
    """
    if origin not in ORIGINS:
        raise StoreError(f"a gold pair's origin must be one of {', '.join(ORIGINS)}, got {origin!r}")
    for pair_id, answer in answers.items():
        if answer not in ("a", "b"):
            raise StoreError(f"gold pair {pair_id} has no answer: give 'a' or 'b', got {answer!r}")
    if not answers:
        return 0
    ids = list(answers)
    with transaction(con):
        found = {row[0] for row in con.execute(f"SELECT id FROM pairs WHERE id IN ({placeholders(len(ids))})", ids).fetchall()}
        if missing := sorted(set(ids) - found):
            raise StoreError(f"no pair {missing[0]} in the project" + (f" (nor {len(missing) - 1} more)" if len(missing) > 1 else ""))
        if ranked := con.execute(f"SELECT min(id) FROM pairs WHERE id IN ({placeholders(len(ids))}) AND {_OF_A_TASK}", ids).fetchone()[0]:
            raise StoreError(f"pair {ranked} is one of a task's answers to rank: only a pair shown as a pair can be gold")
        con.executemany(
            "INSERT INTO gold VALUES (?, ?, ?, ?, ?) ON CONFLICT (pair_id) DO UPDATE SET answer = excluded.answer, "
            "origin = excluded.origin, marked_by = excluded.marked_by, created_at = excluded.created_at",
            [(pair_id, answer, origin, actor, now) for pair_id, answer in answers.items()],
        )
        con.execute(
            f"""
            UPDATE pairs SET votes_wanted = least(votes_wanted, (SELECT count(*) FROM comparisons c WHERE c.pair_id = pairs.id))
            WHERE id IN ({placeholders(len(ids))})
            """,
            ids,
        )
    return len(answers)


def agreed_pairs(con: Connection, min_votes: int) -> dict[int, str]:
    """Pairs not yet gold on which at least `min_votes` people voted, all for the same answer: that answer."""
    rows = con.execute(
        f"""
        SELECT pair_id, any_value(choice) FROM comparisons
        WHERE {_PEOPLE} AND pair_id NOT IN (SELECT pair_id FROM gold) AND pair_id NOT IN (SELECT id FROM pairs WHERE {_OF_A_TASK})
        GROUP BY pair_id
        HAVING count(*) >= ? AND count(DISTINCT choice) = 1 AND any_value(choice) IN ('a', 'b')
        ORDER BY pair_id
        """,
        [min_votes],
    ).fetchall()
    return dict(rows)


def gold_pairs(con: Connection) -> list[GoldPair]:
    """Every gold pair that is not retired, in pair order."""
    rows = con.execute(
        """
        SELECT p.id, p.prompt_id, p.completion_a, p.completion_b, g.answer
        FROM gold g JOIN pairs p ON p.id = g.pair_id
        WHERE NOT p.retired ORDER BY p.id
        """
    ).fetchall()
    return [GoldPair(*row) for row in rows]


def gold_seen(con: Connection) -> list[tuple[str, int]]:
    """(annotator, gold pair) for every gold pair served to or answered by an annotator."""
    return con.execute(
        """
        SELECT annotator, pair_id FROM assignments WHERE pair_id IN (SELECT pair_id FROM gold)
        UNION SELECT annotator, pair_id FROM comparisons WHERE pair_id IN (SELECT pair_id FROM gold)
        """
    ).fetchall()


def gold_answers(con: Connection) -> dict[int, str]:
    return dict(con.execute("SELECT pair_id, answer FROM gold").fetchall())


def people_votes(con: Connection) -> list[tuple[int, str, str]]:
    """(pair, annotator, choice) of every vote people cast for 'a' or 'b': what measures their reliability."""
    return con.execute(
        f"SELECT pair_id, annotator, choice FROM comparisons WHERE {_PEOPLE} AND choice IN ('a', 'b') ORDER BY id"
    ).fetchall()
