"""When the model stops fitting: ZeRO-1, 2 and 3 against DDP on the same emulated nodes.

- memory a rank holds: counted from its tensors, against ZeRO's formula
- bytes each node's link sent a step: against the formula and gloo's collectives
- time per sample: by the one verdict function, over one node too

It reads the nodes study's sharded variants, with the DDP and one-node runs they share links and nodes with
(`zero.sharding_runs`)."""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ddp_core.analysis.comparisons import Judged, compare_times, judged_times, steady_phases, study_floor_power
from ddp_core.analysis.emulated import node_share, one_node_drift
from ddp_core.analysis.provenance import StudySetup, study_setup
from ddp_core.analysis.results import Experiment, last_epochs
from ddp_core.analysis.tables import MEAN_STEP_MS, difference_text, quantity_table, range_text
from ddp_core.analysis.zero import (
    MODE_NAMES,
    SHARDED_MODES,
    Headline,
    block_parameters,
    collective_kind,
    counted_collectives,
    gloo_sends,
    headline,
    held_shares,
    memory_table,
    model_size,
    modes,
    node_counts,
    one_node,
    speedup_table,
    time_comparisons,
)
from ddp_core.engine.model_cost import parameter_counts

KIND_NAMES = {
    "parameters_bytes": "parameters",
    "gradients_bytes": "gradients",
    "optimizer_state_bytes": "optimizer state",
}
# Gradient bytes (4Ψ) a node sends a step, over (N-1)/N, by ZeRO's formula (Rajbhandari et al., section 7: DDP an
# all-reduce, 2; ZeRO-1 and 2 a reduce-scatter and a gather, 2; ZeRO-3 a reduce-scatter and two gathers, 3); what
# PyTorch's collectives on gloo send is counted (`counted_collectives`, `gloo_sends`).
COLLECTIVE_KINDS = {
    "allreduce": "all-reduce",
    "broadcast": "broadcast",
    "allgather": "all-gather",
    "reduce_scatter": "reduce-scatter",
}  # each kind of `collective_kind`, as a reader names it
FORMULA_UNITS = {"none": 2, "zero1": 2, "zero2": 2, "zero3": 3}
DEVICE_BYTES = 80e9  # an 80 GB GPU, the largest model each mode fits in it
MB = 1e6


MEMORY_COLUMNS = {
    f"{kind}_{side}": (f"{name.capitalize()}, {side} (MB)", "{:.1f}", 1 / MB)
    for kind, name in KIND_NAMES.items()
    for side in ("measured", "formula")
} | {
    "gradients_kept_bytes_measured": ("Gradients kept between steps, measured (MB)", "{:.1f}", 1 / MB),
    "per_parameter_measured": ("Bytes a parameter, measured", "{:.1f}"),
    "per_parameter_formula": ("Bytes a parameter, formula", "{:.1f}"),
}


def memory_markdown(study: dict[str, Experiment]) -> str:
    return quantity_table(memory_table(study), MEMORY_COLUMNS, "Mode", turned=True)


def memory_figure(study: dict[str, Experiment]):
    """Per mode, what a rank holds by kind, measured (stacked bars) and by the formula (a line over each bar)."""
    table = memory_table(study)
    fig, ax = plt.subplots(figsize=(7, 3.4))
    x, bottom = np.arange(len(table)), np.zeros(len(table))
    for k, (kind, name) in enumerate(KIND_NAMES.items()):
        heights = table[f"{kind}_measured"].to_numpy() / MB
        ax.bar(x, heights, bottom=bottom, color=f"C{k}", label=f"{name}, measured")
        bottom += heights
    formula = sum(table[f"{kind}_formula"] for kind in KIND_NAMES).to_numpy() / MB
    ax.hlines(formula, x - 0.4, x + 0.4, colors="black", linestyles="dashed", label="formula, all kinds")
    ax.set(
        xticks=x,
        xticklabels=table.index,
        ylabel="MB a rank holds",
        title=f"Training state of the largest rank, {int(table['ranks'].iloc[0])} nodes",
    )
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return fig


