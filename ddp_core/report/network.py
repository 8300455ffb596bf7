"""The chapter Over a network: whose runs of the emulated nodes it shows."""

from __future__ import annotations

from dataclasses import dataclass

from ddp_core.analysis.emulated import BASELINE
from ddp_core.analysis.provenance import Whose, runs_shown
from ddp_core.analysis.results import Experiment


@dataclass(frozen=True)
class Findings:
    """What the chapter's introduction quotes."""

    runs: Whose


def findings(nodes: dict[str, Experiment]) -> Findings:
    """Whose the one-node runs of the nodes study are, which stand for every study on the emulated nodes."""
    return Findings(runs=runs_shown(nodes[BASELINE]))
