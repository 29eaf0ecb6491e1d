"""PPO on a LoRA policy, held near the version it starts from and within a KL budget of the starting model.

After InstructGPT (Ouyang et al. 2022) and "The N implementation details of RLHF with PPO"
(Huang et al. 2024). One base model holds the LoRA adapters (PEFT named adapters) and two scalar heads:
- `policy`, the adapter PPO trains, with the base's own language-model head;
- the value: a scalar head on the policy's last hidden states, started at zero and trained on
  detached states, so that it learns the returns without moving the policy, in the policy's own
  forward pass (`build` says why);
- `reward`, the reward model's adapter and head, frozen; or a head alone on the base's features;
- `start`, when PPO continues a policy version: that version, frozen, the KL penalty's reference.
The starting model v0 is the base with the adapters disabled, so no reference costs a second base.

Each step, in the order `ppo_step` runs it:
1. rollout: sample one response per prompt from the policy at `temperature`, from exactly the
   distribution the loss scores (train.common.models.load_model drops the model's own sampling defaults);
2. evaluate: the policy's log-probs and values, the reference's log-probs, and the reward model's
   reward of each response's text (the mean of its heads' normalised scores), scored as `tether
   rm score` scores it, minus uncertainty_penalty times the heads' spread and the missing-EOS and
   length penalties;
3. rewards: -beta * (log pi - log pi_start) on every response token, pi_start the version the run
   started from (v0 in the first round), plus the score on the last. A penalty to v0 would pull a
   policy that an earlier round (DPO's, say) moved past target_kl back towards v0 and undo that
   round: replaying one such PPO round on the default model gave 59.4% over v0 tethered to v0 and
   69.0% tethered to its start, from a start at 71.1% (scripts/BENCHMARKS.md);
4. advantages: GAE (gamma, lambda), whitened over the batch's response tokens;
5. update: `epochs` passes over minibatches of the clipped policy loss and vf_coef times the
   clipped value loss, the policy's gradient and the value head's each clipped on its own;
6. beta moves so that the KL to the run's start goes towards `target_kl` (Ziegler et al. 2019),
   unless target_kl is 0; it is saved with the policy, so the next round's PPO goes on from it.
   The KL to v0, which adds up over the rounds, is not checked here: the round's predictor measures
   every candidate's, PPO's as DPO's, on held-back prompts at the project's sampling, against
   [round] kl_budget. Checked on a step's 8 responses to training prompts at PPO's temperature, it
   read 20 nats on a policy the predictor put at 12, and stopped runs before their first update
   (scripts/BENCHMARKS.md).

Under accelerate launch each process samples and evaluates its share of the batch's prompts;
the whitening, the KL that steers beta and the statistics are taken over the whole batch, and each
minibatch's gradients are averaged over the processes before the optimiser step (DDP's
all-reduce), so every process keeps the same weights. batch_size and minibatch_size stay global.

Tensors are (B, R) over response tokens unless named otherwise: B responses, R the longest.
"""

import json
import random
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from train.common.config import PPOConfig, data_seed
from train.common.errors import ModelError
from train.common.files import built_beside
from train.common.models import checkpoint_in_eval_mode, prepare_for_training
from train.policy.generate import end_of_turn_ids, lora_folded, sampling, selective_log_softmax
from train.reward.encoding import encode, pad_right
from train.reward.features import FeatureSpec, pool
from train.reward.layout import RewardAdapter
from train.reward.scores import Normalization, reward_and_uncertainty
from train.reward.versions import read_reward_adapter
from train.runtime import distributed
from train.runtime.batching import in_batches
from train.runtime.hardware import uses_bf16

Messages = list[dict[str, str]]
StepFn = Callable[[dict[str, Any]], None]


