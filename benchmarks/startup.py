"""Where a run's time outside training goes, for a 1-rank run and a run on emulated nodes (root).

    python benchmarks/startup.py [--nodes 8] [--cpus-per-node 0.125] [--rounds 3]

Each run is launched as the study runner launches it, and its wall time is set against the time it trained.
It is a benchmark, not a test: the machine is shared.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ddp_core.engine.config import OneLineParser, UsageError, positive_int  # noqa: E402
from ddp_core.launch.launchers import start  # noqa: E402
from ddp_core.launch.plan import Placement, prepare  # noqa: E402

# On the project's 2-core AMD EPYC (2026-11-27), 1 rank spent 3.1 s and 8 nodes of 0.125 core 17.9 s outside training.
# FSDP2 and DTensor (sympy among them) took 1.2 s of a rank's 2.4 s import: now only the sharded modes import them.
# torch's optimizer imports torch._dynamo (1.6 s) on its first construction, which the trainer cannot avoid.
# 8 ranks tearing their interpreters down at once took 4 s: the trainer now skips that once its files are written.
# After both fixes: 2.4 s and 11.8 s.
GOAL_S = {"1 rank": 5.0, "nodes": 15.0}  # seconds outside training (#50)
SETTINGS = {"threads_per_rank": 1, "train_samples": 192, "eval_samples": 64, "epochs": 2, "warmup_steps": 4}


def trained_s(run_dir: Path) -> float:
    """Seconds from the run directory's line to the run's files written, from its run.json."""
    # start_time: torch imported, the data and model built, the ranks joined. end_time: the files written.
    # The rest of the wall time is outside training: interpreters, imports, data, process group, links, teardown.
    info = json.loads((run_dir / "run.json").read_text())
    return (datetime.fromisoformat(info["end_time"]) - datetime.fromisoformat(info["start_time"])).total_seconds()


def outside_training(results: str, experiment: str, repeat: int, **where) -> tuple[float, float]:
    """One run's wall time and the part of it outside training."""
    plan = prepare(
        world_size=where.get("nodes", 1),
        placement=Placement(**where),
        results_dir=results,
        experiment=experiment,
        overrides=SETTINGS,
        repeat=repeat,
    )
    began = time.perf_counter()
    start(plan)
    wall = time.perf_counter() - began
    return wall, wall - trained_s(plan.run_dir)


def import_s() -> float:
    """Seconds for a fresh interpreter to import the trainer."""
    began = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import ddp_core.train"], check=True, cwd=REPO)
    return time.perf_counter() - began


def main() -> int:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8, help="emulated nodes of the second run (0: none)")
    parser.add_argument("--cpus-per-node", type=float, default=0.125)
    parser.add_argument("--rounds", type=positive_int, default=3)
    try:
        opts = parser.parse_args()
        if opts.nodes < 0:
            raise UsageError(f"--nodes must be 0 (no emulated run) or more, got {opts.nodes}")
    except UsageError as exc:
        print(f"startup: error: {exc}", file=sys.stderr)
        return 2
    configurations = {"1 rank": dict(launcher="local")}
    if opts.nodes and os.geteuid() == 0:
        configurations[f"{opts.nodes} nodes"] = dict(
            launcher="emulated", nodes=opts.nodes, link_rate="1gbit", cpus_per_node=opts.cpus_per_node
        )
    rows = {name: [] for name in configurations}
    imports = []
    with tempfile.TemporaryDirectory() as results:
        for repeat in range(1, opts.rounds + 1):
            imports.append(import_s())
            for name, where in configurations.items():
                rows[name].append(outside_training(results, name.replace(" ", "_"), repeat, **dict(where)))
    # medians of the rounds, which ran one after the other
    print(f"importing ddp_core.train: {statistics.median(imports):.1f} s (median of {opts.rounds})")
    for name, runs in rows.items():
        wall, outside = (statistics.median(values) for values in zip(*runs))
        goal = GOAL_S["1 rank" if name == "1 rank" else "nodes"]
        print(
            f"{name}: {wall:.1f} s in all, {outside:.1f} s outside training "
            f"({min(o for _, o in runs):.1f} to {max(o for _, o in runs):.1f} over {len(runs)} rounds; "
            f"goal under {goal:g} s: {'met' if outside < goal else 'missed'})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
