#!/usr/bin/env bash
# Remove the test cluster of ci/cluster-up.sh: its daemons, every process of its nodes,
# its namespaces, network, cgroups, configuration, state and logs. Leaves munged (the
# one-node Slurm of ci/slurm-up.sh shares it) and that Slurm alone.
set -uo pipefail
. "$(dirname "$0")/cluster-lib.sh"

for node in $(pmcc_nodes) $(ls "$PMCC_FREEZER" 2>/dev/null); do
    dir="$PMCC_FREEZER/$node"
    [ -d "$dir" ] || continue
    echo FROZEN >"$dir/freezer.state"
    for _ in 1 2 3; do
        pids="$(cat "$dir/cgroup.procs")"
        [ -z "$pids" ] && break
        # shellcheck disable=SC2086 # one pid per word
        kill -KILL $pids 2>/dev/null
        echo THAWED >"$dir/freezer.state"
        sleep 0.3
        echo FROZEN >"$dir/freezer.state"
    done
    echo THAWED >"$dir/freezer.state"
done
if pmcc_running "$PMCC_RUN/slurmctld.pid"; then
    kill "$(cat "$PMCC_RUN/slurmctld.pid")"
    for _ in $(seq 50); do pmcc_running "$PMCC_RUN/slurmctld.pid" || break; sleep 0.1; done
fi
for f in "$PMCC_RUN"/*.holder; do
    [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null
done
sleep 0.3
for node in $(ls "$PMCC_FREEZER" 2>/dev/null); do
    [ -d "$PMCC_FREEZER/$node" ] && rmdir "$PMCC_FREEZER/$node"
done
[ -d "$PMCC_FREEZER" ] && rmdir "$PMCC_FREEZER"
for f in "$PMCC_RUN"/*.memcg; do
    [ -f "$f" ] || continue
    [ -d "$(cat "$f")" ] && rmdir "$(cat "$f")" && rmdir "$(dirname "$(cat "$f")")" 2>/dev/null
    rm -f "$f"
done
# Whatever still runs in the cluster's network namespaces (a daemon whose pid file was
# lost, a process started by hand with ci/cluster-run.sh).
for ns in $(ip netns list | awk '$1 ~ /^pmcc-/ {print $1}'); do
    pids="$(ip netns pids "$ns" 2>/dev/null)"
    # shellcheck disable=SC2086 # one pid per word
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
    ip netns del "$ns"
done
rm -rf "$PMCC_RUN" "$PMCC_SPOOL" "$PMCC_LOG" "$PMCC_CONF_DIR"
pmcc_log "removed"
