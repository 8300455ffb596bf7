"""Strong scaling over emulated nodes (`ddp_core.launch.emulated`), the nodes page and the report's headline: a
node's own CPU share and network stack, the link's bandwidth the variable. Reads the study's `Experiment`s
(`load_study`); offers `*_findings` for the pages' glue, `*_table`s (DataFrames), their `*_markdown` and
`*_figure`s.

Speedups are taken against the study's one-node runs (`one_node`), which ran in the same rounds as every link's;
the prediction is the prediction chapter's cost model fed the all-reduce benchmark measured over the same links.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ddp_core.launch.cpu_share import PERIOD_US
from ddp_core.launch.emulated import rate_bits_per_s
from ddp_core.studies.wind_tunnel import TOLERANCE
from ddp_core.report.comparisons import chance_glue, compare_times, run_times, speedup_comparisons, time_floor
from ddp_core.report.cost_model import predict
from ddp_core.report.results import (STOLEN, Experiment, joined, link_label, load_experiment, machine_use,
                                     measured_gbit_s, rate_text, wind_tunnel_record)
from ddp_core.report.scaling import scaling_table
from ddp_core.report.tables import commit_text, counted, one_row_each, quantities_by_column

BASELINE = "one_node"


# Link bandwidth ----------------------------------------------------------------------------------------------

def link_experiments(study: dict[str, Experiment]) -> dict[str, Experiment]:
    """Each link's runs with the one-node runs beside them, fastest link first."""
    links = {variant: joined(study[BASELINE], e) for variant, e in study.items() if variant != BASELINE}
    return dict(sorted(links.items(), key=lambda item: -measured_gbit_s(item[1])))


def link_table(study: dict[str, Experiment]) -> pd.DataFrame:
    """One row per (link, world size): the link set and measured, the speedup with its range over the repeats, the
    communication per step (means over the steady epochs), and the cost model's speedup from the all-reduce
    measured over the same links."""
    rows = []
    for variant, e in link_experiments(study).items():
        table, prediction = scaling_table(e), predict(e)
        for n in [n for n in table.index if n > 1]:
            row = table.loc[n]
            rows.append(dict(
                link=link_label(e), measured_gbit_s=measured_gbit_s(e), world_size=n, speedup=row["speedup"],
                speedup_low=row["speedup_low"], speedup_high=row["speedup_high"], efficiency=row["efficiency"],
                step_time_s=row["step_time_s"], mean_step_s=row["mean_step_s"],
                comm_total_per_step_s=row["comm_total_per_step_s"],
                comm_exposed_per_step_s=row["comm_exposed_per_step_s"],
                predicted_comm_s=prediction.loc[n, "predicted_comm_s"] if n in prediction.index else np.nan,
                predicted_compute_s=prediction.loc[n, "predicted_compute_s"] if n in prediction.index else np.nan,
                compute_per_step_s=row["compute_per_step_s"],
                compute_to_comm_ratio=row["compute_to_comm_ratio"],
                break_even_ratio=row["comm_exposed_per_step_s"] / row["comm_total_per_step_s"] / (n - 1),
                predicted_speedup=prediction.loc[n, "predicted_speedup"] if n in prediction.index else np.nan,
                prediction_error=prediction.loc[n, "error"] if n in prediction.index else np.nan))
    return pd.DataFrame(rows)


