"""A round's predictor: how often each candidate policy would beat the round's start, by the reward model.

A round trains several candidates from one start (other seeds, other optimisers) and keeps at
most one. Which one, and whether any, is decided before anyone sees its answers (where the round
registers the candidates' average, the average is the one policy rated, for the KL budget and the
record):
1. sample: the start and every candidate answer the same prompts, held back from training (none of
   them trained on these prompts), `answers` times each, each policy with the same seed, so that
   two alike policies give alike answers and their difference is not drowned in sampling noise;
2. score: every answer by each of the reward model's heads (draws from its posterior, or an
   ensemble), normalised;
3. compare: the candidate's win rate over the start is the share of (candidate answer, start
   answer) pairs to the same prompt that the candidate's answer wins, ties half, averaged over
   prompts, and over the heads: what a judge's win rate over the start measures, with each of the
   reward model's heads for judge in turn, so that a win the heads disagree on counts less;
4. interval: the win rate's `confidence` interval by a bootstrap that draws the prompts again, then
   each prompt's answers of both policies, and one head: so that neither a few prompts nor a reward
   model the votes leave unsure of passes for certainty;
5. KL: each candidate's KL to the starting model v0 on its own answers, for [round] kl_budget. A candidate past the
   budget is pulled back along its step from v0 (its LoRA update scaled down, `scale`) to just inside it, and that
   policy is sampled, measured and rated instead (cut once more if it measures past still): what a round learnt is
   kept in part rather than thrown away, and the budget still holds, measured on fresh answers after the cut.

Not the conservative reward (the mean less the heads' spread) that PPO optimises: it marks down
every answer the reward model is unsure of, and a candidate's answers are the more unusual the
further it moved, so it rated every candidate that moved below its start whatever the judge found
(scripts/BENCHMARKS.md). Nor the heads' mean alone, whose win rate ignores their doubt and fell
outside the interval the heads give. The estimate is the mean over heads, which the interval holds.
"""

import torch

from train.policy.choice import Prediction
from train.policy.generate import Generated


def win_rate(candidate: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """(P, N) and (P, M) rewards of each prompt's answers to the mean over prompts of each prompt's share of (candidate,
    start) pairs the candidate wins, ties half; (...) over any leading dimensions, for the bootstrap's draws."""
    difference = candidate.unsqueeze(-1) - start.unsqueeze(-2)  # (..., P, N, M)
    wins = (difference > 0).double() + 0.5 * (difference == 0).double()
    return wins.mean(dim=(-1, -2)).mean(dim=-1)


def bootstrap_interval(candidate: torch.Tensor, start: torch.Tensor, confidence: float, draws: int,
                       generator: torch.Generator) -> tuple[float, float]:
    """The central `confidence` interval of win_rate over `draws` bootstrap draws of (P, N, K) and (P, M, K) head
    scores: P prompts drawn with replacement, within each drawn prompt its N candidate answers and M start answers,
    each with replacement, and one of the K heads for the whole draw."""
    prompts, n, m, heads = candidate.shape[0], candidate.shape[1], start.shape[1], candidate.shape[2]
    which = torch.randint(prompts, (draws, prompts), generator=generator)  # (D, P)
    head = torch.randint(heads, (draws, 1, 1), generator=generator)  # (D, 1, 1)
    ours = candidate[which].gather(3, head[..., None].expand(-1, prompts, n, 1))[..., 0]  # (D, P, N) under the drawn head
    theirs = start[which].gather(3, head[..., None].expand(-1, prompts, m, 1))[..., 0]  # (D, P, M)
    ours = ours.gather(2, torch.randint(n, (draws, prompts, n), generator=generator))
    theirs = theirs.gather(2, torch.randint(m, (draws, prompts, m), generator=generator))
    rates = win_rate(ours, theirs)  # (D,)
    tail = (1 - confidence) / 2
    low, high = torch.quantile(rates, torch.tensor([tail, 1 - tail], dtype=rates.dtype))
    return low.item(), high.item()


def predict(candidate: torch.Tensor, start: torch.Tensor, answers: list[Generated], kl_to_v0: float, confidence: float, draws: int,
            seed: int, scale: float = 1.0, whole_kl: float | None = None) -> Prediction:
    """A candidate's Prediction from the (P, N, K) normalised head scores of its answers and the (P, M, K) of the start's,
    grouped by prompt; `answers` are the candidate's, at `scale` of its step from v0 (whose whole KL was whole_kl)."""
    low, high = bootstrap_interval(candidate, start, confidence, draws, torch.Generator().manual_seed(seed))
    by_head = win_rate(candidate.movedim(-1, 0), start.movedim(-1, 0))  # (K,)
    return Prediction(by_head.mean().item(), low, high, kl_to_v0, sum(a.finished for a in answers) / len(answers),
                      candidate.mean().item(), candidate.shape[0], len(answers), scale, whole_kl)
