"""An AMD node whose GPUs amdgpu lost drains as an NVIDIA node whose GPUs CUDA lost does
(issue 39 item 8): the node's runtime is the vendor's GPUs on the PCI bus, whatever amdkfd
still lists, and the AMD GPUs on the bus that amdkfd does not list fail ``gpu.rocm``, on
which the gate answers exit 11 before measuring. Before, a node whose amdgpu failed had no
kfd node, was not even taken as AMD (CUDA's "no driver" answered) and exited 9."""

from __future__ import annotations

import shutil

import pytest

import gdrprobe
from gdrprobe.campaign import machine
from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.doctor.runner import run_doctor
from gdrprobe.errors import SCHEDULER_ACTION, ExitCode, GpuUnusable
from gdrprobe.memory import rocm
from gdrprobe.report.model import Status
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor import rocm_machines

GPU0, GPU1 = "0000:1b:00.0", "0000:2d:00.0"


def lose(tree, *nodes: int) -> None:
    """amdkfd's topology without these GPU nodes (1, 2: GPU0, GPU1); none left: amdgpu failed."""
    for node in nodes:
        shutil.rmtree(tree.path(f"{rocm_machines.KFD_NODES}/{node}"))


def findings(root) -> dict:
    return {f.id: f for f in run_doctor(str(root), environ={}).findings}


def test_a_node_whose_amdgpu_failed_is_still_amds_and_fails_gpu_rocm(tmp_path):
    tree = rocm_machines.mi300x_node(tmp_path)
    lose(tree, 1, 2)
    ctx = DoctorContext(SysRoot(str(tmp_path)), {})
    assert ctx.runtime is rocm.RUNTIME and ctx.nccl_rules.library == "RCCL"
    found = findings(tmp_path)["gpu.rocm"]
    assert found.status is Status.FAIL
    assert found.summary.startswith(f"amdkfd lists 0 of the 2 AMD GPUs on the PCI bus: {GPU0}, "
                                    f"{GPU1} are lost to ROCm")
    assert "no GPU node" in found.evidence[0].value and "dmesg" in found.fix


def test_a_gpu_off_the_bus_for_amdkfd_is_named(tmp_path):
    tree = rocm_machines.mi300x_node(tmp_path)
    lose(tree, 2)
    found = findings(tmp_path)["gpu.rocm"]
    assert found.status is Status.FAIL and f"{GPU1} is lost to ROCm" in found.summary


def test_a_gpu_handed_to_a_virtual_machine_is_not_lost(tmp_path):
    tree = rocm_machines.mi300x_node(tmp_path)
    lose(tree, 2)
    tree.symlink(f"{tree.devices[GPU1]}/driver", "/sys/bus/pci/drivers/vfio-pci")
    assert "gpu.rocm" not in findings(tmp_path)


def test_every_gpu_listed_is_no_finding(tmp_path):
    rocm_machines.mi300x_node(tmp_path)
    assert "gpu.rocm" not in findings(tmp_path)


@pytest.mark.parametrize("call", [gdrprobe.check, gdrprobe.check_node])
def test_the_gate_drains_on_amd_gpus_amdgpu_lost(monkeypatch, tmp_path, call):
    from gdrprobe.measure import loopback

    tree = rocm_machines.mi300x_node(tmp_path)
    lose(tree, 1, 2)
    facts = machine.machine_facts(str(tmp_path), {})
    monkeypatch.setattr(machine, "machine_facts", lambda **_: facts)
    monkeypatch.setattr(loopback, "runner", lambda *a, **k: pytest.fail("a run started"))
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with pytest.raises(GpuUnusable, match="lost to ROCm") as raised:
        call()
    assert raised.value.exit_code == ExitCode.GPU_UNUSABLE
    assert SCHEDULER_ACTION[raised.value.exit_code] == "drain"
