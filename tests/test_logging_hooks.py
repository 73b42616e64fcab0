"""pmc's log through the standard logging module: a handler and a level set from Python
see and steer a real run, and pmc's own lines stay as they are."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pmctest import DIAMOND, clean_env, write_dag

PROGRAM = """
import logging, sys
from pmc.commands.cli import main
seen = []
class Keep(logging.Handler):
    def emit(self, record):
        seen.append((record.levelname, record.getMessage()))
code = None
logger = logging.getLogger("pmc")
def hook(*args, **kwargs):
    logger.addHandler(Keep())
    if sys.argv[1] == "quiet":
        logger.setLevel(logging.ERROR)
import pmc.log
setup = pmc.log.setup
def setup_then_hook(*a, **k):
    setup(*a, **k)
    hook()
pmc.log.setup = setup_then_hook
code = main(["run", "--workers", "1", "d.dag"])
print("CODE", code)
for level, msg in seen:
    print(level, msg)
"""


def run(tmp_path: Path, how: str) -> tuple[list[str], str]:
    write_dag(tmp_path / "d.dag", DIAMOND)
    r = subprocess.run([sys.executable, "-c", PROGRAM, how], cwd=tmp_path, env=clean_env(),
                       capture_output=True, text=True, timeout=120)
    return r.stdout.splitlines(), r.stderr


def test_a_python_handler_sees_every_message(tmp_path: Path) -> None:
    out, err = run(tmp_path, "all")
    recorded = [line for line in out if line.startswith(("INFO ", "ERROR ", "WARNING "))]
    assert "CODE 0" in out, err
    assert "INFO Starting workflow" in recorded
    assert recorded[-1] == "INFO Workflow succeeded"
    # pmc's own output is unchanged: the same messages, as [info] lines on stderr.
    logged = [line for line in err.splitlines() if line.startswith("[")]
    assert [f"INFO {line[len('[info] '):]}" for line in logged] == recorded


def test_a_level_set_from_python_steers_the_output(tmp_path: Path) -> None:
    out, err = run(tmp_path, "quiet")
    assert "CODE 0" in out, err
    assert out[out.index("CODE 0") + 1:] == []  # nothing reached the handler at INFO
    assert "[info]" not in err
