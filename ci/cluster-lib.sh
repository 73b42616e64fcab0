# Shared by ci/cluster-*.sh: the test cluster's names, addresses and paths, and how to
# run a command on one of its hosts. Sourced, never run.
#
# Each host (the head, which runs slurmctld and is the login host, and node1..nodeN) is
# a Linux network namespace (pmcc-HOST) plus a long-lived process holding its own UTS
# and mount namespaces (hostname HOST, /etc/hosts naming the cluster's hosts). The
# namespaces are joined by a bridge in the head's network namespace; addresses come
# from 10.77.0.0/24 and exist only inside these namespaces. Every process of a node
# lives in the node's freezer cgroup, which is how a node is frozen or killed whole, and
# in its own memory cgroup, whose limit is the node's memory (pmcc_node_memory_mb; set
# up by ci/cluster-up.sh). The nodes share this machine's cpus: see docs/test-cluster.md
# for why none has fewer.

PMCC_NODES="${PMC_CLUSTER_NODES:-3}"       # node1..nodeN
PMCC_CPUS="${PMC_CLUSTER_CPUS:-6}"         # Slurm's CPUs (slots) per node, not its cpus
PMCC_NET=10.77.0                            # /24, only inside the namespaces
PMCC_HEAD=pmc-head                          # slurmctld and the login host
PMCC_CONF_DIR=/etc/pmc-cluster
PMCC_CONF="$PMCC_CONF_DIR/slurm.conf"
PMCC_RUN=/run/pmc-cluster
PMCC_SPOOL=/var/spool/pmc-cluster
PMCC_LOG=/var/log/pmc-cluster
PMCC_FREEZER=/sys/fs/cgroup/freezer/pmc-cluster
export SLURM_CONF="$PMCC_CONF"

pmcc_log() { printf '%s: %s\n' "$(basename "$0" .sh)" "$*" >&2; }

pmcc_nodes() { seq -f 'node%g' 1 "$PMCC_NODES"; }

# The address of a host: the head .1, nodeK .(10+K).
pmcc_addr() {
    case "$1" in
        "$PMCC_HEAD") echo "$PMCC_NET.1" ;;
        node*) echo "$PMCC_NET.$((10 + ${1#node}))" ;;
        *) return 1 ;;
    esac
}

# A node's memory in MiB (its memory cgroup's limit, and Slurm's RealMemory): each
# node a different figure, that a report mixing hosts up shows.
pmcc_node_memory_mb() {
    case "$1" in
        node1) echo 4096 ;;
        node2) echo 2048 ;;
        *) echo 3072 ;;
    esac
}

# The memory cgroup directory a host's holder is in (a node's own, once
# ci/cluster-up.sh has placed it).
pmcc_holder_memcg() {
    awk -F: '$2 == "memory" {print "/sys/fs/cgroup/memory" $3}' "/proc/$1/cgroup"
}

# The pid of the process holding a host's UTS and mount namespaces (none if it is gone).
pmcc_holder() {
    local pid
    pid="$(cat "$PMCC_RUN/$1.holder" 2>/dev/null)" || return 1
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

# Run a command on a host, in its namespaces and (for a node) its freezer cgroup.
pmcc_exec() {
    local host="$1" pid
    shift
    pid="$(pmcc_holder "$host")" || { pmcc_log "host $host is not up"; return 1; }
    local cg=""
    case "$host" in node*) cg="$(pmcc_holder_memcg "$pid")" ;; esac
    # A node's processes join its freezer cgroup and its holder's memory one.
    nsenter -t "$pid" -n -u -m -- /bin/sh -c \
        'for d in $0; do [ -d "$d" ] && echo $$ > "$d/cgroup.procs"; done; exec "$@"' \
        "$PMCC_FREEZER/$host $cg" "$@"
}

# Start a host's namespace holder: a network namespace, then a process in new UTS and
# mount namespaces that sets the hostname, binds the cluster's /etc/hosts, joins the
# freezer cgroup and sleeps for ever.
pmcc_start_holder() {
    local host="$1"
    if pmcc_holder "$host" >/dev/null; then return 0; fi
    [ -d "$PMCC_FREEZER/$host" ] && [ "$host" != "$PMCC_HEAD" ] \
        && echo THAWED >"$PMCC_FREEZER/$host/freezer.state"
    # nsenter, not "ip netns exec": that one remounts /sys, hiding the cgroup file systems.
    setsid -f nsenter --net="/run/netns/pmcc-$host" unshare --uts --mount --propagation private \
        /bin/sh -c 'hostname "$0" && mount --bind "$1" /etc/hosts \
            && { [ ! -d "$2" ] || echo $$ > "$2/cgroup.procs"; } \
            && echo $$ > "$3.tmp" && mv "$3.tmp" "$3" && exec sleep infinity' \
        "$host" "$PMCC_CONF_DIR/hosts" "$PMCC_FREEZER/$host" "$PMCC_RUN/$host.holder" \
        </dev/null >/dev/null 2>&1
    for _ in $(seq 50); do pmcc_holder "$host" >/dev/null && return 0; sleep 0.1; done
    pmcc_log "the namespaces of $host did not come up"
    return 1
}

pmcc_running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

pmcc_start_slurmd() {
    local node="$1"
    if pmcc_running "$PMCC_RUN/slurmd-$node.pid"; then return 0; fi
    pmcc_exec "$node" /usr/sbin/slurmd -f "$PMCC_CONF"
}
