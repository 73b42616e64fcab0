#!/usr/bin/env bash
# Run a command on the test cluster's head (its login host), where Slurm's commands
# reach its slurmctld: bash ci/cluster-run.sh sinfo -N. SLURM_CONF names the cluster's
# configuration; the rest of the environment and the working directory are kept.
set -euo pipefail
. "$(dirname "$0")/cluster-lib.sh"
[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARG...]" >&2; exit 2; }
pid="$(pmcc_holder "$PMCC_HEAD")" || { pmcc_log "the test cluster is not up"; exit 1; }
exec nsenter -t "$pid" -n -u -m --wd="$PWD" -- "$@"
