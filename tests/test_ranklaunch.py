"""pmc.runtime.ranklaunch: launcher templates, the node file, and the task environment
that lets a nested launcher start an N-rank program inside an MPI launch (real mpiexec
and, with PMC_TEST_SLURM=1, a real srun step)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pmc.runtime.ranklaunch import (
    DEFAULT_MPIEXEC,
    DEFAULT_SLURM,
    check_template,
    default_template,
    launcher_argv,
    task_env,
    write_nodefile,
)

REPO = Path(__file__).resolve().parent.parent
MPI_RANKS = REPO / "tests/data/mpi_ranks.py"


def test_placeholders_substituted_per_word() -> None:
    argv = launcher_argv("launch -np {ranks} '--nodelist={hosts}' --x='a b' {nodefile} "
                         "--per={ranks_per_host} -N{nhosts} -c {cpus_per_rank} {{lit}}",
                         ranks=4, hosts=[("n1", 2), ("n 2", 2)], cpus_per_rank=3,
                         nodefile="/tmp/my nodes")
    assert argv == ["launch", "-np", "4", "--nodelist=n1,n 2", "--x=a b", "/tmp/my nodes",
                    "--per=2", "-N2", "-c", "3", "{lit}"]


def test_user_text_never_meets_a_shell() -> None:
    argv = launcher_argv("run {hosts}", ranks=1, hosts=[("$(touch x);h", 1)],
                         cpus_per_rank=1, nodefile="f")
    assert argv == ["run", "$(touch x);h"]


@pytest.mark.parametrize(("template", "message"), [
    ("mpiexec -n {rank}", "unknown placeholder {rank}"),
    ("mpiexec -n {ranks:3}", "unknown placeholder {ranks:3}"),
    ("mpiexec -n {}", "unknown placeholder {}"),
    ("mpiexec '-n {ranks}", "No closing quotation"),
    ("mpiexec -n {ranks", "expected '}' before end of string"),
    ("   ", "task launcher template is empty"),
])
def test_bad_templates_named(template: str, message: str) -> None:
    with pytest.raises(ValueError) as exc:
        check_template(template)
    assert message in str(exc.value)
    assert str(exc.value).startswith("task launcher template")


def test_ranks_per_host_only_when_equal() -> None:
    with pytest.raises(ValueError, match=r"needs the same number of ranks on every host, "
                                         r"not a:3,b:1"):
        launcher_argv("x --ppn {ranks_per_host}", ranks=4, hosts=[("a", 3), ("b", 1)],
                      cpus_per_rank=1, nodefile="f")


def test_defaults() -> None:
    check_template(DEFAULT_SLURM)
    check_template(DEFAULT_MPIEXEC)
    assert default_template({"SLURM_JOB_ID": "12"}) == DEFAULT_SLURM
    assert default_template({"PATH": "/bin"}) == DEFAULT_MPIEXEC
    assert launcher_argv(DEFAULT_SLURM, ranks=3, hosts=[("a", 2), ("b", 1)],
                         cpus_per_rank=2, nodefile="/w/nf") == [
        "srun", "--mpi=pmi2", "--overlap", "--exact", "--distribution=arbitrary",
        "--ntasks=3", "--nodelist=/w/nf", "--cpus-per-task=2"]


def test_nodefile_one_line_per_rank(tmp_path: Path) -> None:
    path = tmp_path / "nodes"
    write_nodefile(str(path), [("a", 2), ("b", 1)])
    assert path.read_text() == "a\na\nb\n"


def test_task_env_scrubs_outer_launch() -> None:
    outer = {"PATH": "/bin", "PMI_RANK": "1", "PMI_FD": "5", "PMIX_RANK": "0",
             "HYDI_CONTROL_FD": "7", "OMPI_COMM_WORLD_RANK": "1", "SLURM_PROCID": "1",
             "SLURM_STEP_ID": "0", "SLURM_STEPID": "0", "SLURM_NTASKS": "2",
             "SLURM_CPUS_PER_TASK": "1", "SLURM_NTASKS_PER_NODE": "2",
             "SRUN_CPUS_PER_TASK": "4", "SLURM_GPUS_PER_NODE": "4",
             "SLURM_JOB_ID": "7", "SLURM_NODELIST": "vm", "OMPI_MCA_btl": "self",
             "CUDA_VISIBLE_DEVICES": "1", "PMC_AFFINITY": "0"}
    env = task_env(outer, [("vm", 2), ("w", 1)], "/run/nf")
    assert env == {"PATH": "/bin", "SLURM_JOB_ID": "7", "SLURM_NODELIST": "vm",
                   "SLURM_GPUS_PER_NODE": "4",
                   "OMPI_MCA_btl": "self", "CUDA_VISIBLE_DEVICES": "1",
                   "PMC_HOSTS": "vm,w", "PMC_NODEFILE": "/run/nf",
                   "SLURM_HOSTFILE": "/run/nf"}


# The outer rank 0 starts the nested launch as a multi-rank task would be started; the
# others wait at a barrier, as pmc's workers keep their MPI connection meanwhile.
NESTED = """
import os, subprocess, sys
from mpi4py import MPI
from pmc.runtime import ranklaunch as rl
out, template = sys.argv[1], sys.argv[2]
rc = 0
if MPI.COMM_WORLD.Get_rank() == 0:
    hosts = [(os.uname().nodename, 2)]
    nodefile = out + ".nodes"
    rl.write_nodefile(nodefile, hosts)
    argv = rl.launcher_argv(template, ranks=2, hosts=hosts, cpus_per_rank=1,
                            nodefile=nodefile)
    env = rl.task_env(os.environ, hosts, nodefile) if sys.argv[4] == "scrub" else None
    rc = subprocess.run(argv + [sys.executable, sys.argv[3], out], env=env,
                        timeout=120).returncode
