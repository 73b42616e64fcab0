"""Shared pieces of the benchmarks: DAG generators, running pmc, the spawn floor, machine.

Imported by the benchmark scripts (which run with this directory on ``sys.path``) and
by the smoke tests.
"""

from __future__ import annotations

import compileall
import functools
import os
import platform
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PYTHON = sys.executable
NCSA_LAYERS = (1, 700, 1400, 700, 2, 1)  # the NCSA user's workflow shape


# -- DAG files -------------------------------------------------------------------------------


def write_independent(path: Path, n: int, command: str = "/bin/true",
                      style: str = "plain") -> int:
    """``n`` tasks without edges. ``style`` "plain": ``TASK t12 COMMAND``; "options": with
    options as planners write them, ``TASK t12 -m 1 -c 1 COMMAND``; "pegasus": the same
    with a ``#@ SEQ TRANSFORMATION DAX_ID`` line before each TASK, as Pegasus writes
    clustered jobs (its SEQ is then the id in every record). COMMAND as the floor runs
    it, without an argument per task: given one, GNU ``true`` sets up its locale (to
    look for --help), and each task costs ~40 % more than the floor's."""
    with open(path, "w") as f:
        for i in range(n):
            if style == "plain":
                f.write(f"TASK t{i} {command}\n")
                continue
            if style == "pegasus":
                f.write(f"#@ {i + 1} pegasus::transformation:1.0 ID{i + 1:07d}\n")
            f.write(f"TASK t{i} -m 1 -c 1 {command}\n")
    return n


def scaled_layers(layers: Sequence[int], total: int) -> list[int]:
    """The same shape with about ``total`` tasks: the narrow layers (at most 2 wide, the
    head and tail of the NCSA workflow) as they are, the wide ones scaled alike."""
    narrow = sum(w for w in layers if w <= 2)
    wide = sum(w for w in layers if w > 2)
    if not wide or total <= narrow:
        return list(layers)
    out = [w if w <= 2 else max(3, round(w * (total - narrow) / wide)) for w in layers]
    widest = out.index(max(out))
    out[widest] += total - sum(out)  # the rounding, on the widest layer
    return out


def write_layered(path: Path, layers: Sequence[int] = NCSA_LAYERS,
                  command: str = "/bin/true", seed: int = 1) -> tuple[int, int]:
    """Layer k's tasks each depend on 1-2 tasks of layer k-1 (all of it when the layer is
    the narrow tail: at most 2 tasks, as the 2 -> 1 end of the NCSA workflow). Returns
    (tasks, edges)."""
    rng = random.Random(seed)
    names: list[list[str]] = []
    edges: list[str] = []
    lines: list[str] = []
    for k, width in enumerate(layers):
        layer = [f"L{k}_{j}" for j in range(width)]
        lines.extend(f"TASK {name} {command}\n" for name in layer)
        if k:
            prev = names[-1]
            for j, name in enumerate(layer):
                if width <= 2:
                    parents = prev
                else:
                    # A realistic fan-in: the "matching" task of the previous layer and
                    # sometimes a neighbour of it.
                    first = j * len(prev) // width
                    parents = [prev[first]]
                    if len(prev) > 1 and rng.random() < 0.5:
                        parents.append(prev[(first + 1) % len(prev)])
                edges.extend(f"EDGE {p} {name}\n" for p in parents)
        names.append(layer)
    with open(path, "w") as f:
        f.writelines(lines)
        f.writelines(edges)
    return sum(layers), len(edges)


