"""One GPU's measurements as the GPU chapter and the key findings read them (`benchmarks/gpu_session.sh` made them):
the first GPU measured in full (eager, compiled and profiled), its model FLOP utilisation against the goal, and the
forecast of four such GPUs from its measured steps (bounds, `nvlink_forecast.measured_forecast`) placed among the
emulated cluster's links by their compute-to-communication ratio; the replay forecast from its step timelines
(`nvlink_forecast.replay_findings`) joins them for the key findings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ddp_core.analysis.comparisons import speedup_glue
from ddp_core.analysis.emulated import BASELINE, link_table, node_share, similarity_table
from ddp_core.analysis.nvlink_forecast import (
    FORECAST_GPUS,
    SHARE_LOOP,
    WHOLE_LOOP,
    load_timelines,
    measured_forecast,
    replay_findings,
)
from ddp_core.analysis.results import Experiment, Measurement, load_measurements
from ddp_core.analysis.step_profile import StepProfile, load_step_profiles
from ddp_core.analysis.throughput import (
    CONFIG,
    loop_rounds,
    precision_name,
    ratio_comparison,
    ratio_findings,
    rounds_floor,
    throughput_table,
)
from ddp_core.analysis.verdict import compare
from ddp_core.engine.model_shape import PRESETS

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


def mfu_table(gpu: GpuResults) -> pd.DataFrame:
    """Per configuration, eager and (where measured) compiled: the trainer's samples/s as a run trains (timers on),
    its model TFLOP/s, MFU against the datasheet's dense bf16 peak and share of one large product's rate."""
    by_compiled = {False: gpu.eager, True: gpu.compiled}
    table = pd.concat(throughput_table(m).assign(compiled=key) for key, m in by_compiled.items() if m is not None)
    table = table.set_index("compiled", append=True)[["samples_per_s_timed", "tflops", "mfu", "share_of_matmul"]]
    return table.sort_index(
        level=["preset", "amp", "batch_size"],
        key=lambda index: index.map(PRESET_ORDER.get) if index.name == "preset" else index,
    )


def mfu_findings(gpu: GpuResults) -> dict:
    """The best MFU eager and compiled, against the goal; and the compiled trainer against the eager plain loop
    that its measurement ran in the same rounds, judged by the one verdict function."""
    table = mfu_table(gpu)
    eager = table.xs(False, level="compiled").sort_index()
    best = eager["mfu"].idxmax()
    found = {
        "best_mfu": eager["mfu"].max(),
        "best_config": f"{best[0]}, {precision_name(best[1])}, batch {best[2]}",
        "best_tflops": eager.loc[best, "tflops"],
        "goal_word": "reached" if table["mfu"].max() >= MFU_GOAL else "not reached",
        "fp32_best_mfu": eager[eager.index.get_level_values("amp") == "off"]["mfu"].max(),
        "fp32_matmul_tflops": gpu.eager.info["matmul_tflops"].get("off", float("nan")),
    }
    smallest = min(eager.index.get_level_values("preset"), key=PRESET_ORDER.get)
    amp = eager.loc[smallest].index.get_level_values("amp")[0]  # bf16 where measured
    steps = (eager.index.get_level_values("batch_size") / eager["samples_per_s_timed"]).loc[(smallest, amp)]
    low, high = steps.index.min(), steps.index.max()
    found |= {
        "smallest_preset": smallest,
        "smallest_precision": precision_name(amp),
        "smallest_batch_low": int(low),
        "smallest_batch_high": int(high),
        "smallest_batch_growth": high / low,
        "smallest_step_growth": steps.loc[high] / steps.loc[low],
    }
    if gpu.compiled is not None:
        compiled = table.xs(True, level="compiled")
        config = compiled["mfu"].idxmax()
        seconds = loop_rounds(gpu.compiled).loc[config]
        verdict = compare(list(seconds["plain"]), list(seconds["timed"]), rounds_floor(seconds))
        found |= {
            "compiled_mfu": compiled.loc[config, "mfu"],
            "compiled_config": f"{config[0]}, {precision_name(config[1])}, batch {config[2]}",
            "eager_mfu_same_config": eager.loc[config, "mfu"] if config in eager.index else float("nan"),
            "compiled_vs_plain": verdict.ratio,
            "compiled_vs_plain_low": verdict.low,
            "compiled_vs_plain_high": verdict.high,
            "compiled_rounds": len(seconds),
            "compiled_verdict": verdict.says("slower", "faster"),
        }
    return found


def forecast_table(gpu: GpuResults) -> pd.DataFrame:
    """The large model's forecast on FORECAST_GPUS GPUs from the measured steps, per precision and batch per GPU:
    `measured_forecast`'s steps and speedups with each GPU's share stepped in DDP; R_N as the emulated cluster takes
    it, T_1/N over the all-reduce; how much longer a GPU's share takes than T_1/N; and the efficiency with every
    bucket exposed and with the last only, the lowest also from the share's slowest and fastest round."""
    ahead = measured_forecast(gpu.eager)
    ahead = ahead[ahead["preset"] == "large"].reset_index(drop=True)
    configs = pd.MultiIndex.from_arrays([ahead["preset"], ahead["amp"], ahead["batch_per_gpu"]], names=CONFIG)
    epochs = gpu.eager.epochs[gpu.eager.epochs["loop"] == SHARE_LOOP].set_index(CONFIG)
    share_s = epochs["seconds"] / (epochs["samples"] / epochs.index.get_level_values("batch_size"))  # a round's step
    rounds = share_s.groupby(CONFIG).agg(["min", "max"]).reindex(configs) * 1e3  # a GPU's share, in ms
    fastest, slowest = rounds["min"].to_numpy(), rounds["max"].to_numpy()  # its fastest and slowest round
    ideal_ms, n = ahead["one_gpu_ms"] / FORECAST_GPUS, FORECAST_GPUS
    ahead["ratio"] = ideal_ms / ahead["comm_ms"]
    ahead["compute_over_ideal"] = ahead["per_gpu_ms"] / ideal_ms
    ahead["efficiency_no_overlap"] = ahead["speedup_no_overlap"] / n
    ahead["efficiency_last_bucket"] = ahead["speedup_last_bucket_only"] / n
    ahead["compute_over_ideal_low"] = fastest / ideal_ms
    ahead["compute_over_ideal_high"] = slowest / ideal_ms
    ahead["efficiency_no_overlap_low"] = ahead["one_gpu_ms"] / (slowest + ahead["comm_ms"]) / n
    ahead["efficiency_no_overlap_high"] = ahead["one_gpu_ms"] / (fastest + ahead["comm_ms"]) / n
    ahead["speedup_slowest_round"] = ahead["one_gpu_ms"] / (slowest + ahead["comm_ms"])
    ahead["speedup_fastest_round"] = ahead["one_gpu_ms"] / (fastest + ahead["last_bucket_ms"])
    bare = throughput_table(gpu.eager)[f"samples_per_s_{WHOLE_LOOP}"].reindex(configs).to_numpy()
    ahead["bare_per_gpu_ms"] = ahead["batch_per_gpu"] / bare * 1e3
    ahead["ddp_cost_ms"] = ahead["per_gpu_ms"] - ahead["bare_per_gpu_ms"]  # DDP's own work on each GPU
    # without it: where the One device chapter's rule cannot tell that work from noise, the forecast may not count it
    ahead["bare_speedup_no_overlap"] = ahead["one_gpu_ms"] / (ahead["bare_per_gpu_ms"] + ahead["comm_ms"])
    ahead["bare_speedup_last_bucket_only"] = ahead["one_gpu_ms"] / (ahead["bare_per_gpu_ms"] + ahead["last_bucket_ms"])
    return ahead


