"""``pmc run --site PROFILE`` (and ``$PMC_SITE``, and ``~/.config/pmc/site.yaml``): the
profile's pmc:, logging: and metrics: sections apply to the run, the command line and
environment aliases win, a bad profile is refused with its path before anything runs,
and the profile's ``site:`` names the run. ``pegasus-mpi-cluster`` reads a profile only
when given ``--site``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pmctest import clean_env, pmc, pmc_mpi, write_dag

# Fails its first two tries, succeeds on the third: the file "count" holds the tries.
FLAKY = """\
TASK flaky /bin/sh -c "n=$(cat count 2>/dev/null || echo 0); n=$((n + 1)); echo $n >count; \
[ $n -ge 3 ]"
"""


def profile(path: Path, body: str) -> Path:
    path.write_text("site: lab-cluster\nscheduler: slurm\n" + body)
    return path


def tries(cwd: Path) -> int:
    return int((cwd / "count").read_text())


@pytest.fixture
def flaky(tmp_path: Path) -> Path:
    return write_dag(tmp_path / "flaky.dag", FLAKY)


def test_the_profiles_tries_let_a_task_that_fails_twice_succeed(flaky: Path) -> None:
    cwd = flaky.parent
    site = profile(cwd / "site.yaml", "pmc:\n  tries: 3\n")
    r = pmc(["run", "--workers", "1", "--site", str(site), flaky.name], cwd)
    assert r.returncode == 0, r.stderr
    assert tries(cwd) == 3
    assert f"Site profile: {site}" in r.stderr
    assert "Workflow succeeded" in r.stderr


@pytest.mark.mpi
def test_under_mpi_the_profile_reaches_every_rank(flaky: Path) -> None:
    """The master reads the profile; its settings reach the workers (per_task_stdio),
    and a bad profile ends the job before any task, said once (pmc.commands.mpirank)."""
    cwd = flaky.parent
    site = profile(cwd / "site.yaml", "pmc:\n  tries: 3\n  per_task_stdio: true\n")
    r = pmc_mpi(3, ["run", "--site", str(site), flaky.name], cwd)
    assert r.returncode == 0, r.stderr
    assert tries(cwd) == 3
    assert "Master starting with 2 workers" in r.stderr
    # A worker's option (per_task_stdio reaches the workers): one file per try.
    assert sorted(p.name for p in cwd.glob("flaky.out.*")) == [
        "flaky.out.000", "flaky.out.001", "flaky.out.002"]
    bad = profile(cwd / "bad.yaml", "pmc:\n  tries: 0\n")
    r = pmc_mpi(3, ["run", "--site", str(bad), flaky.name], cwd)
    assert r.returncode == 2 and r.stderr.count("pmc.tries: bad value 0") == 1, r.stderr
    assert tries(cwd) == 3, "no task ran under the bad profile"


def test_without_the_profile_the_task_fails(flaky: Path) -> None:
    cwd = flaky.parent
    r = pmc(["run", "--workers", "1", flaky.name], cwd)
    assert r.returncode == 1, r.stderr
    assert tries(cwd) == 1
    assert "Site profile" not in r.stderr


@pytest.mark.parametrize("how", ["PMC_SITE", "config directory"])
def test_the_default_profile_applies_to_pmc_run(flaky: Path, tmp_path: Path, how: str) -> None:
    cwd = flaky.parent
    if how == "PMC_SITE":
        site = profile(cwd / "mine.yaml", "pmc:\n  tries: 3\n")
        env = clean_env(PMC_SITE=str(site))
    else:
        (tmp_path / "config" / "pmc").mkdir(parents=True)
        site = profile(tmp_path / "config" / "pmc" / "site.yaml", "pmc:\n  tries: 3\n")
        env = clean_env(XDG_CONFIG_HOME=str(tmp_path / "config"))
    r = pmc(["run", "--workers", "1", flaky.name], cwd, env=env)
    assert r.returncode == 0, r.stderr
    assert tries(cwd) == 3
    assert f"Site profile: {site}" in r.stderr


def test_no_site_reads_no_default_profile(flaky: Path) -> None:
    cwd = flaky.parent
    site = profile(cwd / "mine.yaml", "pmc:\n  tries: 3\n")
    r = pmc(["run", "--workers", "1", "--no-site", flaky.name], cwd,
            env=clean_env(PMC_SITE=str(site)))
    assert r.returncode == 1, r.stderr
    assert tries(cwd) == 1


def test_the_command_line_wins_over_the_profile(flaky: Path) -> None:
    cwd = flaky.parent
    site = profile(cwd / "site.yaml", "pmc:\n  tries: 3\n")
    r = pmc(["run", "--workers", "1", "--site", str(site), "-t", "1", flaky.name], cwd)
    assert r.returncode == 1, r.stderr
    assert tries(cwd) == 1


def test_an_environment_alias_wins_over_the_profile(diamond: Path) -> None:
    cwd = diamond.parent
    (cwd / "from-env.sh").write_text("#!/bin/sh\necho env >>host-script.out\n")
    (cwd / "from-profile.sh").write_text("#!/bin/sh\necho profile >>host-script.out\n")
    for script in ("from-env.sh", "from-profile.sh"):
        (cwd / script).chmod(0o755)
    site = profile(cwd / "site.yaml", f"pmc:\n  host_script: {cwd / 'from-profile.sh'}\n")
    r = pmc(["run", "--workers", "1", "--site", str(site), diamond.name], cwd,
            env=clean_env(PMC_HOST_SCRIPT=str(cwd / "from-env.sh")))
    assert r.returncode == 0, r.stderr
    assert (cwd / "host-script.out").read_text() == "env\n"


def test_logging_and_metrics_sections_apply_and_the_site_names_the_run(diamond: Path) -> None:
    cwd = diamond.parent
    site = profile(cwd / "site.yaml",
                   "logging:\n  format: json\n  file: run.jsonl\n"
                   "metrics:\n  textfile: run.prom\n")
    r = pmc(["run", "--workers", "2", "--site", str(site), diamond.name], cwd)
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in (cwd / "run.jsonl").read_text().splitlines()]
    assert any(e.get("event") == "Workflow succeeded" for e in events), events[-3:]
    assert all(e.get("site") == "lab-cluster" for e in events if "site" in e)
    prom = (cwd / "run.prom").read_text()
    assert 'site="lab-cluster"' in prom
    # PMC_SITE_NAME (exported by pmc's batch scripts) names the run instead.
    r = pmc(["run", "-s", "--workers", "2", "--site", str(site), diamond.name], cwd,
            env=clean_env(PMC_SITE_NAME="from-script"))
    assert r.returncode == 0, r.stderr
    assert 'site="from-script"' in (cwd / "run.prom").read_text()


@pytest.mark.parametrize(("body", "words"), [
    ("pmc:\n  tries: 0\n", "site.yaml: pmc.tries: bad value 0: must be at least 1"),
    ("pmc:\n  retries: 3\n", "site.yaml: pmc.retries: unknown key"),
    ("logging:\n  format: xml\n", "site.yaml: logging.format: bad value 'xml'"),
    ("pmc:\n  tries: 3\n  tries: 4\n", "site.yaml:5: pmc.tries: given twice (first on line 4)"),
], ids=["value", "key", "choice", "duplicate"])
def test_a_bad_profile_is_refused_with_its_path_before_anything_runs(
        diamond: Path, body: str, words: str) -> None:
    cwd = diamond.parent
    site = profile(cwd / "site.yaml", body + "metrics:\n  textfile: run.prom\n")
    before = sorted(p.name for p in cwd.iterdir())
    r = pmc(["run", "--workers", "1", "--site", str(site), diamond.name], cwd)
    assert r.returncode == 2, r.stderr
    assert words in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "usage:" not in r.stderr
    assert sorted(p.name for p in cwd.iterdir()) == before  # no rescue log, no outputs


def test_a_bad_default_profile_says_where_it_came_from(diamond: Path) -> None:
    cwd = diamond.parent
    site = profile(cwd / "mine.yaml", "pmc:\n  tries: 0\n")
    r = pmc(["run", "--workers", "1", diamond.name], cwd, env=clean_env(PMC_SITE=str(site)))
    assert r.returncode == 2, r.stderr
    assert f"{site}: pmc.tries: bad value 0" in r.stderr
    assert "(the site profile from $PMC_SITE; --no-site reads none)" in r.stderr
    missing = pmc(["run", diamond.name], cwd, env=clean_env(PMC_SITE=str(cwd / "gone.yaml")))
    assert missing.returncode == 2
    assert f"{cwd / 'gone.yaml'}: cannot read site profile" in missing.stderr


def test_site_and_no_site_exclude_each_other(diamond: Path) -> None:
    site = profile(diamond.parent / "site.yaml", "")
    r = pmc(["run", "--site", str(site), "--no-site", diamond.name], diamond.parent)
    assert r.returncode == 2
    assert "--site and --no-site exclude each other" in r.stderr


def test_pegasus_mpi_cluster_reads_a_profile_only_when_given_one(flaky: Path) -> None:
    cwd = flaky.parent
    site = profile(cwd / "site.yaml", "pmc:\n  tries: 3\n")
    # Not from the environment: a drop-in run stays the reference's.
    dropin = pegasus(["--workers", "1", flaky.name], cwd, env=clean_env(PMC_SITE=str(site)))
    assert dropin.returncode == 1, dropin.stderr
    assert tries(cwd) == 1
    (cwd / "count").unlink()
    (cwd / "flaky.dag.rescue").unlink()
    given = pegasus(["--workers", "1", "--site", str(site), flaky.name], cwd)
    assert given.returncode == 0, given.stderr
    assert tries(cwd) == 3


def pegasus(args: list[str], cwd: Path,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``pegasus-mpi-cluster ARGS`` with this interpreter, whatever PATH holds."""
    program = "from pmc.commands.cli import pegasus_main; import sys; sys.exit(pegasus_main())"
    return subprocess.run([sys.executable, "-c", program, *args], cwd=cwd,
                          env=env or clean_env(), capture_output=True, text=True, timeout=120)
