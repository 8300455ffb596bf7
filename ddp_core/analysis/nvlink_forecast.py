"""What the cost model predicts for one node of A100 GPUs on NVLink, from published figures: a prediction, not a run.

The figures are Azure's ND A100 v4 benchmark, kept with its source under `literature/`. Three forecasts use them:
`forecast` from the peak rate, `measured_forecast` from a GPU's measured steps, and `replay_forecast` from its timeline.

    python -m ddp_core.analysis.nvlink_forecast results/report     # prints the forecast for every preset
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

import pandas as pd

from ddp_core.engine.model_cost import bucket_sizes, preset_configs, training_flops
from ddp_core.engine.model_shape import ModelConfig
from ddp_core.engine.run_files import READY
from ddp_core.analysis.cost_model import AlphaBeta, fit_alpha_beta
from ddp_core.analysis.replay import one_node_step_s, replay_step
from ddp_core.analysis.results import Experiment, Measurement, ResultsError, run_on_folder
from ddp_core.analysis.throughput import CONFIG, precision_name, throughput_table
from ddp_core.analysis.tables import measured_by, quantity_table

LITERATURE = Path(__file__).with_name("literature")
# GPUs of the node the forecast describes (the book's chapter and the command line alike), a rank on each.
FORECAST_GPUS = 4
# The single-device benchmark's loops whose steps stand for one GPU's whole batch and each GPU's share of it: the
# trainer, timers off, bare and in DDP over a group of one.
WHOLE_LOOP, SHARE_LOOP = "ddp_core", "ddp_of_one"
ALLREDUCE_FILE = LITERATURE / "nd_a100_v4_allreduce.csv"
GEMM_FILE = LITERATURE / "nd_a100_v4_gemm_fp16.csv"


@cache  # a published curve: fitted once per world size, however many buckets ask
def nvlink_fit(world_size: int) -> AlphaBeta:
    """The alpha-beta fit of the published all-reduce curve, carried to `world_size` GPUs."""
    # NCCL's bus bandwidth from 1 KiB to 8 GiB on 8 A100-SXM4-80GB, NCCL 2.18.5. busbw does not depend on N by its
    # definition, so beta carries over to any N; the latency term follows the ring, 2(N-1) alpha.
    bench = pd.read_csv(ALLREDUCE_FILE, comment="#")
    measured_n = bench["world_size"].to_numpy(float)
    bench["time_s"] = bench["size_bytes"] * 2 * (measured_n - 1) / measured_n / (bench["busbw_GBps"] * 1e9)
    return replace(fit_alpha_beta(bench), world_size=world_size)


def peak_gemm_flops_per_s() -> float:
    # The benchmark's fastest cuBLASLt FP16 GEMM. No product of these models runs faster: times are lower bounds.
    return float(pd.read_csv(GEMM_FILE, comment="#")["tflops"].max() * 1e12)


def forecast(model_config: dict, global_batch_size: int, world_size: int) -> pd.DataFrame:
    """Per preset: the all-reduce per step, the compute that breaks even, and the speedup bounds.

    The workload is a run's: its model's vocabulary, length and classes, and its global batch.
    """
    fit, flops_per_s, n = nvlink_fit(world_size), peak_gemm_flops_per_s(), world_size
    # Gradients are all-reduced in fp32 whatever the compute precision, since AMP keeps fp32 parameters. So the bytes
    # per step do not change with `--amp`.
    rows = []
    for preset, model in preset_configs(model_config).items():
        sizes = bucket_sizes(model)
        buckets = [fit.allreduce_s(size) for size in sizes]
        comm = sum(buckets)
        compute_1 = training_flops(model, global_batch_size * model_config["max_len"]) / flops_per_s
        rows.append(
            dict(
                preset=preset,
                parameters=sum(sizes) // 4,
                buckets=len(buckets),
                comm_ms=comm * 1e3,
                last_bucket_ms=buckets[-1] * 1e3,
                compute_bound_ms=compute_1 * 1e3,
                # The cost model's two overlap bounds: none, or all but the last bucket hidden. Both divide one GPU's
                # step exactly among the GPUs, which a real step with its fixed costs does not: an upper limit.
                speedup_no_overlap=compute_1 / (compute_1 / n + comm),
                speedup_last_bucket_only=compute_1 / (compute_1 / n + buckets[-1]),
                # T_1 must exceed T_comm N/(N-1) for T_1/N + T_comm < T_1; and 9 N T_comm for 90 % efficiency.
                break_even_compute_ms=comm * n / (n - 1) * 1e3,
                efficiency_90_compute_ms=9 * n * comm * 1e3,
            )
        )
    return pd.DataFrame(rows).set_index("preset")


def bucket_allreduces_s(m: Measurement, fit: AlphaBeta) -> dict[tuple, list[float]]:
    """Per configuration the measurement timed, the all-reduce of each of its model's gradient buckets by `fit`.

    The model is built at the workload it was timed on.
    """
    workload = m.epochs.groupby(CONFIG)[["seq_len", "vocab_size", "num_classes"]].first()
    return {
        (preset, amp, batch): [
            fit.allreduce_s(size)
            for size in bucket_sizes(
                vars(
                    ModelConfig.from_preset(
                        preset,
                        vocab_size=int(shape["vocab_size"]),
                        max_len=int(shape["seq_len"]),
                        num_classes=int(shape["num_classes"]),
                    )
                )
            )
        ]
        for (preset, amp, batch), shape in workload.iterrows()
    }


def measured_forecast(m: Measurement, world_size: int = FORECAST_GPUS) -> pd.DataFrame:
    """The forecast with its compute measured on a GPU, for each configuration timed at b and `world_size` b per GPU.

    Only the all-reduce comes from the published fit. There are no rows where no such pair of batches was timed.
    """
    # From `benchmarks/single_device.py`. The whole batch's step on one GPU is `WHOLE_LOOP`: samples over seconds,
    # summed over the rounds. A GPU's share is `SHARE_LOOP`, in DDP over a group of one, since DDP's buckets and hooks
    # cost on every GPU.
    allreduces = bucket_allreduces_s(m, nvlink_fit(world_size))
    table = throughput_table(m)
    batches = table.index.get_level_values("batch_size")
    step_s = batches / table[f"samples_per_s_{WHOLE_LOOP}"]
    rows = []
    for (preset, amp, batch), share_s in (batches / table[f"samples_per_s_{SHARE_LOOP}"]).items():
        whole = (preset, amp, batch * world_size)
        if whole not in step_s.index:
            continue
        buckets, one_gpu_s = allreduces[(preset, amp, batch)], step_s[whole]
        rows.append(
            dict(
                preset=preset,
                amp=amp,
                batch_per_gpu=batch,
                one_gpu_ms=one_gpu_s * 1e3,
                per_gpu_ms=share_s * 1e3,
                comm_ms=sum(buckets) * 1e3,
                last_bucket_ms=buckets[-1] * 1e3,
                speedup_no_overlap=one_gpu_s / (share_s + sum(buckets)),
                speedup_last_bucket_only=one_gpu_s / (share_s + buckets[-1]),
            )
        )
    return pd.DataFrame(rows)


@dataclass
class StepTimeline:
    """One GPU's step as a trainer run drew it in timeline.csv, with its run's run.json."""

    info: dict
    timeline: pd.DataFrame

    @property
    def key(self) -> tuple[str, int]:
        return self.info["config"]["amp"], int(self.info["per_rank_batch_size"])


def load_timelines(folder: Path) -> list[StepTimeline]:
    """The runs under `folder`, the GPU session's gpu_timeline, whose timeline marks when each bucket was ready."""
    timelines = []
    for run in sorted(folder.glob("*/timeline.csv")) if folder.is_dir() else []:
        info = json.loads((run.parent / "run.json").read_text())
        timeline = pd.read_csv(run)
        if not timeline["what"].str.startswith(READY).any():
            raise ResultsError(f"{run}: no bucket's ready moment (a run of more than one rank, or timers off)")
        timelines.append(StepTimeline(info, timeline))
    return timelines


