"""The page on time to accuracy, over the runs and the critical batch size of `ddp_core.analysis.critical_batch`.
It shows the learning-rate neighbours, the steps figure, the time to the target over ranks, and the per-batch table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from ddp_core.analysis.provenance import StudySetup, study_setup
from ddp_core.analysis.results import Experiment
from ddp_core.analysis.tables import median_range, quantity_table
from ddp_core.analysis.verdict import compare, noise_floor
from ddp_core.analysis.critical_batch import (
    CriticalBatchStudy,
    critical_batch_study,
    follows_rule,
    per_batch,
    rule_fit,
    runs_table,
)


def lr_neighbours(variants: dict[str, Experiment]) -> pd.DataFrame:
    """At the batch size whose learning rate was also tried at other values: a row per rate, with its steps to the
    target. The report's verdict holds the rule's rate against each, on a floor from the rates' own repeats."""
    table = runs_table(variants)
    batch = table.loc[~follows_rule(table), "batch"].iloc[0]
    runs = table[table["batch"] == batch]
    # a row per seed, a column per rate; steps NaN: missed the target, or did not run
    wide = runs.pivot(index="seed", columns="lr", values=["steps", "batch", "last_step"])
    steps, ran, last = wide["steps"], wide["batch"].notna(), wide["last_step"]
    rule_lr = runs.loc[follows_rule(table)[runs.index], "lr"].iloc[0]
    floor = noise_floor([steps.loc[ran[lr], lr].tolist() for lr in steps.columns])
    rows = []
    for lr in steps.columns:
        mine = steps.loc[ran[lr], lr]
        missed = last.loc[ran[lr] & steps[lr].isna(), lr]
        row = {
            "lr": lr,
            "times_rule": lr / rule_lr,
            "steps": mine.median(),
            "steps_low": mine.min(),
            "steps_high": mine.max(),
            "reached": int(mine.notna().sum()),
            "runs": len(mine),
            "missed_by": missed.max(),
            "ratio": math.nan,
            "outcome": "–",
        }
        if lr != rule_lr:
            both = ran[lr] & ran[rule_lr]
            rule_steps, their_steps = steps.loc[both, rule_lr], steps.loc[both, lr]
            if rule_steps.isna().any():
                row["outcome"] = "not known: the rule's runs missed the target"
            else:
                # The rule's steps over these, repeat by repeat: one seed per repeat on both sides.
                # A miss counts at its last evaluated step, so the ratio is an upper bound.
                # It can still show that the rule's rate takes fewer steps, and nothing else.
                c = compare(rule_steps.tolist(), their_steps.fillna(last.loc[both, lr]).tolist(), floor)
                row |= {
                    "ratio": c.ratio,
                    "outcome": c.says("fewer steps", "more steps")
                    if their_steps.notna().all()
                    else "fewer steps (a miss counted at its last step)"
                    if c.verdict == "lower"
                    else "not known: this rate missed the target",
                }
        rows.append(row)
    return pd.DataFrame(rows).assign(batch=batch, floor=floor)


def rule_outcome(neighbours: pd.DataFrame) -> str:
    """'held' where no tried neighbour reached the target in fewer steps than the rule's rate, beyond the noise;
    'did not hold' where one did."""
    return "did not hold" if (neighbours["outcome"] == "more steps").any() else "held"


@dataclass(frozen=True)
class Findings:
    """What the time-to-accuracy page quotes."""

    tta: CriticalBatchStudy
    tta_rule_outcome: str
    tta_neighbours_batch: int
    tta_neighbours_floor: float
    setup: StudySetup


def findings(variants: dict[str, Experiment]) -> Findings:
    """The critical batch the study found, and whether the learning-rate rule held at the neighbours' batch."""
    neighbours = lr_neighbours(variants)
    return Findings(
        tta=critical_batch_study(variants),
        tta_rule_outcome=rule_outcome(neighbours),
        tta_neighbours_batch=int(neighbours["batch"].iloc[0]),
        tta_neighbours_floor=neighbours["floor"].iloc[0],
        setup=study_setup(*variants.values()),
    )


NEIGHBOUR_COLUMNS = {
    "lr": ("Learning rate", "{:g}"),
    "times_rule": ("Times the rule's", "{:g}"),
    "steps_text": ("Steps to the target of the runs that reached it, median (range)", "{}"),
    "reached_text": ("Reached it", "{}"),
    "ratio": ("The rule's steps over these, median", "{:.2f}"),
    "outcome": ("The rule's rate against this one, in steps to the target", "{}"),
}


