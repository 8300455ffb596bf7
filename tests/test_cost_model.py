"""The all-reduce benchmark and the alpha-beta model fitted to it."""

import subprocess

import numpy as np
import pandas as pd
import pytest

from conftest import train_command
from ddp_core.cost_model import BUCKET_BYTES, FIRST_BUCKET_BYTES, bucket_sizes, fit_alpha_beta
from ddp_core.model import ModelConfig, TransformerClassifier, count_parameters


def test_benchmark_reports_time_and_the_nccl_tests_bandwidths(tmp_path, isolated_env):
    launch = train_command(2)[:-1] + ["ddp_core.bench_allreduce", "--out", str(tmp_path / "ar"),
                                      "--max-bytes", str(2**16), "--seconds-per-size", "0.02"]
    subprocess.run(launch, cwd=tmp_path, env=isolated_env, check=True, capture_output=True, timeout=300)
    bench = pd.read_csv(tmp_path / "ar" / "allreduce.csv")
    assert list(bench["size_bytes"]) == [4, 16, 64, 256, 1024, 4096, 16384, 65536]
    assert (bench["time_s"] > 0).all() and (bench["world_size"] == 2).all()
    np.testing.assert_allclose(bench["algbw_GBps"], bench["size_bytes"] / bench["time_s"] / 1e9)
    np.testing.assert_allclose(bench["busbw_GBps"], bench["algbw_GBps"] * 2 * (2 - 1) / 2)
    again = subprocess.run(launch, cwd=tmp_path, env=isolated_env, capture_output=True, text=True, timeout=300)
    assert again.returncode != 0 and "exists; choose another --out" in again.stderr


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
