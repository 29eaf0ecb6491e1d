"""The scheduler ([round] every_comparisons) when start_round refuses the round it says is due: it waits, longer after
each refusal, and the Loop view says why no round started."""

import threading
import time
from collections import Counter
from contextlib import closing
from pathlib import Path

from store import open_database
from store.db import utcnow
from store.users import add_user
from tests.conftest import RunningServer, add_pairs, add_users, app_client, set_settings, vote_through_queue
from ui.owner.project import load_project
from ui.owner.runner import JobQueue, RetryWait

REFUSED = "no round started: no resolved comparisons to train on yet: 0 of 3 pairs resolved by a vote it trains on; collect votes first"


def due_but_refused(project: Path) -> None:
    """A round is due (a comparison since none started), and start_round refuses it: every vote is a tie."""
    set_settings(project, "round", every_comparisons=1)
    add_pairs(project, 3)
    with closing(open_database(project / "tether.duckdb")) as con:
        add_user(con, "tester", "annotator", "not a password hash: it never signs in", "a test", utcnow())
        assert vote_through_queue(con, "tester", choose=lambda _: ("tie", None, None)) == 3


def test_a_refused_scheduled_round_is_not_tried_again_at_once_and_the_reason_is_kept(tiny_project):
    """Tried again at once, as before the wait, it read the votes 952 times in 10 s on a 2-core machine."""
    due_but_refused(tiny_project)
    project = load_project(tiny_project)
    con, lock, calls = project.connect(), threading.Lock(), Counter()

    def counted(kind: str):
        def call(fn, *args):
            calls[kind] += 1
            with lock:
                return fn(con, *args)
        return call

    queue = JobQueue(project, counted("run"), counted("read"), on_done=lambda job: None)
    queue.start()
    time.sleep(2)  # one try, then a poll for queued jobs every POLL_SECONDS
    stopping = time.monotonic()
    queue.stop()
    assert time.monotonic() - stopping < 1  # stopping ends the wait
    assert queue.scheduler_waiting == f"{REFUSED}; next try in {RetryWait.FIRST_SECONDS} s"
    assert calls["read"] <= 8 and calls["run"] <= 20, calls
    with closing(con):
        assert con.execute("SELECT count(*) FROM rounds").fetchone() == (0,)


def test_the_wait_doubles_up_to_its_cap_and_new_comparisons_end_it_after_the_first():
    wait, now, waits = RetryWait(), 0.0, []
    assert wait.over(now, lambda: 3)
    for _ in range(8):
        waits.append(wait.refused(now, 3))
        assert not wait.over(now + waits[-1] - 0.1, lambda: 3)
        now += waits[-1]
        assert wait.over(now, lambda: 3)
    assert waits == [5, 10, 20, 40, 80, 160, 300, 300]
    wait.refused(now, 3)
    assert not wait.over(now + 4, lambda: 4)  # within the first wait, new votes wait too
    assert not wait.over(now + 5, lambda: 3)
    assert wait.over(now + 5, lambda: 4)
    assert wait.refused(now + 5, 4) == 5  # the doubling starts over
    wait.reset()
    assert wait.over(now + 5, lambda: 4) and wait.refused(now + 5, 4) == 5


def test_the_loop_view_says_why_the_scheduler_started_no_round(tiny_project):
    due_but_refused(tiny_project)
    add_users(tiny_project, {"olga": "operator"})
    server = RunningServer(tiny_project)
    try:
        operator = app_client(server.url, "olga", "password-123")
        deadline = time.monotonic() + 60
        while "no round started" not in (status := operator.predict(api_name="/round_status")) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        server.stop()
    assert status == f"No round running; the scheduler starts a round every 1 new comparisons, but {REFUSED}; next try in 5 s."
