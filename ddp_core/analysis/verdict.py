"""One yardstick for every comparison the report makes: two sets of interleaved repeats, as a ratio and a verdict.

This machine's speed drifts by tens of per cent over minutes, with its neighbours' load and the VM's scheduling. That
is more than most effects the report studies. Runs that alternate in time see the same drift, so repeat k of one side
is paired with repeat k of the other. `error_rates` measures the rule itself on the runs it judges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median

import numpy as np

MIN_REPEATS = 3  # fewer pairs give no verdict at all
DRAWS = 2000  # new sets of rounds per planted effect in `error_rates`
Z = 2.0  # the floor's width in standard deviations of a pair's log-ratio: under normal noise 1 pair in 20 lies beyond


@dataclass(frozen=True)
class Comparison:
    ratio: float  # median over the pairs of a_k / b_k
    low: float  # smallest and largest ratio of a pair
    high: float
    pairs: int
    floor: float  # the noise floor the ratio was held against, as a fraction (0.05: 5 %)
    verdict: str  # "lower", "higher", "no visible difference", "too few repeats" or, for accuracies, "at chance"

    def says(self, lower: str, higher: str) -> str:
        """The verdict in the sentence's words, e.g. says("faster", "slower") for a ratio of times."""
        return {"lower": lower, "higher": higher}.get(self.verdict, self.verdict)

    @property
    def decided(self) -> bool:
        return self.verdict in ("lower", "higher")

    def value(self) -> str:
        """The ratio with the range of its pairs: '0.85 (0.80 to 0.90 over 3 repeats)'."""
        if self.pairs < 2:
            return f"{self.ratio:.2f} (one run each)"
        low, high = f"{self.low:.2f}", f"{self.high:.2f}"
        # where the range's ends read alike: '1.00 (the same in each of 3 repeats)'
        spread = "the same in each of" if low == high else f"{low} to {high} over"
        return f"{self.ratio:.2f} ({spread} {self.pairs} repeats)"

    def judged(self, lower: str, higher: str) -> str:
        """The verdict in the sentence's words with the noise floor it cleared, or why there is none."""
        if not self.decided:
            return self.why_undecided()
        return f"{self.says(lower, higher)} (beyond the noise floor of {self.floor:.1%})"

    def why_undecided(self) -> str:
        """Why the rule decided neither way, in a few words: noise, too few repeats, guesses, or no floor.

        The pages and the methods chapter say what each means.
        """
        if self.verdict == "too few repeats":
            return f"no verdict ({self.pairs} of each side; a verdict needs {MIN_REPEATS} repeats)"
        if self.verdict == "at chance":
            return "no verdict (every repeat of both sides at chance)"
        if math.isnan(self.floor):
            return "no verdict (no noise floor: no configurations shared rounds)"
        return f"no visible difference (within the noise floor of {self.floor:.1%})"


def compare(a: list[float], b: list[float], floor: float) -> Comparison:
    """Side A against side B: a[k] and b[k] are repeat k of each, run next to each other in time."""
    if len(a) != len(b):
        raise ValueError(f"{len(a)} repeats against {len(b)}: pairs need as many of each")
    # A pair's ratio cancels the drift its runs shared. The range of the ratios is what the runs showed: with three to
    # five repeats, a bootstrap or a t-interval would claim a precision the sample does not have.
    ratios = [x / y for x, y in zip(a, b)]
    ratio = median(ratios)
    # A verdict needs every pair to point the same way, and the median beyond the noise floor.
    if len(ratios) < MIN_REPEATS:
        verdict = "too few repeats"
    elif max(ratios) < 1 and ratio < 1 / (1 + floor):  # the floor in log-ratio on both sides: A against B and B
        # against A get mirrored verdicts (a speedup and the time it inverts never disagree)
        verdict = "lower"
    elif min(ratios) > 1 and ratio > 1 + floor:
        verdict = "higher"
    else:
        verdict = "no visible difference"
    return Comparison(ratio, min(ratios), max(ratios), len(ratios), floor, verdict)


