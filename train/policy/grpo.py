"""GRPO on the policy's LoRA adapter with TRL's GRPOTrainer, scored by the project's reward model.

GRPO (Shao et al. 2024, DeepSeekMath) samples a group of responses to each prompt and takes the
group's mean reward as each response's baseline: no value model. The reward is the Bradley-Terry
reward model's normalised score, less the missing-EOS and length penalties, as PPO scores its
responses. The KL to the starting model (the base with every adapter off) stays in the loss.
As in PPO, one base carries every adapter: the policy's (TRL's `default`) and the reward model's
(`reward`, frozen, with its heads beside), so a GRPO job holds one copy of the base weights,
quantised or not, and the reference costs none.
"""

import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable

from accelerate.utils import set_seed
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from train.common.config import GRPOConfig, data_seed
from train.common.errors import ModelError
from train.common.models import prepare_for_training
from train.policy.adapters import StepFn, StepLog, policy_lora, save_adapter, train_from, trainer_settings
from train.policy.generate import Messages, lora_folded
from train.policy.ppo import RewardScorer, frozen_head, load_adapter_weights, shared_reward_scores
from train.reward.layout import RewardAdapter
from train.runtime import distributed
from train.runtime.batching import in_batches

# What GRPOTrainer logs over a step (one batch of groups and its updates), under the names Tether
# stores, which are PPO's where PPO has the same statistic. TRL's KL is the mean per token, where
# PPO's "kl" is per response.
METRICS = {
    "reward": "score",
    "reward_std": "score_std",
    "kl": "kl_per_token",
    "completions/mean_length": "response_length",
    "clip_ratio/region_mean": "clip_ratio",
    "entropy": "entropy",
}


class _StepLog(StepLog):
    def stats(self, logs: dict[str, float]) -> dict[str, float]:
        return super().stats(logs) | {"finished": 1 - float(logs["completions/clipped_ratio"])}


ScoreFn = Callable[[list[Messages], list[str]], tuple[list[float], list[float]]]


def penalised_scores(score: ScoreFn, config: GRPOConfig, eos_token_id: int) -> Callable[..., list[float]]:
    """The reward function GRPOTrainer calls: the reward model's reward of each response (score gives it and its
    heads' spread), less uncertainty_penalty times that spread, missing_eos_penalty where it did not end and
    length_penalty per token, as PPO scores."""

    def scores(prompts: list[Messages], completions: list[Messages], completion_ids: list[list[int]], **kwargs) -> list[float]:
        texts = [completion[-1]["content"] for completion in completions]
        rewards, uncertainties = score(prompts, texts)
        return [
            reward - config.uncertainty_penalty * spread - config.missing_eos_penalty * (eos_token_id not in ids)
            - config.length_penalty * len(ids)
            for reward, spread, ids in zip(rewards, uncertainties, completion_ids)
        ]

    scores.__name__ = "reward_model"  # TRL logs each reward function under its name
    return scores


class SharedReward:
    """The reward model as the `reward` adapter and a frozen head on the policy's own base model, or a head on that
    base's features: scores as `tether rm score` scores, without a second copy of the base."""

    def __init__(self, reward: RewardAdapter, tokenizer: PreTrainedTokenizerBase):
        self.reward = reward
        self.scorer = RewardScorer(tokenizer, reward.normalization, reward.max_length, reward.features)
        self.peft_model = self.head = None

    def attach(self, peft_model) -> None:
        """Add the reward adapter, frozen, beside the policy's (the active one, which stays active); a head on features
        needs none."""
        if self.reward.lora is not None:
            peft_model.add_adapter("reward", replace(self.reward.lora, lora_dropout=0.0, inference_mode=True))
            load_adapter_weights(peft_model, self.reward.lora_weights, "reward", self.reward.path)
            for name, parameter in peft_model.named_parameters():
                if ".reward." in name:
                    parameter.requires_grad_(False)
        self.peft_model, self.head = peft_model, frozen_head(self.reward, next(peft_model.parameters()).device)

    def score(self, prompts: list[Messages], texts: list[str]) -> tuple[list[float], list[float]]:
        """Each text's reward and its heads' spread, in one batch unless it runs out of GPU memory."""
        policy = self.peft_model.active_adapter

        def run(rows: list[int]) -> list[tuple[float, float]]:
            rewards, spreads = shared_reward_scores(self.peft_model, self.head, self.scorer, [prompts[i] for i in rows],
                                                    [texts[i] for i in rows], back_to=policy)
            return list(zip(rewards.tolist(), spreads.tolist()))

        scored = in_batches(list(range(len(texts))), len(texts), run, "reward scoring")
        return [r for r, _ in scored], [s for _, s in scored]