LINK_ROWS = [
    ("Link measured before the runs, median (Mbit/s)", "measured_gbit_s", 1e3, "{:,.0f}"),
    ("Step time, median of the repeats' medians (ms)", "step_time_s", 1e3, "{:.0f}"),
    ("Speedup over one node, median of the repeats' paired ratios", "speedup", 1, "{:.2f}"),
    ("lowest, over repeats", "speedup_low", 1, "{:.2f}"),
    ("highest, over repeats", "speedup_high", 1, "{:.2f}"),
    ("Step time, mean over the steady epochs (ms)", "mean_step_s", 1e3, "{:.0f}"),
    ("of which compute (ms)", "compute_per_step_s", 1e3, "{:.0f}"),
    ("of which exposed all-reduce (ms)", "comm_exposed_per_step_s", 1e3, "{:.0f}"),
    ("All-reduce in flight per step, mean (ms)", "comm_total_per_step_s", 1e3, "{:.0f}"),
    ("Compute per step, predicted (ms)", "predicted_compute_s", 1e3, "{:.0f}"),
    ("All-reduce per step, predicted from the benchmark (ms)", "predicted_comm_s", 1e3, "{:.0f}"),
    ("Speedup, predicted", "predicted_speedup", 1, "{:.2f}"),
    ("Error of the predicted speedup (%)", "prediction_error", 100, "{:+.0f}"),
    ("$R_N = (T_c/N)/T_\\text{comm}$", "compute_to_comm_ratio", 1, "{:.2f}"),
    ("Break-even $R_N = f/(N-1)$", "break_even_ratio", 1, "{:.2f}"),
]


def link_markdown(study: dict[str, Experiment], world_size: int) -> str:
    """The table at one world size, a column per link."""
    table = link_table(study).query("world_size == @world_size")
    return quantities_by_column(table, LINK_ROWS, list(table["link"]))


def link_figure(study: dict[str, Experiment]):
    """Speedup against the measured link rate per world size, each point with its range over the repeats and the
    prediction beside it; and the communication a step waited for."""
    table = link_table(study)
    fig, (speed, exposed) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, (n, rows) in enumerate(table.groupby("world_size")):
        x = rows["measured_gbit_s"]
        error = [rows["speedup"] - rows["speedup_low"], rows["speedup_high"] - rows["speedup"]]
        speed.errorbar(x, rows["speedup"], yerr=error, fmt="o-", capsize=4, color=f"C{i}",
                       label=f"{n} nodes, measured (bar: range)")
        speed.plot(x, rows["predicted_speedup"], "s--", color=f"C{i}", alpha=0.6, label=f"{n} nodes, predicted")
        exposed.plot(x, rows["comm_exposed_per_step_s"] * 1e3, "o-", color=f"C{i}", label=f"{n} nodes")
    speed.axhline(1, color="gray", linewidth=1)
    speed.set(xscale="log", xlabel="link rate, measured (Gbit/s)", ylabel="speedup over one node",
              title="Speedup against the link")
    exposed.set(xscale="log", yscale="log", xlabel="link rate, measured (Gbit/s)", ylabel="ms per step (mean)",
                title="Exposed communication per step")
    speed.legend(fontsize=7)
    exposed.legend(fontsize=7)
    fig.tight_layout()
    return fig


def link_findings(study: dict[str, Experiment]) -> dict:
    table = link_table(study)
    links = link_experiments(study)
    error = table["prediction_error"].abs()
    inside = table[(table["speedup_low"] <= table["predicted_speedup"])
                   & (table["predicted_speedup"] <= table["speedup_high"])]
    worst = table.loc[error.idxmax()]
    return {
        "links_measured": "; ".join(f"{link_label(e)}: {rate_text(measured_gbit_s(e))} measured"
                                    for e in links.values()),
        "worst_prediction_error": worst["prediction_error"], "worst_prediction_nodes": int(worst["world_size"]),
        "worst_prediction_link": worst["link"], "predictions_inside": len(inside), "predictions": len(table),
        "link_world_sizes": [int(n) for n in sorted(table["world_size"].unique())],
    }


