"""Is DMA from the GPUs and NICs translated by an IOMMU? GPUDirect RDMA needs 1:1.

The authoritative fact is per device: the default domain type of its IOMMU group
(``/sys/kernel/iommu_groups/N/type``). The kernel command line explains why, and is
the place to fix it; dmesg is not read because it rotates away.

The domain types a group reports are those of ``iommu_group_show_type`` (drivers/iommu/iommu.c;
Documentation/ABI/testing/sysfs-kernel-iommu_groups, Linux 5.11+): ``identity`` (DMA untranslated),
``DMA`` and ``DMA-FQ`` (translated, FQ with lazy invalidation), ``blocked`` (no DMA at all),
``unmanaged`` (owned by VFIO or another user-space driver); ``auto`` is only written, never read.

Which IOMMU does the translating matters. On x86 (Intel VT-d, AMD-Vi) GPUDirect RDMA through
nvidia-peermem hands the NIC GPU bus addresses that an IOMMU would remap: NVIDIA's GPUDirect
RDMA guide (CUDA docs, "Supported Systems") asks for the IOMMU off or in pass-through, so a
translating domain there fails. On Grace (Arm SMMUv3) translation is the normal, supported
configuration: Grace has no PCIe ATS, and NVIDIA's GPUDirect RDMA guide for Grace Blackwell
with ConnectX-8 (docs.nvidia.com/multi-node-nvlink-systems/grace-blackwell-cx8-gpudirect-rdma-guide,
"Platform Software and Configuration") reaches GPU memory through dma-buf and the NIC's
data-direct function with the SMMU in place, asking for no ``iommu.passthrough=1``. The
dma-buf exporter maps GPU memory for the NIC through the SMMU, so a DMA domain behind an
SMMUv3 is reported, not failed.
"""

from __future__ import annotations

from gdrprobe.doctor.facts import pci
from gdrprobe.report import finding_ids as ids
from gdrprobe.report.model import Evidence, Finding, Status
from gdrprobe.sysroot import SysRoot

GROUP = ids.IOMMU
CMDLINE = "/proc/cmdline"
IOMMU_GROUPS_DIR = "/sys/kernel/iommu_groups"

IDENTITY_TYPES = ("identity",)
TRANSLATED_TYPES = ("DMA", "DMA-FQ")
BLOCKED_TYPE = "blocked"
# The kernel names an Arm SMMUv3 "smmu3.<MMIO address>" (arm-smmu-v3.c, iommu_device_sysfs_add).
SMMUV3_PREFIX = "smmu3."
# The kernel options that decide the default domain, in the order they are reported.
IOMMU_OPTIONS = ("iommu", "iommu.passthrough", "intel_iommu", "amd_iommu")

TRANSLATED_FIX = ("Boot with iommu=pt (keeps the IOMMU for VFIO, identity for host devices) or "
                  "disable the IOMMU (intel_iommu=off / amd_iommu=off) on bare metal, then reboot.")


def domain_type_path(group: str) -> str:
    return f"{IOMMU_GROUPS_DIR}/{group}/type"


def domain_type(root: SysRoot, group: str) -> str | None:
    """identity, DMA, DMA-FQ, unmanaged, blocked (see above); None on kernels before 5.11."""
    return root.read(domain_type_path(group))


def cmdline_options(root: SysRoot) -> dict[str, str]:
    """The IOMMU-related options of /proc/cmdline, e.g. {"iommu": "pt", "intel_iommu": "on"}."""
    options = {}
    for token in (root.read(CMDLINE) or "").split():
        key, _, value = token.partition("=")
        if key in IOMMU_OPTIONS:
            options[key] = value
    return options


def _enables(value: str, word: str) -> bool:
    """intel_iommu and amd_iommu take comma-separated lists (intel_iommu=on,sm_on)."""
    return word in value.split(",")


def is_smmuv3(unit: str | None) -> bool:
    return unit is not None and unit.startswith(SMMUV3_PREFIX)


def cmdline_finding(root: SysRoot, smmu: bool = False) -> Finding:
    """``smmu``: the devices are behind an Arm SMMUv3, where translation is the supported default."""
    options = cmdline_options(root)
    evidence = (Evidence(CMDLINE, " ".join(f"{k}={v}" for k, v in options.items())
                         or "no IOMMU options"),)
    if smmu and not (options.get("iommu") == "pt" or options.get("iommu.passthrough") == "1"):
        return Finding(ids.IOMMU_CMDLINE, GROUP, Status.INFO,
                       "Arm SMMUv3 (Grace): translated DMA is the supported default here, "
                       "iommu.passthrough=1 is not needed for GPUDirect RDMA through dma-buf", evidence)
    if options.get("iommu") == "pt" or options.get("iommu.passthrough") == "1":
        return Finding(ids.IOMMU_CMDLINE, GROUP, Status.OK,
                       "kernel command line puts host devices in identity (passthrough) mode",
                       evidence)
    if (options.get("iommu") == "off" or _enables(options.get("intel_iommu", ""), "off")
            or _enables(options.get("amd_iommu", ""), "off")):
        return Finding(ids.IOMMU_CMDLINE, GROUP, Status.OK,
                       "kernel command line disables the IOMMU", evidence)
    if (_enables(options.get("intel_iommu", ""), "on") or options.get("iommu") == "force"
            or options.get("iommu.passthrough") == "0"):
        return Finding(ids.IOMMU_CMDLINE, GROUP, Status.WARN,
                       "IOMMU enabled without iommu=pt: devices default to translated DMA",
                       evidence, TRANSLATED_FIX)
    return Finding(ids.IOMMU_CMDLINE, GROUP, Status.INFO,
                   "no decisive IOMMU option: the kernel's build default applies "
                   "(see iommu.domain for what each device actually got)", evidence)


