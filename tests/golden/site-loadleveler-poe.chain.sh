#!/bin/bash
# @ job_name = pmc-workflow
# @ job_type = parallel
# @ class = standard
# @ account_no = NCSA-ABC
# @ wall_clock_limit = 03:00:00
# @ node = 4
# @ tasks_per_node = 16
# @ resources = ConsumableMemory(2048mb)
# @ node_usage = not_shared
# @ output = pmc.$(jobid).out
# @ error = pmc.$(jobid).err
# @ environment = COPY_ALL
# @ network.MPI = sn_all,not_shared,us
# @ queue
# pmc batch script for site example-loadleveler (loadleveler, launcher poe).
# Every value from the profile is quoted; only the setup lines are raw shell.
PMC_CHAIN_INDEX="${PMC_CHAIN_INDEX:-1}"
export PMC_CHAIN_INDEX
# A TERM at the time limit must not end this script before pmc has saved its
# state; pmc gets the signal itself.
trap 'echo "pmc: batch script got SIGTERM" >&2' TERM
poe pmc run --host-cpus 16 --host-memory 32768 --max-wall-time 170 workflow.dag
rc=$?
echo "pmc: run exited with status $rc (job ${LOADL_STEP_ID:-?}, chain link $PMC_CHAIN_INDEX)" >&2
if [ "$rc" -eq 3 ] && [ "$PMC_CHAIN_INDEX" -lt 5 ]; then
    PMC_CHAIN_INDEX=$((PMC_CHAIN_INDEX + 1))
    export PMC_CHAIN_INDEX
    echo "pmc: workflow incomplete; submitting job $PMC_CHAIN_INDEX of 5" >&2
    llsubmit workflow.dag.loadleveler.sh || echo "pmc: could not submit the follow-up job" >&2
elif [ "$rc" -eq 3 ]; then
    echo "pmc: workflow incomplete after 5 jobs; chain ends" >&2
fi
exit "$rc"