def nodes_figure(study: dict[str, Experiment]):
    """The speedup over one node against the number of nodes, per link (a colour each), beside the ideal N and the
    cost model's prediction; and a step's compute and exposed all-reduce against the nodes, beside the one node's
    compute / N. One legend below both panels: the links by colour, then what each line style shows."""
    from matplotlib.lines import Line2D

    table = link_table(study)
    one = scaling_table(study[BASELINE]).loc[1]
    nodes = [1, *sorted(table["world_size"].unique())]
    fig, (speed, parts) = plt.subplots(1, 2, figsize=(10, 5.4))
    speed.plot(nodes, nodes, ":", color="gray")
    parts.plot(nodes, [one["compute_per_step_s"] * 1e3 / n for n in nodes], ":", color="gray")
    colours = []
    for i, (link, rows) in enumerate(table.groupby("link", sort=False)):
        error = [[0, *(rows["speedup"] - rows["speedup_low"])], [0, *(rows["speedup_high"] - rows["speedup"])]]
        speed.errorbar([1, *rows["world_size"]], [1, *rows["speedup"]], yerr=error, fmt="o-", capsize=3,
                       color=f"C{i}")
        speed.plot(rows["world_size"], rows["predicted_speedup"], "s--", color=f"C{i}", alpha=0.6)
        parts.plot(rows["world_size"], rows["compute_per_step_s"] * 1e3, "^-", color=f"C{i}", alpha=0.6,
                   markersize=8 - 2 * i)
        parts.plot(rows["world_size"], rows["comm_exposed_per_step_s"] * 1e3, "o--", color=f"C{i}")
        colours.append(Line2D([], [], color=f"C{i}", linewidth=6, label=link))
    styles = [Line2D([], [], color="black", marker="o", label="speedup measured (bar: range of the repeats)"),
              Line2D([], [], color="black", marker="s", linestyle="--", alpha=0.6, label="speedup predicted"),
              Line2D([], [], color="gray", linestyle=":", label="ideal: N; one node's compute / N"),
              Line2D([], [], color="black", marker="^", alpha=0.6, label="compute per step"),
              Line2D([], [], color="black", marker="o", linestyle="--", label="exposed all-reduce per step")]
    speed.set(xscale="log", yscale="log", xlabel="nodes", ylabel="speedup over one node",
              title="Speedup against nodes")
    speed.set_yticks(nodes, [str(n) for n in nodes])
    parts.set(xscale="log", yscale="log", xlabel="nodes", ylabel="ms per step (mean, steady epochs)",
              title="Compute and exposed all-reduce per step")
    low, high = parts.get_ylim()
    ticks = [t for t in (20, 50, 100, 200, 500, 1000, 2000, 5000) if low <= t <= high]
    for ax in (speed, parts):
        ax.set_xticks(nodes, [str(n) for n in nodes])
        ax.minorticks_off()
    parts.set_yticks(ticks, [str(t) for t in ticks])
    fig.legend(handles=colours, title="links set for", loc="lower left", bbox_to_anchor=(0.06, 0), fontsize=8,
               title_fontsize=8, frameon=False)
    fig.legend(handles=styles, loc="lower left", bbox_to_anchor=(0.5, 0), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.2, 1, 1))
    return fig


