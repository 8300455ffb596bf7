"""The SLURM path against a real single-node Slurm on localhost, and a real two-node rendezvous."""

import os
import shutil
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import jupytext
import papermill
import pytest
import torch
import yaml

from conftest import REPO, TINY_STUDIES, TWO_RANKS_ARGS, TWO_RANKS_SETTINGS, copy_project, free_port, read_metrics
from ddp_core.studies.run import kernel_on_unix_sockets

pytestmark = pytest.mark.slow  # every test here trains more than a few steps

CLUSTER_SCRIPT = REPO / "slurm" / "local-cluster.sh"


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    if shutil.which("sbatch") is None and os.geteuid() != 0:
        pytest.skip("Slurm is absent and installing it (slurm/local-cluster.sh start runs apt-get) needs root")
    env = dict(
        os.environ,
        DDP_SLURM_DIR=str(tmp_path_factory.mktemp("slurm")),
        DDP_SLURMCTLD_PORT="16817",
        DDP_SLURMD_PORT="16818",
    )
    started = subprocess.run([CLUSTER_SCRIPT, "start"], env=env, capture_output=True, text=True, timeout=600)
    assert started.returncode == 0, started.stdout + started.stderr
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = f"{env['DDP_SLURM_DIR']}/slurm.conf"
    yield
    subprocess.run([CLUSTER_SCRIPT, "stop"], env=env, capture_output=True, timeout=60)
    if previous is None:
        del os.environ["SLURM_CONF"]
    else:
        os.environ["SLURM_CONF"] = previous


def run_notebook(tmp_path, timeout=300, **parameters):
    notebook = tmp_path / "run_experiment.ipynb"
    jupytext.write(jupytext.read(REPO / "notebooks" / "run_experiment.md"), notebook)
    output = tmp_path / f"executed-{len(list(tmp_path.glob('executed-*')))}.ipynb"
    papermill.execute_notebook(
        notebook,
        output,
        cwd=tmp_path,
        progress_bar=False,
        execution_timeout=timeout,
        config=kernel_on_unix_sockets(str(tmp_path)),
        parameters={"profile": "tiny", "results_dir": str(tmp_path / "results"), "poll_seconds": 0.5, **parameters},
    )
    return "\n".join(out.get("text", "") for cell in jupytext.read(output).cells for out in cell.get("outputs", []))


def learning_curve(run_dir):
    return [(row["epoch"], row["train_loss"], row["val_loss"], row["val_accuracy"]) for row in read_metrics(run_dir)]


def test_notebook_trains_through_slurm_on_a_gpu_node_exactly_as_locally(slurm_cluster, tmp_path, two_local_ranks):
    """The local node declares 4 GPUs to Slurm as generic resources (slurm/local-cluster.sh), with no device behind
    them: a job asking a GPU per rank is placed on them, and its ranks train on the CPU."""
    printed = run_notebook(
        tmp_path,
        launcher="slurm",
        world_size=2,
        experiment="slurm",
        overrides=TWO_RANKS_SETTINGS,
        slurm_gpus_per_rank=1,
    )

    slurm_run = tmp_path / "results" / "slurm" / "n2"
    assert "COMPLETED" in printed
    logs = [p for p in slurm_run.glob("slurm-*.out")]
    assert logs, "the job's log belongs in the run directory"
    assert "1 node(s) x 2 rank(s), GPUs a node: 2," in logs[0].read_text()
    assert [int(row["world_size"]) for row in read_metrics(slurm_run)] == [2, 2]
    assert learning_curve(slurm_run) == learning_curve(two_local_ranks)


def test_a_run_asking_more_gpus_than_a_node_has_is_refused_in_one_line_before_it_queues(slurm_cluster, tmp_path):
    from ddp_core.launch.plan import ExperimentError, Placement, SlurmOptions, prepare
    from ddp_core.launch.slurm import run_slurm

    greedy = Placement("slurm", slurm=SlurmOptions(gpus_per_rank=3))  # 6 GPUs on a node that declares 4
    plan = prepare(profile="tiny", world_size=2, experiment="greedy", results_dir=str(tmp_path), placement=greedy)
    with pytest.raises(ExperimentError) as refused:
        run_slurm(plan)
    assert str(refused.value).startswith("sbatch refused the job: ")
    assert "\n" not in str(refused.value) and not (plan.run_dir / "slurm_job_id").exists()


