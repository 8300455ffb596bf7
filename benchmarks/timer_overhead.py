"""What ddp_core's timers cost, measured inside one process (or one process per rank under torchrun).

    python benchmarks/timer_overhead.py                           # 1 rank
    torchrun --standalone --nproc-per-node 2 benchmarks/timer_overhead.py

Two copies of the same model train side by side with ddp_core's own `train_step`: one with the
phase timers and the timed all-reduce hook, one with neither (DDP's default hook). Blocks of steps
alternate between them in ABBA order, so the noise of a shared machine, which separate processes
see differently, falls on both alike. Prints throughput with timers / without.
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

    def side(timed: bool):
        torch.manual_seed(0)
        model = TransformerClassifier(config)
        timer = EpochTimer(torch.device("cpu"), enabled=timed)
        if world_size > 1:
            model = DistributedDataParallel(model)
            if timed:
                model.register_comm_hook(None, timer.timed(default_hooks.allreduce_hook))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(10))
        return model, timer, optimizer, scheduler

    sides = {True: side(True), False: side(False)}
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    seconds = {True: 0.0, False: 0.0}
    for block in range(-1, BLOCKS):  # block -1 warms both sides up and is not counted
        for timed in ((True, False) if block % 2 == 0 else (False, True)):
            model, timer, optimizer, scheduler = sides[timed]
            timer.begin_epoch()
            if world_size > 1:
                dist.barrier()
            start = time.perf_counter()
            for _ in range(STEPS_PER_BLOCK):
                train_step(model, iter([(ids, labels)]), 1, timer, optimizer, scheduler, scaler, contextlib.nullcontext)
            elapsed = time.perf_counter() - start
            timer.summary()
            if block >= 0:
                seconds[timed] += elapsed
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"timers on / off ({world_size} rank{'s' if world_size > 1 else ''}, in one process): "
              f"{seconds[False] / seconds[True]:.3f}", flush=True)
    if world_size > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
