"""A worker rank: launches the tasks the master sends and reports their results.

One event loop over an epoll: the master's socket (embedded mode), a pidfd per running
task (readable when it exits) and the read ends of forwarding pipes. Under MPI, where the
transport cannot be waited on, the epoll wait doubles as the polling back-off.

Tasks are started with ``posix_spawn`` (no Python between fork and exec) in their own
process group, stdout/stderr straight into this worker's output files (or the per-task
files), so task output never passes through Python. Only tasks that need an address-space
limit or a cpu binding take the slower path with a ``preexec_fn``.
"""

from __future__ import annotations

import fcntl
import os
import resource
import select
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from pmc import log
from pmc.accounting import Accounting, self_maxrss_kb
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
from pmc.dag import split_command
from pmc.transport import Transport, TransportError, look_interval

FILE_FORWARD_LIMIT = 1 << 20  # the reference's limit for -F files
# Pipe forwarding has no limit (as the manual promises). A task's pipe data waits in
# memory up to this much, all pipes together; beyond it each growing pipe goes on in an
# unlinked temporary file, and reaches the master in FORWARD_CHUNK pieces.
PIPE_MEMORY = 8 << 20
FORWARD_CHUNK = 4 << 20
KILL_GRACE = 3.0  # seconds between SIGTERM and SIGKILL of a task's process group
# A failed try's stderr tail sent to the master: at most this many lines and bytes.
TAIL_LINES = 10
TAIL_BYTES = 2048
# While every running task has its successor queued, results wait up to this long to
# travel together: fewer messages for both ends, and the slots are not waiting. Embedded
# mode only (see Worker.__init__).
RESULT_HOLD = 0.002
SATED_LOOK = 0.01  # polling transports: look this often while no slot needs a task
_READ = 1 << 16
_FORWARD_FD_BASE = 100
# Reset to their defaults in every task: the worker ignores SIGTTOU (see run) and
# catches SIGTERM and SIGINT; Python ignores SIGPIPE.
_TASK_SIGDEF = (signal.SIGPIPE, signal.SIGTERM, signal.SIGINT, signal.SIGTTOU)

# The variables through which an MPI launcher (Hydra, Open MPI/PRRTE, PMIx, Slurm's PMI,
# Cray's ALPS) tells a process which rank of which launch it is. A task inherits the
# worker's environment, and a pmc (or any MPI program) started by a task of an MPI-mode
# run must not take the outer launch for its own: these are removed from tasks' and host
# scripts' environments. Users' MPI settings stay (OMPI_MCA_* tuning, HYDRA_*, I_MPI_*,
# MPIR_CVAR_*), and so do the batch system's job variables (SLURM_JOB_*, SLURM_STEP_*, ...:
# the task runs in that job and step); of Slurm's per-rank variables only SLURM_PROCID,
# with which pmc recognises an srun launch, goes.
_LAUNCH_PREFIXES = ("PMI_", "PMI2_", "PMIX_", "PRTE_", "HYDI_", "OMPI_COMM_WORLD_",
                    "OMPI_MCA_ess", "OMPI_MCA_orte_", "OMPI_MCA_prte_", "OMPI_MCA_pmix",
                    "OMPI_APP_CTX_")
_LAUNCH_NAMES = frozenset((
    "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "ALPS_APP_PE", "SLURM_PROCID",
    "OMPI_UNIVERSE_SIZE", "OMPI_FIRST_RANKS", "OMPI_NUM_APP_CTX", "OMPI_FILE_LOCATION",
    "OMPI_ARGV", "OMPI_COMMAND", "OMPI_MCA_initial_wdir", "OMPI_MCA_mpi_yield_when_idle",
    "OMPI_MCA_shmem_RUNTIME_QUERY_hint",
    "PMC_AFFINITY",  # set per task, only for tasks bound with --set-affinity
))


def task_environment(env: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """The environment tasks start from: the worker's without the outer launch's
    variables (computed once per worker)."""
    return {k: v for k, v in env.items()
            if k not in _LAUNCH_NAMES and not k.startswith(_LAUNCH_PREFIXES)}


def detect_cpus() -> int:
    return os.cpu_count() or 1


def detect_memory_mb() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)


def cpu_sockets() -> dict[int, int]:
    """cpu id -> physical package id, from sysfs (empty if unknown)."""
    out: dict[int, int] = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        path = f"/sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id"
        try:
            with open(path) as f:
                out[cpu] = int(f.read().strip())
        except (OSError, ValueError):
            out[cpu] = 0
    return out


class _Pipe:
    """One -f forward of a running task: what it read so far, in memory or spilled."""

    __slots__ = ("data", "dest", "spill", "var")

    def __init__(self, var: str, dest: str) -> None:
        self.var = var
        self.dest = dest
        self.data = bytearray()
        self.spill: Any = None  # an unlinked temporary file, once spilled


