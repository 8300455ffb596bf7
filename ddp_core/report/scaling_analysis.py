"""The results chapter: speedup, efficiency and the compute/communication split, per world size.

    python -m ddp_core.report.scaling_analysis results/report     # prints the summary table

How speed is compared and a step broken down: `ddp_core.analysis.speedups`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ddp_core.analysis.comparisons import WARMUP_EPOCHS, Chance, against_chance, chance_at
from ddp_core.analysis.compute_ratio import cores_per_rank
from ddp_core.analysis.figures import chance_line
from ddp_core.analysis.results import Experiment, run_on_folder
from ddp_core.analysis.emulated import BASELINE, Headline, headline
from ddp_core.analysis.provenance import Whose, origin, runs_shown
from ddp_core.analysis.speedups import Largest, largest, scaling_table
from ddp_core.analysis.tables import (
    ALLREDUCE_IN_FLIGHT_MS,
    STEP_MEDIAN_MS,
    counted,
    quantity_table,
    range_rows,
    step_part_rows,
)


@dataclass(frozen=True)
class AtRanks:
    """The columns of `scaling_table` the prose quotes, at one world size: means over the steady epochs."""

    step_time_s: float
    samples_per_s: float
    efficiency: float
    cores_ideal: float
    compute_per_step_s: float
    comm_total_per_step_s: float
    comm_exposed_per_step_s: float
    final_val_accuracy: float
    optimizer_per_step_s: float
    peak_memory_mb: float


def at_ranks(table: pd.DataFrame, n: int) -> AtRanks:
    """`AtRanks` of the row for `n` ranks."""
    return AtRanks(**{f.name: float(table.loc[n, f.name]) for f in fields(AtRanks)})


@dataclass(frozen=True)
class Findings(Largest):
    """What the results chapter quotes: `Largest` of its runs, the runs at one rank (`n1`) and at the most (`nmax`),
    and the emulated nodes' headline."""

    parameters: str
    world_sizes: str
    epochs: int
    device: str
    warmup_phrase: str
    optimizer_share_nmax: float
    optimizer_growth_nmax: float
    cores_share_nmax: float
    accuracy: Chance  # one rank's final accuracy against guessing
    accuracy_vs_chance_nmax: str
    n1: AtRanks
    nmax: AtRanks
    transfer_per_step_s_nmax: float  # NaN without all-reduce benchmarks
    waiting_per_step_s_nmax: float
    runs: Whose
    nodes: Headline
    nodes_whose: str


def findings(experiment: Experiment, communication: pd.DataFrame | None, nodes: dict[str, Experiment]) -> Findings:
    """What the results chapter quotes, from its runs and the emulated `nodes`. With `communication`
    (`cost_model.communication_split`), the time in flight splits into transfer and waiting."""
    table = scaling_table(experiment)
    first, most = experiment.baseline, experiment.largest
    split = communication.loc[most] if communication is not None else {"transfer_s": np.nan, "waiting_s": np.nan}
    return Findings(
        **vars(largest(experiment)),
        parameters=f"{first.parameters:,}",
        world_sizes=", ".join(map(str, table.index)),
        epochs=int(experiment.metrics["epoch"].max()),
        device=f"{first.device_name} ({first.backend})",
        warmup_phrase="the first epoch" if WARMUP_EPOCHS == 1 else f"the first {WARMUP_EPOCHS} epochs",
        optimizer_share_nmax=float(table.loc[most, "optimizer_per_step_s"] / table.loc[most, "step_time_s"]),
        optimizer_growth_nmax=float(table.loc[most, "optimizer_per_step_s"] / table.loc[1, "optimizer_per_step_s"]),
        cores_share_nmax=float(cores_per_rank(experiment.runs[most]) / cores_per_rank(first)),
        accuracy=chance_at(experiment, 1),
        accuracy_vs_chance_nmax=against_chance(experiment, most),
        n1=at_ranks(table, 1),
        nmax=at_ranks(table, most),
        transfer_per_step_s_nmax=float(split["transfer_s"]),
        waiting_per_step_s_nmax=float(split["waiting_s"]),
        runs=runs_shown(experiment),
        nodes=headline(nodes),
        nodes_whose=origin(nodes[BASELINE].folder),
    )


# What the results table shows, in the reader's words: (row label, column, scale, format).
RESULTS_ROWS = {
    "runs": ("Runs (seeds)", "{:.0f}"),
    "epoch_time_s": ("Epoch time, median of the repeats (s)", "{:.2f}"),
    "samples_per_s": ("Throughput, from the median step (samples/s)", "{:.1f}"),
    "speedup": ("Speedup, median of the repeats' paired ratios", "{:.2f}"),
    **range_rows("speedup", "{:.2f}"),
    "efficiency": ("Parallel efficiency (%)", "{:.0f}", 100),
    "cores_ideal": ("Ideal speedup for the compute the ranks had (cores, or a GPU each)", "{:.2f}"),
    "step_time_s": (STEP_MEDIAN_MS, "{:.1f}", 1e3),
    **step_part_rows("{:.1f}"),
    "optimizer_per_step_s": ("Optimizer step, part of compute, mean (ms)", "{:.1f}", 1e3),
    "comm_total_per_step_s": (ALLREDUCE_IN_FLIGHT_MS, "{:.1f}", 1e3),
    "peak_memory_mb": ("Peak memory, largest rank and repeat (MiB)", "{:,.0f}"),
    "final_val_accuracy": ("Final validation accuracy, median", "{:.3f}"),
    **range_rows("accuracy", "{:.3f}"),
}


