"""The forecast page: every choice it offers evaluated when the book is built (`cluster_forecast.forecast_grid`), as
JSON the page's script looks a choice up in; a figure of the same forecasts for the PDF; and how far to trust them."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.ticker import FormatStrFormatter, NullFormatter, NullLocator

from ddp_core.analysis.cluster_forecast import CHOICES, INTERCONNECTS, Cluster, cluster_forecast, forecast_grid
from ddp_core.analysis.emulated import BASELINE, forecast_findings
from ddp_core.analysis.gpu_measurements import load_gpu_results, mfu_findings
from ddp_core.analysis.nvlink_forecast import load_timelines, peak_gemm_flops_per_s, replay_findings
from ddp_core.analysis.results import load_study

# The choice the page opens with and the figure draws around: the large model at the nodes study's length.
DEFAULT = {"preset": "large", "seq_len": 128, "batch_per_gpu": 32, "mfu": 0.4, "interconnect": "nvlink", "gpus": 4}


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
    how much more than its share of the batch one measured GPU's step took (`replay_findings`), that GPU's best MFU,
    the published peak, and the most GPUs each published all-reduce measured."""
    nodes = load_study(results / "nodes")
    replay = replay_findings(load_timelines(results / "gpu_timeline"))
    gpu = load_gpu_results(results)
    return ({f"nodes_{key}": value for key, value in forecast_findings(nodes).items()}
            | {"gpu_device": gpu.eager.info["device_name"], "gpu_best_mfu": mfu_findings(gpu)["best_mfu"],
               "gpu_over_ideal": replay["replay_small_over_ideal"],
               "gpu_over_ideal_batch": replay["replay_small_batch"],
               "gpu_over_ideal_global": replay["replay_small_global"],
               "peak_tflops": peak_gemm_flops_per_s() / 1e12}
            | {f"{name}_max_gpus": most for name, (_, most) in INTERCONNECTS.items()})


def speedup_figure(results: Path):
    """The forecast speedup against the GPUs, a line per model, over each interconnect, at the default's length,
    batch a GPU and utilisation; dashed where the publication measured fewer GPUs."""
    shape = workload(results)
    fig, axes = plt.subplots(1, len(INTERCONNECTS), figsize=(9, 3.4), sharey=True)
    for ax, interconnect in zip(axes, INTERCONNECTS):
        for preset in CHOICES["preset"]:
            speedups = [cluster_forecast(Cluster(**DEFAULT | {"preset": preset, "interconnect": interconnect,
                                                              "gpus": n}), shape)["speedup"] for n in CHOICES["gpus"]]
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
    fig.tight_layout()
    return fig
