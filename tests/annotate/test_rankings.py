"""Tasks of K answers to rank: served shuffled, a ranking stored once with its pairs, malformed rankings refused."""

from contextlib import closing
from datetime import datetime, timedelta

import pytest

from annotate.queue import Action, LiveQueue, QueueConfig
from store import open_database
from store.queue import QueueError
from store.rankings import LETTERS, parse_ranking
from store.stats import annotator_stats, pair_states
from tests.conftest import act, add_pairs, run_tether, serve

NOW = datetime(2026, 11, 21, 12, 0, 0)
K = 4


@pytest.fixture
def con(tiny_project):
    add_pairs(tiny_project, prompts=3, answers_per_task=K, overlap_share=1.0)  # two rankings wanted on each task
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        yield con


def counts(con) -> tuple[int, int]:
    return (con.execute("SELECT count(*) FROM rankings").fetchone()[0], con.execute("SELECT count(*) FROM comparisons").fetchone()[0])


def texts_by_id(con) -> dict[str, int]:
    return {text: id_ for id_, text in con.execute("SELECT id, text FROM completions").fetchall()}


def test_a_task_is_its_pairs_and_counts_once(con):
    tasks = con.execute("SELECT id, answers FROM pairs WHERE answers IS NOT NULL ORDER BY id").fetchall()
    assert len(tasks) == 3 and all(len(answers) == K for _, answers in tasks)
    for lead, answers in tasks:
        pairs = con.execute("SELECT completion_a, completion_b FROM pairs WHERE id = ? OR task = ?", [lead, lead]).fetchall()
        assert sorted(pairs) == sorted((a, b) for i, a in enumerate(answers) for b in answers[i + 1:])  # K(K-1)/2 = 6
    assert pair_states(con, NOW) == {"waiting": 3, "leased": 0, "done": 0, "retired": 0}
    queue = LiveQueue.load(con, QueueConfig(), NOW)
    assert queue.pairs_left("ann", NOW) == 3


def test_a_ranking_is_stored_once_and_expands_to_its_pairs(con):
    queue = LiveQueue.load(con, QueueConfig(), NOW)
    shown = serve(queue, con, "ann", NOW)
    assert len(shown.answers) == K
    ids = texts_by_id(con)
    by_letter = {LETTERS[i]: ids[text] for i, (text, _) in enumerate(shown.answers)}
    outcome = act(queue, con, Action("rank", "ann", shown.token, ranking="C > A = D > B"), NOW + timedelta(seconds=30))
    ranked = outcome.vote
    assert ranked.completion_ids == [by_letter["C"], *sorted([by_letter["A"], by_letter["D"]], key=ranked.completion_ids.index), by_letter["B"]]
    assert ranked.ranks == [1, 2, 2, 3] and not ranked.repeated
    row = con.execute("SELECT annotator, completion_ids, ranks, elapsed_ms, client_token FROM rankings").fetchone()
    assert row == ("ann", ranked.completion_ids, [1, 2, 2, 3], 30_000, shown.token)
    rank = dict(zip(ranked.completion_ids, ranked.ranks))
    votes = con.execute(
        "SELECT p.completion_a, p.completion_b, c.choice, c.elapsed_ms FROM comparisons c JOIN pairs p ON p.id = c.pair_id"
    ).fetchall()
    assert len(votes) == 6
    for a, b, choice, _ in votes:
        assert choice == ("a" if rank[a] < rank[b] else "b" if rank[a] > rank[b] else "tie")
    assert sorted(v[3] for v in votes if v[3] is not None) == [30_000]  # the time taken, once, on the lead
    # A double submit stores nothing new; the queue counts one vote and agrees with a rebuild.
    again = act(queue, con, Action("rank", "ann", shown.token, ranking="C > A = D > B", serve_next=False), NOW)
    assert again.vote.repeated and again.vote.completion_ids == ranked.completion_ids
    assert counts(con) == (1, 6)
    assert queue.votes_today("ann", NOW) == 1
    assert queue.state(NOW) == LiveQueue.load(con, QueueConfig(), NOW).state(NOW)
    (stats,) = annotator_stats(con)  # the Data view counts the ranking once, with the time it took
    assert (stats.name, stats.votes, stats.median_seconds) == ("ann", 1, 30.0)


