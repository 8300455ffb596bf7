"""The GPU chapter: its MFU, its verdict on the compiled trainer, how much of a step the GPU computes, each kernel
counted once, where the forecast's ratio falls among the emulated links, and the trainer's runs as a reader sees
them."""

import json
from types import SimpleNamespace

import pandas as pd
import pytest
from torch.autograd import DeviceType

from benchmarks.step_profile import operator_rows
from ddp_core.analysis.gpu_measurements import (
    GpuResults,
    best_mfu,
    compiled_trainer,
    forecast_table,
    forecast_word,
    goal_word,
    load_gpu_results,
    place_among,
)
from ddp_core.report.gpu import gpu_profile, trainer_table
from ddp_core.analysis.results import Measurement
from ddp_core.analysis.step_profile import GPU_IDLE, StepProfile, category_table

H200_PEAK = 989.4


def measurement(seconds: dict[str, list[float]], *, batch=128, compiled=False, amp="bf16") -> Measurement:
    """One configuration of the large model: the given seconds per loop and round, 10 steps of `batch` an epoch."""
    rows = [
        dict(
            preset="large",
            amp=amp,
            batch_size=batch,
            seq_len=128,
            vocab_size=20000,
            num_classes=2,
            flops_per_sample=6.7e10,
            loop=loop,
            round=r,
            samples=10 * batch,
            seconds=s,
        )
        for loop, per_round in seconds.items()
        for r, s in enumerate(per_round)
    ]
    info = {"device": "cuda:0", "device_name": "NVIDIA H200", "compile": compiled, "matmul_tflops": {amp: 780.0}}
    return Measurement("cuda-nvidia-h200", info, pd.DataFrame(rows))


def test_mfu_is_the_trainers_model_flops_over_the_datasheet_peak_and_the_goal_is_judged_on_it():
    eager = measurement({"plain": [0.4] * 3, "ddp_core": [0.4] * 3, "timed": [0.4] * 3, "ddp_of_one": [0.4] * 3})
    found = best_mfu(GpuResults(eager, None, None))
    tflops = 10 * 128 / 0.4 * 6.7e10 / 1e12
    assert found.tflops == pytest.approx(tflops)
    assert found.mfu == pytest.approx(tflops / H200_PEAK)
    assert goal_word(GpuResults(eager, None, None)) == "not reached"  # 214 TFLOP/s is 22 % of the peak
    fast = measurement({loop: [0.2] * 3 for loop in ("plain", "ddp_core", "timed", "ddp_of_one")})
    assert goal_word(GpuResults(fast, None, None)) == "reached"  # 43 %


def test_the_compiled_trainer_is_called_faster_only_when_every_round_says_so():
    eager = measurement({loop: [0.4] * 3 for loop in ("plain", "ddp_core", "timed", "ddp_of_one")})
    compiled = measurement(
        {"plain": [0.40, 0.41, 0.40], "ddp_core": [0.30] * 3, "timed": [0.30, 0.29, 0.31], "ddp_of_one": [0.31] * 3},
        compiled=True,
    )
    found = compiled_trainer(GpuResults(eager, compiled, None))
    assert found.vs_plain == pytest.approx(0.40 / 0.30)  # the median of 1.33, 1.41 and 1.29
    assert found.verdict == "faster"
    assert found.eager_mfu == pytest.approx(10 * 128 / 0.4 * 6.7e10 / 1e12 / H200_PEAK)
    mixed = measurement(
        {"plain": [0.40, 0.30, 0.40], "ddp_core": [0.35] * 3, "timed": [0.35, 0.35, 0.35], "ddp_of_one": [0.35] * 3},
        compiled=True,
    )
    assert compiled_trainer(GpuResults(eager, mixed, None)).verdict == "no visible difference"


