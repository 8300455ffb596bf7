"""The multi-node path of the Slurm script: `sbatch --nodes 2 slurm/ddp_train.sbatch` on a real Slurm whose two
`slurmd` run in two nodes of an emulated cluster (network namespaces), training across them exactly what two ranks
train on one machine. Root only: the nodes are network namespaces, the daemons run as root."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import REPO, TWO_RANKS_ARGS, read_metrics
from ddp_core.launch.emulated import EmulatedCluster

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0, reason="needs root: the nodes are network namespaces and Slurm's daemons run as root"
    ),
]


def slurm_conf(folder, cluster: EmulatedCluster) -> str:
    """Two nodes with a core, a GPU declared as a generic resource (the ranks train on the CPU) and a third of this
    machine's memory each (the batch script asks for 4 GB a core); slurmctld on node0. Each slurmd keeps its own
    spool, PID file and log (%n)."""
    memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20 // 3
    nodes = "\n".join(
        f"NodeName=node{k} NodeAddr={cluster.address(k)} CPUs=1 RealMemory={memory_mb} Gres=gpu:1 State=UNKNOWN"
        for k in range(2)
    )
    (folder / "gres.conf").write_text("NodeName=node[0-1] Name=gpu File=/dev/tty0\n")  # a GPU each: no device
    return f"""ClusterName=ddp-emulated
SlurmctldHost=node0({cluster.address(0)})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={folder}/munge.socket
CredType=cred/munge
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool-%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
GresTypes=gpu
{nodes}
PartitionName=emulated Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def on_node(cluster: EmulatedCluster, k: int, command: str) -> list[str]:
    """`command` in node k's network namespace with its hostname and hosts file. Not `ip netns exec`: it mounts a
    new /sys, and slurmd needs the machine's cgroup mounts under /sys/fs/cgroup."""
    return [
        "nsenter",
        f"--net=/run/netns/{cluster.namespace(k)}",
        "unshare",
        "--mount",
        "--uts",
        "sh",
        "-c",
        f"mount --bind /etc/netns/{cluster.namespace(k)}/hosts /etc/hosts && hostname node{k} && {command}",
    ]


def wait_for(cluster: EmulatedCluster, env: dict, command: str, word: str, folder, seconds: float = 120) -> None:
    """Until `command` on node0 prints `word` on every line (the machine may be busy with other tests)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        lines = subprocess.run(on_node(cluster, 0, command), env=env, capture_output=True, text=True).stdout.split("\n")
        if all(word in line for line in lines if line.strip()) and any(line.strip() for line in lines):
            return
        time.sleep(0.5)
    logs = "\n".join(p.read_text()[-2000:] for p in folder.glob("*.log"))
    pytest.fail(f"{command} never said {word} within {seconds} s; the daemons' logs:\n{logs}")


@pytest.fixture(scope="module")
def slurm_installed():
    """Slurm's daemons, installed from Debian's packages where they are missing, as CI's machine has none."""
    installed = subprocess.run(
        [REPO / "slurm" / "local-cluster.sh", "install"], capture_output=True, text=True, timeout=900
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr


@pytest.fixture
def slurm_folder(slurm_installed):
    """A short path: slurmstepd's sockets live in the spool folder, and a Unix socket's path has 108 bytes at most
    (pytest's own folders are too deep under xdist)."""
    folder = Path(tempfile.mkdtemp(prefix="ddp-slurm-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_sbatch_on_two_emulated_nodes_trains_what_two_local_ranks_train(
    tmp_path, slurm_folder, isolated_env, two_local_ranks
):
    folder = slurm_folder
    for sub in ("state", "spool-node0", "spool-node1"):
        (folder / sub).mkdir(parents=True)
    env = dict(isolated_env, SLURM_CONF=str(folder / "slurm.conf"))
    with EmulatedCluster(nodes=2) as cluster:
        (folder / "slurm.conf").write_text(slurm_conf(folder, cluster))
        subprocess.run(
            ["munged", "--force", f"--socket={folder}/munge.socket", f"--pid-file={folder}/munged.pid"],
            check=True,
            env=env,
        )
        try:
            subprocess.run(on_node(cluster, 0, "slurmctld"), check=True, env=env)
            wait_for(cluster, env, "scontrol ping", "UP", folder)  # a slurmd that finds no controller waits minutes
            for k in range(2):
                subprocess.run(on_node(cluster, k, f"slurmd -N node{k}"), check=True, env=env)
            wait_for(cluster, env, "sinfo -h -o %T", "idle", folder)
            submit = (
                f"GLOO_SOCKET_IFNAME=eth0 DDP_PYTHON={sys.executable} sbatch --wait --gpus-per-node=1 "
                f"--nodes=2 --ntasks-per-node=1 --cpus-per-task=1 --output={tmp_path}/slurm-%j.out "
                f"--export=ALL {REPO}/slurm/ddp_train.sbatch {tmp_path}/two-nodes " + " ".join(TWO_RANKS_ARGS)
            )
            job = subprocess.run(on_node(cluster, 0, submit), env=env, capture_output=True, text=True, timeout=300)
            log = "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
            assert job.returncode == 0, job.stderr + log
        finally:
            os.kill(int((folder / "munged.pid").read_text()), signal.SIGTERM)

    assert "2 node(s) x 1 rank(s), GPUs a node: 1," in log  # a rank per GPU, as a GPU cluster's job has
    learning = ("train_loss", "val_loss", "val_accuracy")
    for nodes, local in zip(read_metrics(tmp_path / "two-nodes"), read_metrics(two_local_ranks), strict=True):
        for key in learning:
            assert float(nodes[key]) == pytest.approx(float(local[key]), abs=1e-6), key
