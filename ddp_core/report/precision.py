"""Mixed precision: bf16 against fp32 on the runs' processor, in step time and in accuracy, and where the One device
chapter timed the same precisions."""

from __future__ import annotations

import pandas as pd

from dataclasses import dataclass

from ddp_core.analysis.comparisons import (
    Chance,
    Judged,
    chance_at,
    compare_accuracies,
    compare_times,
    judged_accuracies,
    judged_times,
)
from ddp_core.analysis.provenance import StudySetup, study_setup
from ddp_core.analysis.results import Experiment, Measurement
from ddp_core.analysis.speedups import scaling_table
from ddp_core.analysis.tables import FINAL_ACCURACY, STEP_MEDIAN_MS, counted, cpu_relation, machine_text, quantity_table


PRECISION_ROWS = {
    "step_time_s": (STEP_MEDIAN_MS, "{:.1f}", 1e3),
    "samples_per_s": ("Throughput, from the median step (samples/s)", "{:.1f}"),
    "final_train_loss": ("Final training loss, median of the repeats", "{:.3f}"),
    "final_val_accuracy": (FINAL_ACCURACY, "{:.3f}"),
}


def precision_markdown(study: dict[str, Experiment]) -> str:
    """A column per variant: its 1-rank runs as the results chapter's table has them (`scaling_table`)."""
    table = pd.DataFrame({variant: scaling_table(e).loc[1] for variant, e in study.items()}).T
    return quantity_table(table, PRECISION_ROWS, turned=True)


BF16_INSTRUCTIONS = ("avx512_bf16", "amx_bf16")


def bf16_support(run) -> str:
    """Whether the processor the runs had computes in bf16, from the extensions its run.json recorded."""
    extensions = run.raw.get("cpu_extensions")
    # a GPU, or a CPU with one of BF16_INSTRUCTIONS
    if run.on_gpu or (extensions and any(name in extensions for name in BF16_INSTRUCTIONS)):
        return "has bf16 instructions"
    return "did not record its extensions" if extensions is None else "has no bf16 instructions"


@dataclass(frozen=True)
class CpuCrossref:
    """Which CPU the One device chapter timed the two precisions on, and whether it is the runs' CPU."""

    cpu: str
    relation: str


def crossref(measurements: list[Measurement], run) -> CpuCrossref:
    """The CPU of `run`, a study's run, where the One device chapter measured it, else its first CPU ("GPUs only"
    where it measured none). bf16's figures carry over only between the same CPU, by name and vector extensions."""
    cpus = sorted(
        (m for m in measurements if m.info["device"] == "cpu"),
        key=lambda m: cpu_relation(m.info, run.raw) != "the same CPU",
    )
    if not cpus:
        return CpuCrossref("GPUs only", "not comparable")
    return CpuCrossref(machine_text(cpus[0].info), cpu_relation(cpus[0].info, run.raw))


@dataclass(frozen=True)
class Findings:
    """What the mixed-precision page quotes."""

    precision_device: str
    precision_bf16_support: str
    precision_extensions: str
    bf16_instructions: str
    precision_speed: Judged
    precision_eval_set: str
    precision_accuracy: Judged
    precision: Chance
    crossref: CpuCrossref
    setup: StudySetup


def findings(study: dict[str, Experiment], measurements: list[Measurement]) -> Findings:
    """bf16 against fp32 in time per sample and in accuracy, on the processor the runs had."""
    fp32 = study["fp32"].baseline
    samples = fp32.config["eval_samples"]  # what an accuracy was measured on
    return Findings(
        precision_device=fp32.device_name,
        precision_bf16_support=bf16_support(fp32),
        precision_extensions=", ".join(fp32.raw.get("cpu_extensions") or []) or "none",
        bf16_instructions=" and ".join(BF16_INSTRUCTIONS),
        precision_speed=judged_times(compare_times(study["bf16"], study["fp32"])),
        precision_eval_set="the whole evaluation split" if samples is None else counted(samples, "evaluation sample"),
        precision_accuracy=judged_accuracies(compare_accuracies(study["bf16"], study["fp32"])),
        precision=chance_at(study["fp32"], 1),
        crossref=crossref(measurements, fp32),
        setup=study_setup(*study.values()),
    )