def replay_forecast(timelines: list[StepTimeline], world_size: int = FORECAST_GPUS) -> pd.DataFrame:
    """The forecast of the prediction and GPU chapters: one GPU's timeline at b per GPU, replayed on `world_size` GPUs.

    No step is scaled: a GPU's step at a quarter of a batch is measured, not taken as a quarter of the step.
    """
    # Per precision and batch b: the replayed step against one GPU's at `world_size` b is the speedup, where that
    # timeline was taken. Against its own step at b, it is the efficiency at a fixed batch per GPU.
    fit = nvlink_fit(world_size)
    steps = {t.key: one_node_step_s(t.timeline) for t in timelines}
    rows = []
    for t in sorted(timelines, key=lambda t: t.key):
        amp, batch = t.key
        allreduces = [fit.allreduce_s(size) for size in bucket_sizes(t.info["model"])]
        step = replay_step(t.timeline, 1, allreduces)  # the buckets' all-reduces over NVLink, nothing shrunk
        whole_s = steps.get((amp, batch * world_size), float("nan"))
        rows.append(
            dict(
                amp=amp,
                batch_per_gpu=batch,
                global_batch=batch * world_size,
                one_gpu_ms=whole_s * 1e3,
                per_gpu_ms=steps[t.key] * 1e3,
                comm_ms=sum(allreduces) * 1e3,
                exposed_ms=step["exposed_s"] * 1e3,
                step_ms=step["step_s"] * 1e3,
                speedup=whole_s / step["step_s"],
                fixed_batch_efficiency=steps[t.key] / step["step_s"],
            )
        )
    return pd.DataFrame(rows)


