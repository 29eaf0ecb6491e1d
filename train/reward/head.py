"""A Bayesian linear Bradley-Terry head on frozen features: a reward model that learns from a few noisy votes.

A response's reward is w . f(response), f its features (train.reward.features), and a vote for a over b
is right with its row's confidence c (from the annotators' measured flip rate), so its likelihood
is c sigmoid(m) + (1 - c) sigmoid(-m), m = w . (f(a) - f(b)) (CrowdBT, train.reward.votes.label_noise_loss).
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

import json
import math
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch

from train.common.config import ModelConfig, RewardModelConfig
from train.common.errors import ModelError
from train.common.files import built_beside
from train.common.models import load_model
from train.common.snapshot import Messages, PreferenceRow
from train.reward.encoding import encode_pairs
from train.reward.features import FeatureCache, FeatureSpec, cached_features, layer_indices, response_features
from train.reward.layout import HEAD_FILE, METRICS_FILE, NORMALIZATION_FILE, RewardAdapter, read_normalization
from train.reward.scores import Normalization, PairwiseResult, RewardModel, normalization_of, pairwise_result
from train.reward.votes import label_noise_loss
from train.runtime import distributed

PRIORS = ("evidence", "cv")
POSTERIORS = ("laplace", "bootstrap")
CV_ALPHAS = torch.logspace(-2, 8, 21, dtype=torch.float64).tolist()  # prior precisions cross-validation tries
CV_FOLDS = 5
EVIDENCE_CAP = 1e12  # the largest prior precision the evidence may choose: there the votes showed no signal


@dataclass(frozen=True)
class Head:
    """K linear heads on raw features: raw scores = features @ weight.T + bias."""

    weight: torch.Tensor  # (K, D)
    bias: torch.Tensor  # (K,)
    alpha: float  # the prior precision the fit chose, on standardised features

    def raw_scores(self, features: torch.Tensor) -> torch.Tensor:
        """(N, D) features to (N, K) raw head scores."""
        return features.to(self.weight) @ self.weight.T + self.bias


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
        return float((counts * label_noise_loss(z @ w, confidence)).sum() + 0.5 * alpha * w @ w)

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


def evidence_alpha(x: torch.Tensor, iterations: int = 500, largest: float = EVIDENCE_CAP) -> float:
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
    """The prior precision of CV_ALPHAS whose fits have the best likelihood of the votes on prompts they left out. Each
    fold's fits run from the strongest prior to the weakest, each starting where the one before ended."""
    folds = torch.tensor([g % CV_FOLDS for g in groups])
    held_out = dict.fromkeys(CV_ALPHAS, 0.0)
    for fold in folds.unique().tolist():
        train, w = folds != fold, None
        for alpha in sorted(CV_ALPHAS, reverse=True):
            w, _ = map_fit(z[train], confidence[train], alpha, start=w)
            held_out[alpha] -= float(label_noise_loss(z[~train] @ w, confidence[~train]).sum())
    return max(CV_ALPHAS, key=held_out.get)


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


# The saved model


@dataclass
class HeadRewardModel(RewardModel):
    """A head on features, ready to score: `model` is the base causal LM whose features it reads."""

    head: Head | None = None
    spec: FeatureSpec | None = None

    def features(self, prompts: list[Messages | str], responses: list[str], batch_size: int,
                 on_scored: Callable[[int], None] | None = None) -> torch.Tensor:
        return response_features(self.model, self.tokenizer, prompts, responses, self.spec, batch_size, on_scored)

    def raw_scores(self, prompts: list[Messages | str], responses: list[str], batch_size: int = 16) -> list[list[float]]:
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
        return self.head.raw_scores(self.features(prompts, responses, batch_size)).tolist() if prompts else []

    def pairwise_accuracy(self, rows: list[PreferenceRow], batch_size: int = 16,
                          on_scored: Callable[[int], None] | None = None) -> PairwiseResult:
        if not rows:
            return pairwise_result(torch.empty(0, 0), torch.empty(0, 0), self.normalization, 0)
        prompts = [row.prompt for row in rows]
        raw = self.head.raw_scores(self.features(prompts * 2, [r.chosen for r in rows] + [r.rejected for r in rows], batch_size, on_scored))
        truncated = encode_pairs(self.tokenizer, rows, self.max_length).truncated
        return pairwise_result(raw[: len(rows)], raw[len(rows) :], self.normalization, truncated)


def save_head(head: Head, spec: FeatureSpec, normalization: Normalization, metrics: dict[str, Any], config: RewardModelConfig,
              out_dir: Path) -> None:
    """The heads' weights, normalisation and metrics (the config and the features' spec among them), put in place whole."""
    from safetensors.torch import save_file

    with built_beside(out_dir) as built:
        built.mkdir()
        save_file({"weight": head.weight.contiguous(), "bias": head.bias.contiguous()}, str(built / HEAD_FILE))
        (built / NORMALIZATION_FILE).write_text(json.dumps(asdict(normalization), indent=2) + "\n")
        (built / METRICS_FILE).write_text(json.dumps({**metrics, "config": asdict(config), "features": asdict(spec)}, indent=2) + "\n")


def read_head(model_dir: Path) -> tuple[Head, FeatureSpec]:
    """A saved head and where it reads the base."""
    from safetensors.torch import load_file

    weights = load_file(str(Path(model_dir) / HEAD_FILE))
    saved = json.loads((Path(model_dir) / METRICS_FILE).read_text())
    spec = saved["features"]
    return Head(weights["weight"], weights["bias"], saved["alpha"]), FeatureSpec(tuple(spec["layers"]), spec["pooling"], spec["max_length"])