def test_the_kernels_share_is_of_the_unprofiled_step_of_the_same_workload():
    eager = measurement(
        {"plain": [0.5] * 3, "ddp_core": [0.32, 0.34, 0.30], "timed": [0.5] * 3, "ddp_of_one": [0.5] * 3}
    )
    operators = pd.DataFrame(
        [
            {"category": "matrix products", "operator": "aten::mm", "self_s_per_step": 0.012, "flops_per_step": 8.4e12},
            {
                "category": "normalisation and activations",
                "operator": "aten::native_layer_norm",
                "self_s_per_step": 0.010,
                "flops_per_step": 0.0,
            },
            {
                "category": "dropout",
                "operator": "aten::native_dropout",
                "self_s_per_step": 0.008,
                "flops_per_step": 0.0,
            },
        ]
    )
    info = {
        "device": "cuda:0",
        "device_name": "NVIDIA H200",
        "preset": "large",
        "amp": "bf16",
        "batch_size": 128,
        "steps": 20,
        "seq_len": 128,
        "step_s": 0.060,
        "matmul_tflops": 800.0,
    }
    found = gpu_profile(GpuResults(eager, None, StepProfile("cuda-nvidia-h200", info, operators)))
    assert found.unprofiled_step_ms == pytest.approx(32.0)  # the median epoch of the loop the profile ran, / 10
    assert found.busy_ms == pytest.approx(30.0)
    assert found.busy_of_unprofiled == pytest.approx(30 / 32)
    assert found.busy_of_profiled == pytest.approx(0.5)
    assert found.products_share == pytest.approx(0.4)
    assert found.products_tflops == pytest.approx(700.0)
    assert found.products_of_large == pytest.approx(700 / 800)
    assert (found.largest_other, found.largest_other_ms) == ("normalisation and activations", pytest.approx(10.0))
    idle = category_table(StepProfile("cuda-nvidia-h200", info, operators)).loc[GPU_IDLE, "ms"]
    assert idle == pytest.approx(30.0)  # the profiled step's time that no kernel ran


def event(key, microseconds, device_type=DeviceType.CPU, annotation=False, flops=0):
    return SimpleNamespace(
        key=key,
        count=20,
        device_type=device_type,
        is_user_annotation=annotation,
        flops=flops,
        self_device_time_total=microseconds,
        self_cpu_time_total=5.0,
    )


def test_on_a_gpu_each_kernel_is_counted_once_under_the_operator_that_launched_it():
    events = [
        event("aten::mm", 200_000, flops=1e14),
        event("nvjet_sm90_tst_256x128", 200_000, DeviceType.CUDA),
        event("aten::_fused_adamw_", 20_000),
        event("multi_tensor_apply_kernel", 20_000, DeviceType.CUDA),
        event("Optimizer.step#AdamW.step", 22_000, annotation=True),
        event("aten::view", 0),
    ]
    rows = operator_rows(SimpleNamespace(key_averages=lambda: events), steps=20, on_gpu=True)
    assert list(rows["operator"]) == ["aten::mm", "aten::_fused_adamw_"]
    assert rows["self_s_per_step"].sum() == pytest.approx(0.011)  # the kernels' 220 ms over 20 steps, once
    assert rows.loc[0, "flops_per_step"] == pytest.approx(5e12)
    on_cpu = operator_rows(SimpleNamespace(key_averages=lambda: events), steps=20, on_gpu=False)
    assert "Optimizer.step#AdamW.step" in set(on_cpu["operator"])  # a CPU's optimizer range is time of its own


@pytest.mark.parametrize(
    "ratio,place,beside",
    [(8.5, "above", ["600 Mbit/s"]), (1.0, "between", ["200 Mbit/s", "600 Mbit/s"]), (0.2, "below", ["200 Mbit/s"])],
)
def test_the_gpus_ratio_is_placed_among_the_emulated_links_with_its_neighbours(ratio, place, beside):
    links = pd.Series({"600 Mbit/s": 1.74, "200 Mbit/s": 0.54})
    assert place_among(ratio, links) == (place, beside)


@pytest.mark.parametrize(
    "slowest,fastest,word",
    [
        (0.6, 0.9, "slower than one GPU"),
        (1.1, 1.8, "faster than one GPU"),
        (0.8, 1.3, "about as fast as one GPU"),
        (1.0, 1.2, "about as fast as one GPU"),
        (0.7, 1.0, "about as fast as one GPU"),
    ],
)
def test_a_forecast_takes_a_side_of_one_gpu_only_where_its_whole_range_lies_on_it(slowest, fastest, word):
    assert forecast_word(slowest, fastest) == word


