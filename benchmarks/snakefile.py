"""A Snakefile of many short jobs through pmc against snakemake-executor-plugin-slurm,
on the real (one-node) Slurm, in one run: makespan and jobs submitted to Slurm.

    python benchmarks/snakefile.py [--jobs 500] [--cpus 5] [--slurm-jobs N] [--together]
        [--limit S] [--pmc-options '--pmc-warm'] [--keep DIR]

pmc: one batch job (``sbatch -c CPUS``, running ``snakemake --executor pmc``) in which
every Snakemake job is a task of one pmc open run with CPUS embedded workers. Slurm:
``snakemake --executor slurm --jobs CPUS`` on this host, a batch job of one cpu per rule
instance, at most CPUS of them at once (as the pmc job's CPUS slots; a centre's limit
of jobs per user works alike; the rest of the node is left to others), or with
``--slurm-jobs N`` up to N of them submitted at once, Slurm starting as many as the
node's declared cpus hold (as users with no such limit run the plugin). Both with the
plugins' defaults but the status command (``squeue``: this cluster keeps no accounting
for ``sacct``).
The sides run one after the other, or with ``--together`` at the same time (then each
shares the machine with the other: their CPUS together must fit the node's cpus).
A side still running after ``--limit`` seconds is stopped (its batch job cancelled, or
its Snakemake interrupted, which cancels its jobs): its outputs are then those made by
then, and its makespan is reported as more than the limit.
Makespan: from starting the side (sbatch, or snakemake) until every output exists and
Snakemake has ended. Jobs submitted: the Slurm job ids seen with a submit time in the
side and their work directory in the side's (``squeue --states=all``, polled each
second; finished jobs stay listed for MinJobAge). Needs the Slurm of ci/slurm-up.sh,
snakemake, the slurm plugin and snakemake-executor-plugin-pmc installed in this Python.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import PYTHON, machine, workdir

SNAKEFILE = """\
COUNT = int(config.get("count", 500))

rule all:
    input: expand("out/{i}.txt", i=range(COUNT))

rule short:
    output: "out/{i}.txt"
    shell: "echo {wildcards.i} > {output}"
