"""First task: wall time from the start of a run to the start of its first task, on big DAGs.

    python benchmarks/firsttask.py                         # 1M tasks + 1M edges, 3 rounds
    python benchmarks/firsttask.py --shapes options --reference /path/to/pegasus-mpi-cluster
    python benchmarks/firsttask.py --trees old=/tmp/base,new=. --rounds 5
    python benchmarks/firsttask.py --size 10000000 --shapes options --rounds 1 \
        --window 10 --timeout 900 --reference /path/to/pegasus-mpi-cluster   # 10M
    python benchmarks/firsttask.py --size 1000000,10000000 --shapes options  # both, by turns

Shapes (those of ``benchmarks/scale.py``): "plain" (``TASK t12 /bin/true -n 12``),
"options" (``TASK t12 -m 1 -c 1 /bin/true arg12``, as planners write them) and "pegasus"
(the same with a ``#@ SEQ TRANSFORMATION DAX_ID`` line before every TASK), n tasks and n
"local" edges, in random order or (``--edge-order by-parent``) grouped by parent as
Pegasus writes them. Every task runs a small script instead of /bin/true (the same text
length as far as the parser cares): the first one to start writes the time into a
stamp file with ``set -C``, so later ones cannot overwrite it. The run is killed as soon
as the stamp is there: only the time to the first task is measured.

Each round runs, by turns, ``pmc run --local --workers W -q -s`` of every tree given
(``--trees NAME=CHECKOUT,...``; default: this checkout), with ``--mpi`` each tree also
as users start it under MPI (the pip MPI's ``mpiexec``, ``-n W+1``, no binding flags) and,
with ``--reference``, the reference under ``/usr/bin/mpiexec.openmpi -n W+1`` on the
same DAG; rounds interleave
so that the machine's drift falls on all alike. Reported per shape and runner: the
median (and range) of first-task seconds, of the cpu seconds its processes had used by
then (utime + stime from /proc, polled every 20 ms with the peaks: on a shared machine
it moves less than the wall time), and the highest peak RSS (VmHWM, polled every
20 ms) of the master, of the edge helper and of any other process of the run. With
``--window S`` each run goes on for S seconds after its first task, and the tasks started
in that time (every task adds a byte to a count file) give the throughput at the start;
the peaks then run to the window's end. With several sizes (``--size 1000000,10000000``)
every round runs each size by turns, each in a directory of its own under the work
directory, and the medians' ratios are printed: the largest size's against the
smallest's, taken in the same minutes.
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import (
    PYTHON,
    TICK,
    clear_run_files,
    cmdline,
    cpu_ticks,
    descendants,
    hwm_mb,
    machine,
    median,
    mpiexec,
    parent_of,
    pmc_env,
    reference_launch,
    write_big,
)
from scale import write_with_options

# Runs as every task; "$0.stamp" is next to the script. set -C: only the first writes.
# The run's token (tasks inherit the environment) before the time: a task of a run
# before, killed as it started, may still write.
# Every task adds a byte to "$0.count": the tasks started, for the throughput at the start.
_STAMP_SCRIPT = ('#!/bin/sh\nset -C\n{ echo "$FIRSTTASK_RUN $(date +%s.%N)" > "$0.stamp"; } '
                 '2>/dev/null\nprintf . >> "$0.count"\nexit 0\n')


def write_shape(work: Path, shape: str, n: int, script: Path, by_parent: bool = False) -> Path:
    """The DAG of ``shape`` with ``script`` in place of /bin/true (written once); with
    ``by_parent`` its EDGE lines grouped by parent, as Pegasus writes them."""
    order = "-by-parent" if by_parent else ""
    path = work / f"first-{shape}-{n}{order}.dag"
    if path.exists():
        return path
    raw = work / f"raw-{shape}-{n}{order}.dag"
    if shape == "plain":
        write_big(raw, n, n, local=True, by_parent=by_parent)
    else:
        write_with_options(raw, n, n, pegasus=shape == "pegasus", by_parent=by_parent)
    old, new = b" /bin/true ", b" " + bytes(script) + b" "
    with open(raw, "rb") as src, open(path, "wb") as dst:
        rest = b""
        for block in iter(lambda: src.read(1 << 20), b""):
            # Whole lines, so that no match is cut in two; the last partial line waits.
            block = rest + block
            end = block.rfind(b"\n") + 1
            dst.write(block[:end].replace(old, new))
            rest = block[end:]
        dst.write(rest.replace(old, new))
    raw.unlink()
    return path


def first_task(argv: list[str], stamp: Path, cwd: Path, env: dict[str, str],
               timeout: float = 300, window: float = 0.0) -> dict[str, float]:
    """Start ``argv``; seconds until the stamp's time, peak RSS by kind of process, and
    with ``window`` the tasks started per second in that many seconds from the first."""
    stamp.unlink(missing_ok=True)
    count = Path(f"{stamp.with_suffix('')}.count")
    count.unlink(missing_ok=True)
    first = cpu = 0.0
    peaks = {"master": 0.0, "helper": 0.0, "other": 0.0}
    token = str(time.time_ns())
    shm_before = _shm_segments()
    errors = cwd / "firsttask.stderr"
    t0 = time.time()
    with errors.open("wb") as stderr:
        proc = subprocess.Popen(argv, cwd=cwd, env=dict(env, FIRSTTASK_RUN=token),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=stderr, start_new_session=True)
    seen: set[int] = set()
    ticks: dict[int, int] = {}  # cpu of each process of the run, last seen
    master = -1
    try:
        while not first or time.time() < first + window:
            if proc.poll() is not None:
                if not first and (first := _first_stamp(stamp, token)):
                    cpu = sum(ticks.values()) / TICK  # a task started as the run ended
                if first:
                    break  # the run ended inside the window: every task it started counts
                raise RuntimeError(f"exit {proc.returncode} before a task started: {argv}:\n"
                                   + errors.read_text(errors="replace")[-2000:])
            if not first and time.time() - t0 > timeout:
                raise RuntimeError(f"no task started in {timeout} s: {argv}")
            if master < 0:
                # Once found, kept: a look that missed it made another rank the
                # master, and the master an "other" process with its own peak.
                master = _master(proc.pid, argv)
            for pid in descendants(proc.pid):
                seen.add(pid)
                # Forked (or vforked: posix_spawn, subprocess) and not yet exec'd: the
                # master's own pages, shared. Its parent is read now, not from a list
                # taken before: a child started in between would count as "other".
                if pid != master and parent_of(pid) == master \
                        and cmdline(pid) == cmdline(master):
                    continue
                if master >= 0:  # (peaks are high-water marks: none is lost meanwhile)
                    kind = ("master" if pid == master
                            else "helper" if "edgehelper" in cmdline(pid) else "other")
                    peaks[kind] = max(peaks[kind], hwm_mb(pid))
                try:
                    ticks[pid] = cpu_ticks(pid)
                except (OSError, ValueError, IndexError):
                    pass  # gone: its last figure stays
            time.sleep(0.02)
            if first:
                continue
            first = _first_stamp(stamp, token)
            if first:
                cpu = sum(ticks.values()) / TICK
        started = count.stat().st_size if window and count.exists() else 0
        return {"first_s": first - t0, "cpu_s": cpu, "rate": started / window if window else 0,
                **{f"{k}_mb": v for k, v in peaks.items()}}
    finally:
        seen.update(descendants(proc.pid))
        for pid in seen:  # processes of this run only: our session, or started by it
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        proc.wait()
        # Until every one is gone: one still dying holds the DAG's lock (on a busy
        # machine the next run, the reference's, once found it locked and exited).
        end = time.time() + 60
        while time.time() < end and any(Path(f"/proc/{pid}").exists()
                                        and _state(pid) != "Z" for pid in seen):
            time.sleep(0.05)
        # What MPI's shared memory left behind the killed run (Open MPI's and MPICH's
        # segments are removed at a normal end only), else they pile up in /dev/shm:
        # those that appeared meanwhile and that no process has mapped.
        left = _shm_segments() - shm_before
        if left:
            for path in left - _mapped():
                path.unlink(missing_ok=True)


def _shm_segments() -> set[Path]:
    """MPI's shared-memory segments in /dev/shm (Open MPI's vader, MPICH's)."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        return set()
    return set(shm.glob("vader_segment.*")) | set(shm.glob("mpich_shm_*"))


