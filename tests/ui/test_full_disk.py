"""A full disk under a running server: a vote that cannot be made durable is never acknowledged,
and the server serves again, with no restart, once space returns.

The project lives on a small tmpfs mounted for the test, which needs root (CI runs as root).
"""

import os
import re
import subprocess
import sys
from contextlib import closing

import pytest

from store import open_database
from tests.conftest import REPO, RunningServer, add_pairs, add_users, app_client, fill, tmpfs
from ui.owner.project import init_project

PASSWORD = "password-123"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a size-limited filesystem needs root")


@pytest.fixture
def small_disk(tmp_path):
    with tmpfs(tmp_path / "disk", "size=64m") as mount_point:
        yield mount_point


def test_a_vote_on_a_full_disk_is_refused_and_not_counted_and_voting_resumes_when_space_returns(small_disk, tiny_model_dir, tmp_path):
    project = small_disk / "project"
    init_project(project, str(tiny_model_dir))
    add_pairs(project, prompts=10)
    add_users(project, {"ann": "annotator"}, PASSWORD)
    server = RunningServer(project, log_dir=tmp_path)  # the log on another disk, as a service manager keeps it
    try:
        annotator = app_client(server.url, "ann", PASSWORD)
        first = annotator.predict(api_name="/next_pair")[0]
        second = annotator.predict(first, None, "", api_name="/vote_left")[0]

        fill(small_disk / "ballast")
        # A vote or two may still fit in space the database's log file holds already; the next ones cannot.
        acknowledged, token = [first], second
        for _ in range(5):
            view = annotator.predict(token, None, "", api_name="/vote_right")
            if view[5]:  # the refusal the test waits for, in the message line
                refused = view[5]
                break
            acknowledged.append(token)
            token = view[0]
        else:
            pytest.fail("five votes on a full disk were all acknowledged")
        assert "could not save this, so nothing of it was recorded (error " in refused
        (small_disk / "ballast").unlink()

        # The same server, not restarted: the vote sent again is stored, and voting goes on.
        following = annotator.predict(token, None, "", api_name="/vote_right")[0]
        acknowledged.append(token)
        view = annotator.predict(following, None, "", api_name="/vote_tie")
        assert view[5] == "" and view[0]
        acknowledged.append(following)
        assert server.process.poll() is None
    finally:
        server.stop()
    error_id = refused.split("(error ")[1].split(")")[0]
    details = server.log.read_text().split(f"error {error_id} in vote")[1]
    assert "No space left on device" in details.split("\nerror ")[0]  # the details went to the log under that id
    with closing(open_database(project / "tether.duckdb")) as con:
        stored = [token for (token,) in con.execute("SELECT client_token FROM comparisons ORDER BY id").fetchall()]
    assert stored == acknowledged  # the refused attempt stored nothing; its retry stored the vote once


@pytest.mark.parametrize("ops", [pytest.param(["settings"], id="quick"),
                                 pytest.param(["export", "restore", "reward-model", "rollback", "init", "settings"], id="every",
                                              marks=pytest.mark.deep)])
def test_each_write_on_a_full_disk_is_refused_in_one_line_naming_it_and_writes_nothing(tmp_path, ops):
    """scripts/crash.py --full-disk, on the operations whose refusals were tracebacks or left a file behind (a restore's
    copy, a job's row, an export's file, the settings file, an init's database) or in a long list of every file's error (a
    rollback's copy): on a disk filled to its last byte each writes something, so each must be refused, in one short
    line that names the full disk, and leave nothing behind. One that ended whole would say the disk was not full.
    The quick tier takes one of them: the settings file, rewritten in place."""
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "crash.py"), "--full-disk", "--size", "200", "--ops", ",".join(ops),
                           "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # Each line: the operation, what it left (whole or none), the project's check after it (whole), and what it said.
    table = {op: (outcome, said) for op, outcome, said in re.findall(r"^([a-z-]+) +(none|whole) +whole  (.*)$", done.stdout, re.M)}
    assert sorted(table) == sorted(ops), done.stdout
    for op, (outcome, said) in table.items():
        assert outcome == "none" and said.startswith("Error: ") and "No space left on device" in said, (op, outcome, said)
