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
from ddp_core.engine.model_cost import bucket_ready_shares, bucket_sizes
from ddp_core.engine.run_files import READY
from ddp_core.launch.emulated import rate_bits_per_s
from ddp_core.studies.wind_tunnel import TOLERANCE
from ddp_core.report.comparisons import (POWER_DRAWS, chance_glue, compare_speedups, compare_times, paired_sides,
                                        run_times, speedup_comparisons, steady_phases, time_floor)
from ddp_core.report.verdict import error_rates
from ddp_core.report.cost_model import predict
from ddp_core.report.results import (EMULATED_OTHER_CORES, STOLEN, Experiment, disturbed, joined, link_label,
                                     load_experiment, machine_use,
                                     measured_gbit_s, rate_text, read_wind_tunnel, wind_tunnel_record)
from ddp_core.report.scaling import scaling_table
from ddp_core.report.similarity import CONFIGURATIONS, large_model
from ddp_core.report.tables import commit_text, counted, day, one_row_each, quantities_by_column

BASELINE = "one_node"


# Link bandwidth ----------------------------------------------------------------------------------------------

def node_share(experiment: Experiment) -> float:
    """The CPU share of the nodes an experiment's runs trained on, in cores."""
    return experiment.baseline.raw["network"]["cpus_per_node"]


def link_experiments(study: dict[str, Experiment]) -> dict[str, Experiment]:
    """Each link's runs on nodes of the one node's share, with the one-node runs beside them, fastest link first
    (the variants at another share are the similarity test's)."""
    share = node_share(study[BASELINE])
    links = {variant: joined(study[BASELINE], e) for variant, e in study.items()
             if e.largest > 1 and node_share(e) == share}
    return dict(sorted(links.items(), key=lambda item: -measured_gbit_s(item[1])))


def variant_experiments(study: dict[str, Experiment]) -> dict[str, Experiment]:
    """Every variant of several nodes, with the one-node runs of its nodes' share beside it: the link experiments,
    then those of the similarity test."""
    ones = {node_share(e): e for e in study.values() if e.largest == 1}
    others = {variant: joined(ones[node_share(e)], e) for variant, e in study.items()
              if e.largest > 1 and variant not in link_experiments(study)}
    return link_experiments(study) | others


def variant_label(experiment: Experiment, study: dict[str, Experiment]) -> str:
    """What its links are set for, and the nodes' share where it is not the one node's."""
    share = node_share(experiment)
    return link_label(experiment) + ("" if share == node_share(study[BASELINE]) else f", nodes of {share:g} core")


def similarity_test_table(study: dict[str, Experiment]) -> pd.DataFrame:
    """The similarity test: per variant on nodes of another share than the one node's, against the variant that
    models the same configuration at the one node's share, each over its own one node: both shares, the speedups
    (medians of the repeats), their ratio repeat by repeat with its range and the verdict of the one rule (held
    against the floor of the two sides' runs together), and how often that rule finds a true difference of
    SIMILARITY_EFFECT with runs this noisy (`verdict.error_rates` on their repeats)."""
    record = wind_tunnel_record(study[BASELINE].folder.parent)
    share = node_share(study[BASELINE])
    ones = {node_share(e): e for e in study.values() if e.largest == 1}
    twins = {record[v]["models"]: v for v, e in study.items() if v in record and node_share(e) == share}
    rows = []
    for variant, experiment in study.items():
        other = node_share(experiment)
        if variant not in record or other == share:
            continue
        twin = joined(study[BASELINE], study[twins[record[variant]["models"]]])
        tested = joined(ones[other], experiment)
        for n in sorted(n for n in experiment.repeats if n > 1 and n in twin.repeats):
            c = compare_speedups(tested, twin, n)
            repeats = [sides[m] for sides in (paired_sides(tested), paired_sides(twin)) for m in (1, n)]
            rows.append(dict(configuration=record[variant]["configuration"], nodes=n, share=share, other_share=other,
                             speedup=speedup_comparisons(twin)[n].ratio, other_speedup=speedup_comparisons(tested)[n].ratio,
                             ratio=c.ratio, low=c.low, high=c.high, floor=c.floor,
                             verdict=c.says("scales worse", "scales better"),
                             finds_effect=error_rates(repeats, [SIMILARITY_EFFECT], draws=POWER_DRAWS)[SIMILARITY_EFFECT]))
    return pd.DataFrame(rows, columns=["configuration", "nodes", "share", "other_share", "speedup", "other_speedup",
                                       "ratio", "low", "high", "floor", "verdict", "finds_effect"])


