"""Strong scaling over emulated nodes (`ddp_core.launch.emulated`): the nodes page and the report's headline.

Each node has its own CPU share and network stack, and the link's bandwidth is the variable.
Speedups are against the study's one-node runs (`one_node`), which ran in the same rounds as every link's.
The prediction is the prediction chapter's cost model, fed the all-reduce benchmark measured over the same links.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ddp_core.engine.model_cost import bucket_ready_shares, bucket_sizes
from ddp_core.engine.run_files import READY
from ddp_core.analysis.comparisons import compare_times, time_floor
from ddp_core.analysis.cpu_period import STUDY_PERIOD_MS, load_periods, period_table
from ddp_core.analysis.emulated import (
    BASELINE,
    FORECAST_BAR,
    SIMILARITY_EFFECT,
    Curve,
    Forecasts,
    Headline,
    SimilarityTest,
    Tunnel,
    curve,
    ddp_on_nodes,
    efficiency_table,
    forecast_table,
    forecasts,
    headline,
    link_experiments,
    link_table,
    one_node_drift,
    similarity_table,
    similarity_test,
    similarity_test_table,
    tunnel,
    variant_experiments,
    variant_label,
)
from ddp_core.analysis.provenance import StudySetup, study_setup
from ddp_core.analysis.results import (
    Experiment,
    link_label,
    machine_use,
    measured_gbit_s,
    node_disturbed,
    only,
    rate_text,
    shares_used,
)
from ddp_core.analysis.similarity import large_model
from ddp_core.analysis.speedups import scaling_table
from ddp_core.analysis.tables import (
    ALLREDUCE_IN_FLIGHT_MS,
    MEAN_STEP_MS,
    STEP_MEDIAN_MS,
    measured_by,
    median_range,
    quantity_table,
    range_rows,
    step_part_rows,
)


def similarity_test_markdown(study: dict[str, Experiment]) -> str:
    table = similarity_test_table(study)
    table["shares"] = [f"{a:g} and {b:g}" for a, b in zip(table["share"], table["other_share"])]
    table["speedups"] = [f"{a:.2f} and {b:.2f}" for a, b in zip(table["speedup"], table["other_speedup"])]
    table["ratio_range"] = [median_range(row.ratio, row.low, row.high, between=" to ") for row in table.itertuples()]
    return quantity_table(
        table,
        {
            "configuration": ("Links set for", "{}"),
            "nodes": ("Nodes", "{}"),
            "shares": ("Shares of a core", "{}"),
            "speedups": ("Speedups (medians)", "{}"),
            "ratio_range": ("Second over first, median of the repeats' paired ratios (range)", "{}"),
            "verdict": ("Verdict", "{}"),
            "floor": ("Noise floor", "{:.0%}"),
            "finds_effect": (f"Chance to detect a {SIMILARITY_EFFECT:.0%} difference", "{:.0%}"),
        },
        index_name=None,
    )


LINK_ROWS = {
    "world_size": ("Nodes", "{:.0f}"),
    "measured_gbit_s": ("Link measured before the runs, median (Mbit/s)", "{:,.0f}", 1e3),
    "step_time_s": (STEP_MEDIAN_MS, "{:.0f}", 1e3),
    "speedup": ("Speedup over one node, median of the repeats' paired ratios", "{:.2f}"),
    **range_rows("speedup", "{:.2f}"),
    **step_part_rows(),
    "comm_total_per_step_s": (ALLREDUCE_IN_FLIGHT_MS, "{:.0f}", 1e3),
    "predicted_compute_s": ("Compute per step, predicted (ms)", "{:.0f}", 1e3),
    "predicted_comm_s": ("All-reduce per step, predicted from the benchmark (ms)", "{:.0f}", 1e3),
    "predicted_speedup": ("Speedup, predicted", "{:.2f}"),
    "prediction_error": ("Error of the predicted speedup (%; positive: more speedup than measured)", "{:+.0f}", 100),
    "compute_to_comm_ratio": ("$R_N = (T_c/N)/T_\\text{comm}$", "{:.2f}"),
    "break_even_ratio": ("Break-even $R_N = f/(N-1)$", "{:.2f}"),
}


def link_markdown(study: dict[str, Experiment]) -> str:
    """A table per world size, a column per link."""
    table = link_table(study)
    return "\n\n".join(
        quantity_table(rows, LINK_ROWS, turned=True, column_names=list(rows["point"]))
        for _, rows in table.groupby("world_size")
    )


def links_measured(study: dict[str, Experiment]) -> str:
    """The rate measured before the runs on each link and number of nodes, in words."""
    return "; ".join(
        f"{variant_label(e, study, n)} at {n} nodes, {rate_text(measured_gbit_s(only(e, n)))}"
        for e in variant_experiments(study).values()
        for n in e.repeats
        if n > 1
    )


@dataclass(frozen=True)
class WorstPrediction:
    """The cost model's prediction that missed the measured speedup most: its error, nodes and link."""

    error: float
    nodes: int
    link: str


