"""Imported human preferences: each becomes a prompt, two completions, a pair and one vote."""

from pathlib import Path

import pyarrow as pa

from store.db import Connection, insert_rows, reserve_ids, transaction
from store.input_files import ImportLimits
from store.pref_files import NewPreference, read_preference_file
from store.prompts import ImportResult, insert_new_prompts, prompt_ids

IMPORT = "import"
"""The pair strategy, the annotator and the vote source of imported preferences."""

# Columns left out are NULL: an imported completion has no policy version, token count,
# finish flag or sampling, and an imported vote no strength, comment, time or client token.
_COMPLETION_SCHEMA = pa.schema([("id", pa.int32()), ("prompt_id", pa.int32()), ("text", pa.string())])
_PAIR_SCHEMA = pa.schema([
    ("id", pa.int32()),
    ("prompt_id", pa.int32()),
    ("completion_a", pa.int32()),
    ("completion_b", pa.int32()),
    ("strategy", pa.string()),
    ("votes_wanted", pa.int32()),
])
_COMPARISON_SCHEMA = pa.schema([("pair_id", pa.int32()), ("annotator", pa.string()), ("choice", pa.string()), ("source", pa.string())])


def import_preference_file(con: Connection, path: Path, limits: ImportLimits = ImportLimits()) -> ImportResult:
    """Read and check the whole file, then add its preferences; a bad row adds nothing."""
    return add_preferences(con, read_preference_file(path, limits))


def add_preferences(con: Connection, preferences: list[NewPreference]) -> ImportResult:
    """Store the preferences the project has not imported before, all in one transaction.

    The chosen reply is completion a and the vote is for a. Prompts are shared with prompt
    import: one already in the project, from either, is reused. New ones come in inactive, so
    that `tether generate` samples only for prompts imported as prompts (HH's red-team prompts
    make good reward-model data but poor annotation work).
    """
    with transaction(con):
        pair_ids = add_preference_pairs(con, preferences, IMPORT, votes_wanted=1)
        votes = [{"pair_id": pair, "annotator": IMPORT, "choice": "a", "source": IMPORT} for pair in pair_ids]
        insert_rows(con, "comparisons", votes, _COMPARISON_SCHEMA)
    return ImportResult(added=len(pair_ids), duplicates=len(preferences) - len(pair_ids))


def add_preference_pairs(con: Connection, preferences: list[NewPreference], strategy: str, votes_wanted: int) -> list[int]:
    """Store each preference not stored before with this strategy as a prompt (reused when present, else new and
    inactive), two completions and a pair whose completion a is the chosen reply; the new pairs' ids."""
    unique: dict[tuple[str, str, str], NewPreference] = {}
    for preference in preferences:
        unique.setdefault(preference.key, preference)
    with transaction(con):
        stored = _stored_keys(con, list({key[0] for key in unique}), strategy)
        new = [p for key, p in unique.items() if key not in stored]
        insert_new_prompts(con, [p.prompt for p in new], active=False)
        prompt_id = prompt_ids(con, [p.prompt.content_hash for p in new])
        completion_ids = reserve_ids(con, "completion_id", 2 * len(new))
        pair_ids = reserve_ids(con, "pair_id", len(new))
        completions, pairs = [], []
        for p, pair, chosen, rejected in zip(new, pair_ids, completion_ids[0::2], completion_ids[1::2]):
            prompt = prompt_id[p.prompt.content_hash]
            completions.append({"id": chosen, "prompt_id": prompt, "text": p.chosen})
            completions.append({"id": rejected, "prompt_id": prompt, "text": p.rejected})
            pairs.append({"id": pair, "prompt_id": prompt, "completion_a": chosen, "completion_b": rejected,
                          "strategy": strategy, "votes_wanted": votes_wanted})
        insert_rows(con, "completions", completions, _COMPLETION_SCHEMA)
        insert_rows(con, "pairs", pairs, _PAIR_SCHEMA)
    return pair_ids


def _stored_keys(con: Connection, content_hashes: list[str], strategy: str) -> set[tuple[str, str, str]]:
    """(prompt hash, chosen text, rejected text) of the pairs stored with this strategy on these prompts."""
    rows = con.execute(
        """
        SELECT p.content_hash, chosen.text, rejected.text
        FROM pairs
        JOIN prompts p ON p.id = pairs.prompt_id
        JOIN completions chosen ON chosen.id = pairs.completion_a
        JOIN completions rejected ON rejected.id = pairs.completion_b
        WHERE pairs.strategy = ? AND list_contains(?, p.content_hash)
        """,
        [strategy, content_hashes],
    ).fetchall()
    return set(rows)
