"""pmc.sif, the file a site runs with ``apptainer exec pmc.sif pmc run``, opened as
Apptainer opens it (tests/sifkit.py): its descriptors name one primary system squashfs
partition, which is mounted at its offset (squashfuse_ll and squashfuse, as unprivileged
Apptainer mounts it, and the kernel's squashfs, as setuid Apptainer does) and
entered with the working directory and /tmp bound in. From inside it, ``pmc run`` and
``pegasus-mpi-cluster`` run the diamond DAG and a 100-task DAG in both MPI models: the
host's launcher starting each rank inside the image (the hybrid model), and the image's
own launcher inside it.

The file is built by ``bash ci/build-sif.sh`` (CI: ci/container-test.sh, which then runs
this file with ``PMC_TEST_SIF`` naming it). Without ``PMC_TEST_SIF`` these tests are
skipped; with it set, a missing file fails them. Needs root.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import sifkit
from pmctest import DIAMOND, clean_env, mpiexec

SIF = os.environ.get("PMC_TEST_SIF")
pytestmark = [
    pytest.mark.container,
    pytest.mark.skipif(not SIF, reason="set PMC_TEST_SIF to a pmc.sif (bash ci/build-sif.sh)"),
]

HUNDRED = "".join(f"TASK t{i} /bin/echo task {i}\n" for i in range(100)) + "".join(
    f"EDGE t{i} t{i + 50}\n" for i in range(50))


@pytest.fixture(scope="module")
def sif() -> Path:
    assert SIF
    path = Path(SIF)
    assert path.is_file(), f"PMC_TEST_SIF={SIF}: no such file"
    if os.geteuid() != 0:
        pytest.skip("entering an image needs root")
    return path


@pytest.fixture(scope="module", params=["squashfuse_ll", "squashfuse", "kernel"])
def image(request: pytest.FixtureRequest, sif: Path) -> Iterator[Path]:
    with sifkit.opened(sif, request.param) as root:
        yield root


@pytest.fixture
def work() -> Iterator[Path]:
    # Under /tmp, which the image gets bound in, as Apptainer binds it by default.
    path = Path(tempfile.mkdtemp(prefix="pmc-sif-test.", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=clean_env(), capture_output=True, text=True,
                          timeout=180)


def summary(r: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("[cluster-summary")]
    assert len(lines) == 1, r.stdout[-2000:] + r.stderr[-2000:]
    return lines[0]


def test_the_descriptors_name_one_primary_system_squashfs_partition(sif: Path) -> None:
    part = sifkit.system_partition(sif)
    assert (part.fstype, part.arch) == (sifkit.FS_SQUASHFS, "02")  # amd64
    assert part.offset % 4096 == 0 and part.size > 10_000_000
    with open(sif, "rb") as f:
        assert f.read(31) == b"#!/usr/bin/env run-singularity\n"
        f.seek(part.offset)
        assert f.read(4) == b"hsqs"  # the squashfs superblock's magic
    if shutil.which("siftool"):
        listing = subprocess.run(["siftool", "list", str(sif)], capture_output=True,
                                 text=True, check=True).stdout
        assert re.search(rf"\|{part.offset}-{part.offset + part.size}\s+\|FS \(Squashfs/\*"
                         r"System/amd64\)", listing), listing
        assert "Def.FILE" in listing and "JSON.Generic" in listing


def test_the_image_is_apptainers_layout(image: Path) -> None:
    sd = image / ".singularity.d"
    assert (sd / "runscript").read_text().strip().splitlines()[-1] == 'exec pmc "$@"'
    assert "PATH=/opt/pmc/bin:" in (sd / "env" / "10-docker2singularity.sh").read_text()
    assert (sd / "labels.json").is_file() and (sd / "Singularity").is_file()
    assert os.access(sd / "actions" / "exec", os.X_OK)


@pytest.mark.parametrize("dag", [DIAMOND, HUNDRED], ids=["diamond", "100 tasks"])
def test_the_hosts_launcher_starts_every_rank_inside_the_image(
        image: Path, work: Path, dag: str) -> None:
    (work / "w.dag").write_text(dag)
    enter = sifkit.enter_script(image, work)
    r = run([mpiexec(), "-n", "3", str(enter), "pmc", "run", "w.dag"], work)
    assert r.returncode == 0, r.stderr[-3000:]
    tasks = dag.count("TASK ")
    line = summary(r)
    assert f'stat="ok", tasks={tasks}, submitted={tasks}, succeeded={tasks}, failed=0' in line
    assert 'app="/opt/pmc/bin/pmc"' in line  # pmc from the image, not the host's
    assert "Master starting with 2 workers" in r.stderr


@pytest.mark.parametrize("dag", [DIAMOND, HUNDRED], ids=["diamond", "100 tasks"])
def test_the_images_own_launcher_inside_it(image: Path, work: Path, dag: str) -> None:
    (work / "w.dag").write_text(dag)
    enter = sifkit.enter_script(image, work)
    r = run([str(enter), "mpiexec", "-n", "3", "pmc", "run", "w.dag"], work)
    assert r.returncode == 0, r.stderr[-3000:]
    tasks = dag.count("TASK ")
    line = summary(r)
    assert f'stat="ok", tasks={tasks}, submitted={tasks}, succeeded={tasks}, failed=0' in line
    assert 'app="/opt/pmc/bin/pmc"' in line
    assert "Master starting with 2 workers" in r.stderr


def test_pegasus_mpi_cluster_and_pmc_run_with_a_profile_inside_the_image(
        image: Path, work: Path) -> None:
    (work / "w.dag").write_text(DIAMOND)
    enter = sifkit.enter_script(image, work)
    r = run([str(enter), "mpiexec", "-n", "3", "pegasus-mpi-cluster", "-s", "w.dag"], work)
    assert r.returncode == 0, r.stderr[-3000:]
    assert 'app="/opt/pmc/bin/pegasus-mpi-cluster"' in summary(r)
    # A batch script of one's own: the site profile, read by the image's pmc (its schema
    # ships in the wheel).
    (work / "site.yaml").write_text("site: lab\nscheduler: slurm\n"
                                    "metrics:\n  textfile: run.prom\n")
    r = run([str(enter), "pmc", "run", "-s", "--workers", "2", "--site", "site.yaml",
             "w.dag"], work)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "succeeded=4, failed=0" in summary(r)
    # The rescue log and the metrics went to the working directory on the host.
    assert (work / "w.dag.rescue").read_text().count("DONE") == 4
    assert 'site="lab"' in (work / "run.prom").read_text()


def test_the_start_up_benchmark_runs_every_way(sif: Path) -> None:
    # benchmarks/sifstart.py at a tiny size: it opens the file each way and runs pmc in
    # each (its figures belong in benchmarks/RESULTS.md, none are asserted here).
    import sys

    bench = Path(__file__).resolve().parent.parent / "benchmarks" / "sifstart.py"
    r = subprocess.run([sys.executable, str(bench), "--sif", str(sif), "--tasks", "40",
                        "--rounds", "1"], env=clean_env(), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    last = r.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"SUMMARY host=1\.00 sandbox=\S+ kernel=\S+ squashfuse_ll=\S+ "
                        r"squashfuse=\S+", last), last
