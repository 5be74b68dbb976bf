#!/usr/bin/env bash
# A single-node SLURM cluster for the tests, in seconds, in a folder of its own.
#   cluster.sh install     installs Debian's slurm-wlm and munge where they are missing (root; .ci/run)
#   cluster.sh start DIR   writes DIR/slurm.conf and a munge key, starts munged, slurmctld and
#                          slurmd on free ports with everything under DIR, waits until the node
#                          takes jobs, and prints the daemons' process ids (one line) to stop them by
# Clients then need SLURM_CONF=DIR/slurm.conf. Nothing outside DIR is touched once installed.
set -euo pipefail

install() {
    command -v sbatch >/dev/null && command -v slurmctld >/dev/null && command -v munged >/dev/null && return
    [ "$(id -u)" = 0 ] || { echo "slurm-wlm and munge are missing and installing them needs root" >&2; exit 1; }
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q slurm-wlm munge >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q slurm-wlm munge >/dev/null; }
}

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

start() {
    local dir host cpus ctld_port d_port
    dir=$(realpath "$1")
    mkdir -p "$dir"/{state,spool,munge}
    host=$(hostname -s)
    cpus=$(nproc)
    ctld_port=$(free_port)
    d_port=$(free_port)
    chmod 700 "$dir/munge"
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1 count=1024 status=none
    chmod 400 "$dir/munge/munge.key"
    cat >"$dir/slurm.conf" <<CONF
ClusterName=kvinject-test
SlurmctldHost=$host
SlurmUser=$(id -un)
SlurmdUser=$(id -un)
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MinJobAge=300
KillWait=30
NodeName=$host CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
    munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
        --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed"
    export SLURM_CONF="$dir/slurm.conf"
    slurmctld -i
    slurmd
    for _ in $(seq 100); do
        if sinfo -h -o %t 2>/dev/null | grep -qx idle; then
            echo "$(cat "$dir/munge/munged.pid") $(cat "$dir/slurmctld.pid") $(cat "$dir/slurmd.pid")"
            return
        fi
        sleep 0.1
    done
    echo "the node did not come up: see $dir/slurmctld.log and $dir/slurmd.log" >&2
    exit 1
}

case "${1:-}" in
    install) install ;;
    start)
        command -v slurmctld >/dev/null && command -v munged >/dev/null || { echo "SLURM is not installed: $0 install" >&2; exit 1; }
        start "${2:?start DIR}" ;;
    *) echo "usage: $0 install | start DIR" >&2; exit 2 ;;
esac