def _mapped() -> set[Path]:
    """The files under /dev/shm that some process has mapped."""
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:
            continue  # gone, or not ours to read
        mapped.update(Path(line.split(None, 5)[5]) for line in text.splitlines()
                      if " /dev/shm/" in line and len(line.split(None, 5)) == 6)
    return mapped


def _first_stamp(stamp: Path, token: str) -> float:
    """The time this run's first task wrote in the stamp file (0.0: none yet)."""
    try:
        text = stamp.read_text()
    except FileNotFoundError:
        return 0.0
    if not text.endswith("\n"):
        return 0.0
    if text.split()[0] != token:
        # A task of a run before, killed as it started: not this run's.
        stamp.unlink(missing_ok=True)
        return 0.0
    return float(text.split()[1])


def _state(pid: int) -> str:
    """A process's state letter ("Z": a zombie, gone but for its parent's wait)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def _master(pid: int, argv: list[str]) -> int:
    """pmc's master is the process started; under a launcher, rank 0 (by the rank the
    launcher put in its environment; its children share it, and come later: the lowest
    pid), below the launcher's proxy if it has one. -1 while there is none yet."""
    if "mpiexec" not in Path(argv[0]).name:
        return pid
    ranks = [p for p in descendants(pid)[1:]
             if ("pegasus-mpi-cluster" in cmdline(p) or " pmc " in f" {cmdline(p)} ")
             and "edgehelper" not in cmdline(p) and _launcher_rank(p) == "0"]
    return min(ranks, default=-1)


