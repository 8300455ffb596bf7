"""Bad input: one line on stderr, a non-zero exit, no traceback, and nothing written."""

import gzip
import json

import pytest
import torch

from conftest import TINY_SYNTHETIC

BATCH = ["--global-batch-size", "8"]


def write_csv(folder, name, text):
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(folder / name, "wt") as f:
        f.write(text)


def assert_one_line_error(proc, fragment):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert len(lines) == 1 and lines[0].startswith("ddp_core.train: error:"), proc.stderr
    assert fragment in lines[0]


CASES = {
    "unknown dataset": (["--dataset", "mnist", *BATCH], "invalid choice: 'mnist'"),
    "unknown preset": (["--preset", "huge", *BATCH], "invalid choice: 'huge'"),
    "missing data dir": (["--dataset", "imdb", "--data-dir", "no/such/dir", *BATCH], "no/such/dir does not exist"),
    "batch does not divide": ([*TINY_SYNTHETIC, "--global-batch-size", "15", "--grad-accum", "2"], "does not divide"),
    "seq-len zero": ([*TINY_SYNTHETIC[:-3], "--seq-len", "0", *BATCH], "--seq-len must be positive"),
    "both batch flags": ([*TINY_SYNTHETIC, *BATCH, "--per-rank-batch-size", "4"], "not allowed with argument"),
    "neither batch flag": (TINY_SYNTHETIC, "one of the arguments --global-batch-size --per-rank-batch-size is required"),
    "resume without a checkpoint": ([*TINY_SYNTHETIC, *BATCH, "--out", "empty", "--resume"], "no checkpoint"),
    "more samples than exist": ([*TINY_SYNTHETIC, *BATCH, "--train-samples", "4"], "make no full step"),
}


@pytest.mark.parametrize("args,fragment", CASES.values(), ids=CASES.keys())
def test_bad_arguments_fail_in_one_line_and_write_nothing(train, tmp_path, args, fragment):
    (tmp_path / "empty").mkdir()
    before = sorted(tmp_path.rglob("*"))
    assert_one_line_error(train(*args, expect_ok=False), fragment)
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize("content,fragment", [
    ("review,sentiment\ngood film,1\n", "missing column(s) label, text"),
    ("text,label\ngood film,1\nbad film,5\n", "label 5 out of range; expected 0..1"),
], ids=["no text/label columns", "label out of range"])
def test_bad_data_files_fail_in_one_line_and_write_nothing(train, tmp_path, content, fragment):
    write_csv(tmp_path / "data" / "imdb", "train.csv.gz", content)
    before = sorted(tmp_path.rglob("*"))
    proc = train("--dataset", "imdb", "--data-dir", tmp_path / "data", *BATCH, "--out", tmp_path / "run",
                 expect_ok=False)
    assert_one_line_error(proc, fragment)
    assert sorted(tmp_path.rglob("*")) == before


def test_unreachable_hub_without_local_copy_says_how_to_pass_one(train, tmp_path):
    proc = train("--dataset", "ag_news", *BATCH, expect_ok=False)
    assert_one_line_error(proc, "--data-dir DIR or DDP_CORE_DATA_DIR")
    assert not (tmp_path / "results").exists()


def test_existing_run_is_never_overwritten(train, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"mine": True}))
    (run_dir / "metrics.csv").write_text("precious\n")
    assert_one_line_error(train(*TINY_SYNTHETIC, *BATCH, "--out", run_dir, expect_ok=False), "already holds a run")
    assert json.loads((run_dir / "run.json").read_text()) == {"mine": True}
    assert (run_dir / "metrics.csv").read_text() == "precious\n"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_nccl_without_gpus_is_refused(train):
    assert_one_line_error(train(*TINY_SYNTHETIC, *BATCH, "--backend", "nccl", expect_ok=False),
                          "--backend nccl needs a CUDA GPU")
