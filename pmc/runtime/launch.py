"""Launching and reaping a worker's tasks: the processes, their output files and pipes,
the kill of their process groups, and each try's result.

Tasks are started with ``posix_spawn`` (no Python between fork and exec) in their own
process group, stdout/stderr straight into the worker's output files (or the per-task
files), so task output never passes through Python. Only tasks that need an address-space
limit or a cpu binding take the slower path with a ``preexec_fn``. A running task's exit
is in the worker's poller (a pidfd) once the worker waits there (``Launcher.wait``; while
one task runs alone it waits by signal instead, ``pmc.runtime.sigwait``), as are its -f
pipes' read ends (``pmc.runtime.taskio``). Every task's process group is held in the
guard's table (``pmc.runtime.guard``) while it runs: the guard kills what is left should
the worker die.
"""

from __future__ import annotations

import fcntl
import os
import signal
import stat
import time
from collections.abc import Callable

from pmc import log
from pmc.core import protocol
from pmc.core.protocol import (
    FAILED_STATUS,
    TaskResult,
    TaskSpec,
    WorkerConfig,
    exit_code_of,
    signal_of,
)
from pmc.core.records import cluster_task_record
from pmc.dag.words import split_command
from pmc.runtime.accounting import Accounting, not_wanted
from pmc.runtime.declared import missing_output
from pmc.runtime.guard import Guard
from pmc.runtime.hostinfo import close_on_exec_all
from pmc.runtime.multirank import RankLauncher
from pmc.runtime.poller import Poller
from pmc.runtime.spawn import exec_path, is_executable, spawn
from pmc.runtime.taskio import (
    TAIL_BYTES,
    Pipe,
    Pipes,
    append,
    open_append,
    open_task_stdio,
    read_forward_file,
    remove_forward_files,
    tail,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing: see pmc.core.record
if TYPE_CHECKING:
    import subprocess
    from typing import Any

KILL_GRACE = 3.0  # seconds between SIGTERM and SIGKILL of a task's process group
_FORWARD_FD_BASE = 100


class Running:
    __slots__ = (
        "app", "cgroup", "err_fd", "err_offset", "err_path", "guard_slot", "nodefile",
        "out_fd", "pid", "pidfd", "pipes", "popen", "spec", "start", "t0", "waited",
    )

    def __init__(self, spec: TaskSpec) -> None:
        self.spec = spec
        self.pid = 0
        self.pidfd = -1
        self.popen: subprocess.Popen[bytes] | None = None
        self.start = 0.0
        self.t0 = 0.0
        self.app = ""
        self.out_fd = -1
        self.err_fd = -1
        self.pipes: Pipes | None = None  # its -f forwards, if it has any
        self.cgroup: Any = None  # its accounting slot (pmc.runtime.accounting), if any
        self.err_path = ""  # where its stderr goes, and how long that file was then
        self.err_offset = 0
        self.nodefile = ""  # a multi-rank task's node file
        self.guard_slot = -1  # its process group's slot in the guard's table
        self.waited: tuple[int, Any] | None = None  # its wait status and rusage, if reaped


# What a poller wait returns for each readable fd: the master's socket, a task's pidfd,
# or one of a task's forwarding pipes.
Waited = str | Running | tuple[Running, int]


class Launcher:
    """A worker's tasks as processes: starts them, reads their pipes, reaps them, kills
    them. Every try's result (and every start) waits in ``results`` (``starts``) for
    the worker to send."""

    def __init__(self, config: WorkerConfig, rank: int, hostname: str, env: dict[str, str],
                 send: Callable[[protocol.Message], None]) -> None:
        self.cfg = config
        self.rank = rank
        self.host_rank = 0
        self.hostname = hostname
        self.base_env = env
        self.send = send  # to the master: spilled pipe data, before the result
        self.poller = Poller()
        self.running: dict[int, Running] = {}  # pid -> Running
        self.running_ids: set[int] = set()  # task ids of self.running
        self.unwatched: dict[int, Running] = {}  # running, no pidfd yet (see ``wait``)
        # Tasks start with the signal mask the worker has now (its loop blocks signals it
        # waits for: pmc.runtime.sigwait).
        self.sigmask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
        self.results: list[TaskResult] = []
        # Tasks started since the last message to the master, (id, Unix time), in order:
        # they travel with results, or alone (STARTED) when there are none.
        self.starts: list[tuple[int, float]] = []
        self.dag_dir = os.path.dirname(os.path.abspath(config.dag_path))
        self.out_fd = self.err_fd = -1
        # A failed try's stderr tail is read from the shared file where it is a regular
        # one, with one slot (nothing else writes there meanwhile): not from /dev/null,
        # a pipe or a terminal.
        self.err_tails = False
        # Log levels, fixed for the run: per-task lines cost one attribute test when off.
        self.debug = log.enabled(log.DEBUG)
        self.trace = log.enabled(log.TRACE)
        if not config.per_task_stdio:
            out_path = config.out_path.format(rank=rank)
            err_path = config.err_path.format(rank=rank)
            log.debug(f"Worker {rank}: Using task stdout file: {out_path}")
            log.debug(f"Worker {rank}: Using task stderr file: {err_path}")
            self.out_fd = open_append(out_path)
            self.err_fd = open_append(err_path)
            self.err_tails = config.worker_slots == 1 and \
                stat.S_ISREG(os.fstat(self.err_fd).st_mode)
        self.err_path = os.path.abspath(config.err_path.format(rank=rank))
        # A task's -m as its cgroup's memory limit (else RLIMIT_AS, set at its spawn).
        cgroup_limits = config.strict_limits and config.limit_memory_by == "cgroup"
        self.accounting = Accounting(
            config.worker_slots, cgroup_limits,
            not_wanted(config.task_accounting, cgroup_limits, config.log_format))
        close_on_exec_all()  # before the guard and the first task start
        self.guard = Guard(KILL_GRACE, start=False)  # with the first task or cgroup
        # GPUs (pmc extension): on a host with some, a task gets its own ids (none for a
        # task asking for none) in CUDA_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES, PMC_GPUS.
        self.gpu_host = False
        self.ranks = RankLauncher(config.task_launcher, env)
        for d in self.accounting.parent:
            if d:  # removed by the guard should this worker be killed
                self.guard.announce(b"c%s\n" % d.encode())
        self.guard.flush()  # the only lines: the tasks' groups go in the guard's table

    # -- launching -------------------------------------------------------------------

    def launch(self, spec: TaskSpec) -> bool:
        """Start a try of ``spec``; False if it failed at once (its result is in
        ``results``)."""
        if self.trace:
            log.trace(f"Running task {spec.name}")
        r = Running(spec)
        try:
            argv = split_command(spec.command)
        except ValueError as e:
            return self.fail_now(r, f"cannot split command: {e}")
        if not argv:
            return self.fail_now(r, "empty command")
        r.app = argv[0]
        env = self.task_env(spec)
        if spec.hosts:
            try:
                argv, env, r.nodefile = self.ranks.prepare(spec, argv, env)
            except (OSError, ValueError) as e:
                return self.fail_now(r, f"cannot start its launcher: {e}")
        try:
            out_fd, err_fd = self.open_stdio(r)
        except OSError as e:
            close_stdio(r)
            return self.fail_now(r, f"cannot open per-task output file: {e}")
        # A task without -f pipes (most) skips their step and its lists.
        moves = self.open_pipes(r, env) if spec.pipe_forwards else []
        write_ends = [high for high, _target in moves]
        read_ends = list(r.pipes.open) if r.pipes is not None else []
        acc = self.accounting
        # A multi-rank task's ranks on this host share its cgroup: -m is per rank.
        r.cgroup = acc.enter(spec.memory * spec.hosts[0][1] if spec.hosts else spec.memory)
        if r.cgroup is None and acc.problem and acc.strict and spec.memory > 0:
            # Its memory limit cannot be set: it must not run without one.
            for fd in (*write_ends, *read_ends):
                os.close(fd)
            message = f"Task {spec.name}: {acc.problem}"
            log.error(message)
            return self.fail_now(r, message, out_fd)
        r.start = time.time()
        r.t0 = time.monotonic()
        # The guard runs before the first task does and marks each spawn: a worker killed
        # at any moment after leaves no task behind (pmc.runtime.guard).
        self.guard.spawning()
        try:
            self.spawn(r, argv, env, out_fd, err_fd, moves)
        except OSError as e:
            self.guard.spawned_none()
            for fd in (*write_ends, *read_ends):
                os.close(fd)
            # What the reference's child writes to the task's stderr when execve fails
            # (it then exits 1: the try's status is 256).
            message = (f"Unable to exec command {exec_path(argv[0])} for task {spec.name}: "
                       f"{os.strerror(e.errno) if e.errno else e}")
            append(err_fd, message + "\n")
            return self.fail_now(r, message, out_fd)
        r.guard_slot = self.guard.hold(r.pid)
        for fd in write_ends:
            os.close(fd)
        self.watch(r, read_ends)
        return True

    def task_env(self, spec: TaskSpec) -> dict[str, str]:
        """The task's environment: the worker's, with what pmc tells each task."""
        env = self.base_env.copy()
        env["PMC_TASK"] = spec.name
        env["PMC_MEMORY"] = str(spec.memory)
        env["PMC_CPUS"] = str(spec.cpus)
        env["PMC_RANK"] = str(self.rank)
        env["PMC_HOST_RANK"] = str(self.host_rank)
        if spec.env:  # an array member's index and value (pmc extension)
            env.update(spec.env)
        if spec.affinity:
            env["PMC_AFFINITY"] = ",".join(map(str, spec.affinity))
        if spec.gpus or self.gpu_host:
            env["CUDA_VISIBLE_DEVICES"] = env["ROCR_VISIBLE_DEVICES"] = env["PMC_GPUS"] = \
                ",".join(spec.gpus or ())
        return env

    def open_stdio(self, r: Running) -> tuple[int, int]:
        """The task's stdout and stderr (its own files or the worker's), and where its
        stderr is for the tail of a failed try (OSError if a file cannot be opened)."""
        cfg = self.cfg
        if cfg.per_task_stdio:
            r.out_fd, r.err_fd = open_task_stdio(os.path.join(self.dag_dir, r.spec.name))
            r.err_path = os.readlink(f"/proc/self/fd/{r.err_fd}")
            return r.out_fd, r.err_fd
        r.err_path = self.err_path
        # Where this try's stderr begins in the shared file, for its tail should it fail.
        r.err_offset = os.fstat(self.err_fd).st_size if self.err_tails else -1
        return self.out_fd, self.err_fd

    def open_pipes(self, r: Running, env: dict[str, str]) -> list[tuple[int, int]]:
        """The task's -f pipes: their read ends in ``r.pipes``, their variables in
        ``env``; returns the moves (write end, fd in the task) for the spawn. The write
        ends reach the task as fds 3, 4, ... (as in PMC: "A=3"), small enough for `echo
        >&$A` in any shell; they wait here at high, close-on-exec numbers so that the
        moves into place cannot overwrite each other."""
        moves: list[tuple[int, int]] = []
        if not r.spec.pipe_forwards:
            return moves
        pipes = r.pipes = Pipes(r.spec.name)
        for i, (var, dest) in enumerate(r.spec.pipe_forwards):
            rd, wr = os.pipe()
            os.set_blocking(rd, False)
            high = fcntl.fcntl(wr, fcntl.F_DUPFD_CLOEXEC, _FORWARD_FD_BASE)
            os.close(wr)
            moves.append((high, 3 + i))
            env[var] = str(3 + i)
            pipes.open[rd] = Pipe(var, dest)
        return moves

    def spawn(self, r: Running, argv: list[str], env: dict[str, str], out_fd: int,
              err_fd: int, moves: list[tuple[int, int]]) -> None:
        """Start the task's process inside its cgroup (OSError if it cannot start: its
        cgroup is given up)."""
        spec, cfg, acc = r.spec, self.cfg, self.accounting
        rlimit = cfg.strict_limits and spec.memory > 0 and acc.limits == "rlimit"
        bind = cfg.set_affinity and bool(spec.affinity)  # else PMC_AFFINITY only
        try:
            try:
                r.pid, r.popen = spawn(spec, None, argv, env, out_fd, err_fd, moves, bind,
                                       rlimit, self.sigmask)
            except FileNotFoundError:
                # The reference runs a bare name that is an executable file in the
                # working directory before it searches PATH; looked at only when the
                # PATH search failed, so that the usual launch costs no extra stat.
                if "/" in argv[0] or not is_executable(argv[0]):
                    raise
                r.pid, r.popen = spawn(spec, argv[0], argv, env, out_fd, err_fd, moves,
                                       bind, rlimit, self.sigmask)
            finally:
                if r.cgroup is not None:
                    acc.leave()
        except OSError:
            if r.cgroup is not None:
                acc.abandon(r.cgroup)
                r.cgroup = None
            raise

    def watch(self, r: Running, read_ends: list[int]) -> None:
        """A started task: its pipes in the poller (its exit once ``wait`` waits there),
        its start noted for the master."""
        poller = self.poller
        for fd in read_ends:
            poller.add(fd, (r, fd))
        self.unwatched[r.pid] = r
        self.running[r.pid] = r
        self.running_ids.add(r.spec.id)
        self.starts.append((r.spec.id, r.start))
        if self.debug:
            log.debug(f"Task {r.spec.name} started as pid {r.pid}")

    def fail_now(self, r: Running, message: str, out_fd: int = -1) -> bool:
        """A try that ended before its program ran (it could not be started, its output
        files not opened): status 256, as the reference's, and its record on the task's
        stdout, or this worker's, where there is one. Returns False (not started)."""
        spec = r.spec
        if self.debug:
            log.debug(f"Task {spec.name} failed: {message}")
        start = r.start or time.time()
        duration = time.monotonic() - r.t0 if r.t0 else 0.0
        if out_fd < 0:
            out_fd = self.out_fd
        if out_fd >= 0:
            append(out_fd, cluster_task_record(
                spec.name, spec.pegasus_id, start, duration, FAILED_STATUS, r.app,
                self.hostname, self.rank, spec.cpus * spec.ranks, spec.memory * spec.ranks))
        close_stdio(r)
        self.starts.append((spec.id, start))
        self.results.append(TaskResult(spec.id, spec.attempt, FAILED_STATUS, start, duration,
                                       0.0, None, message, None,
                                       stderr_path=r.err_path or None,
                                       stderr_tail=message[-TAIL_BYTES:]))
        return False

    # -- waiting and reaping ------------------------------------------------------------

    def wait(self, timeout: float | None) -> list[Waited]:
        """The poller's wait (see ``Poller.wait``), every running task's exit in it."""
        for r in self.unwatched.values():
            r.pidfd = os.pidfd_open(r.pid)
            self.poller.add(r.pidfd, r)
        self.unwatched.clear()
        return self.poller.wait(timeout)

    def exited(self, r: Running) -> bool:
        """Whether ``r`` has exited: if so, reaped (``reap`` takes it from there)."""
        pid, wstatus, usage = os.wait4(r.pid, os.WNOHANG)
        if pid == 0:
            return False
        r.waited = (wstatus, usage)
        return True

    def read_pipe(self, r: Running, fd: int) -> None:
        """Pipe ``fd`` of ``r`` is readable: take its data (close it at EOF)."""
        pipes = r.pipes
        if pipes is not None and fd in pipes.open and not pipes.read(fd):
            self.poller.remove(fd)
            pipes.close(fd)

    def reap(self, r: Running) -> int:
        """``r`` exited: wait for it, take its forwards, write its record, and queue its
        result. Returns its raw wait status."""
        if r.waited is None:
            _, wstatus, usage = os.wait4(r.pid, 0)
        else:
            wstatus, usage = r.waited
        if r.popen is not None:
            r.popen.returncode = 0  # reaped here; keep subprocess from waiting on it
        duration = time.monotonic() - r.t0
        status = wstatus  # raw, as the reference reports it
        spec = r.spec
        if r.nodefile:
            self.ranks.done(r.nodefile)
        if self.debug:
            _log_exit(spec.name, status, duration)
        self.forget(r)
        forwards: list[tuple[str, bytes]]
        if r.pipes is None and not spec.outputs and not spec.file_forwards:
            forwards, error = [], None  # nothing to forward nor check (most tasks)
        else:
            forwards, error = self.take_forwards(r, status)
        if error is not None and status == 0:
            status = FAILED_STATUS
        ranks = spec.ranks
        record = cluster_task_record(
            spec.name, spec.pegasus_id, r.start, duration, status, r.app, self.hostname,
            self.rank, spec.cpus * ranks, spec.memory * ranks,
        )
        append(r.out_fd if r.out_fd >= 0 else self.out_fd, record)
        tail_text = None
        if status != 0 and r.err_offset >= 0:
            tail_text = tail(r.err_path, r.err_offset)
        close_stdio(r)
        used = self.accounting.collect(r.cgroup, usage, status)
        cpu = usage.ru_utime + usage.ru_stime
        if used.user_cpu is not None and used.system_cpu is not None:
            cpu = used.user_cpu + used.system_cpu  # the whole tree, orphans included
        self.results.append(TaskResult(
            spec.id, spec.attempt, status, r.start, duration, cpu, used.max_rss_kb, error,
            tuple(forwards) or None, used.user_cpu, used.system_cpu, used.oom_killed,
            r.err_path if status != 0 else None, tail_text))
        return wstatus

    def forget(self, r: Running) -> None:
        """An exited task out of the running set, the poller and the guard's table."""
        del self.running[r.pid]
        self.running_ids.discard(r.spec.id)
        if self.unwatched.pop(r.pid, None) is None:
            # Taken out of the epoll before it is closed: a task being spawned meanwhile
            # may still hold a copy of every fd (a vfork child lets its parent go on at
            # exec, before it closes its close-on-exec fds), and a registration lasts as
            # long as any copy of its fd.
            self.poller.remove(r.pidfd)
            os.close(r.pidfd)
        self.guard.release(r.guard_slot)

    def take_forwards(self, r: Running, status: int) -> tuple[list[tuple[str, bytes]],
                                                                str | None]:
        """What an exited try forwards to the master (its pipes' data, its -F files), and
        why the try failed though its status is 0 (a pipe or file that could not be
        read, an output it declared missing), or None. A failed try forwards nothing."""
        spec, pipes = r.spec, r.pipes
        error = None
        if pipes is not None:
            for fd in list(pipes.open):
                self.read_pipe(r, fd)
                if fd in pipes.open:  # still open (a grandchild holds it): take what is there
                    self.poller.remove(fd)
                    pipes.close(fd)
            error = pipes.error
        forwards: list[tuple[str, bytes]] = []
        if status == 0 and error is None and spec.outputs:
            error = missing_output(self.dag_dir, spec.outputs)
            if error is not None:
                log.error(f"Task {spec.name} failed: {error}")
        if status == 0 and error is None:
            forwards, error = self.read_forwards(r)
        if spec.file_forwards:
            # Removed whatever happened to the try, as the reference does.
            remove_forward_files(spec.name, spec.file_forwards)
        if pipes is not None:
            pipes.drop()
        if error is None:
            return forwards, None
        if pipes is not None and error is pipes.error:
            # File-forward problems were logged as found.
            log.error(f"Task {spec.name} failed: {error}")
        return [], error

    def read_forwards(self, r: Running) -> tuple[list[tuple[str, bytes]], str | None]:
        """A successful try's forwards: its pipes' data held in memory, its -F files;
        spilled pipe data is sent now, once the files are read (as the reference, which
        reads them before it sends any data)."""
        spec, pipes = r.spec, r.pipes
        forwards = pipes.in_memory() if pipes is not None else []
        for src, dest in spec.file_forwards or ():
            data, problem = read_forward_file(spec.name, src)
            if problem:
                log.error(problem)
                return forwards, problem
            if data:
                forwards.append((dest, data))
        if pipes is not None and pipes.spilled():
            error = pipes.send_spilled(spec, self.send)
            if error is not None:
                log.error(error)
                return forwards, error
        return forwards, None

    def signal_all(self, sig: int) -> None:
        """Send ``sig`` to every running task's process group."""
        for r in self.running.values():
            signal_group(r.pid, sig)


def _log_exit(name: str, status: int, duration: float) -> None:
    if status & 0x7F:
        log.debug(f"Task {name} exited on signal {signal_of(status)} ({status}) in "
                  f"{duration:f} seconds")
    else:
        log.debug(f"Task {name} exited with status {exit_code_of(status)} ({status}) in "
                  f"{duration:f} seconds")


def close_stdio(r: Running) -> None:
    for fd in (r.out_fd, r.err_fd):
        if fd >= 0:
            os.close(fd)
    r.out_fd = r.err_fd = -1


def signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False
