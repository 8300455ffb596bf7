"""The book's first page: what was measured on what, the speedups, and when DDP pays. Its `findings` are the
headlines of the chapters that derive each number."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from ddp_core.analysis import emulated, headline, zero
from ddp_core.analysis.comparisons import Judged
from ddp_core.analysis.critical_batch import CriticalBatchStudy, critical_batch_study
from ddp_core.analysis.emulated import (
    BASELINE,
    SIMILARITY_EFFECT,
    Forecasts,
    link_experiments,
    node_share,
    nodes_figure,
    similarity_table,
    similarity_test_table,
)
from ddp_core.analysis.emulated import Headline as NodesHeadline
from ddp_core.analysis.gpu_measurements import ForecastBounds, emulated_table, forecast_bounds, load_gpu_results
from ddp_core.analysis.headline import Headline
from ddp_core.analysis.provenance import Whose, origin, runs_shown
from ddp_core.analysis.results import Experiment, load_experiment, load_study, point_label
from ddp_core.analysis.speedups import largest, scaling_table
from ddp_core.analysis.tables import counted, median_range, noise_format, quantity_table
from ddp_core.analysis.zero import Headline as ShardingHeadline
from ddp_core.studies.study_list import load_study_list


@dataclass(frozen=True)
class Findings:
    """What the first page quotes: the headline, and the main result of each chapter it leads with."""

    headline: Headline  # the runs whose processes each had compute of their own
    largest: int  # the results chapter's runs, at the most ranks
    placement: str
    speedup_nmax: Judged
    runs: Whose
    nodes: NodesHeadline
    nodes_forecast: Forecasts
    nodes_whose: str
    gpu_device: str
    gpu_forecast: ForecastBounds
    tta: CriticalBatchStudy
    sharding: ShardingHeadline
    study_count: int  # the studies beyond the results chapter's, from the study list itself


def findings(results: Path) -> Findings:
    """The main result of each chapter the first page leads with, from the studies in `results`."""
    scaling, nodes = load_experiment(results / "scaling"), load_study(results / "nodes")
    gpu = load_gpu_results(results)
    shared = largest(scaling)
    return Findings(
        headline=headline.headline(scaling, nodes),
        largest=shared.largest,
        placement=shared.placement,
        speedup_nmax=shared.speedup_nmax,
        runs=runs_shown(scaling),
        nodes=emulated.headline(nodes),
        nodes_forecast=emulated.forecasts(nodes),
        nodes_whose=origin(nodes[BASELINE].folder),
        gpu_device=gpu.eager.info["device_name"],
        gpu_forecast=forecast_bounds(gpu, emulated_table(nodes)),
        tta=critical_batch_study(load_study(results / "time_to_accuracy")),
        sharding=zero.headline(zero.sharding_runs(nodes)),
        study_count=sum(name != "scaling" for name in load_study_list()),
    )


def headline_figure(results: Path):
    """The headline's runs (`headline_runs`): the emulated nodes' figure, or the GPUs' beside the emulated nodes. Each
    build also saves it as `_build/headline.png` for the README."""
    scaling, nodes = load_experiment(results / "scaling"), load_study(results / "nodes")
    on_gpus = headline.headline_runs(scaling, nodes).experiment is scaling
    figure = gpus_figure(scaling, nodes) if on_gpus else nodes_figure(nodes)
    path = results.parents[1] / "_build" / "headline.png"  # `make reference` keeps it beside the reference
    path.parent.mkdir(exist_ok=True)
    figure.savefig(path, dpi=100)
    return figure


@dataclass(frozen=True)
class StepParts:
    """One mean step of the headline's runs at their most processes, in ms, in the order a step spends them."""

    processes: int
    forward_backward_ms: float
    hidden_ms: float  # the all-reduce in flight while backward still computed
    exposed_ms: float  # the all-reduce after backward, which the step waits for
    optimizer_ms: float
    other_ms: float  # what no timer covers: loading the batch, the loop


def step_parts(results: Path) -> StepParts:
    """`StepParts` of the headline's runs (`headline_runs`), means over the steady epochs."""
    scaling, nodes = load_experiment(results / "scaling"), load_study(results / "nodes")
    experiment = headline.headline_runs(scaling, nodes).experiment
    columns = ["mean_step_s", "compute_per_step_s", "optimizer_per_step_s", "comm_total_per_step_s"]
    row = scaling_table(experiment).loc[experiment.largest, [*columns, "comm_exposed_per_step_s"]].astype(float) * 1e3
    exposed = row["comm_exposed_per_step_s"]
    return StepParts(
        processes=experiment.largest,
        forward_backward_ms=row["compute_per_step_s"] - row["optimizer_per_step_s"],
        hidden_ms=row["comm_total_per_step_s"] - exposed,
        exposed_ms=exposed,
        optimizer_ms=row["optimizer_per_step_s"],
        other_ms=row["mean_step_s"] - row["compute_per_step_s"] - exposed,
    )


