#!/bin/bash
# pmc batch script for site workstation (local, launcher mpiexec).
# Every value from the profile is quoted; only the setup lines are raw shell.
PMC_LOCAL_JOB_ID=$$
PMC_CHAIN_INDEX="${PMC_CHAIN_INDEX:-1}"
export PMC_CHAIN_INDEX
# A TERM at the time limit must not end this script before pmc has saved its
# state; pmc gets the signal itself.
trap 'echo "pmc: batch script got SIGTERM" >&2' TERM
mpiexec -n 3 -ppn 3 pmc run workflow.dag
rc=$?
echo "pmc: run exited with status $rc (job ${PMC_LOCAL_JOB_ID:-?}, chain link $PMC_CHAIN_INDEX)" >&2
pmc_jobs="${PMC_LOCAL_JOBS:-$HOME/.cache/pmc/jobs}"
mkdir -p "$pmc_jobs" && printf '%s\n' "$rc" > "$pmc_jobs/$$.rc"
exit "$rc"
