"""Where a training step's time goes, by category of operator, from the profile of `benchmarks/step_profile`.

The profile is a folder per device with operators.csv and device.json. The rows add up to the step.

    python -m ddp_core.analysis.step_profile results/step_profile/cpu     # prints the table
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ddp_core.analysis.results import load_per_device, read_device_files, run_on_folder
from ddp_core.analysis.throughput import precision_name
from ddp_core.analysis.tables import measured_by, quantity_table

# An operator's category, which the book sums by, is the first whose pattern its name contains; any other is OTHER
# (elementwise arithmetic, filling tensors with zeros, views).
CATEGORIES = (
    ("matrix products", ("aten::mm", "aten::addmm", "aten::bmm")),
    (
        "attention",
        (
            "scaled_dot_product",
            "flash_attention",
            "cudnn_attention",
            "efficient_attention",
            "aten::_softmax",
            "aten::_safe_softmax",
        ),
    ),
    ("normalisation and activations", ("layer_norm", "aten::gelu")),
    ("dropout", ("bernoulli", "dropout")),
    ("optimizer", ("adam", "Optimizer.")),
    ("autograd's own work", ("autograd::", "Backward0", "Backward1")),
    ("embeddings", ("embedding",)),
    ("loss", ("nll_loss", "log_softmax")),
    ("copies and conversions", ("aten::copy_", "aten::_to_copy", "aten::clone", "aten::contiguous", "aten::cat")),
)
OTHER = "other operators"


def category(operator: str) -> str:
    return next((name for name, patterns in CATEGORIES if any(p in operator for p in patterns)), OTHER)


def categorised(p: StepProfile) -> pd.DataFrame:
    """The profile's operators, each in its category by today's `CATEGORIES` (not the one written when measured)."""
    return p.operators.assign(category=p.operators["operator"].map(category))


OUTSIDE = "outside any operator (the loop, the profiler)"
# On a GPU the rows are the kernels' time, so what is left of the step is time the GPU ran no kernel.
GPU_IDLE = "no kernel running (the GPU waits for the loop's launches, the profiler)"


@dataclass
class StepProfile:
    name: str  # the device, as benchmarks/step_profile names its folder
    info: dict
    operators: pd.DataFrame


def read_step_profile(folder: str | Path) -> StepProfile:
    return StepProfile(*read_device_files(folder, "operators.csv", "step profile"))


def load_step_profiles(folder: str | Path) -> list[StepProfile]:
    return load_per_device(folder, read_step_profile)


def category_table(p: StepProfile) -> pd.DataFrame:
    """Per category, largest first, then the time outside operators: time per step, share, largest operator, rate.

    Only the matrix products get a rate, in GFLOP/s.
    """
    # Each operator's self time per step falls in one category: its own, not its callees'. On a GPU, its kernels'.
    ops = categorised(p)
    by_category = ops.groupby("category").agg(seconds=("self_s_per_step", "sum"), flops=("flops_per_step", "sum"))
    by_category["largest"] = ops.set_index("operator").groupby("category")["self_s_per_step"].idxmax()
    by_category = by_category.sort_values("seconds", ascending=False)
    step = p.info["step_s"]
    # The step's time no operator spent is its own row, so the rows add up to the step: Python, the loop, the profiler's
    # bookkeeping, or on a GPU the time no kernel ran.
    outside = pd.DataFrame(
        {"seconds": [step - by_category["seconds"].sum()], "flops": [0.0], "largest": [""]},
        index=[OUTSIDE if p.info["device"] == "cpu" else GPU_IDLE],
    )
    table = pd.concat([by_category, outside])
    table["ms"] = table["seconds"] * 1e3
    table["share_pct"] = table["seconds"] / step * 100
    # the profiler counts the products' FLOPs from their shapes
    table["gflops"] = (table["flops"] / table["seconds"] / 1e9).where(table.index == "matrix products")
    return table


def short_name(operator: str) -> str:
    """An operator's name as markdown short enough for a narrow table column to break.

    `aten::_scaled_dot_product_flash_attention_for_cpu_backward` reads `flash_attention` (backward).
    """
    for noise in ("autograd::engine::evaluate_function: ", "aten::", "_scaled_dot_product_", "_for_cpu"):
        operator = operator.replace(noise, "")
    name, backward, _ = operator.partition("_backward")
    return f"`{name}`" + (" (backward)" if backward else "") if name else ""


def category_markdown(p: StepProfile) -> str:
    table = category_table(p)
    table["largest"] = [short_name(name) for name in table["largest"]]
    table.index = [name[0].upper() + name[1:] for name in table.index]
    table["share"] = [f"{pct:.0f}" if pct >= 0.95 else f"{pct:.1f}" for pct in table["share_pct"]]
    unit, gflops_per_unit = _rate_unit(p)
    table["rate"] = table["gflops"] / gflops_per_unit
    columns = {
        "ms": ("Time per step (ms)", "{:.1f}"),
        "share": ("Share of the step (%)", "{}"),
        "rate": (f"Rate ({unit})", "{:,.0f}"),
        "largest": ("Largest operator", "{}"),
    }
    return quantity_table(table, columns, "Operators")


@dataclass(frozen=True)
class ProfiledStep:
    """A profile as a page introduces its table: what ran, and its FLOP rates against one large product's."""

    device: str
    torch: str
    threads: int
    measured_on: str
    commit: str
    steps: int
    batch: int
    seq_len: int
    model: str
    step_ms: str
    large_rate: str
    products_rate: str
    products_share: str
    products_time_share: str
    model_rate: str
    model_share: str


def profiled_step(p: StepProfile) -> ProfiledStep:
    """`ProfiledStep` of a profile, from its device.json and `category_table`."""
    info, table = p.info, category_table(p)
    products = table.loc["matrix products"]
    large = info["matmul_tflops"] * 1e3  # GFLOP/s
    model = info["model_flops_per_step"] / info["step_s"] / 1e9  # the cost model's FLOPs over the step's wall time
    unit, gflops_per_unit = _rate_unit(p)
    return ProfiledStep(
        device=info["device_name"],
        torch=info["torch"],
        threads=info["threads"],
        **measured_by(info, "measured_on"),
        steps=info["steps"],
        batch=info["batch_size"],
        seq_len=info["seq_len"],
        model=f"{info['preset']} preset in {precision_name(info.get('amp', 'off'))}",
        step_ms=f"{info['step_s'] * 1e3:.0f}",
        large_rate=f"{large / gflops_per_unit:,.0f} {unit}",
        products_rate=f"{products['gflops'] / gflops_per_unit:,.0f} {unit}",
        products_share=f"{products['gflops'] / large:.0%}",
        products_time_share=f"{products['share_pct']:.0f}%",
        model_rate=f"{model / gflops_per_unit:,.0f} {unit}",
        model_share=f"{model / large:.0%}",
    )


def _rate_unit(p: StepProfile) -> tuple[str, float]:
    """The unit a device's rates read best in, TFLOP/s on a GPU and GFLOP/s on a CPU, and the GFLOP/s in one."""
    return ("GFLOP/s", 1) if p.info["device"] == "cpu" else ("TFLOP/s", 1e3)


def print_summary(p: StepProfile) -> None:
    print(category_markdown(p))
    print(profiled_step(p))


if __name__ == "__main__":
    sys.exit(run_on_folder("ddp_core.analysis.step_profile", print_summary, load=read_step_profile))
