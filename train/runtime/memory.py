"""The expected peak memory of a round, counted from the model's shapes and the settings, for planning a machine.

A round's jobs run one after another, each in its own process, so a round peaks at its largest
job. A job holds, at its largest moment:
- the runtime: Python, torch, transformers and TRL, resident before any model loads (on the CPU;
  on a GPU, CUDA's context);
- the base's weights, at their stored width: [model] dtype, or 4-bit NF4 with its block scales,
  or 8-bit with its row scales. Bitsandbytes quantises the blocks' linear layers only: the
  embeddings, norms and LM head stay at full width, in float32 once a job trains on them (PEFT's
  k-bit recipe);
- its adapters and heads in float32, and for each it trains a gradient and AdamW's two moments;
- the activations its backward pass keeps: per token, in each layer, about 9 hidden-size vectors
  (norms, attention's inputs and output, residuals) and 4 intermediate-size ones (the MLP's),
  one float per position the token attends over (the attention mask), and with LoRA dropout a
  masked copy of each adapted layer's input; with gradient checkpointing, one hidden vector per
  layer and one layer's worth. A causal LM that trains also keeps its logits over the
  vocabulary three times (the logits, their float32 log-softmax and its gradient);
- where it samples, the key-value cache of its batch;
- on the CPU, the blocks glibc keeps for reuse (GLIBC_KEPT; with checkpointing, CHECKPOINTED_KEPT),
  unless [worker] release_memory.
Not counted: the copy of the block weights that sampling from an adapter takes where memory is free
beyond this peak (train.policy.generate.lora_folded), and skips where it is not.
Quantising a base as it loads reads its whole safetensors file through a map beside the quantised
copy, so on the CPU the file's bytes count once more while it loads (train.common.models then closes
the map); a base that is not quantised is loaded in place.

These counts were checked against PyTorch's own record of the tensors a backward pass keeps
(torch.autograd.graph.saved_tensors_hooks), and the whole against the peak resident memory of
real rounds in scripts/BENCHMARKS.md.
"""

import functools
from dataclasses import dataclass, replace
from pathlib import Path

# Resident memory of a worker on the CPU before its model loads: Python with torch, transformers, peft, TRL and
# Tether's training modules imported (measured: torch 2.13, transformers 5.x, trl 1.16). On a GPU, CUDA's context.
RUNTIME_CPU_GB = 0.48
RUNTIME_GPU_GB = 0.5
GB = 2**30
FLOAT32 = 4
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# NF4 keeps half a byte a weight, an 8-bit scale per block of 64 and, with double quantisation, a float32
# scale per 256 of those (Dettmers et al. 2023, section 2); LLM.int8() keeps a byte a weight and a scale per row.
NF4_BYTES = 0.5 + 1 / 64 + FLOAT32 / (64 * 256)
ADAMW_BYTES = 4 * FLOAT32  # a trained float32 parameter, its gradient and AdamW's two moments
SAVED_HIDDEN, SAVED_INTERMEDIATE = 9, 4  # activations a layer keeps per token, in hidden- and intermediate-size vectors
LOGIT_COPIES = 3
# glibc keeps the blocks a training step frees in its heap for reuse, and on the CPU a job's resident memory holds
# them beside the live activations: a reward-model step on the default model peaked at 1.45 to 1.75 times the
# activations counted alive (scripts/bench_memory.py, a round of `tether simulate`). Measured, not derived; gone
# with [worker] release_memory, which hands them back at once.
GLIBC_KEPT = 1.55
# With gradient checkpointing the backward pass recomputes one layer at a time, and glibc keeps what each recompute
# frees: a checkpointed step on the default model peaked at 0.47 to 0.62 times the activations the same step keeps
# alive without checkpointing (1,040 to 4,160 tokens), against 0.2 with the blocks handed back. Measured, not derived.
CHECKPOINTED_KEPT = 0.5
DROPOUT_COPY = 1.25  # a masked copy of a layer's input, and its mask at a byte an element


