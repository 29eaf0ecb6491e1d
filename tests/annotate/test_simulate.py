"""The simulated annotators' noise, set so that their votes side with the judge as often as asked."""

import random

import pytest

from annotate.judges import concise, prefers_first
from annotate.simulate import UnreachableAgreement, expected_agreement, noise_for_agreement, within_prompt_margins


def measured_agreement(margins: list[float], noise: float, rng: random.Random, rounds: int) -> float:
    """The share of simulated votes over these pairs, `rounds` each, that sided with the noiseless judge; a tie counts half."""
    sided = 0.0
    for _ in range(rounds):
        for margin in margins:
            sided += 0.5 if margin == 0 else float(prefers_first(margin, noise, rng) == (margin > 0))
    return sided / (rounds * len(margins))


def test_the_noise_chosen_for_an_agreement_gives_votes_that_agree_that_often_where_the_judge_tells_apart():
    rng = random.Random(0)
    # Margins of many scales, and a share of ties, as a judge gives on real answers.
    apart = [rng.gauss(0, 3) for _ in range(150)] + [rng.expovariate(1 / 30) for _ in range(30)]
    margins = apart + [0.0] * 20
    for agreement in (0.6, 0.7, 0.85):
        noise = noise_for_agreement(margins, agreement)
        assert expected_agreement(apart, noise) == pytest.approx(agreement, abs=1e-6)
        assert measured_agreement(apart, noise, rng, rounds=50) == pytest.approx(agreement, abs=0.02)
        # On all pairs, the ties' coin flips draw it towards a half.
        assert expected_agreement(margins, noise) == pytest.approx((180 * agreement + 20 * 0.5) / 200, abs=1e-6)
    assert noise_for_agreement(margins, 0.6) > noise_for_agreement(margins, 0.7) > noise_for_agreement(margins, 0.85)
    # The judge's scale sets the noise's: ten times the margins, ten times the noise.
    assert noise_for_agreement([10 * m for m in margins], 0.7) == pytest.approx(10 * noise_for_agreement(margins, 0.7), rel=1e-6)


def test_ties_do_not_cap_the_agreement_and_an_agreement_no_noise_can_give_is_refused_with_why():
    mostly_tied = [1.0, -2.0, 0.0, 0.0, 0.0, 0.0]  # counted in, the ties would hold noiseless votes to 66.7%
    assert expected_agreement([1.0, -2.0], noise_for_agreement(mostly_tied, 0.8)) == pytest.approx(0.8)
    for out_of_reach in (0.5, 1.0):
        with pytest.raises(UnreachableAgreement, match="must be above 0.5 and below 1"):
            noise_for_agreement(mostly_tied, out_of_reach)
    with pytest.raises(UnreachableAgreement, match="scores all 2 pairs the same"):
        noise_for_agreement([0.0, 0.0], 0.7)
    with pytest.raises(UnreachableAgreement, match="no two answers to the same prompt"):
        noise_for_agreement([], 0.7)


def test_the_margins_are_those_of_every_two_answers_to_the_same_prompt():
    prompts = [[{"role": "user", "content": "Name a colour."}], [{"role": "user", "content": "Name a fruit."}]]
    answers = ["Red.", "It is red.", "Blue, I think.", "Apple.", "An apple.", "Apple."]  # three to each prompt
    margins = within_prompt_margins(concise, prompts, answers)
    assert margins == pytest.approx([0.2, 0.2, 0.0, 0.1, 0.0, -0.1])  # concise: minus the words, in tens
