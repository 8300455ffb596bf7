"""Overhead and scaling of ddp_core, as ratios measured in one run on this machine.

    python benchmarks/bench_ddp_core.py [--dataset synthetic|imdb] [--repeats 3]

1. ddp_core at 1 rank vs a minimal plain PyTorch loop (same model, data, batch, optimizer): target >= 0.97.
2. ddp_core with timers vs without, at 1 and 2 ranks: target >= 0.98. Measured inside one process
   by `timer_overhead.py`: between processes this machine's noise (several %) hides a 2 % effect.
3. Samples/s at 1 rank vs 2 ranks on the same cores, small and medium presets.

Every figure is steady-state throughput: the mean over epochs after the first. Each comparison runs
its two sides in ABBA order, `--repeats` pairs, and reports the median ratio with its range over the
pairs: a burst of load from elsewhere on a shared machine hits both sides alike, and the range shows
how far the machine's noise reaches.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from ddp_core.engine.config import TrainConfig
from ddp_core.engine.data import load_data
from ddp_core.engine.runtime import resolve_runtime
from ddp_core.launch.local import launch_command
from ddp_core.paths import REPO_ROOT

EPOCHS = 3


def workload(dataset: str, preset: str) -> list[str]:
    return ["--dataset", dataset, "--preset", preset, "--train-samples", "1024", "--eval-samples", "64",
            "--seq-len", "128", "--global-batch-size", "32", "--epochs", str(EPOCHS), "--seed", "0", "--no-progress"]


def steady_samples_per_s(epoch_rates: list[float]) -> float:
    return statistics.mean(epoch_rates[1:])


def ddp_core_rate(args: list[str], nproc: int, scratch: Path) -> float:
    out = scratch / f"run{time.monotonic_ns()}"
    subprocess.run(launch_command(nproc) + args + ["--out", str(out)], check=True, capture_output=True)
    with open(out / "metrics.csv") as f:
        return steady_samples_per_s([float(row["samples_per_s"]) for row in csv.DictReader(f)])


def plain_loop_rate(args: list[str], scratch: Path) -> float:
    """The same training in the simplest loop PyTorch allows, run in a fresh process like ddp_core."""
    code = f"import sys; sys.argv = ['x'] + {args!r}; from benchmarks.bench_ddp_core import plain_loop; plain_loop()"
    result = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                            cwd=REPO_ROOT)
    return float(result.stdout.strip().splitlines()[-1])


def plain_loop() -> None:
    """The plain loop of `single_device.py`, on the device the trainer would pick, one epoch at a time."""
    from benchmarks.single_device import plain_epoch, synchronize
    from ddp_core.engine.config import micro_batch_size, parse_args

    cfg: TrainConfig = parse_args(sys.argv[1:])
    data = load_data(cfg)
    rt = resolve_runtime(cfg)
    epoch, batch, rates = plain_epoch(cfg, rt, data), micro_batch_size(cfg, 1), []
    for _ in range(cfg.epochs):
        synchronize(rt.device)
        start = time.perf_counter()
        epoch()
        synchronize(rt.device)
        rates.append(len(data.train_labels) // batch * batch / (time.perf_counter() - start))
    print(steady_samples_per_s(rates))


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="synthetic", choices=["synthetic", "imdb"])
    parser.add_argument("--repeats", type=int, default=4)
    opts = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, dataset {opts.dataset}, "
          f"{opts.repeats} ABBA pairs, steady epochs 2..{EPOCHS}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        small = workload(opts.dataset, "small")
        alternate("1. ddp_core (1 rank) / plain loop", lambda: ddp_core_rate(small, 1, scratch),
                  lambda: plain_loop_rate(small, scratch), opts.repeats)
        overhead = Path(__file__).with_name("timer_overhead.py")
        for ranks in (1, 2):
            measured = subprocess.run(launch_command(ranks, str(overhead)), check=True, capture_output=True, text=True)
            print("2. " + measured.stdout.strip().splitlines()[-1], flush=True)
        for preset in ("small", "medium"):
            args = workload(opts.dataset, preset)
            alternate(f"3. {preset}: 2 ranks / 1 rank", lambda: ddp_core_rate(args, 2, scratch),
                      lambda: ddp_core_rate(args, 1, scratch), opts.repeats)


if __name__ == "__main__":
    main()
