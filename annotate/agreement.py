"""Agreement between annotators: the majority on one pair, and chance-corrected agreement over many.

A choice is 'a', 'b', 'tie' or 'both_bad'. Nothing here depends on which choices exist: a
category no one picked adds nothing to any of the sums, so any labels work.
"""

import math
from collections import Counter
from dataclasses import dataclass

from annotate.ratings import wilson_interval
from annotate.trust import PRIOR_MEAN
from store import Connection
from store.ai_votes import judged_pairs
from store.gold import people_votes


def majority(choices: list[str]) -> str | None:
    """The choice with strictly the most votes; None when two or more share first place (or no votes)."""
    ranked = Counter(choices).most_common(2)
    if not ranked or (len(ranked) == 2 and ranked[0][1] == ranked[1][1]):
        return None
    return ranked[0][0]


def agreement_share(choices: list[str]) -> float:
    """Votes for the majority choice over all votes: 1.0 is unanimous.

    0.0 when there is no majority, as then no votes back a winner.
    """
    winner = majority(choices)
    return choices.count(winner) / len(choices) if winner is not None else 0.0


def _pair_agreement(choices: list[str]) -> float:
    """P_i: the share of ordered pairs of raters on this item who agree."""
    n = len(choices)
    return sum(k * (k - 1) for k in Counter(choices).values()) / (n * (n - 1))


def percent_agreement(items: list[list[str]]) -> float | None:
    """Mean share of agreeing rater pairs per item; items with fewer than two ratings are left out.

    None when no item has two ratings.
    """
    rated = [choices for choices in items if len(choices) >= 2]
    if not rated:
        return None
    return sum(_pair_agreement(choices) for choices in rated) / len(rated)


def fleiss_kappa(items: list[list[str]]) -> float | None:
    """Fleiss' kappa, allowing a different number of raters per item; items rated once are left out.

    kappa = (P_bar - P_e) / (1 - P_e), where P_bar is the mean per-item agreement and P_e the
    agreement expected by chance from how often each category was chosen over all ratings.
    None when no item has two ratings, or when every rating is the same category (P_e = 1),
    where chance explains all agreement and kappa is undefined.
    """
    rated = [choices for choices in items if len(choices) >= 2]
    if not rated:
        return None
    totals = Counter(choice for choices in rated for choice in choices)
    ratings = sum(totals.values())
    p_e = sum((count / ratings) ** 2 for count in totals.values())
    if p_e == 1.0:
        return None
    p_bar = sum(_pair_agreement(choices) for choices in rated) / len(rated)
    return (p_bar - p_e) / (1 - p_e)


@dataclass(frozen=True)
class JudgeAgreement:
    """How often an AI judge chose as people did, over the pairs both voted on where people's majority is a or b."""

    agreeing: int
    pairs: int

    @property
    def share(self) -> float | None:
        return self.agreeing / self.pairs if self.pairs else None

    def interval(self) -> tuple[float, float] | None:
        """The share's 95% Wilson interval; None without pairs."""
        return wilson_interval(self.agreeing / self.pairs, self.pairs) if self.pairs else None

    @property
    def confidence(self) -> float:
        """The probability that the judge's label is right, as [reward_model] ai_votes = "weight" trusts it: the share
        smoothed towards a coin, (agreeing + 1) / (pairs + 2) (Laplace's rule), and never below one."""
        return max(0.5, (self.agreeing + 1) / (self.pairs + 2))

    def __str__(self) -> str:
        if not self.pairs:
            return "no pairs that both the judge and people voted on yet"
        low, high = self.interval()
        return f"{self.share:.1%} [95% CI {low:.1%}-{high:.1%}] on {self.pairs} pairs both voted on"


def judge_agreement(judged: list[tuple[str, str, list[str]]]) -> dict[str, JudgeAgreement]:
    """Each judge's agreement with people, from (judge, its choice, people's choices) on pairs both voted on.

    A pair counts where people's majority is 'a' or 'b': a tie among people, or a majority for
    'tie' or 'both_bad', says nothing about which answer the judge should have picked.
    """
    counts: dict[str, list[int]] = {}
    for judge, choice, people in judged:
        winner = majority(people)
        if winner in ("a", "b"):
            agreeing, pairs = counts.setdefault(judge, [0, 0])
            counts[judge] = [agreeing + (choice == winner), pairs + 1]
    return {judge: JudgeAgreement(agreeing, pairs) for judge, (agreeing, pairs) in sorted(counts.items())}


def agreement_with_people(con: Connection) -> dict[str, JudgeAgreement]:
    """Each AI judge's agreement with people, on the pairs both voted on, from the database."""
    return judge_agreement(judged_pairs(con))