"""


class JobWatch(threading.Thread):
    """Slurm job ids submitted from ``since`` on with their work directory in ``where``
    (not the jobs of others sharing the cluster), polled each second."""

    def __init__(self, where: Path) -> None:
        super().__init__(daemon=True)
        self.where = str(where)
        self.since = time.strftime("%Y-%m-%dT%H:%M:%S")
        self.ids: set[str] = set()
        self.stopping = threading.Event()

    def look(self) -> None:
        out = subprocess.run(["squeue", "--states=all", "-h", "-o", "%i|%V|%Z"],
                             capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            job, submitted, where = line.split("|", 2)
            if submitted >= self.since and where.startswith(self.where):
                self.ids.add(job)

    def run(self) -> None:
        while not self.stopping.wait(1.0):
            self.look()

    def stop(self) -> int:
        self.stopping.set()
        self.join()
        self.look()
        return len(self.ids)


Run = Callable[[Path, float], tuple[int, str, str]]  # (work dir, deadline): exit, out, err


def side(name: str, cwd: Path, run: Run, count: int, limit: float) -> dict[str, object]:
    cwd.mkdir(parents=True)
    (cwd / "Snakefile").write_text(SNAKEFILE)
    watch = JobWatch(cwd)
    time.sleep(1.1)  # the watch's second: no job of an earlier side counts
    watch.since = time.strftime("%Y-%m-%dT%H:%M:%S")
    watch.start()
    t0 = time.monotonic()
    code, out, err = run(cwd, t0 + limit)
    wall = time.monotonic() - t0
    jobs = watch.stop()
    made = len(list((cwd / "out").glob("*.txt")))
    (cwd / f"{name}.stdout").write_text(out)
    (cwd / f"{name}.stderr").write_text(err)
    return {"side": name, "exit": code, "outputs": made, "expected": count,
            "makespan": wall, "jobs": jobs, "stopped": wall >= limit}


def command(argv: list[str]) -> Run:
    def run(cwd: Path, deadline: float) -> tuple[int, str, str]:
        with open(cwd / "side.out", "w+") as out, open(cwd / "side.err", "w+") as err:
            # SIGINT as default in Snakemake (a shell's background job has it ignored,
            # and an interpreter that starts so never takes it).
            p = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=err,
                                 preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                                  signal.SIG_DFL))
            while p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.5)
            if p.poll() is None:  # Snakemake cancels its jobs when interrupted
                p.send_signal(signal.SIGINT)
                p.wait()
            out.seek(0)
            err.seek(0)
            return p.returncode, out.read(), err.read()
    return run


def batch_job(cpus: int, script: str) -> Run:
    def run(cwd: Path, deadline: float) -> tuple[int, str, str]:
        (cwd / "job.sh").write_text(script)
        job = subprocess.run(["sbatch", "--parsable", "-N1", "-n1", "-c", str(cpus), "-o",
                              "job.out", "-J", "pmc-snakemake", "job.sh"], cwd=cwd,
                             capture_output=True, text=True, check=True).stdout.strip()
        state = wait_batch(job.split(";")[0], deadline)
        log = (cwd / "job.out").read_text() if (cwd / "job.out").exists() else ""
        return (0 if state == "COMPLETED" else 1), f"job {job}: {state}\n", log
    return run


def wait_batch(job: str, deadline: float) -> str:
    """The state the batch job ended in (cancelled at the deadline)."""
    while True:
        if time.monotonic() >= deadline:
            subprocess.run(["scancel", job], check=False)
            deadline = float("inf")
        out = subprocess.run(["squeue", "--states=all", "-h", "-j", job, "-o", "%T"],
                             capture_output=True, text=True, check=False).stdout.strip()
        if out and out not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            return out
        time.sleep(0.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=500, help="short jobs in the Snakefile")
    ap.add_argument("--cpus", type=int, default=5, help="cpus of the pmc job, and slots "
                    "of both sides (default 5 of the one-node Slurm's 8 declared cpus)")
    ap.add_argument("--slurm-jobs", type=int,
                    help="jobs the Slurm side keeps submitted at once (default: CPUS)")
    ap.add_argument("--together", action="store_true",
                    help="run both sides at the same time (default: one after the other)")
    ap.add_argument("--limit", type=float, default=float("inf"),
                    help="stop a side still running after this many seconds")
    ap.add_argument("--pmc-options", default="",
                    help="more snakemake options for the pmc side, e.g. '--pmc-warm'")
    ap.add_argument("--keep", help="work in this directory and keep it")
    args = ap.parse_args()
    root = workdir(args.keep)
    n, cpus = args.jobs, args.cpus
    slurm_jobs = args.slurm_jobs or cpus
    snake = [PYTHON, "-m", "snakemake", "--jobs", str(n), "--latency-wait", "60",
             "--config", f"count={n}"]
    pmc_cmd = shlex.join([*snake[:3], "--executor", "pmc", "--pmc-workers", str(cpus),
                          *shlex.split(args.pmc_options), *snake[3:]])
    sides = [("pmc", root / "pmc", batch_job(cpus, f"#!/bin/sh\n{pmc_cmd}\n"), n, args.limit),
             ("slurm", root / "slurm", command(
                 [*snake[:3], "--executor", "slurm", "--slurm-status-command", "squeue",
                  "--jobs", str(slurm_jobs), *snake[5:]]), n, args.limit)]
    if args.together:
        with ThreadPoolExecutor(len(sides)) as pool:
            results = list(pool.map(lambda s: side(*s), sides))
    else:
        results = [side(*s) for s in sides]
    print(f"machine: {machine()}")
    print(f"Slurm: one node; pmc {cpus} slots, Slurm side at most {slurm_jobs} jobs "
          f"submitted; {n} jobs of 'echo i > out/i.txt'; "
          f"sides {'at the same time' if args.together else 'one after the other'}")
    print(f"pmc side: snakemake {args.pmc_options or '(plugin defaults)'}")
    print(f"{'side':<8}{'exit':>6}{'outputs':>10}{'makespan s':>12}{'Slurm jobs':>12}")
    for r in results:
        wall = f"{'>' if r['stopped'] else ''}{r['makespan']:.1f}"
        print(f"{r['side']:<8}{r['exit']:>6}{r['outputs']!s:>10}{wall:>12}{r['jobs']:>12}")
    print(f"(work in {root})")


if __name__ == "__main__":
    main()