SIMILARITY_EFFECT = 0.1  # the bar: speedups on CPUs twice apart within 10 % of each other


def similarity_test_findings(study: dict[str, Experiment]) -> dict:
    """The similarity test's first comparison for the key findings: what it modelled, the shares and nodes, the
    ratio of the speedups with its range, the verdict and the chance to detect SIMILARITY_EFFECT; "not run" and
    empty numbers where the study has no variant on nodes of another share."""
    table = similarity_test_table(study)
    if table.empty:
        return {"similarity_verdict": "not run", "similarity_value": "none", "similarity_configuration": "none",
                "similarity_share": "none", "similarity_other_share": "none", "similarity_power": np.nan,
                "similarity_effect": SIMILARITY_EFFECT}
    row = table.iloc[0]
    return {"similarity_configuration": row["configuration"], "similarity_nodes": int(row["nodes"]),
            "similarity_share": f"{row['share']:g}", "similarity_other_share": f"{row['other_share']:g}",
            "similarity_value": f"{row['ratio']:.2f} ({row['low']:.2f} to {row['high']:.2f})",
            "similarity_verdict": row["verdict"], "similarity_power": row["finds_effect"],
            "similarity_effect": SIMILARITY_EFFECT}


def similarity_test_markdown(study: dict[str, Experiment]) -> str:
    table = similarity_test_table(study)
    table["shares"] = [f"{a:g} and {b:g}" for a, b in zip(table["share"], table["other_share"])]
    table["speedups"] = [f"{a:.2f} and {b:.2f}" for a, b in zip(table["speedup"], table["other_speedup"])]
    table["ratio_range"] = [f"{r:.2f} ({low:.2f} to {high:.2f})" for r, low, high in zip(table["ratio"], table["low"],
                                                                                        table["high"])]
    return one_row_each(table, {
        "configuration": ("Links set for", "{}"), "nodes": ("Nodes", "{}"), "shares": ("Shares of a core", "{}"),
        "speedups": ("Speedups (medians)", "{}"), "ratio_range": ("Second over first, median of the repeats' paired ratios (range)", "{}"),
        "verdict": ("Verdict", "{}"), "floor": ("Noise floor", "{:.0%}"),
        "finds_effect": (f"Chance to detect a {SIMILARITY_EFFECT:.0%} difference", "{:.0%}")}, index_name=None)


