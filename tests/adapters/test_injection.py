"""No profile value and no task name can run a command of its own in the batch script.

Each scheduler's script is rendered with hostile text in every field it supports, then
run in real bash with recording stand-ins for the launcher and ``module``: nothing
hostile may execute, and the launcher must receive each value literally.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from adapterkit import Fakes, base_profile
from pmc.adapters import AdapterError, script_for
from pmc.adapters.site import SiteError, parse_site
from pmctest import rescue_done

EVIL = "x$(touch PWNED1)`touch PWNED2`;touch PWNED3 'q' \"dq\" $HOME \\ && touch PWNED4 #"

RECORDER = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["REC_FILE"], "a") as f:
    f.write(json.dumps({{"tool": os.path.basename(sys.argv[0]), "argv": sys.argv[1:],
                        "env": dict(os.environ)}}) + "\\n")
"""

DIRECTIVE_FIELDS = ["job_name", "account", "queue", "qos", "reservation", "constraint"]
DIRECTIVE_FIELDS += ["output", "error"]


def evil_profile(scheduler: str) -> dict[str, Any]:
    data: dict[str, Any] = {
        "site": EVIL,
        "scheduler": scheduler,
        "walltime": 30,
        "nodes": 1,
        "ranks_per_node": 2,
        "environment": {"EVIL_VALUE": EVIL},
        "modules": [EVIL],
        "launcher_args": [EVIL],
        "container": {"image": EVIL, "binds": [EVIL], "args": [EVIL]},
        "pmc": {
            "command": [EVIL],
            "stdout": EVIL,
            "stderr": EVIL,
            "rescue": EVIL,
            "host_script": EVIL,
            "args": [EVIL],
        },
        "logging": {"file": EVIL},
        "metrics": {"bind": EVIL, "textfile": EVIL, "pushgateway": EVIL},
        "directives": [EVIL],
    }
    if scheduler != "local":
        data.update({f: EVIL for f in DIRECTIVE_FIELDS})
    if scheduler in ("pbs", "loadleveler"):
        del data["qos"]
    if scheduler == "pbs":
        del data["queue"]  # PBS Pro takes the reservation as its queue
    if scheduler == "local":
        del data["directives"]
    return data


@pytest.mark.parametrize("scheduler", ["slurm", "pbs", "loadleveler", "local"])
def test_hostile_profile_values_stay_data(tmp_path: Path, scheduler: str) -> None:
    site = parse_site(evil_profile(scheduler))
    dag = f"{EVIL}.dag"
    script = tmp_path / "job.sh"
    script.write_text(script_for(site, dag, script_path=str(script), max_jobs=3))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("srun", "mpiexec", "aprun", "poe", "module", "sbatch", "qsub", "llsubmit"):
        (bin_dir / tool).write_text(RECORDER)
        (bin_dir / tool).chmod(0o755)
    rec = tmp_path / "rec.jsonl"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", REC_FILE=str(rec))
    env["PMC_LOCAL_JOBS"] = str(tmp_path / "jobs")
    env["PBS_O_WORKDIR"] = str(tmp_path)
    subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, check=False, timeout=60)

    assert not list(tmp_path.rglob("PWNED*")), "a profile value ran as a command"
    calls = [json.loads(line) for line in rec.read_text().splitlines()]
    launch = next(c for c in calls if c["tool"] == site.launcher)
    argv = launch["argv"]
    assert launch["env"]["EVIL_VALUE"] == EVIL
    assert EVIL in argv  # launcher_args, binds, args ... reach the launcher as they are
    assert dag in argv
    assert argv.count(EVIL) >= 10
    module = next(c for c in calls if c["tool"] == "module")
    assert module["argv"] == ["load", EVIL]


@pytest.mark.parametrize("scheduler", ["slurm", "pbs", "loadleveler"])
@pytest.mark.parametrize("field", [*DIRECTIVE_FIELDS, "site"])
def test_newline_in_a_directive_value_is_rejected(scheduler: str, field: str) -> None:
    if field == "qos" and scheduler != "slurm":
        pytest.skip("only Slurm has a QOS")
    data = base_profile(scheduler, **{field: "ok\ntouch PWNED"})
    with pytest.raises(SiteError) as e:
        parse_site(data, "p.yaml")
    assert f"p.yaml: {field}: bad value 'ok\\ntouch PWNED': must be one line" in str(e.value)


@pytest.mark.parametrize("scheduler", ["slurm", "pbs", "loadleveler"])
def test_newline_in_raw_directive_or_job_name_from_dag_is_rejected(scheduler: str) -> None:
    data = base_profile(scheduler, directives=["--x\n#!touch PWNED"])
    with pytest.raises(SiteError, match=r"directives\[0\]: bad value .* must be one line"):
        parse_site(data, "p.yaml")
    site = parse_site(base_profile(scheduler))
    with pytest.raises(AdapterError, match=r"job name: bad value .* must be one line"):
        script_for(site, "evil\ntouch PWNED.dag")


def test_environment_value_with_newline_is_quoted_not_rejected(tmp_path: Path) -> None:
    site = parse_site(base_profile("slurm", environment={"MULTI": "a\nb; touch PWNED"}))
    text = script_for(site, "w.dag")
    out = subprocess.run(
        ["bash", "-c", text.split("PMC_CHAIN_INDEX=")[0] + 'printf %s "$MULTI"'],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == "a\nb; touch PWNED"
    assert not list(tmp_path.glob("PWNED"))


@pytest.mark.mpi
def test_hostile_task_names_and_dag_path_run_through_fake_slurm(fakes: Fakes) -> None:
    dag_name = "d$(touch PWNED1);`touch PWNED2`.dag"
    (fakes.work / dag_name).write_text(
        "TASK $(touch_PWNED3) /bin/echo one\n"
        "TASK `touch${IFS}PWNED4`;x /bin/echo two\n"
        "EDGE $(touch_PWNED3) `touch${IFS}PWNED4`;x\n"
    )
    site = fakes.profile("site.yaml", base_profile("slurm"))
    proc = fakes.pmc("submit", "--site", str(site), dag_name)
    assert proc.returncode == 0, proc.stderr
    assert not list(fakes.work.parent.rglob("PWNED*"))
    done = rescue_done(fakes.work / f"{dag_name}.rescue")
    assert done == sorted(["$(touch_PWNED3)", "`touch${IFS}PWNED4`;x"])