@dataclass
class Rollout:
    """One batch of sampled responses and everything PPO computed on it before the update."""

    query_ids: torch.Tensor  # (B, P) prompts, left-padded
    query_mask: torch.Tensor  # (B, P)
    response_ids: torch.Tensor  # (B, R) pad after the end
    response_mask: torch.Tensor  # (B, R) 1 on response tokens, the closing EOS included
    logprobs: torch.Tensor  # (B, R) log pi(token) at the sampling temperature
    ref_logprobs: torch.Tensor  # (B, R) the same under the reference, the starting model v0
    start_logprobs: torch.Tensor  # (B, R) the same under the version this run started from; the reference's from v0
    values: torch.Tensor  # (B, R) V(state before each token)
    scores: torch.Tensor  # (B,) normalised reward-model score, penalties applied
    finished: torch.Tensor  # (B,) bool: ended with EOS
    texts: list[str]  # each response decoded as annotators see it, as the reward model scored it
    rewards: torch.Tensor | None = None  # (B, R) per-token reward, filled by add_rewards
    advantages: torch.Tensor | None = None  # (B, R)
    returns: torch.Tensor | None = None  # (B, R)


class PolicyWithHeads(nn.Module):
    """The base model with the policy's adapter (and the reward model's, for a LoRA reward model), the value head and the
    reward model's head."""

    def __init__(self, peft_model, value_head: nn.Linear, reward_head: nn.Linear):
        super().__init__()
        self.peft_model = peft_model
        self.value_head = value_head
        self.reward_head = reward_head

    @property
    def backbone(self) -> nn.Module:
        """The transformer without its LM head; LoRA layers inside it follow the active adapter."""
        return self.peft_model.get_base_model().base_model

    def forward(self, input_ids, attention_mask, keep: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, keep, V) next-token logits and (B, keep, H) last hidden states at the last `keep` positions, under the
        active adapter: the causal LM's forward pass, with the states it reads its logits from."""
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask),
                               use_cache=False).last_hidden_state[:, -keep:]
        return self.peft_model.get_output_embeddings()(hidden), hidden


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding: a left-padded sequence sees the positions it would unpadded."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


# Building the model


def build(model: PreTrainedModel, reward: RewardAdapter, config: PPOConfig, policy_dir: Path | None = None) -> PolicyWithHeads:
    """Put the adapters and two heads on `model`, a causal LM; `reward` is the saved reward model, read_reward_adapter's.

    The policy starts from policy_dir when given (PPO continues a policy version), else fresh
    (its LoRA B is zero, so it starts equal to the reference).

    The value head reads the policy's last hidden states, detached, in the policy's own forward
    pass. InstructGPT gives the value a model of its own, started from the reward model; here that
    was a value adapter, which cost a second forward and backward pass through the base in every
    minibatch of the update and one more in every step's evaluation: without it the update took
    0.51x the time on the default model. With GAE's lambda at 1 the value is only a baseline, which
    changes the gradient's variance but not its mean, and over a round's ten steps on the default
    model neither value explained any of the returns' variance: -0.09 with the adapter, -0.14 with
    this head, within the steps' spread (probe_value.py, retired; scripts/BENCHMARKS.md). The head
    starts at zero: a copy of the reward model's head would read partial responses, which that head
    never saw in training: on the default model its values were off by about 2.8 normalised units
    (RMS) in the first step's update and 1.7 in the tenth's, so they added more noise to the
    advantages than they took out. V = 0, the mean of the normalised score, is the constant
    baseline it learns from.
    """
    from peft import LoraConfig, PeftModel, get_peft_model

    device = next(model.parameters()).device
    if device.type == "cpu":
        # On a CPU, SDPA's attention backward costs about five times its forward; at PPO's
        # lengths (a prompt and a short response) eager attention is the faster of the two.
        model.set_attn_implementation("eager")
    checkpointing = config.checkpointing(getattr(model, "is_quantized", False))
    model = prepare_for_training(model, checkpointing)
    if policy_dir is not None:
        peft_model = PeftModel.from_pretrained(model, str(policy_dir), adapter_name="policy", is_trainable=True)
        peft_model.load_adapter(str(policy_dir), adapter_name="start", is_trainable=False)
    else:
        torch.manual_seed(config.seed)
        target_modules = reward.lora.target_modules if reward.lora is not None else "all-linear"
        policy_config = LoraConfig(task_type="CAUSAL_LM", r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=0.0,
                                   target_modules=target_modules)
        peft_model = get_peft_model(model, policy_config, adapter_name="policy")
    if reward.lora is not None:
        peft_model.add_adapter("reward", replace(reward.lora, lora_dropout=0.0, inference_mode=False))
        load_adapter_weights(peft_model, reward.lora_weights, "reward", reward.path)
    # The heads stay float32 whatever the base's dtype and read float32 copies of its hidden
    # states, as PEFT keeps output layers for k-bit training: a bf16 value head would round away
    # its small updates, and a bf16 or fp16 base's states must meet the head in one dtype.
    reward_head = frozen_head(reward, device)
    value_head = nn.Linear(model.get_input_embeddings().embedding_dim, 1, bias=True, dtype=torch.float32, device=device)
    nn.init.zeros_(value_head.weight)
    nn.init.zeros_(value_head.bias)
    peft_model.set_adapter("policy")
    # The base is on its device already; moving the whole would fail on a quantised one.
    policy = PolicyWithHeads(peft_model, value_head, reward_head).eval()
    if checkpointing:
        checkpoint_in_eval_mode(model)
    return policy


