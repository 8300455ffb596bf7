"""From the run directories of one experiment to the scaling numbers the report shows.

    python -m ddp_core.analysis results/report     # prints the summary table

An experiment is a folder whose subfolders are runs (each with metrics.csv and run.json) that
differ only in world size. The first epoch of every run is left out of the averages: it pays for
start-up (allocator warm-up, DDP's bucket rebuild, cold caches) that later epochs do not.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from ddp_core.run_files import METRICS_COLUMNS

WARMUP_EPOCHS = 1


class ResultsError(Exception):
    """A results folder that cannot be analysed; the message names the file and the reason."""


def book_results_folder(start: Path | None = None) -> Path:
    """The results the book shows: `book/results` (a link that `make report` or the user points at a folder
    of runs) in the project that holds the current directory."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "_config.yml").is_file() and (folder / "book").is_dir():
            return folder / "book" / "results"
    raise ResultsError(f"{here}: not inside the report's project (no _config.yml with a book/ folder above it)")


def read_run(run_dir: Path) -> tuple[pd.DataFrame, dict]:
    metrics_path, info_path = run_dir / "metrics.csv", run_dir / "run.json"
    for path in (metrics_path, info_path):
        if not path.is_file():
            raise ResultsError(f"{path}: missing")
    try:
        info = json.loads(info_path.read_text())
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{info_path}: not valid JSON ({exc})") from None
    try:
        metrics = pd.read_csv(metrics_path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ResultsError(f"{metrics_path}: unreadable CSV ({str(exc).strip()})") from None
    missing = [c for c in METRICS_COLUMNS if c not in metrics.columns]
    if missing:
        raise ResultsError(f"{metrics_path}: missing column(s) {', '.join(missing)}")
    if metrics.empty:
        raise ResultsError(f"{metrics_path}: no completed epoch")
    if metrics[METRICS_COLUMNS].isna().any().any() and info.get("config", {}).get("timers", True):
        raise ResultsError(f"{metrics_path}: empty or non-numeric values")
    return metrics.assign(run=run_dir.name), info


def load_experiment(folder: str | Path) -> tuple[pd.DataFrame, dict[str, dict]]:
    """All epochs of all runs under `folder` in one table, and each run's run.json by run name."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ResultsError(f"{folder}: no such results folder")
    run_dirs = sorted(p for p in folder.iterdir() if p.is_dir() and (p / "run.json").exists())
    if not run_dirs:
        raise ResultsError(f"{folder}: holds no run (no subfolder with run.json)")
    frames, infos = [], {}
    for run_dir in run_dirs:
        metrics, info = read_run(run_dir)
        frames.append(metrics)
        infos[run_dir.name] = info
    return pd.concat(frames, ignore_index=True), infos


def steady_epochs(metrics: pd.DataFrame) -> pd.DataFrame:
    """Epochs after the warm-up epoch; a run of a single epoch keeps it (and is flagged in `scaling_table`)."""
    later = metrics[metrics["epoch"] > WARMUP_EPOCHS]
    keep_single = ~metrics["run"].isin(later["run"])
    return pd.concat([later, metrics[keep_single]])


def scaling_table(metrics: pd.DataFrame) -> pd.DataFrame:
    """One row per world size: time, throughput, speedup, efficiency, compute vs communication, accuracy.

    Speedup is T1/TN with T the mean epoch time per trained sample, which is the epoch-time ratio when
    every run trains the same number of samples per epoch and stays fair when `drop_last` makes them differ.
    """
    if 1 not in set(metrics["world_size"]):
        raise ResultsError(f"no 1-rank run among world sizes {sorted(set(metrics['world_size']))}: "
                           f"speedup is measured against one rank")
    steady = steady_epochs(metrics)
    per_step = lambda col: steady[col] / steady["steps"]  # noqa: E731
    steady = steady.assign(
        time_per_sample_s=steady["epoch_time_s"] / steady["train_samples"],
        compute_per_step_s=per_step("forward_time_s") + per_step("backward_time_s") - per_step("comm_exposed_s")
        + per_step("optimizer_time_s"),
        comm_total_per_step_s=per_step("comm_total_s"),
        comm_exposed_per_step_s=per_step("comm_exposed_s"),
        data_per_step_s=per_step("data_time_s"),
    )
    table = steady.groupby("world_size").agg(
        epochs_averaged=("epoch", "size"),
        epoch_time_s=("epoch_time_s", "mean"),
        time_per_sample_s=("time_per_sample_s", "mean"),
        samples_per_s=("samples_per_s", "mean"),
        compute_per_step_s=("compute_per_step_s", "mean"),
        comm_total_per_step_s=("comm_total_per_step_s", "mean"),
        comm_exposed_per_step_s=("comm_exposed_per_step_s", "mean"),
        data_per_step_s=("data_per_step_s", "mean"),
    )
    last = metrics.sort_values("epoch").groupby("world_size").last()
    table["final_val_accuracy"] = last["val_accuracy"]
    table["global_batch_size"] = last["global_batch_size"]
    table["speedup"] = table.loc[1, "time_per_sample_s"] / table["time_per_sample_s"]
    table["efficiency"] = table["speedup"] / table.index
    comm = table["comm_total_per_step_s"]
    table["compute_to_comm_ratio"] = (table["compute_per_step_s"] / comm).where(comm > 0)
    return table


def run_on_folder(prog: str, report, argv: list[str] | None = None) -> int:
    """`python -m PROG RESULTS_FOLDER`: `report(folder)` prints its findings, a bad folder one error line."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(f"usage: python -m {prog} RESULTS_FOLDER", file=sys.stderr)
        return 2
    try:
        report(argv[0])
    except ResultsError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    return 0


def print_scaling_table(folder: str) -> None:
    metrics, _ = load_experiment(folder)
    columns = ["global_batch_size", "epoch_time_s", "samples_per_s", "speedup", "efficiency", "compute_per_step_s",
               "comm_total_per_step_s", "comm_exposed_per_step_s", "final_val_accuracy"]
    print(scaling_table(metrics)[columns].to_string(float_format=lambda v: f"{v:.4g}"))


if __name__ == "__main__":
    sys.exit(run_on_folder("ddp_core.analysis", print_scaling_table))
