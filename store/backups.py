"""Copying a whole database: into a backup from one transaction's snapshot, and back out of a backup,
which is not trusted, into a new database of this Tether's own schema."""

import re
import secrets
from pathlib import Path
from typing import Callable, TypeVar

import duckdb

from store.db import Connection, NotSaved, SchemaTooNew, StoreError, migrate, transaction
from store.schema import MIGRATIONS

T = TypeVar("T")


def copy_database(con: Connection, path: Path, read: Callable[[Connection], T]) -> T:
    """Copy the database of `con` into a new file at `path` as one transaction sees it; return what `read`
    finds in that same snapshot. On failure (a full disk) the file at `path` is left to be thrown away."""
    alias = f"copy_{secrets.token_hex(8)}"  # never one a failed copy could have left behind
    try:
        con.execute(f"ATTACH ? AS {alias}", [str(path)])
        try:
            with transaction(con):
                seen = read(con)
                name = con.execute("SELECT current_database()").fetchone()[0]
                con.execute(f"COPY FROM DATABASE {_quoted(name)} TO {alias}")
        finally:  # attached, the copy would hold its file open and its name taken until the process ends
            con.execute(f"DETACH DATABASE IF EXISTS {alias}")
    except (duckdb.Error, NotSaved) as e:
        raise StoreError(f"cannot copy the database to {path}: {e}") from None
    return seen


def restore_database(backup: Path, path: Path) -> None:
    """Make a new database at `path` holding the rows of the backup's database file `backup`.

    The backup is opened read-only with no access to any other file, and only the tables of
    Tether's schema are read from it, column by column, into a database made by Tether's own
    migrations: nothing else a backup file might hold (a view, a macro) comes along. The
    sequences go on from where the backup's stood, so new rows get fresh ids.
    """
    try:
        source = duckdb.connect(str(backup), read_only=True, config={"enable_external_access": False})
    except duckdb.Error as e:
        raise StoreError(f"cannot open {backup}: {e}") from None
    con = duckdb.connect(str(path))
    try:
        version = _schema_version(source, backup)
        migrate(con, [m for m in MIGRATIONS if m.version <= version])  # the backup's schema, to copy its rows as they are
        for table in _tables(con):
            columns = _columns(con, table)
            if _columns(source, table) != columns:
                raise StoreError(f"{backup}: table {table} is not as schema version {version} makes it")
            rows = source.sql(f"SELECT {', '.join(_quoted(c) for c, _ in columns)} FROM {_quoted(table)}").to_arrow_reader()
            con.register("_rows", rows)
            try:
                con.execute(f"INSERT INTO {_quoted(table)} SELECT * FROM _rows")
            finally:
                con.unregister("_rows")
        _continue_sequences(source, con)
        migrate(con)  # then up to this Tether's schema
    except duckdb.Error as e:
        raise StoreError(f"{backup}: cannot restore the database: {e}") from None
    finally:
        source.close()
        con.close()


def _schema_version(source: Connection, backup: Path) -> int:
    try:
        version = source.execute("SELECT max(version) FROM schema_migrations").fetchone()[0]
    except duckdb.Error:
        version = None
    if not isinstance(version, int):
        raise StoreError(f"{backup} is not a Tether database (it has no schema version)")
    if version > MIGRATIONS[-1].version:
        raise SchemaTooNew(f"{backup} is at schema version {version}, but this Tether knows versions up to "
                           f"{MIGRATIONS[-1].version}: upgrade Tether")
    return version


def _tables(con: Connection) -> list[str]:
    """Tether's tables, as its migrations made them in `con`; schema_migrations is the new database's own."""
    return [name for (name,) in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() AND schema_name = 'main' "
        "AND table_name <> 'schema_migrations' ORDER BY table_name").fetchall()]


def _columns(con: Connection, table: str) -> list[tuple[str, str]]:
    """A base table's columns and their types, in order; none when there is no such table."""
    return con.execute(
        "SELECT column_name, data_type FROM duckdb_columns() JOIN duckdb_tables() USING (database_name, schema_name, table_name) "
        "WHERE database_name = current_database() AND schema_name = 'main' AND table_name = ? ORDER BY column_index",
        [table]).fetchall()


def _continue_sequences(source: Connection, con: Connection) -> None:
    """Take each sequence of `con` past its value in the backup and past every id its columns hold."""
    taken = dict(source.execute("SELECT sequence_name, greatest(coalesce(last_value, 0), start_value - 1) FROM duckdb_sequences() "
                                "WHERE database_name = current_database()").fetchall())
    for table, column, default in con.execute(
        "SELECT table_name, column_name, column_default FROM duckdb_columns() "
        "WHERE database_name = current_database() AND column_default LIKE 'nextval(%'").fetchall():
        sequence = re.fullmatch(r"nextval\('(\w+)'\)", default)[1]
        highest = con.execute(f"SELECT coalesce(max({_quoted(column)}), 0) FROM {_quoted(table)}").fetchone()[0]
        past = max(highest, taken.get(sequence, 0))
        if past > 2**31 - 1:  # the ids are INTEGER: a backup claiming more is not one Tether wrote
            raise StoreError(f"sequence {sequence} of the backup is at {past}, past the largest id")
        current = con.execute("SELECT coalesce(last_value, 0) FROM duckdb_sequences() WHERE database_name = current_database() "
                              "AND sequence_name = ?", [sequence]).fetchone()[0]
        # DuckDB cannot set a sequence that a column depends on: taking values is the way, 20 ms a million.
        con.execute(f"SELECT max(nextval('{sequence}')) FROM range(?)", [past - current])


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
