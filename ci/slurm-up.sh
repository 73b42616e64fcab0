#!/usr/bin/env bash
# Start a one-node Slurm cluster on this machine for the tests marked "slurm".
#
# Installs Debian's slurm-wlm and munge, writes a slurm.conf for this host, starts
# munged, slurmctld and slurmd as root and waits until sinfo shows the node idle.
# Safe to run twice: a running daemon is left alone (jobs an earlier run left on it are
# cancelled), a config that is already in place is rewritten with the same content.
set -euo pipefail

CPUS="${PMC_SLURM_CPUS:-8}"          # declared CPUs; more than the cores so multi-rank jobs fit
CONF_DIR=/etc/slurm
HOST="$(hostname -s)"

log() { printf 'slurm-up: %s\n' "$*" >&2; }

. "$(dirname "$0")/slurm-lib.sh"
slurm_install
munge_up

install -d -m 0755 "$CONF_DIR" /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/slurm
conf="$(mktemp)"
cat >"$conf" <<CONF
# One-node test cluster written by ci/slurm-up.sh.
ClusterName=pmc-ci
SlurmctldHost=${HOST}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
# No cgroups in a container: track processes by their parent chain.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
# Finished jobs stay visible to "scontrol show job" (there is no slurmdbd for sacct).
MinJobAge=600
KillWait=10
# Let the node declare more CPUs than it has cores.
SlurmdParameters=config_overrides
NodeName=${HOST} NodeAddr=127.0.0.1 CPUs=${CPUS} State=UNKNOWN
PartitionName=debug Nodes=${HOST} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
if ! cmp -s "$conf" "$CONF_DIR/slurm.conf"; then
    log "writing $CONF_DIR/slurm.conf"
    install -m 0644 "$conf" "$CONF_DIR/slurm.conf"
    changed=1
else
    changed=0
fi
rm -f "$conf"

running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

if running /run/slurm/slurmctld.pid; then
    [ "$changed" = 1 ] && scontrol reconfigure
else
    log "starting slurmctld"
    /usr/sbin/slurmctld
fi
if ! running /run/slurm/slurmd.pid; then
    log "starting slurmd"
    /usr/sbin/slurmd
fi

# Jobs an earlier run left on this test cluster (stopped midway: its processes may be
# gone while the job still holds the node) would make the tests' jobs wait for ever.
left=""
for _ in $(seq 30); do  # a slurmctld just started may not answer yet
    if left="$(squeue -h -o %i 2>/dev/null)"; then break; fi
    sleep 1
done
if [ -n "$left" ]; then
    log "cancelling jobs left by an earlier run: $(echo $left)"
    # shellcheck disable=SC2086 # one job id per word
    scancel $left || true
fi

log "waiting for node ${HOST} to be idle"
for _ in $(seq 120); do
    state="$(sinfo -h -n "$HOST" -o %T 2>/dev/null || true)"
    case "$state" in
        idle|mixed|allocated) log "node ${HOST} is ${state}"; exit 0 ;;
        down*|drain*|fail*)
            scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true ;;
    esac
    sleep 1
done
log "node ${HOST} did not become idle (state: ${state:-unknown})"
tail -n 20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log >&2 || true
exit 1