def worst_prediction(table: pd.DataFrame) -> WorstPrediction:
    """`WorstPrediction` of `link_table`'s points."""
    worst = table.loc[table["prediction_error"].abs().idxmax()]
    return WorstPrediction(worst["prediction_error"], int(worst["world_size"]), worst["point"])


def forecast_markdown(study: dict[str, Experiment]) -> str:
    """`forecast_table`, and whether each error is within FORECAST_BAR."""
    table = forecast_table(study)
    table["within"] = ["yes" if abs(error) <= FORECAST_BAR else "no" for error in table.get("error", [])]
    table["rounds_within"] = [f"{k} of {n}" for k, n in zip(table["rounds_within"], table["rounds"])]
    return quantity_table(
        table,
        {
            "link": ("Links set for", "{}"),
            "world_size": ("Nodes", "{}"),
            "forecast_ms": ("Step forecast, median of the rounds (ms)", "{:.0f}"),
            "rounds_before": ("Rounds forecast before their run", "{}"),
            "step_ms": ("Step measured, median (ms)", "{:.0f}"),
            "error": ("Error of the forecast step (negative: shorter than measured)", "{:+.0%}"),
            "within": (f"Within {FORECAST_BAR:.0%}", "{}"),
            "rounds_within": (f"Rounds within {FORECAST_BAR:.0%} of their run", "{}"),
        },
        index_name=None,
    )


def doubling_markdown(study: dict[str, Experiment]) -> str:
    """Per link and doubling of the nodes, N/2 to N: the time per sample at N over at N/2, with range and verdict."""
    rows = []
    for experiment in link_experiments(study).values():
        sizes, floor = sorted(experiment.runs), time_floor(experiment)
        for half, n in zip(sizes, sizes[1:]):
            c = compare_times(experiment, experiment, n, half, floor=floor)  # repeat by repeat
            rows.append(
                dict(
                    link=link_label(experiment),
                    doubling=f"{half} to {n}",
                    ratio=c.ratio,
                    low=c.low,
                    high=c.high,
                    verdict=c.says("faster", "slower"),
                )
            )
    return quantity_table(
        pd.DataFrame(rows),
        {
            "link": ("Link", "{}"),
            "doubling": ("Nodes", "{}"),
            "ratio": ("Time per sample, after / before (median)", "{:.2f}"),
            "low": ("lowest", "{:.2f}"),
            "high": ("highest", "{:.2f}"),
            "verdict": ("Verdict", "{}"),
        },
    )


def similarity_markdown(study: dict[str, Experiment]) -> str:
    """`similarity_table`: each point's ratio, where it is borrowed from, its speedup beside that cluster's forecast."""
    table = similarity_table(study)
    table["speedup_range"] = [
        median_range(*row, "{:.2f}", " to ")
        for row in zip(table["speedup"], table["speedup_low"], table["speedup_high"])
    ]
    table["cluster_range"] = [
        f"{low:.2f} to {high:.2f}" if low > 0 else np.nan
        for low, high in zip(table["cluster_low"], table["cluster_high"])
    ]
    return quantity_table(
        table,
        {
            "target_ratio": ("$R_N^\\text{bench}$, target", "{:.2f}"),
            "borrowed": ("Ratio borrowed from", "{}"),
            "share": ("Share of a core", "{:g}"),
            "nodes": ("Nodes", "{}"),
            "modelled_batch": ("Global batch modelled", "{:.0f}"),
            "achieved_ratio": ("$R_N^\\text{bench}$, reached", "{:.2f}"),
            "speedup_range": ("Speedup, median (lowest to highest)", "{}"),
            "verdict": ("Verdict against one node", "{}"),
            "cluster_range": ("The cluster's own forecast speedup", "{}"),
        },
        index_name=None,
    )


