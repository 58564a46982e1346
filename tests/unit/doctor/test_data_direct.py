"""mlx5 data-direct NICs as NCCL opens them (NVIDIA/nccl ``src/transport/net_ib/init.cc``
ncclIbInitDevices, 2.27.3 on, ``net_ib/reg.cc``) on the GB300-like fixture tray. Before
issue 34 the doctor placed every NIC at its RDMA device's PCI function and knew no
``<dev>_dma``: GPU0 went to mlx5_0 over P2C, with no data-direct finding."""

from __future__ import annotations

import pytest

from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.doctor.runner import run_doctor
from gdrprobe.nccl import data_direct
from gdrprobe.nccl.decision import decide
from gdrprobe.nccl.versions import NcclRules
from gdrprobe.report import finding_ids as ids
from gdrprobe.report.model import Status, to_dict
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor import data_direct_machines as machines

GPU0, GPU1 = "0008:03:00.0", "0009:03:00.0"
DMA0, DMA1 = "0008:04:00.0", "0009:04:00.0"


def context(root, **environ) -> DoctorContext:
    return DoctorContext(SysRoot(str(root)), environ)


def nets(root, version=None, **environ) -> list[tuple[str, str, str]]:
    ctx = context(root, **environ)
    return [(d.net, d.path_type, d.gdr_mode) for d in decide(ctx.nccl_node, ctx.environ, NcclRules(version))]


def finding(report, finding_id):
    return next(f for f in report.findings if f.id == finding_id)


def test_by_default_each_gpu_sends_through_its_data_direct_device_beside_it(tmp_path):
    machines.gb300_tray(tmp_path)
    report = run_doctor(str(tmp_path), environ={})
    gpu0 = report.nccl[0]
    assert (gpu0.nic, gpu0.net, gpu0.path_type, gpu0.data_direct) == ("mlx5_0", "mlx5_0_dma", "PIX", DMA0)
    assert (gpu0.gdr_write, gpu0.gdr_read, gpu0.gdr_mode, gpu0.mechanism) == (True, True, "pci", "dmabuf")
    assert "MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT" in gpu0.mechanism_reason
    assert any("mlx5_0_dma is mlx5_0's data-direct device, placed at 0008:04:00.0" in why for why in gpu0.why)
    assert to_dict(report)["nccl"][1]["data_direct"] == DMA1
    used = finding(report, ids.NCCL_DATA_DIRECT)
    assert used.status is Status.OK and "mlx5_0, mlx5_1" in used.summary
    distance = [f for f in report.findings if f.id == ids.TOPOLOGY_DISTANCE]
    assert [f.status for f in distance] == [Status.OK, Status.OK] and "mlx5_0_dma (0008:04:00.0" in distance[0].summary
    assert not [f for f in report.findings if f.status is Status.FAIL]


@pytest.mark.parametrize("setting, expected", [
    ("0", [("mlx5_0", "P2C", "default"), ("mlx5_1", "P2C", "default")]),
    ("-1", [("mlx5_0", "P2C", "default"), ("mlx5_1", "P2C", "default")]),
    ("1", [("mlx5_0_dma", "PIX", "pci"), ("mlx5_1_dma", "PIX", "pci")]),
    ("2", [("mlx5_0_dma", "PIX", "pci"), ("mlx5_1_dma", "PIX", "pci")]),   # both open, PIX beats P2C
    ("7", [("mlx5_0_dma", "PIX", "pci"), ("mlx5_1_dma", "PIX", "pci")])])
def test_nccl_ib_data_direct_chooses_the_devices_nccl_opens(tmp_path, setting, expected):
    machines.gb300_tray(tmp_path)
    assert nets(tmp_path, NCCL_IB_DATA_DIRECT=setting) == expected


@pytest.mark.parametrize("version, setting, faces", [
    ((2, 26, 6), None, ("ordinary",)), ((2, 26, 6), "2", ("ordinary",)),
    ((2, 27, 3), None, ("ordinary", "data-direct")), ((2, 27, 3), "-1", ("ordinary", "data-direct")),
    ((2, 27, 7), "0", ("ordinary",)),
    ((2, 28, 3), None, ("data-direct",)), ((2, 28, 3), "2", ("ordinary", "data-direct")),
    ((2, 28, 3), "-1", ("ordinary",)), ((2, 30, 7), "0", ("ordinary",))])
def test_which_faces_each_release_opens(version, setting, faces):
    environ = {} if setting is None else {data_direct.VARIABLE: setting}
    assert data_direct.exposed(NcclRules(version), environ) == faces


