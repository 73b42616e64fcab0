#!/bin/bash
#SBATCH --job-name=pmc-workflow
#SBATCH --partition=cluster
#SBATCH --time=00:05:00
#SBATCH --nodes=3
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=1
#SBATCH --no-kill
# pmc batch script for site test-cluster (slurm, launcher srun).
# Every value from the profile is quoted; only the setup lines are raw shell.
# walltime 00:05:00; pmc run stops by --max-wall-time 4 min, 00:01:00 before the limit.
export MPIR_CVAR_CH4_NETMOD=ofi
export FI_PROVIDER=tcp
# Who this run is, for pmc run's logs and metrics.
PMC_JOB_ID="${SLURM_JOB_ID:-}"
PMC_CHAIN_INDEX="${PMC_CHAIN_INDEX:-1}"
PMC_SITE_NAME=test-cluster
export PMC_JOB_ID PMC_CHAIN_INDEX PMC_SITE_NAME
# A TERM at the time limit must not end this script before pmc has saved its
# state; pmc gets the signal itself.
pmc_term=0
trap 'pmc_term=1; echo "pmc: batch script got SIGTERM" >&2' TERM
# A warning that time is short is pmc run's to act on, sent to its ranks (Slurm's
# --signal=USR1@60, without B:); sent to this shell alone it must not end the job.
trap 'echo "pmc: batch script got a warning signal; pmc run acts on those sent to its ranks" >&2' USR1 USR2 XCPU
srun --mpi=pmi2 --kill-on-bad-exit=0 --no-kill --ntasks=6 --ntasks-per-node=2 --cpus-per-task=1 pmc run --site-name test-cluster --no-site --max-wall-time 4 --jobstate-log workflow.dag
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
