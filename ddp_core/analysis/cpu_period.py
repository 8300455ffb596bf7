"""Whether the CPU quota's period changes the emulated nodes' step, judged against the study's by the one verdict.

The runs are those of `benchmarks/cpu_period.py`: the study's 4 unshaped nodes at several periods, round by round.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ddp_core.analysis.comparisons import at_world_size, compare_times, time_floor
from ddp_core.analysis.results import Experiment, load_experiment
from ddp_core.launch.cpu_share import PERIOD_US

STUDY_PERIOD_MS = PERIOD_US // 1000  # the period every emulated node's quota runs at


def load_periods(folder: Path) -> dict[int, Experiment]:
    """The runs of `benchmarks/cpu_period.py`, by period in ms, read from `folder`/period-<P>ms."""
    return {
        int(path.name.removeprefix("period-").removesuffix("ms")): load_experiment(path)
        for path in folder.glob("period-*ms")
    }


def period_table(periods: dict[int, Experiment]) -> pd.DataFrame:
    """Per period, its step and the step's parts, and its step judged against the study's period's.

    The parts are compute, exposed all-reduce and all-reduce in flight, in ms.
    """
    floor = time_floor(*periods.values())  # the noise floor from every period's repeats
    rows = []
    for period, e in sorted(periods.items()):
        c = compare_times(e, periods[STUDY_PERIOD_MS], e.largest, e.largest, floor=floor)
        # repeat by repeat; the mean step and its parts are means over the steady epochs of its repeats
        ms = at_world_size(e, e.largest) * 1e3
        rows.append(
            dict(
                period_ms=period,
                median_step_ms=ms["step_time_s"],  # the median of its repeats' median steps
                mean_step_ms=ms["mean_step_s"],
                compute_ms=ms["compute_per_step_s"],
                exposed_ms=ms["comm_exposed_per_step_s"],
                in_flight_ms=ms["comm_total_per_step_s"],
                ratio_to_study=c.ratio,
                low=c.low,
                high=c.high,
                value=c.value(),
                verdict=c.judged("faster", "slower"),
            )
        )
    return pd.DataFrame(rows)
