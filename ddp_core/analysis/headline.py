"""The first page's headline: the runs whose processes each had compute of their own.

Those are the results chapter's runs on GPUs, the user's cluster. Else they are the emulated nodes over their fastest
links.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ddp_core.analysis.comparisons import Judged, judged_speedup, speedup_comparisons
from ddp_core.analysis.compute_ratio import rank_share_s
from ddp_core.analysis.emulated import link_experiments
from ddp_core.analysis.provenance import runs_shown
from ddp_core.analysis.results import Experiment, point_label
from ddp_core.analysis.speedups import scaling_table
from ddp_core.analysis.tables import noise_format, range_text

EXPOSED = "the all-reduce that backward could not hide"
UNDIVIDED = "compute that did not shrink with N"
BACKENDS = {"nccl": "NCCL", "gloo": "Gloo"}  # as their makers write them


@dataclass(frozen=True)
class HeadlineRuns:
    """The headline's runs and how a sentence names their processes and setting."""

    experiment: Experiment
    units: str  # "NVIDIA A100 GPUs", "emulated nodes"
    setting: str  # "with nccl", "over links set to ratio 2.6"


def headline_runs(scaling: Experiment, nodes: dict[str, Experiment]) -> HeadlineRuns:
    """GPU runs of the results chapter lead; CPU ranks sharing cores add no compute, so the emulated nodes lead then."""
    if scaling.baseline.on_gpu:
        return HeadlineRuns(
            scaling,
            f"{scaling.baseline.device_name} GPUs",
            f"with {BACKENDS.get(scaling.baseline.backend, scaling.baseline.backend)}",
        )
    fastest = next(iter(link_experiments(nodes).values()))
    return HeadlineRuns(fastest, "emulated nodes", f"over links set to {point_label(fastest, fastest.largest)}")


@dataclass(frozen=True)
class Headline:
    """The first page's headline at its most processes: the speedup over one, and which cost held it back most.

    The two costs are the exposed all-reduce and the compute above one's share, in ms of the mean step.
    """

    units: str
    setting: str
    most: int
    speedup: Judged
    speedup_range: str
    efficiency: float
    limit: str
    limit_ms: float
    step_ms: float
    whose: str
    made_when: str
    made_on: str


def headline(scaling: Experiment, nodes: dict[str, Experiment]) -> Headline:
    """`Headline` of the headline's runs (`headline_runs`)."""
    runs = headline_runs(scaling, nodes)
    experiment, largest = runs.experiment, runs.experiment.largest
    comparison = speedup_comparisons(experiment)[largest]
    table = scaling_table(experiment)
    row = table.loc[largest]
    shown = noise_format(comparison.ratio, comparison.floor)
    share = rank_share_s(table.loc[1, "compute_per_step_s"], experiment.baseline, experiment.runs[largest])
    costs = {EXPOSED: row["comm_exposed_per_step_s"], UNDIVIDED: max(row["compute_per_step_s"] - share, 0.0)}
    limit = max(costs, key=costs.get)
    return Headline(
        units=runs.units,
        setting=runs.setting,
        most=largest,
        speedup=judged_speedup(comparison),
        speedup_range=range_text(comparison.low, comparison.high, shown, " to "),
        efficiency=comparison.ratio / largest,
        limit=limit,
        limit_ms=costs[limit] * 1e3,
        step_ms=row["mean_step_s"] * 1e3,
        **asdict(runs_shown(experiment)),
    )