class Running:
    __slots__ = (
        "app", "cgroup", "drained", "err_fd", "err_offset", "err_path", "error", "out_fd",
        "pid", "pidfd", "pipe_bytes", "pipes", "popen", "rss_floor", "spec", "start", "t0",
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
        self.pipes: dict[int, _Pipe] = {}  # read fd -> pipe
        self.drained: list[_Pipe] = []  # pipes at EOF, in close order
        self.pipe_bytes = 0  # held in memory, all pipes together
        self.error: str | None = None
        self.cgroup: Any = None  # its accounting slot (pmc.accounting), if any
        self.rss_floor = 0  # the worker's RSS high-water mark when it was spawned
        self.err_path = ""  # where its stderr goes, and how long that file was then
        self.err_offset = 0


# What a poller wait returns for each readable fd: the master's socket, a task's pidfd,
# or one of a task's forwarding pipes.
_Waited = str | Running | tuple[Running, int]


class _Poller:
    """epoll over file descriptors, each with the object it stands for. ``selectors``
    does the same with key objects and mask maps at ~15 µs more per task (a pidfd is
    added, waited on and removed for every one)."""

    def __init__(self) -> None:
        self.epoll = select.epoll()
        self.data: dict[int, _Waited] = {}

    def add(self, fd: int, data: _Waited) -> None:
        self.epoll.register(fd, select.EPOLLIN)
        self.data[fd] = data

    def remove(self, fd: int) -> None:
        self.epoll.unregister(fd)
        del self.data[fd]

    def wait(self, timeout: float | None) -> list[_Waited]:
        """What became readable within ``timeout`` seconds (None: wait as long as it
        takes); the wait is rounded up to whole milliseconds."""
        data = self.data
        return [data[fd] for fd, _ in self.epoll.poll(-1 if timeout is None else timeout)]


class Worker:
    def __init__(self, transport: Transport, config: WorkerConfig) -> None:
        self.t = transport
        self.cfg = config
        self.rank = transport.rank
        _raise_nofile()
        self.host_rank = 0
        self.hostname = socket.gethostname()
        self.poller = _Poller()
        self.running: dict[int, Running] = {}  # pid -> Running
        self.running_ids: set[int] = set()  # task ids of self.running
        # Prefetched tasks: id of the task they follow -> spec, started when it ends.
        self.successors: dict[int, TaskSpec] = {}
        self.successor_ids: set[int] = set()
        self.returned: list[int] = []  # queued tasks given back, to tell the master
        self.results: list[TaskResult] = []
        # Tasks started since the last message to the master, (id, Unix time), in order:
        # they travel with results, or alone (STARTED) when there are none.
        self.starts: list[tuple[int, float]] = []
        self.deadline: float | None = None  # monotonic: the run's wall time ends
        self.refusing = False  # a stop was asked for: no task may start any more
        self.held_since: float | None = None  # when the oldest unsent result was ready
        self.host_script: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self.kill_deadline: float | None = None
        self.dag_dir = os.path.dirname(os.path.abspath(config.dag_path))
        self.out_fd = self.err_fd = -1
        # Log levels, fixed for the run: per-task lines cost one attribute test when off.
        self.debug = log.enabled(log.DEBUG)
        self.trace = log.enabled(log.TRACE)
        if not config.per_task_stdio:
            out_path = config.out_path.format(rank=self.rank)
            err_path = config.err_path.format(rank=self.rank)
            log.debug(f"Worker {self.rank}: Using task stdout file: {out_path}")
            log.debug(f"Worker {self.rank}: Using task stderr file: {err_path}")
            self.out_fd = _open_append(out_path)
            self.err_fd = _open_append(err_path)
        self.err_path = os.path.abspath(config.err_path.format(rank=self.rank))
        self.accounting = Accounting(config.slots, config.strict_limits)
        _close_on_exec_all()
        self.guard_fd = _start_guard()
        self.guard_lines: list[bytes] = []
        for d in self.accounting.parent:
            if d:  # removed by the guard should this worker be killed
                self.guard(b"c%s\n" % d.encode())
        self.base_env = task_environment(os.environ)
        # An embedded worker runs in a process group of its own in the terminal's session
        # (it must stay in the job's session): with `stty tostop` its log lines to the
        # terminal would stop it. Tasks get the default back (_TASK_SIGDEF).
        signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        self.term_requested = False
        self.inbox: deque[protocol.Message] = deque()  # received, not yet handled
        self.last_activity = time.monotonic()  # polling transports: last message or exit
        fd = transport.fileno()
        if fd is not None:
            self.poller.add(fd, "master")
        # Results wait for company only where the master answers at once: under MPI it
        # sees a message up to ~1 ms late, and so do we its answer, and holding results
        # on top of that round trip let the queued tasks run out (MPI 0.53 -> 0.59 of
        # the spawn floor, in 7 of 8 interleaved pairs of runs).
        self.result_hold = RESULT_HOLD if fd is not None else 0.0

    # -- start-up ------------------------------------------------------------------

    def hello(self) -> protocol.Message:
        cfg = self.cfg
        if not cfg.keep_affinity:
            _clear_affinity()
        cpus = cfg.host_cpus if cfg.host_cpus is not None else detect_cpus()
        memory = cfg.host_memory if cfg.host_memory is not None else detect_memory_mb()
        sockets = cpu_sockets() if cfg.set_affinity else {}
        acc = self.accounting
        return (protocol.HELLO, protocol.VERSION, self.hostname, cpus, memory, cfg.slots,
                os.getpid(), sockets, acc.method, acc.limits, acc.why)

    def run_host_script(self) -> tuple[bool, str]:
        """Start the host script and wait for it to exit 0 (SIGALRM after 60 s)."""
        path = self.cfg.host_script
        assert path is not None
        rank = self.rank
        log.debug(f"Worker {rank}: Launching host script {path}")
        try:
            # Its stdout goes to stderr, as the reference's: the run's stdout carries the
            # records. Its own process group (killed at the end), but the job's session,
            # so that batch systems that account by session see it.
            self.host_script = subprocess.Popen(
                [path], stdin=subprocess.DEVNULL, stdout=2, process_group=0,
                env=dict(self.base_env, PMC_HOST_RANK=str(self.host_rank),
                         PMC_RANK=str(self.rank)),
            )
        except OSError as e:
            # PMC's child writes this and exits 1 (wait status 256).
            log.error(f"Unable to exec host script: {e.strerror}")
            return False, f"Worker {rank}: Host script failed with status 256"
        proc = self.host_script
        self.guard(b"+%d\n" % proc.pid)  # its group lives until the end of the run
        self.flush_guard()
        timeout = self.cfg.host_script_timeout
        deadline = time.monotonic() + timeout
        code: int | None = None
        while code is None:
            try:
                code = proc.wait(0.1)
            except subprocess.TimeoutExpired:
                pass
            else:
                break
            # The master may stop the run meanwhile (a signal): do not make it wait for
            # the rest of the script's 60 s.
            self.inbox.extend(m for _src, m in self.t.poll(0))
            stop = any(m[0] in (protocol.SHUTDOWN, protocol.KILL) for m in self.inbox)
            if stop or self.term_requested or time.monotonic() >= deadline:
                proc.send_signal(signal.SIGALRM)
                try:
                    proc.wait(KILL_GRACE)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                if stop or self.term_requested:
                    return False, f"Worker {rank}: Host script interrupted: the run is stopping"
                return False, f"Worker {rank}: Host script timed out after {timeout:g} seconds"
        status = -code if code < 0 else code << 8  # the raw wait status, as PMC reports it
        if code < 0:
            log.debug(f"Worker {rank}: Host script exited on signal {-code} ({status})")
        else:
            log.debug(f"Worker {rank}: Host script exited with status {code} ({status})")
        if code != 0:
            return False, f"Worker {rank}: Host script failed with status {status}"
        return True, f"Worker {rank}: Host script {path} finished on {self.hostname}"

    def stop_host_script(self) -> None:
        """SIGTERM to the host script's process group, SIGKILL a few seconds later."""
        proc = self.host_script
        if proc is None:
            return
        self.host_script = None
        pgid = proc.pid
        log.debug(f"Worker {self.rank}: Terminating host script process group with SIGTERM")
        if not _signal_group(pgid, signal.SIGTERM):
            return
        deadline = time.monotonic() + KILL_GRACE
        while time.monotonic() < deadline:
            proc.poll()
            if not _group_alive(pgid):
                return
            time.sleep(0.05)
        if _signal_group(pgid, signal.SIGKILL):
            log.warn(f"Worker {self.rank}: Sent SIGKILL to resilient host script processes")
        proc.poll()

    # -- launching -------------------------------------------------------------------

    def accept(self, spec: TaskSpec) -> None:
        """Start a task now, or queue it behind the task it follows while that runs."""
        after = spec.after
        if after >= 0 and (after in self.running_ids or after in self.successor_ids):
            self.successors[after] = spec
            self.successor_ids.add(spec.id)
        elif self.stop_requested():
            self.returned.append(spec.id)
        else:
            self.launch(spec)

    def stop_requested(self) -> bool:
        """Has a stop been asked for? Then no task starts. The master's stop (KILL) and
        the end of the wall time are for good; a SIGTERM/SIGINT of this worker's own
        counts until the loop has handled it (killed the tasks, given the queued ones
        back): the handler only sets a flag, and a killed task's exit may be seen first.
        After that the master decides (a signal to this worker alone kills its tasks,
        as before, but does not make it refuse work for ever)."""
        if self.refusing or self.term_requested:
            return True
        if self.deadline is not None and time.monotonic() >= self.deadline:
            self.refusing = True
        return self.refusing

    def start_successor(self, task_id: int) -> None:
        """A task ended (or could not start): its queued successor takes its place, if
        the run goes on and the wall time left covers what the task declares; if not,
        it goes back to the master, and so does every task queued behind it."""
        spec = self.successors.pop(task_id, None)
        if spec is None:
            return
        self.successor_ids.discard(spec.id)
        expected = spec.expected_runtime
        if self.stop_requested() or (
                expected is not None and self.deadline is not None
                and self.deadline - time.monotonic() < expected):
            self.returned.append(spec.id)
            self.start_successor(spec.id)
            return
        self.launch(spec)

    def recall(self) -> None:
        """Give every queued task back to the master, unstarted."""
        self.returned.extend(spec.id for spec in self.successors.values())
        self.successors.clear()
        self.successor_ids.clear()

    def launch(self, spec: TaskSpec) -> None:
        if self.trace:
            log.trace(f"Running task {spec.name}")
        r = Running(spec)
        try:
            argv = split_command(spec.command)
        except ValueError as e:
            self.fail_now(r, f"cannot split command: {e}")
            return
        if not argv:
            self.fail_now(r, "empty command")
            return
        r.app = argv[0]
        env = self.base_env.copy()
        env["PMC_TASK"] = spec.name
        env["PMC_MEMORY"] = str(spec.memory)
        env["PMC_CPUS"] = str(spec.cpus)
        env["PMC_RANK"] = str(self.rank)
        env["PMC_HOST_RANK"] = str(self.host_rank)
        if spec.affinity:
            env["PMC_AFFINITY"] = ",".join(map(str, spec.affinity))
        try:
            if self.cfg.per_task_stdio:
                r.out_fd, r.err_fd = _open_task_stdio(os.path.join(self.dag_dir, spec.name))
                out_fd, err_fd = r.out_fd, r.err_fd
            else:
                out_fd, err_fd = self.out_fd, self.err_fd
        except OSError as e:
            self._close_stdio(r)
            self.fail_now(r, f"cannot open per-task output file: {e}")
            return
        # Pipe write ends reach the task as fds 3, 4, ... (as in PMC: "A=3"), small enough
        # for `echo >&$A` in any shell. They wait here at high, close-on-exec numbers so
        # that the moves into place cannot overwrite each other.
        moves: list[tuple[int, int]] = []
        for i, (var, dest) in enumerate(spec.pipe_forwards or ()):
            rd, wr = os.pipe()
            os.set_blocking(rd, False)
            high = fcntl.fcntl(wr, fcntl.F_DUPFD_CLOEXEC, _FORWARD_FD_BASE)
            os.close(wr)
            moves.append((high, 3 + i))
            env[var] = str(3 + i)
            r.pipes[rd] = _Pipe(var, dest)
        write_ends = [high for high, _target in moves]
        acc = self.accounting
        rlimit = self.cfg.strict_limits and spec.memory > 0 and acc.limits == "rlimit"
        needs_preexec = bool(spec.affinity) or rlimit
        if self.cfg.per_task_stdio:
            r.err_path = os.readlink(f"/proc/self/fd/{err_fd}")
        else:
            r.err_path = self.err_path
            # Where this try's stderr begins in the shared file, for its tail should it
            # fail (one slot: nothing else writes there meanwhile).
            r.err_offset = os.fstat(err_fd).st_size if self.cfg.slots == 1 else -1
        r.cgroup = acc.enter(spec.memory)
        if r.cgroup is None:
            if acc.problem and self.cfg.strict_limits and spec.memory > 0:
                # Its memory limit cannot be set: it must not run without one.
                for fd in (*write_ends, *r.pipes):
                    os.close(fd)
                message = f"Task {spec.name}: {acc.problem}"
                log.error(message)
                self.fail_now(r, message, out_fd)
                return
            r.rss_floor = self_maxrss_kb()
        r.start = time.time()
        r.t0 = time.monotonic()
        try:
            try:
                try:
                    self._spawn(r, None, argv, env, out_fd, err_fd, moves, needs_preexec,
                                rlimit)
                except FileNotFoundError:
                    # The reference runs a bare name that is an executable file in the
                    # working directory before it searches PATH; looked at only when the
                    # PATH search failed, so that the usual launch costs no extra stat.
                    if "/" in argv[0] or not _is_executable(argv[0]):
                        raise
                    self._spawn(r, argv[0], argv, env, out_fd, err_fd, moves, needs_preexec,
                                rlimit)
            finally:
                if r.cgroup is not None:
                    acc.leave()
        except OSError as e:
            if r.cgroup is not None:
                acc.abandon(r.cgroup)
                r.cgroup = None
            for fd in write_ends:
                os.close(fd)
            for fd in r.pipes:
                os.close(fd)
            # What the reference's child writes to the task's stderr when execve fails
            # (it then exits 1: the try's status is 256).
            message = (f"Unable to exec command {_exec_path(argv[0])} for task {spec.name}: "
                       f"{os.strerror(e.errno) if e.errno else e}")
            _append(err_fd, message + "\n")
            self.fail_now(r, message, out_fd)
            return
        for fd in write_ends:
            os.close(fd)
        r.pidfd = os.pidfd_open(r.pid)
        self.poller.add(r.pidfd, r)
        for fd in r.pipes:
            self.poller.add(fd, (r, fd))
        self.running[r.pid] = r
        self.running_ids.add(spec.id)
        self.starts.append((spec.id, r.start))
        self.guard(b"+%d\n" % r.pid)
        if self.debug:
            log.debug(f"Task {spec.name} started as pid {r.pid}")

    def _spawn(self, r: Running, path: str | None, argv: list[str], env: dict[str, str],
               out_fd: int, err_fd: int, moves: list[tuple[int, int]], preexec: bool,
               rlimit: bool) -> None:
        """Start the task's process in its own process group (same session); ``path``:
        the file to run, None for argv[0] searched in PATH."""
        spec = r.spec
        if preexec:
            r.popen = subprocess.Popen(
                argv, executable=path, env=env, stdin=subprocess.DEVNULL, stdout=out_fd,
                stderr=err_fd,
                close_fds=False,  # every fd of the worker is close-on-exec already
                process_group=0, preexec_fn=_limits(spec, rlimit, moves),
            )
            r.pid = r.popen.pid
            return
        r.pid = (os.posix_spawnp if path is None else os.posix_spawn)(
            argv[0] if path is None else path, argv, env,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, out_fd, 1),
                (os.POSIX_SPAWN_DUP2, err_fd, 2),
                *((os.POSIX_SPAWN_DUP2, high, target) for high, target in moves),
            ],
            setpgroup=0,
            setsigdef=_TASK_SIGDEF,
        )

    def guard(self, line: bytes) -> None:
        """Tell the guard which process groups to kill should this worker die.

        Sent by ``flush_guard`` once per loop turn: one write (and one wake-up of the
        guard) for every task started and reaped in the turn, not two per task."""
        if self.guard_fd >= 0:
            self.guard_lines.append(line)

    def flush_guard(self) -> None:
        if self.guard_lines and self.guard_fd >= 0:
            data = b"".join(self.guard_lines)
            try:
                while data:
                    data = data[os.write(self.guard_fd, data):]
            except OSError:
                os.close(self.guard_fd)
                self.guard_fd = -1
        self.guard_lines.clear()

    def fail_now(self, r: Running, message: str, out_fd: int = -1) -> None:
        """A try that ended before its program ran (it could not be started, its output
        files not opened): status 256, as the reference's, and its record on the task's
        stdout, or this worker's, where there is one."""
        spec = r.spec
        if self.debug:
            log.debug(f"Task {spec.name} failed: {message}")
        start = r.start or time.time()
        duration = time.monotonic() - r.t0 if r.t0 else 0.0
        if out_fd < 0:
            out_fd = self.out_fd
        if out_fd >= 0:
            _append(out_fd, cluster_task_record(
                spec.name, spec.pegasus_id, start, duration, FAILED_STATUS, r.app,
                self.hostname, self.rank, spec.cpus, spec.memory))
        self._close_stdio(r)
        self.starts.append((spec.id, start))
        self.results.append(TaskResult(spec.id, spec.attempt, FAILED_STATUS, start, duration,
                                       0.0, None, message, None,
                                       stderr_path=r.err_path or None,
                                       stderr_tail=message[-TAIL_BYTES:]))
        self.start_successor(spec.id)

    # -- reaping -----------------------------------------------------------------------

    def read_pipe(self, r: Running, fd: int) -> None:
        pipe = r.pipes[fd]
        while fd in r.pipes:
            try:
                chunk = os.read(fd, _READ)
            except BlockingIOError:
                return
            if not chunk:
                self.close_pipe(r, fd)
                return
            if r.error is not None:
                continue  # the try has failed: keep the pipe flowing, keep nothing
            if pipe.spill is not None:
                try:
                    pipe.spill.write(chunk)
                except OSError as e:
                    self.pipe_failed(r, pipe, e)
                continue
            pipe.data += chunk
            r.pipe_bytes += len(chunk)
            if r.pipe_bytes > PIPE_MEMORY:
                self.spill(r, pipe)

    def spill(self, r: Running, pipe: _Pipe) -> None:
        """Move a pipe's data from memory to an unlinked temporary file ($TMPDIR), where
        the rest of it goes too."""
        try:
            f = tempfile.TemporaryFile(prefix="pmc-forward-")  # noqa: SIM115 - kept open
        except OSError as e:
            self.pipe_failed(r, pipe, e)
            return
        pipe.spill = f
        try:
            f.write(pipe.data)
        except OSError as e:
            self.pipe_failed(r, pipe, e)
            return
        r.pipe_bytes -= len(pipe.data)
        pipe.data = bytearray()

    def pipe_failed(self, r: Running, pipe: _Pipe, e: OSError) -> None:
        """Forwarded data could not be kept: the try fails, its data is dropped."""
        r.error = (f"Task {r.spec.name}: Unable to keep the data forwarded through "
                   f"{pipe.var}: {e.strerror or e}")
        _drop_pipes(r)
        r.pipe_bytes = 0

    def send_spilled(self, spec: TaskSpec, pipes: list[_Pipe]) -> str | None:
        """Send spilled pipe data to the master in pieces, before the try's result."""
        for pipe in pipes:
            f = pipe.spill
            try:
                f.seek(0)
                while chunk := f.read(FORWARD_CHUNK):
                    self.t.send(0, (protocol.FORWARD, spec.id, pipe.dest, chunk))
            except OSError as e:
                return (f"Task {spec.name}: Unable to read the data forwarded through "
                        f"{pipe.var}: {e.strerror or e}")
        return None

    def close_pipe(self, r: Running, fd: int) -> None:
        self.poller.remove(fd)
        os.close(fd)
        r.drained.append(r.pipes.pop(fd))

    def reap(self, r: Running) -> None:
        _, wstatus, usage = os.wait4(r.pid, 0)
        if r.popen is not None:
            r.popen.returncode = 0  # reaped here; keep subprocess from waiting on it
        duration = time.monotonic() - r.t0
        status = wstatus  # raw, as the reference reports it
        if self.debug:
            if status & 0x7F:
                log.debug(f"Task {r.spec.name} exited on signal {signal_of(status)} "
                          f"({status}) in {duration:f} seconds")
            else:
                log.debug(f"Task {r.spec.name} exited with status {exit_code_of(status)} "
                          f"({status}) in {duration:f} seconds")
        del self.running[r.pid]
        spec = r.spec
        self.running_ids.discard(spec.id)
        self.poller.remove(r.pidfd)
        os.close(r.pidfd)
        self.guard(b"-%d\n" % r.pid)
        for fd in list(r.pipes):
            self.read_pipe(r, fd)
            if fd in r.pipes:  # still open (a grandchild holds it): take what is there
                self.close_pipe(r, fd)
        forwards: list[tuple[str, bytes]] = []
        error = r.error
        if status == 0 and error is None:
            forwards = [(p.dest, bytes(p.data)) for p in r.drained if p.data]
            for src, dest in spec.file_forwards or ():
                data, problem = _read_forward_file(spec.name, src)
                if problem:
                    log.error(problem)
                    error = problem
                    break
                if data:
                    forwards.append((dest, data))
            # Only once the files are read (as the reference, which reads them before it
            # sends any data): a try that fails forwards nothing.
            spilled = [p for p in r.drained if p.spill is not None]
            if spilled and error is None:
                error = self.send_spilled(spec, spilled)
                if error is not None:
                    log.error(error)
        if spec.file_forwards:
            # Removed whatever happened to the try, as the reference does.
            _remove_forward_files(spec.name, spec.file_forwards)
        if r.drained:
            _drop_pipes(r)
        if error is not None:
            forwards = []
            if error is r.error:  # file-forward problems were logged as found
                log.error(f"Task {spec.name} failed: {error}")
            if status == 0:
                status = FAILED_STATUS
        record = cluster_task_record(
            spec.name, spec.pegasus_id, r.start, duration, status, r.app, self.hostname,
            self.rank, spec.cpus, spec.memory,
        )
        _append(r.out_fd if r.out_fd >= 0 else self.out_fd, record)
        tail = None
        if status != 0 and r.err_offset >= 0:
            tail = _tail(r.err_path, r.err_offset)
        self._close_stdio(r)
        used = self.accounting.collect(r.cgroup, usage, status, r.rss_floor)
        cpu = usage.ru_utime + usage.ru_stime
        if used.user_cpu is not None and used.system_cpu is not None:
            cpu = used.user_cpu + used.system_cpu  # the whole tree, orphans included
        self.results.append(TaskResult(
            spec.id, spec.attempt, status, r.start, duration, cpu, used.max_rss_kb, error,
            tuple(forwards) or None, used.user_cpu, used.system_cpu, used.oom_killed,
            r.err_path if status != 0 else None, tail))
        # Only now: the record closes this task's output in the shared file before the
        # next task's output begins, and the next task's result (should it fail to start)
        # reaches the master after this one's.
        self.start_successor(spec.id)

    def _close_stdio(self, r: Running) -> None:
        for fd in (r.out_fd, r.err_fd):
            if fd >= 0:
                os.close(fd)
        r.out_fd = r.err_fd = -1

    def kill_all(self, sig: int = signal.SIGTERM) -> None:
        self.recall()  # nothing queued may start in a killed task's place
        for r in self.running.values():
            _signal_group(r.pid, sig)
        if sig == signal.SIGTERM and self.running and self.kill_deadline is None:
            self.kill_deadline = time.monotonic() + KILL_GRACE

    # -- the loop ----------------------------------------------------------------------

    def handle(self, msg: protocol.Message) -> None:
        tag = msg[0]
        if tag == protocol.TASKS:
            for spec in msg[1]:
                self.accept(spec)
        elif tag == protocol.RECALL:
            self.recall()
        elif tag == protocol.KILL:
            self.refusing = True  # the master stops the run: nothing starts any more
            self.kill_all()
        elif tag == protocol.SHUTDOWN:
            log.trace(f"Worker {self.rank}: Got shutdown message")
            self.stopping = True
        else:
            log.warn(f"Worker {self.rank}: Unexpected message {tag} from master")

    def loop(self) -> None:
        polling = self.t.fileno() is None
        delay = 0.0001
        while not (self.stopping and not self.running):
            if self.term_requested:
                self.term_requested = False
                self.kill_all()
            if self.kill_deadline is not None and time.monotonic() >= self.kill_deadline:
                self.kill_all(signal.SIGKILL)
                self.kill_deadline = None
            timeout: float | None = None
            if polling:
                # Every running task has its successor queued: nothing the master sends
                # is urgent, and each task's exit wakes us anyway.
                timeout = delay if self.hungry() else SATED_LOOK
            if self.kill_deadline is not None:
                left = max(0.0, self.kill_deadline - time.monotonic())
                timeout = left if timeout is None else min(timeout, left)
            if self.held_since is not None:
                left = max(0.0, self.held_since + self.result_hold - time.monotonic())
                timeout = left if timeout is None else min(timeout, left)
            if self.inbox:
                timeout = 0
            elif polling and not self.running and timeout is not None and 0 < timeout < 0.001:
                # Nothing runs: wait in the transport, which looks for the master's next
                # message precisely (epoll counts whole milliseconds), then look at the
                # rest without waiting. Not while tasks run: their pidfds must wake us
                # the moment one exits.
                self.inbox.extend(m for _src, m in self.t.poll(timeout))
                timeout = 0
            events = self.poller.wait(timeout)
            got_message = False
            for data in events:
                if isinstance(data, Running):
                    self.reap(data)
                elif isinstance(data, tuple):
                    r, fd = data
                    if fd in r.pipes:  # not already drained by a reap in this batch
                        self.read_pipe(r, fd)
                else:
                    got_message = True  # the master's socket
            if polling or got_message:
                self.inbox.extend(m for _src, m in self.t.poll(0))
            had_messages = bool(self.inbox)
            while self.inbox:
                self.handle(self.inbox.popleft())
            if polling:
                if had_messages or events:
                    delay = 0.0001
                    self.last_activity = time.monotonic()
                else:
                    quiet = time.monotonic() - self.last_activity
                    delay = min(delay * 2, look_interval(quiet))
            self.flush_guard()
            # Returned tasks first: a task given back was recalled before the task it
            # followed ended, so the master must learn of it before that task's result
            # (which would otherwise tell it the successor started in its place).
            if self.returned:
                returned, self.returned = self.returned, []
                self.t.send(0, (protocol.RETURNED, returned))
            if self.results:
                now = time.monotonic()
                if self.held_since is None:
                    self.held_since = now
                if self.hungry() or now - self.held_since >= self.result_hold:
                    self.send_results()
            elif self.starts:
                # Tasks started with no result to carry the news: the master counts them
                # queued until it hears (one message per batch of tasks, not per task).
                starts, self.starts = self.starts, []
                self.t.send(0, (protocol.STARTED, starts))
        self.send_results()

    def send_results(self) -> None:
        if self.results:
            results, self.results = self.results, []
            starts, self.starts = self.starts, []
            self.held_since = None
            self.t.send(0, (protocol.RESULTS, results, starts))

    def hungry(self) -> bool:
        """Does a running task lack a successor (or none run)? Then the master must hear
        of finished tasks now, to send more work in time."""
        successors = self.successors
        return not successors or any(t not in successors for t in self.running_ids)


