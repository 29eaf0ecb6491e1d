"""Opening the database, transactions and bulk inserts."""

import re
import weakref
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import duckdb
import pyarrow as pa

from store.schema import MIGRATIONS, Migration

Connection = duckdb.DuckDBPyConnection


class StoreError(Exception):
    """A problem with the database or with data on its way in, told in one line."""


class DatabaseLocked(StoreError):
    """Another process holds the database file (DuckDB allows one process at a time)."""

    def __init__(self, path: Path, pid: int, command: str):
        self.pid = pid
        super().__init__(
            f"{path} is in use by process {pid} ({command}). DuckDB lets one process open the database at a time: "
            "wait for that process to finish or stop it, then try again."
        )


class NotSaved(StoreError):
    """The database could not make a change durable (a full disk, most often); none of it was kept."""


class BadInput(StoreError):
    """A row of an input file that cannot be imported; nothing from the file is written."""

    def __init__(self, file: str, where: str, problem: str, field: str | None = None):
        self.file, self.where, self.field, self.problem = file, where, field, problem
        at = f"{where}, field '{field}'" if field else where
        super().__init__(f"{file}: {at}: {problem}")


class SchemaTooNew(StoreError):
    """The database was written by a newer Tether than this one."""


_LOCK_HOLDER = re.compile(r"Conflicting lock is held in (?P<exe>.+?) \(PID (?P<pid>\d+)\)")


def _describe_process(pid: int, exe: str) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        return " ".join(a.decode(errors="replace") for a in argv if a) or exe
    except OSError:
        return exe


def open_database(path: Path) -> Connection:
    """Open (or create) the project database read-write and bring its schema up to date."""
    try:
        con = duckdb.connect(str(path))
    except duckdb.IOException as e:
        holder = _LOCK_HOLDER.search(str(e))
        if holder:
            pid = int(holder["pid"])
            raise DatabaseLocked(path, pid, _describe_process(pid, holder["exe"])) from None
        raise StoreError(f"cannot open {path}: {e}") from None
    except duckdb.Error as e:
        raise StoreError(f"cannot open {path}: {e}") from None
    try:
        migrate(con)
    except Exception:
        con.close()
        raise
    return con


# Connections inside a transaction opened by `transaction`. DuckDB aborts the open transaction
# when asked to begin a second one, so nesting must be known before it is tried.
_IN_TRANSACTION: "weakref.WeakSet[Connection]" = weakref.WeakSet()


@contextmanager
def transaction(con: Connection) -> Iterator[Connection]:
    """All or nothing: commit when the block ends, roll back if it raises.

    Inside another transaction the block joins it, so store functions compose into one.
    """
    if con in _IN_TRANSACTION:
        yield con
        return
    con.begin()
    _IN_TRANSACTION.add(con)
    try:
        yield con
    except BaseException:
        con.rollback()
        raise
    else:
        try:
            con.commit()
        except duckdb.Error as e:  # DuckDB has rolled the transaction back
            raise NotSaved(f"the database could not save this change, and kept none of it: {e}") from None
    finally:
        _IN_TRANSACTION.discard(con)


def utcnow() -> datetime:
    """The time as the store records it: UTC, without a zone."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def insert_rows(con: Connection, table: str, rows: list[dict[str, Any]], schema: pa.Schema) -> None:
    """Insert many rows in one statement; DuckDB's executemany is row by row and slow."""
    if not rows:
        return
    batch = pa.Table.from_pylist(rows, schema=schema)
    con.complete()  # DuckDB 2 refuses register while a result is unread, as one the last caller fetched one row of is
    con.register("_batch", batch)
    try:
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _batch")
    finally:
        con.unregister("_batch")


def placeholders(count: int) -> str:
    """'?, ?, ?' for `count` parameters: an IN list or a row of VALUES."""
    return ", ".join("?" * count)


def insert_values(con: Connection, into: str, rows: list[tuple], on_conflict: str = "") -> None:
    """Insert a few rows in one statement, `into` being a table and its columns: each statement costs DuckDB
    a millisecond or two of CPU, however small, and registering an Arrow batch (insert_rows) costs three."""
    if not rows:
        return
    row = f"({placeholders(len(rows[0]))})"
    con.execute(f"INSERT INTO {into} VALUES {', '.join([row] * len(rows))} {on_conflict}", [v for r in rows for v in r])


def reserve_ids(con: Connection, sequence: str, count: int) -> list[int]:
    """Take `count` ids from a sequence, so rows can reference each other before insert."""
    return [row[0] for row in con.execute(f"SELECT nextval('{sequence}') FROM range(?)", [count]).fetchall()]


def schema_version(con: Connection) -> int:
    con.execute("""
        CREATE TABLE IF NOT EXISTS schema_migrations (
            version INTEGER PRIMARY KEY,
            name VARCHAR NOT NULL,
            applied_at TIMESTAMP NOT NULL DEFAULT current_timestamp
        )""")
    # fetchall, not fetchone: DuckDB 2 keeps a result not read to its end open, and then refuses to register a
    # table (insert_rows) on the connection.
    return con.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchall()[0][0]


def migrate(con: Connection, migrations: list[Migration] = MIGRATIONS) -> list[int]:
    """Apply the migrations the database lacks, each in its own transaction; return their versions."""
    current = schema_version(con)
    known = migrations[-1].version if migrations else 0
    if current > known:
        raise SchemaTooNew(f"the database is at schema version {current}, but this Tether knows versions up to {known}: upgrade Tether")
    pending = [m for m in migrations if m.version > current]
    for migration in pending:
        with transaction(con):
            con.execute(migration.sql)
            con.execute("INSERT INTO schema_migrations (version, name) VALUES (?, ?)", [migration.version, migration.name])
    return [m.version for m in pending]
