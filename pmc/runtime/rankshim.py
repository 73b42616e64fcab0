"""A worker rank's keeper: the process an MPI launcher starts for a worker rank forks
before MPI is initialised; the child goes on as the rank, the parent only waits for it.

Why: MPICH's Hydra proxy (``hydra_pmi_proxy``) SIGKILLs every rank it started when it
reaps one that died by a *signal*, ``-disable-auto-cleanup`` or not; a rank that *exits*
does not set that off (it only sends SIGUSR1 to the others). So the parent turns the
rank's death into an exit: the child's exit code, or 128 + the signal's number when a
signal killed it, as a shell reports it. A worker rank killed with ``kill -9`` (or by
the OOM killer) is then, under ``-disable-auto-cleanup``, a lost worker that the master
works around, not the end of the job; under Hydra's defaults its PMI socket, closed
before it left the store, still ends the job, and the keeper makes sure Hydra sees that
before it sees the keeper's exit (``_hand_over``). The master (rank 0) has no keeper: its
loss should end the job at once (the rescue log lets the next run go on), and it does.

The child inherits the launcher's environment and file descriptors (PMI's socket, the
stdio pipes), so it is the MPI process; the parent keeps them open but never uses them,
and leaves only when the child is gone. Signals the launcher or the batch system sends
the parent (SIGTERM, SIGINT, SIGUSR1, SIGCONT, ...) are passed on to the child; they are
blocked across the fork so that none arrives before there is a child to pass it to, and
the parent takes them with ``sigwaitinfo``, which names the sender: Hydra's SIGUSR1 (a
rank ended) goes on as ``batchsignals.RANK_ENDED``, anyone else's as it came (a warning
that time is short, see ``pmc.batchsignals``). A rank without a keeper (rank 0, or a
worker whose fork failed) blocks SIGUSR1 before MPI starts, for the transport to tell
the two apart in the same way.

The child takes a process group of its own and dies with the parent (PR_SET_PDEATHSIG).
Hydra signals the process group of each process it started (SIGUSR1 at every rank's
end): a task the worker is starting is in the worker's group for a moment, and a signal
sent to the group then stays pending across its exec and kills it (seen: a task ended by
SIGUSR1 23 ms after its start, as another rank died). Only the parent is in the
launcher's group now, and passes each signal on to the rank's pid alone; a SIGKILL of
that group (Hydra ending the job) kills the parent, and with it the rank.

Cost: one fork at start, with what exists then frozen out of the collector first (else
the rank's first collections write to every object, and the fork's shared pages are
copied: 0.03 to 0.05 s of cpu per rank, measured). The parent stays as forked (its name
``pmc-keeper``), with nothing to start: its pages are the rank's until the rank writes to
them, so that the two together take what the rank and a fresh small interpreter as its
keeper took (PSS 8.2 + 24.5 MB against 4.5 + 28.5 MB, a worker rank of a drop-in run).
"""

from __future__ import annotations

import gc
import os
import signal
import time
from collections.abc import Mapping

from pmc import batchsignals
from pmc.errors import ExitCode
from pmc.process import flush_stdio, set_name

# The rank as launchers give it before MPI starts: Hydra and Slurm's PMI (PMI_RANK),
# PMIx (PMIX_RANK), Open MPI (OMPI_COMM_WORLD_RANK), srun (SLURM_PROCID).
_RANK_ENV = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")
_PR_SET_PDEATHSIG = 1
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2, signal.SIGXCPU, signal.SIGALRM, signal.SIGCONT, signal.SIGTSTP,
             signal.SIGTTIN, signal.SIGTTOU, signal.SIGWINCH)
_WAITED = (*FORWARDED, signal.SIGCHLD)  # the keeper's: what to pass on, and its child's end
HYDRA_ANSWER = 5.0  # seconds a killed rank's keeper waits for Hydra to act on it


