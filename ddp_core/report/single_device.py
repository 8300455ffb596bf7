"""One device's training throughput, its model FLOP utilisation, and the overheads of ddp_core and of DDP.

    python -m ddp_core.report.single_device results/single_device/cpu     # prints the tables

It reads the measurements of `benchmarks/single_device.py`: a folder per device, with epochs.csv and device.json.
What throughput, MFU and a ratio of two loops are, and how one is called faster: `ddp_core.analysis.throughput`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ddp_core.engine.run_files import CPU_EXTENSIONS
from ddp_core.analysis.comparisons import run_times
from ddp_core.analysis import peers, step_profile
from ddp_core.analysis.peers import Goal, PeerRuns
from ddp_core.analysis.provenance import origin
from ddp_core.analysis.results import Experiment, Measurement, read_measurement, run_on_folder
from ddp_core.analysis.step_profile import ProfiledStep
from ddp_core.analysis.tables import counted, day, machine_text, measured_by, median_range, quantity_table, range_text
from ddp_core.analysis.throughput import (
    RATIOS,
    VERDICT_COUNTS,
    RatioOverview,
    configuration_text,
    configuration_verdicts,
    peak_tflops,
    precision_name,
    ratio_overview,
    ratio_table,
    throughput_table,
    verdict_table,
)


def verdict_markdown(m: Measurement) -> str:
    table = verdict_table(m)
    table["medians"] = [
        range_text(low, high, "{:.3f}", " to ") for low, high in zip(table["lowest_median"], table["highest_median"])
    ]
    table["floors"] = [
        range_text(low, high, "{:.1%}", " to ") for low, high in zip(table["lowest_floor"], table["highest_floor"])
    ]
    columns = {
        "medians": ("Median per configuration, lowest to highest", "{}"),
        "floors": ("Noise floor per configuration, lowest to highest", "{}"),
    }
    columns |= {outcome: (label, "{:.0f}") for outcome, label in VERDICT_COUNTS.items()}
    return quantity_table(table, columns, "Ratio, the first loop against the second (counts: configurations)")


def _configuration_index(table: pd.DataFrame) -> pd.DataFrame:
    return table.set_axis([configuration_text(config) for config in table.index])


def throughput_markdown(m: Measurement) -> str:
    on_gpu = m.info["device"] != "cpu"
    columns = {
        "samples_per_s_plain": ("Plain loop (samples/s)", "{:,.1f}"),
        "samples_per_s_ddp_core": ("The project's trainer, timers off (samples/s)", "{:,.1f}"),
        "samples_per_s_timed": ("The project's trainer, timers on (samples/s)", "{:,.1f}"),
        "tflops": (f"Model compute ({'TFLOP/s' if on_gpu else 'GFLOP/s'})", "{:.3g}", 1 if on_gpu else 1e3),
        "share_of_matmul": ("Share of the matrix-product rate (%)", "{:.1f}", 100),
    }
    if peak_tflops(m):
        columns["mfu"] = ("MFU, of the bf16 datasheet peak (%)", "{:.1f}", 100)
    return quantity_table(_configuration_index(throughput_table(m)), columns, "Model, precision, batch (samples)")


def ratio_markdown(m: Measurement) -> str:
    """Each configuration's ratios, their verdicts where the rule sees a difference, and the floor they were held
    against. Every count of `verdict_markdown` can then be read off a row."""
    table = ratio_table(m).join(configuration_verdicts(m))
    for name in RATIOS:
        table[name] = [
            median_range(*values, "{:.3f}") + ("" if verdict == "no visible difference" else f": {verdict}")
            for *values, verdict in zip(
                table[f"{name}_median"], table[f"{name}_low"], table[f"{name}_high"], table[name]
            )
        ]
    columns = {
        name: (f"{words} (median, range), and the verdict where the rule tells a difference", "{}")
        for name, (_, _, words) in RATIOS.items()
    }
    columns["floor"] = ("Noise floor (%)", "{:.1f}", 100)
    return quantity_table(_configuration_index(table), columns, "Model, precision, batch (samples)")


def measurement_label(m: Measurement) -> str:
    """A measurement as the page heads its tables: the device, and the compiled trainer where it was."""
    return m.info["device_name"] + (", trainer compiled" if m.info.get("compile") else "")


def measurements_markdown(measurements: list[Measurement]) -> str:
    """What each measurement ran on and with, a column each: the provenance and the ceilings its tables rest on."""
    rows = {
        measurement_label(m): {
            "device": m.info["device"],
            "cores": _cpu_text(m),
            "backend": m.info["backend"],
            "torch": m.info["torch"]
            + (f", CUDA {m.info['cuda']}" if m.info.get("cuda") and m.info["device"] != "cpu" else ""),
            **measured_by(m.info),
            "rounds": m.epochs["round"].nunique(),
            "peak": peak_tflops(m),
            "matmul": ", ".join(
                f"{tflops:.3g} in {precision_name(amp)}" for amp, tflops in m.info["matmul_tflops"].items()
            ),
        }
        for m in measurements
    }
    return quantity_table(
        pd.DataFrame(rows).T,
        {
            "device": ("Device", "{}"),
            "cores": ("CPU cores and vector extensions", "{}"),
            "backend": ("Backend", "{}"),
            "torch": ("PyTorch", "{}"),
            "measured_on": ("Measured on", "{}"),
            "commit": ("Code commit", "{}"),
            "rounds": ("Timed epochs of each loop per configuration", "{}"),
            "matmul": ("One large matrix product (TFLOP/s)", "{}"),
            "peak": ("Datasheet's dense bf16 peak (TFLOP/s)", "{:g}"),
        },
        turned=True,
        column_names=list(rows),
    )


def share_above_devices(measurements: list[Measurement]) -> str:
    """The measurements in which the model's own products outran the large one, above 100 % of the matrix-product
    rate. Else "none of these devices"."""
    return (
        ", ".join(measurement_label(m) for m in measurements if (throughput_table(m)["share_of_matmul"] > 1).any())
        or "none of these devices"
    )


BASELINE_OUTCOMES = {"comparable": "the same CPU", "other CPU": "two CPUs of the same name", "none": "not timed here"}


def baseline_comparison(m: Measurement, scaling: Experiment) -> dict:
    """The benchmark's trainer loop beside the strong-scaling study's 1-rank runs, on the same configuration and
    device name. They stay two measurements: they ran in different rounds, which the verdict rule cannot pair."""
    one = scaling.baseline
    key = (one.config["preset"], one.config["amp"], one.global_batch_size)
    table = throughput_table(m)
    if one.device_name != m.info["device_name"] or key not in table.index:
        return {"outcome": "none"}  # nothing alike to set beside
    times = run_times(scaling).query("world_size == 1")
    return {
        # other CPU: the same name, other vector extensions
        "outcome": "comparable" if one.raw.get("cpu_extensions") == m.info.get("cpu_extensions") else "other CPU",
        "runs_device": machine_text(one.raw),
        "device": machine_text(m.info),
        "configuration": configuration_text(key),
        "runs_samples_per_s": 1 / times["time_per_sample_s"].median(),
        "repeats": counted(len(times), "repeat"),
        "samples_per_s": table.loc[key, "samples_per_s_timed"],
        "runs_measured_on": ", ".join(sorted({day(run.raw["start_time"]) for run in scaling.repeats[1]})),
        "measured_on": day(m.info["start_time"]),
    }


def _baseline(measurements: list[Measurement], scaling: Experiment) -> dict:
    """`baseline_comparison` of the first measurement that has one to make."""
    found = (baseline_comparison(m, scaling) for m in measurements)
    return next((f for f in found if f["outcome"] != "none"), {"outcome": "none"})


def baseline_markdown(measurements: list[Measurement], scaling: Experiment) -> str:
    """The strong-scaling study's 1-rank runs and this chapter's trainer, timers on, side by side (`_baseline`). No
    table where no measurement trained their model, precision and batch."""
    found = _baseline(measurements, scaling)
    if found["outcome"] == "none":
        return ""
    sides = pd.DataFrame(
        {
            "runs": [
                found["runs_device"],
                found["configuration"],
                "IMDB text",
                found["runs_samples_per_s"],
                f"median of the {found['repeats']}' median steps",
                found["runs_measured_on"],
            ],
            "here": [
                found["device"],
                found["configuration"],
                "generated tokens",
                found["samples_per_s"],
                "timed epochs, timers on",
                found["measured_on"],
            ],
        },
        index=["device", "configuration", "data", "samples_per_s", "from", "measured_on"],
    ).T
    return quantity_table(
        sides,
        {
            "device": ("CPU (vector extensions)", "{}"),
            "configuration": ("Model, precision, batch", "{}"),
            "data": ("Data", "{}"),
            "samples_per_s": ("Throughput (samples/s)", "{:,.1f}"),
            "from": ("Throughput from", "{}"),
            "measured_on": ("Measured on", "{}"),
        },
        turned=True,
        column_names=["The strong-scaling study's 1-rank runs", "This chapter"],
    )


def baseline_outcome(measurements: list[Measurement], scaling: Experiment) -> str:
    """What the CPUs of `baseline_markdown`'s two sides are to each other, in words (BASELINE_OUTCOMES)."""
    return BASELINE_OUTCOMES[_baseline(measurements, scaling)["outcome"]]