def emulated_table(nodes: dict[str, Experiment]) -> pd.DataFrame:
    """Per link of the emulated cluster at FORECAST_GPUS nodes (or its most, where it has no run at that many), by
    its setting in words: R_N from the benchmarked all-reduce, as the forecast's (the ratio the wind tunnel reached,
    where it set the links; else one node's forward and backward over N, over the benchmark), and the efficiency its
    runs measured with its range."""
    links = link_table(nodes)
    n = FORECAST_GPUS if FORECAST_GPUS in set(links["world_size"]) else int(links["world_size"].max())
    table = links[links["world_size"] == n].set_index("link")
    share = node_share(nodes[BASELINE])  # the links' nodes, not the similarity test's
    points = similarity_table(nodes)
    points = points[(points["nodes"] == n) & (points["share"] == share)]
    settings = dict(zip(points["configuration"], points["setting"]))
    bench = table["predicted_compute_s"] / table["predicted_comm_s"]
    ratio = points.set_index("configuration")["achieved_ratio"].reindex(table.index).fillna(bench)
    return (
        pd.DataFrame(
            {
                "setting": [settings[link] for link in table.index],
                "nodes": n,
                "ratio": ratio,
                "compute_over_ideal": table["compute_per_step_s"] / table["predicted_compute_s"],
                "efficiency": table["efficiency"],
                "efficiency_low": table["speedup_low"] / n,
                "efficiency_high": table["speedup_high"] / n,
            }
        )
        .set_index("setting")
        .sort_values("ratio")
    )