def write_big(path: Path, n: int, edges: int, local: bool, seed: int = 1,
              by_parent: bool = False) -> None:
    """n tasks and about ``edges`` edges (parent before child in DAG order).

    local: each edge joins tasks at most 64 apart, as a Pegasus planner writes them
    (jobs of one level next to each other). Otherwise parents are drawn uniformly from
    all earlier tasks, which defeats every cache in the parser's name lookups.

    The EDGE lines come in random order, or with ``by_parent`` grouped by parent in task
    order (each parent's children in task order), as Pegasus's planner writes a PMC DAG:
    for each job, the edges to its children.
    """
    rng = random.Random(seed)
    with open(path, "w", buffering=1 << 20) as f:
        f.writelines(f"TASK task_{i:07d} /bin/true -n {i}\n" for i in range(n))
        seen: set[int] = set()
        made = 0
        buf: list[str] = []
        while made < edges:
            c = rng.randrange(1, n)
            p = rng.randrange(max(0, c - 64), c) if local else rng.randrange(0, c)
            key = p * n + c
            if key in seen:
                continue
            seen.add(key)
            made += 1
            if not by_parent:
                buf.append(f"EDGE task_{p:07d} task_{c:07d}\n")
                if len(buf) >= 65536:
                    f.writelines(buf)
                    buf.clear()
        if by_parent:  # the keys sort as (parent, child)
            f.writelines(f"EDGE task_{key // n:07d} task_{key % n:07d}\n" for key in sorted(seen))
        f.writelines(buf)


# -- running pmc -----------------------------------------------------------------------------

SUMMARY = re.compile(r"\[cluster-summary stat=\"(\w+)\", tasks=(\d+), submitted=(\d+), "
                      r"succeeded=(\d+), failed=(\d+).*?duration=([0-9.]+)")


def children_cpu() -> float:
    """User + system seconds of every waited-for descendant so far (a run's tasks count
    too: each process adds those it waited for)."""
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


class PmcRun:
    def __init__(self, wall: float, duration: float, tasks: int, ok: bool, out: str,
                 cpu: float = 0.0) -> None:
        self.wall = wall  # the whole command, interpreter start to exit
        self.duration = duration  # the run as pmc measures it (workers up to summary)
        self.tasks = tasks
        self.ok = ok
        self.out = out
        self.cpu = cpu  # seconds, every process of the run: launcher, pmc, tasks

    @property
    def rate(self) -> float:
        return self.tasks / self.duration if self.duration > 0 else 0.0


@functools.cache
@functools.cache
def _compile_pmc(tree: Path) -> None:
    """Compile a checkout's modules, as a non-editable install does: in a checkout run
    with PYTHONDONTWRITEBYTECODE every start of every worker would compile them again,
    and the benchmarks would time that."""
    compileall.compile_dir(str(tree / "pmc"), quiet=1)


def pmc_env(tree: Path = REPO) -> dict[str, str]:
    """The environment of every pmc a benchmark starts: ``tree``'s pmc (this checkout's
    by default), its modules compiled first."""
    _compile_pmc(tree)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def clear_run_files(dag: Path | str) -> None:
    """Remove what a run of ``dag`` leaves beside it (rescue log, resource log, status):
    the next run starts afresh."""
    for suffix in (".rescue", ".resource", ".status.json"):
        Path(f"{dag}{suffix}").unlink(missing_ok=True)


def parse_trees(text: str | None) -> list[tuple[str, Path]]:
    """``--trees NAME=CHECKOUT,...`` as (name, checkout) pairs; this checkout, named
    "", when not given."""
    if not text:
        return [("", REPO)]
    return [(name, Path(path).resolve()) for name, path in
            (t.split("=", 1) for t in text.split(","))]


def run_pmc(dag: Path, mode: str, workers: int, extra: Sequence[str] = (),
            slots: int = 1, timeout: float = 3600, tree: Path = REPO) -> PmcRun:
    """One run of ``pmc run`` (``tree``'s) on a fresh rescue log; the summary record
    gives the rate."""
    clear_run_files(dag)
    args = ["run", str(dag), "-q", "-s", "-o", os.devnull, *extra]
    if slots != 1:
        args += ["--worker-slots", str(slots)]
    if mode == "dropin":
        # As the users type it: the reference's command, its defaults, no binding.
        cmd = [mpiexec(), "-n", str(workers + 1), str(Path(PYTHON).parent / "pegasus-mpi-cluster"),
               "-s", "-o", os.devnull, "-e", os.devnull, *extra, str(dag)]
    elif mode in ("mpi", "mpi-nosock", "mpi-bound"):
        launch = [mpiexec(), "-n", str(workers + 1)]
        if mode == "mpi-nosock":  # every message through MPI, as between hosts
            args.append("--no-host-sockets")
        if mode == "mpi-bound":
            launch[1:1] = ["-bind-to", hydra_binding(workers)]
            args.append("--keep-affinity")
        cmd = [*launch, PYTHON, "-m", "pmc", *args, "--mpi"]
    else:
        cmd = [PYTHON, "-m", "pmc", *args, "--local", "--workers", str(workers)]
    t0 = time.monotonic()
    c0 = children_cpu()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          cwd=dag.parent, env=pmc_env(tree), timeout=timeout, check=False)
    cpu = children_cpu() - c0
    wall = time.monotonic() - t0
    m = SUMMARY.search(proc.stdout)
    if proc.returncode != 0 or m is None:
        raise RuntimeError(f"pmc failed ({proc.returncode}): {' '.join(cmd)}\n"
                           f"{proc.stdout[-3000:]}")
    done = int(m.group(4)) + int(m.group(5))
    return PmcRun(wall, float(m.group(6)), done, m.group(1) == "ok", proc.stdout, cpu)


