"""The studies of what is trained and how fast: gradient accumulation against DDP, and bf16 against fp32. Reads each study's `Experiment`s
(`load_study`); offers per study `<study>_findings` for its page's glue, a `*_table` (DataFrame), its
`*_markdown` and, where the page has one, a `*_figure`.
"""

from __future__ import annotations

from statistics import median

import pandas as pd

from ddp_core.report.results import Experiment, Measurement
from ddp_core.report.comparisons import (accuracy_glue, chance_glue, compare_accuracies, compare_times,
                                         final_accuracies, run_times, time_floor, time_glue)
from ddp_core.report.scaling import scaling_table
from ddp_core.report.tables import configurations_as_columns, counted


# Gradient accumulation against DDP ---------------------------------------------------------------------------

def accumulation_table(study: dict[str, Experiment]) -> pd.DataFrame:
    """Per variant: how the global batch was formed, its median step, and how far its losses and accuracy lie
    from the first variant's, epoch by epoch, repeat k against repeat k (the same seed), the largest gap of all."""
    reference = study[next(iter(study))]
    rows = {}
    for variant, e in study.items():
        run = e.baseline
        gaps = pd.concat([_epochs(e, ours) - _epochs(reference, theirs) for ours, theirs
                          in zip(e.repeats[run.world_size], reference.repeats[reference.baseline.world_size])]).abs()
        rows[variant] = dict(ranks=run.world_size, micro_batch=run.per_rank_batch_size,
                             grad_accum=run.config["grad_accum"], global_batch=run.global_batch_size,
                             step_time_ms=run_times(e)["step_time_s"].median() * 1e3,
                             final_val_accuracy=median(final_accuracies(e, run.world_size)),
                             max_train_loss_gap=gaps["train_loss"].max(), max_val_loss_gap=gaps["val_loss"].max(),
                             max_accuracy_gap=gaps["val_accuracy"].max())
    return pd.DataFrame(rows).T


def _epochs(experiment: Experiment, run) -> pd.DataFrame:
    """One run's losses and accuracy by epoch."""
    metrics = experiment.metrics[experiment.metrics["run"] == run.name]
    return metrics.set_index("epoch")[["train_loss", "val_loss", "val_accuracy"]]


ACCUMULATION_COLUMNS = {"ranks": ("Ranks", "{:.0f}"), "micro_batch": ("Micro-batch (samples)", "{:.0f}"),
                        "grad_accum": ("Micro-batches per step", "{:.0f}"),
                        "global_batch": ("Global batch (samples)", "{:.0f}"),
                        "step_time_ms": ("Step time, median of the repeats (ms)", "{:.1f}"),
                        "final_val_accuracy": ("Final validation accuracy, median of the repeats", "{:.4f}"),
                        "max_train_loss_gap": ("Largest training-loss gap to the first variant", "{:.1e}")}


def accumulation_markdown(study: dict[str, Experiment]) -> str:
    table = accumulation_table(study)
    return configurations_as_columns(table, ACCUMULATION_COLUMNS)


# A loss that agrees to this is the same computation up to the order of float32 sums.
SAME_MODEL_TOLERANCE = 1e-3


def accumulation_findings(study: dict[str, Experiment]) -> dict:
    table = accumulation_table(study)
    gap = float(table[["max_train_loss_gap", "max_val_loss_gap"]].max().max())
    first, *others = table.index
    one_batch, accumulated, ddp = (study[variant] for variant in table.index)
    floor = time_floor(*study.values())  # one floor for both comparisons of the page
    accumulated_c = compare_times(accumulated, one_batch, floor=floor)
    ddp_c = compare_times(ddp, one_batch, a_ranks=ddp.largest, floor=floor)
    return {"accum_variants": ", ".join(name.replace("_", " ") for name in others),
            "accum_reference": first.replace("_", " "),  # variant names in words, as the table's columns
            "accum_loss_gap": gap, "accum_accuracy_gap": float(table["max_accuracy_gap"].max()),
            "accum_tolerance": SAME_MODEL_TOLERANCE,
            "accum_same_model": "the same model" if gap <= SAME_MODEL_TOLERANCE else "different models",
            "accum_within_rounding": "within" if gap <= SAME_MODEL_TOLERANCE else "beyond",
            "accum_ddp_ranks": ddp.largest, **chance_glue("accum", one_batch, 1),
            **time_glue("accum_time", accumulated_c), **time_glue("accum_ddp_time", ddp_c)}


