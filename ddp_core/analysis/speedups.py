"""The one table of a study's speed per world size, which every chapter builds on: speedup with its range and verdict,
efficiency, the compute/communication split, the compute-to-communication ratio, accuracy.

Speed is compared the one way every page compares (`comparisons`): each run's median step, repeat
k at N ranks paired with repeat k at one rank, which ran next to it in time. The breakdown of a
step (compute, communication, data) is of the mean step over the steady epochs of all repeats, so
that its parts add up to it: the first epoch of every run is left out, as it pays for start-up
(allocator warm-up, DDP's bucket rebuild, cold caches) that later epochs do not.
"""

from __future__ import annotations

import pandas as pd

from ddp_core.analysis.comparisons import run_times, speedup_comparisons, steady_phases
from ddp_core.analysis.compute_ratio import compute_to_comm_ratio, cores_per_rank, rank_share_s
from ddp_core.analysis.results import Experiment, last_epochs


def scaling_table(experiment: Experiment) -> pd.DataFrame:
    """One row per world size: time, throughput, speedup with its range and verdict, efficiency, compute vs
    communication, accuracy.

    Step time and time per sample are medians of the repeats' median steps; throughput is their inverse; the
    epoch time is the median of the repeats' mean steady epochs. Speedup
    is the median of the repeats' T1/TN, its range the lowest and highest of them (`speedup_comparisons`). The
    mean step and its parts are means over the steady epochs of all repeats, so the parts add up to no more than
    it; accuracy and training loss are the medians of the repeats' last epochs.
    """
    metrics = experiment.metrics
    comparisons = speedup_comparisons(experiment)
    steady = steady_phases(metrics)
    table = steady.groupby("world_size").agg(
        epochs_averaged=("epoch", "size"),
        mean_step_s=("mean_step_s", "mean"),
        compute_per_step_s=("compute_per_step_s", "mean"),
        comm_total_per_step_s=("comm_total_per_step_s", "mean"),
        comm_exposed_per_step_s=("comm_exposed_per_step_s", "mean"),
        optimizer_per_step_s=("optimizer_per_step_s", "mean"),
        data_per_step_s=("data_per_step_s", "mean"),
        peak_memory_mb=("peak_memory_mb", "max"),
    )
    table["epoch_time_s"] = steady.groupby(["world_size", "run"])["epoch_time_s"].mean().groupby("world_size").median()
    times = run_times(experiment).groupby("world_size")
    table["step_time_s"] = times["step_time_s"].median()
    table["time_per_sample_s"] = times["time_per_sample_s"].median()
    table["samples_per_s"] = 1 / table["time_per_sample_s"]
    final = last_epochs(metrics)
    table["runs"] = final.groupby("world_size").size()
    table["final_val_accuracy"] = final.groupby("world_size")["val_accuracy"].median()
    table["final_train_loss"] = final.groupby("world_size")["train_loss"].median()
    table["accuracy_low"] = final.groupby("world_size")["val_accuracy"].min()
    table["accuracy_high"] = final.groupby("world_size")["val_accuracy"].max()
    table["global_batch_size"] = final.groupby("world_size")["global_batch_size"].first()
    table["speedup"] = [comparisons[n].ratio for n in table.index]
    table["speedup_low"] = [comparisons[n].low for n in table.index]
    table["speedup_high"] = [comparisons[n].high for n in table.index]
    table["pairs"] = [comparisons[n].pairs for n in table.index]
    table["noise_floor"] = [comparisons[n].floor for n in table.index]
    table["verdict"] = [comparisons[n].says("slower", "faster") for n in table.index]
    table["efficiency"] = table["speedup"] / table.index
    one_rank_cores = cores_per_rank(experiment.runs[1])
    table["cores_ideal"] = [n * cores_per_rank(experiment.runs[n]) / one_rank_cores for n in table.index]
    one, comm = experiment.runs[1], table["comm_total_per_step_s"]
    share = [rank_share_s(table.loc[1, "compute_per_step_s"], one, experiment.runs[n]) for n in table.index]
    table["compute_to_comm_ratio"] = compute_to_comm_ratio(pd.Series(share, index=table.index), comm).where(comm > 0)
    table["exposed_share"] = (table["comm_exposed_per_step_s"] / comm).where(comm > 0)  # f of the theory chapter
    return table
