#!/bin/bash
# pmc batch script for site workstation (local, launcher mpiexec).
# Every value from the profile is quoted; only the setup lines are raw shell.
# No walltime: the scheduler's default limit applies; pmc run has no limit.
# pmc chain script: each follow-up job is this script, submitted again.
pmc_stat="$(cat /proc/$$/stat)"
read -r -a pmc_stat <<<"${pmc_stat##*) }"
PMC_LOCAL_JOB_ID="$$-${pmc_stat[19]}"
# Who this run is, for pmc run's logs and metrics.
PMC_JOB_ID="${PMC_LOCAL_JOB_ID:-}"
PMC_CHAIN_INDEX="${PMC_CHAIN_INDEX:-1}"
PMC_SITE_NAME=workstation
export PMC_JOB_ID PMC_CHAIN_INDEX PMC_SITE_NAME
# The chain's id is its first job's id; the chain file beside the DAG lists
# every link (`pmc jobs status` reads it), the index maps job ids to it.
PMC_CHAIN_ID="${PMC_CHAIN_ID:-$PMC_JOB_ID}"
export PMC_CHAIN_ID
pmc_chain_file=workflow.dag.chain
case "$pmc_chain_file" in /*) ;; *) pmc_chain_file="$PWD/$pmc_chain_file" ;; esac
pmc_chain_index="${PMC_CHAINS_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/pmc/chains}"
pmc_chain_note() {
    printf '%s chain=%s %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$PMC_CHAIN_ID" "$*" >>"$pmc_chain_file" || echo "pmc: cannot write $pmc_chain_file" >&2
}
pmc_chain_link() {
    mkdir -p "$pmc_chain_index" 2>/dev/null && printf '%s\n' "$pmc_chain_file" >"$pmc_chain_index/${1//[^A-Za-z0-9._-]/_}"
}
# This script's text, to submit again as the next link: pmc_self.
pmc_find_self() {
    if [ -f "$0" ] && grep -qxF '# pmc chain script: each follow-up job is this script, submitted again.' "$0"; then
        pmc_self="$0"
    elif [ -f workflow.dag.local.sh ] && grep -qxF '# pmc chain script: each follow-up job is this script, submitted again.' workflow.dag.local.sh; then
        pmc_self=workflow.dag.local.sh
    else
        pmc_self=""
        return 1
    fi
}
# Submit it as link PMC_CHAIN_INDEX + 1 (its job id in pmc_next, empty if the
# submission failed), and record it.
pmc_submit_next() {
    PMC_CHAIN_INDEX=$((PMC_CHAIN_INDEX + 1))
    export PMC_CHAIN_INDEX
    setsid bash "$pmc_self" >>"$pmc_self.out" 2>&1 </dev/null &
    pmc_next="$(cat /proc/$!/stat 2>/dev/null)" || pmc_next=""
    if [ -n "$pmc_next" ]; then
        read -r -a pmc_stat <<<"${pmc_next##*) }"
        pmc_next="$!-${pmc_stat[19]}"
    fi
    PMC_CHAIN_INDEX=$((PMC_CHAIN_INDEX - 1))
    [ -n "$pmc_next" ] || return 1
    pmc_chain_link "$pmc_next"
    pmc_chain_note link="$((PMC_CHAIN_INDEX + 1))" job="$pmc_next" event=submitted by="$PMC_JOB_ID"
}
pmc_chain_link "$PMC_JOB_ID"
pmc_chain_note link="$PMC_CHAIN_INDEX" job="$PMC_JOB_ID" event=started scheduler=local host="${HOSTNAME:-?}"
pmc_next=""
# A TERM at the time limit must not end this script before pmc has saved its
# state; pmc gets the signal itself.
pmc_term=0
trap 'pmc_term=1; echo "pmc: batch script got SIGTERM" >&2' TERM
# A warning that time is short is pmc run's to act on, sent to its ranks (Slurm's
# --signal=USR1@60, without B:); sent to this shell alone it must not end the job.
trap 'echo "pmc: batch script got a warning signal; pmc run acts on those sent to its ranks" >&2' USR1 USR2 XCPU
mpiexec -disable-auto-cleanup -n 3 -ppn 3 pmc run --site-name workstation --no-site workflow.dag
rc=$?
echo "pmc: run exited with status $rc (job ${PMC_JOB_ID:-?}, chain link $PMC_CHAIN_INDEX)" >&2
# The launcher's status is not the workflow's when a rank was lost (it reports
# the lost rank's death): take pmc's own record (0 ok, 1 failed, 3 incomplete).
if [ "$rc" -ne 0 ] && [ "$rc" -ne 2 ]; then
    pmc status workflow.dag >/dev/null 2>&1
    pmc_recorded=$?
    case $pmc_recorded in
        0|1|3) [ "$pmc_recorded" -ne "$rc" ] && echo "pmc: the workflow's record says status $pmc_recorded; the script exits with it" >&2; rc=$pmc_recorded ;;
    esac
fi
pmc_outcome=""
case $rc in
    0) pmc_outcome=succeeded ;;
    1) pmc_outcome=failed ;;
    2) pmc_outcome=usage-error ;;
    3) pmc_outcome=incomplete ;;
    *) pmc_outcome=ended ;;
esac
pmc_status=$rc
if [ "$rc" -eq 3 ]; then
    if [ "$pmc_term" = 1 ]; then
        echo "pmc: the batch system stopped this job (SIGTERM): no follow-up; the chain $PMC_CHAIN_ID ends at link $PMC_CHAIN_INDEX (submit again to resume)" >&2
        pmc_outcome=stopped
    elif [ "$PMC_CHAIN_INDEX" -ge 5 ]; then
        echo "pmc: workflow incomplete after 5 jobs; chain ends" >&2
        pmc_outcome=max-jobs
    elif [ -n "$pmc_next" ]; then
        echo "pmc: workflow incomplete; job $pmc_next, queued as link $((PMC_CHAIN_INDEX + 1)) of at most 5 in chain $PMC_CHAIN_ID, goes on; this link ends as a success" >&2
        pmc_outcome=continued
        rc=0
    elif ! pmc_find_self; then
        echo "pmc: cannot find this script's text to submit the follow-up ($0 is not it); the chain ends: submit the script again to resume" >&2
        pmc_outcome=no-follow-up
    elif pmc_submit_next; then
        echo "pmc: workflow incomplete; submitted job $pmc_next as link $((PMC_CHAIN_INDEX + 1)) of at most 5 in chain $PMC_CHAIN_ID; this link ends as a success" >&2
        pmc_outcome=continued
        rc=0
    else
        echo "pmc: could not submit the follow-up job; the chain ends" >&2
        pmc_outcome=no-follow-up
    fi
fi
pmc_chain_note link="$PMC_CHAIN_INDEX" job="$PMC_JOB_ID" event=ended status="$pmc_status" outcome="$pmc_outcome" next="${pmc_next:--}"
pmc_jobs="${PMC_LOCAL_JOBS:-$HOME/.cache/pmc/jobs}"
mkdir -p "$pmc_jobs" && printf '%s\n' "$rc" > "$pmc_jobs/$PMC_LOCAL_JOB_ID.rc"
exit "$rc"
