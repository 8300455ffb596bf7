"""Steps to a target accuracy against the global batch size, and the critical batch size past which more stops helping.

The steps follow Shallue et al. (JMLR 2019), the critical batch McCandlish et al. (2018). The page
book/studies/time_to_accuracy.md shows them, and the key findings quote them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ddp_core.analysis.comparisons import median_step
from ddp_core.analysis.results import Experiment, ResultsError
from ddp_core.analysis.tables import in_words


def steps_to_target(evals: pd.DataFrame, target: float) -> float:
    """The optimizer step of the first evaluation at or past `target`, from evals.csv's rows.

    A run that never reached it gets NaN, never its last step.
    """
    reached = evals.loc[evals["val_accuracy"] >= target, "step"]
    return float(reached.min()) if len(reached) else math.nan


def critical_batch(batch_sizes, steps) -> dict[str, float]:
    """McCandlish's S_min, E_min and B_crit = E_min / S_min, fitted to the steps to target at each global batch size.

    It is NaN where fewer than two batch sizes reached the target, or the measured range has no bend.
    """
    # McCandlish's model: steps S and samples E = B·S to a target satisfy (S/S_min - 1)(E/E_min - 1) = 1.
    # So S = S_min + E_min / B: S halves as B doubles far below B_crit, and stops falling far above it.
    batch, measured = np.asarray(batch_sizes, float), np.asarray(steps, float)
    keep = np.isfinite(measured)  # runs that never reached the target are left out
    batch, measured = batch[keep], measured[keep]
    if len(np.unique(batch)) < 2:
        return dict.fromkeys(["s_min", "e_min", "b_crit"], math.nan)
    # S is linear in 1/B: intercept S_min, slope E_min. The fit is in relative error, since the steps' spread over
    # seeds grows with the steps; a plain fit would let the smallest batch's scatter set the bend.
    e_min, s_min = np.polyfit(1.0 / batch, measured, 1, w=1.0 / measured)
    bends = s_min > 0 and e_min > 0  # else no bend in the measured range
    return {"s_min": float(s_min), "e_min": float(e_min), "b_crit": float(e_min / s_min) if bends else math.nan}


DRAWS = 2000  # resamples of the seeds in `critical_batch_interval`


@dataclass(frozen=True)
class Bounds:
    """A range's two ends: a fitted value's 2.5th and 97.5th percentiles over the seeds' resamples, or a ratio's."""

    low: float
    high: float


@dataclass(frozen=True)
class FitInterval:
    """How far B_crit and S_min move with the seeds (`critical_batch_interval`)."""

    b_crit: Bounds
    s_min: Bounds


def critical_batch_interval(table: pd.DataFrame, draws: int = DRAWS, seed: int = 0) -> FitInterval:
    """How far B_crit and S_min move with the seeds, as the 2.5th and 97.5th percentiles over resampled fits."""
    # Each draw resamples the runs of each batch size with replacement and fits again.
    rng = np.random.default_rng(seed)
    groups = {batch: group["steps"].to_numpy(float) for batch, group in table.groupby("batch")}
    batches = np.concatenate([np.full(len(g), batch) for batch, g in groups.items()])
    fits = pd.DataFrame(
        [
            critical_batch(batches, np.concatenate([rng.choice(g, size=len(g)) for g in groups.values()]))
            for _ in range(draws)
        ]
    )
    bent = fits[np.isfinite(fits["b_crit"])]  # NaN fits, with no bend, are left out
    if bent.empty:
        return FitInterval(Bounds(math.nan, math.nan), Bounds(math.nan, math.nan))
    b_crit, s_min = (
        Bounds(*(float(np.percentile(bent[fitted], q)) for q in (2.5, 97.5))) for fitted in ("b_crit", "s_min")
    )
    return FitInterval(b_crit=b_crit, s_min=s_min)


def _evals(experiment: Experiment, run: str) -> pd.DataFrame:
    path = experiment.folder / run / "evals.csv"
    if not path.is_file():
        raise ResultsError(f"{path}: missing (the study's runs evaluate inside epochs: train them again)")
    return pd.read_csv(path)


def noise_scale_of_run(metrics: pd.DataFrame) -> float:
    """B_simple over a whole run, smoothed as the paper does: a ratio of averages, not an average of noisy ratios."""
    # tr(Σ) and |G|² are each averaged over the run's steps, then divided.
    weights = metrics["steps"]
    trace = (metrics["grad_noise_trace"] * weights).sum() / weights.sum()
    signal = (metrics["grad_sq_norm"] * weights).sum() / weights.sum()
    return float(trace / signal) if signal > 0 else math.nan


def runs_table(variants: dict[str, Experiment]) -> pd.DataFrame:
    """One row per run: its settings, the steps and samples it took to reach the target, B_simple, and its step times.

    NaN steps mean the run never reached the target.
    """
    rows = []
    for name, experiment in variants.items():
        for run in experiment.all_runs:
            target, evals = run.config["target_accuracy"], _evals(experiment, run.name)
            steps = steps_to_target(evals, target)
            metrics = experiment.metrics[experiment.metrics["run"] == run.name]
            steps_csv = experiment.steps[experiment.steps["run"] == run.name]
            rows.append(
                {
                    "variant": name,
                    "batch": run.global_batch_size,
                    "per_rank_batch": run.per_rank_batch_size,
                    "ranks": run.world_size,
                    "lr": run.config["lr"],
                    "seed": run.config["seed"],
                    "target": target,
                    "steps": steps,
                    "samples": steps * run.global_batch_size,
                    "last_step": float(evals["step"].max()),
                    "eval_every": run.config["eval_every_steps"],
                    "b_simple": noise_scale_of_run(metrics),
                    "step_s": median_step(steps_csv["step_time_s"]),
                    # a step less the all-reduce it waited for
                    "compute_s": median_step(steps_csv["step_time_s"] - steps_csv["comm_exposed_s"]),
                    "exposed_s": median_step(steps_csv["comm_exposed_s"]),
                }
            )
    return pd.DataFrame(rows)


def follows_rule(table: pd.DataFrame) -> pd.Series:
    """Which runs have the learning rate of the square-root rule, lr = c·√B, as opposed to its neighbours' runs."""
    c = table["lr"] / np.sqrt(table["batch"])  # the rule's c is the one most variants share: the median
    return pd.Series(np.isclose(c, c.median(), rtol=0.01), index=table.index)


