"""A node's compute: a bounded share of this machine's CPU, so that N emulated nodes have N times the compute of one.

Each node gets a control group with a CFS quota, as Mininet's CPU-limited hosts do (Handigol et al., CoNEXT 2012).
The quota bounds a node's compute, not its communication: gloo's threads move to a sibling group without one. It holds
only from `limit()` to `release()`, so start-up and shutdown are not slowed. Both cgroup v1 and v2 work.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

# A rank that used up its quota waits for the next period, and in a synchronous all-reduce its peers wait with it.
# So the longest stall, period x (1 - share), should stay small against a step.
PERIOD_US = 10_000  # a tenth of the kernel's default (benchmarks/cpu_period.py measures both)
# A high weight gives the nodes their quota before other processes (the notebook kernel, the runner) get what is left:
# the quota, not the scheduler's fairness, sets their compute.
WEIGHT = 10_000  # v2 cpu.weight's maximum; v1 cpu.shares takes the same number (its default is 1024)
MOUNTS = Path("/proc/self/mounts")
GLOO_THREADS = ("pt_gloo", "gloo")  # the names of gloo's threads: "pt_gloo_runloop" (sums, sends), "gloo_tcp_loop"


class CpuShareError(Exception):
    """This machine cannot bound a node's CPU, in one line."""


@dataclass(frozen=True)
class CpuController:
    """Where node groups go: `quota_root` holds the quota, `usage_root` the usage. On v2 they are one folder."""

    # v1: cpu.cfs_quota_us in the `cpu` hierarchy, usage from `cpuacct`, threads moved through `tasks`.
    # v2: cpu.max and cpu.stat, the two children threaded, threads moved through `cgroup.threads`.
    version: int
    quota_root: Path
    usage_root: Path

    def groups(self) -> list[str]:
        """Names of the groups directly under the controller's roots."""
        roots = {self.quota_root, self.usage_root}
        return sorted({p.name for root in roots if root.is_dir() for p in root.iterdir() if p.is_dir()})

    def folders(self, name: str) -> list[Path]:
        """Group `name`'s folders: one on v2, one per hierarchy (cpu, cpuacct) on v1."""
        return sorted({self.quota_root / name, self.usage_root / name})


def find_controller(mounts: Path = MOUNTS, own_cgroup: Path = Path("/proc/self/cgroup")) -> CpuController:
    """The CPU controller this process may create groups under, or a one-line refusal."""
    v1: dict[str, Path] = {}
    v2: Path | None = None
    for line in mounts.read_text().splitlines():
        _, where, kind, options, *_ = line.split()
        if kind == "cgroup":
            for name in ("cpu", "cpuacct"):
                if name in options.split(","):
                    v1[name] = Path(where)
        elif kind == "cgroup2":
            v2 = Path(where)
    if "cpu" in v1 and "cpuacct" in v1:
        controller = CpuController(1, v1["cpu"], v1["cpuacct"])
    elif v2 is not None and "cpu" in _words(v2 / "cgroup.controllers"):
        path = next(
            (line.split("::", 1)[1] for line in own_cgroup.read_text().splitlines() if line.startswith("0::")), "/"
        )
        root = v2 / path.lstrip("/")
        if "cpu" not in _words(root / "cgroup.subtree_control"):
            try:
                (root / "cgroup.subtree_control").write_text("+cpu")
            except OSError as exc:
                raise CpuShareError(
                    f"cannot enable the cpu controller under {root} ({exc.strerror}): run as root "
                    f"in a cgroup whose children may use it, or leave cpus_per_node unset"
                ) from None
        controller = CpuController(2, root, root)
    else:
        raise CpuShareError(
            "no cgroup CPU controller is mounted (cgroup v1 cpu and cpuacct, or v2 with cpu): "
            "nodes cannot get a CPU share here; leave cpus_per_node unset"
        )
    if not (os.access(controller.quota_root, os.W_OK) and os.access(controller.usage_root, os.W_OK)):
        raise CpuShareError(
            f"cannot create control groups under {controller.quota_root}: run as root, or leave cpus_per_node unset"
        )
    return controller


def _words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


def check_shares(nodes: int, cpus_per_node) -> None:
    """A share is a positive number of cores, and the nodes' shares fit in this machine's usable cores."""
    if isinstance(cpus_per_node, bool) or not isinstance(cpus_per_node, (int, float)) or not cpus_per_node > 0:
        raise CpuShareError(f"cpus_per_node must be a positive number of cores (e.g. 0.25), got {cpus_per_node!r}")
    cores = len(os.sched_getaffinity(0))
    if nodes * cpus_per_node > cores + 1e-9:
        raise CpuShareError(
            f"{nodes} nodes x {cpus_per_node} cores = {nodes * cpus_per_node:g} cores, more than "
            f"the {cores} this machine can use: fewer nodes or a smaller cpus_per_node"
        )
    if cpus_per_node * PERIOD_US < 1000:
        raise CpuShareError(
            f"cpus_per_node {cpus_per_node} is below the kernel's smallest quota, 1 ms per "
            f"{PERIOD_US // 1000} ms period ({1000 / PERIOD_US:g} cores)"
        )


