"""ddp_core against what a user would write instead: the loop of PyTorch's DDP tutorial and a loop in Hugging
Face Accelerate, the same model on the same encoded tensors, at 1 and 2 ranks on this machine.

    python -m benchmarks.peers                        # into results/peers/<device>
    python -m benchmarks.peers --rounds 6 --ranks 1 2 --results-dir reference

Each round runs every loop once at every world size, each run a fresh set of processes under torchrun (at 1
rank too: the tutorial's loop needs its environment, and all loops pay the same start-up). ddp_core runs between
its two peers, so that each ratio compares two runs made one right after the other: this machine's slow spells
last tens of seconds, and a run two places away may fall on the other side of one. The peers swap sides, and
the world sizes their order, every round. A run trains the
workload below for EPOCHS epochs and writes each step's time, step end to step end (ddp_core's steps.csv,
`step_clock.py` for the others); the first epoch is warm-up. A round's ratio is a peer's median step over
ddp_core's, so above 1 means ddp_core is faster; the book's chapter on one device gives its median and range
over the rounds with the one verdict function's call.

Output: RESULTS_DIR/peers/<device>/steps.csv (loop, ranks, round, epoch, step, step_time_s), appended after
every run, and device.json (provenance, the workload, each peer's version).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from benchmarks.single_device import measurement_name, new_measurement_folder, positive_int
from ddp_core.engine.config import OneLineParser, UsageError, parse_args
from ddp_core.engine.data import load_data
from ddp_core.engine.run_files import environment, now_iso, save_atomic
from ddp_core.engine.runtime import resolve_runtime
from ddp_core.launch.plan import launch_command
from ddp_core.paths import REPO_ROOT, RESULTS_DIR

LOOPS = {
    "ddp_core": "ddp_core.train",
    "tutorial": "benchmarks.peers.tutorial_loop",
    "accelerate": "benchmarks.peers.accelerate_loop",
}
PEERS = [loop for loop in LOOPS if loop != "ddp_core"]
EPOCHS = 4
# The default profile's model and batch, with --dataset and --train-samples samples an epoch.
WORKLOAD = [
    "--preset",
    "small",
    "--seq-len",
    "128",
    "--eval-samples",
    "64",
    "--global-batch-size",
    "32",
    "--lr",
    "0.003",
    "--warmup-steps",
    "30",
    "--epochs",
    str(EPOCHS),
    "--seed",
    "0",
]
DDP_CORE_FLAGS = ["--no-progress"]  # its progress bar goes to a log no one reads here


def options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = OneLineParser(prog="peers", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=positive_int, default=6)
    parser.add_argument("--ranks", type=positive_int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--results-dir", type=Path, default=Path(RESULTS_DIR), help="the measurement goes to RESULTS_DIR/peers/<device>"
    )
    parser.add_argument("--dataset", choices=["imdb", "synthetic"], default="imdb")
    parser.add_argument("--train-samples", type=positive_int, default=1024, help="samples each epoch trains on")
    return parser.parse_args(argv)


def run_steps(loop: str, ranks: int, workload: list[str], scratch: Path) -> pd.DataFrame:
    out = scratch / f"{loop}-{ranks}"
    shutil.rmtree(out, ignore_errors=True)
    command = [
        *launch_command(ranks, "-m", LOOPS[loop], torchrun=True),
        *workload,
        *(DDP_CORE_FLAGS if loop == "ddp_core" else []),
        "--out",
        str(out),
    ]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{loop} at {ranks} rank(s) failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return pd.read_csv(out / "steps.csv")[["epoch", "step", "step_time_s"]]


def round_order(round_: int, ranks: list[int]) -> list[tuple[str, int]]:
    """The runs of one round, (loop, world size): ddp_core between its peers at each world size."""
    first, last = PEERS if round_ % 2 == 0 else PEERS[::-1]
    return [(loop, n) for n in (ranks if round_ % 2 == 0 else ranks[::-1]) for loop in (first, "ddp_core", last)]


def main(argv: list[str] | None = None) -> int:
    try:
        opts = options(argv)
        workload = [*WORKLOAD, "--dataset", opts.dataset, "--train-samples", str(opts.train_samples)]
        for ranks in opts.ranks:
            parse_args(workload, world_size=ranks)  # every world size divides the batch, before anything runs
        if importlib.util.find_spec("accelerate") is None:
            raise UsageError("the Accelerate loop needs Accelerate: pip install -e '.[peers]'")
        cfg = parse_args(workload, world_size=1)
        rt = resolve_runtime(cfg)
        info = environment(rt.device)
        out = new_measurement_folder(opts.results_dir, "peers", measurement_name(rt, info, compiled=False))
        load_data(cfg)  # the token cache every loop then reads alike; a missing dataset stops here
    except UsageError as exc:
        print(f"peers: error: {exc}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    info |= dict(
        command=sys.argv,
        workload=workload,
        ddp_core_flags=DDP_CORE_FLAGS,
        epochs=EPOCHS,
        accelerate=importlib.metadata.version("accelerate"),
        start_time=now_iso(),
        end_time=None,
    )
    save_atomic(info, out / "device.json")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(opts.rounds):
            for loop, ranks in round_order(round_, opts.ranks):
                steps = run_steps(loop, ranks, workload, Path(tmp))
                rows.append(steps.assign(loop=loop, ranks=ranks, round=round_))
                pd.concat(rows)[["loop", "ranks", "round", "epoch", "step", "step_time_s"]].to_csv(
                    out / "steps.csv", index=False
                )
                median = steps[steps["epoch"] > 1]["step_time_s"].median()
                print(
                    f"peers: round {round_ + 1}/{opts.rounds}, {loop} at {ranks} rank(s): median step "
                    f"{median * 1e3:.1f} ms",
                    flush=True,
                )
    save_atomic(info | {"end_time": now_iso()}, out / "device.json")
    print(f"peers: measured into {out}; the book's chapter on one device shows it (make book)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
