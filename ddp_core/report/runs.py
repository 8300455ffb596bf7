"""The individual runs page: every run of the results chapter in one table, which the PDF prints instead of a page
per run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ddp_core.analysis.provenance import Whose, runs_shown
from ddp_core.analysis.results import Experiment, last_epochs, load_experiment
from ddp_core.analysis.tables import quantity_table

RUN_COLUMNS = {
    "ranks": ("Ranks", "{}"),
    "seed": ("Seed", "{}"),
    "started": ("Started (UTC)", "{}"),
    "epochs": ("Epochs", "{}"),
    "epoch_time_s": ("Last epoch (s)", "{:.2f}"),
    "val_accuracy": ("Validation accuracy", "{:.3f}"),
}


def runs_table(folder: Path) -> pd.DataFrame:
    """A row per run under `folder`, by ranks then seed: when it started, its epochs, and its last epoch's time and
    accuracy."""
    experiment = load_experiment(folder)
    last = last_epochs(experiment.metrics)
    return pd.DataFrame(
        [
            {
                "run": run.name,
                "ranks": run.world_size,
                "seed": run.config["seed"],
                "started": run.raw["start_time"][:16].replace("T", " "),
                "epochs": int(last.loc[run.name, "epoch"]),
                "epoch_time_s": last.loc[run.name, "epoch_time_s"],
                "val_accuracy": last.loc[run.name, "val_accuracy"],
            }
            for run in experiment.all_runs
        ]
    ).set_index("run")


def runs_markdown(folder: Path) -> str:
    return quantity_table(runs_table(folder), RUN_COLUMNS, "Run")


@dataclass(frozen=True)
class Findings:
    """What the individual runs page quotes."""

    runs: Whose


def findings(experiment: Experiment) -> Findings:
    """Whose the results chapter's runs (`experiment`) are, and when and on what they were made."""
    return Findings(runs=runs_shown(experiment))