def link_table(study: dict[str, Experiment]) -> pd.DataFrame:
    """One row per (link, world size): the link set and measured, the speedup with its range over the repeats, the
    communication per step (means over the steady epochs), and the cost model's speedup from the all-reduce
    measured over the same links; where the wind tunnel set the links, the speedup it forecast before the runs (the
    one node's step replayed, `ddp_core.report.replay`)."""
    record = wind_tunnel_record(study[BASELINE].folder.parent)
    rows = []
    for variant, e in link_experiments(study).items():
        table, prediction = scaling_table(e), predict(e)
        for n in [n for n in table.index if n > 1]:
            row = table.loc[n]
            ahead = record.get(variant, {}).get("by_nodes", {}).get(str(n), {})
            rows.append(dict(
                forecast_speedup=ahead.get("forecast_speedup", np.nan),
                link=link_label(e), measured_gbit_s=float(np.median([run.raw["network"]["measured_gbit_s"]
                                                                    for run in e.repeats[n]])),
                world_size=n, speedup=row["speedup"],
                speedup_low=row["speedup_low"], speedup_high=row["speedup_high"], efficiency=row["efficiency"],
                step_time_s=row["step_time_s"], mean_step_s=row["mean_step_s"],
                comm_total_per_step_s=row["comm_total_per_step_s"],
                comm_exposed_per_step_s=row["comm_exposed_per_step_s"],
                predicted_comm_s=prediction.loc[n, "predicted_comm_s"] if n in prediction.index else np.nan,
                predicted_compute_s=prediction.loc[n, "predicted_compute_s"] if n in prediction.index else np.nan,
                compute_per_step_s=row["compute_per_step_s"],
                compute_to_comm_ratio=row["compute_to_comm_ratio"],
                break_even_ratio=row["exposed_share"] / (n - 1),
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
        "links_measured": "; ".join(f"{row.link} at {row.world_size} nodes, {rate_text(row.measured_gbit_s)}"
                                    for row in table.itertuples()),
        "worst_prediction_error": worst["prediction_error"], "worst_prediction_nodes": int(worst["world_size"]),
        "worst_prediction_link": worst["link"], "predictions_inside": len(inside), "predictions": len(table),
        "link_world_sizes": [int(n) for n in sorted(table["world_size"].unique())],
    }


FORECAST_BAR = 0.1  # the goal: every forecast within 10 % of the median step measured


def forecast_table(study: dict[str, Experiment]) -> pd.DataFrame:
    """Per variant whose links the wind tunnel set and number of nodes: the step it forecast before the runs, when,
    the runs' median step (median of the repeats' medians), when the first of them started, and the error."""
    record = wind_tunnel_record(study[BASELINE].folder.parent)
    rows = []
    for variant, experiment in variant_experiments(study).items():
        steps = run_times(experiment).groupby("world_size")["step_time_s"].median()
        for n, entry in record.get(variant, {}).get("by_nodes", {}).items():
            n = int(n)
            rows.append(dict(link=variant_label(experiment, study), world_size=n,
                             forecast_ms=entry["forecast_step_s"] * 1e3, forecast_at=_clock(entry["forecast_at"]),
                             step_ms=steps[n] * 1e3,
                             first_run_at=_clock(min(run.raw["start_time"] for run in experiment.repeats[n])),
                             error=entry["forecast_step_s"] / steps[n] - 1))
    return pd.DataFrame(rows)


def forecast_markdown(study: dict[str, Experiment]) -> str:
    """`forecast_table`, and whether each error is within FORECAST_BAR."""
    table = forecast_table(study)
    table["within"] = ["yes" if abs(error) <= FORECAST_BAR else "no" for error in table.get("error", [])]
    return one_row_each(table, {
        "link": ("Links set for", "{}"), "world_size": ("Nodes", "{}"),
        "forecast_ms": ("Step forecast (ms)", "{:.0f}"), "forecast_at": ("Forecast at (UTC)", "{}"),
        "step_ms": ("Step measured, median (ms)", "{:.0f}"), "first_run_at": ("First run at (UTC)", "{}"),
        "error": ("Error", "{:+.0%}"), "within": (f"Within {FORECAST_BAR:.0%}", "{}")}, index_name=None)


def _clock(stamp: str | None) -> str | None:
    """'14:03:59' of an ISO time as run.json writes it (UTC)."""
    return stamp[11:19] if isinstance(stamp, str) else None


def nodes_figure(study: dict[str, Experiment]):
    """The speedup over one node against the number of nodes, per link (a colour each), beside the ideal N and the
    cost model's prediction; and a step's compute and exposed all-reduce against the nodes, beside the one node's
    compute / N. One legend below both panels: the links by colour, then what each line style shows."""
    from matplotlib.lines import Line2D

    table = link_table(study)
    one = scaling_table(study[BASELINE]).loc[1]
    nodes = sorted({1, *(n for e in variant_experiments(study).values() for n in e.repeats)})
    fig, (speed, parts) = plt.subplots(1, 2, figsize=(10, 5.4))
    speed.plot(nodes, nodes, ":", color="gray")
    parts.plot(nodes, [one["compute_per_step_s"] * 1e3 / n for n in nodes], ":", color="gray")
    colours = []
    for i, (link, rows) in enumerate(table.groupby("link", sort=False)):
        error = [[0, *(rows["speedup"] - rows["speedup_low"])], [0, *(rows["speedup_high"] - rows["speedup"])]]
        speed.errorbar([1, *rows["world_size"]], [1, *rows["speedup"]], yerr=error, fmt="o-", capsize=3,
                       color=f"C{i}")
        ahead = rows["forecast_speedup"].where(rows["forecast_speedup"].notna(), rows["predicted_speedup"])
        speed.plot(rows["world_size"], ahead, "s--", color=f"C{i}", alpha=0.6)
        parts.plot(rows["world_size"], rows["compute_per_step_s"] * 1e3, "^-", color=f"C{i}", alpha=0.6,
                   markersize=8 - 2 * i)
        parts.plot(rows["world_size"], rows["comm_exposed_per_step_s"] * 1e3, "x--", color=f"C{i}", markersize=8)
        colours.append(Line2D([], [], color=f"C{i}", linewidth=6, label=link))
    main = link_experiments(study)
    record = wind_tunnel_record(study[BASELINE].folder.parent)
    for i, (variant, e) in enumerate(((v, e) for v, e in variant_experiments(study).items() if v not in main),
                                     len(colours)):  # the similarity test's nodes: their speedup, over their one node
        curve = scaling_table(e).query("index > 1")
        error = [[0, *(curve["speedup"] - curve["speedup_low"])], [0, *(curve["speedup_high"] - curve["speedup"])]]
        speed.errorbar([1, *curve.index], [1, *curve["speedup"]], yerr=error, fmt="D-", capsize=3, color=f"C{i}")
        ahead = record.get(variant, {}).get("by_nodes", {})
        speed.plot([int(n) for n in ahead], [entry["forecast_speedup"] for entry in ahead.values()], "s--",
                   color=f"C{i}", alpha=0.6)
        colours.append(Line2D([], [], color=f"C{i}", linewidth=6, label=variant_label(e, study)))
    styles = [Line2D([], [], color="black", marker="o", label="speedup measured (bar: range of the repeats)"),
              Line2D([], [], color="black", marker="s", linestyle="--", alpha=0.6,
                     label="speedup forecast before the runs" if table["forecast_speedup"].notna().all()
                     else "speedup predicted"),
              Line2D([], [], color="gray", linestyle=":", label="ideal: N; one node's compute / N"),
              Line2D([], [], color="black", marker="^", alpha=0.6, label="compute per step"),
              Line2D([], [], color="black", marker="x", linestyle="--", label="exposed all-reduce per step")]
    speed.set(xscale="log", yscale="log", xlabel="nodes", ylabel="speedup over one node",
              title="Speedup against nodes")
    speed_ticks = [0.5, *nodes] if speed.get_ylim()[0] < 1 else nodes
    speed.set_yticks(speed_ticks, [f"{t:g}" for t in speed_ticks])
    parts.set(xscale="log", yscale="log", xlabel="nodes", ylabel="ms per step (mean, steady epochs)",
              title="Compute and exposed all-reduce per step")
    nice = [m * 10 ** e for e in range(-1, 5) for m in (1, 2, 5)]  # ms: down to the next of these, a tick at each
    low, high = parts.get_ylim()
    low = max([t for t in nice if t <= low], default=low)
    parts.set_ylim(low, high)
    ticks = [t for t in nice if low <= t <= high]
    for ax in (speed, parts):
        ax.set_xticks(nodes, [str(n) for n in nodes])
        ax.minorticks_off()
    parts.set_yticks(ticks, [f"{t:g}" for t in ticks])
    fig.legend(handles=colours, title="links set for", loc="lower left", bbox_to_anchor=(0.04, 0), fontsize=9,
               title_fontsize=9, frameon=False)
    fig.legend(handles=styles, loc="lower left", bbox_to_anchor=(0.5, 0), fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.22, 1, 1))
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
             "share_got": SHARE_GOT, "stolen_limit": STOLEN, "others_limit": EMULATED_OTHER_CORES,
             "runs_each": counted(len(study[BASELINE].all_runs), "run"),
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
    at_most = table[table["world_size"] == most]
    inflation = at_most["compute_per_step_s"] / at_most["predicted_compute_s"]
    found["compute_inflation_range"] = f"{inflation.min():.2f} to {inflation.max():.2f}"
    theory_says_faster = table["compute_to_comm_ratio"] > table["break_even_ratio"]
    return found | {"points": len(table), "faster_points": int((table["speedup"] > 1).sum()),
                    "break_even_held": int(((table["speedup"] > 1) == theory_says_faster).sum())}


