"""Simulated annotators: votes from a judge plus noise, cast the way people cast them.

They take pairs from the queue people are served from (`LiveQueue`: a lease per pair, the overlap
the queue config asks for) and vote through it as people do, with source 'simulate'. A task of K
answers they rank as Plackett-Luce with the judge's scores over T as utilities does (each answer's
score / T plus Gumbel noise, sorted): any two of its answers are then ordered as a vote on that pair
would be, the judge's way with probability sigmoid(margin / T). The judge,
without noise, also compares two policies' answers to held-out evaluation prompts.
"""

import dataclasses
import itertools
import json
import math
import random
from dataclasses import dataclass
from typing import Any, Callable

from annotate.judges import Judge, prefers_first, sigmoid
from annotate.queue import Action, LiveQueue, QueueConfig
from annotate.ratings import wilson_interval
from store.db import Connection, utcnow
from store.rankings import answer_label

Messages = list[dict[str, str]]
Run = Callable[..., Any]  # runs a store function on the database


def last_user_message(messages: Messages) -> str:
    return next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")


@dataclass
class Votes:
    """Simulated votes cast, and how much they can teach."""

    cast: int = 0
    expected: float = 0.0  # summed over the votes: the chance each had of siding with the noiseless judge
    sided: float = 0.0  # the votes that did side with the noiseless judge, a tie in its score counting half

    @property
    def ceiling(self) -> float | None:
        """The share of the votes expected to side with the noiseless judge: no reward model fitted to
        them can agree with them more often, and near 0.5 they carry almost nothing to learn."""
        return self.expected / self.cast if self.cast else None

    @property
    def agreement(self) -> float | None:
        """The share of the votes that sided with the noiseless judge: the ceiling as it fell."""
        return self.sided / self.cast if self.cast else None


def cast_votes(
    run: Run, queue: QueueConfig, judge: Judge, noise: float, annotators: list[str], labels: int, rng: random.Random,
    votes: Votes | None = None, coin_flippers: frozenset[str] = frozenset(),
) -> Votes:
    """Up to `labels` votes by the simulated annotators in turn, fewer when no one has a pair left, added to `votes`.
    The annotators in `coin_flippers` ignore the judge and vote at random, as a careless person would.

    One call of `run`, so one connection for the whole session, and the queue is loaded once."""
    return run(_cast_votes, queue, judge, noise, annotators, labels, rng, votes or Votes(), coin_flippers)


def _cast_votes(con: Connection, config: QueueConfig, judge: Judge, noise: float, annotators: list[str], labels: int,
                rng: random.Random, votes: Votes, coin_flippers: frozenset[str]) -> Votes:
    queue = LiveQueue.load(con, config, utcnow())
    goal = votes.cast + labels
    idle = set()  # annotators the queue had nothing for
    turn = 0
    while votes.cast < goal and len(idle) < len(annotators):
        annotator = annotators[turn % len(annotators)]
        turn += 1
        if annotator in idle:
            continue
        (served,) = queue.act(con, [Action("serve", annotator)], utcnow())
        assignment = served.assignment
        if assignment is None:
            idle.add(annotator)
            continue
        prompt = last_user_message(json.loads(assignment.prompt_messages))
        careless = annotator in coin_flippers
        if assignment.answers:
            scores = [judge(prompt, text) for text, _ in assignment.answers]
            order = ranked_order(scores, math.inf if careless else noise, rng)
            action = Action("rank", annotator, assignment.token, ranking=" > ".join(answer_label(i) for i in order))
            pairs = [(scores[a] - scores[b], True) for i, a in enumerate(order) for b in order[i + 1:]]  # a above b
        else:
            margin = judge(prompt, assignment.left_text) - judge(prompt, assignment.right_text)
            first = rng.random() < 0.5 if careless else prefers_first(margin, noise, rng)
            action = Action("vote", annotator, assignment.token, "left" if first else "right")
            pairs = [(margin, first)]
        # serve_next=False: the annotator's next pair is served on its next turn, so none is left leased at the end.
        (voted,) = queue.act(con, [dataclasses.replace(action, source="simulate", serve_next=False)], utcnow())
        if voted.refused:
            raise RuntimeError(f"a simulated vote was refused: {voted.refused}")
        votes.cast += 1  # a ranking counts once, its pairs' figures averaged
        votes.expected += sum(0.5 if careless else chance_of_siding(m, noise) for m, _ in pairs) / len(pairs)
        votes.sided += sum(0.5 if m == 0 else float(first == (m > 0)) for m, first in pairs) / len(pairs)
    return votes


