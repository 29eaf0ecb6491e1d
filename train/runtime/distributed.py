"""The processes of one job under `accelerate launch`: which one this is, and the collectives jobs use.

The worker runs as one process, or as several under `accelerate launch` (DDP) when [worker] gpus
asks for more than one GPU. Each function here is the identity with one process, so every job
runs the same code either way. Processes meet only through torch.distributed's process group,
which accelerate sets up: gloo on CPUs, NCCL on GPUs.
"""

import sys
from functools import cache
from typing import Sequence, TypeVar

import torch
from accelerate import PartialState
from accelerate.utils import gather_object

T = TypeVar("T")


@cache
def state() -> PartialState:
    # accelerate's own CPU launcher needs MPI for several processes; its torchrun launcher also
    # starts them on a machine without CUDA, where cpu=True makes them meet through gloo.
    return PartialState(cpu=not torch.cuda.is_available())


def rank() -> int:
    return state().process_index


def world_size() -> int:
    return state().num_processes


def is_main() -> bool:
    return state().is_main_process


def shard(items: Sequence[T]) -> list[int]:
    """The indices of `items` this process works on: every world_size-th, from its rank."""
    return list(range(rank(), len(items), world_size()))


def gather(items: list[T]) -> list[T]:
    """Every process's list, concatenated in rank order, on every process."""
    return items if world_size() == 1 else gather_object(items)


def all_sum(values: torch.Tensor) -> torch.Tensor:
    """The element-wise sum of `values` over the processes (a new tensor)."""
    if world_size() == 1:
        return values
    total = values.detach().clone()
    torch.distributed.all_reduce(total)
    return total


def all_mean(stats: dict[str, float]) -> dict[str, float]:
    """Each statistic averaged over the processes, for numbers each process computed on its own part."""
    if world_size() == 1:
        return stats
    values = all_sum(torch.tensor(list(stats.values()), dtype=torch.float64, device=state().device)) / world_size()
    return dict(zip(stats, values.tolist()))


def average_gradients(parameters: list[torch.nn.Parameter]) -> None:
    """Replace each gradient by its mean over the processes, in one all-reduce, as DDP does after backward.

    Every process holds the same parameters, so the flat buffer lines up; a parameter without a
    gradient contributes zeros.
    """
    if world_size() == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
    flat = all_sum(torch.cat([g.reshape(-1).float() for g in grads])) / world_size()
    offset = 0
    for parameter, grad in zip(parameters, grads):
        size = grad.numel()
        parameter.grad = flat[offset : offset + size].view_as(grad).to(grad.dtype)
        offset += size


def wait_for_everyone() -> None:
    state().wait_for_everyone()


def close() -> None:
    """Leave the process group before exiting: a process that exits with gloo's threads still running can
    abort ("terminate called without an active exception") and fail a job whose work is done."""
    if world_size() > 1:
        state().destroy_process_group()


def report_share(count: int, what: str) -> None:
    """Say in the worker's log how much of the job this process did, so that the log shows every process took part."""
    print(f"process {rank()} of {world_size()}: {count} {what}", file=sys.stderr, flush=True)