def traffic_table(study: dict[str, Experiment]) -> pd.DataFrame:
    """Per mode on the most nodes, the bytes a node's link sent per optimizer step, beside ZeRO's formula and gloo's
    algorithms. Also how unevenly the nodes sent."""
    rows = {}
    for mode, e in modes(study, max(node_counts(study))).items():
        gradient = 4 * model_size(e)[0]  # the fp32 gradient (4Ψ), the table's unit beside MB
        # each run's bytes over its steps alone, a mean over its nodes; the median over the runs
        per_run = e.metrics.groupby("run")[["link_sent_bytes", "steps"]].sum()
        per_step = float((per_run["link_sent_bytes"] / per_run["steps"]).median())
        # the busiest link's bytes over the nodes' mean, whole run: evaluations and checkpoints included
        busiest = [max(sent) / np.mean(sent) for sent in (run.raw["network"]["sent_bytes"] for run in e.all_runs)]
        # the collectives a step handed to gloo, counted on the first repeat's third step, by kind
        n, counted = e.largest, counted_collectives(e.baseline)
        handed = {
            f"handed_{kind}": sum(entry["bytes"] for name, entry in counted.items() if collective_kind(name) == kind)
            / gradient
            for kind in COLLECTIVE_KINDS
        }
        rows[MODE_NAMES[mode]] = {
            "formula_units": FORMULA_UNITS[mode] * (n - 1) / n,
            **handed,
            "gloo_units": gloo_sends(counted, n) / gradient,
            "sent_units": per_step / gradient,
            "sent_mb": per_step / MB,
            "busiest_over_mean": float(np.median(busiest)),
        }
    return pd.DataFrame(rows).T.assign(over_gloo=lambda table: table["sent_units"] / table["gloo_units"])


TRAFFIC_COLUMNS = {
    "formula_units": ("ZeRO's formula (fp32 gradients a step)", "{:.2f}"),
    **{
        f"handed_{kind}": (f"Whole size handed to {name}s, counted (fp32 gradients a step)", "{:.2f}")
        for kind, name in COLLECTIVE_KINDS.items()
    },
    "gloo_units": ("Sent for them by gloo's algorithms (fp32 gradients a step)", "{:.2f}"),
    "sent_units": ("Sent, mean of the links (fp32 gradients a step)", "{:.3f}"),
    "sent_mb": ("Sent, mean of the links (MB a step)", "{:.1f}"),
    "over_gloo": ("Sent over gloo's algorithms (ratio)", "{:.3f}"),
    "busiest_over_mean": ("Busiest link over the mean (ratio, whole run)", "{:.2f}"),
}


def traffic_markdown(study: dict[str, Experiment]) -> str:
    return quantity_table(traffic_table(study), TRAFFIC_COLUMNS, turned=True)


def fits_table(study: dict[str, Experiment]) -> pd.DataFrame:
    """Per mode, the bytes a parameter costs a rank, measured on this model and by ZeRO's formula. Also the largest
    model whose training state fits in DEVICE_BYTES at each, activations apart."""
    table = memory_table(study)
    return pd.DataFrame(
        {
            "per_parameter": table["per_parameter_measured"],
            "largest_billions": DEVICE_BYTES / table["per_parameter_measured"] / 1e9,
            "per_parameter_formula": table["per_parameter_formula"],  # a model whose state divides evenly
            "largest_billions_formula": DEVICE_BYTES / table["per_parameter_formula"] / 1e9,
        }
    )


def fits_markdown(study: dict[str, Experiment]) -> str:
    nodes, device = modes(study)["none"].largest, f"{DEVICE_BYTES / 1e9:.0f} GB"
    return quantity_table(
        fits_table(study),
        {
            "per_parameter": ("Bytes a parameter, this model", "{:.1f}"),
            "largest_billions": (f"Largest model in {device}, shaped like this one (billions of parameters)", "{:.1f}"),
            "per_parameter_formula": ("Bytes a parameter, formula", "{:.1f}"),
            "largest_billions_formula": (
                f"Largest model in {device}, by the formula (billions of parameters)",
                "{:.1f}",
            ),
        },
        f"Mode, {nodes} nodes",
    )


def phase_table(study: dict[str, Experiment]) -> pd.DataFrame:
    """Per mode on the most nodes, the mean step's forward, backward and optimizer step in ms. Under FSDP2, forward
    and backward include the gathers and reductions they wait for."""
    rows = {}
    for mode, e in modes(study, max(node_counts(study))).items():
        steady = steady_phases(e.metrics)  # means over the steady epochs of every repeat
        rows[MODE_NAMES[mode]] = {
            phase: (steady[f"{phase}_time_s"] / steady["steps"]).mean() * 1e3
            for phase in ("forward", "backward", "optimizer")
        } | {"step": steady["mean_step_s"].mean() * 1e3}
    return pd.DataFrame(rows).T


def phase_markdown(study: dict[str, Experiment]) -> str:
    return quantity_table(
        phase_table(study),
        {
            "step": (MEAN_STEP_MS, "{:.0f}"),
            "forward": ("Forward (ms)", "{:.0f}"),
            "backward": ("Backward (ms)", "{:.0f}"),
            "optimizer": ("Optimizer step (ms)", "{:.0f}"),
        },
        f"Mode, {max(node_counts(study))} nodes",
    )


