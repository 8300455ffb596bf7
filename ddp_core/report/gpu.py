"""The GPU chapter (book/gpu.md): one GPU's throughput and model FLOP utilisation by model, precision and batch,
where a step of the report's GPU workload goes, the trainer end to end on IMDB, and the 4-GPU forecasts beside the
emulated cluster's links at the same number of nodes, over `ddp_core.analysis.gpu_measurements`.

    python -m ddp_core.report.gpu book/results      # prints the tables, from the links the book's build made

It reads what `benchmarks/gpu_session.sh` measures: `single_device/<gpu>` (eager) and `single_device/<gpu>-compiled`,
`step_profile/<gpu>`, and the trainer's runs under `gpu_trainer/<preset>-<amp>`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from ddp_core.analysis.gpu_measurements import (
    MFU_GOAL,
    PRESET_ORDER,
    GpuResults,
    emulated_table,
    forecast_table,
    load_gpu_results,
    mfu_findings,
    mfu_table,
)
from ddp_core.analysis.nvlink_forecast import FORECAST_GPUS, load_timelines, replay_markdown
from ddp_core.analysis.results import Experiment, load_study, read_run, run_on_folder
from ddp_core.analysis.step_profile import categorised
from ddp_core.analysis.tables import measured_by, quantity_table, range_text
from ddp_core.analysis.throughput import CONFIG, peak_tflops, precision_name


def provenance_findings(gpu: GpuResults) -> dict:
    info = gpu.eager.info
    return {
        "gpu": info["device_name"],
        "gpu_driver": info["gpu_driver"],
        "gpu_cuda": info["cuda"],
        "gpu_nccl": info["nccl"],
        "gpu_torch": info["torch"],
        **{f"gpu_{key}": value for key, value in measured_by(info).items()},
        "gpu_peak_tflops": peak_tflops(gpu.eager),
        "gpu_matmul_tflops": info["matmul_tflops"]["bf16"],
        "mfu_goal": MFU_GOAL,
        "gpu_rounds": int(gpu.eager.epochs["round"].nunique()),
        "gpu_seq_len": int(gpu.eager.epochs["seq_len"].iloc[0]),
    }


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


def step_findings(gpu: GpuResults) -> dict:
    """The profiled step against the same workload's step unprofiled: how much of it the GPU computes, and how much
    of that the matrix products take, at what rate."""
    p = gpu.profile
    ops = categorised(p)
    busy = ops["self_s_per_step"].sum()
    config = (p.info["preset"], p.info["amp"], p.info["batch_size"])
    # the profile's loop: the trainer's own, timers off
    loop = gpu.eager.epochs.set_index(CONFIG).loc[config].query("loop == 'ddp_core'")
    unprofiled = (loop["seconds"] / (loop["samples"] / config[2])).median()
    products = ops[ops["category"] == "matrix products"]
    products_s = products["self_s_per_step"].sum()
    products_tflops = products["flops_per_step"].sum() / products_s / 1e12
    others = ops[ops["category"] != "matrix products"].groupby("category")["self_s_per_step"].sum()
    return {
        "profile_config": f"{config[0]}, {precision_name(config[1])}, batch {config[2]}",
        "profile_steps": p.info["steps"],
        "profile_seq_len": p.info["seq_len"],
        "profiled_step_ms": p.info["step_s"] * 1e3,
        "unprofiled_step_ms": unprofiled * 1e3,
        "busy_ms": busy * 1e3,
        "busy_share": busy / unprofiled,
        "profiled_busy_share": busy / p.info["step_s"],
        "products_ms": products_s * 1e3,
        "products_share": products_s / busy,
        "products_tflops": products_tflops,
        "products_of_large": products_tflops / p.info["matmul_tflops"],
        "largest_other": others.idxmax(),
        "largest_other_ms": others.max() * 1e3,
        "largest_other_share": others.max() / busy,
    }


def trainer_table(folder: Path) -> pd.DataFrame:
    """One row per run of the trainer on the GPU (`gpu_session.sh trainer`): model, precision, parameters, the last
    epoch's samples/s and validation accuracy, and chance for its classes."""
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


def trainer_findings(folder: Path) -> dict:
    table = trainer_table(folder)
    accuracy, first = table["val_accuracy"], table.iloc[0]
    return {
        "trainer_runs": len(table),
        "trainer_samples": int(first["train_samples"]),
        **{f"trainer_{column}": int(first[column]) for column in ("epochs", "seq_len", "batch", "eval_samples")},
        "trainer_chance": table["chance"].iloc[0],
        "trainer_lowest_accuracy": accuracy.min(),
        "trainer_highest_accuracy": accuracy.max(),
        "trainer_above_chance": int((accuracy > table["chance"]).sum()),
    }


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


def print_summary(results: Path) -> None:
    gpu = load_gpu_results(results)
    if gpu is None:
        print(f"no GPU measured under {results}")
        return
    print(mfu_markdown(gpu), mfu_findings(gpu), step_findings(gpu), sep="\n\n")
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
