"""The files of a run directory: `metrics.csv`, `steps.csv`, `run.json` and `checkpoint.pt`.

A run killed at any moment leaves valid files. The report reads them too, so torch is imported only where a checkpoint
or provenance is written.
"""

from __future__ import annotations

import csv
import json
import math
import os
import platform
import socket
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

# The gradient noise scale's estimates (ddp_core/engine/noise_scale.py): NaN where a run cannot measure them.
NOISE_COLUMNS = ["grad_sq_norm", "grad_noise_trace", "noise_scale"]
# The training state one rank held, by kind, the largest rank's (ddp_core/engine/memory.py).
STATE_COLUMNS = ["parameters_bytes", "gradients_bytes", "optimizer_state_bytes", "gradients_kept_bytes"]
# The bytes the network interface gloo uses (GLOO_SOCKET_IFNAME: an emulated node's link) sent during the epoch's
# steps, its evaluations and checkpoint apart, the mean over the ranks; empty where gloo was given no interface.
LINK_COLUMNS = ["link_sent_bytes"]
METRICS_COLUMNS = [
    "epoch",
    "world_size",
    "global_batch_size",
    "per_rank_batch_size",
    "grad_accum",
    "train_samples",
    "steps",
    "epoch_time_s",
    "data_time_s",
    "forward_time_s",
    "backward_time_s",
    "optimizer_time_s",
    "comm_total_s",
    "comm_exposed_s",
    "eval_time_s",
    "train_loss",
    "val_loss",
    "val_accuracy",
    "lr",
    "samples_per_s",
    "peak_memory_mb",
    "resumes",
    *NOISE_COLUMNS,
    *STATE_COLUMNS,
    *LINK_COLUMNS,
]
# steps.csv: one row per optimizer step, its wall time and its exposed communication, each the mean over the ranks.
STEPS_COLUMNS = ["epoch", "step", "step_time_s", "comm_exposed_s"]
# evals.csv: one row per evaluation on the evaluation set, the optimizer steps taken before it counted over the run.
EVALS_COLUMNS = ["epoch", "step", "val_loss", "val_accuracy"]
# timeline.csv: the median step of the run's last epoch on rank 0, its phases and each bucket's all-reduce in seconds
# from its start.
TIMELINE_COLUMNS = ["what", "start_s", "end_s"]
READY = "gradients ready, bucket "  # a timeline row of one rank: when DDP's bucket k would be handed over


def append_rows(path: Path, rows: list[dict], columns: list[str]) -> None:
    """Append rows, an epoch's, to a CSV file. They are on disk when this returns."""
    new_file = not path.exists()
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        if new_file:
            writer.writeheader()
        writer.writerows({name: row[name] for name in columns} for row in rows)
        # Flushed and synced before returning, so a run killed later keeps these rows.
        f.flush()
        os.fsync(f.fileno())


def drop_rows_after(path: Path, last: int, column: str = "epoch") -> None:
    """Forget a CSV's rows whose `column` is past `last`, the last checkpoint's epoch (or optimizer step): a resumed
    run trains them again."""
    if not path.exists():
        return
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        rows = [row for row in reader if int(row[column]) <= last]
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=reader.fieldnames)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)


def save_atomic(obj, path: Path) -> None:
    # Write, then rename: a run killed meanwhile leaves the previous file whole.
    tmp = path.with_suffix(path.suffix + ".tmp")
    if path.suffix == ".json":
        tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    else:
        import torch  # here only: a book page that imported it would spend two seconds of its build doing so

        torch.save(obj, tmp)
    os.replace(tmp, path)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def git_commit() -> str | None:
    """The commit of the ddp_core checkout, with `-dirty` when its tracked files have uncommitted changes."""
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, check=True
        ).stdout.strip()
        # Results kept in reference/ are output, not code: their changes do not make the checkout dirty.
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ":(top)", ":(top,exclude)reference"],
            cwd=here,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        # A copy without .git, sent to a GPU machine say, is told the commit it was copied from.
        return os.environ.get("DDP_CORE_GIT_COMMIT")
    return commit + ("-dirty" if dirty else "")


def gpu_driver() -> str | None:
    """The NVIDIA driver's version, which torch does not report."""
    try:
        return (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "--id=0"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.CalledProcessError):
        return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# Vector and matrix instructions that decide how fast a CPU trains, bf16 above all (AMX and AVX-512 BF16).
CPU_EXTENSIONS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_extensions() -> list[str]:
    """Which of CPU_EXTENSIONS this CPU has: the model name a virtual machine reports may hide them."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return []
    present = set(flags.split(":", 1)[1].split())
    return [name for name in CPU_EXTENSIONS if name in present]


def environment(device) -> dict:
    """Hardware and software provenance for run.json, `device` a torch.device."""
    import torch

    info = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": None,
        "gpu_driver": None,
        "device_name": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_extensions": cpu_extensions(),
        "git_commit": git_commit(),
    }
    if device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(device)
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        info["gpu_driver"] = gpu_driver()
    return info


@dataclass(frozen=True)
class MachineClock:
    """This machine's CPU time at one moment (/proc/stat, every core), and this process's own."""

    wall_s: float
    busy_s: float  # user, nice, system, irq and softirq time of all cores: what every process and the kernel ran
    steal_s: float  # time the hypervisor ran something else while a core of this virtual machine wanted to run
    process_s: float

    @classmethod
    def now(cls) -> MachineClock:
        import time

        fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
        tick = os.sysconf("SC_CLK_TCK")
        return cls(
            time.perf_counter(), (user + nice + system + irq + softirq) / tick, steal / tick, time.process_time()
        )


def machine_activity(start: MachineClock, end: MachineClock, run_cpu_s: float) -> dict:
    """What the machine did while a run trained: the run's CPU time, everything else's, the stolen time and the load.
    A run disturbed by other work shows here, where its epoch times only look slow."""
    wall = end.wall_s - start.wall_s
    busy = end.busy_s - start.busy_s
    load_1min, load_5min, _ = (float(v) for v in Path("/proc/loadavg").read_text().split()[:3])
    return {
        "wall_s": wall,
        "run_cpu_s": run_cpu_s,
        "other_cpu_s": max(0.0, busy - run_cpu_s),
        "steal_cpu_s": end.steal_s - start.steal_s,
        "cores": os.cpu_count(),
        "load_1min": load_1min,
        "load_5min": load_5min,
    }


def link_sent_bytes() -> float:
    """Bytes sent so far on the interface gloo uses, from its kernel counter. It is NaN where gloo was given none."""
    interface = os.environ.get("GLOO_SOCKET_IFNAME")  # an emulated node sets it to its link
    try:
        return float(Path(f"/sys/class/net/{interface}/statistics/tx_bytes").read_text()) if interface else math.nan
    except OSError:
        return math.nan
