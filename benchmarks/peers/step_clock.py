"""Each step's time as ddp_core's timers take it, for a loop that is not ddp_core's: from the end of the step
before (the epoch's start, for its first) to the end of this one, on the device's timeline (CUDA events on a
GPU, never a synchronisation per step). Rank 0 writes them to steps.csv in ddp_core's columns, so the peers
benchmark reads every loop's steps alike."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from ddp_core.engine.timers import Clock


class StepClock:
    def __init__(self, device: torch.device):
        self.clock = Clock(device)
        self.clock.reset()  # every timestamp is read as seconds from here
        self.epochs: list[tuple[int, object, list]] = []  # (epoch, its start, its step ends)

    def start_epoch(self, epoch: int) -> None:
        self.epochs.append((epoch, self.clock.now(), []))

    def step_done(self) -> None:
        self.epochs[-1][2].append(self.clock.now())

    def save(self, out: str, leader: bool) -> None:
        if not leader:
            return
        if self.clock.cuda:
            torch.cuda.synchronize()
        rows = []
        for epoch, start, ends in self.epochs:
            seconds = [self.clock.seconds(stamp) for stamp in [start, *ends]]
            rows += [
                {"epoch": epoch, "step": k + 1, "step_time_s": b - a}
                for k, (a, b) in enumerate(zip(seconds, seconds[1:]))
            ]
        Path(out).mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).to_csv(Path(out) / "steps.csv", index=False)
