"""Messages between the master (rank 0) and the workers.

One record per message (a NamedTuple: a tuple on the wire, cheap to pickle), its integer
tag first, built by the functions below and read by name; batched — one TASKS message
carries every task the master hands a worker at once, one RESULTS message every result a
worker has ready. The sequence of a run:

    master -> worker   CONFIG: Config(version, WorkerConfig)
    worker -> master   HELLO: Hello(version, hostname, cpus, memory, slots, pid,
                             cpu_socket, accounting, memory_limits, why, gpus, gpu_numa)
    master -> worker   START: Start(host_rank, run_host_script, wall_left)  (seconds of
                                                          wall time left, None: no limit)
    worker -> master   HOST_SCRIPT(ok, message)          (only the worker that ran it)
    master -> worker   TASKS([TaskSpec, ...])            (any number of times)
    worker -> master   FORWARD(task id, destination, data)  (a piece of a finished task's
                                                          large pipe output, before its
                                                          result)
    worker -> master   RESULTS([TaskResult, ...], [(task id, start), ...])
                                                         (any number of times: results,
                                                          and the tasks started since the
                                                          last message, in start order)
    worker -> master   STARTED([(task id, start), ...])  (tasks started, no result to
                                                          carry them)
    master -> worker   RECALL()                          (give back queued tasks)
    worker -> master   RETURNED([task id, ...])          (queued tasks given back, unstarted)
    master -> worker   KILL()                            (abort: kill running tasks, give
                                                          back queued ones)
    master -> worker   SHUTDOWN(worker_lost)              (whether a worker was lost)
    worker -> master   BYE(error_or_None)

At any point after CONFIG:

    worker -> master   PING()                            (nothing else sent for a quarter
    master -> worker   PING()                             of --worker-timeout: a peer
                                                          silent for all of it is lost)

    worker -> master   ERROR(message)                    (the worker cannot start)
    worker -> master   WORKER_FAILED(hostname, traceback)  (its loop died of an unexpected
                                                          exception: the traceback's last
                                                          8 KB; then it exits non-zero)
    worker -> master   WARNED([signal, ...])             (warnings that time is short it
                                                          caught: the master decides)
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing: see pmc.core.record
if TYPE_CHECKING:
    from typing import Any, NamedTuple
else:
    from pmc.core.record import NamedTuple

# 4: STARTED, starts with RESULTS, START carries the wall time left; 5: WORKER_FAILED;
# 6: PING, worker_timeout in WorkerConfig; 7: GPUs in HELLO, TaskSpec gpus and hosts;
# 9: WARNED, limit_memory_by in WorkerConfig
# 10: TaskSpec env and outputs (task arrays, declared files)
# 11: CONFIG, HELLO and START as records (Config, Hello, Start), read by name
# 12: every message a record (Tasks, Results, ...), read by name
# 13: messages travel as plain tuples, made records again on receipt (to_wire, from_wire)
VERSION = 13

CONFIG = 1
HELLO = 2
START = 3
HOST_SCRIPT = 4
TASKS = 5
RESULTS = 6
KILL = 7
SHUTDOWN = 8
BYE = 9
ERROR = 10  # worker -> master: the worker cannot go on (message)
RECALL = 11
RETURNED = 12
FORWARD = 13
STARTED = 14
WORKER_FAILED = 15  # worker -> master: its loop died of an unexpected exception
PING = 16  # either way: "still here", sent only after a quiet spell (any message counts)
WARNED = 17  # worker -> master: warning signals it caught (pmc.batchsignals), in order

# The status of a try that failed for a reason of pmc's, not the task's own exit: the
# program could not be started, its output files not opened, its forwarded files not read
# or written. As the reference, a wait status of exit code 1.
FAILED_STATUS = 1 << 8

# Any of the records below (the transports move them without looking inside, but for
# the tag).
if TYPE_CHECKING:
    Message = tuple[Any, ...]
else:
    Message = tuple  # (annotations are not evaluated: a name for them, at run time)


class WorkerConfig(NamedTuple):
    """What a worker needs to know from the master's command line: what the master
    derives (the first four), then the run options marked for workers in
    ``pmc.options.OPTIONS``, by their ``RunOptions`` names (a test holds the two equal).
    No defaults: made from a ``RunOptions`` (``runtime.startup.worker_config``), whose
    defaults are the table's."""

    dag_path: str
    out_path: str  # this worker's stdout file, "{rank}" replaced; "" with per-task stdio
    err_path: str
    log_level: int
    per_task_stdio: bool
    host_cpus: int | None  # None: detect
    host_memory: int | None  # MB; None: detect
    worker_slots: int
    strict_limits: bool
    keep_affinity: bool
    set_affinity: bool
    host_script: str | None
    host_script_timeout: float  # seconds before SIGALRM
    log_format: str  # "text" or "json"
    worker_timeout: float  # seconds of silence before a peer counts as lost
    host_gpus: int | None  # --host-gpus: declared GPUs; None: probe
    task_launcher: str | None  # --task-launcher: multi-rank tasks' template
    task_accounting: str  # --task-accounting: "auto", "cgroup" or "rusage"
    limit_memory_by: str  # --limit-memory-by: "rlimit" or "cgroup"


