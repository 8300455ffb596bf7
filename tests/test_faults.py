"""Faults cost steps, not the run: a run told to stop (SIGTERM, as a Slurm time limit or preemption sends it; SIGINT,
Ctrl-C) checkpoints inside its epoch and the same command continues it exactly; with torchrun's restarts on, a rank
killed outright is replaced and the run finishes by itself with the same results."""

import csv
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import TINY_SYNTHETIC, read_metrics, run_training
from ddp_core.launch.plan import launch_command

pytestmark = pytest.mark.slow  # every test here trains more than a few steps

# Two ranks with dropout: an exact continuation needs each rank's random state as well as its place in the data.
RUN = [
    *TINY_SYNTHETIC,
    "--dropout",
    "0.1",
    "--global-batch-size",
    8,
    "--train-samples",
    1200,
    "--eval-samples",
    32,
    "--epochs",
    2,
]
LEARNING = [
    "epoch",
    "steps",
    "train_samples",
    "train_loss",
    "val_loss",
    "val_accuracy",
    "lr",
    "grad_sq_norm",
    "grad_noise_trace",
]


def trainer(*args) -> list[str]:
    return [str(a) for a in [*RUN, *args]]


def learning_curve(run_dir) -> list[list[float]]:
    return [[float(row[k]) for k in LEARNING] for row in read_metrics(run_dir)]


def assert_same_training(run_dir, reference_dir):
    """The same rows of learning and the same final model, to 1e-6."""
    for ours, theirs in zip(learning_curve(run_dir), learning_curve(reference_dir), strict=True):
        assert ours == pytest.approx(theirs, rel=1e-6, abs=1e-6)
    ours, theirs = (torch.load(d / "checkpoint.pt", weights_only=False)["model"] for d in (run_dir, reference_dir))
    for name, value in theirs.items():
        torch.testing.assert_close(ours[name], value, rtol=1e-6, atol=1e-6, msg=f"{name} differs")


@pytest.fixture(scope="module")
def straight(tmp_path_factory, isolated_env):
    """The run, never interrupted."""
    folder = tmp_path_factory.mktemp("straight")
    run_training([*trainer(), "--out", folder / "run"], cwd=folder, env=isolated_env, nproc=2)
    return folder / "run"


@pytest.fixture(scope="module")
def stopped(tmp_path_factory, isolated_env):
    """The run sent SIGTERM in its second epoch, torchrun and both ranks at once as Slurm's scancel does:
    (run directory, what it printed, exit code)."""
    folder = tmp_path_factory.mktemp("stopped")
    printed, code = signalled(
        launch_command(2) + trainer("--out", folder / "run"), signal.SIGTERM, folder, isolated_env
    )
    return folder / "run", printed, code


def signalled(command: list[str], signum: int, cwd, env) -> tuple[str, int]:
    """`command` sent `signum` once its first epoch is written, to its whole process group as a terminal sends
    Ctrl-C (and Slurm's scancel SIGTERM): what it printed, stdout and stderr together, and its exit code."""
    proc = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    printed = []
    for line in proc.stdout:
        printed.append(line)
        if line.startswith("ddp_core: epoch 1:"):
            os.killpg(proc.pid, signum)
    proc.wait(timeout=120)
    return "".join(printed), proc.returncode


def copy_of(run_dir, tmp_path):
    return shutil.copytree(run_dir, tmp_path / "run")


def test_a_run_stopped_mid_epoch_continues_exactly_with_its_own_command(stopped, straight, tmp_path, isolated_env):
    run_dir, printed, code = stopped
    stop = re.search(r"ddp_core: stopped by SIGTERM at epoch 2, step (\d+) of (\d+): checkpoint written", printed)
    assert code != 0 and stop and 0 < int(stop[1]) < int(stop[2]), printed
    assert [row["epoch"] for row in read_metrics(run_dir)] == ["1"]

    resumed = copy_of(run_dir, tmp_path)
    run_training([*trainer(), "--out", resumed], cwd=tmp_path, env=isolated_env, nproc=2)
    assert_same_training(resumed, straight)
    assert [row["resumes"] for row in read_metrics(resumed)] == ["0", "1"]
    assert steps_of(resumed) == steps_of(straight)
    assert len(json.loads((resumed / "run.json").read_text())["resumed_at"]) == 1


def steps_of(run_dir) -> list[tuple[str, str]]:
    """(epoch, step) of every row of steps.csv."""
    with open(run_dir / "steps.csv", newline="") as f:
        return [(row["epoch"], row["step"]) for row in csv.DictReader(f)]


def test_a_damaged_mid_epoch_checkpoint_is_named_in_one_line_and_nothing_is_overwritten(
    stopped, tmp_path, isolated_env
):
    run_dir = copy_of(stopped[0], tmp_path)
    checkpoint = run_dir / "checkpoint.pt"
    checkpoint.write_bytes(checkpoint.read_bytes()[:5000])
    before = {path.name: path.read_bytes() for path in run_dir.iterdir()}
    proc = run_training([*trainer(), "--out", run_dir], cwd=tmp_path, env=isolated_env, nproc=2, expect_ok=False)
    assert proc.returncode != 0
    assert proc.stderr.count(f"ddp_core.train: error: {checkpoint} is unreadable (truncated or corrupt)") == 1
    assert {path.name: path.read_bytes() for path in run_dir.iterdir()} == before


