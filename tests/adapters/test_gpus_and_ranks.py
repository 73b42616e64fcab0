"""Site profiles for GPUs and multi-rank tasks: host.gpus becomes each scheduler's GPU
request and pmc run's --host-gpus, pmc.task_launcher becomes --task-launcher; the fake
schedulers run the generated scripts, whose tasks get their own GPUs and whose
multi-rank task starts through the nested launcher."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from adapterkit import Fakes, base_profile
from pmc.adapters import AdapterError, script_for
from pmc.adapters.site import parse_site

REPO = Path(__file__).resolve().parents[2]
MPI_RANKS = REPO / "tests/data/mpi_ranks.py"


def site_of(scheduler: str, **extra: Any) -> Any:
    return parse_site(base_profile(scheduler, **extra), f"{scheduler}.yaml")


def lines_with(text: str, start: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(start)]


def run_line(text: str) -> list[str]:
    """The pmc run argv of a script's launch line."""
    for line in text.splitlines():
        words = shlex.split(line) if " run " in line and not line.startswith("#") else []
        if "run" in words:
            return words[words.index("run"):]
    raise AssertionError("no pmc run line")


@pytest.mark.parametrize(("scheduler", "extra", "directive"), [
    ("slurm", {}, "#SBATCH --gpus-per-node=4"),
    ("pbs", {"flavor": "pro"}, "#PBS -l select=1:ncpus=3:mpiprocs=3:ngpus=4"),
    ("pbs", {"flavor": "torque"}, "#PBS -l nodes=1:ppn=3:gpus=4"),
])
def test_gpus_per_node_requested_and_declared(scheduler: str, extra: dict[str, str],
                                              directive: str) -> None:
    text = script_for(site_of(scheduler, host={"gpus": 4}, **extra), "w.dag")
    assert directive in text.splitlines()
    argv = run_line(text)
    assert argv[argv.index("--host-gpus") + 1] == "4"


def test_no_gpus_no_request() -> None:
    for scheduler in ("slurm", "pbs"):
        text = script_for(site_of(scheduler), "w.dag")
        assert "gpu" not in text.lower()
    # host.gpus 0: declared none, nothing requested
    text = script_for(site_of("slurm", host={"gpus": 0}), "w.dag")
    assert not lines_with(text, "#SBATCH --gpus")
    argv = run_line(text)
    assert argv[argv.index("--host-gpus") + 1] == "0"


def test_local_passes_host_gpus_only() -> None:
    text = script_for(site_of("local", host={"gpus": 2}), "w.dag")
    argv = run_line(text)
    assert argv[argv.index("--host-gpus") + 1] == "2"


def test_loadleveler_says_it_has_no_gpu_request() -> None:
    with pytest.raises(AdapterError) as exc:
        script_for(site_of("loadleveler", host={"gpus": 2}), "w.dag")
    assert str(exc.value) == (
        "loadleveler.yaml: host.gpus: LoadLeveler has no GPU request; ask for the GPUs "
        "with your site's consumable resource in directives (e.g. 'resources = ...'), and "
        "declare them to pmc with environment PMC_HOST_GPUS: 2")


def test_negative_gpus_refused_by_the_schema() -> None:
    with pytest.raises(Exception, match=r"host\.gpus"):
        site_of("slurm", host={"gpus": -1})


def test_task_launcher_passed_as_one_word() -> None:
    template = "mpiexec -launcher pbs -n {ranks} -f {nodefile}"
    text = script_for(site_of("pbs", pmc={"command": ["pmc"], "task_launcher": template}),
                      "w.dag")
    argv = run_line(text)
    assert argv[argv.index("--task-launcher") + 1] == template
    subprocess.run(["bash", "-n", "-c", text], check=True)


def test_a_bad_task_launcher_is_named_where_the_profile_gives_it() -> None:
    # Checked when the profile is read (pmc script / submit), not when the job runs.
    with pytest.raises(Exception) as e:
        site_of("slurm", pmc={"task_launcher": "srun -n {rank} 'x"})
    assert "pmc.task_launcher: bad value" in str(e.value)
    assert "No closing quotation" in str(e.value)
    with pytest.raises(Exception) as e:
        site_of("slurm", pmc={"task_launcher": "srun -n {rank}"})
    assert "pmc.task_launcher: bad value 'srun -n {rank}'" in str(e.value)
    assert "unknown placeholder {rank}" in str(e.value)


def _env_with_our_path(fakes: Fakes) -> None:
    # keep the caller's PYTHONPATH too (how this interpreter finds pmc.adapters)
    extra = os.environ.get("PYTHONPATH")
    if extra:
        fakes.env["PYTHONPATH"] += os.pathsep + extra


GPU_DAG = """\
TASK g1 --request-gpus 2 /bin/sh -c "echo g1 gpus=$PMC_GPUS cuda=$CUDA_VISIBLE_DEVICES"
TASK g2 --request-gpus 2 /bin/sh -c "echo g2 gpus=$PMC_GPUS cuda=$CUDA_VISIBLE_DEVICES"
TASK none /bin/sh -c "echo none gpus=[$PMC_GPUS] cuda=[$CUDA_VISIBLE_DEVICES]"
TASK mr --ranks 2 {python} {prog} {out}
"""


@pytest.mark.mpi
@pytest.mark.parametrize(("scheduler", "extra"), [
    # a template of the profile's: srun (the fake's) started for the task
    ("slurm", {"task_launcher": "srun --overlap --ntasks={ranks} --nodelist={nodefile}"}),
    # none: pmc run's default outside Slurm, mpiexec with the node file
    ("pbs", {}),
])
def test_gpu_and_multirank_tasks_run_through_the_fakes(
        fakes: Fakes, scheduler: str, extra: dict[str, Any]) -> None:
    _env_with_our_path(fakes)
    profile = base_profile(scheduler, host={"gpus": 4})
    profile["pmc"].update(extra)
    out = fakes.work / "ranks.txt"
    (fakes.work / "gpu.dag").write_text(GPU_DAG.format(
        python=sys.executable, prog=MPI_RANKS, out=out))
    site = fakes.profile("site.yaml", profile)
    fakes.pmc("submit", "--site", str(site), "gpu.dag", check=True)
    output = fakes.job_output()
    assert "pmc: run exited with status 0" in output, output
    seen = {line.split()[0]: line.split()[1:] for line in output.splitlines()
            if line.startswith(("g1 ", "g2 ", "none "))}
    assert seen["none"] == ["gpus=[]", "cuda=[]"]
    for task in ("g1", "g2"):
        gpus, cuda = seen[task]
        ids = gpus.removeprefix("gpus=").split(",")
        assert cuda == "cuda=" + ",".join(ids)
        assert len(set(ids)) == 2 and set(ids) <= {"0", "1", "2", "3"}, seen
    host = os.uname().nodename
    assert sorted(out.read_text().splitlines()) == [f"0 2 {host}", f"1 2 {host}"]
    # the multi-rank task started through the nested launcher, after the outer launch
    if scheduler == "slurm":
        inner = [c["argv"] for c in fakes.calls("srun") if "--overlap" in c["argv"]]
        nodefile = inner[0][2].removeprefix("--nodelist=") if inner else ""
        assert inner == [["--overlap", "--ntasks=2", f"--nodelist={nodefile}",
                          sys.executable, str(MPI_RANKS), str(out)]]
    else:
        inner = [c["argv"] for c in fakes.calls("mpiexec") if "-f" in c["argv"]]
        assert len(inner) == 1 and inner[0][:3] == ["-n", "2", "-f"], fakes.calls("mpiexec")
