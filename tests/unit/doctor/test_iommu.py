from __future__ import annotations

from gdrprobe.doctor.checks import iommu
from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.report.model import Status
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor import machines


def run(tmp_path):
    return iommu.check(DoctorContext(SysRoot(str(tmp_path)), {}))


def test_translating_iommu_fails_every_device(tmp_path):
    machines.translating_iommu_node(tmp_path, pairs=2)
    findings = run(tmp_path)
    cmdline = findings[0]
    assert (cmdline.id, cmdline.status) == ("iommu.cmdline", Status.WARN)
    assert cmdline.evidence[0].value == "intel_iommu=on"
    domains = [f for f in findings if f.id == "iommu.domain"]
    assert len(domains) == 4 and all(f.status is Status.FAIL for f in domains)
    assert "GPU0 (0000:1b:00.0): IOMMU domain DMA (Translated)" in domains[0].summary
    assert "iommu=pt" in domains[0].fix
    type_evidence = domains[0].evidence[1]
    assert type_evidence.source.startswith("/sys/kernel/iommu_groups/")
    assert type_evidence.source.endswith("/type") and type_evidence.value == "DMA"


def test_dma_fq_is_translated_too(tmp_path):
    tree = machines.pix_node(tmp_path, pairs=1)
    tree.iommu_groups("DMA-FQ")
    domains = [f for f in run(tmp_path) if f.id == "iommu.domain"]
    assert [f.status for f in domains] == [Status.FAIL, Status.FAIL]


def test_identity_domains_and_iommu_pt_are_ok(tmp_path):
    tree = machines.pix_node(tmp_path, pairs=1)
    tree.iommu_groups("identity")
    cmdline, domain = run(tmp_path)
    assert (cmdline.status, cmdline.evidence[0].value) == (Status.OK, "iommu=pt")
    assert (domain.id, domain.status) == ("iommu.domain", Status.OK)
    assert ("/sys/bus/pci/devices/0000:1b:00.0/iommu_group", "group 5") in [
        (e.source, e.value) for e in domain.evidence]     # groups follow bus order, bridges too
    assert ("/sys/kernel/iommu_groups/5/type", "identity") in [
        (e.source, e.value) for e in domain.evidence]


def test_no_iommu_group_means_untranslated(tmp_path):
    tree = machines.pix_node(tmp_path, pairs=1)
    tree.cmdline("ro intel_iommu=off")
    cmdline, domain = run(tmp_path)
    assert cmdline.status is Status.OK and "disables" in cmdline.summary
    assert domain.status is Status.OK
    assert domain.evidence[0].source == "/sys/bus/pci/devices/0000:1b:00.0/iommu_group"


def test_unreported_and_unmanaged_domains_warn(tmp_path):
    tree = machines.pix_node(tmp_path, pairs=1)
    tree.iommu_groups(None, ["0000:1b:00.0"])
    tree.iommu_groups("unmanaged", ["0000:1c:00.0"])
    domains = [f for f in run(tmp_path) if f.id == "iommu.domain"]
    assert [f.status for f in domains] == [Status.WARN, Status.WARN]
    assert "does not report the domain type" in domains[0].summary
    assert "unmanaged" in domains[1].summary


def test_no_devices_skips(tmp_path):
    machines.SysfsTree(tmp_path)
    cmdline, domain = run(tmp_path)
    assert domain.status is Status.SKIP


GRACE_SMMU = "smmu3.0x0000000011000000"


def test_grace_smmuv3_dma_domain_is_supported_not_a_fault(tmp_path):
    """Grace: the SMMUv3 translates by default and GPUDirect RDMA goes through dma-buf mapped by
    it (NVIDIA's Grace Blackwell CX8 GPUDirect RDMA guide): a DMA domain there is no fault."""
    tree = machines.pix_node(tmp_path, pairs=1)
    tree.cmdline("BOOT_IMAGE=/boot/vmlinuz-6.14.0-nvidia-64k ro")
    tree.iommu_groups("DMA", unit=GRACE_SMMU)
    findings = run(tmp_path)
    cmdline = findings[0]
    assert cmdline.status is Status.INFO and "SMMUv3" in cmdline.summary
    domains = [f for f in findings if f.id == "iommu.domain"]
    assert [f.status for f in domains] == [Status.INFO, Status.INFO]
    assert "behind an Arm SMMUv3" in domains[0].summary
    assert ("/sys/bus/pci/devices/0000:1b:00.0/iommu", GRACE_SMMU) in [
        (e.source, e.value) for e in domains[0].evidence]


def test_grace_passthrough_cmdline_stays_ok(tmp_path):
    tree = machines.pix_node(tmp_path, pairs=1)
    tree.cmdline("ro iommu.passthrough=1")
    tree.iommu_groups("identity", unit=GRACE_SMMU)
    cmdline, domain = run(tmp_path)
    assert (cmdline.status, domain.status) == (Status.OK, Status.OK)


def test_vt_d_dma_domain_still_fails_and_names_its_iommu(tmp_path):
    tree = machines.pix_node(tmp_path, pairs=1)
    tree.cmdline("ro intel_iommu=on")
    tree.iommu_groups("DMA", unit="dmar0")
    findings = run(tmp_path)
    assert findings[0].status is Status.WARN
    domains = [f for f in findings if f.id == "iommu.domain"]
    assert [f.status for f in domains] == [Status.FAIL, Status.FAIL]
    assert domains[0].evidence[-1].value == "dmar0"


def test_blocked_domain_fails(tmp_path):
    tree = machines.pix_node(tmp_path, pairs=1)
    tree.iommu_groups("blocked")
    domains = [f for f in run(tmp_path) if f.id == "iommu.domain"]
    assert [f.status for f in domains] == [Status.FAIL, Status.FAIL]
    assert "refuses every DMA" in domains[0].summary
