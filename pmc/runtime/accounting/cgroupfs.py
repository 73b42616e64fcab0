"""The kernel's cgroup files for task accounting: where they are (``CGROUP_ROOT``,
``PROC_CGROUP``, ``MOUNTINFO``: tests point them at a fake tree, so the other rooms read
them through this module), how they are read and written, and the sweep of the groups
that dead workers left behind."""

from __future__ import annotations

import os
import re

from pmc import log

CGROUP_ROOT = "/sys/fs/cgroup"  # where the v1 controllers are mounted
PROC_CGROUP = "/proc/self/cgroup"
MOUNTINFO = "/proc/self/mountinfo"  # where the v2 hierarchy is mounted
RESIDUAL_MAX = 2 << 20  # bytes charged to an idle slot group beyond which it is replaced
RO = os.O_RDONLY | os.O_CLOEXEC
WO = os.O_WRONLY | os.O_CLOEXEC
RW = os.O_RDWR | os.O_CLOEXEC


def own_groups() -> dict[str, str]:
    """controller -> this process's group path, from /proc/self/cgroup; the v2 group
    (the ``0::`` line) under ``""``."""
    out: dict[str, str] = {}
    try:
        with open(PROC_CGROUP) as f:
            for line in f:
                hid, ctrls, path = line.rstrip("\n").split(":", 2)
                if hid == "0" and not ctrls:
                    out[""] = path
                for c in ctrls.split(","):
                    if c:
                        out[c] = path
    except (OSError, ValueError):
        pass
    return out


def v2_dir(own: str) -> str:
    """The directory of v2 group ``own``: under the cgroup2 mount that holds it (the mount
    may show a subtree: its root, the 4th field of mountinfo, is cut from the path)."""
    try:
        with open(MOUNTINFO) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise Unavailable(f"cannot read {MOUNTINFO}: {e.strerror}") from None
    for line in lines:
        fields, _, fs = line.partition(" - ")
        if not fs.startswith("cgroup2 "):
            continue
        root, mount = (_unescape(s) for s in fields.split()[3:5])
        root = root.rstrip("/")
        if own == root or own.startswith(root + "/"):
            return mount + own[len(root):].rstrip("/")
    raise Unavailable(f"no cgroup2 mount holds pmc's group {own}")


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)  # \040: a space


def read_file(path: str) -> str:
    with open(path) as f:
        return f.read()


def write_file(path: str, data: bytes) -> None:
    fd = os.open(path, WO)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def keyed(fd: int) -> dict[str, int]:
    """A flat keyed file kept open ("name value" lines: cpu.stat, memory.events)."""
    out = {}
    for line in os.pread(fd, 4096, 0).decode().splitlines():
        name, _, value = line.partition(" ")
        if value.isdigit():
            out[name] = int(value)
    return out


def remove_group(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError as e:
        log.debug(f"Cannot remove cgroup {path}: {e.strerror}")


class Unavailable(Exception):
    """cgroup accounting cannot be used here (the message says why)."""


def sweep(base: str) -> None:
    """Remove the empty groups of workers that are gone: a worker killed with SIGKILL
    (by mpiexec tearing a job down, the OOM killer) cannot remove its own."""
    try:
        names = [n for n in os.listdir(base) if n.startswith("pmc-") and n[4:].isdigit()]
    except OSError:
        return
    for name in names:
        try:
            os.kill(int(name[4:]), 0)
            continue  # a live worker's (or a reused pid's: left alone)
        except ProcessLookupError:
            pass
        except OSError:
            continue
        group = f"{base}/{name}"
        try:
            for sub in os.listdir(group):
                if sub.startswith("slot-") or sub == "worker":
                    os.rmdir(f"{group}/{sub}")
            os.rmdir(group)
        except OSError:
            pass  # processes still in it: not ours to touch
