"""The worker rank's keeper (pmc.runtime.rankshim): where a launcher says the process is
a worker rank, the rank runs as its child; the launcher sees the rank's death by a
signal as an exit (128 + the signal), and the signals it sends reach the rank."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from faultkit import alive, wait_for
from pmctest import clean_env

pytestmark = pytest.mark.faults

# After keep(): say who we are, then do what argv[1] says.
CHILD = """
import os, signal, sys, time
from pmc import batchsignals
from pmc.runtime import rankshim
rankshim.keep()
what = sys.argv[1]
if what in ("term", "usr1", "ended"):
    def on_term(signum, frame):
        open("term.txt", "w").write(str(signum))
        os._exit(7)
    caught = batchsignals.RANK_ENDED if what == "ended" else getattr(signal, "SIG" + what.upper())
    signal.signal(caught, on_term)
open("pids.txt", "w").write(f"{os.getpid()} {os.getppid()}")
if what == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if what == "exit":
    sys.exit(5)
time.sleep(60)
"""


def run(tmp_path: Path, what: str, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", CHILD, what], cwd=tmp_path,
                            env=clean_env(**env), stderr=subprocess.PIPE)


def pids(tmp_path: Path) -> tuple[int, int]:
    wait_for(lambda: (tmp_path / "pids.txt").exists()
             and len((tmp_path / "pids.txt").read_text().split()) == 2, 30, "the rank")
    pid, ppid = (tmp_path / "pids.txt").read_text().split()
    return int(pid), int(ppid)


def test_killed_rank_is_an_exit_to_the_launcher(tmp_path: Path) -> None:
    proc = run(tmp_path, "kill", PMI_RANK="1")
    assert proc.wait(30) == 128 + signal.SIGKILL  # an exit status, not -9
    pid, ppid = pids(tmp_path)
    assert ppid == proc.pid and pid != proc.pid, "the rank is the launched process's child"


def test_exit_code_passed_on(tmp_path: Path) -> None:
    proc = run(tmp_path, "exit", SLURM_PROCID="3")
    assert proc.wait(30) == 5


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1], ids=["TERM", "USR1"])
def test_signals_reach_the_rank(tmp_path: Path, sig: signal.Signals) -> None:
    """SIGTERM to the process the launcher started (as mpiexec and srun send it), and
    Hydra's SIGUSR1, are the rank's; the keeper leaves with the rank's exit code."""
    proc = run(tmp_path, sig.name[3:].lower(), PMI_RANK="2")
    pid, _ = pids(tmp_path)  # written after its handler was set
    proc.send_signal(sig)
    assert proc.wait(30) == 7
    assert (tmp_path / "term.txt").read_text() == str(int(sig))
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_hydras_sigusr1_reaches_the_rank_as_a_rank_end(tmp_path: Path) -> None:
    """The keeper tells Hydra's SIGUSR1 (a rank ended) by its sender, a process named
    hydra_pmi_proxy, and passes it on as RANK_ENDED; anyone else's SIGUSR1 goes on as it
    came (above): a warning that time is short."""
    from pmc import batchsignals

    proc = run(tmp_path, "ended", PMI_RANK="2")
    _, keeper = pids(tmp_path)
    hydra = ("import os, signal, sys\nfrom pmc.process import set_name\n"
             "set_name('hydra_pmi_proxy')\nos.kill(int(sys.argv[1]), signal.SIGUSR1)\n")
    subprocess.run([sys.executable, "-c", hydra, str(keeper)], env=clean_env(), check=True,
                   timeout=30)
    assert proc.wait(30) == 7
    assert (tmp_path / "term.txt").read_text() == str(int(batchsignals.RANK_ENDED))


# A launcher named as Hydra's proxy, with a PMI socket: it starts CHILD as rank 1 (killed
# at once), reads its end of the socket to EOF, then answers as argv[2] says.
HYDRA = """
import os, signal, socket, subprocess, sys
from pmc.process import set_name
set_name("hydra_pmi_proxy")
ours, theirs = socket.socketpair()
env = dict(os.environ, PMI_RANK="1", PMI_FD=str(theirs.fileno()))
proc = subprocess.Popen([sys.executable, "-c", sys.argv[1], "kill"], env=env,
                        pass_fds=[theirs.fileno()])
theirs.close()
assert ours.recv(1) == b""
if os.waitpid(proc.pid, os.WNOHANG)[0]:
    print("gone -")
else:
    os.kill(proc.pid, getattr(signal, sys.argv[2]))
    print("there", proc.wait())
"""


@pytest.mark.parametrize("answer", ["SIGKILL", "SIGUSR1"])
def test_killed_rank_closes_pmi_before_its_keeper_exits(tmp_path: Path, answer: str) -> None:
    """Hydra ends the job when a rank's PMI socket closes unannounced, but only while the
    process it started is there to end: the keeper of a killed rank closes the socket
    first and stays until Hydra answers, with SIGKILL (its defaults: the job ends) or
    SIGUSR1 (-disable-auto-cleanup: the others told, the keeper leaves as the rank did)."""
    out = subprocess.run([sys.executable, "-c", HYDRA, CHILD, answer], cwd=tmp_path,
                         env=clean_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    there, code = out.stdout.split()
    assert there == "there", "the keeper had exited before its socket closed"
    assert int(code) == (-signal.SIGKILL if answer == "SIGKILL" else 128 + signal.SIGKILL)


def test_rank_has_its_own_group_and_dies_with_its_keeper(tmp_path: Path) -> None:
    """Signals to the launched process's group (as Hydra sends them) do not reach the
    rank's group, where a task being started could get them; a SIGKILL of the keeper
    (as Hydra ends a job) kills the rank too."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, "sleep"], cwd=tmp_path,
                            env=clean_env(PMI_RANK="1"), stderr=subprocess.PIPE,
                            process_group=0)
    pid, ppid = pids(tmp_path)
    assert ppid == proc.pid
    assert os.getpgid(pid) == pid != os.getpgid(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL
    wait_for(lambda: not alive(pid), 10, "the rank to die with its keeper")


@pytest.mark.parametrize("env", [{"PMI_RANK": "0"}, {}], ids=["rank0", "no-launcher"])
def test_no_keeper_for_the_master_or_outside_a_launcher(tmp_path: Path,
                                                        env: dict[str, str]) -> None:
    """Rank 0's loss must end the job at once (the next run continues from the rescue
    log): it runs as the launched process itself."""
    proc = run(tmp_path, "exit", **env)
    assert proc.wait(30) == 5
    pid, _ = pids(tmp_path)
    assert pid == proc.pid
