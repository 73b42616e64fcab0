"""Task start-up from inside pmc.sif: 10,000 short tasks run by pmc from the SIF's
squashfs mounted by squashfuse_ll and by squashfuse (unprivileged Apptainer's ways: the
low-level, multi-threaded one first), by the kernel (setuid Apptainer's, a loop
device), from the image unpacked into a sandbox directory, and by the host install, in
one run.

    python benchmarks/sifstart.py                      # ./pmc.sif, 10,000 tasks, 5 rounds
    python benchmarks/sifstart.py --sif /path/pmc.sif --tasks 2000 --rounds 1

Needs root (mounts, chroot), squashfuse (both its programs) and squashfs-tools; build
the file first with ``bash ci/build-sif.sh``. Each image is opened once
(tests/sifkit.py, as Apptainer opens it); each round runs every way once, in an order
that turns each round, so that a machine whose speed drifts weighs on all alike. A run
is ``pmc run w.dag`` with default flags (embedded mode, one worker per cpu), its tasks
``/bin/true``: inside the image, the image's python, pmc and ``/bin/true`` are read
through the mount, and every task is an exec from it. Each way gets: tasks per second
end to end (start of the entry command to its exit, the image's entry and pmc's start-up
included), the rate of the run itself (the ``[cluster-summary]`` duration), and the
ratios of the end-to-end rate to the host install's and to the sandbox's of the same
round (medians of the rounds, and the range of the rates); and the cpu per task of every
process of the run and of the FUSE daemon serving the mount (the kernel's squashfs works
in the tasks' own time, and in kernel threads no process is charged with). The sandbox
holds the same files as the mounts, so the ratio to it is the mount's own cost; the host
install differs in more than the file system (its Python build, for one).
"""


from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from _common import REPO, children_cpu, cmdline, cpu_ticks, machine, median, write_independent

sys.path.insert(0, str(REPO / "tests"))
import sifkit

WAYS = ("host", "sandbox", "kernel", "squashfuse_ll", "squashfuse")
DURATION = re.compile(r"\[cluster-summary .*duration=([0-9.]+)")


TICK = os.sysconf("SC_CLK_TCK")


class Run(NamedTuple):
    wall: float  # seconds, end to end
    duration: float  # seconds, the run's own ([cluster-summary])
    cpu: float  # seconds: every process of the run, and the FUSE daemon serving it


def daemons(root: Path) -> list[int]:
    """The FUSE daemon serving the mount at ``root`` (none for the kernel's)."""
    return [int(p.name) for p in Path("/proc").iterdir()
            if p.name.isdigit() and str(root) in cmdline(int(p.name)).split()]


def one(argv: list[str], cwd: Path, tasks: int, fuse: list[int]) -> Run:
    for leftover in cwd.glob("w.dag.*"):
        leftover.unlink()
    cpu0, fuse0 = children_cpu(), sum(map(cpu_ticks, fuse))
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    cpu = children_cpu() - cpu0 + (sum(map(cpu_ticks, fuse)) - fuse0) / TICK
    if proc.returncode != 0 or f"succeeded={tasks}," not in proc.stdout:
        raise SystemExit(f"{argv}: failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    m = DURATION.search(proc.stdout)
    assert m, proc.stdout[-500:]
    return Run(wall, float(m.group(1)), cpu)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sif", type=Path, default=REPO / "pmc.sif")
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if not args.sif.is_file():
        raise SystemExit(f"{args.sif}: no such file (bash ci/build-sif.sh)")
    print(f"machine: {machine()}")
    print(f"image: {args.sif} ({args.sif.stat().st_size >> 20} MB); {args.tasks} x /bin/true, "
          f"pmc run with default flags, {args.rounds} rounds")
    work = Path(tempfile.mkdtemp(prefix="pmc-sifstart.", dir="/tmp"))
    write_independent(work / "w.dag", args.tasks)
    results: dict[str, list[Run]] = {w: [] for w in WAYS}
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, ignore_errors=True)
        argv = {"host": [sys.executable, "-m", "pmc", "run", "w.dag"]}
        fuse: dict[str, list[int]] = {"host": []}
        for way in WAYS[1:]:
            root = stack.enter_context(sifkit.opened(args.sif, way))
            fuse[way] = daemons(root)
            (work / way).mkdir()
            argv[way] = [str(sifkit.enter_script(root, work / way)), "pmc", "run", "w.dag"]
        for r in range(args.rounds):
            order = WAYS[r % len(WAYS):] + WAYS[:r % len(WAYS)]
            for way in order:
                results[way].append(one(argv[way], work, args.tasks, fuse[way]))
            print(f"round {r + 1}: " + ", ".join(
                f"{w} {args.tasks / results[w][-1].wall:.0f}/s" for w in WAYS), flush=True)
    print()
    print("| way | end to end, tasks/s | range | the run itself, tasks/s | cpu per task "
          "| vs host | vs sandbox |")
    print("|---|---|---|---|---|---|---|")
    summary = []
    for way in WAYS:
        runs = results[way]
        e2e = [args.tasks / run.wall for run in runs]
        ratio = {base: median([theirs.wall / mine.wall for theirs, mine
                               in zip(results[base], runs, strict=True)])
                 for base in ("host", "sandbox")}
        print(f"| {way} | {median(e2e):,.0f} | {min(e2e):,.0f}-{max(e2e):,.0f} | "
              f"{median([args.tasks / run.duration for run in runs]):,.0f} | "
              f"{median([run.cpu for run in runs]) / args.tasks * 1e6:,.0f} µs | "
              f"{ratio['host']:.2f} | {ratio['sandbox']:.2f} |")
        summary.append(f"{way}={ratio['host']:.2f}")
    print("SUMMARY " + " ".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
