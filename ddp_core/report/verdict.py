"""One yardstick for every comparison the report makes: two sets of repeats, run interleaved in time, turned
into a ratio with its range and a verdict.

This machine's speed drifts by tens of per cent over minutes (its neighbours' load, the VM's scheduling), so
two single runs differ by more than most effects the report studies. Runs that alternate in time see the same
drift: repeat k of one side is paired with repeat k of the other, and the ratio of a pair cancels what they
shared. The range of the pairs' ratios is what the runs showed; with three to five repeats a bootstrap or a
t-interval would claim a precision the sample does not have.

A verdict is given only when every pair points the same way and the median ratio lies beyond the noise floor,
the spread that identical configurations showed between their own repeats (`noise_floor`); anything else is
"no visible difference", and fewer than MIN_REPEATS pairs give no verdict at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

MIN_REPEATS = 3


@dataclass(frozen=True)
class Comparison:
    ratio: float  # median over the pairs of a_k / b_k
    low: float  # smallest and largest ratio of a pair
    high: float
    pairs: int
    floor: float  # the noise floor the ratio was held against, as a fraction (0.05: 5 %)
    verdict: str  # "lower", "higher", "no visible difference" or "too few repeats"

    def says(self, lower: str, higher: str) -> str:
        """The verdict in the sentence's words, e.g. says("faster", "slower") for a ratio of times."""
        return {"lower": lower, "higher": higher}.get(self.verdict, self.verdict)

    @property
    def decided(self) -> bool:
        return self.verdict in ("lower", "higher")

    def value(self) -> str:
        """'0.85 (0.80 to 0.90 over 3 repeats)': the ratio with the range of its pairs."""
        if self.pairs < 2:
            return f"{self.ratio:.2f} (one run each)"
        return f"{self.ratio:.2f} ({self.low:.2f} to {self.high:.2f} over {self.pairs} repeats)"

    def judged(self, lower: str, higher: str) -> str:
        """The verdict in the sentence's words with the noise floor it cleared, or why there is none."""
        if not self.decided:
            return self.why_undecided()
        return f"{self.says(lower, higher)} (beyond the noise floor of {self._floor_text()})"

    def _floor_text(self) -> str:
        return f"{self.floor:.1%}"  # as the methods chapter gives it

    def why_undecided(self) -> str:
        """Why there is no verdict, as a clause that follows the value and a colon: noise, or too few repeats."""
        if self.verdict == "too few repeats":
            return (f"with {self.pairs} run{'s' if self.pairs > 1 else ''} of each side, fewer than the "
                    f"{MIN_REPEATS} repeats a verdict needs, this gives no verdict")
        return (f"within the noise (repeats of one configuration spread by {self._floor_text()}), so no difference "
                f"can be told")


def compare(a: list[float], b: list[float], floor: float) -> Comparison:
    """Side A against side B: a[k] and b[k] are repeat k of each, run next to each other in time."""
    if len(a) != len(b):
        raise ValueError(f"{len(a)} repeats against {len(b)}: pairs need as many of each")
    ratios = [x / y for x, y in zip(a, b)]
    ratio = median(ratios)
    if len(ratios) < MIN_REPEATS:
        verdict = "too few repeats"
    elif max(ratios) < 1 and ratio < 1 - floor:
        verdict = "lower"
    elif min(ratios) > 1 and ratio > 1 + floor:
        verdict = "higher"
    else:
        verdict = "no visible difference"
    return Comparison(ratio, min(ratios), max(ratios), len(ratios), floor, verdict)


def noise_floor(repeats: list[list[float]]) -> float:
    """The spread between repeats of one configuration, (max - min) / median, as a median over configurations:
    how far apart two runs of the same thing typically land on this machine. A full range, not a half: a ratio
    of two runs can land that far from 1 when one drew the top of it and the other the bottom."""
    spreads = [(max(values) - min(values)) / median(values) for values in repeats
               if len(values) > 1 and median(values) > 0]  # a quantity a configuration lacks (no all-reduce on 1 rank)
    return median(spreads) if spreads else float("nan")  # nothing repeated: no floor, and no verdict either