def _log_table(repeats: list[list[float]]) -> np.ndarray | None:
    """Logs of the configurations with a positive value in every round: a row each, a column per round all of them ran.

    It is None when fewer than two configurations or two rounds are left.
    """
    rows = [values for values in repeats if len(values) > 1 and all(v > 0 for v in values)]  # NaN fails v > 0
    rounds = min((len(values) for values in rows), default=0)
    if len(rows) < 2 or rounds < 2:
        return None
    return np.log([values[:rounds] for values in rows])


def _residuals(table: np.ndarray) -> np.ndarray:
    """What is left of each log value after its configuration's and its round's effect (row and column means)."""
    return table - table.mean(axis=1, keepdims=True) - table.mean(axis=0, keepdims=True) + table.mean()


def degrees_of_freedom(repeats: list[list[float]]) -> int:
    """What the noise floor of `repeats` rests on, in residuals' worth: 0 where there is no floor.

    With 2 the floor itself is uncertain by a factor of several, and small effects go unseen.
    """
    table = _log_table(repeats)
    return 0 if table is None else _degrees(table)


def _degrees(table: np.ndarray) -> int:
    # (configurations - 1) x (rounds - 1)
    return (table.shape[0] - 1) * (table.shape[1] - 1)


def noise_floor(repeats: list[list[float]], runs: int = 2) -> float:
    """How far from 1 a paired ratio of two identical configurations lands on this machine.

    The values are several configurations', repeat k of each run in round k. It is NaN, so no verdict, where one
    configuration or one round cannot separate noise from the configurations.
    """
    table = _log_table(repeats)
    if table is None:
        return float("nan")
    # The logs are fitted as configuration effect + round effect, a randomized block design. A round's drift is shared
    # by every configuration in it, and pairing cancels it. The residual deviation s is the noise pairing leaves.
    s = math.sqrt((_residuals(table) ** 2).sum() / _degrees(table))
    # A pair's log-ratio has deviation sqrt(2) s; the floor is Z of those from 1. A ratio of two speedups holds
    # runs=4 values, each with its own noise: sqrt(4) s.
    return math.exp(Z * math.sqrt(runs) * s) - 1


def slowed_first(drawn: np.ndarray, effect: float) -> tuple[list[float], list[float]]:
    """What `error_rates` plants by default: the first configuration, slowed by the effect, against the second."""
    return list(drawn[0] * (1 + effect)), list(drawn[1])


def error_rates(
    repeats: list[list[float]],
    effects: list[float],
    draws: int = DRAWS,
    seed: int = 0,
    planted=slowed_first,
    runs: int = 2,
) -> dict:
    """How the rule behaves on runs like these: per planted effect, the share of comparisons called in its direction.

    An effect of 0.2 means side A takes 1.2 times as long. At 0, it is the share called either way, which ought to be
    rare.
    """
    # Each draw makes new rounds from the fitted residuals, a residual bootstrap. It estimates the floor as a page
    # would, then makes the comparison `planted` builds with the effect in it. A ratio of two speedups, four runs, is
    # noisier than one of two times, so its test's rates are its own.
    table = _log_table(repeats)
    if table is None:
        return {effect: float("nan") for effect in effects}
    # each residual scaled up for the effects the fit took out
    residuals = _residuals(table).ravel() * math.sqrt(table.size / _degrees(table))
    rng = np.random.default_rng(seed)

    def called(effect: float) -> bool:
        drawn = np.exp(rng.choice(residuals, size=table.shape))
        c = compare(*planted(drawn, effect), noise_floor(drawn.tolist(), runs))
        return c.verdict == "higher" if effect > 0 else c.decided

    return {effect: sum(called(effect) for _ in range(draws)) / draws for effect in effects}
