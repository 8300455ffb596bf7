"""Where a step's time goes: every operator lands in a category, the rows add up to the step, and the FLOPs
the rates rest on are the model's."""

import json
import subprocess
import sys

import pandas as pd
import pytest

from conftest import REPO
from ddp_core.analysis.step_profile import (
    OTHER,
    OUTSIDE,
    StepProfile,
    category,
    category_table,
    profiled_step,
    read_step_profile,
    short_name,
)


@pytest.mark.parametrize(
    "operator,expected",
    [
        ("aten::mm", "matrix products"),
        ("aten::addmm", "matrix products"),
        ("aten::bmm", "matrix products"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "attention"),
        ("aten::_cudnn_attention_backward", "attention"),
        ("aten::native_layer_norm_backward", "normalisation and activations"),
        ("aten::gelu_backward", "normalisation and activations"),
        ("aten::bernoulli_", "dropout"),
        ("aten::_fused_adamw_", "optimizer"),
        ("aten::embedding_dense_backward", "embeddings"),
        ("aten::copy_", "copies and conversions"),
        ("aten::mul", OTHER),
        ("aten::fill_", OTHER),
        ("Optimizer.step#AdamW.step", "optimizer"),
        ("autograd::engine::evaluate_function: AddmmBackward0", "autograd's own work"),
        ("ScaledDotProductFlashAttentionForCpuBackward0", "autograd's own work"),
    ],
)
def test_each_operator_is_counted_in_the_category_a_reader_expects(operator, expected):
    assert category(operator) == expected


def test_the_rows_add_up_to_the_step_and_the_products_rate_is_their_flops_over_their_time():
    operators = pd.DataFrame(
        [
            {"category": "matrix products", "operator": "aten::mm", "self_s_per_step": 0.030, "flops_per_step": 3e9},
            {"category": "matrix products", "operator": "aten::addmm", "self_s_per_step": 0.010, "flops_per_step": 1e9},
            {"category": "dropout", "operator": "aten::bernoulli_", "self_s_per_step": 0.020, "flops_per_step": 0.0},
            {"category": OTHER, "operator": "aten::mul", "self_s_per_step": 0.005, "flops_per_step": 1e6},
        ]
    )
    table = category_table(StepProfile("cpu", {"device": "cpu", "step_s": 0.070}, operators))
    assert table["seconds"].sum() == pytest.approx(0.070)
    assert table.loc[OUTSIDE, "ms"] == pytest.approx(5.0)
    assert table.loc["matrix products", "gflops"] == pytest.approx(100.0)
    assert table.loc["matrix products", "largest"] == "aten::mm"
    assert pd.isna(table.loc[OTHER, "gflops"])  # elementwise FLOPs are not a rate worth a column
    assert list(table.index[:3]) == ["matrix products", "dropout", OTHER]  # largest first, then the rest


@pytest.mark.slow
def test_the_profiled_products_carry_the_cost_models_flops_but_the_fused_attentions(tmp_path, isolated_env):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.step_profile",
            "--steps",
            "2",
            "--dataset",
            "synthetic",
            "--batch-size",
            "8",
            "--results-dir",
            str(tmp_path),
        ],
        cwd=REPO,
        env=isolated_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    folder = tmp_path / "step_profile" / "cpu"
    info, operators = json.loads((folder / "device.json").read_text()), pd.read_csv(folder / "operators.csv")
    assert 0 < operators["self_s_per_step"].sum() <= info["step_s"] * 1.02
    products = operators.loc[operators["category"] == "matrix products", "flops_per_step"].sum()
    attention = 3 * info["batch_size"] * info["seq_len"] * 4 * 2 * info["seq_len"] * 128  # small: 2 layers, 128 wide
    assert products == pytest.approx(info["model_flops_per_step"] - attention, rel=0.01)
    assert info["batch_size"] == 8
    assert profiled_step(read_step_profile(folder)).model == "small preset in fp32"


@pytest.mark.parametrize(
    "operator,shown",
    [
        ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "`flash_attention` (backward)"),
        ("autograd::engine::evaluate_function: AddmmBackward0", "`AddmmBackward0`"),
        ("aten::mm", "`mm`"),
    ],
)
def test_an_operators_name_is_short_enough_for_the_tables_column(operator, shown):
    assert short_name(operator) == shown


def test_the_one_device_chapter_shows_a_cpus_profile_and_leaves_a_gpus_to_the_gpu_chapter():
    from ddp_core.report.single_device import shown_profile

    gpu, cpu = (
        StepProfile(name, {"device": device}, pd.DataFrame())
        for name, device in (("cuda-nvidia-h200", "cuda:0"), ("cpu", "cpu"))
    )
    assert shown_profile([gpu, cpu]) is cpu
    assert shown_profile([gpu]) is gpu  # a GPU's alone: shown here too, rather than nothing
