"""Site profile loading and validation: every error names the YAML path, the bad value
and what is allowed; the command line prints it without a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pmc.site import SiteError, load_site, parse_duration, parse_memory_mb, parse_site

REPO = Path(__file__).resolve().parents[2]


def err(data: object) -> str:
    with pytest.raises(SiteError) as e:
        parse_site(data, "s.yaml")
    return str(e.value)


def test_examples_load() -> None:
    for path in sorted((REPO / "configs").glob("site-*.yaml")):
        site = load_site(path)
        assert site.ranks >= 2


def test_typo_key_lists_valid_keys() -> None:
    msg = err({"site": "x", "scheduler": "slurm", "acount": "p1"})
    assert "s.yaml: acount: unknown key 'acount' (did you mean 'account'?)" in msg
    assert "valid keys: account, constraint," in msg
    msg = err({"site": "x", "scheduler": "slurm", "host": {"cpu": 4}})
    assert (
        "s.yaml: host.cpu: unknown key 'cpu' (did you mean 'cpus'?); valid keys: cpus, memory"
        in msg
    )


def test_bad_enum_type_and_missing_values() -> None:
    assert "s.yaml: scheduler: bad value 'sge'; allowed: slurm, pbs, loadleveler, local" in err(
        {"site": "x", "scheduler": "sge"}
    )
    assert "s.yaml: nodes: bad value 'two': expected integer" in err(
        {"site": "x", "scheduler": "slurm", "nodes": "two"}
    )
    assert "s.yaml: nodes: bad value 0: must be at least 1" in err(
        {"site": "x", "scheduler": "slurm", "nodes": 0}
    )
    assert "s.yaml: (top level): 'scheduler' is required" in err({"site": "x"})
    msg = err({"site": "x", "scheduler": "slurm", "walltime": "1h"})
    assert "s.yaml: walltime: bad value '1h': expected minutes, MM:SS, HH:MM:SS" in msg
    msg = err({"site": "x", "scheduler": "slurm", "environment": {"1BAD": "v"}})
    assert "bad variable name '1BAD'" in msg
    msg = err({"site": "x", "scheduler": "slurm", "pmc": {"tries": 0}})
    assert "s.yaml: pmc.tries: bad value 0: must be at least 1" in msg
    msg = err({"site": "x", "scheduler": "slurm", "modules": ["a", 3]})
    assert "s.yaml: modules[1]: bad value 3: expected string" in msg


def test_cross_field_rules() -> None:
    assert "poe runs only under loadleveler" in err(
        {"site": "x", "scheduler": "slurm", "launcher": "poe"}
    )
    assert "srun runs only under slurm" in err(
        {"site": "x", "scheduler": "pbs", "launcher": "srun"}
    )
    assert "flavor: only meaningful for scheduler pbs" in err(
        {"site": "x", "scheduler": "slurm", "flavor": "torque"}
    )
    assert "must be less than the walltime" in err(
        {"site": "x", "scheduler": "slurm", "walltime": 10, "walltime_margin": 10}
    )
    assert "at least 2 ranks" in err({"site": "x", "scheduler": "slurm", "ranks_per_node": 1})


def test_defaults_and_wall_time_margin() -> None:
    site = parse_site({"site": "x", "scheduler": "pbs", "walltime": "01:00:00"})
    assert site.launcher == "mpiexec"
    assert site.margin == 360  # 10% of an hour
    assert site.max_wall_time_minutes == 54
    short = parse_site({"site": "x", "scheduler": "slurm", "walltime": 1})
    assert short.launcher == "srun"
    assert short.margin == 30  # never more than half
    long = parse_site({"site": "x", "scheduler": "slurm", "walltime": "2-00:00:00"})
    assert long.margin == 600
    assert parse_site({"site": "x", "scheduler": "loadleveler"}).launcher == "poe"


def test_durations_and_memory() -> None:
    assert parse_duration(90) == 5400
    assert parse_duration("0:30") == 30
    assert parse_duration("01:02:03") == 3723
    assert parse_duration("1-02") == 93600
    assert parse_duration("1-00:00:10") == 86410
    assert parse_memory_mb(512) == 512
    assert parse_memory_mb("16G") == 16384
    assert parse_memory_mb("2048 MB") == 2048
    assert parse_memory_mb("1T") == 1048576


def run_pmc(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pmc", *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_cli_reports_profile_errors_without_traceback(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("site: x\nscheduler: slurm\nqueue: [\n")
    proc = run_pmc("script", "--site", "bad.yaml", "w.dag", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("pmc: error: bad.yaml:")
    assert "not valid YAML" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_pmc("script", "--site", "missing.yaml", "w.dag", cwd=tmp_path)
    assert proc.returncode == 2 and "cannot read site profile" in proc.stderr
    (tmp_path / "typo.yaml").write_text("site: x\nscheduler: slurm\nwalltme: 10\n")
    proc = run_pmc("script", "--site", "typo.yaml", "w.dag", cwd=tmp_path)
    assert proc.returncode == 2 and "did you mean 'walltime'?" in proc.stderr


def test_cli_script_prints_and_submit_checks_the_dag(tmp_path: Path) -> None:
    profile = REPO / "configs" / "site-slurm-local.yaml"
    proc = run_pmc("script", "--site", str(profile), "w.dag", cwd=tmp_path)
    assert proc.returncode == 0
    assert proc.stdout.startswith("#!/bin/bash\n#SBATCH --job-name=pmc-w\n")
    assert "--max-wall-time 4 w.dag" in proc.stdout
    assert not list(tmp_path.iterdir())  # script only prints
    proc = run_pmc("submit", "--site", str(profile), "w.dag", cwd=tmp_path)
    assert proc.returncode == 2 and "w.dag: no such DAG file" in proc.stderr
    (tmp_path / "bad.dag").write_text("TASK A /bin/true\nEDGE A Z\n")
    proc = run_pmc("submit", "--site", str(profile), "bad.dag", cwd=tmp_path)
    assert proc.returncode == 2 and "bad.dag:2" in proc.stderr
    proc = run_pmc("script", "--site", str(profile), "--max-jobs", "3", "w.dag", cwd=tmp_path)
    assert proc.returncode == 2 and "--max-jobs only applies with --until-done" in proc.stderr


def test_cli_submit_failure_names_the_command(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        "#!/bin/sh\necho 'sbatch: error: invalid partition' >&2\nexit 1\n"
    )
    (bin_dir / "sbatch").chmod(0o755)
    (tmp_path / "w.dag").write_text("TASK A /bin/true\n")
    import os

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pmc",
            "submit",
            "--site",
            str(REPO / "configs/site-slurm-local.yaml"),
            "w.dag",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}"),
        timeout=60,
    )
    assert proc.returncode == 1
    assert "`sbatch --parsable" in proc.stderr
    assert "failed with exit code 1: sbatch: error: invalid partition" in proc.stderr
    assert "Traceback" not in proc.stderr
