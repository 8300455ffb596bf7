"""The forecast page: every choice it offers, evaluated when the book is built, as JSON for the page's script.
Also a figure of the same forecasts for the PDF, and how far to trust them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
from IPython.display import HTML
from matplotlib.ticker import FormatStrFormatter, NullFormatter, NullLocator

from ddp_core.analysis.cluster_forecast import (
    CHOICES,
    INTERCONNECTS,
    Cluster,
    cluster_forecast,
    forecast_grid,
    proportional_check,
)
from ddp_core.analysis.emulated import BASELINE, Forecasts, forecasts
from ddp_core.analysis.gpu_measurements import (
    ForecastBounds,
    best_mfu,
    emulated_table,
    forecast_bounds,
    load_gpu_results,
)
from ddp_core.analysis.nvlink_forecast import FORECAST_GPUS, load_timelines, peak_gemm_flops_per_s
from ddp_core.analysis.results import load_study
from ddp_core.analysis.tables import quantity_table
from ddp_core.analysis.throughput import precision_name

# The choice the page opens with and the figure draws around: the large model with the most work per GPU the H200's
# timelines measured (their check on the page is at 256 tokens), where dividing the step erred least.
DEFAULT = {"preset": "large", "seq_len": 256, "batch_per_gpu": 64, "mfu": 0.2, "interconnect": "nvlink", "gpus": 4}


def workload(results: Path) -> dict:
    """The vocabulary, length and classes of the nodes study's model: the workload of the clusters it models."""
    return load_study(results / "nodes")[BASELINE].baseline.model


def grid_json(results: Path) -> str:
    """Every choice's forecast, rounded to four significant digits, with the choices offered and the default."""

    def rounded(value):
        if isinstance(value, float):
            return float(f"{value:.4g}")
        return [rounded(item) for item in value] if isinstance(value, list) else value

    rows = [{key: rounded(value) for key, value in row.items()} for row in forecast_grid(workload(results))]
    return json.dumps({"choices": CHOICES, "default": DEFAULT, "rows": rows}, separators=(",", ":"))


@dataclass(frozen=True)
class WorstCheck:
    """Where dividing the whole batch's step overstated a measured GPU's speedup most (`proportional_check`)."""

    most_over: float  # the divided speedup over the measured one
    batch: int
    seq_len: int
    precision: str


@dataclass(frozen=True)
class Findings:
    """What the page quotes beside its answer, and every choice's forecast for its script (`forecast_grid`)."""

    forecast_grid: HTML
    nodes_forecast: Forecasts  # the emulated nodes' forecasts against their runs
    gpu_device: str
    gpu_best_mfu: float
    gpu_forecast: ForecastBounds  # the GPU chapter's, from the measured steps at a small batch
    page_at_measured: float  # this page's speedup at that shape
    check: WorstCheck
    peak_tflops: float
    nvlink_max_gpus: int  # the most GPUs each published all-reduce measured
    ethernet_max_gpus: int


def findings(results: Path) -> Findings:
    """How far to trust the page's forecasts: against the emulated nodes' runs, against a measured GPU's steps, and
    within what the publications measured."""
    nodes = load_study(results / "nodes")
    check = proportional_check(load_timelines(results / "gpu_timeline"))
    over = check["divided_share"] / check["measured_share"]
    worst = check.loc[over.idxmax()]
    gpu = load_gpu_results(results)
    measured = forecast_bounds(gpu, emulated_table(nodes))
    at_measured = Cluster(**DEFAULT | {"seq_len": measured.seq_len, "batch_per_gpu": measured.batch})
    return Findings(
        forecast_grid=HTML(f'<script type="application/json" id="forecast-grid">{grid_json(results)}</script>'),
        nodes_forecast=forecasts(nodes),
        gpu_device=gpu.eager.info["device_name"],
        gpu_best_mfu=best_mfu(gpu).mfu,
        gpu_forecast=measured,
        page_at_measured=cluster_forecast(at_measured, nodes[BASELINE].baseline.model)["speedup"],
        check=WorstCheck(
            most_over=over.max(),
            batch=int(worst["batch_per_gpu"]),
            seq_len=int(worst["seq_len"]),
            precision=precision_name(worst["amp"]),
        ),
        peak_tflops=peak_gemm_flops_per_s() / 1e12,
        nvlink_max_gpus=INTERCONNECTS["nvlink"][1],
        ethernet_max_gpus=INTERCONNECTS["ethernet"][1],
    )


def speedup_figure(results: Path):
    """The forecast speedup against the GPUs, a line per model and a panel per interconnect, at the default's workload.
    A dashed line marks the most GPUs the publication measured."""
    shape = workload(results)
    fig, axes = plt.subplots(1, len(INTERCONNECTS), figsize=(9, 3.4), sharey=True)
    for ax, interconnect in zip(axes, INTERCONNECTS):
        for preset in CHOICES["preset"]:
            speedups = [
                cluster_forecast(
                    Cluster(**DEFAULT | {"preset": preset, "interconnect": interconnect, "gpus": n}), shape
                )["speedup"]
                for n in CHOICES["gpus"]
            ]
            ax.plot(CHOICES["gpus"], speedups, "o-", label=f"{preset} model")
        ax.plot(CHOICES["gpus"], CHOICES["gpus"], ":", color="gray", label="ideal (N)")
        ax.axvline(INTERCONNECTS[interconnect][1], color="gray", linewidth=0.8, linestyle="--")
        ax.set(xscale="log", yscale="log", xlabel="GPUs", title=interconnect)
        ax.set_xticks(CHOICES["gpus"], [str(n) for n in CHOICES["gpus"]], minor=False)
        ax.xaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    axes[0].set_ylabel("speedup over one GPU")
    axes[0].legend(fontsize=8)
    fig.suptitle(  # the default's length, batch a GPU and utilisation
        f"{DEFAULT['seq_len']} tokens, {DEFAULT['batch_per_gpu']} sequences a GPU, "
        f"{DEFAULT['mfu']:.0%} of the A100's peak",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def check_markdown(results: Path) -> str:
    """`proportional_check` as a table, a row per precision and batch per GPU."""
    table = proportional_check(load_timelines(results / "gpu_timeline"))
    table.index = [
        f"{precision_name(row.amp)}, {row.batch_per_gpu} of {row.seq_len} tokens" for row in table.itertuples()
    ]
    return quantity_table(
        table,
        {
            "measured_share": (f"Speedup on {FORECAST_GPUS} GPUs, from each GPU's measured step", "{:.2f}"),
            "divided_share": (f"Speedup on {FORECAST_GPUS} GPUs, from the whole batch's step divided", "{:.2f}"),
        },
        "Precision, sequences a GPU",
    )
