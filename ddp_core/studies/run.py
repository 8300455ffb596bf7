"""Train the studies of the study list: every run through the run notebook, then the benchmarks beside them.

    python -m ddp_core.studies.run                       # every study of notebooks/studies.yml
    python -m ddp_core.studies.run nodes precision --results-dir results
    python -m ddp_core.studies.run scaling --profile gpu     # the strong-scaling study on this node's GPUs
    python -m ddp_core.studies.run --check                   # every run checked and planned; none trains

The runs train round by round, so that the runs the report compares alternate in time. Every run is planned and
checked first, so a bad entry fails in one line before anything trains. Each run executes `notebooks/run_experiment.md`
with papermill, and the executed notebook is saved in the run's folder.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ddp_core.engine.config import OneLineParser, UsageError, check_writable_folder, positive_int
from ddp_core.launch.plan import ExperimentError, Placement, Plan, check_can_emulate, launch_command, prepare_run
from ddp_core.launch.slurm import run_slurm
from ddp_core.paths import REPO_ROOT, RESULTS_DIR
from ddp_core.studies import wind_tunnel
from ddp_core.studies.study_list import (
    STUDY_LIST,
    Run,
    SlurmPlacement,
    Study,
    StudyError,
    at_world_sizes,
    interleaved,
    load_study_list,
    on_profile,
    on_slurm,
    select,
)

RUN_NOTEBOOK = REPO_ROOT / "notebooks" / "run_experiment.md"
NOTEBOOK_NAME = "run_experiment.ipynb"
# The kernel's own log, critical messages only: its start-up warning and the note it logs when it is shut down,
# once per run, would bury the runner's progress lines. A failing cell still fails the run, through papermill.
QUIET_KERNEL = ["--IPKernelApp.log_level=CRITICAL"]
# Over an emulated link a 256 MiB all-reduce takes minutes: the benchmark stops at 16 MiB, beyond the buckets.
EMULATED_ALLREDUCE_ARGS = ["--max-bytes", str(16 * 2**20), "--seconds-per-size", "0.5"]


def plan_runs(studies: list[Study], results_dir: str) -> list[tuple[Run, Plan]]:
    """Check and plan every run, a modelled one with the rate the wind tunnel chose once it has chosen."""
    # The trainer's own parser checks the settings, and the plan refuses a folder that holds a different run.
    records = {study.name: wind_tunnel.recorded(study, results_dir) for study in studies if study.modelled}
    planned = []
    for run in interleaved(studies):
        if run.models:
            run = wind_tunnel.dimensioned(run, records[run.study])
        try:
            plan = prepare_run(run.parameters(results_dir))
        except ExperimentError as exc:
            raise StudyError(f"study {run.study!r}, run {run.folder}: {exc}") from None
        planned.append((run, plan))
    return planned


def kernel_on_unix_sockets(folder: str):
    """The notebook kernel's settings: its channels on Unix sockets in `folder`, not on TCP ports. A TCP kernel binds
    its ports after they were chosen, and another process sometimes takes one first."""
    # "Address already in use", from another kernel or a trainer's connections, and that channel is dead
    from traitlets.config import Config

    return Config({"KernelManager": {"transport": "ipc", "ip": f"{folder}/kernel"}})


class RunKernel:
    """One notebook kernel for every run of a `make report`: its start and imports cost seconds, paid once, not 93
    times. Each run's notebook assigns every variable before reading it, so a run sees nothing of the one before."""

    def __init__(self, sockets: str):
        from jupyter_client.manager import KernelManager

        self.manager = KernelManager(kernel_name="python3", config=kernel_on_unix_sockets(sockets))

    def alive(self):
        if not self.manager.is_alive():  # a kernel that died is started anew before the next run
            if self.manager.has_kernel:
                self.manager.cleanup_resources()
            self.manager.start_kernel(extra_arguments=QUIET_KERNEL)
        return self.manager

    def shutdown(self) -> None:
        if self.manager.has_kernel:
            self.manager.shutdown_kernel(now=True)


@contextlib.contextmanager
def run_kernel():
    with tempfile.TemporaryDirectory(prefix="ddp-kernel-") as sockets:
        kernel = RunKernel(sockets)
        try:
            yield kernel
        finally:
            kernel.shutdown()


