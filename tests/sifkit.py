"""Open a SIF file the way Apptainer does, without Apptainer: read its header and
descriptors, find the primary system partition, mount that squashfs at its offset
(squashfuse_ll or squashfuse, as unprivileged Apptainer does, or the kernel's squashfs
on a loop device, as setuid Apptainer does; or unpack it into a sandbox directory), and
enter the root file system with the working directory and /tmp bound in (a private mount
namespace, /dev, /proc, /sys, chroot), sourcing the image's /.singularity.d/env scripts
first.


Used by tests/test_sif.py and benchmarks/sifstart.py (which puts this directory on its
path). Needs root for mount namespaces, mounts and chroot.
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

# The SIF global header (github.com/apptainer/sif, little-endian, packed): launch
# script, magic, version, architecture, id; then created, modified, descriptors free and
# total, descriptors' offset and size, data offset and size.
HEADER = struct.Struct("<32s10s3s3s16s8q")
# A descriptor: data type, used, id, group, link, offset, size, size with padding,
# created, modified, uid, gid, name, extra (a partition's: fs type, partition type, arch).
DESCRIPTOR = struct.Struct("<i?IIIqqqqqqq128s384s")
PARTITION_EXTRA = struct.Struct("<ii3s")
MAGIC = b"SIF_MAGIC\0"
DATA_PARTITION = 0x4004
FS_SQUASHFS = 1
PART_PRIMSYS = 2


class Partition(NamedTuple):
    offset: int
    size: int
    fstype: int
    parttype: int
    arch: str


def partitions(sif: Path) -> list[Partition]:
    with open(sif, "rb") as f:
        head = f.read(HEADER.size)
        fields = HEADER.unpack(head)
        if fields[1] != MAGIC:
            raise ValueError(f"{sif}: not a SIF file (magic {fields[1]!r})")
        _, _, _, total, offset, _, _, _ = fields[5:]
        f.seek(offset)
        raw = f.read(DESCRIPTOR.size * total)
    out = []
    for i in range(total):
        d = DESCRIPTOR.unpack_from(raw, i * DESCRIPTOR.size)
        datatype, used, off, size, extra = d[0], d[1], d[5], d[6], d[13]
        if used and datatype == DATA_PARTITION:
            fstype, parttype, arch = PARTITION_EXTRA.unpack_from(extra)
            out.append(Partition(off, size, fstype, parttype, arch.rstrip(b"\0").decode()))
    return out


def system_partition(sif: Path) -> Partition:
    """The partition ``apptainer exec`` runs: the primary system squashfs."""
    found = [p for p in partitions(sif) if p.parttype == PART_PRIMSYS]
    if len(found) != 1 or found[0].fstype != FS_SQUASHFS:
        raise ValueError(f"{sif}: expected one primary system squashfs partition, got {found}")
    return found[0]


@contextlib.contextmanager
def opened(sif: Path, how: str) -> Iterator[Path]:
    """The image's root file system, read-only: ``how`` is "squashfuse_ll" (the
    low-level, multi-threaded squashfuse that unprivileged Apptainer prefers),
    "squashfuse" (its high-level one, Apptainer's fallback), "kernel" or "sandbox"
    (unpacked into a directory, as ``apptainer build --sandbox`` makes one)."""
    part = system_partition(sif)
    where = Path(tempfile.mkdtemp(prefix=f"pmc-sif-{how}.", dir="/var/tmp"))
    root = where / "root"
    root.mkdir()
    try:
        if how in ("squashfuse", "squashfuse_ll"):
            subprocess.run([how, "-o", f"offset={part.offset}", str(sif), str(root)],
                           check=True)
        elif how == "kernel":
            subprocess.run(["mount", "-t", "squashfs", "-o", f"ro,loop,offset={part.offset}",
                            str(sif), str(root)], check=True)
        elif how == "sandbox":
            root.rmdir()
            subprocess.run(["unsquashfs", "-q", "-n", "-o", str(part.offset), "-d", str(root),
                            str(sif)], check=True, stdout=subprocess.DEVNULL)
        else:
            raise ValueError(f"unknown way to open a SIF: {how}")
        yield root
    finally:
        if how in ("squashfuse", "squashfuse_ll", "kernel"):
            # As root, umount ends a FUSE mount too; -d frees the kernel's loop device.
            subprocess.run(["umount", "-d", str(root)], check=False)
        shutil.rmtree(where, ignore_errors=True)


# What `apptainer exec IMAGE CMD...` does for one process: a private mount namespace;
# /dev, /proc, /sys and /tmp (Apptainer's default binds, the working directory being
# under /tmp here) bound in; chroot; the default PATH, then the image's env scripts
# (its action script); back to the working directory; CMD. Launcher variables (PMI_*)
# and inherited descriptors pass through unchanged.
ENTER = """#!/bin/sh
exec unshare --mount --propagation private sh -c '
    set -e
    mount --rbind /dev "$0/dev"
    mount -t proc proc "$0/proc"
    mount --rbind /sys "$0/sys"
    mount --rbind /tmp "$0/tmp"
    cwd=$(pwd)
    exec chroot "$0" /usr/bin/env -u PYTHONPATH -u PYTHONHOME -u VIRTUAL_ENV \\
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
        /.singularity.d/actions/exec sh -c "cd \\"\\$0\\" && exec \\"\\$@\\"" "$cwd" "$@"
' %s "$@"
"""


def enter_script(root: Path, directory: Path) -> Path:
    """A script that runs its arguments inside the image at ``root`` (one call per
    process: an MPI launcher on the host may start it once per rank)."""
    path = directory / "apptainer-exec"
    path.write_text(ENTER % shlex.quote(str(root)))
    path.chmod(0o755)
    return path
