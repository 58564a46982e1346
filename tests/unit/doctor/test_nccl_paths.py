"""NCCL's path types and the NIC it picks, where the doctor disagreed with NCCL's source
(NVIDIA/nccl 2.30.7): Broadcom switches flattened (src/graph/topo.cc getBcmGen,
ncclTopoFlattenBcmSwitches), and paths on which GDR is off routed through the CPU before the
NIC is chosen (src/graph/paths.cc ncclTopoComputePaths, addInterStep; the choice
src/graph/topo.cc ncclTopoGetLocal, ncclTopoGetLocalNetType). Each docstring says what the
doctor answered before."""

from __future__ import annotations

import pytest

from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.doctor.runner import run_doctor
from gdrprobe.nccl.decision import decide
from gdrprobe.nccl.topo import bcm_gen, pci_device_id
from gdrprobe.nccl.versions import NcclRules
from gdrprobe.report.model import Status
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor import nccl_machines


def context(tmp_path, **environ) -> DoctorContext:
    return DoctorContext(SysRoot(str(tmp_path)), environ)


def by_gpu(tmp_path, **environ):
    return {d.gpu_bdf: d for d in context(tmp_path, **environ).nccl_decisions}


# ---- Broadcom switches that show one switch as two levels --------------------------------------


@pytest.mark.parametrize("ids, gen", [(nccl_machines.BCM_GEN5_TOP, 5), (nccl_machines.BCM_GEN4, 4),
                                      (nccl_machines.BCM_GEN5_SUB, 0), (nccl_machines.PLX_SWITCH, 0)])
def test_bcm_gen_reads_the_packed_ids_as_nccl_does(ids, gen):
    assert bcm_gen(pci_device_id(*(f"0x{part:04x}" for part in ids)), 0) == gen


@pytest.mark.parametrize("top, sub", [(nccl_machines.BCM_GEN5_TOP, nccl_machines.BCM_GEN5_SUB),
                                      (nccl_machines.BCM_GEN4, nccl_machines.BCM_GEN4)])
def test_gpu_and_nic_under_one_broadcom_switch_are_pix_and_keep_gdr_at_level_pix(tmp_path, top, sub):
    """Was: PXB (two switch levels), so NCCL_NET_GDR_LEVEL=PIX turned GDR off."""
    nccl_machines.two_level_switch(tmp_path, top, sub)
    (choice,) = context(tmp_path, NCCL_NET_GDR_LEVEL="PIX").nccl_decisions
    assert (choice.nic, choice.path_type, choice.gdr_write, choice.gdr_read) == ("mlx5_0", "PIX", True, True)
    distance = next(f for f in run_doctor(str(tmp_path), environ={}).findings if f.id == "topology.distance")
    assert distance.status is Status.OK and ": PXB (NCCL class PIX)" in distance.summary


def test_two_levels_of_another_vendor_stay_pxb(tmp_path):
    nccl_machines.two_level_switch(tmp_path, nccl_machines.PLX_SWITCH, nccl_machines.PLX_SWITCH)
    (choice,) = context(tmp_path, NCCL_NET_GDR_LEVEL="PIX").nccl_decisions
    assert (choice.path_type, choice.detour_from, choice.gdr_write) == ("PHB", "PXB", False)


@pytest.mark.parametrize("top, sub, version, path_type", [
    (nccl_machines.BCM_GEN5_TOP, nccl_machines.BCM_GEN5_SUB, (2, 19, 3), "PXB"),   # Gen5 from 2.20.3
    (nccl_machines.BCM_GEN4, nccl_machines.BCM_GEN4, (2, 19, 3), "PIX"),          # same ids: 2.9.6 on
    (nccl_machines.BCM_GEN4, nccl_machines.BCM_GEN4, (2, 8, 4), "PXB")])
def test_flattening_follows_the_nccl_release(tmp_path, top, sub, version, path_type):
    nccl_machines.two_level_switch(tmp_path, top, sub)
    ctx = context(tmp_path)
    (choice,) = decide(ctx.nccl_node, {}, NcclRules(version))
    assert choice.path_type == path_type


# ---- a path without GDR goes through the CPU, and NICs tie -------------------------------------


def test_gdr_off_on_the_nearest_path_makes_nics_tie_and_the_tie_break_picks_another(tmp_path):
    """Was: GPU1 kept mlx5_0, its only PXB NIC, with GDR off at NCCL_NET_GDR_LEVEL=PIX. NCCL
    routes that path through the CPU (PHB), so mlx5_0 and mlx5_1 tie for GPU1 and for GPU0,
    two GPUs are local to mlx5_0 and GPU1 (NVML index 1) starts at NIC 1 % 2 = 1: mlx5_1."""
    nccl_machines.detour_tie(tmp_path)
    gpu0, gpu1 = "0000:04:00.0", "0000:1d:00.0"
    default = by_gpu(tmp_path)
    assert (default[gpu1].nic, default[gpu1].path_type, default[gpu1].gdr_write) == ("mlx5_0", "PXB", True)
    found = by_gpu(tmp_path, NCCL_NET_GDR_LEVEL="PIX")
    assert (found[gpu1].nic, found[gpu1].path_type, found[gpu1].candidates) == ("mlx5_1", "PHB", ("mlx5_0", "mlx5_1"))
    assert (found[gpu0].nic, found[gpu0].candidates) == ("mlx5_0", ("mlx5_0", "mlx5_1"))
    assert any(why.startswith("mlx5_0: GDR is off on its PXB path (path PXB is beyond the GDR level PIX")
               and why.endswith("so NCCL routes it through the CPU: PHB (paths.cc ncclTopoComputePaths)")
               for why in found[gpu1].why)


def test_a_nic_that_can_do_no_gdr_loses_to_a_farther_nic_that_can(tmp_path):
    """Was: mlx5_0 (PIX, its DMA-BUF probe fails, no peer memory) with GDR off: a FAIL. NCCL
    routes the GDR-less path through the CPU, so mlx5_1 (PXB, GDR on) wins."""
    nccl_machines.nearest_nic_without_gdr(tmp_path)
    report = run_doctor(str(tmp_path), environ={})
    (choice,) = report.nccl
    assert (choice.nic, choice.path_type, choice.gdr_write, choice.gdr_read) == ("mlx5_1", "PXB", True, True)
    assert any(why.startswith("mlx5_0: GDR is off on its PIX path (NCCL says \"GPU Direct RDMA Disabled for HCA\"")
               for why in choice.why)
    found = {f.id: f for f in report.findings}
    assert found["nccl.gpu.0000:1b:00.0"].status is Status.OK
    assert found["stack.path"].status is Status.FAIL and "mlx5_0" in found["stack.path"].summary
