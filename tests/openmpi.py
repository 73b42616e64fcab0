"""Open MPI for the tests, as a site that has it: Debian's launcher (``mpiexec.openmpi``,
Open MPI 4.1) and a venv whose mpi4py is compiled against that Open MPI.

The pip MPICH's mpi4py cannot join an Open MPI job (each rank would start as a singleton),
so ``openmpi_python`` builds mpi4py from its source with ``MPICC=mpicc.openmpi`` into a
venv of its own, as docs/containers.md tells a site to, and points that venv at this
one's site-packages for pmc and its other dependencies (a ``.pth`` line): its own
mpi4py comes first. The venv is kept in ``$PMC_TEST_CACHE`` (default
``~/.cache/pmc-tests``) under a name made of what it depends on, so the compile (a
minute or two) is paid once per machine.
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
RECIPE = "2"  # changes when _build does: a venv built another way is not reused


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


def _key() -> str:
    version = subprocess.run([str(MPICC), "--showme:version"], capture_output=True, text=True,
                             check=False).stdout + subprocess.run(
        [str(MPICC), "--showme"], capture_output=True, text=True, check=False).stdout
    text = "\n".join([MPI4PY, RECIPE, version, sys.version, sys.prefix])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def openmpi_python() -> Path:
    """The venv's python, built on first use (under a lock: test runs of other venvs or
    checkouts may build theirs at the same time)."""
    available()
    cache = Path(os.environ.get("PMC_TEST_CACHE")
                 or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pmc-tests")
    venv = cache / f"openmpi-venv-{_key()}"
    python = venv / "bin" / "python"
    done = venv / "built"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "openmpi-venv.lock", "w") as lock:
        fcntl.lockf(lock, fcntl.LOCK_EX)
        if not done.exists():
            _build(venv)
            done.write_text(MPI4PY + "\n")
    return python


def _build(venv: Path) -> None:
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    # The wrapper links too (LDSHARED): else Python's own -L (here pyenv's lib/, where
    # the pip MPICH may have put a libmpi.so) comes first and mpi4py links MPICH. No
    # debug information, light optimisation: the compile takes a third of the time.
    build_env = dict(os.environ, MPICC=str(MPICC), LDSHARED=f"{MPICC} -shared",
                     CFLAGS="-O1 -g0", PIP_DISABLE_PIP_VERSION_CHECK="1")
    proc = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-cache-dir",
                           "--no-binary=mpi4py", MPI4PY], env=build_env,
                          capture_output=True, text=True, timeout=1200, check=False)
    if proc.returncode != 0:
        pytest.fail(f"building mpi4py against Open MPI failed:\n{proc.stderr[-3000:]}")
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