def test_a_rank_killed_with_restarts_on_is_replaced_and_the_run_finishes_the_same(straight, tmp_path, isolated_env):
    run_dir = tmp_path / "run"
    with open(tmp_path / "output.log", "w") as log:
        agent = subprocess.Popen(
            launch_command(2, max_restarts=1) + trainer("--checkpoint-every-steps", 50, "--out", run_dir),
            cwd=tmp_path,
            env=isolated_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 180
            while not (run_dir / "checkpoint.pt").exists():  # the first checkpoint, 50 steps into epoch 1
                assert agent.poll() is None and time.monotonic() < deadline, (tmp_path / "output.log").read_text()
                time.sleep(0.1)
            ranks = subprocess.run(["pgrep", "-P", str(agent.pid)], capture_output=True, text=True).stdout.split()
            assert len(ranks) == 2
            os.kill(int(ranks[-1]), signal.SIGKILL)
            agent.wait(timeout=300)
        finally:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
    output = (tmp_path / "output.log").read_text()
    assert agent.returncode == 0, output
    assert_same_training(run_dir, straight)
    assert len(json.loads((run_dir / "run.json").read_text())["resumed_at"]) == 1


STOP_LINE = re.compile(
    r"^ddp_core: stopped by SIGINT at epoch 2, step (\d+) of (\d+): checkpoint written; "
    r"continue the run with: (.*)$",
    re.MULTILINE,
)


def continue_command(printed: str) -> list[str]:
    """The command in the one line that a run stopped by Ctrl-C inside its second epoch printed, to run from here."""
    lines = STOP_LINE.findall(printed)
    assert len(lines) == 1, printed
    step, steps, command = lines[0]
    assert 0 < int(step) < int(steps), printed
    program, *args = shlex.split(command)
    return [str(Path(sys.executable).with_name(program)), *args]  # python or torchrun, of this environment


def test_ctrl_c_stops_one_process_in_one_line_whose_command_finishes_the_run(tmp_path, isolated_env):
    # 600 steps an epoch: one process takes 150 in less time than a busy machine may take to send the signal
    printed, code = signalled(
        [sys.executable, "-m", "ddp_core.train", *trainer("--train-samples", 4800)],
        signal.SIGINT,
        tmp_path,
        isolated_env,
    )
    assert code == 130 and "Traceback" not in printed, printed
    command = continue_command(printed)
    assert command[1:3] == ["-m", "ddp_core.train"]
    run_dir = tmp_path / command[command.index("--out") + 1]  # named by the line: the run's own command did not
    assert [row["epoch"] for row in read_metrics(run_dir)] == ["1"]

    finished = subprocess.run(command, cwd=tmp_path, env=isolated_env, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert [row["resumes"] for row in read_metrics(run_dir)] == ["0", "1"]


@pytest.mark.parametrize("launcher", ["torchrun", "ddp-torchrun"])
def test_ctrl_c_stops_every_rank_under_torchrun_and_the_command_it_prints_continues_exactly(
    straight, tmp_path, isolated_env, launcher
):
    """Torchrun reports the signal itself after the ranks have stopped (a traceback and exit status 1, torch 2.13):
    the ranks print one line and no traceback. The project's ddp-torchrun leaves the agent's report out and exits
    130, as a program ended by Ctrl-C does; its line names it as the command to continue with."""
    agent = [
        str(Path(sys.executable).with_name(launcher)),
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "ddp_core.train",
    ]
    printed, code = signalled(agent + trainer("--out", tmp_path / "run"), signal.SIGINT, tmp_path, isolated_env)
    assert "KeyboardInterrupt" not in printed, printed
    if launcher == "ddp-torchrun":
        assert code == 130 and "Traceback" not in printed and "signal" not in printed.replace("SIGINT", ""), printed
    command = continue_command(printed)
    assert Path(command[0]).name == launcher and "--nproc-per-node=2" in command

    finished = subprocess.run(command, cwd=tmp_path, env=isolated_env, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert_same_training(tmp_path / "run", straight)


# The local launcher, called as a notebook's cell calls it, in a process that Ctrl-C interrupts as a terminal's does
# (a suite run in a background job would have it inherit SIGINT ignored).
LAUNCHER = """import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from ddp_core.launch.launchers import start
from ddp_core.launch.plan import Placement, prepare
start(prepare(world_size=2, placement=Placement(sys.argv[2], nodes=int(sys.argv[3])), results_dir=sys.argv[1],
              experiment="ctrl-c", profile="tiny", overrides={"train_samples": 2400, "global_batch_size": 8}))
"""


@pytest.mark.parametrize(
    "launcher, nodes",
    [
        ("local", 1),
        pytest.param("emulated", 2, marks=pytest.mark.skipif(os.geteuid() != 0, reason="emulated nodes need root")),
    ],
)
def test_ctrl_c_in_a_launcher_ends_in_the_trainers_one_line_and_the_same_call_finishes_the_run(
    tmp_path, isolated_env, launcher, nodes
):
    command = [sys.executable, "-c", LAUNCHER, str(tmp_path / "results"), launcher, str(nodes)]
    printed, code = signalled(command, signal.SIGINT, tmp_path, isolated_env)
    assert code == 130 and "Traceback" not in printed and "SignalException" not in printed, printed
    continue_command(printed)
    run_dir = tmp_path / "results" / "ctrl-c" / "n2"
    assert [row["epoch"] for row in read_metrics(run_dir)] == ["1"]

    finished = subprocess.run(command, cwd=tmp_path, env=isolated_env, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert [row["resumes"] for row in read_metrics(run_dir)] == ["0", "1"]