def ranked_order(scores: list[float], noise: float, rng: random.Random) -> list[int]:
    """The positions of the answers, best first, as a noisy annotator ranks them: Plackett-Luce with utilities
    score / noise (each plus Gumbel noise, sorted), so any two are ordered the judge's way with probability
    sigmoid(margin / noise), as prefers_first votes. noise 0 sorts by score (a tie in order at random);
    infinite noise is a random order."""
    def key(i: int) -> float:
        if noise == 0:
            return scores[i]
        if math.isinf(noise):
            return rng.random()
        return scores[i] / noise - math.log(-math.log(rng.random() or 1e-300))
    positions = list(range(len(scores)))
    rng.shuffle(positions)  # breaks ties in the key at random
    return sorted(positions, key=key, reverse=True)


def chance_of_siding(margin: float, noise: float) -> float:
    """The chance that a vote at noise T sides with the noiseless judge, whose margin is judge(a) - judge(b); a tie counts half."""
    return 0.5 if margin == 0 else 1.0 if noise == 0 else sigmoid(abs(margin) / noise)


def expected_agreement(margins: list[float], noise: float) -> float:
    """The share of votes on pairs with these judge margins expected to side with the noiseless judge at noise T."""
    return sum(chance_of_siding(m, noise) for m in margins) / len(margins)


class UnreachableAgreement(ValueError):
    """No noise temperature makes votes on these pairs side with the judge as often as asked."""


def noise_for_agreement(margins: list[float], agreement: float) -> float:
    """The noise T at which votes on the pairs with these judge margins that it tells apart side with the noiseless
    judge `agreement` of the time.

    Ties are left out: a vote on a pair the judge scores the same sides with it half the time at any T, so counted in
    they would cap the agreement a judge can be given (`polite` ties 65% of the default model's pairs: 67.4% at most).
    The expected agreement falls from 1 at T -> 0 to 0.5 as T grows; so bracket the target, then bisect on log T, since
    margins, and so T, may be of any scale.
    """
    if not margins:
        raise UnreachableAgreement("no two answers to the same prompt to set the noise on")
    if not 0.5 < agreement < 1:
        raise UnreachableAgreement(f"agreement must be above 0.5 and below 1, got {agreement}: votes that side with the judge "
                                   f"half the time are coin flips, and those that always do have noise 0")
    apart = [m for m in margins if m != 0]
    if not apart:
        raise UnreachableAgreement(f"the judge scores all {len(margins)} pairs the same: there is nothing for votes to side with")
    low = high = sorted(map(abs, apart))[len(apart) // 2]  # the median margin: T is of its scale
    while expected_agreement(apart, low) < agreement:
        low /= 2
    while expected_agreement(apart, high) > agreement:
        high *= 2
    for _ in range(60):
        middle = math.sqrt(low * high)
        if expected_agreement(apart, middle) > agreement:
            low = middle
        else:
            high = middle
    return math.sqrt(low * high)


def within_prompt_margins(judge: Judge, prompts: list[Messages], answers: list[str]) -> list[float]:
    """The judge's margin on every pair of two answers to the same prompt; the answers are grouped by prompt, in prompt order."""
    per_prompt = len(answers) // len(prompts)
    margins = []
    for i, messages in enumerate(prompts):
        prompt = last_user_message(messages)
        scores = [judge(prompt, answer) for answer in answers[i * per_prompt : (i + 1) * per_prompt]]
        margins += [a - b for a, b in itertools.combinations(scores, 2)]
    return margins


@dataclass(frozen=True)
class JudgeEvaluation:
    win_rate: float  # of the candidate over the baseline, ties counting half
    low: float  # Wilson 95% interval
    high: float
    pairs: int
    mean_score: float  # the judge's mean score of the candidate's answers


def judge_against(judge: Judge, prompts: list[Messages], candidate: list[str], baseline: list[str]) -> JudgeEvaluation:
    """The judge's verdict on each candidate answer against the baseline's answer at the same place."""
    per_prompt = len(candidate) // len(prompts)
    wins = 0.0
    scores = []
    for i, (new, old) in enumerate(zip(candidate, baseline, strict=True)):
        prompt = last_user_message(prompts[i // per_prompt])
        new_score, old_score = judge(prompt, new), judge(prompt, old)
        scores.append(new_score)
        wins += 1.0 if new_score > old_score else 0.5 if new_score == old_score else 0.0
    rate = wins / len(candidate)
    low, high = wilson_interval(rate, len(candidate))
    return JudgeEvaluation(rate, low, high, len(candidate), sum(scores) / len(scores))
