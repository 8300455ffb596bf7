"""The all-reduce benchmark and the alpha-beta model fitted to it."""

import pkgutil
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from conftest import REPO
from ddp_core.engine.model import TransformerClassifier, count_parameters
from ddp_core.engine.model_shape import PRESETS, ModelConfig, parameter_shapes
from ddp_core.engine.model_cost import (
    BUCKET_BYTES,
    FIRST_BUCKET_BYTES,
    bucket_ready_shares,
    bucket_sizes,
    training_flops,
)
from ddp_core.analysis.cost_model import fit_alpha_beta
from ddp_core.analysis.nvlink_forecast import (
    ALLREDUCE_FILE,
    FORECAST_GPUS,
    StepTimeline,
    forecast,
    measured_forecast,
    nvlink_fit,
    replay_forecast,
    replay_markdown,
)
from ddp_core.analysis.results import Measurement


def test_the_benchmark_never_overwrites_a_measurement(tmp_path, monkeypatch, capsys):
    from ddp_core.bench.allreduce import main

    (tmp_path / "ar").mkdir()
    (tmp_path / "ar" / "allreduce.csv").write_text("size_bytes\n4\n")
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun sets it: the refusal comes before the process group
    assert main(["--out", str(tmp_path / "ar")]) == 2
    assert "exists; choose another --out" in capsys.readouterr().err
    assert (tmp_path / "ar" / "allreduce.csv").read_text() == "size_bytes\n4\n"


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--min-bytes", "4096", "--max-bytes", "16"], "no size to time from --min-bytes 4096 to --max-bytes 16"),
        (["--sizes", "-8"], "at least 4 each"),
        (["--warmup", "0"], "--warmup needs at least 1 iteration"),
        (["--seconds-per-size", "-1"], "--seconds-per-size a time above 0"),
        (["--bogus"], "unrecognized arguments"),
    ],
    ids=["sizes out of order", "negative size", "no warm-up", "negative time budget", "unknown option"],
)
def test_bad_benchmark_options_are_one_line_before_any_process_group(tmp_path, monkeypatch, capsys, args, fragment):
    from ddp_core.bench.allreduce import main

    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["--out", str(tmp_path / "ar"), *args]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("bench_allreduce: error:") and fragment in line
    assert not (tmp_path / "ar").exists()


def test_fit_recovers_latency_and_bandwidth_of_a_ring():
    n, alpha, beta = 4, 25e-6, 1 / 12e9
    sizes = 4.0 ** np.arange(1, 15)
    noise = np.random.default_rng(0).normal(1, 0.01, sizes.size)
    times = (2 * (n - 1) * alpha + 2 * (n - 1) / n * sizes * beta) * noise
    fit = fit_alpha_beta(pd.DataFrame({"size_bytes": sizes, "time_s": times, "world_size": n}))
    assert fit.alpha_s == pytest.approx(alpha, rel=0.03)
    assert fit.bus_bandwidth_GBps == pytest.approx(12, rel=0.03)
    assert fit.max_relative_error < 0.05


def test_buckets_hold_every_gradient_byte_the_first_small_the_rest_up_to_the_cap():
    config = ModelConfig.from_preset("medium", vocab_size=20000, max_len=256, num_classes=2)
    model = TransformerClassifier(config)
    buckets = bucket_sizes(vars(config))
    assert sum(buckets) == 4 * count_parameters(model)
    assert buckets[0] >= FIRST_BUCKET_BYTES and len(buckets) >= 2
    largest_parameter = 4 * max(p.numel() for p in model.parameters())
    assert all(size < BUCKET_BYTES + largest_parameter for size in buckets[1:-1])


def test_a_bucket_is_ready_when_backward_has_done_the_flops_of_its_parameters_and_of_all_registered_after_them():
    """The small model, by hand, in weight-equivalents of 2 FLOPs a token: a block's Linear weights are 384*128 (qkv),
    128*128 (proj), 512*128 and 128*512 (the feed-forward), its attention scores 4 T d / 2 = 2*128*128 at qkv:
    229,376 a block, 2 blocks and the head's 2*128: 459,008. The first bucket (1 MiB: 262,144 elements) closes,
    counting back from the head, at block 0's second feed-forward weight (264,066 elements): the head, block 1 and
    that weight, 256 + 229,376 + 65,536 FLOPs. The second holds the rest and the embeddings: ready at the end."""
    small = vars(ModelConfig.from_preset("small", vocab_size=20000, max_len=128, num_classes=2))
    assert bucket_ready_shares(small) == pytest.approx([(256 + 229_376 + 65_536) / 459_008, 1.0])


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_training_flops_agree_with_pytorchs_flop_counter(preset):
    config = ModelConfig.from_preset(preset, vocab_size=1000, max_len=64, num_classes=2, dropout=0.0)
    model = TransformerClassifier(config)
    # The math attention path runs as matrix products, which the counter sees; the fused CPU kernel it does not.
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(torch.randint(1, 1000, (4, 64))).sum().backward()
    assert training_flops(vars(config), 4 * 64) == pytest.approx(counter.get_total_flops(), rel=0.02)


