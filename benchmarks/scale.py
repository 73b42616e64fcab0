"""Scale: parse + validate time, master memory, and master CPU per task, by DAG size.

    python benchmarks/scale.py                       # 10k / 100k / 1M tasks, as many edges
    python benchmarks/scale.py --sizes 1000,10000 --edges local
    python benchmarks/scale.py --sizes 1000000 --edges options,pegasus
    python benchmarks/scale.py --sizes 1000000,2000000,5000000,10000000 --edges options \
        --parse-only                                 # parse time and memory per task

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

With ``--cluster W1,W2,...`` it simulates clusters instead: W workers x ``--slots`` slots
(32 by default) spread over min(W, ``--hosts``) hosts (1,000 by default; consecutive
ranks share a host, as launchers place them by default, one cpu per slot), all of them
registering with the master (the hand-shake: CONFIG, HELLO, START), then the same
in-process run of a DAG of ``--tasks`` tasks with options on every line, one task in four
asking for 2 cpus (so hosts have free slots but not the cpus for the next task, and the
master must look past them). It reports the master's CPU for the hand-shake (``start``:
everything before the first task, the check that every task fits some host included)
and per task, for each W, with ``--trees`` running the same simulation against other
checkouts of pmc by turns (``old=/path,new=.``: checkouts with ``pmc.commands.lifecycle``,
whose ``Run`` takes the steps ``pmc run`` takes), and ``--profile FILE`` writing a
cProfile of the last child.
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
from typing import Any

from _common import PYTHON, children_cpu, clear_run_files, machine, pmc_env, write_big

HERE = Path(__file__).resolve().parent


def write_with_options(path: Path, n: int, edges: int, pegasus: bool,
                       wide_every: int = 0, by_parent: bool = False) -> None:
    """The "local" DAG of ``write_big``, every TASK line with options (and, with
    ``pegasus``, a ``#@`` line before it); with ``wide_every`` k, every k-th task asks
    for 2 cpus; ``by_parent``: the EDGE lines grouped by parent (``write_big``)."""
    plain = path.with_suffix(".plain")
    write_big(plain, n, edges, local=True, by_parent=by_parent)
    with open(plain) as src, open(path, "w", buffering=1 << 20) as f:
        for line in src:
            if line.startswith("TASK "):
                name = line.split(None, 2)[1]
                i = int(name[5:])
                if pegasus:
                    f.write(f"#@ {i + 1} pegasus::transformation:1.0 ID{i + 1:07d}\n")
                cpus = 2 if wide_every and i % wide_every == wide_every - 1 else 1
                line = f"TASK {name} -m 1 -c {cpus} /bin/true arg{i}\n"
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


def run_master(dag_path: str, dag: Any, transport: Any, slots: int, cpus: int
               ) -> dict[str, float]:
    """A whole run of the real ``Master`` over ``transport`` with every default observer,
    wired as ``pmc run`` wires it: the hand-shake's and the loop's CPU apart."""
    try:
        from pmc.commands.lifecycle import Run
    except ImportError:
        raise SystemExit("this checkout of pmc has no pmc.commands.lifecycle (older "
                         "than the benchmark)") from None
    from pmc.core.events import Fanout
    from pmc.options import RunOptions
    from pmc.outputs import assemble

    opts = RunOptions(dag=dag_path, skip_rescue=True, nolock=True, mode="local",
                      worker_slots=slots, host_cpus=cpus)
    run = Run(opts, dag, transport, Fanout(assemble.outputs(opts).observers), "local")
    init_rss = peak_mb()
    gc.collect()
    c0 = time.process_time()
    info = run.start()  # the heap settled first, as pmc run's
    start_cpu = time.process_time() - c0
    run.started(info)
    c0 = time.process_time()
    t0 = time.perf_counter()
    summary = run.loop()
    run_cpu = time.process_time() - c0
    run_wall = time.perf_counter() - t0
    run.shutdown()
    run.finished(summary)
    run.close()
    if not summary.ok or summary.succeeded != len(dag):
        raise SystemExit(f"run did not succeed: {summary.outcome} {summary.succeeded}")
    return {"master_init_mb": init_rss, "start_cpu_s": start_cpu, "run_cpu_s": run_cpu,
            "run_wall_s": run_wall, "us_per_task": run_cpu / len(dag) * 1e6,
            "peak_mb": peak_mb()}


def fakes() -> Any:
    """``tests/fakes.py``, the in-process transports the tests use too."""
    sys.path.insert(0, str(HERE.parent / "tests"))
    import fakes as module

    return module


def measure(dag_path: str, workers: int, slots: int, parse_only: bool = False
            ) -> dict[str, float]:
    """In this process: parse, then (unless ``parse_only``) a whole run of the master.
    Figures as a dict."""
    from pmc import log
    from pmc.dag import parse_dag

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
    if parse_only:
        run = {"master_init_mb": parse_rss, "start_cpu_s": 0.0, "run_cpu_s": 0.0,
               "run_wall_s": 0.0, "us_per_task": 0.0, "peak_mb": parse_rss}
    else:
        transport = fakes().InstantWorkers.on_one_host(workers, cpus=workers * slots,
                                                       memory=1 << 20, slots=slots)
        run = run_master(dag_path, dag, transport, slots, workers * slots)
    return {
        "tasks": len(dag), "edges": dag.edge_count(), "parse_s": parse_wall,
        "parse_cpu_s": parse_cpu, "helper_cpu_s": helper_cpu,
        "helper_mb": helper_mb(dag_path), "base_mb": base, "parse_mb": parse_rss, **run,
    }


def cluster_layout(workers: int, hosts: int) -> list[tuple[int, str]]:
    """(rank, host) of each worker: consecutive ranks on a host, in rank order."""
    hosts = min(workers, hosts)
    return [(rank, f"node{(rank - 1) * hosts // workers:05d}")
            for rank in range(1, workers + 1)]


def measure_cluster(dag_path: str, workers: int, slots: int, hosts: int,
                    profile: str | None) -> dict[str, float]:
    """In this process: the hand-shake and a whole run on a simulated cluster."""
    from pmc import log
    from pmc.dag import parse_dag

    log.setup(log.WARN)
    dag = parse_dag(dag_path)
    layout = cluster_layout(workers, hosts)
    per_host = -(-workers // min(workers, hosts))
    transport = fakes().InstantWorkers(layout, cpus=per_host * slots, memory=1 << 20,
                                       slots=slots)
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    r = run_master(dag_path, dag, transport, slots, per_host * slots)
    if profile:
        prof.disable()
        prof.dump_stats(profile)
    return {"tasks": len(dag), "workers": workers, "slots": slots,
            "hosts": len({h for _r, h in layout}), **r}


def cluster_main(args: argparse.Namespace) -> int:
    slots = args.slots or 32
    trees = [t.split("=", 1) if "=" in t else [t, t] for t in args.trees.split(",") if t]
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="pmc-cluster-",
                                                                   dir=shm))
    work.mkdir(parents=True, exist_ok=True)
    dag = work / f"cluster-{args.tasks}.dag"
    if not dag.exists():
        write_with_options(dag, args.tasks, args.tasks, pegasus=False, wide_every=4)
    print(f"machine: {machine()}")
    print(f"{args.tasks} tasks (1 in 4 with -c 2), {slots} slots per worker, up to "
          f"{args.hosts} hosts, one cpu per slot; trees by turns: "
          + ", ".join(f"{name}={path}" for name, path in trees))
    print(f"{'tree':6s} {'workers':>8s} {'hosts':>6s} {'slots':>8s} {'start cpu s':>11s} "
          f"{'run s':>7s} {'us/task':>8s} {'peak MB':>8s}")
    widths = [int(x) for x in args.cluster.split(",") if x]
    figures: dict[tuple[str, int], list[dict[str, float]]] = {}
    for _round in range(args.rounds):
        for w in widths:
            for name, path in trees:
                env = pmc_env()
                env["PYTHONPATH"] = str(Path(path).resolve()) + os.pathsep + env["PYTHONPATH"]
                argv = [PYTHON, str(HERE / "scale.py"), "--child-cluster", str(dag),
                        "--workers", str(w), "--slots", str(slots), "--hosts",
                        str(args.hosts)]
                if args.profile and w == widths[-1] and name == trees[-1][0]:
                    argv += ["--profile", args.profile]
                proc = subprocess.run(argv, capture_output=True, text=True, env=env,
                                      cwd=work, check=False)
                if proc.returncode != 0:
                    print(proc.stdout, proc.stderr, file=sys.stderr)
                    return 1
                r = json.loads(proc.stdout.strip().splitlines()[-1])
                figures.setdefault((name, w), []).append(r)
                print(f"{name:6s} {w:8d} {r['hosts']:6d} {w * slots:8d} "
                      f"{r['start_cpu_s']:11.2f} {r['run_wall_s']:7.1f} "
                      f"{r['us_per_task']:8.1f} {r['peak_mb']:8.0f}", flush=True)
                clear_run_files(dag)
    if not args.keep:
        dag.unlink()
        try:
            work.rmdir()
        except OSError:
            pass
    parts = []
    for name, _path in trees:
        best = {w: min(r["us_per_task"] for r in figures[(name, w)]) for w in widths}
        start = min(r["start_cpu_s"] for r in figures[(name, widths[-1])])
        ratio = best[widths[-1]] / best[widths[0]] if best[widths[0]] else 0.0
        parts.append(f"{name}: master CPU/task {best[widths[0]]:.1f} us at {widths[0]} "
                     f"workers, {best[widths[-1]]:.1f} us at {widths[-1]} = {ratio:.2f}x; "
                     f"start-up of {widths[-1]} ranks {start:.2f} s")
    print("SUMMARY cluster: " + "; ".join(parts))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="10000,100000,1000000")
    p.add_argument("--edges", default="local,random,options,pegasus",
                   help="DAG shapes: local, random, options, pegasus")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--slots", type=int, default=0,
                   help="task slots per worker (default 50; 32 with --cluster)")
    p.add_argument("--keep", metavar="DIR", help="write DAGs into DIR and keep them")
    p.add_argument("--cluster", metavar="W,...",
                   help="simulate clusters of these numbers of workers instead")
    p.add_argument("--hosts", type=int, default=1000,
                   help="with --cluster: the most hosts the workers spread over")
    p.add_argument("--tasks", type=int, default=1000000, help="with --cluster: DAG size")
    p.add_argument("--rounds", type=int, default=1, help="with --cluster: rounds")
    p.add_argument("--trees", default=".", metavar="NAME=DIR,...",
                   help="with --cluster: pmc checkouts to run by turns")
    p.add_argument("--profile", metavar="FILE",
                   help="with --cluster: cProfile of the largest cluster (last tree)")
    p.add_argument("--parse-only", action="store_true",
                   help="parse only, no run of the master (for 5M or 10M tasks)")
    p.add_argument("--child", metavar="DAG", help=argparse.SUPPRESS)
    p.add_argument("--child-cluster", metavar="DAG", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child, args.workers, args.slots or 50, args.parse_only)))
        return 0
    if args.child_cluster:
        print(json.dumps(measure_cluster(args.child_cluster, args.workers, args.slots,
                                         args.hosts, args.profile)))
        return 0
    if args.cluster:
        return cluster_main(args)
    args.slots = args.slots or 50

    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="pmc-scale-",
                                                                   dir=shm))
    work.mkdir(parents=True, exist_ok=True)
    print(f"machine: {machine()}")
    print(f"work dir: {work} ({'tmpfs' if shm and str(work).startswith(shm) else 'disk'}); "
          f"master with {args.workers} instant workers x {args.slots} slots")
    print(f"{'edges':7s} {'tasks':>9s} {'edge#':>9s} {'parse s':>8s} {'parse MB':>9s} "
          f"{'master MB':>9s} {'peak MB':>8s} {'run s':>7s} {'us/task':>8s} "
          f"{'helper cpu s':>12s} {'helper MB':>9s} {'parse cpu us/task':>17s} "
          f"{'parse B/task':>12s}")
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
                 str(args.workers), "--slots", str(args.slots),
                 *(["--parse-only"] if args.parse_only else [])],
                capture_output=True, text=True, env=pmc_env(), cwd=work, check=False)
            if proc.returncode != 0:
                print(proc.stdout, proc.stderr, file=sys.stderr)
                return 1
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            rows.append((pattern, r))
            print(f"{pattern:7s} {r['tasks']:9d} {r['edges']:9d} {r['parse_s']:8.2f} "
                  f"{r['parse_mb']:9.0f} {r['master_init_mb']:9.0f} {r['peak_mb']:8.0f} "
                  f"{r['run_wall_s']:7.1f} {r['us_per_task']:8.1f} "
                  f"{r['helper_cpu_s']:12.2f} {r['helper_mb']:9.0f} "
                  f"{r['parse_cpu_s'] / r['tasks'] * 1e6:17.2f} "
                  f"{(r['parse_mb'] - r['base_mb']) * 2**20 / r['tasks']:12.0f}", flush=True)
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

        def per_task(r: dict[str, float]) -> tuple[float, float]:
            return (r["parse_cpu_s"] / r["tasks"],
                    (r["parse_mb"] - r["base_mb"]) / r["tasks"])

        # (A tiny DAG's parse may move the peak by nothing: no ratio then.)
        growth = [f"{b / a:.2f}x" if a > 0 else "-" for a, b in
                  zip(per_task(small), per_task(big), strict=True)]
        parts.append(f"{pattern}: {int(big['tasks'])} tasks parse {big['parse_s']:.2f} s, "
                     f"peak {big['peak_mb']:.0f} MB, master CPU/task {big['us_per_task']:.0f} "
                     f"us = {flat:.2f}x of {int(small['tasks'])} tasks; per task, parse cpu "
                     f"{growth[0]} and parse memory {growth[1]} of "
                     f"{int(small['tasks'])} tasks")
    print("SUMMARY scale: " + "; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
