"""The bytes one step hands to each collective, counted where PyTorch dispatches them.

DDP, ZeRO-1 and FSDP2 all reach the process group through the `c10d` operators. A dispatch mode therefore sees each
collective once, whether C++ or Python issued it.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# The mode sees every other operator too and slows its step several times over, so one step is counted.
# The third: at the second, DDP rebuilds its buckets in the order backward filled them and broadcasts that order.
COUNTED_STEP = 3
UNCOUNTED = ("barrier", "monitored_barrier_")  # c10d operators that carry no data


def collective_bytes(name: str, args) -> int:
    """The size in bytes of a `c10d` collective called with `args`: the whole tensor it is about."""
    # An all-reduce's or a broadcast's tensors and an all-gather's output come first; a reduce-scatter's input second.
    # What a node sends depends on the algorithm: `ddp_core.analysis.zero` converts one into the other for gloo's.
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
    """Counts the collectives of this process's COUNTED_STEP-th step when `enabled`. Then `counted` maps each operator
    to its calls and bytes. Before that step, and in shorter runs, it is None."""

    def __init__(self, enabled: bool):
        self.enabled, self.counted, self.steps = enabled, None, 0

    def around_step(self):
        """The dispatch mode around the step to count, else nothing."""
        self.steps += 1
        if not self.enabled or self.steps != COUNTED_STEP:
            return contextlib.nullcontext()
        self.counted = defaultdict(lambda: {"calls": 0, "bytes": 0})
        return _Counting(self.counted)
