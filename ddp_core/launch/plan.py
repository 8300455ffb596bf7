"""One run's launch plan, which every launcher takes (`local`, `emulated`, `slurm`): checked before any process starts.

A bad value then fails the run notebook's first cell with one line. The plan also decides what to do with the run
directory. A finished run is reused, an interrupted one resumed, and one with other settings never touched. The module
also holds what the launchers share: the trainer's command line, printed as a shell takes it, and following its output.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from ddp_core.engine.config import (
    CHECKPOINT_NAME,
    ERROR_PREFIX,
    TrainConfig,
    UsageError,
    differing_settings,
    load_profile,
    parse_args,
    to_args,
)
from ddp_core.launch.cpu_share import CpuShareError, check_shares, find_controller

LAUNCHERS = ("local", "slurm", "emulated")
NETWORK_FILE = "network.json"  # an emulated cluster's nodes and link, beside run.json

WIND_TUNNEL_FOLDER = "wind_tunnel"  # beside it, the wind tunnel's own measurements: its one-node runs, its benchmarks
# The run notebook's parameters that say where its ranks go (`Placement`), and those of its Slurm options that a
# study's run sets (`Run.parameters`), under the notebook's names.
PLACEMENT_PARAMETERS = ("launcher", "nodes", "link_rate", "cpus_per_node", "max_restarts")
SLURM_PARAMETERS = ("slurm_gpus_per_rank", "slurm_cpus_per_rank")


class ExperimentError(Exception):
    """A bad notebook parameter or a failed launch, in one line."""


@dataclass
class SlurmOptions:
    """How launcher "slurm" asks for the job's resources and waits for it."""

    gpus_per_rank: int = 0  # 1 on a GPU cluster, 0 on a CPU-only one (gloo)
    cpus_per_rank: int = 1  # CPU cores per rank
    sbatch_args: str = ""  # more sbatch options, e.g. "--partition gpu --time 01:00:00"
    wait: bool = True  # False submits and returns; the same plan later collects the results
    poll_s: float = 5.0  # seconds between looks at the job's state


@dataclass(frozen=True)
class Placement:
    """Where a run's ranks go and how they start: the launcher and what it is told."""

    launcher: str = "local"  # one of LAUNCHERS: `ddp_core.launch.launchers.start` starts it
    nodes: int = 1  # launchers "slurm" and "emulated": the nodes the ranks are spread over, evenly
    link_rate: str | None = None  # launcher "emulated": each node's link rate, None unshaped
    cpus_per_node: float | None = None  # launcher "emulated": each node's CPU share in cores, None the shared cores
    # times torchrun starts the ranks again after one failed, from the last checkpoint: for a run that must finish,
    # not one that is measured, since the restart's time is not in its epochs
    max_restarts: int = 0
    slurm: SlurmOptions = field(default_factory=SlurmOptions)  # launcher "slurm"

    @classmethod
    def of(cls, parameters: dict) -> Placement:
        """The placement a run notebook's parameters (`Run.parameters`) give, as the notebook builds it."""
        slurm = SlurmOptions(parameters.get("slurm_gpus_per_rank", 0), parameters.get("slurm_cpus_per_rank", 1))
        return cls(**{name: parameters[name] for name in PLACEMENT_PARAMETERS if name in parameters}, slurm=slurm)


@dataclass
class Plan:
    world_size: int
    run_dir: Path
    train_args: list[str]
    action: str  # "train", "resume", "reuse", or "interrupted" (a run that stopped before its first checkpoint)
    placement: Placement = field(default_factory=Placement)

    @property
    def ranks_per_node(self) -> int:
        return self.world_size // self.placement.nodes


