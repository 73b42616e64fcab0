"""Site profile loading and validation: every error names the YAML path, the bad value
and what is allowed; the command line prints it without a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pmc.adapters.site import SiteError, load_site, parse_duration, parse_memory_mb, parse_site

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
        "s.yaml: host.cpu: unknown key 'cpu' (did you mean 'cpus'?); valid keys: cpus, gpus, memory"
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
    assert "s.yaml: walltime: bad value '1h': expected minutes, HH:MM:SS or D-HH:MM:SS" in msg
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
    assert parse_duration("90") == 5400
    assert parse_duration("01:02:03") == 3723
    assert parse_duration("1:00:00") == 3600
    assert parse_duration("1-02") == 93600
    assert parse_duration("1-00:00:10") == 86410
    assert parse_duration("1-00:10") == 87000
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
    # ... unless told where to write it: then it writes it there, executable.
    written = run_pmc("script", "--site", str(profile), "--script-path", "job.sh", "w.dag",
                      cwd=tmp_path)
    assert (written.returncode, written.stdout, written.stderr) == (0, "", "pmc: wrote job.sh\n")
    assert (tmp_path / "job.sh").read_text() == proc.stdout
    assert (tmp_path / "job.sh").stat().st_mode & 0o111
    (tmp_path / "job.sh").unlink()
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


# --- read as written (YAML 1.2), overrides, default profile --------------------------


def site_text(tmp_path: Path, body: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text("site: x\nscheduler: slurm\n" + body)
    return path


@pytest.mark.parametrize(
    ("written", "seconds", "max_wall"),
    [
        ("12:00:00", 12 * 3600, 710),  # YAML 1.1: the number 43200 → 720 hours
        ("1:00:00", 3600, 54),  # YAML 1.1: 3600 → 60 hours
        ('"12:00:00"', 12 * 3600, 710),
        ("90", 90 * 60, 81),  # a bare number is minutes
        ("010", 10 * 60, 9),  # YAML 1.1: octal 8
        ("1-00:00:00", 86400, 1430),
    ],
)
def test_walltime_is_read_as_written(
    tmp_path: Path, written: str, seconds: int, max_wall: int
) -> None:
    site = load_site(site_text(tmp_path, f"walltime: {written}\n"))
    assert site.walltime == seconds
    assert site.max_wall_time_minutes == max_wall


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        (
            "1:30",
            "s.yaml: walltime: bad value '1:30': ambiguous: Slurm reads '1:30' as 1 min 30 s "
            "(MM:SS), people often mean 1 h 30 min; write '00:01:30' for 1 min 30 s or "
            "'01:30:00' for 1 h 30 min",
        ),
        (
            "1.5",
            "s.yaml: walltime: bad value 1.5: expected minutes, HH:MM:SS or D-HH:MM:SS; "
            "whole minutes only: write 90 or '01:30:00', not 1.5",
        ),
        (
            "12:75:00",
            "s.yaml: walltime: bad value '12:75:00': minutes and seconds must be below 60",
        ),
        ("00:00:00", "s.yaml: walltime: bad value '00:00:00': must be more than zero"),
        ("1-25:00:00", "hours after the days must be below 24, got 25"),
    ],
)
def test_ambiguous_or_impossible_walltime_is_refused(
    tmp_path: Path, written: str, expected: str
) -> None:
    with pytest.raises(SiteError) as e:
        load_site(site_text(tmp_path, f"walltime: {written}\n"))
    assert expected in str(e.value)


def test_other_scalars_are_read_as_written(tmp_path: Path) -> None:
    path = site_text(
        tmp_path,
        "environment:\n  VERSION: 1.10\n  FLAG: true\n  MODE: 0755\n  WORD: on\n"
        "queue: 2024-01-01\n",
    )
    site = load_site(path)
    assert dict(site.environment) == {
        "VERSION": "1.10",
        "FLAG": "true",
        "MODE": "0755",
        "WORD": "on",
    }
    assert site.queue == "2024-01-01"  # not a date
    with pytest.raises(SiteError) as e:
        load_site(site_text(tmp_path, "pmc:\n  skip_rescue: yes\n"))
    assert str(e.value).endswith(
        "s.yaml: pmc.skip_rescue: bad value 'yes': expected boolean (write true or false; "
        "profiles are YAML 1.2, where yes/no/on/off are text)"
    )


def test_a_key_given_twice_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SiteError) as e:
        load_site(site_text(tmp_path, "walltime: 10\npmc:\n  tries: 2\n  tries: 3\n"))
    assert str(e.value).endswith("s.yaml:6: pmc.tries: given twice (first on line 5); keep one")


def test_overrides_change_the_profile_and_are_validated_like_it(tmp_path: Path) -> None:
    from pmc.adapters.site import override, parse_set

    path = site_text(tmp_path, "walltime: 10\nqueue: debug\n")
    site = load_site(
        path,
        [
            parse_set("pmc.tries=3"),
            parse_set("host.memory=16G"),
            parse_set("modules=[a, b]"),
            parse_set("environment.OMP_NUM_THREADS=04"),
            override("--walltime", "walltime", "12:00:00"),
            override("--queue", "queue", "123"),
            override("--nodes", "nodes", "4"),
        ],
    )
    assert (site.walltime, site.queue, site.nodes) == (12 * 3600, "123", 4)
    assert site.pmc == {"tries": 3} and site.host_memory == 16384
    assert site.modules == ("a", "b") and dict(site.environment) == {"OMP_NUM_THREADS": "04"}
    assert load_site(path).queue == "debug"  # the file is not changed

    def bad(*overrides: object) -> str:
        with pytest.raises(SiteError) as e:
            load_site(path, list(overrides))  # type: ignore[arg-type]
        return str(e.value)

    assert bad(parse_set("pmc.tries=0")) == "--set pmc.tries: bad value 0: must be at least 1"
    assert bad(override("--nodes", "nodes", "two")) == (
        "--nodes: bad value 'two': expected integer"
    )
    assert bad(override("--walltime", "walltime", "1:30")).startswith(
        "--walltime: bad value '1:30': ambiguous"
    )
    assert bad(parse_set("acount=p1")).startswith(
        "--set acount: unknown key 'acount' (did you mean 'account'?); valid keys: account,"
    )
    assert bad(parse_set("modules=[a, 3]")) == (
        "--set modules: modules[1]: bad value 3: expected string"
    )
    with pytest.raises(SiteError) as e:
        parse_set("walltime")
    assert str(e.value) == "--set walltime: expected KEY=VALUE, e.g. --set pmc.tries=3"
    with pytest.raises(SiteError) as e:
        parse_set("pmc..x=1")
    assert "--set pmc..x: bad key 'pmc..x'" in str(e.value)


def test_default_profile_location() -> None:
    from pmc.adapters.site import default_site_path

    assert default_site_path({"PMC_SITE": "/p/site.yaml"}) == ("/p/site.yaml", "$PMC_SITE")
    assert default_site_path({"XDG_CONFIG_HOME": "/nonexistent", "HOME": "/nonexistent"}) is None


def run_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMC_", "XDG_"))}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "config"), **extra)
    return env


def test_cli_takes_the_default_profile_and_overrides(tmp_path: Path) -> None:
    def script(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pmc", "script", *args, "w.dag"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            env=run_env(tmp_path, **env),
        )

    proc = script()
    assert proc.returncode == 2
    assert proc.stderr == (
        "pmc: error: no site profile: give --site FILE, set $PMC_SITE, or write one to "
        "$XDG_CONFIG_HOME/pmc/site.yaml (default ~/.config/pmc/site.yaml)\n"
    )
    config = tmp_path / "config" / "pmc"
    config.mkdir(parents=True)
    (config / "site.yaml").write_text("site: mine\nscheduler: slurm\nwalltime: 12:00:00\n")
    proc = script()
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --time=12:00:00\n" in proc.stdout
    assert "--max-wall-time 710 w.dag" in proc.stdout
    assert f"pmc: site profile {config / 'site.yaml'} (from the user's config directory)" in (
        proc.stderr
    )
    other = site_text(tmp_path, "walltime: 30\n", "other.yaml")
    proc = script(PMC_SITE=str(other))
    assert "#SBATCH --time=00:30:00\n" in proc.stdout and "(from $PMC_SITE)" in proc.stderr
    proc = script(
        "--walltime", "1:00:00", "--queue", "debug", "--nodes", "2", "--ranks-per-node", "4",
        "--account", "p1", "--reservation", "r1", "--job-name", "jn", "--set", "qos=high",
        "--set", "pmc.tries=2",
    )
    assert proc.returncode == 0, proc.stderr
    for line in (
        "--job-name=jn", "--account=p1", "--partition=debug", "--qos=high",
        "--reservation=r1", "--time=01:00:00", "--nodes=2", "--ntasks-per-node=4",
    ):
        assert f"#SBATCH {line}\n" in proc.stdout
    assert "--ntasks=8" in proc.stdout and "-t 2" in proc.stdout
    proc = script("--set", "pmc.tries=zero")
    assert proc.returncode == 2
    assert proc.stderr == "pmc: error: --set pmc.tries: bad value 'zero': expected integer\n"


def test_cli_submit_echoes_the_walltime(tmp_path: Path) -> None:
    import os

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\necho 77\n")
    (bin_dir / "sbatch").chmod(0o755)
    (tmp_path / "w.dag").write_text("TASK A /bin/true\n")
    path = site_text(tmp_path, "walltime: 12:00:00\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pmc", "submit", "--site", str(path), "w.dag"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=run_env(tmp_path, PATH=f"{bin_dir}:{os.environ['PATH']}"),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "77\n"
    assert (
        "pmc: walltime 12:00:00; pmc run --max-wall-time 710 (stops 00:10:00 before the limit)"
        in proc.stderr
    )
