import pytest

from annotate.agreement import agreement_share, fleiss_kappa, majority, percent_agreement

# Fleiss (1971) as worked on Wikipedia's "Fleiss' kappa" page: 10 subjects, 14 raters each,
# 5 categories; each row counts the raters who chose each category.
WIKIPEDIA_COUNTS = [
    [0, 0, 0, 0, 14],
    [0, 2, 6, 4, 2],
    [0, 0, 3, 5, 6],
    [0, 3, 9, 2, 0],
    [2, 2, 8, 1, 1],
    [7, 7, 0, 0, 0],
    [3, 2, 6, 3, 0],
    [2, 5, 3, 2, 2],
    [6, 5, 2, 1, 0],
    [0, 2, 2, 3, 7],
]


def ratings(counts: list[int]) -> list[str]:
    return [f"category {j}" for j, n in enumerate(counts) for _ in range(n)]


@pytest.mark.parametrize("choices, expected", [
    (["a"], "a"),
    (["a", "b", "a"], "a"),
    (["tie", "tie", "b"], "tie"),
    (["a", "b"], None),
    (["a", "b", "tie", "both_bad"], None),
    (["a", "a", "b", "b", "tie"], None),
    ([], None),
])
def test_majority_needs_strictly_the_most_votes(choices, expected):
    assert majority(choices) == expected


def test_agreement_share_is_the_winners_votes_over_all_and_zero_without_a_winner():
    assert agreement_share(["b"]) == 1.0
    assert agreement_share(["a", "a", "b"]) == pytest.approx(2 / 3)
    assert agreement_share(["a", "a", "b", "tie"]) == 0.5
    assert agreement_share(["a", "b"]) == 0.0
    assert agreement_share([]) == 0.0


def test_fleiss_kappa_matches_the_classic_worked_example():
    items = [ratings(row) for row in WIKIPEDIA_COUNTS]
    assert percent_agreement(items) == pytest.approx(0.378, abs=5e-4)  # P_bar
    assert fleiss_kappa(items) == pytest.approx(0.210, abs=5e-4)


def test_perfect_agreement_is_one():
    items = [["a", "a", "a"], ["b", "b"], ["tie", "tie"]]
    assert fleiss_kappa(items) == 1.0
    assert percent_agreement(items) == 1.0


def test_varying_raters_per_item_by_hand():
    items = [["a", "a", "b"], ["a", "b"], ["tie", "tie"]]
    # P_i = 2/6, 0/2, 2/2 so P_bar = 4/9; p = (3, 2, 2)/7 so P_e = 17/49.
    assert percent_agreement(items) == pytest.approx(4 / 9)
    assert fleiss_kappa(items) == pytest.approx((4 / 9 - 17 / 49) / (1 - 17 / 49))


def test_systematic_disagreement_is_below_zero():
    # P_bar = 0; p = (2, 2, 1, 1)/6 so P_e = 10/36 and kappa = -(10/36) / (26/36).
    assert fleiss_kappa([["a", "b"], ["a", "b"], ["tie", "both_bad"]]) == pytest.approx(-10 / 26)
    assert percent_agreement([["a", "b"], ["b", "a"]]) == 0.0


def test_items_with_one_rating_are_left_out_and_undefined_cases_are_none():
    assert fleiss_kappa([["a"], ["a", "a"], ["b", "b"]]) == fleiss_kappa([["a", "a"], ["b", "b"]]) == 1.0
    assert fleiss_kappa([]) is None
    assert fleiss_kappa([["a"], ["b"]]) is None
    assert percent_agreement([["a"]]) is None
    # Everyone always picks the same choice: chance explains all of it, kappa is undefined.
    assert fleiss_kappa([["a", "a"], ["a", "a", "a"]]) is None
    assert percent_agreement([["a", "a"], ["a", "a", "a"]]) == 1.0