def run(transport: Transport) -> int:
    """The worker's whole life: config, hello, start, tasks, shutdown. Returns exit code."""
    inbox: deque[protocol.Message] = deque()
    msg = _wait(transport, inbox)
    if msg[0] == protocol.SHUTDOWN:  # the master stopped before the run began
        return 0
    if msg[0] != protocol.CONFIG or msg[1] != protocol.VERSION:
        log.fatal(f"worker {transport.rank}: unexpected first message from master: {msg[:2]}")
        return 1
    cfg: WorkerConfig = msg[2]
    _setup_logging(cfg, transport.rank)
    rank = transport.rank
    log.debug(f"Worker {rank}: Starting...")
    try:
        worker = Worker(transport, cfg)
        worker.inbox.extend(inbox)
    except OSError as e:
        transport.send(0, (protocol.ERROR, f"worker {transport.rank} cannot start: {e}"))
        return 1
    hello = worker.hello()
    transport.send(0, hello)
    if log.enabled(log.TRACE):
        log.trace(f"Worker {rank}: Host name: {hello[2]}")
        log.trace(f"Worker {rank}: Host memory: {hello[4]} MB")
        log.trace(f"Worker {rank}: Host threads/CPUs: {hello[3]}")
    msg = _wait(transport, worker.inbox)
    if msg[0] == protocol.SHUTDOWN:
        transport.send(0, (protocol.BYE, None))
        return 0
    worker.host_rank, run_script, wall_left = msg[1], msg[2], msg[3]
    if wall_left is not None:
        # Remaining seconds, not the master's clock: hosts' clocks may differ.
        worker.deadline = time.monotonic() + wall_left
    log.trace(f"Worker {rank}: Host rank: {worker.host_rank}")
    prev_handlers = _install_term(worker)
    try:
        if run_script:
            # A failure is the master's to report (as a fatal error, once).
            ok, text = worker.run_host_script()
            transport.send(0, (protocol.HOST_SCRIPT, ok, text))
        worker.loop()
        worker.stop_host_script()
        transport.send(0, (protocol.BYE, None))
        log.debug(f"Worker {rank}: Exiting...")
    except TransportError as e:
        log.error(f"Worker {rank}: Lost the master ({e}); killing tasks")
        worker.kill_all(signal.SIGKILL)
        worker.stop_host_script()
        return 1
    finally:
        worker.accounting.close()
        for sig, handler in prev_handlers.items():
            signal.signal(sig, handler)
    return 0


