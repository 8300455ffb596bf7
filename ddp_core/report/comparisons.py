"""Every comparison the report makes between runs, in one place: each run's time is its median step
(`run_times`), the two sides of a comparison are their repeats in order (repeat k of each ran in
round k of `make report`, next to each other in time), and `verdict.compare` turns them into a
ratio with its range and a verdict. Speedups, times per sample and final accuracies are compared
this way on every page; the `*_phrase`/`*_sentence` helpers word the outcome for glue.
"""

from __future__ import annotations

import math

import pandas as pd

from ddp_core.report.results import Experiment, ResultsError
from ddp_core.report.tables import one_row_each
from ddp_core.report.verdict import MIN_REPEATS, Comparison, compare, noise_floor

WARMUP_STEPS = 5  # a run's first steps pay for start-up (allocator, DDP's bucket rebuild, cold caches)


def run_times(experiment: Experiment) -> pd.DataFrame:
    """One row per run: world size, repeat (1 for the lowest seed), its median step over the steps after its
    first WARMUP_STEPS, and that per trained sample (fair when world sizes differ in global batch)."""
    rows = []
    for n, runs in experiment.repeats.items():
        for repeat, run in enumerate(runs, 1):
            steps = experiment.steps.loc[experiment.steps["run"] == run.name, "step_time_s"]
            step = float((steps.iloc[WARMUP_STEPS:] if len(steps) > WARMUP_STEPS else steps).median())
            rows.append({"world_size": n, "repeat": repeat, "run": run.name, "step_time_s": step,
                         "time_per_sample_s": step / run.global_batch_size})
    return pd.DataFrame(rows)


def noise_floor_of(experiment: Experiment) -> float:
    """How far apart repeats of one world size land (`verdict.noise_floor`): this experiment's yardstick."""
    times = run_times(experiment)
    return noise_floor([list(rows["time_per_sample_s"]) for _, rows in times.groupby("world_size")])


def paired_times(experiment: Experiment, world_size: int) -> list[float]:
    """The time per sample of each repeat at `world_size`, repeat 1 first: one side of a paired comparison."""
    times = run_times(experiment)
    return list(times.loc[times["world_size"] == world_size, "time_per_sample_s"])


def _larger(*floors: float) -> float:
    """The larger of two experiments' floors; NaN (no repeats) only when both are."""
    known = [f for f in floors if not math.isnan(f)]
    return max(known) if known else float("nan")


def _paired(a: list[float], b: list[float]) -> tuple[list[float], list[float]]:
    pairs = min(len(a), len(b))
    return a[:pairs], b[:pairs]


def speedup_comparisons(experiment: Experiment) -> dict[int, Comparison]:
    """Per world size, one rank's time per sample against its own, repeat by repeat: the comparison's ratio is
    the speedup T1/TN with its range, "higher" meaning faster than one rank."""
    if 1 not in experiment.repeats:
        raise ResultsError(f"no 1-rank run among world sizes {sorted(experiment.repeats)}: "
                           f"speedup is measured against one rank")
    floor, one = noise_floor_of(experiment), paired_times(experiment, 1)
    return {n: compare(*_paired(one, paired_times(experiment, n)), floor) for n in experiment.repeats}


def compare_speedups(a: Experiment, b: Experiment, n: int) -> Comparison:
    """A's speedup at `n` ranks against B's, repeat by repeat ("higher": A scales better), held against the
    larger of the two experiments' noise floors."""
    def speedups(e: Experiment) -> list[float]:
        return [t1 / tn for t1, tn in zip(*_paired(paired_times(e, 1), paired_times(e, n)))]

    return compare(*_paired(speedups(a), speedups(b)), _larger(noise_floor_of(a), noise_floor_of(b)))


def compare_times(a: Experiment, b: Experiment, a_ranks: int = 1, b_ranks: int = 1) -> Comparison:
    """A's time per sample at `a_ranks` against B's at `b_ranks`, repeat by repeat ("lower": A is faster)."""
    return compare(*_paired(paired_times(a, a_ranks), paired_times(b, b_ranks)), _larger(noise_floor_of(a), noise_floor_of(b)))


def final_accuracies(experiment: Experiment, world_size: int) -> list[float]:
    """Each repeat's last validation accuracy at `world_size`, repeat 1 first."""
    last = experiment.metrics.sort_values("epoch").groupby("run")["val_accuracy"].last()
    return [float(last[run.name]) for run in experiment.repeats[world_size]]


def accuracy_floor(experiment: Experiment) -> float:
    """How far apart the final accuracies of repeats (other seeds) of one world size land."""
    return noise_floor([final_accuracies(experiment, n) for n in experiment.repeats])


def compare_accuracies(a: Experiment, b: Experiment, a_ranks: int = 1, b_ranks: int = 1) -> Comparison:
    """A's final accuracy at `a_ranks` against B's at `b_ranks`, repeat k with repeat k (the same seed offset),
    held against the larger spread between seeds of the two."""
    return compare(*_paired(final_accuracies(a, a_ranks), final_accuracies(b, b_ranks)),
                   _larger(accuracy_floor(a), accuracy_floor(b)))


def accuracy_phrase(c: Comparison, of_what: str) -> str:
    """'0.99 (0.98 to 1.00 over 3 repeats) times the baseline's: lower', or why there is no verdict."""
    return f"{c.value()} times {of_what}: " + (c.says("lower", "higher") if c.decided else c.why_undecided())


def time_ratio_sentence(c: Comparison, a: str, b: str) -> str:
    """'A took 0.85 (0.80 to 0.90 over 3 repeats) times as long per sample as B: faster' and its other outcomes."""
    verdict = c.says("faster", "slower") if c.decided else c.why_undecided()
    return f"{a} took {c.value()} times as long per sample as {b}: {verdict}"


def noise_findings(experiment: Experiment) -> dict:
    """The yardstick of this build, for the methods chapter: the noise floor and what it rests on."""
    times = run_times(experiment)
    return {"noise_floor": noise_floor_of(experiment), "noise_repeats": int(times.groupby("world_size").size().min()),
            "min_repeats": MIN_REPEATS, "warmup_steps": WARMUP_STEPS}


RUN_ORDER_COLUMNS = {"start": ("Started (UTC)", "{}"), "run": ("Run", "{}"), "world_size": ("Ranks", "{:.0f}"),
                     "repeat": ("Repeat", "{:.0f}"), "step_ms": ("Median step (ms)", "{:.1f}")}


def run_order_markdown(experiment: Experiment) -> str:
    """The runs in the order they started, each with its median step: how the repeats alternated in time, and
    how far the repeats of one world size land apart."""
    times = run_times(experiment)
    started = {run.name: run.raw["start_time"] for run in experiment.all_runs}
    times = times.assign(start=times["run"].map(started).str.slice(0, 19).str.replace("T", " "),
                         step_ms=times["step_time_s"] * 1e3).sort_values("start")
    return one_row_each(times, RUN_ORDER_COLUMNS)