def test_the_trainers_runs_read_as_their_last_epoch(train, tmp_path):
    for preset in ("small", "tiny"):
        train(
            "--dataset",
            "synthetic",
            "--preset",
            preset,
            "--seq-len",
            "16",
            "--train-samples",
            "64",
            "--eval-samples",
            "32",
            "--global-batch-size",
            "16",
            "--epochs",
            "2",
            "--no-progress",
            "--out",
            tmp_path / "gpu_trainer" / f"{preset}-off",
        )
    table = trainer_table(tmp_path / "gpu_trainer")
    assert list(table["preset"]) == ["tiny", "small"]  # by size, not by name
    metrics = pd.read_csv(tmp_path / "gpu_trainer" / "small-off" / "metrics.csv")
    row = table.iloc[1]
    assert (row["epochs"], row["val_accuracy"], row["samples_per_s"]) == (
        2,
        metrics["val_accuracy"].iloc[-1],
        metrics["samples_per_s"].iloc[-1],
    )
    assert (row["chance"], row["batch"], row["seq_len"]) == (0.5, 16, 16)


def test_the_forecast_steps_each_gpus_quarter_in_ddp_and_takes_r_as_the_emulated_cluster_does():
    quarter = measurement(
        {"plain": [0.3] * 3, "ddp_core": [0.3] * 3, "timed": [0.3] * 3, "ddp_of_one": [0.40, 0.44, 0.36]}, batch=32
    )
    whole = measurement(
        {"plain": [0.7] * 3, "ddp_core": [0.8] * 3, "timed": [0.85] * 3, "ddp_of_one": [0.9] * 3}, batch=128
    )
    eager = Measurement("cuda-nvidia-h200", quarter.info, pd.concat([quarter.epochs, whole.epochs]))
    row = forecast_table(GpuResults(eager, None, None)).iloc[0]
    assert (row["one_gpu_ms"], row["per_gpu_ms"]) == (pytest.approx(80.0), pytest.approx(40.0))  # bare; in DDP
    assert row["compute_over_ideal"] == pytest.approx(2.0)  # 40 ms against 80 / 4
    assert row["ratio"] == pytest.approx(20.0 / row["comm_ms"])
    assert row["efficiency_no_overlap"] == pytest.approx(80 / (40 + row["comm_ms"]) / 4)
    assert row["efficiency_no_overlap_low"] == pytest.approx(80 / (44 + row["comm_ms"]) / 4)  # the slowest round
    assert (row["speedup_slowest_round"], row["speedup_fastest_round"]) == (
        pytest.approx(80 / (44 + row["comm_ms"])),
        pytest.approx(80 / (36 + row["last_bucket_ms"])),
    )
    assert (row["bare_per_gpu_ms"], row["ddp_cost_ms"]) == (pytest.approx(30.0), pytest.approx(10.0))  # DDP's own work
    assert (row["bare_speedup_no_overlap"], row["bare_speedup_last_bucket_only"]) == (  # without it
        pytest.approx(80 / (30 + row["comm_ms"])),
        pytest.approx(80 / (30 + row["last_bucket_ms"])),
    )


def test_the_chapter_reads_the_gpu_measured_in_full_and_passes_over_one_measured_in_part(tmp_path):
    def save(folder, info, table, name):
        folder.mkdir(parents=True)
        (folder / "device.json").write_text(json.dumps(info))
        table.to_csv(folder / name, index=False)

    loops = ("plain", "ddp_core", "timed", "ddp_of_one")
    for gpu, batches in (("NVIDIA A100", (32,)), ("NVIDIA H200", (32, 128))):  # the A100 sorts first, measured in part
        m = [measurement({loop: [0.4] * 3 for loop in loops}, batch=b) for b in batches]
        info = m[0].info | {"device_name": gpu}
        save(tmp_path / "single_device" / gpu, info, pd.concat([x.epochs for x in m]), "epochs.csv")
    save(
        tmp_path / "single_device" / "H200-compiled",
        info | {"compile": True},
        measurement({loop: [0.3] * 3 for loop in loops}, compiled=True).epochs,
        "epochs.csv",
    )
    save(
        tmp_path / "step_profile" / "H200",
        {"device": "cuda:0", "device_name": "NVIDIA H200"},
        pd.DataFrame(
            [
                {
                    "category": "matrix products",
                    "operator": "aten::mm",
                    "calls_per_step": 1,
                    "self_s_per_step": 0.01,
                    "flops_per_step": 1e12,
                }
            ]
        ),
        "operators.csv",
    )
    gpu = load_gpu_results(tmp_path)
    assert (gpu.eager.info["device_name"], gpu.compiled.info["compile"], gpu.profile.name) == (
        "NVIDIA H200",
        True,
        "H200",
    )
    (tmp_path / "step_profile" / "H200" / "operators.csv").unlink()
    (tmp_path / "step_profile" / "H200" / "device.json").unlink()
    assert load_gpu_results(tmp_path) is None  # no GPU measured in full
