"""The numbers in metrics.csv, checked by value against an independent computation: the loss and accuracy
a reader compares across world sizes must mean the same thing at every world size, and DDP on N ranks is the
same large-batch SGD as one rank (the same parameters, the same learning curve)."""

import csv
import json

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from conftest import TINY_SYNTHETIC, final_parameters, read_metrics, run_training
from ddp_core.engine.config import parse_args
from ddp_core.engine.data import load_data
from ddp_core.engine.model import TransformerClassifier
from ddp_core.engine.model_shape import ModelConfig

pytestmark = pytest.mark.slow  # every test here trains more than a few steps

# 96 training samples make whole steps at 1, 2 and 3 ranks; 37 evaluation samples leave a partial last batch.
DATA = [*TINY_SYNTHETIC, "--train-samples", 96, "--eval-samples", 37, "--dropout", "0"]
FROZEN = ["--lr", "1e-30", "--warmup-steps", 0, "--epochs", 1]  # an update far below float32 resolution
CURVE = [*DATA, "--global-batch-size", 16, "--epochs", 2, "--lr", "3e-3", "--warmup-steps", 2]  # 6 steps an epoch


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory, isolated_env):
    """CURVE on one rank, trained once for the module: what every run here on more ranks is held against."""
    folder = tmp_path_factory.mktemp("one_rank")
    run_training([*CURVE, "--out", folder / "run"], cwd=folder, env=isolated_env)
    return folder / "run"


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, isolated_env):
    """CURVE on two ranks, trained once for the module."""
    folder = tmp_path_factory.mktemp("two_ranks")
    run_training([*CURVE, "--out", folder / "run"], cwd=folder, env=isolated_env, nproc=2)
    return folder / "run"


def per_sample_losses(run_dir):
    """Cross-entropy and correctness of every training and evaluation sample under the run's final weights."""
    args = [str(a) for a in DATA if a != "--no-progress"] + ["--global-batch-size", "8"]
    data = load_data(parse_args(args, world_size=1))
    model = TransformerClassifier(ModelConfig(**json.loads((run_dir / "run.json").read_text())["model"]))
    model.load_state_dict(torch.load(run_dir / "checkpoint.pt", weights_only=False)["model"])
    model.eval()
    with torch.no_grad():
        train_logits = model(data.train_ids.long())
        eval_logits = model(data.eval_ids.long())
    return (
        F.cross_entropy(train_logits, data.train_labels, reduction="none"),
        F.cross_entropy(eval_logits, data.eval_labels, reduction="none"),
        (eval_logits.argmax(-1) == data.eval_labels).double(),
    )


@pytest.mark.parametrize("nproc", [1, 2, 3])
def test_losses_are_means_over_every_sample_once_at_every_world_size(train, tmp_path, nproc):
    train(*DATA, *FROZEN, "--per-rank-batch-size", 8, "--out", tmp_path / "run", nproc=nproc)
    [row] = read_metrics(tmp_path / "run")
    train_losses, eval_losses, correct = per_sample_losses(tmp_path / "run")
    assert int(row["train_samples"]) == 96
    assert float(row["train_loss"]) == pytest.approx(train_losses.mean().item(), abs=1e-6)
    assert float(row["val_loss"]) == pytest.approx(eval_losses.mean().item(), abs=1e-6)
    assert float(row["val_accuracy"]) == pytest.approx(correct.mean().item(), abs=1e-12)


def test_one_and_two_ranks_report_the_same_learning_curve(one_rank, two_ranks):
    for one, two in zip(read_metrics(one_rank), read_metrics(two_ranks), strict=True):
        for column in ("train_loss", "val_loss", "val_accuracy"):
            assert float(two[column]) == pytest.approx(float(one[column]), abs=1e-6), (one["epoch"], column)


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_two_ranks_hold_the_same_parameters_as_one_rank_with_the_same_global_batch(
    one_rank, two_ranks, train, tmp_path, grad_accum
):
    two = two_ranks
    if grad_accum > 1:
        two = tmp_path / "two"
        train(*CURVE, "--grad-accum", grad_accum, "--out", two, nproc=2)
    assert read_metrics(two)[0]["steps"] == "6"
    one, two = final_parameters(one_rank), final_parameters(two)
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=0, atol=1e-5, msg=f"parameter {name} differs")


def test_resume_drops_the_rows_after_the_checkpoint_and_trains_them_again(one_rank, train, tmp_path):
    train(*CURVE, "--epochs", 1, "--out", tmp_path / "resumed")
    with open(tmp_path / "resumed" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    stale = {**rows[0], "epoch": "2", "train_loss": "99", "val_loss": "99", "val_accuracy": "0"}
    with open(tmp_path / "resumed" / "metrics.csv", "a", newline="") as f:
        csv.DictWriter(f, fieldnames=list(rows[0])).writerow(stale)  # epoch 2 written, its checkpoint not
    with open(tmp_path / "resumed" / "steps.csv", "a") as f:
        f.write("2,1,99.0,0.0\n")
    train(*CURVE, "--out", tmp_path / "resumed", "--resume")
    learning = ("epoch", "train_loss", "val_loss", "val_accuracy", "lr")
    assert [[r[k] for k in learning] for r in read_metrics(tmp_path / "resumed")] == [
        [r[k] for k in learning] for r in read_metrics(one_rank)
    ]
    steps = [pd.read_csv(run / "steps.csv")[["epoch", "step"]] for run in (tmp_path / "resumed", one_rank)]
    pd.testing.assert_frame_equal(*steps)  # the steps of epoch 2 once, as the uninterrupted run has them
