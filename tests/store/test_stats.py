"""store.stats on a real DuckDB file."""

from contextlib import closing
from datetime import datetime, timedelta

from store import open_database
from store.stats import votes_before_versions


def test_each_version_counts_the_peoples_votes_cast_before_it_was_made(tmp_path):
    start = datetime(2026, 1, 1)
    with closing(open_database(tmp_path / "tether.duckdb")) as con:
        for version, hours in ((0, 0), (1, 10), (2, 20)):
            con.execute("INSERT INTO policies (version, parent, adapter_path, created_at) VALUES (?, ?, ?, ?)",
                        [version, version - 1 if version else None, f"policies/v{version}" if version else None,
                         start + timedelta(hours=hours)])
        # Pair 1 is a plain pair; pairs 2 and 3 are one task to rank, 2 its lead: the ranking counts once.
        con.execute("INSERT INTO pairs (id, prompt_id, completion_a, completion_b, strategy) VALUES "
                    "(1, 1, 1, 2, 'same_policy'), (2, 1, 1, 3, 'ranking'), (3, 1, 2, 3, 'ranking')")
        con.execute("UPDATE pairs SET task = 2 WHERE id = 3")
        votes = [(1, "ann", "app", 1), (1, "bob", "simulate", 2), (1, "judge", "ai", 3),  # the AI judge's vote is no person's
                 (2, "ann", "app", 4), (3, "ann", "app", 4),  # one ranking
                 (1, "cid", "import", 15), (1, "dan", "app", 25)]  # after v1; after v2, counted by none
        for pair, annotator, source, hours in votes:
            con.execute("INSERT INTO comparisons (pair_id, annotator, choice, source, created_at) VALUES (?, ?, 'a', ?, ?)",
                        [pair, annotator, source, start + timedelta(hours=hours)])
        assert votes_before_versions(con) == {0: 0, 1: 3, 2: 4}
