"""Every comparison the report makes between runs, in one place, so that every page compares the same way.

A run's time is its median step (`run_times`). The two sides of a comparison are their repeats in order. Repeat k of
each ran in round k of `make report`, next to each other in time. `verdict.compare` turns the sides into a ratio with
its range and a verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from ddp_core.analysis.results import OUT_OF_LINE, Experiment, ResultsError, last_epochs
from ddp_core.analysis.tables import noise_format, quantity_table
from ddp_core.analysis.verdict import (
    DRAWS,
    MIN_REPEATS,
    Z,
    Comparison,
    compare,
    degrees_of_freedom,
    error_rates,
    noise_floor,
)

WARMUP_STEPS = 5  # a run's first steps pay for start-up (allocator, DDP's bucket rebuild, cold caches)
WARMUP_EPOCHS = 1  # the same for the per-epoch timers: a run's first epoch is left out of its phases


def steady_phases(metrics: pd.DataFrame) -> pd.DataFrame:
    """Each run's epochs after warm-up, with the epoch's mean step and its timed phases per step.

    The phases add up to no more than the mean step.
    """
    later = metrics[metrics["epoch"] > WARMUP_EPOCHS]
    steady = pd.concat([later, metrics[~metrics["run"].isin(later["run"])]])  # a run of one epoch keeps it
    per_step = lambda col: steady[col] / steady["steps"]  # noqa: E731
    return steady.assign(
        mean_step_s=per_step("epoch_time_s"),
        # forward and backward less the communication they waited for, plus the optimizer
        compute_per_step_s=per_step("forward_time_s")
        + per_step("backward_time_s")
        - per_step("comm_exposed_s")
        + per_step("optimizer_time_s"),
        comm_total_per_step_s=per_step("comm_total_s"),
        comm_exposed_per_step_s=per_step("comm_exposed_s"),
        optimizer_per_step_s=per_step("optimizer_time_s"),
        data_per_step_s=per_step("data_time_s"),
    )


def median_step(step_times: pd.Series) -> float:
    """A run's step time: the median of its steps after the first WARMUP_STEPS."""
    return float((step_times.iloc[WARMUP_STEPS:] if len(step_times) > WARMUP_STEPS else step_times).median())


def out_of_line(step_times: pd.Series, configurations: pd.Series) -> pd.Series:
    """Per run, its median step over its configuration's median, where that ratio is far enough out of line to flag.

    `configurations` says which runs repeat one another. NaN marks a run in line.
    """
    repeats = step_times.groupby(configurations)
    ratio = step_times / repeats.transform("median")  # the median of the repeats, itself included
    far = (ratio >= OUT_OF_LINE) | (ratio <= 1 / OUT_OF_LINE)
    # With fewer than MIN_REPEATS repeats, no majority tells which run is out of line.
    return ratio.where(far & (repeats.transform("size") >= MIN_REPEATS))


def run_times(experiment: Experiment) -> pd.DataFrame:
    """One row per run: world size, repeat, median step, time per sample, and mean step and compute per step.

    Repeat 1 has the lowest seed. Time per sample is fair when world sizes differ in global batch.
    """
    # the mean step and compute are means over the run's steady epochs
    steady = steady_phases(experiment.metrics).groupby("run")[["mean_step_s", "compute_per_step_s"]].mean()
    rows = []
    for n, runs in experiment.repeats.items():
        for repeat, run in enumerate(runs, 1):
            # over the steps after its first WARMUP_STEPS
            step = median_step(experiment.steps.loc[experiment.steps["run"] == run.name, "step_time_s"])
            rows.append(
                {
                    "world_size": n,
                    "repeat": repeat,
                    "run": run.name,
                    "step_time_s": step,
                    "time_per_sample_s": step / run.global_batch_size,
                    **steady.loc[run.name],
                }
            )
    return pd.DataFrame(rows)


def paired_sides(experiment: Experiment, quantity: str = "time_per_sample_s") -> dict[int, list[float]]:
    """Per world size, a quantity of `run_times` for each repeat, repeat 1 first: the sides of paired comparisons."""
    return {n: list(rows[quantity]) for n, rows in run_times(experiment).groupby("world_size")}


def _distinct(items: tuple) -> list:
    """`items` with each object once, by identity, so that an experiment compared with itself counts once in a floor.

    Counted twice, its configurations would pass for twice the evidence.
    """
    return [item for i, item in enumerate(items) if all(item is not other for other in items[:i])]


