"""Whether the database is whole: every table reads back, and every reference between tables holds.

DuckDB has no integrity check of its own, but it verifies a block's checksum whenever it reads
one, so reading every column of every row finds a damaged file. The schema has no foreign keys
(see store.schema), so the references the store keeps whole are checked here, one query each.
"""

from dataclasses import dataclass

import duckdb

from store.db import Connection
from store.jobs import registered_adapter_paths
from store.policies import dpo_jobs_behind, policy_versions

# (table, column, the table and column it names, what the rows are, a condition on the rows that must name one)
REFERENCES = [
    ("comparisons", "pair_id", "pairs", "id", "votes", "true"),
    ("comparisons", "annotator", "users", "name", "votes cast in the app", "source = 'app'"),
    ("rankings", "pair_id", "pairs", "id", "rankings", "true"),
    ("rankings", "annotator", "users", "name", "rankings cast in the app", "source = 'app'"),
    ("skips", "pair_id", "pairs", "id", "skips", "true"),
    ("assignments", "pair_id", "pairs", "id", "servings of a pair", "true"),
    ("gold", "pair_id", "pairs", "id", "gold answers", "true"),
    ("pairs", "prompt_id", "prompts", "id", "pairs", "true"),
    ("pairs", "completion_a", "completions", "id", "pairs", "true"),
    ("pairs", "completion_b", "completions", "id", "pairs", "true"),
    ("completions", "prompt_id", "prompts", "id", "answers", "true"),
    ("completions", "policy_version", "policies", "version", "answers", "policy_version IS NOT NULL"),
    ("policies", "parent", "policies", "version", "policy versions", "parent IS NOT NULL"),
    ("reward_models", "snapshot", "snapshots", "hash", "reward models", "true"),
    ("rounds", "policy_from", "policies", "version", "rounds", "true"),
    ("rounds", "policy_to", "policies", "version", "rounds", "policy_to IS NOT NULL"),
    ("rounds", "reward_version", "reward_models", "version", "rounds", "reward_version IS NOT NULL"),
    ("candidates", "round", "rounds", "id", "candidates", "true"),
    ("candidates", "job", "jobs", "id", "candidates", "true"),
    ("jobs", "round", "rounds", "id", "jobs", "round IS NOT NULL"),
    ("metrics", "job_id", "jobs", "id", "training figures", "true"),
    ("account_events", "account", "users", "name", "account log entries", "true"),
]
SHOWN = 5  # the ids a problem names at most


def unreadable_tables(con: Connection) -> list[str]:
    """The tables that do not read back, one line each; a damaged file shows here."""
    tables = [row[0] for row in con.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main'").fetchall()]
    problems = []
    for table in tables:
        try:  # hash(row) reads every column of every row, and so every block of the table
            con.execute(f'SELECT count(*), sum(hash("{table}")) FROM "{table}"').fetchall()
        except duckdb.Error as e:
            problems.append(f"the database's table {table} cannot be read back ({e}): restore the project from a backup")
    return problems


def broken_references(con: Connection) -> list[str]:
    """The references between tables that do not hold, one line each; only meaningful once every table reads."""
    problems = []
    for table, column, target, target_column, rows, condition in REFERENCES:
        missing = con.execute(f"""
            SELECT DISTINCT {column} FROM {table} WHERE {condition}
            AND {column} NOT IN (SELECT {target_column} FROM {target}) ORDER BY 1""").fetchall()
        if missing:
            named = ", ".join(str(row[0]) for row in missing[:SHOWN]) + (" and more" if len(missing) > SHOWN else "")
            problems.append(f"{rows} name {len(missing)} {target} row{'s' if len(missing) > 1 else ''} that the database "
                            f"does not hold ({table}.{column}: {named}): restore the project from a backup")
    return problems


def holds_only_the_start(con: Connection) -> bool:
    """The database as `tether init` makes it: its schema, and at most the starting model as policy 0."""
    tables = [row[0] for row in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' AND table_name NOT IN ('schema_migrations', 'policies')").fetchall()]
    if any(con.execute(f'SELECT count(*) FROM "{table}"').fetchall()[0][0] for table in tables):
        return False
    return con.execute("SELECT list(version) FROM policies").fetchall()[0][0] in (None, [0])


@dataclass(frozen=True)
class NamedFiles:
    """What the database names in the project's folder."""

    versions: dict[str, dict[str, str]]  # each registered version's directory: its files' digests, {} if registered before they were kept
    snapshots: dict[str, int]  # the votes each reward model trained on, frozen in its job's directory: the file, its rows
    dpo_jobs: list[int]  # the DPO jobs whose votes a registered policy learnt: later rounds read them, to train on new ones
    jobs: set[int]


def named_files(con: Connection) -> NamedFiles:
    versions: dict[str, dict[str, str]] = {path: {} for path in registered_adapter_paths(con)}
    for adapter_path, file, digest in con.execute("SELECT adapter_path, file, sha256 FROM version_files").fetchall():
        versions.setdefault(adapter_path, {})[file] = digest
    snapshots = dict(con.execute("SELECT path, rows FROM snapshots WHERE hash IN (SELECT snapshot FROM reward_models)").fetchall())
    dpo_jobs = sorted({job for version in policy_versions(con) for job in dpo_jobs_behind(con, version)})
    return NamedFiles(versions, snapshots, dpo_jobs, {row[0] for row in con.execute("SELECT id FROM jobs").fetchall()})
