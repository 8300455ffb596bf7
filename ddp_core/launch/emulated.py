"""A cluster emulated on this machine: nodes as network namespaces on a bridge, each node's link capped at a rate.

DDP's communication then crosses a network whose bandwidth the report can turn.

    with EmulatedCluster(nodes=2, link_rate="100mbit") as cluster:
        leader, *others = cluster.launch(ranks_per_node=1, program=["-m", "ddp_core.train", ...], log_dir=out)

Each node is what a cluster node is to torchrun: its own network stack, hostname and hosts file. With `cpus_per_node`,
each node also gets a CPU share (`cpu_share.py`), so N nodes have N times the compute of one. The cluster is torn down
on every way out of its `with` block. A cluster whose owner was killed is swept by the next one.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ddp_core.engine.config import ERROR_PREFIX
from ddp_core.engine.run_files import save_atomic
from ddp_core.launch.cpu_share import PERIOD_US, CpuShareError, NodeCpu, find_controller, remove_group
from ddp_core.launch.local import stop_interrupted
from ddp_core.launch.plan import (
    NETWORK_FILE,
    ClusterError,
    ExperimentError,
    Plan,
    check_can_emulate,
    follow_trainer,
    rate_bits_per_s,
    refuse_interrupted,
    shell_command,
    stop_with_parent,
    trainer_args,
)

# Nodes are SUBNET.1, SUBNET.2, ... in RFC 2544's benchmarking range. The namespaces have no route beyond their subnet
# and the bridge has no address, so no packet leaves them.
SUBNET = "198.18.0"
NETNS_ETC = Path("/etc/netns")
PREFIX = "ddc"  # ddc<owner pid, 6 hex digits><sequence>: <=15 characters with the link suffixes (Linux's limit)
NAME = re.compile(rf"^{PREFIX}(?P<owner>[0-9a-f]{{6}})[0-9a-z](?:-n\d+|br|v\d+)$")
STOP_GRACE_S = 5  # after a node failed, the others' time to end by themselves before they are stopped
STOP_AT_CHECKPOINT_S = 120  # after Ctrl-C, the nodes' time to finish their step and write the checkpoint
MASTER_PORT = 29500  # every cluster has its own network stacks: two clusters never share this port
_sequence = itertools.count()
_failure_lock = threading.Lock()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise ClusterError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _remove_namespace(namespace: str) -> None:
    """Kill what still runs in `namespace`, then remove it and its hosts file."""
    for pid in _ip("netns", "pids", namespace, check=False).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    _ip("netns", "delete", namespace, check=False)
    shutil.rmtree(NETNS_ETC / namespace, ignore_errors=True)


def _cpu_controller():
    """The CPU controller when this machine has a writable one (a cluster without CPU shares needs none)."""
    try:
        return find_controller()
    except CpuShareError:
        return None


def leftovers(owner_alive=_alive) -> dict[str, list[str]]:
    """The namespaces, links, hosts-file folders and CPU groups of clusters whose owner process is gone."""

    def orphaned(name: str) -> bool:
        match = NAME.match(name)
        return bool(match) and not owner_alive(int(match["owner"], 16))

    namespaces = [line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines() if line.strip()]
    shown = _ip("-o", "link", "show", check=False).stdout.splitlines()
    links = [line.split(":")[1].strip().split("@")[0] for line in shown]
    folders = [p.name for p in NETNS_ETC.iterdir()] if NETNS_ETC.is_dir() else []
    controller = _cpu_controller()
    groups = controller.groups() if controller else []
    return {
        "namespaces": [n for n in namespaces if orphaned(n)],
        "links": [n for n in links if orphaned(n)],
        "hosts files": [n for n in folders if orphaned(n)],
        "cpu groups": [n for n in groups if orphaned(n)],
    }


def sweep_leftovers() -> None:
    """Remove what clusters of dead owners left: a kill -9 runs no teardown."""
    # the owner's process id is part of every name (PREFIX)
    left = leftovers()
    for namespace in set(left["namespaces"]) | set(left["hosts files"]):
        _remove_namespace(namespace)
    for link in left["links"]:
        _ip("link", "delete", link, check=False)
    if left["cpu groups"]:
        controller = find_controller()
        for group in left["cpu groups"]:
            remove_group(controller, group)


def _burst_bytes(bits_per_s: float) -> int:
    """The token bucket's depth: 2 ms at the rate, and at least 64 KiB, one segment as veth hands it over (GSO)."""
    return max(64 * 1024, int(bits_per_s / 8 * 0.002))


