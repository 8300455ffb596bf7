"""Overheads and scaling of ddp_core, as ratios measured in one run on this machine.

    python benchmarks/bench_ddp_core.py [--dataset synthetic|imdb] [--repeats 4]

1. What the measurements cost: the timers, and the gradient noise scale.
2. Samples/s at 2 ranks against 1 rank, on the same cores.

ddp_core against the loops a user would write instead is `python -m benchmarks.peers`.
"""

from __future__ import annotations

import csv
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from ddp_core.engine.config import OneLineParser, UsageError, positive_int
from ddp_core.launch.plan import launch_command

EPOCHS = 3


def workload(dataset: str, preset: str) -> list[str]:
    return [
        "--dataset",
        dataset,
        "--preset",
        preset,
        "--train-samples",
        "1024",
        "--eval-samples",
        "64",
        "--seq-len",
        "128",
        "--global-batch-size",
        "32",
        "--epochs",
        str(EPOCHS),
        "--seed",
        "0",
        "--no-progress",
    ]


def steady_samples_per_s(epoch_rates: list[float]) -> float:
    # steady state: the mean over the epochs after the first
    return statistics.mean(epoch_rates[1:])


def ddp_core_rate(args: list[str], nproc: int, scratch: Path) -> float:
    out = scratch / f"run{time.monotonic_ns()}"
    subprocess.run(launch_command(nproc) + args + ["--out", str(out)], check=True, capture_output=True)
    with open(out / "metrics.csv") as f:
        return steady_samples_per_s([float(row["samples_per_s"]) for row in csv.DictReader(f)])


def alternate(name: str, measure_a, measure_b, repeats: int) -> float:
    # ABBA order: a burst of load from elsewhere hits both sides alike.
    # The range over the pairs shows how far the machine's noise reaches.
    ratios = []
    for i in range(repeats):
        if i % 2 == 0:
            a, b = measure_a(), measure_b()
        else:
            b, a = measure_b(), measure_a()
        ratios.append(a / b)
    median = statistics.median(ratios)
    print(f"{name}: ratio {median:.3f} (range {min(ratios):.3f}-{max(ratios):.3f} over {repeats} pairs)", flush=True)
    return median


def main() -> int:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="synthetic", choices=["synthetic", "imdb"])
    parser.add_argument("--repeats", type=positive_int, default=4)
    try:
        opts = parser.parse_args()
    except UsageError as exc:
        print(f"bench_ddp_core: error: {exc}", file=sys.stderr)
        return 2
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, dataset {opts.dataset}, "
        f"{opts.repeats} ABBA pairs, steady epochs 2..{EPOCHS}",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        # 1. Inside one process: between processes this machine's noise (several %) hides a 2 % effect.
        # Targets: timers on / off >= 0.98 at 1 and 2 ranks, noise scale on / off >= 0.99 at 2 ranks.
        overhead = Path(__file__).with_name("measurement_overhead.py")
        for ranks in (1, 2):
            measured = subprocess.run(launch_command(ranks, str(overhead)), check=True, capture_output=True, text=True)
            for line in measured.stdout.strip().splitlines():
                print("1. " + line, flush=True)
        for preset in ("small", "medium"):
            args = workload(opts.dataset, preset)
            alternate(
                f"2. {preset}: 2 ranks / 1 rank",
                lambda: ddp_core_rate(args, 2, scratch),
                lambda: ddp_core_rate(args, 1, scratch),
                opts.repeats,
            )


if __name__ == "__main__":
    sys.exit(main())
