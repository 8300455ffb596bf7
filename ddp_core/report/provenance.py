"""The set-up and methods chapters: where and how the runs were made, and the run pages' own summary."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from ddp_core.report.results import Experiment

PROVENANCE = ["world_size", "backend", "device", "device_name", "cpu_count", "threads_per_rank", "hostname",
              "platform", "python", "torch", "cuda", "nccl", "git_commit", "parameters", "start_time", "end_time"]
NOT_SETTINGS = ["out", "data_dir", "cache_dir", "check", "progress", "resume"]


def setup_findings(experiment: Experiment) -> dict:
    first = experiment.baseline.raw
    return {
        "folder": str(experiment.folder.resolve()), "world_sizes": ", ".join(map(str, experiment.runs)),
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
    return settings.drop(index=NOT_SETTINGS).to_markdown()


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