def train_grpo(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[Messages],
    reward: RewardAdapter,
    config: GRPOConfig,
    out_dir: Path,
    policy_dir: Path | None = None,
    on_step: StepFn | None = None,
    on_cpu: bool = False,
) -> dict[str, Any]:
    """Train the policy adapter on groups of responses to `prompts`, scored by `reward`; save it to out_dir
    as a plain PEFT adapter. Returns each step's metrics.

    model is the base causal LM, without adapters (train.common.models.load_model gives it); reward is the
    saved reward model taken apart (train.reward.versions.read_reward_adapter), to ride on the same base.
    """
    from datasets import Dataset
    from trl import GRPOConfig as TRLGRPOConfig
    from trl import GRPOTrainer

    processes = distributed.world_size()
    group_batch = config.prompts_per_step * config.group_size
    if group_batch % (processes * config.minibatches):
        raise ModelError(f"[grpo] prompts_per_step * group_size = {group_batch} responses do not split into {config.minibatches} "
                         f"minibatches on each of {processes} processes")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ModelError(f"{out_dir} already exists and is not empty")
    if not prompts:
        raise ModelError("no prompts to train on")
    if config.max_new_tokens is None:  # the job resolves it from [generation]
        raise ModelError("[grpo] max_new_tokens must be set to train")
    model = prepare_for_training(model)  # a quantised base as PPO and the reward model have it (PEFT's k-bit recipe)
    lora = policy_lora(policy_dir, config.lora_r, config.lora_alpha)
    updates_per_step = config.minibatches * config.epochs
    log = _StepLog(on_step, METRICS, updates_per_step)
    with tempfile.TemporaryDirectory(prefix="tether-grpo-") as scratch:  # the Trainer wants an output_dir; nothing is kept
        args = TRLGRPOConfig(
            **trainer_settings(scratch, config.seed, data_seed(config), config.precision, on_cpu),
            beta=config.beta,
            num_generations=config.group_size,
            per_device_train_batch_size=group_batch // config.minibatches // processes,
            steps_per_generation=config.minibatches,  # a step's groups, sampled once, are cut into minibatches
            num_iterations=config.epochs,
            max_steps=config.steps * updates_per_step,
            learning_rate=config.learning_rate,
            lr_scheduler_type="constant",
            epsilon=config.clip_range,
            scale_rewards=config.scale_rewards,
            temperature=config.temperature,
            top_p=1.0,
            max_completion_length=config.max_new_tokens,
            logging_steps=updates_per_step,  # one log per step: its groups' rewards, its updates' KL and clipping
        )
        # TRL draws a step's prompts from the dataset without repeats and passes over it again for
        # later steps, each time in a new order; with fewer prompts than a step takes, it would draw
        # none. Those are repeated then, and a step may answer a prompt in two groups.
        copies = -(-config.prompts_per_step // len(prompts))
        dataset = Dataset.from_list([{"prompt": p} for p in prompts * copies])
        shared = SharedReward(reward, tokenizer)

        class FoldedGRPOTrainer(GRPOTrainer):
            """TRL's GRPO, sampling its groups with the policy's LoRA folded into the base, as every job samples."""

            def _generate_single_turn(self, *args, **kwargs):
                with lora_folded(self.model):
                    return super()._generate_single_turn(*args, **kwargs)

        # TRL samples with compilation off (disable_compile), and a static cache is no faster uncompiled.
        model.generation_config.cache_implementation = None
        trainer = FoldedGRPOTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer, peft_config=lora,
                              reward_funcs=penalised_scores(shared.score, config, tokenizer.eos_token_id), callbacks=[log])
        shared.attach(trainer.model)  # the PeftModel TRL made on the base: the policy's adapter is its `default`
        # TRL initialised the adapter under args.seed, and would draw the groups and samples under it too.
        trainer.args.seed = args.data_seed
        set_seed(args.data_seed, device_specific=True)  # as TRL seeds each process its own samples
        train_from(trainer, policy_dir)
    if distributed.is_main():
        save_adapter(trainer, out_dir, "grpo_config.json", asdict(config))
    return {"steps": log.steps}
