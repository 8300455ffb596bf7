"""The CPU quota's period of the emulated nodes: the runs of `benchmarks/cpu_period.py` (the study's 4 unshaped
nodes at several periods, round by round), each period's step against the study's through the one verdict function.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ddp_core.analysis.comparisons import at_world_size, compare_times, time_floor
from ddp_core.analysis.results import Experiment, load_experiment
from ddp_core.launch.cpu_share import PERIOD_US

STUDY_PERIOD_MS = PERIOD_US // 1000  # the period every emulated node's quota runs at


def load_periods(folder: Path) -> dict[int, Experiment]:
    """The runs of `benchmarks/cpu_period.py` (`folder`/period-<P>ms: the study's 4 unshaped nodes, round by round),
    by period in ms."""
    return {
        int(path.name.removeprefix("period-").removesuffix("ms")): load_experiment(path)
        for path in folder.glob("period-*ms")
    }


def period_table(periods: dict[int, Experiment]) -> pd.DataFrame:
    """Per period (`load_periods`), the median of its repeats' median steps, its mean step and the mean step's
    compute, exposed all-reduce and all-reduce in flight (means over the steady epochs of its repeats,
    `comparisons.at_world_size`), and its step against the study's period's, repeat by repeat, through the one verdict
    function (the floor from every period's repeats)."""
    floor = time_floor(*periods.values())
    rows = []
    for period, e in sorted(periods.items()):
        c = compare_times(e, periods[STUDY_PERIOD_MS], e.largest, e.largest, floor=floor)
        ms = at_world_size(e, e.largest) * 1e3
        rows.append(
            dict(
                period_ms=period,
                median_step_ms=ms["step_time_s"],
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
