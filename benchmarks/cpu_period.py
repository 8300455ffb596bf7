"""How the period of an emulated node's CPU quota moves a DDP step, at 10 ms, 100 ms and 5 ms.

    python benchmarks/cpu_period.py --results-dir results/cpu_period     # root; about 6 minutes on 2 cores

A node out of quota stalls until the next period, and a synchronous all-reduce makes every other node wait too.
Prints each period's step against the 10 ms runs', with the verdict that the nodes page shows.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ddp_core.engine.config import OneLineParser, UsageError, positive_int
from ddp_core.launch.emulated import EmulatedCluster
from ddp_core.launch.plan import Placement, follow_trainer, prepare, trainer_args
from ddp_core.analysis.cpu_period import load_periods, period_table
from ddp_core.studies.study_list import load_study_list

# 10 ms is the project's period, 100 ms the kernel's default.
# A longer period makes a longer stall, up to the period less the quota. A shorter one costs the kernel more work.
PERIODS_MS = (10, 100, 5)
NODES, CPUS_PER_NODE = 4, 0.25  # the nodes study's run: 4 nodes of a quarter core, links unshaped


def train(results_dir: Path, period_ms: int, repeat: int) -> None:
    """One run of the nodes study's settings at this period."""
    study = load_study_list()["nodes"]
    plan = prepare(
        world_size=NODES,
        placement=Placement("emulated", NODES, cpus_per_node=CPUS_PER_NODE),
        results_dir=str(results_dir),
        experiment=f"period-{period_ms}ms",
        profile=study.profile,
        overrides=study.variants[0].settings,
        repeat=repeat,
    )
    if plan.action != "reuse":
        plan.run_dir.mkdir(parents=True, exist_ok=True)
        with EmulatedCluster(NODES, None, CPUS_PER_NODE, cpu_period_us=period_ms * 1000) as cluster:
            leader, *others = cluster.launch(1, ["-m", "ddp_core.train", *trainer_args(plan)], plan.run_dir)
            follow_trainer(leader, on_start=cluster.limit_cpu, on_finish=cluster.release_cpu)
            cluster.wait(others, plan.run_dir)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results-dir", type=Path, required=True)
    parser.add_argument("--rounds", type=positive_int, default=3)
    try:
        opts = parser.parse_args(argv)
    except UsageError as exc:
        print(f"cpu_period: error: {exc}", file=sys.stderr)
        return 2
    for repeat in range(1, opts.rounds + 1):  # round by round, the order reversed every other round
        order = PERIODS_MS if repeat % 2 else PERIODS_MS[::-1]
        for period in order:
            train(opts.results_dir, period, repeat)
    # The median over the rounds of each run's median step, its ratio to the 10 ms runs' paired round by round,
    # and the verdict of the report's one verdict function.
    table = period_table(load_periods(opts.results_dir)).drop(columns="value")
    table.to_csv(opts.results_dir / "cpu_period.csv", index=False)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
