"""Run the trainer in a scratch folder: as real processes (plain python for 1 rank, torchrun for more), or, on
generated data, called in the test's own process for one rank and in ranks forked from it for several, where
starting an interpreter costs more than the run.

The suite runs on every core and one worker more (pytest-xdist), a file per worker at a time. The tests that
read the tiny end-to-end report (`project`) are all in test_report.py, so that it is made once, on the worker that
starts with it while the others run the rest. `-m "not slow"` (make test-fast) leaves out the tests that train more
than a few steps or build a book.
"""

import csv
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from filelock import FileLock

from ddp_core.engine.config import load_profile, to_args
from ddp_core.launch.plan import launch_command
from ddp_core.paths import REPO_ROOT as REPO

TINY_STUDIES = REPO / "tests" / "studies-tiny.yml"
# The report's studies that the tiny report does not train, each with the kept study whose runs have its shape; their
# pages are built from the reference results there. A study added to the report goes into one list or the other.
LEFT_OUT_OF_THE_TINY_REPORT = {
    "ag_news": "scaling: 1 and 2 ranks (on generated data at the tests' scale, as every study)",
    "bucket_size": "nodes: 2 ranks on 2 emulated nodes over a shaped link (DDP's bucket size: tests/test_ddp_knobs.py; "
    "the page's drawn steps: tests/test_reference.py)",
    "compression": "nodes: 2 ranks on 2 emulated nodes over a shaped link (the communication hooks: "
    "tests/test_ddp_knobs.py)",
    "time_to_accuracy": "grad_accum: variants of the settings on 1 and 2 ranks (evaluations inside epochs and a target "
    "accuracy: tests/test_evaluations.py)",
}
WORLD_SIZES = (1, 4)  # of the scaling study in TINY_STUDIES
# The tiny profile's data and model, to which each test adds its batch, samples and epochs.
TINY_SYNTHETIC = [
    *to_args(
        {key: load_profile("tiny")[key] for key in ("threads_per_rank", "dataset", "preset", "vocab_size", "seq_len")}
    ),
    "--no-progress",
]
# Two short epochs: a test that reads the last epoch's timeline or compares two runs' curves needs two.
TWO_SHORT_EPOCHS = to_args({"global_batch_size": 16, "train_samples": 64, "eval_samples": 32, "epochs": 2})
SMALL_MODEL = to_args({"preset": "small", "vocab_size": 2000})  # its layers' gradient is beyond DDP's first bucket
# The tiny profile without dropout on 128 samples: every run of these settings takes the same optimizer steps, so each
# multi-node path (emulated nodes, a c10d rendezvous, Slurm on one node and on two) is held against one run of two
# ranks on this machine (`two_local_ranks`).
TWO_RANKS_SETTINGS = {"dropout": 0.0, "train_samples": 128, "epochs": 2}
TWO_RANKS_ARGS = [*to_args(load_profile("tiny") | TWO_RANKS_SETTINGS), "--no-progress"]


def local_data_dir() -> Path | None:
    """The real IMDB / AG News files: DDP_CORE_DATA_DIR, else ../shared/data beside the checkout."""
    candidates = [os.environ.get("DDP_CORE_DATA_DIR"), REPO.parent / "shared" / "data"]
    return next((Path(c) for c in candidates if c and (Path(c) / "imdb" / "train.csv.gz").is_file()), None)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    found = local_data_dir()
    if found is None:
        pytest.skip("real data absent: set DDP_CORE_DATA_DIR to a folder with imdb/{train,test}.csv.gz")
    return found


@pytest.fixture(scope="session")
def isolated_env(tmp_path_factory) -> dict:
    """No network, a private token cache and Hugging Face cache, one thread per rank, and a private temporary
    folder: what a process the test kills leaves there (a notebook kernel's sockets) goes with the test's files."""
    scratch = tmp_path_factory.mktemp("caches")
    (scratch / "tmp").mkdir()
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        HF_HOME=str(scratch / "hf"),
        DDP_CORE_CACHE_DIR=str(scratch / "tokens"),
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(REPO),
        TMPDIR=str(scratch / "tmp"),
    )
    env.pop("DDP_CORE_DATA_DIR", None)
    return env


def final_parameters(run_dir) -> dict:
    """The model's weights at the end of a run, from its checkpoint."""
    import torch

    return torch.load(run_dir / "checkpoint.pt", weights_only=False)["model"]


