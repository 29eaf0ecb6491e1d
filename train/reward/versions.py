"""A reward-model version of either kind ([reward_model] kind), through one face: fit it, load it to score, or take
it apart for a policy's base.

Callers use these and train.reward.scores.RewardModel; neither kind (train.reward.lora, train.reward.head)
imports the other, and only this module knows both.
"""

import json
from pathlib import Path
from typing import Any, Callable

from train.common.config import ModelConfig, RewardModelConfig
from train.common.files import built_beside
from train.common.snapshot import RankingRow
from train.reward.head import Previous, load_head_model, read_head_adapter, train_head_model
from train.reward.layout import STEERING_FILE, RewardAdapter, is_head, steering_dir
from train.reward.lora import ProgressFn, load_lora, plan_warm_start, read_lora_adapter, train_reward_model
from train.reward.scores import RewardModel
from train.reward.votes import Row, as_pairs
from train.runtime.job_configs import PreviousRewardModel


def fit_reward_model(
    model_path: str, base: ModelConfig, reward: RewardModelConfig, train_rows: list[Row], eval_rows: list[Row], out: Path,
    warm_start: PreviousRewardModel | None = None, previous: PreviousRewardModel | None = None, features_cache: Path | None = None,
    on_progress: ProgressFn | None = None,
) -> dict[str, Any]:
    """Fit a reward model of reward.kind on the base at model_path, loaded as `base` says, and save it to `out`; its
    metrics. Kind "auto" fits both, in out/head and out/lora, and out/steering.json names the one that steers.

    With warm_start the LoRA model continues from that version on the pairs and rankings it has not seen plus a replay
    sample; without, it starts from scratch. With previous the head first measures that version's head on the votes it never saw. Each update to
    on_progress carries "progress", the share of the whole fit done.
    """
    if reward.kind == "head":
        return _fit_head(model_path, base, reward, train_rows, eval_rows, out, previous, features_cache, _part(on_progress, 0, 1))
    if reward.kind == "lora":
        return _fit_lora(model_path, base, reward, train_rows, eval_rows, out, warm_start, _part(on_progress, 0, 1))
    with built_beside(out) as built:
        head = _fit_head(model_path, base, reward, train_rows, eval_rows, built / "head", previous, features_cache,
                         _part(on_progress, 0, 0.1))
        lora = _fit_lora(model_path, base, reward, train_rows, eval_rows, built / "lora", warm_start, _part(on_progress, 0.1, 1))
        steering, why = choose_steering(head, lora)
        (built / STEERING_FILE).write_text(json.dumps({"kind": steering, "why": why}) + "\n")
    return {**(head if steering == "head" else lora), "kind": "auto", "steering": steering, "steering_why": why,
            **{f"{kind}_{name}": m.get(name) for kind, m in (("head", head), ("lora", lora))
               for name in ("eval_accuracy", "pairs_eval", "new_votes_accuracy", "new_votes_pairs", "seconds")}}


def _part(on_progress: ProgressFn | None, start: float, end: float) -> ProgressFn:
    """Progress of a part of the fit that runs from `start` to `end` of the whole."""
    def progress(update: dict[str, Any]) -> None:
        if on_progress is not None:
            on_progress({**update, "progress": start + (end - start) * update["step"] / update["total_steps"]})

    return progress


def _is_new(seen: PreviousRewardModel) -> Callable[[Row], bool]:
    """Whether a row is one of the pairs and rankings a version never saw."""
    new_pair_ids, new_ranking_ids = set(seen.new_pair_ids), set(seen.new_ranking_ids)
    return lambda row: row.ranking_id in new_ranking_ids if isinstance(row, RankingRow) else row.pair_id in new_pair_ids


def _fit_lora(model_path: str, base: ModelConfig, reward: RewardModelConfig, train_rows: list[Row], eval_rows: list[Row],
              out: Path, warm_start: PreviousRewardModel | None, progress: ProgressFn) -> dict[str, Any]:
    plan = None
    if warm_start:
        plan = plan_warm_start(Path(warm_start.adapter_path), warm_start.version, train_rows, eval_rows, _is_new(warm_start),
                               reward.replay, reward.seed)
    return {"kind": "lora"} | train_reward_model(model_path, train_rows, eval_rows, reward, out, progress, plan, base)


def _fit_head(model_path: str, base: ModelConfig, reward: RewardModelConfig, train_rows: list[Row], eval_rows: list[Row],
              out: Path, previous: PreviousRewardModel | None, features_cache: Path | None, progress: ProgressFn) -> dict[str, Any]:
    """The head fits pairs: a ranking is fitted as the pairs of its answers that are not tied."""
    before = None
    if previous:
        is_new = _is_new(previous)
        new = [row for row in train_rows + eval_rows if is_new(row)]
        before = Previous(Path(previous.adapter_path), previous.version, as_pairs(new))
    return train_head_model(model_path, as_pairs(train_rows), as_pairs(eval_rows), reward, out, base, features_cache, before,
                            progress)


def load_reward_model(model_path: str, version_dir: Path, base: ModelConfig | None = None) -> RewardModel:
    """A saved reward model, in eval mode, on the base model at model_path loaded as `base` says and on its device
    (float32 on the CPU when not given): the one that steers, for a version of both kinds."""
    base = base or ModelConfig(device="cpu")
    model_dir = steering_dir(version_dir)
    return load_head_model(model_path, model_dir, base) if is_head(model_dir) else load_lora(model_path, model_dir, base)


def read_reward_adapter(version_dir: Path) -> RewardAdapter:
    """A saved reward model taken apart, for a causal LM that carries its adapter beside others (PPO's, GRPO's)."""
    model_dir = steering_dir(version_dir)
    return read_head_adapter(model_dir) if is_head(model_dir) else read_lora_adapter(model_dir)


def choose_steering(head: dict[str, Any], lora: dict[str, Any]) -> tuple[str, str]:
    """Which of a version's two reward models steers, from their metrics, and why, in words: the one more accurate on
    the held-out prompts' votes, which neither trained on; the head where they tie or none are held out, as it is the
    one that learns from few votes."""
    if not head.get("pairs_eval") or head["eval_accuracy"] is None or lora["eval_accuracy"] is None:
        return "head", "no held-out votes to compare the two on yet: the head, which learns from fewer votes"
    figures = f"{head['eval_accuracy']:.1%} for the head and {lora['eval_accuracy']:.1%} for the LoRA model on {head['pairs_eval']} held-out votes"
    if lora["eval_accuracy"] > head["eval_accuracy"]:
        return "lora", f"the LoRA model predicts votes it never saw better: {figures}"
    return "head", f"the head predicts votes it never saw {'as well' if lora['eval_accuracy'] == head['eval_accuracy'] else 'better'}: {figures}"
