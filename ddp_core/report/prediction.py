"""The chapter "Predicting scaling": the all-reduce fit, predicted against measured speedup, the NVLink
forecast, and what the CPU these runs used does to the model."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ddp_core.report.cost_model import allreduce_fits, bucket_sizes, predict
from ddp_core.report.nvlink_forecast import forecast, nvlink_fit, peak_gemm_flops_per_s
from ddp_core.report.results import Experiment

FORECAST_GPUS = 4
FORECAST_LABELS = {
    "parameters": "parameters", "buckets": "DDP buckets", "comm_ms": "all-reduce per step (ms)",
    "last_bucket_ms": "last bucket (ms)", "compute_bound_ms": "T1 at the peak rate (ms)",
    "speedup_no_overlap": "speedup, no overlap", "speedup_last_bucket_only": "speedup, last bucket only",
    "break_even_compute_ms": "break-even T1 (ms)", "efficiency_90_compute_ms": "T1 for 90 % efficiency (ms)"}


def findings(experiment: Experiment) -> dict:
    """The numbers and words the chapter's prose quotes."""
    prediction, fits = predict(experiment), allreduce_fits(experiment)
    buckets = bucket_sizes(experiment.baseline.model)
    fit = fits[max(fits)]
    worst = int(prediction["error"].abs().idxmax())
    at_worst = prediction.loc[worst]
    step_gap = at_worst["predicted_step_s"] - at_worst["measured_step_s"]
    comm_gap = at_worst["predicted_comm_s"] - at_worst["measured_comm_s"]
    return {
        "largest": max(fits), "alpha_us": fit.alpha_s * 1e6, "beta_ns": fit.beta_s_per_byte * 1e9,
        "busbw": fit.bus_bandwidth_GBps, "r2": fit.r2, "fit_error": fit.max_relative_error,
        "n_buckets": len(buckets), "gradient_mb": sum(buckets) / 2**20,
        "max_error": float(prediction["error"].abs().max()), "worst_n": worst,
        "target_verdict": "meets" if prediction["error"].abs().max() <= 0.10 else "misses",
        "worst_step_gap_ms": float(step_gap * 1e3), "worst_comm_gap_ms": float(comm_gap * 1e3),
        "worst_cause": "the communication estimate" if abs(comm_gap) > abs(step_gap - comm_gap)
        else "the compute estimate",
    } | forecast_findings(experiment) | hardware_findings(experiment, worst)


def forecast_findings(experiment: Experiment) -> dict:
    workload = experiment.baseline
    nvlink = nvlink_fit(FORECAST_GPUS)
    ahead = forecast(workload.model, workload.global_batch_size, FORECAST_GPUS)
    return {
        "gpus": FORECAST_GPUS, "nv_alpha_us": nvlink.alpha_s * 1e6, "nv_busbw": nvlink.bus_bandwidth_GBps,
        "nv_r2": nvlink.r2, "nv_fit_error": nvlink.max_relative_error, "nv_tflops": peak_gemm_flops_per_s() / 1e12,
        "nv_batch": workload.global_batch_size, "nv_seq": workload.model["max_len"],
        "nv_paying": ", ".join(ahead.index[ahead["speedup_no_overlap"] > 1]) or "none",
        "nv_paying_best_case": ", ".join(ahead.index[ahead["speedup_last_bucket_only"] > 1]) or "none",
    }


def hardware_findings(experiment: Experiment, worst: int) -> dict:
    """How the CPU the runs shared bends the model, at the world size it missed most."""
    prediction, runs = predict(experiment), experiment.runs
    at_worst = prediction.loc[worst]
    one = runs[1]
    return {
        "cores": one.cpu_count, "threads_1": one.threads_per_rank, "threads_worst": runs[worst].threads_per_rank,
        "oversubscription": runs[worst].threads_per_rank * runs[worst].local_world_size / one.cpu_count,
        "compute_predicted_ms": float(at_worst["predicted_compute_s"] * 1e3),
        "compute_measured_ms": float(at_worst["measured_compute_s"] * 1e3),
        "comm_predicted_ms": float(at_worst["predicted_comm_s"] * 1e3),
        "comm_measured_ms": float(at_worst["measured_comm_s"] * 1e3),
        "comm_slowdown": float(at_worst["measured_comm_s"] / at_worst["predicted_comm_s"]),
        "hardware_note": "These runs ran on GPUs; the CPU specifics below apply to a run without GPUs."
        if one.on_gpu else "These runs ran on CPU cores, and three things follow from it.",
    }


