"""A round and its reward model in words, for the Loop view, `tether rounds` and the progress bars."""

from annotate.ratings import wilson_interval
from store.reward_models import RewardModel
from train.common.config import RewardModelConfig

JOB_NAMES = {"reward_model": "reward model", "ppo": "PPO", "dpo": "DPO", "grpo": "GRPO", "predict": "predictor", "generate": "completions"}

KIND_NAMES = {"head": "a head on the base's frozen features", "lora": "a LoRA reward model"}


def scoring_kind(reward_model: RewardModel) -> str:
    """Which reward model scores for a version, and why, in words."""
    kind = reward_model.metrics.get("kind", "lora")  # versions before heads were all LoRA models
    if kind == "auto":
        return f"{KIND_NAMES[reward_model.metrics['steering']]} (kind \"auto\": {reward_model.metrics['steering_why']})"
    return f"{KIND_NAMES[kind]} (kind \"{kind}\")"


def trust_status(reward_model: RewardModel, config: RewardModelConfig) -> str:
    """Whether the version steers the loop ([reward_model] trust), and why, in words."""
    if config.trust == "always":
        return 'it steers the loop: [reward_model] trust = "always"'
    accuracy, pairs = reward_model.metrics.get("new_votes_accuracy"), reward_model.metrics.get("new_votes_pairs")
    if accuracy is None or not pairs:
        return "it does not steer the loop yet: no earlier version has been measured on votes it never saw"
    low = wilson_interval(accuracy, pairs)[0]
    measured = f"v{reward_model.metrics.get('new_votes_from')} agreed with {accuracy:.0%} of {pairs} votes it never saw (95% lower bound {low:.0%})"
    return f"it steers the loop: {measured}" if low > 0.5 else f"it does not steer the loop yet: {measured}, not above 50%"
