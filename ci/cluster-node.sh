#!/usr/bin/env bash
# Play a node failure on the test cluster of ci/cluster-up.sh:
#   kill NODE    the node dies: its network goes silent (its peers get no word of the
#                end, as when a machine loses power) and every process on it is killed
#   freeze NODE  the node hangs: every process on it is stopped (freezer cgroup), its
#                network stays up
#   thaw NODE    a frozen node resumes
#   revive NODE  a killed node comes back: network up, slurmd started, node resumed
set -euo pipefail
. "$(dirname "$0")/cluster-lib.sh"

usage() { echo "usage: $0 kill|freeze|thaw|revive NODE" >&2; exit 2; }
[ $# -eq 2 ] || usage
action="$1" node="$2"
pmcc_nodes | grep -qx "$node" || { pmcc_log "no node $node in the test cluster"; exit 2; }
cg="$PMCC_FREEZER/$node"
[ -d "$cg" ] || { pmcc_log "the test cluster is not up (no $cg)"; exit 1; }
holder="$(pmcc_holder "$node")" || { pmcc_log "node $node has no namespaces"; exit 1; }

state() { echo "$1" >"$cg/freezer.state"; }

# Every process of the node but the one holding its namespaces.
node_pids() { grep -vx "$holder" "$cg/cgroup.procs" || true; }

case "$action" in
    kill)
        ip -n "pmcc-$node" link set eth0 down
        state FROZEN
        for _ in $(seq 50); do
            pids="$(node_pids)"
            [ -z "$pids" ] && break
            # shellcheck disable=SC2086 # one pid per word
            kill -KILL $pids 2>/dev/null || true
            state THAWED   # a frozen process dies only once it runs again
            sleep 0.1
            state FROZEN
        done
        state THAWED
        [ -z "$(node_pids)" ] || { pmcc_log "processes of $node survived: $(node_pids)"; exit 1; }
        rm -f "$PMCC_RUN/slurmd-$node.pid"
        pmcc_log "$node killed"
        ;;
    freeze)
        state FROZEN
        for _ in $(seq 50); do
            [ "$(cat "$cg/freezer.state")" = FROZEN ] && break
            sleep 0.1
        done
        pmcc_log "$node frozen ($(node_pids | wc -l) processes)"
        ;;
    thaw)
        state THAWED
        pmcc_log "$node thawed"
        ;;
    revive)
        state THAWED
        ip -n "pmcc-$node" link set eth0 up
        pmcc_start_slurmd "$node"
        for _ in $(seq 60); do
            s="$(pmcc_exec "$PMCC_HEAD" sinfo -h -n "$node" -o %T 2>/dev/null || true)"
            case "$s" in
                idle|mixed|allocated) pmcc_log "$node revived ($s)"; exit 0 ;;
                down*|drain*|fail*)
                    pmcc_exec "$PMCC_HEAD" scontrol update nodename="$node" state=resume \
                        >/dev/null 2>&1 || true ;;
            esac
            sleep 1
        done
        pmcc_log "$node did not come back (state: ${s:-unknown})"
        exit 1
        ;;
    *) usage ;;
esac