def allreduce_figure(experiment: Experiment):
    """Measured all-reduce time with its fit, and bus bandwidth, against message size; DDP's buckets marked."""
    fits, buckets = allreduce_fits(experiment), bucket_sizes(experiment.baseline.model)
    fig, (times, bandwidth) = plt.subplots(1, 2, figsize=(10, 3.8))
    for n, bench in experiment.allreduce.items():
        sizes = bench["size_bytes"].to_numpy(float)
        times.loglog(sizes, bench["time_s"], "o", label=f"measured, N={n}")
        times.loglog(sizes, [fits[n].allreduce_s(s) for s in sizes], "-", label=f"fit, N={n}")
        bandwidth.semilogx(sizes, bench["busbw_GBps"], "o-", label=f"N={n}")
    for ax in (times, bandwidth):
        for size in buckets:
            ax.axvline(size, color="gray", linestyle=":", linewidth=1)
    times.set(xlabel="message size (bytes)", ylabel="seconds", title="All-reduce time (dotted: DDP buckets)")
    bandwidth.set(xlabel="message size (bytes)", ylabel="GB/s", title="Bus bandwidth")
    times.legend(fontsize=8)
    bandwidth.legend(fontsize=8)
    fig.tight_layout()
    return fig


def fit_table(experiment: Experiment) -> str:
    return ("| ranks | alpha (µs) | beta (ns/B) | busbw (GB/s) | R² | max rel. error |\n|---|---|---|---|---|---|\n"
            + "\n".join(f"| {n} | {f.alpha_s * 1e6:.2f} | {f.beta_s_per_byte * 1e9:.4f} | {f.bus_bandwidth_GBps:.2f} "
                        f"| {f.r2:.4f} | {f.max_relative_error:.1%} |" for n, f in allreduce_fits(experiment).items()))


def prediction_table(experiment: Experiment) -> str:
    return predict(experiment)[[
        "buckets", "predicted_comm_s", "measured_comm_s", "predicted_step_s", "measured_step_s", "predicted_speedup",
        "speedup_no_overlap", "speedup_last_bucket_only", "measured_speedup", "predicted_efficiency",
        "measured_efficiency", "error"]].to_markdown(floatfmt=".4g")


def prediction_figure(experiment: Experiment):
    prediction = predict(experiment)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    x = np.arange(len(prediction))
    ax.bar(x - 0.2, prediction["predicted_speedup"], 0.4, label="predicted")
    ax.bar(x + 0.2, prediction["measured_speedup"], 0.4, label="measured")
    ax.plot(x - 0.2, prediction["speedup_no_overlap"], "v", color="k", label="scenario: no overlap")
    ax.plot(x - 0.2, prediction["speedup_last_bucket_only"], "^", color="gray", label="scenario: last bucket only")
    ax.set(xticks=x, xticklabels=prediction.index, xlabel="ranks", ylabel="speedup",
           title="Predicted vs measured speedup")
    ax.legend()
    fig.tight_layout()
    return fig


def forecast_table(experiment: Experiment) -> str:
    """The NVLink forecast per preset, presets as columns so that it fits the page."""
    workload = experiment.baseline
    ahead = forecast(workload.model, workload.global_batch_size, FORECAST_GPUS)
    cells = ahead.apply(lambda column: column.map(
        "{:,}".format if column.name in ("parameters", "buckets") else "{:.3g}".format))
    return cells.rename(columns=FORECAST_LABELS).T.to_markdown(disable_numparse=True)