def test_shown_shuffled_per_lease_and_the_same_on_reload(con):
    queue = LiveQueue.load(con, QueueConfig(), NOW)
    first = serve(queue, con, "ann", NOW)
    assert serve(queue, con, "ann", NOW).answers == first.answers  # the open lease again, in the same order
    rebuilt = LiveQueue.load(con, QueueConfig(), NOW)
    assert serve(rebuilt, con, "ann", NOW).answers == first.answers
    orders = set()  # each lease's order, as a permutation of its task's texts
    for i in range(5):  # the other five leases the three tasks with two rankings wanted allow
        texts = [t for t, _ in serve(queue, con, f"x{i}", NOW).answers]
        orders.add(tuple(sorted(texts).index(t) for t in texts))
    assert len(orders) > 1


@pytest.mark.parametrize("ranking, message", [
    ("C > A > B", "leaves out answer D"),
    ("C > A = D > B > A", "names answer A 2 times"),
    ("C > A = D > E", "names 'E', which is not one of the answers A, B, C, D"),
    ("C > AD > B", "names 'AD', which is not one of the answers"),
    ("C > > B", "names '', which is not one of the answers"),
    ("  ", "the ranking is empty: rank all 4 answers"),
])
def test_a_malformed_ranking_is_refused_and_nothing_written(con, ranking, message):
    queue = LiveQueue.load(con, QueueConfig(), NOW)
    shown = serve(queue, con, "ann", NOW)
    with pytest.raises(QueueError, match=message):
        act(queue, con, Action("rank", "ann", shown.token, ranking=ranking), NOW)
    assert counts(con) == (0, 0)
    assert serve(queue, con, "ann", NOW).token == shown.token  # the task stays leased, to rank again
    assert queue.state(NOW) == LiveQueue.load(con, QueueConfig(), NOW).state(NOW)


def test_a_vote_on_a_task_and_a_ranking_of_a_pair_are_refused(tiny_project):
    add_pairs(tiny_project, prompts=1, answers_per_task=K)
    add_pairs(tiny_project, prompts=1)
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        queue = LiveQueue.load(con, QueueConfig(), NOW)
        refusals = []
        for annotator in ("ann", "ann"):
            shown = serve(queue, con, annotator, NOW)
            wrong = Action("vote", "ann", shown.token, "left") if shown.answers else Action("rank", "ann", shown.token, ranking="A > B")
            refusals.append(queue.act(con, [wrong], NOW)[0].refused)
            act(queue, con, Action("skip", "ann", shown.token, serve_next=False), NOW)
        assert sorted(refusals) == ["this pair wants a vote, not a ranking", "this task wants a ranking of its answers, not a vote"]
        assert counts(con) == (0, 0)


def test_parse_ranking_reads_ties_and_spaces():
    assert parse_ranking("c>a=d >B", 4) == [[2], [0, 3], [1]]
    assert parse_ranking("A=B=C", 3) == [[0, 1, 2]]


def test_simulated_rankings_order_two_answers_as_a_vote_would():
    """Gumbel noise on score / T: each two answers of a ranking are in the judge's order with probability sigmoid(margin / T)."""
    import math
    import random

    from annotate.simulate import ranked_order

    rng = random.Random(0)
    scores, noise, draws = [0.0, 1.0, -0.5, 2.0], 1.5, 20_000
    above = [[0] * 4 for _ in range(4)]
    for _ in range(draws):
        order = ranked_order(scores, noise, rng)
        for i, a in enumerate(order):
            for b in order[i + 1:]:
                above[a][b] += 1
    for a in range(4):
        for b in range(4):
            if a != b:
                assert above[a][b] / draws == pytest.approx(1 / (1 + math.exp(-(scores[a] - scores[b]) / noise)), abs=0.015)
    assert ranked_order(scores, 0.0, rng) == [3, 1, 0, 2]


