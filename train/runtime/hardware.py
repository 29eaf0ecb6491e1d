"""What this machine can run: its device, its memory, and whether [model]'s GPU and quantisation settings run here.

Torch alone, and bitsandbytes when a quantisation is set: a command checks these before it queues a job,
and transformers would add seconds to every such command.
"""

import functools
import os
import warnings

import torch

from train.common.config import Hardware, ModelConfig
from train.common.errors import ModelError

# transformers' own minimum for bitsandbytes quantisation (BITSANDBYTES_MIN_VERSION in transformers.utils.import_utils)
BITSANDBYTES_MIN_VERSION = "0.46.1"


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


def detect_hardware() -> Hardware:
    """The first CUDA GPU and its memory, or the CPU and the machine's memory."""
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(0)
        return Hardware("cuda", properties.name, properties.total_memory / 2**30)
    return Hardware("cpu", f"CPU with {os.cpu_count()} cores", machine_memory_gb())


def machine_memory_gb() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def free_bytes(target: torch.device) -> int:
    """Memory a new tensor on `target` can take now: a GPU's free memory with what torch's allocator holds unused; on
    the CPU, what Linux counts available (free, and the file cache it can drop), else the free pages."""
    if target.type == "cuda":
        free, _ = torch.cuda.mem_get_info(target)
        return free + torch.cuda.memory_reserved(target) - torch.cuda.memory_allocated(target)
    try:
        with open("/proc/meminfo") as meminfo:
            return next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


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
