"""Idle cost and concurrency: thousands of sleeping tasks, and what pmc burns meanwhile.

    python benchmarks/idle.py                        # 4,000 x sleep 60, embedded and MPI
    python benchmarks/idle.py --tasks 200 --sleep 15 --window 5 --modes local

Runs N ``sleep S`` tasks at once (W worker ranks with N/W slots each, --host-cpus N),
waits until all N are running (the ramp: how long, and how much of a core the master
used meanwhile), then reads utime + stime of the master, the workers and their guards
from /proc/PID/stat at the start and end of a window while every task sleeps, and
reports their CPU as a share of one core. The MPI launcher's own processes (mpiexec,
hydra proxy) are reported apart. The run is then left to finish and must succeed.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from _common import (
    PYTHON,
    TICK,
    children_of,
    clear_run_files,
    cmdline,
    cpu_ticks,
    machine,
    mpiexec,
    pmc_env,
    workdir,
)


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        kids = children_of(p)
        out.extend(kids)
        todo.extend(kids)
    return out


def classify(root: int, mode: str) -> tuple[int, list[int], list[int], list[int]]:
    """(master, pmc helper processes: workers and guards, tasks, launcher processes)."""
    procs = [root, *descendants(root)]
    master = -1
    pmc: list[int] = []
    tasks: list[int] = []
    launcher: list[int] = []
    for pid in procs:
        cmd = cmdline(pid)
        if not cmd:
            continue
        if cmd.startswith("sleep") or "/sleep " in cmd or cmd.endswith("/sleep"):
            tasks.append(pid)
        elif mode == "local" and pid == root:
            master = pid
        elif " -m pmc run" in cmd or cmd.endswith("-m pmc"):
            if master < 0 and _rank(pid) == 0:
                master = pid
            else:
                pmc.append(pid)
        elif "pmc.runtime.worker" in cmd or "pmc/runtime/guard.py" in cmd:
            pmc.append(pid)
        else:
            launcher.append(pid)
    return master, pmc, tasks, launcher


def _rank(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                for var in (b"PMI_RANK=", b"OMPI_COMM_WORLD_RANK=", b"PMIX_RANK="):
                    if item.startswith(var):
                        return int(item[len(var):])
    except (OSError, ValueError):
        pass
    return -1


def ticks(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            total += cpu_ticks(pid)
        except (OSError, ValueError, IndexError):
            pass
    return total


def one(mode: str, work: Path, n: int, workers: int, sleep: float, window: float,
        timeout: float) -> dict[str, float]:
    dag = work / f"idle-{mode}.dag"
    with open(dag, "w") as f:
        f.writelines(f"TASK s{i} sleep {sleep:g}\n" for i in range(n))
    clear_run_files(dag)
    slots = -(-n // workers)
    args = ["run", str(dag), "-q", "-s", "-o", os.devnull, "--worker-slots", str(slots),
            "--host-cpus", str(slots * workers)]
    if mode == "mpi":
        cmd = [mpiexec(), "-n", str(workers + 1), PYTHON, "-m", "pmc", *args, "--mpi"]
    else:
        cmd = [PYTHON, "-m", "pmc", *args, "--local", "--workers", str(workers)]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=work, env=pmc_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        master = -1
        running = 0
        deadline = t0 + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            master, _pmc, tasks, _launcher = classify(proc.pid, mode)
            running = len(tasks)
            if running >= n and master > 0:
                break
            time.sleep(0.05)
        ramp = time.monotonic() - t0
        if running < n:
            raise RuntimeError(f"{mode}: only {running} of {n} tasks running after "
                               f"{ramp:.0f} s")
        master, pmc, tasks, launcher = classify(proc.pid, mode)
        master_ramp = cpu_ticks(master) / TICK
        start_m, start_p, start_l = ticks([master]), ticks(pmc), ticks(launcher)
        w0 = time.monotonic()
        time.sleep(window)
        end_m, end_p, end_l = ticks([master]), ticks(pmc), ticks(launcher)
        elapsed = time.monotonic() - w0
        still = len(classify(proc.pid, mode)[2])
        out, _ = proc.communicate(timeout=sleep + timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"{mode}: pmc exited {proc.returncode}\n{out[-2000:]}")
    return {
        "tasks": n, "ramp_s": ramp, "master_ramp_core": master_ramp / ramp,
        "window_s": elapsed, "still_running": still, "helpers": len(pmc),
        "master_pct": (end_m - start_m) / TICK / elapsed * 100,
        "workers_pct": (end_p - start_p) / TICK / elapsed * 100,
        "launcher_pct": (end_l - start_l) / TICK / elapsed * 100,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", type=int, default=4000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--sleep", type=float, default=60.0)
    p.add_argument("--window", type=float, default=30.0, help="seconds measured")
    p.add_argument("--modes", default="local,mpi")
    p.add_argument("--timeout", type=float, default=120.0, help="for the ramp")
    p.add_argument("--keep", metavar="DIR")
    args = p.parse_args(argv)
    work = workdir(args.keep)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)
    try:
        pid_max = Path("/proc/sys/kernel/pid_max").read_text().strip()
    except OSError:
        pid_max = "?"
    print(f"machine: {machine()}")
    print(f"limits: RLIMIT_NOFILE {soft}/{hard}, RLIMIT_NPROC {nproc[0]}, pid_max {pid_max}")
    parts = []
    for mode in [m for m in args.modes.split(",") if m]:
        r = one(mode, work, args.tasks, args.workers, args.sleep, args.window, args.timeout)
        busy = r["master_pct"] + r["workers_pct"]
        print(f"{mode}: {r['tasks']} tasks running after {r['ramp_s']:.1f} s (master used "
              f"{r['master_ramp_core']:.2f} of a core meanwhile); over {r['window_s']:.0f} s "
              f"with {r['still_running']} sleeping: master {r['master_pct']:.2f}%, "
              f"{r['helpers']} worker/guard processes {r['workers_pct']:.2f}% "
              f"(together {busy:.2f}% of one core)"
              + (f"; launcher {r['launcher_pct']:.2f}%" if mode == "mpi" else ""), flush=True)
        parts.append(f"{mode} {r['tasks']} tasks: ramp {r['ramp_s']:.1f} s, master "
                     f"{r['master_ramp_core']:.2f} core; idle {busy:.2f}% of a core")
    print("SUMMARY idle: " + "; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
