"""Features of a response read off the frozen base model: its hidden states, pooled over the response.

A few-vote reward model (train.head) is a linear head on these. A response is encoded as the
LoRA reward model encodes it (train.reward_model.encode: the prompt through the chat template,
the response as the assistant turn closed by EOS, a prompt over max_length cut from its start),
run through the base model with every adapter off, and read at chosen layers:
- "mean": the mean of the layer's states over the response's tokens, its EOS included;
- "last": the state at the EOS that closes it, where the LoRA reward model reads its score.
Layers count as `output_hidden_states` does: 0 is the embeddings, -1 the last layer's output.
"""

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable

import torch

from train.batching import in_batches
from train.reward_model import encode, pad_right
from train.snapshot import Messages

POOLINGS = ("mean", "last")


@dataclass(frozen=True)
class FeatureSpec:
    """Which hidden states make a response's features, and how they are pooled over it."""

    layers: tuple[int, ...]
    pooling: str
    max_length: int

    def __post_init__(self):
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {self.pooling!r}")
        if not self.layers:
            raise ValueError("features need at least one layer")


def layer_indices(fractions: tuple[float, ...], depth: int) -> tuple[int, ...]:
    """The hidden states at these fractions of a model of `depth` layers: 0 its embeddings, 1 its last layer's output."""
    return tuple(sorted({round(f * depth) for f in fractions}))


@torch.inference_mode()
def pooled_states(
    model, tokenizer, prompts: list[Messages | str], texts: list[str], layers: tuple[int, ...], poolings: tuple[str, ...],
    max_length: int, batch_size: int, on_batch: Callable[[int], None] | None = None,
) -> torch.Tensor:
    """(N, len(poolings), len(layers), H) float32: each response's states at each layer, pooled each way.

    `model` is a causal LM or a PEFT model on one; its adapters are off while it reads. Batches hold
    sequences of like length, right-padded, and one that runs out of GPU memory is halved.
    """
    encoded = [encode(tokenizer, p, t, max_length) for p, t in zip(prompts, texts)]
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i].input_ids))
    device = next(model.parameters()).device
    adapters_off = model.disable_adapter() if hasattr(model, "disable_adapter") else nullcontext()

    def read(batch: list[int]) -> list[torch.Tensor]:
        input_ids, attention_mask = pad_right([encoded[i].input_ids for i in batch], tokenizer.pad_token_id)  # (B, T)
        with adapters_off:
            hidden = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), output_hidden_states=True,
                           logits_to_keep=1).hidden_states
        states = torch.stack([hidden[layer] for layer in layers], dim=1).float()  # (B, L, T, H)
        lengths = attention_mask.sum(dim=1)  # (B,)
        out = []
        for row, i in enumerate(batch):
            end, start = int(lengths[row]), int(lengths[row]) - encoded[i].response_tokens
            pooled = {"mean": states[row, :, start:end].mean(dim=1), "last": states[row, :, end - 1]}  # (L, H) each
            out.append(torch.stack([pooled[p] for p in poolings]).cpu())
        if on_batch is not None:
            on_batch(len(batch))
        return out

    features: list[torch.Tensor | None] = [None] * len(encoded)
    for i, value in zip(order, in_batches(order, batch_size, read, "reading features")):
        features[i] = value
    return torch.stack(features) if features else torch.empty(0)


def response_features(model, tokenizer, prompts: list[Messages | str], texts: list[str], spec: FeatureSpec, batch_size: int,
                      on_batch: Callable[[int], None] | None = None) -> torch.Tensor:
    """(N, D) each response's features as `spec` reads them: its layers' pooled states side by side."""
    states = pooled_states(model, tokenizer, prompts, texts, spec.layers, (spec.pooling,), spec.max_length, batch_size, on_batch)
    return states.flatten(start_dim=1)