def efficiency_figure(study: dict[str, Experiment]):
    """Every point's efficiency against R_N / f, on the theory's curve x / (1 + x). A colour per configuration, a
    marker per number of nodes, a bar for the range of the repeats."""
    table = efficiency_table(study)
    fig, ax = plt.subplots(figsize=(9, 4.2))
    x = np.geomspace(min(0.05, table["ratio_over_exposed"].min() / 2), max(50, table["ratio_over_exposed"].max() * 2))
    ax.plot(x, x / (1 + x), color="gray", label="theory: $x/(1+x)$")
    markers = dict(zip(sorted(table["nodes"].unique()), "osD^v"))
    for i, (configuration, rows) in enumerate(table.groupby("configuration", sort=False)):
        for row in rows.itertuples():
            ax.errorbar(
                row.ratio_over_exposed,
                row.efficiency,
                capsize=3,
                color=f"C{i}",
                fmt=markers[row.nodes],
                yerr=[[row.efficiency - row.efficiency_low], [row.efficiency_high - row.efficiency]],
                label=f"{configuration}, {row.nodes} nodes",
            )
    ax.set(
        xscale="log",
        xlabel="$x = R_N / f$: compute per node over the exposed all-reduce",
        ylabel="parallel efficiency, mean steps\n(bar: range of the rounds)",
        ylim=(0, 1.05),
        title="Efficiency against the compute-to-communication ratio",
    )
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    fig.tight_layout()
    return fig


def gradient_ready_table(study: dict[str, Experiment]) -> pd.DataFrame:
    """When each of DDP's gradient buckets is complete, as a share of backward, with the gradient's bytes complete by
    then. It covers the study's model as measured, and it and the large model as backward's FLOPs place them."""
    one = study[BASELINE].baseline
    # the one-node run's first repeat: the step the wind tunnel replays
    timeline = pd.read_csv(study[BASELINE].folder / one.name / "timeline.csv").set_index("what")
    start, end = timeline.loc["backward", "start_s"], timeline.loc["backward", "end_s"]
    small, large = one.raw["model"], large_model(one.raw["model"])
    buckets = bucket_sizes(small)
    measured = [(timeline.loc[f"{READY}{k}", "start_s"] - start) / (end - start) for k in range(1, len(buckets) + 1)]
    # By FLOPs (`model_cost.bucket_ready_shares`): how a GPU's backward spends its time.
    # The large model is the one the configurations train.
    profiles = {
        f"{one.config['preset']} model, measured on one node": (buckets, measured),
        f"{one.config['preset']} model, by FLOPs": (buckets, bucket_ready_shares(small)),
        "large model, by FLOPs": (bucket_sizes(large), bucket_ready_shares(large)),
    }
    rows = [
        dict(
            model=model,
            bucket=k,
            backward_done=share,
            bytes_ready=sum(sizes[:k]) / sum(sizes),
            last_bucket_bytes=sizes[-1] / sum(sizes),
        )
        for model, (sizes, shares) in profiles.items()
        for k, share in enumerate(shares, 1)
    ]
    return pd.DataFrame(rows)


def gradient_ready_figure(study: dict[str, Experiment]):
    """The gradient's bytes complete against the share of backward done, a step per bucket, a line per profile. It
    shows what backward lets the all-reduce overlap."""
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for i, (model, rows) in enumerate(gradient_ready_table(study).groupby("model", sort=False)):
        ax.step(
            [0, *rows["backward_done"], 1],
            [0, *rows["bytes_ready"], 1],
            where="post",
            color=f"C{i}",
            linestyle=["-", "--", "-"][i % 3],
            marker="o",
            markersize=4,
            label=model,
        )
    ax.set(
        xlabel="share of backward done",
        ylabel="share of the gradient's bytes ready to all-reduce",
        title="When the gradient is ready",
        xlim=(0, 1.02),
        ylim=(0, 1.02),
    )
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