@functools.cache
def mpiexec() -> str:
    """The MPI launcher installed beside this interpreter (the pip MPI's, the one an
    activated venv finds first), else the first on PATH. Not PATH first: an entry there
    may be a wrapper rather than the launcher (pyenv's shims run a shell script and
    several processes on every call, ~0.05 s of wall and cpu that no MPI user pays)."""
    for name in ("mpiexec", "mpirun"):
        beside = Path(PYTHON).parent / name
        if os.access(beside, os.X_OK):
            return str(beside)
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if found is None:
        raise RuntimeError("no mpiexec beside the interpreter nor on PATH")
    return found


OMPI_MPIEXEC = "/usr/bin/mpiexec.openmpi"


def reference_launch(ranks: int, binary: str) -> tuple[list[str], dict[str, str]]:
    """The reference's launch line (Open MPI's ``mpiexec``, ``ranks`` ranks on this host's
    cores) and the variables to add to its environment. ``PMIX_MCA_psec=native``: with munge
    installed (slurm-wlm brings it) but its daemon not running, PMIx's munge plugin
    retries munge's socket for ~2.3 s before every launch, a wait that no site with
    munge running pays and that would be charged to the reference."""
    env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none", "PMIX_MCA_psec": "native"}
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [OMPI_MPIEXEC, *root, "--oversubscribe", "-n", str(ranks), binary], env


# MPI's start and stop of Python ranks with the settings pmc starts MPI with
# (pmc.transport.mpisettings), and no pmc code besides: what any run of this many ranks
# under mpiexec pays here before and after its own work.
MPI_CONTROL = ("import os; from pmc.transport.mpisettings import mpi_settings; "
               "os.environ.update(mpi_settings(os.environ)); from mpi4py import MPI")


def mpi_control(workers: int, tree: Path = REPO) -> tuple[float, float]:
    """(cpu, wall) seconds of ``mpiexec -n W+1 python -c MPI_CONTROL``."""
    c0, t0 = children_cpu(), time.monotonic()
    subprocess.run([mpiexec(), "-n", str(workers + 1), PYTHON, "-c", MPI_CONTROL],
                   env=pmc_env(tree), check=True, timeout=300)
    return children_cpu() - c0, time.monotonic() - t0


@functools.cache
def hydra_binding(workers: int) -> str:
    """MPICH hydra's ``-bind-to`` list for rank 0 on every cpu and worker k on cpu k-1
    (round robin): each worker and the tasks it starts stay on one cpu, the master goes
    where there is room.

    Why a benchmark case binds at all: on a Linux kernel with autogroup (every session a
    scheduling group, and every worker is a session), unbound MPI workers leave a cpu
    idle now and then while work waits; bound, they run as fast as embedded workers
    (RESULTS.md, "autogroup and the MPI library").
    """
    version = subprocess.run([mpiexec(), "--version"], capture_output=True, text=True,
                             check=False).stdout
    if "HYDRA" not in version:
        raise RuntimeError(f"mpi-bound binds with the -bind-to of MPICH's mpiexec (hydra); "
                           f"{mpiexec()} is another")
    cpus = sorted(os.sched_getaffinity(0))
    return "user:" + ",".join(["+".join(map(str, cpus)),
                               *(str(cpus[k % len(cpus)]) for k in range(workers))])


# -- the spawn floor -------------------------------------------------------------------------

