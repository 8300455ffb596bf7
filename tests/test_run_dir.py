"""A run directory never blocks its own command: interrupted starts, damaged files and divergence each end
in a working rerun or in one line that says what to do."""

import gzip
import json
import math

import pytest

from conftest import TINY_SYNTHETIC, one_line_error, read_metrics

pytestmark = pytest.mark.slow  # every test here trains more than a few steps

RUN = [*TINY_SYNTHETIC, "--global-batch-size", 16, "--train-samples", 128, "--eval-samples", 32]


def stopped_before_first_checkpoint(train, run_dir):
    """A run killed after writing epoch 1's row but before its checkpoint: run.json unfinished, no checkpoint."""
    train(*RUN, "--epochs", 1, "--out", run_dir)
    (run_dir / "checkpoint.pt").unlink()
    info = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps(info | {"end_time": None}))


def test_the_same_command_starts_a_run_that_stopped_before_its_first_checkpoint_again(train, tmp_path):
    stopped_before_first_checkpoint(train, tmp_path / "run")
    train(*RUN, "--epochs", 2, "--out", tmp_path / "run")
    assert [row["epoch"] for row in read_metrics(tmp_path / "run")] == ["1", "2"]


def test_resuming_a_run_without_checkpoint_says_to_rerun_it(train, tmp_path):
    stopped_before_first_checkpoint(train, tmp_path / "run")
    error = one_line_error(train(*RUN, "--epochs", 2, "--out", tmp_path / "run", "--resume", expect_ok=False))
    assert "(the run completed no step); run the command without --resume to start it again" in error


def test_another_command_never_takes_over_a_stopped_run(train, tmp_path):
    stopped_before_first_checkpoint(train, tmp_path / "run")
    before = (tmp_path / "run" / "metrics.csv").read_text()
    error = one_line_error(train(*RUN, "--epochs", 2, "--lr", "0.01", "--out", tmp_path / "run", expect_ok=False))
    assert "already holds a run" in error
    assert (tmp_path / "run" / "metrics.csv").read_text() == before


def test_a_truncated_checkpoint_is_named_in_one_line(train, tmp_path):
    train(*RUN, "--epochs", 1, "--out", tmp_path / "run")
    checkpoint = tmp_path / "run" / "checkpoint.pt"
    checkpoint.write_bytes(checkpoint.read_bytes()[:1000])
    error = one_line_error(train(*RUN, "--epochs", 2, "--out", tmp_path / "run", "--resume", expect_ok=False))
    assert f"{checkpoint} is unreadable (truncated or corrupt)" in error


def test_a_missing_run_json_is_written_anew_on_resume(train, tmp_path):
    train(*RUN, "--epochs", 1, "--out", tmp_path / "run")
    (tmp_path / "run" / "run.json").unlink()
    train(*RUN, "--epochs", 2, "--out", tmp_path / "run", "--resume")
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["world_size"] == 1 and info["end_time"] and len(info["resumed_at"]) == 1
    assert [row["epoch"] for row in read_metrics(tmp_path / "run")] == ["1", "2"]


def test_a_corrupt_token_cache_is_rebuilt(train, tmp_path):
    data = tmp_path / "data" / "imdb"
    data.mkdir(parents=True)
    with gzip.open(data / "train.csv.gz", "wt") as f:
        f.write("text,label\n" + "".join(f"{'good' if i % 2 else 'bad'} film number {i},{i % 2}\n" for i in range(60)))
    args = ["--dataset", "imdb", "--data-dir", data.parent, "--preset", "tiny", "--seq-len", 16, "--vocab-size", 64,
            "--global-batch-size", 8, "--cache-dir", tmp_path / "cache", "--no-progress"]
    train(*args, "--check")
    [cache] = list((tmp_path / "cache").glob("imdb-*.pt"))
    cache.write_bytes(b"not a tensor file")
    proc = train(*args, "--out", tmp_path / "run")
    assert "unreadable; encoding the data again" in proc.stdout
    assert len(read_metrics(tmp_path / "run")) == 1


def test_a_diverging_run_stops_with_the_epoch_and_step_and_writes_no_nan(train, tmp_path):
    proc = train(*RUN, "--epochs", 2, "--lr", "1000", "--warmup-steps", 0, "--out", tmp_path / "run", nproc=2,
                 expect_ok=False)
    assert proc.returncode != 0
    assert proc.stderr.count("ddp_core.train: error: training diverged: the loss was not finite at epoch 1, step") == 1
    rows = read_metrics(tmp_path / "run") if (tmp_path / "run" / "metrics.csv").exists() else []
    assert all(math.isfinite(float(row["train_loss"])) for row in rows)