def headline_findings(study: dict[str, Experiment]) -> dict:
    """`nodes_findings`, `efficiency_findings`, `similarity_test_findings` and `similarity_findings` (the machine)
    named `nodes_<name>`, as the pages that quote the headline beside their own findings glue them."""
    found = (nodes_findings(study) | efficiency_findings(study) | similarity_test_findings(study)
             | similarity_findings(study))
    return {f"nodes_{key}": value for key, value in found.items()}


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
    """Per variant and number of nodes: the configuration its links model (else their rate) and the nodes' share,
    R_N^bench as that configuration has it (its target, from published figures or the measured GPU) and as the wind
    tunnel reached it on this machine before the runs (the benchmark at the rate it set; both empty for links set by
    a rate), the link's rate, and the speedup and efficiency the runs measured over the one node of the same share,
    with their ranges and the verdict; and the runs' own R_N beside the theory's break-even f/(N-1)."""
    record = wind_tunnel_record(study[BASELINE].folder.parent)
    rows = []
    for variant, experiment in variant_experiments(study).items():
        table, verdicts = scaling_table(experiment), speedup_comparisons(experiment)
        rate = experiment.all_runs[-1].raw["network"]["link_rate_gbit_s"]
        for n in [n for n in table.index if n > 1]:
            row = table.loc[n]
            entry = record.get(variant, {}).get("by_nodes", {}).get(str(n), {})
            models = record.get(variant, {}).get("models")
            rows.append(dict(configuration=link_label(experiment), share=node_share(experiment), nodes=n,
                             modelled_batch=(CONFIGURATIONS[models].global_batch or experiment.baseline.global_batch_size)
                             if models else np.nan,
                             target_ratio=entry.get("target_ratio", np.nan),
                             achieved_ratio=entry.get("achieved_ratio", np.nan),
                             link_mbit_s=rate_bits_per_s(entry["link_rate"]) / 1e6 if entry
                             else rate * 1e3 if rate else np.nan,
                             speedup=row["speedup"], efficiency=row["efficiency"],
                             speedup_low=row["speedup_low"], speedup_high=row["speedup_high"],
                             efficiency_low=row["speedup_low"] / n, efficiency_high=row["speedup_high"] / n,
                             verdict=verdicts[n].says("slower", "faster"), floor=verdicts[n].floor,
                             runs_ratio=row["compute_to_comm_ratio"], break_even=row["exposed_share"] / (n - 1)))
    return pd.DataFrame(rows)


