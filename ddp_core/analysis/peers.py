"""ddp_core against the loops a user would write instead: the loop of PyTorch's DDP tutorial, and a loop in Accelerate.

It reads the measurement of `benchmarks/peers`, a folder per device with steps.csv and device.json. A ratio above 1
means ddp_core is faster.

    python -m ddp_core.analysis.peers results/peers/cpu     # prints the table
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
    # A median: a burst of other load moves it far less than a mean.
    steady = m.steps[m.steps["epoch"] > m.steps["epoch"].min()]
    return steady.groupby(["loop", "ranks", "round"])["step_time_s"].median()


def comparisons(m: PeerMeasurement) -> dict[tuple[str, int], Comparison]:
    """(peer, ranks) -> the peer's step time over ddp_core's, round by round: "higher" means ddp_core is faster.

    Each world size has its own noise floor, since its runs spread by their own amount.
    """
    # A round ran every loop once at each world size, back to back. Only rounds that ran both loops are paired.
    times = run_step_times(m)
    found = {}
    for ranks in sorted(m.steps["ranks"].unique()):
        at_size = times.xs(ranks, level="ranks")
        # what pairing by rounds leaves of its loops' run medians
        floor = noise_floor([list(group) for _, group in at_size.groupby("loop")])
        loops = set(at_size.index.get_level_values("loop"))
        for peer in PEERS:
            if {peer, "ddp_core"} <= loops:
                both = pd.concat([at_size[peer], at_size["ddp_core"]], axis=1, join="inner")
                found[peer, int(ranks)] = compare(list(both.iloc[:, 0]), list(both.iloc[:, 1]), floor)
    return found


def speed_table(m: PeerMeasurement) -> pd.DataFrame:
    """Per peer and world size: both loops' steps, their ratio over the rounds, the verdict, and the goal's outcome."""
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
    """The peers' measurement as a page introduces its table: the device, the versions, when, and the workload."""

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
    """Whether ddp_core met its goal against a peer at a world size: "met", "missed" or "not shown".

    "Not shown" means noise alone puts rounds below GOAL_LOWEST, so ddp_core against itself would fall short.
    """
    if round(c.ratio, 2) >= GOAL_MEDIAN and round(c.low, 2) >= GOAL_LOWEST:
        return "met"
    # "Missed" where ddp_core is slower beyond the noise, or the noise is narrower than the shortfall allowed.
    if c.verdict != "lower" and c.floor > 1 - GOAL_LOWEST:
        return "not shown"
    return "missed"


@dataclass(frozen=True)
class Goal:
    """The engine's goal against each peer, as a page states it."""

    median: float
    lowest: float
    shortfall: float  # how far below 1 a round may fall; a wider noise floor cannot show the goal met


def goal() -> Goal:
    """`Goal` of GOAL_MEDIAN and GOAL_LOWEST."""
    return Goal(GOAL_MEDIAN, GOAL_LOWEST, 1 - GOAL_LOWEST)


def print_summary(m: PeerMeasurement) -> None:
    print(speed_markdown(m))


if __name__ == "__main__":
    sys.exit(run_on_folder("ddp_core.analysis.peers", print_summary, load=read_peers))
