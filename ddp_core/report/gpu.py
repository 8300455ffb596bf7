"""The GPU chapter (book/gpu.md), over `ddp_core.analysis.gpu_measurements`.

    python -m ddp_core.report.gpu book/results      # prints the tables, from the links the book's build made

It shows one GPU's throughput and MFU by model, precision and batch, and where a step's time goes.
It also shows the trainer end to end on IMDB, and the 4-GPU forecasts beside the emulated links at as many nodes.
It reads what `benchmarks/gpu_session.sh` measures: `single_device/<gpu>`, eager and `-compiled`,
`step_profile/<gpu>`, and the trainer's runs under `gpu_trainer/<preset>-<amp>`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from ddp_core.analysis.gpu_measurements import (
    MFU_GOAL,
    PRESET_ORDER,
    BatchGrowth,
    BestMfu,
    CompiledTrainer,
    EmulatedShares,
    ForecastBounds,
    Fp32Rates,
    GpuResults,
    best_mfu,
    compiled_trainer,
    emulated_shares,
    emulated_table,
    forecast_bounds,
    forecast_table,
    fp32_rates,
    goal_word,
    load_gpu_results,
    mfu_table,
    smallest_model,
)
from ddp_core.analysis.nvlink_forecast import (
    FORECAST_GPUS,
    Replay,
    StepTimeline,
    load_timelines,
    replay,
    replay_markdown,
)
from ddp_core.analysis.provenance import origin
from ddp_core.analysis.results import Experiment, load_study, read_run, run_on_folder
from ddp_core.analysis.step_profile import categorised
from ddp_core.analysis.tables import measured_by, quantity_table, range_text
from ddp_core.analysis.throughput import CONFIG, configuration_text, peak_tflops, precision_name


@dataclass(frozen=True)
class GpuSetup:
    """The GPU the chapter measured and the software it ran, with its rates and the throughput measurement's
    settings."""

    name: str
    driver: str
    cuda: str
    nccl: str
    torch: str
    measured_on: str
    commit: str
    peak_tflops: float  # the datasheet's dense bf16 peak
    matmul_tflops: float  # one large product's rate in bf16
    rounds: int
    seq_len: int


def gpu_setup(gpu: GpuResults) -> GpuSetup:
    """`GpuSetup` of the eager measurement."""
    info = gpu.eager.info
    return GpuSetup(
        name=info["device_name"],
        driver=info["gpu_driver"],
        cuda=info["cuda"],
        nccl=info["nccl"],
        torch=info["torch"],
        **measured_by(info),
        peak_tflops=peak_tflops(gpu.eager),
        matmul_tflops=info["matmul_tflops"]["bf16"],
        rounds=int(gpu.eager.epochs["round"].nunique()),
        seq_len=int(gpu.eager.epochs["seq_len"].iloc[0]),
    )


def mfu_markdown(gpu: GpuResults) -> str:
    table = mfu_table(gpu)
    table.index = [
        f"{preset}, {precision_name(amp)}, {batch}{', compiled' if compiled else ''}"
        for preset, amp, batch, compiled in table.index
    ]
    return quantity_table(
        table,
        {
            "samples_per_s_timed": ("Samples/s", "{:,.0f}"),
            "tflops": ("Model TFLOP/s", "{:.1f}"),
            "mfu": ("MFU", "{:.1%}"),
            "share_of_matmul": ("Share of the large product's rate", "{:.1%}"),
        },
        "Model, precision, batch (samples)",
    )


def mfu_figure(gpu: GpuResults):
    """MFU against the batch, a line per model and precision, the compiled trainer as stars, the goal as a line."""
    table = mfu_table(gpu).reset_index()
    fig, ax = plt.subplots(figsize=(8, 4.6))
    eager = table[~table["compiled"]]
    for i, (preset, rows) in enumerate(sorted(eager.groupby("preset"), key=lambda item: PRESET_ORDER[item[0]])):
        for amp, style in (("bf16", "o-"), ("off", "s--")):
            line = rows[rows["amp"] == amp]
            ax.plot(
                line["batch_size"], line["mfu"] * 100, style, color=f"C{i}", label=f"{preset}, {precision_name(amp)}"
            )
    for row in table[table["compiled"]].itertuples():
        ax.plot(
            row.batch_size,
            row.mfu * 100,
            "*",
            markersize=14,
            color="black",
            label=f"{row.preset}, {precision_name(row.amp)}, compiled",
        )
    ax.axhline(MFU_GOAL * 100, color="gray", linestyle=":", label=f"goal: {MFU_GOAL:.0%}")
    batches = sorted(table["batch_size"].unique())
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="batch (samples per step)",
        ylabel="MFU (% of the dense bf16 peak)",
        title=f"Model FLOP utilisation on one {gpu.eager.info['device_name']}",
    )
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_ylim(0.5 * table["mfu"].min() * 100, 400 * max(MFU_GOAL, table["mfu"].max()))  # room for the legend
    ticks = [t for t in (0.1, 0.3, 1, 3, 10, 30, 100) if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]]
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.legend(fontsize=8, loc="upper left", ncol=3, frameon=False)
    fig.tight_layout()
    return fig


@dataclass(frozen=True)
class GpuProfile:
    """The profiled step, with the kernels' time as a share of it and of the same workload's unprofiled step. Both
    shares, since the profiler slows the loop that launches the kernels. Also the matrix products' time and the
    largest other category's."""

    config: str
    steps: int
    seq_len: int
    step_ms: float
    unprofiled_step_ms: float
    busy_ms: float
    busy_of_profiled: float
    busy_of_unprofiled: float
    products_ms: float
    products_share: float
    products_tflops: float
    products_of_large: float
    largest_other: str
    largest_other_ms: float
    largest_other_share: float