def speedup_markdown(study: dict[str, Experiment]) -> str:
    """Turned, a column per mode: on each number of nodes its speedup with the repeats' range, efficiency and
    verdict. One noise floor per mode covers its rounds' one node and its runs on every number of nodes."""
    table, counts = speedup_table(study), node_counts(study)
    quantities = {}
    for n in counts:
        table[f"range_n{n}"] = list(map(range_text, table[f"speedup_low_n{n}"], table[f"speedup_high_n{n}"]))
        quantities |= {
            f"speedup_n{n}": (f"Speedup over one node, {n} nodes", "{:.2f}"),
            f"range_n{n}": (f"Range of the repeats, {n} nodes", "{}"),
            f"efficiency_n{n}": (f"Efficiency (speedup over the nodes), {n} nodes", "{:.0%}"),
            f"verdict_n{n}": (f"Verdict, {n} nodes", "{}"),
        }
    floor = {f"noise_floor_n{counts[-1]}": ("Noise floor (every number of nodes and the one node)", "{:.1%}")}
    return quantity_table(table, quantities | floor, turned=True)


def time_markdown(study: dict[str, Experiment]) -> str:
    """Turned, a column per sharded mode: its time per sample over DDP's on each number of nodes. Each is the median
    of the rounds' ratios, with their range and the verdict (`time_comparisons`)."""
    rows, quantities = {MODE_NAMES[mode]: {} for mode in SHARDED_MODES}, {}
    for n, comparisons in time_comparisons(study).items():
        for mode, c in comparisons.items():
            rows[MODE_NAMES[mode]] |= {
                f"ratio_n{n}": c.ratio,
                f"range_n{n}": range_text(c.low, c.high),
                f"verdict_n{n}": c.says("faster", "slower"),
            }
        quantities |= {
            f"ratio_n{n}": (f"Time per sample over DDP's, {n} nodes", "{:.2f}"),
            f"range_n{n}": (f"Range of the repeats, {n} nodes", "{}"),
            f"verdict_n{n}": (f"Verdict, {n} nodes", "{}"),
        }
    return quantity_table(pd.DataFrame(rows).T, quantities, turned=True)


def loss_gap(study: dict[str, Experiment]) -> float:
    """The largest gap of a sharded mode's final training losses to DDP's, repeat by repeat. It shows how far from
    DDP's computation the modes' models lie."""
    losses = {mode: last_epochs(e.metrics)["train_loss"].to_numpy() for mode, e in modes(study).items()}
    return max(float(np.max(np.abs(losses[mode] - losses["none"]))) for mode in SHARDED_MODES)


@dataclass(frozen=True)
class AgainstDdp:
    """A sharded mode's training state a rank, its links' bytes a step and the largest model it fits, each over
    DDP's."""

    held_share: float
    traffic_ratio: float
    fits_ratio: float


@dataclass(frozen=True)
class Findings:
    """What the sharding page quotes."""

    sharding: Headline
    sharding_fewer_nodes: int
    sharding_parameters_m: float
    sharding_ddp_mb: float
    sharding_gradient_mb: float
    one_node_apart: float
    sharding_time_floor: float
    sharding_found_10: float
    sharding_found_20: float
    zero1: AgainstDdp
    zero2: AgainstDdp
    zero3: AgainstDdp
    zero1_against_zero2_time: Judged
    zero1_against_zero2_time_fewer: Judged
    sharded_slower: int
    sharded_slower_fewer: int
    sharding_zero3_time_fewer: Judged
    sharding_ddp_speedup_fewer: float
    sharding_zero3_speedup_fewer: float
    traffic_over_gloo: str
    largest_tensor_share: float
    root_share: float
    block_share: float
    root_gradient_mb: float
    zero1_optimizer_share: float
    zero1_busiest_over_mean: float
    ddp_busiest_over_mean: float
    zero1_optimizer_ms: float
    ddp_optimizer_ms: float
    ddp_forward_ms: float
    zero3_forward_ms: float
    sharding_loss_gap_text: str
    sharding_cpus_per_node: int
    sharding_steps: int
    ddp_rss_mb: float
    zero3_rss_mb: float
    state_share_of_rss: float
    setup: StudySetup


