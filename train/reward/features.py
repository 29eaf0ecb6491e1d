"""Features of a response read off the frozen base model: its hidden states, pooled over the response.

A few-vote reward model (train.reward.head) is a linear head on these. A response is encoded as
either reward model encodes it (train.reward.encoding.encode: the prompt through the chat template,
the response as the assistant turn closed by EOS, a prompt over max_length cut from its start),
run through the base model with every adapter off, and read at chosen layers:
- "mean": the mean of the layer's states over the response's tokens, its EOS included;
- "last": the state at the EOS that closes it, where the LoRA reward model reads its score.
Layers count as `output_hidden_states` does: 0 is the embeddings, -1 the last layer's output.
"""

import hashlib
import json
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from train.common.files import built_beside
from train.common.snapshot import Messages
from train.reward.encoding import encode, pad_right
from train.runtime import distributed
from train.runtime.batching import in_batches

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

    def read(batch: list[int]) -> list[torch.Tensor]:
        input_ids, attention_mask = pad_right([encoded[i].input_ids for i in batch], tokenizer.pad_token_id)  # (B, T)
        with model.disable_adapter() if hasattr(model, "disable_adapter") else nullcontext():  # a PEFT model's
            hidden = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), output_hidden_states=list(layers),
                           logits_to_keep=1).hidden_states  # only these layers' states are kept, the others None
        pooled = pool(hidden, layers, poolings, attention_mask.sum(dim=1), torch.tensor([encoded[i].response_tokens for i in batch]))
        if on_batch is not None:
            on_batch(len(batch))
        return list(pooled.cpu())

    features: list[torch.Tensor | None] = [None] * len(encoded)
    for i, value in zip(order, in_batches(order, batch_size, read, "reading features")):
        features[i] = value
    return torch.stack(features) if features else torch.empty(0)


def pool(hidden_states: tuple[torch.Tensor, ...], layers: tuple[int, ...], poolings: tuple[str, ...], lengths: torch.Tensor,
         response_tokens: torch.Tensor) -> torch.Tensor:
    """(B, len(poolings), len(layers), H) float32 from a right-padded batch's hidden states, (B, T, H) per layer: each
    sequence's `lengths` tokens end with its `response_tokens` response tokens."""
    states = torch.stack([hidden_states[layer] for layer in layers], dim=1).float()  # (B, L, T, H)
    positions = torch.arange(states.shape[2], device=states.device)  # (T,)
    ends = lengths.to(states.device)  # (B,); PPO's masks are on the model's device, the token counts on the CPU
    starts = ends - response_tokens.to(states.device)
    response = ((positions >= starts[:, None]) & (positions < ends[:, None])).float()  # (B, T)
    mean = torch.einsum("blth,bt->blh", states, response) / response.sum(dim=1)[:, None, None]
    last = states[torch.arange(states.shape[0]), :, ends - 1]  # (B, L, H)
    return torch.stack([{"mean": mean, "last": last}[p] for p in poolings], dim=1)


def response_features(model, tokenizer, prompts: list[Messages | str], texts: list[str], spec: FeatureSpec, batch_size: int,
                      on_batch: Callable[[int], None] | None = None) -> torch.Tensor:
    """(N, D) each response's features as `spec` reads them: its layers' pooled states side by side."""
    states = pooled_states(model, tokenizer, prompts, texts, spec.layers, (spec.pooling,), spec.max_length, batch_size, on_batch)
    return states.flatten(start_dim=1)


def answer_key(prompt: Messages | str, text: str) -> str:
    """What a cached feature vector belongs to: its prompt and answer, hashed."""
    return hashlib.sha256(json.dumps([prompt, text], ensure_ascii=False, sort_keys=True).encode()).hexdigest()


class FeatureCache:
    """Features read before, by answer_key: in `root`, one folder per reading (a base model loaded one way, and a
    FeatureSpec), each job's new features one Parquet file put in whole, so the folder is only ever added to. A cache
    without a root (a job run away from its project) keeps nothing."""

    def __init__(self, root: Path | None, reading: dict[str, Any]):
        digest = hashlib.sha256(json.dumps(reading, sort_keys=True).encode()).hexdigest()[:16]
        self.folder = None if root is None else Path(root) / digest

    def read(self, keys: list[str]) -> dict[str, list[float]]:
        """The cached features of these keys, where cached."""
        if self.folder is None or not self.folder.is_dir():
            return {}
        found = {}
        for path in sorted(self.folder.glob("*.parquet")):
            table = pq.read_table(path, filters=[("key", "in", keys)]).to_pydict()
            found.update(zip(table["key"], table["features"]))
        return found

    def add(self, features: dict[str, list[float]], name: str) -> None:
        if self.folder is None or not features:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        table = pa.table({"key": list(features), "features": pa.array(list(features.values()), pa.list_(pa.float32()))})
        with built_beside(self.folder / f"{name}.parquet") as built:
            pq.write_table(table, built)


def cached_features(model, tokenizer, prompts: list[Messages | str], texts: list[str], spec: FeatureSpec, batch_size: int,
                    cache: FeatureCache, name: str, on_batch: Callable[[int], None] | None = None) -> tuple[torch.Tensor, int, int]:
    """(N, D) the features of each answer, read from the cache or, once, from the model, then cached under `name`; and
    how many distinct answers were read from the model, and how many found cached. Under accelerate launch each
    process reads its share of the answers, and every process gets them all."""
    keys = [answer_key(p, t) for p, t in zip(prompts, texts)]
    known = cache.read(keys)
    missing = list({key: i for i, key in enumerate(keys) if key not in known}.items())  # each answer once, however often asked
    mine = [missing[i] for i in distributed.shard(missing)]
    read = response_features(model, tokenizer, [prompts[i] for _, i in mine], [texts[i] for _, i in mine], spec, batch_size,
                             on_batch) if mine else torch.empty(0)
    distributed.report_share(len(mine), "answers' features read")
    new = dict(distributed.gather([(key, vector.tolist()) for (key, _), vector in zip(mine, read)]))
    cache.add(new, name)
    return torch.tensor([known[key] if key in known else new[key] for key in keys], dtype=torch.float32), len(new), len(known)
