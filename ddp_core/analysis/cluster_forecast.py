"""A forecast for a cluster nobody here ran, built only from what the book validates.

The book's build evaluates it over a grid of choices (`forecast_grid`), and the forecast page only looks one up. Its
bounds are the clusters' forecasts the other chapters quote (`Configuration.speedup_range`).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass

import pandas as pd

from ddp_core.analysis.gpu_measurements import forecast_word
from ddp_core.analysis.nvlink_forecast import FORECAST_GPUS, StepTimeline, nvlink_fit, replay_forecast
from ddp_core.analysis.replay import replay_step
from ddp_core.analysis.similarity import CONFIGURATIONS, Configuration, gpu_step_s
from ddp_core.engine.model_cost import bucket_ready_shares, bucket_sizes, preset_configs
from ddp_core.engine.run_files import READY

FORWARD_SHARE = 1 / 3  # of a step's FLOPs: backward computes two for every one of forward (`training_flops`)
# The interconnects a reader picks, each the configuration of the wind tunnel whose published all-reduce it takes,
# and the most GPUs that configuration's publication measured: beyond, the forecast is flagged as unvalidated.
INTERCONNECTS = {"nvlink": ("a100_nvlink", 8), "ethernet": ("a100_ethernet", 4)}
# The grid the page offers: the book's own choices among them (the large preset, 128 tokens, 8 and 64 a GPU, 40 %).
CHOICES = {
    "preset": ("small", "medium", "large"),
    "seq_len": (128, 256, 512),
    "batch_per_gpu": (8, 16, 32, 64),
    "mfu": (0.2, 0.4, 0.6),
    "interconnect": tuple(INTERCONNECTS),
    "gpus": (2, 4, 8, 16),
}


@dataclass(frozen=True)
class Cluster:
    """One choice of the page: the model and its work per GPU, the GPU's utilisation, and how the GPUs are joined."""

    preset: str  # the project's model presets; "large" is BERT-base's shape
    seq_len: int  # tokens a sequence
    batch_per_gpu: int  # sequences each GPU computes a step
    mfu: float  # the share of the A100's published FP16 matrix-product peak a step reaches
    interconnect: str  # a key of INTERCONNECTS
    gpus: int


def model_of(cluster: Cluster, workload: dict) -> dict:
    """The cluster's model: its preset at the book's vocabulary and classes (a run's `model`) and its length."""
    return preset_configs(workload | {"max_len": cluster.seq_len})[cluster.preset]


def configuration(cluster: Cluster, workload: dict) -> Configuration:
    """The cluster as the wind tunnel's configurations describe one, so that their forecasts apply to it."""
    # the step at the chosen utilisation, the all-reduce of the chosen interconnect
    model, published = model_of(cluster, workload), CONFIGURATIONS[INTERCONNECTS[cluster.interconnect][0]]

    def step_s(_, batch: int) -> float:
        return gpu_step_s(model, batch, cluster.mfu)

    return Configuration(
        f"{cluster.gpus} A100s",
        None,
        step_s,
        step_s,
        published.bucket_allreduce_s,
        published.latency_s,
        published.source,
        preset=cluster.preset,
    )


def flops_timeline(model: dict, step_s: float) -> pd.DataFrame:
    """A step of `step_s` drawn as a trainer's timeline.csv, so that the replay can take it."""
    # Each bucket is ready where backward's FLOPs place it (`bucket_ready_shares`); the optimizer takes no time.
    forward_end = FORWARD_SHARE * step_s
    backward_s = step_s - forward_end
    rows = [("forward", 0.0, forward_end), ("backward", forward_end, step_s), ("optimizer", step_s, step_s)]
    rows += [
        (f"{READY}{k}", forward_end + share * backward_s, forward_end + share * backward_s)
        for k, share in enumerate(bucket_ready_shares(model), start=1)
    ]
    return pd.DataFrame(rows, columns=["what", "start_s", "end_s"])


