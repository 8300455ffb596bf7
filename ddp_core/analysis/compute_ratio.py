"""R_N, the theory chapter's compute-to-communication ratio: its one definition, used by every chapter.

It is measured from runs (`speedups.scaling_table`) or taken from the model (`cost_model`). The share of the machine a
rank computes on is here too, since it sets how far a rank's measured compute is from T_c/N.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for the annotations only: results imports the study list, which checks against similarity's
    from ddp_core.analysis.results import RunInfo


def compute_to_comm_ratio(rank_share_s: float, allreduce_s: float) -> float:
    """R_N of the theory chapter: one rank's share of the 1-rank compute over the all-reduce of a step's gradient.

    It is the book's one definition, measured or from the model (`model_compute_to_comm_ratio`). It is not the compute
    a rank measured, which is larger where ranks share cores.
    """
    # (T_c/N) / T_comm(N), as if each rank computed on a device of its own. With shared cores a rank's measured compute
    # exceeds T_c/N, and the theory's break-even does not apply.
    return rank_share_s / allreduce_s


def rank_share_s(one_rank_s: float, one: RunInfo, run: RunInfo) -> float:
    """T_c/N: the 1-rank run's compute per step scaled to `run`'s per-rank batch."""
    return one_rank_s * run.per_rank_batch_size / one.per_rank_batch_size


def cores_per_rank(run: RunInfo) -> float:
    """The CPU a rank computes on, which sets how much compute it can do alone."""
    if run.on_gpu:  # a device of its own
        return 1.0
    share = run.raw.get("network", {}).get("cpus_per_node")
    if share:  # an emulated node with a CPU quota: its node's share
        return min(run.threads_per_rank, share / run.raw["network"]["ranks_per_node"])
    # else its threads, or its part of the cores when the ranks on the machine outnumber them
    return min(run.threads_per_rank, run.cpu_count / run.ranks_on_machine)