def _int_at_least(value, minimum: int) -> bool:
    """An int (not a bool) of at least `minimum`: what a count in a notebook parameter must be."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def run_dir_name(world_size: int, repeat: int = 1) -> str:
    """`n4` for the first run at 4 ranks, `n4-r2` for its second repeat."""
    return f"n{world_size}" + (f"-r{repeat}" if repeat > 1 else "")


def prepare_run(parameters: dict) -> Plan:
    """`prepare` from a run notebook's parameters (`Run.parameters`), its placement's among them."""
    rest = {name: value for name, value in parameters.items() if name not in PLACEMENT_PARAMETERS + SLURM_PARAMETERS}
    return prepare(**rest, placement=Placement.of(parameters))


def prepare(
    *,
    world_size,
    placement: Placement,
    results_dir: str,
    experiment: str,
    profile: str = "default",
    overrides: dict | None = None,
    repeat=1,
) -> Plan:
    """Check every parameter and decide what to do with the run directory, starting nothing."""
    check_placement(world_size, repeat, placement)
    args, cfg = run_settings(profile, overrides, repeat, world_size)
    run_dir = Path(results_dir) / experiment / run_dir_name(world_size, repeat)
    action = run_dir_action(run_dir, cfg, world_size, placement)
    if action != "reuse" and (cfg.device == "cuda" or cfg.backend == "nccl"):
        check_gpu_launch(placement.launcher, cfg, world_size)
    return Plan(world_size, run_dir, args, action, placement)


def check_placement(world_size, repeat, placement: Placement) -> None:
    """Check where and how often the run goes, before anything is read. The first wrong value fails in one line."""
    launcher, nodes, slurm = placement.launcher, placement.nodes, placement.slurm
    if not _int_at_least(world_size, 1):
        raise ExperimentError(f"world_size must be a positive integer, got {world_size!r}")
    if not _int_at_least(repeat, 1):
        raise ExperimentError(f"repeat must be a positive integer, got {repeat!r}")
    if not _int_at_least(placement.max_restarts, 0):
        raise ExperimentError(f"max_restarts must be an integer >= 0, got {placement.max_restarts!r}")
    if launcher not in LAUNCHERS:
        raise ExperimentError(f"unknown launcher {launcher!r}; choose from {', '.join(LAUNCHERS)}")
    if not _int_at_least(slurm.gpus_per_rank, 0) or not _int_at_least(slurm.cpus_per_rank, 1):
        raise ExperimentError(
            f"slurm_gpus_per_rank must be an integer >= 0 and slurm_cpus_per_rank one >= 1, got "
            f"{slurm.gpus_per_rank!r} and {slurm.cpus_per_rank!r}"
        )
    if not _int_at_least(nodes, 1) or world_size % nodes:
        raise ExperimentError(f"nodes must be a positive integer that divides world_size {world_size}, got {nodes!r}")
    if launcher == "local" and nodes != 1:
        raise ExperimentError(
            f"launcher 'local' runs on this machine only; nodes={nodes} needs launcher='slurm' "
            f"(a cluster) or 'emulated' (nodes emulated on this machine)"
        )
    if launcher != "emulated" and placement.link_rate is not None:
        raise ExperimentError(f"link_rate sets the links of an emulated cluster; launcher {launcher!r} has none")
    if launcher != "emulated" and placement.cpus_per_node is not None:
        raise ExperimentError(
            f"cpus_per_node sets the compute of an emulated cluster's nodes; launcher {launcher!r} has none"
        )
    if launcher == "emulated":  # its nodes, link rate and CPU share, and whether this machine can make it
        check_can_emulate(nodes, placement.link_rate, placement.cpus_per_node)


def run_settings(profile: str, overrides: dict | None, repeat: int, world_size: int) -> tuple[list[str], TrainConfig]:
    """The trainer's arguments and the config its own parser makes of them."""
    try:
        settings = load_profile(profile) | (overrides or {})  # notebooks/profiles/NAME.yml: fields of TrainConfig
        # Repeat k trains with seed + k - 1: repeats show how far timings and accuracy move from run to run, the
        # yardstick the report holds every difference against.
        args = to_args(settings | {"seed": settings.get("seed", 0) + repeat - 1})
        return args, parse_args(args, world_size=world_size)
    except UsageError as exc:
        raise ExperimentError(str(exc)) from None


