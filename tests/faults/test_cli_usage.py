"""Unknown or out-of-range values for the command line's choice and number options are
usage errors: exit code 2 and a message naming the option, never a traceback, never a
run. The cases are derived from the parsers themselves, so a new option is covered the
day it is added."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from faultkit import clean_env

from pmc import cli

pytestmark = pytest.mark.faults

# Bad values per option type (by the type function's name).
BAD = {
    "_positive_int": ["0", "-1", "x", "1.5", ""],
    "_nonneg_int": ["-1", "x", "1e3"],
    "_minutes": ["0", "-1", "nan", "inf", "x", "-inf"],
    "_port": ["65536", "-1", "x", "99999999999"],
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
                values = BAD.get(getattr(action.type, "__name__", ""), ["x"])
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
    ["--bogus-option"],
])
def test_pegasus_mpi_cluster_usage(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.pegasus_main([*argv, "w.dag"])
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize(("var", "value"), [
    ("PMC_MAX_WALL_TIME", "soon"), ("PMC_MAX_WALL_TIME", "-5"), ("PMC_HOST_CPUS", "0"),
    ("PMC_HOST_MEMORY", "-1"), ("PMC_HOST_MEMORY", "lots"),
])
def test_bad_environment_value_is_a_usage_error(var: str, value: str, tmp_path: Path) -> None:
    (tmp_path / "w.dag").write_text("TASK A /bin/true\n")
    r = subprocess.run([sys.executable, "-m", "pmc", "run", "w.dag"], cwd=tmp_path,
                       env=clean_env(**{var: value}), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2, r.stderr
    assert var in r.stderr
    assert not (tmp_path / "w.dag.rescue").exists(), "nothing ran"


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
