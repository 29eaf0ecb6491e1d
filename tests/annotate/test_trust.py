"""Gold pairs in the queue, each annotator's reliability, and votes weighted by it."""

import json
import random
from contextlib import closing
from datetime import datetime

import pytest

from annotate.export import preference_rows
from annotate.queue import LiveQueue, QueueConfig
from annotate.simulate import cast_votes
from annotate.trust import estimate_reliability, project_reliability, weighted_label
from store import StoreError, open_database
from store.db import BadInput
from store.gold import agreed_pairs, gold_answers, import_gold_file, mark_gold
from store.stats import pair_states
from tests.conftest import add_pairs, run_tether, serve, vote

NOW = datetime(2026, 11, 26, 12, 0, 0)


def gold_file(path, rows: int, start: int = 0):
    with path.open("w") as f:
        for i in range(start, start + rows):
            f.write(json.dumps({"prompt": f"gold question {i}", "chosen": f"right answer {i}", "rejected": f"wrong answer {i}"}) + "\n")
    return path


@pytest.fixture
def con(tiny_project):
    add_pairs(tiny_project, prompts=12)
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        yield con


def test_each_annotator_gets_every_gold_pair_once_at_the_gold_share_beside_the_pairs_that_want_votes(con, tmp_path):
    assert import_gold_file(con, gold_file(tmp_path / "gold.jsonl", 4), "op", NOW).added == 4
    gold = gold_answers(con)
    states = pair_states(con, NOW)
    assert states["waiting"] == 12  # the gold pairs want no votes of their own
    random.seed(3)
    queue = LiveQueue.load(con, QueueConfig(gold_share=1.0), NOW)
    left = queue.pairs_left("ann", NOW)
    assert left == 12  # gold is not counted as work left
    served = []
    for annotator in ("ann", "bob"):
        assignment = serve(queue, con, annotator, NOW)
        for _ in range(6):
            served.append((annotator, assignment.pair_id))
            # ann picks the wrong answer on every gold pair, bob the right one: the answer is always completion a
            right = "left" if assignment.left_text.startswith("right") else "right"
            wrong = "right" if right == "left" else "left"
            _, assignment = vote(queue, con, annotator, assignment.token, wrong if annotator == "ann" else right, None, None, NOW)
    # Left: 12 less the 4 pairs voted on and the 2 leased now, each annotator's next; gold counts for nothing.
    for annotator in ("ann", "bob"):
        theirs = [pair for who, pair in served if who == annotator]
        assert set(theirs[:4]) == set(gold) and len(set(theirs)) == 6  # all four gold first (share 1), each once, then work
    assert queue.pairs_left("ann", NOW) == 12 - 4 - 2 and queue.state(NOW) == LiveQueue.load(con, QueueConfig(gold_share=1.0), NOW).state(NOW)
    assert pair_states(con, NOW)["done"] == 4 + 4  # the gold pairs, and the four ordinary pairs voted on

    reliability = project_reliability(con)
    assert (reliability["ann"].gold_answered, reliability["ann"].gold_correct) == (4, 0)
    assert (reliability["bob"].gold_answered, reliability["bob"].gold_correct) == (4, 4)
    assert reliability["ann"].reliability < 0.5 < 0.7 < reliability["bob"].reliability


def test_no_gold_is_served_at_a_share_of_0(con, tmp_path):
    import_gold_file(con, gold_file(tmp_path / "gold.jsonl", 4), "op", NOW)
    queue = LiveQueue.load(con, QueueConfig(gold_share=0.0), NOW)
    assignment = serve(queue, con, "ann", NOW)
    for _ in range(12):
        assert assignment.pair_id not in gold_answers(con)
        _, assignment = vote(queue, con, "ann", assignment.token, "left", None, None, NOW)
    assert assignment is None


def test_a_gold_file_row_without_an_answer_is_refused_and_nothing_is_written(con, tmp_path):
    path = gold_file(tmp_path / "gold.jsonl", 3)
    with path.open("a") as f:
        f.write(json.dumps({"prompt": "no answer here", "rejected": "wrong"}) + "\n")
    pairs = con.execute("SELECT count(*) FROM pairs").fetchone()[0]
    with pytest.raises(BadInput, match=r"gold.jsonl: line 4, field 'chosen': is missing"):
        import_gold_file(con, path, "op", NOW)
    assert con.execute("SELECT count(*) FROM pairs").fetchone()[0] == pairs and gold_answers(con) == {}
    with pytest.raises(StoreError, match="gold pair 1 has no answer"):
        mark_gold(con, {1: None}, "operator", "op", NOW)
    with pytest.raises(StoreError, match="no pair 999"):
        mark_gold(con, {1: "a", 999: "b"}, "operator", "op", NOW)
    assert gold_answers(con) == {}


def test_pairs_everyone_agreed_on_become_gold_and_leave_the_ordinary_queue(tiny_project):
    add_pairs(tiny_project, prompts=6, overlap_share=1.0)  # every pair wants two votes
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        queue = LiveQueue.load(con, QueueConfig(), NOW)
        for annotator, choice in (("ann", "left"), ("bob", "left")):
            assignment = serve(queue, con, annotator, NOW)
            for _ in range(3):  # three pairs each, the same three: one vote each on the first three pairs
                _, assignment = vote(queue, con, annotator, assignment.token, choice, None, None, NOW)
        votes = con.execute("SELECT pair_id, list(choice) FROM comparisons GROUP BY pair_id").fetchall()
        unanimous = {pair: choices[0] for pair, choices in votes if len(choices) == 2 and len(set(choices)) == 1}
        assert agreed_pairs(con, 2) == unanimous and agreed_pairs(con, 3) == {}
        assert mark_gold(con, agreed_pairs(con, 2), "agreed", "op", NOW) == len(unanimous)
        assert gold_answers(con) == unanimous and agreed_pairs(con, 2) == {}  # marked once
        wanting = {pair for pair, in con.execute(
            "SELECT id FROM pairs p WHERE votes_wanted > (SELECT count(*) FROM comparisons c WHERE c.pair_id = p.id)").fetchall()}
        assert not wanting & set(unanimous)


