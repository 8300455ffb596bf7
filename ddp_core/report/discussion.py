"""The discussion: where the time went, and when DDP pays off, from the runs and the cost model (`analysis.payoff`,
which the introduction quotes too)."""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ddp_core.engine.model_cost import preset_configs
from ddp_core.analysis.emulated import BASELINE, Headline, headline
from ddp_core.analysis.cost_model import rank_compute_s
from ddp_core.analysis.provenance import Whose, origin, runs_shown
from ddp_core.analysis.results import Experiment
from ddp_core.analysis.tables import markdown_table
from ddp_core.analysis.verdict import Comparison, compare, noise_floor
from ddp_core.analysis.comparisons import Judged, judged_times, paired_sides
from ddp_core.analysis.speedups import largest, scaling_table
from ddp_core.analysis.payoff import CPU, GPU, Payoff, benchmarked, payoff, ratio_per_token


@dataclass(frozen=True)
class Findings:
    """What the discussion quotes: the results chapter's runs at the most ranks, and where their time beyond T1/N
    went. Also the theory's verdict on them (`payoff`), and the emulated nodes beside them."""

    largest: int
    placement: str
    dropout: float
    threads_1: str
    threads_nmax: str
    speedup_nmax: Judged
    accuracy_nmax: Judged
    efficiency_nmax: float
    step_1_ms: float
    step_nmax_ms: float
    ideal_step_ms: float
    lost_ms: float
    lost_compute_ms: float
    lost_comm_ms: float
    lost_other_ms: float
    main_cause: str
    compute_inflation: float
    hidden_share: float
    divided_compute_ms: float
    compute_nmax_ms: float
    divided: Judged  # the compute measured at the most ranks against one rank's divided by the cores a rank got
    payoff: Payoff
    runs: Whose
    nodes: Headline
    nodes_whose: str


def findings(experiment: Experiment, nodes: dict[str, Experiment]) -> Findings:
    """Whether DDP pays, and where each step's time beyond T1/N went at the largest world size."""
    table = scaling_table(experiment)
    most = experiment.largest
    one, big = table.loc[1], table.loc[most]
    # Lost: compute that did not shrink as 1/N, exposed communication, and what the timed phases leave out.
    # All are means over the same steady epochs, so the parts add up.
    lost = big["mean_step_s"] - one["mean_step_s"] / most
    lost_compute = big["compute_per_step_s"] - one["compute_per_step_s"] / most
    lost_comm = big["comm_exposed_per_step_s"]
    shared = largest(experiment)
    return Findings(
        largest=most,
        placement=shared.placement,
        dropout=shared.dropout,
        threads_1=shared.threads_1,
        threads_nmax=shared.threads_nmax,
        speedup_nmax=shared.speedup_nmax,
        accuracy_nmax=shared.accuracy_nmax,
        efficiency_nmax=float(big["efficiency"]),
        step_1_ms=float(one["mean_step_s"] * 1e3),
        step_nmax_ms=float(big["mean_step_s"] * 1e3),
        ideal_step_ms=float(one["mean_step_s"] / most * 1e3),
        lost_ms=float(lost * 1e3),
        lost_compute_ms=float(lost_compute * 1e3),
        lost_comm_ms=float(lost_comm * 1e3),
        lost_other_ms=float((lost - lost_compute - lost_comm) * 1e3),
        main_cause="computation that did not shrink to one N-th"
        if lost_compute > lost_comm
        else "exposed communication",
        compute_inflation=float(big["compute_per_step_s"] / (one["compute_per_step_s"] / most)),
        hidden_share=float(1 - big["exposed_share"]),
        divided_compute_ms=float(
            rank_compute_s(one["compute_per_step_s"], experiment.runs[1], experiment.runs[most]) * 1e3
        ),
        compute_nmax_ms=float(big["compute_per_step_s"] * 1e3),
        divided=judged_times(_divided_comparison(experiment, most)),
        payoff=payoff(experiment),
        runs=runs_shown(experiment),
        nodes=headline(nodes),
        nodes_whose=origin(nodes[BASELINE].folder),
    )


def _divided_comparison(experiment: Experiment, n: int) -> Comparison:
    """Each repeat's compute per step at `n` ranks against its round's 1-rank compute, divided by the cores a rank
    got. The one verdict function judges them."""
    compute = paired_sides(experiment, "compute_per_step_s")
    one, run = experiment.runs[1], experiment.runs[n]
    divided = [rank_compute_s(c, one, run) for c in compute[1]]
    return compare(compute[n][: len(divided)], divided[: len(compute[n])], noise_floor(list(compute.values())))


def _targets(experiment: Experiment) -> dict[str, float]:
    n, _ = benchmarked(experiment)
    return {"break even, no overlap": 1 / (n - 1), "90% efficiency, no overlap": 9.0}


def ratio_figure(experiment: Experiment):
    """R_N against tokens per rank, a line per preset, with the two targets. One panel is ranks like the results
    chapter's, the other A100s."""
    n, _ = benchmarked(experiment)
    ratios = ratio_per_token(experiment)
    presets = list(preset_configs(experiment.baseline.model))
    tokens = np.logspace(np.log10(64), np.log10(2**20), 40)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4), sharey=True)
    for ax, (name, title) in zip(
        axes, [(CPU, f"Ranks like the results chapter's, N={n}"), (GPU, f"A100 + NVLink, N={n} (prediction)")]
    ):
        for preset in presets:
            ax.loglog(tokens, ratios[name, preset] * tokens, label=preset)
        for (target, value), style in zip(_targets(experiment).items(), ["--", ":"]):
            ax.axhline(value, color="k", linestyle=style, linewidth=1, label=target)
        ax.axvline(experiment.runs[n].tokens_per_rank, color="gray", linewidth=1, label="these runs")
        ax.set(xlabel="tokens per rank per step (b T)", title=title)
    measured = scaling_table(experiment).loc[n, "compute_to_comm_ratio"]
    axes[0].plot(experiment.runs[n].tokens_per_rank, measured, "k*", markersize=10, label="these runs, measured")
    axes[0].set_ylabel("$R_N = (T_c/N)/T_\\mathrm{comm}$")
    # one legend below both panels, off the curves
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig


def tokens_needed_markdown(experiment: Experiment) -> str:
    """Tokens per rank per step that each preset needs on each kind of rank to reach each target (Markdown)."""
    ratios = ratio_per_token(experiment)
    presets = list(preset_configs(experiment.baseline.model))
    needed = pd.DataFrame(
        {
            preset: {
                f"{name}: {target}": value / ratios[name, preset]
                for name in (CPU, GPU)
                for target, value in _targets(experiment).items()
            }
            for preset in presets
        }
    )
    return markdown_table(needed.map("{:,.0f}".format), "")
