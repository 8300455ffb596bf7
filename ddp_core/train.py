"""Train a transformer text classifier with DistributedDataParallel, one row of metrics per epoch.

    python -m ddp_core.train --dataset imdb --global-batch-size 64                      # 1 process
    torchrun --nproc-per-node 4 -m ddp_core.train --dataset imdb --global-batch-size 64 # 4 ranks

Synchronous data-parallel SGD: every rank holds the same model, trains on its own shard of each
global batch, and DDP averages the gradients across ranks during backward, so each optimizer step
equals one step on the whole global batch. A 1-rank run uses no process group and no DDP wrapper:
it is the plain baseline that speedups are measured against.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler
from tqdm import tqdm

from ddp_core.config import (CHECKPOINT_NAME, TrainConfig, UsageError, differing_settings, global_batch_size,
                             micro_batch_size, parse_args)
from ddp_core.data import EncodedData, load_data
from ddp_core.model import ModelConfig, TransformerClassifier, count_parameters
from ddp_core.run_files import append_metrics_row, drop_metrics_after, environment, now_iso, save_atomic
from ddp_core.timers import EpochTimer


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


def usable_cores() -> int:
    """Cores this process may run on: a SLURM or taskset allocation, not the whole machine."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def resolve_runtime(cfg: TrainConfig) -> Runtime:
    env = os.environ
    world_size, local_world_size = int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_WORLD_SIZE", 1))
    rank, local_rank = int(env.get("RANK", 0)), int(env.get("LOCAL_RANK", 0))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and gpus >= local_world_size and cfg.backend != "gloo")
    if use_cuda and gpus < local_world_size:
        raise UsageError(f"--device cuda needs a GPU per local rank: {local_world_size} local rank(s), {gpus} GPU(s)")
    backend = cfg.backend if cfg.backend != "auto" else ("nccl" if use_cuda else "gloo")
    if backend == "nccl" and not use_cuda:
        raise UsageError(f"--backend nccl needs a CUDA GPU per local rank; found {gpus} GPU(s) for "
                         f"{local_world_size} local rank(s) (use --backend gloo on CPU)")
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    threads = cfg.threads_per_rank or max(1, usable_cores() // local_world_size)
    return Runtime(rank, local_rank, world_size, local_world_size, device, backend, threads)


def lr_factor(warmup_steps: int):
    """Linear warm-up, then decay as 1/sqrt(step). The schedule has no horizon, so a run resumed with
    more --epochs follows exactly the schedule it would have followed had it asked for them at the start."""
    warmup = max(1, warmup_steps)
    return lambda step: min((step + 1) / warmup, (warmup / (step + 1)) ** 0.5)


def batches(data_ids: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor, batch_size: int, device):
    """Full micro-batches of this rank's indices, moved to the device."""
    for start in range(0, len(indices) - batch_size + 1, batch_size):
        idx = indices[start:start + batch_size]
        yield data_ids[idx].to(device, non_blocking=True).long(), labels[idx].to(device, non_blocking=True)


def train_step(model, micro_batches, grad_accum: int, timer: EpochTimer, optimizer, scheduler, scaler,
               autocast) -> torch.Tensor:
    """One optimizer step over `grad_accum` micro-batches; DDP all-reduces the gradients on the last one only.
    Returns the summed (not averaged) loss of the step's samples, left on the device."""
    timer.begin_step()
    loss_sum = 0.0
    for k in range(grad_accum):
        with timer.phase("data"):
            ids, labels = next(micro_batches)
        last_micro_step = k == grad_accum - 1
        with contextlib.nullcontext() if last_micro_step or not isinstance(model, DistributedDataParallel) \
                else model.no_sync():
            with timer.phase("forward"), autocast():
                loss = F.cross_entropy(model(ids).float(), labels)
            with timer.phase("backward"):
                scaler.scale(loss / grad_accum).backward()
        loss_sum = loss_sum + loss.detach() * len(labels)
    with timer.phase("optimizer"):
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
    return loss_sum


def all_reduce(values: list[float], op, rt: Runtime) -> list[float]:
    if not rt.distributed:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=rt.device)
    dist.all_reduce(tensor, op=op)
    return tensor.tolist()


