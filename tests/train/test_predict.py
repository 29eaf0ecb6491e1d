"""The round's predictor: a candidate's win rate over the start by the reward model, its interval, and the choice."""

import pytest
import torch

from train.policy.generate import Generated
from train.policy.choice import Prediction, choose
from train.policy.predict import bootstrap_interval, predict, win_rate


def test_the_win_rate_is_each_prompts_share_of_won_answer_pairs_ties_half_averaged_over_prompts():
    candidate = torch.tensor([[2.0, 0.0], [1.0, 1.0]], dtype=torch.float64)  # (prompts, answers)
    start = torch.tensor([[1.0, 1.0, 1.0], [1.0, 3.0, 0.0]], dtype=torch.float64)
    # Prompt 1: 2.0 beats all three, 0.0 none: 3 / 6. Prompt 2: each 1.0 ties one, loses one, beats one: 3 / 6.
    assert win_rate(candidate, start).item() == pytest.approx(0.5)
    assert win_rate(start, candidate).item() == pytest.approx(0.5)
    better = candidate + 10
    assert win_rate(better, start).item() == 1.0 and win_rate(start, better).item() == 0.0


def test_the_interval_holds_the_win_rate_narrows_with_more_answers_and_is_the_same_for_the_same_seed():
    torch.manual_seed(0)
    few_candidate, few_start = torch.randn(4, 3, 1, dtype=torch.float64) + 0.5, torch.randn(4, 3, 1, dtype=torch.float64)
    many_candidate, many_start = torch.randn(32, 8, 1, dtype=torch.float64) + 0.5, torch.randn(32, 8, 1, dtype=torch.float64)
    few = bootstrap_interval(few_candidate, few_start, 0.8, 2000, torch.Generator().manual_seed(1))
    many = bootstrap_interval(many_candidate, many_start, 0.8, 2000, torch.Generator().manual_seed(1))
    assert few[0] < win_rate(few_candidate[..., 0], few_start[..., 0]).item() < few[1]
    assert many[0] < win_rate(many_candidate[..., 0], many_start[..., 0]).item() < many[1]
    assert many[1] - many[0] < 0.5 * (few[1] - few[0])
    assert many[0] > 0.5  # half a standard deviation better, on 32 prompts of 8 answers: clear of a coin
    assert bootstrap_interval(few_candidate, few_start, 0.8, 2000, torch.Generator().manual_seed(1)) == few


def test_the_interval_counts_the_prompts_not_only_the_answers():
    """Answers to one prompt are alike: a candidate better on half the prompts and worse on the rest is no better."""
    start = torch.zeros(6, 8, 1, dtype=torch.float64)
    candidate = torch.tensor([[[1.0]] * 8] * 4 + [[[-1.0]] * 8] * 2, dtype=torch.float64)  # wins every pair on 4 of 6 prompts
    low, high = bootstrap_interval(candidate, start, 0.8, 4000, torch.Generator().manual_seed(0))
    assert win_rate(candidate[..., 0], start[..., 0]).item() == pytest.approx(4 / 6)
    assert low < 0.5 < high  # six prompts cannot tell 4 in 6 from a coin


def test_the_interval_counts_the_reward_models_doubt_and_the_estimate_is_the_heads_mean_win_rate():
    """Two heads that disagree on the candidate: the win rate is the mean of each head's, and the interval spans both."""
    torch.manual_seed(0)
    start = torch.randn(16, 8, 1, dtype=torch.float64).expand(-1, -1, 2)
    candidate = torch.randn(16, 8, 1, dtype=torch.float64) + torch.tensor([1.0, -0.6], dtype=torch.float64)  # head 0 likes it
    answers = [Generated(i // 8, "a", 5, i % 2 == 0) for i in range(128)]
    prediction = predict(candidate, start, answers, 2.0, 0.8, 2000, 0)
    each = [win_rate(candidate[..., k], start[..., k]).item() for k in range(2)]
    assert each[0] > 0.6 > 0.45 > each[1] and prediction.win_rate == pytest.approx(sum(each) / 2)
    assert prediction.low < prediction.win_rate < prediction.high
    sure = predict(candidate[..., :1], start[..., :1], answers, 2.0, 0.8, 2000, 0)  # head 0 alone
    assert prediction.low < 0.5 < sure.low and prediction.high >= sure.high - 0.02
    assert (prediction.prompts, prediction.answers, prediction.ended, prediction.kl_to_v0) == (16, 128, 0.5, 2.0)


def prediction(win_rate: float, low: float, high: float, kl: float = 1.0) -> Prediction:
    return Prediction(win_rate, low, high, kl, 0.5, 0.0, 8, 32)


def test_the_choice_is_the_best_rated_of_the_candidates_confidently_better_than_the_start_and_within_the_budget():
    candidates = [prediction(0.62, 0.54, 0.70), prediction(0.70, 0.48, 0.88), prediction(0.66, 0.58, 0.74),
                  prediction(0.90, 0.85, 0.95, kl=25.0)]
    chosen, verdicts = choose(candidates, kl_budget=20.0)
    assert chosen == 2
    assert verdicts[0] == "rated below another: 62% [54%, 70%] over the start"
    assert verdicts[1] == "not predicted better than the start with confidence: 70% [48%, 88%] over the start"
    assert verdicts[2] == "registered, rated best: 66% [58%, 74%] over the start"
    assert verdicts[3] == "over the KL budget: 25.0 nats from v0, the round's allowance 20 ([round] kl_budget, kl_per_vote)"
    assert choose(candidates, kl_budget=0.0)[0] == 3  # no budget
    assert choose(candidates, kl_budget=20.0, register="best")[0] == 1  # the best rated, however sure


def test_no_candidate_is_chosen_when_none_is_confidently_better():
    chosen, verdicts = choose([prediction(0.55, 0.45, 0.65), prediction(0.40, 0.30, 0.50)], kl_budget=20.0)
    assert chosen is None and all(v.startswith("not predicted better") for v in verdicts)
    assert choose([prediction(0.55, 0.45, 0.65, kl=30.0)], kl_budget=20.0, register="best")[0] is None


def test_with_register_average_the_average_is_chosen_whatever_is_predicted_unless_over_the_budget():
    chosen, verdicts = choose([prediction(0.48, 0.40, 0.56, kl=4.0)], kl_budget=20.0, register="average")
    assert chosen == 0 and verdicts == ["registered, the average: 48% [40%, 56%] over the start"]
    chosen, verdicts = choose([prediction(0.48, 0.40, 0.56, kl=21.0)], kl_budget=20.0, register="average")
    assert chosen is None and verdicts == ["over the KL budget: 21.0 nats from v0, the round's allowance 20 ([round] kl_budget, kl_per_vote)"]
