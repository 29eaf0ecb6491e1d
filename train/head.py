"""A Bayesian linear Bradley-Terry head on frozen features: a reward model that learns from a few noisy votes.

A response's reward is w . f(response), f its features (train.features), and a vote for a over b
is right with its row's confidence c (from the annotators' measured flip rate), so its likelihood
is c sigmoid(m) + (1 - c) sigmoid(-m), m = w . (f(a) - f(b)) (CrowdBT, as train.reward's loss).
The prior is w ~ N(0, I / alpha) on standardised features. The fit, in the order `fit_head` runs it:
1. standardise: each feature less its mean and over its std across the voted answers;
2. reduce: w's component outside the span of the votes' differences keeps its prior, so the fit runs
   in that span's r <= N dimensions (the thin SVD of the differences);
3. alpha, the prior's strength: by the evidence (MacKay 1992) of the votes' linearised model, where
   2c - 1 is a vote's expected sign and w . d its mean with Gaussian noise, exact and in closed form,
   taken to the Bradley-Terry scale (sigmoid is linear near 0, with slope 1/4); or ("cv") the alpha of
   a grid with the best held-out likelihood over folds of the prompts;
4. posterior: the MAP w by Fisher scoring, and Laplace's covariance, (J' S J + alpha I)^-1 within the
   span, S each vote's Fisher information, and I / alpha outside it;
5. heads: K draws of w, in antithetic pairs (w* +- d), so that the heads' mean is the MAP head and
   their spread the posterior's; or ("bootstrap") K MAP fits, each on a double-or-nothing resampling.
The heads are folded back into raw features: head k's raw score is weight_k . f + bias_k.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

PRIORS = ("evidence", "cv")
POSTERIORS = ("laplace", "bootstrap")
CV_ALPHAS = torch.logspace(0, 8, 17, dtype=torch.float64).tolist()  # prior precisions cross-validation tries
CV_FOLDS = 5


@dataclass(frozen=True)
class Head:
    """K linear heads on raw features: raw scores = features @ weight.T + bias."""

    weight: torch.Tensor  # (K, D)
    bias: torch.Tensor  # (K,)
    alpha: float  # the prior precision the fit chose, on standardised features

    def raw_scores(self, features: torch.Tensor) -> torch.Tensor:
        """(N, D) features to (N, K) raw head scores."""
        return features.to(self.weight) @ self.weight.T + self.bias


def noisy_nll(margin: torch.Tensor, confidence: torch.Tensor) -> torch.Tensor:
    """-log(c sigmoid(m) + (1 - c) sigmoid(-m)), elementwise: at c = 1 it is Bradley-Terry's -log sigmoid(m)."""
    return -torch.logaddexp(confidence.log() + F.logsigmoid(margin), torch.log1p(-confidence) + F.logsigmoid(-margin))