def test_the_flip_rate_inverts_agreement_and_leans_on_its_prior_until_pairs_are_voted_on_twice():
    from annotate.agreement import FLIP_PRIOR_PAIRS, flip_rate, majority_confidence

    assumed = flip_rate([["a"], ["tie", "a"], ["b", "both_bad"]])  # no pair with two votes for a side
    assert assumed.pairs == 0 and assumed.rate == pytest.approx(0.3, abs=1e-6) and "assumed" in str(assumed)
    unanimous = flip_rate([["a", "a"]] * 1000)
    assert unanimous.agreement == 1.0 and unanimous.rate < 0.01
    split = flip_rate([["a", "b"]] * 1000)
    assert split.agreement == 0.0 and split.rate == 0.45  # capped: coin flips would teach nothing
    few = flip_rate([["a", "a"]] * 2)  # two unanimous pairs against the prior's FLIP_PRIOR_PAIRS
    assert FLIP_PRIOR_PAIRS > 2 and unanimous.rate < few.rate < assumed.rate
    # The least rate the pairs allow lies below the estimate, and rises towards it as overlapped pairs add evidence.
    evidence = [flip_rate([["a", "a"]] * round(n * 0.58) + [["a", "b"]] * (n - round(n * 0.58))) for n in (0, 10, 100, 1000)]
    assert all(f.low < f.rate for f in evidence) and assumed.low < 0.1
    gaps = [f.rate - f.low for f in evidence]
    assert gaps == sorted(gaps, reverse=True) and gaps[-1] < 0.05
    assert split.low == 0.45  # even the bound allows no less than the cap when every pair splits
    assert majority_confidence(1, 0, 0.3) == pytest.approx(0.7) and majority_confidence(2, 0, 0.3) == pytest.approx(0.49 / 0.58)
    assert majority_confidence(2, 1, 0.3) == pytest.approx(0.7) and majority_confidence(3, 0, 0.0) == 1.0


@pytest.mark.parametrize("agreement", [0.6, 0.7, 0.8])
def test_the_flip_rate_of_simulated_annotators_is_measured_within_005_of_the_truth(tmp_path, agreement):
    """Two annotators vote on each of 3,000 pairs with simulate's noise, siding with a judge `agreement` of the time;
    the flip rate the Data view and `tether status` show comes within 0.05 of 1 - the share of votes that did."""
    import random
    from contextlib import closing

    from annotate.agreement import project_flip_rate
    from annotate.judges import concise, prefers_first
    from annotate.pairs import add_completions_with_pairs
    from annotate.queue import QueueConfig
    from annotate.simulate import noise_for_agreement
    from store import open_database
    from store.completions import NewCompletion
    from store.db import utcnow
    from store.prompt_files import NewPrompt
    from store.prompts import add_prompts
    from store.votes import insert_votes, vote_row

    rng, prompts = random.Random(agreement), 3000
    words = [[max(1, round(rng.gauss(40, 12))) for _ in range(2)] for _ in range(prompts)]  # two answers' lengths a prompt
    with closing(open_database(tmp_path / "tether.duckdb")) as con:
        add_prompts(con, [NewPrompt([{"role": "user", "content": f"question {i}"}], "test") for i in range(prompts)])
        ids = [row[0] for row in con.execute("SELECT id FROM prompts ORDER BY id").fetchall()]
        add_completions_with_pairs(con, [NewCompletion(p, 0, "word " * n, n, True, {}) for p, ns in zip(ids, words) for n in ns],
                                   QueueConfig(overlap_share=1.0))
        pairs = con.execute("SELECT p.id, a.text, b.text FROM pairs p JOIN completions a ON a.id = p.completion_a "
                            "JOIN completions b ON b.id = p.completion_b").fetchall()
        margins = {pair: concise("", a) - concise("", b) for pair, a, b in pairs}
        noise = noise_for_agreement(list(margins.values()), agreement)
        votes = [(pair, annotator, "a" if prefers_first(margin, noise, rng) else "b") for pair, margin in margins.items()
                 for annotator in ("ann", "bea")]
        insert_votes(con, [vote_row(pair, annotator, choice, None, None, None, None, "simulate", utcnow()) for pair, annotator, choice in votes])
        measured = project_flip_rate(con)
    sided = sum((choice == "a") == (margins[pair] > 0) if margins[pair] else 0.5 for pair, _, choice in votes) / len(votes)
    assert measured.pairs == len(pairs) > 2500 and abs(sided - agreement) < 0.02
    assert abs(measured.rate - (1 - sided)) < 0.05, (measured, sided)
