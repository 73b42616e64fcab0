#!/bin/bash
#SBATCH --job-name=pmc-workflow
#SBATCH --partition=debug
#SBATCH --time=00:05:00
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=3
#SBATCH --cpus-per-task=1
#SBATCH --no-kill
# pmc batch script for site ci-slurm (slurm, launcher srun).
# Every value from the profile is quoted; only the setup lines are raw shell.
# walltime 00:05:00; pmc run stops by --max-wall-time 4 min, 00:01:00 before the limit.
# pmc chain script: each follow-up job is this script, submitted again.
# Who this run is, for pmc run's logs and metrics.
PMC_JOB_ID="${SLURM_JOB_ID:-}"
PMC_CHAIN_INDEX="${PMC_CHAIN_INDEX:-1}"
PMC_SITE_NAME=ci-slurm
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
    elif [ -f workflow.dag.slurm.sh ] && grep -qxF '# pmc chain script: each follow-up job is this script, submitted again.' workflow.dag.slurm.sh; then
        pmc_self=workflow.dag.slurm.sh
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
    pmc_next="$(sbatch --parsable --dependency="afterany:$SLURM_JOB_ID" "$pmc_self")" || pmc_next=""
    pmc_next="${pmc_next%%;*}"
    PMC_CHAIN_INDEX=$((PMC_CHAIN_INDEX - 1))
    [ -n "$pmc_next" ] || return 1
    pmc_chain_link "$pmc_next"
    pmc_chain_note link="$((PMC_CHAIN_INDEX + 1))" job="$pmc_next" event=submitted by="$PMC_JOB_ID"
}
pmc_chain_link "$PMC_JOB_ID"
pmc_chain_note link="$PMC_CHAIN_INDEX" job="$PMC_JOB_ID" event=started scheduler=slurm host="${HOSTNAME:-?}"
pmc_next=""
# A link queued ahead starts once the link before has ended: it runs only if
# that one handed over to it (the workflow may have ended there).
if [ "$PMC_CHAIN_INDEX" -gt 1 ]; then
    pmc_before="$(awk -v c="chain=$PMC_CHAIN_ID" -v l="link=$((PMC_CHAIN_INDEX - 1))" '$2 == c && $3 == l && $5 == "event=ended" { o = $7 } END { print o }' "$pmc_chain_file" 2>/dev/null)"
    if [ "$pmc_before" != outcome=continued ]; then
        echo "pmc: link $((PMC_CHAIN_INDEX - 1)) of chain $PMC_CHAIN_ID did not hand over to this one (${pmc_before:-no record of its end}): the chain has ended; nothing to do" >&2
        pmc_chain_note link="$PMC_CHAIN_INDEX" job="$PMC_JOB_ID" event=ended status=- outcome=skipped next=-
        exit 0
    fi
fi
# The next link waits in the queue while this one runs.
if [ "$PMC_CHAIN_INDEX" -lt 5 ]; then
    if pmc_find_self && pmc_submit_next; then
        echo "pmc: queued job $pmc_next as link $((PMC_CHAIN_INDEX + 1)) of at most 5 in chain $PMC_CHAIN_ID, to start when this job ends" >&2
    else
        echo "pmc: could not queue the next link now; it is submitted at the end should the workflow be incomplete" >&2
        pmc_next=""
    fi
fi
# A TERM at the time limit must not end this script before pmc has saved its
# state; pmc gets the signal itself.
pmc_term=0
trap 'pmc_term=1; echo "pmc: batch script got SIGTERM" >&2' TERM
# A warning that time is short is pmc run's to act on, sent to its ranks (Slurm's
# --signal=USR1@60, without B:); sent to this shell alone it must not end the job.
trap 'echo "pmc: batch script got a warning signal; pmc run acts on those sent to its ranks" >&2' USR1 USR2 XCPU
srun --mpi=pmi2 --kill-on-bad-exit=0 --no-kill --ntasks=3 --ntasks-per-node=3 --cpus-per-task=1 pmc run --site-name ci-slurm --no-site --max-wall-time 4 workflow.dag
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
# The workflow ended here: the link queued ahead goes (or, should it start,
# it finds this link did not hand over, and ends at once).
if [ -n "$pmc_next" ] && [ "$pmc_outcome" != continued ]; then
    if scancel "$pmc_next" >/dev/null 2>&1; then
        echo "pmc: cancelled job $pmc_next, queued as link $((PMC_CHAIN_INDEX + 1)): the chain ends here" >&2
        pmc_chain_note link="$((PMC_CHAIN_INDEX + 1))" job="$pmc_next" event=cancelled by="$PMC_JOB_ID"
    else
        echo "pmc: could not cancel job $pmc_next, queued as link $((PMC_CHAIN_INDEX + 1)): it ends at once when it starts" >&2
    fi
    pmc_next=""
fi
pmc_chain_note link="$PMC_CHAIN_INDEX" job="$PMC_JOB_ID" event=ended status="$pmc_status" outcome="$pmc_outcome" next="${pmc_next:--}"
exit "$rc"
