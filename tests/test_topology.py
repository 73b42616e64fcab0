"""pmc.runtime.topology against fake /proc and /sys trees: the GPUs a job gets and the
NUMA node of each, and the NUMA node of each cpu."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pmc.runtime.topology import Gpu, cpu_numa_nodes, gpu_inventory, job_set

NO_PATH = {"PATH": "/nonexistent"}  # no nvidia-smi, whatever the machine has


def nvidia_tree(root: Path, buses: dict[str, str]) -> None:
    """/proc/driver/nvidia/gpus/<bus>/ and the PCI device's numa_node text."""
    for bus, numa in buses.items():
        (root / "proc/driver/nvidia/gpus" / bus).mkdir(parents=True)
        (root / "proc/driver/nvidia/gpus" / bus / "information").write_text("Model: X\n")
        dev = root / "sys/bus/pci/devices" / bus.lower()
        dev.mkdir(parents=True)
        (dev / "numa_node").write_text(numa)


def kfd_tree(root: Path, nodes: list[str]) -> None:
    base = root / "sys/class/kfd/kfd/topology/nodes"
    for i, props in enumerate(nodes):
        (base / str(i)).mkdir(parents=True)
        (base / str(i) / "properties").write_text(props)


def test_nvidia_proc_in_bus_order_with_numa(tmp_path: Path) -> None:
    nvidia_tree(tmp_path, {"0000:af:00.0": "1\n", "0000:3b:00.0": "0\n",
                           "0000:d8:00.0": "-1\n"})
    gpus, how = gpu_inventory(None, NO_PATH, str(tmp_path))
    assert how == "nvidia"
    assert gpus == [Gpu("0", 0), Gpu("1", 1), Gpu("2", None)]


def test_amd_kfd_gpu_nodes_only(tmp_path: Path) -> None:
    # node 0 a CPU (no SIMDs), nodes 1 and 2 GPUs at 0000:c1:00.0 and 0000:41:00.0
    kfd_tree(tmp_path, [
        "cpu_cores_count 64\nsimd_count 0\n",
        f"simd_count 240\nlocation_id {0xc1 << 8}\ndomain 0\n",
        f"simd_count 240\nlocation_id {0x41 << 8}\ndomain 0\n",
    ])
    for bus, numa in (("0000:c1:00.0", "1"), ("0000:41:00.0", "0")):
        dev = tmp_path / "sys/bus/pci/devices" / bus
        dev.mkdir(parents=True)
        (dev / "numa_node").write_text(numa)
    gpus, how = gpu_inventory(None, NO_PATH, str(tmp_path))
    assert (gpus, how) == ([Gpu("0", 1), Gpu("1", 0)], "amd")


def test_job_set_restricts_probe_with_ids_as_the_job_sees_them(tmp_path: Path) -> None:
    nvidia_tree(tmp_path, {f"0000:{b}:00.0": str(n) for b, n in
                           (("1a", 0), ("1b", 0), ("8a", 1), ("8b", 1))})
    env = {**NO_PATH, "CUDA_VISIBLE_DEVICES": "2,3"}
    assert gpu_inventory(None, env, str(tmp_path)) == ([Gpu("2", 1), Gpu("3", 1)], "nvidia")
    # Slurm renumbering inside a device cgroup: physical ids from SLURM_JOB_GPUS
    env = {**NO_PATH, "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_GPUS": "2,3"}
    assert gpu_inventory(None, env, str(tmp_path)) == ([Gpu("0", 1), Gpu("1", 1)], "nvidia")
    # a hint naming devices the probe does not show: ids kept, nodes unknown
    env = {**NO_PATH, "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_GPUS": "6,7"}
    assert gpu_inventory(None, env, str(tmp_path)) == ([Gpu("0", None), Gpu("1", None)],
                                                       "nvidia")