def nodes_findings(study: dict[str, Experiment]) -> dict:
    """The numbers of the headline: each node's share, the speedup and efficiency of the fastest and the slowest
    link at the most nodes, with their ranges and the verdict word, a step's compute against one node's / N and
    its exposed all-reduce; and at how many of the (link, nodes) points the
    theory's break-even called the speedup's side of 1 right (a speedup above 1 where R_N > f/(N-1))."""
    table = link_table(study)
    links = link_experiments(study)
    most = int(table["world_size"].max())
    one = study[BASELINE].baseline
    network = one.raw["network"]
    nodes = [1, *sorted(table["world_size"].unique())]
    found = {"cpus_per_node": network["cpus_per_node"], "cpu_period_ms": network["cpu_period_ms"], "most_nodes": most,
             "node_counts": f"{', '.join(map(str, nodes[:-1]))} and {nodes[-1]}", "global_batch": one.global_batch_size,
             "train_samples": one.config["train_samples"], "epochs": one.config["epochs"],
             "share_got": SHARE_GOT, "stolen_limit": STOLEN, "runs_each": counted(len(study[BASELINE].all_runs), "run"),
             "ideal_cores": network["cpus_per_node"] * most, "cores": one.cpu_count,
             "spare_cores": one.cpu_count - network["cpus_per_node"] * most,
             **chance_glue("one_node", study[BASELINE], 1),
             "prediction_errors": ("all positive" if (table["prediction_error"] > 0).all() else "all negative"
                                   if (table["prediction_error"] < 0).all() else "of both signs")}
    for end, experiment in (("fastest", next(iter(links.values()))), ("slowest", list(links.values())[-1])):
        row = table.set_index(["link", "world_size"]).loc[(link_label(experiment), most)]
        found |= {f"{end}_link": link_label(experiment), f"{end}_speedup": row["speedup"],
                  f"{end}_speedup_range": f"{row['speedup_low']:.2f} to {row['speedup_high']:.2f}",
                  f"{end}_efficiency": row["efficiency"],
                  f"{end}_compute_inflation": row["compute_per_step_s"] / row["predicted_compute_s"],
                  f"{end}_exposed_ms": row["comm_exposed_per_step_s"] * 1e3, f"{end}_step_ms": row["mean_step_s"] * 1e3,
                  f"{end}_comm_ms": row["comm_total_per_step_s"] * 1e3,
                  f"{end}_benchmark_ms": row["predicted_comm_s"] * 1e3,
                  f"{end}_verdict": speedup_comparisons(experiment)[most].says("slower", "faster")}
    inflation = sorted([found["fastest_compute_inflation"], found["slowest_compute_inflation"]])
    found["compute_inflation_range"] = f"{inflation[0]:.2f} to {inflation[1]:.2f}"
    theory_says_faster = table["compute_to_comm_ratio"] > table["break_even_ratio"]
    return found | {"points": len(table), "faster_points": int((table["speedup"] > 1).sum()),
                    "break_even_held": int(((table["speedup"] > 1) == theory_says_faster).sum())}


def headline_findings(study: dict[str, Experiment]) -> dict:
    """`nodes_findings` named `nodes_<name>`, as the pages that quote the headline beside their own findings glue
    them."""
    return {f"nodes_{key}": value for key, value in nodes_findings(study).items()}


def doubling_table(study: dict[str, Experiment]) -> pd.DataFrame:
    """Per link and each doubling of the nodes (N/2 to N): the time per sample at N over that at N/2, repeat by
    repeat, with its range and the verdict."""
    rows = []
    for link, experiment in link_experiments(study).items():
        sizes = sorted(experiment.runs)
        floor = time_floor(experiment)
        for half, n in zip(sizes, sizes[1:]):
            c = compare_times(experiment, experiment, n, half, floor=floor)
            rows.append(dict(link=link_label(experiment), doubling=f"{half} to {n}", ratio=c.ratio, low=c.low,
                             high=c.high, verdict=c.says("faster", "slower")))
    return pd.DataFrame(rows)


def doubling_markdown(study: dict[str, Experiment]) -> str:
    return one_row_each(doubling_table(study), {
        "link": ("Link", "{}"), "doubling": ("Nodes", "{}"),
        "ratio": ("Time per sample, after / before (median)", "{:.2f}"), "low": ("lowest", "{:.2f}"),
        "high": ("highest", "{:.2f}"), "verdict": ("Verdict", "{}")})