def test_nvlink_forecast_is_sourced_and_brackets_the_speedup_between_its_two_overlap_scenarios():
    published = pd.read_csv(ALLREDUCE_FILE, comment="#")
    assert "https://github.com/Azure/AI-benchmarking-guide" in ALLREDUCE_FILE.read_text().splitlines()[1]
    fit = nvlink_fit(FORECAST_GPUS)
    assert published["busbw_GBps"].iloc[-8] < fit.bus_bandwidth_GBps <= published["busbw_GBps"].max()
    workload = {"global_batch_size": 32, "model": {"vocab_size": 20000, "max_len": 128, "num_classes": 2}}
    ahead = forecast(workload["model"], workload["global_batch_size"], FORECAST_GPUS)
    assert list(ahead.index) == list(PRESETS)
    assert (ahead["speedup_no_overlap"] <= ahead["speedup_last_bucket_only"]).all()
    assert (ahead["break_even_compute_ms"] < ahead["efficiency_90_compute_ms"]).all()
    # A step slower than the break-even compute pays off with no overlap at all, by the model's own terms.
    pays = ahead["compute_bound_ms"] > ahead["break_even_compute_ms"]
    assert (pays == (ahead["speedup_no_overlap"] > 1)).all()


def gpu_epochs(preset: str, batch: int, timed_seconds: list[float], plain_seconds: float = 9.0) -> list[dict]:
    """A single-device measurement's rows of one configuration: the trainer with its timers, the same without them
    5 % faster and in DDP 10 % slower, and a plain loop beside them."""
    shape = dict(
        preset=preset, amp="bf16", batch_size=batch, seq_len=128, vocab_size=20000, num_classes=2, flops_per_sample=1e9
    )
    return [
        shape | dict(loop=loop, round=i, samples=batch * 10, seconds=s * slower)
        for loop, slower in (("timed", 1.0), ("ddp_core", 0.95), ("ddp_of_one", 1.1))
        for i, s in enumerate(timed_seconds)
    ] + [shape | dict(loop="plain", round=0, samples=batch * 10, seconds=plain_seconds)]


def test_the_forecast_from_a_measured_gpu_takes_the_whole_batch_from_the_trainer_and_each_share_from_it_in_ddp():
    """Both timers off, as the single-device benchmark runs its bare and DDP loops."""
    rows = gpu_epochs("small", 32, [0.1, 0.3]) + gpu_epochs("small", 128, [0.5, 0.7]) + gpu_epochs("large", 256, [1.0])
    info = {
        "device": "cuda",
        "device_name": "NVIDIA H100 80GB HBM3",
        "git_commit": "0123456789ab",
        "start_time": "2026-11-24T10:00:00+00:00",
        "matmul_tflops": {"bf16": 500.0},
    }
    m = Measurement("cuda-test", info, pd.DataFrame(rows))
    ahead = measured_forecast(m, world_size=4)
    assert list(ahead["batch_per_gpu"]) == [32], "a pair of batch sizes b and 4 b is needed"
    row = ahead.iloc[0]
    whole_ms, share_ms = 0.95 * 1.2 / 2560 * 128 * 1e3, 1.1 * 0.4 / 640 * 32 * 1e3  # seconds / samples x batch
    buckets = [
        nvlink_fit(4).allreduce_s(size) * 1e3
        for size in bucket_sizes(vars(ModelConfig.from_preset("small", vocab_size=20000, max_len=128, num_classes=2)))
    ]
    assert (row["one_gpu_ms"], row["per_gpu_ms"]) == (pytest.approx(whole_ms), pytest.approx(share_ms))
    assert row["comm_ms"] == pytest.approx(sum(buckets))
    assert row["speedup_no_overlap"] == pytest.approx(whole_ms / (share_ms + sum(buckets)))
    assert row["speedup_last_bucket_only"] == pytest.approx(whole_ms / (share_ms + buckets[-1]))