def test_job_set_without_probe_is_the_inventory(tmp_path: Path) -> None:
    for var in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "SLURM_JOB_GPUS",
                "GPU_DEVICE_ORDINAL"):
        gpus, how = gpu_inventory(None, {**NO_PATH, var: "2, 3"}, str(tmp_path))
        assert (gpus, how) == ([Gpu("2", None), Gpu("3", None)], "job"), var
    # a job given none (Slurm's old marker, an empty list): no GPU, not a probe
    assert gpu_inventory(None, {"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, str(tmp_path)) == (
        [], "job")
    assert gpu_inventory(None, {"CUDA_VISIBLE_DEVICES": ""}, str(tmp_path)) == ([], "job")
    # CUDA's rule: the list stops at the first invalid entry
    assert gpu_inventory(None, {"CUDA_VISIBLE_DEVICES": "1,-1,2"}, str(tmp_path))[0] == [
        Gpu("1", None)]


def test_declared_without_and_with_job_set(tmp_path: Path) -> None:
    assert gpu_inventory(4, NO_PATH, str(tmp_path)) == (
        [Gpu(str(i), None) for i in range(4)], "declared")
    assert gpu_inventory(0, NO_PATH, str(tmp_path)) == ([], "declared")
    env = {**NO_PATH, "CUDA_VISIBLE_DEVICES": "2,3,5"}
    assert gpu_inventory(2, env, str(tmp_path)) == ([Gpu("2", None), Gpu("3", None)],
                                                    "declared")
    nvidia_tree(tmp_path, {"0000:3b:00.0": "0", "0000:af:00.0": "1"})
    assert gpu_inventory(1, NO_PATH, str(tmp_path)) == ([Gpu("0", 0)], "declared")


@pytest.mark.parametrize(("declared", "env", "message"), [
    (4, {"CUDA_VISIBLE_DEVICES": "2,3"},
     "--host-gpus 4, but CUDA_VISIBLE_DEVICES gives this job 2 GPUs (2,3)"),
    (1, {"ROCR_VISIBLE_DEVICES": ""},
     "--host-gpus 1, but ROCR_VISIBLE_DEVICES gives this job 0 GPUs (none)"),
    (-1, {}, "--host-gpus -1: the number of GPUs cannot be negative"),
    (None, {"CUDA_VISIBLE_DEVICES": "1,1"}, "CUDA_VISIBLE_DEVICES='1,1' names device 1 twice"),
])
def test_contradictions_are_one_message(tmp_path: Path, declared: int | None,
                                        env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError) as exc:
        gpu_inventory(declared, {**NO_PATH, **env}, str(tmp_path))
    assert str(exc.value) == message


def test_contradictions_with_the_probe(tmp_path: Path) -> None:
    nvidia_tree(tmp_path, {"0000:3b:00.0": "0", "0000:af:00.0": "1"})
    with pytest.raises(ValueError, match=r"^--host-gpus 3, but this host has 2 nvidia GPUs$"):
        gpu_inventory(3, NO_PATH, str(tmp_path))
    with pytest.raises(ValueError, match=r"^CUDA_VISIBLE_DEVICES names GPU 5, but this "
                                         r"host's nvidia devices are 0,1$"):
        gpu_inventory(None, {**NO_PATH, "CUDA_VISIBLE_DEVICES": "5"}, str(tmp_path))
    # a UUID cannot be matched to the probe: kept, node unknown
    env = {**NO_PATH, "CUDA_VISIBLE_DEVICES": "GPU-8f0e2c1a"}
    assert gpu_inventory(None, env, str(tmp_path)) == ([Gpu("GPU-8f0e2c1a", None)], "nvidia")


def test_garbage_files_are_unknown_not_errors(tmp_path: Path) -> None:
    (tmp_path / "proc/driver/nvidia/gpus/not-a-bus").mkdir(parents=True)
    nvidia_tree(tmp_path, {"0000:3b:00.0": "zero\n"})
    kfd_tree(tmp_path, ["\x00\xff garbage", "simd_count lots\n"])
    (tmp_path / "sys/devices/system/node/node0").mkdir(parents=True)
    (tmp_path / "sys/devices/system/node/node0/cpulist").write_text("0-x\n")
    assert gpu_inventory(None, NO_PATH, str(tmp_path)) == ([Gpu("0", None)], "nvidia")
    assert cpu_numa_nodes(str(tmp_path)) == {}
    empty = tmp_path / "empty"
    empty.mkdir()
    assert gpu_inventory(None, NO_PATH, str(empty)) == ([], "none")
    assert cpu_numa_nodes(str(empty)) == {}
    kfd_only = tmp_path / "kfd"
    kfd_tree(kfd_only, ["\x00\xff garbage", "simd_count lots\n", "simd_count 4\n"])
    assert gpu_inventory(None, NO_PATH, str(kfd_only)) == ([Gpu("0", None)], "amd")


def test_cpu_numa_nodes_limited_to_our_cpus(tmp_path: Path) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    base = tmp_path / "sys/devices/system/node"
    top = max(allowed)
    (base / "node0").mkdir(parents=True)
    (base / "node0/cpulist").write_text(f"0-{top // 2}\n" if top else "0\n")
    (base / "node1").mkdir()
    (base / "node1/cpulist").write_text(f"{top // 2 + 1}-{top + 4}\n" if top else "1-4\n")
    (base / "has_cpu").write_text("0-1\n")  # not a node directory
    nodes = cpu_numa_nodes(str(tmp_path))
    assert sorted(nodes) == allowed
    assert all(nodes[c] == (0 if c <= top // 2 else 1) for c in allowed)
    (base / "node1/cpulist").write_text(f"0-{top + 4}\n")  # cpu 0 on two nodes
    assert cpu_numa_nodes(str(tmp_path)) == {}


def test_job_set_order_of_variables() -> None:
    env = {"SLURM_JOB_GPUS": "4,5", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert job_set(env) == ("CUDA_VISIBLE_DEVICES", ["0", "1"])
    assert job_set({}) is None


def fake_smi(tmp_path: Path, body: str) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + body)
    smi.chmod(0o755)
    return {"PATH": str(bin_dir)}


needs_no_nvidia_driver = pytest.mark.skipif(
    os.path.isdir("/proc/driver/nvidia/gpus"), reason="this host's NVIDIA driver answers first")


@needs_no_nvidia_driver
def test_nvidia_smi_when_the_driver_files_are_absent(tmp_path: Path) -> None:
    env = fake_smi(tmp_path, 'echo "0, 00000000:3B:00.0"\necho "1, 00000000:AF:00.0"\n')
    gpus, how = gpu_inventory(None, env, "/")
    assert how == "nvidia"
    assert [g.id for g in gpus] == ["0", "1"]  # nodes: whatever this host's sysfs says


@needs_no_nvidia_driver
@pytest.mark.parametrize("body", [
    'echo "NVIDIA-SMI has failed because it could not communicate with the driver"\nexit 9\n',
    "echo 'garbage, more, fields'\n",
    "exec sleep 30\n",
])
def test_nvidia_smi_failing_or_hanging_is_no_gpu(tmp_path: Path, body: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import pmc.runtime.topology as topology
    monkeypatch.setattr(topology, "_NVIDIA_SMI_TIMEOUT", 0.5)
    env = fake_smi(tmp_path, body)
    if os.path.isdir("/sys/class/kfd/kfd/topology/nodes"):
        pytest.skip("this host has an AMD kfd topology")
    assert gpu_inventory(None, env, "/") == ([], "none")


def test_a_fake_tree_never_runs_nvidia_smi(tmp_path: Path) -> None:
    env = fake_smi(tmp_path, f"touch {tmp_path}/ran\necho '0, 00000000:3B:00.0'\n")
    tree = tmp_path / "root"
    tree.mkdir()
    assert gpu_inventory(None, env, str(tree)) == ([], "none")
    assert not (tmp_path / "ran").exists()