def read_head_adapter(model_dir: Path) -> RewardAdapter:
    """A saved head taken apart, for a policy's base that reads its features with every adapter off."""
    head, spec = read_head(model_dir)
    return RewardAdapter(Path(model_dir), None, {}, head.weight, read_normalization(model_dir), spec.max_length, head.bias, spec)


def load_head_model(model_path: str, model_dir: Path, base: ModelConfig) -> HeadRewardModel:
    """A saved head on the base model at model_path, loaded as `base` says, in eval mode."""
    model, tokenizer = load_model(replace(base, name_or_path=model_path))
    head, spec = read_head(model_dir)
    head = Head(head.weight.to(next(model.parameters()).device), head.bias.to(next(model.parameters()).device), head.alpha)
    return HeadRewardModel(model, tokenizer, read_normalization(model_dir), spec.max_length, head, spec)


# The whole run


@dataclass(frozen=True)
class Previous:
    """The newest head before this one, to measure on the votes it never saw."""

    model_dir: Path
    version: int
    new_rows: list[PreferenceRow]


def train_head_model(
    model_path: str, train_rows: list[PreferenceRow], eval_rows: list[PreferenceRow], config: RewardModelConfig, out_dir: Path,
    base: ModelConfig, cache_root: Path | None = None, previous: Previous | None = None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Fit the heads on the training rows' features, evaluate them on eval_rows', and save them to out_dir; their metrics.

    Each answer's features are read once from the base model loaded as `base` says (float32 on the CPU when not
    given) and cached under cache_root. Given `previous`, that head is measured first on the votes it never saw.
    """
    if not train_rows:
        raise ModelError("no preference pairs to train on")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ModelError(f"{out_dir} already exists and is not empty")
    started = time.perf_counter()
    model, tokenizer = load_model(replace(base, name_or_path=model_path))
    spec = FeatureSpec(layer_indices(tuple(config.feature_layers), model.config.num_hidden_layers), "mean", config.max_length)
    reading = {"model": base.name_or_path, "dtype": base.dtype, "quantization": base.quantization, **asdict(spec)}
    earlier = read_head(previous.model_dir) if previous is not None else None
    measured = previous.new_rows if earlier is not None and earlier[1] == spec else []
    rows = train_rows + eval_rows + measured
    prompts = [row.prompt for row in rows] * 2
    texts = [row.chosen for row in rows] + [row.rejected for row in rows]
    done = 0

    def progress(count: int) -> None:  # answers read so far, of at most every one asked for; the rest are cached
        nonlocal done
        done += count
        if on_progress is not None:
            on_progress({"step": done, "total_steps": len(texts)})

    cache = FeatureCache(cache_root if distributed.is_main() else None, reading)  # one process caches what all read
    features, computed, cached = cached_features(model, tokenizer, prompts, texts, spec, config.batch_size * 2, cache, uuid.uuid4().hex, progress)
    progress(len(texts) - done)
    feature_seconds = time.perf_counter() - started  # the base's load included
    chosen, rejected = features[: len(rows)], features[len(rows) :]  # (N, D) each
    ends = [len(train_rows), len(train_rows) + len(eval_rows), len(rows)]
    train, held, new = slice(0, ends[0]), slice(ends[0], ends[1]), slice(ends[1], ends[2])
    fit_started = time.perf_counter()
    confidence = torch.tensor([row.confidence for row in train_rows])
    prompt_numbers: dict[str, int] = {}
    groups = [prompt_numbers.setdefault(json.dumps(row.prompt, sort_keys=True), len(prompt_numbers)) for row in train_rows]
    head = fit_head(chosen[train], rejected[train], confidence, groups, config.heads, seed=config.seed)
    fit_seconds = time.perf_counter() - fit_started
    normalization = normalization_of(head.raw_scores(torch.cat([chosen[train], rejected[train]])).tolist())
    held_out = pairwise_result(head.raw_scores(chosen[held]), head.raw_scores(rejected[held]), normalization, 0)
    new_votes, measured_from = None, None
    if measured:
        old = earlier[0]
        new_votes = pairwise_result(old.raw_scores(chosen[new]), old.raw_scores(rejected[new]), read_normalization(previous.model_dir), 0)
        measured_from = previous.version
    elif previous is not None and not previous.new_rows:  # fitted again on the same votes: the earlier record stands
        record = json.loads((previous.model_dir / METRICS_FILE).read_text())
        new_votes = PairwiseResult(record.get("new_votes_accuracy"), None, None, None, record.get("new_votes_pairs") or 0, 0)
        measured_from = record.get("new_votes_from")
    margins = (head.raw_scores(chosen[train]) - head.raw_scores(rejected[train])).mean(dim=1).double()
    metrics = {
        "kind": "head",
        "train_loss": float(label_noise_loss(margins, confidence.double()).mean()),
        "eval_accuracy": held_out.accuracy,
        "eval_mean_margin": held_out.mean_margin,
        "eval_loss": held_out.loss,
        "eval_calibration_error": held_out.calibration_error,
        "heads": config.heads,
        "alpha": head.alpha,
        "label_confidence": float(confidence.mean()),  # the mean probability that a training label is right
        "reward_mean": normalization.mean,
        "reward_std": normalization.std,
        "pairs_train": len(train_rows),
        "pairs_eval": len(eval_rows),
        "features_read": computed,
        "features_cached": cached,
        "feature_seconds": feature_seconds,
        "train_seconds": fit_seconds,
        "pairs_per_second": len(train_rows) / max(fit_seconds, 1e-9),
        "new_votes_from": measured_from,
        "new_votes_accuracy": new_votes.accuracy if new_votes else None,  # the previous version's, before this run fitted
        "new_votes_pairs": new_votes.pairs if new_votes else None,
    }
    metrics["seconds"] = time.perf_counter() - started
    if distributed.is_main():
        save_head(head, spec, normalization, metrics, config, out_dir)
    return metrics
