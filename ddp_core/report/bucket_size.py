"""Gradient buckets over an emulated link: how DDP's bucket size sets a step's all-reduces, and how much of them
backward hides."""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ddp_core.analysis.comparisons import (
    Judged,
    at_world_size,
    comm_over_compute,
    compare_times,
    judged_times,
    run_times,
    time_floor,
)
from ddp_core.analysis.provenance import StudySetup, study_setup
from ddp_core.analysis.results import Experiment, link_label
from ddp_core.analysis.tables import ALLREDUCE_IN_FLIGHT_MS, STEP_RANGE_MS, in_words, quantity_table, step_part_rows


def bucket_table(study: dict[str, Experiment]) -> pd.DataFrame:
    """One row per bucket setting at the study's world size: the all-reduces a step launched, the step, and its
    communication."""
    rows = {}
    for variant, e in study.items():
        run = e.runs[e.largest]
        cap = run.config.get("bucket_cap_mb")
        rows[variant] = {
            "bucket_cap_mb": np.nan if cap is None else cap,
            "allreduces": run.raw.get("allreduces_per_step", np.nan),
            # the step: the median of the repeats' median steps, with their range. Communication: steady epochs' mean.
            **at_world_size(e, e.largest),
        }
    return pd.DataFrame(rows).T


BUCKET_ROWS = {
    "bucket_cap_mb": ("Bucket size set (MiB; –: PyTorch's default)", "{:g}"),
    "allreduces": ("All-reduces per step", "{:.0f}"),
    **STEP_RANGE_MS,
    **step_part_rows(),
    "comm_total_per_step_s": (ALLREDUCE_IN_FLIGHT_MS, "{:.0f}", 1e3),
}


def bucket_markdown(study: dict[str, Experiment]) -> str:
    return quantity_table(bucket_table(study), BUCKET_ROWS, turned=True)


@dataclass(frozen=True)
class DrawnStep:
    """How long the step a variant's timeline draws took, beside its run's median step. One step is an example, not a
    measure."""

    drawn_ms: float
    median_ms: float


def drawn_step(experiment: Experiment) -> DrawnStep:
    """`DrawnStep` of the step `timeline_figure` draws: rank 0's of repeat 1, at the study's world size."""
    run = experiment.repeats[experiment.largest][0]
    return DrawnStep(
        drawn_ms=_timeline(experiment)["end_s"].max() * 1e3,
        median_ms=run_times(experiment).set_index("run").loc[run.name, "step_time_s"] * 1e3,
    )


@dataclass(frozen=True)
class Findings:
    """What the bucket-size page quotes."""

    bucket_nodes: int
    bucket_link: str
    bucket_preset: str
    bucket_parameters: str
    bucket_vocabulary: str
    bucket_comm_over_compute: float
    one_bucket_time: Judged
    one_mib_buckets_time: Judged
    default_buckets: DrawnStep
    one_bucket: DrawnStep
    one_mib_buckets: DrawnStep
    setup: StudySetup


def findings(study: dict[str, Experiment]) -> Findings:
    """One bucket and 1 MiB buckets against PyTorch's default in time per sample, on one floor for both. Also the
    model and link they ran over, and the step each timeline draws."""
    default = study["default_buckets"]
    n = default.largest
    floor = time_floor(*study.values())
    return Findings(
        bucket_nodes=n,
        bucket_link=link_label(default),
        bucket_preset=default.baseline.config["preset"],
        bucket_parameters=f"{default.baseline.parameters:,}",
        bucket_vocabulary=f"{default.baseline.config['vocab_size']:,}",
        bucket_comm_over_compute=comm_over_compute(at_world_size(default, n)),
        one_bucket_time=judged_times(compare_times(study["one_bucket"], default, n, n, floor=floor)),
        one_mib_buckets_time=judged_times(compare_times(study["one_mib_buckets"], default, n, n, floor=floor)),
        default_buckets=drawn_step(default),
        one_bucket=drawn_step(study["one_bucket"]),
        one_mib_buckets=drawn_step(study["one_mib_buckets"]),
        setup=study_setup(*study.values()),
    )


def _timeline(experiment: Experiment) -> pd.DataFrame:
    """The timeline of the step drawn: rank 0's median step of repeat 1's last epoch, at the study's world size."""
    run = experiment.repeats[experiment.largest][0]
    return pd.read_csv(experiment.folder / run.name / "timeline.csv")


def timeline_figure(study: dict[str, Experiment]):
    """Rank 0's median step per bucket setting: the phases on one row, each bucket's all-reduce on the row below. One
    time axis shows how backward and communication overlap."""
    variants = list(study)
    fig, axes = plt.subplots(len(variants), 1, figsize=(10, 1.5 * len(variants) + 0.7), sharex=True)
    colors = {"forward": "C0", "backward": "C1", "optimizer": "C2", "all-reduce": "C3"}
    for ax, variant in zip(axes, variants):
        timeline = _timeline(study[variant])
        for row in timeline[timeline["what"] != "data"].itertuples():  # data loading: too short to see
            bucket = row.what.startswith("all-reduce")
            ax.barh(
                0 if bucket else 1,
                (row.end_s - row.start_s) * 1e3,
                left=row.start_s * 1e3,
                height=0.6,
                color=colors["all-reduce" if bucket else row.what],
                edgecolor="white",
                linewidth=0.5,
            )
        ax.set(yticks=[0, 1], yticklabels=["all-reduce\n(each bucket)", "phases"], title=in_words(variant))
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    fig.legend(
        handles,
        ["forward", "backward (with DDP's wait)", "optimizer", "all-reduce of a bucket"],
        loc="lower center",
        ncol=4,
        fontsize=8,
        frameon=False,
    )
    axes[-1].set_xlabel("ms from the start of the step")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig
