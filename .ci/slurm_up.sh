#!/usr/bin/env bash
# A one-machine SLURM (munge + slurmctld + slurmd) for tests/e2e/test_slurm.py.
#
# Installs Debian's slurm-wlm and munge if missing, writes a slurm.conf for this host with
# SLURM_CPUS task slots (default 8, more than the cores: tasks oversubscribe them), starts
# the daemons that are not running and waits until `sinfo` shows the node idle. Safe to run
# twice. Needs root (or sudo). No cgroups: process tracking by /proc, no task plugin.
set -euo pipefail

CPUS="${SLURM_CPUS:-8}"
WAIT_SECONDS="${SLURM_WAIT_SECONDS:-60}"
CONF=/etc/slurm/slurm.conf
LOGS=/var/log/slurm
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi

log() { echo "slurm_up: $*"; }

install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
            && command -v srun >/dev/null && command -v munged >/dev/null; then
        return
    fi
    log "installing slurm-wlm and munge"
    export DEBIAN_FRONTEND=noninteractive
    local apt=($SUDO apt-get install -y -q --no-install-recommends slurm-wlm munge)
    "${apt[@]}" >/dev/null || { $SUDO apt-get update -q >/dev/null && "${apt[@]}" >/dev/null; }
}

write_conf() {
    local host="$1" tmp
    tmp="$(mktemp)"
    cat >"$tmp" <<CONF
# Written by .ci/slurm_up.sh: one node, $CPUS task slots, no cgroups.
ClusterName=tfdist
SlurmctldHost=$host(127.0.0.1)
AuthType=auth/munge
SlurmUser=root
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmdSpoolDir=/var/spool/slurmd
StateSaveLocation=/var/spool/slurmctld
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
NodeName=$host NodeAddr=127.0.0.1 CPUs=$CPUS State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
    $SUDO mkdir -p /etc/slurm "$LOGS" /var/spool/slurmd /var/spool/slurmctld
    if ! cmp -s "$tmp" "$CONF" 2>/dev/null; then
        $SUDO cp "$tmp" "$CONF"
        CONF_CHANGED=1
    fi
    rm -f "$tmp"
}

running() { pgrep -x "$1" >/dev/null; }

start_munge() {
    if ! running munged; then
        log "starting munged"
        $SUDO install -d -o munge -g munge -m 0755 /run/munge
        [ -s /etc/munge/munge.key ] || $SUDO runuser -u munge -- mungekey --create
        $SUDO runuser -u munge -- /usr/sbin/munged
    fi
    for _ in $(seq 20); do
        munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    log "munged does not answer; its log:"
    tail -n 20 /var/log/munge/munged.log 2>/dev/null || true
    return 1
}

resolvable_host() {
    # TF tasks reach each other by SLURM's node name: it must resolve.
    local host="$1"
    if ! getent hosts "$host" >/dev/null; then
        log "adding $host to /etc/hosts (127.0.1.1): TF tasks address each other by node name"
        echo "127.0.1.1 $host" | $SUDO tee -a /etc/hosts >/dev/null
    fi
}

start_slurm() {
    if [ "${CONF_CHANGED:-0}" = 1 ] && { running slurmctld || running slurmd; }; then
        log "slurm.conf changed: restarting slurmctld and slurmd"
        $SUDO scontrol shutdown >/dev/null 2>&1 || true
        for _ in $(seq 30); do
            running slurmctld || running slurmd || break
            sleep 1
        done
    fi
    running slurmctld || { log "starting slurmctld"; $SUDO slurmctld; }
    running slurmd || { log "starting slurmd"; $SUDO slurmd; }
}

wait_idle() {
    local host="$1" state=""
    for _ in $(seq "$WAIT_SECONDS"); do
        state="$(sinfo -h -n "$host" -o %T 2>/dev/null || true)"
        case "$state" in
            *\*) ;;  # a trailing * : slurmctld does not hear from slurmd yet
            idle*|mixed*|allocated*) log "node $host is $state"; return 0 ;;
            down*|drain*) $SUDO scontrol update nodename="$host" state=resume 2>/dev/null || true ;;
        esac
        sleep 1
    done
    log "node $host not idle after ${WAIT_SECONDS}s (state: '${state:-none}'); logs:"
    sinfo -N -l || true
    tail -n 40 "$LOGS/slurmctld.log" "$LOGS/slurmd.log" 2>/dev/null || true
    return 1
}

main() {
    local host
    host="$(hostname -s)"
    install_packages
    resolvable_host "$host"
    write_conf "$host"
    start_munge
    start_slurm
    wait_idle "$host"
}

main "$@"