def launcher_rank(env: Mapping[str, str]) -> int | None:
    """This process's rank as the MPI launcher set it in the environment, or None."""
    for key in _RANK_ENV:
        value = env.get(key)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def keep(env: Mapping[str, str] = os.environ) -> None:
    """In a worker rank started by an MPI launcher: fork; return in the child, which is
    the rank from now on, while the parent waits for it and exits as it did. Rank 0
    returns at once, SIGUSR1 blocked (see the module docstring); elsewhere (no rank in
    the environment) nothing is done."""
    rank = launcher_rank(env)
    if rank is None:
        return
    if rank == 0:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        return
    flush_stdio()  # or the child would write it again
    keeper = os.getpid()
    # What exists now stays as long as the rank: out of the collector's way, its pages
    # are not copied for the rank by the first collection's writes.
    gc.freeze()
    signal.pthread_sigmask(signal.SIG_BLOCK, _WAITED)
    try:
        pid = os.fork()
    except OSError:
        # No keeper, but the rank can still run (as it did without one), hearing
        # SIGUSR1 itself.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, set(_WAITED) - {signal.SIGUSR1})
        return
    if pid == 0:
        _follow(keeper)
        # Until the transport takes it: the keeper's word before MPI has started.
        signal.signal(batchsignals.RANK_ENDED, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _WAITED)
        return
    # The parent: the signals stay blocked until its handlers are in place. It leaves
    # without Python's finalisation, which would put the default actions back: Hydra's
    # SIGUSR1 at another rank's end would then kill it, a death by a signal again.
    set_name("pmc-keeper")  # not a second copy of the rank's name
    status = _keeper(pid)
    if status is not None and os.WIFSIGNALED(status):
        _hand_over(env)
    os._exit(_exit_code(status))


def _follow(keeper: int) -> None:
    """The rank (the child): a process group of its own, and death with its keeper."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    import ctypes  # mpi4py imports it anyway

    try:
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != keeper:  # it died before the call
        os._exit(128 + signal.SIGKILL)


def _keeper(pid: int) -> int | None:
    """The parent's whole life: pass signals on to ``pid`` (Hydra's SIGUSR1 as
    RANK_ENDED), wait for it, return its wait status (None: not its child, what became
    of the rank is unknown). Every signal it waits for stays blocked: each is taken, with
    its sender, by ``sigwaitinfo``; the child's end too (SIGCHLD). Until the child is
    reaped its pid is its own (a zombie keeps it), so nothing is ever sent to another
    process."""
    while True:
        try:
            reaped, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if reaped:
            return status
        info = signal.sigwaitinfo(_WAITED)
        sig = info.si_signo
        if sig == signal.SIGCHLD:
            continue  # ended, stopped or continued: the next look says
        if sig == signal.SIGUSR1 and batchsignals.from_hydra(info.si_pid):
            sig = batchsignals.RANK_ENDED
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _exit_code(status: int | None) -> int:
    """The keeper's exit code for the rank's wait ``status``: the rank's own, or 128 +
    the signal that killed it, as a shell reports it."""
    if status is None:
        return ExitCode.FAILED
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _hand_over(env: Mapping[str, str]) -> None:
    """The rank was killed, so it never left the launcher's store. Under Hydra, a rank's
    PMI socket that closes before it left the store ends the job (``-disable-auto-cleanup``:
    the other ranks are sent SIGUSR1), but only while the process Hydra started is still
    there: once Hydra has reaped that process's exit, the closed socket is let go and the
    job runs on (seen: one run in 5 to 8 on a 2-core machine). So the keeper closes its
    copy of the socket first (the rank's closed as it died) and waits for Hydra's answer:
    SIGKILL (the job ends; the keeper with it), SIGUSR1 (the others told), or any other
    signal; at most HYDRA_ANSWER seconds. Under other launchers it leaves at once."""
    if not batchsignals.from_hydra(os.getppid()):
        return
    try:
        os.close(int(env["PMI_FD"]))
    except (KeyError, ValueError, OSError):
        return
    deadline = time.monotonic() + HYDRA_ANSWER
    while (left := deadline - time.monotonic()) > 0:
        info = signal.sigtimedwait(_WAITED, left)
        if info is None or info.si_signo != signal.SIGCHLD:
            return
