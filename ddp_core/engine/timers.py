"""Per-epoch phase and communication timers for a DDP training loop.

How each number is measured (the report's methods chapter cites this):

Clock. Every timestamp is taken on the timeline that limits throughput. On a GPU that is the
device stream. A `torch.cuda.Event` is recorded at each boundary. All of them are converted to
seconds once, at the end of the epoch, after one `torch.cuda.synchronize()`. No step is ever
synchronised for the sake of measuring it. On a CPU the timestamps are `time.perf_counter()`.
Host work that overlaps with GPU work already queued therefore costs nothing on a GPU, which is
the truth about its cost.

Phases. A phase is the span between two consecutive boundaries, summed over the epoch's
micro-steps. The `data` phase takes the next batch and moves it to the device. The `forward` phase
runs the model and the loss. The `backward` phase is `loss.backward()`. In DDP it returns only once
every gradient bucket has been all-reduced. The `optimizer` phase is the AdamW step, the
learning-rate schedule and the zeroing of the gradients.

Communication. DDP hands each gradient bucket to a communication hook as soon as all of its
gradients are ready. Meanwhile the backward pass carries on with earlier layers. The hook here is
the run's own: PyTorch's averaging all-reduce, or a compressing one (`--comm-hook`). Two timestamps
are added to it: when the bucket was handed over, and when its reduced result was ready. The second
is recorded in the future's callback. On a GPU that callback runs on a stream that waits for the
NCCL kernel.

- `comm_total_s` is the time during which at least one all-reduce was in flight. It is the length
  of the union of the per-bucket [handed over, reduced] intervals. Buckets queue behind each other
  on one communication stream, so the union counts each moment once.
- `comm_exposed_s` is the communication that backward could not hide. Per optimizer step, it runs
  from the moment the last bucket was handed over to the moment the last all-reduce completed. The
  backward computation is finished at the first of these moments. So this is the time the step
  waits for the network before the optimizer may run. It is part of `backward_time_s` and never
  exceeds `comm_total_s`.

Timeline. The median step of each epoch, by wall time, is also kept whole (`median_step_timeline`).
It holds the step's phases and each bucket's all-reduce on one time axis. On one rank DDP forms no
buckets. There the timeline holds instead the moment each of DDP's buckets would be complete
(`gradient_ready`), from a hook on every parameter's gradient. The trainer writes the timeline to
timeline.csv for the run's last epoch. It keeps the median step, not the last, so that the step
drawn is a typical one. The last step might be one that a burst of other load happened to stretch.

Steps. Each optimizer step's wall time and its exposed communication are also kept one by one,
as `summary`'s second value. The report takes a median over steps. A burst of other load on the
machine moves a median far less than a mean. A step's time runs from the end of the step before it
to the end of its optimizer phase. For an epoch's first step, it runs from the epoch's start. So a
step holds whatever the loop does between steps too, and the steps of an epoch add up to its time.
A loop timed from outside, step end to step end, is measured the same way. The script
`benchmarks/peers/step_clock.py` times other loops so. An evaluation inside the epoch
(--eval-every-steps) is timed as the phase `eval`. It is left out of the step after it.

What this leaves out. When compute and communication share a resource, communication also slows
the backward computation it overlaps with. On a CPU that resource is the same cores. On a GPU it is
the SMs and memory bandwidth that NCCL kernels use. That cost shows up as a longer
`backward_time_s` than in a 1-rank run with the same per-rank batch. It does not show up in
`comm_exposed_s`. A 1-rank run has no process group and no DDP wrapper, so its communication is
exactly zero.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

import torch

from ddp_core.engine.run_files import READY

PHASES = ("data", "forward", "backward", "optimizer")


class Clock:
    """Timestamps on the timeline that limits throughput: the device stream on a GPU, perf_counter on a CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.origin = None

    def now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def reset(self):
        self.origin = self.now()

    def seconds(self, stamp) -> float:
        """Seconds since `reset()`. On a GPU it is valid only after the device was synchronised."""
        if not self.cuda:
            return stamp - self.origin
        return self.origin.elapsed_time(stamp) / 1000.0


