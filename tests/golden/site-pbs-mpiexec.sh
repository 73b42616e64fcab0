#!/bin/bash
#PBS -N pmc-workflow
#PBS -A PRJ0001
#PBS -q workq
#PBS -l walltime=01:00:00
#PBS -l select=2:ncpus=4:mpiprocs=4:mem=65536mb
#PBS -l place=scatter:excl
#PBS -o pmc.out
#PBS -e pmc.err
# pmc batch script for site example-pbs (pbs, launcher mpiexec).
# Every value from the profile is quoted; only the setup lines are raw shell.
# walltime 01:00:00; pmc run stops by --max-wall-time 54 min, 00:06:00 before the limit.
cd "${PBS_O_WORKDIR:-.}" || exit 1
module load mpich/4.2-pbs
# setup: raw shell lines from the profile
source /home/me/venvs/pmc-site-mpi/bin/activate
# Who this run is, for pmc run's logs and metrics.
PMC_JOB_ID="${PBS_JOBID:-}"
PMC_CHAIN_INDEX="${PMC_CHAIN_INDEX:-1}"
PMC_SITE_NAME=example-pbs
export PMC_JOB_ID PMC_CHAIN_INDEX PMC_SITE_NAME
# A TERM at the time limit must not end this script before pmc has saved its
# state; pmc gets the signal itself.
pmc_term=0
trap 'pmc_term=1; echo "pmc: batch script got SIGTERM" >&2' TERM
# A warning that time is short is pmc run's to act on, sent to its ranks (Slurm's
# --signal=USR1@60, without B:); sent to this shell alone it must not end the job.
trap 'echo "pmc: batch script got a warning signal; pmc run acts on those sent to its ranks" >&2' USR1 USR2 XCPU
mpiexec -disable-auto-cleanup -n 8 -ppn 4 -launcher pbs pmc run --site-name example-pbs --no-site -t 2 --host-memory 65536 --max-wall-time 54 workflow.dag
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
exit "$rc"
