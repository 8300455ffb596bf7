"""Launch real training processes (plain python for 1 rank, torchrun for more) in a scratch folder."""

import csv
import os
import subprocess
from pathlib import Path

import pytest

from ddp_core.experiment import launch_command

REPO = Path(__file__).resolve().parents[1]
TINY_SYNTHETIC = ["--dataset", "synthetic", "--preset", "tiny", "--vocab-size", "128", "--seq-len", "32",
                  "--no-progress"]


def train_command(nproc: int) -> list[str]:
    return launch_command(nproc)


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
    """No network, a private token cache and Hugging Face cache, one thread per rank."""
    scratch = tmp_path_factory.mktemp("caches")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(scratch / "hf"), DDP_CORE_CACHE_DIR=str(scratch / "tokens"),
               OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    env.pop("DDP_CORE_DATA_DIR", None)
    return env


def run_training(args, *, cwd, env, nproc: int = 1, expect_ok: bool = True) -> subprocess.CompletedProcess:
    """Run `ddp_core.train` with `args` on `nproc` ranks; fails the test if a run meant to work does not."""
    proc = subprocess.run(train_command(nproc) + [str(a) for a in args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)
    if expect_ok and proc.returncode != 0:
        pytest.fail(f"training failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture
def train(tmp_path, isolated_env):
    """`run_training` in this test's own scratch folder."""
    return lambda *args, **kw: run_training(args, cwd=tmp_path, env=isolated_env, **kw)


def read_metrics(run_dir: Path) -> list[dict]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))