def gpu_timeline(batch: int, step_s: float, buckets: int) -> StepTimeline:
    """One GPU's step of the small model at `batch`: forward the first fifth, backward to 0.9 of the step with every
    bucket but the last ready as it starts and the last as it ends, then the optimizer."""
    rows = [
        ("data", 0.0, 0.0),
        ("forward", 0.0, 0.2 * step_s),
        ("backward", 0.2 * step_s, 0.9 * step_s),
        *((f"gradients ready, bucket {k}", 0.2 * step_s, 0.2 * step_s) for k in range(1, buckets)),
        (f"gradients ready, bucket {buckets}", 0.9 * step_s, 0.9 * step_s),
        ("optimizer", 0.9 * step_s, step_s),
    ]
    model = vars(ModelConfig.from_preset("small", vocab_size=20000, max_len=128, num_classes=2))
    info = {
        "config": {"amp": "bf16"},
        "per_rank_batch_size": batch,
        "model": model,
        "device_name": "NVIDIA H200",
        "start_time": "2026-11-26T21:22:19+00:00",
        "git_commit": "f7713e857323a461d1335629c3fc5dc485a2f2ce",
    }
    return StepTimeline(info, pd.DataFrame(rows, columns=["what", "start_s", "end_s"]))


def test_the_gpu_forecast_replays_a_gpus_measured_step_at_its_share_against_one_gpu_stepping_the_whole_batch():
    """Four GPUs at 32 each: the step measured at 32 (nothing scaled down) plus the last bucket's all-reduce, which
    backward cannot hide (the others are done long before it ends), against one GPU's step measured at 128."""
    model = vars(ModelConfig.from_preset("small", vocab_size=20000, max_len=128, num_classes=2))
    allreduces = [nvlink_fit(4).allreduce_s(size) for size in bucket_sizes(model)]
    timelines = [gpu_timeline(32, 0.02, len(allreduces)), gpu_timeline(128, 0.05, len(allreduces))]
    ahead = replay_forecast(timelines, world_size=4).set_index("batch_per_gpu")
    assert ahead.loc[32, "exposed_ms"] == pytest.approx(allreduces[-1] * 1e3)
    assert ahead.loc[32, "step_ms"] == pytest.approx((0.02 + allreduces[-1]) * 1e3)
    assert ahead.loc[32, "speedup"] == pytest.approx(0.05 / (0.02 + allreduces[-1]))
    assert ahead.loc[32, "fixed_batch_efficiency"] == pytest.approx(0.02 / (0.02 + allreduces[-1]))
    assert np.isnan(ahead.loc[128, "speedup"]), "no step of 512 was measured"
    table = replay_markdown(timelines).splitlines()
    assert [cell.strip() for cell in table[-2].split("|")[1:-1]][-2:] == [
        f"{0.05 / (0.02 + allreduces[-1]):.2f}",
        f"{0.02 / (0.02 + allreduces[-1]):.1%}",
    ]


@pytest.mark.parametrize("preset", list(PRESETS))
def test_the_shapes_the_report_counts_are_the_models_own(preset):
    config = ModelConfig.from_preset(preset, vocab_size=1000, max_len=64, num_classes=3)
    with torch.device("meta"):
        model = TransformerClassifier(config)
    assert list(parameter_shapes(config).items()) == [(name, tuple(p.shape)) for name, p in model.named_parameters()]


def test_the_book_pages_and_the_report_start_without_importing_torch():
    """A book page starts without torch (seconds per page, several pages per build): neither the pages' modules, the
    analysis layer, nor anything a page imports loads it."""
    pages = [
        *(REPO / "book").glob("*.md"),
        *(REPO / "book" / "studies").glob("*.md"),
        REPO / "notebooks" / "scaling_analysis.md",
    ]
    imported = {
        match for page in pages for match in re.findall(r"^(?:from|import) (ddp_core[\w.]*)", page.read_text(), re.M)
    }
    modules = sorted(
        imported
        | {
            f"ddp_core.{layer}.{m.name}"
            for layer in ("analysis", "report")
            for m in pkgutil.iter_modules([str(REPO / "ddp_core" / layer)])
        }
    )
    assert {"ddp_core.report.nodes", "ddp_core.analysis.emulated", "ddp_core.studies.study_list"} <= set(modules)
    check = f"import sys, {', '.join(modules)}; print('torch' in sys.modules)"
    assert (
        subprocess.run(
            [sys.executable, "-c", check], capture_output=True, text=True, check=True, cwd=REPO
        ).stdout.strip()
        == "False"
    )
