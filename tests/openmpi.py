"""Open MPI for the tests, as a site that has it: Debian's launcher (``mpiexec.openmpi``,
Open MPI 4.1) and a venv whose mpi4py is compiled against that Open MPI.

The pip MPICH's mpi4py cannot join an Open MPI job (each rank would start as a singleton),
so ``openmpi_python`` builds mpi4py from its source with ``MPICC=mpicc.openmpi`` into a
venv of its own, as docs/containers.md tells a site to, and points that venv at this
one's site-packages for pmc and its other dependencies (a ``.pth`` line): its own
mpi4py comes first. The compiled wheel and the venv are kept in ``$PMC_TEST_CACHE``
(default ``~/.cache/pmc-tests``) under names made of what they depend on, so the
compile (two to six minutes on a 2-core machine) is paid once per machine and Python
version, and making a venv of it afterwards takes seconds. Every test that calls
``openmpi_python`` carries ``may_build``, a time limit that allows for the compile.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from pmctest import clean_env

MPIEXEC = shutil.which("mpiexec.openmpi")
MPICC = shutil.which("mpicc.openmpi")
MPI4PY = "mpi4py>=4.0,<5"
RECIPE = "4"  # changes when _build does: a venv built another way is not reused
# The compile may take this long on a busy machine; past it, pip is stopped and the test
# fails saying so.
BUILD_SECONDS = 900
# The time limit of a test that calls openmpi_python(): on a fresh machine the first one
# to run pays the compile inside it, so pytest's per-test default (300 s, pyproject.toml)
# would stop it half-built. Its own work gets the default on top of the compile.
may_build = pytest.mark.timeout(BUILD_SECONDS + 300)


def available() -> None:
    """Skip the test unless Open MPI (launcher and compiler wrapper) is installed."""
    if MPIEXEC is None or MPICC is None:
        pytest.skip("Open MPI is not installed (apt-get install openmpi-bin libopenmpi-dev)")


def env(**extra: str) -> dict[str, str]:
    """A user's environment for ``mpiexec.openmpi``. The tests run as root, which Open
    MPI refuses unless told twice; they also start more ranks than this machine has
    cores, which it refuses unless allowed to oversubscribe."""
    out = clean_env(**extra)
    if os.geteuid() == 0:
        out.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    out.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    return out


def _key(*parts: str) -> str:
    mpicc = [subprocess.run([str(MPICC), flag], capture_output=True, text=True,
                            check=False).stdout for flag in ("--showme:version", "--showme")]
    text = "\n".join([MPI4PY, RECIPE, *mpicc, sys.version, *parts])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def openmpi_python() -> Path:
    """The venv's python, made on first use (under a lock: test runs of other venvs or
    checkouts may make theirs at the same time). The compiled mpi4py wheel is kept
    apart, shared by the venvs of every interpreter of this Python version."""
    available()
    cache = Path(os.environ.get("PMC_TEST_CACHE")
                 or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pmc-tests")
    venv = cache / f"openmpi-venv-{_key(sys.prefix)}"
    wheels = cache / f"mpi4py-openmpi-{_key()}"
    done = venv / "built"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "openmpi-venv.lock", "w") as lock:
        fcntl.lockf(lock, fcntl.LOCK_EX)
        if not done.exists():
            _build(venv, wheels)
            done.write_text(MPI4PY + "\n")
    return venv / "bin" / "python"


def _pip(python: Path, *args: str, env: dict[str, str] | None = None) -> None:
    try:
        proc = subprocess.run([str(python), "-m", "pip", *args], env=env, capture_output=True,
                              text=True, timeout=BUILD_SECONDS, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"pip {args[0]} of mpi4py against Open MPI took over {BUILD_SECONDS} s")
    if proc.returncode != 0:
        pytest.fail(f"pip {args[0]} of mpi4py against Open MPI failed:\n{proc.stderr[-3000:]}")


def _build(venv: Path, wheels: Path) -> None:
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    if not list(wheels.glob("mpi4py-*.whl")):
        # Open MPI's library directories first: a shared Python's link line (pyenv's
        # LDSHARED, and the -L of its lib/ that every extension gets) names its own
        # lib/ before the wrapper's, and the pip MPICH may have put a libmpi.so there.
        # The wrapper with LDFLAGS replaces that line's start. No debug information,
        # light optimisation: a third of the compile time.
        libdirs = subprocess.run([str(MPICC), "--showme:libdirs"], capture_output=True,
                                 text=True, check=True).stdout.split()
        build_env = dict(os.environ, MPICC=str(MPICC), LDSHARED=f"{MPICC} -shared",
                         LDFLAGS=" ".join(f"-L{d}" for d in libdirs), CFLAGS="-O1 -g0",
                         PIP_DISABLE_PIP_VERSION_CHECK="1")
        _pip(python, "wheel", "-q", "--no-cache-dir", "--no-deps", "--no-binary=mpi4py",
             "-w", str(wheels), MPI4PY, env=build_env)
    _pip(python, "install", "-q", "--no-index", "--no-deps", *map(str, wheels.glob("*.whl")))
    # pmc and its other dependencies: this venv's, after the venv's own mpi4py.
    purelib = subprocess.run([str(python), "-c", "import sysconfig; "
                              "print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    here = sysconfig.get_paths()["purelib"]
    Path(purelib, "pmc-tests-base.pth").write_text(
        f"import site; site.addsitedir({here!r})\n")
    version = subprocess.run([str(python), "-c", "from mpi4py import MPI; "
                              "print(MPI.Get_library_version())"],
                             capture_output=True, text=True, check=False)
    if "Open MPI" not in version.stdout:
        pytest.fail(f"mpi4py in {venv} does not load Open MPI: {version.stdout}{version.stderr}")