def _setup_logging(cfg: WorkerConfig, rank: int) -> None:
    """The master's log format for this worker's own messages (on its stderr): text lines
    as PMC's workers write them (those about the worker itself say "Worker R:"), or JSON
    objects with a rank field."""
    if cfg.log_format != "json":
        log.setup(cfg.log_level)
        return
    sink: list[Callable[[int, str], None]] = []

    def json_message(level: int, msg: str) -> None:
        # structlog is set up at the first message, not at start: its import takes
        # ~0.1 s of cpu, and a worker that runs its tasks without a word needs none.
        if not sink:
            from pmc.outputs.observe import LogOutput

            out = LogOutput("json", None, cfg.log_level)
            out.logger = out.logger.bind(rank=rank)
            sink.append(out.message)
        sink[0](level, msg)

    log.setup(cfg.log_level, sink=json_message)


def _wait(transport: Transport, inbox: deque[protocol.Message]) -> protocol.Message:
    """The next message; any that arrived with it stay in the inbox, in order."""
    while not inbox:
        inbox.extend(m for _src, m in transport.poll(None))
    return inbox.popleft()


def _install_term(worker: Worker) -> dict[int, Any]:
    # SIGTERM/SIGINT (a batch system's time limit, Ctrl-C) kill this worker's tasks; the
    # worker itself keeps talking to the master, which decides when everyone stops.
    def on_term(signum: int, frame: object) -> None:
        worker.term_requested = True

    prev: dict[int, Any] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        prev[sig] = signal.signal(sig, on_term)
    return prev


