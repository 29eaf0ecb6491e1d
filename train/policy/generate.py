"""Batched sampling from a chat model: prompts in, completion texts with token counts out."""

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from tqdm.auto import tqdm
from transformers import LogitsProcessor, LogitsProcessorList, PreTrainedModel, PreTrainedTokenizerBase

from train.common.config import GenerationConfig
from train.common.errors import ModelError
from train.runtime.batching import in_batches
from train.runtime.hardware import free_bytes

Messages = list[dict[str, str]]


class PromptTooLong(ModelError):
    def __init__(self, index: int, tokens: int, max_new_tokens: int, context: int):
        self.index = index
        super().__init__(
            f"is {tokens:,} tokens long: with max_new_tokens = {max_new_tokens} it does not fit the model's context of {context:,} tokens"
        )


@dataclass(frozen=True)
class Generated:
    prompt_index: int  # index into the prompts passed in
    text: str
    token_count: int  # generated tokens, the closing EOS included
    finished: bool  # ended with EOS rather than at max_new_tokens
    tokens: tuple[int, ...] | None = None  # the tokens sampled, the closing EOS left out; None when read back from text


def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[Messages],
    config: GenerationConfig,
    progress: bool = True,
    on_progress: Callable[[int, int], None] | None = None,
) -> list[Generated]:
    """Sample `config.per_prompt` completions for each prompt, grouped by prompt in prompt order.

    Batches hold prompts of like length, with the KV cache and the model's attention (SDPA,
    transformers' default, on a GPU); a batch that runs out of GPU memory is halved. Through a
    compiled static cache ([model] compile) the last batch is filled up with copies of its last
    prompt, whose answers are dropped: a batch of another size would compile again.
    `progress` shows a bar on the terminal; `on_progress(done, total)` is called after each batch.
    """
    if config.seed is not None:
        torch.manual_seed(config.seed)
    encoded = [
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        for messages in prompts
    ]
    context = getattr(model.config, "max_position_embeddings", None)
    for i, ids in enumerate(encoded):
        if context and len(ids) + config.max_new_tokens > context:
            raise PromptTooLong(i, len(ids), config.max_new_tokens, context)
    # Longest first, so sequences of like length share a batch and little compute goes on padding.
    jobs = sorted(
        (i for i in range(len(prompts)) for _ in range(config.per_prompt)),
        key=lambda i: -len(encoded[i]),
    )
    total = len(jobs)
    if model.generation_config.cache_implementation == "static":
        jobs += jobs[-1:] * (-total % config.batch_size)  # halved on running out of memory, the batches stay full
    eos_ids = end_of_turn_ids(model, tokenizer)
    with lora_folded(model), tqdm(total=total, desc="generating", unit="completion", disable=not progress) as bar:

        def done(count: int) -> None:
            count = min(count, total)
            bar.update(count - bar.n)
            if on_progress:
                on_progress(count, total)

        results = in_batches(
            jobs, config.batch_size, lambda batch: _generate_batch(model, tokenizer, batch, [encoded[i] for i in batch], config, eos_ids),
            "generation", done,
        )
    return sorted(results[:total], key=lambda g: g.prompt_index)


def _generate_batch(model, tokenizer, prompt_indices, input_ids, config, eos_ids) -> list[Generated]:
    inputs = tokenizer.pad({"input_ids": input_ids}, padding=True, return_tensors="pt").to(model.device)
    with torch.inference_mode():
        output = model.generate(
            **inputs,
            max_new_tokens=config.max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=list(eos_ids),
            **sampling(config.temperature, config.top_p, config.top_k),
        )
    responses = output[:, inputs["input_ids"].shape[1] :].tolist()  # (B, new tokens)
    results = []
    for prompt_index, tokens in zip(prompt_indices, responses):
        end = next((i for i, t in enumerate(tokens) if t in eos_ids), None)
        finished = end is not None
        content = tokens[:end] if finished else tokens
        results.append(Generated(
            prompt_index=prompt_index,
            text=tokenizer.decode(content, skip_special_tokens=True),
            token_count=len(content) + finished,
            finished=finished,
            tokens=tuple(content),
        ))
    return results


