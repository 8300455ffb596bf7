#!/usr/bin/env bash
# A real single-node Slurm on this machine, for the tests and CI: munged + slurmctld + slurmd, no systemd.
#
#   slurm/local-cluster.sh start    # installs the Debian packages when missing (needs root), starts the daemons
#   slurm/local-cluster.sh install  # only installs the Debian packages when missing (needs root)
#   slurm/local-cluster.sh stop     # stops them by their PID files
#   slurm/local-cluster.sh env      # prints the variables a client needs: eval "$(slurm/local-cluster.sh env)"
#
# Everything (config, state, spool, logs, PID files, munge socket) lives under $DDP_SLURM_DIR
# (default /tmp/ddp-slurm); nothing outside it is changed except the installed packages.
set -euo pipefail

dir=${DDP_SLURM_DIR:-/tmp/ddp-slurm}
node=$(hostname -s)
gpus=${DDP_SLURM_GPUS:-4}  # GPUs the node declares to Slurm as generic resources (no device behind them)
packages=(slurmctld slurmd slurm-client munge)

print_env() {
    echo "export SLURM_CONF=$dir/slurm.conf"
}

install_packages() {
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
        && command -v munged >/dev/null && return
    if [ "$(id -u)" -ne 0 ]; then
        echo "local-cluster: Slurm is not installed and installing it needs root: apt-get install ${packages[*]}" >&2
        exit 1
    fi
    # Wait for another install to end (a test may be installing TeX) rather than fail on dpkg's lock.
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
}

write_config() {
    mkdir -p "$dir"/{state,spool,log,run,munge}
    cat >"$dir/slurm.conf" <<EOF
ClusterName=ddp-local
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldPort=${DDP_SLURMCTLD_PORT:-6817}
SlurmdPort=${DDP_SLURMD_PORT:-6818}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/log/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
EnforcePartLimits=ALL
MinJobAge=10
ReturnToService=2
MpiDefault=none
GresTypes=gpu
NodeName=$node NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo) Gres=gpu:$gpus State=UNKNOWN
PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    # GPUs as a GPU node declares them: jobs that ask for them are placed and told which they got (SLURM_GPUS_ON_NODE,
    # CUDA_VISIBLE_DEVICES), and train on the CPU. gres/gpu counts a GPU by its device file; a terminal's stands in.
    echo "NodeName=$node Name=gpu File=/dev/tty[0-$((gpus - 1))]" >"$dir/gres.conf"
}

wait_until() {  # wait_until SECONDS COMMAND...: retry COMMAND until it succeeds
    local deadline=$((SECONDS + $1)); shift
    until "$@" >/dev/null 2>&1; do
        if [ $SECONDS -ge $deadline ]; then return 1; fi
        sleep 0.2
    done
}

start() {
    install_packages
    stop quietly
    write_config
    export SLURM_CONF=$dir/slurm.conf
    munged --force --socket="$dir/munge/munge.socket" --pid-file="$dir/run/munged.pid" \
        --log-file="$dir/log/munged.log" --seed-file="$dir/munge/munge.seed" --key-file=/etc/munge/munge.key
    slurmctld
    slurmd
    if ! wait_until 30 bash -c "sinfo -h -o %T | grep -qx idle"; then
        echo "local-cluster: the node did not come up; logs in $dir/log" >&2
        tail -n 5 "$dir"/log/slurm*.log >&2 || true
        stop quietly  # a start that failed leaves no daemon holding the ports
        exit 1
    fi
    echo "local-cluster: up ($node, $(nproc) CPUs); $(print_env)"
}

stop() {
    local pidfile pid
    for pidfile in "$dir"/run/slurmd.pid "$dir"/run/slurmctld.pid "$dir"/run/munged.pid; do
        [ -f "$pidfile" ] || continue
        pid=$(cat "$pidfile")
        if kill "$pid" 2>/dev/null; then
            wait_until 10 bash -c "! kill -0 $pid" || kill -9 "$pid" 2>/dev/null || true
        fi
        rm -f "$pidfile"
    done
    [ "${1:-}" = quietly ] || echo "local-cluster: stopped"
}

case "${1:-}" in
    start) start ;;
    install) install_packages ;;
    stop) stop ;;
    env) print_env ;;
    *) echo "usage: $0 start|install|stop|env" >&2; exit 2 ;;
esac