@dataclass(frozen=True)
class LastBucket:
    """The share of the gradient's bytes in the last bucket, for the study's model and the large one. That bucket is
    complete only as backward ends, so no backward can hide its all-reduce."""

    small: float
    large: float


def last_bucket(study: dict[str, Experiment]) -> LastBucket:
    """`LastBucket` of `gradient_ready_table`'s first and last profile."""
    last = gradient_ready_table(study).groupby("model", sort=False)["last_bucket_bytes"].first()
    return LastBucket(last.iloc[0], last.iloc[-1])


def exposed_share_range(study: dict[str, Experiment]) -> str:
    """The share f of the all-reduce the runs left exposed, lowest to highest over the links and numbers of nodes."""
    exposed = [
        share
        for e in variant_experiments(study).values()
        for n, share in scaling_table(e)["exposed_share"].items()
        if n > 1
    ]
    return f"{min(exposed):.0%} to {max(exposed):.0%}"


def fidelity_table(study: dict[str, Experiment]) -> pd.DataFrame:
    """Per run of one node, or of DDP on nodes with a CPU share: how far its nodes got the share they were set. Also
    what else the machine did beside it. The sharded modes' runs are the sharding chapter's."""
    rows = []
    for variant, experiment in ((v, e) for v, e in study.items() if e.largest == 1 or ddp_on_nodes(e)):
        for run in experiment.all_runs:
            network, use, used = run.raw["network"], machine_use(run.raw), shares_used(run.raw)
            if not used:
                continue
            nodes = network["node_cpu"]
            rows.append(
                dict(
                    link=link_label(experiment) if experiment.largest > 1 else "none",
                    nodes=network["nodes"],
                    share=network["cpus_per_node"],
                    run=f"{variant}/{run.name}",
                    # A node's CPU over the periods it ran in, against its share.
                    # 1 for a node that computed all the time, less where it waited for the network inside a period.
                    used_share_low=min(used),
                    used_share=float(np.median(used)),
                    # the share of those periods in which the kernel stopped it at its quota
                    throttled=float(np.median([node["throttled_periods"] / node["periods"] for node in nodes])),
                    # from run.json: the CPU of every other process, such as the launcher and the kernel's network work
                    other_cores=use["other_cores"] if use else np.nan,
                    stolen=use["stolen"] if use else np.nan,  # the time the hypervisor took
                    # a one-node run got less than its share, or the machine did more beside it than a quiet one does
                    disturbed=node_disturbed(run.raw),
                )
            )
    return pd.DataFrame(rows)


def disturbed_runs(study: dict[str, Experiment]) -> str:
    """The runs `fidelity_table` calls disturbed, by folder, or "none"."""
    table = fidelity_table(study)
    return ", ".join(table.loc[table["disturbed"], "run"]) or "none"


def fidelity_markdown(study: dict[str, Experiment]) -> str:
    summary = (
        fidelity_table(study)
        .groupby(["link", "share", "nodes"], sort=False)
        .agg(
            used_share_low=("used_share_low", "min"),
            used_share=("used_share", "median"),
            throttled=("throttled", "median"),
            other_cores=("other_cores", "median"),
            stolen=("stolen", "max"),
            disturbed=("disturbed", "sum"),
        )
        .reset_index()
    )
    return quantity_table(
        summary,
        {
            "link": ("Links set for", "{}"),
            "share": ("Share of a core", "{:g}"),
            "nodes": ("Nodes", "{}"),
            "used_share": ("Quota used (%)", "{:.0f}", 100),
            "used_share_low": ("lowest (%)", "{:.0f}", 100),
            "throttled": ("Throttled (%)", "{:.0f}", 100),
            "other_cores": ("Others (cores)", "{:.2f}"),
            "stolen": ("Stolen (%)", "{:.1f}", 100),
            "disturbed": ("Disturbed", "{}"),
        },
    )