# Mixed precision ---------------------------------------------------------------------------------------------

def precision_table(study: dict[str, Experiment]) -> pd.DataFrame:
    rows = {}
    for variant, e in study.items():
        table = scaling_table(e).loc[1]
        rows[variant] = dict(step_time_ms=table["step_time_s"] * 1e3, samples_per_s=table["samples_per_s"],
                             final_val_accuracy=table["final_val_accuracy"], final_train_loss=table["final_train_loss"])
    return pd.DataFrame(rows).T


PRECISION_COLUMNS = {"step_time_ms": ("Step time, median of the repeats' medians (ms)", "{:.1f}"),
                     "samples_per_s": ("Throughput, from the median step (samples/s)", "{:.1f}"),
                     "final_train_loss": ("Final training loss, median of the repeats", "{:.3f}"),
                     "final_val_accuracy": ("Final validation accuracy, median of the repeats", "{:.3f}")}


def precision_markdown(study: dict[str, Experiment]) -> str:
    table = precision_table(study)
    return configurations_as_columns(table, PRECISION_COLUMNS)


BF16_INSTRUCTIONS = ("avx512_bf16", "amx_bf16")


def bf16_support(run) -> str:
    """Whether the processor the runs had computes in bf16, from the extensions its run.json recorded: 'has bf16
    instructions' (a GPU, or a CPU with one of BF16_INSTRUCTIONS), 'has no bf16 instructions', or 'did not record
    its extensions'."""
    extensions = run.raw.get("cpu_extensions")
    if run.on_gpu or (extensions and any(name in extensions for name in BF16_INSTRUCTIONS)):
        return "has bf16 instructions"
    return "did not record its extensions" if extensions is None else "has no bf16 instructions"


def _evaluation_set(run) -> str:
    """'64 evaluation samples' or 'the whole evaluation split': what an accuracy was measured on."""
    samples = run.config["eval_samples"]
    return "the whole evaluation split" if samples is None else counted(samples, "evaluation sample")


def precision_findings(study: dict[str, Experiment]) -> dict:
    c = compare_times(study["bf16"], study["fp32"])
    return {"precision_device": study["fp32"].baseline.device_name,
            "precision_bf16_support": bf16_support(study["fp32"].baseline),
            "precision_extensions": ", ".join(study["fp32"].baseline.raw.get("cpu_extensions") or []) or "none",
            "bf16_instructions": " or ".join(BF16_INSTRUCTIONS),
            **time_glue("precision_speed", c),
            "precision_time_ratio": float(c.ratio),
            "precision_eval_set": _evaluation_set(study["fp32"].baseline),
            **accuracy_glue("precision_accuracy", compare_accuracies(study["bf16"], study["fp32"])),
            **chance_glue("precision", study["fp32"], 1)}


def precision_crossref(measurements: list[Measurement], run) -> str:
    """Where the One device chapter timed bf16 against fp32 too, as a clause: on the CPU of `run` (a study's run),
    or on another one, whose bf16 figures do not carry over (with both CPUs' vector extensions)."""
    same_name = [m for m in measurements if m.info["device_name"] == run.device_name]
    if not same_name:
        return "on other devices than these runs had"
    extensions = same_name[0].info.get("cpu_extensions")
    if extensions != run.raw.get("cpu_extensions"):
        return (f"on a CPU of the same name but other vector extensions ({', '.join(extensions or ['none recorded'])} "
                f"against these runs' {', '.join(run.raw.get('cpu_extensions') or ['none recorded'])}), whose bf16 "
                f"figures do not carry over to these runs")
    return "on this kind of CPU, at its own batch sizes"