def cluster_forecast(cluster: Cluster, workload: dict) -> dict:
    """The cluster's forecast for the page: its step and its parts in ms, its speedup with bounds, and its caveats."""
    model, config, n = model_of(cluster, workload), configuration(cluster, workload), cluster.gpus
    shape = workload | {"max_len": cluster.seq_len}
    share_s = gpu_step_s(model, cluster.batch_per_gpu, cluster.mfu)
    whole_s = gpu_step_s(model, cluster.batch_per_gpu * n, cluster.mfu)
    allreduces = config.allreduces_s(shape, n)
    # One GPU's step from the model's FLOPs at a stated share of a published peak. Each bucket's all-reduce over a
    # published interconnect is replayed into backward as DDP issues them.
    step = replay_step(flops_timeline(model, share_s), 1, allreduces)
    low, high = config.speedup_range(shape, cluster.batch_per_gpu * n, n)
    speedup = whole_s / step["step_s"]  # over one GPU stepping the whole batch
    return {
        "step_ms": step["step_s"] * 1e3,
        "compute_ms": share_s * 1e3,
        "exposed_ms": step["exposed_s"] * 1e3,
        "comm_ms": sum(allreduces) * 1e3,
        "speedup": speedup,
        "outcome": forecast_word(low, high),  # the GPU chapter's words
        "efficiency": speedup / n,
        "speedup_no_overlap": low,  # the bounds: no overlap, and only the last bucket exposed
        "speedup_last_bucket": high,
        "break_even_ms": sum(allreduces) * n / (n - 1) * 1e3,  # the whole batch's compute that breaks even
        "whole_ms": whole_s * 1e3,
        "backward_ms": [FORWARD_SHARE * share_s * 1e3, share_s * 1e3],
        # each bucket's all-reduce, start and end, to draw against backward's
        "buckets_ms": [[start * 1e3, end * 1e3] for start, end in step["allreduces_s"]],
        "validated": n <= INTERCONNECTS[cluster.interconnect][1],  # the publication measured that many GPUs
        # Backward is long enough to hide all but the last bucket: the only way the last-bucket bound is reached.
        "last_bucket_reachable": sum(allreduces[:-1]) <= (1 - FORWARD_SHARE) * share_s,
    }


def forecast_grid(workload: dict) -> list[dict]:
    """`cluster_forecast` for every combination of CHOICES, each with its choice."""
    return [
        asdict(cluster) | cluster_forecast(cluster, workload)
        for cluster in itertools.starmap(Cluster, itertools.product(*CHOICES.values()))
    ]


def proportional_check(timelines: list[StepTimeline]) -> pd.DataFrame:
    """What the page's assumption, a step that shrinks in proportion to its batch, does to a measured GPU.

    Each row forecasts the speedup on FORECAST_GPUS GPUs two ways, from the measured share and from the divided whole.
    """
    # Rows: per precision and batch per GPU whose whole batch one GPU also stepped. `measured_share` replays each GPU's
    # measured step (`replay_forecast`, the GPU chapter's). `divided_share` divides the whole batch's step among the
    # GPUs as nodes, as the page's forecasts do.
    fit, whole = nvlink_fit(FORECAST_GPUS), {t.key: t for t in timelines}
    rows = []
    for row in replay_forecast(timelines).dropna(subset=["speedup"]).itertuples():
        timeline = whole[(row.amp, row.global_batch)]
        allreduces = [fit.allreduce_s(size) for size in bucket_sizes(timeline.info["model"])]
        divided = replay_step(timeline.timeline, FORECAST_GPUS, allreduces)
        rows.append(
            {
                "amp": row.amp,
                "batch_per_gpu": row.batch_per_gpu,
                "seq_len": timeline.info["model"]["max_len"],
                "measured_share": row.speedup,
                "divided_share": row.one_gpu_ms / 1e3 / divided["step_s"],
            }
        )
    return pd.DataFrame(rows)
