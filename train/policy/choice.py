"""A round's choice among its candidates, by the predictor's figures (train.policy.predict): which one it registers,
and each one's verdict in words. Apart from the predictor, and without torch, so that the app that takes in a
predict job's results starts without importing it."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Prediction:
    """A candidate's predicted win rate over the round's start, and what it was measured on."""

    win_rate: float  # share of answer pairs to the same prompt where the candidate's reward is higher, ties half
    low: float  # the bootstrap interval at the job's confidence
    high: float
    kl_to_v0: float  # KL(candidate || v0) on its own answers, nats per answer
    ended: float  # share of its answers that ended before the length limit
    mean_reward: float  # its answers' mean reward, the heads' mean
    prompts: int
    answers: int  # of the candidate, as many of the start's
    scale: float = 1.0  # the share of its step from v0 kept: under 1 where the whole step went past [round] kl_budget
    whole_kl: float | None = None  # where it was cut, the whole step's KL to v0


def choose(predictions: list[Prediction], kl_budget: float, register: str = "confident") -> tuple[int | None, list[str]]:
    """Which candidate a round registers, by index, and each candidate's verdict in words; None where none may be.
    A candidate over kl_budget (0: no budget) may not. With `register` 'average' the one prediction is the
    candidates' average's, and it is the one; with 'confident', of those whose whole interval lies above 50%, and with
    'best' of all, the one with the highest predicted win rate."""
    if register == "average":
        (average,) = predictions
        if kl_budget and average.kl_to_v0 > kl_budget:
            return None, [_over_budget(average, kl_budget)]
        return 0, [f"registered, the average: {_figures(average)}"]
    verdicts, eligible = [], []
    for i, p in enumerate(predictions):
        if kl_budget and p.kl_to_v0 > kl_budget:
            verdicts.append(_over_budget(p, kl_budget))
        elif register == "confident" and p.low <= 0.5:
            verdicts.append(f"not predicted better than the start with confidence: {_figures(p)}")
        else:
            verdicts.append("")
            eligible.append(i)
    chosen = max(eligible, key=lambda i: predictions[i].win_rate, default=None)
    for i in eligible:
        verdicts[i] = f"registered, rated best: {_figures(predictions[i])}" if i == chosen else f"rated below another: {_figures(predictions[i])}"
    return chosen, verdicts


def _over_budget(p: Prediction, kl_budget: float) -> str:
    return f"over the KL budget: {p.kl_to_v0:.1f} nats from v0{_cut(p)}, the round's allowance {kl_budget:g} ([round] kl_budget, kl_per_vote)"


def _figures(p: Prediction) -> str:
    return f"{p.win_rate:.0%} [{p.low:.0%}, {p.high:.0%}] over the start{_cut(p)}"


def _cut(p: Prediction) -> str:
    return "" if p.whole_kl is None else f", at {p.scale:.2g} of its step from v0 (the whole step: {p.whole_kl:.1f} nats)"
