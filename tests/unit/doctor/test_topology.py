from __future__ import annotations

import pytest

from gdrprobe.doctor import topology as topo
from gdrprobe.doctor.context import DoctorContext
from gdrprobe.report.model import Status
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor import machines


def run(tmp_path, environ=None):
    return topo.check(DoctorContext(SysRoot(str(tmp_path)), environ or {}))


def by_id(findings, finding_id):
    return [f for f in findings if f.id == finding_id]


def test_pix_node_pairs_each_gpu_with_its_switch_nic(tmp_path):
    machines.pix_node(tmp_path)
    t = topo.build_topology(SysRoot(str(tmp_path)))
    assert [g.name for g in t.gpus] == [f"GPU{i}" for i in range(8)]
    assert [n.name for n in t.nics] == [f"mlx5_{i}" for i in range(8)]
    assert t.gpus[0].bdf == "0000:1b:00.0" and t.nics[0].bdf == "0000:1c:00.0"
    assert t.gpus[4].numa_node == 1
    for i, gpu in enumerate(t.gpus):
        nic, distance = t.nearest_nic(gpu)
        assert (nic.name, distance) == (f"mlx5_{i}", "PIX")
    assert t.distance(t.gpus[0], t.nics[1]) == "NODE"
    assert t.nccl_class(t.gpus[0], t.nics[1]) == "PHB"
    assert t.distance(t.gpus[0], t.nics[4]) == "SYS"
    assert t.distance(t.gpus[0], t.gpus[0]) == "X"
    assert t.bridges_between(t.gpus[0], t.nics[0]) == ("0000:19:00.0", "0000:1a:00.0", "0000:1a:01.0")
    assert not t.virtualization.is_vm


def test_pix_node_findings_and_matrix(tmp_path):
    machines.pix_node(tmp_path)
    findings = run(tmp_path)
    distances = by_id(findings, "topology.distance")
    assert len(distances) == 8 and all(f.status is Status.OK for f in distances)
    assert "GPU0 (0000:1b:00.0, NUMA 0) nearest NIC mlx5_0" in distances[0].summary
    assert distances[0].evidence[0].source == "realpath /sys/bus/pci/devices/0000:1b:00.0"
    assert distances[0].evidence[0].value == (
        "/sys/devices/pci0000:18/0000:18:01.0/0000:19:00.0/0000:1a:00.0/0000:1b:00.0")
    assert distances[0].evidence[2].source == "realpath /sys/class/infiniband/mlx5_0/device"
    gates = by_id(findings, "topology.nccl_gate")
    assert all(f.status is Status.OK for f in gates)
    assert by_id(findings, "topology.vm")[0].status is Status.OK
    matrix = by_id(findings, "topology.matrix")[0].evidence[0].value
    lines = matrix.splitlines()
    assert lines[0].split()[:3] == ["GPU0", "GPU1", "GPU2"]
    assert "NIC7" in lines[0] and "CPU Affinity" in lines[0] and "NUMA Affinity" in lines[0]
    assert lines[1].split() == (["GPU0", "X", "NODE", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS",
                                 "PIX", "NODE", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS",
                                 "0-55", "0"])
    assert lines[9].split()[:2] == ["NIC0", "PIX"]
    assert "Legend:" in lines and "NIC Legend:" in lines
    assert "  NIC3: mlx5_3" in lines


def test_pxb_through_two_switches(tmp_path):
    tree = machines.SysfsTree(tmp_path)
    host = tree.host_bridge(0x10)
    root_port = tree.bridge(host, "0000:10:01.0")
    left, right = tree.switch(root_port, "0000:11:00.0", ["0000:12:00.0", "0000:12:01.0"])
    (gpu_port,) = tree.switch(left, "0000:13:00.0", ["0000:14:00.0"])
    (nic_port,) = tree.switch(right, "0000:15:00.0", ["0000:16:00.0"])
    tree.gpu(gpu_port, "0000:17:00.0")
    tree.nic(nic_port, "0000:18:00.0", "mlx5_0")
    t = topo.build_topology(SysRoot(str(tmp_path)))
    assert t.nearest_nic(t.gpus[0])[1] == "PXB"
    assert by_id(run(tmp_path), "topology.distance")[0].status is Status.OK


