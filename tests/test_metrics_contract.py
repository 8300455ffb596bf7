"""The CSV and run.json that every chapter of the report reads."""

import json
import math
import os
import shutil
import subprocess
import sys
import time

import pandas as pd
import pytest

from conftest import REPO, TINY_SYNTHETIC, read_metrics, run_training
from ddp_core.engine.run_files import LINK_COLUMNS, METRICS_COLUMNS, NOISE_COLUMNS, STEPS_COLUMNS
from ddp_core.launch.plan import launch_command

pytestmark = pytest.mark.slow  # every test here trains more than a few steps

REQUIRED = [
    "epoch",
    "world_size",
    "global_batch_size",
    "per_rank_batch_size",
    "train_samples",
    "epoch_time_s",
    "data_time_s",
    "forward_time_s",
    "backward_time_s",
    "optimizer_time_s",
    "comm_total_s",
    "comm_exposed_s",
    "train_loss",
    "val_loss",
    "val_accuracy",
    "samples_per_s",
    "peak_memory_mb",
]
INTEGERS = [
    "epoch",
    "world_size",
    "global_batch_size",
    "per_rank_batch_size",
    "grad_accum",
    "train_samples",
    "steps",
    "resumes",
]
RUN = [*TINY_SYNTHETIC, "--global-batch-size", 32, "--train-samples", 512, "--eval-samples", 100, "--epochs", 2]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, isolated_env):
    folder = tmp_path_factory.mktemp("runs")
    run_training([*RUN, "--out", folder / "n1"], cwd=folder, env=isolated_env)
    run_training([*RUN, "--grad-accum", 2, "--out", folder / "n2"], cwd=folder, env=isolated_env, nproc=2)
    return folder


def test_metrics_have_the_documented_columns_and_types(runs):
    for name, world in [("n1", 1), ("n2", 2)]:
        rows = read_metrics(runs / name)
        assert list(rows[0]) == METRICS_COLUMNS and set(REQUIRED) <= set(METRICS_COLUMNS)
        assert [int(r["epoch"]) for r in rows] == [1, 2]
        for row in rows:
            assert math.isnan(float(row["link_sent_bytes"]))  # gloo given no interface to count, as off emulated nodes
            for column in set(METRICS_COLUMNS) - set(NOISE_COLUMNS) - set(LINK_COLUMNS):
                value = float(row[column])
                assert value >= 0, column
                if column in INTEGERS:
                    assert value == int(value), column
            assert int(row["world_size"]) == world
            assert int(row["global_batch_size"]) == 32
            assert int(row["per_rank_batch_size"]) * world * int(row["grad_accum"]) == 32
            assert 0 <= float(row["val_accuracy"]) <= 1
            assert float(row["samples_per_s"]) == pytest.approx(int(row["train_samples"]) / float(row["epoch_time_s"]))
            phases = sum(float(row[f"{p}_time_s"]) for p in ["data", "forward", "backward", "optimizer"])
            assert phases <= float(row["epoch_time_s"]) * 1.01


def test_every_step_has_a_row_of_steps_csv_whose_times_make_up_its_epoch(runs):
    for name in ("n1", "n2"):
        epochs, steps = pd.read_csv(runs / name / "metrics.csv"), pd.read_csv(runs / name / "steps.csv")
        assert list(steps.columns) == STEPS_COLUMNS
        per_epoch = steps.groupby("epoch").agg(
            steps=("step", "size"), last=("step", "max"), time=("step_time_s", "sum"), exposed=("comm_exposed_s", "sum")
        )
        assert per_epoch["steps"].tolist() == per_epoch["last"].tolist() == epochs["steps"].tolist()
        # the steps are the epoch but for the loop around them: a step is the mean over ranks, and every rank's steps
        # lie within its own epoch, so they sum to no more than the slowest rank's epoch
        assert (per_epoch["time"].values <= epochs["epoch_time_s"].values * (1 + 1e-9)).all()
        assert (per_epoch["time"].values >= epochs["epoch_time_s"].values * 0.8).all()
        assert (steps["comm_exposed_s"] <= steps["step_time_s"]).all()
        assert (per_epoch["exposed"] > 0).all() == (name == "n2")


def test_communication_is_zero_on_one_rank_and_exposed_never_exceeds_total(runs):
    for row in read_metrics(runs / "n1"):
        assert float(row["comm_total_s"]) == 0 and float(row["comm_exposed_s"]) == 0
    for row in read_metrics(runs / "n2"):
        assert 0 < float(row["comm_exposed_s"]) <= float(row["comm_total_s"])
        assert float(row["comm_exposed_s"]) <= float(row["backward_time_s"])


def test_the_gradient_noise_is_measured_on_two_ranks_and_left_empty_on_one(runs):
    """One rank has one batch size, and the noise scale needs two (ddp_core/engine/noise_scale.py)."""
    one, two = pd.read_csv(runs / "n1" / "metrics.csv"), pd.read_csv(runs / "n2" / "metrics.csv")
    assert one[NOISE_COLUMNS].isna().all().all()
    assert two[["grad_sq_norm", "grad_noise_trace"]].notna().all().all()
    assert (two["grad_noise_trace"] > 0).all(), "a rank's 16-sample gradient is noisier than the 32-sample average"


def test_run_json_records_provenance(runs):
    info = json.loads((runs / "n2" / "run.json").read_text())
    for key in [
        "config",
        "world_size",
        "backend",
        "device_name",
        "threads_per_rank",
        "torch",
        "cuda",
        "nccl",
        "gpu_driver",
        "hostname",
        "git_commit",
        "parameters",
        "start_time",
        "end_time",
    ]:
        assert key in info, key
    assert info["world_size"] == 2 and info["backend"] == "gloo" and info["config"]["grad_accum"] == 2
    assert info["parameters"] > 0 and info["end_time"] >= info["start_time"]


def test_a_copy_of_the_code_without_its_git_folder_records_the_commit_it_was_copied_from(tmp_path):
    shutil.copytree(REPO / "ddp_core", tmp_path / "ddp_core")
    said = "0123456789abcdef0123456789abcdef01234567"
    read = "from ddp_core.engine.run_files import git_commit; print(git_commit())"
    commits = [
        subprocess.run(
            [sys.executable, "-c", read],
            cwd=code,
            capture_output=True,
            text=True,
            check=True,
            env=dict(os.environ, PYTHONPATH=str(code), DDP_CORE_GIT_COMMIT=said),
        ).stdout.strip()
        for code in (tmp_path, REPO)
    ]
    assert commits[0] == said
    assert commits[1] != said and len(commits[1].removesuffix("-dirty")) == 40, "a checkout names its own commit"


def test_killed_run_keeps_a_valid_csv_of_completed_epochs_and_resumes(train, tmp_path, isolated_env):
    run_without_epochs = [*RUN[:-2], "--out", tmp_path / "run"]
    args = [*run_without_epochs, "--epochs", 50]
    proc = subprocess.Popen(
        launch_command(1) + [str(a) for a in args],
        cwd=tmp_path,
        env=isolated_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if (tmp_path / "run" / "checkpoint.pt").exists() and len(read_metrics(tmp_path / "run")) >= 2:
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()

    rows = read_metrics(tmp_path / "run")
    assert 2 <= len(rows) < 50
    assert all(None not in row.values() and "" not in row.values() for row in rows)
    train(*run_without_epochs, "--epochs", 55, "--resume")
    assert [int(r["epoch"]) for r in read_metrics(tmp_path / "run")] == list(range(1, 56))
