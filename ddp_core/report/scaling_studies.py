"""The studies of how DDP scales: weak against strong scaling, batch size,
model size. Reads each study's `Experiment`s (`load_study`); offers per study `<study>_findings` for its
page's glue, `*_markdown` tables, `*_figure`s, and the DataFrames they are made from (`*_table`).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ddp_core.engine.model_cost import bucket_sizes, training_flops
from ddp_core.report.results import Experiment
from ddp_core.report.comparisons import (compare_speedups, compare_times, paired_sides, speedup_comparisons,
                                         time_ratio_sentence)
from ddp_core.report.verdict import compare, noise_floor
from ddp_core.report.scaling import scaling_table
from ddp_core.report.tables import quantities_by_column, rank_label


def _speedup(experiment: Experiment, n: int) -> str:
    return speedup_comparisons(experiment)[n].value()


# Weak against strong scaling ---------------------------------------------------------------------------------

def weak_scaling_findings(strong: Experiment, weak: Experiment) -> dict:
    s, w = scaling_table(strong), scaling_table(weak)
    n = max(set(s.index) & set(w.index))
    c = compare_speedups(weak, strong, n)
    speedups = f"weak scaling reaches a speedup of {_speedup(weak, n)}, strong scaling {_speedup(strong, n)}"
    if not c.decided:
        verdict = f"At {n} ranks {speedups}; weak over strong is {c.value()}: {c.why_undecided()}."
    else:
        verdict = (f"At {n} ranks {speedups}; weak over strong is {c.value()}: weak scaling scales "
                   + c.judged("worse", "better") + (
                       ": with a per-rank batch that does not shrink, each rank's step does as much work as the 1-rank "
                       "step." if c.verdict == "higher" else "."))
    return {"weak_largest": n, "weak_per_rank_batch": weak.baseline.per_rank_batch_size,
            "weak_global_batch_nmax": weak.runs[n].global_batch_size, "strong_global_batch": strong.baseline.global_batch_size,
            "weak_speedup_nmax": float(w.loc[n, "speedup"]), "strong_speedup_nmax": float(s.loc[n, "speedup"]),
            "weak_step_growth_nmax": float(w.loc[n, "step_time_s"] / w.loc[1, "step_time_s"]),
            "weak_vs_strong_sentence": verdict}


SCALING_ROWS = [
    ("Global batch (samples)", "global_batch_size", 1, "{:.0f}"),
    ("Step time, median of the repeats' medians (ms)", "step_time_s", 1e3, "{:.1f}"),
    ("Throughput, from the median step (samples/s)", "samples_per_s", 1, "{:.1f}"),
    ("Speedup, median of the repeats' paired ratios", "speedup", 1, "{:.2f}"),
    ("lowest, over repeats", "speedup_low", 1, "{:.2f}"),
    ("highest, over repeats", "speedup_high", 1, "{:.2f}"),
    ("Parallel efficiency (%)", "efficiency", 100, "{:.0f}"),
]


def side_by_side_markdown(experiments: dict[str, Experiment], rows=SCALING_ROWS) -> str:
    """A column per (setup, world size): the quantities of `rows` for several setups of one scaling study."""
    tables = {label: scaling_table(e) for label, e in experiments.items()}
    combined = pd.concat(tables.values(), ignore_index=True)
    names = [f"{label}, {rank_label(n)}" for label, t in tables.items() for n in t.index]
    return quantities_by_column(combined, rows, names)


def speedups_figure(experiments: dict[str, Experiment], title: str, predicted: dict[str, pd.Series] | None = None):
    """Measured speedup (bar: range over repeats) of several setups against ranks, the ideal beside;
    predicted speedups, where given, as markers."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    sizes = sorted({n for e in experiments.values() for n in e.runs})
    x = np.arange(len(sizes))
    width = 0.8 / (len(experiments) + 1)
    for i, (label, experiment) in enumerate(experiments.items()):
        table = scaling_table(experiment).reindex(sizes)
        error = [table["speedup"] - table["speedup_low"], table["speedup_high"] - table["speedup"]]
        offset = (i - len(experiments) / 2) * width
        ax.bar(x + offset, table["speedup"], width, yerr=error, capsize=3, label=f"{label}, measured", color=f"C{i}")
        if predicted and label in predicted:
            guess = predicted[label].reindex(sizes)
            ax.plot(x + offset, guess, "k^", markersize=7, label="predicted by the cost model" if i == 0 else None)
    ax.bar(x + (len(experiments) / 2) * width, sizes, width, color="lightgray", label="ideal (N)")
    ax.set(xticks=x, xticklabels=sizes, xlabel="ranks", ylabel="speedup", title=title)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def weak_scaling_figure(strong: Experiment, weak: Experiment):
    return speedups_figure({"strong (global batch fixed)": strong, "weak (per-rank batch fixed)": weak},
                           "Speedup: strong T1/TN against weak N t1/tN")


