"""SIGTERM and SIGINT as requests to stop cleanly: finish the step in flight, checkpoint, exit.

Dying on either would lose every step since the last checkpoint. The run stops at a step's end instead, and the same
command continues it exactly.
"""

from __future__ import annotations

import signal
from pathlib import Path

import torch
import torch.distributed as dist

from ddp_core.engine.runtime import Runtime


# SIGTERM: Slurm at a time limit (`slurm/ddp_train.sbatch`'s warning trap) or a preemption, torchrun stopping its
# ranks, `kill`. SIGINT: Ctrl-C, which a terminal sends to torchrun and every rank at once.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(Exception):
    """The run stopped on a signal after writing a checkpoint. The same command continues it."""

    def __init__(self, signum: int, message: str, run_dir: Path | None):
        super().__init__(message)
        # A shell's status for a program ended by that signal (130 for Ctrl-C, 143 for SIGTERM): scripts see why.
        self.exit_code = 128 + signum
        self.run_dir = run_dir  # on rank 0; None on the others


class StopRequest:
    """SIGTERM and SIGINT turned into a flag while in use (`with StopRequest() as stop:`). The process's own handlers
    come back after."""

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
        # A second Ctrl-C is the same request: torchrun passes on the one every rank already had from the terminal.
        self.received = signum

    def join(self, rt: Runtime) -> None:
        """Agree with the other ranks from now on, once the process group exists."""
        # The flags travel over gloo on the host: on NCCL a flag on the GPU would need copying back every step.
        self._distributed = rt.distributed
        if rt.distributed and rt.backend != "gloo":
            self._group = dist.new_group(backend="gloo")

    def agreed(self) -> signal.Signals | None:
        """Called by every rank after every step: the signal on which all ranks stop now, or None to go on."""
        # The ranks must stop at the same step, since the checkpoint is a collective, but each gets the signal at its
        # own moment. Each step starts a MAX all-reduce of the flags, and the next step reads it, long finished.
        # So agreeing costs no wait and no GPU sync, and all ranks stop one step after the first was signalled.
        if not self._distributed:
            return signal.Signals(self.received) if self.received else None
        stop = 0
        if self._pending is not None:
            work, flag = self._pending
            work.wait()
            stop = int(flag.item())
        flag = torch.tensor([self.received])  # MAX: SIGTERM (15) wins where some ranks had SIGINT (2)
        self._pending = (
            None if stop else (dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True), flag)
        )
        return signal.Signals(stop) if stop else None
