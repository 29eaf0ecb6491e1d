"""The device [model] names, and whether [model]'s GPU and quantisation settings run on this machine: what loading the
base checks first, and what a command checks before it queues a job.

Torch alone, and bitsandbytes when a quantisation is set: transformers would add seconds to every such command.
"""

import functools
import os
import warnings

import torch

from train.common.config import ModelConfig
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


def device(config: ModelConfig) -> torch.device:
    """The device [model] device names; "auto" and "cuda" mean this process's own GPU when there is one.

    Under accelerate launch each process has its own GPU, cuda:LOCAL_RANK; alone it is cuda:0.
    """
    if config.device == "cpu" or (config.device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if config.device in ("auto", "cuda"):
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device(config.device)