def gpu_profile(gpu: GpuResults) -> GpuProfile:
    """`GpuProfile` of a GPU's profile."""
    p = gpu.profile
    ops = categorised(p)
    busy = ops["self_s_per_step"].sum()
    config = (p.info["preset"], p.info["amp"], p.info["batch_size"])
    # unprofiled: the median epoch's step of the trainer's own loop, timers off, as the profile ran it
    loop = gpu.eager.epochs.set_index(CONFIG).loc[config].query("loop == 'ddp_core'")
    unprofiled = (loop["seconds"] / (loop["samples"] / config[2])).median()
    products = ops[ops["category"] == "matrix products"]
    products_s = products["self_s_per_step"].sum()
    products_tflops = products["flops_per_step"].sum() / products_s / 1e12
    others = ops[ops["category"] != "matrix products"].groupby("category")["self_s_per_step"].sum()
    return GpuProfile(
        config=configuration_text(config),
        steps=p.info["steps"],
        seq_len=p.info["seq_len"],
        step_ms=p.info["step_s"] * 1e3,
        unprofiled_step_ms=unprofiled * 1e3,
        busy_ms=busy * 1e3,
        busy_of_profiled=busy / p.info["step_s"],
        busy_of_unprofiled=busy / unprofiled,
        products_ms=products_s * 1e3,
        products_share=products_s / busy,
        products_tflops=products_tflops,
        products_of_large=products_tflops / p.info["matmul_tflops"],
        largest_other=others.idxmax(),
        largest_other_ms=others.max() * 1e3,
        largest_other_share=others.max() / busy,
    )


def trainer_table(folder: Path) -> pd.DataFrame:
    """One row per run of the trainer on the GPU (`gpu_session.sh trainer`): its last epoch's speed and accuracy, and
    chance for its classes."""
    rows = []
    for run_dir in sorted(p.parent for p in folder.glob("*/run.json")):
        metrics, info = read_run(run_dir)
        last = metrics.iloc[-1]
        rows.append(
            dict(
                preset=info["config"]["preset"],
                amp=info["config"]["amp"],
                parameters=info["parameters"],
                epochs=int(last["epoch"]),
                train_samples=info["config"]["train_samples"],
                samples_per_s=last["samples_per_s"],
                val_accuracy=last["val_accuracy"],
                chance=1 / info["model"]["num_classes"],
                device=info["device_name"],
                seq_len=info["config"]["seq_len"],
                batch=info["global_batch_size"],
                eval_samples=info["config"]["eval_samples"],
            )
        )
    return pd.DataFrame(rows).sort_values(
        ["preset", "amp"], ignore_index=True, key=lambda c: c.map(PRESET_ORDER) if c.name == "preset" else c
    )


def trainer_markdown(folder: Path) -> str:
    table = trainer_table(folder)
    table.index = [f"{row.preset}, {precision_name(row.amp)}" for row in table.itertuples()]
    return quantity_table(
        table,
        {
            "parameters": ("Parameters", "{:,}"),
            "samples_per_s": ("Samples/s, last epoch", "{:,.0f}"),
            "val_accuracy": ("Validation accuracy, last epoch", "{:.1%}"),
        },
        "Model, precision",
    )


@dataclass(frozen=True)
class TrainerRuns:
    """The trainer's runs on the GPU in a sentence: their workload (the first run's), chance, and their accuracies.
    One run each shows that the CUDA path trains, not which setting is faster."""

    runs: int
    samples: int
    epochs: int
    seq_len: int
    batch: int
    eval_samples: int
    chance: float
    lowest_accuracy: float
    highest_accuracy: float
    above_chance: int


