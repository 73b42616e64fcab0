"""pmc's own cpu a task: its master, workers and guards (not its tasks), checkouts by turns.

    python benchmarks/owncpu.py --trees before=/tmp/old,after=. --rounds 12
    python benchmarks/owncpu.py --tasks 2000 --rounds 3           # this checkout alone

The throughput benchmark's cpu figure counts every process of a run, the tasks too, and
its rates move by more from one minute to the next than a change of a tenth of pmc's own
cost does. Here each embedded run (`pmc run --workers W`, 10,000 /bin/true by default)
is watched from /proc: the processes below the command are found in its first 1.5 s,
then read every 20 ms until each is gone, and the last figure of each counts. The tasks
are left out; what is left, divided by the tasks, is pmc's own: the master (the command
itself), the workers (its `pmc-worker-N` children) and their guards. The last 20 ms of
each process go uncounted, alike for every checkout. The runs go by turns, the order
reversed every round; the summary gives the medians, and in how many rounds each
checkout spent less than the first one. The watching costs cpu too: the rates printed
here are not the throughput benchmark's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from _common import (
    PYTHON,
    SUMMARY,
    TICK,
    children_of,
    clear_run_files,
    cmdline,
    cpu_ticks,
    machine,
    median,
    parent_of,
    parse_trees,
    pmc_env,
    workdir,
    write_independent,
)

FIND = 1.5  # seconds of a run during which its processes are looked for
LOOK = 0.02  # seconds between two readings


def role(pid: int, root: int) -> str | None:
    """What a process of the run is to pmc (None: a task, or gone)."""
    if pid == root:
        return "master"
    try:
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
    except OSError:
        return None
    if comm.startswith("pmc-worker") and parent_of(pid) == root:
        return "workers"
    return "guards" if "pmc/runtime/guard.py" in cmdline(pid) else None


def watch(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[dict[str, float], str]:
    """Run ``cmd``; the cpu seconds of each role, and its output."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    roles: dict[int, str | None] = {}
    last: dict[int, tuple[str, int]] = {}
    t0 = time.monotonic()
    while proc.poll() is None:
        if time.monotonic() - t0 < FIND:
            todo = [proc.pid]
            while todo:
                pid = todo.pop()
                if roles.get(pid) is None:  # a worker is named just after its fork
                    roles[pid] = role(pid, proc.pid)
                if roles[pid] is not None:  # a task's children are no business of ours
                    todo.extend(children_of(pid))
        for pid, what in roles.items():
            if what is not None:
                try:
                    last[pid] = (what, cpu_ticks(pid))
                except OSError:
                    pass  # gone: its last reading counts
        time.sleep(LOOK)
    out = proc.stdout.read() if proc.stdout else ""
    if proc.returncode != 0:
        raise RuntimeError(f"pmc failed ({proc.returncode}): {' '.join(cmd)}\n{out[-3000:]}")
    seconds = {"master": 0.0, "workers": 0.0, "guards": 0.0}
    for what, ticks in last.values():
        seconds[what] += ticks / TICK
    return seconds, out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trees", metavar="NAME=CHECKOUT,...",
                   help="checkouts to run by turns (default: this one)")
    p.add_argument("--tasks", type=int, default=10000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--keep", metavar="DIR", help="work here (kept) instead of a temp dir")
    args = p.parse_args(argv)
    trees = [(name or "this", tree) for name, tree in parse_trees(args.trees)]
    work = workdir(args.keep)
    dag = work / "owncpu.dag"
    write_independent(dag, args.tasks)
    print(f"machine: {machine()}")
    print(f"{args.tasks} /bin/true, pmc run --workers {args.workers}; checkouts: "
          + ", ".join(f"{name}={tree}" for name, tree in trees))
    parts: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
    for rnd in range(1, args.rounds + 1):
        for name, tree in trees if rnd % 2 else trees[::-1]:
            clear_run_files(dag)
            cmd = [PYTHON, "-m", "pmc", "run", dag.name, "-q", "-s", "-o", os.devnull,
                   "--local", "--workers", str(args.workers)]
            seconds, out = watch(cmd, work, pmc_env(tree))
            m = SUMMARY.search(out)
            if m is None:
                raise RuntimeError(f"no [cluster-summary] record: {' '.join(cmd)}\n{out[-3000:]}")
            rate = args.tasks / float(m.group(6))
            per = {k: v / args.tasks * 1e6 for k, v in seconds.items()}
            parts[name].append(per)
            print(f"round {rnd}: {name:>8} own cpu {sum(per.values()):4.0f} µs/task (master "
                  f"{per['master']:.0f}, workers {per['workers']:.0f}, guards "
                  f"{per['guards']:.0f})  {rate:5.0f} tasks/s", flush=True)
    own = {name: [sum(p.values()) for p in runs] for name, runs in parts.items()}
    first = trees[0][0]
    summary = []
    for name, _ in trees:
        med = {k: median([p[k] for p in parts[name]]) for k in parts[name][0]}
        line = (f"{name} {median(own[name]):.0f} µs (master {med['master']:.0f}, workers "
                f"{med['workers']:.0f}, guards {med['guards']:.0f})")
        if name != first:
            fewer = sum(a < b for a, b in zip(own[name], own[first], strict=True))
            line += f", less than {first} in {fewer} of {args.rounds} rounds"
        summary.append(line)
    print("SUMMARY own cpu a task (median): " + "; ".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
