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


def test_acs_redirect_on_switch_ports_fails_with_setpci_fix(tmp_path):
    machines.acs_node(tmp_path, pairs=2)
    findings = run(tmp_path)
    failing = [f for f in findings if f.status is Status.FAIL]
    assert [f.id for f in failing] == ["acs.bridge", "acs.bridge"]
    assert "0000:1a:00.0 (SV+RR+CR+UF)" in failing[0].summary
    assert "GPU0-mlx5_0" in failing[0].summary
    assert "setpci -s 0000:1a:00.0 ECAP_ACS+0x6.w=0000" in failing[0].fix
    evidence = failing[0].evidence[0]
    assert evidence.source == "/sys/bus/pci/devices/0000:1a:00.0/config @0x14e"
    assert "ReqRedir+ CmpltRedir+" in evidence.value
    (clear,) = [f for f in findings if f.status is Status.OK]
    assert "4 bridge(s)" in clear.summary   # the upstream port of pair 0, pair 1's three ports


def test_acs_in_a_vm_advises_ats(tmp_path):
    tree = machines.pix_node(tmp_path, pairs=1)
    tree.cpuinfo(hypervisor=True)
    tree.set_acs("0000:1a:01.0")
    (warning,) = [f for f in run(tmp_path) if f.status is not Status.OK]
    assert warning.status is Status.WARN and "ATS" in warning.fix
    assert "setpci" not in warning.fix


def test_unprivileged_reader_gets_skip_with_run_as_root(tmp_path):
    tree = machines.acs_node(tmp_path, pairs=1)
    tree.unprivileged_config()
    (finding,) = run(tmp_path)
    assert finding.status is Status.SKIP and "beyond 64 bytes" in finding.summary
    assert "root" in finding.fix
    assert len(finding.evidence) == 3


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
