"""One GPU's measurements, made by `benchmarks/gpu_session.sh`, as the GPU chapter and the key findings read them.

It holds the GPU's model FLOP utilisation against the goal, and a forecast of four such GPUs from its measured steps.
The forecast is placed among the emulated cluster's links by their compute-to-communication ratio.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ddp_core.analysis.comparisons import Judged, judged_speedup
from ddp_core.analysis.emulated import BASELINE, link_table, node_share, similarity_table
from ddp_core.analysis.nvlink_forecast import (
    FORECAST_GPUS,
    SHARE_LOOP,
    WHOLE_LOOP,
    measured_forecast,
)
from ddp_core.analysis.results import Experiment, Measurement, load_measurements
from ddp_core.analysis.step_profile import StepProfile, load_step_profiles
from ddp_core.analysis.throughput import (
    CONFIG,
    configuration_text,
    loop_rounds,
    precision_name,
    ratio_comparison,
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
    """The first GPU under `results` measured in full, as `gpu_session.sh` measures one, or None.

    A GPU measured in part, by `make single-device` alone, leaves the chapter to one measured in full.
    """
    # In full: eager, compiled and profiled, the large model in bf16 at a batch and at FORECAST_GPUS times it.
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
    """Per configuration, eager and compiled where measured: the trainer's throughput and how much of the GPU it used.

    Samples/s are as a run trains, with timers on. MFU is against the datasheet's dense bf16 peak.
    """
    by_compiled = {False: gpu.eager, True: gpu.compiled}
    table = pd.concat(throughput_table(m).assign(compiled=key) for key, m in by_compiled.items() if m is not None)
    table = table.set_index("compiled", append=True)[["samples_per_s_timed", "tflops", "mfu", "share_of_matmul"]]
    return table.sort_index(
        level=["preset", "amp", "batch_size"],
        key=lambda index: index.map(PRESET_ORDER.get) if index.name == "preset" else index,
    )


def _eager_mfu(gpu: GpuResults) -> pd.DataFrame:
    """`mfu_table` of the eager trainer alone, since the compiled one ran in a call of its own."""
    return mfu_table(gpu).xs(False, level="compiled").sort_index()


@dataclass(frozen=True)
class BestMfu:
    """The eager trainer's highest MFU, the configuration it came at, and its model TFLOP/s there."""

    mfu: float
    config: str
    tflops: float


def best_mfu(gpu: GpuResults) -> BestMfu:
    """`BestMfu` of the eager trainer (timers on, as a run trains)."""
    eager = _eager_mfu(gpu)
    best = eager["mfu"].idxmax()
    return BestMfu(eager["mfu"].max(), configuration_text(best), eager.loc[best, "tflops"])


def goal_word(gpu: GpuResults) -> str:
    """Whether any configuration measured, eager or compiled, reached MFU_GOAL: "reached" or "not reached"."""
    return "reached" if mfu_table(gpu)["mfu"].max() >= MFU_GOAL else "not reached"


@dataclass(frozen=True)
class Fp32Rates:
    """The eager trainer's best MFU in fp32, and the rate one large product reached in fp32.

    In fp32 PyTorch keeps the products off the tensor cores, with no TF32.
    """

    best_mfu: float
    matmul_tflops: float


def fp32_rates(gpu: GpuResults) -> Fp32Rates:
    """`Fp32Rates` of the eager measurement (NaN where it timed no fp32)."""
    eager = _eager_mfu(gpu)
    return Fp32Rates(
        eager[eager.index.get_level_values("amp") == "off"]["mfu"].max(),
        gpu.eager.info["matmul_tflops"].get("off", float("nan")),
    )


@dataclass(frozen=True)
class BatchGrowth:
    """The smallest model's step at its largest batch against its smallest, beside how much more work that batch is.

    Where a step's time does not follow its work, the loop around the arithmetic sets the pace.
    """

    preset: str
    precision: str
    batch_low: int
    batch_high: int
    batch_growth: float
    step_growth: float


def smallest_model(gpu: GpuResults) -> BatchGrowth:
    """`BatchGrowth` of the smallest preset the eager trainer ran, in bf16 where measured."""
    eager = _eager_mfu(gpu)
    smallest = min(eager.index.get_level_values("preset"), key=PRESET_ORDER.get)
    amp = eager.loc[smallest].index.get_level_values("amp")[0]  # bf16 where measured
    steps = (eager.index.get_level_values("batch_size") / eager["samples_per_s_timed"]).loc[(smallest, amp)]
    low, high = steps.index.min(), steps.index.max()
    return BatchGrowth(
        preset=smallest,
        precision=precision_name(amp),
        batch_low=int(low),
        batch_high=int(high),
        batch_growth=high / low,
        step_growth=steps.loc[high] / steps.loc[low],
    )


