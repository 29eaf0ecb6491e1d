"""The pair queue and votes, on a real database: leases, overlap, skips, idempotency, strategies."""

from contextlib import closing
from datetime import datetime, timedelta

import pytest

from annotate.queue import LiveQueue, QueueConfig
from store import open_database
from store.queue import QueueError, release_leases
from store.stats import annotator_stats, overlapped_choices, pair_states
from tests.conftest import add_pairs, serve, skip, vote, vote_through_queue

NOW = datetime(2026, 11, 21, 12, 0, 0)
LEASE = 600


@pytest.fixture
def con(tiny_project):
    add_pairs(tiny_project, prompts=4)
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        yield con


@pytest.fixture
def queue(con):
    return LiveQueue.load(con, QueueConfig(lease_seconds=LEASE), NOW)


def completion_ids(con, token):
    """(shown left, shown right, pair's a, pair's b) for an assignment."""
    return con.execute(
        """
        SELECT s.shown_left, CASE WHEN s.shown_left = p.completion_a THEN p.completion_b ELSE p.completion_a END,
               p.completion_a, p.completion_b
        FROM assignments s JOIN pairs p ON p.id = s.pair_id WHERE s.token = ?
        """,
        [token],
    ).fetchone()


def test_votes_are_stored_against_completions_not_screen_sides(con, queue):
    for k in range(4):
        now = NOW + timedelta(seconds=7 * k)  # each vote 7 s after its pair was served, with the vote's reply
        assignment = serve(queue, con, "ann", now)
        left, right, a, b = completion_ids(con, assignment.token)
        texts = dict(con.execute("SELECT id, text FROM completions").fetchall())
        assert (assignment.left_text, assignment.right_text) == (texts[left], texts[right])
        stored, _ = vote(queue, con, "ann", assignment.token, "left", "much", " fine ", now + timedelta(seconds=7))
        assert stored.choice == ("a" if left == a else "b")
    rows = con.execute("SELECT choice, strength, comment, elapsed_ms, annotator, source FROM comparisons").fetchall()
    assert len(rows) == 4 and all(r[1:] == ("much", "fine", 7000, "ann", "app") for r in rows)


def test_a_pair_is_never_served_twice_to_one_annotator(con, queue):
    seen = []
    while (assignment := serve(queue, con, "ann", NOW)) is not None:
        seen.append(assignment.pair_id)
        if len(seen) % 2:
            skip(queue, con, "ann", assignment.token, NOW)
        else:
            vote(queue, con, "ann", assignment.token, "tie", None, None, NOW)
    assert sorted(seen) == [1, 2, 3, 4]
    assert queue.pairs_left("ann", NOW) == 0
    assert serve(queue, con, "bob", NOW) is not None  # skipped pairs stay open to others


def test_the_open_assignment_comes_back_until_answered(con, queue):
    first = serve(queue, con, "ann", NOW)
    assert serve(queue, con, "ann", NOW + timedelta(seconds=30)).token == first.token
    vote(queue, con, "ann", first.token, "right", None, None, NOW + timedelta(seconds=30))
    assert serve(queue, con, "ann", NOW + timedelta(seconds=30)).pair_id != first.pair_id


def test_double_submit_stores_one_vote(con, queue):
    assignment = serve(queue, con, "ann", NOW)
    first, _ = vote(queue, con, "ann", assignment.token, "left", None, None, NOW)
    again, _ = vote(queue, con, "ann", assignment.token, "right", None, None, NOW)
    assert (again.choice, again.repeated) == (first.choice, True)
    assert con.execute("SELECT count(*) FROM comparisons").fetchone()[0] == 1


def test_votes_that_are_not_yours_or_on_retired_pairs_are_refused(con, queue):
    mine = serve(queue, con, "ann", NOW)
    with pytest.raises(QueueError, match="not served to you"):
        vote(queue, con, "mallory", mine.token, "left", None, None, NOW)
    with pytest.raises(QueueError, match="not served to you"):
        vote(queue, con, "ann", "made-up-token", "left", None, None, NOW)
    con.execute("UPDATE pairs SET retired = true WHERE id = ?", [mine.pair_id])
    queue = LiveQueue.load(con, QueueConfig(lease_seconds=LEASE), NOW)  # the queue sees a retirement when rebuilt
    with pytest.raises(QueueError, match="retired"):
        vote(queue, con, "ann", mine.token, "left", None, None, NOW)
    skipped = serve(queue, con, "ann", NOW)
    skip(queue, con, "ann", skipped.token, NOW)
    with pytest.raises(QueueError, match="skipped"):
        vote(queue, con, "ann", skipped.token, "left", None, None, NOW)
    assert con.execute("SELECT count(*) FROM comparisons").fetchone()[0] == 0


