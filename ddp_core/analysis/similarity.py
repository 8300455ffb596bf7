"""The real configurations the emulated cluster stands for, each by the number that decides what DDP gains on it: its
compute-to-communication ratio R_N^bench, a GPU's share of the step over the all-reduce of the step's gradient.

A wind tunnel matches the Reynolds number, not the wind speed. The emulated nodes' links are set so that their R_N,
measured on the host that runs them, equals the real configuration's (`ddp_core.studies.wind_tunnel`), so that a
faster or slower CPU models the same configuration as far as that ratio decides (the nodes study's similarity test
measures how far). Each configuration's R_N comes from
published figures kept with their source in `literature/`, or from the GPU this project measured:

- the large model on A100s over NVLink: the prediction chapter's forecast (published all-reduce and matrix-product
  rates, a step at `A100_MFU` of the peak), the study's global batch;
- the large model on H200s over NVLink: one H200's step of the whole batch as `benchmarks/single_device.py` measured
  it (`H200_MEASUREMENT`, bf16, the trainer with timers off), the all-reduce from the same published A100 curve;
- the large model on A100s, one a node, over 32 Gbit/s Ethernet (NCCL over TCP, a published bus bandwidth): the
  configuration where DDP struggles, at a global batch of `ETHERNET_GLOBAL_BATCH`.

R_N is taken as the emulated side takes it (`ddp_core.analysis.compute_ratio`): the whole batch's step over N, as if
each GPU did exactly its share, over the sum of the model's gradient buckets' all-reduces as a benchmark times them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pandas as pd

from ddp_core.engine.model_cost import bucket_sizes, preset_configs, training_flops
from ddp_core.paths import REPO_ROOT
from ddp_core.analysis.compute_ratio import compute_to_comm_ratio
from ddp_core.analysis.nvlink_forecast import LITERATURE, WHOLE_LOOP, nvlink_fit, peak_gemm_flops_per_s
from ddp_core.analysis.results import read_measurement

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


def a100_step_s(workload: dict, global_batch: int) -> float:
    """One A100's step of the whole batch: its training FLOPs at A100_MFU of the published peak."""
    tokens = global_batch * workload["max_len"]
    return training_flops(large_model(workload), tokens) / (peak_gemm_flops_per_s() * A100_MFU)


def h200_step_s(workload: dict) -> float:
    """One H200's step of H200_GLOBAL_BATCH sequences as measured: the trainer, timers off, summed over the rounds."""
    if not (H200_MEASUREMENT / "epochs.csv").is_file():
        raise SimilarityError(f"the H200 configuration needs the GPU measurement in {H200_MEASUREMENT}")
    rows = read_measurement(H200_MEASUREMENT).epochs.query(
        "preset == @PRESET and amp == @H200_PRECISION and batch_size == @H200_GLOBAL_BATCH and loop == @WHOLE_LOOP")
    if rows.empty:
        raise SimilarityError(f"{H200_MEASUREMENT}: no step of the {PRESET} model in {H200_PRECISION} at batch "
                              f"{H200_GLOBAL_BATCH}")
    return float(rows["seconds"].sum() / rows["samples"].sum() * H200_GLOBAL_BATCH)


def nvlink_allreduce_s(workload: dict, nodes: int) -> float:
    """The large model's buckets all-reduced over NVLink on `nodes` GPUs, by the published curve's fit."""
    fit = nvlink_fit(nodes)
    return sum(fit.allreduce_s(size) for size in bucket_sizes(large_model(workload)))


def ethernet_allreduce_s(workload: dict, nodes: int) -> float:
    """The large model's buckets all-reduced by a ring at the published bus bandwidth (the median of its runs): the
    bandwidth term only, a lower bound on the time (no latency), so R_N is the configuration's best case."""
    busbw = float(pd.read_csv(ETHERNET_FILE, comment="#")["busbw_gbit_s"].median() * 1e9 / 8)  # bytes per second
    return sum(2 * (nodes - 1) / nodes * size / busbw for size in bucket_sizes(large_model(workload)))


@dataclass(frozen=True)
class Configuration:
    """A real cluster: what the page calls it, its batch, and how its step and all-reduce are known."""
    name: str  # the words a page names it by
    global_batch: int | None  # None: the study's own
    step_s: Callable[[dict, int], float]  # (workload, global batch) -> one GPU's step of the whole batch
    allreduce_s: Callable[[dict, int], float]  # (workload, GPUs) -> the all-reduce of a step's gradient
    source: str

    def ratio(self, workload: dict, study_batch: int, nodes: int) -> float:
        """R_N^bench of this configuration on `nodes` GPUs, for a run's workload (its `model`) and global batch."""
        step = self.step_s(workload, self.global_batch or study_batch)
        return compute_to_comm_ratio(step / nodes, self.allreduce_s(workload, nodes))


CONFIGURATIONS = {
    "h200_nvlink": Configuration(
        "H200s over NVLink", H200_GLOBAL_BATCH, lambda workload, batch: h200_step_s(workload), nvlink_allreduce_s,
        "one H200's step measured by this project (reference/single_device/cuda-nvidia-h200, from the lease in "
        "reference/gpu_lease); the all-reduce from Azure's published "
        "ND A100 v4 curve (an A100's NVLink: the H200's is faster)"),
    "a100_nvlink": Configuration(
        "A100s over NVLink", None, a100_step_s, nvlink_allreduce_s,
        f"Azure's published ND A100 v4 all-reduce curve and matrix-product rate, a step at {A100_MFU:.0%} of it"),
    "a100_ethernet": Configuration(
        "A100s over 32 Gbit/s Ethernet", ETHERNET_GLOBAL_BATCH, a100_step_s, ethernet_allreduce_s,
        "NCCL over TCP on 32 Gbit/s Ethernet as published in NVIDIA/nccl#209; the A100's step as above"),
}


def configuration(name: str) -> Configuration:
    if name not in CONFIGURATIONS:
        raise SimilarityError(f"no configuration {name!r} to model; the configurations are: "
                              f"{', '.join(CONFIGURATIONS)}")
    return CONFIGURATIONS[name]
