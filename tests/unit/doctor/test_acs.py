from __future__ import annotations

from gdrprobe.doctor import acs, pci
from gdrprobe.doctor.context import DoctorContext
from gdrprobe.report.model import Status
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor import machines


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