class EpochTimer:
    """Collects phase spans and per-bucket all-reduce spans for one epoch at a time."""

    def __init__(self, device: torch.device, enabled: bool = True, communication: bool = True):
        self.enabled = enabled
        self.communication = communication  # False where no DDP hook sees the collectives (FSDP2): not measured
        self.clock = Clock(device)
        self.begin_epoch()

    def begin_epoch(self) -> None:
        self.median_step_timeline = []
        self.phase_spans = defaultdict(list)
        self.comm_spans_per_step = []
        self.ready_per_step = []
        self.step_starts = []
        if self.enabled:
            self.clock.reset()

    @contextmanager
    def phase(self, name: str):
        if not self.enabled:
            yield
            return
        start = self.clock.now()
        yield
        self.phase_spans[name].append((start, self.clock.now()))

    def begin_step(self) -> None:
        """Marks the start of an optimizer step: all-reduces after this belong to it."""
        self.comm_spans_per_step.append([])
        self.ready_per_step.append({})
        if self.enabled:
            self.step_starts.append(self.clock.now())

    def gradient_ready(self, bucket: int) -> None:
        """A gradient of DDP's bucket `bucket` is ready, on one rank where no DDP forms the buckets."""
        # A step's last call for a bucket marks the whole bucket ready: when DDP would hand it to its all-reduce.
        if self.enabled:
            self.ready_per_step[-1][bucket] = self.clock.now()

    def timed(self, hook):
        """DDP communication hook `hook` (state, bucket) -> future, with each bucket's span recorded."""

        def timed_hook(state, bucket):
            spans = self.comm_spans_per_step[-1]
            handed_over = self.clock.now()

            def reduced(fut):
                spans.append((handed_over, self.clock.now()))
                return fut.value()

            return hook(state, bucket).then(reduced)

        return timed_hook

    def allreduces_in_last_step(self) -> int | None:
        """Buckets the last optimizer step all-reduced: one per bucket DDP formed (none when not timed)."""
        timed = self.enabled and self.communication and self.comm_spans_per_step
        return len(self.comm_spans_per_step[-1]) if timed else None

    def summary(self) -> tuple[dict[str, float], dict[str, list[float]]]:
        """Seconds per phase with `comm_total_s` and `comm_exposed_s`, and each step's `step_time_s` and
        `comm_exposed_s`. It covers the steps since `begin_epoch`: the epoch's at its end, those so far at a mid-epoch
        checkpoint."""
        if not self.enabled:  # NaN totals, and no steps
            totals = {f"{name}_time_s": float("nan") for name in PHASES} | {
                "comm_total_s": float("nan"),
                "comm_exposed_s": float("nan"),
            }
            return totals, {"step_time_s": [], "comm_exposed_s": []}
        if self.clock.cuda:
            torch.cuda.synchronize()
        sec = self.clock.seconds
        totals = {f"{name}_time_s": sum(sec(b) - sec(a) for a, b in self.phase_spans[name]) for name in PHASES}
        step_spans = [[(sec(a), sec(b)) for a, b in spans] for spans in self.comm_spans_per_step]
        totals["comm_total_s"] = union_length([span for spans in step_spans for span in spans])
        # 0 where no hook ran: one rank.
        exposed = [max(b for _, b in spans) - max(a for a, _ in spans) if spans else 0.0 for spans in step_spans]
        totals["comm_exposed_s"] = sum(exposed)
        step_ends = [sec(end) for _, end in self.phase_spans["optimizer"]]
        evals = [(sec(a), sec(b)) for a, b in self.phase_spans["eval"]]
        steps = {
            "step_time_s": [
                end - start - sum(b - a for a, b in evals if start <= a < end)
                for start, end in zip([0.0] + step_ends, step_ends)
            ],
            "comm_exposed_s": exposed,
        }
        if not self.communication:  # FSDP2: no hook times the collectives
            totals["comm_total_s"] = totals["comm_exposed_s"] = float("nan")
            steps["comm_exposed_s"] = [float("nan")] * len(steps["step_time_s"])
        times = steps["step_time_s"]
        median = sorted(range(len(times)), key=times.__getitem__)[(len(times) - 1) // 2] if times else -1
        self.median_step_timeline = self._timeline(median, step_spans[median] if step_spans else [])
        return totals, steps

    def _timeline(self, step: int, buckets: list[tuple[float, float]]) -> list[dict]:
        """The rows of timeline.csv: optimizer step `step`'s phases and each bucket's all-reduce, in seconds from its
        start. On one rank it holds when each bucket's gradients were ready instead. `ddp_core.analysis.replay` replays
        the step on N ranks from it."""
        if step < 0:
            return []
        sec = self.clock.seconds
        start, end = sec(self.step_starts[step]), sec(self.phase_spans["optimizer"][step][1])
        rows = [
            {"what": name, "start_s": sec(a) - start, "end_s": sec(b) - start}
            for name in PHASES
            for a, b in self.phase_spans[name]
            if start <= sec(a) and sec(b) <= end
        ]
        rows += [
            {"what": f"all-reduce, bucket {k}", "start_s": a - start, "end_s": b - start}
            for k, (a, b) in enumerate(buckets, 1)
        ]
        rows += [
            {"what": f"{READY}{k}", "start_s": sec(at) - start, "end_s": sec(at) - start}
            for k, at in sorted(self.ready_per_step[step].items())
        ]
        return sorted(rows, key=lambda row: row["start_s"])


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by a set of intervals, each moment counted once."""
    total, covered_until = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > covered_until:
            total += end - max(start, covered_until)
            covered_until = end
    return total
