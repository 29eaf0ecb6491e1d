"""Batches that shrink when the GPU runs out of memory, for generation, scoring and PPO's rollouts."""

import sys
from typing import Callable, TypeVar

import torch

from train.common.errors import ModelError

T = TypeVar("T")
R = TypeVar("R")

# The batch size each kind of work was halved to in this process (one job): once a batch of some
# size ran out of memory, later batches of the same work start at the size that fitted.
_fitted: dict[str, int] = {}


def in_batches(items: list[T], size: int, run: Callable[[list[T]], list[R]], what: str,
               on_done: Callable[[int], None] | None = None) -> list[R]:
    """run(batch) over items in batches of at most `size`, the results in item order.

    A batch that runs out of GPU memory is halved and tried again, and the job's log says so;
    a single item that does not fit is a ModelError. on_done(count) follows each batch.
    """
    size = min(size, _fitted.get(what, size))
    results: list[R] = []
    while len(results) < len(items):
        batch = items[len(results) : len(results) + size]
        try:
            results += run(batch)
        except torch.OutOfMemoryError:
            out_of_memory = True
        else:
            out_of_memory = False
            if on_done is not None:
                on_done(len(results))
        if out_of_memory:  # outside the except block, so that its traceback's tensors are freed first
            if size == 1:
                raise ModelError(f"{what} ran out of GPU memory on a batch of 1: use a smaller model, "
                                 'quantization = "4bit", or shorter max_new_tokens / max_length')
            size = _fitted[what] = size // 2
            torch.cuda.empty_cache()
            print(f"out of GPU memory in {what}: batch size halved to {size}, and retried", file=sys.stderr, flush=True)
    return results