def rule_fit(table: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, float]]:
    """The runs at the rule's learning rate, and McCandlish's model fitted to them.

    The page's figures, tables and findings all rest on this.
    """
    rule = table[follows_rule(table)]
    return rule, critical_batch(rule["batch"], rule["steps"])


def per_batch(table: pd.DataFrame) -> pd.DataFrame:
    """The rule's runs by global batch, summarised over the repeats for the page's table."""
    grouped = table[follows_rule(table)].groupby("batch")
    return pd.DataFrame(
        {
            "per_rank_batch": grouped["per_rank_batch"].first(),
            "lr": grouped["lr"].first(),
            "steps": grouped["steps"].median(),
            "steps_low": grouped["steps"].min(),
            "steps_high": grouped["steps"].max(),
            "samples": grouped["samples"].median(),
            "reached": grouped["steps"].count(),
            "runs": grouped.size(),
            "eval_every": grouped["eval_every"].first(),
            "b_simple": grouped["b_simple"].mean(),
            "step_s": grouped["step_s"].median(),
            "compute_s": grouped["compute_s"].median(),
            "exposed_s": grouped["exposed_s"].median(),
        }
    )


@dataclass(frozen=True)
class BatchEnds:
    """A quantity of `per_batch` at the smallest and the largest global batch measured."""

    smallest: float
    largest: float


@dataclass(frozen=True)
class CriticalBatchStudy:
    """What the time-to-accuracy study found: steps to the target, McCandlish's fit, and the noise scale against it."""

    target: float
    chance: float
    preset: str
    dataset: str
    eval_samples: int
    target_se: float
    ranks: int
    smallest: int
    largest: int
    lr_at_32: float
    unreached: int
    runs: int
    samples: BatchEnds
    steps: BatchEnds
    s_min: float
    e_min: float
    b_crit: float
    b_crit_low: float
    b_crit_high: float
    s_min_low: float
    s_min_high: float
    b_crit_against_range: str
    b_simple: float
    b_simple_low: float
    b_simple_high: float
    b_crit_over_b_simple: float
    ratio: Bounds
    b_crit_against_b_simple: str
    rule_unreached: int
    rule_runs: int


def critical_batch_study(variants: dict[str, Experiment]) -> CriticalBatchStudy:
    """`CriticalBatchStudy` of the study's runs: the fit and the noise scale over the runs at the rule's rate."""
    table = runs_table(variants)
    batches = per_batch(table)
    rule, fit = rule_fit(table)
    interval = critical_batch_interval(rule)
    first = next(iter(variants.values())).baseline
    target, evaluated = first.config["target_accuracy"], first.config["eval_samples"]
    noise = rule["b_simple"]
    smallest, largest = batches.index.min(), batches.index.max()
    ends = {
        column: BatchEnds(*(float(batches.loc[b, column]) for b in (smallest, largest)))
        for column in ("samples", "steps")
    }
    return CriticalBatchStudy(
        target=target,
        chance=1 / first.model["num_classes"],
        preset=first.config["preset"],
        dataset=in_words(first.config["dataset"]),
        eval_samples=evaluated,
        target_se=math.sqrt(target * (1 - target) / evaluated),
        ranks=int(table["ranks"].iloc[0]),
        smallest=int(smallest),
        largest=int(largest),
        lr_at_32=float(rule["lr"].iloc[0] * math.sqrt(32 / rule["batch"].iloc[0])),
        unreached=int(table["steps"].isna().sum()),
        runs=len(table),
        samples=ends["samples"],
        steps=ends["steps"],
        s_min=fit["s_min"],
        e_min=fit["e_min"],
        b_crit=fit["b_crit"],
        b_crit_low=interval.b_crit.low,
        b_crit_high=interval.b_crit.high,
        s_min_low=interval.s_min.low,
        s_min_high=interval.s_min.high,
        b_crit_against_range="past the largest batch measured"
        if fit["b_crit"] > largest
        else "below the smallest batch measured"
        if fit["b_crit"] < smallest
        else "inside the range measured",
        b_simple=float(noise.mean()),
        b_simple_low=float(noise.min()),
        b_simple_high=float(noise.max()),
        b_crit_over_b_simple=fit["b_crit"] / float(noise.mean()),
        ratio=Bounds(interval.b_crit.low / float(noise.mean()), interval.b_crit.high / float(noise.mean())),
        b_crit_against_b_simple="larger than every noise scale measured"
        if interval.b_crit.low > noise.max()
        else "smaller than every noise scale measured"
        if interval.b_crit.high < noise.min()
        else "not told apart from the noise scale",
        rule_unreached=int(rule["steps"].isna().sum()),
        rule_runs=len(rule),
    )
