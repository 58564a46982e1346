from __future__ import annotations

import pytest

from gdrprobe.doctor.checks import topology as topo
from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.doctor.facts.topology import build_topology
from gdrprobe.nccl.env import gdr_level
from gdrprobe.report.model import Status
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor import machines, nccl_machines


def run(tmp_path, environ=None):
    return topo.check(DoctorContext(SysRoot(str(tmp_path)), environ or {}))


def with_stack(tree):
    """A healthy DMA-BUF stack, so that only placement and the environment decide GDR."""
    nics = sorted(p.name for p in tree.path("/sys/class/infiniband").iterdir())
    nccl_machines.healthy_stack(tree, nccl_machines.gpu_bdfs(tree), nics)
    return tree


def decisions(tmp_path, environ=None):
    return DoctorContext(SysRoot(str(tmp_path)), environ or {}).nccl_decisions


def by_id(findings, finding_id):
    return [f for f in findings if f.id == finding_id]


def test_pix_node_pairs_each_gpu_with_its_switch_nic(tmp_path):
    with_stack(machines.pix_node(tmp_path))
    t = build_topology(SysRoot(str(tmp_path)))
    assert [g.name for g in t.gpus] == [f"GPU{i}" for i in range(8)]
    assert [n.name for n in t.nics] == [f"mlx5_{i}" for i in range(8)]
    assert t.gpus[0].bdf == "0000:1b:00.0" and t.nics[0].bdf == "0000:1c:00.0"
    assert t.gpus[4].numa_node == 1
    assert [(d.nic, d.path_type, d.path) for d in decisions(tmp_path)] == [
        (f"mlx5_{i}", "PIX", "direct") for i in range(8)]
    assert t.distance(t.gpus[0], t.nics[1]) == "NODE"
    assert t.nccl_class(t.gpus[0], t.nics[1]) == "PHB"
    assert t.distance(t.gpus[0], t.nics[4]) == "SYS"
    assert t.distance(t.gpus[0], t.gpus[0]) == "X"
    assert t.bridges_between(t.gpus[0], t.nics[0]) == ("0000:19:00.0", "0000:1a:00.0", "0000:1a:01.0")
    assert not t.virtualization.is_vm


def test_pix_node_findings_and_matrix(tmp_path):
    with_stack(machines.pix_node(tmp_path))
    findings = run(tmp_path)
    distances = by_id(findings, "topology.distance")
    assert len(distances) == 8 and all(f.status is Status.OK for f in distances)
    assert "GPU0 (0000:1b:00.0, NUMA 0) and the NIC NCCL uses, mlx5_0" in distances[0].summary
    assert distances[0].evidence[0].source == "realpath /sys/bus/pci/devices/0000:1b:00.0"
    assert distances[0].evidence[0].value == (
        "/sys/devices/pci0000:18/0000:18:01.0/0000:19:00.0/0000:1a:00.0/0000:1b:00.0")
    assert distances[0].evidence[2].source == "realpath /sys/class/infiniband/mlx5_0/device"
    assert by_id(findings, "topology.nccl_gate") == []     # the gate is nccl.gpu.<bdf> now
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
    with_stack(tree)
    t = build_topology(SysRoot(str(tmp_path)))
    assert t.distance(t.gpus[0], t.nics[0]) == "PXB"
    assert decisions(tmp_path)[0].path_type == "PXB"
    assert by_id(run(tmp_path), "topology.distance")[0].status is Status.OK


def test_dual_socket_node_reports_node_sys_and_phb(tmp_path):
    with_stack(machines.dual_socket_node(tmp_path))
    t = build_topology(SysRoot(str(tmp_path)))
    gpu0, gpu1 = t.gpus
    mlx5_0, mlx5_1 = t.nics
    assert t.distance(gpu0, mlx5_0) == "NODE"
    assert t.distance(gpu0, mlx5_1) == "SYS"
    assert t.distance(gpu1, mlx5_1) == "PHB"
    assert [d.nic for d in decisions(tmp_path)] == ["mlx5_0", "mlx5_1"]
    findings = run(tmp_path)
    first, second = by_id(findings, "topology.distance")
    assert first.status is Status.FAIL and "NODE (NCCL class PHB)" in first.summary
    assert "Move the NIC" in first.fix
    assert ("/sys/bus/pci/devices/0000:41:00.0/numa_node", "0") in [
        (e.source, e.value) for e in first.evidence]
    assert second.status is Status.WARN and "PHB" in second.summary
    verdicts = decisions(tmp_path)
    assert [(d.gdr_write, d.gdr_read) for d in verdicts] == [(False, False), (False, False)]
    assert "receive: path PHB is beyond the GDR level P2C (NCCL's default)" in verdicts[0].why


def test_gate_follows_nccl_net_gdr_level(tmp_path):
    with_stack(machines.dual_socket_node(tmp_path))
    verdicts = decisions(tmp_path, {"NCCL_NET_GDR_LEVEL": "PHB"})
    assert [d.gdr_write for d in verdicts] == [True, True]


def test_restrictive_level_blocks_pix_pair_and_says_unset(tmp_path):
    with_stack(machines.pix_node(tmp_path, pairs=1))
    (verdict,) = decisions(tmp_path, {"NCCL_NET_GDR_LEVEL": "LOC"})
    assert not verdict.gdr_write
    assert ("receive: path PIX is beyond the GDR level LOC (NCCL_NET_GDR_LEVEL=LOC), so NCCL routes it "
            "through the CPU: PHB") in verdict.why


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
    level = gdr_level(environ)
    assert (level.name, level.ignored) == (name, ignored)


def test_unknown_level_is_reported_as_silently_ignored(tmp_path):
    machines.pix_node(tmp_path, pairs=1)
    (level,) = by_id(run(tmp_path, {"NCCL_NET_GDR_LEVEL": "pxb"}), "topology.nccl_level")
    assert level.status is Status.WARN and "ignores it" in level.summary
    assert level.evidence[0].value == "'pxb'"


def test_flat_vm_is_flagged_with_its_consequence(tmp_path):
    machines.flat_vm(tmp_path)
    t = build_topology(SysRoot(str(tmp_path)))
    assert t.virtualization.flat and t.virtualization.hypervisor
    assert decisions(tmp_path)[0].path_type == "PHB"
    findings = run(tmp_path)
    (vm,) = by_id(findings, "topology.vm")
    assert vm.status is Status.WARN and "flat virtual PCI topology" in vm.summary
    assert "NCCL_TOPO_FILE" in vm.fix
    sources = [e.source for e in vm.evidence]
    assert "/proc/cpuinfo" in sources
    assert "/sys/devices/virtual/dmi/id/sys_vendor" in sources
    assert "/sys/bus/pci/devices/0000:00:02.0/vendor" in sources
    assert not any(d.gdr_write for d in decisions(tmp_path))


def test_no_gpu_and_software_rdma_only(tmp_path):
    tree = machines.SysfsTree(tmp_path)
    tree.host_bridge(0x00)
    tree.software_rdma("rxe0")
    t = build_topology(SysRoot(str(tmp_path)))
    assert t.nics == () and t.software_nics == ("rxe0",)
    findings = run(tmp_path)
    assert [f.id for f in findings] == ["topology.devices", "topology.software_nic", "topology.vm"]
    assert findings[0].status is Status.WARN and "no NVIDIA GPU and PCI RDMA NIC" in findings[0].summary
