"""Stand-ins for batch-system commands, installed by the tests under their real names
(sbatch, squeue, scontrol, scancel, qsub, qstat, qdel, llsubmit, llq, llcancel, srun,
mpiexec, aprun, poe, apptainer) first on PATH.

Every call is recorded (argv, cwd, the scheduler variables it saw) as one JSON line in
``$FAKE_STATE/calls.jsonl``. A submit gives the next job id and runs the script at once
in real bash with the scheduler's environment; its exit status decides the job's state.
A job submitted with a dependency on a job that has not ended (Slurm's
``--dependency=afterany:ID``, PBS's ``-W depend=afterany:ID``) waits, pending with the
reason ``Dependency``, and runs when that job has ended, unless cancelled meanwhile.
With ``$FAKE_HOLD`` set, a submitted job stays queued instead, with that text as the
reason it waits (Slurm ``Reason``, PBS ``comment``, LoadLeveler status), until it is
cancelled. A job that runs is listed as running. Cancel commands answer as the real ones
do for unknown jobs (``scancel`` says nothing and exits 0); with ``$FAKE_CANCEL_FAILS``
set they refuse every job, as a server that denies it would. Launchers start the command
with the real MPICH ``mpiexec -n RANKS`` (``$FAKE_REAL_MPIEXEC``) so the DAG really runs
on several ranks; with ``$FAKE_OPENMPI_MPIEXEC`` set, ``mpiexec`` is that real Open MPI
launcher, given the script's line as it is. Status commands answer in the scheduler's
own format for finished jobs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

STATE = Path(os.environ["FAKE_STATE"])
SCHED_PREFIXES = ("SLURM_", "PBS_", "LOADL_", "ALPS_", "PMC_CHAIN")


def record(tool: str, argv: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k.startswith(SCHED_PREFIXES)}
    entry = {"tool": tool, "argv": argv, "cwd": os.getcwd(), "env": env}
    with open(STATE / "calls.jsonl", "a") as f:
        f.write(json.dumps(entry) + "\n")


def next_id() -> int:
    counter = STATE / "next_id"
    n = int(counter.read_text()) if counter.exists() else 100
    counter.write_text(str(n + 1))
    return n


def directive_values(script: str, prefix: str) -> list[str]:
    out = []
    for line in Path(script).read_text().splitlines():
        if line.startswith(prefix):
            out.append(line[len(prefix) :].strip())
    return out


def ranks_of(script: str, sched: str) -> int:
    text = "\n".join(directive_values(script, {"pbs": "#PBS", "ll": "# @"}[sched]))
    if sched == "pbs":
        m = re.search(r"select=(\d+):ncpus=\d+:mpiprocs=(\d+)", text)
        if m:
            return int(m.group(1)) * int(m.group(2))
        m = re.search(r"nodes=(\d+):ppn=(\d+)", text)
        return int(m.group(1)) * int(m.group(2)) if m else 1
    node = re.search(r"^node = (\d+)", text, re.M)
    per = re.search(r"^tasks_per_node = (\d+)", text, re.M)
    return (int(node.group(1)) if node else 1) * (int(per.group(1)) if per else 1)


def run_job(job_id: str, script: str, env: dict[str, str], cwd: str) -> int:
    # Batch systems keep a copy of the script taken at submit time and run that.
    spool = STATE / f"spool-{job_id}.sh"
    spool.write_text(Path(script).read_text())
    out = STATE / f"job-{job_id}.out"
    (STATE / f"job-{job_id}.json").write_text(json.dumps({"running": True}))
    with open(out, "ab") as f:
        rc = subprocess.call(
            ["bash", str(spool)], env=env, cwd=cwd, stdout=f, stderr=subprocess.STDOUT
        )
    (STATE / f"job-{job_id}.json").write_text(json.dumps({"rc": rc}))
    # Then the jobs that waited for this one, unless cancelled meanwhile.
    waiting = STATE / f"after-{job_id}.json"
    for dep in json.loads(waiting.read_text()) if waiting.exists() else []:
        info = job_info(dep["job"])
        if info is not None and info.get("pending"):
            run_job(dep["job"], dep["script"], dep["env"], dep["cwd"])
    return rc


def after(args: list[str]) -> str | None:
    """The job a submission waits for (afterany), or None."""
    for arg in args:
        for prefix in ("--dependency=afterany:", "depend=afterany:"):
            if arg.startswith(prefix):
                return arg[len(prefix):]
    return None


def start_or_wait(job_id: str, args: list[str], env: dict[str, str], cwd: str) -> None:
    """Run the submitted job now, or queue it behind the job it depends on while that
    one has not ended."""
    script = args[-1]
    before = after(args)
    if before is None or job_rc(before) is not None:  # no dependency, or it has ended
        run_job(job_id, script, env, cwd)
        return
    (STATE / f"job-{job_id}.json").write_text(
        json.dumps({"pending": True, "reason": "Dependency"}))
    waiting = STATE / f"after-{before}.json"
    queue = json.loads(waiting.read_text()) if waiting.exists() else []
    queue.append({"job": job_id, "script": script, "env": env, "cwd": cwd})
    waiting.write_text(json.dumps(queue))


def job_info(job_id: str) -> dict[str, object] | None:
    f = STATE / f"job-{job_id}.json"
    if not f.exists():
        return None
    info: dict[str, object] = json.loads(f.read_text())
    return info


def job_rc(job_id: str) -> int | None:
    """The exit status of a job that has ended; None for one queued, running or unknown."""
    info = job_info(job_id)
    if info is None or "rc" not in info:
        return None
    rc = info["rc"]
    assert isinstance(rc, int)
    return rc


def held(job_id: str) -> bool:
    """Keep the job queued (``$FAKE_HOLD``): it never runs unless cancelled."""
    reason = os.environ.get("FAKE_HOLD")
    if not reason:
        return False
    (STATE / f"job-{job_id}.json").write_text(json.dumps({"pending": True, "reason": reason}))
    return True


def cancel(tool: str, job_id: str) -> int:
    if os.environ.get("FAKE_CANCEL_FAILS"):
        print(f"{tool}: Unauthorized Request {job_id}", file=sys.stderr)
        return 159
    info = job_info(job_id)
    if info is None or not info.get("pending"):
        if tool == "scancel":
            return 0  # the real scancel says nothing for unknown or ended jobs
        print(f"{tool}: Unknown Job Id {job_id}", file=sys.stderr)
        return 153
    (STATE / f"job-{job_id}.json").write_text(json.dumps({"rc": 271, "cancelled": True}))
    return 0


def sbatch(args: list[str]) -> int:
    job_id = str(next_id())
    env = dict(os.environ, SLURM_JOB_ID=job_id, SLURM_JOBID=job_id)
    env.update(SLURM_SUBMIT_DIR=os.getcwd(), SLURM_JOB_NODELIST="localhost", SLURM_NNODES="1")
    print(job_id)
    sys.stdout.flush()
    if not held(job_id):
        start_or_wait(job_id, args, env, os.getcwd())
    return 0


def squeue(args: list[str]) -> int:
    job_id = args[args.index("-j") + 1]
    info = job_info(job_id)
    if info is None:
        print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
        return 1
    if info.get("pending"):
        print(f"PENDING|{info['reason']}")
    elif info.get("running"):
        print("RUNNING|None")
    return 0  # finished jobs are not listed; exit 0, as the real squeue


def scontrol(args: list[str]) -> int:
    job_id = args[-1]
    info = job_info(job_id)
    if info is None:
        print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
        return 1
    if info.get("pending"):
        state, reason, rc = "PENDING", str(info["reason"]), 0
    elif info.get("running"):
        state, reason, rc = "RUNNING", "None", 0
    else:
        rc = int(str(info["rc"]))
        reason = "None"
        state = "CANCELLED" if info.get("cancelled") else ("COMPLETED" if rc == 0 else "FAILED")
    print(f"JobId={job_id} JobName=fake\n   JobState={state} Reason={reason} Dependency=(null)")
    print(f"   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode={rc}:0")
    return 0


def qsub(args: list[str]) -> int:
    script = args[-1]
    job_id = f"{next_id()}.fakeserver"
    nodefile = STATE / f"nodes-{job_id}"
    nodefile.write_text("localhost\n" * ranks_of(script, "pbs"))
    home = STATE / "home"
    home.mkdir(exist_ok=True)
    env = dict(os.environ, PBS_JOBID=job_id, PBS_NODEFILE=str(nodefile), HOME=str(home))
    env.update(PBS_O_WORKDIR=os.getcwd(), PBS_ENVIRONMENT="PBS_BATCH", PBS_NUM_NODES="1")
    print(job_id)
    sys.stdout.flush()
    # PBS starts the job script in $HOME, not where qsub ran.
    if not held(job_id):
        start_or_wait(job_id, args, env, str(home))
    return 0


def qstat(args: list[str]) -> int:
    job_id = args[-1]
    info = job_info(job_id)
    if info is not None and info.get("pending"):
        print(f"Job Id: {job_id}\n    Job_Name = fake\n    job_state = Q\n    queue = workq")
        print(f"    comment = {info['reason']}")
        return 0
    if info is not None and info.get("running"):
        print(f"Job Id: {job_id}\n    Job_Name = fake\n    job_state = R\n    queue = workq")
        return 0
    rc = job_rc(job_id)
    if rc is None or "-x" not in args:
        # A finished job has left the live queue; PBS Pro keeps it for qstat -x.
        print(f"qstat: Unknown Job Id {job_id}", file=sys.stderr)
        return 153
    print(f"Job Id: {job_id}\n    Job_Name = fake\n    job_state = F\n    queue = workq")
    print(f"    Exit_status = {rc}\n    Variable_List = PBS_O_HOME=/root,PBS_O_LANG=C,")
    print("\tPBS_O_WORKDIR=/tmp")
    return 0


def llsubmit(args: list[str]) -> int:
    script = args[-1]
    n = next_id()
    job_id = f"fakehost.example.org.{n}"
    step = f"{job_id}.0"
    ranks = ranks_of(script, "ll")
    hostfile = STATE / f"hosts-{n}"
    hostfile.write_text("localhost\n" * ranks)
    env = dict(os.environ, LOADL_STEP_ID=step, LOADL_HOSTFILE=str(hostfile))
    env.update(LOADL_TOTAL_TASKS=str(ranks), LOADL_JOB_NAME="fake", LOADL_STEP_INITDIR=os.getcwd())
    print(f'llsubmit: The job "{job_id}" has been submitted.')
    sys.stdout.flush()
    if not held(step):
        run_job(step, script, env, os.getcwd())
    return 0


def llq(args: list[str]) -> int:
    info = job_info(args[-1])
    if info is not None and (info.get("pending") or info.get("running")):
        status = info["reason"] if info.get("pending") else "Running"
        print(f"===== Job Step {args[-1]} =====\n        Job Step Id: {args[-1]}")
        print(f"             Status: {status}\n      Hold Job Until:")
        return 0
    print("llq: There is currently no job status to report.")
    return 0


def launch(tool: str, args: list[str]) -> int:
    # The real mpiexec must not mistake this for a Slurm or PBS job it could use.
    env = {k: v for k, v in os.environ.items() if not k.startswith(SCHED_PREFIXES[:4])}
    openmpi = os.environ.get("FAKE_OPENMPI_MPIEXEC")
    if tool == "mpiexec" and openmpi:
        # An Open MPI site: its real launcher reads the line exactly as written.
        return subprocess.call([openmpi, *args], env=env)
    if tool == "poe":
        ranks = int(os.environ.get("LOADL_TOTAL_TASKS", "2"))
        cmd = args
    elif tool == "srun":
        ranks = next(int(a.split("=", 1)[1]) for a in args if a.startswith("--ntasks="))
        cmd = args[next(i for i, a in enumerate(args) if not a.startswith("-")) :]
    else:  # mpiexec -n R -ppn P ..., aprun -n R -N P -d C ...
        ranks = int(args[args.index("-n") + 1])
        i = 0
        while i < len(args) and args[i].startswith("-"):
            i += 1 if args[i] == "-disable-auto-cleanup" else 2  # the one without a value
        cmd = args[i:]
    real = os.environ["FAKE_REAL_MPIEXEC"]
    return subprocess.call([real, "-n", str(ranks), *cmd], env=env)


def apptainer(args: list[str]) -> int:
    i = 1  # after "exec"
    while args[i].startswith("-"):
        i += 2 if args[i] in ("--bind", "-B") else 1
    image, cmd = args[i], args[i + 1 :]
    if not Path(image).exists():
        print(f"FATAL: could not open image {image}: no such file", file=sys.stderr)
        return 255
    os.execvp(cmd[0], cmd)


def main() -> int:
    tool = Path(sys.argv[0]).name
    args = sys.argv[1:]
    record(tool, args)
    if tool == "sbatch":
        return sbatch(args)
    if tool == "squeue":
        return squeue(args)
    if tool == "scontrol":
        return scontrol(args)
    if tool in ("scancel", "qdel", "llcancel"):
        return cancel(tool, args[-1])
    if tool == "qsub":
        return qsub(args)
    if tool == "qstat":
        return qstat(args)
    if tool == "llsubmit":
        return llsubmit(args)
    if tool == "llq":
        return llq(args)
    if tool in ("srun", "mpiexec", "aprun", "poe"):
        return launch(tool, args)
    if tool == "apptainer":
        return apptainer(args)
    print(f"fakesched: unknown tool {tool}", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(main())