class Config(NamedTuple):
    """Master -> worker, first: the protocol and what the worker needs of the options."""

    tag: int
    version: int
    config: WorkerConfig


class Hello(NamedTuple):
    """Worker -> master, in answer to Config: the worker's host and how it runs tasks."""

    tag: int
    version: int
    hostname: str
    cpus: int
    memory: int  # MB
    slots: int
    pid: int
    cpu_socket: dict[int, int]  # cpu id -> its NUMA node (or socket)
    accounting: str  # how it measures tasks (pmc.runtime.accounting)
    memory_limits: str  # how it holds --strict-limits tasks to their -m
    why: str  # why it measures so ("" if there is nothing to say)
    gpus: tuple[str, ...]  # GPU ids, in the host's order
    gpu_numa: tuple[tuple[str, int], ...]  # (GPU id, its NUMA node) where known


class Start(NamedTuple):
    """Master -> worker, once every worker said hello: go."""

    tag: int
    host_rank: int
    run_host_script: bool
    wall_left: float | None  # seconds of wall time left; None: no limit


def config(worker_config: WorkerConfig) -> Config:
    return Config(CONFIG, VERSION, worker_config)


def start(host_rank: int, run_host_script: bool, wall_left: float | None) -> Start:
    return Start(START, host_rank, run_host_script, wall_left)


class TaskSpec(NamedTuple):
    id: int
    name: str
    command: str
    cpus: int
    memory: int
    attempt: int  # 1-based try number
    pipe_forwards: tuple[tuple[str, str], ...] | None
    file_forwards: tuple[tuple[str, str], ...] | None
    pegasus_id: str | None
    affinity: tuple[int, ...] | None
    # -1: start now. Otherwise the id of a task this worker runs (or holds queued): start
    # this one the moment that one ends, in its place (prefetching: the slot never waits
    # for a round trip to the master).
    after: int = -1
    # The task's declared runtime (seconds): a worker does not start it from its queue
    # with less wall time left (it gives it back instead).
    expected_runtime: float | None = None
    # GPU ids on this worker's host the task (each of its ranks here) may use (pmc
    # extension, --request-gpus); None: none.
    gpus: tuple[str, ...] | None = None
    # A multi-rank task (--ranks): (host, ranks) of each host it runs on, this worker's
    # first; None: a plain task.
    hosts: tuple[tuple[str, int], ...] | None = None
    # Variables added to the task's environment (an array member's PMC_ARRAY_INDEX and
    # PMC_ARRAY_VALUE); None: none.
    env: tuple[tuple[str, str], ...] | None = None
    # Declared outputs (--outputs, pmc extension), relative to the DAG's directory: a try
    # that exits 0 without one of them fails.
    outputs: tuple[str, ...] | None = None

    @property
    def ranks(self) -> int:
        """How many ranks the task runs as (1 but for a multi-rank task)."""
        return sum(n for _h, n in self.hosts) if self.hosts else 1


class TaskResult(NamedTuple):
    id: int
    attempt: int
    # The raw wait status, as the reference reports it (exit code N is N << 8, death by
    # signal S is S; 0 is success). Read it through exit_code_of / signal_of / describe.
    status: int
    start: float  # Unix time
    duration: float  # seconds, wall
    cpu_time: float  # user + system seconds of the task and its reaped children
    # Peak memory of the task (KiB): of its whole process tree with cgroup accounting,
    # else the largest RSS of one of its processes when it is known to be the task's own;
    # None when it cannot be told apart from what the worker passed on (see
    # pmc.runtime.accounting).
    max_rss_kb: int | None
    error: str | None  # why the worker failed the task, if it did
    forwards: tuple[tuple[str, bytes], ...] | None  # (destination, data) to append
    user_cpu: float | None = None  # seconds, the whole process tree (cgroup), or None
    system_cpu: float | None = None
    oom_killed: bool = False  # killed by the memory limit of its cgroup (--strict-limits)
    stderr_path: str | None = None  # failed tries: where the task's stderr went
    stderr_tail: str | None = None  # failed tries: its last lines (bounded)


class HostScript(NamedTuple):
    """Worker -> master: how the host script went (only the worker that ran it)."""

    tag: int
    ok: bool
    message: str


class Tasks(NamedTuple):
    """Master -> worker: tasks to run or queue."""

    tag: int
    specs: list[TaskSpec]


class Results(NamedTuple):
    """Worker -> master: results, and the tasks started since the last message."""

    tag: int
    results: list[TaskResult]
    starts: list[tuple[int, float]]  # (task id, start), in start order


class Started(NamedTuple):
    """Worker -> master: tasks started, no result to carry them."""

    tag: int
    starts: list[tuple[int, float]]