def _tail(path: str, offset: int) -> str | None:
    """The last lines a failed try wrote to its stderr (from ``offset`` on), bounded by
    TAIL_LINES and TAIL_BYTES; None if there are none."""
    try:
        with open(path, "rb") as f:
            end = os.fstat(f.fileno()).st_size
            start = max(offset, end - TAIL_BYTES)
            data = os.pread(f.fileno(), end - start, start) if end > start else b""
    except OSError:
        return None
    lines = data.decode(errors="replace").splitlines()[-TAIL_LINES:]
    return "\n".join(lines) or None


def _limits(spec: TaskSpec, rlimit: bool, moves: list[tuple[int, int]]) -> Callable[[], None]:
    affinity = spec.affinity
    limit = spec.memory * 1024 * 1024 if rlimit else 0

    def apply() -> None:
        for high, target in moves:
            os.dup2(high, target)  # inheritable, unlike the source
        if affinity:
            os.sched_setaffinity(0, affinity)
        if limit:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        signal.signal(signal.SIGTTOU, signal.SIG_DFL)  # ignored by the worker

    return apply


def _close_on_exec_all() -> None:
    """Mark every inherited descriptor above stderr close-on-exec (an MPI library's
    sockets, a launcher's pipes), so tasks are started with stdin, stdout, stderr and
    their forwarding pipes only."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return
    for fd in fds:
        if fd > 2:
            try:
                os.set_inheritable(fd, False)
            except OSError:
                pass  # the listing's own descriptor, already closed


# The guard: a small process in its own session, started by each worker, that outlives
# it. The worker announces every task's process group ("+PGID" when started, "-PGID"
# when reaped) on a pipe only it holds; when that pipe reaches EOF the worker is gone
# (exited, or killed with SIGKILL, e.g. by mpiexec tearing down the job, where nothing of
# the worker can run), and the guard terminates the groups still announced: SIGTERM, then
# SIGKILL after the grace period. No per-task preexec, no PR_SET_PDEATHSIG.
_GUARD = """
import os, signal, time
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
groups, buf, cgroups = set(), b"", []
while True:
    data = os.read(0, 65536)
    if not data:
        break
    *lines, buf = (buf + data).split(b"\\n")
    for line in lines:
        if line[:1] == b"c":
            cgroups.append(line[1:].decode())
            continue
        (groups.add if line[:1] == b"+" else groups.discard)(int(line[1:]))
    time.sleep(0.1)  # let lines gather in the pipe: a few wake-ups a second, not 2 per task
