"""The chapter "Predicting scaling": the all-reduce fit, predicted against measured speedup, the NVLink
forecast, and what the CPU these runs used does to the model."""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ddp_core.engine.model_cost import bucket_sizes
from ddp_core.analysis.cost_model import allreduce_fits, measured_allreduce_s, predict
from ddp_core.analysis.nvlink_forecast import (
    FORECAST_GPUS,
    Replay,
    StepTimeline,
    forecast,
    nvlink_fit,
    peak_gemm_flops_per_s,
    replay,
)
from ddp_core.analysis.provenance import Whose, runs_shown
from ddp_core.analysis.results import Experiment
from ddp_core.analysis.tables import counted, quantity_table, range_rows

FORECAST_ROWS = {"parameters": ("parameters", "{:,}"), "buckets": ("DDP buckets", "{:,}")} | {
    column: (label, "{:.3g}")
    for column, label in {
        "comm_ms": "all-reduce per step (ms)",
        "last_bucket_ms": "last bucket (ms)",
        "compute_bound_ms": "T1 at the peak rate (ms)",
        "speedup_no_overlap": "speedup, no overlap",
        "speedup_last_bucket_only": "speedup, last bucket only",
        "break_even_compute_ms": "break-even T1 (ms)",
        "efficiency_90_compute_ms": "T1 for 90% efficiency (ms)",
    }.items()
}


TARGET = 0.10  # the largest relative error of a predicted speedup that the chapter calls a good prediction


@dataclass(frozen=True)
class TargetCheck:
    """Whether the predictions meet the target: every speedup and part within `bound` (TARGET) of the measured one.
    They must also err less than a null model that predicts no speedup: a cost model earns its keep by erring less."""

    bound: float
    outcome: str
    parts_max_error: float
    inside: int  # predictions within the repeats' range, where this machine cannot tell them from measurement
    predictions: int
    null_max_error: float
    null_worst_n: int
    model_vs_null: str
    null_better_at: str


def target_check(prediction: pd.DataFrame) -> TargetCheck:
    """`TargetCheck` of a prediction (`predict`)."""
    error = prediction["error"].abs()
    parts_error = pd.concat([prediction["compute_error"], prediction["comm_error"]]).abs()
    # The null model predicts no speedup, as ranks that share the cores add no compute.
    null_error = (1 / prediction["measured_speedup"] - 1).abs()
    inside = prediction["predicted_speedup"].between(
        prediction["measured_speedup_low"], prediction["measured_speedup_high"]
    )
    meets = error.max() <= TARGET and parts_error.max() <= TARGET and error.max() < null_error.max()
    return TargetCheck(
        bound=TARGET,
        outcome="meets" if meets else "misses",
        parts_max_error=float(parts_error.max()),
        inside=int(inside.sum()),
        predictions=len(prediction),
        null_max_error=float(null_error.max()),
        null_worst_n=int(null_error.idxmax()),
        model_vs_null="smaller than" if error.max() < null_error.max() else "no smaller than",
        null_better_at=", ".join(f"{n} ranks" for n in prediction.index[null_error < error]) or "no world size",
    )


@dataclass(frozen=True)
class WorstPrediction:
    """The world size whose speedup the prediction missed most, its parts' gaps there, and which part missed more.
    A gap is the predicted less the measured, in ms."""

    n: int
    step_gap_ms: float
    comm_gap_ms: float
    compute_gap_ms: float
    cause: str


def worst_prediction(prediction: pd.DataFrame) -> WorstPrediction:
    """`WorstPrediction` of a prediction (`predict`)."""
    n = int(prediction["error"].abs().idxmax())
    row = prediction.loc[n]
    step, comm, compute = (
        float(row[f"predicted_{part}_s"] - row[f"measured_{part}_s"]) * 1e3 for part in ("step", "comm", "compute")
    )
    return WorstPrediction(
        n=n,
        step_gap_ms=step,
        comm_gap_ms=comm,
        compute_gap_ms=compute,
        cause="the communication estimate" if abs(comm) > abs(compute) else "the compute estimate",
    )


