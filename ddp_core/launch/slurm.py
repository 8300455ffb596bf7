"""Submit a run to Slurm with `slurm/ddp_train.sbatch`, wait for it, and report how it really ended.

The final state comes from Slurm's records, never from an exit code alone: `sbatch --wait` returns 0 for a job
cancelled while pending. The job id is kept in the run directory, so running the notebook again attaches to a queued
job instead of submitting it twice. A requeued job keeps its id and continues from its checkpoint.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from ddp_core.engine.config import ERROR_PREFIX, UsageError, parse_args
from ddp_core.launch.plan import ExperimentError, Plan, refuse_interrupted
from ddp_core.paths import REPO_ROOT

SBATCH_SCRIPT = REPO_ROOT / "slurm" / "ddp_train.sbatch"
JOB_ID_FILE = "slurm_job_id"
ATTEMPT_LINE = re.compile(r"^ddp_train: job \d+ \(attempt \d+\)", re.MULTILINE)  # printed by SBATCH_SCRIPT
ACTIVE_STATES = {
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "REQUEUED",
    "RESIZING",
    "STAGE_OUT",
    "SIGNALING",
}


def _slurm(*command: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(command, capture_output=True, text=True)
    except FileNotFoundError:
        raise ExperimentError(f"{command[0]} not found: launcher='slurm' needs the Slurm client commands") from None


def sbatch_command(plan: Plan) -> list[str]:
    """The job's submission, with the resources the placement's `slurm` asks for."""
    ranks_per_node, slurm = plan.ranks_per_node, plan.placement.slurm
    command = [
        "sbatch",
        "--parsable",
        f"--job-name=ddp-{plan.run_dir.parent.name}-n{plan.world_size}",
        f"--nodes={plan.placement.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={ranks_per_node * slurm.cpus_per_rank}",
        f"--output={plan.run_dir.resolve()}/slurm-%j.out",
        "--export=ALL",
    ]
    if slurm.gpus_per_rank:
        command.append(f"--gpus-per-node={ranks_per_node * slurm.gpus_per_rank}")
    train_args = [*plan.train_args, "--resume"] if plan.action == "resume" else plan.train_args
    return [*command, *slurm.sbatch_args.split(), str(SBATCH_SCRIPT), str(plan.run_dir.resolve()), *train_args]


def job_state(job_id: str) -> tuple[str, str]:
    """(state, exit code) of a job, e.g. ("RUNNING", "") or ("FAILED", "1:0"), and ("UNKNOWN", "") if Slurm forgot
    it. A requeued job's state is its last attempt's."""
    # squeue while it is queued or running, then sacct, or sacct -c where only job completion logging is on, then
    # scontrol show job
    queued = _slurm("squeue", "--noheader", "--jobs", job_id, "--format=%T")
    if queued.returncode == 0 and queued.stdout.strip():
        return queued.stdout.split()[0], ""
    for sacct in (["sacct"], ["sacct", "-c"]):
        done = _slurm(
            *sacct, "--noheader", "--parsable2", "--allocations", "--jobs", job_id, "--format=JobID,State,ExitCode"
        )
        if done.returncode != 0:
            continue
        attempts = [
            fields
            for fields in (line.split("|") for line in done.stdout.splitlines())
            if len(fields) == 3 and fields[0] == job_id
        ]
        if attempts:  # a requeued job's records may hold every attempt in turn
            return attempts[-1][1].split()[0], attempts[-1][2]
    shown = _slurm("scontrol", "show", "job", job_id)
    fields = dict(item.split("=", 1) for item in shown.stdout.split() if "=" in item)
    return fields.get("JobState", "UNKNOWN"), fields.get("ExitCode", "")


def attempts_started(log: Path) -> int:
    """How many times the batch script has started. Each attempt of a requeued job says so in the job's log."""
    try:
        return len(ATTEMPT_LINE.findall(log.read_text(errors="replace")))  # each attempt appends to the same log
    except OSError:
        return 0


