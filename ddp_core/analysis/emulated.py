"""The emulated nodes study's tables and findings, which book/studies/nodes.md shows and other chapters quote.

It sets each link's speedup beside its forecasts, and the efficiency against the theory's curve. The similarity test
runs the same configurations on nodes of another share. A study is `results.load_study`'s dict of variant ->
`Experiment`, and `BASELINE` is the one node's variant.
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ddp_core.analysis.comparisons import (
    POWER_DRAWS,
    SPEEDUP_RUNS,
    Chance,
    chance_at,
    compare_speedups,
    paired_sides,
    run_times,
    slower_speedup,
    speedup_comparisons,
    steady_phases,
    study_floor_power,
)
from ddp_core.analysis.cost_model import predict
from ddp_core.engine.wind_tunnel_file import read_wind_tunnel
from ddp_core.analysis.results import (
    EMULATED_OTHER_CORES,
    SHARE_GOT,
    STOLEN,
    Experiment,
    borrowed_from,
    forecast,
    joined,
    link_choice,
    link_label,
    measured_gbit_s,
    only,
    point_label,
    wind_tunnel_record,
)
from ddp_core.analysis.similarity import CONFIGURATIONS
from ddp_core.analysis.speedups import scaling_table
from ddp_core.analysis.tables import counted, median_range, noise_format, range_text
from ddp_core.analysis.verdict import error_rates
from ddp_core.launch.plan import rate_bits_per_s

BASELINE = "one_node"


def node_share(experiment: Experiment) -> float:
    """The CPU share of the nodes an experiment's runs trained on, in cores."""
    return experiment.baseline.raw["network"]["cpus_per_node"]


def ddp_on_nodes(experiment: Experiment) -> bool:
    """Whether a variant trains DDP on several nodes; the sharded modes' variants belong to the sharding chapter."""
    return experiment.largest > 1 and not experiment.baseline.sharded


def link_experiments(study: dict[str, Experiment]) -> dict[str, Experiment]:
    """Each link's DDP runs on nodes of the one node's share, with the one-node runs beside them, fastest link first.

    The variants at another share belong to the similarity test.
    """
    links = {
        variant: joined(study[BASELINE], e)
        for variant, e in study.items()
        if ddp_on_nodes(e) and node_share(e) == node_share(study[BASELINE])
    }
    return dict(sorted(links.items(), key=lambda item: -measured_gbit_s(item[1])))


def variant_experiments(study: dict[str, Experiment]) -> dict[str, Experiment]:
    """Every variant of DDP on several nodes with its share's one-node runs: the links', then the similarity test's."""
    links = link_experiments(study)
    ones = {node_share(e): e for e in study.values() if e.largest == 1}
    return links | {
        variant: joined(ones[node_share(e)], e)
        for variant, e in study.items()
        if ddp_on_nodes(e) and variant not in links
    }


def variant_label(experiment: Experiment, study: dict[str, Experiment], nodes: int | None = None) -> str:
    """What its links are set for, at `nodes` nodes where given, and the nodes' share where it is not one node's."""
    share = node_share(experiment)
    links = link_label(experiment) if nodes is None else point_label(experiment, nodes)
    return links + ("" if share == node_share(study[BASELINE]) else f", nodes of {share:g} core")