def test_nccl_before_2_27_3_ignores_data_direct(tmp_path):
    machines.gb300_tray(tmp_path)
    # 2.26 has no P2C and NCCL_NET_GDR_C2C defaults to 0 there: PHB without GPUDirect.
    assert nets(tmp_path, (2, 26, 6)) == [("mlx5_0", "PHB", "disabled"), ("mlx5_1", "PHB", "disabled")]
    # 2.27.x opens both faces: the data-direct one is nearer.
    assert nets(tmp_path, (2, 27, 3))[0] == ("mlx5_0_dma", "PIX", "pci")


def test_data_direct_available_but_turned_off_is_a_warning_with_the_setting(tmp_path):
    machines.gb300_tray(tmp_path)
    report = run_doctor(str(tmp_path), environ={"NCCL_IB_DATA_DIRECT": "0"})
    unused = finding(report, ids.NCCL_DATA_DIRECT)
    assert unused.status is Status.WARN and unused.summary.startswith("data-direct available but not used")
    assert "NCCL_IB_DATA_DIRECT=0" in unused.evidence[0].value and "2.27.6" in unused.fix


def test_a_gpu_on_another_domains_data_direct_device_is_flagged(tmp_path):
    machines.gb300_tray(tmp_path)
    report = run_doctor(str(tmp_path), environ={"NCCL_IB_HCA": "mlx5_1"})
    mismatch = finding(report, ids.nccl_data_direct_domain(GPU0))
    assert mismatch.status is Status.WARN and "PCI domain 0009, not the GPU's (0008)" in mismatch.summary
    assert not [f for f in report.findings if f.id == ids.nccl_data_direct_domain(GPU1)]


def test_without_libmlx5_or_without_a_path_the_nics_are_ordinary(tmp_path):
    tree = machines.gb300_tray(tmp_path)
    machines.data_direct_probe(tree, error="cannot load libmlx5.so.1 (not found)")
    report = run_doctor(str(tmp_path), environ={})
    assert [d.net for d in report.nccl] == ["mlx5_0", "mlx5_1"]
    assert not [f for f in report.findings if f.id == ids.NCCL_DATA_DIRECT]
    assert "libmlx5" in context(tmp_path).data_direct_probes["mlx5_0"].reason
    machines.data_direct_probe(tree, {"mlx5_0": machines.not_data_direct(), "mlx5_1": {"mlx5": False}})
    assert [d.net for d in run_doctor(str(tmp_path), environ={}).nccl] == ["mlx5_0", "mlx5_1"]


def test_a_capture_without_the_probe_replays_as_no_data_direct(tmp_path):
    machines.gb300_tray(tmp_path, probe=False)
    assert [d.net for d in run_doctor(str(tmp_path), environ={}).nccl] == ["mlx5_0", "mlx5_1"]
    assert "no data-direct probe was captured" in context(tmp_path).data_direct_probes["mlx5_1"].reason


def test_mlx5_dmabuf_refused_means_not_data_direct(tmp_path):
    tree = machines.gb300_tray(tmp_path)
    refused = {**machines.found("/devices/x"), "dmabuf_errno": machines.EOPNOTSUPP}
    machines.data_direct_probe(tree, {"mlx5_0": refused, "mlx5_1": refused})
    probe = context(tmp_path).data_direct_probes["mlx5_0"]
    assert probe.path is None and "EOPNOTSUPP" in probe.reason and "ncclMlx5dvDmaBufCapable" in probe.reason


def test_a_lookup_error_other_than_enodev_stops_nccl_2_28_3_and_later(tmp_path):
    tree = machines.gb300_tray(tmp_path)
    machines.data_direct_probe(tree, {"mlx5_0": machines.not_data_direct(machines.EINVAL),
                                      "mlx5_1": machines.not_data_direct()})
    report = run_doctor(str(tmp_path), environ={})
    broken = finding(report, ids.NCCL_DATA_DIRECT)
    assert broken.status is Status.FAIL and "mlx5_0" in broken.summary and "EINVAL" in broken.evidence[0].value
    assert "NCCL_IB_DATA_DIRECT=0" in broken.fix
    probe = context(tmp_path).data_direct_probes["mlx5_0"]
    assert not data_direct.breaks_init(NcclRules((2, 27, 7)), {}, probe)
    assert not data_direct.breaks_init(NcclRules(), {"NCCL_IB_DATA_DIRECT": "0"}, probe)


def test_a_path_that_is_no_pci_function_is_not_placed(tmp_path):
    tree = machines.gb300_tray(tmp_path)
    machines.data_direct_probe(tree, {"mlx5_0": machines.found("/devices/virtual/nowhere"),
                                      "mlx5_1": machines.not_data_direct()})
    report = run_doctor(str(tmp_path), environ={})
    assert [d.net for d in report.nccl] == ["mlx5_0", "mlx5_1"]
    unplaced = finding(report, ids.NCCL_DATA_DIRECT)
    assert unplaced.status is Status.WARN and "not placed" in unplaced.evidence[0].value