# Batch size --------------------------------------------------------------------------------------------------

def batch_sweep_table(study: dict[str, Experiment]) -> pd.DataFrame:
    """One row per (per-rank batch, world size): step time, throughput, compute, communication and R_N."""
    rows = []
    for experiment in study.values():
        table = scaling_table(experiment)
        for n in table.index:
            rows.append(dict(per_rank_batch=experiment.runs[n].per_rank_batch_size, world_size=n,
                             **table.loc[n, ["step_time_s", "mean_step_s", "samples_per_s", "compute_per_step_s",
                                             "comm_total_per_step_s", "compute_to_comm_ratio"]]))
    return pd.DataFrame(rows).sort_values(["world_size", "per_rank_batch"]).reset_index(drop=True)


def batch_findings(study: dict[str, Experiment]) -> dict:
    """The smallest per-rank batch against the largest, each claim through the one verdict function: time per
    sample on one rank, and at the most ranks R_N, the all-reduce time and the speedup."""
    by_batch = sorted(study.values(), key=lambda e: e.baseline.per_rank_batch_size)
    small, large = by_batch[0], by_batch[-1]
    b_small, b_large = small.baseline.per_rank_batch_size, large.baseline.per_rank_batch_size
    top = max(set(small.runs) & set(large.runs))
    ratio = compare_times(large, small, top, top, "compute_to_comm_ratio")
    comm = compare_times(large, small, top, top, "comm_total_per_step_s")
    speedup = compare_speedups(large, small, top)
    sweep = batch_sweep_table(study).set_index(["world_size", "per_rank_batch"])
    return {"batch_smallest": b_small, "batch_largest": b_large, "batch_top_ranks": top,
            "batch_factor": b_large / b_small,
            "batch_throughput_sentence": time_ratio_sentence(compare_times(large, small), f"On one rank a batch of "
                                                             f"{b_large}", f"a batch of {b_small}") + ".",
            "ratio_small_top": float(sweep.loc[(top, b_small), "compute_to_comm_ratio"]),
            "ratio_large_top": float(sweep.loc[(top, b_large), "compute_to_comm_ratio"]),
            "batch_ratio_sentence": f"{b_large} over {b_small} is {ratio.value()}: {ratio.judged('lower', 'higher')}.",
            "compute_growth_1": float(sweep.loc[(1, b_large), "compute_per_step_s"]
                                      / sweep.loc[(1, b_small), "compute_per_step_s"]),
            "comm_small_top_ms": float(sweep.loc[(top, b_small), "comm_total_per_step_s"] * 1e3),
            "comm_large_top_ms": float(sweep.loc[(top, b_large), "comm_total_per_step_s"] * 1e3),
            "batch_comm_sentence": f"{b_large} over {b_small} is {comm.value()}: {comm.judged('shorter', 'longer')}.",
            "batch_speedup_sentence": (
                f"At {top} ranks the speedup is {_speedup(large, top)} at a per-rank batch of {b_large} and "
                f"{_speedup(small, top)} at {b_small}; {b_large} over {b_small} is {speedup.value()}: "
                + speedup.judged("the larger batch scales worse", "the larger batch scales better") + ".")}