@contextmanager
def polled_in_background(poll, every_s: float):
    """`poll()` every `every_s` seconds in a thread while the block runs, until it returns True."""
    done = threading.Event()

    def loop():
        while not done.wait(every_s):
            if poll():
                return

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def requeued_jobs_released():
    """Slurm holds a requeued job for about two minutes before it may start again (its BeginTime), so that its
    nodes can clean up; the test releases each one three seconds after it sees it held, as an administrator may,
    to keep the suite short. Not at once: a node refuses an attempt whose credential was made in the second the
    last one was revoked ("Job credential revoked"), and the job ends FAILED."""
    held_since = {}

    def release() -> bool:
        pending = subprocess.run(
            ["squeue", "--noheader", "--states=PENDING", "--format=%i %r"], capture_output=True, text=True
        ).stdout
        held = {job for job, reason in (line.split() for line in pending.splitlines()) if reason == "BeginTime"}
        for job in held_since.keys() - held:
            del held_since[job]
        for job in held:
            if time.monotonic() - held_since.setdefault(job, time.monotonic()) >= 3:
                subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], capture_output=True)
        return False

    return polled_in_background(release, every_s=0.5)


def time_limit_warned_once(run_dir):
    """Ahead of a job's time limit Slurm sends its batch script USR1 (slurm/ddp_train.sbatch: --signal=B:USR1@120)
    at one of the controller's checks, every 30 s. The test sends the same signal the same way (scancel --batch) as
    soon as the first attempt's trainer has started, so the attempt is cut short however fast this machine trains."""

    def warn() -> bool:
        if not ((run_dir / "run.json").is_file() and (run_dir / "slurm_job_id").is_file()):
            return False
        job = (run_dir / "slurm_job_id").read_text().strip()
        subprocess.run(["scancel", "--signal=USR1", "--batch", job], capture_output=True)
        return True

    return polled_in_background(warn, every_s=0.2)


def test_a_job_warned_of_its_time_limit_is_requeued_and_finishes_as_if_never_stopped(slurm_cluster, tmp_path):
    long_run = {"train_samples": 4000, "eval_samples": 64, "global_batch_size": 16, "dropout": 0.1}
    run_dir = tmp_path / "results" / "limit" / "n2"
    with requeued_jobs_released(), time_limit_warned_once(run_dir):
        printed = run_notebook(
            tmp_path, timeout=900, launcher="slurm", world_size=2, experiment="limit", overrides=long_run
        )
    run_notebook(tmp_path, timeout=900, launcher="local", world_size=2, experiment="straight", overrides=long_run)

    [log] = run_dir.glob("slurm-*.out")
    assert "ddp_train: time limit near: stopping at a checkpoint" in log.read_text()
    assert "attempt 2 started (requeued), continuing from the checkpoint" in printed
    assert "COMPLETED after" in printed
    assert learning_curve(run_dir) == learning_curve(tmp_path / "results" / "straight" / "n2")
    assert sum(int(row["resumes"]) for row in read_metrics(run_dir)) >= 1


def test_a_job_that_fails_inside_stops_with_the_cause(slurm_cluster, tmp_path):
    with pytest.raises(papermill.PapermillExecutionError) as failure:
        run_notebook(
            tmp_path,
            launcher="slurm",
            world_size=2,
            experiment="bad",
            overrides={"dataset": "imdb", "data_dir": str(tmp_path / "no-such-data")},
        )
    assert failure.value.ename == "ExperimentError"
    assert "ended FAILED" in failure.value.evalue
    assert f"data dir {tmp_path / 'no-such-data'} does not exist" in failure.value.evalue


def test_a_job_larger_than_the_cluster_is_refused_at_once(slurm_cluster, tmp_path):
    with pytest.raises(papermill.PapermillExecutionError) as failure:
        run_notebook(tmp_path, launcher="slurm", world_size=2, experiment="big", slurm_cpus_per_rank=4096)
    assert failure.value.ename == "ExperimentError"
    assert "sbatch refused the job" in failure.value.evalue and "processors" in failure.value.evalue