MPI.COMM_WORLD.Barrier()
sys.exit(rc)
"""


def _nested(tmp_path: Path, outer: list[str], template: str, *, scrub: bool = True,
            **env_extra: str) -> list[str]:
    """The lines the nested 2-rank program wrote ([] when the nested launch failed)."""
    script = tmp_path / "outer.py"
    script.write_text(NESTED)
    out = tmp_path / "ranks.txt"
    out.unlink(missing_ok=True)
    env = {**os.environ, **env_extra,
           "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([*outer, sys.executable, str(script), str(out), template,
                           str(MPI_RANKS), "scrub" if scrub else "raw"], cwd=tmp_path,
                          env=env, timeout=180, capture_output=True, text=True, check=False)
    if not out.exists():
        assert proc.returncode != 0
        return []
    assert proc.returncode == 0, proc.stderr[-2000:]
    return sorted(out.read_text().splitlines())


@pytest.mark.mpi
def test_nested_mpiexec_inside_an_mpiexec_rank(tmp_path: Path) -> None:
    host = os.uname().nodename
    lines = _nested(tmp_path, ["mpiexec", "-n", "2"], DEFAULT_MPIEXEC)
    assert lines == [f"0 2 {host}", f"1 2 {host}"]


def _slurm_node() -> tuple[str, str]:
    """The local Slurm node and its cpus; skipped without Slurm unless
    PMC_TEST_SLURM=1 (as tests/slurm/conftest.py)."""
    proc = None
    if shutil.which("sinfo") is not None:
        proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %c %T"], capture_output=True,
                              text=True, timeout=30, check=False)
    fields = proc.stdout.split() if proc is not None and proc.returncode == 0 else []
    if len(fields) < 3 or fields[2] not in ("idle", "mixed", "allocated"):
        if os.environ.get("PMC_TEST_SLURM") == "1":
            pytest.fail("PMC_TEST_SLURM=1 but the local Slurm cluster is not up")
        pytest.skip("the local Slurm cluster is not up (bash ci/slurm-up.sh)")
    return fields[0], fields[1]


@pytest.mark.slurm
@pytest.mark.slow
def test_nested_srun_overlap_inside_an_srun_step(tmp_path: Path) -> None:
    host, cpus = _slurm_node()
    # the outer step takes every cpu of the node: only --overlap lets the nested one in
    lines = _nested(tmp_path, ["srun", "--mpi=pmi2", "-n", "1", "-c", cpus, "--exact",
                               f"--nodelist={host}"], DEFAULT_SLURM)
    assert lines == [f"0 2 {host}", f"1 2 {host}"]


@pytest.mark.slurm
@pytest.mark.slow
def test_nested_srun_takes_its_own_layout_not_the_outer_steps(tmp_path: Path) -> None:
    # As in a batch script of sbatch -c C: the outer step's cpus per task (from
    # SRUN_CPUS_PER_TASK and the step's SLURM_CPUS_PER_TASK) would make a 2-rank step
    # ask for twice the node's cpus; scrubbed, the template alone decides.
    host, cpus = _slurm_node()
    outer = ["srun", "--mpi=pmi2", "-n", "1", "-c", cpus, "--exact", f"--nodelist={host}"]
    template = "srun --mpi=pmi2 --overlap --distribution=arbitrary --ntasks={ranks} " \
               "--nodelist={nodefile}"
    assert _nested(tmp_path, outer, template, SRUN_CPUS_PER_TASK=cpus) == [
        f"0 2 {host}", f"1 2 {host}"]
    assert _nested(tmp_path, outer, template, scrub=False, SRUN_CPUS_PER_TASK=cpus) == []
