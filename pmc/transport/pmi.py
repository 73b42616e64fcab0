"""The launcher's key-value store without MPI: a PMI-1 client on the socket that
MPICH's Hydra (``mpiexec``) gives every rank it starts (``PMI_FD``).

PMI is how an MPI library's ranks find each other: each puts its address in the job's
key-value store, all meet at a barrier, each reads the others'. pmc needs it only where
every rank is on one host (``pmc.transport.onehost``), to pass one value from the
master to its workers: the ranks then never load MPI. The wire protocol is PMI-1's
lines of ``key=value`` words (``cmd=put kvsname=K key=k value=v``), which Hydra has
spoken since MPICH2, and which MPICH's own PMI client speaks too: a rank that has used
it can still start MPI afterwards (the connection stays open, and ``MPI_Init`` says
``cmd=init`` again).
"""

from __future__ import annotations

import socket

FINALIZE_WAIT = 10.0  # seconds


class PmiError(OSError):
    """The launcher refused a request, or its socket broke."""


class Pmi:
    """This rank's connection to the launcher (its descriptor, ``PMI_FD``)."""

    def __init__(self, fd: int) -> None:
        self.sock = socket.socket(fileno=fd)
        self.buf = b""
        self.owed = 0  # answers to requests sent without waiting (barrier_in)
        try:
            self.ask("cmd=init pmi_version=1 pmi_subversion=1")
            self.kvs = self.ask("cmd=get_my_kvsname")["kvsname"]
        except (OSError, KeyError) as e:
            self.sock.detach()  # the launcher's descriptor, not ours to close
            raise PmiError(f"no PMI-1 key-value store on descriptor {fd}: {e}") from e

    def ask(self, line: str) -> dict[str, str]:
        """Send one request, return the words of its answer (PmiError if rc != 0)."""
        while self.owed:
            self._answer(line)
            self.owed -= 1
        self.sock.sendall(line.encode() + b"\n")
        return self._answer(line)

    def _answer(self, line: str) -> dict[str, str]:
        while b"\n" not in self.buf:
            data = self.sock.recv(4096)
            if not data:
                raise PmiError(f"the launcher closed the PMI socket at {line.split()[0]}")
            self.buf += data
        answer, _, self.buf = self.buf.partition(b"\n")
        words = dict(w.partition("=")[::2] for w in answer.decode().split())
        if words.get("rc", "0") != "0":
            raise PmiError(f"the launcher refused {line.split()[0]}: {answer.decode()}")
        return words

    def put(self, key: str, value: str) -> None:
        """``value`` (no spaces) under ``key``, for the others after the barrier."""
        self.ask(f"cmd=put kvsname={self.kvs} key={key} value={value}")

    def barrier(self, wait: bool = True) -> None:
        """Meet every rank of the job: wait (blocked in a read: no cpu) until all are
        here; or, without ``wait``, go on and take the answer before the next request's:
        the others go on once all are here, and the values put before are theirs."""
        if wait:
            self.ask("cmd=barrier_in")
        else:
            self.sock.sendall(b"cmd=barrier_in\n")
            self.owed += 1

    def get(self, key: str) -> str:
        return self.ask(f"cmd=get kvsname={self.kvs} key={key}")["value"]

    def abort(self, code: int) -> None:
        """Have the launcher end every rank and exit with ``code``."""
        self.sock.sendall(b"cmd=abort exitcode=%d\n" % code)

    def finalize(self) -> None:
        """Leave the store (the socket stays the launcher's: it is not closed). Every
        rank that came in must leave before it exits: Hydra ends the job of one that
        does not. A barrier not yet met (a rank that never came) is waited for a while,
        not for ever."""
        self.sock.settimeout(FINALIZE_WAIT)
        try:
            self.ask("cmd=finalize")
        except OSError:
            pass  # the launcher is going anyway
        self.sock.detach()

    def release(self) -> None:
        """Hand the connection on to the MPI library, which will say ``init`` again."""
        self.sock.detach()
