"""What hardware a host has for this job: its GPUs (probed from the NVIDIA driver, the AMD
kfd topology, the batch system's device variables, or declared with --host-gpus), the
NUMA node of each, and the NUMA node of each cpu this process may use. Only reading: no
decisions. Unknown facts are reported as unknown (an empty inventory, a None node), never
guessed; what contradicts itself is a ValueError with one message."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from os.path import join

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing: see pmc.core.record
if TYPE_CHECKING:
    from typing import NamedTuple
else:
    from pmc.core.record import NamedTuple


# Plain strings for paths, a NamedTuple for the record: every worker imports this module
# as it starts, and pathlib and dataclasses would add ~10 ms of imports to each.
class Gpu(NamedTuple):
    id: str            # the id as the job sees it ("2" when the job was given 2,3)
    numa: int | None   # NUMA node of the device from sysfs, None if unknown


# The batch system's (or an outer launcher's) device variables, most specific first:
# CUDA_VISIBLE_DEVICES and ROCR_VISIBLE_DEVICES are what the GPU runtimes obey, so their
# ids are the ones the job's programs see; SLURM_JOB_GPUS and GPU_DEVICE_ORDINAL name
# the same devices where the runtime variables are not set.
JOB_SET_VARIABLES = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL",
                     "SLURM_JOB_GPUS")

# Compiled at its first match (re caches it), not at import: a host without GPUs never
# needs it.
_BUS_ID = r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$"
_NVIDIA_SMI_TIMEOUT = 10.0


def _read(*path: str) -> str | None:
    try:
        with open(join(*path), errors="replace") as f:
            return f.read()
    except (OSError, ValueError):
        return None


def _pci_numa(root: str, bus_id: str) -> int | None:
    """The NUMA node sysfs gives the PCI device (None: unknown, or -1: no affinity)."""
    m = re.match(_BUS_ID, bus_id.strip())
    if m is None:
        return None
    domain, bus, dev, fn = m.groups()
    name = f"{int(domain, 16):04x}:{bus.lower()}:{dev.lower()}.{fn}"
    text = _read(root, "sys/bus/pci/devices", name, "numa_node")
    try:
        node = int(text.strip()) if text is not None else -1
    except ValueError:
        return None
    return node if node >= 0 else None


def job_set(env: Mapping[str, str]) -> tuple[str, list[str]] | None:
    """The devices the batch system gave the job: (variable, ids), or None when no
    variable names any. An empty list is a job given none. As CUDA does, the list stops
    at its first invalid entry (Slurm's "NoDevFiles", "-1")."""
    for var in JOB_SET_VARIABLES:
        value = env.get(var)
        if value is None:
            continue
        ids: list[str] = []
        for raw in value.split(","):
            item = raw.strip()
            if not item:
                continue
            if item in ("NoDevFiles", "-1") or item.startswith("-"):
                break
            if item in ids:
                raise ValueError(f"{var}={value!r} names device {item} twice")
            ids.append(item)
        return var, ids
    return None


def _nvidia_proc(root: str) -> list[Gpu] | None:
    base = join(root, "proc/driver/nvidia/gpus")
    try:
        names = sorted(n for n in os.listdir(base) if re.match(_BUS_ID, n))
    except OSError:
        return None
    if not names:
        return None
    # The driver's device index (nvidia-smi's, and CUDA's with
    # CUDA_DEVICE_ORDER=PCI_BUS_ID) follows the PCI bus order.
    names.sort(key=lambda n: tuple(int(p, 16) for p in re.split(r"[:.]", n)))
    return [Gpu(str(i), _pci_numa(root, n)) for i, n in enumerate(names)]


def _on_path(name: str, path: str) -> str | None:
    """``shutil.which`` for a plain name, without shutil's imports (bz2, lzma: every
    worker rank looks for nvidia-smi at start)."""
    for folder in path.split(os.pathsep):
        exe = join(folder or os.curdir, name)
        if os.access(exe, os.X_OK) and not os.path.isdir(exe):
            return exe
    return None


def _nvidia_smi(env: Mapping[str, str]) -> list[Gpu] | None:
    exe = _on_path("nvidia-smi", env.get("PATH", os.defpath))
    if exe is None:
        return None
    import subprocess  # only where there is an nvidia-smi to run

    try:
        proc = subprocess.run(
            [exe, "--query-gpu=index,pci.bus_id", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=_NVIDIA_SMI_TIMEOUT, check=False,
            stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    gpus: list[Gpu] = []
    for line in proc.stdout.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 2 or not fields[0].isdigit():
            continue
        gpus.append(Gpu(fields[0], _pci_numa("/", _short_bus_id(fields[1]))))
    return gpus or None


def _short_bus_id(bus_id: str) -> str:
    # nvidia-smi writes an 8-digit domain ("00000000:3B:00.0"); sysfs has 4.
    m = re.match(_BUS_ID, bus_id)
    if m is None:
        return bus_id
    domain, bus, dev, fn = m.groups()
    return f"{int(domain, 16):04x}:{bus}:{dev}.{fn}"


def _properties(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return out


def _amd_kfd(root: str) -> list[Gpu] | None:
    base = join(root, "sys/class/kfd/kfd/topology/nodes")
    try:
        nodes = sorted((n for n in os.listdir(base) if n.isdigit()), key=int)
    except OSError:
        return None
    gpus: list[Gpu] = []
    for node in nodes:
        text = _read(base, node, "properties")
        props = _properties(text) if text is not None else {}
        # CPU nodes have no SIMD units; a GPU node has a non-zero gpu_id.
        if props.get("simd_count", 0) <= 0:
            continue
        gpu_id = _read(base, node, "gpu_id")
        if gpu_id is not None and gpu_id.strip() == "0":
            continue
        numa = None
        if "location_id" in props:
            loc = props["location_id"]
            bus_id = (f"{props.get('domain', 0):04x}:{(loc >> 8) & 0xff:02x}:"
                      f"{(loc >> 3) & 0x1f:02x}.{loc & 0x7}")
            numa = _pci_numa(root, bus_id)
        # ROCR_VISIBLE_DEVICES counts GPU nodes only, in node order.
        gpus.append(Gpu(str(len(gpus)), numa))
    return gpus or None


def probe_gpus(env: Mapping[str, str] = os.environ,
               root: str = "/") -> tuple[list[Gpu], str]:
    """Every GPU the host's drivers show, and which driver ("nvidia", "amd", "none")."""
    nvidia = _nvidia_proc(root)
    if nvidia is None and os.path.realpath(root) == "/":
        nvidia = _nvidia_smi(env)  # a fake tree has no nvidia-smi of its own
    if nvidia:
        return nvidia, "nvidia"
    amd = _amd_kfd(root)
    if amd:
        return amd, "amd"
    return [], "none"


def _restrict(probed: list[Gpu], source: str, var: str, ids: list[str],
              env: Mapping[str, str]) -> list[Gpu]:
    by_id = {g.id: g for g in probed}
    # Where Slurm renumbers CUDA_VISIBLE_DEVICES inside a device cgroup, SLURM_JOB_GPUS
    # still names the physical devices, in the same order: use them for the NUMA nodes.
    physical = ids
    slurm = job_set({"SLURM_JOB_GPUS": env["SLURM_JOB_GPUS"]}) if (
        var != "SLURM_JOB_GPUS" and "SLURM_JOB_GPUS" in env) else None
    if slurm is not None and len(slurm[1]) == len(ids):
        physical = slurm[1]
    out: list[Gpu] = []
    for seen, phys in zip(ids, physical, strict=True):
        if phys in by_id:
            out.append(Gpu(seen, by_id[phys].numa))
        elif seen in by_id and physical is not ids:
            out.append(Gpu(seen, None))  # the Slurm hint names no probed device
        elif seen.isdigit():
            have = ",".join(g.id for g in probed)
            raise ValueError(f"{var} names GPU {seen}, but this host's {source} devices "
                             f"are {have}")
        else:
            out.append(Gpu(seen, None))  # a UUID or MIG name: kept, node unknown
    return out


def gpu_inventory(declared: int | None, env: Mapping[str, str] = os.environ,
                  root: str = "/") -> tuple[list[Gpu], str]:
    """The host's GPUs for this job and how they were found ("declared", "nvidia",
    "amd", "job", "none"). `declared` is --host-gpus N (None: probe). Probing: NVIDIA
    via `nvidia-smi` or <root>/proc/driver/nvidia/gpus, AMD via the kfd topology in
    <root>/sys/class/kfd/kfd/topology/nodes; limited to the job's own set when the batch
    system gives one (CUDA_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES, SLURM_JOB_GPUS,
    GPU_DEVICE_ORDINAL); where no device can be probed the job's set is the inventory.
    Declared N: the job's set's first N ids when there is one, else 0..N-1.
    Raises ValueError (one clear message) for contradictions (e.g. --host-gpus 4 with
    a job set of 2)."""
    if declared is not None and declared < 0:
        raise ValueError(f"--host-gpus {declared}: the number of GPUs cannot be negative")
    given = job_set(env)
    probed, source = probe_gpus(env, root)
    if given is not None:
        var, ids = given
        found = _restrict(probed, source, var, ids, env) if probed else [
            Gpu(i, None) for i in ids]
        if not probed:
            source = "job"
    else:
        found = probed
    if declared is None:
        return found, source
    if given is not None:
        var, ids = given
        if declared > len(ids):
            raise ValueError(f"--host-gpus {declared}, but {var} gives this job "
                             f"{len(ids)} GPU{'s' if len(ids) != 1 else ''}"
                             f" ({','.join(ids) or 'none'})")
        return found[:declared], "declared"
    if probed and declared > len(probed):
        raise ValueError(f"--host-gpus {declared}, but this host has {len(probed)} "
                         f"{source} GPU{'s' if len(probed) != 1 else ''}")
    return [probed[i] if i < len(probed) else Gpu(str(i), None)
            for i in range(declared)], "declared"


def _cpulist(text: str) -> list[int] | None:
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            return None
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            return None
        cpus.extend(range(first, last + 1))
    return cpus


def cpu_numa_nodes(root: str = "/") -> dict[int, int]:
    """cpu id -> NUMA node from <root>/sys/devices/system/node/node*/cpulist (empty if
    unknown), limited to the cpus this process may use."""
    base = join(root, "sys/devices/system/node")
    try:
        names = [n for n in os.listdir(base) if re.fullmatch(r"node\d+", n)]
    except OSError:
        return {}
    allowed = os.sched_getaffinity(0)
    out: dict[int, int] = {}
    for name in names:
        text = _read(base, name, "cpulist")
        cpus = _cpulist(text) if text is not None else None
        if cpus is None:
            return {}  # one node unreadable: the map would be wrong, so it is unknown
        for cpu in cpus:
            if cpu in out:
                return {}  # a cpu on two nodes: sysfs is not to be believed
            out[cpu] = int(name[4:])
    return {c: n for c, n in sorted(out.items()) if c in allowed}
