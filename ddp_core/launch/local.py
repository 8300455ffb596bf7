"""The local launcher: one experiment's plan (`ddp_core.launch.plan`) trained on this machine with torchrun (plain
python for one rank), its lines echoed as it goes.
"""

from __future__ import annotations

import subprocess
import sys

from ddp_core.launch.plan import (Plan, follow_trainer, launch_command, refuse_interrupted, shell_command,
                                  stop_with_parent, trainer_args)


def run_local(plan: Plan) -> bool:
    """Train with torchrun (plain python for 1 rank), echoing each epoch's line. The trainer checks its settings
    and data before it writes anything; a run it refuses fails here with its one error line."""
    if plan.action == "reuse":
        print(f"{plan.run_dir} already holds this finished run: reusing it, not retraining")
        return True
    refuse_interrupted(plan)
    command = [*launch_command(plan.world_size, max_restarts=plan.max_restarts), *trainer_args(plan)]
    print(shell_command(["python", *command[1:]]), flush=True)
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          preexec_fn=stop_with_parent if sys.platform == "linux" else None) as proc:
        follow_trainer(proc)
    return True