def frozen_head(reward: RewardAdapter, device: torch.device) -> nn.Linear:
    """The reward model's K heads as one frozen float32 linear layer on `device`."""
    heads, width = reward.head.shape  # (K, H), or (K, D) on features
    head = nn.Linear(width, heads, bias=reward.bias is not None, dtype=torch.float32, device=device)
    head.weight.data.copy_(reward.head)
    if reward.bias is not None:
        head.bias.data.copy_(reward.bias)
    return head.requires_grad_(False)


def load_adapter_weights(peft_model, lora_weights: dict[str, torch.Tensor], name: str, source: Path) -> None:
    """Load LoRA weights into adapter `name`, or fail: PEFT reports a mismatch but loads what it can,
    which would leave the adapter's LoRA at its initial values without a word."""
    from peft import set_peft_model_state_dict

    loaded = set_peft_model_state_dict(peft_model, lora_weights, adapter_name=name)
    missing = [k for k in loaded.missing_keys if "lora_" in k and f".{name}." in k]
    if loaded.unexpected_keys or missing:
        unmatched = (loaded.unexpected_keys or missing)[0]
        raise ModelError(
            f"{source} does not fit this model: {len(loaded.unexpected_keys)} of its LoRA weights match no layer and "
            f"{len(missing)} layers get none (for example {unmatched}); was it trained on another base model?"
        )


# 1. Rollout


def sampling_settings(config: PPOConfig, tokenizer, eos_ids: set[int]) -> dict[str, Any]:
    """generate()'s arguments for PPO's samples: plain sampling at the temperature the loss divides by.

    top_k=0 and top_p=1, so the sample comes from exactly the distribution the loss scores.
    """
    return {**sampling(config.temperature, top_p=1.0, top_k=0),
            "max_new_tokens": config.max_new_tokens, "pad_token_id": tokenizer.pad_token_id, "eos_token_id": sorted(eos_ids)}


