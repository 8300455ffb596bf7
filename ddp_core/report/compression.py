"""Gradient compression, over an emulated link: DDP's fp16 and PowerSGD communication hooks against fp32, in step time
and in accuracy."""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ddp_core.analysis.comparisons import (
    Judged,
    accuracy_floor,
    at_world_size,
    comm_over_compute,
    compare_accuracies,
    compare_times,
    judged_accuracies,
    judged_times,
    time_floor,
)
from ddp_core.analysis.provenance import StudySetup, study_setup
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


@dataclass(frozen=True)
class AgainstFp32:
    """A hook's time per sample and final accuracy against fp32's, on the study's world size."""

    time: Judged
    accuracy: Judged


def against_fp32(study: dict[str, Experiment], variant: str, time_noise: float, accuracy_noise: float) -> AgainstFp32:
    """`AgainstFp32` of `variant`, against the floors every hook's comparison shares."""
    e, base = study[variant], study["fp32"]
    n = base.largest
    return AgainstFp32(
        time=judged_times(compare_times(e, base, n, n, floor=time_noise)),
        accuracy=judged_accuracies(compare_accuracies(e, base, n, n, floor=accuracy_noise)),
    )


@dataclass(frozen=True)
class Findings:
    """What the compression page quotes."""

    compression_nodes: int
    compression_link: str
    compression_steps: int
    powersgd_rank: int
    compression_train_loss: float
    compression_guess_loss: float
    compression_learned: str
    compression_comm_over_compute: float
    fp16: AgainstFp32
    powersgd: AgainstFp32
    setup: StudySetup


def findings(study: dict[str, Experiment]) -> Findings:
    """fp16 and PowerSGD against fp32, with whether the runs trained long enough for their accuracies to say
    anything."""
    base = study["fp32"]
    n = base.largest
    noise = time_floor(*study.values()), accuracy_floor(*study.values())
    parts = at_world_size(base, n)  # its runs' steps read once
    loss, classes = parts["final_train_loss"], base.baseline.model["num_classes"]
    return Findings(
        compression_nodes=n,
        compression_link=link_label(base),
        compression_steps=int(base.metrics.query("run == @base.runs[@n].name")["steps"].sum()),
        powersgd_rank=study["powersgd"].baseline.config["powersgd_rank"],
        compression_train_loss=loss,
        compression_guess_loss=float(np.log(classes)),
        compression_learned=learned(loss, classes),
        compression_comm_over_compute=comm_over_compute(parts),
        fp16=against_fp32(study, "fp16", *noise),
        powersgd=against_fp32(study, "powersgd", *noise),
        setup=study_setup(*study.values()),
    )


def learned(train_loss: float, classes: int) -> str:
    """Whether the runs trained long enough for accuracy to say anything, judged by their loss against a guess's."""
    guess = np.log(classes)  # the loss of a uniform guess
    if train_loss >= guess:
        return "has not learned"
    return "has barely learned" if train_loss > 0.95 * guess else "has learned"  # barely: within 5 % below it


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
