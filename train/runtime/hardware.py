"""What this machine has: its GPU or CPU, its memory, and whether it computes fast in bfloat16.

Torch alone: `tether init` and `tether status` read these, and transformers would add seconds to either.
"""

import os

import torch

from train.common.config import Hardware, ModelConfig
from train.common.device import device

# ui/owner/jobs.py imports check_runs_here from here, where it lived until loading the base came to need it
# (train.common.device); issue 87 left that file to its own change. Drop this line once it imports from there.
from train.common.device import check_runs_here  # noqa: F401


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
