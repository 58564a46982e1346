from __future__ import annotations

from gdrprobe.doctor.checks import acs
from gdrprobe.doctor.facts import pci
from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.report.model import Status
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor import machines
from tests.unit.doctor.stack_machines import DenyingRoot


def run(tmp_path):
    return acs.check(DoctorContext(SysRoot(str(tmp_path)), {}))


def test_extended_capability_walk_finds_acs_after_aer():
    config = machines.config_space(0x1000, 0xC030, 0x060400, bridge=True, acs_control=0x1D)
    assert pci.extended_capabilities(config) == {0x0001: 0x100, 0x000D: 0x148}
    assert acs.decode_control(0x1D) == (
        "SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-")


def test_acs_redirect_on_the_ports_where_gpu_and_nic_meet_fails_with_the_fix(tmp_path):
    machines.acs_node(tmp_path, pairs=2)
    findings = run(tmp_path)
    failing = [f for f in findings if f.status is Status.FAIL]
    assert [f.id for f in failing] == ["acs.bridge", "acs.bridge"]
    assert "0000:1a:00.0 (SV+RR+CR+UF)" in failing[0].summary
    assert "GPU0-mlx5_0" in failing[0].summary and "switch where they meet" in failing[0].summary
    assert "setpci -s 0000:1a:00.0 ECAP_ACS+0x6.w=0000" in failing[0].fix
    assert "pci=disable_acs_redir=0000:1a:00.0" in failing[0].fix
    evidence = failing[0].evidence[0]
    assert evidence.source == "/sys/bus/pci/devices/0000:1a:00.0/config @0x14e"
    assert "ReqRedir+ CmpltRedir+" in evidence.value
    (clear,) = [f for f in findings if f.status is Status.OK]
    assert "2 port(s)" in clear.summary   # pair 1's two downstream ports; root ports and upstream ports are no turn


def linux_acs_on_every_port(tree) -> None:
    """What Linux does whenever an IOMMU driver asks for ACS: SV RR CR UF on every port with
    the capability (drivers/pci/pci.c pci_std_enable_acs), root ports included."""
    for bdf, directory in list(tree.devices.items()):
        if tree.path(directory + "/config").read_bytes()[0x0E] & 0x01:
            tree.set_acs(bdf)


def test_acs_on_root_ports_is_no_fault_where_gpu_and_nic_meet_in_the_root_complex(tmp_path):
    """Was: FAIL with a setpci fix on both root ports. Traffic between two root ports crosses
    the root complex whatever their ACS bits say."""
    tree = machines.SysfsTree(tmp_path)
    host = tree.host_bridge(0x00)
    gpu = tree.gpu(tree.bridge(host, "0000:00:01.0", vendor=machines.INTEL), "0000:01:00.0")
    tree.nic(tree.bridge(host, "0000:00:02.0", vendor=machines.INTEL), "0000:02:00.0", "mlx5_0")
    linux_acs_on_every_port(tree)
    findings = run(tmp_path)
    assert [f.status for f in findings] == [Status.OK]
    (ok,) = findings
    assert "meet only in the root complex" in ok.summary and "GPU0-mlx5_0" in ok.summary
    assert not ok.fix and "setpci" not in ok.summary
    assert {e.source.split(" ")[0] for e in ok.evidence} == {
        "/sys/bus/pci/devices/0000:00:01.0/config", "/sys/bus/pci/devices/0000:00:02.0/config"}
    assert gpu == "0000:01:00.0"


def two_level_switch(tmp_path):
    """GPU below a second switch (1b:00.0 upstream, 1c:00.0 downstream) under port 1a:00.0 of
    the first; the NIC under the first switch's port 1a:01.0: they meet in the first switch."""
    tree = machines.SysfsTree(tmp_path)
    host = tree.host_bridge(0x18)
    root_port = tree.bridge(host, "0000:18:01.0", vendor=machines.INTEL)
    gpu_side, nic_side = tree.switch(root_port, "0000:19:00.0", ["0000:1a:00.0", "0000:1a:01.0"])
    (lower,) = tree.switch(gpu_side, "0000:1b:00.0", ["0000:1c:00.0"])
    tree.gpu(lower, "0000:1d:00.0")
    tree.nic(nic_side, "0000:1e:00.0", "mlx5_0")
    return tree