@torch.no_grad()
def sample(model: PolicyWithHeads, tokenizer, prompts: list[Messages], config: PPOConfig, eos_ids: set[int]):
    """(query_ids, query_mask, response_ids, response_mask, finished) for one response per prompt."""
    encoded = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"] for m in prompts]
    query = tokenizer.pad({"input_ids": encoded}, padding=True, return_tensors="pt")  # left padding
    device = next(model.parameters()).device
    query_ids, query_mask = query["input_ids"].to(device), query["attention_mask"].to(device)
    model.peft_model.set_adapter("policy")
    settings = sampling_settings(config, tokenizer, eos_ids)

    def generate(rows: list[int]) -> list[torch.Tensor]:
        output = model.peft_model.generate(input_ids=query_ids[rows], attention_mask=query_mask[rows], **settings)
        return list(output[:, query_ids.shape[1] :])

    # In one batch unless it runs out of GPU memory; parts of it come back with their own widths.
    with lora_folded(model.peft_model):
        responses = in_batches(list(range(len(prompts))), len(prompts), generate, "PPO's rollouts")
    response_ids = nn.utils.rnn.pad_sequence(responses, batch_first=True, padding_value=tokenizer.pad_token_id)  # (B, R)
    is_eos = torch.isin(response_ids, torch.tensor(sorted(eos_ids), device=device))
    finished = is_eos.any(dim=1)
    # The response runs through its first EOS; generate pads after it, but the mask must not trust the pad id.
    first_eos = torch.where(finished, is_eos.float().argmax(dim=1), torch.full_like(finished, response_ids.shape[1], dtype=torch.long))
    lengths = torch.where(finished, first_eos + 1, first_eos)
    response_mask = (torch.arange(response_ids.shape[1], device=device)[None, :] < lengths[:, None]).long()
    response_ids = response_ids.masked_fill(response_mask == 0, tokenizer.pad_token_id)
    return query_ids, query_mask, response_ids, response_mask, finished


def response_texts(tokenizer, response_ids: torch.Tensor, response_mask: torch.Tensor, finished: torch.Tensor) -> list[str]:
    """Each response as annotators see it: decoded without its closing EOS, as generation stores completions."""
    lengths = response_mask.sum(dim=1) - finished.long()
    return [tokenizer.decode(ids[:n], skip_special_tokens=True) for ids, n in zip(response_ids.tolist(), lengths.tolist())]


# 2. Evaluate