def similarity_table(study: dict[str, Experiment]) -> pd.DataFrame:
    """Per variant and number of nodes: the configuration its links model (else their rate), R_N^bench as that
    configuration has it (its target, from published figures or the measured GPU) and as the wind tunnel reached it
    on this machine before the runs (the benchmark at the rate it set; both empty for links set by a rate), the link's
    rate, and the speedup and efficiency the runs measured, with their ranges and the verdict."""
    record = wind_tunnel_record(study[BASELINE].folder.parent)
    links = link_table(study)
    rows = []
    for variant, experiment in link_experiments(study).items():
        verdicts = speedup_comparisons(experiment)
        rate = experiment.all_runs[-1].raw["network"]["link_rate_gbit_s"]
        for row in links[links["link"] == link_label(experiment)].itertuples():
            entry = record.get(variant, {}).get("by_nodes", {}).get(str(row.world_size), {})
            n = row.world_size
            rows.append(dict(configuration=row.link, nodes=n, target_ratio=entry.get("target_ratio", np.nan),
                             achieved_ratio=entry.get("achieved_ratio", np.nan),
                             link_mbit_s=rate_bits_per_s(entry["link_rate"]) / 1e6 if entry
                             else rate * 1e3 if rate else np.nan,
                             speedup=row.speedup, efficiency=row.efficiency, efficiency_low=row.speedup_low / n,
                             efficiency_high=row.speedup_high / n, verdict=verdicts[n].says("slower", "faster")))
    return pd.DataFrame(rows)


def similarity_markdown(study: dict[str, Experiment]) -> str:
    table = similarity_table(study)
    table["efficiency_range"] = [f"{low:.0%} to {high:.0%}" for low, high in zip(table["efficiency_low"],
                                                                                   table["efficiency_high"])]
    return one_row_each(table, {
        "configuration": ("Links set for", "{}"), "nodes": ("Nodes", "{}"),
        "target_ratio": ("$R_N^\\text{bench}$ of the configuration", "{:.2f}"),
        "achieved_ratio": ("$R_N^\\text{bench}$ reached", "{:.2f}"),
        "link_mbit_s": ("Link rate set (Mbit/s)", "{:,.0f}"), "efficiency": ("Efficiency (median)", "{:.0%}"),
        "efficiency_range": ("lowest to highest", "{}"), "verdict": ("Verdict", "{}")}, index_name=None)


def similarity_findings(study: dict[str, Experiment]) -> dict:
    """One node's compute per step on this machine, the CPU, the tolerance the wind tunnel held every target to and
    where the configurations' ratios come from ("none" where no variant models one)."""
    record = wind_tunnel_record(study[BASELINE].folder.parent)
    one = study[BASELINE].baseline
    return {"tunnel_compute_ms": scaling_table(study[BASELINE]).loc[1, "compute_per_step_s"] * 1e3,
            "tunnel_cpu": one.raw["device_name"],
            "tunnel_cpu_extensions": ", ".join(one.raw.get("cpu_extensions") or ["none recorded"]),
            "tunnel_tolerance": TOLERANCE,
            "tunnel_sources": "; ".join(f"{modelled['configuration']}: {modelled['source']}"
                                        for modelled in record.values()) or "none"}


def fidelity_table(study: dict[str, Experiment]) -> pd.DataFrame:
    """Per run on nodes with a CPU share: how far its nodes got the share they were set, and what else the machine
    did. `used_share` is a node's CPU over the periods it ran in, against its share: 1 for a node that computed all
    the time, less where it waited for the network inside a period. `throttled` is the share of those periods in
    which the kernel stopped it at its quota. `other_cores` and `stolen` come from run.json: the CPU of every other
    process on the machine (the launcher, the kernel's network work) and the time the hypervisor took."""
    rows = []
    for variant in [BASELINE, *link_experiments(study)]:  # the one node first, then the links, fastest first
        experiment = study[variant]
        for run in experiment.all_runs:
            network, use = run.raw["network"], machine_use(run.raw)
            nodes = network.get("node_cpu")
            if not nodes:
                continue
            period_s = network["cpu_period_ms"] / 1e3
            used = [node["cpu_s"] / (node["periods"] * period_s) / network["cpus_per_node"] for node in nodes]
            rows.append(dict(
                link=link_label(experiment) if variant != BASELINE else "none", nodes=network["nodes"],
                run=f"{variant}/{run.name}",
                used_share_low=min(used), used_share=float(np.median(used)),
                throttled=float(np.median([node["throttled_periods"] / node["periods"] for node in nodes])),
                other_cores=use["other_cores"] if use else np.nan, stolen=use["stolen"] if use else np.nan))
    table = pd.DataFrame(rows)
    table["disturbed"] = ((table["nodes"] == 1) & (table["used_share_low"] < SHARE_GOT)) | (table["stolen"] > STOLEN)
    return table


