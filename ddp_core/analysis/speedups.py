"""The one table of a study's speed per world size, which every chapter builds on.

Speed is compared the way every page compares, through `comparisons`. A step's breakdown is of the mean step, so that
its parts add up to it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ddp_core.analysis.comparisons import (
    Judged,
    compare_accuracies,
    judged_accuracies,
    judged_speedup,
    run_times,
    speedup_comparisons,
    steady_phases,
)
from ddp_core.analysis.compute_ratio import compute_to_comm_ratio, cores_per_rank, rank_share_s
from ddp_core.analysis.results import Experiment, last_epochs
from ddp_core.analysis.tables import counted, in_words


def scaling_table(experiment: Experiment) -> pd.DataFrame:
    """One row per world size: time, throughput, speedup with its range and verdict, efficiency, split and accuracy."""
    # Speedup is the median of the repeats' T1/TN, ranged by the lowest and highest. Repeat k at N ranks is paired with
    # repeat k at one rank, which ran next to it in time.
    comparisons = speedup_comparisons(experiment)
    # The mean step and its parts are means over the steady epochs of all repeats, so the parts add up to no more
    # than it. The first epoch pays for start-up that later ones do not: allocator warm-up, bucket rebuild, cold caches.
    steady = steady_phases(experiment.metrics)
    means = [
        "mean_step_s",
        "compute_per_step_s",
        "comm_total_per_step_s",
        "comm_exposed_per_step_s",
        "optimizer_per_step_s",
        "data_per_step_s",
    ]
    table = steady.groupby("world_size").agg(
        **{c: (c, "mean") for c in means}, peak_memory_mb=("peak_memory_mb", "max")
    )
    # the median of the repeats' mean steady epochs
    table["epoch_time_s"] = steady.groupby(["world_size", "run"])["epoch_time_s"].mean().groupby("world_size").median()
    timed = ["step_time_s", "time_per_sample_s"]  # medians of the repeats' median steps; throughput is the inverse
    table[timed] = run_times(experiment).groupby("world_size")[timed].median()
    table["samples_per_s"] = 1 / table["time_per_sample_s"]
    table = table.join(  # accuracy and training loss: medians of the repeats' last epochs
        last_epochs(experiment.metrics)
        .groupby("world_size")
        .agg(
            runs=("val_accuracy", "size"),
            final_val_accuracy=("val_accuracy", "median"),
            final_train_loss=("train_loss", "median"),
            accuracy_low=("val_accuracy", "min"),
            accuracy_high=("val_accuracy", "max"),
            global_batch_size=("global_batch_size", "first"),
        )
    )
    for column, field in (
        ("speedup", "ratio"),
        ("speedup_low", "low"),
        ("speedup_high", "high"),
        ("pairs", "pairs"),
        ("noise_floor", "floor"),
    ):
        table[column] = [getattr(comparisons[n], field) for n in table.index]
    table["verdict"] = [comparisons[n].says("slower", "faster") for n in table.index]
    table["efficiency"] = table["speedup"] / table.index
    one, comm = experiment.runs[1], table["comm_total_per_step_s"]
    table["cores_ideal"] = [n * cores_per_rank(experiment.runs[n]) / cores_per_rank(one) for n in table.index]
    share = [rank_share_s(table.loc[1, "compute_per_step_s"], one, experiment.runs[n]) for n in table.index]
    table["compute_to_comm_ratio"] = compute_to_comm_ratio(pd.Series(share, index=table.index), comm).where(comm > 0)
    table["exposed_share"] = (table["comm_exposed_per_step_s"] / comm).where(comm > 0)  # f of the theory chapter
    return table


@dataclass(frozen=True)
class Largest:
    """What the results chapter, the discussion and the first page say of a study's runs, kept in one place.

    It holds the shared settings, and the speedup and final accuracy at the most ranks against one rank's.
    """

    preset: str
    dataset: str
    placement: str  # for CPU ranks and GPUs alike: "shared one machine's 2 CPU cores"
    global_batch: int
    dropout: float
    largest: int
    threads_1: str
    threads_nmax: str
    speedup_nmax: Judged
    accuracy_nmax: Judged


def largest(experiment: Experiment) -> Largest:
    """`Largest` of a study's runs."""
    one, most = experiment.baseline, experiment.largest
    return Largest(
        preset=one.config["preset"],
        dataset=in_words(one.config["dataset"]),
        placement="each had a GPU of its own" if one.on_gpu else f"shared one machine's {one.cpu_count} CPU cores",
        global_batch=one.global_batch_size,
        dropout=one.model["dropout"],
        largest=most,
        threads_1=counted(one.threads_per_rank, "thread"),
        threads_nmax=counted(experiment.runs[most].threads_per_rank, "thread"),
        speedup_nmax=judged_speedup(speedup_comparisons(experiment)[most]),
        accuracy_nmax=judged_accuracies(compare_accuracies(experiment, experiment, most, 1)),
    )
