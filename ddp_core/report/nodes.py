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
from ddp_core.report.comparisons import chance_glue, compare_times, run_times, speedup_comparisons, time_floor
from ddp_core.report.cost_model import predict
from ddp_core.report.nvlink_forecast import FORECAST_GPUS, forecast
from ddp_core.report.results import (STOLEN, Experiment, joined, link_label, load_experiment, machine_use,
                                     measured_gbit_s, rate_text)
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
        "link_rates": _links_phrase([link_label(e) for e in links.values()]),
        "links_measured": "; ".join(f"{link_label(e)}: {rate_text(measured_gbit_s(e))} measured"
                                    for e in links.values()),
        "worst_prediction_error": worst["prediction_error"], "worst_prediction_nodes": int(worst["world_size"]),
        "worst_prediction_link": worst["link"], "predictions_inside": len(inside), "predictions": len(table),
        "link_world_sizes": [int(n) for n in sorted(table["world_size"].unique())],
    }


def nodes_figure(study: dict[str, Experiment]):
    """The speedup over one node against the number of nodes, per link, beside the ideal N and the cost model's
    prediction; and a step's compute and exposed all-reduce against the nodes, beside the one node's compute / N."""
    table = link_table(study)
    one = scaling_table(study[BASELINE]).loc[1]
    nodes = [1, *sorted(table["world_size"].unique())]
    fig, (speed, parts) = plt.subplots(1, 2, figsize=(10, 5.2))
    speed.plot(nodes, nodes, ":", color="gray", label="ideal: N")
    parts.plot(nodes, [one["compute_per_step_s"] * 1e3 / n for n in nodes], ":", color="gray",
               label="one node's compute / N")
    for i, (link, rows) in enumerate(table.groupby("link", sort=False)):
        error = [[0, *(rows["speedup"] - rows["speedup_low"])], [0, *(rows["speedup_high"] - rows["speedup"])]]
        speed.errorbar([1, *rows["world_size"]], [1, *rows["speedup"]], yerr=error, fmt="o-", capsize=3,
                       color=f"C{i}", label=f"{link}, measured (bar: range)")
        speed.plot(rows["world_size"], rows["predicted_speedup"], "s--", color=f"C{i}", alpha=0.6,
                   label=f"{link}, predicted")
        parts.plot(rows["world_size"], rows["compute_per_step_s"] * 1e3, "^-", color=f"C{i}", alpha=0.6,
                   markersize=8 - 2 * i, label=f"compute, {link}")
        parts.plot(rows["world_size"], rows["comm_exposed_per_step_s"] * 1e3, "o--", color=f"C{i}",
                   label=f"exposed all-reduce, {link}")
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
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    parts.set_yticks(ticks, [str(t) for t in ticks])
    fig.tight_layout()
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


# The real configuration the nodes study models: the prediction chapter's forecast for this preset on
# nvlink_forecast.FORECAST_GPUS A100s over NVLink, at this model FLOP utilisation.
SCALE_MODEL_PRESET, SCALE_MODEL_MFU = "large", 0.4


def scale_model_findings(study: dict[str, Experiment]) -> dict:
    """The emulated link whose N nodes have the compute-to-communication ratio R_N closest to the one the prediction
    chapter forecasts for SCALE_MODEL_PRESET on N A100s over NVLink (the same workload: sequence, vocabulary, global
    batch), and the efficiency measured there against the forecast's bounds: every bucket exposed, or only the
    last. "within", "below" or "above" says where the measured median falls. Both ratios are taken alike, a rank's
    compute T_c/N over the all-reduce of the gradient's buckets as a benchmark times it (NCCL's published curve
    there, `ddp_core.bench.allreduce` over the emulated links here), not the all-reduce time inside the runs. N is
    the forecast's number of GPUs, or the study's most nodes where it has no run at that many."""
    links = link_table(study)
    n = FORECAST_GPUS if FORECAST_GPUS in set(links["world_size"]) else int(links["world_size"].max())
    table = links.query("world_size == @n")
    one = study[BASELINE].baseline
    ahead = forecast(one.model, one.global_batch_size, n).loc[SCALE_MODEL_PRESET]
    compute_ms = ahead["compute_bound_ms"] / SCALE_MODEL_MFU
    target = compute_ms / n / ahead["comm_ms"]
    bounds = [compute_ms / (compute_ms / n + exposed) / n for exposed in (ahead["comm_ms"], ahead["last_bucket_ms"])]
    ratios = table["predicted_compute_s"] / table["predicted_comm_s"]
    closest = table.loc[np.log(ratios / target).abs().idxmin()]
    measured = closest["efficiency"]
    return {"scale_gpus": n, "scale_preset": SCALE_MODEL_PRESET, "scale_mfu": SCALE_MODEL_MFU,
            "scale_target_ratio": target, "scale_link": closest["link"], "scale_ratio": ratios[closest.name],
            "scale_efficiency": measured,
            "scale_efficiency_range": f"{closest['speedup_low'] / n:.0%} to {closest['speedup_high'] / n:.0%}",
            "scale_forecast_low": bounds[0], "scale_forecast_high": bounds[1],
            "scale_place": "within" if bounds[0] <= measured <= bounds[1] else "below" if measured < bounds[0]
            else "above"}


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


def _links_phrase(labels: list[str]) -> str:
    """'an unshaped link and links capped at 1 Gbit/s and 100 Mbit/s', for any mix of links."""
    shaped = [label for label in labels if label != "unshaped"]
    capped = (f"links capped at {', '.join(shaped[:-1])} and {shaped[-1]}" if len(shaped) > 1
              else f"a link capped at {shaped[0]}" if shaped else "")
    unshaped = "an unshaped link" if "unshaped" in labels else ""
    return " and ".join(part for part in (unshaped, capped) if part)


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
