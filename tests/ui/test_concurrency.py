"""Many annotators at once over HTTP against a real server, and a kill -9 in the middle."""

import random
import threading
from contextlib import closing
from datetime import datetime, timedelta

import pytest

from annotate.queue import Action, LiveQueue, QueueConfig
from store import open_database
from tests.conftest import RunningServer, add_pairs, add_users, app_client, run_tether

ANNOTATORS = 16
VOTES_EACH = 25
PASSWORD = "password-123"


class Annotator(threading.Thread):
    """Votes through the app's HTTP API as a browser would: next pair, then vote, vote, vote..."""

    def __init__(self, url: str, name: str, votes: int, start_together: threading.Barrier):
        super().__init__(daemon=True)
        self.url, self.name, self.votes, self.start_together = url, name, votes, start_together
        self.acknowledged: list[str] = []  # tokens of votes whose success reached this client
        self.unanswered: str | None = None  # the token on screen when the server went away
        self.error: Exception | None = None

    def run(self):
        try:
            # Sixteen scrypt sign-ins at once (128 MiB, about 0.55 s each) take seconds on 2 cores:
            # more than httpx's default 5 s timeout.
            client = app_client(self.url, self.name, PASSWORD, httpx_kwargs={"timeout": 60})
            self.start_together.wait(timeout=120)  # a sign-in that failed breaks the barrier for all, at once
            token = client.predict(api_name="/next_pair")[0]
            while token and len(self.acknowledged) < self.votes:
                self.unanswered = token
                choice = random.choice(["left", "right", "tie", "both_bad"])
                view = client.predict(token, None, "", api_name=f"/vote_{choice}")
                if view[5] == "":  # the message line: empty when the vote was stored
                    self.acknowledged.append(token)
                self.unanswered = None
                token = view[0]
        except Exception as e:  # noqa: BLE001 - the crash test expects the server to vanish
            self.error = e


def cast_votes(url: str, votes_each: int) -> list[Annotator]:
    barrier = threading.Barrier(ANNOTATORS)
    annotators = [Annotator(url, f"annotator{i:02d}", votes_each, barrier) for i in range(ANNOTATORS)]
    for a in annotators:
        a.start()
    return annotators


def make_project(tiny_project):
    add_pairs(tiny_project, prompts=400, overlap_share=0.3)  # room for 400 votes, whatever the draw
    add_users(tiny_project, {f"annotator{i:02d}": "annotator" for i in range(ANNOTATORS)}, PASSWORD)
    return tiny_project


@pytest.mark.deep
def test_sixteen_annotators_cast_four_hundred_votes_at_once(tiny_project):
    project = make_project(tiny_project)
    server = RunningServer(project)
    try:
        annotators = cast_votes(server.url, VOTES_EACH)
        for a in annotators:
            a.join(timeout=300)
    finally:
        server.stop()
    assert [a.error for a in annotators] == [None] * ANNOTATORS
    assert sum(len(a.acknowledged) for a in annotators) == ANNOTATORS * VOTES_EACH

    with closing(open_database(project / "tether.duckdb")) as con:
        assert con.execute("SELECT count(*) FROM comparisons").fetchone()[0] == 400
        duplicates = con.execute(
            "SELECT count(*) FROM (SELECT pair_id, annotator FROM comparisons GROUP BY ALL HAVING count(*) > 1)"
        ).fetchone()[0]
        assert duplicates == 0
        per_pair = con.execute(
            """
            SELECT p.votes_wanted, count(c.id), count(DISTINCT c.annotator)
            FROM pairs p JOIN comparisons c ON c.pair_id = p.id GROUP BY p.id, p.votes_wanted
            """
        ).fetchall()
    assert all(votes <= wanted for wanted, votes, _ in per_pair)  # overlap never exceeded
    overlapped = [(votes, distinct) for wanted, votes, distinct in per_pair if wanted == 2 and votes == 2]
    assert overlapped and all(distinct == 2 for _, distinct in overlapped)  # overlap reached, by two people
    acknowledged = {t for a in annotators for t in a.acknowledged}
    assert len(acknowledged) == 400


