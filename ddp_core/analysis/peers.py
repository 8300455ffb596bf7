"""ddp_core against the loops a user would write instead (the loop of PyTorch's DDP tutorial, a loop in
Accelerate), from the measurement of `benchmarks/peers` (a folder per device: steps.csv, device.json).

    python -m ddp_core.analysis.peers results/peers/cpu     # prints the table

A run's step time is the median of its steps after the first epoch (a burst of other load moves a median far
less than a mean). A round ran every loop once at each world size, back to back; its ratio is a peer's step
time over ddp_core's at the same world size, so above 1 means ddp_core is faster. The ratio is given as the
median over the rounds with its range, and whether ddp_core is faster is the one verdict function's call
(`verdict.compare`, the rounds paired) against the noise floor of its world size: what pairing by rounds leaves of
the loops' run medians there (`verdict.noise_floor`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ddp_core.analysis.results import load_per_device, read_device_files, run_on_folder
from ddp_core.analysis.tables import counted, measured_by, median_range, quantity_table
from ddp_core.analysis.verdict import Comparison, compare, noise_floor

# benchmarks/peers's loops other than ddp_core, as the page names them
PEERS = {"tutorial": "DDP tutorial loop", "accelerate": "Accelerate loop"}
# The engine's goal against each peer: a median ratio of at least GOAL_MEDIAN, no round below GOAL_LOWEST.
GOAL_MEDIAN, GOAL_LOWEST = 1.00, 0.97


@dataclass
class PeerMeasurement:
    name: str  # the device, as benchmarks/peers names its folder
    info: dict
    steps: pd.DataFrame


def read_peers(folder: str | Path) -> PeerMeasurement:
    return PeerMeasurement(*read_device_files(folder, "steps.csv", "peers measurement"))


def load_peer_measurements(folder: str | Path) -> list[PeerMeasurement]:
    return load_per_device(folder, read_peers)


def run_step_times(m: PeerMeasurement) -> pd.Series:
    """Each run's median step in seconds, after its first epoch: indexed by loop, ranks and round."""
    steady = m.steps[m.steps["epoch"] > m.steps["epoch"].min()]
    return steady.groupby(["loop", "ranks", "round"])["step_time_s"].median()


def comparisons(m: PeerMeasurement) -> dict[tuple[str, int], Comparison]:
    """(peer, ranks) -> the peer's step time over ddp_core's, round by round: "higher" means ddp_core is faster.
    Only rounds that ran both loops are paired; each world size is held against its own noise floor (the noise
    that pairing by rounds leaves of its loops' times), since its runs spread by their own amount."""
    times = run_step_times(m)
    found = {}
    for ranks in sorted(m.steps["ranks"].unique()):
        at_size = times.xs(ranks, level="ranks")
        floor = noise_floor([list(group) for _, group in at_size.groupby("loop")])
        loops = set(at_size.index.get_level_values("loop"))
        for peer in PEERS:
            if {peer, "ddp_core"} <= loops:
                both = pd.concat([at_size[peer], at_size["ddp_core"]], axis=1, join="inner")
                found[peer, int(ranks)] = compare(list(both.iloc[:, 0]), list(both.iloc[:, 1]), floor)
    return found


def speed_table(m: PeerMeasurement) -> pd.DataFrame:
    """Per peer and world size: both loops' median step (over the rounds), the ratio's median and range over the
    rounds, its noise floor, the verdict on ddp_core and whether it met its goal."""
    times = run_step_times(m).groupby(["loop", "ranks"]).median()
    return pd.DataFrame(
        [
            {
                "peer": peer,
                "ranks": ranks,
                "peer_step_ms": times[peer, ranks] * 1e3,
                "ddp_core_step_ms": times["ddp_core", ranks] * 1e3,
                "ratio": c.ratio,
                "low": c.low,
                "high": c.high,
                "rounds": c.pairs,
                "floor": c.floor,
                "verdict": c.says("ddp_core slower", "ddp_core faster"),
                "goal": goal_outcome(c),
            }
            for (peer, ranks), c in comparisons(m).items()
        ]
    )


def speed_markdown(m: PeerMeasurement) -> str:
    table = speed_table(m)
    table.index = [
        f"{PEERS[peer][0].upper()}{PEERS[peer][1:]}, {counted(n, 'rank')}"
        for peer, n in zip(table["peer"], table["ranks"])
    ]
    table["ratio_text"] = list(map(median_range, table["ratio"], table["low"], table["high"]))
    columns = {
        "peer_step_ms": ("The loop's median step (ms)", "{:.1f}"),
        "ddp_core_step_ms": ("ddp_core's median step (ms)", "{:.1f}"),
        "ratio_text": ("ddp_core's speed relative to it (median of the rounds' ratios, range)", "{}"),
        "floor": ("Noise floor", "{:.1%}"),
        "verdict": ("Verdict", "{}"),
        "goal": ("Goal", "{}"),
    }
    return quantity_table(table, columns, "Loop, world size")


@dataclass(frozen=True)
class PeerRuns:
    """The peers' measurement as a page introduces its table: the device, PyTorch and Accelerate, the day and the code
    commit, and the workload (rounds, epochs a run, training samples)."""

    device: str
    torch: str
    accelerate: str
    measured_on: str
    commit: str
    rounds: int
    epochs: int
    samples: str


def peer_runs(m: PeerMeasurement) -> PeerRuns:
    """`PeerRuns` of a measurement, from its device.json and steps."""
    info = m.info
    return PeerRuns(
        device=info["device_name"],
        torch=info["torch"],
        accelerate=info["accelerate"],
        **measured_by(info),
        rounds=m.steps["round"].nunique(),
        epochs=info["epochs"],
        samples=info["workload"][info["workload"].index("--train-samples") + 1],
    )


def goal_outcome(c: Comparison) -> str:
    """Whether ddp_core met its goal against a peer at a world size: "met" with a median ratio of at least
    GOAL_MEDIAN and no round below GOAL_LOWEST; short of it "missed" where ddp_core is slower beyond the noise or
    the noise is narrower than a round may fall short, and "not shown" elsewhere: there noise alone puts rounds
    below GOAL_LOWEST (ddp_core against itself would fall short)."""
    if round(c.ratio, 2) >= GOAL_MEDIAN and round(c.low, 2) >= GOAL_LOWEST:
        return "met"
    if c.verdict != "lower" and c.floor > 1 - GOAL_LOWEST:
        return "not shown"
    return "missed"


@dataclass(frozen=True)
class Goal:
    """The engine's goal against each peer, as a page states it: the median ratio and the lowest round it asks for,
    and how far below 1 that lets a round fall (a noise floor wider than this cannot show the goal met)."""

    median: float
    lowest: float
    shortfall: float


def goal() -> Goal:
    """`Goal` of GOAL_MEDIAN and GOAL_LOWEST."""
    return Goal(GOAL_MEDIAN, GOAL_LOWEST, 1 - GOAL_LOWEST)


def print_summary(m: PeerMeasurement) -> None:
    print(speed_markdown(m))


if __name__ == "__main__":
    sys.exit(run_on_folder("ddp_core.analysis.peers", print_summary, load=read_peers))
