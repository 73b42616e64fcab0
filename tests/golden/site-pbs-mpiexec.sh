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
cd "${PBS_O_WORKDIR:-.}" || exit 1
module load cray-python
PMC_CHAIN_INDEX="${PMC_CHAIN_INDEX:-1}"
export PMC_CHAIN_INDEX
# A TERM at the time limit must not end this script before pmc has saved its
# state; pmc gets the signal itself.
trap 'echo "pmc: batch script got SIGTERM" >&2' TERM
mpiexec -n 8 -ppn 4 pmc run -t 2 --host-memory 65536 --max-wall-time 54 workflow.dag
rc=$?
echo "pmc: run exited with status $rc (job ${PBS_JOBID:-?}, chain link $PMC_CHAIN_INDEX)" >&2
exit "$rc"