def findings(study: dict[str, Experiment]) -> Findings:
    """The key findings on the most nodes (`headline`), the model, and each mode's memory, traffic, speedup and time
    against DDP's. Speedup and time are on the fewer nodes too, and ZeRO-1 meets ZeRO-2 on the same floor."""
    by_mode = modes(study)
    ddp, counts = by_mode["none"], node_counts(study)
    fewer, n = counts[0], counts[-1]
    parameters, _ = model_size(ddp)
    memory, traffic, fits = memory_table(study), traffic_table(study), fits_table(study)
    held, against_ddp, speedups = held_shares(memory), time_comparisons(study), speedup_table(study)
    floor = against_ddp[n]["zero1"].floor
    power = study_floor_power(study)
    sharded = {
        mode: AgainstDdp(
            held_share=held.loc[MODE_NAMES[mode], "measured"],
            traffic_ratio=traffic.loc[MODE_NAMES[mode], "sent_units"] / traffic.loc["DDP", "sent_units"],
            fits_ratio=fits.loc[MODE_NAMES[mode], "largest_billions"] / fits.loc["DDP", "largest_billions"],
        )
        for mode in SHARDED_MODES
    }
    zero1_against_zero2, slower = {}, {}
    for nodes in (n, fewer):
        zero1_against_zero2[nodes] = judged_times(
            compare_times(by_mode["zero1"], by_mode["zero2"], nodes, nodes, floor=floor)
        )
        slower[nodes] = sum(against_ddp[nodes][mode].verdict == "higher" for mode in SHARDED_MODES)
    phases = phase_table(study)
    last = {mode: last_epochs(e.metrics) for mode, e in by_mode.items()}
    rss = {mode: float(table.loc[table["world_size"] == n, "peak_memory_mb"].median()) for mode, table in last.items()}
    tensors = parameter_counts(ddp.baseline.model)
    block_share = sum(block_parameters(tensors).values()) / parameters
    ddp_mb = sum(memory.loc["DDP", f"{kind}_measured"] for kind in KIND_NAMES) / MB
    return Findings(
        sharding=headline(study),
        sharding_fewer_nodes=fewer,
        sharding_parameters_m=parameters / 1e6,
        sharding_ddp_mb=ddp_mb,
        sharding_gradient_mb=4 * parameters / MB,
        one_node_apart=one_node_drift(study)[node_share(one_node(study))],
        sharding_time_floor=floor,
        sharding_found_10=power["found_10"],
        sharding_found_20=power["found_20"],
        zero1=sharded["zero1"],
        zero2=sharded["zero2"],
        zero3=sharded["zero3"],
        zero1_against_zero2_time=zero1_against_zero2[n],
        zero1_against_zero2_time_fewer=zero1_against_zero2[fewer],
        sharded_slower=slower[n],
        sharded_slower_fewer=slower[fewer],
        # on the most nodes, `headline` gives these
        sharding_zero3_time_fewer=judged_times(against_ddp[fewer]["zero3"]),
        sharding_ddp_speedup_fewer=speedups.loc["DDP", f"speedup_n{fewer}"],
        sharding_zero3_speedup_fewer=speedups.loc[MODE_NAMES["zero3"], f"speedup_n{fewer}"],
        traffic_over_gloo=range_text(traffic["over_gloo"].min(), traffic["over_gloo"].max(), "{:.3f}", " to "),
        largest_tensor_share=max(tensors.values()) / parameters,
        root_share=1 - block_share,
        block_share=block_share,
        root_gradient_mb=4 * parameters * (1 - block_share) / MB,
        zero1_optimizer_share=memory.loc[MODE_NAMES["zero1"], "optimizer_state_bytes_measured"]
        / memory.loc["DDP", "optimizer_state_bytes_measured"],
        zero1_busiest_over_mean=traffic.loc[MODE_NAMES["zero1"], "busiest_over_mean"],
        ddp_busiest_over_mean=traffic.loc["DDP", "busiest_over_mean"],
        zero1_optimizer_ms=phases.loc[MODE_NAMES["zero1"], "optimizer"],
        ddp_optimizer_ms=phases.loc["DDP", "optimizer"],
        ddp_forward_ms=phases.loc["DDP", "forward"],
        zero3_forward_ms=phases.loc[MODE_NAMES["zero3"], "forward"],
        sharding_loss_gap_text=difference_text(loss_gap(study)),
        sharding_cpus_per_node=ddp.baseline.raw["network"]["cpus_per_node"],
        sharding_steps=int(ddp.metrics.groupby("run")["steps"].sum().median()),
        ddp_rss_mb=rss["none"],
        zero3_rss_mb=rss["zero3"],
        state_share_of_rss=ddp_mb * MB / 2**20 / rss["none"],
        setup=study_setup(*study.values()),
    )
