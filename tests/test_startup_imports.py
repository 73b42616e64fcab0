"""What a run imports: every MPI rank runs the command line, so ``pmc run`` and
``pegasus-mpi-cluster`` leave out what the command in hand does not use (the batch
wing's site profiles and schema validation, structlog in text mode, the master's side on
a worker rank, the DAG reader on a worker; under MPI a worker rank reads no command line
at all), while ``pmc --help`` and JSON logs work as before, and a command line that ends
the master before its run (a bad option, ``--version``) ends every rank, said once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pmctest import DIAMOND, clean_env, mpiexec, pmc, pmc_mpi, rescue_done, write_dag

# Runs the command line as ``python -m pmc`` does, then says which of WATCH it imported.
_PROBE = """
import atexit, os, sys
WATCH = @WATCH@
def said():
    rank = os.environ.get("PMI_RANK", "-")
    got = sorted(m for m in WATCH if m in sys.modules)
    sys.stdout.flush()
    # One write per line: the ranks' outputs meet in mpiexec's, and print() under
    # PYTHONUNBUFFERED writes the text and its newline apart.
    os.write(1, f"rank {rank} imported {','.join(got) or 'none'}\\n".encode())
atexit.register(said)
from pmc.commands.cli import main, pegasus_main
entry = pegasus_main if sys.argv[1] == "pegasus" else main
sys.exit(entry(sys.argv[2:]))
"""


def watching(modules: tuple[str, ...]) -> str:
    return _PROBE.replace("@WATCH@", repr(modules))


PROBE = watching(("pmc.adapters", "jsonschema", "structlog", "pmc.runtime.master",
                  "pmc.dag.reader", "pmc.dag.model"))


def probe(args: list[str], cwd: Path, mpi: int = 0,
          program: str = PROBE) -> subprocess.CompletedProcess[str]:
    launch = [mpiexec(), "-n", str(mpi)] if mpi else []
    return subprocess.run([*launch, sys.executable, "-c", program, *args], cwd=cwd,
                          env=clean_env(), capture_output=True, text=True, timeout=120)


def test_pmc_run_in_text_mode_imports_neither_batch_wing_nor_structlog(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "d.dag", DIAMOND)
    r = probe(["pmc", "run", "--workers", "2", dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "[info] Workflow succeeded" in r.stderr
    assert r.stdout.splitlines()[-1] == \
        "rank - imported pmc.dag.model,pmc.dag.reader,pmc.runtime.master"
    assert len(list(tmp_path.glob("d.dag.rescue"))) == 1


@pytest.mark.mpi
def test_worker_ranks_import_no_master_side(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "d.dag", DIAMOND)
    r = probe(["pegasus", "-s", dag.name], tmp_path, mpi=3)
    assert r.returncode == 0, r.stderr
    said = sorted(line for line in r.stdout.splitlines() if line.startswith("rank "))
    # Nor the DAG reader or model: a worker splits commands (pmc.dag.words), it reads no
    # DAG.
    assert said == ["rank 0 imported pmc.dag.model,pmc.dag.reader,pmc.runtime.master",
                    "rank 1 imported none", "rank 2 imported none"]


# Standard modules each of which costs a rank 2-10 ms of cpu at start, and none of which a
# text-mode run of a small DAG needs: the worker ranks import none of them, the master only
# json (its status file). Counted beyond what the interpreter alone has imported by then:
# an environment's .pth files (an editable install's finder, a certificate hook) may
# import some of them before any pmc code runs.
STDLIB_WATCH = ("dataclasses", "inspect", "secrets", "hashlib", "subprocess", "json",
                "datetime")


def imported_by_rank(modules: tuple[str, ...], tmp_path: Path,
                     ) -> tuple[dict[str, set[str]], set[str]]:
    """Which of ``modules`` each rank of a 3-rank drop-in run of the diamond imported
    beyond those the bare interpreter already has (also returned)."""
    bare = subprocess.run(
        [sys.executable, "-c",
         f"import sys; print(*(m for m in {modules!r} if m in sys.modules))"],
        env=clean_env(), capture_output=True, text=True, timeout=60, check=True)
    before = set(bare.stdout.split())
    dag = write_dag(tmp_path / "d.dag", DIAMOND)
    r = probe(["pegasus", "-s", dag.name], tmp_path, mpi=3, program=watching(modules))
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("[info] Workflow succeeded") == 1, r.stderr
    added = {}
    for line in r.stdout.splitlines():
        if line.startswith("rank "):
            _, rank, _, names = line.split()
            added[rank] = set(names.split(",")) - before - {"none"}
    return added, before


@pytest.mark.mpi
def test_ranks_import_no_more_of_the_standard_library_than_they_use(tmp_path: Path) -> None:
    added, before = imported_by_rank(STDLIB_WATCH, tmp_path)
    assert added == {"0": {"json"} - before, "1": set(), "2": set()}, (added, before)


# What a worker rank needs on rare paths only, or never: the logging module (no code but
# pmc's runs in it, so nothing can hook its log: pmc.log.standalone), traceback (a
# failure's report), threading (rank 0's SIGUSR1 watcher), typing (only the type checker
# reads it: pmc.core.record), the DAG's model, the host script's runner (only with
# --host-script). Each costs every rank's start up to millions of instructions.
WORKER_UNUSED = ("logging", "traceback", "threading", "typing", "pmc.dag.model",
                 "pmc.runtime.hostscript")


@pytest.mark.mpi
def test_worker_ranks_import_what_they_use_only(tmp_path: Path) -> None:
    added, before = imported_by_rank(WORKER_UNUSED, tmp_path)
    # The master binds pmc.log to the "pmc" logger, where Python code may hook it.
    master = set(WORKER_UNUSED) - {"pmc.runtime.hostscript"} - before
    assert added == {"0": master, "1": set(), "2": set()}, (added, before)


def test_json_logs_still_written(tmp_path: Path) -> None:
    dag = write_dag(tmp_path / "d.dag", DIAMOND)
    r = probe(["pmc", "run", "--workers", "2", "--log-format", "json", dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stderr.splitlines() if line.startswith("{")]
    assert {e["event"] for e in events} >= {"workflow.started", "task.finished",
                                            "Workflow succeeded"}
    assert "structlog" in r.stdout.splitlines()[-1]


def test_help_still_lists_the_batch_commands(tmp_path: Path) -> None:
    r = pmc(["--help"], tmp_path)
    assert r.returncode == 0, r.stderr
    for command in ("run", "status", "report", "script", "submit", "jobs"):
        assert f"    {command}" in r.stdout
    r = pmc(["script", "--help"], tmp_path)
    assert r.returncode == 0, r.stderr


# What reading the command line takes: on the master only, under MPI.
READER = ("pmc.options", "pmc.commands.siteprofile", "pmc.commands.run")
READER_PROBE = watching(READER)


@pytest.mark.mpi
@pytest.mark.parametrize("entry", [["pegasus"], ["pmc", "run"]])
def test_worker_ranks_read_no_command_line(tmp_path: Path, entry: list[str]) -> None:
    dag = write_dag(tmp_path / "d.dag", DIAMOND)
    r = probe([*entry, "-s", dag.name], tmp_path, mpi=3, program=READER_PROBE)
    assert r.returncode == 0, r.stderr
    said = sorted(line for line in r.stdout.splitlines() if line.startswith("rank "))
    assert said == [f"rank 0 imported {','.join(sorted(READER))}",
                    "rank 1 imported none", "rank 2 imported none"]
    assert r.stderr.count("[info] Workflow succeeded") == 1
    assert sorted(rescue_done(tmp_path / "d.dag.rescue")) == ["A", "B", "C", "D"]


@pytest.mark.mpi
@pytest.mark.parametrize("always_mpi", ["", "1"], ids=["no-mpi", "mpi"])
def test_a_bad_command_line_under_mpi_ends_every_rank_said_once(tmp_path: Path,
                                                                always_mpi: str) -> None:
    """Told through the launcher's store, or through MPI (pmc.transport.onehost)."""
    dag = write_dag(tmp_path / "d.dag", DIAMOND)
    env = clean_env(PMC_ALWAYS_MPI=always_mpi)
    r = pmc_mpi(3, ["run", "--no-such-option", dag.name], tmp_path, timeout=120, env=env)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("error: unrecognized arguments: --no-such-option") == 1, r.stderr
    assert not (tmp_path / "d.dag.rescue").exists()
    r = pmc_mpi(3, ["run", "--tries", "0", dag.name], tmp_path, timeout=120, env=env)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("--tries") == 1, r.stderr


@pytest.mark.mpi
def test_version_under_mpi_said_once(tmp_path: Path) -> None:
    r = subprocess.run([mpiexec(), "-n", "3", sys.executable, "-c", PROBE, "pegasus",
                        "--version"], cwd=tmp_path, env=clean_env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("pegasus-mpi-cluster (pmc)") == 1, r.stdout


@pytest.mark.mpi
def test_local_asked_for_under_mpi_is_read_by_every_rank(tmp_path: Path) -> None:
    """``--local`` under a launcher: each rank an embedded run of its own, as before
    (here each with its own DAG, named by its rank)."""
    for rank in range(2):
        write_dag(tmp_path / f"d{rank}.dag", "TASK a /bin/true\n")
    program = PROBE.replace("entry(sys.argv[2:])",
                            "entry([*sys.argv[2:], f\"d{os.environ['PMI_RANK']}.dag\"])")
    r = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-c", program, "pmc", "run",
                        "--local", "--workers", "1"], cwd=tmp_path, env=clean_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("[info] Workflow succeeded") == 2, r.stderr
    for rank in range(2):
        assert rescue_done(tmp_path / f"d{rank}.dag.rescue") == ["a"]