@dataclass(frozen=True)
class PredictedAndMeasured:
    """One part of a step, as the cost model predicted it and as the runs measured it in training (ms)."""

    predicted_ms: float
    measured_ms: float


def predicted_and_measured(row: pd.Series, part: str) -> PredictedAndMeasured:
    """`PredictedAndMeasured` of `part` ("comm" or "compute") in a world size's row of `predict`."""
    return PredictedAndMeasured(float(row[f"predicted_{part}_s"] * 1e3), float(row[f"measured_{part}_s"] * 1e3))


@dataclass(frozen=True)
class NvlinkBound:
    """The bound on NVLink from published figures, for the runs' workload. It holds the published all-reduce's fit,
    the fastest published GEMM rate, and the presets on which DDP pays off at that rate."""

    alpha_us: float
    busbw: float
    r2: float
    fit_error: float
    tflops: float
    batch: int
    seq: int
    paying: str  # without overlap
    paying_best_case: str  # at best: only the last bucket exposed


def nvlink_bound(experiment: Experiment) -> NvlinkBound:
    """`NvlinkBound` on FORECAST_GPUS GPUs for the workload of `experiment`'s runs (`forecast`)."""
    workload = experiment.baseline
    nvlink = nvlink_fit(FORECAST_GPUS)
    ahead = forecast(workload.model, workload.global_batch_size, FORECAST_GPUS)
    return NvlinkBound(
        alpha_us=nvlink.alpha_s * 1e6,
        busbw=nvlink.bus_bandwidth_GBps,
        r2=nvlink.r2,
        fit_error=nvlink.max_relative_error,
        tflops=peak_gemm_flops_per_s() / 1e12,
        batch=workload.global_batch_size,
        seq=workload.model["max_len"],
        paying=", ".join(ahead.index[ahead["speedup_no_overlap"] > 1]) or "none",
        paying_best_case=", ".join(ahead.index[ahead["speedup_last_bucket_only"] > 1]) or "none",
    )


def exposure_source(row: pd.Series) -> str:
    """What sets the prediction's exposed all-reduce: the share the runs left exposed, or the last bucket's where
    that is larger. Backward can never hide the last bucket."""
    return "the last bucket" if row["exposed_fraction"] < row["last_bucket_share"] else "the measured share"


def threads_against_cores(threads: int, cores: int) -> str:
    return "more than" if threads > cores else "as many as" if threads == cores else "fewer than"


@dataclass(frozen=True)
class Findings:
    """What the chapter Predicting scaling quotes."""

    runs: Whose
    largest: int
    alpha_us: float
    busbw: float
    r2: float
    fit_error: float
    buckets: str
    gradient_mb: float
    bucket_fit_ratio: float
    max_error: float
    target: TargetCheck
    worst: WorstPrediction
    parts_outcome: str
    exposed_fraction: float
    last_bucket_share: float
    exposure_source: str
    ran_on: str
    cores: int
    threads_1: str
    threads_worst: str
    threads_all: int
    threads_vs_cores: str
    compute: PredictedAndMeasured
    comm: PredictedAndMeasured
    comm_slowdown: float
    gpus: int
    nv: NvlinkBound
    replay: Replay


