"""Gradient accumulation against DDP: one global batch formed at once, in micro-batches, or over several ranks.
All three should train the same model, up to float32's order of sums."""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

import pandas as pd

from ddp_core.analysis.comparisons import (
    Chance,
    Judged,
    chance_at,
    compare_times,
    final_accuracies,
    judged_times,
    run_times,
    time_floor,
)
from ddp_core.analysis.provenance import StudySetup, study_setup
from ddp_core.analysis.results import Experiment
from ddp_core.analysis.tables import FINAL_ACCURACY, difference_text, quantity_table


def accumulation_table(study: dict[str, Experiment]) -> pd.DataFrame:
    """Per variant: how the global batch was formed, its median step, and its largest loss gap to the first
    variant."""
    reference = next(iter(study.values()))
    rows = {}
    for variant, e in study.items():
        run = e.baseline
        # epoch by epoch, repeat k against repeat k: the same seed
        gaps = pd.concat(
            [
                _epochs(e, ours) - _epochs(reference, theirs)
                for ours, theirs in zip(e.repeats[run.world_size], reference.repeats[reference.baseline.world_size])
            ]
        ).abs()
        rows[variant] = dict(
            ranks=run.world_size,
            micro_batch=run.per_rank_batch_size,
            grad_accum=run.config["grad_accum"],
            global_batch=run.global_batch_size,
            step_time_ms=run_times(e)["step_time_s"].median() * 1e3,
            final_val_accuracy=median(final_accuracies(e, run.world_size)),
            max_train_loss_gap=gaps["train_loss"].max(),
            max_val_loss_gap=gaps["val_loss"].max(),
        )
    return pd.DataFrame(rows).T


def _epochs(experiment: Experiment, run) -> pd.DataFrame:
    """One run's losses by epoch."""
    return experiment.metrics.query("run == @run.name").set_index("epoch")[["train_loss", "val_loss"]]


ACCUMULATION_ROWS = {
    "ranks": ("Ranks", "{:.0f}"),
    "micro_batch": ("Micro-batch (samples)", "{:.0f}"),
    "grad_accum": ("Micro-batches per step", "{:.0f}"),
    "global_batch": ("Global batch (samples)", "{:.0f}"),
    "step_time_ms": ("Step time, median of the repeats (ms)", "{:.1f}"),
    "final_val_accuracy": (FINAL_ACCURACY, "{:.4f}"),
    "max_train_loss_gap": ("Largest training-loss gap to the first variant", "{}"),  # `accumulation_markdown` words it
}


def accumulation_markdown(study: dict[str, Experiment]) -> str:
    table = accumulation_table(study)
    table["max_train_loss_gap"] = [difference_text(gap, "below ") for gap in table["max_train_loss_gap"]]
    return quantity_table(table, ACCUMULATION_ROWS, turned=True)


# A loss that agrees to this is the same computation up to the order of float32 sums.
SAME_MODEL_TOLERANCE = 1e-3


def loss_gap(table: pd.DataFrame) -> float:
    """The largest gap of any variant's training or validation loss to the first variant's (`accumulation_table`).
    It shows how far from one computation the variants' models lie."""
    return float(table[["max_train_loss_gap", "max_val_loss_gap"]].max().max())


@dataclass(frozen=True)
class Findings:
    """What the gradient-accumulation page quotes."""

    accum_reference: str
    accum_loss_gap_text: str
    accum_tolerance: float
    accum_same_model: str
    accum_within_rounding: str
    accum_ddp_ranks: int
    accum: Chance
    accum_time: Judged
    accum_ddp_time: Judged
    setup: StudySetup


def findings(study: dict[str, Experiment]) -> Findings:
    """Whether the three ways of forming the batch trained the same model. Also what accumulating and DDP cost in
    time against one batch at once, on one floor for both."""
    table = accumulation_table(study)
    gap = loss_gap(table)
    same = gap <= SAME_MODEL_TOLERANCE
    one_batch, accumulated, ddp = (study[variant] for variant in table.index)
    floor = time_floor(*study.values())
    return Findings(
        accum_reference=table.index[0].replace("_", " "),  # the variant's name in words, as the table's columns
        accum_loss_gap_text=difference_text(gap),
        accum_tolerance=SAME_MODEL_TOLERANCE,
        accum_same_model="the same model" if same else "different models",
        accum_within_rounding="within" if same else "beyond",
        accum_ddp_ranks=ddp.largest,
        accum=chance_at(one_batch, 1),
        accum_time=judged_times(compare_times(accumulated, one_batch, floor=floor)),
        accum_ddp_time=judged_times(compare_times(ddp, one_batch, a_ranks=ddp.largest, floor=floor)),
        setup=study_setup(*study.values()),
    )