def _slope_and_information(margin: torch.Tensor, confidence: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """d nll / d m, and each vote's Fisher information about m (positive even where the noisy likelihood is not
    log-concave, so that Fisher scoring always descends)."""
    s = torch.sigmoid(margin)
    p = (confidence * s + (1 - confidence) * (1 - s)).clamp(1e-12, 1 - 1e-12)  # P(the label as given)
    dp = (2 * confidence - 1) * s * (1 - s)
    return -dp / p, dp**2 / (p * (1 - p))


def map_fit(z: torch.Tensor, confidence: torch.Tensor, alpha: float, counts: torch.Tensor | None = None,
            start: torch.Tensor | None = None, iterations: int = 100) -> tuple[torch.Tensor, torch.Tensor]:
    """The MAP w (r,) for votes z (N, r), chosen less rejected, under prior precision alpha, by Fisher scoring with
    step halving; and the posterior precision (r, r) there. `counts` (N,) counts each vote that many times."""
    counts = torch.ones_like(confidence) if counts is None else counts
    identity = torch.eye(z.shape[1], dtype=z.dtype)
    w = torch.zeros(z.shape[1], dtype=z.dtype) if start is None else start.clone()

    def objective(w: torch.Tensor) -> float:
        return float((counts * noisy_nll(z @ w, confidence)).sum() + 0.5 * alpha * w @ w)

    def precision_at(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        slope, information = _slope_and_information(z @ w, confidence)
        return z.T @ (counts * slope) + alpha * w, z.T @ ((counts * information)[:, None] * z) + alpha * identity

    value = objective(w)
    for _ in range(iterations):
        gradient, precision = precision_at(w)
        step = torch.linalg.solve(precision, gradient)
        size = 1.0
        while (new := objective(w - size * step)) > value and size > 1e-6:
            size /= 2
        if new > value:
            break
        w, improved = w - size * step, value - new
        value = new
        if improved < 1e-10 * (1 + abs(value)):
            break
    return w, precision_at(w)[1]


def evidence_alpha(x: torch.Tensor, iterations: int = 500, largest: float = 1e12) -> float:
    """The prior precision that maximises the exact evidence of 1 = w . x_i + Gaussian noise for every vote, its noise
    precision fitted alongside (MacKay's updates). Capped at `largest`, where the votes show no signal at all."""
    _, singular, basis = torch.linalg.svd(x, full_matrices=False)
    squares, projected = singular**2, singular * (x @ basis.T).sum(dim=0) / singular.clamp(min=1e-300)  # (r,) S U' 1
    alpha, beta = 1.0, 1.0
    for _ in range(iterations):
        mean = beta * projected / (beta * squares + alpha)  # (r,) the posterior mean, in x's singular basis
        well_determined = float((beta * squares / (beta * squares + alpha)).sum())
        misfit = float(((1 - x @ basis.T @ mean) ** 2).sum())
        new_alpha = min(well_determined / max(float(mean @ mean), 1e-300), largest)
        new_beta = max(x.shape[0] - well_determined, 1e-6) / max(misfit, 1e-300)
        converged = abs(math.log(new_alpha / alpha)) < 1e-7 and abs(math.log(new_beta / beta)) < 1e-7
        alpha, beta = new_alpha, new_beta
        if converged:
            break
    return alpha


def cv_alpha(z: torch.Tensor, confidence: torch.Tensor, groups: list[int]) -> float:
    """The prior precision of CV_ALPHAS whose fits have the best likelihood of the votes on prompts they left out."""
    folds = torch.tensor([g % CV_FOLDS for g in groups])
    scores = []
    for alpha in CV_ALPHAS:
        held_out = 0.0
        for fold in folds.unique().tolist():
            train = folds != fold
            w, _ = map_fit(z[train], confidence[train], alpha)
            held_out -= float(noisy_nll(z[~train] @ w, confidence[~train]).sum())
        scores.append((held_out, alpha))
    return max(scores)[1]


def fit_head(chosen: torch.Tensor, rejected: torch.Tensor, confidence: torch.Tensor, groups: list[int], heads: int,
             prior: str = "evidence", posterior: str = "laplace", seed: int = 0) -> Head:
    """K heads fitted to votes for chosen (N, D) over rejected (N, D) features, each label right with probability
    `confidence` (N,) (above 0.5); `groups` (N,) numbers each vote's prompt, for cross-validation's folds."""
    if prior not in PRIORS or posterior not in POSTERIORS:
        raise ValueError(f"prior must be one of {', '.join(PRIORS)} and posterior one of {', '.join(POSTERIORS)}")
    chosen, rejected, confidence = chosen.double(), rejected.double(), confidence.double()
    answers = torch.cat([chosen, rejected])
    mean, std = answers.mean(dim=0), answers.std(dim=0).clamp(min=1e-6)
    differences = (chosen - rejected) / std  # (N, D) standardised
    _, singular, basis = torch.linalg.svd(differences, full_matrices=False)
    keep = singular > singular[0] * 1e-9
    singular, basis = singular[keep], basis[keep]  # (r,), (r, D): the span of the differences
    z = differences @ basis.T  # (N, r)
    if prior == "evidence":
        # Linearised: a vote's expected sign is (2c - 1)(2 sigmoid(m) - 1), about (2c - 1) m / 2 near m = 0.
        alpha = evidence_alpha(z * ((2 * confidence - 1) / 2)[:, None])
    else:
        alpha = cv_alpha(z, confidence, groups)
    w, precision = map_fit(z, confidence, alpha)
    generator = torch.Generator().manual_seed(seed)
    if heads == 1:
        draws = (w @ basis)[None]
    elif posterior == "laplace":
        half = (heads + 1) // 2
        factor = torch.linalg.cholesky(torch.linalg.inv(precision))  # (r, r): the covariance within the span
        noise = torch.randn(half, differences.shape[1], dtype=torch.float64, generator=generator)  # (half, D)
        outside = (noise - (noise @ basis.T) @ basis) / math.sqrt(alpha)  # the prior's part, outside the span
        within = torch.randn(half, z.shape[1], dtype=torch.float64, generator=generator) @ factor.T @ basis
        draws = torch.cat([w @ basis + within + outside, w @ basis - within - outside])[:heads]
    else:
        draws = torch.stack([
            map_fit(z, confidence, alpha, counts=2.0 * torch.randint(0, 2, (z.shape[0],), generator=generator).double(), start=w)[0]
            @ basis for _ in range(heads)
        ])
    weight = draws / std  # (K, D): on raw features
    return Head(weight.float(), (-(weight @ mean)).float(), alpha)