def run_training(
    args, *, cwd, env, nproc: int = 1, expect_ok: bool = True, torchrun: bool = False
) -> subprocess.CompletedProcess:
    """Run `ddp_core.train` with `args` on `nproc` ranks; fails the test if a run meant to work does not.

    A run on generated data is the trainer's `main` called in this process for one rank (`run_in_process`), and in
    ranks forked from this process for several (`run_forked_ranks`): each process started costs 4 CPU-seconds before it
    trains (the interpreter, `import torch`, and torch's compiler, which the optimizer imports), more than such a
    run. Runs on real data (the Hugging Face cache is configured when `datasets` is imported), compiled ones
    (inductor's worker processes) and tracked ones start their processes, plain python for one rank and torchrun for
    more, as does a run asked for with `torchrun`: the launcher itself is under test there, as in the tiny report,
    the faults, Slurm and the emulated nodes."""
    args = [str(a) for a in args]
    dataset = args[args.index("--dataset") + 1] if "--dataset" in args else None
    if dataset == "synthetic" and not torchrun and not {"--compile", "--mlflow-uri"} & set(args):
        proc = (
            run_in_process(args, cwd=cwd, env=env)
            if nproc == 1
            else run_forked_ranks(args, nproc=nproc, cwd=cwd, env=env)
        )
    else:
        proc = subprocess.run(
            launch_command(nproc, torchrun=torchrun) + args,
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
    if expect_ok and proc.returncode != 0:
        pytest.fail(f"training failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def run_forked_ranks(
    args: list[str], *, nproc: int, cwd, env: dict, main=None, timeout: float = 900
) -> subprocess.CompletedProcess:
    """`main(args)` (the trainer's by default) on `nproc` ranks forked from this process, each with the environment
    torchrun gives the ranks of one node: real processes that meet over gloo, without an interpreter start each. As
    under torchrun, a failed rank ends the run: the others get 30 s to end by themselves, then are killed; the exit
    code is the first failed rank's, and the output each rank's in turn."""
    import multiprocessing
    from multiprocessing.connection import wait

    port = free_port()  # for rank 0's store, as torchrun --standalone picks one
    fork = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory() as logs:
        ranks = [
            fork.Process(
                target=forked_rank,
                args=(
                    main,
                    args,
                    cwd,
                    env
                    | {
                        "RANK": str(rank),
                        "LOCAL_RANK": str(rank),
                        "WORLD_SIZE": str(nproc),
                        "LOCAL_WORLD_SIZE": str(nproc),
                        "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(port),
                    },
                    Path(logs) / str(rank),
                ),
            )
            for rank in range(nproc)
        ]
        for rank in ranks:
            rank.start()

        def first_failure() -> int:
            failed = [rank.exitcode for rank in ranks if rank.exitcode not in (None, 0)]
            return (failed[0] if failed[0] > 0 else 1) if failed else 0

        code, deadline = 0, time.monotonic() + timeout
        try:
            while running := [rank for rank in ranks if rank.exitcode is None]:
                # Looked for after `running`, not only after a wake: a rank's sentinel can be ready a moment before
                # the kernel lets its exit code be read, and the failure would go unseen until the timeout.
                if not code and (code := first_failure()):
                    deadline = min(deadline, time.monotonic() + 30)
                if not wait([rank.sentinel for rank in running], timeout=max(0.0, deadline - time.monotonic())):
                    if code:
                        break  # ranks that outlived a failed one by 30 s: killed below
                    pytest.fail(f"{nproc} forked ranks still running after {timeout} s")
            code = code or first_failure()  # ranks that all ended between two looks
        finally:
            for rank in ranks:
                rank.kill()
                rank.join()
        output = [(Path(logs) / f"{rank}.out").read_text() for rank in range(nproc)]
        errors = [(Path(logs) / f"{rank}.err").read_text() for rank in range(nproc)]
    return subprocess.CompletedProcess(args, code, "".join(output), "".join(errors))


def free_port() -> int:
    """A port of this machine's loopback that no one listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def forked_rank(main, args: list[str], cwd, env: dict, log: Path) -> None:
    """One rank of `run_forked_ranks`: its environment, its folder, and its output in LOG.out and LOG.err (file
    descriptors too, for what torch's C++ side prints)."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.stdout, sys.stderr = open(f"{log}.out", "w"), open(f"{log}.err", "w")
    os.dup2(sys.stdout.fileno(), 1)
    os.dup2(sys.stderr.fileno(), 2)
    if main is None:
        from ddp_core.train import main
    sys.exit(main(args))


def run_in_process(args: list[str], *, cwd, env: dict, main=None) -> subprocess.CompletedProcess:
    """`main(args)` (the trainer's by default) called here, in folder `cwd` with environment `env` (both restored
    after), as a finished process: its exit code, what it printed, and a traceback in stderr where it raised. For a
    program's refusals too, which end before anything starts: an interpreter start and `import torch` would cost more
    than the case."""
    if main is None:
        from ddp_core.train import main
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    out, err = io.StringIO(), io.StringIO()
    try:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        with redirect_stdout(out), redirect_stderr(err):
            try:
                code = main(args)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except Exception:  # as the interpreter would end: a traceback and exit code 1
                traceback.print_exc()
                code = 1
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


@pytest.fixture
def train(tmp_path, isolated_env):
    """`run_training` in this test's own scratch folder."""
    return lambda *args, **kw: run_training(args, cwd=tmp_path, env=isolated_env, **kw)


@pytest.fixture
def refused(tmp_path, isolated_env):
    """The trainer called in this process (`run_in_process`) in this test's scratch folder, for input it refuses
    before it trains: an interpreter start per case would cost more than the case."""
    return lambda *args: run_in_process([str(a) for a in args], cwd=tmp_path, env=isolated_env)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    """The trainer's error line: a failed run says what went wrong in one stderr line, never a traceback."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert len(lines) == 1 and lines[0].startswith("ddp_core.train: error:"), proc.stderr
    return lines[0]


@pytest.fixture(scope="session")
def hooked(tmp_path_factory, isolated_env):
    """What tests/hooked_gradients.py saves: one backward pass of the tiny model under each communication hook."""
    import hooked_gradients  # here, not at the top: most tests never load torch in the test process
    import torch

    out = tmp_path_factory.mktemp("hooks") / "gradients.pt"
    proc = run_forked_ranks(
        [str(out)], nproc=2, cwd=out.parent, env=isolated_env, main=hooked_gradients.main, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="session")
def two_local_ranks(tmp_path_factory, isolated_env, worker_id) -> Path:
    """TWO_RANKS_ARGS trained on two local ranks once for the whole suite: the first test worker to ask trains it,
    the others wait for it (pytest-xdist's workers share the parent of their temporary folders)."""
    shared = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    run_dir, done = shared / "two-local-ranks", shared / "two-local-ranks.done"
    with FileLock(shared / "two-local-ranks.lock"):
        if not done.exists():
            shutil.rmtree(run_dir, ignore_errors=True)  # what a failed attempt left
            run_training([*TWO_RANKS_ARGS, "--out", run_dir], cwd=shared, env=isolated_env, nproc=2)
            done.touch()
    return run_dir


def ddp_variants(folder: Path, record: dict) -> dict:
    """The entries of wind_tunnel.json (`record`) of the variants that train DDP, which the wind tunnel forecasts and
    the nodes page shows: the sharded modes on DDP's links are the sharding chapter's."""
    return {
        variant: modelled
        for variant, modelled in record["variants"].items()
        if json.loads(next((folder / variant).glob("n*/run.json")).read_text())["config"]["sharding"] == "none"
    }


def repeat_runs(folder: Path, world_size: int) -> list[Path]:
    """A configuration's runs round by round: folder/n<N>, n<N>-r2, ..."""
    return [folder / f"n{world_size}", *sorted(folder.glob(f"n{world_size}-r*"))]


def repeat_medians(folder: Path, world_size: int) -> list[float]:
    """The oracle of a run's time: each repeat's median step after the warm-up steps, read from its steps.csv, round by
    round."""
    import pandas as pd

    from ddp_core.analysis.comparisons import WARMUP_STEPS

    return [
        pd.read_csv(run / "steps.csv")["step_time_s"].iloc[WARMUP_STEPS:].median()
        for run in repeat_runs(folder, world_size)
    ]


def read_metrics(run_dir: Path) -> list[dict]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="session")
def offline():
    """A command prefix that runs a command in a network namespace with no route out (its loopback only), as on a
    compute node without internet; empty where making one needs root that the tests do not have."""
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("nsenter") is None:
        yield []
        return
    name = f"ddp-offline-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield ["nsenter", f"--net=/run/netns/{name}"]  # not `ip netns exec`, which hides the cgroup mounts of /sys
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


def copy_project(dest: Path) -> Path:
    """The project's files as a fresh clone has them (plus untracked, unignored ones), sharing .venv and MathJax."""
    tracked = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in tracked:
        source = REPO / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the working tree, not yet in the index
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            (dest / name).symlink_to(source.readlink())
        else:
            shutil.copy2(source, dest / name)
    shutil.copytree(REPO / "book" / "_static" / "mathjax", dest / "book" / "_static" / "mathjax")
    (dest / ".venv").symlink_to(REPO / ".venv")
    return dest


def pytest_xdist_auto_num_workers(config) -> int:
    """One test worker more than the machine has cores (`-n auto`): a worker whose test waits on Slurm's scheduler, a
    node's CPU quota or a signal leaves its core to the extra one (on 2 cores, 1.77 of them were busy on average over
    the suite with 3 workers, 1.72 with 2)."""
    return (os.cpu_count() or 1) + 1


REPORT_TESTS = "test_report.py"  # the one file whose tests read the tiny report: one worker runs it, first
BOOK_TESTS = (REPORT_TESTS, "test_reference.py")  # the files that build a book, the longest first


# Fixtures that train or benchmark on several processes: a test that asks for one is slow (make test-fast skips it).
SLOW_FIXTURES = {"project", "hooked", "measured", "two_local_ranks", "sharded_runs"}


def pytest_collection_modifyitems(items):
    """The files that build a book first, the longest first, then the rest as collected: the longest chains start
    while the other workers share everything else. A test elsewhere that asks for the tiny report would make it a
    second time."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if "project" in fixtures and item.path.name != REPORT_TESTS:
            raise pytest.UsageError(f"{item.nodeid} reads the tiny report: move it to tests/{REPORT_TESTS}")
        if fixtures & SLOW_FIXTURES:
            item.add_marker(pytest.mark.slow)
    order = {name: i for i, name in enumerate(BOOK_TESTS)}
    items.sort(key=lambda item: order.get(item.path.name, len(BOOK_TESTS)))


# The skips CI may show (`.ci/run` sets DDP_CORE_CI=1): CI runs as root and the tests install Slurm and TeX
# themselves, so the only skips left are about what a machine cannot install: a GPU, and the real data where it
# lies nowhere beside the checkout (it is never committed).
SKIPS_ALLOWED_IN_CI = ("this machine has a GPU", "real data absent")
_skipped: list[str] = []


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        _skipped.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session, exitstatus):
    unexpected = [skip for skip in _skipped if not any(reason in skip for reason in SKIPS_ALLOWED_IN_CI)]
    if os.environ.get("DDP_CORE_CI") and unexpected and not hasattr(session.config, "workerinput"):
        print("\nSkipped in CI, where every test but those needing a GPU must run:\n  " + "\n  ".join(unexpected))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def runnable_tiny_studies() -> dict:
    """The tiny studies this machine can run: those on an emulated cluster need root."""
    from ddp_core.studies.study_list import load_study_list

    return {
        name: study
        for name, study in load_study_list(TINY_STUDIES).items()
        if study.ranks_per_node is None or os.geteuid() == 0
    }


@pytest.fixture(scope="session")
def project(tmp_path_factory, isolated_env, offline):
    """A copy of the project in which `make report` ran every study at the tests' scale (tests/studies-tiny.yml:
    the tiny profile), as CI and a user run it, with no route out of the machine (`offline`) as on a compute node;
    what it printed is in make-report.log beside."""
    project = copy_project(tmp_path_factory.mktemp("project"))
    proc = subprocess.run(
        [
            *offline,
            "make",
            "-o",
            ".venv/.installed",
            "report",
            f"STUDY_LIST={TINY_STUDIES}",
            f"STUDIES={' '.join(runnable_tiny_studies())}",
            "ALLREDUCE_ARGS=--max-bytes 1048576 --seconds-per-size 0.02",
        ],
        cwd=project,
        env=isolated_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=1800,
    )
    (project.parent / "make-report.log").write_text(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-5000:]
    return project
