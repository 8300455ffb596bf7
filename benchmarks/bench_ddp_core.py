"""Overheads and scaling of ddp_core, as ratios measured in one run on this machine.

    python benchmarks/bench_ddp_core.py [--dataset synthetic|imdb] [--repeats 4]

1. ddp_core with timers vs without, at 1 and 2 ranks: target >= 0.98; and with the gradient noise scale vs
   without at 2 ranks: target >= 0.99. Measured inside one process by `measurement_overhead.py`: between
   processes this machine's noise (several %) hides a 2 % effect.
2. Samples/s at 1 rank vs 2 ranks on the same cores, small and medium presets.

(ddp_core against the loops a user would write instead, whole runs in fresh processes: `python -m
benchmarks.peers`.) Every figure is steady-state throughput: the mean over epochs after the first. The
comparison of 2 runs its two sides in ABBA order, `--repeats` pairs, and reports the median ratio with its
range over the pairs: a burst of load from elsewhere on a shared machine hits both sides alike, and the
range shows how far the machine's noise reaches.
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
    return statistics.mean(epoch_rates[1:])


def ddp_core_rate(args: list[str], nproc: int, scratch: Path) -> float:
    out = scratch / f"run{time.monotonic_ns()}"
    subprocess.run(launch_command(nproc) + args + ["--out", str(out)], check=True, capture_output=True)
    with open(out / "metrics.csv") as f:
        return steady_samples_per_s([float(row["samples_per_s"]) for row in csv.DictReader(f)])


def alternate(name: str, measure_a, measure_b, repeats: int) -> float:
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
