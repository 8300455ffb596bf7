"""One device's training throughput, its model FLOP utilisation, and the overheads of ddp_core and of DDP,
from the measurements of `benchmarks/single_device.py` (a folder per device: epochs.csv, device.json).

    python -m ddp_core.report.single_device results/single_device/cpu     # prints the tables

Throughput of a loop: its samples over its seconds, summed over the timed epochs. Model FLOP
utilisation (MFU): the model's training FLOPs per second (the cost model's count, padding included)
over the device's dense bf16 peak from its datasheet, the usual definition (PaLM, Chowdhery et al.
2022); beside it, the share of the rate one large matrix product reached on the same device, which
a CPU, with no datasheet figure, has too. A ratio of two loops is computed per round (the loops of a
round ran back to back) and reported as the median over the rounds with its range: when the range
includes 1 the two are not told apart by this measurement.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ddp_core.engine.run_files import CPU_EXTENSIONS
from ddp_core.report.tables import one_row_each

LOOPS = ("plain", "ddp_core", "timed", "ddp_of_one")
CONFIG = ["preset", "amp", "batch_size"]
# name: (loop, against loop, in words, the target the loop should reach)
RATIOS = {
    "trainer": ("ddp_core", "plain", "ddp_core / plain loop", 0.97),
    "timers": ("timed", "ddp_core", "timers on / off", 0.98),
    "ddp": ("ddp_of_one", "ddp_core", "in DDP, group of one / bare model", None),
}
# Dense bf16 tensor-core peaks by NVIDIA's datasheets (TFLOP/s, no sparsity); the first name the device's contains.
DATASHEET_BF16_TFLOPS = (("H100 PCIe", 756.0), ("H100", 989.4), ("H200", 989.4), ("A100", 312.0))


class MeasurementError(Exception):
    """A measurement folder that cannot be read; the message names the file."""


@dataclass(frozen=True)
class Measurement:
    name: str
    info: dict
    epochs: pd.DataFrame

    @property
    def peak_tflops(self) -> float | None:
        return next((peak for name, peak in DATASHEET_BF16_TFLOPS if name in self.info["device_name"]), None)


def load_measurement(folder: str | Path) -> Measurement:
    folder = Path(folder)
    try:
        info = json.loads((folder / "device.json").read_text())
        epochs = pd.read_csv(folder / "epochs.csv")
    except (OSError, ValueError) as exc:
        raise MeasurementError(f"{folder}: not a finished single-device measurement ({exc})") from None
    return Measurement(folder.name, info, epochs)


def load_measurements(folder: str | Path) -> list[Measurement]:
    """Every measurement under `folder`, the CPU ones first."""
    found = [load_measurement(sub) for sub in sorted(Path(folder).iterdir()) if (sub / "device.json").exists()]
    return sorted(found, key=lambda m: (m.info["device"] != "cpu", m.name))


def throughput_table(m: Measurement) -> pd.DataFrame:
    """Per configuration: samples/s of each loop; model TFLOP/s, MFU and share of the matrix-product rate of
    the trainer as every run uses it (the timed loop)."""
    sums = m.epochs.groupby(CONFIG + ["loop"])[["samples", "seconds"]].sum()
    rates = (sums["samples"] / sums["seconds"]).unstack("loop")[list(LOOPS)].add_prefix("samples_per_s_")
    flops = m.epochs.groupby(CONFIG)["flops_per_sample"].first()
    table = rates.join(flops)
    table["tflops"] = table["samples_per_s_timed"] * table["flops_per_sample"] / 1e12
    table["share_of_matmul"] = [row.tflops / m.info["matmul_tflops"][amp] for (_, amp, _), row in table.iterrows()]
    table["mfu"] = table["tflops"] / m.peak_tflops if m.peak_tflops else float("nan")
    return table


def ratio_table(m: Measurement) -> pd.DataFrame:
    """Per configuration and ratio: median, lowest and highest over the rounds of (throughput of the loop) /
    (throughput of the loop it is set against)."""
    seconds = m.epochs.set_index(CONFIG + ["round", "loop"])["seconds"].unstack("loop")
    columns = {}
    for name, (loop, against, _, _) in RATIOS.items():
        per_round = (seconds[against] / seconds[loop]).groupby(CONFIG)
        columns |= {f"{name}_median": per_round.median(), f"{name}_low": per_round.min(),
                    f"{name}_high": per_round.max()}
    return pd.DataFrame(columns)


def ratio_sentence(m: Measurement, name: str) -> str:
    """What the measurement says of one ratio over every configuration, for any outcome."""
    table = ratio_table(m)
    _, _, words, target = RATIOS[name]
    median, low, high = table[f"{name}_median"], table[f"{name}_low"], table[f"{name}_high"]
    within = ((low <= 1) & (high >= 1)).sum()
    sentence = (f"{words}: {median.min():.3f} to {median.max():.3f} (median per configuration); "
                f"in {within} of {len(table)} configuration(s) the range over the rounds includes 1, "
                f"a difference within this machine's noise")
    if target is not None:
        missed = (high < target).sum()
        sentence += (f"; target {target}: missed beyond noise in {missed} configuration(s)" if missed
                     else f"; target {target}: no configuration is below it beyond noise")
    return sentence + "."


def _configuration_index(table: pd.DataFrame) -> pd.DataFrame:
    table = table.copy()
    table.index = [f"{preset}, {'bf16' if amp == 'bf16' else 'fp32'}, batch {batch}" for preset, amp, batch in table.index]
    return table


def throughput_markdown(m: Measurement) -> str:
    table = throughput_table(m)
    on_gpu = m.info["device"] != "cpu"
    table["compute"] = table["tflops"] * (1 if on_gpu else 1e3)
    columns = {"samples_per_s_plain": ("Plain loop (samples/s)", "{:.1f}"),
               "samples_per_s_timed": ("ddp_core, timers on (samples/s)", "{:.1f}"),
               "compute": (f"Model compute ({'TFLOP/s' if on_gpu else 'GFLOP/s'})", "{:.3g}"),
               "share_of_matmul": ("Share of the matrix-product rate (%)", "{:.0%}")}
    if m.peak_tflops:
        columns["mfu"] = ("MFU, of the bf16 datasheet peak (%)", "{:.1%}")
    return one_row_each(_configuration_index(table), columns, "Model, precision, batch (samples)")


def ratio_markdown(m: Measurement) -> str:
    table = ratio_table(m)
    for name in RATIOS:
        table[name] = [f"{mid:.3f} ({low:.3f}–{high:.3f})" for mid, low, high in
                       zip(table[f"{name}_median"], table[f"{name}_low"], table[f"{name}_high"])]
    columns = {name: (f"{words} (median, range)", "{}") for name, (_, _, words, _) in RATIOS.items()}
    return one_row_each(_configuration_index(table), columns, "Model, precision, batch (samples)")


def ceiling_sentence(m: Measurement) -> str:
    rates = " and ".join(f"{tflops:.3g} TFLOP/s in {'bf16' if amp == 'bf16' else 'fp32'}"
                         for amp, tflops in m.info["matmul_tflops"].items())
    peak = (f"; the datasheet's dense bf16 peak is {m.peak_tflops:g} TFLOP/s" if m.peak_tflops
            else "; MFU against a datasheet peak is not given for a device without one")
    sentence = f"One large matrix product ran at {rates} on this device{peak}."
    if (throughput_table(m)["share_of_matmul"] > 1).any():
        sentence += (" A share above 100 % means that the model's own, smaller products ran faster than the large "
                     "one: the library picks its kernels by shape, and at that precision the large product is not "
                     "this device's ceiling.")
    return sentence


def _or(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def provenance_sentence(m: Measurement) -> str:
    commit = m.info["git_commit"] or "unknown"
    extensions = m.info.get("cpu_extensions")
    cpu = ""
    if m.info["device"] == "cpu" and extensions is not None:
        missing = [name for name in CPU_EXTENSIONS if name not in extensions]
        has = f"with {', '.join(extensions)}" if extensions else "with none of"
        cpu = f": {m.info['cpu_count']} cores {has}" + (f"{' but no' if extensions else ''} {_or(missing)}"
                                                       if missing else "")
    return (f"{m.info['device']}{cpu}; {m.info['backend']}; PyTorch {m.info['torch']}"
            f"{'; CUDA ' + m.info['cuda'] if m.info.get('cuda') and m.info['device'] != 'cpu' else ''}; "
            f"measured on {m.info['start_time'][:10]} by code commit {commit[:10]}, "
            f"{m.epochs['round'].nunique()} timed epochs of each loop per configuration")


def devices_markdown(measurements: list[Measurement]) -> str:
    """A section per measured device: provenance, ceilings, the throughput table, the ratio table and what
    the ratios say."""
    parts = []
    for m in measurements:
        compiled = ", the trainer under torch.compile" if m.info.get("compile") else ""
        parts += [f"**{m.info['device_name']}{compiled}** ({provenance_sentence(m)}). {ceiling_sentence(m)}",
                  throughput_markdown(m), ratio_markdown(m),
                  "\n".join(f"- {ratio_sentence(m, name)}" for name in RATIOS)]
    return "\n\n".join(parts + [gpu_sentence(measurements)])


def gpu_sentence(measurements: list[Measurement]) -> str:
    gpus = [m.info["device_name"] for m in measurements if m.info["device"] != "cpu"]
    if gpus:
        return (f"The CUDA path (CUDA tensors, NCCL, CUDA-event timers) was measured on {', '.join(gpus)}: "
                f"these are the figures a GPU user's runs start from.")
    return ("No GPU measurement is among these results yet: every figure here is from a CPU, where MFU has no "
            "datasheet peak to be measured against. `make single-device RESULTS_DIR=reference` on a machine with "
            "a GPU adds one.")


def print_summary(folder: str | Path) -> None:
    m = load_measurement(folder)
    rounds = m.epochs["round"].nunique()
    print(f"{m.info['device_name']} ({m.info['device']}, {m.info['backend']}, torch {m.info['torch']}), "
          f"{rounds} timed epoch(s) per loop")
    print(ceiling_sentence(m))
    print(_configuration_index(throughput_table(m)).drop(columns="flops_per_sample")
          .to_string(float_format=lambda v: f"{v:.4g}"))
    for name in RATIOS:
        print(ratio_sentence(m, name))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m ddp_core.report.single_device FOLDER")
    try:
        print_summary(sys.argv[1])
    except MeasurementError as exc:
        sys.exit(f"single_device: error: {exc}")
