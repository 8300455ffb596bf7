"""The bytes one step hands to each collective, counted where PyTorch dispatches them. DDP's reducer, ZeRO-1's
broadcasts and FSDP2's gathers and reduce-scatters all reach the process group through the `c10d` operators, so a
dispatch mode sees each of them once, whoever issued it, in C++ or in Python. The mode sees every other operator of
the step too, which slows that step several times over: the trainer counts one step only (--count-collectives), the
third: DDP rebuilds its buckets in the order backward filled them at the second, and broadcasts the new order.

A collective's size is the tensor it is about, whole: the tensors an all-reduce or a broadcast carries, the output an
all-gather fills, the input a reduce-scatter splits. What a node sends for it depends on the algorithm
(`ddp_core.analysis.zero` turns one into the other for gloo's)."""

from __future__ import annotations

import contextlib
from collections import defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

COUNTED_STEP = 3
UNCOUNTED = ("barrier", "monitored_barrier_")  # c10d operators that carry no data


def collective_bytes(name: str, args) -> int:
    """The size of a `c10d` collective called with `args`, in bytes (see the module's docstring): its first argument
    (the tensors an all-reduce or a broadcast carries, the output an all-gather fills), a reduce-scatter's second
    (the input it splits)."""
    tensors = args[1] if "reduce_scatter" in name else args[0]
    return sum(t.numel() * t.element_size() for t in _flatten(tensors))


def _flatten(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _flatten(item)


class _Counting(TorchDispatchMode):
    def __init__(self, counted: dict):
        super().__init__()
        self.counted = counted

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if func.namespace == "c10d" and name not in UNCOUNTED:
            entry = self.counted[name]
            entry["calls"] += 1
            entry["bytes"] += collective_bytes(name, args)
        return func(*args, **(kwargs or {}))


class CollectiveCensus:
    """Counts the collectives of the COUNTED_STEP-th step this process trains when `enabled`: `counted` is then
    {operator: {"calls", "bytes"}}, None before (and in a run of fewer steps)."""

    def __init__(self, enabled: bool):
        self.enabled, self.counted, self.steps = enabled, None, 0

    def around_step(self):
        """The dispatch mode around the step to count, else nothing."""
        self.steps += 1
        if not self.enabled or self.steps != COUNTED_STEP:
            return contextlib.nullcontext()
        self.counted = defaultdict(lambda: {"calls": 0, "bytes": 0})
        return _Counting(self.counted)