@dataclass(frozen=True)
class CompiledTrainer:
    """The compiled trainer's best MFU, and its throughput against the eager plain loop that ran in its rounds."""

    mfu: float
    config: str
    eager_mfu: float  # at the same configuration; it ran in another call, so there is no verdict between the two
    vs_plain: float
    vs_plain_low: float
    vs_plain_high: float
    rounds: int
    verdict: str


def compiled_trainer(gpu: GpuResults) -> CompiledTrainer:
    """`CompiledTrainer` of a GPU measured compiled, judged by the one verdict function with the rounds paired."""
    compiled, eager = mfu_table(gpu).xs(True, level="compiled"), _eager_mfu(gpu)
    config = compiled["mfu"].idxmax()
    seconds = loop_rounds(gpu.compiled).loc[config]
    verdict = compare(list(seconds["plain"]), list(seconds["timed"]), rounds_floor(seconds))
    return CompiledTrainer(
        mfu=compiled.loc[config, "mfu"],
        config=configuration_text(config),
        eager_mfu=eager.loc[config, "mfu"] if config in eager.index else float("nan"),
        vs_plain=verdict.ratio,
        vs_plain_low=verdict.low,
        vs_plain_high=verdict.high,
        rounds=len(seconds),
        verdict=verdict.says("slower", "faster"),
    )


def forecast_table(gpu: GpuResults) -> pd.DataFrame:
    """The large model's forecast on FORECAST_GPUS GPUs from the measured steps, per precision and batch per GPU.

    It adds R_N as the emulated cluster takes it, and how much longer a GPU's share takes than T_1/N. The efficiency
    bounds also come from the share's slowest and fastest round.
    """
    # `measured_forecast` steps each GPU's share in DDP.
    ahead = measured_forecast(gpu.eager)
    ahead = ahead[ahead["preset"] == "large"].reset_index(drop=True)
    configs = pd.MultiIndex.from_arrays([ahead["preset"], ahead["amp"], ahead["batch_per_gpu"]], names=CONFIG)
    epochs = gpu.eager.epochs[gpu.eager.epochs["loop"] == SHARE_LOOP].set_index(CONFIG)
    share_s = epochs["seconds"] / (epochs["samples"] / epochs.index.get_level_values("batch_size"))  # a round's step
    rounds = share_s.groupby(CONFIG).agg(["min", "max"]).reindex(configs) * 1e3  # a GPU's share, in ms
    fastest, slowest = rounds["min"].to_numpy(), rounds["max"].to_numpy()  # its fastest and slowest round
    ideal_ms, n = ahead["one_gpu_ms"] / FORECAST_GPUS, FORECAST_GPUS
    ahead["ratio"] = ideal_ms / ahead["comm_ms"]  # R_N: T_1/N over the all-reduce
    ahead["compute_over_ideal"] = ahead["per_gpu_ms"] / ideal_ms
    ahead["efficiency_no_overlap"] = ahead["speedup_no_overlap"] / n  # every bucket exposed; below, the last only
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
    """Per link of the emulated cluster at FORECAST_GPUS nodes: R_N as the forecast takes it, and measured efficiency.

    Where the cluster has no run at that many nodes, its most stand in. Rows are named by their setting in words.
    """
    links = link_table(nodes)
    n = FORECAST_GPUS if FORECAST_GPUS in set(links["world_size"]) else int(links["world_size"].max())
    table = links[links["world_size"] == n].set_index("link")
    share = node_share(nodes[BASELINE])  # the links' nodes, not the similarity test's
    points = similarity_table(nodes)
    points = points[(points["nodes"] == n) & (points["share"] == share)]
    settings = dict(zip(points["configuration"], points["setting"]))
    bench = table["predicted_compute_s"] / table["predicted_comm_s"]
    # R_N from the benchmarked all-reduce: the ratio the wind tunnel reached where it set the links, else one node's
    # forward and backward over N, over the benchmark.
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
    """Where `ratio` falls among the links': "between", "above" or "below" them all, and its neighbours, lower first."""
    below = link_ratios[link_ratios <= ratio].sort_values()
    above = link_ratios[link_ratios > ratio].sort_values()
    place = "between" if len(below) and len(above) else "above" if len(below) else "below"
    return place, list(below.index[-1:]) + list(above.index[:1])


def forecast_word(slowest: float, fastest: float) -> str:
    """What a forecast's speedup range over one GPU says: a side only where the whole range lies on it."""
    # lowest: the slowest round, nothing overlapped; highest: the fastest round, all but the last bucket hidden
    if fastest < 1:
        return "slower than one GPU"
    return "faster than one GPU" if slowest > 1 else "about as fast as one GPU"