def test_simulated_annotators_rank_tasks_through_the_queue(tiny_project):
    import random

    from annotate.judges import concise
    from annotate.simulate import cast_votes

    add_pairs(tiny_project, prompts=3, answers_per_task=K, texts=lambda prompt, k: "word " * (k + 1))
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        votes = cast_votes(lambda fn, *args: fn(con, *args), QueueConfig(), concise, 0.0, ["sim"], 10, random.Random(0))
        assert votes.cast == 3 and votes.agreement == 1.0  # noiseless: every pair of every ranking sides with the judge
        ranked = con.execute("SELECT completion_ids, ranks, source FROM rankings").fetchall()
        texts = dict(con.execute("SELECT id, text FROM completions").fetchall())
        assert len(ranked) == 3 and con.execute("SELECT count(*) FROM comparisons").fetchone()[0] == 18
    for ids, ranks, source in ranked:
        assert [len(texts[i]) for i in ids] == sorted(len(texts[i]) for i in ids)  # the concise judge: shortest first
        assert ranks == [1, 2, 3, 4] and source == "simulate"
    status = run_tether("status", "--project", str(tiny_project), check=True).stdout
    assert "\nvotes         18\n" in status and "\nrankings      3, of 3 tasks to rank;" in status


def test_a_task_pair_is_never_gold(con):
    from store.db import StoreError, utcnow
    from store.gold import agreed_pairs, mark_gold

    queue = LiveQueue.load(con, QueueConfig(), NOW)
    for annotator in ("ann", "bob"):  # both rank every answer alike, so all six pairs of the task are unanimous
        shown = serve(queue, con, annotator, NOW)
        by_text = {text: LETTERS[i] for i, (text, _) in enumerate(shown.answers)}
        act(queue, con, Action("rank", annotator, shown.token, ranking=" > ".join(by_text[t] for t in sorted(by_text)),
                               serve_next=False), NOW)
    assert agreed_pairs(con, min_votes=1) == {}
    lead = con.execute("SELECT min(id) FROM pairs WHERE answers IS NOT NULL").fetchone()[0]
    with pytest.raises(StoreError, match=f"pair {lead} is one of a task's answers to rank"):
        mark_gold(con, {lead: "a"}, "operator", "olga", utcnow())
    assert con.execute("SELECT count(*) FROM gold").fetchone()[0] == 0


def test_one_ranking_of_four_exports_as_six_preference_pairs_and_one_ranking_row(con, tmp_path):
    from annotate.export import ExportError, export_preferences, export_rankings
    from tests.conftest import read_parquet

    queue = LiveQueue.load(con, QueueConfig(), NOW)
    shown = serve(queue, con, "ann", NOW)
    act(queue, con, Action("rank", "ann", shown.token, ranking="B > D > A > C", serve_next=False), NOW)
    result = export_preferences(con, tmp_path / "prefs.parquet", "parquet")
    assert (result.rows, result.pairs) == (6, 6)
    assert export_rankings(con, tmp_path / "rankings.parquet", "parquet") == 1
    (ranking,) = read_parquet(tmp_path / "rankings.parquet")
    best_first = [answer[0]["content"] for answer in ranking["answers"]]
    assert best_first == [shown.answers["ABCD".index(letter)][0] for letter in "BDAC"]
    assert ranking["ranks"] == [1, 2, 3, 4] and ranking["pairs"] == 6 and ranking["annotator"] == "ann"
    place = {text: i for i, text in enumerate(best_first)}
    for row in read_parquet(tmp_path / "prefs.parquet"):  # each pair's chosen answer is the one ranked higher
        assert place[row["chosen"][0]["content"]] < place[row["rejected"][0]["content"]]
    with pytest.raises(ExportError, match="already exists"):
        export_rankings(con, tmp_path / "rankings.parquet", "parquet")