class NodeCpu:
    """One node's control group: its compute held to `cpus` cores, its communication beside it without a quota. It
    reads back their usage and the compute's throttling."""

    # A bucket's all-reduce runs beside backward, as a GPU's collectives run on its links' engines beside its compute.
    # With gloo's threads under the quota, each waited for the periods backward had spent. An all-reduce during
    # backward then took several times as long as alone, which no forecast from one node's step could see.
    COMPUTE, COMMUNICATION = "compute", "communication"

    def __init__(self, controller: CpuController, name: str, cpus: float, period_us: int = PERIOD_US):
        # `name` is the cluster's namespace name, so the sweep of a killed owner's leftovers finds the group
        self.controller, self.name, self.cpus, self.period_us = controller, name, cpus, period_us
        self.dirs = controller.folders(name)
        self.quota_dir = controller.quota_root / name / self.COMPUTE
        self.usage_dirs = {part: controller.usage_root / name / part for part in (self.COMPUTE, self.COMMUNICATION)}

    def create(self) -> None:
        """The group and its two children, its weight and the compute's period, without a quota yet."""
        for folder in self.dirs:
            folder.mkdir()
            for part in (self.COMPUTE, self.COMMUNICATION):
                (folder / part).mkdir()
                if self.controller.version == 2:
                    (folder / part / "cgroup.type").write_text("threaded")
        self.at_limit = self.at_release = None
        if self.controller.version == 1:
            (self.quota_dir / "cpu.cfs_period_us").write_text(str(self.period_us))
            (self.quota_dir.parent / "cpu.shares").write_text(str(WEIGHT))
        else:
            (self.quota_dir.parent / "cgroup.subtree_control").write_text("+cpu")
            (self.quota_dir / "cpu.max").write_text(f"max {self.period_us}")
            (self.quota_dir.parent / "cpu.weight").write_text(str(WEIGHT))

    def limit(self) -> None:
        """Start the quota on the compute and move gloo's threads to the communication. `stats` counts from here."""
        # The launcher calls this once training starts: every rank has loaded torch, the data and its process group,
        # whose threads then exist. Start-up and shutdown, which no timer measures, would take 4x as long at 0.25 core.
        self._separate_communication()
        # CFS: at most `quota` of CPU time per period, however many threads want it. 0.25 core is 2.5 ms per 10 ms.
        quota = round(self.cpus * self.period_us)
        if self.controller.version == 1:
            (self.quota_dir / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (self.quota_dir / "cpu.max").write_text(f"{quota} {self.period_us}")
        self.at_limit, self.at_release = self._counters(), None

    def _separate_communication(self) -> None:
        # gloo's threads, found by name: its workers, which sum and send the buckets, and its transport's receive loop.
        # The threads of forward, backward and the optimizer stay under the quota, however many there are.
        threads = "tasks" if self.controller.version == 1 else "cgroup.threads"
        for folder in self.dirs:
            for thread in _words(folder / self.COMPUTE / threads):
                try:
                    if Path(f"/proc/{thread}/comm").read_text().startswith(GLOO_THREADS):
                        (folder / self.COMMUNICATION / threads).write_text(thread)
                except (FileNotFoundError, ProcessLookupError):
                    pass  # the thread ended since it was listed

    def release(self) -> None:
        """No quota from now on. `stats` stays what it was here."""
        self.at_release = self.stats()
        if self.controller.version == 1:
            (self.quota_dir / "cpu.cfs_quota_us").write_text("-1")
        else:
            (self.quota_dir / "cpu.max").write_text(f"max {self.period_us}")

    def enter(self) -> None:
        """Move the calling process into the compute, from a child before it executes. Its children and threads
        follow."""
        pid = str(os.getpid())
        for folder in self.dirs:
            if self.controller.version == 1:
                (folder / self.COMPUTE / "cgroup.procs").write_text(pid)
            else:  # the process joins the node's group, then its one thread the threaded `compute`
                (folder / "cgroup.procs").write_text(pid)
                (folder / self.COMPUTE / "cgroup.threads").write_text(pid)

    def stats(self) -> dict:
        """CPU use from `limit` to `release`, or to now. It holds the compute's CPU seconds, periods and throttling,
        and the communication's CPU seconds."""
        if self.at_release:
            return self.at_release
        now = self._counters()
        return {key: value - self.at_limit[key] for key, value in now.items()} if self.at_limit else now

    def _counters(self) -> dict:
        stat = _stat(self.quota_dir)
        if self.controller.version == 1:
            used = {part: int((folder / "cpuacct.usage").read_text()) / 1e9 for part, folder in self.usage_dirs.items()}
            throttled_s = int(stat["throttled_time"]) / 1e9
        else:
            used = {part: int(_stat(folder)["usage_usec"]) / 1e6 for part, folder in self.usage_dirs.items()}
            throttled_s = int(stat["throttled_usec"]) / 1e6
        return {
            "cpu_s": used[self.COMPUTE],
            "periods": int(stat["nr_periods"]),
            "throttled_periods": int(stat["nr_throttled"]),
            "throttled_s": throttled_s,
            "communication_cpu_s": used[self.COMMUNICATION],
        }

    def remove(self) -> None:
        remove_group(self.controller, self.name)


def _stat(folder: Path) -> dict:
    return dict(line.split() for line in (folder / "cpu.stat").read_text().splitlines() if line.strip())


def _subgroups(top: Path) -> list[Path]:
    """The groups under `top`, deepest first. If another sweep removes one during the walk, the walk starts again."""
    for _ in range(10):
        try:
            found = [p for p in top.rglob("*") if p.is_dir()] if top.exists() else []
            return sorted(found, key=lambda p: -len(p.parts))
        except FileNotFoundError:  # a test worker's sweep or a cluster's own teardown removed one
            continue
    return []


def remove_group(controller: CpuController, name: str) -> None:
    """Kill what still runs in the group, then remove it, its children first."""
    # the kernel refuses to remove a group while a process is in it
    for top in controller.folders(name):
        for folder in [*_subgroups(top), top]:
            for _ in range(50):
                if not folder.exists():
                    break
                for pid in _words(folder / "cgroup.procs"):
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                try:
                    folder.rmdir()
                except OSError:
                    time.sleep(0.02)  # a killed process leaves its group a moment later