def simulated_votes(careful: float, pairs: int, gold: int, seed: int = 0):
    """(pair, annotator, choice) of three annotators siding with the truth `careful` of the time and one flipping a
    coin, two of them on each pair, with `gold` of the pairs gold; the truth is always 'a'."""
    rng = random.Random(seed)
    votes = []
    for pair in range(pairs):
        for annotator in rng.sample(["ann", "bob", "cid", "dee"], 2):
            right = rng.random() < (0.5 if annotator == "dee" else careful)
            votes.append((pair, annotator, "a" if right else "b"))
    return votes, dict.fromkeys(range(gold), "a")


def test_a_coin_flipper_is_found_from_gold_answers_and_from_agreement_alone():
    votes, gold = simulated_votes(careful=0.8, pairs=300, gold=60)
    for known in (gold, {}):  # with gold pairs, and from agreement with others only
        reliability = estimate_reliability(votes, known)
        assert reliability["dee"].reliability < 0.6, known and "with gold"
        assert all(0.7 < reliability[a].reliability < 0.9 for a in ("ann", "bob", "cid"))
    # Few votes say little: the estimate stays near the prior rather than condemn anyone.
    few = estimate_reliability(votes[:6], {})
    assert all(0.6 < r.reliability < 0.8 for r in few.values())


def test_a_trusted_vote_outweighs_a_coin_flip_and_the_label_carries_its_confidence():
    reliability = {"ann": 0.9, "dee": 0.5}
    assert weighted_label([("ann", "a"), ("dee", "b")], reliability) == ("a", pytest.approx(0.9))
    assert weighted_label([("dee", "b")], reliability) is None  # a coin flip alone says nothing
    assert weighted_label([("ann", "tie")], reliability) is None
    label, confidence = weighted_label([("ann", "b"), ("ann2", "b")], reliability)  # ann2 unmeasured: the prior, 0.7
    assert label == "b" and confidence == pytest.approx(0.9 * 0.7 / (0.9 * 0.7 + 0.1 * 0.3))


def test_weighting_by_trust_drops_a_coin_flippers_lone_votes_and_keeps_the_gold_answer(tiny_project, tmp_path):
    add_pairs(tiny_project, prompts=80, overlap_share=0.5)
    judge = "tests.annotate.test_trust:first_digit_judge"
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        import_gold_file(con, gold_file(tmp_path / "gold.jsonl", 20), "op", NOW)
        random.seed(1)  # the queue's draws: pairs and sides, apart from the annotators' own

        def run(fn, *args):
            return fn(con, *args)

        from annotate.judges import load_judge

        cast_votes(run, QueueConfig(gold_share=0.3, overlap_share=0.5), load_judge(judge), 0.0, ["ann", "bob", "cid", "dee"], 400,
                   random.Random(0), coin_flippers=frozenset({"dee"}))
        reliability = project_reliability(con)
        flag_below = QueueConfig().flag_reliability_below
        assert reliability["dee"].reliability < flag_below < min(reliability[a].reliability for a in ("ann", "bob", "cid"))
        plain, weighted = preference_rows(con, False, False), preference_rows(con, False, True)
        assert {row.confidence for row in plain} == {1.0}
        dee_alone = {pair for pair, in con.execute(
            "SELECT pair_id FROM comparisons GROUP BY pair_id HAVING list(annotator) = ['dee']").fetchall()}
        gold = gold_answers(con)
        assert dee_alone and dee_alone <= {row.pair_id for row in plain}
        # The coin-flipper's lone votes stay, each as sure as dee is reliable: they pull with 2r - 1, near nothing.
        assert all(row.confidence == pytest.approx(reliability["dee"].reliability) for row in weighted if row.pair_id in dee_alone)
        assert all(0.5 < row.confidence < 1 for row in weighted if row.pair_id not in gold)
        # Where anyone careful voted, every label by trust sides with the noiseless judge, and where dee disagreed with
        # them it is kept: the plain majority has no winner there and drops the pair.
        careful = [row for row in weighted if row.pair_id not in gold and row.pair_id not in dee_alone]
        assert careful and all(row.chosen.startswith("answer 1") for row in careful)
        assert len(careful) > len([row for row in plain if row.pair_id not in gold and row.pair_id not in dee_alone])
        gold_rows = [row for row in weighted if row.pair_id in gold]
        assert gold_rows and all(row.chosen.startswith("right") and row.confidence == 1.0 for row in gold_rows)


def first_digit_judge(prompt: str, completion: str) -> float:
    """add_pairs' answers are 'answer K to question N', K 0 or 1: answer 1 is better; gold's right answers are better still."""
    return 2.0 if completion.startswith("right") else 1.0 if completion.startswith("answer 1") else 0.0


def test_gold_commands_refuse_a_bad_file_and_report_reliability(tiny_project, tmp_path):
    bad = gold_file(tmp_path / "gold.jsonl", 2)
    with bad.open("a") as f:
        f.write(json.dumps({"prompt": "p", "chosen": "same", "rejected": "same"}) + "\n")
    refused = run_tether("gold", "import", str(bad), "--project", str(tiny_project))
    assert refused.returncode == 1 and "gold.jsonl: line 3, field 'rejected'" in refused.stderr
    status = run_tether("gold", "status", "--project", str(tiny_project), check=True)
    assert status.stdout.startswith("0 gold pairs")
