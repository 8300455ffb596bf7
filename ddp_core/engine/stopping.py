"""SIGTERM and SIGINT as requests to stop cleanly: finish the step in flight, checkpoint, exit.

SIGTERM is how a run is told to end early on the machines this report runs on: Slurm sends it at a
time limit (through `slurm/ddp_train.sbatch`'s warning trap) and when it preempts a job, torchrun
sends it to every rank when its agent is stopped or a peer has failed, and `kill` sends it by default.
SIGINT is Ctrl-C, which a terminal sends to torchrun and every rank at once (and torchrun sends on to them).
Dying on either would lose every step since the last checkpoint; instead the trainer stops at the end of
a step and writes a mid-epoch checkpoint, from which the same command continues exactly.

The ranks must stop at the same step, because the checkpoint gathers each rank's state and any
collective needs all of them, yet the signal reaches each rank at its own moment. So every step starts
an all-reduce (MAX) of the ranks' flags (the number of the signal each received, 0 for none) without
waiting for it, and the next step reads its result: by then it has long finished, so the agreement costs
no waiting and no GPU synchronisation, and every rank reads the same answer after the same step, one step
after the first rank was signalled.
"""

from __future__ import annotations

import signal
from pathlib import Path

import torch
import torch.distributed as dist

from ddp_core.engine.runtime import Runtime


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(Exception):
    """The run stopped on a signal after writing a checkpoint; the same command continues it. Its exit status is a
    shell's for a program ended by that signal (130 for Ctrl-C, 143 for SIGTERM), so scripts around it see why."""

    def __init__(self, signum: int, message: str, run_dir: Path | None):
        super().__init__(message)
        self.exit_code = 128 + signum
        self.run_dir = run_dir  # on rank 0; None on the others


class StopRequest:
    """SIGTERM and SIGINT turned into a flag while in use (`with StopRequest() as stop:`); the process's own handlers
    after. A second Ctrl-C is the same request: torchrun passes on the one every rank already had from the terminal."""

    def __init__(self):
        self.received = 0  # the number of the last stop signal this process received, 0 before one
        self._pending = None  # (work, flag) of the all-reduce started after the last step
        self._group = None
        self._distributed = False
        self._previous_handlers = {}

    def __enter__(self) -> StopRequest:
        self._previous_handlers = {signum: signal.signal(signum, self._received) for signum in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)

    def _received(self, signum, frame) -> None:
        self.received = signum

    def join(self, rt: Runtime) -> None:
        """Agree with the other ranks from now on (after the process group exists). The flags travel over gloo
        on the host: on NCCL a flag on the GPU would have to be copied back, a synchronisation every step."""
        self._distributed = rt.distributed
        if rt.distributed and rt.backend != "gloo":
            self._group = dist.new_group(backend="gloo")

    def agreed(self) -> signal.Signals | None:
        """Called by every rank after every step: the signal on which all ranks stop now, because one of them received
        it before the previous step ended (SIGTERM where some had SIGINT: the larger number); None to go on."""
        if not self._distributed:
            return signal.Signals(self.received) if self.received else None
        stop = 0
        if self._pending is not None:
            work, flag = self._pending
            work.wait()
            stop = int(flag.item())
        flag = torch.tensor([self.received])
        self._pending = (
            None if stop else (dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True), flag)
        )
        return signal.Signals(stop) if stop else None