def sampling(temperature: float, top_p: float, top_k: int) -> dict:
    """generate()'s arguments to sample at these settings (temperature 0: greedy), through Sampler."""
    if temperature == 0:
        return {"do_sample": False}
    return {"do_sample": False, "logits_processor": LogitsProcessorList([Sampler(temperature, top_p, top_k)])}


class Sampler(LogitsProcessor):
    """Draws each next token itself, from the distribution transformers' sampling draws from (temperature, then top-k,
    then top-p), and leaves generate()'s greedy pick only that token to take.

    transformers' top-p sorts the whole vocabulary at every step and torch.multinomial walks it: for 32 sequences of
    the default model on the 2-core CPU, 74 and 46 ms a step, against about 230 ms for the model's forward pass
    (scripts/BENCHMARKS.md). Here the nucleus is looked for among the CANDIDATES likeliest tokens, which hold it
    whenever their probability reaches top_p, and in the sorted vocabulary only where it does not; the draw is an
    inverse-CDF lookup.
    """

    CANDIDATES = 256

    def __init__(self, temperature: float, top_p: float, top_k: int):
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k

    def distribution(self, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(probabilities, their token ids) for each row, zero outside the nucleus; ids None: the whole vocabulary in order."""
        logits = scores.float() / self.temperature
        if self.top_k:
            values, ids = logits.topk(min(self.top_k, logits.shape[-1]))
            probs = values.softmax(-1)
        elif self.top_p < 1:
            values, ids = logits.topk(min(self.CANDIDATES, logits.shape[-1]))
            probs = (values - logits.logsumexp(-1, keepdim=True)).exp()
            if (probs.sum(-1) < self.top_p).any():  # a flat row: its nucleus reaches past the candidates
                values, ids = logits.sort(-1, descending=True)
                probs = values.softmax(-1)
        else:
            return logits.softmax(-1), None
        if self.top_p < 1:  # a token stays if the likelier ones before it hold less than top_p, as transformers decides
            probs = probs.masked_fill(probs.cumsum(-1) - probs >= self.top_p, 0)
        return probs, ids

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        probs, ids = self.distribution(scores)
        cdf = probs.cumsum(-1, dtype=torch.float64)
        point = torch.rand(len(cdf), 1, dtype=torch.float64, device=cdf.device) * cdf[:, -1:]
        drawn = torch.searchsorted(cdf, point, right=True).clamp_max(cdf.shape[-1] - 1)  # (B, 1)
        tokens = drawn if ids is None else ids.gather(-1, drawn)
        return torch.full_like(scores, float("-inf")).scatter_(-1, tokens, 0.0)


@contextmanager
def lora_folded(model) -> Iterator[None]:
    """Inside, a PEFT model's active LoRA adapter is folded into its base's weights and every adapter is off, so the
    model computes the adapted policy as a plain model does; after, every base weight is the tensor it was, bit for bit.

    Sampling through the unfolded LoRA halved generation's speed on a GPU (scripts/BENCHMARKS.md): two small matmuls
    a layer at every token. A fold and an unfold are not exact in floating point, and the reference and the reward
    model read the same base, so the touched weights are copied first and copied back after. That copy needs the
    touched weights' size again, from memory the round's expected peak (train.runtime.memory) leaves free: where it is not
    free, or the fold runs out of memory halfway, the model samples through the adapter as it is, as it does on a
    quantised base, which cannot take the fold.
    """
    layers = _active_lora_layers(model)
    weights = [layer.get_base_layer().weight for layer, _ in layers]
    if weights and sum(w.numel() * w.element_size() for w in weights) * 1.1 > free_bytes(weights[0].device):  # a tenth spare
        layers = []
    kept = _fold(layers)
    try:
        if kept:
            with model.disable_adapter():
                yield
        else:
            yield
    finally:
        _restore(kept)


def _fold(layers: list) -> list:
    """Fold each layer's adapter into its base weight; (weight, its original) for each, to put back. A fold that runs
    out of memory halfway puts back what it folded and keeps nothing."""
    kept = []
    try:
        with torch.no_grad():
            for layer, adapter in layers:
                weight = layer.get_base_layer().weight
                kept.append((weight, weight.clone()))
                weight.add_(layer.get_delta_weight(adapter))  # in place: a compiled graph keeps reading the same storage
    except torch.OutOfMemoryError:
        _restore(kept)
        return []
    return kept


def _active_lora_layers(model) -> list:
    """(LoRA layer, adapter name) of a PEFT model's active adapter on a base that is not quantised; else none."""
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer

    if not isinstance(model, PeftModel) or getattr(model.get_base_model(), "is_quantized", False):
        return []
    adapter = model.active_adapter
    return [(m, adapter) for m in model.modules() if isinstance(m, LoraLayer) and adapter in m.lora_A]


def _restore(kept: list) -> None:
    with torch.no_grad():
        for weight, original in kept:
            weight.copy_(original)


def end_of_turn_ids(model, tokenizer) -> set[int]:
    """Every token that ends a turn: the tokenizer's EOS and any the model's generation config adds."""
    configured = model.generation_config.eos_token_id
    ids = set(configured if isinstance(configured, list) else [configured] if configured is not None else [])
    ids.add(tokenizer.eos_token_id)
    return ids


def kl_to_base(model, tokenizer: PreTrainedTokenizerBase, prompts: list[Messages], answers: list[Generated], temperature: float,
               batch_size: int) -> float:
    """KL(policy || base) estimated on the policy's own answers: the mean over answers of
    log pi(y | x) - log pi_0(y | x), both at the sampling temperature (top-p and top-k aside).

    `model` is a PeftModel: its adapters off give the base. Every optimiser's policy is measured
    alike, on prompts none of them trained on, whatever KL its training reported. It is an
    estimate, on few answers sampled with top-p, so it can come out below 0. It reads the tokens
    the policy sampled: encoded again from their text, a tiny test model's answers became other
    tokens every time, and their KL read -4.5 nats where the policy had moved.
    """
    end = tokenizer.eos_token_id

    def sequence(answer: Generated) -> tuple[list[int], int]:
        prompt = tokenizer.apply_chat_template(prompts[answer.prompt_index], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        sampled = list(answer.tokens) if answer.tokens is not None else tokenizer(answer.text, add_special_tokens=False)["input_ids"]
        response = sampled + [end] * answer.finished
        return prompt + response, len(response)

    def log_ratios(batch: list[Generated]) -> list[float]:
        sequences, lengths = zip(*map(sequence, batch))
        padded = tokenizer.pad({"input_ids": list(sequences)}, padding=True, return_tensors="pt").to(model.device)
        ids, mask = padded["input_ids"], padded["attention_mask"]
        positions = (mask.cumsum(1) - 1).clamp(min=0)  # left padding: each sequence counts from its first real token
        width = max(lengths)  # every response ends the sequence: the last `width` tokens hold the longest

        def logprobs() -> torch.Tensor:  # (B, width) of the last width tokens; only the logits that predict them are made
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=width + 1).logits[:, :-1]
            return selective_log_softmax(logits, ids[:, -width:], temperature)

        with torch.inference_mode():
            policy = logprobs()
            with model.disable_adapter():
                base = logprobs()
        return [(policy[i, width - n:] - base[i, width - n:]).sum().item() for i, n in enumerate(lengths)]

    ratios = in_batches(answers, batch_size, log_ratios, "KL to the base")
    return sum(ratios) / len(ratios)


def selective_log_softmax(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / T) at `tokens`, (B, R), in float32 one sequence at a time.

    The full (B, R, V) log-softmax is never built: each row's logsumexp is taken from a float32
    copy of that row alone, as TRL's selective_log_softmax does.
    """
    rows = []
    for row, row_tokens in zip(logits, tokens):  # (R, V), (R,)
        scaled = row.float() / temperature
        rows.append(scaled.gather(-1, row_tokens.unsqueeze(-1)).squeeze(-1) - scaled.logsumexp(-1))
    return torch.stack(rows)
