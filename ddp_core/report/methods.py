"""The methods chapter: what the runs of the results chapter rest on, how a comparison is judged, and how quiet the
machine was."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ddp_core.analysis.comparisons import POWER_DRAWS, WARMUP_STEPS, Noise, noise
from ddp_core.analysis.provenance import Whose, runs_shown
from ddp_core.analysis.results import EMULATED_OTHER_CORES, OTHER_CORES, OUT_OF_LINE, STOLEN, Experiment
from ddp_core.analysis.verdict import DRAWS, MIN_REPEATS, Z


@dataclass(frozen=True)
class Findings:
    """What the methods page quotes."""

    runs: Whose
    warmup_steps: int
    min_repeats: int
    floor_z: float
    noise: Noise
    rule_draws: int
    identical_called: float
    power_draws: int
    other_cores_limit: float
    stolen_limit: float
    emulated_other_cores_limit: float
    out_of_line: float
    out_of_line_low: float


def findings(experiment: Experiment, rates: pd.DataFrame) -> Findings:
    """The rule's settings and this build's floor on the strong-scaling runs, and when a run counts as disturbed or
    out of line. `rates` (`rule_rates_table`) tells how often the rule called identical configurations different."""
    return Findings(
        runs=runs_shown(experiment),
        warmup_steps=WARMUP_STEPS,
        min_repeats=MIN_REPEATS,
        floor_z=Z,
        noise=noise(experiment),
        rule_draws=DRAWS,
        identical_called=rates.set_index("effect")["called"][0.0],
        power_draws=POWER_DRAWS,
        other_cores_limit=OTHER_CORES,
        stolen_limit=STOLEN,
        emulated_other_cores_limit=EMULATED_OTHER_CORES,
        out_of_line=OUT_OF_LINE,
        out_of_line_low=1 / OUT_OF_LINE,
    )