# Until the overlapped pairs say otherwise, votes are taken to side with the better answer as often as
# annotate.trust starts everyone at (PRIOR_MEAN), with the weight of FLIP_PRIOR_PAIRS pairs voted on twice.
FLIP_PRIOR_PAIRS = 4.0
MAX_FLIP_RATE = 0.45  # a flip rate of 0.5 would make every vote a coin flip, and teach nothing
_CLEARNESS = [(i + 0.5) * 8 / 400 for i in range(400)]  # z from 0 to 8: the midpoints of a grid over the half-normal
_WEIGHTS = [2 * math.exp(-z * z / 2) / math.sqrt(2 * math.pi) * 8 / 400 for z in _CLEARNESS]


@dataclass(frozen=True)
class FlipRate:
    """How often a vote picks the worse answer, from how often two people's votes on one pair agree."""

    rate: float
    agreement: float | None  # the share of agreeing pairs of votes on the overlapped pairs; None without any
    pairs: int  # overlapped pairs, two or more votes for 'a' or 'b', that it rests on
    low: float  # the least rate the overlapped pairs allow: at the agreement's 95% Wilson upper bound, prior included

    def __str__(self) -> str:
        if not self.pairs:
            return f"{self.rate:.2f} (assumed: no pair has two votes yet)"
        return f"{self.rate:.2f} (from {self.agreement:.1%} agreement on {self.pairs} pairs voted on by two or more)"

    def in_use(self, setting: float | str) -> str:
        """What the reward model's likelihood takes, given [reward_model] flip_rate, in words."""
        if setting == "auto":
            return f"{self}; the reward model allows for it"
        return f"{setting:.2f}, set by hand in [reward_model] flip_rate; measured {self}"


def _siding_and_agreement(spread: float) -> tuple[float, float]:
    """Under votes that side with the better answer with probability sigmoid(spread * z), z half-normal: the share of
    votes that side with it, and the share of pairs of votes that agree, q^2 + (1 - q)^2 on average over the pairs."""
    sides = [1 / (1 + math.exp(-spread * z)) for z in _CLEARNESS]
    return (sum(w * q for w, q in zip(_WEIGHTS, sides)) / sum(_WEIGHTS),
            sum(w * (q * q + (1 - q) ** 2) for w, q in zip(_WEIGHTS, sides)) / sum(_WEIGHTS))


def _spread_where(index: int, target: float) -> float:
    """The spread at which _siding_and_agreement's `index`th share is `target`: both rise with it, from 0.5 towards 1."""
    low, high = 1e-6, 1e3
    for _ in range(80):
        middle = math.sqrt(low * high)
        low, high = (middle, high) if _siding_and_agreement(middle)[index] < target else (low, middle)
    return middle


def flip_rate(items: list[list[str]]) -> FlipRate:
    """The flip rate of votes, from the choices on each pair.

    Two annotators who each pick the better of a pair with probability q agree with probability q^2 + (1 - q)^2. q
    is not the same on every pair: people agree on a clear pair and split on a close one. So the pairs are taken as
    Bradley-Terry has them, with answers whose qualities are normally distributed: a vote picks the better with
    probability sigmoid(z), z half-normal at a spread that gives the agreement measured, and the flip rate is 1 - the
    mean of sigmoid(z). (Taking one q for every pair puts the flip rate 0.04 to 0.05 below the truth for simulated
    annotators who side with a judge 60% to 80% of the time.) The agreement is the mean share of agreeing pairs of
    votes over the pairs with two or more votes for 'a' or 'b' (ties and both-bad say nothing about which is better),
    drawn towards annotate.trust's prior by FLIP_PRIOR_PAIRS pairs.
    """
    rated = [[c for c in choices if c in ("a", "b")] for choices in items]
    rated = [choices for choices in rated if len(choices) >= 2]
    prior = _siding_and_agreement(_spread_where(0, PRIOR_MEAN))[1]
    measured = sum(_pair_agreement(choices) for choices in rated)
    weight = len(rated) + FLIP_PRIOR_PAIRS
    agreement = (measured + FLIP_PRIOR_PAIRS * prior) / weight
    rate, low = (min(1 - _siding_where_agreement(a), MAX_FLIP_RATE) for a in (agreement, wilson_interval(agreement, weight)[1]))
    return FlipRate(rate, measured / len(rated) if rated else None, len(rated), low)


def _siding_where_agreement(agreement: float) -> float:
    return 0.5 if agreement <= 0.5 else _siding_and_agreement(_spread_where(1, agreement))[0]


def majority_confidence(agreeing: int, disagreeing: int, flip: float) -> float:
    """The probability that the majority of a pair's votes is right: `agreeing` votes for it and `disagreeing` against,
    each wrong with probability `flip`, from an even prior. 1 when flip is 0."""
    if flip == 0:
        return 1.0
    lead = agreeing - disagreeing
    return 1 / (1 + (flip / (1 - flip)) ** lead)


def project_flip_rate(con: Connection) -> FlipRate:
    """The flip rate of people's votes in the project, from the pairs two or more of them voted on."""
    by_pair: dict[int, list[str]] = {}
    for pair_id, _, choice in people_votes(con):
        by_pair.setdefault(pair_id, []).append(choice)
    return flip_rate(list(by_pair.values()))