def trainer_runs(folder: Path) -> TrainerRuns:
    """`TrainerRuns` of the runs under `folder` (`trainer_table`), the workload as the first run had it."""
    table = trainer_table(folder)
    accuracy, first = table["val_accuracy"], table.iloc[0]
    return TrainerRuns(
        runs=len(table),
        samples=int(first["train_samples"]),
        epochs=int(first["epochs"]),
        seq_len=int(first["seq_len"]),
        batch=int(first["batch"]),
        eval_samples=int(first["eval_samples"]),
        chance=table["chance"].iloc[0],
        lowest_accuracy=accuracy.min(),
        highest_accuracy=accuracy.max(),
        above_chance=int((accuracy > table["chance"]).sum()),
    )


def forecast_markdown(gpu: GpuResults) -> str:
    table = forecast_table(gpu)
    table.index = [f"{precision_name(row.amp)}, {row.batch_per_gpu}" for row in table.itertuples()]
    table["efficiency"] = [
        f"{low * 100:.0f}–{high:.0%}"
        for low, high in zip(table["efficiency_no_overlap"], table["efficiency_last_bucket"])
    ]
    n = FORECAST_GPUS
    return quantity_table(
        table,
        {
            "one_gpu_ms": ("$T_1$ (ms)", "{:.1f}"),
            "per_gpu_ms": ("A quarter, in DDP (ms)", "{:.1f}"),
            "compute_over_ideal": (f"A quarter / ($T_1$/{n})", "{:.2f}"),
            "comm_ms": ("All-reduce (ms)", "{:.1f}"),
            "ratio": (f"$R_{n}^\\text{{bench}}$", "{:.2f}"),
            "efficiency": ("Efficiency", "{}"),
        },
        "Large model: precision, batch per GPU",
    )


def emulated_markdown(nodes: dict[str, Experiment]) -> str:
    table = emulated_table(nodes)
    table["range"] = [
        range_text(low, high, "{:.0%}", " to ") for low, high in zip(table["efficiency_low"], table["efficiency_high"])
    ]
    n = table["nodes"].iloc[0]
    return quantity_table(
        table,
        {
            "ratio": (f"$R_{n}^\\text{{bench}}$", "{:.2f}"),
            "compute_over_ideal": (f"A node's compute / ($T_1$/{n})", "{:.2f}"),
            "efficiency": ("Efficiency, measured (median)", "{:.0%}"),
            "range": ("lowest to highest", "{}"),
        },
        "Emulated links",
    )


@dataclass(frozen=True)
class Findings:
    """What the GPU chapter quotes."""

    whose: str
    gpu: GpuSetup
    mfu_goal: float
    best: BestMfu
    goal_word: str
    fp32: Fp32Rates
    smallest: BatchGrowth
    compiled: CompiledTrainer
    profile: GpuProfile
    trainer: TrainerRuns
    forecast: ForecastBounds
    emulated: EmulatedShares
    replay: Replay


def findings(results: Path, gpu: GpuResults, nodes: dict[str, Experiment], timelines: list[StepTimeline]) -> Findings:
    """The GPU measured in full under `results` (`load_gpu_results`), its trainer's runs and its step timelines, with
    the emulated cluster's `nodes` beside its forecast."""
    links = emulated_table(nodes)
    return Findings(
        whose=origin(results / "single_device" / gpu.eager.name),
        gpu=gpu_setup(gpu),
        mfu_goal=MFU_GOAL,
        best=best_mfu(gpu),
        goal_word=goal_word(gpu),
        fp32=fp32_rates(gpu),
        smallest=smallest_model(gpu),
        compiled=compiled_trainer(gpu),
        profile=gpu_profile(gpu),
        trainer=trainer_runs(results / "gpu_trainer"),
        forecast=forecast_bounds(gpu, links),
        emulated=emulated_shares(links),
        replay=replay(timelines),
    )


def print_summary(results: Path) -> None:
    gpu = load_gpu_results(results)
    if gpu is None:
        print(f"no GPU measured under {results}")
        return
    print(mfu_markdown(gpu), best_mfu(gpu), compiled_trainer(gpu), gpu_profile(gpu), sep="\n\n")
    if (results / "gpu_trainer").is_dir():
        print(trainer_markdown(results / "gpu_trainer"))
    print(
        replay_markdown(load_timelines(results / "gpu_timeline")),
        forecast_markdown(gpu),
        emulated_markdown(load_study(results / "nodes")),
        sep="\n\n",
    )


if __name__ == "__main__":
    sys.exit(run_on_folder("ddp_core.report.gpu", print_summary, Path))
