"""Task arrays: one ``--array`` line of N members against the same N plain TASK lines.

    python benchmarks/arrays.py                      # 1M tasks, 1 round, whole runs
    python benchmarks/arrays.py --first-only --rounds 3   # time to first task and RSS only
    python benchmarks/arrays.py --size 100000 --rounds 3 --trees old=/tmp/old,new=.

The two DAGs run the same N tasks, ``/bin/true`` each (no argument, as the floor of
``throughput.py`` runs it): ``TASK t --array 0-(N-1) /bin/true`` and N lines ``TASK tI
/bin/true``. Each is run as users run pmc: ``pmc run --local --workers W -s -o
/dev/null -e /dev/null DAG`` (the task output and records to /dev/null; the summary
record, which always goes to stdout, read from there), the two by turns, round after
round, so that the machine's drift falls on both alike.

Per run: the time from the start of the command to its first task's end (the first
record in the rescue log, written and synced as the first result comes in: the first
start plus that task's few milliseconds, alike for both DAGs); with whole runs, the
run's rate (tasks / the ``[cluster-summary]`` duration, workers' start to the last
result), its end-to-end rate (tasks / the command's wall time) and the cpu of every
process of the run (the master, its workers and the edge helper, and the tasks they
waited for: wait4's); and the peak RSS (VmHWM, polled every 10 ms, the last look at the
end) of the master, of the largest worker and of any other process of pmc's (the
workers' guards, and the edge helper that a big plain DAG gets).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import (
    PYTHON,
    REPO,
    SUMMARY,
    clear_run_files,
    cmdline,
    descendants,
    hwm_mb,
    machine,
    median,
    pmc_env,
)

KINDS = ("array", "plain")


def write_dags(work: Path, n: int) -> dict[str, Path]:
    """The two DAGs of ``n`` /bin/true tasks (written once per size)."""
    array = work / f"array-{n}.dag"
    plain = work / f"plain-{n}.dag"
    if not array.exists():
        array.write_text(f"TASK t --array 0-{n - 1} /bin/true\n")
    if not plain.exists():
        with open(plain, "w", buffering=1 << 20) as f:
            for i in range(n):
                f.write(f"TASK t{i} /bin/true\n")
    return {"array": array, "plain": plain}


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _peaks(master: int, peaks: dict[str, float]) -> None:
    """Raise ``peaks`` to the processes' VmHWM now: the master, workers, the others (not
    the tasks, /bin/true, too short-lived to matter or to be seen)."""
    for pid in descendants(master):
        if pid == master:
            kind = "master"
        elif _comm(pid).startswith("pmc-worker"):
            kind = "worker"
        elif "python" in cmdline(pid) or "pmc" in cmdline(pid):
            kind = "other"
        else:
            continue
        peaks[kind] = max(peaks[kind], hwm_mb(pid))


def run(dag: Path, workers: int, env: dict[str, str], first_only: bool,
        timeout: float) -> dict[str, float]:
    """One run (or its start, with ``first_only``): its figures, by name."""
    clear_run_files(dag)
    rescue = Path(f"{dag}.rescue")
    cmd = [PYTHON, "-m", "pmc", "run", "--local", "--workers", str(workers), "-s",
           "-o", os.devnull, "-e", os.devnull, str(dag)]
    peaks = {"master": 0.0, "worker": 0.0, "other": 0.0}
    got: dict[str, float] = {}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=dag.parent, env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=err, start_new_session=True)
        try:
            while True:
                _peaks(proc.pid, peaks)
                if "first_s" not in got and rescue.exists() and rescue.stat().st_size:
                    got["first_s"] = time.monotonic() - t0
                    if first_only:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
                        return {**got, **{f"{k}_mb": v for k, v in peaks.items()}}
                # Reaped here, for the cpu of the whole run (wait4's).
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    proc.returncode = os.waitstatus_to_exitcode(status)
                    break
                if time.monotonic() - t0 > timeout:
                    raise RuntimeError(f"no end in {timeout} s: {' '.join(cmd)}")
                time.sleep(0.01)
        finally:
            if proc.returncode is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
        wall = time.monotonic() - t0
        out.seek(0)
        text = out.read().decode(errors="replace")
        err.seek(0)
        m = SUMMARY.search(text)
        if status != 0 or m is None:
            raise RuntimeError(f"pmc failed ({status}): {' '.join(cmd)}\n{text[-2000:]}"
                               f"{err.read().decode(errors='replace')[-2000:]}")
    tasks = int(m.group(4))
    duration = float(m.group(6))
    return {**got, "rate": tasks / duration, "e2e_rate": tasks / wall, "wall_s": wall,
            "cpu_us": 1e6 * (usage.ru_utime + usage.ru_stime) / tasks,
            **{f"{k}_mb": v for k, v in peaks.items()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", type=int, default=1_000_000, help="tasks (members)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--first-only", action="store_true",
                   help="stop each run at its first task (first task and peak RSS only)")
    p.add_argument("--trees", default=f"pmc={REPO}",
                   help="NAME=CHECKOUT,...: pmc checkouts to run by turns")
    p.add_argument("--keep", metavar="DIR", help="write the DAGs into DIR and keep them")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per run")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="pmc-arrays-",
                                                                   dir=shm))
    work.mkdir(parents=True, exist_ok=True)
    dags = write_dags(work, args.size)
    trees = dict(item.split("=", 1) for item in args.trees.split(",") if item)
    envs = {name: pmc_env(Path(tree).resolve()) for name, tree in trees.items()}
    print(f"machine: {machine()}")
    print(f"{args.size} /bin/true tasks: one --array line against {args.size} TASK lines; "
          f"--local --workers {args.workers}; {args.rounds} interleaved round(s)"
          + ("; each run stopped at its first task" if args.first_only else ""))
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    for r in range(args.rounds):
        kinds = KINDS if r % 2 == 0 else KINDS[::-1]
        for kind in kinds:
            for name, env in envs.items():
                got = run(dags[kind], args.workers, env, args.first_only, args.timeout)
                results.setdefault((kind, name), []).append(got)
                rates = ("" if args.first_only else
                         f"  rate {got['rate']:7.0f}/s  end to end {got['e2e_rate']:7.0f}/s"
                         f"  cpu {got['cpu_us']:5.0f} us/task")
                print(f"round {r + 1} {kind:5s} {name:8s} first task {got['first_s']:6.2f} s"
                      f"{rates}  master {got['master_mb']:5.0f} MB  worker "
                      f"{got['worker_mb']:4.0f} MB  other {got['other_mb']:4.0f} MB",
                      flush=True)
    parts = []
    for (kind, name), got in results.items():
        first = [g["first_s"] for g in got]
        line = (f"{kind} {name}: first task median {median(first):.2f} s "
                f"({min(first):.2f}-{max(first):.2f})")
        if not args.first_only:
            rate = [g["rate"] for g in got]
            line += (f", rate median {median(rate):.0f}/s ({min(rate):.0f}-{max(rate):.0f}),"
                     f" end to end {median([g['e2e_rate'] for g in got]):.0f}/s, cpu "
                     f"{median([g['cpu_us'] for g in got]):.0f} us/task")
        line += "".join(f", peak {k} {max(g[f'{k}_mb'] for g in got):.0f} MB"
                        for k in ("master", "worker", "other"))
        print(line)
        parts.append(line)
    print("SUMMARY arrays: " + "; ".join(parts))
    if not args.keep:
        for path in work.iterdir():
            path.unlink()
        work.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
