"""The alpha-beta model of ring all-reduce, fitted to `bench_allreduce`, and the DDP speedup it predicts.

It predicts N ranks from the 1-rank run and the benchmark, with one measured input: the exposed share of the all-reduce.
Anything a measured step holds beyond its timed phases is part of the prediction's error.

    python -m ddp_core.analysis.cost_model results/report     # prints the fit and the prediction errors
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ddp_core.engine.model_cost import bucket_sizes, training_flops
from ddp_core.analysis.results import Experiment, ResultsError, RunInfo, run_on_folder
from ddp_core.analysis.compute_ratio import compute_to_comm_ratio, cores_per_rank, rank_share_s
from ddp_core.analysis.speedups import scaling_table


@dataclass
class AlphaBeta:
    world_size: int
    alpha_s: float
    beta_s_per_byte: float
    r2: float
    max_relative_error: float

    def allreduce_s(self, size_bytes: float) -> float:
        n = self.world_size
        return 2 * (n - 1) * self.alpha_s + 2 * (n - 1) / n * size_bytes * self.beta_s_per_byte

    @property
    def bus_bandwidth_GBps(self) -> float:
        return 1 / self.beta_s_per_byte / 1e9


def measured_allreduce_s(bench: pd.DataFrame, size_bytes: float, fit: AlphaBeta) -> float:
    """The benchmark's all-reduce time at `size_bytes`, interpolated on log-log axes; the fit outside its range."""
    sizes, seconds = bench["size_bytes"].to_numpy(float), bench["time_s"].to_numpy(float)
    if not sizes.min() <= size_bytes <= sizes.max():
        return fit.allreduce_s(size_bytes)
    return float(np.exp(np.interp(np.log(size_bytes), np.log(sizes), np.log(seconds))))


def fit_alpha_beta(bench: pd.DataFrame) -> AlphaBeta:
    # T(S) = 2(N-1) alpha + 2 (N-1)/N S beta, by least squares on relative error: each message size counts alike,
    # from bytes to hundreds of MB.
    n = int(bench["world_size"].iloc[0])
    size, seconds = bench["size_bytes"].to_numpy(float), bench["time_s"].to_numpy(float)
    design = np.column_stack([np.full_like(size, 2 * (n - 1)), 2 * (n - 1) / n * size])
    weights = 1 / seconds
    (alpha, beta), *_ = np.linalg.lstsq(design * weights[:, None], seconds * weights, rcond=None)
    predicted = design @ [alpha, beta]
    spread = np.sum((seconds - seconds.mean()) ** 2)  # 0 for one size (the wind tunnel's of a one-bucket model)
    r2 = 1 - np.sum((seconds - predicted) ** 2) / spread if spread > 0 else float("nan")
    return AlphaBeta(n, float(alpha), float(beta), float(r2), float(np.max(np.abs(predicted / seconds - 1))))


def model_compute_to_comm_ratio(model_config: dict, tokens_per_rank: int, flops_per_s: float, fit: AlphaBeta) -> float:
    """R_N from the model: its training FLOPs per rank at `flops_per_s` over the fitted all-reduce of its buckets."""
    communication = sum(fit.allreduce_s(size) for size in bucket_sizes(model_config))
    return compute_to_comm_ratio(training_flops(model_config, tokens_per_rank) / flops_per_s, communication)


def rank_compute_s(one_rank_s: float, one: RunInfo, run: RunInfo) -> float:
    """A rank's compute per step in `run`, from `one_rank_s` of the 1-rank run `one`.

    Compute is taken to scale inversely with the share of the machine a rank gets.
    """
    # On a GPU, or on emulated nodes with a CPU share, the factor is 1: each rank has what the 1-rank run had.
    # Else ranks share the cores, and each gets min(threads_per_rank, cores / ranks on the node).
    return rank_share_s(one_rank_s, one, run) * cores_per_rank(one) / cores_per_rank(run)


def allreduce_fits(experiment: Experiment) -> dict[int, AlphaBeta]:
    return {n: fit_alpha_beta(bench) for n, bench in experiment.allreduce.items()}


