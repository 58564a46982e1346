"""Is DMA from the GPUs and NICs translated by an IOMMU? GPUDirect RDMA needs 1:1.

The authoritative fact is per device: the default domain type of its IOMMU group
(``/sys/kernel/iommu_groups/N/type``). The kernel command line explains why, and is
the place to fix it; dmesg is not read because it rotates away.
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
# The kernel options that decide the default domain, in the order they are reported.
IOMMU_OPTIONS = ("iommu", "iommu.passthrough", "intel_iommu", "amd_iommu")

TRANSLATED_FIX = ("Boot with iommu=pt (keeps the IOMMU for VFIO, identity for host devices) or "
                  "disable the IOMMU (intel_iommu=off / amd_iommu=off) on bare metal, then reboot.")


def domain_type_path(group: str) -> str:
    return f"{IOMMU_GROUPS_DIR}/{group}/type"


def domain_type(root: SysRoot, group: str) -> str | None:
    """identity, DMA, DMA-FQ, unmanaged, blocked; None on kernels that do not expose it."""
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


def cmdline_finding(root: SysRoot) -> Finding:
    options = cmdline_options(root)
    evidence = (Evidence(CMDLINE, " ".join(f"{k}={v}" for k, v in options.items())
                         or "no IOMMU options"),)
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
    """The device's domain type (or None) and the files that say so."""
    link = pci.iommu_group_link(bdf)
    group = pci.iommu_group(root, bdf)
    if group is None:
        return None, (Evidence(link, "absent: the device is not behind an active IOMMU"),)
    kind = domain_type(root, group)
    return kind, (Evidence(link, f"group {group}"),
                  Evidence(domain_type_path(group), kind if kind is not None else "absent"))


def domain_findings(root: SysRoot, devices) -> list[Finding]:
    findings, clear = [], []
    for device in devices:
        kind, evidence = device_evidence(root, device.bdf)
        label = f"{device.name} ({device.bdf})"
        if kind in TRANSLATED_TYPES:
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
    findings = [cmdline_finding(ctx.root)]
    devices = topology.gpus + topology.nics
    if not devices:
        findings.append(Finding(ids.IOMMU_DOMAIN, GROUP, Status.SKIP,
                                "no GPU or PCI RDMA NIC to check",
                                (Evidence(pci.PCI_DEVICES_DIR, "no GPU or RDMA NIC"),)))
        return findings
    return findings + domain_findings(ctx.root, devices)
