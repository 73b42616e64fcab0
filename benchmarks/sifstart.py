"""Task start-up from inside pmc.sif: 10,000 short tasks run by pmc from the SIF's
squashfs mounted by squashfuse (unprivileged Apptainer's way), by the kernel (setuid
Apptainer's, a loop device), from the image unpacked into a sandbox directory, and by
the host install, in one run.

    python benchmarks/sifstart.py                      # ./pmc.sif, 10,000 tasks, 5 rounds
    python benchmarks/sifstart.py --sif /path/pmc.sif --tasks 2000 --rounds 1

Needs root (mounts, chroot), squashfuse and squashfs-tools; build the file first with
``bash ci/build-sif.sh``. Each image is opened once (tests/sifkit.py, as Apptainer
opens it); each round runs every way once, in an order that turns each round, so that
a machine whose speed drifts weighs on all alike. A run is ``pmc run w.dag`` with
default flags (embedded mode, one worker per cpu), its tasks ``/bin/true``: inside the
image, the image's python, pmc and ``/bin/true`` are read through the mount, and every
task is an exec from it. Each way gets: tasks per second end to end (start of the entry
command to its exit, the image's entry and pmc's start-up included), the rate of the
run itself (the ``[cluster-summary]`` duration), and the ratio of the end-to-end rate
to the host install's of the same round (medians of the rounds, and their range).
"""

from __future__ import annotations

import argparse
import contextlib
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import REPO, machine, median, write_independent

sys.path.insert(0, str(REPO / "tests"))
import sifkit

WAYS = ("host", "sandbox", "kernel", "squashfuse")
DURATION = re.compile(r"\[cluster-summary .*duration=([0-9.]+)")


def one(argv: list[str], cwd: Path, tasks: int) -> tuple[float, float]:
    """(end-to-end seconds, the run's own seconds)."""
    for leftover in cwd.glob("w.dag.*"):
        leftover.unlink()
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or f"succeeded={tasks}," not in proc.stdout:
        raise SystemExit(f"{argv}: failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    m = DURATION.search(proc.stdout)
    assert m, proc.stdout[-500:]
    return wall, float(m.group(1))


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
    results: dict[str, list[tuple[float, float]]] = {w: [] for w in WAYS}
    with contextlib.ExitStack() as stack:
        argv = {"host": [sys.executable, "-m", "pmc", "run", "w.dag"]}
        for way in WAYS[1:]:
            root = stack.enter_context(sifkit.opened(args.sif, way))
            (work / way).mkdir()
            argv[way] = [str(sifkit.enter_script(root, work / way)), "pmc", "run", "w.dag"]
        for r in range(args.rounds):
            order = WAYS[r % len(WAYS):] + WAYS[:r % len(WAYS)]
            for way in order:
                results[way].append(one(argv[way], work, args.tasks))
            print(f"round {r + 1}: " + ", ".join(
                f"{w} {args.tasks / results[w][-1][0]:.0f}/s" for w in WAYS), flush=True)
    print()
    print("| way | end to end, tasks/s | range | the run itself, tasks/s | vs host |")
    print("|---|---|---|---|---|")
    summary = []
    for way in WAYS:
        e2e = [args.tasks / wall for wall, _ in results[way]]
        own = [args.tasks / dur for _, dur in results[way]]
        ratio = [host / mine for (host, _), (mine, _) in zip(results["host"], results[way],
                                                              strict=True)]
        print(f"| {way} | {median(e2e):,.0f} | {min(e2e):,.0f}-{max(e2e):,.0f} | "
              f"{median(own):,.0f} | {median(ratio):.2f} |")
        summary.append(f"{way}={median(ratio):.2f}")
    print("SUMMARY " + " ".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