def response_outputs(model: PolicyWithHeads, query_ids, query_mask, response_ids, response_mask,
                     temperature: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One forward pass under the active adapter: the log-probs (B, R) of the response tokens at the sampling
    temperature, the values (B, R) of the states before each of them, by the value head on those states detached, and
    the next-token logits (B, R, V)."""
    input_ids = torch.cat([query_ids, response_ids], dim=1)  # (B, P + R)
    attention_mask = torch.cat([query_mask, response_mask], dim=1)
    width = response_ids.shape[1]
    logits, hidden = model(input_ids, attention_mask, keep=width + 1)
    logits, hidden = logits[:, :-1], hidden[:, :-1]  # each position predicts the next token
    values = model.value_head(hidden.detach().float()).squeeze(-1).float()  # float again: autocast computes it in bf16
    return selective_log_softmax(logits, response_ids, temperature), values, logits


def response_logprobs(model: PolicyWithHeads, query_ids, query_mask, response_ids, response_mask, temperature: float) -> torch.Tensor:
    """The log-probs (B, R) of the response tokens under the active adapter, at the sampling temperature."""
    return response_outputs(model, query_ids, query_mask, response_ids, response_mask, temperature)[0]


def entropy_of(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) along the last dimension."""
    logprobs = logits.log_softmax(-1)
    return -(logprobs.exp() * logprobs).sum(-1)


@contextmanager
def adapter(model: PolicyWithHeads, name: str) -> Iterator[None]:
    """Adapter `name` active inside, the policy's again after."""
    model.peft_model.set_adapter(name)
    try:
        yield
    finally:
        model.peft_model.set_adapter("policy")


@dataclass(frozen=True)
class RewardScorer:
    """How the reward model reads a response: the tokenizer's chat template, its normalisation and its trained max_length,
    and for a head on features (train.reward.head), where it reads the base."""

    tokenizer: PreTrainedTokenizerBase
    normalization: Normalization
    max_length: int
    features: FeatureSpec | None = None


def reward_scores(model: PolicyWithHeads, scorer: RewardScorer, prompts: list[Messages], texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) reward of each response text and (B,) its uncertainty: shared_reward_scores on PPO's model."""
    return shared_reward_scores(model.peft_model, model.reward_head, scorer, prompts, texts, back_to="policy")


@torch.no_grad()
def shared_reward_scores(peft_model, reward_head: nn.Linear, scorer: RewardScorer, prompts: list[Messages], texts: list[str],
                         back_to: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) reward of each response text and (B,) its uncertainty, by the `reward` adapter of a base that carries
    other adapters too, and its head, or by a head on the base's features read with every adapter off; computed as
    `tether rm score` computes them: the mean and the spread of the heads' normalised scores. The adapter `back_to`
    is active again after.

    The text is encoded again through the chat template and closed by EOS, as in reward-model
    training, and a sequence over the reward model's max_length loses the start of its prompt.
    """
    encoded = [encode(scorer.tokenizer, p, t, scorer.max_length) for p, t in zip(prompts, texts)]
    input_ids, attention_mask = pad_right([e.input_ids for e in encoded], scorer.tokenizer.pad_token_id)  # (B, T) each
    device = reward_head.weight.device
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    if scorer.features is not None:
        with peft_model.disable_adapter():
            hidden = peft_model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=list(scorer.features.layers),
                                logits_to_keep=1).hidden_states  # only the head's layers are kept, the others None
        spec = scorer.features
        features = pool(hidden, spec.layers, (spec.pooling,), attention_mask.sum(dim=1), torch.tensor([e.response_tokens for e in encoded]))
        return reward_and_uncertainty(scorer.normalization.apply(reward_head(features.flatten(start_dim=1))))
    backbone = peft_model.get_base_model().base_model  # the transformer without its LM head
    peft_model.set_adapter("reward")
    try:
        hidden = backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    finally:
        peft_model.set_adapter(back_to)
    last = attention_mask.sum(dim=1) - 1  # (B,) right padding: each sequence's last real token
    raw = reward_head(hidden[torch.arange(hidden.shape[0]), last].float())  # (B, K)
    return reward_and_uncertainty(scorer.normalization.apply(raw))


@torch.no_grad()
def evaluate(model: PolicyWithHeads, scorer: RewardScorer, prompts: list[Messages], batch: tuple, config: PPOConfig) -> tuple[Rollout, dict[str, torch.Tensor]]:
    """The rollout of a sampled batch, and per-token diagnostics (B, R) along it: the entropy."""
    query_ids, query_mask, response_ids, response_mask, finished = batch
    args = (query_ids, query_mask, response_ids, response_mask)
    # The update recomputes these under the same precision, so its first ratios are 1.
    with mixed_precision(model, config):
        logprobs, values, logits = response_outputs(model, *args, config.temperature)
        entropy = torch.stack([entropy_of(row.float() / config.temperature) for row in logits])  # (B, R)
        del logits  # the step's largest tensor, not to be held through the passes below
        with model.peft_model.disable_adapter():
            ref_logprobs = response_logprobs(model, *args, config.temperature)
        start_logprobs = ref_logprobs
        if "start" in model.peft_model.peft_config:
            with adapter(model, "start"):
                start_logprobs = response_logprobs(model, *args, config.temperature)
    texts = response_texts(scorer.tokenizer, response_ids, response_mask, finished)
    scores, uncertainty = reward_scores(model, scorer, prompts, texts)  # float32, as the normalisation offsets were computed
    scores = scores - config.uncertainty_penalty * uncertainty - config.missing_eos_penalty * (~finished).float() - config.length_penalty * response_mask.sum(dim=1).float()
    mask = response_mask.float()
    rollout = Rollout(query_ids, query_mask, response_ids, response_mask,
                      logprobs * mask, ref_logprobs * mask, start_logprobs * mask, values * mask, scores, finished, texts)
    return rollout, {"entropy": entropy}


# 3. Rewards and 4. advantages


def add_rewards(rollout: Rollout, beta: float) -> torch.Tensor:
    """Per-token rewards: the KL penalty to the version the run started from on every response token, the score added
    on the last. Returns that KL (B, R)."""
    kl = rollout.logprobs - rollout.start_logprobs  # (B, R), 0 on padding
    rewards = -beta * kl
    last = rollout.response_mask.sum(dim=1) - 1  # (B,)
    rewards[torch.arange(rewards.shape[0]), last] += rollout.scores
    rollout.rewards = rewards
    return kl


def add_advantages(rollout: Rollout, gamma: float, lam: float) -> None:
    """GAE over the response tokens, then whitened advantages; returns = advantages (before whitening) + values."""
    rewards, values, mask = rollout.rewards, rollout.values, rollout.response_mask.float()
    width = rewards.shape[1]
    advantages = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], device=rewards.device)
    for t in reversed(range(width)):
        next_value = values[:, t + 1] if t + 1 < width else torch.zeros_like(running)  # 0 past the end: values are masked
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = delta + gamma * lam * running
        advantages[:, t] = running
    rollout.returns = (advantages + values) * mask
    rollout.advantages = whiten(advantages, mask) * mask


def whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x with mean 0 and variance 1 over the masked tokens of the whole batch, every process's part of it."""
    total, count = distributed.all_sum(torch.stack([(x * mask).sum(), mask.sum()]))
    mean = total / count
    variance = distributed.all_sum((((x - mean) * mask) ** 2).sum()) / count
    return (x - mean) * torch.rsqrt(variance + 1e-8)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum()


# 5. Update


def update(model: PolicyWithHeads, optimizer, rollout: Rollout, config: PPOConfig, generator: torch.Generator) -> dict[str, float]:
    """K epochs of clipped PPO over shuffled minibatches; the means of the update's statistics.

    The policy and value losses come from one forward pass and go backwards together; the value's
    gradient reaches its head alone, through the detached states it reads.
    """
    stats: dict[str, list[float]] = {"clip_fraction": [], "approx_kl": [], "policy_loss": [], "value_loss": [], "value_clip_fraction": [],
                                     "policy_grad_norm": [], "value_grad_norm": []}
    size = rollout.response_ids.shape[0]
    minibatch_size = config.minibatch_size // distributed.world_size()  # this process's part of each minibatch
    policy_group, value_group = (group["params"] for group in optimizer.param_groups)
    for _ in range(config.epochs):
        order = torch.randperm(size, generator=generator)
        for start in range(0, size, minibatch_size):
            index = order[start : start + minibatch_size]
            mask = rollout.response_mask[index].float()
            args = (rollout.query_ids[index], rollout.query_mask[index], rollout.response_ids[index], rollout.response_mask[index])
            optimizer.zero_grad(set_to_none=True)

            with mixed_precision(model, config):
                logprobs, values = response_outputs(model, *args, config.temperature)[:2]  # the logits are not kept
            log_ratio = (logprobs - rollout.logprobs[index]) * mask
            ratio = log_ratio.exp()
            advantages = rollout.advantages[index]
            policy_loss = masked_mean(torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - config.clip_range, 1 + config.clip_range)), mask)
            old_values, returns = rollout.values[index], rollout.returns[index]
            clipped = old_values + (values - old_values).clamp(-config.clip_range_value, config.clip_range_value)
            value_loss = 0.5 * masked_mean(torch.max((values - returns) ** 2, (clipped - returns) ** 2), mask)
            (policy_loss + config.vf_coef * value_loss).backward()

            distributed.average_gradients(policy_group + value_group)
            # Each clipped on its own: one clip over both let the value head's gradient, 6 to 10 times the policy's
            # on the default model, shrink every policy step towards AdamW's epsilon (scripts/BENCHMARKS.md).
            policy_norm = nn.utils.clip_grad_norm_(policy_group, config.max_grad_norm)
            value_norm = nn.utils.clip_grad_norm_(value_group, config.max_grad_norm)
            optimizer.step()
            with torch.no_grad():
                stats["clip_fraction"].append(masked_mean(((ratio - 1).abs() > config.clip_range).float(), mask).item())
                stats["approx_kl"].append(masked_mean(0.5 * log_ratio**2, mask).item())
                stats["policy_loss"].append(policy_loss.item())
                stats["value_loss"].append(value_loss.item())
                stats["value_clip_fraction"].append(masked_mean(((values - old_values).abs() > config.clip_range_value).float(), mask).item())
                stats["policy_grad_norm"].append(policy_norm.item())
                stats["value_grad_norm"].append(value_norm.item())
    means = {name: sum(values) / len(values) for name, values in stats.items()} | {"first_clip_fraction": stats["clip_fraction"][0]}
    return distributed.all_mean(means)


