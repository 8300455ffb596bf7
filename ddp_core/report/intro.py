"""The book's first page: what was measured on what, the speedups, and when DDP pays. Reads an `Experiment`;
offers `findings` for the page's glue, the headline of the chapters that derive each number."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from ddp_core.analysis import gpu_measurements, headline, zero
from ddp_core.analysis.comparisons import study_floor_power
from ddp_core.analysis.critical_batch import critical_batch_findings
from ddp_core.analysis.emulated import (
    BASELINE,
    SIMILARITY_EFFECT,
    headline_findings,
    link_experiments,
    node_share,
    nodes_figure,
    similarity_table,
    similarity_test_table,
)
from ddp_core.analysis.likeness import likeness_table
from ddp_core.analysis.payoff import payoff_findings
from ddp_core.analysis.provenance import origin, shown_folder, whose_findings
from ddp_core.analysis.results import Experiment, load_experiment, load_measurements, load_study, point_label
from ddp_core.analysis.speedups import largest_findings, scaling_table
from ddp_core.analysis.tables import counted, cpu_relation, machine_text, median_range, noise_format, quantity_table
from ddp_core.analysis.throughput import ratio_findings
from ddp_core.studies.study_list import load_study_list


def key_findings(results: Path) -> dict:
    """The main result of each chapter the first page leads with, from the studies in `results`: the results
    chapter's runs, the emulated nodes (`nodes_`), the GPU (`gpu_`), time to accuracy (`tta_`), the One device
    chapter's ratios (`device_`; the GPU's among the `gpu_` findings), sharding (`sharding_`) and the list of
    studies."""
    scaling, nodes = load_experiment(results / "scaling"), load_study(results / "nodes")
    # The studies beyond the results chapter's, from the study list itself: the overview the first page gives can
    # then never leave one out.
    titles = [study.title for name, study in load_study_list().items() if name != "scaling"]
    # The One device chapter's ratios on the device the results chapter's runs had, or on the first one measured.
    measurements = load_measurements(results / "single_device")
    same = [m for m in measurements if m.info["device_name"] == scaling.baseline.device_name]
    measured = (same or measurements)[0]
    return (
        findings(scaling)
        | headline_findings(nodes)
        | {"nodes_results_kind": shown_folder(nodes[BASELINE])[1]}
        | {f"headline_{key}": value for key, value in headline.headline_findings(scaling, nodes).items()}
        | gpu_measurements.headline_findings(results, nodes)
        | {"study_count": len(titles), "study_titles": "; ".join(titles)}
        | critical_batch_findings(load_study(results / "time_to_accuracy"))
        | ratio_findings(measured)
        | {
            "runs_machine": machine_text(scaling.baseline.raw),
            "runs_cpu_relation": cpu_relation(measured.info, scaling.baseline.raw),
        }
        | zero.headline_findings(zero.sharding_runs(nodes))
    )


def headline_figure(results: Path):
    """The headline's runs (`headline_runs`): the emulated nodes' figure, or the GPUs' beside the emulated nodes. Each
    build also saves it as `_build/headline.png` for the README; `make reference` keeps it beside the reference."""
    scaling, nodes = load_experiment(results / "scaling"), load_study(results / "nodes")
    on_gpus = headline.headline_runs(scaling, nodes).experiment is scaling
    figure = gpus_figure(scaling, nodes) if on_gpus else nodes_figure(nodes)
    path = results.parents[1] / "_build" / "headline.png"
    path.parent.mkdir(exist_ok=True)
    figure.savefig(path, dpi=100)
    return figure


def gpus_figure(scaling: Experiment, nodes: dict[str, Experiment]):
    """The GPUs' speedup over one against their number, beside the ideal N and, in grey, the emulated nodes' links;
    and their step's compute and exposed all-reduce beside one GPU's compute / N."""
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


def summary_table(results: Path) -> pd.DataFrame:
    """One row per finding the key findings page leads with: each configuration the emulated nodes modelled at each
    number of nodes (the speedup with its range, the efficiency, the
    verdict against one node, and the runs' own R_N against the break-even f/(N-1)); the similarity test (the
    speedups' ratio on nodes of half the share); and the results chapter's ranks that share one machine's cores."""
    nodes = load_study(results / "nodes")
    rows = []
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
    for row in similarity_test_table(nodes).itertuples():
        rows.append(
            dict(
                setting=f"{counted(row.nodes, 'node')}, links set to {row.configuration}: speedup at "
                f"{row.other_share:g} core over at {row.share:g}",
                value=median_range(row.ratio, row.low, row.high),
                efficiency="",
                verdict=row.verdict,
                floor=f"{row.floor:.0%}",
                why=f"a {SIMILARITY_EFFECT:.0%} difference shows {row.finds_effect:.0%} of the time",
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
            "value": ("Speedup or ratio, median (range)", "{}"),
            "efficiency": ("Efficiency", "{}"),
            "verdict": ("Verdict", "{}"),
            "floor": ("Noise floor", "{}"),
            "why": ("Why", "{}"),
        },
    )


def findings(experiment: Experiment) -> dict:
    table = scaling_table(experiment)
    one = experiment.baseline
    return (
        largest_findings(experiment)
        | payoff_findings(experiment)
        | whose_findings(experiment)
        | {
            "parameters": one.parameters,
            "device": one.device_name,
            "backend": one.backend,
            "efficiencies": " and ".join(
                f"{table.loc[n, 'efficiency']:.0%} at {n} ranks" for n in table.index if n > 1
            ),
            # how often runs this noisy find a true 10 % difference, beside every verdict on them
            "speedup_nmax_power": study_floor_power({"": experiment})["found_10"],
        }
    )
