"""Ending a job whose ranks were given up on: the master's last lines are read by the
launcher before the abort (pmc.transport.jobend.drained), whether they go through a pipe
(Hydra, Open MPI) or a socket."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

from pmc.transport.jobend import drained


def test_a_pipe_not_read_holds_the_abort_for_the_window_only() -> None:
    r, w = os.pipe()
    try:
        os.write(w, b"[error] Workflow failed\n")
        assert not drained((w,), 0.05)
    finally:
        os.close(r)
        os.close(w)


def test_the_abort_waits_until_the_launcher_has_read_the_last_lines() -> None:
    r, w = os.pipe()
    got: list[bytes] = []

    def launcher() -> None:
        threading.Event().wait(0.2)  # busy elsewhere for a moment
        got.append(os.read(r, 4096))

    reader = threading.Thread(target=launcher)
    try:
        os.write(w, b"[error] Workflow failed\n")
        reader.start()
        assert drained((w,), 10)
        assert got == [b"[error] Workflow failed\n"]
    finally:
        reader.join()
        os.close(r)
        os.close(w)


def test_a_socket_is_drained_once_its_peer_has_read_everything() -> None:
    master, launcher = socket.socketpair()
    with master, launcher:
        master.sendall(b"x" * 1000)
        assert not drained((master.fileno(),), 0.05)
        assert len(launcher.recv(4096)) == 1000
        assert drained((master.fileno(),), 10)


def test_files_terminals_and_closed_descriptors_have_nothing_to_wait_for(
        tmp_path: Path) -> None:
    with open(tmp_path / "log", "w") as f:
        f.write("line\n")
        f.flush()
        r, w = os.pipe()
        os.close(r)
        os.close(w)
        assert drained((f.fileno(), w), 0)
