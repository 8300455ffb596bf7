"""The local launcher: one experiment's plan trained on this machine with torchrun, its lines echoed as it goes."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from typing import NoReturn

from ddp_core.launch.plan import (
    ExperimentError,
    Plan,
    follow_trainer,
    launch_command,
    refuse_interrupted,
    shell_command,
    stop_with_parent,
    trainer_args,
)


def run_local(plan: Plan) -> bool:
    """Train with torchrun, or plain python for 1 rank, echoing each epoch's line. A run the trainer refuses fails
    here with its one error line."""
    if plan.action == "reuse":
        print(f"{plan.run_dir} already holds this finished run: reusing it, not retraining")
        return True
    refuse_interrupted(plan)
    command = [*launch_command(plan.world_size, max_restarts=plan.placement.max_restarts), *trainer_args(plan)]
    print(shell_command(["python", *command[1:]]), flush=True)
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # Ctrl-C in a terminal or a notebook does not reach it: the launcher passes it on once
        preexec_fn=stop_with_parent if sys.platform == "linux" else None,
    ) as proc:
        try:
            follow_trainer(proc)
        except KeyboardInterrupt:
            stop_interrupted(proc)
    return True


def stop_interrupted(proc: subprocess.Popen) -> NoReturn:
    """Ctrl-C: the trainer stops at the end of its step with a checkpoint and says so. Then exit status 130, as for
    any program Ctrl-C ended."""
    proc.send_signal(signal.SIGINT)  # torchrun sends it on to every rank
    # torchrun's own report of the signal, a traceback and exit status 1, stays in the output that is not echoed
    with contextlib.suppress(ExperimentError):
        follow_trainer(proc)
    raise SystemExit(128 + signal.SIGINT)