FLOOR_C = r"""
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
extern char **environ;
int main(int argc, char **argv) {
    int n = atoi(argv[1]), conc = atoi(argv[2]);
    char *args[] = {argv[3], NULL};
    int out = open("/dev/null", O_WRONLY);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out, 1);
    posix_spawn_file_actions_adddup2(&fa, out, 2);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int started = 0, done = 0, running = 0, st;
    while (done < n) {
        while (running < conc && started < n) {
            pid_t pid;
            if (posix_spawn(&pid, argv[3], &fa, NULL, args, environ) != 0) {
                perror("posix_spawn");
                return 1;
            }
            started++;
            running++;
        }
        if (wait(&st) > 0) {
            running--;
            done++;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%.6f\n", (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
    return 0;
}
"""


class Floor:
    """A tight posix_spawn + wait loop at a given concurrency: the cost of the tasks alone.

    Compiled from C with the system compiler when there is one, else the same loop in
    Python (os.posix_spawn + os.wait)."""

    def __init__(self, workdir: Path) -> None:
        self.kind = "python"
        self.exe: Path | None = None
        self.cpu = 0.0  # seconds of the last run, the loop and its tasks
        cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
        if cc:
            src = workdir / "floor.c"
            src.write_text(FLOOR_C)
            exe = workdir / "floor"
            proc = subprocess.run([cc, "-O2", "-o", str(exe), str(src)],
                                  capture_output=True, text=True, check=False)
            if proc.returncode == 0:
                self.kind = f"C ({os.path.basename(cc)})"
                self.exe = exe

    def run(self, n: int, concurrency: int, program: str = "/bin/true") -> float:
        """Tasks per second."""
        c0 = children_cpu()
        if self.exe is not None:
            out = subprocess.run([str(self.exe), str(n), str(concurrency), program],
                                 capture_output=True, text=True, check=True).stdout
            self.cpu = children_cpu() - c0
            return n / float(out)
        s0 = resource.getrusage(resource.RUSAGE_SELF)
        elapsed = python_floor(n, concurrency, program)
        s1 = resource.getrusage(resource.RUSAGE_SELF)
        self.cpu = (children_cpu() - c0 + s1.ru_utime - s0.ru_utime + s1.ru_stime
                    - s0.ru_stime)
        return n / elapsed


def python_floor(n: int, concurrency: int, program: str) -> float:
    out = os.open(os.devnull, os.O_WRONLY)
    actions = [(os.POSIX_SPAWN_DUP2, out, 1), (os.POSIX_SPAWN_DUP2, out, 2)]
    argv = [program]
    env = dict(os.environ)
    t0 = time.monotonic()
    started = done = running = 0
    while done < n:
        while running < concurrency and started < n:
            os.posix_spawn(program, argv, env, file_actions=actions)
            started += 1
            running += 1
        os.wait()
        running -= 1
        done += 1
    elapsed = time.monotonic() - t0
    os.close(out)
    return elapsed


# -- reporting -------------------------------------------------------------------------------


def machine() -> str:
    model = "unknown cpu"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:  # changes how MPI ranks share the cpus (see hydra_binding)
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            autogroup = "on" if f.read().strip() == "1" else "off"
    except OSError:
        autogroup = "n/a"
    return (f"nproc={os.cpu_count()}, cpu={model}, kernel={platform.release()}, "
            f"autogroup={autogroup}, python={platform.python_version()}")


def median(values: Sequence[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def workdir(keep: str | None = None) -> Path:
    if keep:
        p = Path(keep)
        p.mkdir(parents=True, exist_ok=True)
        return p
    return Path(tempfile.mkdtemp(prefix="pmc-bench-"))


def cpu_ticks(pid: int) -> int:
    """utime + stime of a process (clock ticks), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        data = f.read()
    fields = data[data.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def children_of(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(x) for x in f.read().split())
    except OSError:
        pass
    return out


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it, as /proc shows them now."""
    found: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children_of(p))
    return found


def parent_of(pid: int) -> int:
    """A process's parent as /proc shows it now; -1 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def hwm_mb(pid: int) -> float:
    """A process's peak resident set (VmHWM) in MiB; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


TICK = os.sysconf("SC_CLK_TCK")