def execute_run_notebook(run: Run, results_dir: str, kernel: RunKernel) -> None:
    """Execute the run notebook with papermill into the run's folder. A failure leaves it as *.failed.ipynb."""
    import jupytext
    import nbformat
    import papermill

    run_dir = Path(results_dir) / run.folder
    run_dir.mkdir(parents=True, exist_ok=True)
    failed = run_dir / NOTEBOOK_NAME.replace(".ipynb", ".failed.ipynb")
    try:
        executed = papermill.execute_notebook(
            jupytext.read(RUN_NOTEBOOK),
            str(failed),
            parameters=run.parameters(results_dir),
            progress_bar=False,
            km=kernel.alive(),
        )
    except papermill.PapermillExecutionError as exc:
        raise StudyError(
            f"run {run.folder} failed: {exc.ename}: {exc.evalue.splitlines()[0] if exc.evalue else ''}"
            f" (the notebook: {failed})"
        ) from None
    ran = [cell for cell in executed.cells if cell.cell_type == "code" and cell.execution_count is not None]
    for count, cell in enumerate(ran, 1):  # numbered as in a kernel of its own, which a user's papermill call starts
        cell.execution_count = count
        for output in cell.outputs:
            if "execution_count" in output:
                output["execution_count"] = count
    for cell in executed.cells:  # the book shows the command the run printed, not the notebook's parameter cells
        if {"parameters", "injected-parameters"} & set(cell.metadata.get("tags", [])):
            cell.metadata["tags"] = [*cell.metadata["tags"], "remove-cell"]
    nbformat.write(executed, run_dir / NOTEBOOK_NAME)
    failed.unlink()


def run_quietly(label: str, command: list[str]) -> None:
    """Run a benchmark as one progress line with its time. Its own output is shown only when it fails."""
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-10:])
        raise StudyError(f"{label} failed (command: {shlex.join(command)}); its last lines:\n{tail}")
    print(f"{label}: done in {time.perf_counter() - start:.0f} s", flush=True)


def benchmark_on_slurm(study: Study, n: int, out: Path, extra_args: str) -> None:
    """The all-reduce benchmark on `n` ranks as a Slurm job placed as the study's runs are, waited for."""
    run = next(run for run in study.runs() if run.world_size == n)
    parameters = run.parameters(str(out.parent))
    plan = Plan(
        world_size=n,
        run_dir=out,
        train_args=shlex.split(extra_args),
        action="train",
        placement=Placement.of(parameters),
    )
    start = time.perf_counter()
    run_slurm(plan, module="ddp_core.bench.allreduce")
    print(
        f"{study.name}: all-reduce benchmark on {n} ranks as a Slurm job: done in {time.perf_counter() - start:.0f} s",
        flush=True,
    )


def benchmark_allreduce(study: Study, results_dir: str, extra_args: str) -> None:
    """Run the all-reduce benchmark at each world size above 1 of the study. It runs here, as a Slurm job, or on each
    emulated variant's links."""
    if study.ranks_per_node is None:
        for n in study.allreduce_world_sizes:
            out = Path(results_dir) / study.name / f"allreduce-n{n}"
            if (out / "allreduce.csv").exists():
                continue
            if study.slurm:
                benchmark_on_slurm(study, n, out, extra_args)
            else:
                run_quietly(
                    f"{study.name}: all-reduce benchmark on {n} ranks",
                    [*launch_command(n, "-m", "ddp_core.bench.allreduce"), "--out", str(out), *shlex.split(extra_args)],
                )
        return
    for variant in study.variants if study.allreduce else ():
        for n in sorted(n for n in variant.world_sizes if n > 1 and not variant.models):  # the wind tunnel's: made
            out = Path(results_dir) / study.experiment(variant) / f"allreduce-n{n}"  # results/<study>/<variant>/...
            if not (out / "allreduce.csv").exists():
                start = time.perf_counter()
                wind_tunnel.benchmark_on_cluster(
                    n // study.ranks_per_node,
                    study.ranks_per_node,
                    variant.link_rate,
                    variant.cpus_per_node,
                    out,
                    [*EMULATED_ALLREDUCE_ARGS, *shlex.split(extra_args)],
                )
                print(
                    f"{study.experiment(variant)}: all-reduce benchmark on {n} ranks over "
                    f"{n // study.ranks_per_node} emulated nodes: done in {time.perf_counter() - start:.0f} s",
                    flush=True,
                )


def run_studies(studies: list[Study], results_dir: str, allreduce_args: str = "") -> None:
    """Train every run, round by round, then the all-reduce benchmarks. Modelled variants are calibrated when the
    first of them trains, and forecast each round before their runs."""
    planned = plan_runs(studies, results_dir)
    by_name = {study.name: study for study in studies}
    with run_kernel() as kernel:
        # Round k is repeat k of every chosen study, variant and world size; each run.json has its start time.
        for i, (run, plan) in enumerate(planned, 1):
            label = f"[{i}/{len(planned)}] {run.folder}"
            # A finished run with its notebook is skipped. The notebook reuses one without, and resumes a stopped one.
            if plan.action == "reuse" and (plan.run_dir / NOTEBOOK_NAME).exists():
                print(f"{label}: done before, reused", flush=True)
                continue
            if run.models:
                if run.link_rate is None:  # after the one-node run of its share, which round 1 trains before them
                    run = wind_tunnel.dimensioned(
                        run, wind_tunnel.calibrate(by_name[run.study], results_dir, run.cpus_per_node)
                    )
                # before the first of the share's modelled variants trains in this round
                wind_tunnel.forecast_round(by_name[run.study], results_dir, run.cpus_per_node, run.repeat)
            start = time.perf_counter()
            execute_run_notebook(run, results_dir, kernel)
            print(f"{label}: {plan.action} in {time.perf_counter() - start:.0f} s", flush=True)
    for study in studies:
        benchmark_allreduce(study, results_dir, allreduce_args)