@dataclass(frozen=True)
class ModelShape:
    """What memory depends on in a causal LM, read from its config."""

    vocab: int
    hidden: int
    intermediate: int
    layers: int
    kv_width: int  # key-value heads times the head size: one token's cache in one layer is twice this
    block_linears: tuple[tuple[int, int], ...]  # (in, out) of each linear layer in one block
    other_parameters: int  # embeddings, norms, biases and an untied LM head: never quantised
    checkpoint_bytes: int  # the weights' file, as stored

    @property
    def block_parameters(self) -> int:
        return self.layers * sum(i * o for i, o in self.block_linears)

    @property
    def parameters(self) -> int:
        return self.block_parameters + self.other_parameters


@functools.cache
def model_shape(path: str) -> ModelShape:
    """The shape of the causal LM at `path` (a directory or a cached hub id), built on PyTorch's meta device:
    every parameter's size, and no memory."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    text = config.get_text_config()
    block = model.get_decoder().layers[0]
    linears = tuple((m.in_features, m.out_features) for m in block.modules() if isinstance(m, torch.nn.Linear))
    total = sum(p.numel() for p in model.parameters())
    head_size = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    stored = BYTES.get(str(getattr(config, "dtype", None) or "float32").removeprefix("torch."), FLOAT32)
    block_params = text.num_hidden_layers * sum(i * o for i, o in linears)
    return ModelShape(
        vocab=text.vocab_size, hidden=text.hidden_size, intermediate=getattr(text, "intermediate_size", 4 * text.hidden_size),
        layers=text.num_hidden_layers, kv_width=kv_heads * head_size, block_linears=linears,
        other_parameters=total - block_params, checkpoint_bytes=_checkpoint_bytes(Path(path), total * stored),
    )


def _checkpoint_bytes(path: Path, otherwise: int) -> int:
    files = list(path.glob("*.safetensors")) if path.is_dir() else []
    return sum(f.stat().st_size for f in files) or otherwise


@dataclass(frozen=True)
class JobMemory:
    """A job's expected peak, in bytes, and its parts at that moment."""

    job: str
    runtime: float
    weights: float
    adapters: float
    activations: float
    loading: float  # the peak while the base loads: runtime, weights and the mapped file

    @property
    def peak(self) -> float:
        return max(self.runtime + self.weights + self.adapters + self.activations, self.loading)


