"""The set-up chapter: when and on what the book's results were made, and what the results chapter's runs were."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ddp_core.analysis.provenance import Made, StudySetup, made, shown_folder, study_setup
from ddp_core.analysis.results import Experiment
from ddp_core.analysis.tables import day, in_words


@dataclass(frozen=True)
class Findings:
    """What the set-up page quotes."""

    made: Made
    setup: StudySetup
    measured_on: str
    hostname: str
    world_sizes: str
    repeats: str
    dataset: str
    folder: str


def findings(experiment: Experiment, results: Path) -> Findings:
    """When and on what every result in `results` was made. Also where the results chapter's runs ran, on how many
    ranks and repeats, on which dataset, from which folder."""
    first = experiment.baseline.raw
    counts = sorted({len(runs) for runs in experiment.repeats.values()})
    return Findings(
        made=made(results),
        setup=study_setup(experiment),
        measured_on=day(min(run.raw["start_time"] for run in experiment.all_runs)),
        hostname=first["hostname"],
        world_sizes=", ".join(map(str, experiment.runs)),
        repeats="one run per world size"
        if counts == [1]
        else f"{' to '.join(map(str, counts))} runs per world size, each with its own seed",
        dataset=in_words(first["config"]["dataset"]),
        folder=shown_folder(experiment)[0],
    )
