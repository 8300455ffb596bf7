"""Evaluations inside epochs, and a run that ends at its target accuracy: what the time-to-accuracy study reads."""

import pandas as pd
import pytest

from conftest import TINY_SYNTHETIC, run_training
from ddp_core.engine.run_files import EVALS_COLUMNS
from ddp_core.analysis.critical_batch import steps_to_target

pytestmark = pytest.mark.slow  # every test here trains

RUN = [*TINY_SYNTHETIC, "--global-batch-size", 32, "--train-samples", 512, "--eval-samples", 200, "--epochs", 2]


def test_evaluating_inside_epochs_records_every_evaluation_and_leaves_the_training_as_it_was(tmp_path, isolated_env):
    run_training([*RUN, "--out", tmp_path / "plain"], cwd=tmp_path, env=isolated_env)
    run_training([*RUN, "--eval-every-steps", 4, "--out", tmp_path / "evals"], cwd=tmp_path, env=isolated_env)
    evals = pd.read_csv(tmp_path / "evals" / "evals.csv")
    assert list(evals.columns) == EVALS_COLUMNS
    assert evals["step"].tolist() == [4, 8, 12, 16, 20, 24, 28, 32]  # 16 steps an epoch, its end evaluated once
    assert evals["epoch"].tolist() == [1] * 4 + [2] * 4
    plain, with_evals = (pd.read_csv(tmp_path / name / "metrics.csv") for name in ("plain", "evals"))
    learning = ["steps", "train_samples", "train_loss", "val_loss", "val_accuracy"]
    pd.testing.assert_frame_equal(with_evals[learning], plain[learning])
    assert with_evals["val_accuracy"].tolist() == evals.loc[evals["step"].isin([16, 32]), "val_accuracy"].tolist()
    assert pd.read_csv(tmp_path / "plain" / "evals.csv")["step"].tolist() == [16, 32]


def test_a_run_ends_at_the_first_evaluation_that_reaches_its_target(tmp_path, isolated_env):
    target = 0.7
    out = tmp_path / "run"
    printed = run_training(
        [*RUN[:-2], "--epochs", 6, "--eval-every-steps", 2, "--target-accuracy", target, "--out", out],
        cwd=tmp_path,
        env=isolated_env,
    ).stdout
    evals, metrics = pd.read_csv(out / "evals.csv"), pd.read_csv(out / "metrics.csv")
    assert (evals["val_accuracy"].iloc[:-1] < target).all() and evals["val_accuracy"].iloc[-1] >= target
    reached = steps_to_target(evals, target)
    assert reached == evals["step"].iloc[-1] < 6 * 16, "the target is reached before the last epoch"
    assert metrics["steps"].sum() == reached and metrics["train_samples"].sum() == 32 * reached
    assert metrics["val_accuracy"].iloc[-1] == evals["val_accuracy"].iloc[-1]
    assert f"reached the target {target} after {int(reached)} steps" in printed