def run_dir_action(run_dir: Path, cfg: TrainConfig, world_size: int, placement: Placement) -> str:
    """What a run directory asks for: "train", "reuse", "resume" or "interrupted". A directory holding another run,
    or one on another emulated cluster, is refused."""
    if not (run_dir / "run.json").exists():
        return "train"
    try:
        info = json.loads((run_dir / "run.json").read_text())
        changed = differing_settings(info["config"], cfg) + ([] if info["world_size"] == world_size else ["world size"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ExperimentError(
            f"{run_dir / 'run.json'} is not a run's record ({type(exc).__name__}: {exc}); "
            f"move the folder away or choose another experiment name"
        ) from None
    if changed:
        raise ExperimentError(
            f"{run_dir} holds a run with other settings ({', '.join(changed)}); choose another experiment name"
        )
    held = network_of(run_dir)
    if held and (held["nodes"], held["link_rate"], held.get("cpus_per_node")) != (
        placement.nodes,
        placement.link_rate,
        placement.cpus_per_node,
    ):
        raise ExperimentError(
            f"{run_dir} holds a run on {held['nodes']} emulated node(s) at link rate "
            f"{held['link_rate']} with {held.get('cpus_per_node') or 'shared'} cores "
            f"each; choose another experiment name"
        )
    if info.get("end_time") and info["config"]["epochs"] >= cfg.epochs:
        return "reuse"  # papermill can re-execute the notebook without retraining
    # this run, unfinished: resumed from its checkpoint, or "interrupted" before its first one
    return "resume" if (run_dir / CHECKPOINT_NAME).exists() else "interrupted"


def check_gpu_launch(launcher: str, cfg: TrainConfig, world_size: int) -> None:
    """Check a run for GPUs: on Slurm, a torch with CUDA on this login node, and locally, enough GPUs visible here."""
    if launcher == "slurm":
        check_cuda_build()
    if launcher == "local":
        from ddp_core.engine.runtime import check_gpus, visible_gpus  # torch: imported only when GPUs are asked for

        try:
            check_gpus(cfg, world_size, visible_gpus())
        except UsageError as exc:
            raise ExperimentError(str(exc)) from None


def check_cuda_build() -> None:
    """A job for GPUs fails on its node when this torch has no CUDA: said here, on the login node, before it queues."""
    import torch

    if torch.version.cuda is None:
        raise ExperimentError(
            f"--device cuda on Slurm needs a CUDA build of torch, and this one is "
            f"{torch.__version__} without CUDA: install the build for the cluster's driver "
            f'(docs/using.md, "On a GPU cluster")'
        )


def network_of(run_dir: Path) -> dict | None:
    """The emulated network a run trained over (network.json), None for a run on one machine."""
    path = run_dir / NETWORK_FILE
    return json.loads(path.read_text()) if path.exists() else None


def refuse_interrupted(plan: Plan) -> None:
    if plan.action == "interrupted":
        raise ExperimentError(
            f"{plan.run_dir} holds a run that stopped before its first checkpoint; delete it or "
            f"choose another experiment name"
        )


def launch_command(world_size: int, *program: str, max_restarts: int = 0, torchrun: bool = False) -> list[str]:
    """`python PROGRAM` on `world_size` ranks of this machine. PROGRAM is `-m MODULE` or a script, by default the
    trainer."""
    program = program or ("-m", "ddp_core.train")
    # plain python for 1 rank; torchrun for more, to restart the ranks, or for a program that needs its environment
    if world_size == 1 and not max_restarts and not torchrun:
        return [sys.executable, *program]
    restarts = [f"--max-restarts={max_restarts}"] if max_restarts else []
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={world_size}",
        *restarts,
        *program,
    ]


def stop_with_parent() -> None:
    """Linux: SIGTERM to the trainer when the process that started it dies. Otherwise an interrupted `make report`
    leaves the trainer writing into the run directory the next attempt resumes."""
    # The notebook's kernel runs in a session of its own: a Ctrl-C or a killed job does not reach the trainer.
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


OPTION = re.compile(r"-[^\d.]")  # an option word (not a negative number)


def shell_command(words: list[str], width: int = 80) -> str:
    """`words` as the shell command line that the run prints, quoted, each option beside its value. Lines continue
    with ` \\` so that none passes `width` characters unless one option does."""
    groups: list[str] = []
    for word in words:
        if groups and not OPTION.match(word):
            groups[-1] += " " + shlex.quote(word)
        else:
            groups.append(shlex.quote(word))
    lines: list[str] = []
    for group in groups:
        if lines and len(lines[-1]) + len(" ") + len(group) + len(" \\") <= width:
            lines[-1] += " " + group
        else:
            lines.append(("    " if lines else "$ ") + group)
    return " \\\n".join(lines)


def trainer_args(plan: Plan) -> list[str]:
    """The trainer's arguments for this plan: its settings, its run directory, and --resume when it resumes."""
    return [
        *plan.train_args,
        "--out",
        str(plan.run_dir),
        "--no-progress",
        *(["--resume"] if plan.action == "resume" else []),
    ]


# Lines that frame what is measured: an emulated cluster's nodes compute at their CPU shares from the first (every
# rank has started: imports, data) to the last (the run's files are written; the processes only exit after it).
RUN_DIRECTORY_LINE = "ddp_core: run directory"  # the trainer's rank 0 has loaded everything and starts to train


RUN_FINISHED_LINE = "ddp_core: run finished"
LAUNCHER_VARIABLE = "DDP_CORE_LAUNCHER"  # set by ddp-torchrun: the trainer names it in the command that continues a run


ALLREDUCE_READY_LINE = "bench_allreduce: every rank is ready"


def follow_trainer(proc: subprocess.Popen, on_start=None, on_finish=None) -> None:
    """Echo the trainer's own lines as they come, calling `on_start` and `on_finish` at the lines that frame the run.
    Raise its one error line if it refused, or its output's end if it failed otherwise."""
    tail, refusal = deque(maxlen=20), None
    for line in proc.stdout:
        tail.append(line.rstrip())
        if line.startswith(RUN_DIRECTORY_LINE) and on_start:
            on_start()
        if line.startswith(RUN_FINISHED_LINE) and on_finish:
            on_finish()
        if line.startswith("ddp_core:"):
            print(line.rstrip(), flush=True)
        elif line.startswith(ERROR_PREFIX):
            refusal = line.rstrip()
    proc.wait()
    if refusal:
        raise ExperimentError(refusal)
    if proc.returncode != 0:
        raise ExperimentError(f"training exited with code {proc.returncode}; its last lines:\n" + "\n".join(tail))


MAX_NODES = 32


RATE = re.compile(r"^(?P<value>\d+(?:\.\d+)?)(?P<unit>kbit|mbit|gbit)$")


UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


class ClusterError(ExperimentError):
    """This machine cannot emulate the cluster asked for, or a node failed, in one line."""


def rate_bits_per_s(link_rate: str | None) -> float | None:
    """Bits per second of a tc rate such as "100mbit" or "2.5gbit". None, an unshaped link, stays None."""
    if link_rate is None:
        return None
    match = RATE.match(str(link_rate))
    if not match or float(match["value"]) <= 0:
        raise ClusterError(
            f"link_rate must be a rate such as 100mbit or 1gbit (kbit, mbit or gbit), or None for an "
            f"unshaped link; got {link_rate!r}"
        )
    return float(match["value"]) * UNITS[match["unit"]]


def check_can_emulate(nodes: int, link_rate: str | None, cpus_per_node: float | None = None) -> None:
    """Refuse, before anything is created, an emulated cluster this machine cannot make. It checks root, the tools,
    the rate, the CPU shares and a writable CPU controller."""
    if not isinstance(nodes, int) or not 1 <= nodes <= MAX_NODES:
        raise ClusterError(f"an emulated cluster has 1 to {MAX_NODES} nodes, got {nodes!r}")
    rate_bits_per_s(link_rate)
    if sys.platform != "linux":
        raise ClusterError("an emulated cluster needs Linux network namespaces")
    missing = [tool for tool in ("ip", "tc", "unshare") if shutil.which(tool) is None]
    if missing:
        raise ClusterError(
            f"an emulated cluster needs {', '.join(missing)} (Debian: apt-get install iproute2 util-linux)"
        )
    if os.geteuid() != 0:
        raise ClusterError(
            "an emulated cluster creates network namespaces and links: run as root (sudo), or use launcher='local'"
        )
    if cpus_per_node is not None:
        try:
            check_shares(nodes, cpus_per_node)
            find_controller()
        except CpuShareError as exc:
            raise ClusterError(str(exc)) from None
