"""Starting one task's process: ``posix_spawn`` (no Python between fork and exec) in its
own process group, or ``Popen`` with a pre-exec hook for a task that needs an
address-space limit or a cpu binding; and the reference's rules for the file a command
names, for the message of a start that failed."""

from __future__ import annotations

import os
import resource
import signal
from collections.abc import Callable

from pmc.core.protocol import TaskSpec

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing: see pmc.core.record
if TYPE_CHECKING:
    import subprocess

# Reset to their defaults in every task: the worker ignores SIGTTOU (see Worker) and
# catches SIGTERM and SIGINT; Python ignores SIGPIPE.
_TASK_SIGDEF = (signal.SIGPIPE, signal.SIGTERM, signal.SIGINT, signal.SIGTTOU)
_STDIN = (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)


def spawn(spec: TaskSpec, path: str | None, argv: list[str], env: dict[str, str],
          out_fd: int, err_fd: int, moves: list[tuple[int, int]], bind: bool,
          rlimit: bool, sigmask: set[int]) -> tuple[int, subprocess.Popen[bytes] | None]:
    """Start the task's process in its own process group (same session), with signals
    ``sigmask`` blocked; ``path``: the file to run, None for argv[0] searched in PATH.
    Bound to its cpus (``bind``) or limited to its -m (``rlimit``), through a pre-exec
    hook. Returns its pid, and its ``Popen`` where one started it."""
    if bind or rlimit:
        import subprocess  # only here: a worker whose tasks need none saves its import

        popen = subprocess.Popen(
            argv, executable=path, env=env, stdin=subprocess.DEVNULL, stdout=out_fd,
            stderr=err_fd,
            close_fds=False,  # every fd of the worker is close-on-exec already
            process_group=0, preexec_fn=_limits(spec, bind, rlimit, moves, sigmask),
        )
        return popen.pid, popen
    actions = [_STDIN, (os.POSIX_SPAWN_DUP2, out_fd, 1), (os.POSIX_SPAWN_DUP2, err_fd, 2)]
    if moves:  # -f pipes' write ends, into place
        actions += [(os.POSIX_SPAWN_DUP2, high, target) for high, target in moves]
    pid = (os.posix_spawnp if path is None else os.posix_spawn)(
        argv[0] if path is None else path, argv, env,
        file_actions=actions,
        setpgroup=0,
        setsigdef=_TASK_SIGDEF,
        setsigmask=sigmask,
    )
    return pid, None


def _limits(spec: TaskSpec, bind: bool, rlimit: bool, moves: list[tuple[int, int]],
            sigmask: set[int]) -> Callable[[], None]:
    affinity = spec.affinity if bind else None
    limit = spec.memory * 1024 * 1024 if rlimit else 0

    def apply() -> None:
        for high, target in moves:
            os.dup2(high, target)  # inheritable, unlike the source
        if affinity:
            os.sched_setaffinity(0, affinity)
        if limit:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        signal.signal(signal.SIGTTOU, signal.SIG_DFL)  # ignored by the worker
        signal.pthread_sigmask(signal.SIG_SETMASK, sigmask)

    return apply


def is_executable(path: str) -> bool:
    """A regular file this process may execute (the reference's test)."""
    return os.path.isfile(path) and os.access(path, os.X_OK)


def exec_path(name: str) -> str:
    """The file the reference would have tried to execute for argv[0] ``name``: as
    given if it has a slash or is an executable file here, else the first executable
    file of that name in PATH, else the name itself. Only for the message of a failed
    start."""
    if not name or "/" in name or is_executable(name):
        return name
    for d in os.environ.get("PATH", "").split(":"):
        if d and is_executable(f"{d}/{name}"):
            return f"{d}/{name}"
    return name
