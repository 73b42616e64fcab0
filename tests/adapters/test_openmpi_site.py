"""An Open MPI site (profile ``mpi: openmpi``): the PBS script pmc writes, submitted to
the fake qsub, starts its ranks with the real Open MPI launcher (Debian's
``mpiexec.openmpi``, given the script's line as written) and an mpi4py built against
that Open MPI (tests/openmpi.py), and runs every task of the workflow."""

from __future__ import annotations

import shlex

import openmpi
import pytest
from adapterkit import Fakes, base_profile
from pmc.adapters import script_for
from pmc.adapters.site import SiteError, parse_site
from pmctest import rescue_done

TASKS = 30


@pytest.mark.mpi
@pytest.mark.slow
@openmpi.may_build
def test_the_pbs_script_of_an_open_mpi_site_runs_every_task(fakes: Fakes) -> None:
    python = str(openmpi.openmpi_python())
    env = openmpi.env()
    fakes.env.update({k: v for k, v in env.items() if k.startswith("OMPI_")})
    fakes.env["FAKE_OPENMPI_MPIEXEC"] = str(openmpi.MPIEXEC)
    (fakes.work / "w.dag").write_text(
        "".join(f"TASK t{i} /bin/echo task {i}\n" for i in range(TASKS))
        + "".join(f"EDGE t{i} t{i + 1}\n" for i in range(0, TASKS - 1, 3)))
    site = fakes.profile("site.yaml", base_profile(
        "pbs", mpi="openmpi", pmc={"command": [python, "-m", "pmc"], "tries": 2},
        environment={"OMP_NUM_THREADS": 1}))
    job_id = fakes.pmc("submit", "--site", str(site), "w.dag", check=True).stdout.strip()

    (launch,) = fakes.calls("mpiexec")
    argv = launch["argv"]
    assert argv[:8] == ["--enable-recovery", "-n", "3", "--map-by", "ppr:3:node",
                        "--bind-to", "none", "-x"]
    exported = [argv[i + 1] for i, word in enumerate(argv) if word == "-x"]
    assert exported == ["PATH", "OMP_NUM_THREADS", "PMC_JOB_ID", "PMC_CHAIN_INDEX",
                        "PMC_SITE_NAME"]
    out = fakes.job_output()
    assert "pmc: run exited with status 0" in out, out[-3000:]
    assert "Master starting with 2 workers" in out
    assert f'stat="ok", tasks={TASKS}, submitted={TASKS}, succeeded={TASKS}, failed=0' in out
    assert sorted(rescue_done(fakes.work / "w.dag.rescue")) == sorted(
        f"t{i}" for i in range(TASKS))
    status = fakes.pmc("jobs", "status", "--site", str(site), job_id, check=True)
    assert f"{job_id} COMPLETED" in status.stdout


def launch_line(**profile: object) -> list[str]:
    site = parse_site({"site": "s", "nodes": 2, "ranks_per_node": 4, **profile}, "s.yaml")
    text = script_for(site, "w.dag")
    (line,) = [ln for ln in text.splitlines() if ln.startswith(("mpiexec ", "srun "))]
    return shlex.split(line)


def test_each_mpi_family_gets_its_launchers_own_flags() -> None:
    hydra = launch_line(scheduler="pbs")
    assert hydra[:6] == ["mpiexec", "-disable-auto-cleanup", "-n", "8", "-ppn", "4"]
    ompi = launch_line(scheduler="pbs", mpi="openmpi")
    assert ompi[:8] == ["mpiexec", "--enable-recovery", "-n", "8", "--map-by", "ppr:4:node",
                        "--bind-to", "none"]
    assert "-ppn" not in ompi and "-disable-auto-cleanup" not in ompi
    assert launch_line(scheduler="slurm")[1] == "--mpi=pmi2"
    assert launch_line(scheduler="slurm", mpi="openmpi")[1] == "--mpi=pmix"


def test_mpi_is_refused_for_a_launcher_of_its_own_mpi() -> None:
    with pytest.raises(SiteError) as e:
        parse_site({"site": "s", "scheduler": "pbs", "launcher": "aprun", "mpi": "openmpi"},
                   "s.yaml")
    assert str(e.value).startswith("s.yaml: mpi: only meaningful for the launchers mpiexec "
                                   "and srun, not aprun")
    with pytest.raises(SiteError) as e:
        parse_site({"site": "s", "scheduler": "pbs", "mpi": "intel"}, "s.yaml")
    assert "s.yaml: mpi: bad value 'intel'" in str(e.value)