def device_evidence(root: SysRoot, bdf: str) -> tuple[str | None, tuple[Evidence, ...]]:
    """The device's domain type (or None) and the files that say so: its group, the group's
    type and, where the kernel links it, the IOMMU that translates for it."""
    link = pci.iommu_group_link(bdf)
    group = pci.iommu_group(root, bdf)
    if group is None:
        return None, (Evidence(link, "absent: the device is not behind an active IOMMU"),)
    kind = domain_type(root, group)
    unit = pci.iommu_unit(root, bdf)
    return kind, (Evidence(link, f"group {group}"),
                  Evidence(domain_type_path(group), kind if kind is not None else "absent"),
                  *((Evidence(pci.iommu_unit_link(bdf), unit),) if unit else ()))


def behind_smmuv3(root: SysRoot, devices) -> bool:
    """Every checked device that has an IOMMU has an Arm SMMUv3, and at least one has."""
    units = [pci.iommu_unit(root, device.bdf) for device in devices]
    present = [unit for unit in units if unit is not None]
    return bool(present) and all(is_smmuv3(unit) for unit in present)


def domain_findings(root: SysRoot, devices) -> list[Finding]:
    findings, clear = [], []
    for device in devices:
        kind, evidence = device_evidence(root, device.bdf)
        label = f"{device.name} ({device.bdf})"
        if kind in TRANSLATED_TYPES and is_smmuv3(pci.iommu_unit(root, device.bdf)):
            findings.append(Finding(
                ids.IOMMU_DOMAIN, GROUP, Status.INFO,
                f"{label}: IOMMU domain {kind} behind an Arm SMMUv3 (Grace): translated DMA is the "
                "supported configuration; GPU memory reaches the NIC through dma-buf, mapped by the SMMU",
                evidence))
        elif kind == BLOCKED_TYPE:
            findings.append(Finding(
                ids.IOMMU_DOMAIN, GROUP, Status.FAIL,
                f"{label}: IOMMU domain blocked: the IOMMU refuses every DMA of this device", evidence,
                "Bind the device to its kernel driver (nvidia / mlx5_core), or write 'auto' to the "
                "group's type file with no driver bound, so that it gets its default domain."))
        elif kind in TRANSLATED_TYPES:
            findings.append(Finding(
                ids.IOMMU_DOMAIN, GROUP, Status.FAIL,
                f"{label}: IOMMU domain {kind} (Translated): DMA addresses are remapped, which "
                "GPUDirect RDMA does not support and which can corrupt memory silently",
                evidence, TRANSLATED_FIX))
        elif kind == "unmanaged":
            findings.append(Finding(
                ids.IOMMU_DOMAIN, GROUP, Status.WARN,
                f"{label}: IOMMU domain unmanaged: the device is owned by VFIO or another "
                "user-space driver, not by the host kernel", evidence,
                "Bind the device back to its kernel driver (nvidia / mlx5_core) to use it here."))
        elif kind is None and len(evidence) > 1:
            findings.append(Finding(
                ids.IOMMU_DOMAIN, GROUP, Status.WARN,
                f"{label}: in an IOMMU group, but this kernel does not report the domain type",
                evidence, "Judge from iommu.cmdline; boot with iommu=pt to be sure DMA is 1:1."))
        elif kind is not None and kind not in IDENTITY_TYPES:
            findings.append(Finding(
                ids.IOMMU_DOMAIN, GROUP, Status.WARN,
                f"{label}: unexpected IOMMU domain type {kind!r}", evidence,
                "Expect identity (iommu=pt) or no IOMMU group; check the kernel's IOMMU options."))
        else:
            clear.append((label, evidence))
    if clear:
        findings.append(Finding(
            ids.IOMMU_DOMAIN, GROUP, Status.OK,
            "DMA of {} is untranslated (identity domain or no IOMMU)".format(
                ", ".join(label for label, _ in clear)),
            tuple(item for _, evidence in clear for item in evidence)))
    return findings


def check(ctx) -> list[Finding]:
    topology = ctx.topology
    devices = topology.gpus + topology.nics
    findings = [cmdline_finding(ctx.root, smmu=behind_smmuv3(ctx.root, devices))]
    if not devices:
        findings.append(Finding(ids.IOMMU_DOMAIN, GROUP, Status.SKIP,
                                "no GPU or PCI RDMA NIC to check",
                                (Evidence(pci.PCI_DEVICES_DIR, "no GPU or RDMA NIC"),)))
        return findings
    return findings + domain_findings(ctx.root, devices)
