"""Start a launch plan with the launcher it names. Each takes the plan alone and returns True when the run is finished.

Slurm with `wait=False` returns False: submitted, not finished.
"""

from __future__ import annotations

from ddp_core.launch.emulated import run_emulated
from ddp_core.launch.local import run_local
from ddp_core.launch.plan import Plan
from ddp_core.launch.slurm import run_slurm

START = {"local": run_local, "emulated": run_emulated, "slurm": run_slurm}


def start(plan: Plan) -> bool:
    return START[plan.placement.launcher](plan)