def predict(experiment: Experiment, allreduce: dict[int, pd.DataFrame] | None = None) -> pd.DataFrame:
    """Predicted against measured speedup for every world size with a run and a benchmark.

    The benchmarks are the experiment's own, or `allreduce`: those of another experiment on the same machine.
    """
    table = scaling_table(experiment)
    benchmarks = allreduce if allreduce is not None else experiment.allreduce
    fits = {n: fit_alpha_beta(bench) for n, bench in benchmarks.items()}
    runs = experiment.runs
    predictable = sorted(set(fits) & set(runs))
    if not predictable:
        raise ResultsError(
            f"{experiment.folder}: the cost model needs a run and an all-reduce benchmark at the same "
            f"world size; it has runs at {sorted(runs)} and benchmarks at {sorted(fits)}"
        )
    # The 1-rank run's timed phases but communication: the same compute every chapter divides.
    compute_1 = table.loc[1, "compute_per_step_s"]
    per_sample_1 = compute_1 / runs[1].global_batch_size  # what each speedup divides: one rank's compute per sample
    rows = []
    for n in predictable:
        # Buckets as DDP forms them, each timed off the measured benchmark at its size. One alpha-beta line over bytes
        # to hundreds of MB errs most in the middle, where the buckets are; the measurement does not.
        buckets = [measured_allreduce_s(benchmarks[n], size, fits[n]) for size in bucket_sizes(runs[n].model)]
        comm, measured = sum(buckets), table.loc[n]
        # The one measured input: the share the N-rank run left exposed. No backward work is left to hide the last one.
        exposed = max(measured["exposed_share"] * comm, buckets[-1])
        compute = rank_compute_s(compute_1, runs[1], runs[n])
        # The model's step is compute and exposed communication only. Beside it: every bucket exposed (no overlap),
        # and only the last one exposed (DDP's best case).
        speedup = {
            name: per_sample_1 / (step / runs[n].global_batch_size)
            for name, step in [
                ("predicted", compute + exposed),
                ("no_overlap", compute + comm),
                ("last_bucket_only", compute + buckets[-1]),
            ]
        }
        rows.append(
            dict(
                world_size=n,
                buckets=len(buckets),
                exposed_fraction=measured["exposed_share"],
                last_bucket_share=buckets[-1] / comm,
                predicted_compute_s=compute,
                measured_compute_s=measured["compute_per_step_s"],
                predicted_comm_s=comm,
                measured_comm_s=measured["comm_total_per_step_s"],
                predicted_step_s=compute + exposed,
                measured_step_s=measured["step_time_s"],
                predicted_speedup=speedup["predicted"],
                speedup_no_overlap=speedup["no_overlap"],
                speedup_last_bucket_only=speedup["last_bucket_only"],
                measured_speedup=measured["speedup"],
                measured_speedup_low=measured["speedup_low"],
                measured_speedup_high=measured["speedup_high"],
                compute_error=compute / measured["compute_per_step_s"] - 1,
                comm_error=comm / measured["comm_total_per_step_s"] - 1,
                error=speedup["predicted"] / measured["speedup"] - 1,
            )
        )
    return pd.DataFrame(rows).set_index("world_size")


def communication_split(experiment: Experiment) -> pd.DataFrame:
    """Per world size with a benchmark, the mean all-reduce time in flight a step, split into transfer and waiting.

    Transfer is what the benchmark takes for the step's buckets alone on the machine. Waiting is for the slowest rank,
    or for a free core where ranks share them.
    """
    # Where training's all-reduce beat the benchmark's, all of it is transfer: waiting is never below 0.
    prediction = predict(experiment)
    in_flight = prediction["measured_comm_s"]
    transfer = prediction["predicted_comm_s"].clip(upper=in_flight)
    return pd.DataFrame({"in_flight_s": in_flight, "transfer_s": transfer, "waiting_s": in_flight - transfer})


def print_prediction(experiment: Experiment) -> None:
    prediction = predict(experiment)
    for n, fit in allreduce_fits(experiment).items():
        print(
            f"N={n}: alpha {fit.alpha_s * 1e6:.1f} us, beta {fit.beta_s_per_byte * 1e9:.4f} ns/B "
            f"(busbw {fit.bus_bandwidth_GBps:.2f} GB/s), R^2 {fit.r2:.4f}, max relative error "
            f"{fit.max_relative_error:.1%}"
        )
    print(prediction.to_string(float_format=lambda v: f"{v:.4g}"))
    print(f"largest |predicted - measured| / measured speedup: {prediction['error'].abs().max():.1%}")


if __name__ == "__main__":
    sys.exit(run_on_folder("ddp_core.analysis.cost_model", print_prediction))
