"""Gradient compression, over an emulated link: DDP's fp16 and PowerSGD communication hooks against fp32, in step time
and in accuracy."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ddp_core.analysis.comparisons import (
    accuracy_floor,
    accuracy_glue,
    at_world_size,
    comm_over_compute,
    compare_accuracies,
    compare_times,
    time_floor,
    time_glue,
)
from ddp_core.analysis.figures import chance_line
from ddp_core.analysis.results import Experiment, link_label
from ddp_core.analysis.tables import (
    ALLREDUCE_IN_FLIGHT_MS,
    FINAL_ACCURACY,
    STEP_RANGE_MS,
    in_words,
    quantity_table,
    range_rows,
)


def compression_table(study: dict[str, Experiment]) -> pd.DataFrame:
    """Per variant, at the study's world size: its step, communication and accuracy (`at_world_size`)."""
    return pd.DataFrame({variant: at_world_size(e, e.largest) for variant, e in study.items()}).T


COMPRESSION_ROWS = {
    **STEP_RANGE_MS,
    "comm_total_per_step_s": (ALLREDUCE_IN_FLIGHT_MS, "{:.0f}", 1e3),
    "final_val_accuracy": (FINAL_ACCURACY, "{:.3f}"),
    **range_rows("accuracy", "{:.3f}"),
    "final_train_loss": ("Final training loss, median of the repeats", "{:.3f}"),
}


def compression_markdown(study: dict[str, Experiment]) -> str:
    return quantity_table(compression_table(study), COMPRESSION_ROWS, turned=True)


def compression_findings(study: dict[str, Experiment]) -> dict:
    base = study["fp32"]
    n = base.largest
    time_noise, accuracy_noise = time_floor(*study.values()), accuracy_floor(*study.values())
    parts = at_world_size(base, n)  # its runs' steps read once
    loss, classes = parts["final_train_loss"], base.baseline.model["num_classes"]
    found = {
        "compression_nodes": n,
        "compression_link": link_label(base),
        "compression_steps": int(base.metrics.query("run == @base.runs[@n].name")["steps"].sum()),
        "powersgd_rank": study["powersgd"].baseline.config["powersgd_rank"],
        "compression_train_loss": loss,
        "compression_guess_loss": float(np.log(classes)),
        "compression_learned": learned(loss, classes),
        "compression_comm_over_compute": comm_over_compute(parts),
    }
    for variant in ("fp16", "powersgd"):
        e = study[variant]
        found |= time_glue(f"{variant}_time", compare_times(e, base, n, n, floor=time_noise))
        found |= accuracy_glue(f"{variant}_accuracy", compare_accuracies(e, base, n, n, floor=accuracy_noise))
    return found


def learned(train_loss: float, classes: int) -> str:
    """Whether the runs trained long enough for accuracy to say anything: 'has not learned' at or above a uniform
    guess's loss, ln(classes); 'has barely learned' within 5 % below it; 'has learned' below that."""
    guess = np.log(classes)
    if train_loss >= guess:
        return "has not learned"
    return "has barely learned" if train_loss > 0.95 * guess else "has learned"


def compression_figure(study: dict[str, Experiment]):
    table = compression_table(study)
    fig, (time_ax, acc_ax) = plt.subplots(1, 2, figsize=(10, 3.4))
    x = np.arange(len(table))
    names = [in_words(name) for name in table.index]
    _bars(time_ax, x, *(table[column] * 1e3 for column in ("step_time_s", "step_low_s", "step_high_s")))
    time_ax.set(xticks=x, xticklabels=names, ylabel="ms per step", title="Step time (bar: range of repeats)")
    _bars(acc_ax, x, table["final_val_accuracy"], table["accuracy_low"], table["accuracy_high"], color="C2")
    chance_line(acc_ax, next(iter(study.values())).baseline.model["num_classes"])
    acc_ax.set_ylim(0, 1.3 * table["accuracy_high"].max())  # room above the whiskers for the legend
    acc_ax.legend(fontsize=8, loc="upper right")
    acc_ax.set(xticks=x, xticklabels=names, ylabel="accuracy", title="Final validation accuracy (bar: range)")
    fig.tight_layout()
    return fig


def _bars(ax, x, median, low, high, **style) -> None:
    """A bar per variant at its median, its whisker the range of the repeats."""
    ax.bar(x, median, yerr=[median - low, high - median], capsize=4, **style)
