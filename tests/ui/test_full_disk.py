"""A full disk under a running server: a vote that cannot be made durable is never acknowledged,
and the server serves again, with no restart, once space returns.

The project lives on a small tmpfs mounted for the test, which needs root (CI runs as root).
"""

import os
from contextlib import closing

import pytest
from gradio_client import Client

from store import open_database
from tests.conftest import RunningServer, add_pairs, add_users, tmpfs
from ui.owner.project import init_project

PASSWORD = "password-123"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a size-limited filesystem needs root")


@pytest.fixture
def small_disk(tmp_path):
    with tmpfs(tmp_path / "disk", "size=64m") as mount_point:
        yield mount_point


def fill(path) -> None:
    """Write to `path` until the filesystem has no space left, down to the last byte."""
    with open(path, "wb", buffering=0) as f:
        for chunk in (2**16, 2**12, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError as e:
                assert e.errno == 28, e  # ENOSPC


def test_a_vote_on_a_full_disk_is_refused_and_not_counted_and_voting_resumes_when_space_returns(small_disk, tiny_model_dir, tmp_path):
    project = small_disk / "project"
    init_project(project, str(tiny_model_dir))
    add_pairs(project, prompts=10)
    add_users(project, {"ann": "annotator"}, PASSWORD)
    server = RunningServer(project, log_dir=tmp_path)  # the log on another disk, as a service manager keeps it
    try:
        annotator = Client(server.url, auth=("ann", PASSWORD), verbose=False)
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
