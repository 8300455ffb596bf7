"""What ddp_core's measurements cost, measured inside one process (or one process per rank under torchrun).

    python benchmarks/measurement_overhead.py                           # 1 rank: the timers
    torchrun --standalone --nproc-per-node 2 benchmarks/measurement_overhead.py  # + the gradient noise scale

Copies of one model train side by side with ddp_core's own `train_step`, with and without each measurement.
Separate processes see a shared machine's noise differently, so one process runs them all.
Prints throughput without / with each: the noise scale's target is 0.99 or more.
"""

from __future__ import annotations

import contextlib
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from ddp_core.engine.model import TransformerClassifier
from ddp_core.engine.model_shape import ModelConfig
from ddp_core.engine.noise_scale import GradientNoise
from ddp_core.engine.timers import EpochTimer
from ddp_core.engine.runtime import threads_per_rank
from ddp_core.train import lr_factor, train_step

BLOCKS, STEPS_PER_BLOCK, GLOBAL_BATCH, SEQ_LEN = 16, 6, 32, 128


def main() -> None:
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1:
        dist.init_process_group("gloo")
    torch.set_num_threads(threads_per_rank(int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    config = ModelConfig.from_preset("small", vocab_size=20000, max_len=SEQ_LEN, num_classes=2)
    batch = GLOBAL_BATCH // world_size
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, config.vocab_size, (batch, SEQ_LEN), generator=generator)
    labels = torch.randint(0, 2, (batch,), generator=generator)

    def side(timed: bool, noise_scale: bool):
        torch.manual_seed(0)
        model = TransformerClassifier(config)
        timer, noise = EpochTimer(torch.device("cpu"), enabled=timed), GradientNoise()
        if world_size > 1:
            model = DistributedDataParallel(model)
            hook = timer.timed(default_hooks.allreduce_hook) if timed else default_hooks.allreduce_hook
            if noise_scale:
                hook = noise.measured(hook)
            if hook is not default_hooks.allreduce_hook:
                model.register_comm_hook(None, hook)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(10))
        return model, timer, noise, optimizer, scheduler

    # neither: DDP's default hook, no phase timers, no noise scale's squared norms.
    # timers: the phase timers and the timed all-reduce hook. On 2 or more ranks, both, as a run measures by default.
    names = ["neither", "timers"] + (["timers + noise scale"] if world_size > 1 else [])
    sides = {name: side(name != "neither", "noise" in name) for name in names}
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    seconds = dict.fromkeys(names, 0.0)
    # Blocks of steps rotate between the sides, each starting with another, so the machine's noise falls on all alike.
    for block in range(-1, BLOCKS):  # block -1 warms every side up and is not counted
        for name in names[block % len(names) :] + names[: block % len(names)]:
            model, timer, noise, optimizer, scheduler = sides[name]
            timer.begin_epoch()
            noise.begin_epoch()
            if world_size > 1:
                dist.barrier()
            start = time.perf_counter()
            for _ in range(STEPS_PER_BLOCK):
                train_step(model, iter([(ids, labels)]), 1, timer, optimizer, scheduler, scaler, contextlib.nullcontext)
            noise.sums()
            elapsed = time.perf_counter() - start
            timer.summary()
            if block >= 0:
                seconds[name] += elapsed
    if int(os.environ.get("RANK", "0")) == 0:
        where = f"{world_size} rank{'s' if world_size > 1 else ''}, in one process"
        print(f"timers on / off ({where}): {seconds['neither'] / seconds['timers']:.3f}", flush=True)
        if world_size > 1:
            print(
                f"noise scale on / off, timers on ({where}): {seconds['timers'] / seconds['timers + noise scale']:.3f}",
                flush=True,
            )
    if world_size > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