def test_only_the_ports_of_the_switch_where_they_meet_turn_the_traffic(tmp_path):
    tree = two_level_switch(tmp_path)
    for bdf in ("0000:18:01.0", "0000:19:00.0", "0000:1b:00.0", "0000:1c:00.0"):
        tree.set_acs(bdf)
    findings = run(tmp_path)
    assert [f.status for f in findings] == [Status.OK]
    assert "2 port(s)" in findings[0].summary and "0000:1c:00.0" in " ".join(e.source for e in findings[0].evidence)
    tree.set_acs("0000:1a:00.0")
    (failing,) = [f for f in run(tmp_path) if f.status is Status.FAIL]
    assert failing.summary.startswith("ACS on bridge 0000:1a:00.0 (SV+RR+CR+UF)")


ATS_OFFSET = machines.ACS_OFFSET


def with_ats(tree, bdf: str, enabled: bool) -> None:
    """The ATS extended capability (ID 0x000F) after AER, its Enable bit (ATS Control bit 15) as given."""
    config = bytearray(tree.path(tree.devices[bdf] + "/config").read_bytes())
    config[ATS_OFFSET:ATS_OFFSET + 4] = (0x000F | 1 << 16).to_bytes(4, "little")
    config[ATS_OFFSET + 6:ATS_OFFSET + 8] = ((1 << 15) if enabled else 0).to_bytes(2, "little")
    header = int.from_bytes(config[machines.AER_OFFSET:machines.AER_OFFSET + 4], "little")
    config[machines.AER_OFFSET:machines.AER_OFFSET + 4] = (header & 0xFFFFF | ATS_OFFSET << 20).to_bytes(4, "little")
    tree.write(tree.devices[bdf] + "/config", bytes(config))


def kvm_guest(tmp_path, ats: bool | None):
    """A q35 guest: GPU and NIC each behind a virtual root port with ACS (what QEMU's
    pcie-root-port has, and what the guest kernel turns on)."""
    tree = machines.SysfsTree(tmp_path)
    tree.cpuinfo(hypervisor=True)
    host = tree.host_bridge(0x00)
    tree.gpu(tree.bridge(host, "0000:00:10.0", vendor=0x1B36), "0000:01:00.0")
    tree.nic(tree.bridge(host, "0000:00:11.0", vendor=0x1B36), "0000:02:00.0", "mlx5_0")
    linux_acs_on_every_port(tree)
    if ats is not None:
        with_ats(tree, "0000:02:00.0", ats)
    return tree


def test_virtual_root_ports_are_no_warning_and_ats_is_advised_only_where_it_is_off(tmp_path):
    """Was: a WARN on each virtual root port and "enable ATS" whether or not it was on."""
    kvm_guest(tmp_path / "on", ats=True)
    findings = run(tmp_path / "on")
    assert not [f for f in findings if f.status in (Status.FAIL, Status.WARN)]
    (ats,) = [f for f in findings if f.id == "acs.ats"]
    assert ats.status is Status.OK and "ATS is on" in ats.summary and not ats.fix
    kvm_guest(tmp_path / "off", ats=False)
    (ats,) = [f for f in run(tmp_path / "off") if f.id == "acs.ats"]
    assert ats.status is Status.WARN and "ATS" in ats.fix
    kvm_guest(tmp_path / "hidden", ats=None)
    (ats,) = [f for f in run(tmp_path / "hidden") if f.id == "acs.ats"]
    assert ats.status is Status.INFO and "host" in ats.summary