@contextmanager
def mixed_precision(model: PolicyWithHeads, config: PPOConfig) -> Iterator[None]:
    """bfloat16 autocast for forward passes when config.precision asks for it; log-probs and values come out float32.

    Under autocast, PEFT's cast of each LoRA layer's input to the adapter's float32 is undone at
    once by autocast's cast back to bfloat16, so it is switched off: the same numbers, two copies fewer.
    """
    from peft.helpers import disable_input_dtype_casting

    device = next(model.parameters()).device.type
    enabled = uses_bf16(config.precision)
    with torch.autocast(device, dtype=torch.bfloat16, enabled=enabled), disable_input_dtype_casting(model.peft_model, active=enabled):
        yield


def optimizer_for(model: PolicyWithHeads, config: PPOConfig) -> torch.optim.Optimizer:
    """AdamW without weight decay, as in TRL's PPO: decay would pull the adapters back towards the
    reference on a schedule of its own, beside the KL penalty that is meant to do that. Two groups,
    the policy's and the value's, which `update` clips each on its own."""
    policy, value = trainable_parameters(model)
    return torch.optim.AdamW([{"params": policy}, {"params": value}], lr=config.learning_rate, eps=1e-5, weight_decay=0.0)


def trainable_parameters(model: PolicyWithHeads) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """The policy adapter's LoRA weights, and the value head's."""
    return [p for name, p in model.peft_model.named_parameters() if ".policy." in name], list(model.value_head.parameters())


