"""Bad input: one line on stderr, a non-zero exit, no traceback, and nothing written. The trainer's refusals are
called in this process (`refused`); what needs a process of its own (torchrun, an offline Hub, the notebook's
launch) starts one."""

import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
import torch

from conftest import REPO, TINY_SYNTHETIC, one_line_error
from ddp_core.launch.local import run_local
from ddp_core.launch.plan import ExperimentError, Placement, prepare

BATCH = ["--global-batch-size", "8"]


def write_csv(folder, name, text):
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(folder / name, "wt") as f:
        f.write(text)


def assert_one_line_error(proc, fragment):
    assert fragment in one_line_error(proc)


CASES = {
    "unknown dataset": (["--dataset", "mnist", *BATCH], "invalid choice: 'mnist'"),
    "unknown preset": (["--preset", "huge", *BATCH], "invalid choice: 'huge'"),
    "missing data dir": (["--dataset", "imdb", "--data-dir", "no/such/dir", *BATCH], "no/such/dir does not exist"),
    "batch does not divide": ([*TINY_SYNTHETIC, "--global-batch-size", "15", "--grad-accum", "2"], "does not divide"),
    "seq-len zero": ([*TINY_SYNTHETIC[:-3], "--seq-len", "0", *BATCH], "--seq-len must be positive"),
    "both batch flags": ([*TINY_SYNTHETIC, *BATCH, "--per-rank-batch-size", "4"], "not allowed with argument"),
    "neither batch flag": (
        TINY_SYNTHETIC,
        "one of the arguments --global-batch-size --per-rank-batch-size is required",
    ),
    "resume without a checkpoint": ([*TINY_SYNTHETIC, *BATCH, "--out", "empty", "--resume"], "no checkpoint"),
    "more samples than exist": ([*TINY_SYNTHETIC, *BATCH, "--train-samples", "4"], "make no full step"),
    "checkpoint interval of no steps": (
        [*TINY_SYNTHETIC, *BATCH, "--checkpoint-every-steps", "0"],
        "--checkpoint-every-steps must be positive",
    ),
    "checkpoint interval as long as the run": (
        [*TINY_SYNTHETIC, *BATCH, "--train-samples", "64", "--epochs", "2", "--checkpoint-every-steps", "16"],
        "--checkpoint-every-steps 16 is not shorter than the run (2 epoch(s) of 8 steps)",
    ),
    "learning rate not a number": ([*TINY_SYNTHETIC, *BATCH, "--lr", "nan"], "--lr must be a finite number above 0"),
    "learning rate infinite": ([*TINY_SYNTHETIC, *BATCH, "--lr", "inf"], "--lr must be a finite number above 0"),
    "learning rate zero": ([*TINY_SYNTHETIC, *BATCH, "--lr", "0"], "--lr must be a finite number above 0, got 0.0"),
    "negative weight decay": ([*TINY_SYNTHETIC, *BATCH, "--weight-decay", "-0.1"], "--weight-decay must be a finite"),
    "infinite weight decay": ([*TINY_SYNTHETIC, *BATCH, "--weight-decay", "inf"], "--weight-decay must be a finite"),
    "negative warm-up": ([*TINY_SYNTHETIC, *BATCH, "--warmup-steps", "-1"], "--warmup-steps must be >= 0"),
    "dropout not a number": ([*TINY_SYNTHETIC, *BATCH, "--dropout", "nan"], "--dropout must be in [0, 1), got nan"),
    "dropout of one": ([*TINY_SYNTHETIC, *BATCH, "--dropout", "1"], "--dropout must be in [0, 1)"),
    "target above one": ([*TINY_SYNTHETIC, *BATCH, "--target-accuracy", "1.5"], "--target-accuracy must be in (0, 1]"),
    "evaluations every 0 steps": (
        [*TINY_SYNTHETIC, *BATCH, "--eval-every-steps", "0"],
        "--eval-every-steps must be positive",
    ),
    "vocabulary too small": ([*TINY_SYNTHETIC[:-5], "--vocab-size", "2", *BATCH], "--vocab-size must be at least 3"),
    "vocabulary too small for the generated task": (
        [*TINY_SYNTHETIC[:-5], "--vocab-size", "4", *BATCH],
        "--vocab-size must be at least 5 for --dataset synthetic",
    ),
    "bucket of no size": ([*TINY_SYNTHETIC, *BATCH, "--bucket-cap-mb", "0"], "--bucket-cap-mb must be positive"),
    "PowerSGD of rank zero": (
        [*TINY_SYNTHETIC, *BATCH, "--comm-hook", "powersgd", "--powersgd-rank", "0"],
        "--powersgd-rank must be positive",
    ),
    "bf16 hook on gloo": (
        [*TINY_SYNTHETIC, *BATCH, "--comm-hook", "bf16", "--backend", "gloo"],
        "--comm-hook bf16 needs NCCL",
    ),
    "bf16 hook without GPUs": ([*TINY_SYNTHETIC, *BATCH, "--comm-hook", "bf16"], "--comm-hook bf16 needs NCCL"),
    "fp16 autocast without GPUs": ([*TINY_SYNTHETIC, *BATCH, "--amp", "fp16"], "--amp fp16 needs a CUDA device"),
    "out is a file": ([*TINY_SYNTHETIC, *BATCH, "--out", "afile"], "--out afile is a file, not a directory"),
    "cache dir is a file": (
        ["--dataset", "imdb", "--data-dir", ".", "--cache-dir", "afile", *BATCH],
        "--cache-dir afile is a file",
    ),
}


