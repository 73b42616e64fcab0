"""Helpers for the differential suite: build the reference pegasus-mpi-cluster, run the
same DAG through it and through pmc's ``pegasus-mpi-cluster``, and normalise what both
print so that only behaviour a user or Pegasus can see is compared.

What is normalised (everywhere unless a test says otherwise):

- ``[cluster-task ...]``: ``start=``, ``duration=``, ``hostname=`` and ``slot=`` are
  dropped; ``id=``, ``name=``, ``status=``, ``app=``, ``cpus=``, ``memory=`` are kept,
  in that order.
- ``[cluster-summary ...]``: ``start=``, ``duration=``, ``pid=``, ``app=``, ``runtime=``
  and ``cpus=`` are dropped (the reference never adds to its ``cpus``: it writes
  ``cpus=0`` always); ``stat=``, ``tasks=``, ``submitted=``, ``succeeded=``, ``failed=``,
  ``extra=`` and ``slots=`` are kept.
- jobstate.log: the leading timestamp is dropped.
- DAG.dagman.out: the leading ``mm/dd/yy hh:mm:ss`` and pids are dropped.
- Everywhere: the run's directory becomes ``<DIR>``, this host's name ``<HOST>``.
- Console log lines are compared only for the events a test names (regular expressions
  over whole lines, level tag included); abort messages (``ABORT: file.cpp(NN): text``
  in the reference) are compared by their text.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import os
import re
import shutil
import socket
import subprocess
import sysconfig
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from pmctest import MPIEXEC, REPO, clean_env

SOURCES = (REPO.parent / "shared" / "reference" / "pegasus-mpi-cluster").resolve()
OMPI_MPIEXEC = "/usr/bin/mpiexec.openmpi"
DAG_NAME = "w.dag"


# -- building the reference ------------------------------------------------------------

def _ompi_cxx() -> str | None:
    """Open MPI's C++ wrapper by its own name: plain ``mpicxx`` may be the pip MPICH's."""
    for name in ("/usr/bin/mpicxx.openmpi", "mpicxx.openmpi"):
        found = shutil.which(name)
        if found:
            return found
    return None


def missing_prerequisite() -> str | None:
    """Why the reference cannot be built and run here, or None."""
    if not (SOURCES / "Makefile").is_file():
        return f"the reference's sources are not beside the checkout ({SOURCES})"
    for tool in ("g++", "make"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install g++ make)"
    if _ompi_cxx() is None or not os.access(OMPI_MPIEXEC, os.X_OK):
        return ("Open MPI is not installed (apt-get install libopenmpi-dev openmpi-bin): "
                "no mpicxx.openmpi or /usr/bin/mpiexec.openmpi")
    if MPIEXEC is None:
        return "the pip MPI's mpiexec is not installed (pip install '.[mpi]')"
    if pegasus_command() is None:
        return "pmc's pegasus-mpi-cluster command is not installed (pip install -e .)"
    return None


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    root = Path(base) / "pmc-compat"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError:  # no writable home: a directory of our own under /tmp
        root = Path(tempfile.gettempdir()) / f"pmc-compat-{os.getuid()}"
        root.mkdir(mode=0o700, exist_ok=True)
    return root


def build_reference() -> Path:
    """The reference binary, built once per version of its sources into a cache directory
    outside the repository (``$XDG_CACHE_HOME/pmc-compat/<hash>``)."""
    cxx = _ompi_cxx()
    assert cxx is not None
    digest = hashlib.sha256(cxx.encode())
    for path in sorted(SOURCES.iterdir()):
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    target = _cache_root() / digest.hexdigest()[:16]
    binary = target / "pegasus-mpi-cluster"
    if binary.is_file():
        return binary
    target.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix="build-", dir=target.parent))
    shutil.copytree(SOURCES, build, dirs_exist_ok=True)
    (build / "version.h").write_text("")  # the Makefile's version step wants git metadata
    done = subprocess.run(
        ["make", f"CXX={cxx}", "CXXFLAGS=-O2 -Wall", "pegasus-mpi-cluster"], cwd=build,
        capture_output=True, text=True, timeout=600,
    )
    if done.returncode != 0:
        shutil.rmtree(build, ignore_errors=True)
        pytest.fail(f"building the reference failed:\n{done.stdout}\n{done.stderr}")
    try:
        build.rename(target)
    except OSError:  # built meanwhile by another session
        shutil.rmtree(build, ignore_errors=True)
    return binary


def pegasus_command() -> str | None:
    """pmc's drop-in ``pegasus-mpi-cluster`` (the real script, not a pyenv shim)."""
    script = Path(sysconfig.get_path("scripts")) / "pegasus-mpi-cluster"
    if script.exists():
        return str(script)
    return shutil.which("pegasus-mpi-cluster")