# 6. The KL controller


KL_STATE_FILE = "kl_controller.json"


class AdaptiveKL:
    """beta *= 1 + clip(KL / target - 1, -0.2, 0.2) / horizon after each step (Ziegler et al. 2019,
    with the horizon counted in PPO steps rather than responses); fixed when target is 0."""

    def __init__(self, beta: float, target: float, horizon: int):
        self.beta, self.target, self.horizon = beta, target, horizon

    def update(self, kl: float) -> None:
        if self.target > 0:
            error = max(-0.2, min(0.2, kl / self.target - 1))
            self.beta *= 1 + error / self.horizon


def starting_beta(config: PPOConfig, policy_dir: Path | None) -> float:
    """kl_coef for a fresh policy; the beta a policy version ended with, when PPO continues it and beta adapts.

    Rounds are a few steps each, too few for the controller to settle within one, so it goes on
    across them as one run would.
    """
    state = policy_dir / KL_STATE_FILE if policy_dir is not None else None
    if config.target_kl > 0 and state is not None and state.exists():
        return json.loads(state.read_text())["beta"]
    return config.kl_coef


# The whole run


def ppo_step(model, scorer: RewardScorer, optimizer, prompts, config, controller: AdaptiveKL, eos_ids, generator) -> tuple[dict, Rollout]:
    """One PPO step on a batch of prompts: its logged statistics, and the rollout they came from."""
    started = time.perf_counter()
    batch = sample(model, scorer.tokenizer, prompts, config, eos_ids)
    sampled = time.perf_counter()
    rollout, diagnostics = evaluate(model, scorer, prompts, batch, config)
    beta = controller.beta
    kl_to_start = add_rewards(rollout, beta)
    add_advantages(rollout, config.gamma, config.lam)
    mask = rollout.response_mask.float()
    # Means over each process's equal share of the batch; their mean is the whole batch's.
    stats = distributed.all_mean({
        "score": rollout.scores.mean().item(),
        "kl": (rollout.logprobs - rollout.ref_logprobs).sum(dim=1).mean().item(),
        "kl_to_start": kl_to_start.sum(dim=1).mean().item(),
        "entropy": masked_mean(diagnostics["entropy"], mask).item(),
        "response_length": mask.sum(dim=1).mean().item(),
        "finished": rollout.finished.float().mean().item(),
        "generate_seconds": sampled - started,
    })
    stats |= {"beta": beta, "generated_tokens": int(distributed.all_sum(mask.sum()).item())}
    scored = time.perf_counter()  # after .item(), which waits for the GPU
    stats["score_seconds"] = scored - sampled
    stats |= update(model, optimizer, rollout, config, generator)
    controller.update(stats["kl_to_start"])
    stats["update_seconds"] = time.perf_counter() - scored
    stats["seconds"] = time.perf_counter() - started
    return stats, rollout


