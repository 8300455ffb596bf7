"""What one rank holds of the training state, by kind, counted from the tensors' own storages.

It counts at the moments that tell the sharding modes apart (`ddp_core.engine.sharding`), keeping the epoch's largest.
Activations, a collective's buffers and the whole gradient FSDP2 holds briefly before reducing it are not counted.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddp_core.engine.run_files import STATE_COLUMNS
from ddp_core.engine.sharding import is_fsdp, is_sharded


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors`, so views sharing a storage count it once."""
    seen = {}  # None counts nothing; a DTensor, FSDP2's shard, counts its local part, padding included
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
    """The bytes of gradients this rank holds: DDP's buckets, else the parameters' gradients."""
    # DDP keeps its buckets from step to step, and its gradients are views into them (`gradient_as_bucket_view`).
    if isinstance(model, DistributedDataParallel):
        sizes = str(model._get_ddp_logging_data().get("bucket_sizes", ""))
        return sum(int(size) for size in sizes.split(",") if size.strip())
    return storage_bytes(p.grad for p in model.parameters())


class StateCensus:
    """The epoch's largest bytes of each kind in STATE_COLUMNS that one rank held. It counts every step, since a pass
    over some storages costs microseconds against a step."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer
        self.largest = dict.fromkeys(STATE_COLUMNS, 0)
        self.gathered = 0  # the most bytes of FSDP2's parameters seen whole at once
        # The parameters at their most. Under DDP and ZeRO-1 that is every rank's whole copy.
        model.register_forward_hook(lambda *_: self._note("parameters_bytes", storage_bytes(model.parameters())))
        # Under FSDP2, the shards plus what is gathered whole as each unit starts its forward: its own and its parents'.
        # ZeRO-3 then holds the root's embedding and head beside one block's; ZeRO-2 holds all, until backward ends.
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
        self._note("gradients_bytes", gradient_bytes(self.model))  # DDP's buckets, or a shard under FSDP2
        # The optimizer's state: whole under DDP, 1/N of it under every ZeRO.
        self._note("optimizer_state_bytes", storage_bytes(optimizer_state(self.optimizer)))

    def between_steps(self) -> None:
        # DDP keeps its buckets from step to step; FSDP2 frees its gradient shards.
        self._note("gradients_kept_bytes", gradient_bytes(self.model))