# -- running both -----------------------------------------------------------------------

@dataclass
class Run:
    who: str
    dir: Path
    rc: int
    stdout: str
    stderr: str

    def text(self, name: str) -> str | None:
        path = self.dir / name
        return path.read_text(errors="replace") if path.exists() else None

    def describe(self) -> str:
        return (f"--- {self.who}: exit {self.rc} in {self.dir}\n--- stdout:\n{self.stdout}"
                f"--- stderr:\n{self.stderr}")


def ompi_env(**extra: str) -> dict[str, str]:
    """A clean environment for Open MPI's mpiexec (as root it needs leave to run)."""
    return clean_env(
        OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_btl_vader_single_copy_mechanism="none",
        OMPI_MCA_rmaps_base_oversubscribe="1", **extra,
    )


def reference_argv(binary: Path, workers: int, args: Sequence[str]) -> list[str]:
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [OMPI_MPIEXEC, *root, "--oversubscribe", "--bind-to", "none",
            "-n", str(workers + 1), str(binary), *args]


def pmc_argv(mode: str, workers: int, args: Sequence[str]) -> list[str]:
    """mode "mpi": under the pip MPI's mpiexec with WORKERS+1 ranks; "embedded": no
    launcher, ``--workers WORKERS``."""
    command = pegasus_command()
    assert command is not None and MPIEXEC is not None
    if mode == "mpi":
        return [MPIEXEC, "-n", str(workers + 1), command, *args]
    assert mode == "embedded", mode
    return [command, "--workers", str(workers), *args]


def execute(who: str, argv: Sequence[str], cwd: Path, env: dict[str, str],
            timeout: float = 90) -> Run:
    done = subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True,
                          errors="replace", timeout=timeout)
    return Run(who, cwd, done.returncode, done.stdout, done.stderr)


def prepare(where: Path, dag: str, files: dict[str, str] | None = None) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    dagfile = where / DAG_NAME
    if not dagfile.exists() or dagfile.read_text() != dag:  # a rerun keeps the same file
        dagfile.write_text(dag)
    for name, content in (files or {}).items():
        path = where / name
        path.write_text(content)
        if content.startswith("#!"):
            path.chmod(0o755)
    return where


def assert_same(reference: Sequence[str], pmc: Sequence[str], what: str,
                context: Iterable[Run] = ()) -> None:
    """Equal sequences of normalised lines, or a failure with their unified diff."""
    if list(reference) == list(pmc):
        return
    diff = "\n".join(difflib.unified_diff(
        list(reference), list(pmc), fromfile=f"reference: {what}", tofile=f"pmc: {what}",
        lineterm=""))
    details = "\n".join(run.describe() for run in context)
    pytest.fail(f"{what} differ (normalised):\n{diff}\n\n{details}", pytrace=False)


# -- normalising ------------------------------------------------------------------------

_FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^,\]]*)')
_RECORD_KEYS = ("id", "name", "status", "app", "cpus", "memory")
_SUMMARY_KEYS = ("stat", "tasks", "submitted", "succeeded", "failed", "extra", "slots")
HOST = socket.gethostname()
_HOST_WORD = re.compile(r"(?<![\w.-])" + re.escape(HOST) + r"(?![\w-])")


def exit_kind(run: Run) -> list[str]:
    """Only zero or non-zero is compared: the reference's aborts exit 1, pmc's stops 3."""
    return ["exit 0" if run.rc == 0 else "exit non-zero"]


def fields(record: str) -> dict[str, str]:
    body = record[record.index(" ") + 1: record.rindex("]")]
    return {m.group(1): m.group(2) for m in _FIELD.finditer(body)}


def norm_record(line: str) -> str:
    f = fields(line)
    kept = ", ".join(f"{k}={f[k]}" for k in _RECORD_KEYS if k in f)
    return f"[cluster-task {kept}]"


def norm_summary(line: str) -> str:
    f = fields(line)
    kept = ", ".join(f"{k}={f.get(k, '<missing>')}" for k in _SUMMARY_KEYS)
    return f"[cluster-summary {kept}]"


def norm_paths(text: str, run: Run) -> str:
    text = text.replace(str(run.dir.resolve()), "<DIR>").replace(str(run.dir), "<DIR>")
    return _HOST_WORD.sub("<HOST>", text) if HOST else text