def wait_for(job_id: str, poll_s: float, log: Path) -> tuple[str, str]:
    """Poll until the job has left the queue and Slurm has recorded how it ended, through its requeues."""
    # Slurm requeues a job near its time limit or when preempted: it continues the same run from its checkpoint
    last_state, last_attempt = None, 1
    while True:
        state, exit_code = job_state(job_id)
        if state != last_state:
            print(f"job {job_id}: {state}", flush=True)
            last_state = state
        attempt = attempts_started(log)
        if attempt > last_attempt:
            print(f"job {job_id}: attempt {attempt} started (requeued), continuing from the checkpoint", flush=True)
            last_attempt = attempt
        if state not in ACTIVE_STATES | {"UNKNOWN"}:
            if last_attempt > 1:
                print(f"job {job_id}: {state} after {last_attempt} attempts", flush=True)
            return state, exit_code
        time.sleep(poll_s)


def failure_report(run_dir: Path, job_id: str, lines: int = 15) -> str:
    """The trainer's own error lines (each rank prints one), then the end of the job's log."""
    log = run_dir / f"slurm-{job_id}.out"
    if not log.is_file():
        return f"no log at {log}"
    text = log.read_text(errors="replace").splitlines()
    causes = dict.fromkeys(line.strip() for line in text if ERROR_PREFIX in line)
    return "\n".join([*causes, f"--- end of {log}:", *text[-lines:]])


def run_slurm(plan: Plan, module: str = "ddp_core.train") -> bool:
    """Submit the run's job, or attach to it, and with the placement's `wait` block until it ends. True when the run
    is finished. `module` is what the ranks run: the trainer or the all-reduce benchmark."""
    if plan.action == "reuse":
        print(f"{plan.run_dir} already holds this finished run: reusing it, not resubmitting")
        return True
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    id_file = plan.run_dir / JOB_ID_FILE
    job_id = id_file.read_text().strip() if id_file.exists() else None
    if job_id and job_state(job_id)[0] in ACTIVE_STATES:
        print(f"job {job_id} for {plan.run_dir} is already in the queue: attaching to it")
    else:
        refuse_interrupted(plan)
        command = sbatch_command(plan)
        env = dict(
            os.environ,
            DDP_PYTHON=sys.executable,
            DDP_NPROC_PER_NODE=str(plan.ranks_per_node),
            DDP_MAX_RESTARTS=str(plan.placement.max_restarts),
            DDP_MODULE=module,
        )
        submitted = subprocess.run(command, capture_output=True, text=True, env=env)
        if submitted.returncode != 0:
            raise ExperimentError("sbatch refused the job: " + " ".join(submitted.stderr.split()))
        job_id = submitted.stdout.strip().split(";")[0]
        id_file.write_text(job_id + "\n")
        print(f"submitted job {job_id}; log: {plan.run_dir / f'slurm-{job_id}.out'}")
    if not plan.placement.slurm.wait:
        print("not waiting (wait=False): run this notebook again with the same parameters to collect the results")
        return False
    state, exit_code = wait_for(job_id, plan.placement.slurm.poll_s, plan.run_dir / f"slurm-{job_id}.out")
    if state != "COMPLETED":
        raise ExperimentError(
            f"job {job_id} ended {state} (exit code {exit_code or '?'})\n" + failure_report(plan.run_dir, job_id)
        )
    return True


def check_submission(argv: list[str]) -> int:
    """Run the trainer's own checks of a job's options: `python -m ddp_core.launch.slurm WORLD_SIZE RUN_DIR [...]`.
    The scripts slurm/submit-*.sh run it before queueing, since a job refused on its GPUs has queued for nothing."""
    world_size, run_dir, *options = argv
    try:
        parse_args([*options, "--out", run_dir], world_size=int(world_size))
    except UsageError as exc:
        print(f"{ERROR_PREFIX} {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(check_submission(sys.argv[1:]))
