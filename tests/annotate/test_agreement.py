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