@torch.no_grad()
def evaluate(model, data: EncodedData, batch_size: int, rt: Runtime, autocast) -> tuple[float, float]:
    """Loss and accuracy over the WHOLE evaluation set: each rank takes every world_size-th sample, no padding."""
    model.eval()
    indices = torch.arange(rt.rank, len(data.eval_labels), rt.world_size)
    loss_sum = torch.zeros((), dtype=torch.float64, device=rt.device)
    correct = torch.zeros((), dtype=torch.float64, device=rt.device)
    for start in range(0, len(indices), batch_size):
        idx = indices[start:start + batch_size]
        ids, labels = data.eval_ids[idx].to(rt.device).long(), data.eval_labels[idx].to(rt.device)
        with autocast():
            logits = model(ids).float()
        loss_sum += F.cross_entropy(logits, labels, reduction="sum")
        correct += (logits.argmax(-1) == labels).sum()
    total_loss, total_correct = all_reduce([loss_sum.item(), correct.item()], dist.ReduceOp.SUM, rt)
    model.train()
    return total_loss / len(data.eval_labels), total_correct / len(data.eval_labels)


def peak_memory_mb(device: torch.device) -> float:
    """Peak allocated CUDA memory this epoch on a GPU; on a CPU the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def new_run_dir(cfg: TrainConfig, world_size: int) -> Path:
    stem = f"results/{cfg.dataset}-{cfg.preset}-n{world_size}-{datetime.now():%Y%m%d-%H%M%S}"
    for suffix in ["", *(f"-{i}" for i in range(2, 1000))]:
        path = Path(stem + suffix)
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise UsageError(f"could not create a unique run directory {stem}")


def load_checkpoint(cfg: TrainConfig, rt: Runtime) -> dict:
    ckpt = torch.load(Path(cfg.out) / CHECKPOINT_NAME, map_location=rt.device, weights_only=False)
    changed = differing_settings(ckpt["config"], cfg)
    if changed:
        raise UsageError(f"--resume: {', '.join(changed)} differ(s) from the run being resumed; "
                         f"resume with the same arguments (only --epochs may grow)")
    if ckpt["world_size"] != rt.world_size:
        raise UsageError(f"--resume: the run used {ckpt['world_size']} rank(s), this launch has {rt.world_size}")
    return ckpt


def train(cfg: TrainConfig) -> None:
    rt = resolve_runtime(cfg)
    torch.set_num_threads(rt.threads_per_rank)
    if rt.device.type == "cuda":
        torch.cuda.set_device(rt.device)
    if rt.distributed:
        dist.init_process_group(rt.backend)
    try:
        run(cfg, rt)
        if rt.distributed:
            dist.barrier()  # no rank tears gloo down while a peer is still talking to it
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run(cfg: TrainConfig, rt: Runtime) -> None:
    data = load_data(cfg, rt.local_rank)
    micro, global_batch = micro_batch_size(cfg, rt.world_size), global_batch_size(cfg, rt.world_size)
    steps = len(data.train_labels) // rt.world_size // micro // cfg.grad_accum
    if steps == 0:
        raise UsageError(f"{len(data.train_labels)} training samples make no full step of global batch {global_batch}")
    torch.manual_seed(cfg.seed)
    model_cfg = ModelConfig.from_preset(cfg.preset, vocab_size=cfg.vocab_size, max_len=cfg.seq_len,
                                        num_classes=data.num_classes, dropout=cfg.dropout)
    model = TransformerClassifier(model_cfg).to(rt.device)
    n_params = count_parameters(model)
    leader = rt.rank == 0
    if cfg.check:
        if leader:
            print(f"ddp_core: check passed: {len(data.train_labels)} train / {len(data.eval_labels)} eval samples, "
                  f"{n_params:,} parameters, {rt.world_size} rank(s) on {rt.device.type} with {rt.backend}")
        return

    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg.warmup_steps))
    scaler = torch.amp.GradScaler(rt.device.type, enabled=cfg.amp == "fp16")
    amp_dtype = torch.float16 if cfg.amp == "fp16" else torch.bfloat16

    def autocast():
        return torch.autocast(rt.device.type, dtype=amp_dtype, enabled=cfg.amp != "off")

    out = Path(cfg.out) if cfg.out else None
    first_epoch = 1
    if cfg.resume:
        ckpt = load_checkpoint(cfg, rt)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        scaler.load_state_dict(ckpt["scaler"])
        first_epoch = ckpt["epoch"] + 1
    if leader:
        out = out or new_run_dir(cfg, rt.world_size)
        out.mkdir(parents=True, exist_ok=True)
        run_info = json.loads((out / "run.json").read_text()) if cfg.resume else {
            "start_time": now_iso(), "resumed_at": [], "config": cfg.to_dict()}
        if cfg.resume:
            run_info["resumed_at"].append(now_iso())
            drop_metrics_after(out / "metrics.csv", first_epoch - 1)
        run_info.update(config=cfg.to_dict(), world_size=rt.world_size, local_world_size=rt.local_world_size,
                        backend=rt.backend, device=str(rt.device),
                        threads_per_rank=rt.threads_per_rank, parameters=n_params, model=vars(model_cfg),
                        per_rank_batch_size=micro, global_batch_size=global_batch, end_time=None,
                        **environment(rt.device))
        save_atomic(run_info, out / "run.json")
        print(f"ddp_core: run directory {out}", flush=True)

    timer = EpochTimer(rt.device, enabled=cfg.timers)
    ddp_model = model
    if rt.distributed:
        ddp_model = DistributedDataParallel(model, device_ids=[rt.device.index] if rt.device.type == "cuda" else None)
        if cfg.timers:
            ddp_model.register_comm_hook(None, timer.allreduce_hook)
    sampler = DistributedSampler(data.train_labels, num_replicas=rt.world_size, rank=rt.rank, shuffle=True,
                                 seed=cfg.seed, drop_last=True)

    for epoch in range(first_epoch, cfg.epochs + 1):
        torch.manual_seed(cfg.seed + 1000 * epoch + rt.rank)  # dropout masks a resumed run repeats exactly
        sampler.set_epoch(epoch)
        micro_batches = batches(data.train_ids, data.train_labels, torch.tensor(list(sampler)), micro, rt.device)
        if rt.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(rt.device)
        loss_sum = torch.zeros((), dtype=torch.float64, device=rt.device)
        timer.begin_epoch()
        epoch_start = time.perf_counter()
        for _ in tqdm(range(steps), desc=f"epoch {epoch}", disable=not (leader and cfg.progress), file=sys.stderr):
            loss_sum += train_step(ddp_model, micro_batches, cfg.grad_accum, timer, optimizer, scheduler, scaler,
                                   autocast)
        if rt.device.type == "cuda":
            torch.cuda.synchronize(rt.device)
        epoch_time = time.perf_counter() - epoch_start
        phases = timer.end_epoch()

        eval_start = time.perf_counter()
        val_loss, val_accuracy = evaluate(model, data, micro, rt, autocast)
        eval_time = time.perf_counter() - eval_start

        names = list(phases)
        summed = all_reduce([phases[n] for n in names] + [loss_sum.item()], dist.ReduceOp.SUM, rt)
        slowest = all_reduce([epoch_time, eval_time, peak_memory_mb(rt.device)], dist.ReduceOp.MAX, rt)
        samples = steps * global_batch
        row = {name: value / rt.world_size for name, value in zip(names, summed)}  # mean over ranks
        row.update(
            epoch=epoch, world_size=rt.world_size, global_batch_size=global_batch, per_rank_batch_size=micro,
            grad_accum=cfg.grad_accum, train_samples=samples, steps=steps, epoch_time_s=slowest[0],
            eval_time_s=slowest[1], train_loss=summed[-1] / samples, val_loss=val_loss, val_accuracy=val_accuracy,
            lr=scheduler.get_last_lr()[0], samples_per_s=samples / slowest[0], peak_memory_mb=slowest[2])
        if leader:
            append_metrics_row(out / "metrics.csv", row)
            save_atomic({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                         "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(), "epoch": epoch,
                         "config": cfg.to_dict(), "world_size": rt.world_size}, out / CHECKPOINT_NAME)
            print(f"ddp_core: epoch {epoch}: train_loss {row['train_loss']:.4f} val_loss {val_loss:.4f} "
                  f"val_accuracy {val_accuracy:.4f} {row['samples_per_s']:.1f} samples/s", flush=True)

    if leader:
        run_info["end_time"] = now_iso()
        save_atomic(run_info, out / "run.json")


def main(argv: list[str] | None = None) -> int:
    try:
        train(parse_args(argv))
    except UsageError as exc:
        print(f"ddp_core.train: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
