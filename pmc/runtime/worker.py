"""A worker rank: its event loop over the master's messages and its tasks' exits.

One event loop over an epoll: the master's socket (embedded mode), a pidfd per running
task (readable when it exits) and the read ends of forwarding pipes; or, while one task
runs and has no pipe to read, a wait by signal for its exit and the rest
(``pmc.runtime.sigwait``). Under MPI, where the transport cannot be waited on, the
epoll wait doubles as the polling back-off. The
processes themselves are ``pmc.runtime.launch``'s; this module decides when tasks start
(at once, or queued behind the task they follow), when results travel, and how the
worker's life goes: config, hello, host script, tasks, shutdown. Should the loop die of
an unexpected exception, the master hears why (WORKER_FAILED) before the worker exits.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from collections import deque

from pmc import batchsignals, log
from pmc.core import protocol
from pmc.core.protocol import TaskSpec, WorkerConfig
from pmc.errors import ExitCode
from pmc.process import set_name
from pmc.runtime import workerlog
from pmc.runtime.hostinfo import (
    clear_affinity,
    cpu_sockets,
    detect_cpus,
    detect_memory_mb,
    raise_nofile,
    task_environment,
)
from pmc.runtime.launch import KILL_GRACE, Launcher, Running, Waited
from pmc.runtime.sigwait import SignalWait
from pmc.runtime.topology import cpu_numa_nodes, gpu_inventory
from pmc.runtime.workersignals import Wakeup, catch_stops
from pmc.transport import TransportError, look_interval

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing: see pmc.core.record
if TYPE_CHECKING:
    from pmc.runtime.hostscript import HostScript
    from pmc.transport import Transport

# While every running task has its successor queued, results wait up to this long to
# travel together: fewer messages for both ends, and the slots are not waiting (a slot
# holds ~20 ms of short tasks: pmc.core.chains). Where the master's socket can be
# waited on only (see Worker.__init__). The master hears of an end or a start up to this
# much later; the records' times are the worker's own.
RESULT_HOLD = 0.020
SATED_LOOK = 0.01  # polling transports: look this often while no slot needs a task


class Worker:
    def __init__(self, transport: Transport, config: WorkerConfig) -> None:
        self.t = transport
        self.cfg = config
        self.rank = transport.rank
        raise_nofile()
        self.hostname = socket.gethostname()
        self.base_env = task_environment(os.environ)
        launcher = self.launcher = Launcher(config, self.rank, self.hostname, self.base_env,
                                            self.send)
        self.poller = launcher.poller
        self.running = launcher.running  # pid -> Running (the launcher's own dict)
        self.running_ids = launcher.running_ids
        # Prefetched tasks: id of the task they follow -> spec, started when it ends.
        self.successors: dict[int, TaskSpec] = {}
        self.successor_ids: set[int] = set()
        self.returned: list[int] = []  # queued tasks given back, to tell the master
        self.deadline: float | None = None  # monotonic: the run's wall time ends
        self.refusing = False  # a stop was asked for: no task may start any more
        self.held_since: float | None = None  # when the oldest unsent result was ready
        self.host_script: HostScript | None = None
        self.stopping = False
        self.kill_deadline: float | None = None
        # An embedded worker runs in a process group of its own in the terminal's session
        # (it must stay in the job's session): with `stty tostop` its log lines to the
        # terminal would stop it. Tasks get the default back (pmc.runtime.launch).
        signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        self.term_requested = False
        self.inbox: deque[protocol.Message] = deque()  # received, not yet handled
        self.last_activity = time.monotonic()  # polling transports: last message or exit
        # Heartbeats: after a quiet quarter of --worker-timeout this worker says it is
        # still here (any message counts); a master silent for all of it is gone.
        self.beat = config.worker_timeout / 4
        self.last_sent = self.last_heard = time.monotonic()
        fd = transport.fileno()
        if fd is not None:
            self.poller.add(fd, "master")
        # A signal caught wakes the loop at once (a wait may otherwise last a beat): a
        # SIGTERM's kill and a warning's word to the master do not wait for it.
        self.wakeup = Wakeup(self.poller)
        self.sigwait: SignalWait | None = None  # while the loop runs, where it can
        # Results wait for company only where the master answers at once: under MPI it
        # sees a message up to ~1 ms late, and so do we its answer, and holding results
        # on top of that round trip let the queued tasks run out (MPI 0.53 -> 0.59 of
        # the spawn floor, in 7 of 8 interleaved pairs of runs).
        self.result_hold = RESULT_HOLD if fd is not None else 0.0

    def send(self, msg: protocol.Message) -> None:
        self.t.send(0, msg)
        self.last_sent = time.monotonic()

    def heartbeat(self, now: float) -> None:
        """A PING when nothing went to the master for a while; the master's silence for
        all of --worker-timeout means it is gone (its own PINGs keep a quiet one heard)."""
        if now - self.last_sent >= self.beat:
            self.send(protocol.ping())
        if now - self.last_heard > self.cfg.worker_timeout:
            raise TransportError(f"no word from the master for {self.cfg.worker_timeout:g} s")

    # -- start-up ------------------------------------------------------------------

    def hello(self) -> protocol.Hello:
        """What this worker tells the master of its host. Its GPU inventory (--host-gpus,
        else probed; limited to the job's own set) is read first: a contradiction
        raises ValueError, which stops the worker."""
        cfg = self.cfg
        gpus, _how = gpu_inventory(cfg.host_gpus, os.environ)
        self.launcher.gpu_host = bool(gpus)
        if not cfg.keep_affinity:
            clear_affinity()
        cpus = cfg.host_cpus if cfg.host_cpus is not None else detect_cpus()
        memory = cfg.host_memory if cfg.host_memory is not None else detect_memory_mb()
        # A multi-core task's cpus (PMC_AFFINITY, bound with --set-affinity) are grouped
        # by NUMA node, by socket where sysfs has no nodes to tell; --host-cpus N makes
        # them ids 0 to N-1 on one socket, as PMC.
        sockets = (dict.fromkeys(range(cpus), 0) if cfg.host_cpus is not None
                   else cpu_numa_nodes() or cpu_sockets())
        acc = self.launcher.accounting
        return protocol.Hello(
            protocol.HELLO, protocol.VERSION, self.hostname, cpus, memory, cfg.worker_slots,
            os.getpid(), sockets, acc.method, acc.limits, acc.why, tuple(g.id for g in gpus),
            tuple((g.id, g.numa) for g in gpus if g.numa is not None))

    def run_host_script(self) -> tuple[bool, str]:
        """Start the host script and wait for it to exit 0 (SIGALRM after its timeout,
        or at once should the run stop meanwhile)."""
        path = self.cfg.host_script
        assert path is not None
        env = dict(self.base_env, PMC_HOST_RANK=str(self.launcher.host_rank),
                   PMC_RANK=str(self.rank))
        from pmc.runtime.hostscript import HostScript  # only with --host-script

        self.host_script = HostScript(path, self.rank, env, self.launcher.guard)
        return self.host_script.run(self.cfg.host_script_timeout, self.stop_coming,
                                    self.hostname)

    def stop_asked(self) -> None:
        """SIGTERM or SIGINT (a signal handler: the loop acts on it)."""
        self.term_requested = True

    def stop_coming(self) -> bool:
        """While the host script runs: has the master stopped the run (its messages wait
        in the inbox), or this worker been signalled?"""
        self.inbox.extend(m for _src, m in self.t.poll(0))
        return (any(isinstance(m, (protocol.Shutdown, protocol.Kill)) for m in self.inbox)
                or self.term_requested)

    def stop_host_script(self) -> None:
        if self.host_script is not None:
            self.host_script.stop()

    # -- starting tasks ----------------------------------------------------------------

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

    def start_successor(self, task_id: int, give_back: bool = False) -> None:
        """A task ended (or could not start): its queued successor takes its place, if
        the run goes on and the wall time left covers what the task declares; if not, it
        goes back to the master and the next one behind it is looked at the same way.
        With ``give_back`` the whole queue goes back."""
        spec = self.successors.pop(task_id, None)
        if spec is None:
            return
        self.successor_ids.discard(spec.id)
        expected = spec.expected_runtime
        if give_back or self.stop_requested() or (
                expected is not None and self.deadline is not None
                and self.deadline - time.monotonic() < expected):
            self.returned.append(spec.id)
            self.start_successor(spec.id, give_back)
            return
        self.launch(spec)

    def recall(self) -> None:
        """Give every queued task back to the master, unstarted."""
        self.returned.extend(spec.id for spec in self.successors.values())
        self.successors.clear()
        self.successor_ids.clear()

    def launch(self, spec: TaskSpec) -> None:
        if not self.launcher.launch(spec):  # failed at once: its successor goes on
            self.start_successor(spec.id)

    def reap(self, r: Running) -> None:
        wstatus = self.launcher.reap(r)
        # Only now: the record closes this task's output in the shared file before the
        # next task's output begins, and the next task's result (should it fail to start)
        # reaches the master after this one's. A task killed by a signal this worker did
        # not send (it recalls the queue before it signals) may be the first sign of a
        # batch system stopping the job, which signals every process in no set order:
        # what follows it goes back, for the master to start or not.
        self.start_successor(r.spec.id, give_back=os.WIFSIGNALED(wstatus))

    def kill_all(self, sig: int = signal.SIGTERM) -> None:
        self.recall()  # nothing queued may start in a killed task's place
        self.launcher.signal_all(sig)
        if sig == signal.SIGTERM and self.running and self.kill_deadline is None:
            self.kill_deadline = time.monotonic() + KILL_GRACE

    # -- the loop ----------------------------------------------------------------------

    def handle(self, msg: protocol.Message) -> None:
        if isinstance(msg, protocol.Tasks):
            for spec in msg.specs:
                self.accept(spec)
        elif isinstance(msg, protocol.Recall):
            self.recall()
        elif isinstance(msg, protocol.Kill):
            self.refusing = True  # the master stops the run: nothing starts any more
            self.kill_all()
        elif isinstance(msg, protocol.Ping):
            pass  # the master is there: heard already
        elif isinstance(msg, protocol.Shutdown):
            log.trace(f"Worker {self.rank}: Got shutdown message")
            self.stopping = True
        else:
            log.warn(f"Worker {self.rank}: Unexpected message {msg[0]} from master")

    def loop(self) -> None:
        polling = self.t.fileno() is None
        launcher = self.launcher
        delay = 0.0001
        self.last_sent = self.last_heard = time.monotonic()
        while not (self.stopping and not self.running):
            if self.term_requested:
                self.term_requested = False
                self.kill_all()
            if self.kill_deadline is not None and time.monotonic() >= self.kill_deadline:
                self.kill_all(signal.SIGKILL)
                self.kill_deadline = None
            timeout: float | None = self.beat
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
            events = self.wait(timeout)
            got_message = False
            for data in events:
                if isinstance(data, Running):
                    self.reap(data)
                elif isinstance(data, tuple):
                    # (Not if already drained by a reap in this batch.)
                    self.launcher.read_pipe(*data)
                elif data == "signal":
                    self.wakeup.empty()
                else:
                    got_message = True  # the master's socket
            had_messages = self.hear(polling or got_message)
            self.heartbeat(time.monotonic())
            if batchsignals.pending():  # warnings that time is short: the master decides
                self.send(protocol.warned(batchsignals.take()))
            if polling:
                if had_messages or events:
                    delay = 0.0001
                    self.last_activity = time.monotonic()
                else:
                    quiet = time.monotonic() - self.last_activity
                    delay = min(delay * 2, look_interval(quiet))
            # Returned tasks first: a task given back was recalled before the task it
            # followed ended, so the master must learn of it before that task's result
            # (which would otherwise tell it the successor started in its place).
            if self.returned:
                returned, self.returned = self.returned, []
                self.send(protocol.returned(returned))
            if launcher.results:
                now = time.monotonic()
                if self.held_since is None:
                    self.held_since = now
                if self.hungry() or now - self.held_since >= self.result_hold:
                    self.send_results()
            elif launcher.starts:
                # Tasks started with no result to carry the news: the master counts them
                # queued until it hears (one message per batch of tasks, not per task).
                starts, launcher.starts = launcher.starts, []
                self.send(protocol.started(starts))
        self.send_results()

    def wait_by_signal(self) -> None:
        """Wait for a task that runs alone by signal from now on, where that can be done:
        a master that can be waited on, a wake-up pipe, a single thread."""
        fd = self.t.fileno()
        if fd is not None and self.wakeup.fd >= 0:
            sigwait = SignalWait((fd, self.wakeup.fd))
            if sigwait.usable:
                self.sigwait = sigwait

    def wait(self, timeout: float | None) -> list[Waited]:
        """What needs the worker within ``timeout`` seconds (None: a beat). One task
        running with no pipe to read: waited for by signal (``pmc.runtime.sigwait``);
        otherwise in the poller, every running task's exit there."""
        sigwait = self.sigwait
        if sigwait is not None and len(self.running) == 1:
            (r,) = self.running.values()
            if r.pipes is None:
                woke = sigwait.wait(self.beat if timeout is None else timeout)
                if woke == signal.SIGCHLD:  # a child ended: this task?
                    return [r] if self.launcher.exited(r) else []
                # SIGIO: the master's socket or the signal wake-up pipe turned readable.
                return ["master", "signal"] if woke else []
        return self.launcher.wait(timeout)

    def hear(self, look: bool) -> bool:
        """Act on what the master sent (``look``: read the transport first); whether it
        sent anything."""
        if look:
            self.inbox.extend(m for _src, m in self.t.poll(0))
        if not self.inbox:
            return False
        self.last_heard = time.monotonic()
        while self.inbox:
            self.handle(self.inbox.popleft())
        return True

    def send_results(self) -> None:
        launcher = self.launcher
        if launcher.results:
            results, launcher.results = launcher.results, []
            starts, launcher.starts = launcher.starts, []
            self.held_since = None
            self.send(protocol.results(results, starts))

    def hungry(self) -> bool:
        """Does a running task lack a successor (or none run)? Then the master must hear
        of finished tasks now, to send more work in time."""
        successors = self.successors
        return not successors or not successors.keys() >= self.running_ids


def run(transport: Transport) -> int:
    """The worker's whole life: config, hello, start, tasks, shutdown. Returns exit code.
    An unexpected exception is reported to the master (WORKER_FAILED), then raised."""
    batchsignals.catch()  # (already, but for a worker started afresh)
    try:
        return _live(transport)
    except TransportError:
        raise
    except Exception:
        import traceback  # only now: with logging, ~10 M instructions of every start

        workerlog.report_failure(transport, traceback.format_exc())
        raise


def _live(transport: Transport) -> int:
    inbox: deque[protocol.Message] = deque()
    msg = _wait(transport, inbox)
    if isinstance(msg, protocol.Shutdown):  # the master stopped before the run began
        return ExitCode.OK
    if not isinstance(msg, protocol.Config) or msg.version != protocol.VERSION:
        log.fatal(f"worker {transport.rank}: unexpected first message from master: {msg[:2]}")
        return ExitCode.FAILED
    cfg = msg.config
    workerlog.setup(cfg, transport.rank)
    rank = transport.rank
    log.debug(f"Worker {rank}: Starting...")
    try:
        worker = Worker(transport, cfg)
        worker.inbox.extend(inbox)
        hello = worker.hello()
    except (OSError, ValueError) as e:
        transport.send(0, protocol.error(f"worker {transport.rank} cannot start: {e}"))
        return ExitCode.FAILED
    transport.send(0, hello)
    if log.enabled(log.TRACE):
        log.trace(f"Worker {rank}: Host name: {hello.hostname}")
        log.trace(f"Worker {rank}: Host memory: {hello.memory} MB")
        log.trace(f"Worker {rank}: Host threads/CPUs: {hello.cpus}")
    msg = _wait(transport, worker.inbox)
    if isinstance(msg, protocol.Shutdown):
        transport.send(0, protocol.bye(None))
        return ExitCode.OK
    assert isinstance(msg, protocol.Start), msg[:1]
    worker.launcher.host_rank, run_script = msg.host_rank, msg.run_host_script
    if msg.wall_left is not None:
        # Remaining seconds, not the master's clock: hosts' clocks may differ.
        worker.deadline = time.monotonic() + msg.wall_left
    log.trace(f"Worker {rank}: Host rank: {worker.launcher.host_rank}")
    prev_handlers = catch_stops(worker.stop_asked)
    try:
        if run_script:
            # A failure is the master's to report (as a fatal error, once).
            ok, text = worker.run_host_script()
            transport.send(0, protocol.host_script(ok, text))
        worker.wait_by_signal()  # after the host script: it starts with nothing blocked
        worker.loop()
        worker.stop_host_script()
        transport.send(0, protocol.bye(None))
        log.debug(f"Worker {rank}: Exiting...")
    except TransportError as e:
        log.error(f"Worker {rank}: Lost the master ({e}); killing tasks")
        worker.kill_all(signal.SIGKILL)
        worker.stop_host_script()
        return ExitCode.FAILED
    finally:
        worker.launcher.accounting.close()
        worker.launcher.ranks.close()
        if worker.sigwait is not None:
            worker.sigwait.close()
        worker.wakeup.close()
        for sig, handler in prev_handlers.items():
            signal.signal(sig, handler)
    return ExitCode.OK


def _wait(transport: Transport, inbox: deque[protocol.Message]) -> protocol.Message:
    """The next message; any that arrived with it stay in the inbox, in order."""
    while not inbox:
        inbox.extend(m for _src, m in transport.poll(None))
    return inbox.popleft()


def serve(fd: int, rank: int, size: int) -> int:
    """An embedded worker's whole life on its end (``fd``) of the master's socket pair,
    in a process forked from the master or a fresh one (``main``). Returns the exit
    code."""
    # Forked from the master, it would show the master's name; fresh, the interpreter's.
    set_name(f"pmc-worker-{rank}")
    from pmc.transport.local import LocalWorker

    transport = LocalWorker(fd, rank, size)
    try:
        return run(transport)
    except TransportError:
        return ExitCode.FAILED
    finally:
        transport.close()


def main(argv: list[str] | None = None) -> int:
    """Entry of an embedded-mode worker started as a fresh Python by the local transport,
    as ``--fd N --rank R --size S`` (parsed by hand: argparse would add ~15 ms to the
    start of every worker, which the run waits for)."""
    args = sys.argv[1:] if argv is None else argv
    try:
        opts = dict(zip(args[::2], map(int, args[1::2]), strict=True))
        fd, rank, size = opts["--fd"], opts["--rank"], opts["--size"]
    except (KeyError, ValueError):
        print(f"usage: pmc-worker --fd N --rank R --size S (got {' '.join(args)})",
              file=sys.stderr)
        return ExitCode.USAGE
    log.standalone()  # a fresh interpreter running pmc alone: nothing can hook its log
    return serve(fd, rank, size)


if __name__ == "__main__":
    sys.exit(main())
