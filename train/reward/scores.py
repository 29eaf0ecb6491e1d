"""A reward model's scores, of either kind: normalised to the reward's units, the heads' mean and spread, and the
pairwise figures it is judged by; and RewardModel, the face both kinds show to whoever scores with one.

The heads are an ensemble (a LoRA model's fitted each on its own bootstrap weighting of the votes, a head's drawn
from its posterior): the reward is the mean of their normalised scores, and their spread is its uncertainty.
(raw - mean) / std, per head, makes a score comparable across versions.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from train.common.snapshot import Messages, PreferenceRow


@dataclass(frozen=True)
class Normalization:
    """Per head, the offset and divisor that put a raw score in the reward's units: the heads' mean has mean 0
    and std 1 on the reward model's training data."""

    mean: list[float]
    std: list[float]

    def apply(self, raw: torch.Tensor) -> torch.Tensor:
        """(N, K) raw head scores to normalised ones."""
        return (raw - torch.tensor(self.mean, device=raw.device)) / torch.tensor(self.std, device=raw.device)



def normalization_of(raw: list[list[float]]) -> Normalization:
    """From raw (N, K): each head's mean and (population) std, its std then scaled by the std of the heads' mean
    of so-normalised scores, so that the reward (that mean) has std 1 however much the heads agree. A std of
    0, from identical scores, becomes 1."""
    scores = torch.tensor(raw, dtype=torch.float64)
    mean, std = scores.mean(dim=0), scores.std(dim=0, correction=0)
    std = torch.where(std > 0, std, torch.ones_like(std))
    spread = ((scores - mean) / std).mean(dim=-1).std(correction=0).item()
    return Normalization(mean=mean.tolist(), std=(std * (spread if spread > 0 else 1.0)).tolist())



def reward_and_uncertainty(normalised: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) normalised head scores to (N,) rewards, their mean, and (N,) uncertainties, their spread
    (the sample std across heads; 0 for a single head)."""
    spread = normalised.std(dim=-1) if normalised.shape[-1] > 1 else torch.zeros_like(normalised[..., 0])
    return normalised.mean(dim=-1), spread



@dataclass(frozen=True)
class PairwiseResult:
    accuracy: float | None  # share of pairs with r_chosen > r_rejected (the reward: the heads' normalised mean); None for no pairs
    mean_margin: float | None  # mean of r_chosen - r_rejected in normalised units (training-reward stds)
    loss: float | None  # the ensemble's Bradley-Terry loss: mean -log p, p = the heads' mean sigmoid(raw chosen - raw rejected)
    calibration_error: float | None  # expected calibration error of p over CALIBRATION_BINS bins of confidence
    pairs: int
    truncated: int



CALIBRATION_BINS = 5  # of confidence max(p, 1 - p), 0.5 to 1: few, since held-out pairs are few



def calibration_error(probabilities: torch.Tensor) -> float:
    """Expected calibration error of the probabilities that the chosen response wins: per bin of confidence,
    |mean confidence - share right|, weighted by the bin's share of pairs."""
    confidence = torch.maximum(probabilities, 1 - probabilities)
    right = (probabilities > 0.5).double()
    bins = ((confidence - 0.5) * 2 * CALIBRATION_BINS).long().clamp(max=CALIBRATION_BINS - 1)
    error = 0.0
    for b in range(CALIBRATION_BINS):
        members = bins == b
        if members.any():
            error += members.double().mean().item() * abs(confidence[members].mean().item() - right[members].mean().item())
    return error


@dataclass
class RewardModel(ABC):
    """A reward model ready to score: the base it reads (a classifier with its adapter, or the causal LM whose
    features a head reads), its tokenizer, its offsets and its training max_length."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    normalization: Normalization
    max_length: int  # sequences are truncated as in training, or the scores would not be the trained ones

    @abstractmethod
    def raw_scores(self, prompts: list[Messages | str], responses: list[str], batch_size: int = 16) -> list[list[float]]:
        """Each head's score of each response to its prompt, (N, K) before normalisation."""

    @abstractmethod
    def pairwise_accuracy(
        self, rows: list[PreferenceRow], batch_size: int = 16, on_scored: Callable[[int], None] | None = None
    ) -> PairwiseResult:
        """How often the chosen response scores above the rejected one; a tie counts as wrong.

        on_scored, if given, is called with the number of sequences scored after each batch (two per pair).
        """

    def score_with_uncertainty(
        self, prompts: list[Messages | str], responses: list[str], batch_size: int = 16
    ) -> tuple[list[float], list[float]]:
        """Each response's reward, the mean of its normalised head scores (comparable across reward-model
        versions), and its uncertainty, their spread across heads."""
        raw = self.raw_scores(prompts, responses, batch_size)
        if not raw:
            return [], []
        reward, spread = reward_and_uncertainty(self.normalization.apply(torch.tensor(raw, dtype=torch.float64)))
        return reward.tolist(), spread.tolist()

    def score(self, prompts: list[Messages | str], responses: list[str], batch_size: int = 16) -> list[float]:
        """Each response's reward: the mean of its normalised head scores."""
        return self.score_with_uncertainty(prompts, responses, batch_size)[0]


def pairwise_result(chosen: torch.Tensor, rejected: torch.Tensor, normalization: Normalization, truncated: int) -> PairwiseResult:
    """The pairwise figures of raw head scores (N, K) of each pair's chosen and rejected response."""
    if not len(chosen):
        return PairwiseResult(accuracy=None, mean_margin=None, loss=None, calibration_error=None, pairs=0, truncated=0)
    chosen, rejected = chosen.double(), rejected.double()
    margins = reward_and_uncertainty(normalization.apply(chosen))[0] - reward_and_uncertainty(normalization.apply(rejected))[0]
    probabilities = torch.sigmoid(chosen - rejected).mean(dim=-1)  # (N,) the ensemble's P(chosen wins)
    return PairwiseResult(
        accuracy=(margins > 0).double().mean().item(),
        mean_margin=margins.mean().item(),
        loss=-probabilities.log().mean().item(),
        calibration_error=calibration_error(probabilities),
        pairs=len(chosen),
        truncated=truncated,
    )