SHARE_GOT = 0.95  # a node that computes all the time (one node alone) uses at least this much of its share


def disturbed_runs(study: dict[str, Experiment]) -> str:
    """The runs `fidelity_table` calls disturbed, by folder, or "none"."""
    table = fidelity_table(study)
    return ", ".join(f"`{name}`" for name in table.loc[table["disturbed"], "run"]) or "none"


def fidelity_markdown(study: dict[str, Experiment]) -> str:
    summary = fidelity_table(study).groupby(["link", "nodes"], sort=False).agg(
        used_share_low=("used_share_low", "min"), used_share=("used_share", "median"),
        throttled=("throttled", "median"), other_cores=("other_cores", "median"), stolen=("stolen", "max"),
        disturbed=("disturbed", "sum")).reset_index()
    percent = ["used_share_low", "used_share", "throttled", "stolen"]
    summary[percent] *= 100
    return one_row_each(summary, {
        "link": ("Link", "{}"), "nodes": ("Nodes", "{}"),
        "used_share": ("Quota used (%)", "{:.0f}"), "used_share_low": ("lowest (%)", "{:.0f}"),
        "throttled": ("Throttled (%)", "{:.0f}"), "other_cores": ("Others (cores)", "{:.2f}"),
        "stolen": ("Stolen (%)", "{:.1f}"), "disturbed": ("Disturbed", "{}")}, index_name=None)


# The quota's period -------------------------------------------------------------------------------------------

STUDY_PERIOD_MS = PERIOD_US // 1000  # the period every emulated node's quota runs at


def load_periods(folder: Path) -> dict[int, Experiment]:
    """The runs of `benchmarks/cpu_period.py` (`folder`/period-<P>ms: the study's 4 unshaped nodes, round by round),
    by period in ms."""
    return {int(path.name.removeprefix("period-").removesuffix("ms")): load_experiment(path)
            for path in folder.glob("period-*ms")}


def period_table(periods: dict[int, Experiment]) -> pd.DataFrame:
    """Per period (`load_periods`), the median of its repeats' median steps, and its step against the study's
    period's, repeat by repeat, through the one verdict function (the floor from every period's repeats)."""
    floor = time_floor(*periods.values())
    rows = []
    for period, e in sorted(periods.items()):
        c = compare_times(e, periods[STUDY_PERIOD_MS], e.largest, e.largest, floor=floor)
        rows.append(dict(period_ms=period, median_step_ms=run_times(e)["step_time_s"].median() * 1e3,
                         ratio_to_study=c.ratio, low=c.low, high=c.high, value=c.value(),
                         verdict=c.judged("faster", "slower")))
    return pd.DataFrame(rows)


def period_findings(folder: Path) -> dict:
    """`period_table` for the page: each other period's step against the study's, '100 ms: 0.93 (0.79 to 0.94
    over 3 repeats) times as long, within the noise ...'."""
    periods = load_periods(folder)
    table = period_table(periods).query("period_ms != @STUDY_PERIOD_MS")
    runs = [e.baseline for e in periods.values()]
    return {"study_period_ms": STUDY_PERIOD_MS,
            "period_commits": ", ".join(sorted({commit_text(run.raw.get("git_commit")) for run in runs})),
            "period_dates": ", ".join(sorted({run.raw["start_time"][:10] for run in runs})),
            "period_comparisons": "; ".join(f"at {row.period_ms} ms, {row.value} times as long: {row.verdict}"
                                            for row in table.itertuples())}
