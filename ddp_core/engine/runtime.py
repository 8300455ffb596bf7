"""Where a process sits in the job and what it runs on: rank, device, backend and CPU threads.

Each is decided here only. The trainer, the launchers and the benchmarks call these functions rather than deciding
again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ddp_core.engine.config import TrainConfig, UsageError, world_size_from_env


@dataclass
class Runtime:
    """Where this process sits in the job, as torchrun's environment says."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device
    backend: str
    threads_per_rank: int

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def leader(self) -> bool:
        return self.rank == 0


def usable_cores() -> int:
    """Cores this process may run on: a SLURM or taskset allocation, not the whole machine."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def threads_per_rank(local_world_size: int, requested: int | None = None) -> int:
    """CPU threads for each of the ranks on this node: the usable cores divided among them, at least one.
    More threads than that would make the ranks time-slice the same cores."""
    return requested or max(1, usable_cores() // local_world_size)


def visible_gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_gpus(cfg: TrainConfig, local_world_size: int, gpus: int) -> None:
    """--device cuda and --backend nccl need a GPU for each rank on the node."""
    for wanted, option in ((cfg.device == "cuda", "--device cuda"), (cfg.backend == "nccl", "--backend nccl")):
        if wanted and gpus < local_world_size:
            raise UsageError(
                f"{option} needs a CUDA GPU per local rank: {local_world_size} local rank(s), {gpus} "
                f"GPU(s) (on a machine without, use --device cpu and --backend gloo, or auto)"
            )


def resolve_runtime(cfg: TrainConfig) -> Runtime:
    env = os.environ
    world_size, local_world_size = world_size_from_env(), int(env.get("LOCAL_WORLD_SIZE", 1))
    rank, local_rank = int(env.get("RANK", 0)), int(env.get("LOCAL_RANK", 0))
    gpus = visible_gpus()
    check_gpus(cfg, local_world_size, gpus)
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and gpus >= local_world_size and cfg.backend != "gloo")
    backend = cfg.backend if cfg.backend != "auto" else ("nccl" if use_cuda else "gloo")
    if cfg.comm_hook == "bf16" and backend != "nccl":
        raise UsageError(
            "--comm-hook bf16 needs NCCL (DDP accepts its bf16 hook on no other backend), and this run "
            "has no GPU per rank: use --comm-hook fp16"
        )
    if cfg.amp == "fp16" and not use_cuda:  # --device cpu is refused when parsed; auto resolves to the CPU only here
        raise UsageError("--amp fp16 needs a CUDA device, and this run has no GPU per rank: use --amp bf16 on CPU")
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    return Runtime(
        rank,
        local_rank,
        world_size,
        local_world_size,
        device,
        backend,
        threads_per_rank(local_world_size, cfg.threads_per_rank),
    )


def place_process(rt: Runtime) -> None:
    """Give this process its threads and its GPU."""
    torch.set_num_threads(rt.threads_per_rank)
    if rt.device.type == "cuda":
        torch.cuda.set_device(rt.device)