BATCH_ROWS = [("Step time, median of the repeats' medians (ms)", "step_time_s", 1e3, "{:.1f}"),
              ("Throughput, from the median step (samples/s)", "samples_per_s", 1, "{:.1f}"),
              ("Step time, mean over the steady epochs (ms)", "mean_step_s", 1e3, "{:.1f}"),
              ("of which compute (ms)", "compute_per_step_s", 1e3, "{:.1f}"),
              ("All-reduce in flight per step, mean (ms)", "comm_total_per_step_s", 1e3, "{:.1f}"),
              ("$R_N = (T_c/N)/T_\\text{comm}$", "compute_to_comm_ratio", 1, "{:.2f}")]


def batch_markdown(study: dict[str, Experiment]) -> str:
    """A column per (per-rank batch, ranks), a row per quantity."""
    sweep = batch_sweep_table(study)
    names = [f"batch {b:.0f}, {rank_label(int(n))}" for b, n in zip(sweep["per_rank_batch"], sweep["world_size"])]
    return quantities_by_column(sweep, BATCH_ROWS, names)


def batch_figure(study: dict[str, Experiment]):
    sweep = batch_sweep_table(study)
    fig, (speed, ratio) = plt.subplots(1, 2, figsize=(10, 3.6))
    for i, (n, rows) in enumerate(sweep.groupby("world_size")):
        speed.plot(rows["per_rank_batch"], rows["samples_per_s"], "o-", color=f"C{i}", label=rank_label(n))
        if n > 1:
            ratio.plot(rows["per_rank_batch"], rows["compute_to_comm_ratio"], "o-", color=f"C{i}", label=rank_label(n))
    for ax in (speed, ratio):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(sweep["per_rank_batch"].unique()), labels=sorted(sweep["per_rank_batch"].unique()))
        ax.set_xlabel("per-rank batch (samples)")
        ax.legend(fontsize=8)
    speed.set(ylabel="samples/s", title="Throughput")
    ratio.set(ylabel="$R_N = (T_c/N)/T_\\mathrm{comm}$", title="Compute-to-communication ratio $R_N$")
    fig.tight_layout()
    return fig


# Model size --------------------------------------------------------------------------------------------------

def model_size_table(study: dict[str, Experiment]) -> pd.DataFrame:
    """One row per preset: size, FLOPs and gradient bytes per step, compute at one rank, speedup and R_N at the
    largest world size."""
    rows = {}
    for preset, experiment in study.items():
        table, first = scaling_table(experiment), experiment.baseline
        n = experiment.largest
        rows[preset] = dict(parameters=first.parameters, gradient_mb=sum(bucket_sizes(first.model)) / 1e6,
                            gflops_per_step=training_flops(first.model, first.tokens_per_rank) / 1e9,
                            compute_1_s=table.loc[1, "compute_per_step_s"], largest=n,
                            speedup=table.loc[n, "speedup"], speedup_low=table.loc[n, "speedup_low"],
                            speedup_high=table.loc[n, "speedup_high"], efficiency=table.loc[n, "efficiency"],
                            comm_s=table.loc[n, "comm_total_per_step_s"], ratio=table.loc[n, "compute_to_comm_ratio"])
    return pd.DataFrame(rows).T.sort_values("parameters")


MODEL_ROWS = [
    ("Parameters", "parameters", 1, "{:,.0f}"),
    ("Gradient all-reduced per step (MB)", "gradient_mb", 1, "{:.1f}"),
    ("Training FLOPs per rank and step (GFLOP, 1 rank)", "gflops_per_step", 1, "{:.1f}"),
    ("Compute per step on one rank, mean (ms)", "compute_1_s", 1e3, "{:.0f}"),
    ("Speedup at {largest} ranks", "speedup", 1, "{:.2f}"),
    ("lowest, over repeats", "speedup_low", 1, "{:.2f}"),
    ("highest, over repeats", "speedup_high", 1, "{:.2f}"),
    ("All-reduce in flight per step at {largest} ranks, mean (ms)", "comm_s", 1e3, "{:.1f}"),
    ("$R_N = (T_c/N)/T_\\text{comm}$ at {largest} ranks", "ratio", 1, "{:.2f}"),
]


