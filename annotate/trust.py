"""How far to trust each annotator: their reliability, estimated from gold answers and from agreement with others.

The model is Dawid and Skene's (1979) with one coin per annotator: on every pair one answer is
truly better, and annotator j picks it with probability r_j, their reliability, whatever the
pair. EM alternates between the posterior of each pair's better answer given the votes on it
(a gold pair's is its known answer) and each r_j given those posteriors, under a Beta prior that
starts everyone at PRIOR_MEAN (people agree with a careful judge about 70% of the time) with
the weight of PRIOR_VOTES votes, so that a few unlucky votes do not condemn anyone. A pair one
person voted on and no gold answer covers says nothing about that person, and is left out.
Ties and both-bad votes say nothing about which answer is better, and are left out too.

A pair's label then weighs each vote by its annotator's log-odds logit(r_j): a coin-flipper's vote
counts for nothing, and the label comes with the probability that it is right (its confidence),
which the reward model's loss takes (train.reward.votes.label_noise_loss).
"""

import math
from collections import defaultdict
from dataclasses import dataclass

from store.db import Connection
from store.gold import gold_answers, people_votes

PRIOR_MEAN = 0.7
PRIOR_VOTES = 4.0


@dataclass(frozen=True)
class Reliability:
    annotator: str
    reliability: float  # the estimated probability that their vote picks the better answer
    informative_votes: int  # votes on gold pairs or on pairs others voted on too: what the estimate rests on
    gold_answered: int
    gold_correct: int


def estimate_reliability(
    votes: list[tuple[int, str, str]], gold: dict[int, str], iterations: int = 200
) -> dict[str, Reliability]:
    """Each annotator's reliability from their (pair, annotator, 'a' or 'b') votes and the gold answers, by EM."""
    by_pair: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for pair_id, annotator, choice in votes:
        by_pair[pair_id].append((annotator, choice))
    informative = {p: vs for p, vs in by_pair.items() if p in gold or len(vs) > 1}
    annotators = sorted({annotator for _, annotator, _ in votes})
    reliability = dict.fromkeys(annotators, PRIOR_MEAN)
    for _ in range(iterations):
        right = {a: PRIOR_MEAN * PRIOR_VOTES for a in annotators}
        counted = dict.fromkeys(annotators, PRIOR_VOTES)
        for pair_id, pair_votes in informative.items():
            p_a = 1.0 if gold.get(pair_id) == "a" else 0.0 if pair_id in gold else _posterior_a(pair_votes, reliability)
            for annotator, choice in pair_votes:
                right[annotator] += p_a if choice == "a" else 1 - p_a
                counted[annotator] += 1
        updated = {a: right[a] / counted[a] for a in annotators}
        converged = all(abs(updated[a] - reliability[a]) < 1e-7 for a in annotators)
        reliability = updated
        if converged:
            break
    on_gold = defaultdict(lambda: [0, 0])
    for pair_id, annotator, choice in votes:
        if pair_id in gold:
            on_gold[annotator][0] += 1
            on_gold[annotator][1] += choice == gold[pair_id]
    return {
        a: Reliability(a, reliability[a], round(counted[a] - PRIOR_VOTES), on_gold[a][0], on_gold[a][1]) for a in annotators
    }


def project_reliability(con: Connection) -> dict[str, Reliability]:
    """Every annotator's reliability from the project's votes and gold pairs."""
    return estimate_reliability(people_votes(con), gold_answers(con))


def _log_odds(reliability: float) -> float:
    """A vote's weight: logit(r), with r held within [0.5, 0.99]. Below 0.5 a vote would count against its own
    side; a person's vote is never turned around, only given no weight. 0.99 keeps one vote from being certain."""
    r = min(max(reliability, 0.5), 0.99)
    return math.log(r / (1 - r))


def _posterior_a(pair_votes: list[tuple[str, str]], reliability: dict[str, float]) -> float:
    """P(a is the better answer | the votes), from an even prior."""
    log_odds = sum(_log_odds(reliability[annotator]) * (1 if choice == "a" else -1) for annotator, choice in pair_votes)
    return 1 / (1 + math.exp(-log_odds))


def weighted_label(pair_votes: list[tuple[str, str]], reliability: dict[str, float]) -> tuple[str, float] | None:
    """The better answer by the votes' trust-weighted log-odds, and the probability that it is right; None when
    the votes cancel out or none is for 'a' or 'b'. An annotator with no estimate counts at PRIOR_MEAN."""
    ab = [(annotator, choice) for annotator, choice in pair_votes if choice in ("a", "b")]
    p_a = _posterior_a(ab, {a: reliability.get(a, PRIOR_MEAN) for a, _ in ab})
    if not ab or p_a == 0.5:
        return None
    return ("a", p_a) if p_a > 0.5 else ("b", 1 - p_a)
