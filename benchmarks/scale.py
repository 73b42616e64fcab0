"""Scale: parse + validate time, master memory, and master CPU per task, by DAG size.

    python benchmarks/scale.py                       # 10k / 100k / 1M tasks, as many edges
    python benchmarks/scale.py --sizes 1000,10000 --edges local
    python benchmarks/scale.py --sizes 1000000 --edges options,pegasus

For each size and edge pattern a fresh interpreter (so RSS figures are its own):
1. writes the DAG (n tasks, n edges; "local" edges join tasks at most 64 apart, as a
   planner writes them, "random" ones join any earlier task to any later one;
   "options" is "local" with options on every TASK line, ``TASK t12 -m 1 -c 1 /bin/true
   arg12``, and "pegasus" the same with a ``#@ SEQ TRANSFORMATION DAX_ID`` line before
   each TASK, as Pegasus writes clustered jobs),
2. times ``parse_dag`` (reading, validation, duplicate-edge and cycle checks) and takes
   the peak RSS after it; for a file big enough to get an edge helper (a second
   process resolving part of the EDGE lines, ``pmc.dag.edgehelper``), its cpu, and its peak
   RSS from a run of the helper's work on its own,
3. runs the real ``Master`` with every default observer (rescue log, resource log,
   status snapshot, tally) over an in-process transport whose workers finish a task the
   moment they get it, and reports the master's CPU per task and the run's peak RSS.
   The rescue log lives on tmpfs when /dev/shm exists, so its fdatasync costs no disk
   wait; every other cost of the master's loop is the real one.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import PYTHON, children_cpu, machine, pmc_env, write_big

HERE = Path(__file__).resolve().parent


def write_with_options(path: Path, n: int, edges: int, pegasus: bool) -> None:
    """The "local" DAG of ``write_big``, every TASK line with options (and, with
    ``pegasus``, a ``#@`` line before it)."""
    plain = path.with_suffix(".plain")
    write_big(plain, n, edges, local=True)
    with open(plain) as src, open(path, "w", buffering=1 << 20) as f:
        for line in src:
            if line.startswith("TASK "):
                name = line.split(None, 2)[1]
                i = int(name[5:])
                if pegasus:
                    f.write(f"#@ {i + 1} pegasus::transformation:1.0 ID{i + 1:07d}\n")
                line = f"TASK {name} -m 1 -c 1 /bin/true arg{i}\n"
            f.write(line)
    plain.unlink()


def peak_mb() -> float:
    """Peak RSS of this process image. VmHWM, not ru_maxrss: Linux carries ru_maxrss
    over from the parent across fork + exec, so a child would report the parent's."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def helper_mb(dag_path: str) -> float:
    """Peak RSS of the edge helper's work on this file, in a process of its own (the
    helper of a parse is not waited for in a way that would tell)."""
    from pmc.dag import edgehelper, reader

    if os.path.getsize(dag_path) < edgehelper.MIN_BYTES:
        return 0.0
    code = ("import io, os, sys; from pmc.dag import edgehelper; "
            "edgehelper.resolve(sys.argv[1], os.path.getsize(sys.argv[1]), int(sys.argv[2]), "
            "io.BytesIO()); print([l for l in open('/proc/self/status') "
            "if l.startswith('VmHWM:')][0].split()[1])")
    out = subprocess.run([sys.executable, "-c", code, dag_path, str(reader._CHUNK)],
                         capture_output=True, text=True, check=True).stdout
    return int(out) / 1024


def measure(dag_path: str, workers: int, slots: int) -> dict[str, float]:
    """In this process: parse, then a whole run of the master. Figures as a dict."""
    from pmc import log
    from pmc.dag import parse_dag
    from pmc.options import RunOptions
    from pmc.runtime.master import Master

    log.setup(log.WARN)
    base = peak_mb()
    t0 = time.perf_counter()
    c0 = time.process_time()
    h0 = children_cpu()
    dag = parse_dag(dag_path)
    parse_wall = time.perf_counter() - t0
    parse_cpu = time.process_time() - c0
    helper_cpu = children_cpu() - h0
    parse_rss = peak_mb()
    opts = RunOptions(dag=dag_path, skip_rescue=True, nolock=True, mode="local",
                      worker_slots=slots, host_cpus=workers * slots)
    from pmc.outputs import assemble

    sys.path.insert(0, str(HERE.parent / "tests"))  # the fakes the tests use too
    from fakes import InstantWorkers

    transport = InstantWorkers.on_one_host(workers, cpus=workers * slots, memory=1 << 20,
                                           slots=slots)
    master = Master(transport, opts, dag, set(), [], "local",
                    open_outputs=lambda: assemble.outputs(opts).observers)
    init_rss = peak_mb()
    gc.collect()
    c0 = time.process_time()
    t0 = time.perf_counter()
    summary = master.run()
    run_cpu = time.process_time() - c0
    run_wall = time.perf_counter() - t0
    master.shutdown_workers()
    master.close()
    if not summary.ok or summary.succeeded != len(dag):
        raise SystemExit(f"run did not succeed: {summary.outcome} {summary.succeeded}")
    return {
        "tasks": len(dag), "edges": dag.edge_count(), "parse_s": parse_wall,
        "parse_cpu_s": parse_cpu, "helper_cpu_s": helper_cpu,
        "helper_mb": helper_mb(dag_path), "base_mb": base, "parse_mb": parse_rss,
        "master_init_mb": init_rss, "peak_mb": peak_mb(), "run_cpu_s": run_cpu,
        "run_wall_s": run_wall, "us_per_task": run_cpu / len(dag) * 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="10000,100000,1000000")
    p.add_argument("--edges", default="local,random,options,pegasus",
                   help="DAG shapes: local, random, options, pegasus")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--slots", type=int, default=50, help="task slots per worker")
    p.add_argument("--keep", metavar="DIR", help="write DAGs into DIR and keep them")
    p.add_argument("--child", metavar="DAG", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child, args.workers, args.slots)))
        return 0

    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="pmc-scale-",
                                                                   dir=shm))
    work.mkdir(parents=True, exist_ok=True)
    print(f"machine: {machine()}")
    print(f"work dir: {work} ({'tmpfs' if shm and str(work).startswith(shm) else 'disk'}); "
          f"master with {args.workers} instant workers x {args.slots} slots")
    print(f"{'edges':7s} {'tasks':>9s} {'edge#':>9s} {'parse s':>8s} {'parse MB':>9s} "
          f"{'master MB':>9s} {'peak MB':>8s} {'run s':>7s} {'us/task':>8s} "
          f"{'helper cpu s':>12s} {'helper MB':>9s}")
    rows: list[tuple[str, dict[str, float]]] = []
    for pattern in [e for e in args.edges.split(",") if e]:
        for n in [int(x) for x in args.sizes.split(",") if x]:
            path = work / f"scale-{pattern}-{n}.dag"
            if not path.exists():
                if pattern in ("options", "pegasus"):
                    write_with_options(path, n, n, pegasus=pattern == "pegasus")
                else:
                    write_big(path, n, n, local=pattern == "local")
            proc = subprocess.run(
                [PYTHON, str(HERE / "scale.py"), "--child", str(path), "--workers",
                 str(args.workers), "--slots", str(args.slots)],
                capture_output=True, text=True, env=pmc_env(), cwd=work, check=False)
            if proc.returncode != 0:
                print(proc.stdout, proc.stderr, file=sys.stderr)
                return 1
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            rows.append((pattern, r))
            print(f"{pattern:7s} {r['tasks']:9d} {r['edges']:9d} {r['parse_s']:8.2f} "
                  f"{r['parse_mb']:9.0f} {r['master_init_mb']:9.0f} {r['peak_mb']:8.0f} "
                  f"{r['run_wall_s']:7.1f} {r['us_per_task']:8.1f} "
                  f"{r['helper_cpu_s']:12.2f} {r['helper_mb']:9.0f}", flush=True)
            if not args.keep:
                for suffix in ("", ".rescue", ".resource", ".status.json"):
                    try:
                        os.unlink(f"{path}{suffix}")
                    except FileNotFoundError:
                        pass
    if not args.keep:
        try:
            work.rmdir()
        except OSError:
            pass
    parts = []
    for pattern in dict.fromkeys(pat for pat, _ in rows):
        mine = [r for pat, r in rows if pat == pattern]
        small, big = mine[0], mine[-1]
        flat = big["us_per_task"] / small["us_per_task"] if small["us_per_task"] else 0.0
        parts.append(f"{pattern}: {int(big['tasks'])} tasks parse {big['parse_s']:.2f} s, "
                     f"peak {big['peak_mb']:.0f} MB, master CPU/task {big['us_per_task']:.0f} "
                     f"us = {flat:.2f}x of {int(small['tasks'])} tasks")
    print("SUMMARY scale: " + "; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