def similarity_markdown(study: dict[str, Experiment]) -> str:
    table = similarity_table(study)
    table["efficiency_range"] = [f"{e:.0%} ({low:.0%} to {high:.0%})" for e, low, high in
                                 zip(table["efficiency"], table["efficiency_low"], table["efficiency_high"])]
    return one_row_each(table, {
        "configuration": ("Links set for", "{}"), "share": ("Share of a core", "{:g}"), "nodes": ("Nodes", "{}"),
        "modelled_batch": ("Global batch modelled", "{:.0f}"),
        "target_ratio": ("$R_N^\\text{bench}$, target", "{:.2f}"),
        "achieved_ratio": ("$R_N^\\text{bench}$, reached", "{:.2f}"),
        "link_mbit_s": ("Link rate set (Mbit/s)", "{:,.0f}"),
        "efficiency_range": ("Efficiency, median (lowest to highest)", "{}"),
        "verdict": ("Verdict against one node", "{}")}, index_name=None)


def efficiency_table(study: dict[str, Experiment]) -> pd.DataFrame:
    """Per variant and number of nodes: the parallel efficiency measured (median of the repeats, with their range)
    against x = R_N / f, the runs' own compute-to-communication ratio over the share of the all-reduce they left
    exposed, and the theory's efficiency at that x, x / (1 + x): a step of T_c/N + f T_comm (the theory chapter),
    whatever the CPU, the link or the configuration modelled."""
    rows = []
    for variant, experiment in variant_experiments(study).items():
        table = scaling_table(experiment)
        for n in [n for n in table.index if n > 1]:
            row = table.loc[n]
            x = row["compute_to_comm_ratio"] / row["exposed_share"]
            rows.append(dict(configuration=variant_label(experiment, study), nodes=n, ratio_over_exposed=x,
                             efficiency=row["efficiency"], efficiency_low=row["speedup_low"] / n,
                             efficiency_high=row["speedup_high"] / n, theory_efficiency=x / (1 + x)))
    table = pd.DataFrame(rows)
    table["of_theory"] = table["efficiency"] / table["theory_efficiency"]
    return table


