"""The real configurations the emulated cluster stands for, each by its compute-to-communication ratio R_N^bench.

That ratio decides what DDP gains on a configuration. A wind tunnel matches the Reynolds number, not the wind speed.
So the emulated links are set to match the real R_N, and a faster or slower CPU models the same configuration.

The emulated nodes match a configuration in that number only. So a page names them by it, and shows the cluster's own
forecast (`Configuration.speedup_range`) beside any result that names the cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Callable

import pandas as pd

from ddp_core.engine.model_cost import bucket_sizes, preset_configs, training_flops
from ddp_core.paths import REPO_ROOT
from ddp_core.analysis.compute_ratio import compute_to_comm_ratio
from ddp_core.analysis.nvlink_forecast import LITERATURE, SHARE_LOOP, WHOLE_LOOP, nvlink_fit, peak_gemm_flops_per_s
from ddp_core.analysis.results import read_measurement

# R_N comes from published figures kept with their source in `literature/`, or from the GPU this project measured.
# The nodes study's similarity test measures how far a faster or slower CPU still models the same configuration.
PRESET = "large"  # the model every configuration trains
A100_MFU = 0.4  # the share of the A100's peak its step reaches (nvlink_forecast.MFU_SCENARIOS says why 40 %)
H200_MEASUREMENT = REPO_ROOT / "reference" / "single_device" / "cuda-nvidia-h200"
H200_PRECISION, H200_GLOBAL_BATCH = "bf16", 128  # the measured step: 4 GPUs at 32 sequences each
ETHERNET_FILE = LITERATURE / "gcp_32gbe_allreduce.csv"
ETHERNET_GLOBAL_BATCH = 256  # 64 sequences a GPU on 4 GPUs: DDP near its break-even there


class SimilarityError(Exception):
    """A configuration that cannot be computed (its measurement missing), in one line."""


def large_model(workload: dict) -> dict:
    """The large preset at the workload's vocabulary, sequence length and classes (a run's `model`)."""
    return preset_configs(workload)[PRESET]


def gpu_step_s(model: dict, samples: int, mfu: float) -> float:
    """One A100's step of `samples` sequences of `model`: its training FLOPs at `mfu` of the published peak."""
    return training_flops(model, samples * model["max_len"]) / (peak_gemm_flops_per_s() * mfu)


def a100_step_s(workload: dict, global_batch: int) -> float:
    """One A100's step of the whole batch of the large model at A100_MFU."""
    return gpu_step_s(large_model(workload), global_batch, A100_MFU)


@cache  # one measurement, read once per batch and loop
def h200_step_s(batch: int, loop: str) -> float:
    """One H200's step of `batch` sequences as measured in `loop` (timers off), summed over the rounds."""
    if not (H200_MEASUREMENT / "epochs.csv").is_file():
        raise SimilarityError(f"the H200 configuration needs the GPU measurement in {H200_MEASUREMENT}")
    rows = read_measurement(H200_MEASUREMENT).epochs.query(
        "preset == @PRESET and amp == @H200_PRECISION and batch_size == @batch and loop == @loop"
    )
    if rows.empty:
        raise SimilarityError(f"{H200_MEASUREMENT}: no step of the {PRESET} model in {H200_PRECISION} at batch {batch}")
    return float(rows["seconds"].sum() / rows["samples"].sum() * batch)


def nvlink_bucket_s(size_bytes: float, gpus: int) -> float:
    """A bucket all-reduced over NVLink on `gpus` GPUs, by the published curve's fit."""
    return nvlink_fit(gpus).allreduce_s(size_bytes)


@cache
def ethernet_busbw() -> float:
    """The published bus bandwidth in bytes per second: the median of its runs."""
    return float(pd.read_csv(ETHERNET_FILE, comment="#")["busbw_gbit_s"].median() * 1e9 / 8)


def ethernet_bucket_s(size_bytes: float, gpus: int) -> float:
    """A bucket all-reduced by a ring at the published bus bandwidth, with no latency term.

    That is a lower bound on the time, so R_N is the configuration's best case.
    """
    return 2 * (gpus - 1) / gpus * size_bytes / ethernet_busbw()


def nvlink_latency_s(gpus: int) -> float:
    return nvlink_fit(gpus).alpha_s


def unpublished(gpus: int) -> float:
    return float("nan")