def place_among(ratio: float, link_ratios: pd.Series) -> tuple[str, list[str]]:
    """Where `ratio` falls among the links' (indexed by link): "between", "above" or "below" them all, and the links
    on either side of it, lower first."""
    below = link_ratios[link_ratios <= ratio].sort_values()
    above = link_ratios[link_ratios > ratio].sort_values()
    place = "between" if len(below) and len(above) else "above" if len(below) else "below"
    return place, list(below.index[-1:]) + list(above.index[:1])


def forecast_word(slowest: float, fastest: float) -> str:
    """What a forecast's speedup over one GPU says, from its lowest (the slowest round, nothing overlapped) and its
    highest (the fastest round, all but the last bucket hidden): a side only where the whole range lies on it."""
    if fastest < 1:
        return "slower than one GPU"
    return "faster than one GPU" if slowest > 1 else "about as fast as one GPU"


def forecast_findings(gpu: GpuResults, nodes: dict[str, Experiment]) -> dict:
    """For the bf16 row with the largest batch per GPU: its forecast, and where its R_N falls among the emulated
    links' ("between" two of them, "above" or "below" all), with the links on either side and their efficiencies."""
    table = forecast_table(gpu).sort_values("batch_per_gpu")
    row, fp32 = table.query("amp == 'bf16'").iloc[-1], table.query("amp == 'off'")
    links = emulated_table(nodes)
    place, beside = place_among(row["ratio"], links["ratio"])
    batch = int(row["batch_per_gpu"])
    return {
        "forecast_gpus": FORECAST_GPUS,
        "forecast_batch": batch,
        "forecast_global_batch": batch * FORECAST_GPUS,
        "forecast_seq_len": int(gpu.eager.epochs["seq_len"].iloc[0]),
        "forecast_batch_mfu": mfu_table(gpu).loc[("large", "bf16", batch, False), "mfu"],
        **{
            f"forecast_{key}": row[key]
            for key in (
                "compute_over_ideal",
                "bare_per_gpu_ms",
                "ddp_cost_ms",
                "one_gpu_ms",
                "per_gpu_ms",
                "comm_ms",
                "ratio",
            )
        },
        "forecast_compute_over_ideal_rounds": f"{row['compute_over_ideal_low']:.2f} to "
        f"{row['compute_over_ideal_high']:.2f}",
        "forecast_speedup_low": row["speedup_no_overlap"],
        "forecast_speedup_high": row["speedup_last_bucket_only"],
        "forecast_bare_speedup_low": row["bare_speedup_no_overlap"],
        "forecast_bare_speedup_high": row["bare_speedup_last_bucket_only"],
        "forecast_speedup_rounds": f"{row['speedup_slowest_round']:.2f} to {row['speedup_fastest_round']:.2f}",
        "forecast_speedup_word": forecast_word(row["speedup_slowest_round"], row["speedup_fastest_round"]),
        **speedup_glue("forecast_ddp", ratio_comparison(gpu.eager, "ddp", ("large", "bf16", batch))),
        "forecast_low_rounds": f"{row['efficiency_no_overlap_low']:.0%} to {row['efficiency_no_overlap_high']:.0%}",
        "forecast_fp32_low": fp32["efficiency_no_overlap"].iloc[-1] if len(fp32) else float("nan"),
        "forecast_fp32_high": fp32["efficiency_last_bucket"].iloc[-1] if len(fp32) else float("nan"),
        "forecast_fp32_compute_over_ideal": fp32["compute_over_ideal"].iloc[-1] if len(fp32) else float("nan"),
        "emulated_compute_over_ideal": " and ".join(f"{value:.2f}" for value in links["compute_over_ideal"]),
        "forecast_low": row["efficiency_no_overlap"],
        "forecast_high": row["efficiency_last_bucket"],
        "forecast_place": place,
        "emulated_nodes": int(links["nodes"].iloc[0]),
        "forecast_beside": " and ".join(
            f"{link}, {links.loc[link, 'ratio']:.2f} reached, {links.loc[link, 'efficiency']:.0%} efficiency measured"
            for link in beside
        ),
    }


def headline_findings(results: Path, nodes: dict[str, Experiment]) -> dict:
    """`mfu_findings`, `forecast_findings`, `replay_findings` and the One device chapter's `ratio_findings` of the
    eager trainer named `gpu_<name>`, with the GPU's name as `gpu_device`, for the first page."""
    gpu = load_gpu_results(results)
    timelines = load_timelines(results / "gpu_timeline")
    found = mfu_findings(gpu) | forecast_findings(gpu, nodes) | replay_findings(timelines) | ratio_findings(gpu.eager)
    return {"gpu_device": gpu.eager.info["device_name"]} | {f"gpu_{key}": value for key, value in found.items()}