class Estimator:
    """Each job's expected peak for a project's settings (ui.owner.config.TetherConfig: model, generation,
    reward_model, ppo, dpo, grpo and worker) on a model of shape `shape`, for prompts of up to `prompt_tokens` tokens."""

    def __init__(self, shape: ModelShape, config, prompt_tokens: int, on_gpu: bool):
        self.shape, self.config, self.prompt_tokens, self.on_gpu = shape, config, prompt_tokens, on_gpu
        self.quantization = config.model.quantization
        self.width = BYTES[config.model.dtype]
        self.keeps_freed_blocks = not on_gpu and not config.worker.release_memory  # glibc's heap, on the CPU

    def weights(self, training: bool) -> float:
        """The base's bytes: a quantised base's blocks at their quantised width, the rest at full width
        (float32 where a job trains, as prepare_for_training casts it)."""
        shape = self.shape
        if self.quantization == "none":
            return shape.parameters * self.width
        rows = shape.layers * sum(o for _, o in shape.block_linears)
        blocks = shape.block_parameters * NF4_BYTES if self.quantization == "4bit" else shape.block_parameters + rows * FLOAT32
        return blocks + shape.other_parameters * (FLOAT32 if training else self.width)

    def lora_parameters(self, rank: int) -> int:
        """An all-linear LoRA adapter's parameters: rank * (in + out) for each linear layer of each block."""
        return self.shape.layers * sum(rank * (i + o) for i, o in self.shape.block_linears)

    def layer_activations(self, tokens: int, length: int, dropout: float, checkpointing: bool = False) -> float:
        """What a training forward pass over `tokens` tokens, in sequences of `length`, keeps for its backward."""
        shape = self.shape
        per_layer = (SAVED_HIDDEN * shape.hidden + SAVED_INTERMEDIATE * shape.intermediate) * self.width + length * FLOAT32
        if dropout > 0:
            per_layer += DROPOUT_COPY * sum(i for i, _ in shape.block_linears) * FLOAT32
        if checkpointing:
            return tokens * (shape.layers * shape.hidden * self.width + per_layer)
        return tokens * shape.layers * per_layer

    def kept_activations(self, tokens: int, length: int, dropout: float, checkpointing: bool) -> float:
        """layer_activations, with what glibc keeps of a checkpointed backward's recomputes on the CPU."""
        kept = self.layer_activations(tokens, length, dropout, checkpointing)
        if checkpointing and self.keeps_freed_blocks:
            full = self.layer_activations(tokens, length, dropout)
            kept = max(kept, full * CHECKPOINTED_KEPT / GLIBC_KEPT)  # job() multiplies by GLIBC_KEPT
        return kept

    def kv_cache(self, sequences: int, length: int) -> float:
        return sequences * length * self.shape.layers * 2 * self.shape.kv_width * self.width

    def logits(self, sequences: int, positions: int) -> float:
        return LOGIT_COPIES * sequences * positions * self.shape.vocab * FLOAT32

    def job(self, name: str, weights: float, adapters: float = 0.0, activations: float = 0.0) -> JobMemory:
        if self.keeps_freed_blocks:
            activations *= GLIBC_KEPT
        runtime = RUNTIME_GPU_GB * GB if self.on_gpu else RUNTIME_CPU_GB * GB
        mapped = self.shape.checkpoint_bytes if self.quantization != "none" and not self.on_gpu else 0
        return JobMemory(name, runtime, weights, adapters, activations, loading=runtime + weights + mapped)

    def generation(self) -> JobMemory:
        generation = self.config.generation
        length = self.prompt_tokens + generation.max_new_tokens
        working = self.kv_cache(generation.batch_size, length) + generation.batch_size * self.shape.vocab * FLOAT32 * LOGIT_COPIES
        return self.job("completions", self.weights(training=False), activations=working)

    def predictor(self) -> JobMemory:
        """Sampling as a generation job does, then each answer's log-probs under the policy and under the base (its KL
        to v0), then the reward model's reading of every answer, one at a time."""
        generation = self.config.generation
        length = self.prompt_tokens + generation.max_new_tokens
        sampling = self.kv_cache(generation.batch_size, length) + generation.batch_size * self.shape.vocab * FLOAT32 * LOGIT_COPIES
        kl = self.logits(generation.batch_size, generation.max_new_tokens + 1)  # the logits that predict the answers' tokens
        return self.job("predictor", self.weights(training=False), activations=max(sampling, kl, self.reading()))

    def reading(self) -> float:
        """What reading a batch of answers' features keeps, without gradients: the hidden states at the layers a head reads
        (as train.reward.features.layer_indices picks them) and the one being computed, and the last logits."""
        rm = self.config.reward_model
        length = min(rm.max_length, self.prompt_tokens + self.config.generation.max_new_tokens)
        sequences = 2 * rm.batch_size  # as many as a training batch's responses
        states = len({round(f * self.shape.layers) for f in rm.feature_layers}) + 1
        return sequences * length * states * self.shape.hidden * self.width + self.logits(sequences, 1)

    def reward_model(self) -> JobMemory:
        """The head's job or the LoRA model's, by [reward_model] kind; with 'auto' the larger, as they run one after the other."""
        rm = self.config.reward_model
        length = min(rm.max_length, self.prompt_tokens + self.config.generation.max_new_tokens)
        sequences = 2 * rm.batch_size  # each pair's two responses
        head = self.job("reward model", self.weights(training=False), activations=self.reading())
        adapters = self.lora_parameters(rm.lora_r) * ADAMW_BYTES
        activations = self.kept_activations(sequences * length, length, rm.lora_dropout, rm.checkpointing(self.config.model))
        lora = self.job("reward model", self.weights(training=True), adapters, activations)
        return {"head": head, "lora": lora, "auto": max(head, lora, key=lambda job: job.peak)}[rm.kind]

    def reward_adapter(self) -> int:
        """The parameters of the reward model's adapter that PPO and GRPO carry: none for a head on features."""
        return 0 if self.config.reward_model.kind == "head" else self.lora_parameters(self.config.reward_model.lora_r)

    def ppo(self) -> JobMemory:
        ppo = self.config.ppo
        response = ppo.max_new_tokens or self.config.generation.max_new_tokens
        length = self.prompt_tokens + response
        # The policy's adapter trains (the value head beside it is a vector); the reward model's adapter rides along frozen.
        adapters = self.lora_parameters(ppo.lora_r) * ADAMW_BYTES + self.reward_adapter() * FLOAT32
        kept = self.kept_activations(ppo.minibatch_size * length, length, 0.0, ppo.checkpointing(self.quantization != "none"))
        update = kept + self.logits(ppo.minibatch_size, response + 1)
        rollout = self.kv_cache(ppo.batch_size, length) + self.logits(ppo.batch_size, response + 1) / LOGIT_COPIES
        return self.job("PPO", self.weights(training=True), adapters, max(update, rollout))

    def dpo(self) -> JobMemory:
        dpo = self.config.dpo
        length = min(dpo.max_length, self.prompt_tokens + self.config.generation.max_new_tokens)
        sequences = 2 * dpo.batch_size  # chosen and rejected, in one forward pass
        activations = self.layer_activations(sequences * length, length, 0.0) + self.logits(sequences, length)
        return self.job("DPO", self.weights(training=True), self.lora_parameters(dpo.lora_r) * ADAMW_BYTES, activations)

    def grpo(self) -> JobMemory:
        grpo = self.config.grpo
        response = grpo.max_new_tokens or self.config.generation.max_new_tokens
        length = self.prompt_tokens + response
        responses = grpo.prompts_per_step * grpo.group_size
        minibatch = responses // grpo.minibatches
        adapters = self.lora_parameters(grpo.lora_r) * ADAMW_BYTES + self.reward_adapter() * FLOAT32
        update = self.layer_activations(minibatch * length, length, 0.0) + self.logits(minibatch, response)
        rollout = self.kv_cache(responses, length) + self.logits(responses, response) / LOGIT_COPIES
        return self.job("GRPO", self.weights(training=True), adapters, max(update, rollout))

    def round(self, optimizer: str) -> list[JobMemory]:
        """The jobs of a round with `optimizer`, in order; with 'auto', both it may choose between after the reward model."""
        jobs = {"ppo": self.ppo, "dpo": self.dpo, "grpo": self.grpo}
        chosen = dict.fromkeys([self.config.round.trusted_optimizer, "dpo"]) if optimizer == "auto" else [optimizer]
        trains = [jobs[name]() for name in chosen]
        return [self.reward_model()] + trains + [self.predictor(), self.generation()]