def findings(experiment: Experiment, timelines: list[StepTimeline]) -> Findings:
    """The all-reduce fit, the prediction against the runs, and how the shared CPU bends the model where it missed
    most. Also the NVLink bound and the replay forecast from one GPU's step `timelines`."""
    prediction, fits = predict(experiment), allreduce_fits(experiment)
    buckets = bucket_sizes(experiment.baseline.model)
    largest = max(fits)  # the fit at the largest world size benchmarked
    fit, bench = fits[largest], experiment.allreduce[largest]
    worst = worst_prediction(prediction)
    at_worst, one, at_n = prediction.loc[worst.n], experiment.runs[1], experiment.runs[worst.n]
    threads = at_n.threads_per_rank * at_n.local_world_size
    return Findings(
        runs=runs_shown(experiment),
        largest=largest,
        alpha_us=fit.alpha_s * 1e6,
        busbw=fit.bus_bandwidth_GBps,
        r2=fit.r2,
        fit_error=fit.max_relative_error,
        buckets=counted(len(buckets), "DDP bucket"),
        gradient_mb=sum(buckets) / 2**20,
        # how far the fit misses the measured all-reduce at the gradient buckets' sizes
        bucket_fit_ratio=max(measured_allreduce_s(bench, size, fit) / fit.allreduce_s(size) for size in buckets),
        max_error=float(prediction["error"].abs().max()),
        target=target_check(prediction),
        worst=worst,
        parts_outcome="partly cancel" if worst.comm_gap_ms * worst.compute_gap_ms < 0 else "add up",
        exposed_fraction=float(at_worst["exposed_fraction"]),
        last_bucket_share=float(at_worst["last_bucket_share"]),
        exposure_source=exposure_source(at_worst),
        ran_on="GPUs" if one.on_gpu else "CPU cores",
        cores=one.cpu_count,
        threads_1=counted(one.threads_per_rank, "thread"),
        threads_worst=counted(at_n.threads_per_rank, "thread"),
        threads_all=threads,
        threads_vs_cores=threads_against_cores(threads, one.cpu_count),
        compute=predicted_and_measured(at_worst, "compute"),
        comm=predicted_and_measured(at_worst, "comm"),
        comm_slowdown=float(at_worst["measured_comm_s"] / at_worst["predicted_comm_s"]),
        gpus=FORECAST_GPUS,
        nv=nvlink_bound(experiment),
        replay=replay(timelines),
    )


def allreduce_figure(experiment: Experiment):
    """Measured all-reduce time with the alpha-beta fit, and the fit's residuals, against message size;
    DDP's gradient buckets marked where the prediction reads the curve."""
    fits, buckets = allreduce_fits(experiment), bucket_sizes(experiment.baseline.model)
    fig, (times, residuals) = plt.subplots(1, 2, figsize=(10, 3.8))
    for (n, bench), color in zip(experiment.allreduce.items(), ["C0", "C1", "C2", "C3"]):
        sizes = bench["size_bytes"].to_numpy(float)
        fitted = np.array([fits[n].allreduce_s(size) for size in sizes])
        times.loglog(sizes, bench["time_s"], "o", color=color, markersize=4, label=f"measured, {n} ranks")
        times.loglog(sizes, fitted, "-", color=color, label=f"alpha-beta fit, {n} ranks")
        residuals.semilogx(
            sizes, (fitted / bench["time_s"] - 1) * 100, "o-", color=color, markersize=4, label=f"{n} ranks"
        )
    for ax in (times, residuals):
        for size in buckets:
            ax.axvline(size, color="gray", linestyle=":", linewidth=1)
    residuals.axhline(0, color="k", linewidth=1)
    times.set(xlabel="message size (bytes)", ylabel="seconds", title="All-reduce time (dotted: DDP buckets)")
    residuals.set(xlabel="message size (bytes)", ylabel="fit / measured - 1 (%)", title="Relative error of the fit")
    times.legend(fontsize=7, loc="upper left")
    residuals.legend(fontsize=7)
    fig.tight_layout()
    return fig


FIT_COLUMNS = {
    "alpha_us": ("Latency α (µs)", "{:.2f}"),
    "beta_ns": ("Time per byte β (ns)", "{:.4f}"),
    "bus_bandwidth_GBps": ("Bus bandwidth (GB/s)", "{:.2f}"),
    "r2": ("R²", "{:.4f}"),
    "max_error_pct": ("Largest error of the fit (%)", "{:.1f}"),
}