def replay_markdown(timelines: list[StepTimeline], world_size: int = FORECAST_GPUS) -> str:
    """The replay forecast as a table, a row per precision and batch per GPU."""
    table = replay_forecast(timelines, world_size)
    table.index = [f"{precision_name(row.amp)}, {row.batch_per_gpu}" for row in table.itertuples()]
    n = world_size
    return quantity_table(
        table,
        {
            "per_gpu_ms": ("A GPU's step (ms)", "{:.1f}"),
            "exposed_ms": ("All-reduce exposed (ms)", "{:.2f}"),
            "step_ms": (f"Forecast step on {n} GPUs (ms)", "{:.1f}"),
            "one_gpu_ms": (f"One GPU, {n} times the batch (ms)", "{:.1f}"),
            "speedup": (f"Speedup, {n} GPUs", "{:.2f}"),
            "fixed_batch_efficiency": ("Weak-scaling efficiency (a fixed batch per GPU)", "{:.1%}"),
        },
        "Precision, batch per GPU",
    )


@dataclass(frozen=True)
class ReplayEnd:
    """The replay forecast in bf16 at the smallest or largest batch per GPU whose whole batch one GPU also stepped."""

    batch: int
    global_batch: int
    speedup: float
    one_gpu_ms: float
    per_gpu_ms: float
    over_ideal: float  # a GPU's share over 1/FORECAST_GPUS of one GPU's whole batch


@dataclass(frozen=True)
class Replay:
    """The replay forecast as the pages quote it."""

    gpu: str
    gpus: int
    seq_len: int
    measured_on: str
    commit: str
    comm_ms: float
    exposed_ms: float
    fixed_low: float
    fixed_high: float
    fixed_batches: str
    small: ReplayEnd
    large: ReplayEnd


def replay(timelines: list[StepTimeline]) -> Replay:
    """`Replay` of the timelines of one GPU."""
    table = replay_forecast(timelines)
    bf16 = table.query("amp == 'bf16'").sort_values("batch_per_gpu")
    paired = bf16.dropna(subset=["speedup"])
    info = timelines[0].info
    return Replay(
        gpu=info["device_name"],
        gpus=FORECAST_GPUS,
        seq_len=info["model"]["max_len"],
        **measured_by(info),
        comm_ms=table["comm_ms"].max(),
        exposed_ms=table["exposed_ms"].max(),
        fixed_low=bf16["fixed_batch_efficiency"].min(),
        fixed_high=bf16["fixed_batch_efficiency"].max(),
        fixed_batches=f"{bf16['batch_per_gpu'].min()} to {bf16['batch_per_gpu'].max()}",
        small=_replay_end(paired.iloc[0]),
        large=_replay_end(paired.iloc[-1]),
    )


def _replay_end(row: pd.Series) -> ReplayEnd:
    return ReplayEnd(
        batch=int(row["batch_per_gpu"]),
        global_batch=int(row["global_batch"]),
        speedup=row["speedup"],
        one_gpu_ms=row["one_gpu_ms"],
        per_gpu_ms=row["per_gpu_ms"],
        over_ideal=row["per_gpu_ms"] / (row["one_gpu_ms"] / FORECAST_GPUS),
    )


def print_forecast(experiment: Experiment) -> None:
    workload, fit = experiment.baseline, nvlink_fit(FORECAST_GPUS)
    print(
        f"A100 NVLink (published): alpha {fit.alpha_s * 1e6:.2f} us, busbw {fit.bus_bandwidth_GBps:.1f} GB/s, "
        f"R^2 {fit.r2:.4f}, max relative error {fit.max_relative_error:.1%}; "
        f"peak FP16 GEMM {peak_gemm_flops_per_s() / 1e12:.1f} TFLOPS"
    )
    print(
        f"workload: global batch {workload.global_batch_size}, sequence {workload.model['max_len']}, "
        f"{FORECAST_GPUS} GPUs"
    )
    ahead = forecast(workload.model, workload.global_batch_size, FORECAST_GPUS)
    print(ahead.to_string(float_format=lambda v: f"{v:.4g}"))


if __name__ == "__main__":
    sys.exit(run_on_folder("ddp_core.analysis.nvlink_forecast", print_forecast))