class Recall(NamedTuple):
    """Master -> worker: give back queued tasks."""

    tag: int


class Returned(NamedTuple):
    """Worker -> master: queued tasks given back, unstarted."""

    tag: int
    task_ids: list[int]


class Forward(NamedTuple):
    """Worker -> master: a piece of a finished task's large pipe output."""

    tag: int
    task_id: int
    destination: str
    data: bytes


class Kill(NamedTuple):
    """Master -> worker: abort (kill running tasks, give back queued ones)."""

    tag: int


class Shutdown(NamedTuple):
    """Master -> worker: the end."""

    tag: int
    worker_lost: bool  # whether a worker was lost (MPI workers then skip MPI_Finalize)


class Bye(NamedTuple):
    """Worker -> master, the last: its error, or None."""

    tag: int
    error: str | None


class Error(NamedTuple):
    """Worker -> master: the worker cannot start."""

    tag: int
    message: str


class WorkerFailed(NamedTuple):
    """Worker -> master: its loop died of an unexpected exception."""

    tag: int
    hostname: str
    traceback: str  # its last 8 KB


class Ping(NamedTuple):
    """Either way: still here."""

    tag: int


class Warned(NamedTuple):
    """Worker -> master: warning signals it caught, in order."""

    tag: int
    signals: list[int]


# Each message's record by its tag.
_KINDS: dict[int, type[tuple[Any, ...]]] = {
    CONFIG: Config, HELLO: Hello, START: Start, HOST_SCRIPT: HostScript, TASKS: Tasks,
    RESULTS: Results, KILL: Kill, SHUTDOWN: Shutdown, BYE: Bye, ERROR: Error,
    RECALL: Recall, RETURNED: Returned, FORWARD: Forward, STARTED: Started,
    WORKER_FAILED: WorkerFailed, PING: Ping, WARNED: Warned}


# The records a message carries, by its tag: plain tuples on the wire too.
_INNER: dict[int, type[tuple[Any, ...]]] = {TASKS: TaskSpec, RESULTS: TaskResult}


def to_wire(msg: Message) -> tuple[Any, ...]:
    """The message as it travels: a plain tuple, the task specs or results it carries
    plain tuples too. A record's pickle names its class and is written and rebuilt
    through NamedTuple's Python-level ``__getnewargs__`` and ``__new__`` (~1.8 µs more to
    write and ~0.8 µs more to read, per record: a task's spec and its result each); a
    tuple's is C all the way."""
    tag = msg[0]
    if tag in _INNER:
        return (tag, [tuple(r) for r in msg[1]], *msg[2:])
    return tuple(msg)


def from_wire(data: tuple[Any, ...]) -> Message:
    """A message received as ``to_wire`` sent it, its records again (built in C, without
    the records' ``__new__``); a tuple of no known tag is passed on as it came, for the
    reader to refuse."""
    kind = _KINDS.get(data[0]) if data else None
    if kind is None:
        return data
    inner = _INNER.get(data[0])
    if inner is not None:
        new = tuple.__new__
        data = (data[0], [new(inner, r) for r in data[1]], *data[2:])
    return tuple.__new__(kind, data)


def host_script(ok: bool, message: str) -> HostScript:
    return HostScript(HOST_SCRIPT, ok, message)


def tasks(specs: list[TaskSpec]) -> Tasks:
    return Tasks(TASKS, specs)


def results(results: list[TaskResult], starts: list[tuple[int, float]]) -> Results:
    return Results(RESULTS, results, starts)


def started(starts: list[tuple[int, float]]) -> Started:
    return Started(STARTED, starts)


def recall() -> Recall:
    return Recall(RECALL)


def returned(task_ids: list[int]) -> Returned:
    return Returned(RETURNED, task_ids)


def forward(task_id: int, destination: str, data: bytes) -> Forward:
    return Forward(FORWARD, task_id, destination, data)


def kill() -> Kill:
    return Kill(KILL)


def shutdown(worker_lost: bool) -> Shutdown:
    return Shutdown(SHUTDOWN, worker_lost)


def bye(error: str | None) -> Bye:
    return Bye(BYE, error)


def error(message: str) -> Error:
    return Error(ERROR, message)


def worker_failed(hostname: str, traceback: str) -> WorkerFailed:
    return WorkerFailed(WORKER_FAILED, hostname, traceback)


def ping() -> Ping:
    return Ping(PING)


def warned(signals: list[int]) -> Warned:
    return Warned(WARNED, signals)


def signal_of(status: int) -> int:
    """The signal that ended a try with this raw wait status, or 0 if it exited."""
    return status & 0x7F


def exit_code_of(status: int) -> int:
    """The exit code of a try with this raw wait status (0 if a signal ended it)."""
    return 0 if status & 0x7F else (status >> 8) & 0xFF


def describe(status: int) -> str:
    """A raw wait status in words: ``exit code 2``, ``signal 9``."""
    sig = status & 0x7F
    return f"signal {sig}" if sig else f"exit code {(status >> 8) & 0xFF}"
