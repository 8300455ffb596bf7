"""The AG News study's page: the results chapter's scaling on a second dataset, with its accuracy against chance."""

from __future__ import annotations

from dataclasses import dataclass

from ddp_core.analysis.comparisons import Chance, Judged, against_chance, chance_at
from ddp_core.analysis.provenance import StudySetup, study_setup
from ddp_core.analysis.results import Experiment
from ddp_core.analysis.speedups import largest
from ddp_core.engine.config import EVAL_FRACTION_WHEN_UNSPLIT


@dataclass(frozen=True)
class Findings:
    """What the AG News page quotes: the speedup and accuracy at the most ranks, and the accuracy against guessing."""

    largest: int
    placement: str
    speedup_nmax: Judged
    accuracy_nmax: Judged
    eval_fraction: float  # of the one split AG News ships here, held out for evaluation
    accuracy: Chance  # one rank's final accuracy against guessing
    accuracy_vs_chance_nmax: str
    setup: StudySetup


def findings(news: Experiment) -> Findings:
    """The study's runs against one rank, and against a classifier that guesses."""
    most = largest(news)
    return Findings(
        largest=most.largest,
        placement=most.placement,
        speedup_nmax=most.speedup_nmax,
        accuracy_nmax=most.accuracy_nmax,
        eval_fraction=EVAL_FRACTION_WHEN_UNSPLIT,
        accuracy=chance_at(news, 1),
        accuracy_vs_chance_nmax=against_chance(news, news.largest),
        setup=study_setup(news),
    )