def _pooled(*sides: dict[int, list[float]]) -> list[list[float]]:
    """The configurations (world sizes) of several experiments' `paired_sides`, as a noise floor pools them."""
    return [values for per_size in _distinct(sides) for values in per_size.values()]


POWER_DRAWS = DRAWS // 4  # per row of every study's table: a rate within about 2 points, in a second a study


def study_floor_power(study: dict[str, Experiment]) -> dict:
    """What a study's time floor rests on and what it can tell, so that its page can say how far to trust it.

    The floor pools every configuration of the study, as the page's comparisons do.
    """
    repeats = _pooled(*(paired_sides(e) for e in study.values()))
    # On the study's own runs: how often the rule calls identical configurations different, and how often it finds a
    # planted effect of 10 % and 20 %.
    rates = error_rates(repeats, [0.0, 0.1, 0.2], draws=POWER_DRAWS)
    return {
        "degrees": degrees_of_freedom(repeats),
        "floor": noise_floor(repeats),
        "identical_called": rates[0.0],
        "found_10": rates[0.1],
        "found_20": rates[0.2],
    }


def _paired(a: list[float], b: list[float]) -> tuple[list[float], list[float]]:
    pairs = min(len(a), len(b))
    return a[:pairs], b[:pairs]


def speedup_comparisons(experiment: Experiment) -> dict[int, Comparison]:
    """Per world size, one rank's time per sample against its own, repeat by repeat.

    The ratio is the speedup T1/TN with its range, and "higher" means faster than one rank.
    """
    sides = paired_sides(experiment)
    if 1 not in sides:
        raise ResultsError(f"no 1-rank run among world sizes {sorted(sides)}: speedup is measured against one rank")
    floor = noise_floor(list(sides.values()))
    return {n: compare(*_paired(sides[1], times), floor) for n, times in sides.items()}


SPEEDUP_RUNS = 4  # a ratio of two speedups: two runs on one rank, two on n


def compare_speedups(a: Experiment, b: Experiment, n: int) -> Comparison:
    """A's speedup at `n` ranks against B's, repeat by repeat: "higher" means A scales better."""
    # The floor pools both experiments' configurations, for a ratio of four runs' values (SPEEDUP_RUNS).
    sides_a = paired_sides(a)
    sides_b = sides_a if b is a else paired_sides(b)
    speedups = [[t1 / tn for t1, tn in zip(*_paired(sides[1], sides[n]))] for sides in (sides_a, sides_b)]
    return compare(*_paired(*speedups), noise_floor(_pooled(sides_a, sides_b), runs=SPEEDUP_RUNS))


def slower_speedup(drawn: np.ndarray, effect: float) -> tuple[list[float], list[float]]:
    """`compare_speedups` as `verdict.error_rates` plants an effect in it, to measure that comparison's error rates."""
    # Rows 0 and 1 are one rank or node and N; rows 2 and 3 the same, with the step on N longer by the effect.
    # Every row is in the floor, as `compare_speedups` pools both experiments' configurations with runs=SPEEDUP_RUNS.
    return list(drawn[0] / drawn[1]), list(drawn[2] / (drawn[3] * (1 + effect)))


def time_floor(*experiments: Experiment) -> float:
    """The noise floor of the time per sample over the configurations (world sizes) of all `experiments`."""
    return noise_floor(_pooled(*(paired_sides(e) for e in experiments)))


def compare_times(
    a: Experiment, b: Experiment, a_ranks: int = 1, b_ranks: int = 1, floor: float | None = None
) -> Comparison:
    """A's time per sample at `a_ranks` against B's at `b_ranks`, repeat by repeat: "lower" means A is faster.

    A page that compares several pairs passes one `floor` for all. The default pools both experiments' configurations.
    """
    sides_a = paired_sides(a)  # each experiment's runs read once
    sides_b = sides_a if b is a else paired_sides(b)
    return compare(
        *_paired(sides_a[a_ranks], sides_b[b_ranks]), noise_floor(_pooled(sides_a, sides_b)) if floor is None else floor
    )


def final_accuracies(experiment: Experiment, world_size: int) -> list[float]:
    """Each repeat's last validation accuracy at `world_size`, repeat 1 first."""
    last = last_epochs(experiment.metrics)["val_accuracy"]
    return [float(last[run.name]) for run in experiment.repeats[world_size]]


