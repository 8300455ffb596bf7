"""The GPU chapter (book/gpu.md): one GPU's throughput and model FLOP utilisation by model, precision and batch,
where a step of the report's GPU workload goes, the trainer end to end on IMDB, and the 4-GPU forecast from the
measured step beside the emulated cluster's links at the same number of nodes.

    python -m ddp_core.report.gpu book/results      # prints the tables, from the links the book's build made

It reads what `benchmarks/gpu_session.sh` measures: `single_device/<gpu>` (eager) and `single_device/<gpu>-compiled`,
`step_profile/<gpu>`, and the trainer's runs under `gpu_trainer/<preset>-<amp>`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from ddp_core.engine.model_shape import PRESETS
from ddp_core.analysis.emulated import BASELINE, link_table, node_share, similarity_table
from ddp_core.analysis.nvlink_forecast import (FORECAST_GPUS, SHARE_LOOP, load_timelines, measured_forecast,
                                               replay_findings, replay_markdown)
from ddp_core.analysis.results import Experiment, Measurement, load_measurements, read_run
from ddp_core.analysis.throughput import CONFIG, peak_tflops, precision_name, throughput_table
from ddp_core.analysis.step_profile import StepProfile, categorised, load_step_profiles
from ddp_core.analysis.tables import measured_by, one_row_each
from ddp_core.analysis.verdict import compare, noise_floor

MFU_GOAL = 0.40  # the model FLOP utilisation this project set itself for the large preset in bf16 on one GPU
PRESET_ORDER = {name: size for size, name in enumerate(PRESETS)}  # smallest model first


@dataclass
class GpuResults:
    eager: Measurement
    compiled: Measurement | None
    profile: StepProfile | None


def load_gpu_results(results: Path) -> GpuResults | None:
    """The first GPU under `results` (a book's or a RESULTS_DIR) measured in full, as `gpu_session.sh` measures one:
    eager, compiled and profiled, the large model in bf16 at a batch and at FORECAST_GPUS times it; or None. A GPU
    measured in part (`make single-device` alone) leaves the chapter to one measured in full."""
    measurements = load_measurements(results / "single_device")
    profiles = load_step_profiles(results / "step_profile")
    for eager in (m for m in measurements if m.info["device"] != "cpu" and not m.info.get("compile")):
        name = eager.info["device_name"]
        compiled = next((m for m in measurements if m.info.get("compile") and m.info["device_name"] == name), None)
        profile = next((p for p in profiles if p.info["device_name"] == name), None)
        gpu = GpuResults(eager, compiled, profile)
        if compiled and profile and not forecast_table(gpu).query("amp == 'bf16'").empty:
            return gpu
    return None


def provenance_findings(gpu: GpuResults) -> dict:
    info = gpu.eager.info
    return {"gpu": info["device_name"], "gpu_driver": info["gpu_driver"], "gpu_cuda": info["cuda"],
            "gpu_nccl": info["nccl"], "gpu_torch": info["torch"],
            **{f"gpu_{key}": value for key, value in measured_by(info).items()},
            "gpu_peak_tflops": peak_tflops(gpu.eager),
            "gpu_matmul_tflops": info["matmul_tflops"]["bf16"], "mfu_goal": MFU_GOAL,
            "gpu_rounds": int(gpu.eager.epochs["round"].nunique()),
            "gpu_seq_len": int(gpu.eager.epochs["seq_len"].iloc[0])}


def mfu_table(gpu: GpuResults) -> pd.DataFrame:
    """Per configuration, eager and (where measured) compiled: the trainer's samples/s as a run trains (timers on),
    its model TFLOP/s, MFU against the datasheet's dense bf16 peak and share of one large product's rate."""
    parts = [throughput_table(gpu.eager).assign(compiled=False)]
    if gpu.compiled is not None:
        parts.append(throughput_table(gpu.compiled).assign(compiled=True))
    table = pd.concat(parts).set_index("compiled", append=True)
    return table[["samples_per_s_timed", "tflops", "mfu", "share_of_matmul"]].sort_index(
        level=["preset", "amp", "batch_size"], key=lambda index: index.map(PRESET_ORDER.get) if index.name == "preset"
        else index)


def mfu_markdown(gpu: GpuResults) -> str:
    table = mfu_table(gpu)
    table.index = [f"{preset}, {precision_name(amp)}, {batch}{', compiled' if compiled else ''}"
                   for preset, amp, batch, compiled in table.index]
    return one_row_each(table, {"samples_per_s_timed": ("Samples/s", "{:,.0f}"),
                                "tflops": ("Model TFLOP/s", "{:.1f}"), "mfu": ("MFU", "{:.1%}"),
                                "share_of_matmul": ("Share of the large product's rate", "{:.1%}")},
                        "Model, precision, batch (samples)")


def mfu_figure(gpu: GpuResults):
    """MFU against the batch, a line per model and precision, the compiled trainer as stars, the goal as a line."""
    table = mfu_table(gpu).reset_index()
    fig, ax = plt.subplots(figsize=(8, 4.6))
    eager = table[~table["compiled"]]
    for i, (preset, rows) in enumerate(sorted(eager.groupby("preset"), key=lambda item: PRESET_ORDER[item[0]])):
        for amp, style in (("bf16", "o-"), ("off", "s--")):
            line = rows[rows["amp"] == amp]
            ax.plot(line["batch_size"], line["mfu"] * 100, style, color=f"C{i}", label=f"{preset}, {precision_name(amp)}")
    for row in table[table["compiled"]].itertuples():
        ax.plot(row.batch_size, row.mfu * 100, "*", markersize=14, color="black",
                label=f"{row.preset}, {precision_name(row.amp)}, compiled")
    ax.axhline(MFU_GOAL * 100, color="gray", linestyle=":", label=f"goal: {MFU_GOAL:.0%}")
    batches = sorted(table["batch_size"].unique())
    ax.set(xscale="log", xlabel="batch (samples per step)", ylabel="MFU (% of the dense bf16 peak)",
           title=f"Model FLOP utilisation on one {gpu.eager.info['device_name']}")
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_yscale("log")
    ax.set_ylim(0.5 * table["mfu"].min() * 100, 400 * max(MFU_GOAL, table["mfu"].max()))  # room for the legend
    ticks = [t for t in (0.1, 0.3, 1, 3, 10, 30, 100) if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]]
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.legend(fontsize=8, loc="upper left", ncol=3, frameon=False)
    fig.tight_layout()
    return fig


def mfu_findings(gpu: GpuResults) -> dict:
    """The best MFU eager and compiled, against the goal; and the compiled trainer against the eager plain loop
    that its measurement ran in the same rounds, judged by the one verdict function."""
    table = mfu_table(gpu)
    eager = table.xs(False, level="compiled").sort_index()
    best = eager["mfu"].idxmax()
    found = {"best_mfu": eager["mfu"].max(), "best_config": f"{best[0]}, {precision_name(best[1])}, batch {best[2]}",
             "best_tflops": eager.loc[best, "tflops"],
             "goal_word": "reached" if table["mfu"].max() >= MFU_GOAL else "not reached",
             "fp32_best_mfu": eager[eager.index.get_level_values("amp") == "off"]["mfu"].max(),
             "fp32_matmul_tflops": gpu.eager.info["matmul_tflops"].get("off", float("nan"))}
    smallest = min(eager.index.get_level_values("preset"), key=PRESET_ORDER.get)
    amp = eager.loc[smallest].index.get_level_values("amp")[0]  # bf16 where measured
    steps = (eager.index.get_level_values("batch_size") / eager["samples_per_s_timed"]).loc[(smallest, amp)]
    found |= {"smallest_preset": smallest, "smallest_precision": precision_name(amp),
              "smallest_batch_low": int(steps.index.min()),
              "smallest_batch_high": int(steps.index.max()),
              "smallest_batch_growth": steps.index.max() / steps.index.min(),
              "smallest_step_growth": steps.loc[steps.index.max()] / steps.loc[steps.index.min()]}
    if gpu.compiled is not None:
        compiled = table.xs(True, level="compiled")
        config = compiled["mfu"].idxmax()
        seconds = gpu.compiled.epochs.set_index(CONFIG + ["round", "loop"])["seconds"].unstack("loop").loc[config]
        floor = noise_floor([list(seconds[loop]) for loop in seconds])
        verdict = compare(list(seconds["plain"]), list(seconds["timed"]), floor)
        found |= {"compiled_mfu": compiled.loc[config, "mfu"], "compiled_tflops": compiled.loc[config, "tflops"],
                  "compiled_config": f"{config[0]}, {precision_name(config[1])}, batch {config[2]}",
                  "eager_mfu_same_config": eager.loc[config, "mfu"] if config in eager.index else float("nan"),
                  "compiled_vs_plain": verdict.ratio, "compiled_vs_plain_low": verdict.low,
                  "compiled_vs_plain_high": verdict.high, "compiled_rounds": len(seconds),
                  "compiled_verdict": verdict.says("slower", "faster")}
    return found


def step_findings(gpu: GpuResults) -> dict:
    """The profiled step against the same workload's step unprofiled: how much of it the GPU computes, and how much
    of that the matrix products take, at what rate."""
    p = gpu.profile
    ops = categorised(p)
    busy = ops["self_s_per_step"].sum()
    config = (p.info["preset"], p.info["amp"], p.info["batch_size"])
    epochs = gpu.eager.epochs.set_index(CONFIG).loc[config]
    loop = epochs[epochs["loop"] == "ddp_core"]  # the profile's loop: the trainer's own, timers off
    unprofiled = (loop["seconds"] / (loop["samples"] / config[2])).median()
    products = ops[ops["category"] == "matrix products"]
    products_s = products["self_s_per_step"].sum()
    products_tflops = products["flops_per_step"].sum() / products_s / 1e12
    others = ops[ops["category"] != "matrix products"].groupby("category")["self_s_per_step"].sum()
    return {"profile_config": f"{config[0]}, {precision_name(config[1])}, batch {config[2]}",
            "profile_steps": p.info["steps"], "profile_seq_len": p.info["seq_len"],
            "profiled_step_ms": p.info["step_s"] * 1e3, "unprofiled_step_ms": unprofiled * 1e3,
            "busy_ms": busy * 1e3, "busy_share": busy / unprofiled, "profiled_busy_share": busy / p.info["step_s"],
            "products_ms": products_s * 1e3, "products_share": products_s / busy, "products_tflops": products_tflops,
            "products_of_large": products_tflops / p.info["matmul_tflops"],
            "largest_other": others.idxmax(), "largest_other_ms": others.max() * 1e3,
            "largest_other_share": others.max() / busy}


def trainer_table(folder: Path) -> pd.DataFrame:
    """One row per run of the trainer on the GPU (`gpu_session.sh trainer`): model, precision, parameters, the last
    epoch's samples/s and validation accuracy, and chance for its classes."""
    rows = []
    for run_dir in sorted(p.parent for p in folder.glob("*/run.json")):
        metrics, info = read_run(run_dir)
        last = metrics.iloc[-1]
        rows.append(dict(preset=info["config"]["preset"], amp=info["config"]["amp"], parameters=info["parameters"],
                         epochs=int(last["epoch"]), train_samples=info["config"]["train_samples"],
                         samples_per_s=last["samples_per_s"], val_accuracy=last["val_accuracy"],
                         chance=1 / info["model"]["num_classes"], device=info["device_name"],
                         seq_len=info["config"]["seq_len"], batch=info["global_batch_size"],
                         eval_samples=info["config"]["eval_samples"]))
    table = pd.DataFrame(rows)
    return table.sort_values(["preset", "amp"], key=lambda c: c.map(PRESET_ORDER) if c.name == "preset" else c,
                             ignore_index=True)


def trainer_markdown(folder: Path) -> str:
    table = trainer_table(folder)
    table.index = [f"{row.preset}, {precision_name(row.amp)}" for row in table.itertuples()]
    return one_row_each(table, {"parameters": ("Parameters", "{:,}"),
                                "samples_per_s": ("Samples/s, last epoch", "{:,.0f}"),
                                "val_accuracy": ("Validation accuracy, last epoch", "{:.1%}")},
                        "Model, precision")


def trainer_findings(folder: Path) -> dict:
    table = trainer_table(folder)
    return {"trainer_runs": len(table), "trainer_epochs": int(table["epochs"].iloc[0]),
            "trainer_seq_len": int(table["seq_len"].iloc[0]), "trainer_batch": int(table["batch"].iloc[0]),
            "trainer_eval_samples": int(table["eval_samples"].iloc[0]),
            "trainer_samples": int(table["train_samples"].iloc[0]), "trainer_chance": table["chance"].iloc[0],
            "trainer_lowest_accuracy": table["val_accuracy"].min(),
            "trainer_highest_accuracy": table["val_accuracy"].max(),
            "trainer_above_chance": int((table["val_accuracy"] > table["chance"]).sum())}


def forecast_table(gpu: GpuResults) -> pd.DataFrame:
    """The large model's forecast on FORECAST_GPUS GPUs from the measured steps, per precision and batch per GPU:
    `measured_forecast`'s steps and speedups with each GPU's share stepped in DDP; R_N as the emulated cluster takes
    it, T_1/N over the all-reduce; how much longer a GPU's share takes than T_1/N; and the efficiency with every
    bucket exposed and with the last only, the lowest also from the share's slowest and fastest round."""
    ahead = measured_forecast(gpu.eager)
    ahead = ahead[ahead["preset"] == "large"].reset_index(drop=True)
    epochs = gpu.eager.epochs[gpu.eager.epochs["loop"] == SHARE_LOOP].set_index(CONFIG)
    rounds = (epochs["seconds"] / (epochs["samples"] / epochs.index.get_level_values("batch_size"))).groupby(CONFIG)
    shares = [rounds.get_group(("large", row.amp, row.batch_per_gpu)) * 1e3 for row in ahead.itertuples()]
    ideal_ms = ahead["one_gpu_ms"] / FORECAST_GPUS
    ahead["ratio"] = ideal_ms / ahead["comm_ms"]
    ahead["compute_over_ideal"] = ahead["per_gpu_ms"] / ideal_ms
    n = FORECAST_GPUS
    ahead["efficiency_no_overlap"] = ahead["speedup_no_overlap"] / n
    ahead["efficiency_last_bucket"] = ahead["speedup_last_bucket_only"] / n
    ahead["compute_over_ideal_low"] = [share.min() / ideal for share, ideal in zip(shares, ideal_ms)]
    ahead["compute_over_ideal_high"] = [share.max() / ideal for share, ideal in zip(shares, ideal_ms)]
    ahead["efficiency_no_overlap_low"] = [row.one_gpu_ms / (share.max() + row.comm_ms) / n
                                          for row, share in zip(ahead.itertuples(), shares)]
    ahead["efficiency_no_overlap_high"] = [row.one_gpu_ms / (share.min() + row.comm_ms) / n
                                           for row, share in zip(ahead.itertuples(), shares)]
    return ahead


def forecast_markdown(gpu: GpuResults) -> str:
    table = forecast_table(gpu)
    table.index = [f"{precision_name(row.amp)}, {row.batch_per_gpu}" for row in table.itertuples()]
    table["efficiency"] = [f"{low * 100:.0f}–{high:.0%}" for low, high in zip(table["efficiency_no_overlap"],
                                                                              table["efficiency_last_bucket"])]
    n = FORECAST_GPUS
    return one_row_each(table, {
        "one_gpu_ms": ("$T_1$ (ms)", "{:.1f}"), "per_gpu_ms": ("A quarter, in DDP (ms)", "{:.1f}"),
        "compute_over_ideal": (f"A quarter / ($T_1$/{n})", "{:.2f}"), "comm_ms": ("All-reduce (ms)", "{:.1f}"),
        "ratio": (f"$R_{n}^\\text{{bench}}$", "{:.2f}"), "efficiency": ("Efficiency", "{}")},
        "Large model: precision, batch per GPU")


def emulated_table(nodes: dict[str, Experiment]) -> pd.DataFrame:
    """Per link of the emulated cluster at FORECAST_GPUS nodes (or its most, where it has no run at that many):
    R_N from the benchmarked all-reduce, as the forecast's (the ratio the wind tunnel reached, where it set the
    links; else one node's forward and backward over N, over the benchmark), and the efficiency its runs measured
    with its range."""
    links = link_table(nodes)
    n = FORECAST_GPUS if FORECAST_GPUS in set(links["world_size"]) else int(links["world_size"].max())
    table = links[links["world_size"] == n].set_index("link")
    share = node_share(nodes[BASELINE])  # the links' nodes, not the similarity test's
    reached = similarity_table(nodes).query("nodes == @n and share == @share").set_index("configuration")[
        "achieved_ratio"]
    ratio = reached.reindex(table.index).fillna(table["predicted_compute_s"] / table["predicted_comm_s"])
    return pd.DataFrame({"nodes": n, "ratio": ratio,
                         "compute_over_ideal": table["compute_per_step_s"] / table["predicted_compute_s"],
                         "efficiency": table["efficiency"], "efficiency_low": table["speedup_low"] / n,
                         "efficiency_high": table["speedup_high"] / n}).sort_values("ratio")


def emulated_markdown(nodes: dict[str, Experiment]) -> str:
    table = emulated_table(nodes)
    table["range"] = [f"{low:.0%} to {high:.0%}" for low, high in zip(table["efficiency_low"], table["efficiency_high"])]
    n = table["nodes"].iloc[0]
    return one_row_each(table, {"ratio": (f"$R_{n}^\\text{{bench}}$", "{:.2f}"),
                                "compute_over_ideal": (f"A node's compute / ($T_1$/{n})", "{:.2f}"),
                                "efficiency": ("Efficiency, measured (median)", "{:.0%}"),
                                "range": ("lowest to highest", "{}")}, "Emulated link")


def place_among(ratio: float, link_ratios: pd.Series) -> tuple[str, list[str]]:
    """Where `ratio` falls among the links' (indexed by link): "between", "above" or "below" them all, and the links
    on either side of it, lower first."""
    below = link_ratios[link_ratios <= ratio].sort_values()
    above = link_ratios[link_ratios > ratio].sort_values()
    place = "between" if len(below) and len(above) else "above" if len(below) else "below"
    return place, list(below.index[-1:]) + list(above.index[:1])


def forecast_findings(gpu: GpuResults, nodes: dict[str, Experiment]) -> dict:
    """For the bf16 row with the largest batch per GPU: its forecast, and where its R_N falls among the emulated
    links' ("between" two of them, "above" or "below" all), with the links on either side and their efficiencies."""
    table = forecast_table(gpu).sort_values("batch_per_gpu")
    row, fp32 = table.query("amp == 'bf16'").iloc[-1], table.query("amp == 'off'")
    links = emulated_table(nodes)
    place, beside = place_among(row["ratio"], links["ratio"])
    return {"forecast_gpus": FORECAST_GPUS, "forecast_batch": int(row["batch_per_gpu"]),
            "forecast_seq_len": int(gpu.eager.epochs["seq_len"].iloc[0]),
            "forecast_batch_mfu": mfu_table(gpu).loc[("large", "bf16", int(row["batch_per_gpu"]), False), "mfu"],
            "forecast_compute_over_ideal": row["compute_over_ideal"],
            "forecast_compute_over_ideal_rounds": f"{row['compute_over_ideal_low']:.2f} to "
                                                  f"{row['compute_over_ideal_high']:.2f}",
            "forecast_speedup_low": row["speedup_no_overlap"], "forecast_speedup_high": row["speedup_last_bucket_only"],
            "forecast_speedup_word": "slower than one GPU" if row["speedup_last_bucket_only"] < 1
            else "faster than one GPU" if row["speedup_no_overlap"] > 1 else "about as fast as one GPU",
            "forecast_low_rounds": f"{row['efficiency_no_overlap_low']:.0%} to {row['efficiency_no_overlap_high']:.0%}",
            "forecast_fp32_low": fp32["efficiency_no_overlap"].iloc[-1] if len(fp32) else float("nan"),
            "forecast_fp32_high": fp32["efficiency_last_bucket"].iloc[-1] if len(fp32) else float("nan"),
            "forecast_fp32_compute_over_ideal": fp32["compute_over_ideal"].iloc[-1] if len(fp32) else float("nan"),
            "emulated_compute_over_ideal": " and ".join(f"{value:.2f}" for value in links["compute_over_ideal"]),
            "forecast_global_batch": int(row["batch_per_gpu"]) * FORECAST_GPUS,
            "forecast_one_gpu_ms": row["one_gpu_ms"], "forecast_per_gpu_ms": row["per_gpu_ms"],
            "forecast_comm_ms": row["comm_ms"], "forecast_ratio": row["ratio"],
            "forecast_low": row["efficiency_no_overlap"], "forecast_high": row["efficiency_last_bucket"],
            "forecast_place": place, "emulated_nodes": int(links["nodes"].iloc[0]),
            "forecast_beside": " and ".join(f"{link} at {links.loc[link, 'ratio']:.2f}, {links.loc[link, 'efficiency']:.0%} "
                                            f"measured" for link in beside)}


def headline_findings(results: Path, nodes: dict[str, Experiment]) -> dict:
    """`mfu_findings`, `forecast_findings` and `replay_findings` named `gpu_<name>`, with the GPU's name as
    `gpu_device`, for the first page."""
    gpu = load_gpu_results(results)
    found = mfu_findings(gpu) | forecast_findings(gpu, nodes) | replay_findings(load_timelines(results / "gpu_timeline"))
    return {"gpu_device": gpu.eager.info["device_name"]} | {f"gpu_{key}": value for key, value in found.items()}


def print_summary(results: Path) -> None:
    from ddp_core.analysis.results import load_study

    gpu = load_gpu_results(results)
    if gpu is None:
        print(f"no GPU measured under {results}")
        return
    print(mfu_markdown(gpu), mfu_findings(gpu), step_findings(gpu), sep="\n\n")
    if (results / "gpu_trainer").is_dir():
        print(trainer_markdown(results / "gpu_trainer"))
    print(replay_markdown(load_timelines(results / "gpu_timeline")), forecast_markdown(gpu),
          emulated_markdown(load_study(results / "nodes")), sep="\n\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m ddp_core.report.gpu RESULTS_FOLDER")
    print_summary(Path(sys.argv[1]))