def _cpu_text(m: Measurement) -> str:
    """'4 cores with avx2 but no avx512f or amx_bf16' for a CPU that recorded its vector extensions, else '–'."""
    extensions = m.info.get("cpu_extensions")
    if m.info["device"] != "cpu" or extensions is None:
        return "–"
    missing = [name for name in CPU_EXTENSIONS if name not in extensions]
    has = f"with {', '.join(extensions)}" if extensions else "with none of"
    return f"{m.info['cpu_count']} cores {has}" + (
        f"{' but no' if extensions else ''} {_or(missing)}" if missing else ""
    )


def _or(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def gpus_measured(measurements: list[Measurement]) -> str:
    """The GPUs among the measurements, each named once, or "none"."""
    return ", ".join(dict.fromkeys(m.info["device_name"] for m in measurements if m.info["device"] != "cpu")) or "none"


def shown_profile(profiles: list[step_profile.StepProfile]) -> step_profile.StepProfile:
    """The step profile this chapter shows: a CPU's where there is one (the GPU chapter shows a GPU's), else the
    first."""
    return next((p for p in profiles if p.info["device"] == "cpu"), profiles[0])


@dataclass(frozen=True)
class Findings:
    """What the One device chapter quotes."""

    whose: str
    device: RatioOverview
    share_above_devices: str
    baseline_outcome: str
    gpus_measured: str
    goal: Goal
    peers: PeerRuns
    step_profile: ProfiledStep


def findings(
    results: Path,
    measurements: list[Measurement],
    scaling: Experiment,
    peer_measurements: list[peers.PeerMeasurement],
    profiles: list[step_profile.StepProfile],
) -> Findings:
    """The first device's ratios, the baseline beside the strong-scaling study's, the peers and the step profile.
    Also whose measurements under `results` these are."""
    return Findings(
        whose=" and ".join(sorted({origin(results / "single_device" / m.name) for m in measurements})),
        device=ratio_overview(measurements[0]),
        share_above_devices=share_above_devices(measurements),
        baseline_outcome=baseline_outcome(measurements, scaling),
        gpus_measured=gpus_measured(measurements),
        goal=peers.goal(),
        peers=peers.peer_runs(peer_measurements[0]),  # the first device the peers measured
        step_profile=step_profile.profiled_step(shown_profile(profiles)),
    )


def print_summary(m: Measurement) -> None:
    print(measurements_markdown([m]))
    print(
        _configuration_index(throughput_table(m))
        .drop(columns="flops_per_sample")
        .to_string(float_format=lambda v: f"{v:.4g}")
    )
    print(verdict_table(m).to_string(float_format=lambda v: f"{v:.3f}"))


if __name__ == "__main__":
    sys.exit(run_on_folder("ddp_core.report.single_device", print_summary, read_measurement))