def can_run_here(studies: list[Study], launcher: str = "local") -> tuple[list[Study], str]:
    """The studies this machine can run, or its cluster under `launcher` slurm, and why the others cannot. Emulated
    studies need root and iproute2 here, and never run on a cluster."""
    emulated = [study for study in studies if study.ranks_per_node is not None]
    if emulated and launcher == "slurm":
        return [study for study in studies if study not in emulated], (
            f"not submitting {', '.join(study.name for study in emulated)}: their nodes are emulated on one machine"
        )
    try:
        if emulated:
            check_can_emulate(1, None)
    except ExperimentError as exc:
        return [study for study in studies if study not in emulated], (
            f"not training {', '.join(study.name for study in emulated)}: {exc}"
        )
    return studies, ""


def check_allreduce_args(extra_args: str, studies: list[Study]) -> None:
    """Check the all-reduce benchmark's extra options as the benchmark does, before the first run trains. The
    benchmarks run after every run, too late to refuse them."""
    from ddp_core.bench.allreduce import parse_args

    emulated = any(study.ranks_per_node is not None and study.allreduce for study in studies)
    with tempfile.TemporaryDirectory() as folder:
        try:
            for base in ([], EMULATED_ALLREDUCE_ARGS) if emulated else ([],):  # after an emulated benchmark's too
                parse_args([*base, "--out", f"{folder}/allreduce", *shlex.split(extra_args)])
        except (ValueError, UsageError) as exc:
            raise StudyError(f"--allreduce-args {extra_args!r}: {exc}") from None


def world_size(text: str) -> int:
    """`positive_int`, naming the usual slip: a study's name after --world-sizes, which takes every word after it."""
    try:
        return positive_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of ranks (name the studies before --world-sizes)"
        ) from None


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m ddp_core.studies.run", description=__doc__.splitlines()[0])
    parser.add_argument("studies", nargs="*", help="names of studies to run (default: all of them)")
    parser.add_argument("--study-list", default=str(STUDY_LIST), help="the study list (default %(default)s)")
    parser.add_argument("--results-dir", default=RESULTS_DIR, help="where the studies' folders go")
    parser.add_argument("--allreduce-args", default="", help="more options for ddp_core.bench.allreduce")
    parser.add_argument(
        "--profile",
        default=None,
        help="base profile of every chosen study instead of its own (e.g. gpu); refused where a "
        "study's settings would override the profile's",
    )
    parser.add_argument(
        "--world-sizes",
        nargs="+",
        type=world_size,
        metavar="N",
        help="only the runs of N ranks (e.g. 1 on a machine with one GPU); the others are left to a "
        "later call, which reuses these",
    )
    parser.add_argument(
        "--launcher",
        choices=["local", "slurm"],
        default="local",
        help="local: every run on this machine; slurm: every run a job of slurm/ddp_train.sbatch, "
        "submitted and waited for in turn",
    )
    parser.add_argument(
        "--ranks-per-node",
        type=positive_int,
        default=SlurmPlacement.ranks_per_node,
        help="slurm: the most ranks a job puts on a node (its GPUs); more take whole nodes (default %(default)s)",
    )
    parser.add_argument(
        "--cpus-per-rank",
        type=positive_int,
        default=SlurmPlacement.cpus_per_rank,
        help="slurm: CPU cores a rank asks for (default %(default)s)",
    )
    parser.add_argument(
        "--check", action="store_true", help="plan and check every run of the chosen studies, then stop: train nothing"
    )
    try:
        args = parser.parse_args(argv)
        check_writable_folder(Path(args.results_dir), "--results-dir")
        studies = select(load_study_list(args.study_list), args.studies)
        # A user who names no studies gets those this machine can run, and the book shows the others' reference runs.
        # A study named on the command line is refused in one line instead.
        if not args.studies:
            studies, skipped = can_run_here(studies, args.launcher)
            if skipped:
                print(f"ddp_core.studies.run: {skipped}; the book shows their reference runs", flush=True)
        if args.world_sizes:
            studies = at_world_sizes(studies, args.world_sizes)
        if args.profile:
            studies = on_profile(studies, args.profile)
        if args.launcher == "slurm":
            studies = on_slurm(studies, SlurmPlacement(args.ranks_per_node, args.cpus_per_rank))
        if args.allreduce_args:
            check_allreduce_args(args.allreduce_args, studies)
        if args.check:
            print(f"ddp_core.studies.run: check passed: {len(plan_runs(studies, args.results_dir))} runs planned")
        else:
            run_studies(studies, args.results_dir, args.allreduce_args)
    except (StudyError, UsageError) as exc:
        print(f"ddp_core.studies.run: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the run in flight, in a session of its own, got it too: it stops at a checkpoint
        print(
            "ddp_core.studies.run: stopped by Ctrl-C; run the same command to go on: it reuses every finished run "
            "and continues a stopped one from its checkpoint",
            file=sys.stderr,
        )
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
