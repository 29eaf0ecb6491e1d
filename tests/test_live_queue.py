"""The queue the server keeps in memory, checked against the database: the SQL queue's answers and a rebuild."""

import random
from contextlib import closing
from datetime import datetime, timedelta

import pytest

from annotate.queue import LiveQueue, QueueConfig
from store import open_database
from store.queue import QueueError
from store.queue import pairs_left as pairs_left_in_sql
from store.stats import pair_states
from tests.conftest import add_pairs

NOW = datetime(2026, 11, 21, 12, 0, 0)
LEASE = 60
ANNOTATORS = ["ann", "bob", "cat", "dan", "eve"]


@pytest.fixture
def con(tiny_project):
    add_pairs(tiny_project, prompts=40, overlap_share=0.5)
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        yield con


def stored_votes(con) -> int:
    return con.execute("SELECT count(*) FROM comparisons").fetchone()[0]


def test_random_work_leaves_the_queue_as_the_database_says(con):
    """Serves, votes (late, repeated, on others' pairs), skips and lapsed leases, in random order: after each,
    every annotator's pairs left equal the SQL queue's count, and the queue equals one rebuilt from the database."""
    rng = random.Random(7)
    random.seed(7)  # the queue's own draws (order, sides): the same run every time
    config = QueueConfig(lease_seconds=LEASE)
    queue = LiveQueue.load(con, config, NOW)
    now, screens, refusals = NOW, {}, set()
    for step in range(400):
        now += timedelta(seconds=rng.choice([1, 5, 20, LEASE + 1]))
        annotator = rng.choice(ANNOTATORS)
        action = rng.random()
        token = screens.get(annotator)
        if token and action < 0.1:  # someone else's pair, or one answered already
            token = rng.choice(list(screens.values()) + [token])
        try:
            if token is None or action > 0.85:
                assignment = queue.serve(con, annotator, now)
            elif action < 0.75:
                before = stored_votes(con)
                vote, assignment = queue.vote(con, annotator, token, rng.choice(["left", "right", "tie", "both_bad"]), None, None, now)
                assert stored_votes(con) == before + (not vote.repeated)
            else:
                assignment = queue.skip(con, annotator, token, now)
        except QueueError as e:
            refusals.add(str(e).split(";")[0])
            assignment = queue.serve(con, annotator, now)
        screens[annotator] = assignment.token if assignment else None
        for name in ANNOTATORS:
            assert queue.pairs_left(name, now) == pairs_left_in_sql(con, name, now), (step, name)
        if step % 25 == 0:
            assert queue.state(now) == LiveQueue.load(con, config, now).state(now), step
            assert queue.pair_states(con, now) == pair_states(con, now), step
    assert queue.state(now) == LiveQueue.load(con, config, now).state(now)
    assert {"this pair was not served to you", "your time on this pair ran out and others have answered it"} <= refusals
    wanted_more = con.execute("""
        SELECT count(*) FROM pairs p WHERE (SELECT count(*) FROM comparisons c WHERE c.pair_id = p.id) > p.votes_wanted
    """).fetchone()[0]
    assert wanted_more == 0


def test_votes_are_stored_against_completions_and_a_double_submit_once(con):
    queue = LiveQueue.load(con, QueueConfig(), NOW)
    assignment = queue.serve(con, "ann", NOW)
    assert queue.serve(con, "ann", NOW + timedelta(seconds=30)).token == assignment.token  # it comes back until answered
    left = con.execute("SELECT shown_left FROM assignments WHERE token = ?", [assignment.token]).fetchone()[0]
    a, b = con.execute("SELECT completion_a, completion_b FROM pairs WHERE id = ?", [assignment.pair_id]).fetchone()
    texts = dict(con.execute("SELECT id, text FROM completions WHERE id IN (?, ?)", [a, b]).fetchall())
    assert (assignment.left_text, assignment.right_text) == (texts[left], texts[b if left == a else a])
    vote, following = queue.vote(con, "ann", assignment.token, "left", "much", " fine ", NOW + timedelta(seconds=7))
    assert vote.choice == ("a" if left == a else "b") and following.pair_id != assignment.pair_id
    again, _ = queue.vote(con, "ann", assignment.token, "right", None, None, NOW + timedelta(seconds=8))
    assert (again.choice, again.repeated) == (vote.choice, True)
    assert con.execute("SELECT choice, strength, comment, elapsed_ms FROM comparisons").fetchall() == [(vote.choice, "much", "fine", 7000)]
    assert queue.votes_today("ann", NOW) == 1 and queue.votes_today("ann", NOW + timedelta(days=1)) == 0