def similarity_test_table(study: dict[str, Experiment]) -> pd.DataFrame:
    """The similarity test: whether a configuration's speedup holds on nodes of another CPU share.

    Each variant at another share is compared with its twin at the one node's share, each over its own one node. A row
    also says how often the rule finds a true SIMILARITY_EFFECT with runs this noisy.
    """
    # Speedups are medians of the repeats. Their ratio is taken repeat by repeat, against the floor of both sides' runs.
    record = wind_tunnel_record(study[BASELINE].folder.parent)
    share, links = node_share(study[BASELINE]), link_experiments(study)
    twins = {record[v].models: links[v] for v in study if v in record and v in links}
    rows = []
    for variant, tested in variant_experiments(study).items():
        if variant not in record or variant in links:
            continue
        twin = twins[record[variant].models]
        twin_sides, tested_sides = paired_sides(twin), paired_sides(tested)  # each side's runs read once
        twin_speedups, tested_speedups = speedup_comparisons(twin), speedup_comparisons(tested)
        for n in sorted(n for n in tested.repeats if n > 1 and n in twin.repeats):
            c = compare_speedups(tested, twin, n)
            repeats = [
                twin_sides[1],
                twin_sides[n],
                tested_sides[1],
                tested_sides[n],  # the floor's configurations
                *(sides[m] for sides in (twin_sides, tested_sides) for m in sides if m not in (1, n)),
            ]
            rows.append(
                dict(
                    configuration=point_label(tested, n),
                    nodes=n,
                    borrowed=record[variant].configuration,
                    share=share,
                    other_share=node_share(tested),
                    speedup=twin_speedups[n].ratio,
                    other_speedup=tested_speedups[n].ratio,
                    ratio=c.ratio,
                    low=c.low,
                    high=c.high,
                    floor=c.floor,
                    verdict=c.says("scales worse", "scales better"),
                    # `verdict.error_rates` plants the effect in this very test (`slower_speedup`)
                    finds_effect=error_rates(
                        repeats, [SIMILARITY_EFFECT], draws=POWER_DRAWS, planted=slower_speedup, runs=SPEEDUP_RUNS
                    )[SIMILARITY_EFFECT],
                )
            )
    return pd.DataFrame(
        rows,
        columns=[
            "configuration",
            "nodes",
            "borrowed",
            "share",
            "other_share",
            "speedup",
            "other_speedup",
            "ratio",
            "low",
            "high",
            "floor",
            "verdict",
            "finds_effect",
        ],
    )


SIMILARITY_EFFECT = 0.1  # the bar: speedups on CPUs twice apart within 10 % of each other


@dataclass(frozen=True)
class SimilarityTest:
    """The similarity test's first comparison, as the key findings quote it."""

    setting: str
    value: str  # the ratio of the speedups on the two shares, with its range
    verdict: str


def similarity_test(study: dict[str, Experiment]) -> SimilarityTest:
    """`SimilarityTest` of `similarity_test_table`'s first row, or "not run" where no variant has another share."""
    table = similarity_test_table(study)
    if table.empty:
        return SimilarityTest(setting="none", value="none", verdict="not run")
    row = table.iloc[0]
    return SimilarityTest(
        setting=f"{counted(int(row['nodes']), 'node')}, links set to {row['configuration']}",
        value=median_range(row["ratio"], row["low"], row["high"], between=" to "),
        verdict=row["verdict"],
    )


def link_table(study: dict[str, Experiment]) -> pd.DataFrame:
    """One row per link and world size: the measured speedup beside the cost model's and the wind tunnel's forecasts.

    The cost model uses the all-reduce measured over the same links. The wind tunnel forecast before the runs, where it
    set the links.
    """
    record = wind_tunnel_record(study[BASELINE].folder.parent)
    rows = []
    for variant, e in link_experiments(study).items():
        table, prediction = scaling_table(e), predict(e)
        for n in [n for n in table.index if n > 1]:
            row, predicted = table.loc[n], prediction.reindex([n]).iloc[0]  # all NaN where no benchmark at n
            rows.append(
                dict(
                    # the one node's step replayed (`ddp_core.analysis.replay`)
                    forecast_speedup=forecast(link_choice(record, variant, n)).get("speedup", np.nan),
                    link=link_label(e),
                    point=point_label(e, n),
                    measured_gbit_s=measured_gbit_s(only(e, n)),
                    world_size=n,
                    **row[
                        [
                            "speedup",
                            "speedup_low",
                            "speedup_high",
                            "efficiency",
                            "step_time_s",
                            "mean_step_s",
                            "comm_total_per_step_s",
                            "comm_exposed_per_step_s",
                        ]
                    ],
                    **predicted[["predicted_comm_s", "predicted_compute_s"]],
                    **row[["compute_per_step_s", "compute_to_comm_ratio"]],
                    break_even_ratio=row["exposed_share"] / (n - 1),
                    predicted_speedup=predicted["predicted_speedup"],
                    prediction_error=predicted["error"],
                )
            )
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class LinkEnd:
    """The fastest or the slowest link at the most nodes, as the headline quotes it."""

    setting: str
    speedup_shown: str  # to the digit its noise floor allows
    speedup_range: str
    verdict: str
    floor: float
    power: float  # the tests' power to find a true 10 % difference
    efficiency: float
    compute_inflation: float
    exposed_ms: float
    step_ms: float
    comm_ms: float
    benchmark_ms: float  # the step's parts above are means over the steady epochs


