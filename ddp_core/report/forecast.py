"""The forecast page: every choice it offers evaluated when the book is built (`cluster_forecast.forecast_grid`), as
JSON the page's script looks a choice up in; a figure of the same forecasts for the PDF; and how far to trust them."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.ticker import FormatStrFormatter, NullFormatter, NullLocator

from ddp_core.analysis.cluster_forecast import (
    CHOICES,
    INTERCONNECTS,
    Cluster,
    cluster_forecast,
    forecast_grid,
    proportional_check,
)
from ddp_core.analysis.emulated import BASELINE, forecast_findings
from ddp_core.analysis.gpu_measurements import forecast_findings as gpu_forecast_findings
from ddp_core.analysis.gpu_measurements import load_gpu_results, mfu_findings
from ddp_core.analysis.nvlink_forecast import FORECAST_GPUS, load_timelines, peak_gemm_flops_per_s
from ddp_core.analysis.results import load_study
from ddp_core.analysis.tables import quantity_table
from ddp_core.analysis.throughput import precision_name

# The choice the page opens with and the figure draws around: the large model with the most work per GPU the H200's
# timelines measured (their check on the page is at 256 tokens), where dividing the step erred least.
DEFAULT = {"preset": "large", "seq_len": 256, "batch_per_gpu": 64, "mfu": 0.2, "interconnect": "nvlink", "gpus": 4}


# What the page quotes of the GPU chapter's forecast from one GPU's measured steps, for its caveat.
MEASURED_FORECAST = tuple(
    f"forecast_{key}"
    for key in ("batch", "seq_len", "compute_over_ideal", "speedup_low", "speedup_high", "speedup_word")
)


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


def trust_findings(results: Path) -> dict:
    """What the page quotes beside its answer: the emulated nodes' forecasts against their runs (`forecast_findings`),
    how far dividing the whole batch's step overstated a measured GPU's speedup (`proportional_check`), its best MFU,
    the GPU chapter's forecast from that GPU's measured steps at a small batch beside this page's at the same shape,
    the published peak, and the most GPUs each published all-reduce measured."""
    nodes = load_study(results / "nodes")
    check = proportional_check(load_timelines(results / "gpu_timeline"))
    over = check["divided_share"] / check["measured_share"]
    worst = check.loc[over.idxmax()]
    gpu = load_gpu_results(results)
    measured = gpu_forecast_findings(gpu, nodes)
    return (
        {f"nodes_{key}": value for key, value in forecast_findings(nodes).items()}
        | {f"gpu_{key}": measured[key] for key in MEASURED_FORECAST}
        | {
            "page_at_measured": cluster_forecast(
                Cluster(
                    **DEFAULT | {"seq_len": measured["forecast_seq_len"], "batch_per_gpu": measured["forecast_batch"]}
                ),
                nodes[BASELINE].baseline.model,
            )["speedup"]
        }
        | {
            "gpu_device": gpu.eager.info["device_name"],
            "gpu_best_mfu": mfu_findings(gpu)["best_mfu"],
            "check_most_over": over.max(),
            "check_batch": int(worst["batch_per_gpu"]),
            "check_seq_len": int(worst["seq_len"]),
            "check_precision": precision_name(worst["amp"]),
            "peak_tflops": peak_gemm_flops_per_s() / 1e12,
        }
        | {f"{name}_max_gpus": most_gpus for name, (_, most_gpus) in INTERCONNECTS.items()}
    )


def speedup_figure(results: Path):
    """The forecast speedup against the GPUs, a line per model, over each interconnect, at the default's length,
    batch a GPU and utilisation (in its title); dashed where the publication measured fewer GPUs."""
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
    fig.suptitle(
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
