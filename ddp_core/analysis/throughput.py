"""One device's training throughput and model FLOP utilisation, from the measurements of `benchmarks/single_device.py`.

MFU follows the usual definition (PaLM, Chowdhery et al. 2022). A ratio of two loops is judged round by round by the
one verdict, since a round's loops ran back to back.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ddp_core.analysis.results import Measurement
from ddp_core.analysis.tables import counted, machine_text, range_text
from ddp_core.analysis.verdict import Comparison, compare, noise_floor

CONFIG = ["preset", "amp", "batch_size"]
# Dense bf16 tensor-core peaks by NVIDIA's datasheets (TFLOP/s, no sparsity); the first name the device's contains.
DATASHEET_BF16_TFLOPS = (("H100 PCIe", 756.0), ("H100", 989.4), ("H200", 989.4), ("A100", 312.0))


def peak_tflops(m: Measurement) -> float | None:
    """The device's dense bf16 peak by its datasheet; none for a device without one (a CPU)."""
    return next((peak for name, peak in DATASHEET_BF16_TFLOPS if name in m.info["device_name"]), None)


def throughput_table(m: Measurement) -> pd.DataFrame:
    """Per configuration: samples/s of each loop, and the timed trainer's model TFLOP/s, MFU and matmul share.

    The timed loop is the trainer as every run uses it.
    """
    # a loop's throughput: its samples over its seconds, summed over the timed epochs
    sums = m.epochs.groupby(CONFIG + ["loop"])[["samples", "seconds"]].sum()
    rates = (sums["samples"] / sums["seconds"]).unstack("loop").add_prefix("samples_per_s_")
    table = rates.join(m.epochs.groupby(CONFIG)["flops_per_sample"].first())
    table["tflops"] = table["samples_per_s_timed"] * table["flops_per_sample"] / 1e12  # the cost model's, with padding
    # The share of one large matrix product's rate on the same device: a CPU, with no datasheet peak, has it too.
    table["share_of_matmul"] = [row.tflops / m.info["matmul_tflops"][amp] for (_, amp, _), row in table.iterrows()]
    peak = peak_tflops(m)
    table["mfu"] = table["tflops"] / peak if peak else float("nan")  # over the datasheet's dense bf16 peak
    return table


def precision_name(amp: str) -> str:
    """A run's --amp as a reader names the precision."""
    return "bf16" if amp == "bf16" else "fp32"


def configuration_text(config: tuple) -> str:
    """A configuration (preset, amp, batch size) as the prose and the tables name it: 'large, bf16, batch 128'."""
    preset, amp, batch = config
    return f"{preset}, {precision_name(amp)}, batch {batch}"


# name: (loop, against loop, in words)
RATIOS = {
    "trainer": ("ddp_core", "plain", "throughput, the project's trainer / plain loop"),
    "timers": ("timed", "ddp_core", "throughput, timers on / off"),
    "ddp": ("ddp_of_one", "ddp_core", "throughput, in DDP, group of one / bare model"),
}


def ratio_table(m: Measurement) -> pd.DataFrame:
    """Per configuration and ratio: a loop's throughput over the other's, as median, lowest and highest over rounds."""
    seconds = loop_rounds(m)
    return pd.concat(
        [
            (seconds[against] / seconds[loop])
            .groupby(CONFIG)
            .agg(["median", "min", "max"])
            .set_axis([f"{name}_median", f"{name}_low", f"{name}_high"], axis=1)
            for name, (loop, against, _) in RATIOS.items()
        ],
        axis=1,
    )


def verdict_table(m: Measurement) -> pd.DataFrame:
    """Per ratio, what the measurement says of it over every configuration, with how many got each verdict.

    It gives the range of its medians and of the configurations' noise floors.
    """
    verdicts, medians = configuration_verdicts(m), ratio_table(m)
    return pd.DataFrame(
        [
            {
                "ratio": words,
                "lowest_median": medians[f"{name}_median"].min(),
                "highest_median": medians[f"{name}_median"].max(),
                "lowest_floor": verdicts["floor"].min(),
                "highest_floor": verdicts["floor"].max(),
                **{outcome: int((verdicts[name] == outcome).sum()) for outcome in VERDICT_COUNTS},
            }
            for name, (_, _, words) in RATIOS.items()
        ]
    ).set_index("ratio")


def configuration_verdicts(m: Measurement) -> pd.DataFrame:
    """Per configuration: its noise floor and each ratio's verdict, the calls `verdict_table` counts."""
    rows = {}
    for configuration, rounds in loop_rounds(m).groupby(CONFIG):
        rounds = rounds.droplevel(CONFIG)
        floor = rounds_floor(rounds)
        rows[configuration] = {
            "floor": floor,
            **{name: _compare(rounds, name, floor).says("slower", "faster") for name in RATIOS},
        }
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis(CONFIG)


def loop_rounds(m: Measurement) -> pd.DataFrame:
    """Each configuration's epochs by round (rows) and loop (columns)."""
    return m.epochs.set_index(CONFIG + ["round", "loop"])["seconds"].unstack("loop").sort_index()


def rounds_floor(rounds: pd.DataFrame) -> float:
    """The noise that pairing by rounds leaves of one configuration's loops: the floor its ratios are held against.

    Each configuration has its own, so that one with steady epochs is not judged by another's noise.
    """
    # On a GPU the small model's steps, a few milliseconds, spread far more than the large one's.
    return noise_floor([list(rounds[loop]) for loop in rounds])


def ratio_comparison(m: Measurement, name: str, configuration: tuple) -> Comparison:
    """One ratio of RATIOS at one configuration, round by round, against its floor: "lower" means the loop is slower."""
    rounds = loop_rounds(m).loc[configuration]
    return _compare(rounds, name, rounds_floor(rounds))


def _compare(rounds: pd.DataFrame, name: str, floor: float) -> Comparison:
    loop, against, _ = RATIOS[name]
    return compare(list(rounds[against]), list(rounds[loop]), floor)


VERDICT_COUNTS = {
    "faster": "Faster",
    "slower": "Slower",
    "no visible difference": "No visible difference",
    "too few repeats": "No verdict (few rounds)",
}


@dataclass(frozen=True)
class RatioSpan:
    """One ratio of RATIOS over a measurement's configurations: its range of medians and its verdicts."""

    low: float
    high: float
    verdicts: str  # each with how many configurations reached it: 'slower in 1 configuration'


@dataclass(frozen=True)
class RatioOverview:
    """A measurement's ratios over all its configurations, for a page to sum up in a sentence."""

    overview_name: str
    configurations: int
    floors: str
    trainer: RatioSpan
    ddp: RatioSpan


def ratio_overview(m: Measurement) -> RatioOverview:
    """`RatioOverview` of a measurement, from its `verdict_table`."""
    table = verdict_table(m)
    return RatioOverview(
        overview_name=machine_text(m.info),
        configurations=m.epochs.groupby(CONFIG).ngroups,
        floors=range_text(*table[["lowest_floor", "highest_floor"]].iloc[0], "{:.1%}", " to "),
        trainer=_ratio_span(table.loc[RATIOS["trainer"][2]]),
        ddp=_ratio_span(table.loc[RATIOS["ddp"][2]]),
    )


def _ratio_span(row: pd.Series) -> RatioSpan:
    return RatioSpan(
        low=float(row["lowest_median"]),
        high=float(row["highest_median"]),
        verdicts=", ".join(
            f"{outcome} in {counted(int(row[outcome]), 'configuration')}"
            for outcome in VERDICT_COUNTS
            if row[outcome] > 0
        ),
    )
