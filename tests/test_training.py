"""The identities the report rests on: resume is exact, compiling changes nothing learned, the model learns."""

import json

import pytest

from conftest import TINY_SYNTHETIC, TWO_SHORT_EPOCHS, final_parameters, read_metrics

pytestmark = pytest.mark.slow  # every test here trains more than a few steps


def test_resume_after_one_epoch_reproduces_an_uninterrupted_run(train, tmp_path):
    common = [
        *TINY_SYNTHETIC,
        "--dropout",
        "0.1",
        "--global-batch-size",
        32,
        "--train-samples",
        512,
        "--eval-samples",
        128,
    ]
    train(*common, "--epochs", 2, "--out", tmp_path / "straight", nproc=2)
    train(*common, "--epochs", 1, "--out", tmp_path / "resumed", nproc=2)
    train(*common, "--epochs", 2, "--out", tmp_path / "resumed", "--resume", nproc=2)

    learning = ["epoch", "train_loss", "val_loss", "val_accuracy", "lr"]
    straight = [{k: row[k] for k in learning} for row in read_metrics(tmp_path / "straight")]
    resumed = [{k: row[k] for k in learning} for row in read_metrics(tmp_path / "resumed")]
    assert resumed == straight
    run_info = json.loads((tmp_path / "resumed" / "run.json").read_text())
    assert len(run_info["resumed_at"]) == 1 and run_info["end_time"]


def test_a_compiled_model_trains_as_the_eager_one_does(train, tmp_path):
    common = [*TINY_SYNTHETIC, "--dropout", "0", *TWO_SHORT_EPOCHS]
    train(*common, "--out", tmp_path / "eager")
    train(*common, "--compile", "--out", tmp_path / "compiled")
    for eager, compiled in zip(read_metrics(tmp_path / "eager"), read_metrics(tmp_path / "compiled"), strict=True):
        for key in ("train_loss", "val_loss"):
            assert float(compiled[key]) == pytest.approx(float(eager[key]), rel=1e-4), key
    assert set(final_parameters(tmp_path / "compiled")) == set(final_parameters(tmp_path / "eager"))


def test_synthetic_task_is_learned(train, tmp_path):
    train(
        *TINY_SYNTHETIC,
        "--global-batch-size",
        32,
        "--epochs",
        4,
        "--lr",
        "3e-3",
        "--warmup-steps",
        10,
        "--out",
        tmp_path / "run",
    )
    assert float(read_metrics(tmp_path / "run")[-1]["val_accuracy"]) >= 0.95


def test_the_model_learns_imdb_well_above_chance(train, tmp_path, data_dir):
    train(
        "--dataset",
        "imdb",
        "--data-dir",
        data_dir,
        "--preset",
        "tiny",
        "--threads-per-rank",
        1,
        "--train-samples",
        3000,
        "--eval-samples",
        500,
        "--seq-len",
        128,
        "--global-batch-size",
        32,
        "--epochs",
        3,
        "--lr",
        "3e-3",
        "--warmup-steps",
        30,
        "--no-progress",
        "--out",
        tmp_path / "imdb",
    )
    assert float(read_metrics(tmp_path / "imdb")[-1]["val_accuracy"]) >= 0.65