def test_refusals_name_the_reason_and_store_nothing(con):
    queue = LiveQueue.load(con, QueueConfig(), NOW)
    mine = queue.serve(con, "ann", NOW)
    for annotator, token, reason in [("mallory", mine.token, "not served to you"), ("ann", "made-up", "not served to you")]:
        with pytest.raises(QueueError, match=reason):
            queue.vote(con, annotator, token, "left", None, None, NOW)
    following = queue.skip(con, "ann", mine.token, NOW)
    with pytest.raises(QueueError, match="you skipped this pair"):
        queue.vote(con, "ann", mine.token, "left", None, None, NOW)
    with pytest.raises(QueueError, match="answered this pair already"):
        queue.skip(con, "ann", mine.token, NOW)
    with pytest.raises(QueueError, match="the limit is 2,000"):
        queue.vote(con, "ann", following.token, "left", None, "x" * 2001, NOW)
    assert stored_votes(con) == 0
    assert queue.state(NOW) == LiveQueue.load(con, QueueConfig(), NOW).state(NOW)


def test_a_disabled_annotators_leases_go_back_at_once(con):
    con.execute("UPDATE pairs SET votes_wanted = 1")  # so that ann's lease leaves bob no room on her pair
    queue = LiveQueue.load(con, QueueConfig(), NOW)
    before = queue.pairs_left("bob", NOW)
    queue.serve(con, "ann", NOW)
    assert queue.pairs_left("bob", NOW) == before - 1
    con.execute("UPDATE assignments SET expires_at = ? WHERE annotator = 'ann'", [NOW])  # as store.users.set_disabled does
    queue.release("ann", NOW)
    assert queue.pairs_left("bob", NOW) == before == pairs_left_in_sql(con, "bob", NOW)
    assert queue.state(NOW) == LiveQueue.load(con, QueueConfig(), NOW).state(NOW)


def test_new_pairs_join_and_orderings_follow_policy_and_scores(tiny_project):
    add_pairs(tiny_project, prompts=6)
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        newest = LiveQueue.load(con, QueueConfig(strategy="newest_policy_first"), NOW)
        uncertain = LiveQueue.load(con, QueueConfig(strategy="uncertain"), NOW)
        con.execute("INSERT INTO policies (version, parent) VALUES (1, 0)")
        later = con.execute("SELECT max(id) FROM prompts").fetchone()[0]
        con.execute("""
            INSERT INTO completions (prompt_id, policy_version, text, token_count, finished, sampling)
            VALUES (?, 1, 'new a', 2, true, '{}'), (?, 1, 'new b', 2, true, '{}')
        """, [later, later])
        a, b = [row[0] for row in con.execute("SELECT id FROM completions WHERE policy_version = 1 ORDER BY id").fetchall()]
        con.execute("INSERT INTO pairs (prompt_id, completion_a, completion_b, strategy) VALUES (?, ?, ?, 'same_policy')", [later, a, b])
        assert newest.add_new_pairs(con, NOW) == 1
        assert newest.serve(con, "ann", NOW).left_text.startswith("new")
        # Pair 2's completions are closest once scored.
        for prompt, rewards in {1: (0.0, 2.0), 2: (0.5, 0.6), 3: (-1.5, 1.5)}.items():
            ids = [row[0] for row in con.execute("SELECT id FROM completions WHERE prompt_id = ? ORDER BY id", [prompt]).fetchall()]
            for completion, reward in zip(ids, rewards):
                con.execute("UPDATE completions SET reward = ? WHERE id = ?", [reward, completion])
        uncertain.reorder(con, NOW)
        assert uncertain.serve(con, "bob", NOW).pair_id == 2
        assert uncertain.serve(con, "cat", NOW).pair_id == 1