@dataclass(frozen=True)
class Fp32Bounds:
    """The forecast in fp32 at its largest batch per GPU: its efficiency bounds and its share against T_1/N."""

    low: float  # every bucket exposed
    high: float  # the last bucket only
    compute_over_ideal: float


@dataclass(frozen=True)
class ForecastBounds:
    """The forecast from the measured steps at bf16 and the largest batch per GPU, as the GPU chapter quotes it.

    Its speedups run from every bucket exposed to the last only, and from the share's slowest round to its fastest.
    """

    gpus: int
    batch: int
    global_batch: int
    seq_len: int
    batch_mfu: float
    one_gpu_ms: float
    per_gpu_ms: float
    bare_per_gpu_ms: float
    ddp_cost_ms: float
    comm_ms: float
    ratio: float
    compute_over_ideal: float
    compute_over_ideal_rounds: str
    speedup_low: float
    speedup_high: float
    speedup_rounds: str
    speedup_word: str
    bare_speedup_low: float
    bare_speedup_high: float
    ddp: Judged
    low: float
    high: float
    low_rounds: str
    fp32: Fp32Bounds
    place: str  # where its R_N falls among the emulated links': "between", "above", "below"
    beside: str


def forecast_bounds(gpu: GpuResults, links: pd.DataFrame) -> ForecastBounds:
    """`ForecastBounds` of a GPU, placed among the emulated cluster's `links` (`emulated_table`)."""
    table = forecast_table(gpu).sort_values("batch_per_gpu")
    row = table.query("amp == 'bf16'").iloc[-1]
    place, beside = place_among(row["ratio"], links["ratio"])
    batch = int(row["batch_per_gpu"])
    return ForecastBounds(
        gpus=FORECAST_GPUS,
        batch=batch,
        global_batch=batch * FORECAST_GPUS,
        seq_len=int(gpu.eager.epochs["seq_len"].iloc[0]),
        batch_mfu=mfu_table(gpu).loc[("large", "bf16", batch, False), "mfu"],
        one_gpu_ms=row["one_gpu_ms"],
        per_gpu_ms=row["per_gpu_ms"],
        bare_per_gpu_ms=row["bare_per_gpu_ms"],
        ddp_cost_ms=row["ddp_cost_ms"],
        comm_ms=row["comm_ms"],
        ratio=row["ratio"],
        compute_over_ideal=row["compute_over_ideal"],
        compute_over_ideal_rounds=f"{row['compute_over_ideal_low']:.2f} to {row['compute_over_ideal_high']:.2f}",
        speedup_low=row["speedup_no_overlap"],
        speedup_high=row["speedup_last_bucket_only"],
        speedup_rounds=f"{row['speedup_slowest_round']:.2f} to {row['speedup_fastest_round']:.2f}",
        speedup_word=forecast_word(row["speedup_slowest_round"], row["speedup_fastest_round"]),
        bare_speedup_low=row["bare_speedup_no_overlap"],
        bare_speedup_high=row["bare_speedup_last_bucket_only"],
        ddp=judged_speedup(ratio_comparison(gpu.eager, "ddp", ("large", "bf16", batch))),
        low=row["efficiency_no_overlap"],
        high=row["efficiency_last_bucket"],
        low_rounds=f"{row['efficiency_no_overlap_low']:.0%} to {row['efficiency_no_overlap_high']:.0%}",
        fp32=_fp32_bounds(table.query("amp == 'off'")),
        place=place,
        beside=" and ".join(
            f"{link}, {links.loc[link, 'ratio']:.2f} reached, {links.loc[link, 'efficiency']:.0%} efficiency measured"
            for link in beside
        ),
    )


def _fp32_bounds(fp32: pd.DataFrame) -> Fp32Bounds:
    """`Fp32Bounds` of the fp32 rows of `forecast_table`, by batch per GPU.

    It is NaN where fp32 was not timed at a batch and at FORECAST_GPUS times it.
    """
    if fp32.empty:
        return Fp32Bounds(float("nan"), float("nan"), float("nan"))
    last = fp32.iloc[-1]
    return Fp32Bounds(last["efficiency_no_overlap"], last["efficiency_last_bucket"], last["compute_over_ideal"])


@dataclass(frozen=True)
class EmulatedShares:
    """The emulated cluster beside the forecast: its nodes, and how many times T_1/N a node's share took per link."""

    nodes: int
    compute_over_ideal: str  # in words: '1.02 and 1.05'


def emulated_shares(links: pd.DataFrame) -> EmulatedShares:
    """`EmulatedShares` of the emulated cluster's `links` (`emulated_table`)."""
    return EmulatedShares(
        nodes=int(links["nodes"].iloc[0]),
        compute_over_ideal=" and ".join(f"{value:.2f}" for value in links["compute_over_ideal"]),
    )