def train_ppo(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[Messages],
    reward_dir: Path,
    config: PPOConfig,
    out_dir: Path,
    policy_dir: Path | None = None,
    on_step: StepFn | None = None,
) -> dict[str, Any]:
    """Run config.steps PPO steps on batches drawn from prompts; save the policy adapter to out_dir.

    model is the base causal LM with a left-padding tokenizer whose pad differs from EOS
    (train.common.models.load_model gives both). out_dir gets a standard PEFT adapter directory, built
    beside it and renamed into place when complete. on_step gets each step's statistics and a
    few sampled responses. Returns the statistics of every step.
    """
    if not prompts:
        raise ModelError("no prompts to run PPO on")
    processes = distributed.world_size()
    for name in ("batch_size", "minibatch_size"):
        if getattr(config, name) % processes:
            raise ModelError(f"[ppo] {name} = {getattr(config, name)} does not split evenly across {processes} processes: "
                             f"make it a multiple of {processes}")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ModelError(f"{out_dir} already exists and is not empty")
    reward = read_reward_adapter(reward_dir)
    wrapped = build(model, reward, config, policy_dir)
    scorer = RewardScorer(tokenizer, reward.normalization, reward.max_length, reward.features)
    optimizer = optimizer_for(wrapped, config)
    controller = AdaptiveKL(starting_beta(config, policy_dir), config.target_kl, config.kl_horizon)
    draws = data_seed(config)
    generator = torch.Generator().manual_seed(draws)
    torch.manual_seed(draws + distributed.rank())  # each process its own samples
    order = random.Random(draws)  # the same batches in every process, each taking its share
    eos = end_of_turn_ids(model, tokenizer)
    history, sampled = [], 0
    for step in range(1, config.steps + 1):
        batch_prompts = draw_prompts(prompts, config.batch_size, order)[distributed.rank() :: processes]
        stats, rollout = ppo_step(wrapped, scorer, optimizer, batch_prompts, config, controller, eos, generator)
        stats["step"] = step
        history.append(stats)
        sampled += len(rollout.texts)
        if on_step is not None:
            samples = [{"prompt": batch_prompts[i][-1]["content"], "response": text, "score": rollout.scores[i].item()}
                       for i, text in enumerate(rollout.texts[:3])]
            on_step({**stats, "total_steps": config.steps, "samples": samples})
    distributed.report_share(sampled, f"responses sampled over {len(history)} steps")
    if distributed.is_main():
        save_policy(wrapped, out_dir, config, controller.beta)
    return {"steps": history}


def draw_prompts(prompts: list[Messages], size: int, rng: random.Random) -> list[Messages]:
    """A batch of distinct prompts when there are enough; otherwise every prompt as evenly as it goes."""
    if len(prompts) >= size:
        return rng.sample(prompts, size)
    batch = prompts * (size // len(prompts)) + rng.sample(prompts, size % len(prompts))
    rng.shuffle(batch)
    return batch


def save_policy(model: PolicyWithHeads, out_dir: Path, config: PPOConfig, beta: float) -> None:
    """The policy adapter alone, as a directory PeftModel.from_pretrained loads, with the KL controller's beta."""
    with built_beside(out_dir) as built:
        # PEFT saves an adapter not named "default" in a folder of its name: policy/, in the staging directory.
        model.peft_model.save_pretrained(built.parent, selected_adapters=["policy"])
        (built.parent / "policy").rename(built)
        (built / "ppo_config.json").write_text(json.dumps(asdict(config), indent=2) + "\n")
        (built / KL_STATE_FILE).write_text(json.dumps({"beta": beta}) + "\n")
