"""What each rank keeps of the model's training state (`--sharding`), after ZeRO (Rajbhandari et al., SC 2020).

- none: all of it on every rank (DDP).
- zero1: the optimizer's state in 1/N shards (DDP with `ZeroRedundancyOptimizer`).
- zero2: the gradients too (FSDP2).
- zero3: the parameters as well (FSDP2).

A checkpoint holds the whole state in every mode, so a run resumes exactly and its weights read like any other run's.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from ddp_core.engine.config import FSDP_MODES

# FSDP2, DTensor and ZeroRedundancyOptimizer are imported where a mode uses them: importing them (sympy among them)
# took 1.2 s of every rank's 2.4 s start, 8 ranks at once on 2 cores, for runs that mostly shard nothing.


def is_fsdp(module: nn.Module) -> bool:
    """Whether FSDP2 wraps `module`. Nothing does where FSDP2 was never imported."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(module, fsdp.FSDPModule)


def is_sharded(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is a DTensor, one of FSDP2's shards. None is where DTensor was never imported."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    return dtensor is not None and isinstance(tensor, dtensor.DTensor)


def shard_model(model: nn.Module, sharding: str, device: torch.device) -> nn.Module:
    """The model, its parameters sharded in place among the ranks where the mode shards them."""
    if sharding in FSDP_MODES:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        # A mesh of the ranks' own device type: left to itself, FSDP2 takes a CUDA mesh wherever CUDA is present,
        # even for ranks that train on the CPU beside a GPU they do not use.
        mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
        # Each block is a unit of its own, then the root holds the rest: under ZeRO-3 a rank holds whole at most the
        # root's parameters and one block's. zero3 gathers a block's for its forward and again for its backward;
        # zero2 keeps them whole in between, its gradients reduce-scattered instead of all-reduced.
        for block in model.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=sharding == "zero3")
        # The root (embeddings, head) stays gathered from forward to backward in both modes, as FSDP2 leaves a root
        # by default: backward needs it at once, so freeing it would save no memory at the peak and cost a gather.
        fully_shard(model, mesh=mesh, reshard_after_forward=False)
    return model


def adamw(model: nn.Module, sharding: str, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW over the model's parameters, its shards of them under FSDP2, with its state sharded under zero1."""
    # Fused: one pass per tensor, a few kernels on a GPU, instead of a dozen elementwise operations. A CPU's default,
    # the per-tensor loop, took 4-5 times as long.
    if sharding == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        # Each rank steps the parameters its shard of the state covers and broadcasts them to the others.
        return ZeroRedundancyOptimizer(
            model.parameters(), optimizer_class=torch.optim.AdamW, lr=lr, weight_decay=weight_decay, fused=True
        )
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, fused=True)


def whole_state(model: nn.Module, optimizer: torch.optim.Optimizer, sharding: str) -> tuple[dict, dict | None]:
    """The model's and the optimizer's state as one rank would hold them without sharding, on rank 0. Elsewhere the
    optimizer's is None, and under FSDP2 both are empty. Every rank must call it, since gathering is a collective."""
    if sharding in FSDP_MODES:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        whole = StateDictOptions(full_state_dict=True, cpu_offload=True)  # the whole state, on rank 0 only
        return get_model_state_dict(model, options=whole), get_optimizer_state_dict(model, optimizer, options=whole)
    if sharding == "zero1":
        optimizer.consolidate_state_dict(to=0)
        return model.state_dict(), optimizer.state_dict() if torch.distributed.get_rank() == 0 else None
    return model.state_dict(), optimizer.state_dict()


def load_whole_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, sharding: str, model_state: dict, optimizer_state: dict
) -> None:
    """`whole_state`'s dicts, which every rank has read, loaded into each rank's shards."""
    if sharding in FSDP_MODES:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        whole = StateDictOptions(full_state_dict=True)
        set_model_state_dict(model, model_state, options=whole)
        set_optimizer_state_dict(model, optimizer, optimizer_state, options=whole)
        return
    model.load_state_dict(model_state)
    optimizer.load_state_dict(optimizer_state)