def test_bad_choices_strengths_and_comments_are_refused(con, queue):
    assignment = serve(queue, con, "ann", NOW)
    for choice, strength, comment, message in [
        ("a", None, None, "choice must be one of"),
        ("left", "huge", None, "strength must be one of"),
        ("left", None, "x" * 2001, "the limit is 2,000"),
    ]:
        with pytest.raises(QueueError, match=message):
            vote(queue, con, "ann", assignment.token, choice, strength, comment, NOW)


def test_an_unanswered_lease_returns_to_the_queue_after_its_timeout(con, queue):
    holders = ["a1", "a2", "a3", "a4"]
    held = [serve(queue, con, name, NOW) for name in holders]
    assert serve(queue, con, "a5", NOW) is None  # every pair is leased
    assert pair_states(con, NOW)["leased"] == 4
    later = NOW + timedelta(seconds=LEASE + 1)
    # A late vote still counts while nobody else has taken the pair...
    assert vote(queue, con, "a2", held[1].token, "left", None, None, later)[0].repeated is False
    # ...the other lapsed pairs go back to the queue...
    retaken = serve(queue, con, "a6", later)
    assert retaken.pair_id in {h.pair_id for h in held} - {held[1].pair_id}
    vote(queue, con, "a6", retaken.token, "left", None, None, later)
    # ...and once someone else has answered, the late vote is refused.
    i = [h.pair_id for h in held].index(retaken.pair_id)
    with pytest.raises(QueueError, match="ran out"):
        vote(queue, con, holders[i], held[i].token, "left", None, None, later)


def test_release_leases_after_a_restart_frees_every_open_lease(con, queue):
    for name in ("a1", "a2"):
        serve(queue, con, name, NOW)
    assert release_leases(con, NOW) == 2
    assert pair_states(con, NOW) == {"waiting": 4, "leased": 0, "done": 0, "retired": 0}
    assert LiveQueue.load(con, QueueConfig(), NOW).pairs_left("a3", NOW) == 4  # the server's queue, rebuilt at its start


def test_overlap_pairs_get_several_annotators(tiny_project):
    add_pairs(tiny_project, prompts=10, overlap_share=1.0)
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        assert {row[0] for row in con.execute("SELECT votes_wanted FROM pairs").fetchall()} == {2}
        for name in ("ann", "cat", "bob"):
            vote_through_queue(con, name, lambda _: ("left" if name != "cat" else "tie", None, None), NOW)
        votes = con.execute("SELECT pair_id, count(*), count(DISTINCT annotator) FROM comparisons GROUP BY pair_id").fetchall()
        assert len(votes) == 10 and all(n == 2 and distinct == 2 for _, n, distinct in votes)
        assert len(overlapped_choices(con)) == 10
        stats = {s.name: s for s in annotator_stats(con)}
        assert set(stats) == {"ann", "cat"}  # bob found every pair full
        assert (stats["ann"].votes, stats["ann"].tie_rate, stats["cat"].tie_rate) == (10, 0.0, 1.0)


def test_newest_policy_first_and_uncertain_orderings(tiny_project):
    add_pairs(tiny_project, prompts=6)
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        con.execute("INSERT INTO policies (version, parent) VALUES (1, 0)")
        con.execute("UPDATE completions SET policy_version = 1 WHERE prompt_id = 4")
        newest = LiveQueue.load(con, QueueConfig(strategy="newest_policy_first"), NOW)
        assert serve(newest, con, "ann", NOW).pair_id == 4
        # Rewards: pair 2's completions are closest.
        for prompt, rewards in {1: (0.0, 2.0), 2: (0.5, 0.6), 3: (-1.5, 1.5)}.items():
            for completion, reward in zip(con.execute("SELECT id FROM completions WHERE prompt_id = ? ORDER BY id", [prompt]).fetchall(), rewards):
                con.execute("UPDATE completions SET reward = ? WHERE id = ?", [reward, completion[0]])
        uncertain = LiveQueue.load(con, QueueConfig(strategy="uncertain"), NOW)
        assert serve(uncertain, con, "bob", NOW).pair_id == 2
        assert serve(uncertain, con, "cat", NOW).pair_id == 1


def test_queue_config_is_checked():
    with pytest.raises(ValueError, match="strategy must be one of"):
        QueueConfig(strategy="fastest")
    with pytest.raises(ValueError, match="overlap_votes"):
        QueueConfig(overlap_votes=1)
