"""The chapter Over a network: whose runs of the emulated nodes it shows, and the real clusters they stand for."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ddp_core.analysis.emulated import BASELINE
from ddp_core.analysis.gpu_measurements import ForecastBounds, emulated_table, forecast_bounds, load_gpu_results
from ddp_core.analysis.likeness import likeness_table
from ddp_core.analysis.provenance import Whose, runs_shown
from ddp_core.analysis.results import load_study
from ddp_core.analysis.tables import quantity_table


@dataclass(frozen=True)
class Findings:
    """What the chapter's introduction quotes."""

    runs: Whose
    gpu_device: str
    gpu_forecast: ForecastBounds  # the GPU section's four H200s, from one GPU's steps measured in DDP


def findings(results: Path) -> Findings:
    """Whose the one-node runs of the nodes study are, which stand for every study on the emulated nodes, and what a
    measured GPU's steps say of dividing a step among GPUs."""
    nodes, gpu = load_study(results / "nodes"), load_gpu_results(results)
    return Findings(
        runs=runs_shown(nodes[BASELINE]),
        gpu_device=gpu.eager.info["device_name"],
        gpu_forecast=forecast_bounds(gpu, emulated_table(nodes)),
    )


def likeness_markdown(results: Path) -> str:
    """`likeness_table`: the headline's emulated nodes beside the clusters whose ratio they borrow, a column each."""
    table = likeness_table(load_study(results / "nodes"))
    return quantity_table(
        table,
        {
            "model": ("Model", "{}"),
            "global_batch": ("Global batch", "{:.0f}"),
            "bench_ratio": ("Compute over all-reduce, as a benchmark times it ($R_N^\\text{bench}$)", "{:.2f}"),
            "runs_ratio": ("Compute over all-reduce inside the runs ($R_N$)", "{:.2f}"),
            "exposed_share": ("Share of the all-reduce that backward did not hide ($f$)", "{:.0%}"),
            "fixed_ms": ("All-reduce time a faster link would not remove (ms per step)", "{:.2f}"),
            "speedup": ("Speedup over one", "{}"),
        },
        turned=True,
        column_names=list(table.index),
    )
