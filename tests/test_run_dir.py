"""A run directory never blocks its own command: interrupted starts, damaged files and divergence each end
in a working rerun or in one line that says what to do."""

import gzip
import json
import math
import shutil

import pytest

from conftest import TINY_SYNTHETIC, one_line_error, read_metrics, run_training

pytestmark = pytest.mark.slow  # every test here trains more than a few steps

RUN = [*TINY_SYNTHETIC, "--global-batch-size", 16, "--train-samples", 128, "--eval-samples", 32]


@pytest.fixture(scope="module")
def one_epoch_run(tmp_path_factory, isolated_env):
    """RUN trained for one epoch, once for the module: each test damages its own copy."""
    folder = tmp_path_factory.mktemp("one_epoch")
    run_training([*RUN, "--epochs", 1, "--out", folder / "run"], cwd=folder, env=isolated_env)
    return folder / "run"


@pytest.fixture
def run_dir(one_epoch_run, tmp_path):
    return shutil.copytree(one_epoch_run, tmp_path / "run")


def stopped_before_first_checkpoint(run_dir):
    """A run killed after writing epoch 1's row but before its checkpoint: run.json unfinished, no checkpoint."""
    (run_dir / "checkpoint.pt").unlink()
    info = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps(info | {"end_time": None}))


def test_the_same_command_starts_a_run_that_stopped_before_its_first_checkpoint_again(train, run_dir):
    stopped_before_first_checkpoint(run_dir)
    train(*RUN, "--epochs", 2, "--out", run_dir)
    assert [row["epoch"] for row in read_metrics(run_dir)] == ["1", "2"]


def test_resuming_a_run_without_checkpoint_says_to_rerun_it(refused, run_dir):
    stopped_before_first_checkpoint(run_dir)
    error = one_line_error(refused(*RUN, "--epochs", 2, "--out", run_dir, "--resume"))
    assert "(the run completed no step); run the command without --resume to start it again" in error


def test_another_command_never_takes_over_a_stopped_run(refused, run_dir):
    stopped_before_first_checkpoint(run_dir)
    before = (run_dir / "metrics.csv").read_text()
    error = one_line_error(refused(*RUN, "--epochs", 2, "--lr", "0.01", "--out", run_dir))
    assert "already holds a run" in error
    assert (run_dir / "metrics.csv").read_text() == before


def test_resuming_a_finished_run_without_more_epochs_is_refused_and_leaves_its_files_as_they_were(refused, run_dir):
    before = {path.name: path.read_bytes() for path in run_dir.iterdir()}
    error = one_line_error(refused(*RUN, "--epochs", 1, "--out", run_dir, "--resume"))
    assert "holds a finished run of 1 epoch(s)" in error and "raise --epochs" in error
    assert {path.name: path.read_bytes() for path in run_dir.iterdir()} == before


def test_resuming_a_stopped_run_with_fewer_epochs_than_its_checkpoint_is_refused(train, refused, run_dir):
    train(*RUN, "--epochs", 2, "--out", run_dir, "--resume")  # its checkpoint now at epoch 2
    info = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps(info | {"end_time": None}))  # stopped before its end was written
    before = {path.name: path.read_bytes() for path in run_dir.iterdir()}
    error = one_line_error(refused(*RUN, "--epochs", 1, "--out", run_dir, "--resume"))
    assert "checkpoint is at epoch 2; --epochs 1 would end it before it" in error
    assert {path.name: path.read_bytes() for path in run_dir.iterdir()} == before


def test_a_truncated_checkpoint_is_named_in_one_line(refused, run_dir):
    checkpoint = run_dir / "checkpoint.pt"
    checkpoint.write_bytes(checkpoint.read_bytes()[:1000])
    error = one_line_error(refused(*RUN, "--epochs", 2, "--out", run_dir, "--resume"))
    assert f"{checkpoint} is unreadable (truncated or corrupt)" in error


def test_a_missing_run_json_is_written_anew_on_resume(train, run_dir):
    (run_dir / "run.json").unlink()
    train(*RUN, "--epochs", 2, "--out", run_dir, "--resume")
    info = json.loads((run_dir / "run.json").read_text())
    assert info["world_size"] == 1 and info["end_time"] and len(info["resumed_at"]) == 1
    assert [row["epoch"] for row in read_metrics(run_dir)] == ["1", "2"]


def test_a_corrupt_token_cache_is_rebuilt(train, tmp_path):
    data = tmp_path / "data" / "imdb"
    data.mkdir(parents=True)
    with gzip.open(data / "train.csv.gz", "wt") as f:
        f.write("text,label\n" + "".join(f"{'good' if i % 2 else 'bad'} film number {i},{i % 2}\n" for i in range(60)))
    args = [
        "--dataset",
        "imdb",
        "--data-dir",
        data.parent,
        "--preset",
        "tiny",
        "--seq-len",
        16,
        "--vocab-size",
        64,
        "--global-batch-size",
        8,
        "--cache-dir",
        tmp_path / "cache",
        "--no-progress",
    ]
    train(*args, "--check")
    [cache] = list((tmp_path / "cache").glob("imdb-*.pt"))
    cache.write_bytes(b"not a tensor file")
    proc = train(*args, "--out", tmp_path / "run")
    assert "unreadable; encoding the data again" in proc.stdout
    assert len(read_metrics(tmp_path / "run")) == 1


def test_a_diverging_run_stops_with_the_epoch_and_step_and_writes_no_nan(train, tmp_path):
    proc = train(
        *RUN, "--epochs", 2, "--lr", "1000", "--warmup-steps", 0, "--out", tmp_path / "run", nproc=2, expect_ok=False
    )
    assert proc.returncode != 0
    assert proc.stderr.count("ddp_core.train: error: training diverged: the loss was not finite at epoch 1, step") == 1
    rows = read_metrics(tmp_path / "run") if (tmp_path / "run" / "metrics.csv").exists() else []
    assert all(math.isfinite(float(row["train_loss"])) for row in rows)