def link_end(experiment: Experiment, table: pd.DataFrame, setting: str, nodes: int) -> LinkEnd:
    """`LinkEnd` of a link's runs on `nodes` nodes, from `link_table` and its setting in words (`similarity_table`)."""
    row = table.set_index(["link", "world_size"]).loc[(link_label(experiment), nodes)]
    comparison = speedup_comparisons(experiment)[nodes]
    shown = noise_format(row["speedup"], comparison.floor)
    return LinkEnd(
        setting=setting,
        speedup_shown=shown.format(row["speedup"]),
        speedup_range=range_text(row["speedup_low"], row["speedup_high"], shown, " to "),
        verdict=comparison.says("slower", "faster"),
        floor=comparison.floor,
        power=study_floor_power({"": experiment})["found_10"],
        efficiency=row["efficiency"],
        compute_inflation=row["compute_per_step_s"] / row["predicted_compute_s"],
        exposed_ms=row["comm_exposed_per_step_s"] * 1e3,
        step_ms=row["mean_step_s"] * 1e3,
        comm_ms=row["comm_total_per_step_s"] * 1e3,
        benchmark_ms=row["predicted_comm_s"] * 1e3,
    )


@dataclass(frozen=True)
class Headline:
    """The emulated nodes' headline and what it rests on, which the nodes page and later chapters quote.

    It holds the nodes and their runs, the limits that call a run disturbed, and the fastest and slowest links. It also
    holds the theory's break-even against the speedups.
    """

    cpus_per_node: float
    cpu_period_ms: float
    most_nodes: int
    node_counts: str
    global_batch: int
    train_samples: int
    epochs: int
    share_got: float
    stolen_limit: float
    others_limit: float
    runs_each: str
    ideal_cores: float
    sharded_runs: int
    cores: int
    spare_cores: float
    one_node: Chance
    prediction_errors: str
    fastest: LinkEnd
    slowest: LinkEnd
    compute_inflation_range: str
    points: int
    faster_points: int
    break_even_held: int


