"""Which PCIe element a node's rails share (doctor/facts/rails.py) on fixture machines, and
the doctor's finding and matrix line that name it."""

from __future__ import annotations

from gdrprobe.doctor.checks import topology as topo
from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.doctor.facts.rails import (ROOT_COMPLEX, SOCKET, SOCKETS, SWITCH, SWITCH_PORT, Link, Rail,
                                         read_links, shared_element)
from gdrprobe.doctor.facts.topology import build_topology
from gdrprobe.report.model import Status, to_dict
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor import machines, nccl_machines

CX7 = {"mlx5_0": 400.0, "mlx5_1": 400.0}


def rails_of(tmp_path, pairs):
    """Rails by (GPU index, NIC name) on the machine under tmp_path, with their links."""
    topology = build_topology(SysRoot(str(tmp_path)))
    nics = {nic.name: nic for nic in topology.nics}
    rails = [Rail(topology.gpus[gpu], nics[nic]) for gpu, nic in pairs]
    return rails, read_links(SysRoot(str(tmp_path)), rails)


def test_two_nics_under_one_switch_share_its_narrow_uplink(tmp_path):
    machines.narrow_uplink_node(tmp_path)
    rails, links = rails_of(tmp_path, [(0, "mlx5_0"), (1, "mlx5_1")])
    element = shared_element(rails, links, CX7)
    # The root port and the switch's upstream port state the same x8 link: the deeper one,
    # the switch's, is the element; each NIC's own downstream port is not shared.
    assert (element.kind, element.name) == (SWITCH_PORT, "0000:01:00.0")
    assert element.link == Link("16.0 GT/s PCIe", "8")
    assert round(element.link.gbps) == 126
    assert element.demand_gbps == 800.0 and element.oversubscribed
    assert element.describe() == ("switch port 0000:01:00.0, x8 at 16.0 GT/s PCIe (126 Gb/s) "
                                  "against 800 Gb/s of the rails' NICs")
    assert element.as_json()["oversubscribed"] is True


def test_a_wide_shared_uplink_is_named_but_not_oversubscribed(tmp_path):
    tree = machines.narrow_uplink_node(tmp_path)
    for port in ("0000:00:01.0", "0000:01:00.0"):
        tree.link(port, "64.0 GT/s PCIe", 16)
    rails, links = rails_of(tmp_path, [(0, "mlx5_0"), (1, "mlx5_1")])
    element = shared_element(rails, links, CX7)
    assert element.name == "0000:01:00.0" and not element.oversubscribed


def test_an_unknown_nic_rate_names_the_element_without_judging_it(tmp_path):
    machines.narrow_uplink_node(tmp_path)
    rails, links = rails_of(tmp_path, [(0, "mlx5_0"), (1, "mlx5_1")])
    element = shared_element(rails, links, {"mlx5_0": 400.0})
    assert element.demand_gbps is None and not element.oversubscribed


def test_two_root_ports_of_one_socket_share_the_root_complex(tmp_path):
    machines.two_root_ports_node(tmp_path)
    rails, links = rails_of(tmp_path, [(0, "mlx5_0"), (1, "mlx5_1")])
    element = shared_element(rails, links, CX7)
    assert (element.kind, element.name, element.link) == (ROOT_COMPLEX, "pci0000:00", None)
    assert element.rails == ("GPU0-mlx5_0", "GPU1-mlx5_1")


def test_rails_on_root_complexes_of_one_socket_share_the_socket(tmp_path):
    machines.pix_node(tmp_path, pairs=2)
    rails, links = rails_of(tmp_path, [(0, "mlx5_0"), (1, "mlx5_1")])
    element = shared_element(rails, links, CX7)
    assert (element.kind, element.name) == (SOCKET, "NUMA 0")


def test_rails_that_cross_sockets_share_the_link_between_them(tmp_path):
    machines.dual_socket_node(tmp_path)
    rails, links = rails_of(tmp_path, [(0, "mlx5_1"), (1, "mlx5_0")])
    element = shared_element(rails, links, CX7)
    assert (element.kind, element.name) == (SOCKETS, "NUMA 0-1")


def test_rails_each_on_a_socket_of_its_own_share_nothing(tmp_path):
    machines.pix_node(tmp_path, pairs=8)
    rails, links = rails_of(tmp_path, [(0, "mlx5_0"), (4, "mlx5_4")])
    assert shared_element(rails, links, {}) is None


def test_two_rails_turning_in_one_switch_share_that_switch(tmp_path):
    tree = machines.SysfsTree(tmp_path)
    host = tree.host_bridge(0x00, numa=0)
    ports = tree.switch(tree.bridge(host, "0000:00:01.0", vendor=machines.INTEL), "0000:01:00.0",
                        [f"0000:02:0{i}.0" for i in range(4)])
    tree.gpu(ports[0], "0000:03:00.0")
    tree.gpu(ports[1], "0000:04:00.0")
    tree.nic(ports[2], "0000:05:00.0", "mlx5_0")
    tree.nic(ports[3], "0000:06:00.0", "mlx5_1")
    rails, links = rails_of(tmp_path, [(0, "mlx5_0"), (1, "mlx5_1")])
    assert (shared_element(rails, links, CX7).kind, shared_element(rails, links, CX7).name) == (
        SWITCH, "0000:01:00.0")


def test_one_rail_shares_nothing(tmp_path):
    machines.narrow_uplink_node(tmp_path)
    rails, links = rails_of(tmp_path, [(0, "mlx5_0")])
    assert shared_element(rails, links, CX7) is None


def test_a_link_sysfs_does_not_state_is_not_rated():
    assert Link().gbps is None and Link("unknown", "16").gbps is None
    assert Link("2.5 GT/s PCIe", "1").gbps == 2.0
    assert Link().describe() == "link not stated in sysfs"


def test_the_doctor_warns_of_an_oversubscribed_uplink_in_its_finding_and_matrix(tmp_path):
    tree = machines.narrow_uplink_node(tmp_path)
    nccl_machines.healthy_stack(tree, nccl_machines.gpu_bdfs(tree), ["mlx5_0", "mlx5_1"])
    for nic in ("mlx5_0", "mlx5_1"):
        nccl_machines.port_rate(tree, nic, 400)
    ctx = DoctorContext(SysRoot(str(tmp_path)), {})
    findings = topo.check(ctx)
    [rails] = [f for f in findings if f.id == "topology.rails"]
    [matrix] = [f for f in findings if f.id == "topology.matrix"]
    assert [d.nic for d in ctx.nccl_decisions] == ["mlx5_0", "mlx5_1"]
    assert rails.status is Status.WARN and "0000:01:00.0" in rails.summary and rails.fix
    assert "x8 at 16.0 GT/s PCIe (126 Gb/s) against 800 Gb/s" in rails.summary
    assert "Rails together (GPU0-mlx5_0, GPU1-mlx5_1) share: switch port 0000:01:00.0" in (
        matrix.evidence[0].value)
    assert to_dict(rails)["id"] == "topology.rails" and to_dict(rails)["status"] == "warn"
