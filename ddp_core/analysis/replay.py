"""A step on N nodes forecast from one node's step, before any run on N nodes: the replay of Daydream (Zhu et al.,
USENIX ATC 2020), which predicts a distributed step from the trace of one device.

One node's median step (its timeline.csv: forward, backward, optimizer, and the moments each of DDP's gradient
buckets would be complete, `ddp_core.engine.run_files.READY`) is carried to N nodes: a rank computes 1/N of the global
batch, so forward, backward and the moments within backward at which the buckets are ready shrink N times; the
optimizer steps the whole model on every rank and does not, nor does anything else outside forward and backward
(taking the batch, the moments between backward and the optimizer). Then the buckets' all-reduces are replayed in
order on one channel, as DDP issues them: bucket k starts when it is ready and the one before it has finished, and takes
what the all-reduce benchmark measured for its size over the nodes' links (or, for GPUs, a published curve). The
step ends when backward and the last all-reduce have both ended, plus what followed backward on the one node. A
timeline taken at the batch each rank computes is replayed with `nodes=1`: nothing shrinks, only the all-reduces are
added (the GPU forecast does so, since a GPU's step does not shrink in proportion to its batch). What the replay
leaves out is where it errs: on an emulated node the all-reduce's own CPU work (gloo's sums, the kernel's network
stack) competes with backward for the node's quota.
"""

from __future__ import annotations

import pandas as pd

from ddp_core.engine.run_files import READY


def replay_step(timeline: pd.DataFrame, nodes: int, allreduce_s: list[float]) -> dict:
    """The step of one node's `timeline` replayed on `nodes` nodes whose buckets' all-reduces take `allreduce_s`
    (bucket 1 first): its length, its compute, the all-reduce left exposed after backward, and when each bucket's
    all-reduce ran (start and end, from the step's start)."""
    span = timeline.set_index("what")
    start, end = span.loc["forward", "start_s"], span.loc["backward", "start_s"]
    forward, backward = (end - start) / nodes, (span.loc["backward", "end_s"] - end) / nodes
    after = one_node_step_s(timeline) - span.loc["backward", "end_s"]  # the optimizer, and any gap before it
    ready = [(span.loc[f"{READY}{k}", "start_s"] - end) / nodes for k in range(1, len(allreduce_s) + 1)]
    done, spans = 0.0, []  # within backward, from its start: when the last all-reduce so far ends
    for at, seconds in zip(ready, allreduce_s):
        begins, done = max(at, done), max(at, done) + seconds
        spans.append((start + forward + begins, start + forward + done))
    exposed = max(0.0, done - backward)
    return {
        "step_s": start + forward + backward + exposed + after,
        "compute_s": forward + backward + after,
        "exposed_s": exposed,
        "allreduces_s": spans,
    }


def stretched(timeline: pd.DataFrame, step_s: float) -> pd.DataFrame:
    """`timeline` with every moment scaled so that its step lasts `step_s`: the shape of one step, the length of the
    run's median step (`comparisons.median_step`), which is what the steps on N nodes are measured by. The timeline's
    step is one of an epoch's few (the lower median of six in the nodes study), and at an eighth of a core one such step
    ran 6 % shorter than its run's median."""
    scale = step_s / one_node_step_s(timeline)
    return timeline.assign(start_s=timeline["start_s"] * scale, end_s=timeline["end_s"] * scale)


def one_node_step_s(timeline: pd.DataFrame) -> float:
    """The length of the one node's step the replay starts from: to the end of its optimizer."""
    return float(timeline.set_index("what").loc["optimizer", "end_s"])
