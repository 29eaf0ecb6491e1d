"""The queue the server keeps in memory, checked against the database: counts in SQL and a rebuild."""

import random
from contextlib import closing
from datetime import datetime, timedelta

import duckdb
import pytest

from annotate.queue import Action, LiveQueue, QueueConfig
from store import open_database
from store.queue import QueueError
from store.stats import pair_states
from tests.conftest import add_pairs, serve, skip, vote

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


def pairs_left_in_sql(con, annotator, now) -> int:
    """Pairs the annotator could still be served, by the definition the queue in memory must meet: live, never
    served to them (so never skipped or voted on by them), and short of votes counting the leases others hold now."""
    return con.execute(
        """
        SELECT count(*) FROM pairs p
        WHERE NOT p.retired
          AND NOT EXISTS (SELECT 1 FROM assignments s WHERE s.pair_id = p.id AND s.annotator = $annotator)
          AND NOT EXISTS (SELECT 1 FROM comparisons c WHERE c.pair_id = p.id AND c.annotator = $annotator)
          AND (SELECT count(*) FROM comparisons c WHERE c.pair_id = p.id)
              + (SELECT count(*) FROM assignments s WHERE s.pair_id = p.id AND s.closed_at IS NULL AND s.expires_at > $now)
              < p.votes_wanted
        """,
        {"annotator": annotator, "now": now},
    ).fetchone()[0]