def stdout_lines(text: str, run: Run) -> list[str]:
    """Every line of a merged task stdout: records and the summary normalised, the
    tasks' own output kept as it is (paths made relative)."""
    out = []
    for line in norm_paths(text, run).splitlines():
        if line.startswith("[cluster-task "):
            out.append(norm_record(line))
        elif line.startswith("[cluster-summary "):
            out.append(norm_summary(line))
        else:
            out.append(line)
    return out


def blocks(lines: Sequence[str]) -> list[str]:
    """A merged stdout as one entry per task try: its output lines, then its record; in
    a stable order (for runs whose workers finish in any order). Output after the last
    record (a task that never finished) and the summary are entries of their own."""
    out: list[str] = []
    pending: list[str] = []
    for line in lines:
        if line.startswith("[cluster-task "):
            out.append(" | ".join([*pending, line]))
            pending = []
        elif line.startswith("[cluster-summary "):
            out.append(line)
        else:
            pending.append(line)
    if pending:
        out.append(" | ".join(pending))
    return sorted(out)


def records(lines: Sequence[str]) -> list[str]:
    return [line for line in lines if line.startswith("[cluster-task ")]


def summaries(lines: Sequence[str]) -> list[str]:
    return [line for line in lines if line.startswith("[cluster-summary ")]


_JOBSTATE_TS = re.compile(r"^\d+\.\d+ ")


def jobstate_lines(text: str | None) -> list[str]:
    if text is None:
        return ["<no jobstate.log>"]
    return [_JOBSTATE_TS.sub("", line) for line in text.splitlines()]


_DAGMAN_TS = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d ")
_PID = re.compile(r"(PID = |pid )\d+")


def dagman_lines(text: str | None) -> list[str]:
    if text is None:
        return ["<no DAG.dagman.out>"]
    return [_PID.sub(r"\1<PID>", _DAGMAN_TS.sub("", line)) for line in text.splitlines()]


def rescue_lines(text: str | None) -> list[str]:
    """The rescue file's records (DONE lines; blank lines and comments dropped)."""
    if text is None:
        return ["<no rescue file>"]
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def log_lines(run: Run, patterns: Sequence[str]) -> list[str]:
    """The console log lines (stderr) that match one of the patterns (whole line,
    ``re.fullmatch``), in order, paths normalised."""
    compiled = [re.compile(p) for p in patterns]
    out = []
    for line in norm_paths(run.stderr, run).splitlines():
        if any(c.fullmatch(line) for c in compiled):
            out.append(line)
    return out


_ABORT = re.compile(r"^ABORT: (?:\w+\.cpp\(\d+\): )?")


def abort_text(run: Run) -> list[str]:
    """The reference's abort message(s) without ``ABORT: file.cpp(NN): ``."""
    return [_ABORT.sub("", line) for line in norm_paths(run.stderr, run).splitlines()
            if line.startswith("ABORT: ")]


# -- the pair of runs ---------------------------------------------------------------------

class Pair:
    """Runs one DAG through the reference and through pmc, each in a directory of its own
    (same file names in both, so outputs compare after replacing the directory)."""

    def __init__(self, binary: Path, base: Path, cache: dict[tuple[object, ...], Run]):
        self.binary = binary
        self.base = base
        self._cache = cache
        self._count = itertools.count()

    def fresh(self, label: str) -> Path:
        return self.base / f"{label}-{next(self._count)}"

    def reference(self, dag: str, args: Sequence[str] = (), *, workers: int = 1,
                  env: dict[str, str] | None = None, files: dict[str, str] | None = None,
                  where: Path | None = None, timeout: float = 90) -> Run:
        """The reference on DAG (``w.dag``, given last) with WORKERS worker ranks. Runs in
        a new directory are cached for the session (the same DAG, options and files give
        the same Run): pmc is run in both modes against one reference run."""
        key = (dag, tuple(args), workers, tuple(sorted((env or {}).items())),
               tuple(sorted((files or {}).items())))
        if where is None and key in self._cache:
            return self._cache[key]
        cwd = prepare(where or self.fresh("reference"), dag, files)
        run = execute("reference", reference_argv(self.binary, workers, [*args, DAG_NAME]),
                      cwd, ompi_env(**(env or {})), timeout)
        if where is None:
            self._cache[key] = run
        return run

    def pmc(self, mode: str, dag: str, args: Sequence[str] = (), *, workers: int = 1,
            env: dict[str, str] | None = None, files: dict[str, str] | None = None,
            where: Path | None = None, timeout: float = 90) -> Run:
        cwd = prepare(where or self.fresh(f"pmc-{mode}"), dag, files)
        return execute(f"pmc ({mode})", pmc_argv(mode, workers, [*args, DAG_NAME]), cwd,
                       clean_env(**(env or {})), timeout)