def test_acs_in_a_vm_on_a_switch_where_they_meet_warns_without_setpci(tmp_path):
    tree = machines.pix_node(tmp_path, pairs=1)
    tree.cpuinfo(hypervisor=True)
    tree.set_acs("0000:1a:01.0")
    with_ats(tree, "0000:1c:00.0", True)
    (warning,) = [f for f in run(tmp_path) if f.status is Status.WARN]
    assert warning.id == "acs.bridge" and "(virtual machine)" in warning.summary
    assert "setpci" not in warning.fix and "enable ATS" not in warning.fix


def test_unprivileged_reader_gets_skip_with_run_as_root(tmp_path):
    tree = machines.acs_node(tmp_path, pairs=1)
    tree.unprivileged_config()
    (finding,) = run(tmp_path)
    assert finding.status is Status.SKIP and "beyond 64 bytes" in finding.summary
    assert "root" in finding.fix
    assert len(finding.evidence) == 2          # the two ports of the switch where GPU0 and mlx5_0 meet


def test_bridge_without_acs_capability_is_clear(tmp_path):
    tree = machines.pix_node(tmp_path, pairs=1)
    config = bytearray(tree.path(tree.devices["0000:1a:00.0"] + "/config").read_bytes())
    config[0x100:0x104] = bytes(4)         # no extended capabilities at all
    tree.write(tree.devices["0000:1a:00.0"] + "/config", bytes(config))
    (finding,) = run(tmp_path)
    assert finding.status is Status.OK
    assert ("/sys/bus/pci/devices/0000:1a:00.0/config", "no ACS extended capability") in [
        (e.source, e.value) for e in finding.evidence]


def test_no_gpu_skips(tmp_path):
    machines.SysfsTree(tmp_path)
    (finding,) = run(tmp_path)
    assert finding.status is Status.SKIP


EGRESS_CTRL = 1 << 5


def set_egress(tree, bdf: str, vector: int) -> None:
    """EgressCtrl on, with the 256-bit Egress Control Vector (ACSCap size field 0) holding ``vector``."""
    tree.set_acs(bdf, EGRESS_CTRL)
    config = bytearray(tree.path(tree.devices[bdf] + "/config").read_bytes())
    start = machines.ACS_OFFSET + 8
    config[start:start + 32] = vector.to_bytes(32, "little")
    tree.write(tree.devices[bdf] + "/config", bytes(config))


def test_egress_control_with_a_port_in_its_vector_fails(tmp_path):
    """Was: ignored (only ReqRedir/CmpltRedir counted)."""
    tree = machines.pix_node(tmp_path, pairs=1)
    set_egress(tree, "0000:1a:00.0", 0b10)
    (failing,) = [f for f in run(tmp_path) if f.status is Status.FAIL]
    assert "(EC) blocks or redirects peer traffic of GPU0-mlx5_0" in failing.summary
    assert failing.evidence[0].value.endswith("EgressCtrl+ DirectTrans-; Egress Control Vector 0x2")
    assert "ECAP_ACS+0x6.w=0000" in failing.fix


def test_egress_control_with_an_empty_vector_is_clear(tmp_path):
    tree = machines.pix_node(tmp_path, pairs=1)
    set_egress(tree, "0000:1a:00.0", 0)
    (finding,) = run(tmp_path)
    assert finding.status is Status.OK
    assert "Egress Control Vector 0x0" in " ".join(e.value for e in finding.evidence)


def test_config_space_refused_to_this_user_says_permission_denied(tmp_path):
    machines.acs_node(tmp_path, pairs=1)
    denied = {pci.config_path(bdf) for bdf in ("0000:19:00.0", "0000:1a:00.0", "0000:1a:01.0")}
    (finding,) = acs.check(DoctorContext(DenyingRoot(str(tmp_path), denied), {}))
    assert finding.status is Status.SKIP and "root" in finding.fix
    assert {e.value for e in finding.evidence} == {"permission denied"}