def period_markdown(folder: Path) -> str:
    """`period_table`: each period's step, its parts and its ratio to the study's period."""
    table = period_table(load_periods(folder))
    study = table["period_ms"] == STUDY_PERIOD_MS
    table["ratio"] = table["value"].where(~study, "1 (the study's period)")
    table["verdict"] = table["verdict"].where(~study, "")
    return quantity_table(
        table,
        {
            "period_ms": ("Quota period (ms)", "{}"),
            "median_step_ms": (STEP_MEDIAN_MS, "{:.0f}"),
            "mean_step_ms": (MEAN_STEP_MS, "{:.0f}"),
            "compute_ms": ("Compute per step, mean (ms)", "{:.0f}"),
            "exposed_ms": ("Exposed all-reduce per step, mean (ms)", "{:.0f}"),
            "in_flight_ms": (ALLREDUCE_IN_FLIGHT_MS, "{:.0f}"),
            "ratio": (f"Step against {STUDY_PERIOD_MS} ms, median of the paired ratios (range)", "{}"),
            "verdict": ("Verdict", "{}"),
        },
        index_name=None,
    )


@dataclass(frozen=True)
class QuotaPeriods:
    """The quota period's runs (`period_table`): the code commits and days that made them, and each other period's
    step against the study's."""

    commits: str
    dates: str
    comparisons: str  # "at 100 ms, 0.93 (0.79 to 0.94 over 3 repeats) times as long: within the noise ..."


def quota_periods(folder: Path) -> QuotaPeriods:
    """`QuotaPeriods` of the runs in `folder`."""
    periods = load_periods(folder)
    table = period_table(periods).query("period_ms != @STUDY_PERIOD_MS")
    made = [measured_by(e.baseline.raw) for e in periods.values()]
    return QuotaPeriods(
        commits=", ".join(sorted({run["commit"] for run in made})),
        dates=", ".join(sorted({run["measured_on"] for run in made})),
        comparisons="; ".join(
            f"at {row.period_ms} ms, {row.value} times as long: {row.verdict}" for row in table.itertuples()
        ),
    )


def one_node_repeats_apart(study: dict[str, Experiment]) -> str:
    """How far apart the one node's repeats ran at each share (`one_node_drift`), largest share first."""
    drift = sorted(one_node_drift(study).items(), reverse=True)
    return " and ".join(f"{apart:.0%} at {share:g} core" for share, apart in drift)


@dataclass(frozen=True)
class Findings(Headline):
    """What the emulated nodes page quotes: the headline, and how the runs bear it out. The headline's fields keep
    the names that other pages quote after `nodes_`."""

    tunnel: Tunnel
    links_measured: str
    curve: Curve
    similarity: SimilarityTest
    forecast: Forecasts
    one_node_repeats_apart: str
    worst_prediction: WorstPrediction
    predictions: int
    predictions_inside: int
    last_bucket: LastBucket
    exposed_share_range: str
    study_period_ms: int
    period: QuotaPeriods
    disturbed: str
    setup: StudySetup


def findings(study: dict[str, Experiment], periods: Path) -> Findings:
    """The study's findings, with those of the quota period's runs in the folder `periods`."""
    table = link_table(study)
    # inside: the cost model's speedup lies within the range of the repeats
    inside = table["predicted_speedup"].between(table["speedup_low"], table["speedup_high"])
    return Findings(
        **vars(headline(study)),
        tunnel=tunnel(study),
        links_measured=links_measured(study),
        curve=curve(study),
        similarity=similarity_test(study),
        forecast=forecasts(study),
        one_node_repeats_apart=one_node_repeats_apart(study),
        worst_prediction=worst_prediction(table),
        predictions=len(table),
        predictions_inside=int(inside.sum()),
        last_bucket=last_bucket(study),
        exposed_share_range=exposed_share_range(study),
        study_period_ms=STUDY_PERIOD_MS,
        period=quota_periods(periods),
        disturbed=disturbed_runs(study),
        setup=study_setup(*study.values()),
    )
