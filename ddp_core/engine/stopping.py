"""SIGTERM as a request to stop cleanly: finish the step in flight, checkpoint, exit.

SIGTERM is how a run is told to end early on the machines this report runs on: Slurm sends it at a
time limit (through `slurm/ddp_train.sbatch`'s warning trap) and when it preempts a job, torchrun
sends it to every rank when its agent is stopped or a peer has failed, and `kill` sends it by default.
Dying on it would lose every step since the last checkpoint; instead the trainer stops at the end of
a step and writes a mid-epoch checkpoint, from which the same command continues exactly.

The ranks must stop at the same step, because the checkpoint gathers each rank's state and any
collective needs all of them, yet the signal reaches each rank at its own moment. So every step starts
an all-reduce (MAX) of the ranks' flags without waiting for it, and the next step reads its result:
by then it has long finished, so the agreement costs no waiting and no GPU synchronisation, and every
rank reads the same answer after the same step, one step after the first rank was signalled.
"""

from __future__ import annotations

import signal

import torch
import torch.distributed as dist

from ddp_core.engine.runtime import Runtime


class Stopped(Exception):
    """The run stopped on a signal after writing a checkpoint; the same command continues it."""


class StopRequest:
    """SIGTERM turned into a flag while in use (`with StopRequest() as stop:`); the process's own handler after."""

    def __init__(self):
        self.signal_name: str | None = None
        self._pending = None  # (work, flag) of the all-reduce started after the last step
        self._group = None
        self._distributed = False
        self._previous_handler = None

    def __enter__(self) -> StopRequest:
        self._previous_handler = signal.signal(signal.SIGTERM, self._received)
        return self

    def __exit__(self, *exc) -> None:
        signal.signal(signal.SIGTERM, self._previous_handler)

    def _received(self, signum, frame) -> None:
        self.signal_name = signal.Signals(signum).name

    def join(self, rt: Runtime) -> None:
        """Agree with the other ranks from now on (after the process group exists). The flags travel over gloo
        on the host: on NCCL a flag on the GPU would have to be copied back, a synchronisation every step."""
        self._distributed = rt.distributed
        if rt.distributed and rt.backend != "gloo":
            self._group = dist.new_group(backend="gloo")

    def agreed(self) -> bool:
        """Called by every rank after every step: whether all ranks stop now, because one of them was signalled
        before the previous step ended."""
        if not self._distributed:
            return self.signal_name is not None
        stop = False
        if self._pending is not None:
            work, flag = self._pending
            work.wait()
            stop = bool(flag.item())
        flag = torch.tensor([int(self.signal_name is not None)])
        self._pending = None if stop else (dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group,
                                                           async_op=True), flag)
        return stop
