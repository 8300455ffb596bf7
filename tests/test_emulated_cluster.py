"""Nodes emulated as network namespaces: DDP across them trains what it trains on one machine, the links run at the
rate they were set to, a node computes at the CPU share it was given, and nothing of a cluster outlives it. Real
namespaces, links, control groups and processes: root only."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, TWO_RANKS_SETTINGS, read_metrics
from ddp_core.launch.cpu_share import PERIOD_US, CpuShareError, find_controller
from ddp_core.launch.emulated import EmulatedCluster, leftovers
from ddp_core.launch.plan import ExperimentError, Placement, prepare

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or sys.platform != "linux", reason="an emulated cluster needs root on Linux (network namespaces)"
)

LEARNING = ("train_loss", "val_loss", "val_accuracy")


def owned_by(pid: int) -> dict[str, list[str]]:
    """What clusters created by process `pid` have left on this machine."""
    return leftovers(owner_alive=lambda owner: owner != pid)


def nothing_left(pid: int) -> bool:
    return not any(owned_by(pid).values())


@pytest.fixture
def in_env(isolated_env, monkeypatch):
    for name, value in isolated_env.items():
        monkeypatch.setenv(name, value)


def plan(tmp_path, experiment, launcher, overrides=None, **where):
    return prepare(
        world_size=2,
        placement=Placement(launcher, **where),
        results_dir=str(tmp_path),
        experiment=experiment,
        profile="tiny",
        overrides=TWO_RANKS_SETTINGS | (overrides or {}),
    )


@pytest.mark.slow
def test_two_nodes_train_exactly_what_two_ranks_on_one_machine_train(tmp_path, in_env, two_local_ranks):
    from ddp_core.launch.emulated import run_emulated

    two_nodes = plan(tmp_path, "nodes", "emulated", nodes=2, link_rate="1gbit", cpus_per_node=0.5)
    run_emulated(two_nodes)

    for local, emulated in zip(read_metrics(two_local_ranks), read_metrics(two_nodes.run_dir), strict=True):
        for key in LEARNING:
            assert float(emulated[key]) == pytest.approx(float(local[key]), abs=1e-6), key
    network = json.loads((two_nodes.run_dir / "network.json").read_text())
    assert network["nodes"] == 2 and network["ranks_per_node"] == 1 and network["cpus_per_node"] == 0.5
    # Each node ran, and the kernel held it to its quota: no more than half a period's CPU in each period it ran
    # (without a quota the kernel counts no periods). So short a run need not exhaust its quota, throttled or not.
    for node in network["node_cpu"]:
        assert 0 < node["cpu_s"] <= 1.05 * node["periods"] * 0.5 * PERIOD_US / 1e6
        assert node["throttled_periods"] <= node["periods"]
    # Each node's link carried at least the ring all-reduce's 2 (N-1)/N of the fp32 gradient a step, which no
    # all-reduce can undercut, and not half as much again: the start-up's broadcast of the weights, the evaluations
    # and the protocols' headers are the rest (1.06 and 1.12 times the ring's bytes when this was written).
    steps = sum(int(row["steps"]) for row in read_metrics(two_nodes.run_dir))
    gradient = 4 * json.loads((two_nodes.run_dir / "run.json").read_text())["parameters"]
    ring = steps * 2 * (2 - 1) / 2 * gradient
    assert all(ring <= sent < 1.5 * ring for sent in network["sent_bytes"])
    # The trainer's own count, of the steps alone, comes closer: the ring's bytes and the protocols' headers.
    in_steps = sum(float(row["link_sent_bytes"]) for row in read_metrics(two_nodes.run_dir))
    assert ring <= in_steps < 1.1 * ring and in_steps < min(network["sent_bytes"]), in_steps / ring
    assert all(math.isnan(float(row["link_sent_bytes"])) for row in read_metrics(two_local_ranks))  # no link: none
    assert json.loads((two_nodes.run_dir / "run.json").read_text())["local_world_size"] == 1
    assert nothing_left(os.getpid())


# Rates the studies use. The cap is the shaper's and holds however busy the machine is; how close a link comes to
# it is not: the copy through the namespaces' veth pairs takes CPU, and while the other test worker trains a
# 500 Mbit/s link measured 0.42 Gbit/s (at 1 Gbit/s, 0.79). The studies measure each link before their runs.
@pytest.mark.parametrize("link_rate, gbit_s", [("100mbit", 0.1), ("500mbit", 0.5)])
def test_a_link_never_passes_the_rate_it_was_set_to_and_carries_most_of_it(link_rate, gbit_s):
    with EmulatedCluster(nodes=2, link_rate=link_rate) as cluster:
        measured = cluster.measure_link_gbit_s()
    assert 0.6 * gbit_s <= measured <= 1.1 * gbit_s
    assert nothing_left(os.getpid())


@pytest.mark.slow  # brings nodes up and down
def test_a_refused_run_leaves_no_namespace_link_or_hosts_file(tmp_path, in_env):
    from ddp_core.launch.emulated import run_emulated

    refused = plan(
        tmp_path,
        "refused",
        "emulated",
        nodes=2,
        overrides={"dataset": "imdb", "data_dir": str(tmp_path / "no-such-data")},
    )
    with pytest.raises(ExperimentError, match="does not exist"):
        run_emulated(refused)
    assert nothing_left(os.getpid())


@pytest.mark.slow  # brings nodes up and down
def test_a_node_that_fails_stops_the_others_and_is_the_one_named(tmp_path):
    """Each node runs its one rank without a torchrun agent: the launcher ends the job when a rank fails, as the
    agents would, so that no rank waits in a collective for a peer that is gone."""
    from ddp_core.launch.plan import ClusterError

    program = ["-c", "import os, sys, time\nif os.environ['RANK'] == '2': sys.exit(3)\ntime.sleep(120)"]
    with EmulatedCluster(nodes=3) as cluster:
        started = time.monotonic()
        leader, *others = cluster.launch(1, program, tmp_path)
        assert leader.wait(timeout=30) == -signal.SIGTERM
        with pytest.raises(ClusterError, match=f"^node 2 exited with code 3; its output: {tmp_path / 'node2.log'}$"):
            cluster.wait(others, tmp_path)
        assert time.monotonic() - started < 30
    assert nothing_left(os.getpid())


def start_cluster_process(tmp_path) -> subprocess.Popen:
    """A process that brings up a 2-node cluster, says so, and waits in it. Ctrl-C raises KeyboardInterrupt in it
    as in a terminal, even when the suite runs in a background job (whose children inherit SIGINT ignored)."""
    code = (
        "from ddp_core.launch.emulated import EmulatedCluster\nimport signal, time\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "with EmulatedCluster(nodes=2, link_rate='100mbit', cpus_per_node=0.5):\n"
        "    print('up', flush=True)\n    time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    assert owned_by(proc.pid)["namespaces"] and owned_by(proc.pid)["cpu groups"]
    return proc


def test_an_interrupted_cluster_removes_itself(tmp_path):
    proc = start_cluster_process(tmp_path)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    assert nothing_left(proc.pid)


def test_what_a_killed_cluster_left_is_swept_by_the_next(tmp_path):
    proc = start_cluster_process(tmp_path)
    proc.kill()
    proc.wait(timeout=60)
    deadline = time.monotonic() + 10
    while owned_by(proc.pid)["namespaces"] == [] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert owned_by(proc.pid)["namespaces"], "kill -9 runs no teardown: its namespaces must still be there"
    with EmulatedCluster(nodes=1):
        pass
    assert nothing_left(proc.pid)


@pytest.mark.parametrize(
    "kw, fragment",
    [
        (dict(nodes=2, link_rate="fast"), "link_rate must be a rate such as 100mbit"),
        (dict(nodes=3), "nodes must be a positive integer that divides world_size 2"),
        (dict(launcher="local", link_rate="1gbit"), "link_rate sets the links of an emulated cluster"),
        (dict(nodes=2, cpus_per_node=0), "cpus_per_node must be a positive number of cores"),
        (dict(nodes=2, cpus_per_node="half"), "cpus_per_node must be a positive number of cores"),
        (dict(nodes=2, cpus_per_node=len(os.sched_getaffinity(0))), "more than the"),
        (dict(nodes=2, cpus_per_node=0.01), "below the kernel's smallest quota"),
        (dict(launcher="local", cpus_per_node=0.5), "cpus_per_node sets the compute of an emulated cluster's nodes"),
    ],
)
def test_a_bad_cluster_is_refused_in_one_line_before_anything_starts(tmp_path, in_env, kw, fragment):
    launcher = kw.pop("launcher", "emulated")
    with pytest.raises(ExperimentError, match=fragment) as refused:
        plan(tmp_path, "bad", launcher, **kw)
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "bad").exists() and nothing_left(os.getpid())


def as_nobody(code: str) -> subprocess.CompletedProcess:
    """Python `code` run in the repository as a user without root, its output captured."""
    return subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )


def test_without_root_the_emulated_launcher_is_refused_in_one_line(tmp_path):
    code = (
        "from ddp_core.launch.plan import Placement, prepare\n"
        "prepare(world_size=2, placement=Placement('emulated', nodes=2), results_dir='/tmp', experiment='x', "
        "profile='tiny')"
    )
    proc = as_nobody(code)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].endswith("run as root (sudo), or use launcher='local'")


def test_without_root_the_study_runner_leaves_out_the_emulated_studies_and_says_why():
    code = (
        "from ddp_core.studies.run import can_run_here\nfrom ddp_core.studies.study_list import load_study_list\n"
        "studies, why = can_run_here(list(load_study_list('tests/studies-tiny.yml').values()))\n"
        "print(' '.join(s.name for s in studies)); print(why)"
    )
    proc = as_nobody(code)
    kept, why = proc.stdout.strip().splitlines()
    assert "nodes" not in kept.split() and "scaling" in kept.split()
    assert why.startswith("not training nodes: an emulated cluster creates")


@pytest.mark.slow
def test_a_run_beside_two_busy_processes_is_named_disturbed(tmp_path, in_env):
    """Busy processes slow what the nodes do outside their quotas (the kernel's work for the links, the launcher)
    and leave the nodes' own shares whole, so the run's record of the machine, not the nodes', must show them."""
    from ddp_core.launch.emulated import run_emulated
    from ddp_core.report.nodes import fidelity_table
    from ddp_core.analysis.results import EMULATED_OTHER_CORES, disturbed, load_study, machine_use, read_run

    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        two_nodes = plan(tmp_path, "nodes/busy", "emulated", nodes=2, link_rate="1gbit", cpus_per_node=0.25)
        run_emulated(two_nodes)
    finally:
        for process in busy:
            process.kill()
            process.wait()
    _, info = read_run(two_nodes.run_dir)
    assert machine_use(info)["other_cores"] > EMULATED_OTHER_CORES and disturbed(info)
    assert fidelity_table(load_study(tmp_path / "nodes"))["disturbed"].all()
    assert nothing_left(os.getpid())


# Half a CPU-second of work; the process prints the wall time it took, its own start-up left out (under the suite's
# load, starting Python takes longer than the work).
BUSY_HALF_A_SECOND = [
    sys.executable,
    "-c",
    "import time\nstart, wall = time.process_time(), time.perf_counter()\n"
    "while time.process_time() - start < 0.5: pass\nprint(time.perf_counter() - wall)",
]


def wall_time_on(cluster: EmulatedCluster) -> float:
    busy = cluster.start(0, BUSY_HALF_A_SECOND, stdout=subprocess.PIPE, text=True)
    out, _ = busy.communicate(timeout=60)
    assert busy.returncode == 0
    return float(out)


def test_a_node_at_a_quarter_core_computes_at_a_quarter_of_the_speed_and_says_it_was_throttled():
    """The kernel's statistics prove the quota, not a node without one: on a machine that other tests load, a
    node with no quota got 0.15 of a core, slower than the quota allows."""
    with EmulatedCluster(nodes=1, cpus_per_node=0.25) as quarter:
        before = wall_time_on(quarter)
        quarter.limit_cpu()
        constrained = wall_time_on(quarter)
        quarter.release_cpu()
        (node,) = quarter.cpu_use()["node_cpu"]
        released = wall_time_on(quarter)
    # a quarter core gives half a CPU-second in 2 s at the least (a period's slack aside); other load only slows it
    assert 0.8 * 0.5 / 0.25 < constrained < 8 * 0.5 / 0.25, constrained
    assert node["cpu_s"] == pytest.approx(0.5, abs=0.25)
    assert node["throttled_periods"] > 0.5 * node["periods"] > 0 and node["throttled_s"] > 0.5 * constrained
    assert max(before, released) < 0.8 * constrained  # the share holds while a run trains, not as it starts or ends
    assert nothing_left(os.getpid())


# A rank's process group on a node, after its first collective (as the trainer's after DDP's broadcast), waiting:
# gloo's threads exist from here on.
GLOO_PROCESS = [
    sys.executable,
    "-c",
    "import sys, torch, torch.distributed as dist\n"
    "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:29500', rank=0, world_size=1)\n"
    "dist.all_reduce(torch.ones(4))\nprint('ready', flush=True)\nsys.stdin.readline()",
]


def _wait_for_gloos_loop_to_name_itself(pid: int) -> None:
    """A thread names itself once it first runs: in a group of one, gloo's transport loop has served no collective and
    may not have run yet on a loaded machine (in a trainer's group it has served DDP's first broadcast)."""
    deadline = time.monotonic() + 30
    tasks = Path(f"/proc/{pid}/task")
    while not any((task / "comm").read_text().startswith("gloo_tcp_loop") for task in tasks.iterdir()):
        assert time.monotonic() < deadline, "gloo's transport loop never ran"
        time.sleep(0.05)


def test_a_nodes_gloo_threads_run_beside_its_quota_and_the_rest_under_it():
    """The quota is the node's compute; the all-reduce's sums and sends run beside it, as a GPU's collectives do,
    so that a bucket's all-reduce during backward neither waits for backward's quota nor takes from it."""
    with EmulatedCluster(nodes=1, cpus_per_node=0.25) as cluster:
        rank = cluster.start(0, GLOO_PROCESS, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert rank.stdout.readline() == "ready\n"
            _wait_for_gloos_loop_to_name_itself(rank.pid)
            cluster.limit_cpu()
            group = cluster.cpu[0].quota_dir.parent
            compute, communication = (
                {int(t) for t in (group / part / "tasks").read_text().split()} for part in ("compute", "communication")
            )
            names = {int(t.name): (t / "comm").read_text().strip() for t in Path(f"/proc/{rank.pid}/task").iterdir()}
        finally:
            rank.communicate("\n", timeout=60)
    gloo = {tid for tid, name in names.items() if "gloo" in name}
    assert gloo and gloo <= communication, (names, communication)
    assert set(names) - gloo <= compute and rank.pid in compute
    assert nothing_left(os.getpid())


def test_a_machine_without_a_cpu_controller_is_refused_in_one_line(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("proc /proc proc rw 0 0\ncgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n")
    with pytest.raises(CpuShareError, match="no cgroup CPU controller is mounted") as refused:
        find_controller(mounts)
    assert "\n" not in str(refused.value)


def test_on_cgroup_v2_a_node_writes_cpu_max_and_reads_cpu_stat(tmp_path):
    """This machine mounts cgroup v1; the v2 files, as the kernel documents them (cgroup-v2.rst: cpu.max
    "$MAX $PERIOD", cpu.stat usage_usec, nr_periods, nr_throttled, throttled_usec), laid out in a folder."""
    from ddp_core.launch.cpu_share import NodeCpu

    mounts, own = tmp_path / "mounts", tmp_path / "cgroup"
    root = tmp_path / "unified"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("")
    mounts.write_text(f"cgroup2 {root} cgroup2 rw,nosuid 0 0\n")
    own.write_text("0::/\n")
    controller = find_controller(mounts, own)
    assert (controller.version, controller.quota_root) == (2, root)
    assert (root / "cgroup.subtree_control").read_text() == "+cpu"
    node = NodeCpu(controller, "ddc000001a-n0", 0.25)
    node.create()
    group = root / node.name
    compute, communication = group / "compute", group / "communication"
    assert [(part / "cgroup.type").read_text() for part in (compute, communication)] == ["threaded", "threaded"]
    assert (group / "cgroup.subtree_control").read_text() == "+cpu"
    assert (compute / "cpu.max").read_text() == "max 10000"
    stat = "usage_usec {}\nuser_usec 0\nsystem_usec 0\nnr_periods {}\nnr_throttled {}\nthrottled_usec {}\n"
    (compute / "cpu.stat").write_text(stat.format(1_000_000, 10, 0, 0))
    (communication / "cpu.stat").write_text(stat.format(0, 0, 0, 0))
    node.limit()
    assert (compute / "cpu.max").read_text() == "2500 10000"
    (compute / "cpu.stat").write_text(stat.format(1_500_000, 210, 180, 1_200_000))
    (communication / "cpu.stat").write_text(stat.format(300_000, 0, 0, 0))
    assert node.stats() == {
        "cpu_s": 0.5,
        "periods": 200,
        "throttled_periods": 180,
        "throttled_s": 1.2,
        "communication_cpu_s": 0.3,
    }
    node.release()
    assert (compute / "cpu.max").read_text() == "max 10000"