@pytest.mark.parametrize("batch_size", [1, pytest.param(6, marks=pytest.mark.deep)])
def test_random_work_leaves_the_queue_as_the_database_says(con, batch_size):
    """Serves, votes (late, repeated, on others' pairs), skips and lapsed leases, in random order and in batches
    as the server groups them: after each batch, every annotator's pairs left equal the count in SQL, and
    the queue equals one rebuilt from the database."""
    rng = random.Random(7)
    random.seed(7)  # the queue's own draws (order, sides): the same run every time
    config = QueueConfig(lease_seconds=LEASE)
    queue = LiveQueue.load(con, config, NOW)
    now, screens, refusals, repeats = NOW, {}, set(), 0
    for step in range(400 // batch_size):
        now += timedelta(seconds=rng.choice([1, 5, 20, LEASE + 1]))
        actions = []
        for _ in range(rng.randint(1, batch_size)):
            annotator = rng.choice(ANNOTATORS)
            token, draw = screens.get(annotator), rng.random()
            if token and draw < 0.1:  # someone else's pair, or one answered already
                token = rng.choice(list(screens.values()) + [token])
            if token is None or draw > 0.85:
                actions.append(Action("serve", annotator))
            elif draw < 0.75:
                actions.append(Action("vote", annotator, token, rng.choice(["left", "right", "tie", "both_bad"])))
            else:
                actions.append(Action("skip", annotator, token))
            if rng.random() < 0.2:  # a double submit, or the same pair answered twice, within the batch
                actions.append(actions[-1] if rng.random() < 0.5 else Action("vote", annotator, token or "", "tie"))
        before = stored_votes(con)
        outcomes = queue.act(con, actions, now)
        for action, outcome in zip(actions, outcomes):
            if outcome.refused:
                refusals.add(outcome.refused.split(";")[0])
                outcome = queue.act(con, [Action("serve", action.annotator)], now)[0]  # as the server shows the next pair
            repeats += bool(outcome.vote and outcome.vote.repeated)
            screens[action.annotator] = outcome.assignment.token if outcome.assignment else None
        new_votes = sum(1 for o in outcomes if o.vote and not o.vote.repeated)
        assert stored_votes(con) == before + new_votes, step
        for name in ANNOTATORS:
            assert queue.pairs_left(name, now) == pairs_left_in_sql(con, name, now), (step, name)
        if step % 10 == 0:
            assert queue.state(now) == LiveQueue.load(con, config, now).state(now), step
            assert queue.pair_states(con, now) == pair_states(con, now), step
    assert queue.state(now) == LiveQueue.load(con, config, now).state(now)
    assert {"this pair was not served to you", "your time on this pair ran out and others have answered it",
            "you skipped this pair"} <= refusals
    assert repeats > 0
    wanted_more = con.execute("""
        SELECT count(*) FROM pairs p WHERE (SELECT count(*) FROM comparisons c WHERE c.pair_id = p.id) > p.votes_wanted
    """).fetchone()[0]
    assert wanted_more == 0


def test_a_batch_is_stored_whole_or_not_at_all(con):
    """A double submit and a vote on a skipped pair inside one batch are answered as one by one; a batch that
    cannot be stored stores nothing, and the queue goes back to what the database holds."""
    queue = LiveQueue.load(con, QueueConfig(), NOW)
    ann, bob = serve(queue, con, "ann", NOW), serve(queue, con, "bob", NOW)
    first, again, skipped, late = queue.act(con, [
        Action("vote", "ann", ann.token, "left"), Action("vote", "ann", ann.token, "right"),
        Action("skip", "bob", bob.token), Action("vote", "bob", bob.token, "left"),
    ], NOW)
    assert (again.vote.choice, again.vote.repeated, first.vote.repeated) == (first.vote.choice, True, False)
    assert again.assignment.token == first.assignment.token  # the same next pair, leased once
    assert skipped.vote is None and late.refused.startswith("you skipped this pair")
    assert stored_votes(con) == 1
    assert queue.state(NOW) == LiveQueue.load(con, QueueConfig(), NOW).state(NOW)

    ann, bob = first.assignment, skipped.assignment
    con.execute("INSERT INTO comparisons (pair_id, annotator, choice, created_at) VALUES (?, 'ann', 'tie', ?)", [ann.pair_id, NOW])
    leases = con.execute("SELECT count(*) FROM assignments").fetchone()[0]
    with pytest.raises(duckdb.ConstraintException):  # ann's vote collides with the row just put in
        queue.act(con, [Action("vote", "bob", bob.token, "left"), Action("vote", "ann", ann.token, "left")], NOW)
    assert stored_votes(con) == 2 and con.execute("SELECT count(*) FROM assignments").fetchone()[0] == leases
    assert serve(queue, con, "bob", NOW).token == bob.token  # bob's vote was not kept: his pair is still his
    assert queue.state(NOW) == LiveQueue.load(con, QueueConfig(), NOW).state(NOW)


def test_votes_are_stored_against_completions_and_a_double_submit_once(con):
    queue = LiveQueue.load(con, QueueConfig(), NOW)
    assignment = serve(queue, con, "ann", NOW)
    assert serve(queue, con, "ann", NOW + timedelta(seconds=30)).token == assignment.token  # it comes back until answered
    left = con.execute("SELECT shown_left FROM assignments WHERE token = ?", [assignment.token]).fetchone()[0]
    a, b = con.execute("SELECT completion_a, completion_b FROM pairs WHERE id = ?", [assignment.pair_id]).fetchone()
    texts = dict(con.execute("SELECT id, text FROM completions WHERE id IN (?, ?)", [a, b]).fetchall())
    assert (assignment.left_text, assignment.right_text) == (texts[left], texts[b if left == a else a])
    first, following = vote(queue, con, "ann", assignment.token, "left", "much", " fine ", NOW + timedelta(seconds=7))
    assert first.choice == ("a" if left == a else "b") and following.pair_id != assignment.pair_id
    again, _ = vote(queue, con, "ann", assignment.token, "right", None, None, NOW + timedelta(seconds=8))
    assert (again.choice, again.repeated) == (first.choice, True)
    assert con.execute("SELECT choice, strength, comment, elapsed_ms FROM comparisons").fetchall() == [(first.choice, "much", "fine", 7000)]
    assert queue.votes_today("ann", NOW) == 1 and queue.votes_today("ann", NOW + timedelta(days=1)) == 0


def test_refusals_name_the_reason_and_store_nothing(con):
    queue = LiveQueue.load(con, QueueConfig(), NOW)
    mine = serve(queue, con, "ann", NOW)
    for annotator, token, reason in [("mallory", mine.token, "not served to you"), ("ann", "made-up", "not served to you")]:
        with pytest.raises(QueueError, match=reason):
            vote(queue, con, annotator, token, "left", None, None, NOW)
    following = skip(queue, con, "ann", mine.token, NOW)
    with pytest.raises(QueueError, match="you skipped this pair"):
        vote(queue, con, "ann", mine.token, "left", None, None, NOW)
    with pytest.raises(QueueError, match="answered this pair already"):
        skip(queue, con, "ann", mine.token, NOW)
    with pytest.raises(QueueError, match="the limit is 2,000"):
        vote(queue, con, "ann", following.token, "left", None, "x" * 2001, NOW)
    assert stored_votes(con) == 0
    assert queue.state(NOW) == LiveQueue.load(con, QueueConfig(), NOW).state(NOW)


def test_a_disabled_annotators_leases_go_back_at_once(con):
    con.execute("UPDATE pairs SET votes_wanted = 1")  # so that ann's lease leaves bob no room on her pair
    queue = LiveQueue.load(con, QueueConfig(), NOW)
    before = queue.pairs_left("bob", NOW)
    serve(queue, con, "ann", NOW)
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
        assert serve(newest, con, "ann", NOW).left_text.startswith("new")
        # Pair 2's completions are closest once scored.
        for prompt, rewards in {1: (0.0, 2.0), 2: (0.5, 0.6), 3: (-1.5, 1.5)}.items():
            ids = [row[0] for row in con.execute("SELECT id FROM completions WHERE prompt_id = ? ORDER BY id", [prompt]).fetchall()]
            for completion, reward in zip(ids, rewards):
                con.execute("UPDATE completions SET reward = ? WHERE id = ?", [reward, completion])
        uncertain.reorder(con, NOW)
        assert serve(uncertain, con, "bob", NOW).pair_id == 2
        assert serve(uncertain, con, "cat", NOW).pair_id == 1


def test_active_serves_first_the_pairs_whose_reward_model_heads_disagree_most(tiny_project):
    add_pairs(tiny_project, prompts=5)
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        active = LiveQueue.load(con, QueueConfig(strategy="active"), NOW)
        # Per pair, each completion's four head scores: pair 3's heads split two against two, pair 5's
        # lean the same way with some doubt, pair 1's agree (however large its gap), pair 2 has one head.
        heads = {
            1: ([3.0, 3.5, 2.5, 3.0], [0.0, 0.0, 0.0, 0.0]),
            2: ([1.0], [0.0]),
            3: ([2.0, 2.0, -2.0, -2.0], [0.0, 0.0, 0.0, 0.0]),
            5: ([1.0, 0.2, 1.5, 0.0], [0.0, 0.0, 0.0, 0.0]),
        }
        for pair, (a, b) in heads.items():
            ca, cb = con.execute("SELECT completion_a, completion_b FROM pairs WHERE id = ?", [pair]).fetchone()
            con.execute("UPDATE completions SET reward_heads = ? WHERE id = ?", [a, ca])
            con.execute("UPDATE completions SET reward_heads = ? WHERE id = ?", [b, cb])
        active.reorder(con, NOW)
        served = [serve(active, con, name, NOW).pair_id for name in ("bob", "cat", "dan", "eve")]
        assert served[:3] == [3, 5, 1]  # the most disputed first; unscored pair 4 and single-headed 2 after
        assert served[3] in (2, 4)


def test_preference_spread_is_the_heads_disagreement_on_which_answer_wins():
    from annotate.queue import preference_spread

    assert preference_spread(None, [1.0, 2.0]) is None
    assert preference_spread([1.0], [0.0]) == 0.0  # one head cannot disagree with itself
    assert preference_spread([5.0, 5.0], [0.0, 0.0]) == pytest.approx(0.0)  # sure, and of one mind
    split = preference_spread([2.0, -2.0], [0.0, 0.0])
    assert split == pytest.approx(abs(0.8807970779778823 - 0.11920292202211755) / 2 ** 0.5, abs=1e-9)  # sample std of two
    assert preference_spread([0.5, -0.5], [0.0, 0.0]) < split


def test_a_served_pair_says_which_of_its_answers_was_cut_at_the_length_limit(tiny_project):
    add_pairs(tiny_project, prompts=1)
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        cut = con.execute("SELECT completion_a FROM pairs").fetchone()[0]
        con.execute("UPDATE completions SET finished = false WHERE id = ?", [cut])
        assignment = serve(LiveQueue.load(con, QueueConfig(), NOW), con, "ann", NOW)
        shown_cut = assignment.left_text if not assignment.left_finished else assignment.right_text
        assert (assignment.left_finished, assignment.right_finished).count(False) == 1
        assert shown_cut == con.execute("SELECT text FROM completions WHERE id = ?", [cut]).fetchone()[0]