@pytest.mark.deep
def test_votes_survive_kill_9_and_leases_return_after_restart(tiny_project):
    project = make_project(tiny_project)
    server = RunningServer(project)
    annotators = cast_votes(server.url, votes_each=10**6)  # vote until the server dies
    deadline = datetime.now() + timedelta(seconds=120)
    while sum(len(a.acknowledged) for a in annotators) < 150 and datetime.now() < deadline:
        threading.Event().wait(0.05)
    server.crash()
    for a in annotators:
        a.join(timeout=60)
    acknowledged = {t for a in annotators for t in a.acknowledged}
    unanswered = {a.unanswered for a in annotators if a.unanswered}
    assert len(acknowledged) >= 150 and unanswered

    restarted = RunningServer(project)  # its start releases the leases the dead run left open
    restarted.stop()
    assert "released" in restarted.log.read_text()

    with closing(open_database(project / "tether.duckdb")) as con:
        stored = {row[0] for row in con.execute("SELECT client_token FROM comparisons").fetchall()}
        assert acknowledged <= stored  # every vote a client was told about survived
        lapsed = {
            row[0] for row in con.execute(
                "SELECT pair_id FROM assignments WHERE list_contains(?, token) AND closed_at IS NULL", [list(unanswered)]
            ).fetchall()
        }
        now = datetime.utcnow()
        open_leases = con.execute("SELECT count(*) FROM assignments WHERE closed_at IS NULL AND expires_at > ?", [now]).fetchone()[0]
        assert open_leases == 0
        served = set()
        queue = LiveQueue.load(con, QueueConfig(), now)
        (outcome,) = queue.act(con, [Action("serve", "newcomer")], now)
        while outcome.assignment is not None:  # every pair the newcomer can be served, each skipped for the next
            served.add(outcome.assignment.pair_id)
            (outcome,) = queue.act(con, [Action("skip", "newcomer", outcome.assignment.token)], now)
        still_wanted = {
            row[0] for row in con.execute(
                "SELECT p.id FROM pairs p WHERE list_contains(?, p.id) AND (SELECT count(*) FROM comparisons c WHERE c.pair_id = p.id) < p.votes_wanted",
                [list(lapsed)],
            ).fetchall()
        }
        assert still_wanted and still_wanted <= served  # the unanswered pairs are back in the queue


@pytest.mark.deep
def test_a_kill_9_under_full_load_at_100k_pairs_loses_no_vote_and_the_queue_rebuilds_the_same(tiny_project):
    """Annotators vote as fast as the server answers on a project of 100,000 pairs; the server is killed
    and restarted, and voting goes on. Every acknowledged vote is stored, no pair gets more votes than it
    wants, and the restarted server's queue in memory equals one rebuilt from the database."""
    add_pairs(tiny_project, prompts=100_000, overlap_share=0.3)
    add_users(tiny_project, {f"annotator{i:02d}": "annotator" for i in range(ANNOTATORS)}, PASSWORD)
    server = RunningServer(tiny_project)
    before = cast_votes(server.url, votes_each=10**6)
    while sum(len(a.acknowledged) for a in before) < 150:
        threading.Event().wait(0.05)
    server.crash()
    for a in before:
        a.join(timeout=60)

    restarted = RunningServer(tiny_project)
    try:
        after = cast_votes(restarted.url, votes_each=10)
        for a in after:
            a.join(timeout=300)
        assert [a.error for a in after] == [None] * ANNOTATORS
        check = run_tether("check-queue", "--project", str(tiny_project))  # through the running server
        assert check.returncode == 0 and "matches the database" in check.stdout, check.stderr
    finally:
        restarted.stop()

    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        stored = {row[0] for row in con.execute("SELECT client_token FROM comparisons").fetchall()}
        over_wanted = con.execute("""
            SELECT count(*) FROM pairs p JOIN (SELECT pair_id, count(*) AS votes FROM comparisons GROUP BY pair_id) c
            ON c.pair_id = p.id WHERE c.votes > p.votes_wanted
        """).fetchone()[0]
    acknowledged = {t for a in before + after for t in a.acknowledged}
    assert len(acknowledged) >= 150 + ANNOTATORS * 10
    assert acknowledged <= stored
    assert over_wanted == 0