BENCHMARK_CASES = {
    "quota periods of no round": (
        ["cpu_period.py", "--results-dir", "out", "--rounds", "0"],
        "cpu_period: error: argument --rounds: must be at least 1, got 0",
    ),
    "start-up of no round": (["startup.py", "--rounds", "0"], "startup: error: argument --rounds: must be at least 1"),
    "start-up on negative nodes": (["startup.py", "--nodes", "-1"], "startup: error: --nodes must be 0"),
    "overheads of no repeat": (["bench_ddp_core.py", "--repeats", "0"], "bench_ddp_core: error: argument --repeats"),
    "a device measured into a file": (
        ["single_device.py", "--results-dir", "afile"],
        "--results-dir afile/single_device/cpu cannot be made: /",
    ),
}


@pytest.mark.parametrize("args,line", BENCHMARK_CASES.values(), ids=BENCHMARK_CASES.keys())
def test_the_benchmarks_refuse_bad_options_in_one_line_before_measuring(tmp_path, isolated_env, args, line):
    (tmp_path / "afile").write_text("mine\n")
    proc = subprocess.run(
        [sys.executable, REPO / "benchmarks" / args[0], *args[1:]],
        cwd=tmp_path,
        env=isolated_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and line in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


@pytest.mark.parametrize(
    "script,args,line",
    [
        (
            "submit-4gpu.sh",
            ["run", "--global-batch-size", "6"],
            "--global-batch-size 6 does not divide by world size 4",
        ),
        ("submit-1gpu.sh", ["run", "--global-batch-size", "8", "--lr", "-1"], "--lr must be a finite number above 0"),
        ("submit-1gpu.sh", ["--dataset", "imdb", "run"], "(the run directory first)"),
    ],
    ids=["batch for 4 GPUs", "bad value", "options before the run directory"],
)
def test_a_slurm_submission_with_bad_options_is_refused_before_it_is_queued(tmp_path, isolated_env, script, args, line):
    """The sbatch on the PATH only notes that it was called: a refusal must come before it."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "sbatch").write_text(f"#!/bin/sh\ntouch {tmp_path / 'queued'}\n")
    (tmp_path / "bin" / "sbatch").chmod(0o755)
    env = isolated_env | {"DDP_PYTHON": sys.executable, "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}
    proc = subprocess.run(
        ["bash", REPO / "slurm" / script, *args], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and line in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "queued").exists()


@pytest.mark.parametrize("args,fragment", CASES.values(), ids=CASES.keys())
def test_bad_arguments_fail_in_one_line_and_write_nothing(refused, tmp_path, args, fragment):
    (tmp_path / "empty").mkdir()
    (tmp_path / "afile").write_text("mine\n")
    before = sorted(tmp_path.rglob("*"))
    assert_one_line_error(refused(*args), fragment)
    assert sorted(tmp_path.rglob("*")) == before


TWO_ROWS = "text,label\ngood film,1\nbad film,0\n"
BAD_FILES = {
    "no text/label columns": ("train.csv.gz", "review,sentiment\ngood film,1\n", "missing column(s) label, text"),
    "label out of range": (
        "train.csv.gz",
        "text,label\ngood film,1\nbad film,5\n",
        "row 2: label 5 out of range; expected 0..1",
    ),
    "label is a word": (
        "train.csv.gz",
        "text,label\ngood film,1\nbad film,negative\n",
        "row 2: label 'negative' is not a class number (a whole number 0..1)",
    ),
    "label is a fraction": (
        "train.csv.gz",
        "text,label\ngood film,1\nbad film,0.5\n",
        "row 2: label 0.5 is not a class number",
    ),
    "label missing": ("train.csv.gz", "text,label\ngood film,1\nbad film,\n", "row 2: the label is missing"),
    "text missing": ("train.csv.gz", "text,label\ngood film,1\n,0\n", "row 2: the text is missing"),
    "text blank": ("train.csv.gz", "text,label\ngood film,1\n   ,0\n", "row 2: the text is empty"),
    "no rows": ("train.csv.gz", "text,label\n", "no rows"),
    "one class only": (
        "train.csv.gz",
        "text,label\n" + "good film,1\n" * 20,
        "have label 1: a classifier needs at least two of the 2 classes",
    ),
    "truncated gzip": ("train.csv.gz", None, "not a valid gzip file (truncated)"),
    "not gzip at all": ("train.csv.gz", b"text,label\ngood film,1\n", "not a valid gzip file (corrupt or not gzip)"),
    "not parquet": ("train.parquet", b"text,label\ngood film,1\n", "not a valid Parquet file"),
}


@pytest.mark.parametrize("name,content,fragment", BAD_FILES.values(), ids=BAD_FILES.keys())
def test_bad_data_files_are_named_with_the_row_and_the_fault_in_one_line(refused, tmp_path, name, content, fragment):
    folder = tmp_path / "data" / "imdb"
    if name.endswith(".gz") and not isinstance(content, bytes):
        write_csv(folder, name, content if content is not None else TWO_ROWS * 2000)
        if content is None:  # cut off halfway, as an interrupted download leaves it
            whole = (folder / name).read_bytes()
            (folder / name).write_bytes(whole[: len(whole) // 2])
    else:
        folder.mkdir(parents=True)
        (folder / name).write_bytes(content)
    before = sorted(tmp_path.rglob("*"))
    proc = refused(
        "--dataset", "imdb", "--data-dir", tmp_path / "data", *BATCH, "--train-samples", 8, "--out", tmp_path / "run"
    )
    assert_one_line_error(proc, fragment)
    if "classes" not in fragment:
        assert str(folder / name) in proc.stderr
    assert sorted(tmp_path.rglob("*")) == before


def test_unreachable_hub_without_local_copy_says_how_to_pass_one(train, tmp_path):
    proc = train("--dataset", "ag_news", *BATCH, expect_ok=False)
    assert_one_line_error(proc, "--data-dir DIR or DDP_CORE_DATA_DIR")
    assert not (tmp_path / "results").exists()


def test_existing_run_is_never_overwritten(refused, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"mine": True}))
    (run_dir / "metrics.csv").write_text("precious\n")
    assert_one_line_error(refused(*TINY_SYNTHETIC, *BATCH, "--out", run_dir), "already holds a run")
    assert json.loads((run_dir / "run.json").read_text()) == {"mine": True}
    assert (run_dir / "metrics.csv").read_text() == "precious\n"


@pytest.mark.slow  # starts torchrun and its ranks
def test_under_torchrun_a_bad_input_is_reported_once(train):
    proc = train(*TINY_SYNTHETIC, *BATCH, "--lr", "-1", nproc=2, expect_ok=False, torchrun=True)
    assert proc.returncode != 0
    assert proc.stderr.count("ddp_core.train: error:") == 1, proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_nccl_without_gpus_is_refused(refused):
    assert_one_line_error(refused(*TINY_SYNTHETIC, *BATCH, "--backend", "nccl"), "--backend nccl needs a CUDA GPU")


@pytest.mark.slow  # executes the run notebook in a kernel
def test_a_run_the_trainer_refuses_fails_the_notebook_in_the_trainers_one_line(tmp_path, isolated_env, monkeypatch):
    folder = tmp_path / "data" / "imdb"
    write_csv(folder, "train.csv.gz", "text,label\ngood film,1\nbad film,5\n")
    write_csv(folder, "test.csv.gz", TWO_ROWS)
    for name, value in isolated_env.items():
        monkeypatch.setenv(name, value)
    plan = prepare(
        world_size=2,
        placement=Placement(),
        results_dir=str(tmp_path / "results"),
        experiment="bad",
        profile="tiny",
        overrides={"dataset": "imdb", "data_dir": str(tmp_path / "data")},
    )
    with pytest.raises(ExperimentError) as refused:
        run_local(plan)
    assert str(refused.value) == (
        f"ddp_core.train: error: {folder / 'train.csv.gz'}: row 2: label 5 out of range; expected 0..1"
    )
    assert not plan.run_dir.exists()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="runs as another user: needs root")
def test_make_pdf_without_tex_and_without_root_says_what_it_needs_in_one_line():
    """A cluster user has no root: make pdf cannot apt-get TeX there, and says so before trying."""
    with tempfile.TemporaryDirectory() as folder:  # readable by the other user, unlike pytest's own
        os.chmod(folder, 0o755)
        for tool in ("sh", "make", "id"):  # a PATH without latexmk
            os.symlink(shutil.which(tool), os.path.join(folder, tool))
        proc = subprocess.run(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "env",
                f"PATH={folder}",
                "make",
                "-o",
                ".venv/.installed",
                "pdf",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
    assert proc.returncode != 0
    assert proc.stderr.splitlines()[0] == (
        "make pdf: needs latexmk and TeX Gyre (tgtermes.sty) on the PATH, which "
        'only root can install with apt-get; see docs/using.md, "On a GPU '
        'cluster"'
    )