def _launcher_rank(pid: int) -> str | None:
    """The rank an MPI launcher gave a process, from its environment (None: none)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return None
    for item in env:
        key, _, value = item.partition(b"=")
        if key in (b"PMI_RANK", b"OMPI_COMM_WORLD_RANK", b"PMIX_RANK"):
            return value.decode()
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", default="1000000",
                   help="tasks (and edges); several, comma-separated: run by turns")
    p.add_argument("--shapes", default="plain,options,pegasus")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=300, help="seconds to the first task")
    p.add_argument("--trees", default=f"pmc={Path(__file__).resolve().parent.parent}",
                   help="NAME=CHECKOUT,...: pmc checkouts to run by turns")
    p.add_argument("--mpi", action="store_true",
                   help="also run each tree under the pip MPI's mpiexec (-n W+1, --mpi)")
    p.add_argument("--reference", metavar="BINARY", help="the reference's binary, run too")
    p.add_argument("--keep", metavar="DIR", help="write DAGs into DIR and keep them")
    p.add_argument("--edge-order", choices=("random", "by-parent"), default="random",
                   help="EDGE lines in random order (the default: the parser's lookups "
                        "miss every cache), or grouped by parent in task order, as "
                        "Pegasus's planner writes them")
    p.add_argument("--window", type=float, default=0.0, metavar="S",
                   help="also the tasks started per second in S seconds from the first "
                        "(the peaks then run to its end)")
    args = p.parse_args(argv)
    # Stopped with SIGTERM: unwind, so that the run in progress is killed too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="pmc-first-",
                                                                   dir=shm))
    work.mkdir(parents=True, exist_ok=True)
    sizes = [int(size) for size in args.size.split(",")]
    homes = {size: work / str(size) if len(sizes) > 1 else work for size in sizes}
    for home in homes.values():
        home.mkdir(exist_ok=True)
        (home / "stamp.sh").write_text(_STAMP_SCRIPT)
        (home / "stamp.sh").chmod(0o755)
    trees = dict(item.split("=", 1) for item in args.trees.split(",") if item)
    runners: dict[str, tuple[list[str], dict[str, str]]] = {}
    for name, tree in trees.items():
        env = pmc_env()
        env["PYTHONPATH"] = str(Path(tree).resolve())
        compileall.compile_dir(str(Path(tree) / "pmc"), quiet=1)  # as installed
        pmc = [PYTHON, "-m", "pmc", "run", "-q", "-s", "-o", os.devnull, "-e", os.devnull]
        runners[name] = ([*pmc, "--local", "--workers", str(args.workers)], env)
        if args.mpi:
            runners[f"{name}-mpi"] = ([mpiexec(), "-n", str(args.workers + 1), *pmc,
                                       "--mpi"], env)
    if args.reference:
        launch, extra = reference_launch(args.workers + 1, args.reference)
        runners["reference"] = ([*launch, "-s", "-o", os.devnull, "-e", os.devnull],
                                dict(os.environ, **extra))
    print(f"machine: {machine()}")
    print(f"work dir: {work}; {args.size} tasks + as many local edges "
          f"({args.edge_order} order); {args.rounds} interleaved rounds")
    results: dict[tuple[int, str, str], list[dict[str, float]]] = {}
    shapes = [s for s in args.shapes.split(",") if s]
    dags = {(size, shape): write_shape(homes[size], shape, size, homes[size] / "stamp.sh",
                                       by_parent=args.edge_order == "by-parent")
            for size in sizes for shape in shapes}
    for r in range(args.rounds):
        for (size, shape), dag in dags.items():
            for name, (cmd, env) in runners.items():
                got = first_task([*cmd, str(dag)], homes[size] / "stamp.sh.stamp",
                                 homes[size], env, timeout=args.timeout, window=args.window)
                results.setdefault((size, shape, name), []).append(got)
                print(f"round {r + 1} {_label(size, sizes)}{shape:8s} {name:10s} first task "
                      f"{got['first_s']:6.2f} s  cpu {got['cpu_s']:5.2f} s"
                      f"  master {got['master_mb']:4.0f} MB"
                      f"  helper {got['helper_mb']:4.0f} MB"
                      f"  other {got['other_mb']:4.0f} MB"
                      + (f"  {got['rate']:5.0f} tasks/s" if args.window else ""), flush=True)
                clear_run_files(dag)
    parts = []
    for (size, shape, name), got in results.items():
        firsts = [g["first_s"] for g in got]
        cpus = [g["cpu_s"] for g in got]
        peak = {k: max(g[f"{k}_mb"] for g in got) for k in ("master", "helper", "other")}
        line = (f"{_label(size, sizes)}{shape} {name}: first task median {median(firsts):.2f} s "
                f"({min(firsts):.2f}-{max(firsts):.2f}), cpu median {median(cpus):.2f} s "
                f"({min(cpus):.2f}-{max(cpus):.2f}), peak master {peak['master']:.0f} MB, "
                f"helper {peak['helper']:.0f} MB, other {peak['other']:.0f} MB")
        if args.window:
            rates = [g["rate"] for g in got]
            line += f", {median(rates):.0f} tasks/s in the first {args.window:g} s"
        print(line)
        parts.append(line)
    if len(sizes) > 1:
        big, small = max(sizes), min(sizes)
        for shape in shapes:
            for name in runners:
                ratio = (median([g["first_s"] for g in results[big, shape, name]])
                         / median([g["first_s"] for g in results[small, shape, name]]))
                line = f"{shape} {name}: first task {big} / {small}: {ratio:.1f}x"
                print(line)
                parts.append(line)
    print("SUMMARY firsttask: " + "; ".join(parts))
    if not args.keep:
        shutil.rmtree(work)
    return 0


def _label(size: int, sizes: list[int]) -> str:
    """The size in a line of results, where there are several."""
    return f"{size:>9d} " if len(sizes) > 1 else ""


if __name__ == "__main__":
    sys.exit(main())
