from contextlib import closing

import pytest

from store import SchemaTooNew, open_database
from store.db import migrate, schema_version
from store.schema import MIGRATIONS, Migration

TABLES = {
    "prompts", "policies", "completions", "pairs", "assignments", "comparisons", "skips",
    "users", "reward_models", "jobs", "metrics", "snapshots", "rounds", "schema_migrations", "account_events", "gold", "rankings",
    "candidates", "version_files",
}


def tables(con) -> set[str]:
    return {row[0] for row in con.execute("SHOW TABLES").fetchall()}


def columns(con, table: str) -> set[str]:
    return {row[0] for row in con.execute(f"DESCRIBE {table}").fetchall()}


def test_new_database_gets_every_migration_recorded(tmp_path):
    with closing(open_database(tmp_path / "t.duckdb")) as con:
        assert tables(con) == TABLES
        recorded = con.execute("SELECT version, name FROM schema_migrations ORDER BY version").fetchall()
        assert recorded == [(m.version, m.name) for m in MIGRATIONS]


def test_reopening_applies_nothing_and_keeps_data(tmp_path):
    path = tmp_path / "t.duckdb"
    with closing(open_database(path)) as con:
        con.execute("INSERT INTO policies (version) VALUES (0)")
    with closing(open_database(path)) as con:
        assert migrate(con) == []
        assert con.execute("SELECT version FROM policies").fetchall() == [(0,)]


def test_accounts_of_a_database_from_before_disabling_existed_stay_enabled(tmp_path):
    import duckdb

    con = duckdb.connect(str(tmp_path / "old.duckdb"))
    migrate(con, [m for m in MIGRATIONS if m.version <= 4])
    con.execute("INSERT INTO users (name, role, password_hash) VALUES ('ann', 'annotator', 'scrypt$...')")
    assert migrate(con) == [m.version for m in MIGRATIONS if m.version > 4]
    assert con.execute("SELECT name, disabled FROM users").fetchall() == [("ann", False)]
    con.close()


def test_a_new_migration_applies_once_on_an_existing_database(tmp_path):
    path = tmp_path / "t.duckdb"
    open_database(path).close()
    extended = MIGRATIONS + [Migration(len(MIGRATIONS) + 1, "add note", "ALTER TABLE prompts ADD COLUMN note VARCHAR")]
    with closing(open_database(path)) as con:
        assert migrate(con, extended) == [len(MIGRATIONS) + 1]
        assert "note" in columns(con, "prompts")
        assert migrate(con, extended) == []


def test_a_failing_migration_leaves_the_schema_as_it_was(tmp_path):
    path = tmp_path / "t.duckdb"
    open_database(path).close()
    broken = MIGRATIONS + [Migration(len(MIGRATIONS) + 1, "broken", "ALTER TABLE prompts ADD COLUMN x INT; SELECT * FROM no_such_table")]
    with closing(open_database(path)) as con:
        with pytest.raises(Exception, match="no_such_table"):
            migrate(con, broken)
        assert schema_version(con) == len(MIGRATIONS)
        assert "x" not in columns(con, "prompts")


def test_a_database_from_a_newer_tether_is_refused(tmp_path):
    path = tmp_path / "t.duckdb"
    with closing(open_database(path)) as con:
        con.execute("INSERT INTO schema_migrations (version, name) VALUES (999, 'from the future')")
    with pytest.raises(SchemaTooNew, match="schema version 999"):
        open_database(path)


def test_a_transaction_inside_another_joins_it(tmp_path):
    from store import transaction

    with closing(open_database(tmp_path / "t.duckdb")) as con:
        with pytest.raises(RuntimeError):
            with transaction(con):
                con.execute("INSERT INTO policies (version) VALUES (0)")
                with transaction(con):
                    con.execute("INSERT INTO policies (version) VALUES (1)")
                raise RuntimeError("the outer block fails after the inner one ended")
        assert con.execute("SELECT count(*) FROM policies").fetchone()[0] == 0