def efficiency_figure(study: dict[str, Experiment]):
    """Every point's efficiency against R_N / f (a colour per configuration, a marker per number of nodes, a bar for
    the range of the repeats), on the theory's curve x / (1 + x)."""
    table = efficiency_table(study)
    fig, ax = plt.subplots(figsize=(7, 4.6))
    x = np.geomspace(min(0.05, table["ratio_over_exposed"].min() / 2), max(50, table["ratio_over_exposed"].max() * 2))
    ax.plot(x, x / (1 + x), color="gray", label="theory: $x/(1+x)$")
    markers = dict(zip(sorted(table["nodes"].unique()), "osD^v"))
    for i, (configuration, rows) in enumerate(table.groupby("configuration", sort=False)):
        for row in rows.itertuples():
            ax.errorbar(row.ratio_over_exposed, row.efficiency, capsize=3, color=f"C{i}", fmt=markers[row.nodes],
                        yerr=[[row.efficiency - row.efficiency_low], [row.efficiency_high - row.efficiency]],
                        label=f"{configuration}, {row.nodes} nodes")
    ax.set(xscale="log", xlabel="$x = R_N / f$: compute per node over the exposed all-reduce",
           ylabel="parallel efficiency (bar: range of the repeats)", ylim=(0, 1.05),
           title="Efficiency against the compute-to-communication ratio")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def efficiency_findings(study: dict[str, Experiment]) -> dict:
    """How far the points reach the theory's curve: the efficiency measured over the curve's at the same x, its
    median and range over the points (below 1: under the curve)."""
    reached = efficiency_table(study)["of_theory"]
    return {"curve_points": len(reached), "curve_reached": reached.median(),
            "curve_reached_range": f"{reached.min():.0%} to {reached.max():.0%}"}


def gradient_ready_table(study: dict[str, Experiment]) -> pd.DataFrame:
    """When each of DDP's gradient buckets is complete during backward, as a share of backward, with the share of
    the gradient's bytes complete by then: for the study's model as its one-node run measured it (the first repeat's
    timeline, the step the wind tunnel replays), and for it and for the large model the configurations train as
    backward's FLOPs place them (`model_cost.bucket_ready_shares`, how a GPU's backward spends its time)."""
    one = study[BASELINE].baseline
    timeline = pd.read_csv(study[BASELINE].folder / one.name / "timeline.csv").set_index("what")
    start, end = timeline.loc["backward", "start_s"], timeline.loc["backward", "end_s"]
    small, large = one.raw["model"], large_model(one.raw["model"])
    profiles = {f"{one.config['preset']} model, measured on one node": (
                    bucket_sizes(small), [(timeline.loc[f"{READY}{k}", "start_s"] - start) / (end - start)
                                          for k in range(1, len(bucket_sizes(small)) + 1)]),
                f"{one.config['preset']} model, by FLOPs": (bucket_sizes(small), bucket_ready_shares(small)),
                "large model, by FLOPs": (bucket_sizes(large), bucket_ready_shares(large))}
    rows = [dict(model=model, bucket=k, backward_done=share, bytes_ready=sum(sizes[:k]) / sum(sizes),
                 last_bucket_bytes=sizes[-1] / sum(sizes))
            for model, (sizes, shares) in profiles.items() for k, share in enumerate(shares, 1)]
    return pd.DataFrame(rows)


def gradient_ready_figure(study: dict[str, Experiment]):
    """The gradient's bytes complete against the share of backward done, a step per bucket, per `gradient_ready_table`
    profile: what backward lets the all-reduce overlap."""
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for i, (model, rows) in enumerate(gradient_ready_table(study).groupby("model", sort=False)):
        ax.step([0, *rows["backward_done"], 1], [0, *rows["bytes_ready"], 1], where="post", color=f"C{i}",
                linestyle=["-", "--", "-"][i % 3], marker="o", markersize=4, label=model)
    ax.set(xlabel="share of backward done", ylabel="share of the gradient's bytes ready to all-reduce",
           title="When the gradient is ready", xlim=(0, 1.02), ylim=(0, 1.02))
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def gradient_ready_findings(study: dict[str, Experiment]) -> dict:
    """The share of the gradient's bytes in the last bucket, complete only as backward ends (the share of the
    all-reduce no backward can hide), of the study's model and of the large one; and the share f of the all-reduce
    the runs left exposed, lowest and highest over the links and numbers of nodes."""
    last = gradient_ready_table(study).groupby("model", sort=False)["last_bucket_bytes"].first()
    exposed = [share for e in variant_experiments(study).values()
               for n, share in scaling_table(e)["exposed_share"].items() if n > 1]
    return {"last_bucket_small": last.iloc[0], "last_bucket_large": last.iloc[-1],
            "exposed_share_range": f"{min(exposed):.0%} to {max(exposed):.0%}"}


