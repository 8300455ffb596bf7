"""The set-up and methods chapters: where and how the runs were made, and the run pages' own summary."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from ddp_core.report.results import NOT_SETTINGS, Experiment, book_results_folder

PROVENANCE = ["world_size", "backend", "device", "device_name", "cpu_count", "threads_per_rank", "hostname",
              "platform", "python", "torch", "cuda", "nccl", "git_commit", "parameters", "start_time", "end_time"]


def shown_folder(experiment: Experiment) -> tuple[str, str]:
    """Where the shown runs are, relative to the project when they lie in it, and what they are."""
    folder = experiment.folder.resolve()
    root = book_results_folder().parents[1]
    try:
        folder = folder.relative_to(root)
    except ValueError:
        return str(folder), "runs made outside this project"
    if folder.parts[0] == "reference":
        return str(folder), "the reference results shipped with the report, made by make reference"
    return str(folder), "runs made in this project, by make report or by hand"


def setup_findings(experiment: Experiment) -> dict:
    first = experiment.baseline.raw
    folder, kind = shown_folder(experiment)
    return {
        "folder": folder, "results_kind": kind, "world_sizes": ", ".join(map(str, experiment.runs)),
        "device": first["device_name"], "backend": first["backend"], "hostname": first["hostname"],
        "cpu_count": first["cpu_count"], "torch_version": first["torch"], "dataset": first["config"]["dataset"],
        "measured_on": min(run.raw["start_time"] for run in experiment.runs.values())[:10],
    }


def provenance_table(experiment: Experiment) -> str:
    """Hardware and software of every run, from its run.json (Markdown)."""
    return pd.DataFrame({run.name: {key: run.raw.get(key) for key in PROVENANCE}
                         for run in experiment.runs.values()}).to_markdown()


def settings_table(experiment: Experiment) -> str:
    """The training settings of every run (Markdown); paths and switches that do not change training left out."""
    settings = pd.DataFrame({run.name: run.config for run in experiment.runs.values()})
    return settings.drop(index=list(NOT_SETTINGS)).to_markdown()


def run_summary(info: dict) -> str:
    return (f"{info['world_size']} rank(s), {info['backend']} on {info['device_name']}, torch {info['torch']}, "
            f"{info['parameters']:,} parameters")


def learning_curves_figure(metrics: pd.DataFrame):
    """One run's loss and validation accuracy per epoch."""
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(9, 3.2))
    loss_ax.plot(metrics["epoch"], metrics["train_loss"], "o-", label="train")
    loss_ax.plot(metrics["epoch"], metrics["val_loss"], "s-", label="validation")
    loss_ax.set(xlabel="epoch", ylabel="cross-entropy loss", title="Loss")
    loss_ax.legend()
    acc_ax.plot(metrics["epoch"], metrics["val_accuracy"], "s-", color="C2")
    acc_ax.set(xlabel="epoch", ylabel="accuracy", title="Validation accuracy")
    for ax in (loss_ax, acc_ax):
        ax.set_xticks(metrics["epoch"])
    fig.tight_layout()
    return fig