def headline(study: dict[str, Experiment]) -> Headline:
    """`Headline` of the study."""
    table, links = link_table(study), link_experiments(study)
    most = int(table["world_size"].max())
    settings = similarity_table(study).set_index(["variant", "nodes"])["setting"]
    one = study[BASELINE].baseline
    share = one.raw["network"]["cpus_per_node"]
    nodes = sorted({n for experiment in study.values() for n in experiment.repeats})
    # a step's compute against one node's / N, over the links at the most nodes
    inflation = (table["compute_per_step_s"] / table["predicted_compute_s"])[table["world_size"] == most]
    fastest, slowest = list(links)[0], list(links)[-1]  # `link_experiments` puts the fastest first
    theory_says_faster = table["compute_to_comm_ratio"] > table["break_even_ratio"]  # R_N > f/(N-1)
    return Headline(
        cpus_per_node=share,
        cpu_period_ms=one.raw["network"]["cpu_period_ms"],
        most_nodes=most,
        node_counts=f"{', '.join(map(str, nodes[:-1]))} and {nodes[-1]}",
        global_batch=one.global_batch_size,
        train_samples=one.config["train_samples"],
        epochs=one.config["epochs"],
        share_got=SHARE_GOT,
        stolen_limit=STOLEN,
        others_limit=EMULATED_OTHER_CORES,
        runs_each=counted(len(study[BASELINE].all_runs), "run"),
        ideal_cores=share * most,
        sharded_runs=sum(len(e.all_runs) for e in study.values() if e.baseline.sharded),
        cores=one.cpu_count,
        spare_cores=one.cpu_count - share * most,
        one_node=chance_at(study[BASELINE], 1),
        prediction_errors=signs(table["prediction_error"]),
        fastest=link_end(links[fastest], table, settings[(fastest, most)], most),
        slowest=link_end(links[slowest], table, settings[(slowest, most)], most),
        compute_inflation_range=f"{inflation.min():.2f} to {inflation.max():.2f}",
        points=len(table),
        faster_points=int((table["speedup"] > 1).sum()),
        # the (link, nodes) points where the speedup was above 1 exactly where the theory said so
        break_even_held=int(((table["speedup"] > 1) == theory_says_faster).sum()),
    )


FORECAST_BAR = 0.1  # the goal: every forecast within 10 % of the median step measured


def forecast_table(study: dict[str, Experiment]) -> pd.DataFrame:
    """Per variant whose links the wind tunnel set, and number of nodes: the forecast step against the runs' step.

    It also counts the rounds whose forecast was written before their run started, and came within FORECAST_BAR of it.
    """
    record = wind_tunnel_record(study[BASELINE].folder.parent)
    rows = []
    for variant, experiment in variant_experiments(study).items():
        own = run_times(experiment).set_index(["world_size", "repeat"])["step_time_s"]  # each round's run
        for n, choice in (record[variant].by_nodes if variant in record else {}).items():
            ahead = forecast(choice)  # the median of the rounds' forecasts
            runs, step = experiment.repeats[n], own[n].median()  # the median of the repeats' median steps
            rounds = [f for f in choice.forecasts if f.repeat <= len(runs)]
            before = sum(f.at < runs[f.repeat - 1].raw["start_time"] for f in rounds)
            within = sum(abs(f.step_s / own[(n, f.repeat)] - 1) <= FORECAST_BAR for f in rounds)
            rows.append(
                dict(
                    link=variant_label(experiment, study, n),
                    world_size=n,
                    forecast_ms=ahead["step_s"] * 1e3,
                    rounds_before=f"{before} of {len(runs)}",
                    step_ms=step * 1e3,
                    error=ahead["step_s"] / step - 1,
                    rounds_within=within,
                    rounds=len(rounds),
                )
            )
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class Forecasts:
    """The wind tunnel's forecasts against their runs, overall and round by round, with the errors' signs and range."""

    bar: float
    count: int
    within: int
    rounds: int
    rounds_within: int
    errors: str
    error_range: str


def forecasts(study: dict[str, Experiment]) -> Forecasts:
    """`Forecasts` of the study's variants whose links the wind tunnel set."""
    table = forecast_table(study)
    errors = table["error"]
    return Forecasts(
        bar=FORECAST_BAR,
        count=len(table),
        within=int((errors.abs() <= FORECAST_BAR).sum()),
        rounds=int(table["rounds"].sum()),
        rounds_within=int(table["rounds_within"].sum()),
        errors=signs(errors),
        error_range=f"{errors.min():+.0%} to {errors.max():+.0%}",
    )