def _steps_text(rows: pd.DataFrame) -> list[str]:
    """Each row's steps to the target, median (range), the median alone where the repeats agree (`median_range`),
    "–" where none reached it."""
    return [
        "–" if not np.isfinite(median) else median_range(median, low, high, "{:.0f}", " to ")
        for median, low, high in zip(rows["steps"], rows["steps_low"], rows["steps_high"])
    ]


def lr_neighbours_markdown(variants: dict[str, Experiment]) -> str:
    rows = lr_neighbours(variants)
    rows = rows.assign(
        steps_text=_steps_text(rows),
        reached_text=[
            f"{r} of {n}" + (f" (missed: still short at step {m:.0f})" if m == m else "")
            for r, n, m in zip(rows["reached"], rows["runs"], rows["missed_by"])
        ],
    )
    return quantity_table(rows, NEIGHBOUR_COLUMNS)


def predicted_steps(fit: dict, batch) -> np.ndarray:
    """McCandlish's S = S_min + E_min / B at the fitted S_min and E_min."""
    return fit["s_min"] + fit["e_min"] / np.asarray(batch, float)


def steps_figure(variants: dict[str, Experiment]):
    """The Shallue plot: steps to the target against the global batch on log axes, every run a point. Beside them
    are perfect scaling from the smallest batch, the fit of McCandlish's model with B_crit, and B_simple."""
    table = runs_table(variants)
    rule, fit = rule_fit(table)
    batches = per_batch(table)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot(rule["batch"], rule["steps"], "o", color="C0", alpha=0.6, label="a run (its seed), the rule's rate")
    ax.plot(batches.index, batches["steps"], "-", color="C0", label="median over the repeats")
    for lr, group in table[~follows_rule(table)].groupby("lr"):
        higher = lr > batches.loc[group["batch"].iloc[0], "lr"]
        ax.plot(
            group["batch"],
            group["steps"],
            "^" if higher else "v",
            color="C3" if higher else "C4",
            alpha=0.7,
            label=f"learning rate {lr:g}, {'above' if higher else 'below'} the rule's",
        )
    grid = np.geomspace(batches.index.min(), batches.index.max(), 50)
    smallest = batches.index.min()
    ax.plot(
        grid,
        batches.loc[smallest, "steps"] * smallest / grid,
        ":",
        color="gray",
        label="perfect scaling (steps halve as the batch doubles)",
    )
    if np.isfinite(fit["b_crit"]):
        ax.plot(
            grid,
            predicted_steps(fit, grid),
            "--",
            color="C1",
            label=f"fit: S = S_min + E_min/B, B_crit = {fit['b_crit']:.0f}",
        )
        ax.axvline(fit["b_crit"], color="C1", linewidth=1)
    b_simple = rule["b_simple"]
    ax.axvspan(b_simple.min(), b_simple.max(), color="C2", alpha=0.15)
    ax.axvline(b_simple.mean(), color="C2", linewidth=1, label=f"B_simple, mean {b_simple.mean():.0f} (band: range)")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="global batch size B (samples per step)",
        ylabel="optimizer steps to the target",
    )
    ax.set_xticks(batches.index, [str(b) for b in batches.index])
    ax.minorticks_off()
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


RANKS = 2 ** np.arange(0, 11)  # 1 to 1024 ranks, for the projection


def ring_factor(ranks) -> np.ndarray:
    """The bytes a ring all-reduce moves per rank, in gradients: 2(N - 1)/N (the theory chapter); 0 on one rank."""
    ranks = np.asarray(ranks, float)
    return 2 * (ranks - 1) / ranks


def projected_step(compute_s: float, exposed_s: float, ranks) -> np.ndarray:
    """A step of N ranks projected from one measured on 2. The all-reduce it waited for scales with the bytes a ring
    moves per rank at N against at 2."""
    # the bandwidth term only: the latency term, 2(N - 1) hops, is left out
    return compute_s + exposed_s * ring_factor(ranks) / ring_factor(2)


def time_to_target(table: pd.DataFrame) -> pd.DataFrame:
    """Time to the target on N ranks with per-rank batch b, projected from `runs_table`. It is the fit's steps at
    B = N·b times the step projected from these runs' 2-rank step (`projected_step`)."""
    _, fit = rule_fit(table)
    batches = per_batch(table)
    low, high = batches.index.min(), batches.index.max()
    rows = [
        {
            "per_rank_batch": int(b),
            "ranks": int(n),
            "batch": int(n * b),
            "measured": low <= n * b <= high,  # within the global batches measured; elsewhere the fit extrapolates
            "step_s": projected_step(compute, exposed, n).item(),
            "steps": predicted_steps(fit, n * b).item(),  # NaN where the fit found no bend
        }
        for b, compute, exposed in zip(batches["per_rank_batch"], batches["compute_s"], batches["exposed_s"])
        for n in RANKS
    ]
    return pd.DataFrame(rows).assign(seconds=lambda projection: projection["steps"] * projection["step_s"])