@dataclass(frozen=True)
class Configuration:
    """A real cluster: what the page calls it, its batch, and how its steps and all-reduce are known."""

    name: str  # the words a page names it by
    global_batch: int | None  # None: the study's own
    step_s: Callable[[dict, int], float]  # (workload, batch) -> one GPU's step of `batch` samples, alone
    share_step_s: Callable[[dict, int], float]  # (workload, batch) -> the same inside DDP, without communication
    bucket_allreduce_s: Callable[[float, int], float]  # (bucket bytes, GPUs) -> its all-reduce
    latency_s: Callable[[int], float]  # GPUs -> the all-reduce's latency term alpha; NaN where not published
    source: str
    preset: str = PRESET  # the model it trains, at the workload's vocabulary, length and classes

    def batch(self, study_batch: int) -> int:
        return self.global_batch or study_batch

    def allreduces_s(self, workload: dict, gpus: int) -> list[float]:
        """Each of the model's gradient buckets all-reduced on `gpus` GPUs, the last one to be ready last."""
        return [self.bucket_allreduce_s(size, gpus) for size in bucket_sizes(preset_configs(workload)[self.preset])]

    def ratio(self, workload: dict, study_batch: int, nodes: int) -> float:
        """R_N^bench of this configuration on `nodes` GPUs, for a run's workload (its `model`) and global batch."""
        # As the emulated side takes it (`compute_ratio`): the whole batch's step over N, as if each GPU did exactly
        # its share, over the sum of the buckets' all-reduces as a benchmark times them.
        step = self.step_s(workload, self.batch(study_batch))
        return compute_to_comm_ratio(step / nodes, sum(self.allreduces_s(workload, nodes)))

    def speedup_range(self, workload: dict, study_batch: int, nodes: int) -> tuple[float, float]:
        """The cluster's own forecast speedup range on `nodes` GPUs over one, shown beside results naming it."""
        # Each GPU steps its share, then waits for every bucket's all-reduce (lowest) or the last (highest).
        batch = self.batch(study_batch)
        whole, share = self.step_s(workload, batch), self.share_step_s(workload, batch // nodes)
        buckets = self.allreduces_s(workload, nodes)
        return whole / (share + sum(buckets)), whole / (share + buckets[-1])


CONFIGURATIONS = {
    # One H200's step of the whole batch, measured by `benchmarks/single_device.py` in bf16 with timers off; the
    # all-reduce from the same published A100 curve.
    "h200_nvlink": Configuration(
        "H200s over NVLink",
        H200_GLOBAL_BATCH,
        lambda workload, batch: h200_step_s(batch, WHOLE_LOOP),
        lambda workload, batch: h200_step_s(batch, SHARE_LOOP),
        nvlink_bucket_s,
        nvlink_latency_s,
        "one H200's step measured by this project (reference/single_device/cuda-nvidia-h200, from the lease in "
        "reference/gpu_lease); the all-reduce from Azure's published "
        "ND A100 v4 curve (an A100's NVLink: the H200's is faster)",
    ),
    # The prediction chapter's forecast: published all-reduce and matrix-product rates, a step at A100_MFU of the peak,
    # at the study's global batch.
    "a100_nvlink": Configuration(
        "A100s over NVLink",
        None,
        a100_step_s,
        a100_step_s,
        nvlink_bucket_s,
        nvlink_latency_s,
        f"Azure's published ND A100 v4 all-reduce curve and matrix-product rate, a step at {A100_MFU:.0%} of it",
    ),
    # One A100 a node over 32 Gbit/s Ethernet, NCCL over TCP: where DDP struggles, at ETHERNET_GLOBAL_BATCH.
    "a100_ethernet": Configuration(
        "A100s over 32 Gbit/s Ethernet",
        ETHERNET_GLOBAL_BATCH,
        a100_step_s,
        a100_step_s,
        ethernet_bucket_s,
        unpublished,
        "NCCL over TCP on 32 Gbit/s Ethernet as published in NVIDIA/nccl#209; the A100's step as above",
    ),
}


def configuration(name: str) -> Configuration:
    if name not in CONFIGURATIONS:
        raise SimilarityError(
            f"no configuration {name!r} to model; the configurations are: {', '.join(CONFIGURATIONS)}"
        )
    return CONFIGURATIONS[name]
