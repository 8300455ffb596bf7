"""What one rank holds of the training state, by kind, counted from the tensors themselves: the bytes of every
distinct storage behind the parameters, the gradients and the optimizer's state (activations apart). A sharded
tensor (FSDP2's DTensor) counts its rank's part, padding included; views sharing a storage count it once.

The moments that tell the sharding modes apart (`ddp_core.engine.sharding`):
- the parameters at their most: under DDP and ZeRO-1 every rank's whole copy; under FSDP2 (ZeRO-2, ZeRO-3) the
  rank's shards of every parameter plus the parameters gathered whole at that moment, counted as each of FSDP2's
  units starts its forward (its own gathered, and its parents' still gathered: ZeRO-3 holds the root's parameters,
  the embedding and the head, beside one block's; ZeRO-2 all of them, from forward to the end of backward);
- just before the optimizer steps, the gradients: DDP's buckets (the gradients are views into them), a shard under
  FSDP2; and the optimizer's state, whole under DDP, 1/N of it under every ZeRO;
- between steps, the gradients still held: DDP keeps its buckets from step to step, FSDP2 frees its shards.
Each is the largest the rank saw in the epoch; the run writes the largest over the ranks (ZeRO-1 gives each rank
whole parameters, so its shards differ in size). Not counted: a gradient whole for the moment before FSDP2 reduces
it to a shard, and a collective's buffers.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddp_core.engine.run_files import STATE_COLUMNS
from ddp_core.engine.sharding import is_fsdp, is_sharded


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (a DTensor: its local part; None: nothing)."""
    seen = {}
    for tensor in tensors:
        if tensor is None:
            continue
        local = tensor.to_local() if is_sharded(tensor) else tensor
        storage = local.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def optimizer_state(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The tensors of the optimizer's state on this rank (ZeRO-1's: the inner optimizer's, over its own shard)."""
    inner = getattr(optimizer, "optim", optimizer)
    return [value for state in inner.state.values() for value in state.values() if isinstance(value, torch.Tensor)]


def gradient_bytes(model: nn.Module) -> int:
    """The gradients this rank holds: DDP's buckets, which it keeps from step to step (its gradients are views into
    them, `gradient_as_bucket_view`), else the parameters' gradients."""
    if isinstance(model, DistributedDataParallel):
        sizes = str(model._get_ddp_logging_data().get("bucket_sizes", ""))
        return sum(int(size) for size in sizes.split(",") if size.strip())
    return storage_bytes(p.grad for p in model.parameters())


class StateCensus:
    """The epoch's largest bytes of each kind (STATE_COLUMNS) one rank held at the module docstring's moments. It
    counts every step: a pass over some tensors' storages, microseconds against a step."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer
        self.largest = dict.fromkeys(STATE_COLUMNS, 0)
        self.gathered = 0  # the most bytes of FSDP2's parameters seen whole at once
        model.register_forward_hook(lambda *_: self._note("parameters_bytes", storage_bytes(model.parameters())))
        for unit in (m for m in model.modules() if is_fsdp(m)):  # after FSDP2's own hook has gathered
            unit.register_forward_pre_hook(lambda *_: self._note_gathered())
        optimizer.register_step_pre_hook(lambda *_: self._before_step())

    def begin_epoch(self) -> None:
        self.largest = dict.fromkeys(STATE_COLUMNS, 0)
        self.gathered = 0

    def _note(self, kind: str, size: int) -> None:
        self.largest[kind] = max(self.largest[kind], size)

    def _note_gathered(self) -> None:
        whole = storage_bytes(p for p in self.model.parameters() if not is_sharded(p))
        self.gathered = max(self.gathered, whole)

    def _before_step(self) -> None:
        # Under FSDP2 every parameter is a shard here; the ones gathered earlier were held beside their shards.
        self._note("parameters_bytes", storage_bytes(self.model.parameters()) + self.gathered)
        self._note("gradients_bytes", gradient_bytes(self.model))
        self._note("optimizer_state_bytes", storage_bytes(optimizer_state(self.optimizer)))

    def between_steps(self) -> None:
        self._note("gradients_kept_bytes", gradient_bytes(self.model))