def results_markdown(experiment: Experiment) -> str:
    """Per world size (columns), averaged over the steady epochs."""
    table = scaling_table(experiment)
    return quantity_table(table, RESULTS_ROWS, turned=True, column_names=[counted(n, "rank") for n in table.index])


def _plot_each_run(ax, metrics: pd.DataFrame, sizes: pd.Index, column: str) -> None:
    """Each repeat's `column` per epoch, a colour per world size as `sizes` orders them. Each world size is labelled
    once, so that its repeats share a legend entry."""
    colors, labelled = {n: f"C{i}" for i, n in enumerate(sizes)}, set()
    for (n, _), rows in metrics.sort_values("epoch").groupby(["world_size", "run"]):
        ax.plot(
            rows["epoch"],
            rows[column],
            "o-",
            color=colors[n],
            label=None if n in labelled else counted(n, "rank"),
            alpha=0.8,
        )
        labelled.add(n)
    ax.set_xticks(sorted(metrics["epoch"].unique()))


def epoch_time_figure(experiment: Experiment):
    table = scaling_table(experiment)
    fig, (per_epoch, mean_time) = plt.subplots(1, 2, figsize=(10, 3.6))
    _plot_each_run(per_epoch, experiment.metrics, table.index, "epoch_time_s")
    per_epoch.set(xlabel="epoch", ylabel="seconds", title="Time per epoch (each repeat)")
    per_epoch.legend(fontsize=8)
    mean_time.bar([counted(n, "rank") for n in table.index], table["epoch_time_s"], color="C0")
    mean_time.set(ylabel="seconds", title="Epoch time after warm-up, median of the repeats")
    fig.tight_layout()
    return fig


def speedup_figure(experiment: Experiment):
    """Measured speedup with its range over the repeats (or epochs), beside the ideal; and the efficiency."""
    table = scaling_table(experiment)
    sizes = list(table.index)
    fig, (speed, eff) = plt.subplots(1, 2, figsize=(10, 3.6))
    x = np.arange(len(sizes))
    error = [table["speedup"] - table["speedup_low"], table["speedup_high"] - table["speedup"]]
    speed.bar(x - 0.27, table["speedup"], 0.27, yerr=error, capsize=4, label="measured (bar: range)")
    speed.bar(x, table["cores_ideal"], 0.27, color="darkgray", label="ideal for the compute the ranks had")
    speed.bar(x + 0.27, sizes, 0.27, color="lightgray", label="ideal with a device per rank (N)")
    speed.set(xticks=x, xticklabels=sizes, xlabel="ranks", ylabel="speedup over one rank (T1 / TN)", title="Speedup")
    speed.legend(loc="upper left", fontsize=8)
    eff.bar(x, table["efficiency"] * 100, color="C1")
    eff.axhline(100, color="gray", linestyle="--", linewidth=1)
    eff.set(
        xticks=x,
        xticklabels=sizes,
        xlabel="ranks",
        ylabel="efficiency: speedup / ranks (%)",
        title="Parallel efficiency",
    )
    fig.tight_layout()
    return fig


def time_split_figure(experiment: Experiment, communication: pd.DataFrame):
    """Per world size, the mean step's time as it adds up, and beside it all the time an all-reduce was in flight.
    `communication` (`cost_model.communication_split`) splits the time in flight into transfer and waiting."""
    table = scaling_table(experiment)
    communication = communication.reindex(table.index, fill_value=0.0)
    fig, ax = plt.subplots(figsize=(7, 3.8))
    x = np.arange(len(table))
    timed = table["compute_per_step_s"] + table["data_per_step_s"] + table["comm_exposed_per_step_s"]
    in_step = {  # data loading is too small to show on its own
        "compute and data loading": (table["compute_per_step_s"] + table["data_per_step_s"], "C0"),
        "exposed all-reduce": (table["comm_exposed_per_step_s"], "C3"),
        "outside the timed phases": ((table["mean_step_s"] - timed).clip(lower=0), "C7"),
    }
    in_flight = {  # most of it hidden behind the compute it overlaps
        "all-reduce in flight: transfer (as benchmarked)": (communication["transfer_s"], "C2"),
        "all-reduce in flight: waiting (slowest rank, a core)": (communication["waiting_s"], "C8"),
    }
    for offset, alpha, stack in ((-0.2, None, in_step), (0.2, 0.6, in_flight)):
        bottom = np.zeros(len(table))
        for label, (seconds, color) in stack.items():
            ax.bar(x + offset, seconds * 1e3, 0.38, bottom=bottom, color=color, alpha=alpha, label=label)
            bottom += seconds.to_numpy() * 1e3
    ax.set(
        xticks=x,
        xticklabels=[counted(n, "rank") for n in table.index],
        ylabel="ms per step (mean)",
        title="Where a step's time goes",
    )
    fig.legend(loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    return fig


def accuracy_figure(experiment: Experiment):
    fig, ax = plt.subplots(figsize=(7, 3.6))
    _plot_each_run(ax, experiment.metrics, scaling_table(experiment).index, "val_accuracy")
    chance_line(ax, experiment.baseline.model["num_classes"])
    ax.set(xlabel="epoch", ylabel="accuracy", title="Validation accuracy per epoch (each repeat)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def print_scaling_table(experiment: Experiment) -> None:
    columns = [
        "global_batch_size",
        "epoch_time_s",
        "samples_per_s",
        "speedup",
        "efficiency",
        "compute_per_step_s",
        "comm_total_per_step_s",
        "comm_exposed_per_step_s",
        "final_val_accuracy",
    ]
    print(scaling_table(experiment)[columns].to_string(float_format=lambda v: f"{v:.4g}"))


if __name__ == "__main__":
    sys.exit(run_on_folder("ddp_core.report.scaling_analysis", print_scaling_table))
