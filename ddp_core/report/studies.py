"""The studies overview: which results the book shows were made by this build and which were shipped."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ddp_core.analysis.provenance import ResultsFrom, results_shown


@dataclass(frozen=True)
class Findings:
    """What the studies overview quotes."""

    results_from: ResultsFrom


def findings(results: Path, studies: dict) -> Findings:
    """Every result in `results` (book/results), each study titled as the study list `studies` gives it."""
    return Findings(results_from=results_shown(results, studies))
