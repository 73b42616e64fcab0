"""Unknown or out-of-range values for the command line's choice and number options are
usage errors: exit code 2 and a message naming the option, never a traceback, never a
run. The cases are derived from the parsers themselves, so a new option is covered the
day it is added. The values pegasus-mpi-cluster accepts (0 for --max-wall-time and
--host-cpus, PMC_HOST_MEMORY=0) run as they run there, and what it refuses
(--host-memory 0, --host-cpus with --set-affinity) is refused."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from faultkit import clean_env

from pmc.commands import cli

pytestmark = pytest.mark.faults

# Bad values per option type (by the type function's name; a type missing here fails the
# collection, so that no option goes untested).
BAD = {
    "positive_int": ["0", "-1", "x", "1.5", "", "1_0"],
    "nonneg_int": ["-1", "x", "1e3", "1_0", "\uff11"],
    # The reference's own whole numbers take a fraction (cut off, as sscanf does there),
    # nothing else after the digits.
    "ref_positive_int": ["0", "-1", "x", "0.9", "", "1_0", "1e3", "12abc"],
    "ref_nonneg_int": ["-1", "x", "1e3", "1_0", "\uff11", "12abc", ".5"],
    "minutes": ["-1", "nan", "inf", "x", "-inf", "", "1_0", "5m"],
    "listen_address": ["", "[::1", "h:99999", "a b", ":x", "[::1]x", "h:9-8", "bad$host"],
    "port_or_range": ["65536", "-1", "x", "99999999999", "9-8", "0-5", "1-2-3", "1-"],
    "seconds": ["0", "-1", "nan", "inf", "x", ""],
    "nonneg_seconds": ["-1", "nan", "inf", "x", ""],
    "launcher_template": ["mpiexec -n {rank}", "srun 'x", "", "{}", "a{b", "{ranks!r}"],
    "int": ["x", "1.5", ""],
    "float": ["x", "", "1,5"],
}
# How to reach each (sub)command with its required arguments filled in.
BASE = {
    "run": ["run", "w.dag"],
    "status": ["status", "w.dag"],
    "report": ["report", "events.json"],
    "script": ["script", "--site", "site.yaml", "w.dag"],
    "submit": ["submit", "--site", "site.yaml", "w.dag"],
    "jobs status": ["jobs", "status", "1"],
    "jobs cancel": ["jobs", "cancel", "1"],
}


def _subparsers(p: argparse.ArgumentParser, prefix: str = "") -> Iterator[
        tuple[str, argparse.ArgumentParser]]:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                full = f"{prefix}{name}"
                yield full, sub
                yield from _subparsers(sub, full + " ")


def _cases() -> list[tuple[str, list[str], str]]:
    out: list[tuple[str, list[str], str]] = []
    for command, parser in _subparsers(cli.build_parser()):
        if command not in BASE:
            continue
        for action in parser._actions:
            if not action.option_strings:
                continue
            opt = max(action.option_strings, key=len)
            values: list[str] = []
            if action.choices is not None:
                values = ["bogus", "TEXT", ""]
            elif action.type is not None:
                values = BAD[getattr(action.type, "__name__", "")]
            for v in values:
                out.append((f"{command} {opt}={v!r}", [*BASE[command], opt, v], opt))
    return out


CASES = _cases()


def test_every_choice_and_number_option_is_covered() -> None:
    options = {case[2] for case in CASES}
    for opt in ("--tries", "--max-failures", "--max-wall-time", "--host-cpus", "--host-memory",
                "--maxfds", "--workers", "--worker-slots", "--log-format", "--metrics-port",
                "--top", "--bin", "--max-jobs", "--scheduler"):
        assert opt in options


@pytest.mark.parametrize(("argv", "opt"), [(c[1], c[2]) for c in CASES],
                         ids=[c[0] for c in CASES])
def test_bad_value_is_a_usage_error(argv: list[str], opt: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and opt in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv", [
    ["-t", "0"], ["--max-wall-time", "nan"], ["--maxfds", "0"], ["--host-cpus", "x"],
    ["--bogus-option"], ["--host-memory", "0"], ["-m", "-1"],
    ["--host-cpus", "2", "--set-affinity"], ["--set-affinity", "--host-cpus", "1"],
])
def test_pegasus_mpi_cluster_usage(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.pegasus_main([*argv, "w.dag"])
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize(("var", "value"), [
    ("PMC_MAX_WALL_TIME", "soon"), ("PMC_MAX_WALL_TIME", "-5"), ("PMC_HOST_CPUS", "-1"),
    ("PMC_HOST_MEMORY", "-1"), ("PMC_HOST_MEMORY", "lots"),
    # Set but empty: the reference says "Invalid value for PMC_..." too.
    ("PMC_HOST_CPUS", ""), ("PMC_HOST_MEMORY", ""), ("PMC_MAX_WALL_TIME", ""),
])
def test_bad_environment_value_is_a_usage_error(var: str, value: str, tmp_path: Path) -> None:
    (tmp_path / "w.dag").write_text("TASK A /bin/true\n")
    r = subprocess.run([sys.executable, "-m", "pmc", "run", "w.dag"], cwd=tmp_path,
                       env=clean_env(**{var: value}), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2, r.stderr
    assert var in r.stderr
    assert not (tmp_path / "w.dag.rescue").exists(), "nothing ran"


def test_host_cpus_with_set_affinity_is_refused(tmp_path: Path) -> None:
    # The reference refuses the pair with these words, from the option or PMC_HOST_CPUS.
    (tmp_path / "w.dag").write_text("TASK A /bin/true\n")
    for argv, env in ((["--host-cpus", "2"], {}), ([], {"PMC_HOST_CPUS": "2"})):
        r = subprocess.run([sys.executable, "-m", "pmc", "run", *argv, "--set-affinity",
                            "w.dag"], cwd=tmp_path, env=clean_env(**env),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, r.stderr
        assert "--host-cpus is not compatible with --set-affinity" in r.stderr
        assert "Traceback" not in r.stderr
        assert not (tmp_path / "w.dag.rescue").exists(), "nothing ran"


def _options(argv: list[str], monkeypatch: pytest.MonkeyPatch,
             **env: str) -> object:
    for var in ("PMC_HOST_CPUS", "PMC_HOST_MEMORY", "PMC_MAX_WALL_TIME", "PMC_HOST_SCRIPT"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    p = cli.build_parser()
    args = p.parse_args(["run", *argv, "w.dag"])
    return cli.options_from_args(p, args)


@pytest.mark.parametrize(("argv", "env", "attr", "value"), [
    (["--max-wall-time", "0"], {}, "max_wall_time", None),
    ([], {"PMC_MAX_WALL_TIME": "0"}, "max_wall_time", None),
    ([], {"PMC_MAX_WALL_TIME": "1.5"}, "max_wall_time", 1.5),
    (["--max-wall-time", "0"], {"PMC_MAX_WALL_TIME": "3"}, "max_wall_time", None),
    (["--host-cpus", "0"], {}, "host_cpus", None),
    ([], {"PMC_HOST_CPUS": "0"}, "host_cpus", None),
    (["--host-cpus", "0", "--set-affinity"], {}, "host_cpus", None),
    (["--host-cpus", "3"], {"PMC_HOST_CPUS": "0"}, "host_cpus", 3),
    ([], {"PMC_HOST_MEMORY": "0"}, "host_memory", None),
    (["--host-memory", "7"], {"PMC_HOST_MEMORY": "0"}, "host_memory", 7),
    (["--host-cpus", " 4"], {}, "host_cpus", 4),
    # sscanf("%d") stops at the decimal point: -m 99.1 is 99 there.
    (["-m", "99.1"], {}, "max_failures", 99),
    (["-t", "2.5"], {}, "tries", 2),
    (["--host-cpus", "2.9"], {}, "host_cpus", 2),
    (["--host-memory", "1024.5"], {}, "host_memory", 1024),
    (["--maxfds", "64."], {}, "maxfds", 64),
    ([], {"PMC_HOST_CPUS": "3.7"}, "host_cpus", 3),
])
def test_values_the_reference_accepts(argv: list[str], env: dict[str, str], attr: str,
                                      value: object, monkeypatch: pytest.MonkeyPatch) -> None:
    assert getattr(_options(argv, monkeypatch, **env), attr) == value


def test_zero_wall_time_and_host_cpus_run(tmp_path: Path) -> None:
    # 0 is no limit and detection, as in the reference: the run goes ahead.
    from pmc.runtime.hostinfo import detect_cpus

    (tmp_path / "w.dag").write_text("TASK A -m 1 /bin/echo ran\n")
    for argv, env in ((["--max-wall-time", "0", "--host-cpus", "0"], {}),
                      ([], {"PMC_MAX_WALL_TIME": "0", "PMC_HOST_CPUS": "0",
                            "PMC_HOST_MEMORY": "0"})):
        r = subprocess.run([sys.executable, "-m", "pmc", "run", "--workers", "1", *argv,
                            "-s", "w.dag"], cwd=tmp_path, env=clean_env(**env),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert "ran\n[cluster-task name=A," in r.stdout
        assert f"cpus={detect_cpus()}]" in r.stdout  # the summary's cpus: detected


def test_max_jobs_zero_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "w.dag").write_text("TASK A /bin/true\n")
    (tmp_path / "site.yaml").write_text("site: t\nscheduler: slurm\n")
    r = subprocess.run([sys.executable, "-m", "pmc", "script", "--site", "site.yaml",
                        "--until-done", "--max-jobs", "0", "w.dag"], cwd=tmp_path,
                       env=clean_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "--max-jobs" in r.stderr and "Traceback" not in r.stderr


@pytest.fixture(scope="module")
def event_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("report")
    (tmp / "w.dag").write_text("TASK A /bin/true\nTASK B /bin/true\n")
    r = subprocess.run([sys.executable, "-m", "pmc", "run", "--workers", "1", "w.dag",
                        "--log-format", "json", "--log-file", "events.json"], cwd=tmp,
                       env=clean_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return tmp / "events.json"


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_report_bin_must_be_positive(value: str, event_log: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "pmc", "report", "--bin", value,
                        str(event_log)], env=clean_env(), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "--bin" in r.stderr