def chance_bar(run) -> tuple[float, float]:
    """Chance accuracy, and the accuracy a classifier at chance exceeds on the run's evaluation set about 1 time in 40.

    The bar is NaN where the set's size is not recorded.
    """
    # the bar: chance plus Z binomial standard errors
    chance = 1 / run.model["num_classes"]
    samples = run.config.get("eval_samples")
    return chance, chance + Z * math.sqrt(chance * (1 - chance) / samples) if samples else float("nan")


def against_chance(experiment: Experiment, world_size: int) -> str:
    """Whether the repeats' final accuracies at `world_size` lie above what chance reaches on the evaluation set."""
    _, bar = chance_bar(experiment.repeats[world_size][0])
    accuracies = final_accuracies(experiment, world_size)
    above = sum(accuracy > bar for accuracy in accuracies)
    if math.isnan(bar):
        return "not judged against chance (the evaluation set's size is not recorded)"
    if above == len(accuracies):
        return "above chance in every repeat"
    return "at chance in every repeat" if above == 0 else f"above chance in {above} of {len(accuracies)} repeats"


@dataclass(frozen=True)
class Chance:
    """Where a study's accuracy stands against guessing, so that accuracies of guesses are not read as learning."""

    # the evaluation set's size, chance (1/classes), the bar a guess rarely passes on that set, `against_chance`

    eval_samples: int | None
    chance: float
    chance_bar: float
    vs_chance: str


def chance_at(experiment: Experiment, world_size: int) -> Chance:
    """`Chance` of the runs at `world_size`."""
    run = experiment.repeats[world_size][0]
    chance, bar = chance_bar(run)
    return Chance(run.config.get("eval_samples"), chance, bar, against_chance(experiment, world_size))


def accuracy_floor(*experiments: Experiment) -> float:
    """How far apart the final accuracies of one configuration's repeats land, over all `experiments`' world sizes.

    The repeats differ in seed. An experiment compared with itself counts once.
    """
    return noise_floor([final_accuracies(e, n) for e in _distinct(experiments) for n in e.repeats])


def binomial_floor(accuracy: float, samples: int | None) -> float:
    """How far from 1 the ratio of two accuracies lands from sampling `samples` evaluation samples alone.

    It is 0 where the size is unknown.
    """
    # Z standard errors of the ratio's log, sqrt(2 p (1 - p) / n) / p
    if not samples or not 0 < accuracy < 1:
        return 0.0
    return math.exp(Z * math.sqrt(2 * accuracy * (1 - accuracy) / samples) / accuracy) - 1


def compare_accuracies(
    a: Experiment, b: Experiment, a_ranks: int = 1, b_ranks: int = 1, floor: float | None = None
) -> Comparison:
    """A's final accuracy at `a_ranks` against B's at `b_ranks`, repeat k with repeat k, which share a seed offset.

    Accuracies of guesses are not compared: where both sides are at chance, the verdict is "at chance".
    """
    # The floor is `floor` or the evaluation set's resolution, whichever is wider. A page that compares several pairs
    # passes one `floor` for all; the default pools both experiments' configurations.
    side_a, side_b = _paired(final_accuracies(a, a_ranks), final_accuracies(b, b_ranks))
    run_a, run_b = a.repeats[a_ranks][0], b.repeats[b_ranks][0]
    resolved = binomial_floor(
        pd.Series(side_a + side_b).median(), min(run.config.get("eval_samples") or 0 for run in (run_a, run_b))
    )
    c = compare(side_a, side_b, max(accuracy_floor(a, b) if floor is None else floor, resolved))
    (_, bar_a), (_, bar_b) = chance_bar(run_a), chance_bar(run_b)
    # every repeat of both sides at chance
    if c.pairs >= MIN_REPEATS and all(x <= bar_a for x in side_a) and all(y <= bar_b for y in side_b):
        return replace(c, verdict="at chance")
    return c


@dataclass(frozen=True)
class Judged:
    """A comparison as a page quotes it, in a sentence's words or a one-line finding's."""

    value: str  # '0.85 (0.80 to 0.90 over 3 repeats)'
    verdict: str  # 'faster (beyond the noise floor of 5.0%)', or why there is none
    shown: str  # for a one-line finding: the ratio to the digit its noise floor allows
    word: str  # the bare verdict


def judged(c: Comparison, lower: str, higher: str) -> Judged:
    """`Judged` of a comparison, its verdict in the sentence's words for a ratio below and above 1."""
    return Judged(
        c.value(), c.judged(lower, higher), noise_format(c.ratio, c.floor).format(c.ratio), c.says(lower, higher)
    )


