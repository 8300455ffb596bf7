"""A step on N nodes forecast from one node's step, before any run on N nodes.

It is the replay of Daydream (Zhu et al., USENIX ATC 2020), which predicts a distributed step from one device's
trace. It leaves out the all-reduce's own CPU work: gloo's sums and the kernel's network stack. On an emulated node
that work competes with backward for the node's quota, which is where the replay errs.
"""

from __future__ import annotations

import pandas as pd

from ddp_core.engine.run_files import READY


def replay_step(timeline: pd.DataFrame, nodes: int, allreduce_s: list[float]) -> dict:
    """One node's `timeline` replayed on `nodes` nodes whose buckets' all-reduces take `allreduce_s`, bucket 1 first.

    It returns the step's length, its compute, the all-reduce exposed after backward, and when each all-reduce ran.
    """
    # The timeline is one node's median step: forward, backward, optimizer, and when each DDP bucket is ready.
    # A rank computes 1/N of the global batch, so forward, backward and the ready moments shrink N times.
    # Use nodes=1 for a timeline taken at each rank's batch: only the all-reduces are added. The GPU forecast does so.
    span = timeline.set_index("what")
    # `start` is taking the batch, before forward: it does not shrink.
    start, end = span.loc["forward", "start_s"], span.loc["backward", "start_s"]
    forward, backward = (end - start) / nodes, (span.loc["backward", "end_s"] - end) / nodes
    # The optimizer steps the whole model on every rank, so it does not shrink; nor does any gap before it.
    after = one_node_step_s(timeline) - span.loc["backward", "end_s"]
    ready = [(span.loc[f"{READY}{k}", "start_s"] - end) / nodes for k in range(1, len(allreduce_s) + 1)]
    # One channel, in DDP's order: a bucket starts when it is ready and the one before it has finished.
    # Its time is the benchmark's for its size over the nodes' links, or a published curve for GPUs.
    done, spans = 0.0, []  # within backward, from its start: when the last all-reduce so far ends
    for at, seconds in zip(ready, allreduce_s):
        begins, done = max(at, done), max(at, done) + seconds
        spans.append((start + forward + begins, start + forward + done))
    # The step ends when backward and the last all-reduce have both ended, plus what followed backward.
    exposed = max(0.0, done - backward)
    return {
        "step_s": start + forward + backward + exposed + after,
        "compute_s": forward + backward + after,
        "exposed_s": exposed,
        "allreduces_s": spans,
    }


def stretched(timeline: pd.DataFrame, step_s: float) -> pd.DataFrame:
    """`timeline` scaled so that its step lasts `step_s`: one step's shape at the run's median step length.

    The steps on N nodes are measured by the median, so the one-node step is too.
    """
    # The timeline's step is one of an epoch's few, the lower median of six in the nodes study. At an eighth of a core
    # one such step ran 6 % shorter than its run's median.
    scale = step_s / one_node_step_s(timeline)
    return timeline.assign(start_s=timeline["start_s"] * scale, end_s=timeline["end_s"] * scale)


def one_node_step_s(timeline: pd.DataFrame) -> float:
    """The length of the one node's step the replay starts from: to the end of its optimizer."""
    return float(timeline.set_index("what").loc["optimizer", "end_s"])
