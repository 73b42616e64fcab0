#!/usr/bin/env bash
# Start a test cluster on this machine: a head host running slurmctld and
# ${PMC_CLUSTER_NODES:-3} nodes (node1..) each running its own slurmd, every host with
# its own hostname and network address (Linux namespaces, see ci/cluster-lib.sh),
# sharing this machine's file system as a cluster's shared file system, with munge.
# Needs root. It lives beside the one-node Slurm of ci/slurm-up.sh: its own
# configuration (/etc/pmc-cluster/slurm.conf, named by SLURM_CONF), ports, state and logs.
#
# Safe to run twice: hosts and daemons already up are left alone, jobs left on the
# cluster are cancelled, nodes left down are resumed. Ends when `sinfo -N` (run on the
# head: bash ci/cluster-run.sh sinfo -N) lists every node idle.
set -euo pipefail
cd "$(dirname "$0")"
. ./cluster-lib.sh

command -v nsenter >/dev/null && command -v unshare >/dev/null \
    || { pmcc_log "needs nsenter and unshare (util-linux)"; exit 1; }
. ./slurm-lib.sh
slurm_install
munge_up  # shared by every host (its socket is on the shared file system)

install -d -m 0755 "$PMCC_CONF_DIR" "$PMCC_RUN" "$PMCC_SPOOL/ctld" "$PMCC_LOG"
for node in $(pmcc_nodes); do install -d -m 0755 "$PMCC_SPOOL/$node"; done

# The cluster's /etc/hosts (bound over /etc/hosts inside each host's namespaces only).
hosts="$(mktemp)"
{
    echo "127.0.0.1 localhost"
    echo "$(pmcc_addr "$PMCC_HEAD") $PMCC_HEAD"
    for node in $(pmcc_nodes); do echo "$(pmcc_addr "$node") $node"; done
} >"$hosts"
install -m 0644 "$hosts" "$PMCC_CONF_DIR/hosts"
rm -f "$hosts"

# Job ids of their own: MPICH names a job's shared memory segment after its job step
# (mpich_shm_HASH_N in /dev/shm), and a segment left by a killed job made a later job
# with the same id (after cluster-down.sh, or of the one-node Slurm) fail in MPI_Init
# ("MPIDI_POSIX_comm_bootstrap: Out of memory"). Each cluster starts its ids from the
# time it was made, far above the one-node Slurm's, past any an earlier cluster used
# (fewer than one job every 4 s).
[ -s "$PMCC_CONF_DIR/first-job-id" ] \
    || echo "$(( ($(date +%s) / 4) % 50000000 + 1000000 ))" >"$PMCC_CONF_DIR/first-job-id"

conf="$(mktemp)"
cat >"$conf" <<CONF
# The multi-node test cluster written by ci/cluster-up.sh.
ClusterName=pmc-cluster
FirstJobId=$(cat "$PMCC_CONF_DIR/first-job-id")
SlurmctldHost=${PMCC_HEAD}($(pmcc_addr "$PMCC_HEAD"))
SlurmctldPort=6917
SlurmdPort=6918
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$PMCC_SPOOL/ctld
SlurmdSpoolDir=$PMCC_SPOOL/%n
SlurmctldPidFile=$PMCC_RUN/slurmctld.pid
SlurmdPidFile=$PMCC_RUN/slurmd-%n.pid
SlurmctldLogFile=$PMCC_LOG/slurmctld.log
SlurmdLogFile=$PMCC_LOG/slurmd-%n.log
# No cgroups for Slurm here: processes are tracked by their parent chain (a node's
# freezer cgroup is the cluster scripts' own).
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
# A node that does not answer is down after 10 s (tests kill and freeze nodes).
SlurmdTimeout=10
MinJobAge=600
KillWait=5
SlurmdParameters=config_overrides
# Each node's memory is its memory cgroup's limit. Its CPUs are slots, more than the
# cpus it shares with the other nodes: the tests' jobs put up to 6 ranks on one node.
$(for node in $(pmcc_nodes); do
    echo "NodeName=$node NodeAddr=$(pmcc_addr "$node") CPUs=${PMCC_CPUS} RealMemory=$(pmcc_node_memory_mb "$node") State=UNKNOWN"
done)
PartitionName=cluster Nodes=node[1-${PMCC_NODES}] Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
if ! cmp -s "$conf" "$PMCC_CONF"; then
    pmcc_log "writing $PMCC_CONF"
    install -m 0644 "$conf" "$PMCC_CONF"
    changed=1
else
    changed=0
fi
rm -f "$conf"

# The network: a bridge in the head's namespace, a veth pair from it to each node.
ensure_netns() {
    ip netns list | grep -qw "pmcc-$1" || ip netns add "pmcc-$1"
    ip -n "pmcc-$1" link set lo up
}
ensure_netns "$PMCC_HEAD"
if ! ip -n "pmcc-$PMCC_HEAD" link show br0 >/dev/null 2>&1; then
    ip -n "pmcc-$PMCC_HEAD" link add br0 type bridge
    ip -n "pmcc-$PMCC_HEAD" addr add "$(pmcc_addr "$PMCC_HEAD")/24" dev br0