def test_submit_now_and_collect_later(slurm_cluster, tmp_path):
    printed = run_notebook(tmp_path, launcher="slurm", world_size=2, experiment="later", wait=False)
    assert "submitted job" in printed and "not waiting" in printed
    printed = run_notebook(tmp_path, launcher="slurm", world_size=2, experiment="later")
    assert "submitted job" not in printed, "the second execution must not submit the run again"
    assert len(read_metrics(tmp_path / "results" / "later" / "n2")) == 2


def test_the_study_runner_submits_each_run_and_benchmark_as_a_job_and_collects_what_finished(
    slurm_cluster, tmp_path, isolated_env
):
    study_list = tmp_path / "studies.yml"
    study_list.write_text(
        yaml.safe_dump({"mine": {"title": "Mine", "profile": "tiny", "world_sizes": [1, 2], "allreduce": True}})
    )
    command = [
        sys.executable,
        "-m",
        "ddp_core.studies.run",
        "--study-list",
        str(study_list),
        "--results-dir",
        "results",
        "--launcher",
        "slurm",
        "--ranks-per-node",
        "2",
        "--cpus-per-rank",
        "1",
        "--allreduce-args=--max-bytes 4096",
    ]
    env = isolated_env | {"SLURM_CONF": os.environ["SLURM_CONF"]}
    first = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stdout + first.stderr

    study = tmp_path / "results" / "mine"
    jobs = {folder: (study / folder / "slurm_job_id").read_text().strip() for folder in ("n1", "n2", "allreduce-n2")}
    assert len(set(jobs.values())) == 3, "a job each"
    for folder, job in jobs.items():
        assert (study / folder / f"slurm-{job}.out").is_file(), "each job's log in its folder"
    assert [len(read_metrics(study / f"n{n}")) for n in (1, 2)] == [2, 2]  # the tiny profile's 2 epochs
    assert (study / "allreduce-n2" / "allreduce.csv").is_file()

    second = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout + second.stderr
    assert second.stdout.count("done before, reused") == 2 and "submitted job" not in second.stdout
    assert {folder: (study / folder / "slurm_job_id").read_text().strip() for folder in jobs} == jobs


def test_one_job_makes_the_whole_report_inside_its_allocation(slurm_cluster, tmp_path, isolated_env):
    """For sites that allow no long process on the login node: sbatch slurm/report.sbatch, make's variables after it."""
    project = copy_project(tmp_path / "project")
    env = isolated_env | {"SLURM_CONF": os.environ["SLURM_CONF"]}
    job = subprocess.run(
        [
            "sbatch",
            "--wait",
            "--parsable",
            "--cpus-per-task",
            "2",
            "slurm/report.sbatch",
            f"STUDY_LIST={TINY_STUDIES}",
            "STUDIES=scaling",
            "ALLREDUCE_ARGS=--max-bytes 4096 --seconds-per-size 0.02",
        ],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    log = project / f"slurm-report-{job.stdout.strip().split(';')[0]}.out"
    assert job.returncode == 0, log.read_text()[-3000:] if log.is_file() else job.stderr
    assert "report: job" in log.read_text() and "HTML: _build/html/index.html" in log.read_text()
    assert (project / "results" / "scaling" / "n1" / "run.json").is_file()
    assert "Strong scaling" in (project / "_build" / "html" / "notebooks" / "scaling_analysis.html").read_text()


def test_two_nodes_rendezvous_over_c10d_and_train_the_same_model_as_one_node(tmp_path, isolated_env, two_local_ranks):
    endpoint = f"127.0.0.1:{free_port()}"
    agents = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc-per-node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={endpoint}",
                "--rdzv-id=two-nodes",
                "-m",
                "ddp_core.train",
                *TWO_RANKS_ARGS,
                "--out",
                str(tmp_path / "two-nodes"),
            ],
            cwd=tmp_path,
            env=isolated_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [agent.communicate(timeout=300)[0] for agent in agents]
    assert all(agent.returncode == 0 for agent in agents), "\n".join(outputs)

    one = torch.load(two_local_ranks / "checkpoint.pt", weights_only=False)
    two = torch.load(tmp_path / "two-nodes" / "checkpoint.pt", weights_only=False)
    assert one["world_size"] == two["world_size"] == 2
    for name, value in one["model"].items():
        torch.testing.assert_close(two["model"][name], value, rtol=0, atol=0, msg=f"{name} differs")