# What lowers each job's peak, for a round that would not fit.
LOWER = {
    "reward model": "lower [reward_model] batch_size (raising gradient_accumulation with a LoRA model), or turn on its "
                    "gradient_checkpointing",
    "PPO": "turn on [ppo] gradient_checkpointing, or lower [ppo] minibatch_size",
    "DPO": "lower [dpo] batch_size",
    "GRPO": "raise [grpo] minibatches",
    "predictor": "lower [generation] batch_size",
    "completions": "lower [generation] batch_size",
}


def describe(jobs: list[JobMemory], prompt_tokens: int, on_gpu: bool, available_gb: float) -> str:
    """One line for `tether status` and `tether init`: the round's expected peak, its largest job and that job's
    parts, and what to change when it is more than the `available_gb` of the GPU or the machine."""
    largest = max(jobs, key=lambda j: j.peak)
    where = "GPU memory" if on_gpu else "resident memory"
    parts = (f"runtime {largest.runtime / GB:.2f}, weights {largest.weights / GB:.2f}, adapters {largest.adapters / GB:.2f}, "
             f"activations {largest.activations / GB:.2f}")
    others = ", ".join(f"{j.job} {j.peak / GB:.1f}" for j in jobs if j is not largest)
    line = (f"{largest.peak / GB:.1f} GB of {where} at the round's peak, in its {largest.job} job ({parts}); "
            f"{others}; for prompts of up to {prompt_tokens} tokens")
    if largest.peak / GB > available_gb:
        line += f". That is more than the {available_gb:.0f} GB here: {LOWER[largest.job]}"
    return line