def judged_times(c: Comparison) -> Judged:
    """A ratio of times, A's over B's: A is 'faster' below 1 ("A took {value} times as long as B: {verdict}")."""
    return judged(c, "faster", "slower")


def judged_accuracies(c: Comparison) -> Judged:
    """A ratio of final accuracies, A's over B's: A's is 'higher' above 1."""
    return judged(c, "lower", "higher")


def judged_speedup(c: Comparison) -> Judged:
    """A speedup, T1/TN (`speedup_comparisons`): 'faster' above 1."""
    return judged(c, "slower", "faster")


PLANTED_EFFECTS = [0.0, 0.05, 0.1, 0.2, 0.5]


def rule_rates_table(experiment: Experiment) -> pd.DataFrame:
    """Per planted effect, the share of comparisons the rule calls in its direction, on this experiment's runs.

    At an effect of 0, a call in either direction counts.
    """
    rates = error_rates(list(paired_sides(experiment).values()), PLANTED_EFFECTS)
    return pd.DataFrame({"effect": list(rates), "called": list(rates.values())})


def rule_rates_markdown(rates: pd.DataFrame) -> str:
    """`rule_rates_table`, made once per build (its resampling takes seconds), as the book's table."""
    return quantity_table(
        rates,
        {
            "effect": ("Planted effect: side A takes longer by", "{:.0%}"),
            "called": ("Comparisons called in its direction (at 0%: in either)", "{:.1%}"),
        },
    )


@dataclass(frozen=True)
class Noise:
    """The yardstick of a build, for the methods chapter: a time-per-sample noise floor and what it rests on."""

    floor: float
    repeats: int  # rounds
    configurations: int  # world sizes


def noise(experiment: Experiment) -> Noise:
    """`Noise` of every world size of `experiment`."""
    sides = list(paired_sides(experiment).values())
    return Noise(floor=noise_floor(sides), repeats=min(len(side) for side in sides), configurations=len(sides))


RUN_ORDER_COLUMNS = {
    "start": ("Started (UTC)", "{}"),
    "run": ("Run", "{}"),
    "world_size": ("Ranks", "{:.0f}"),
    "repeat": ("Repeat", "{:.0f}"),
    "step_ms": ("Median step (ms)", "{:.1f}"),
}


def run_order_markdown(experiment: Experiment) -> str:
    """The runs in the order they started, each with its median step.

    It shows how the repeats alternated in time, and how far one world size's repeats land apart.
    """
    times = run_times(experiment)
    started = {run.name: run.raw["start_time"] for run in experiment.all_runs}
    times = times.assign(
        start=times["run"].map(started).str.slice(0, 19).str.replace("T", " "), step_ms=times["step_time_s"] * 1e3
    ).sort_values("start")
    return quantity_table(times, RUN_ORDER_COLUMNS)


def at_world_size(experiment: Experiment, n: int) -> pd.Series:
    """A study's runs at `n` ranks, for studies without a 1-rank run to take speedups against.

    It holds the step, the mean step's parts, and the final accuracy and training loss.
    """
    # The step is the median of the repeats' median steps, with their lowest and highest.
    # The mean step and its parts are over the steady epochs. Accuracy is median, lowest and highest; loss is median.
    steady = steady_phases(experiment.metrics).query("world_size == @n")
    parts = steady[["mean_step_s", "compute_per_step_s", "comm_total_per_step_s", "comm_exposed_per_step_s"]].mean()
    last = last_epochs(experiment.metrics.query("world_size == @n"))
    steps = run_times(experiment).query("world_size == @n")["step_time_s"]
    return pd.concat(
        [
            parts,
            pd.Series(
                {
                    "step_time_s": steps.median(),
                    "step_low_s": steps.min(),
                    "step_high_s": steps.max(),
                    "final_train_loss": last["train_loss"].median(),
                    "final_val_accuracy": last["val_accuracy"].median(),
                    "accuracy_low": last["val_accuracy"].min(),
                    "accuracy_high": last["val_accuracy"].max(),
                }
            ),
        ]
    )


def comm_over_compute(parts: pd.Series) -> float:
    """The all-reduce in flight a step over the step's compute, from `at_world_size`'s steady means.

    It shows how much links set in Mbit/s weigh against this CPU's compute. A reader on another CPU then sees where the
    verdicts were measured.
    """
    return float(parts["comm_total_per_step_s"] / parts["compute_per_step_s"])