fi
ip -n "pmcc-$PMCC_HEAD" link set br0 up
install -d -m 0755 "$PMCC_FREEZER"
for node in $(pmcc_nodes); do
    ensure_netns "$node"
    install -d -m 0755 "$PMCC_FREEZER/$node"
    if ! ip -n "pmcc-$node" link show eth0 >/dev/null 2>&1; then
        # Made in the head's namespace, one end then moved: nothing in this machine's own.
        ip -n "pmcc-$PMCC_HEAD" link add "v-$node" type veth peer name eth0 \
            netns "pmcc-$node"
        ip -n "pmcc-$PMCC_HEAD" link set "v-$node" master br0
        ip -n "pmcc-$node" addr add "$(pmcc_addr "$node")/24" dev eth0
    fi
    ip -n "pmcc-$PMCC_HEAD" link set "v-$node" up
    ip -n "pmcc-$node" link set eth0 up
done

for host in "$PMCC_HEAD" $(pmcc_nodes); do pmcc_start_holder "$host"; done

# Each node's own memory: a memory cgroup with a limit, made under the one its holder
# started in (so whatever limits that one holds still hold); every process of the node
# (its freezer cgroup's) is moved into it.
for node in $(pmcc_nodes); do
    mem="$(pmcc_holder_memcg "$(pmcc_holder "$node")")"
    case "$mem" in
        */pmc-cluster/"$node") ;;
        *) mem="${mem%/}/pmc-cluster/$node" ;;
    esac
    install -d -m 0755 "$mem"
    echo "$(($(pmcc_node_memory_mb "$node") * 1024 * 1024))" >"$mem/memory.limit_in_bytes"
    echo "$mem" >"$PMCC_RUN/$node.memcg"
    for pid in $(cat "$PMCC_FREEZER/$node/cgroup.procs"); do
        echo "$pid" >"$mem/cgroup.procs" 2>/dev/null || true  # (a process just gone)
    done
done

stop_daemon() {  # a daemon started with an earlier configuration
    local pidfile="$1"
    pmcc_running "$pidfile" || return 0
    kill "$(cat "$pidfile")"
    for _ in $(seq 100); do pmcc_running "$pidfile" || return 0; sleep 0.1; done
    kill -KILL "$(cat "$pidfile")" 2>/dev/null || true
}
if [ "$changed" = 1 ]; then
    # Nodes' cpus and the like take a restart of the daemons, not a reconfigure.
    stop_daemon "$PMCC_RUN/slurmctld.pid"
    for node in $(pmcc_nodes); do stop_daemon "$PMCC_RUN/slurmd-$node.pid"; done
fi
if ! pmcc_running "$PMCC_RUN/slurmctld.pid"; then
    pmcc_log "starting slurmctld on $PMCC_HEAD"
    pmcc_exec "$PMCC_HEAD" /usr/sbin/slurmctld -f "$PMCC_CONF"
fi
for node in $(pmcc_nodes); do
    [ "$(cat "$PMCC_FREEZER/$node/freezer.state")" = THAWED ] \
        || echo THAWED >"$PMCC_FREEZER/$node/freezer.state"
    pmcc_running "$PMCC_RUN/slurmd-$node.pid" || pmcc_log "starting slurmd on $node"
    pmcc_start_slurmd "$node"
done

left=""
for _ in $(seq 30); do  # a slurmctld just started may not answer yet
    if left="$(pmcc_exec "$PMCC_HEAD" squeue -h -o %i 2>/dev/null)"; then break; fi
    sleep 1
done
if [ -n "$left" ]; then
    pmcc_log "cancelling jobs left by an earlier run: $(echo $left)"
    # shellcheck disable=SC2086 # one job id per word
    pmcc_exec "$PMCC_HEAD" scancel $left || true
fi

pmcc_log "waiting for ${PMCC_NODES} nodes to be idle"
for _ in $(seq 120); do
    states="$(pmcc_exec "$PMCC_HEAD" sinfo -h -N -o '%N %T' 2>/dev/null || true)"
    idle="$(awk '$2 == "idle" || $2 == "mixed" || $2 == "allocated"' <<<"$states" | wc -l)"
    if [ "$idle" -ge "$PMCC_NODES" ]; then
        pmcc_log "up: $(echo $states)"
        exit 0
    fi
    down="$(awk '$2 ~ /^(down|drain|fail)/ {print $1}' <<<"$states")"
    for node in $down; do
        pmcc_exec "$PMCC_HEAD" scontrol update nodename="$node" state=resume \
            >/dev/null 2>&1 || true
    done
    sleep 1
done
pmcc_log "the nodes did not become idle: $(echo ${states:-none})"
tail -n 20 "$PMCC_LOG"/*.log >&2 || true
exit 1
