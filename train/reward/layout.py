"""A reward-model version on disk, of either kind, and what it holds taken apart.

A LoRA reward model (train.reward.lora) is a directory:

    adapter_config.json, adapter_model.safetensors   a plain PEFT adapter on the base model as a
                                                     sequence classifier with K outputs (its heads),
                                                     the `score` head included
    tokenizer files                                  with the pad token it was trained with
    reward_normalization.json                        per head, mean and std of its raw rewards in training
    metrics.json                                     its metrics, and the config it trained with (K is
                                                     config.heads)

With plain transformers and peft it loads as
`PeftModel.from_pretrained(AutoModelForSequenceClassification.from_pretrained(base, num_labels=K), dir)`.

A head on the base's features (train.reward.head) keeps head.safetensors in place of the adapter and the
tokenizer, and its metrics.json names where it reads the base. A version of both kinds ([reward_model] kind =
"auto") holds each in a folder of its kind's name, and steering.json names the one that scores.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from train.reward.scores import Normalization

NORMALIZATION_FILE = "reward_normalization.json"
METRICS_FILE = "metrics.json"
HEAD_FILE = "head.safetensors"  # a head on the base's features (train.reward.head) in place of an adapter
STEERING_FILE = "steering.json"  # a version of both kinds ([reward_model] kind = "auto"): which one scores


def steering_dir(version_dir: Path) -> Path:
    """The reward model that scores for a version's directory: the directory itself, or, for a version of both kinds
    ([reward_model] kind = "auto"), the kind its steering.json names, in the folder of that name."""
    steering = Path(version_dir) / STEERING_FILE
    return Path(version_dir) / json.loads(steering.read_text())["kind"] if steering.exists() else Path(version_dir)



def is_head(model_dir: Path) -> bool:
    """Whether a reward model is a head on the base's features (train.reward.head) rather than a LoRA adapter."""
    return (Path(model_dir) / HEAD_FILE).exists()



def read_normalization(adapter_dir: Path) -> Normalization:
    return Normalization(**json.loads((Path(adapter_dir) / NORMALIZATION_FILE).read_text()))



def trained_config(adapter_dir: Path) -> dict[str, Any]:
    """The [reward_model] settings a reward model was trained with. It scores at their max_length, or its
    scores are not the trained ones, and has config.heads heads."""
    return json.loads((steering_dir(adapter_dir) / METRICS_FILE).read_text())["config"]



@dataclass(frozen=True)
class RewardAdapter:
    """A saved reward model taken apart, for a causal LM that carries its adapter beside others (PPO's)."""

    path: Path
    lora: Any  # peft.LoraConfig of its adapter on a causal LM: the head is `head` here, not a module to save; None for a head on features
    lora_weights: dict[str, torch.Tensor]  # its LoRA weights, under the keys PEFT saved them with
    head: torch.Tensor  # (K, H) the score heads' weights; (K, D) on features
    normalization: Normalization
    max_length: int
    bias: torch.Tensor | None = None  # (K,) a head on features: its offsets
    features: Any = None  # train.reward.features.FeatureSpec: where a head on features reads the base, with every adapter off