def step_figure(results: Path):
    """One step as a timeline: forward and backward, the all-reduce under backward's end (hidden) and after it
    (exposed), then the optimizer. It draws the first page's terms with the headline's own milliseconds."""
    parts = step_parts(results)
    backward_end = parts.forward_backward_ms
    spans = [
        ("compute", 0, backward_end, "C0", "forward + backward"),
        ("all-reduce", backward_end - parts.hidden_ms, parts.hidden_ms, "C2", "hidden"),
        ("all-reduce", backward_end, parts.exposed_ms, "C3", "exposed"),
        ("compute", backward_end + parts.exposed_ms, parts.optimizer_ms, "C1", "optimizer"),
    ]
    fig, ax = plt.subplots(figsize=(9, 2.2))
    for lane, start, width, colour, name in spans:
        ax.barh(lane, width, left=start, color=colour, edgecolor="white")
        ax.text(start + width / 2, lane, f"{name}\n{width:,.0f} ms", ha="center", va="center", fontsize=8)
    untimed = f"; {parts.other_ms:,.0f} ms more go untimed (loading the batch)" if parts.other_ms >= 0.5 else ""
    ax.set(xlabel=f"ms into a mean step on {parts.processes} processes{untimed}", xlim=(0, None))
    ax.invert_yaxis()
    fig.tight_layout()
    return fig


def gpus_figure(scaling: Experiment, nodes: dict[str, Experiment]):
    """The GPUs' speedup over one against their number, beside the ideal N and the emulated nodes' links in grey.
    Beside it, their step's compute and exposed all-reduce against one GPU's compute / N."""
    table = scaling_table(scaling)
    sizes = list(table.index)
    fig, (speed, parts) = plt.subplots(1, 2, figsize=(10, 4.4))
    speed.plot(sizes, sizes, ":", color="gray", label="ideal: N")
    error = [table["speedup"] - table["speedup_low"], table["speedup_high"] - table["speedup"]]
    speed.errorbar(
        sizes,
        table["speedup"],
        yerr=error,
        fmt="o-",
        capsize=3,
        color="C0",
        label=f"{scaling.baseline.device_name} GPUs ({origin(scaling.folder)})",
    )
    whose = origin(nodes[BASELINE].folder)
    for i, (variant, experiment) in enumerate(link_experiments(nodes).items()):
        curve = scaling_table(experiment)
        speed.plot(
            curve.index,
            curve["speedup"],
            "s--",
            color="gray",
            alpha=0.4 + 0.3 * (i == 0),
            label=f"emulated nodes, links set to {point_label(experiment, experiment.largest)} ({whose})",
        )
    speed.set(xlabel="processes", ylabel="speedup over one", title="Speedup against processes")
    parts.plot(
        sizes, table.loc[1, "compute_per_step_s"] * 1e3 / table.index, ":", color="gray", label="one GPU's compute / N"
    )
    parts.plot(sizes, table["compute_per_step_s"] * 1e3, "^-", color="C0", label="compute per step")
    parts.plot(sizes, table["comm_exposed_per_step_s"] * 1e3, "x--", color="C1", label="exposed all-reduce per step")
    parts.set(xlabel="GPUs", ylabel="ms per step (mean, steady epochs)", title="Compute and exposed all-reduce")
    for ax in (speed, parts):
        ax.set_xticks(sizes)
        ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def summary_table(results: Path) -> pd.DataFrame:
    """One row per finding the key findings page leads with. They are the emulated nodes' configurations, the
    similarity test, and the results chapter's ranks that share one machine's cores."""
    nodes = load_study(results / "nodes")
    rows = []
    # Each configuration at each number of nodes: the speedup with its range, the efficiency, the verdict against
    # one node, and the runs' own R_N against the break-even f/(N-1).
    for row in similarity_table(nodes).itertuples():
        share = "" if row.share == node_share(nodes[BASELINE]) else f" of {row.share:g} core"
        rows.append(
            dict(
                setting=f"{counted(row.nodes, 'node')}{share}, {row.setting}",
                value=median_range(
                    row.speedup, row.speedup_low, row.speedup_high, noise_format(row.speedup, row.floor)
                ),
                efficiency=f"{row.efficiency:.0%}",
                verdict=row.verdict,
                floor=f"{row.floor:.0%}",
                why=f"$R_N$ {row.runs_ratio:.2f} {'>' if row.runs_ratio > row.break_even else '<'} "
                f"{row.break_even:.2f}",
            )
        )
    for row in similarity_test_table(nodes).itertuples():  # the speedups' ratio on nodes of half the share
        rows.append(
            dict(
                setting=f"{counted(row.nodes, 'node')}, links set to {row.configuration}: the speedup on nodes of "
                f"{row.other_share:g} core over the speedup on nodes of {row.share:g}",
                value=median_range(row.ratio, row.low, row.high),
                efficiency="",
                verdict=row.verdict,
                floor=f"{row.floor:.0%}",
                why=f"too noisy: a true {SIMILARITY_EFFECT:.0%} difference is found {row.finds_effect:.0%} of the time",
            )
        )
    scaling = load_experiment(results / "scaling")
    shared, one = scaling_table(scaling).loc[scaling.largest], scaling.baseline
    setting = "Ranks on a GPU each" if one.on_gpu else f"Ranks sharing one machine's {one.cpu_count} cores"
    rows.append(
        dict(
            setting=f"{setting}, {counted(scaling.largest, 'rank')}",
            value=median_range(shared["speedup"], shared["speedup_low"], shared["speedup_high"]),
            efficiency=f"{shared['efficiency']:.0%}" if one.on_gpu else "",
            verdict=shared["verdict"],
            floor=f"{shared['noise_floor']:.0%}",
            why="" if one.on_gpu else "no compute added",
        )
    )
    return pd.DataFrame(rows)


def summary_markdown(results: Path) -> str:
    return quantity_table(
        summary_table(results),
        {
            "setting": ("Setting", "{}"),
            "value": ("Speedup, median (range)", "{}"),
            "efficiency": ("Efficiency", "{}"),
            "verdict": ("Verdict", "{}"),
            "floor": ("Noise floor", "{}"),
            "why": ("Why: $R_N$ against the break-even", "{}"),
        },
    )