def round_memory(config, optimizer: str, prompts: list, on_gpu: bool | None = None) -> tuple[list[JobMemory], int, bool]:
    """The expected peak of each job of a round with `optimizer`, for a project's settings (train.common.config sections
    under .model, .generation, .reward_model, .ppo, .dpo and .grpo) and chat prompts; the prompt length it assumed,
    and whether the jobs run on a GPU ([model] device unless said). The prompts count at their longest, or with
    none yet, at the longest [reward_model] max_length leaves beside a response of [generation] max_new_tokens."""
    from train.common.device import device
    from train.common.models import load_tokenizer, resolve_model_path

    path = resolve_model_path(config.model.name_or_path)
    if prompts:
        tokenizer = load_tokenizer(path)
        prompt_tokens = max(
            len(tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]) for m in prompts
        )
    else:
        prompt_tokens = max(config.reward_model.max_length - config.generation.max_new_tokens, 1)
    on_gpu = device(config.model).type == "cuda" if on_gpu is None else on_gpu
    return Estimator(model_shape(path), config, prompt_tokens, on_gpu).round(optimizer), prompt_tokens, on_gpu


# The share of the GPU's or the machine's memory a round may expect to use: the rest is for what the estimate
# leaves out (the allocator's slack, CUDA's kernels, other processes).
HEADROOM = 0.9


def fit_to_memory(config, optimizer: str, on_gpu: bool, available_gb: float) -> list[str]:
    """Lower the settings of a round's largest job, a step at a time, until every job's expected peak for the longest
    prompts the settings allow is within HEADROOM of `available_gb`, or nothing more can be lowered in any job over it;
    each change, in words, the last of each setting. The reward model's batches keep their size through gradient
    accumulation."""
    changes: dict[str, str] = {}
    while True:
        jobs = sorted(round_memory(config, optimizer, [], on_gpu)[0], key=lambda job: job.peak, reverse=True)
        over = [job.job for job in jobs if job.peak > HEADROOM * available_gb * GB]
        change = next(filter(None, (_lower(config, job) for job in over)), None)  # the largest that can still be lowered
        if change is None:
            return list(changes.values())
        changes[change.split(" = ")[0]] = change


def _lower(config, job: str) -> str | None:
    """Change one setting of `config` that lowers `job`'s peak, and say which; None when none is left to lower."""
    rm, ppo, dpo, grpo, generation = config.reward_model, config.ppo, config.dpo, config.grpo, config.generation
    if job == "reward model" and rm.kind == "head" and rm.batch_size % 2 == 0:
        config.reward_model = replace(rm, batch_size=rm.batch_size // 2)
        return f"[reward_model] batch_size = {rm.batch_size // 2}"
    if job == "reward model" and not rm.checkpointing(config.model):
        config.reward_model = replace(rm, gradient_checkpointing=True)
        return "[reward_model] gradient_checkpointing = true"
    if job == "reward model" and rm.batch_size % 2 == 0:
        config.reward_model = replace(rm, batch_size=rm.batch_size // 2, gradient_accumulation=2 * rm.gradient_accumulation)
        return f"[reward_model] batch_size = {rm.batch_size // 2} with gradient_accumulation = {2 * rm.gradient_accumulation}"
    if job == "PPO" and not ppo.checkpointing(config.model.quantization != "none"):
        config.ppo = replace(ppo, gradient_checkpointing=True)
        return "[ppo] gradient_checkpointing = true"
    if job == "PPO" and ppo.minibatch_size % 2 == 0:
        config.ppo = replace(ppo, minibatch_size=ppo.minibatch_size // 2)
        return f"[ppo] minibatch_size = {ppo.minibatch_size // 2}"
    if job == "DPO" and dpo.batch_size % 2 == 0:
        config.dpo = replace(dpo, batch_size=dpo.batch_size // 2)
        return f"[dpo] batch_size = {dpo.batch_size // 2}"
    if job == "GRPO" and (grpo.prompts_per_step * grpo.group_size) % (2 * grpo.minibatches) == 0:
        config.grpo = replace(grpo, minibatches=2 * grpo.minibatches)
        return f"[grpo] minibatches = {2 * grpo.minibatches}"
    if job in ("predictor", "completions") and generation.batch_size % 2 == 0:
        config.generation = replace(generation, batch_size=generation.batch_size // 2)
        return f"[generation] batch_size = {generation.batch_size // 2}"
    return None