def time_to_target_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per per-rank batch, from `runs_table`: the median step and the measured time to the target. Also the ranks at
    which N·b = B_crit, the projected time there, and the floor the projection approaches as N grows."""
    rule, fit = rule_fit(table)
    # steps to the target times the median step, evaluations left out
    measured = (rule["steps"] * rule["step_s"]).groupby(rule["per_rank_batch"]).median()
    batches = per_batch(table).set_index("per_rank_batch")
    ranks_at_crit = fit["b_crit"] / batches.index.to_numpy(float)
    return pd.DataFrame(
        {
            "step_ms": batches["step_s"] * 1e3,
            "measured_s": measured,
            "ranks_at_crit": ranks_at_crit,
            "seconds_at_crit": predicted_steps(fit, fit["b_crit"]).item()
            * projected_step(batches["compute_s"], batches["exposed_s"], ranks_at_crit),
            # S_min steps of a step whose all-reduce moves twice the gradient
            "floor_s": fit["s_min"] * (batches["compute_s"] + batches["exposed_s"] * 2 / ring_factor(2)),
        },
    ).rename_axis("per_rank_batch")


TIME_COLUMNS = {
    "step_ms": ("Median step on 2 ranks (ms)", "{:.0f}"),
    "measured_s": (
        "Time to the target on 2 ranks: steps to it times the median step, median of the repeats (s)",
        "{:.1f}",
    ),
    "ranks_at_crit": ("Ranks at the critical batch", "{:.1f}"),
    "seconds_at_crit": ("Time there, projected (s)", "{:.2f}"),
    "floor_s": ("Floor as the ranks grow, extrapolated (s)", "{:.2f}"),
}


def time_to_target_markdown(variants: dict[str, Experiment]) -> str:
    return quantity_table(time_to_target_table(runs_table(variants)), TIME_COLUMNS, "Per-rank batch (samples)")


def time_to_target_figure(variants: dict[str, Experiment]):
    """Projected time to the target against ranks, a line per per-rank batch, and the measured runs as points. A
    line is dotted where the fit extrapolates, and marked where N·b = B_crit."""
    table = runs_table(variants)
    rule, fit = rule_fit(table)
    at_crit = time_to_target_table(table)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, (b, rows) in enumerate(time_to_target(table).groupby("per_rank_batch")):
        ax.plot(rows["ranks"], rows["seconds"], ":", color=f"C{i}")
        inside = rows[rows["measured"]]
        ax.plot(inside["ranks"], inside["seconds"], "-", color=f"C{i}", label=f"{b} samples per rank")
        runs = rule[rule["per_rank_batch"] == b]
        ax.plot(runs["ranks"], runs["steps"] * runs["step_s"], "o", color=f"C{i}", alpha=0.6)
        if np.isfinite(fit["b_crit"]):
            ax.plot(
                [at_crit.loc[b, "ranks_at_crit"]],
                [at_crit.loc[b, "seconds_at_crit"]],
                "s",
                color=f"C{i}",
                markerfacecolor="none",
            )
    ax.set(xscale="log", yscale="log", xlabel="ranks N", ylabel="time to the target (s), evaluations left out")
    ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.legend(fontsize=7, title="lines: projected; dots: measured runs; squares: N·b = B_crit", title_fontsize=7)
    fig.tight_layout()
    return fig


BATCH_COLUMNS = {
    "lr": ("Learning rate", "{:g}"),
    "eval_every": ("Evaluated every (steps)", "{:.0f}"),
    "steps_text": ("Steps to the target, median (range)", "{}"),
    "samples": ("Samples to it, median", "{:,.0f}"),
    "reached_text": ("Reached it", "{}"),
    "b_simple": ("Noise scale (samples), mean", "{:.0f}"),
}


def per_batch_markdown(variants: dict[str, Experiment]) -> str:
    rows = per_batch(runs_table(variants))
    rows = rows.assign(
        steps_text=_steps_text(rows), reached_text=[f"{r} of {n}" for r, n in zip(rows["reached"], rows["runs"])]
    )
    return quantity_table(rows, BATCH_COLUMNS, "Global batch (samples)")