def test_dual_socket_node_reports_node_sys_and_phb(tmp_path):
    machines.dual_socket_node(tmp_path)
    t = topo.build_topology(SysRoot(str(tmp_path)))
    gpu0, gpu1 = t.gpus
    mlx5_0, mlx5_1 = t.nics
    assert t.distance(gpu0, mlx5_0) == "NODE"
    assert t.distance(gpu0, mlx5_1) == "SYS"
    assert t.distance(gpu1, mlx5_1) == "PHB"
    assert t.nearest_nic(gpu0) == (mlx5_0, "NODE")
    findings = run(tmp_path)
    first, second = by_id(findings, "topology.distance")
    assert first.status is Status.FAIL and "NODE (NCCL class PHB)" in first.summary
    assert "Move the NIC" in first.fix
    assert ("/sys/bus/pci/devices/0000:41:00.0/numa_node", "0") in [
        (e.source, e.value) for e in first.evidence]
    assert second.status is Status.WARN and "PHB" in second.summary
    gates = by_id(findings, "topology.nccl_gate")
    assert [g.status for g in gates] == [Status.FAIL, Status.FAIL]
    assert "PHB > P2C" in gates[0].summary


def test_gate_follows_nccl_net_gdr_level(tmp_path):
    machines.dual_socket_node(tmp_path)
    gates = by_id(run(tmp_path, {"NCCL_NET_GDR_LEVEL": "PHB"}), "topology.nccl_gate")
    assert [g.status for g in gates] == [Status.OK, Status.OK]


def test_restrictive_level_blocks_pix_pair_and_says_unset(tmp_path):
    machines.pix_node(tmp_path, pairs=1)
    findings = run(tmp_path, {"NCCL_NET_GDR_LEVEL": "LOC"})
    (gate,) = by_id(findings, "topology.nccl_gate")
    assert gate.status is Status.FAIL and "PIX > LOC" in gate.summary
    assert "Unset NCCL_NET_GDR_LEVEL" in gate.fix


@pytest.mark.parametrize("environ, name, ignored", [
    ({}, "P2C", False),
    ({"NCCL_NET_GDR_C2C": "0"}, "PXB", False),
    ({"NCCL_NET_GDR_LEVEL": "PHB"}, "PHB", False),
    ({"NCCL_NET_GDR_LEVEL": "0"}, "LOC", False),
    ({"NCCL_NET_GDR_LEVEL": "2"}, "PXB", False),
    ({"NCCL_NET_GDR_LEVEL": "3"}, "PHB", False),
    ({"NCCL_NET_GDR_LEVEL": "7"}, "SYS", False),
    ({"NCCL_NET_GDR_LEVEL": "pxb"}, "P2C", True),
    ({"NCCL_NET_GDR_LEVEL": "NODE"}, "P2C", True),
])
def test_gdr_level_parsing(environ, name, ignored):
    level = topo.gdr_level(environ)
    assert (level.name, level.ignored) == (name, ignored)


def test_unknown_level_is_reported_as_silently_ignored(tmp_path):
    machines.pix_node(tmp_path, pairs=1)
    (level,) = by_id(run(tmp_path, {"NCCL_NET_GDR_LEVEL": "pxb"}), "topology.nccl_level")
    assert level.status is Status.WARN and "ignores it" in level.summary
    assert level.evidence[0].value == "'pxb'"


def test_flat_vm_is_flagged_with_its_consequence(tmp_path):
    machines.flat_vm(tmp_path)
    t = topo.build_topology(SysRoot(str(tmp_path)))
    assert t.virtualization.flat and t.virtualization.hypervisor
    assert t.nearest_nic(t.gpus[0])[1] == "PHB"
    findings = run(tmp_path)
    (vm,) = by_id(findings, "topology.vm")
    assert vm.status is Status.WARN and "flat virtual PCI topology" in vm.summary
    assert "NCCL_TOPO_FILE" in vm.fix
    sources = [e.source for e in vm.evidence]
    assert "/proc/cpuinfo" in sources
    assert "/sys/devices/virtual/dmi/id/sys_vendor" in sources
    assert "/sys/bus/pci/devices/0000:00:02.0/vendor" in sources
    assert all(g.status is Status.FAIL for g in by_id(findings, "topology.nccl_gate"))


def test_no_gpu_and_software_rdma_only(tmp_path):
    tree = machines.SysfsTree(tmp_path)
    tree.host_bridge(0x00)
    tree.software_rdma("rxe0")
    t = topo.build_topology(SysRoot(str(tmp_path)))
    assert t.nics == () and t.software_nics == ("rxe0",)
    findings = run(tmp_path)
    assert [f.id for f in findings] == ["topology.devices", "topology.software_nic", "topology.vm"]
    assert findings[0].status is Status.WARN and "no NVIDIA GPU and PCI RDMA NIC" in findings[0].summary