def one_node_drift(study: dict[str, Experiment]) -> dict[float, float]:
    """Per CPU share, how far apart the one node's repeats ran: the slowest median step over the fastest, less 1.

    A speedup over one node carries this drift. Forecasting each round from its own one node leaves it out.
    """
    steps = {node_share(e): run_times(e)["step_time_s"] for e in study.values() if set(e.repeats) == {1}}
    return {share: times.max() / times.min() - 1 for share, times in steps.items()}


def signs(values: pd.Series) -> str:
    """The signs of `values` in outcome words: "all positive", "all negative", or "6 of 7 negative"."""
    negative = int((values < 0).sum())
    return (
        "all positive"
        if (values > 0).all()
        else "all negative"
        if negative == len(values)
        else f"{negative} of {len(values)} negative"
    )


def similarity_table(study: dict[str, Experiment]) -> pd.DataFrame:
    """Per variant and number of nodes: what its links model, and the speedup and efficiency the runs measured.

    A modelled configuration's row sets the borrowed cluster's own forecast beside the runs. It also sets the runs' R_N
    beside the theory's break-even f/(N-1).
    """
    record = wind_tunnel_record(study[BASELINE].folder.parent)
    rows = []
    for variant, experiment in variant_experiments(study).items():
        table, models = scaling_table(experiment), record[variant].models if variant in record else None
        cluster, one = (CONFIGURATIONS[models] if models else None), experiment.baseline
        rate = experiment.all_runs[-1].raw["network"]["link_rate_gbit_s"]
        for n in [n for n in table.index if n > 1]:
            row = table.loc[n]
            choice = link_choice(record, variant, n)
            cluster_low, cluster_high = (
                cluster.speedup_range(one.model, one.global_batch_size, n) if cluster else (np.nan, np.nan)
            )
            point, borrowed = point_label(experiment, n), borrowed_from(experiment)
            rows.append(
                dict(
                    variant=variant,
                    configuration=link_label(experiment),
                    point=point,  # the ratio its links were set for, else their rate, at this number of nodes
                    borrowed=borrowed,
                    setting=f"links set to {point}" if borrowed else f"{point} links",  # "links set to ratio 2.6"
                    share=node_share(experiment),
                    nodes=n,
                    modelled_batch=cluster.batch(one.global_batch_size) if cluster else np.nan,
                    cluster_low=cluster_low,  # the borrowed cluster's own forecast, `Configuration.speedup_range`
                    cluster_high=cluster_high,
                    # R_N^bench: the configuration's target, from published figures or the measured GPU, and what the
                    # wind tunnel reached here before the runs. Both are empty for links set by a rate.
                    target_ratio=choice.target_ratio if choice else np.nan,
                    achieved_ratio=choice.achieved_ratio if choice else np.nan,
                    link_mbit_s=rate_bits_per_s(choice.link_rate) / 1e6 if choice else rate * 1e3 if rate else np.nan,
                    **row[["speedup", "efficiency", "speedup_low", "speedup_high"]],
                    efficiency_low=row["speedup_low"] / n,
                    efficiency_high=row["speedup_high"] / n,
                    verdict=row["verdict"],
                    floor=row["noise_floor"],
                    runs_ratio=row["compute_to_comm_ratio"],
                    exposed_share=row["exposed_share"],
                    break_even=row["exposed_share"] / (n - 1),
                )
            )
    return pd.DataFrame(rows)


