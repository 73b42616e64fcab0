"""Every example profile's script matches its golden file under tests/golden/.

Goldens change only on purpose: ``PMC_REGEN_GOLDEN=1 pytest tests/adapters`` rewrites
them; without the flag a missing or different golden is a failure.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pmctest
import pytest
from pmc.adapters import script_for
from pmc.adapters.site import load_site

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden"
PROFILES = sorted((REPO / "configs").glob("site-*.yaml"))
CHAINED = {"site-slurm-local", "site-pbs-mpiexec", "site-loadleveler-poe", "site-local-mpiexec",
           "site-pbs-openmpi"}
REGEN = os.environ.get("PMC_REGEN_GOLDEN") == "1"

CASES = [(p, 1) for p in PROFILES] + [(p, 5) for p in PROFILES if p.stem in CHAINED]


def test_every_scheduler_and_launcher_has_an_example() -> None:
    pairs = {(s.scheduler, s.launcher) for s in map(load_site, PROFILES)}
    assert {
        ("slurm", "srun"),
        ("slurm", "mpiexec"),
        ("slurm", "aprun"),
        ("pbs", "mpiexec"),
        ("pbs", "aprun"),
        ("loadleveler", "poe"),
        ("local", "mpiexec"),
    } <= pairs


@pytest.mark.parametrize(("profile", "max_jobs"), CASES, ids=lambda v: getattr(v, "stem", v))
def test_script_matches_golden(profile: Path, max_jobs: int) -> None:
    site = load_site(profile)
    text = script_for(
        site, "workflow.dag", script_path=f"workflow.dag.{site.scheduler}.sh", max_jobs=max_jobs
    )
    golden = GOLDEN / (profile.stem + (".chain" if max_jobs > 1 else "") + ".sh")
    if REGEN:
        golden.write_text(text)
    assert golden.exists(), f"no golden {golden}; create it with PMC_REGEN_GOLDEN=1"
    assert text == golden.read_text(), f"script differs from {golden} (PMC_REGEN_GOLDEN=1)"
    # Whatever it says, it is valid bash.
    subprocess.run(["bash", "-n", str(golden)], check=True)


def test_rendering_is_stable() -> None:
    site = load_site(PROFILES[0])
    assert script_for(site, "w.dag") == script_for(site, "w.dag")


def test_pbs_examples_start_ranks_through_a_launcher_pbs_tracks() -> None:
    # Under PBS an mpiexec without a TM launcher starts the other nodes' ranks over ssh,
    # outside the job. The PBS examples use aprun, or ask mpiexec for its PBS launcher.
    pbs = [s for s in map(load_site, PROFILES) if s.scheduler == "pbs"]
    assert {s.launcher for s in pbs} == {"mpiexec", "aprun"}
    assert {s.mpi for s in pbs if s.launcher == "mpiexec"} == {"mpich", "openmpi"}
    for site in pbs:
        if site.launcher == "mpiexec":
            tm = ["-launcher", "pbs"] if site.mpi == "mpich" else ["--mca", "plm", "tm"]
            assert list(site.launcher_args[:len(tm)]) == tm, site.source
            assert site.modules and site.setup, f"{site.source}: loads no site MPI"


@pytest.mark.mpi
def test_pip_mpiexec_refuses_the_pbs_launcher_instead_of_using_ssh() -> None:
    # What the PBS example does with the pip MPICH by mistake: fail at once, loudly.
    proc = subprocess.run(
        [pmctest.mpiexec(), "-launcher", "pbs", "-n", "1", "true"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0
    assert "unrecognized launcher: pbs" in proc.stdout + proc.stderr