def signal_all(sig):
    alive = set()
    for g in groups:
        try:
            os.killpg(g, sig)
            alive.add(g)
        except OSError:
            pass
    return alive
groups = signal_all(signal.SIGTERM)
deadline = time.monotonic() + GRACE
while groups and time.monotonic() < deadline:
    time.sleep(0.05)
    groups = signal_all(0)
signal_all(signal.SIGKILL)
# The worker's accounting cgroups (gone already if it exited normally): once its tasks
# are, they can be removed.
for _ in range(20):
    left = []
    for d in cgroups:
        try:
            for sub in os.listdir(d):
                if sub.startswith("slot-"):
                    os.rmdir(os.path.join(d, sub))
            os.rmdir(d)
        except FileNotFoundError:
            pass
        except OSError:
            left.append(d)
    cgroups = left
    if not cgroups:
        break
    time.sleep(0.1)
"""


def _start_guard() -> int:
    """Start the guard; return the write end of its pipe (-1 if it could not start)."""
    rd, wr = os.pipe()
    try:
        os.posix_spawn(
            sys.executable, [sys.executable, "-I", "-S", "-c",
                             _GUARD.replace("GRACE", repr(KILL_GRACE))], os.environ,
            file_actions=[(os.POSIX_SPAWN_DUP2, rd, 0),
                          (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                          (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0)],
            # Its own process group, so that a launcher killing the worker's group spares
            # it; but the job's session, which batch systems (PBS/Torque) account and
            # clean up by.
            setpgroup=0,
        )
    except OSError as e:
        log.warn(f"Cannot start the task guard ({e.strerror}): tasks may outlive a killed "
                 "worker")
        os.close(wr)
        wr = -1
    finally:
        os.close(rd)
    return wr


def _raise_nofile() -> None:
    # Every running task holds a pidfd here: thousands of slots need more descriptors
    # than the usual soft limit of 1024. The hard limit is ours to take.
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > soft):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError):
        pass  # keep the soft limit; a launch that runs out of fds fails that task


def _clear_affinity() -> None:
    try:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
    except OSError:
        pass  # not allowed (e.g. a cgroup cpuset): keep what we have


def _open_append(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o666)


def _open_task_stdio(base: str) -> tuple[int, int]:
    """--per-task-stdio: ``base.out.NNN`` and ``base.err.NNN`` for the first NNN (000,
    001, ...) whose .out file does not exist yet, as the reference numbers them: a retry,
    and a restarted run, take the next number instead of overwriting. O_EXCL finds it
    in one open() in the usual case, and two workers cannot take the same."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    seq = 0
    while True:
        try:
            out = os.open(f"{base}.out.{seq:03d}", flags, 0o666)
            break
        except FileExistsError:
            seq += 1
    try:
        err = os.open(f"{base}.err.{seq:03d}", flags & ~os.O_EXCL | os.O_TRUNC, 0o666)
    except OSError:
        os.close(out)
        raise
    return out, err


