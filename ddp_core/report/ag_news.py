"""The AG News study's page: the results chapter's scaling on a second dataset, with its accuracy against chance."""

from __future__ import annotations

from dataclasses import dataclass

from ddp_core.analysis.comparisons import Judged, against_chance, chance_bar
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
    eval_samples: int | None
    eval_fraction: float  # of the one split AG News ships here, held out for evaluation
    chance: float
    chance_bar: float
    accuracy_vs_chance_n1: str
    accuracy_vs_chance_nmax: str
    setup: StudySetup


def findings(news: Experiment) -> Findings:
    """The study's runs against one rank, and against a classifier that guesses."""
    chance, bar = chance_bar(news.baseline)
    most = largest(news)
    return Findings(
        largest=most.largest,
        placement=most.placement,
        speedup_nmax=most.speedup_nmax,
        accuracy_nmax=most.accuracy_nmax,
        eval_samples=news.baseline.config["eval_samples"],
        eval_fraction=EVAL_FRACTION_WHEN_UNSPLIT,
        chance=chance,
        chance_bar=bar,
        accuracy_vs_chance_n1=against_chance(news, 1),
        accuracy_vs_chance_nmax=against_chance(news, news.largest),
        setup=study_setup(news),
    )