def fit_markdown(experiment: Experiment) -> str:
    """The α–β fit of the all-reduce, one row per world size benchmarked."""
    fits = pd.DataFrame(
        {
            n: {
                "alpha_us": f.alpha_s * 1e6,
                "beta_ns": f.beta_s_per_byte * 1e9,
                "bus_bandwidth_GBps": f.bus_bandwidth_GBps,
                "r2": f.r2,
                "max_error_pct": f.max_relative_error * 100,
            }
            for n, f in allreduce_fits(experiment).items()
        }
    ).T
    return quantity_table(fits, FIT_COLUMNS, "Ranks")


# The prediction table in the reader's words: (row label, column of `predict`, scale, format).
PREDICTION_ROWS = {
    "buckets": ("DDP gradient buckets", "{:.0f}"),
    "predicted_compute_s": ("Compute per step, predicted (ms)", "{:.1f}", 1e3),
    "measured_compute_s": ("Compute per step, measured, mean (ms)", "{:.1f}", 1e3),
    "predicted_comm_s": ("All-reduce per step, predicted (ms)", "{:.1f}", 1e3),
    "measured_comm_s": ("All-reduce per step, measured, mean (ms)", "{:.1f}", 1e3),
    "predicted_step_s": ("Step, predicted (ms)", "{:.1f}", 1e3),
    "measured_step_s": ("Step, measured: median of the repeats' medians (ms)", "{:.1f}", 1e3),
    "predicted_speedup": ("Speedup, predicted", "{:.3f}"),
    "measured_speedup": ("Speedup, measured: median of the repeats' paired ratios", "{:.3f}"),
    **range_rows("measured_speedup", "{:.3f}"),
    "speedup_no_overlap": ("Speedup, scenario without overlap", "{:.3f}"),
    "speedup_last_bucket_only": ("Speedup, scenario last bucket only", "{:.3f}"),
    "compute_error": ("Error of the compute estimate (%)", "{:+.0f}", 100),
    "comm_error": ("Error of the all-reduce estimate (%)", "{:+.0f}", 100),
    "error": ("Error of the predicted speedup (%)", "{:+.1f}", 100),
}


def prediction_markdown(experiment: Experiment) -> str:
    """Predicted against measured, part by part, one column per world size (Markdown)."""
    prediction = predict(experiment)
    return quantity_table(
        prediction, PREDICTION_ROWS, turned=True, column_names=[f"{n} ranks" for n in prediction.index]
    )


def prediction_figure(experiment: Experiment):
    prediction = predict(experiment)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    x = np.arange(len(prediction))
    ax.bar(x - 0.2, prediction["predicted_speedup"], 0.4, label="predicted")
    error = [
        prediction["measured_speedup"] - prediction["measured_speedup_low"],
        prediction["measured_speedup_high"] - prediction["measured_speedup"],
    ]
    ax.bar(
        x + 0.2, prediction["measured_speedup"], 0.4, yerr=error, capsize=4, label="measured (bar: range of repeats)"
    )
    ax.vlines(
        x - 0.2,
        prediction["speedup_no_overlap"],
        prediction["speedup_last_bucket_only"],
        color="k",
        linewidth=3,
        label="scenarios: no overlap to last bucket only",
    )
    for end in ("speedup_no_overlap", "speedup_last_bucket_only"):  # a tick at each, seen where the two are close
        ax.hlines(prediction[end], x - 0.35, x - 0.05, color="k", linewidth=1.5)
    ax.set(
        xticks=x,
        xticklabels=[f"{n} ranks" for n in prediction.index],
        ylabel="speedup",
        title="Predicted vs measured speedup",
    )
    fig.legend(loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


def forecast_markdown(experiment: Experiment) -> str:
    """The NVLink forecast per preset, presets as columns so that it fits the page."""
    workload = experiment.baseline
    return quantity_table(
        forecast(workload.model, workload.global_batch_size, FORECAST_GPUS), FORECAST_ROWS, turned=True
    )