def _is_executable(path: str) -> bool:
    """A regular file this process may execute (the reference's test)."""
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _exec_path(name: str) -> str:
    """The file the reference would have tried to execute for argv[0] ``name``: as
    given if it has a slash or is an executable file here, else the first executable
    file of that name in PATH, else the name itself. Only for the message of a failed
    start."""
    if not name or "/" in name or _is_executable(name):
        return name
    for d in os.environ.get("PATH", "").split(":"):
        if d and _is_executable(f"{d}/{name}"):
            return f"{d}/{name}"
    return name


def _drop_pipes(r: Running) -> None:
    """Free a task's forwarded pipe data (memory and temporary files)."""
    for pipe in (*r.pipes.values(), *r.drained):
        pipe.data = bytearray()
        if pipe.spill is not None:
            pipe.spill.close()
            pipe.spill = None


def _remove_forward_files(name: str, file_forwards: tuple[tuple[str, str], ...]) -> None:
    for src, _dest in file_forwards:
        try:
            os.unlink(src)
        except OSError as e:
            log.debug(f"Task {name}: Error unlinking forwarded file {src}: {e.strerror}")


def _append(fd: int, text: str) -> None:
    try:
        os.write(fd, text.encode())
    except OSError as e:
        log.error(f"Cannot write task record: {e.strerror}")


