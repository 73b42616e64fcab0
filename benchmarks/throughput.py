"""Throughput: pmc against the spawn floor, same concurrency, same machine, same run.

    python benchmarks/throughput.py                 # 20,000 /bin/true, the NCSA DAG
                                                    # and its shape with 20,000 tasks,
                                                    # embedded and MPI (host sockets,
                                                    # bound to cpus, all through MPI),
                                                    # 3 rounds
    python benchmarks/throughput.py --tasks 2000 --rounds 1 --modes local
    python benchmarks/throughput.py --trees old=/tmp/old,new=.   # two checkouts by turns

Each round runs the floor (a tight posix_spawn + wait loop, in C when a compiler is
there) before and after each pmc case, and each case's ratio is to the mean of the two
floors around it: figures taken moments apart on a machine whose speed drifts. pmc's
rate is tasks / the run's own duration (the ``[cluster-summary]`` record: from start-up
of the workers to the last result); the end-to-end rate, interpreter start to exit, is
printed too, and its ratio to the same floors ("end to end": start-up included). The
observability case adds ``--log-format json --log-file F --metrics-port 0`` to the
embedded run; both run twice a round, in the order plain,
observed, observed, plain, and the cost is the median of the ratios of the observed runs
to the plain ones beside them. A JSON log also brings per-task cgroup accounting where
the workers may create cgroups (``--task-accounting auto``): the cost is the defaults',
both together, as users see it. ``--with-no-prefetch``
adds runs with PMC's one-task-per-free-slot dispatch.

Beside the rates, the cpu per task of every process of a run (floor: the loop and its
tasks; pmc: launcher, master, workers and tasks). With the cores busy the ratio follows
the cpu ratio, which moves less from minute to minute than the rates do.

Where pmc runs under ``mpiexec``, each round also times MPI's own start and stop of as
many Python ranks, with the settings pmc starts MPI with and no pmc code
(``_common.MPI_CONTROL``), and each such case shows its ceiling: the end-to-end ratio of
a run that ran its tasks exactly at the floor's rate and added nothing to that start
and stop, tasks / floor rate / (tasks / floor rate + their median wall).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _common import (
    NCSA_LAYERS,
    Floor,
    PmcRun,
    machine,
    median,
    mpi_control,
    parse_trees,
    run_pmc,
    scaled_layers,
    workdir,
    write_independent,
    write_layered,
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", type=int, default=20000,
                   help="tasks of the independent and layered-scaled DAGs")
    p.add_argument("--slots", type=int, default=2, help="concurrent task slots (workers)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--modes", default="local,mpi,mpi-bound,mpi-nosock",
                   help="local, dropin (`mpiexec -n W+1 pegasus-mpi-cluster -s -o /dev/null "
                   "-e /dev/null`, as users type it), mpi (the workers share the master's "
                   "host: host sockets), "
                   "mpi-bound (the same, each worker and its tasks bound to one cpu by "
                   "MPICH's mpiexec, with --keep-affinity), mpi-nosock (every message "
                   "through MPI, as between hosts)")
    p.add_argument("--shapes", default="independent,layered,layered-scaled",
                   help="independent (--tasks tasks), options (the same with `-m 1 -c 1` "
                   "on every TASK line, as planners write them), pegasus "
                   "(options, and a `#@` line before every TASK, as Pegasus writes "
                   "them), layered (the NCSA workflow's shape, --layers), layered-scaled "
                   "(that shape with --tasks tasks)")
    p.add_argument("--no-observability", action="store_true",
                   help="skip the JSON log + metrics comparison")
    p.add_argument("--with-no-prefetch", action="store_true",
                   help="also run the independent DAG with --no-prefetch (PMC's dispatch)")
    p.add_argument("--layers", default=",".join(map(str, NCSA_LAYERS)),
                   help="layer widths of the layered DAG")
    p.add_argument("--program", default="/bin/true")
    p.add_argument("--keep", metavar="DIR", help="work in DIR and keep the files")
    p.add_argument("--trees", metavar="NAME=CHECKOUT,...",
                   help="run each case with each checkout's pmc, by turns (default: this "
                   "checkout's)")
    args = p.parse_args(argv)
    trees = [(f"{name}:" if name else "", tree) for name, tree in parse_trees(args.trees)]

    work = workdir(args.keep)
    floor = Floor(work)
    modes = [m for m in args.modes.split(",") if m]
    shapes = [s for s in args.shapes.split(",") if s]
    dags: dict[str, tuple[Path, int]] = {}
    for shape, style in (("independent", "plain"), ("options", "options"),
                         ("pegasus", "pegasus")):
        if shape in shapes:
            path = work / f"{shape}.dag"
            dags[shape] = (path, write_independent(path, args.tasks, args.program, style))
    layers = [int(x) for x in args.layers.split(",")]
    for shape, widths in (("layered", layers),
                          ("layered-scaled", scaled_layers(layers, args.tasks))):
        if shape in shapes:
            path = work / f"{shape}.dag"
            n, e = write_layered(path, widths, args.program)
            dags[shape] = (path, n)
            print(f"{shape} DAG: {'+'.join(map(str, widths))} = {n} tasks, {e} edges")
    # (label, shape, mode, extra, checkout)
    cases: list[tuple[str, str, str, list[str], Path]] = []
    for shape in dags:
        for mode in modes:
            for name, tree in trees:
                cases.append((f"{name}{shape}/{mode}", shape, mode, [], tree))
    if args.with_no_prefetch and "independent" in dags:
        for mode in (m for m in modes if m in ("local", "mpi")):
            for name, tree in trees:
                cases.append((f"{name}independent/{mode}+no-prefetch", "independent", mode,
                              ["--no-prefetch"], tree))
    obs = base = ""  # the observed case's label, and the plain one's
    if not args.no_observability and "local" in modes and dags:
        # Beside the plain run it is compared with (this machine's speed drifts by
        # several per cent from one minute to the next), and both twice a round: plain,
        # observed, observed, plain, so that whatever favours the first or the second of
        # two runs cancels out. Labels repeat in `cases`; the figures are per label.
        shape = "independent" if "independent" in dags else next(iter(dags))
        log = str(work / "pmc-log.json")
        name, tree = trees[-1]
        obs, base = f"{name}{shape}/local+json+metrics", f"{name}{shape}/local"
        observed = (obs, shape, "local", ["--log-format", "json", "--log-file", log,
                                          "--metrics-port", "0"], tree)
        plain = next(i for i, case in enumerate(cases) if case[0] == base)
        cases[plain + 1:plain + 1] = [observed, observed, cases[plain]]

    print(f"machine: {machine()}")
    print(f"floor: {floor.kind} posix_spawn loop of {args.program}, "
          f"concurrency {args.slots}")
    print("checkouts: " + ", ".join(f"{name}{tree}" for name, tree in trees))
    ratios: dict[str, list[float]] = {label: [] for label, *_ in cases}
    rates: dict[str, list[float]] = {label: [] for label, *_ in cases}
    cpus: dict[str, list[float]] = {label: [] for label, *_ in cases}  # µs per task
    # Start-up and shut-down included: tasks / the command's wall time, to the floor.
    e2e: dict[str, list[float]] = {label: [] for label, *_ in cases}
    # The floor's cpu per task over the case's, both floors around it: while the cores
    # are busy, throughput follows it, and it moves less when others share the machine
    # (where the case's several sessions get more of the cpu than the floor's one).
    cpu_ratios: dict[str, list[float]] = {label: [] for label, *_ in cases}
    floors: list[float] = []
    floor_cpus: list[float] = []
    mpi_modes = {"dropin", "mpi", "mpi-bound", "mpi-nosock"}
    controls: list[float] = []  # wall seconds of MPI's start and stop alone

    def run_floor() -> float:
        f_rate = floor.run(args.tasks, args.slots, args.program)
        floors.append(f_rate)
        floor_cpus.append(floor.cpu / args.tasks * 1e6)
        print(f"round {rnd}: floor {f_rate:8.0f} tasks/s  cpu {floor_cpus[-1]:5.0f} µs/task")
        return f_rate

    for rnd in range(1, args.rounds + 1):
        f_before = run_floor()
        if mpi_modes & set(modes):
            controls.append(mpi_control(args.slots, trees[-1][1])[1])
            print(f"round {rnd}: MPI start and stop alone {controls[-1]:.3f} s")
        for label, shape, mode, extra, tree in cases:
            path, n = dags[shape]
            try:
                r: PmcRun = run_pmc(path, mode, args.slots, extra, tree=tree)
            except RuntimeError as e:
                print(f"  {label}: {e}", file=sys.stderr)
                return 1
            if r.tasks != n or not r.ok:
                print(f"  {label}: ran {r.tasks} of {n} tasks", file=sys.stderr)
                return 1
            # The floor runs before and after each case, and the case is compared with
            # their mean: the machine's speed drifts from one minute to the next.
            f_after = run_floor()
            f_mean = (f_before + f_after) / 2
            f_before = f_after
            ratio = r.rate / f_mean
            ratios[label].append(ratio)
            e2e[label].append(n / r.wall / f_mean)
            rates[label].append(r.rate)
            cpus[label].append(r.cpu / n * 1e6)
            cpu_ratios[label].append((floor_cpus[-1] + floor_cpus[-2]) / 2 / cpus[label][-1])
            print(f"round {rnd}: {label:32s} {r.rate:8.0f} tasks/s  ratio {ratio:5.2f}  "
                  f"cpu {cpus[label][-1]:5.0f} µs/task  "
                  f"(end to end {n / r.wall:6.0f}/s, {r.wall:.1f} s, ratio {e2e[label][-1]:.2f})")
    print()
    print(f"floor cpu per task (median): {median(floor_cpus):.0f} µs")
    ceilings: dict[str, float] = {}
    if controls:
        print(f"MPI start and stop alone (median): {median(controls):.3f} s")
        for label, shape, mode, _extra, _tree in cases:
            if mode in mpi_modes:
                at_floor = dags[shape][1] / median(floors)
                ceilings[label] = at_floor / (at_floor + median(controls))
    print(f"{'case':34s} {'median rate':>12s} {'median ratio':>13s} {'best ratio':>11s} "
          f"{'end to end':>11s} {'ceiling':>8s} {'cpu µs/task':>12s} {'cpu ratio':>10s}")
    for label in ratios:
        ceiling = f"{ceilings[label]:8.2f}" if label in ceilings else f"{'-':>8s}"
        print(f"{label:34s} {median(rates[label]):10.0f}/s {median(ratios[label]):13.2f} "
              f"{max(ratios[label]):11.2f} {median(e2e[label]):11.2f} {ceiling} "
              f"{median(cpus[label]):12.0f} {median(cpu_ratios[label]):10.2f}")
    obs_note = ""
    if obs:
        # Each observed run against the plain run beside it, each by its ratio to the
        # floors around it (not raw rates: the machine's speed drifts by more than this
        # cost from one minute to the next); the median of those pairs.
        cost = 1 - median([o / b for o, b in zip(ratios[obs], ratios[base], strict=True)])
        obs_note = f"; observability cost {cost * 100:.1f}%"
    summary = ", ".join(f"{label} {median(ratios[label]):.2f} (end to end "
                        f"{median(e2e[label]):.2f}"
                        + (f" of ceiling {ceilings[label]:.2f}" if label in ceilings else "")
                        + f", cpu {median(cpu_ratios[label]):.2f})"
                        for label in ratios if label != obs)
    print(f"SUMMARY throughput: floor {median(floors):.0f}/s ({floor.kind}); ratio to floor: "
          f"{summary}{obs_note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
