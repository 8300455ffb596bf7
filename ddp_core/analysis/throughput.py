"""One device's training throughput and model FLOP utilisation, from the measurements of
`benchmarks/single_device.py` (a folder per device: epochs.csv, device.json; `results.load_measurements`).

Throughput of a loop: its samples over its seconds, summed over the timed epochs. Model FLOP
utilisation (MFU): the model's training FLOPs per second (the cost model's count, padding included)
over the device's dense bf16 peak from its datasheet, the usual definition (PaLM, Chowdhery et al.
2022); beside it, the share of the rate one large matrix product reached on the same device, which
a CPU, with no datasheet figure, has too.
"""

from __future__ import annotations

import pandas as pd

from ddp_core.analysis.results import Measurement

CONFIG = ["preset", "amp", "batch_size"]
# Dense bf16 tensor-core peaks by NVIDIA's datasheets (TFLOP/s, no sparsity); the first name the device's contains.
DATASHEET_BF16_TFLOPS = (("H100 PCIe", 756.0), ("H100", 989.4), ("H200", 989.4), ("A100", 312.0))


def peak_tflops(m: Measurement) -> float | None:
    """The device's dense bf16 peak by its datasheet; none for a device without one (a CPU)."""
    return next((peak for name, peak in DATASHEET_BF16_TFLOPS if name in m.info["device_name"]), None)


def throughput_table(m: Measurement) -> pd.DataFrame:
    """Per configuration: samples/s of each loop; model TFLOP/s, MFU and share of the matrix-product rate of
    the trainer as every run uses it (the timed loop)."""
    sums = m.epochs.groupby(CONFIG + ["loop"])[["samples", "seconds"]].sum()
    rates = (sums["samples"] / sums["seconds"]).unstack("loop").add_prefix("samples_per_s_")
    flops = m.epochs.groupby(CONFIG)["flops_per_sample"].first()
    table = rates.join(flops)
    table["tflops"] = table["samples_per_s_timed"] * table["flops_per_sample"] / 1e12
    table["share_of_matmul"] = [row.tflops / m.info["matmul_tflops"][amp] for (_, amp, _), row in table.iterrows()]
    peak = peak_tflops(m)
    table["mfu"] = table["tflops"] / peak if peak else float("nan")
    return table


def precision_name(amp: str) -> str:
    """A run's --amp as a reader names the precision."""
    return "bf16" if amp == "bf16" else "fp32"