def _read_forward_file(name: str, src: str) -> tuple[bytes, str | None]:
    """Read a -F source of task ``name`` (removed by the caller, whatever happens).
    Missing is not an error; anything
    but a regular file, or more than 1 MiB, is (with PMC's message)."""
    try:
        st = os.stat(src)
    except FileNotFoundError:
        log.debug(f"Task {name}: file {src} does not exist")
        return b"", None
    except OSError as e:
        return b"", f"Task {name}: stat failed on file {src}: {e.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return b"", f"Task {name}: {src} is not a file"
    if st.st_size > FILE_FORWARD_LIMIT:
        return b"", f"Task {name}: File {src} is too large"
    try:
        with open(src, "rb") as f:
            data = f.read(FILE_FORWARD_LIMIT + 1)
    except OSError as e:
        return b"", f"Task {name}: Unable to read {src}: {e.strerror}"
    if len(data) > FILE_FORWARD_LIMIT:
        return b"", f"Task {name}: File {src} is too large"
    return data, None


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def main(argv: list[str] | None = None) -> int:
    """Entry of an embedded-mode worker process, started by the local transport as
    ``--fd N --rank R --size S`` (parsed by hand: argparse would add ~15 ms to the start
    of every worker, which the run waits for)."""
    args = sys.argv[1:] if argv is None else argv
    try:
        opts = dict(zip(args[::2], map(int, args[1::2]), strict=True))
        fd, rank, size = opts["--fd"], opts["--rank"], opts["--size"]
    except (KeyError, ValueError):
        print(f"usage: pmc-worker --fd N --rank R --size S (got {' '.join(args)})",
              file=sys.stderr)
        return 2
    from pmc.transport.local import LocalWorker

    transport = LocalWorker(fd, rank, size)
    try:
        return run(transport)
    except TransportError:
        return 1
    finally:
        transport.close()


if __name__ == "__main__":
    sys.exit(main())
