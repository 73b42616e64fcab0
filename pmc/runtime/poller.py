"""The worker's epoll: file descriptors, each with the object it stands for (the
master's socket, a task's pidfd or one of its forwarding pipes, the signal wake-up
pipe), and a wait that returns those objects."""

from __future__ import annotations

import select

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing: see pmc.core.record
if TYPE_CHECKING:
    from typing import Any


class Poller:
    """epoll over file descriptors, each with the object it stands for. ``selectors``
    does the same with key objects and mask maps at ~15 µs more per task (a pidfd is
    added, waited on and removed for every one that runs long enough to need one)."""

    def __init__(self) -> None:
        self.epoll = select.epoll()
        self.data: dict[int, Any] = {}

    def add(self, fd: int, data: Any) -> None:
        self.epoll.register(fd, select.EPOLLIN)
        self.data[fd] = data

    def remove(self, fd: int) -> None:
        self.epoll.unregister(fd)
        del self.data[fd]

    def wait(self, timeout: float | None) -> list[Any]:
        """What became readable within ``timeout`` seconds (None: wait as long as it
        takes); the wait is rounded up to whole milliseconds."""
        data = self.data
        return [data[fd] for fd, _ in self.epoll.poll(-1 if timeout is None else timeout)]
