"""store.db on a real DuckDB file."""

from contextlib import closing

import pyarrow as pa

from store import open_database
from store.db import insert_rows


def test_insert_rows_after_a_result_read_only_in_part_on_the_same_connection(tmp_path):
    """Found by scripts/fuzz.py: on the server's one connection, a job's metrics failed to go in ("connection has an
    unfinished result") after another call had read one row of a result, as fetchone() does."""
    with closing(open_database(tmp_path / "tether.duckdb")) as con:
        con.execute("CREATE TABLE numbers (n INTEGER)")
        insert_rows(con, "numbers", [{"n": 1}, {"n": 2}], pa.schema([("n", pa.int32())]))
        assert con.execute("SELECT n FROM numbers ORDER BY n").fetchone() == (1,)  # the second row is left unread
        insert_rows(con, "numbers", [{"n": 3}], pa.schema([("n", pa.int32())]))
        assert con.execute("SELECT n FROM numbers ORDER BY n").fetchall() == [(1,), (2,), (3,)]