def efficiency_table(study: dict[str, Experiment]) -> pd.DataFrame:
    """Per variant and number of nodes: the measured parallel efficiency against the theory's, at x = R_N / f.

    The theory's curve holds whatever the CPU, the link or the configuration modelled.
    """
    # x is the runs' own R_N over the share of the all-reduce they left exposed. The theory's step is T_c/N + f T_comm,
    # so its efficiency is x / (1 + x).
    experiments = variant_experiments(study)
    points = pd.concat(
        {variant: scaling_table(e).query("index > 1") for variant, e in experiments.items()}, names=["variant", "nodes"]
    ).reset_index()
    x, nodes = points["compute_to_comm_ratio"] / points["exposed_share"], points["nodes"]
    # The theory's step is a mean over the steady epochs, so these are too: one node's mean step over N times the
    # N nodes', round by round. The speedups' median step leaves out each epoch's slower first steps, and would put
    # points above the curve.
    steps = {variant: paired_sides(e, "mean_step_s") for variant, e in experiments.items()}
    rounds = [
        [one / (n * step) for one, step in zip(steps[v][1], steps[v][n])] for v, n in zip(points["variant"], nodes)
    ]
    table = pd.DataFrame(
        {
            "configuration": [variant_label(experiments[v], study) for v in points["variant"]],
            "nodes": nodes,
            "ratio_over_exposed": x,
            "efficiency": [np.median(r) for r in rounds],
            "efficiency_low": [min(r) for r in rounds],
            "efficiency_high": [max(r) for r in rounds],
            "theory_efficiency": x / (1 + x),
        }
    )
    return table.assign(of_theory=table["efficiency"] / table["theory_efficiency"])


@dataclass(frozen=True)
class Curve:
    """How far the points reach the theory's curve: the measured efficiency over the curve's at the same x."""

    points: int
    reached: float  # the median over the points; below 1 is under the curve
    reached_range: str


def curve(study: dict[str, Experiment]) -> Curve:
    """`Curve` of `efficiency_table`'s points."""
    reached = efficiency_table(study)["of_theory"]
    return Curve(len(reached), reached.median(), f"{reached.min():.0%} to {reached.max():.0%}")


@dataclass(frozen=True)
class Tunnel:
    """How the wind tunnel set the links on this machine, for the methods the nodes page states."""

    compute_ms: float  # one node's compute per step
    runs_counted: int  # the one-node runs it set the links by
    runs_range: str
    set_aside: str  # each with why, or "none"
    out_of_line: float  # the bar a run's compute had to keep to
    quiet: str
    compute_range: str  # the study's own one-node runs'
    cpu: str
    cpu_extensions: str
    tolerance: float  # every target was held to it
    sources: str  # where the configurations' ratios come from; "none" where no variant models one


def tunnel(study: dict[str, Experiment]) -> Tunnel:
    """`Tunnel` from wind_tunnel.json at the one node's share, or the study's own one-node runs where it has none."""
    record, one = read_wind_tunnel(study[BASELINE].folder.parent), study[BASELINE].baseline.raw
    calibrated = record.shares.get(node_share(study[BASELINE])) if record else None
    modelled = {m.configuration: CONFIGURATIONS[m.models].source for m in (record.variants if record else {}).values()}
    repeats = steady_phases(study[BASELINE].metrics).groupby("run")["compute_per_step_s"].mean() * 1e3
    runs = calibrated.one_node_runs if calibrated else []
    kept = [run.compute_per_step_s * 1e3 for run in runs if not run.set_aside]
    return Tunnel(
        compute_ms=calibrated.compute_per_step_s * 1e3 if calibrated else repeats.median(),
        runs_counted=len(kept),
        runs_range=f"{min(kept, default=np.nan):,.0f} to {max(kept, default=np.nan):,.0f}",
        set_aside=", ".join(
            f"{run.run} ({run.set_aside}, {run.compute_per_step_s * 1e3:,.0f} ms)" for run in runs if run.set_aside
        )
        or "none",
        out_of_line=calibrated.out_of_line if calibrated else np.nan,
        quiet="quiet" if not calibrated or calibrated.quiet else "busy",
        compute_range=f"{repeats.min():,.0f} to {repeats.max():,.0f}",
        cpu=one["device_name"],
        cpu_extensions=", ".join(one.get("cpu_extensions") or ["none recorded"]),
        tolerance=record.tolerance if record else np.nan,
        sources="; ".join(f"{name}: {source}" for name, source in modelled.items()) or "none",
    )


