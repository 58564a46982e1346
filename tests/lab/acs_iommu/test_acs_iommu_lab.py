"""The doctor's ACS and IOMMU checks read from a live kernel (lab/acs_iommu.py): q35, an
emulated Intel IOMMU, a root port with ACS and one without. Runs only in that guest
(`python -m lab demo-platform`); emulated hardware, not hardware proof."""

from __future__ import annotations

import contextlib
import os

import pytest

from gdrprobe.doctor.checks import acs, iommu
from gdrprobe.doctor.facts import pci
from gdrprobe.report.model import Status
from gdrprobe.sysroot import SysRoot
from lab.acs_iommu import (ACS_PORT, BARE_METAL, GPU_STANDIN, GUEST_MARK, NIC_STANDIN, NO_ACS_PORT,
                           live_findings)

pytestmark = pytest.mark.skipif(os.environ.get(GUEST_MARK) != "1",
                                reason="needs the ACS/IOMMU guest (python -m lab demo-platform)")
LINUX_ACS = ("SV", "RR", "CR", "UF")     # what pci_std_enable_acs turns on (drivers/pci/pci.c)


def by_id(findings, finding_id):
    return [f for f in findings if f.id == finding_id]


@contextlib.contextmanager
def acs_control_written(bdf: str, value: int):
    """ACSCtl set as the doctor's fix says (setpci ECAP_ACS+0x6.w), put back afterwards."""
    state = acs.read_acs(SysRoot("/"), bdf)
    where = state.capability_offset + acs.ACS_CONTROL_OFFSET
    path = pci.config_path(bdf)

    def write(control: int) -> None:
        with open(path, "r+b", buffering=0) as config:
            config.seek(where)
            config.write(control.to_bytes(2, "little"))

    write(value)
    try:
        yield
    finally:
        write(state.control)


def test_the_kernel_turned_acs_on_where_the_port_has_it():
    root = SysRoot("/")
    with_acs, without = acs.read_acs(root, ACS_PORT), acs.read_acs(root, NO_ACS_PORT)
    assert with_acs.readable and with_acs.capability_offset is not None
    assert with_acs.enabled() == LINUX_ACS and with_acs.redirects()
    assert without.readable and without.capability_offset is None
    # The kernel's own reading agrees: no ACS below a port, no isolation from it.
    assert pci.iommu_group(root, NIC_STANDIN) == pci.iommu_group(root, NO_ACS_PORT)
    assert pci.iommu_group(root, GPU_STANDIN) != pci.iommu_group(root, ACS_PORT)


def test_acs_on_root_ports_read_live_is_no_fault_where_the_pair_meets_in_the_root_complex():
    """The two stand-ins sit behind two root ports: their traffic crosses the root complex
    whatever the kernel's ACS bits on the first port say, in the guest and on bare metal
    alike; no fix is named, no warning raised (acs.bridge, the path NCCL's traffic takes)."""
    for findings in (live_findings(), live_findings(BARE_METAL)):
        (settled,) = by_id(findings, "acs.bridge")
        assert settled.status is Status.OK and not settled.fix
        assert "GPU0-nic0 meet only in the root complex" in settled.summary
        assert [e.value for e in settled.evidence if e.source.startswith(pci.config_path(ACS_PORT))] == [
            "ACSCtl 0x001d: SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-"]
    (ats,) = by_id(live_findings(), "acs.ats")          # the guest: NCCL's guide asks for ATS there
    assert ats.status is Status.INFO and "does not see an ATS capability" in ats.summary
    assert by_id(live_findings(BARE_METAL), "acs.ats") == []


def test_acs_cleared_live_changes_nothing_on_a_root_complex_path():
    """ACSCtl written to 0 on the root port: the answer is the same, as it should be where
    the bits do not change the path."""
    with acs_control_written(ACS_PORT, 0):
        findings = by_id(live_findings(BARE_METAL), "acs.bridge")
    assert [f.status for f in findings] == [Status.OK]
    assert "meet only in the root complex" in findings[0].summary
    assert not any("ACSCtl" in e.value for e in findings[0].evidence)


def test_translated_domains_read_live_fail_on_vt_d():
    findings = live_findings()
    cmdline = by_id(findings, "iommu.cmdline")[0]
    assert (cmdline.status, cmdline.evidence[0].value) == (Status.WARN, "intel_iommu=on")
    domains = by_id(findings, "iommu.domain")
    assert [f.status for f in domains] == [Status.FAIL, Status.FAIL]
    assert "IOMMU domain DMA-FQ (Translated)" in domains[0].summary
    assert domains[0].evidence[-1].value == "dmar0"     # VT-d, not an SMMUv3: no Grace pass


def test_identity_domain_set_live_is_ok():
    """The group's type written to identity with no driver bound (Linux 5.11+), as iommu=pt
    would have made it; the driver bound again afterwards."""
    root = SysRoot("/")
    group = pci.iommu_group(root, GPU_STANDIN)
    device = pci.device_dir(GPU_STANDIN)
    driver = os.path.basename(os.readlink(f"{device}/driver"))
    with open(f"{device}/driver/unbind", "w") as unbind:
        unbind.write(GPU_STANDIN)
    try:
        with open(iommu.domain_type_path(group), "w") as kind:
            kind.write("identity")
    finally:
        with open(f"/sys/bus/pci/drivers/{driver}/bind", "w") as bind:
            bind.write(GPU_STANDIN)
    domains = by_id(live_findings(), "iommu.domain")
    assert [f.status for f in domains] == [Status.FAIL, Status.OK]
    assert domains[0].summary.startswith(f"nic0 ({NIC_STANDIN})")
    assert domains[1].summary.startswith(f"DMA of GPU0 ({GPU_STANDIN}) is untranslated")
    assert (iommu.domain_type_path(group), "identity") in [
        (e.source, e.value) for e in domains[1].evidence]
