"""scripts/soak.py, briefly: a few annotators, two kill -9 restarts, and its verdict from the database, for 72 s in
the deep tier. The quick tier proves its parts apart: kill -9 during every write (test_crash.py), a hostile annotator
beside honest ones (test_hostile_input.py)."""

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO


def figure(report: str, label: str) -> str:
    found = re.search(rf"^{re.escape(label)} +(\S.*?)$", report, re.M)
    assert found, f"no {label!r} in:\n{report}"
    return found.group(1)


@pytest.mark.deep
def test_soak_restarts_the_server_twice_and_finds_every_acknowledged_vote_stored_once_beside_a_hostile_annotator(tmp_path):
    seconds = 72
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "soak.py"), "--annotators", "4", "--minutes", str(seconds / 60),
         "--restart-every", str(seconds // 2 - 3),
         "--vote-seconds", "0.5,1.5", "--hostile", "1", "--project", str(tmp_path / "soak")],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = done.stdout
    acknowledged, stored = int(figure(report, "votes acknowledged")), int(figure(report, "votes stored"))
    assert acknowledged > seconds / 2 and stored == acknowledged  # 97 of 36 s here alone; a restart loses 7 s
    assert figure(report, "acknowledged votes missing (must be 0)") == "0"
    assert figure(report, "duplicates (must be 0)") == "0"
    assert figure(report, "restarts (kill -9)") == "2"
    assert figure(report, "honest votes refused by the app (must be 0)") == "0"
    # The hostile annotator's malformed and cross-site votes were each refused, and none was stored.
    assert int(figure(report, "hostile requests refused")) >= seconds // 2  # 47 of 36 s
    assert figure(report, "hostile requests accepted (must be 0)") == "0"
    assert figure(report, "votes stored from hostile annotators (must be 0)") == "0"
    # The script's count agrees with the database it left behind.
    from store import open_database

    con = open_database(tmp_path / "soak" / "tether.duckdb")
    try:
        assert con.execute("SELECT count(DISTINCT client_token) FROM comparisons").fetchone()[0] == stored
    finally:
        con.close()