def model_markdown(study: dict[str, Experiment]) -> str:
    table = model_size_table(study)
    largest = ", ".join(map(str, sorted({int(n) for n in table["largest"]})))  # the same for every preset
    rows = [(label.replace("{largest}", largest), *rest) for label, *rest in MODEL_ROWS]
    return quantities_by_column(table, rows, list(table.index))


def model_findings(study: dict[str, Experiment]) -> dict:
    """The larger preset against the smaller: what the FLOPs and bytes let the theory expect of R_N, and what was
    measured, each through the one verdict function."""
    table = model_size_table(study)
    small, large = table.index[0], table.index[-1]
    a, b = table.loc[small], table.loc[large]
    n = int(a["largest"])
    c = compare_speedups(study[large], study[small], n)
    ratio = compare_times(study[large], study[small], n, n, "compute_to_comm_ratio")
    speedups = (f"at {n} ranks the {large} model's speedup is {_speedup(study[large], n)} and the {small} model's "
                f"{_speedup(study[small], n)}; {large} over {small} is {c.value()}")
    if not c.decided:
        verdict = f"{speedups}: {c.why_undecided()}"
    else:
        verdict = (f"{speedups}: the {large if c.verdict == 'higher' else small} model scales better (beyond the "
                   f"noise floor of {c.floor:.1%})")
    flops, grad = b["gflops_per_step"] / a["gflops_per_step"], b["gradient_mb"] / a["gradient_mb"]
    return {"model_small": small, "model_large": large, "model_largest_ranks": n,
            "model_flops_ratio": float(flops), "model_bytes_ratio": float(grad),
            "model_expected_ratio_growth": float(flops / grad),
            "model_ratio_small": float(a["ratio"]), "model_ratio_large": float(b["ratio"]),
            "model_ratio_sentence": f"{large} over {small} is {ratio.value()}: " + (
                ratio.judged("lower", "higher")) + ".",
            "model_growth_sentence": _growth_sentence(study, table, small, large, flops, grad),
            "model_verdict": verdict}


def _growth_sentence(study: dict[str, Experiment], table: pd.DataFrame, small: str, large: str, flops: float,
                     grad: float) -> str:
    """How the 1-rank compute grew against the FLOPs, and the all-reduce in training against the bytes (through
    the one verdict function: each repeat's growth against the bytes' growth)."""
    a, b = study[small], study[large]
    n = max(set(a.runs) & set(b.runs))
    compute = table.loc[large, "compute_1_s"] / table.loc[small, "compute_1_s"]
    rate_small, rate_large = (table.loc[p, "gflops_per_step"] / table.loc[p, "compute_1_s"] for p in (small, large))
    comm_a, comm_b = paired_sides(a, "comm_total_per_step_s"), paired_sides(b, "comm_total_per_step_s")
    growth = compare(comm_b[n], [grad * value for value in comm_a[n]], noise_floor([*comm_a.values(), *comm_b.values()]))
    return (f"The 1-rank compute grew {compute:.1f} times for {flops:.1f} times the FLOPs: the {large} model's "
            f"matrices ran at a {'higher' if rate_large > rate_small else 'lower'} rate on this CPU "
            f"({rate_large:.0f} against {rate_small:.0f} GFLOP/s). The all-reduce in training grew "
            f"{growth.ratio * grad:.1f} times (the median over the repeats' pairs) for {grad:.1f} times the bytes; "
            f"its growth over the bytes' is "
            f"{growth.value()}: " + growth.judged("it grew less than the bytes", "it grew more than the bytes") + ".")


def model_figure(study: dict[str, Experiment]):
    return speedups_figure({f"{preset} model": e for preset, e in study.items()}, "Speedup by model size")