def nodes_figure(study: dict[str, Experiment]):
    """Two panels against the number of nodes: the speedup per link, and a step's compute and exposed all-reduce.

    Each sits beside its ideal and the forecast. One legend below both gives the links by colour, then the line styles.
    """
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
        speed.errorbar([1, *rows["world_size"]], [1, *rows["speedup"]], yerr=error, fmt="o-", capsize=3, color=f"C{i}")
        ahead = rows["forecast_speedup"].fillna(rows["predicted_speedup"])  # the forecast, else the cost model's
        speed.plot(rows["world_size"], ahead, "s--", color=f"C{i}", alpha=0.6)
        parts.plot(
            rows["world_size"], rows["compute_per_step_s"] * 1e3, "^-", color=f"C{i}", alpha=0.6, markersize=8 - 2 * i
        )
        parts.plot(rows["world_size"], rows["comm_exposed_per_step_s"] * 1e3, "x--", color=f"C{i}", markersize=8)
        colours.append(Line2D([], [], color=f"C{i}", linewidth=6, label=link))
    main, record = link_experiments(study), wind_tunnel_record(study[BASELINE].folder.parent)
    for i, (variant, e) in enumerate(
        ((v, e) for v, e in variant_experiments(study).items() if v not in main), len(colours)
    ):  # the similarity test's nodes: their speedup, over their one node
        curve = scaling_table(e).query("index > 1")
        error = [[0, *(curve["speedup"] - curve["speedup_low"])], [0, *(curve["speedup_high"] - curve["speedup"])]]
        speed.errorbar([1, *curve.index], [1, *curve["speedup"]], yerr=error, fmt="D-", capsize=3, color=f"C{i}")
        ahead = record[variant].by_nodes if variant in record else {}
        speed.plot(
            list(ahead),
            [forecast(choice)["speedup"] for choice in ahead.values()],
            "s--",
            color=f"C{i}",
            alpha=0.6,
        )
        colours.append(Line2D([], [], color=f"C{i}", linewidth=6, label=f"{variant_label(e, study)} (left only)"))
    ahead_label = "speedup forecast before the runs" if table["forecast_speedup"].notna().all() else "speedup predicted"
    styles = [
        Line2D([], [], color="black", marker="o", label="speedup measured (bar: range of the repeats)"),
        Line2D([], [], color="black", marker="s", linestyle="--", alpha=0.6, label=ahead_label),
        Line2D([], [], color="gray", linestyle=":", label="ideal: N; one node's compute / N"),
        Line2D([], [], color="black", marker="^", alpha=0.6, label="compute per step"),
        Line2D([], [], color="black", marker="x", linestyle="--", label="exposed all-reduce per step"),
    ]
    speed.set(xscale="log", yscale="log", xlabel="nodes", ylabel="speedup over one node", title="Speedup against nodes")
    speed_ticks = [0.5, *nodes] if speed.get_ylim()[0] < 1 else nodes
    parts.set(
        xscale="log",
        yscale="log",
        xlabel="nodes",
        ylabel="ms per step (mean, steady epochs)",
        title="Compute and exposed all-reduce per step",
    )
    nice = [m * 10**e for e in range(-1, 5) for m in (1, 2, 5)]  # ms: down to the next of these, a tick at each
    low, high = parts.get_ylim()
    low = max([t for t in nice if t <= low], default=low)
    parts.set_ylim(low, high)
    for ax, ticks in ((speed, speed_ticks), (parts, [t for t in nice if low <= t <= high])):
        ax.set_xticks(nodes, [str(n) for n in nodes])
        ax.minorticks_off()
        ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    fig.legend(
        handles=colours,
        title="links",
        loc="lower left",
        bbox_to_anchor=(0.04, 0),
        fontsize=9,
        title_fontsize=9,
        frameon=False,
    )
    fig.legend(handles=styles, loc="lower left", bbox_to_anchor=(0.5, 0), fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.22, 1, 1))
    return fig
