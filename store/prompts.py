"""Prompts: importing them (deduplicated by content) and choosing which to generate for."""

import json
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from store.db import Connection, insert_rows, transaction
from store.input_files import ImportLimits, Messages
from store.prompt_files import NewPrompt, read_prompt_file

_ROW_SCHEMA = pa.schema([
    ("content_hash", pa.string()),
    ("messages", pa.string()),
    ("source", pa.string()),
    ("tags", pa.list_(pa.string())),
    ("active", pa.bool_()),
])


@dataclass(frozen=True)
class Prompt:
    id: int
    messages: Messages
    content_hash: str
    completions: int  # from the policy version it was fetched for


@dataclass(frozen=True)
class ImportResult:
    added: int
    duplicates: int


def add_prompts(con: Connection, prompts: list[NewPrompt]) -> ImportResult:
    """Insert the prompts the project lacks, all in one transaction."""
    with transaction(con):
        added = insert_new_prompts(con, prompts)
    return ImportResult(added=added, duplicates=len(prompts) - added)


def insert_new_prompts(con: Connection, prompts: list[NewPrompt], active: bool = True) -> int:
    """Insert the prompts the project lacks, inside the caller's transaction; return how many.

    Inactive prompts are kept for their votes but not generated for.
    """
    unique: dict[str, NewPrompt] = {}
    for prompt in prompts:
        unique.setdefault(prompt.content_hash, prompt)
    existing = prompt_ids(con, list(unique))
    new = [p for h, p in unique.items() if h not in existing]
    rows = [
        {"content_hash": p.content_hash, "messages": json.dumps(p.messages, ensure_ascii=False), "source": p.source, "tags": list(p.tags), "active": active}
        for p in new
    ]
    insert_rows(con, "prompts", rows, _ROW_SCHEMA)
    return len(new)


def prompt_ids(con: Connection, content_hashes: list[str]) -> dict[str, int]:
    """The ids of the stored prompts with these content hashes; hashes not stored are left out."""
    return dict(
        con.execute("SELECT content_hash, id FROM prompts WHERE list_contains(?, content_hash)", [content_hashes]).fetchall()
    )


def import_prompt_file(con: Connection, path: Path, limits: ImportLimits = ImportLimits()) -> ImportResult:
    """Read and check the whole file, then add its prompts; a bad row adds nothing."""
    return add_prompts(con, read_prompt_file(path, limits))


def prompts_to_generate(con: Connection, policy_version: int, limit: int | None) -> list[Prompt]:
    """Active prompts, those with the fewest completions from this policy first."""
    rows = con.execute(
        """
        SELECT p.id, p.messages, p.content_hash, count(c.id)
        FROM prompts p
        LEFT JOIN completions c ON c.prompt_id = p.id AND c.policy_version = ?
        WHERE p.active
        GROUP BY p.id, p.messages, p.content_hash
        ORDER BY count(c.id), p.id
        LIMIT ?
        """,
        [policy_version, limit],
    ).fetchall()
    return [Prompt(row[0], json.loads(row[1]), row[2], row[3]) for row in rows]
