"""The DDP paper's knobs do what they say: the bucket size sets how many all-reduces a step launches, and a
communication hook changes the averaged gradient by no more than its compression allows."""

import json

import pandas as pd
import pytest
import torch

from conftest import SMALL_MODEL, TINY_SYNTHETIC, TWO_SHORT_EPOCHS, run_training


def test_without_a_hook_ddp_averages_the_ranks_gradients_exactly(hooked):
    for step, (ddp, exact) in enumerate(zip(hooked["none"], hooked["exact"], strict=True)):
        for name in exact:
            torch.testing.assert_close(ddp[name], exact[name], rtol=1e-6, atol=1e-9, msg=f"step {step}: {name}")


def test_fp16_compression_rounds_each_gradient_to_half_precision(hooked):
    for ddp, exact, magnitude in zip(hooked["fp16"], hooked["exact"], hooked["magnitude"], strict=True):
        for name in exact:
            # The hook rounds each rank's g_i to fp16, halves it and rounds the sum of the halves: each rounding
            # errs by 2^-11 of the value, or by half of fp16's smallest spacing (2^-25) below its normal range.
            bound = 2**-11 * (magnitude[name] + exact[name].abs()) + 4 * 2**-25
            assert ((ddp[name] - exact[name]).abs() <= bound).all(), name
    moved = [(ddp[n] != exact[n]).any().item() for ddp, exact in zip(hooked["fp16"], hooked["exact"]) for n in exact]
    assert any(moved), "fp16 compression left every gradient bit-identical: the hook did not run"


def test_powersgd_sends_low_rank_gradients_after_two_plain_steps(hooked):
    *plain, compressed = hooked["powersgd"]
    for step, grads in enumerate(plain):  # PyTorch's PowerSGD needs two plain all-reduces before it compresses
        for name in grads:
            torch.testing.assert_close(grads[name], hooked["exact"][step][name], rtol=1e-6, atol=1e-9)
    matrices = [name for name, grad in compressed.items() if grad.ndim == 2 and min(grad.shape) >= 8]
    exact_ranks = {name: torch.linalg.matrix_rank(hooked["exact"][-1][name]).item() for name in matrices}
    sent_ranks = {name: torch.linalg.matrix_rank(compressed[name]).item() for name in matrices}
    assert max(exact_ranks.values()) > 1
    assert set(sent_ranks.values()) == {1}, sent_ranks


@pytest.mark.slow
@pytest.mark.parametrize("bucket_cap_mb, allreduces", [(1000, 1), (0.002, "many")])
def test_the_bucket_size_sets_how_many_allreduces_a_step_launches(tmp_path, isolated_env, bucket_cap_mb, allreduces):
    # Two epochs: timeline.csv draws a step of the last one. DDP's first step all-reduces every gradient in one bucket
    # (it forms its buckets in the order that step's gradients came in), so a one-epoch run may draw that step.
    args = [*TINY_SYNTHETIC, *TWO_SHORT_EPOCHS, "--bucket-cap-mb", bucket_cap_mb, "--out", tmp_path / "run"]
    run_training(args, cwd=tmp_path, env=isolated_env, nproc=2)
    launched = json.loads((tmp_path / "run" / "run.json").read_text())["allreduces_per_step"]
    if allreduces == "many":
        assert launched >= 5
    else:
        assert launched == allreduces
    # the timeline of the median step draws each of them inside backward, which returns once they are reduced
    timeline = pd.read_csv(tmp_path / "run" / "timeline.csv").set_index("what")
    buckets = timeline[timeline.index.str.startswith("all-reduce")]
    assert len(buckets) == launched
    backward = timeline.loc["backward"]
    assert (buckets["start_s"] >= backward["start_s"]).all() and (buckets["end_s"] <= backward["end_s"]).all()
    assert timeline.loc["forward", "end_s"] <= backward["start_s"] <= timeline.loc["optimizer", "start_s"]


@pytest.mark.slow
def test_powersgd_on_gloo_trains_in_one_bucket_where_the_default_would_make_two(tmp_path, isolated_env):
    # the small model's layers are a gradient of 1.6 MiB: beyond DDP's 1 MiB first bucket
    common = [*TINY_SYNTHETIC, *SMALL_MODEL, *TWO_SHORT_EPOCHS]
    run_training([*common, "--out", tmp_path / "plain"], cwd=tmp_path, env=isolated_env, nproc=2)
    run_training(
        [*common, "--comm-hook", "powersgd", "--out", tmp_path / "powersgd"], cwd=tmp_path, env=isolated_env, nproc=2
    )
    launched = {
        name: json.loads((tmp_path / name / "run.json").read_text())["allreduces_per_step"]
        for name in ("plain", "powersgd")
    }
    assert launched == {"plain": 2, "powersgd": 1}


@pytest.mark.slow
def test_one_rank_notes_when_each_of_ddps_buckets_would_be_ready_as_many_as_two_ranks_all_reduce(
    tmp_path, isolated_env
):
    """The forecast replays a one-node step on N nodes from these moments: they must be DDP's own buckets."""
    common = [*TINY_SYNTHETIC, *SMALL_MODEL, *TWO_SHORT_EPOCHS]
    run_training([*common, "--out", tmp_path / "one"], cwd=tmp_path, env=isolated_env)
    run_training([*common, "--out", tmp_path / "two"], cwd=tmp_path, env=isolated_env, nproc=2)
    timeline = pd.read_csv(tmp_path / "one" / "timeline.csv").set_index("what")
    ready = timeline[timeline.index.str.startswith("gradients ready, bucket ")]
    launched = json.loads((tmp_path / "two" / "run.json").read_text())["allreduces_per_step"]
    assert list(ready.index) == [f"gradients ready, bucket {k}" for k in range(1, launched + 1)] and launched == 2
    backward = timeline.loc["backward"]
    assert backward["start_s"] < ready["start_s"].iloc[0] <= ready["start_s"].iloc[-1] <= backward["end_s"]