def similarity_findings(study: dict[str, Experiment]) -> dict:
    """One node's compute per step on this machine, the CPU, the tolerance the wind tunnel held every target to and
    where the configurations' ratios come from ("none" where no variant models one)."""
    record = wind_tunnel_record(study[BASELINE].folder.parent)
    one = study[BASELINE].baseline
    calibrated = (read_wind_tunnel(study[BASELINE].folder.parent) or {}).get("shares", {}).get(
        f"{node_share(study[BASELINE]):g}")
    repeats = steady_phases(study[BASELINE].metrics).groupby("run")["compute_per_step_s"].mean() * 1e3
    return {"tunnel_compute_ms": calibrated["compute_per_step_s"] * 1e3 if calibrated else repeats.median(),
            "tunnel_compute_range": f"{repeats.min():,.0f} to {repeats.max():,.0f}",
            "tunnel_cpu": one.raw["device_name"],
            "tunnel_cpu_extensions": ", ".join(one.raw.get("cpu_extensions") or ["none recorded"]),
            "tunnel_tolerance": TOLERANCE,
            "tunnel_sources": "; ".join(f"{name}: {source}" for name, source in {
                m["configuration"]: CONFIGURATIONS[m["models"]].source for m in record.values()}.items()) or "none"}


def fidelity_table(study: dict[str, Experiment]) -> pd.DataFrame:
    """Per run on nodes with a CPU share: how far its nodes got the share they were set, and what else the machine
    did. `used_share` is a node's CPU over the periods it ran in, against its share: 1 for a node that computed all
    the time, less where it waited for the network inside a period. `throttled` is the share of those periods in
    which the kernel stopped it at its quota. `other_cores` and `stolen` come from run.json: the CPU of every other
    process on the machine (the launcher, the kernel's network work) and the time the hypervisor took. A run is
    `disturbed` where a one-node run got less than SHARE_GOT of its share or the machine did more beside it than a
    quiet one does (`results.disturbed`)."""
    rows = []
    for variant, experiment in study.items():
        for run in experiment.all_runs:
            network, use = run.raw["network"], machine_use(run.raw)
            nodes = network.get("node_cpu")
            if not nodes:
                continue
            period_s = network["cpu_period_ms"] / 1e3
            used = [node["cpu_s"] / (node["periods"] * period_s) / network["cpus_per_node"] for node in nodes]
            rows.append(dict(
                link=link_label(experiment) if experiment.largest > 1 else "none", nodes=network["nodes"],
                machine_disturbed=disturbed(run.raw),
                share=network["cpus_per_node"], run=f"{variant}/{run.name}",
                used_share_low=min(used), used_share=float(np.median(used)),
                throttled=float(np.median([node["throttled_periods"] / node["periods"] for node in nodes])),
                other_cores=use["other_cores"] if use else np.nan, stolen=use["stolen"] if use else np.nan))
    table = pd.DataFrame(rows)
    table["disturbed"] = ((table["nodes"] == 1) & (table["used_share_low"] < SHARE_GOT)) | table.pop("machine_disturbed")
    return table


SHARE_GOT = 0.95  # a node that computes all the time (one node alone) uses at least this much of its share


def disturbed_runs(study: dict[str, Experiment]) -> str:
    """The runs `fidelity_table` calls disturbed, by folder, or "none"."""
    table = fidelity_table(study)
    return ", ".join(f"`{name}`" for name in table.loc[table["disturbed"], "run"]) or "none"


def fidelity_markdown(study: dict[str, Experiment]) -> str:
    summary = fidelity_table(study).groupby(["link", "share", "nodes"], sort=False).agg(
        used_share_low=("used_share_low", "min"), used_share=("used_share", "median"),
        throttled=("throttled", "median"), other_cores=("other_cores", "median"), stolen=("stolen", "max"),
        disturbed=("disturbed", "sum")).reset_index()
    percent = ["used_share_low", "used_share", "throttled", "stolen"]
    summary[percent] *= 100
    return one_row_each(summary, {
        "link": ("Links set for", "{}"), "share": ("Share of a core", "{:g}"), "nodes": ("Nodes", "{}"),
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
            "period_dates": ", ".join(sorted({day(run.raw["start_time"]) for run in runs})),
            "period_comparisons": "; ".join(f"at {row.period_ms} ms, {row.value} times as long: {row.verdict}"
                                            for row in table.itertuples())}