class EmulatedCluster:
    """`nodes` network namespaces on one bridge, each sending at most `link_rate` and computing on `cpus_per_node`
    cores. A None rate is unshaped, and None cores are the machine's, shared."""

    def __init__(
        self,
        nodes: int,
        link_rate: str | None = None,
        cpus_per_node: float | None = None,
        cpu_period_us: int = PERIOD_US,
    ):
        check_can_emulate(nodes, link_rate, cpus_per_node)
        self.nodes, self.link_rate, self.cpus_per_node = nodes, link_rate, cpus_per_node
        self.base = f"{PREFIX}{os.getpid():06x}{next(_sequence) % 36:x}"
        self.bridge = f"{self.base}br"
        controller = find_controller() if cpus_per_node is not None else None
        self.cpu = (
            [NodeCpu(controller, self.namespace(k), cpus_per_node, cpu_period_us) for k in range(nodes)]
            if controller
            else []
        )
        self.limited_at = self.limited_s = None

    def namespace(self, k: int) -> str:
        return f"{self.base}-n{k}"

    @staticmethod
    def address(k: int) -> str:
        return f"{SUBNET}.{k + 1}"

    def __enter__(self) -> EmulatedCluster:
        sweep_leftovers()
        try:
            self._create()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def _create(self) -> None:
        # `ip netns exec` mounts /etc/netns/<namespace>/hosts over /etc/hosts: every node knows the others by name.
        hosts = "127.0.0.1 localhost\n" + "".join(f"{self.address(k)} node{k}\n" for k in range(self.nodes))
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")
        for node_cpu in self.cpu:
            node_cpu.create()
        # eth0 in the node's namespace, its veth peer on the bridge: a switch that never limits
        for k in range(self.nodes):
            namespace, veth = self.namespace(k), f"{self.base}v{k}"
            (NETNS_ETC / namespace).mkdir(parents=True, exist_ok=True)
            (NETNS_ETC / namespace / "hosts").write_text(hosts)
            _ip("netns", "add", namespace)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", namespace)
            _ip("link", "set", veth, "master", self.bridge, "up")
            _ip("-n", namespace, "addr", "add", f"{self.address(k)}/24", "dev", "eth0")
            _ip("-n", namespace, "link", "set", "eth0", "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
            # A token bucket on what each node sends. In a ring all-reduce it receives as much from its neighbour: a
            # full-duplex link of that rate. No netem in this machine's kernel: the latency is the veth pair's.
            if self.link_rate is not None:
                rate = rate_bits_per_s(self.link_rate)
                shaped = subprocess.run(
                    [
                        "tc",
                        "-n",
                        namespace,
                        "qdisc",
                        "replace",
                        "dev",
                        "eth0",
                        "root",
                        "tbf",
                        "rate",
                        f"{int(rate)}bit",
                        "burst",
                        str(_burst_bytes(rate)),
                        "latency",
                        "50ms",
                    ],
                    capture_output=True,
                    text=True,
                )
                if shaped.returncode != 0:
                    raise ClusterError(f"tc could not shape the link to {self.link_rate}: {shaped.stderr.strip()}")

    def teardown(self) -> None:
        # processes still in the namespaces are killed, then the namespaces, links, hosts files and CPU groups removed
        for k in range(self.nodes):
            _remove_namespace(self.namespace(k))
            _ip("link", "delete", f"{self.base}v{k}", check=False)
        _ip("link", "delete", self.bridge, check=False)
        for node_cpu in self.cpu:
            node_cpu.remove()

    def limit_cpu(self) -> None:
        """Every node at its CPU share from now on (a cluster without shares: nothing)."""
        self.limited_at = time.perf_counter()
        for node_cpu in self.cpu:
            node_cpu.limit()

    def release_cpu(self) -> None:
        """Every node unconstrained again, its use of the share kept for `cpu_use`."""
        self.limited_s = time.perf_counter() - self.limited_at
        for node_cpu in self.cpu:
            node_cpu.release()

    def sent_bytes(self) -> list[int]:
        """Per node, the bytes its eth0 has sent so far, every protocol's headers included."""
        sent = []
        for k in range(self.nodes):
            stats = json.loads(_ip("-n", self.namespace(k), "-s", "-j", "link", "show", "eth0").stdout)
            sent.append(int(stats[0]["stats64"]["tx"]["bytes"]))
        return sent

    def cpu_use(self) -> dict:
        """From `limit_cpu` to `release_cpu`: the seconds, and per node its CPU use and throttling."""
        return {"limited_wall_s": self.limited_s, "node_cpu": [node_cpu.stats() for node_cpu in self.cpu]}

    def command(self, k: int, argv: list[str]) -> list[str]:
        """`argv` run on node k: in its namespace, with its hostname, and gloo on its link."""
        # the hostname node<k> is set in a UTS namespace of the node's own
        return [
            "ip",
            "netns",
            "exec",
            self.namespace(k),
            "unshare",
            "--uts",
            "sh",
            "-c",
            'hostname "$0" && exec "$@"',
            f"node{k}",
            "env",
            "GLOO_SOCKET_IFNAME=eth0",
            *argv,
        ]

    def cores(self, k: int) -> set[int]:
        """The cores node k runs on: the usable cores split evenly among the nodes (shared when there are fewer)."""
        usable = sorted(os.sched_getaffinity(0))
        if len(usable) < self.nodes:
            return {usable[k % len(usable)]}
        share = len(usable) // self.nodes
        return set(usable[k * share : (k + 1) * share])

    def start(self, k: int, argv: list[str], **popen) -> subprocess.Popen:
        """`argv` started on node k, on its cores and in its CPU group. It receives SIGTERM if this process dies."""
        cores = self.cores(k)

        def placed():
            os.sched_setaffinity(0, cores)
            if self.cpu:
                self.cpu[k].enter()
            stop_with_parent()

        return subprocess.Popen(self.command(k, argv), preexec_fn=placed, **popen)

    def torchrun(self, k: int, ranks_per_node: int, program: list[str], max_restarts: int = 0) -> list[str]:
        """The torchrun agent of node k: static rendezvous at node0, ranks k*M ... k*M+M-1 on this node."""
        restarts = [f"--max-restarts={max_restarts}"] if max_restarts else []
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={self.nodes}",
            f"--nproc-per-node={ranks_per_node}",
            f"--node-rank={k}",
            "--master-addr=node0",
            f"--master-port={MASTER_PORT}",
            *restarts,
            *program,
        ]

    def rank(self, k: int, program: list[str]) -> list[str]:
        """Node k's one rank, started without a torchrun agent but in the environment torchrun gives a rank. A node of
        one rank that never restarts needs no agent."""
        # an agent is one more interpreter importing torch on every node: a third of an 8-node run's start-up on 2 cores
        return [
            "env",
            f"RANK={k}",
            "LOCAL_RANK=0",
            f"WORLD_SIZE={self.nodes}",
            "LOCAL_WORLD_SIZE=1",
            "MASTER_ADDR=node0",
            f"MASTER_PORT={MASTER_PORT}",
            sys.executable,
            *program,
        ]

    def node_command(self, k: int, ranks_per_node: int, program: list[str], max_restarts: int = 0) -> list[str]:
        """What node k runs: its rank itself where it has one and no restarts, else a torchrun agent."""
        if ranks_per_node == 1 and not max_restarts:
            return self.rank(k, program)
        return self.torchrun(k, ranks_per_node, program, max_restarts)

    def launch(
        self, ranks_per_node: int, program: list[str], log_dir: Path, max_restarts: int = 0
    ) -> list[subprocess.Popen]:
        """Start `program` on every node: node 0's output comes on its stdout, node k's goes to log_dir/node<k>.log.
        As under torchrun, a node that fails ends the job, so that none waits in a collective for a lost peer."""
        others = []
        for k in range(1, self.nodes):
            with open(log_dir / f"node{k}.log", "w") as log:
                others.append(
                    self.start(
                        k,
                        self.node_command(k, ranks_per_node, program, max_restarts),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        leader = self.start(
            0,
            self.node_command(0, ranks_per_node, program, max_restarts),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        started = [leader, *others]
        self.first_failed = None
        for k, proc in enumerate(started):  # a watch per node; the cluster's teardown kills whichever still runs
            threading.Thread(target=self._stop_all_if_failed, args=(k, started), daemon=True).start()
        return started

    def _stop_all_if_failed(self, k: int, started: list[subprocess.Popen]) -> None:
        """Node k's watch: when it fails, record it as the first unless one failed before, then stop the others."""
        if started[k].wait() != 0:
            with _failure_lock:
                if self.first_failed is None:
                    self.first_failed = k
            # the others get STOP_GRACE_S to end by themselves: a bad setting fails every rank, and only rank 0 says why
            deadline = time.monotonic() + STOP_GRACE_S
            for other in started:
                try:
                    other.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    other.terminate()

    def wait(self, others: list[subprocess.Popen], log_dir: Path) -> None:
        """Wait for nodes 1, 2, ... after node 0 has finished. A failure names the node that failed first, with the
        trainer's refusal where it refused."""
        codes = [proc.wait() for proc in others]
        failed = [k for k, code in enumerate(codes, 1) if code != 0]
        if failed:
            k = self.first_failed or failed[0]  # not one that was stopped because another failed
            log = log_dir / f"node{k}.log"
            refusals = [line for line in log.read_text(errors="replace").splitlines() if line.startswith(ERROR_PREFIX)]
            raise ClusterError(
                f"node {k}: {refusals[-1]}"
                if refusals
                else f"node {k} exited with code {codes[k - 1]}; its output: {log}"
            )

    def measure_link_gbit_s(self) -> float:
        """Gbit/s of TCP payload that node 1 sends to node 0, over about half a second at the set rate."""
        if self.nodes < 2:
            raise ClusterError("measuring a link needs 2 nodes")
        size = int(max(1e6, (rate_bits_per_s(self.link_rate) or 10e9) / 8 / 2))
        probe = [sys.executable, "-m", "ddp_core.launch.link_probe"]
        started = []
        try:
            started.append(self.start(0, [*probe, "receive", self.address(0)], stdout=subprocess.PIPE, text=True))
            started.append(
                self.start(
                    1,
                    [*probe, "send", self.address(0), str(size)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
            receiver, sender = started
            _, error = sender.communicate(timeout=120)
            out, _ = receiver.communicate(timeout=30)
        finally:
            for proc in started:
                if proc.poll() is None:
                    proc.kill()
        if sender.returncode != 0 or receiver.returncode != 0:
            raise ClusterError(f"the link probe failed: {error.strip()}")
        return float(out.split()[0])


def run_emulated(plan: Plan) -> bool:
    """Train across an emulated cluster of `placement.nodes` nodes at its `link_rate`, the ranks split evenly.
    Node 0's epoch lines are echoed, and network.json records the cluster beside the run."""
    if plan.action == "reuse":
        print(f"{plan.run_dir} already holds this finished run: reusing it, not retraining")
        return True
    refuse_interrupted(plan)
    where, ranks_per_node = plan.placement, plan.ranks_per_node
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    with EmulatedCluster(where.nodes, where.link_rate, where.cpus_per_node) as cluster:
        # network.json, before training: the nodes, the rate the link was set to and measured at, each node's share
        measured = cluster.measure_link_gbit_s() if where.nodes > 1 else None
        rate = rate_bits_per_s(where.link_rate)
        network = {
            "nodes": where.nodes,
            "ranks_per_node": ranks_per_node,
            "link_rate": where.link_rate,
            "link_rate_gbit_s": rate / 1e9 if rate else None,
            "measured_gbit_s": measured,
            "addresses": [cluster.address(k) for k in range(where.nodes)],
            "cpus_per_node": where.cpus_per_node,
            "cpu_period_ms": PERIOD_US / 1000,
        }
        save_atomic(network, plan.run_dir / NETWORK_FILE)
        share = f", {where.cpus_per_node:g} core(s) each" if where.cpus_per_node else ""
        link = f"{where.link_rate or 'unshaped'}" + (f", measured {measured:.3f} Gbit/s" if measured else "")
        print(f"emulated cluster: {where.nodes} node(s) x {ranks_per_node} rank(s){share}, link {link}", flush=True)
        program = ["-m", "ddp_core.train", *trainer_args(plan)]
        command = cluster.node_command(0, ranks_per_node, program, where.max_restarts)
        shown = (
            ["torchrun", *command[3:]]
            if command[1:3] == ["-m", "torch.distributed.run"]
            else [word for word in command if word != "env"]
        )
        print(shell_command([word.replace(sys.executable, "python") for word in shown]), flush=True)
        sent_before = cluster.sent_bytes()
        leader, *others = cluster.launch(ranks_per_node, program, plan.run_dir, where.max_restarts)
        try:
            follow_trainer(leader, on_start=cluster.limit_cpu, on_finish=cluster.release_cpu)
        except KeyboardInterrupt:  # every node stops at the same step with a checkpoint before the cluster goes
            for node in others:
                node.send_signal(signal.SIGINT)
            for node in others:
                node.wait(timeout=STOP_AT_CHECKPOINT_S)
            stop_interrupted(leader)
        except ExperimentError:
            if leader.wait() == -signal.SIGTERM and cluster.first_failed:  # node 0 was stopped for another that failed
                cluster.wait(others, plan.run_dir)
            raise
        cluster.wait(others, plan.run_dir)  # each other node's output is in node<k>.log in the run directory
        # after training: the bytes each link sent, start-up and evaluations included, and each node's CPU use
        network["sent_bytes"] = [after - before for before, after in zip(sent_before, cluster.sent_bytes())]
        if cluster.cpu and cluster.limited_s is not None:
            network |= cluster.cpu_use()
        save_atomic(network, plan.run_dir / NETWORK_FILE)
    return True
