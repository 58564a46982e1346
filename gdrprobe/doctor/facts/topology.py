"""Where the GPUs and RDMA NICs sit on the PCIe tree, and whether this is a virtual machine,
read from sysfs once (:attr:`gdrprobe.doctor.facts.context.DoctorContext.topology`).

Distances between them are NCCL's rule and vocabulary: :mod:`gdrprobe.nccl.topo`.
"""

from __future__ import annotations

import dataclasses

from gdrprobe.doctor.facts import pci
from gdrprobe.nccl.topo import common_prefix, nccl_path_type, pcie_distance
from gdrprobe.report.model import Evidence
from gdrprobe.sysroot import SysRoot

# sys_vendor / product_name substrings that only virtual machines report.
HYPERVISOR_DMI_MARKERS = ("qemu", "kvm", "vmware", "virtualbox", "xen", "virtual machine",
                          "bhyve", "openstack", "google compute engine", "cloud hypervisor")
# PCI vendors whose devices only exist inside virtual machines (emulated or paravirtual).
HYPERVISOR_PCI_VENDORS = {0x1AF4: "Red Hat virtio", 0x1B36: "Red Hat/QEMU",
                          0x15AD: "VMware", 0x1414: "Microsoft Hyper-V", 0x5853: "XenSource"}
DMI_FILES = ("/sys/devices/virtual/dmi/id/sys_vendor", "/sys/devices/virtual/dmi/id/product_name")
CPUINFO = "/proc/cpuinfo"
XEN_HYPERVISOR_TYPE = "/sys/hypervisor/type"


@dataclasses.dataclass(frozen=True)
class PcieDevice:
    """A GPU or an RDMA NIC and where it sits on the PCIe tree."""

    kind: str                      # "GPU" or "NIC"
    name: str                      # "GPU0" by bus order; the ibdev name (mlx5_0) for NICs
    bdf: str
    numa_node: int                 # -1 when sysfs does not say
    sysfs_path: str                # resolved /sys/devices/pci.../<bdf>
    host_bridge: str | None        # pci0000:00
    local_cpus: str | None         # local_cpulist, the "CPU Affinity" column of nvidia-smi
    bridges: tuple[str, ...]       # from the root port down to the direct parent


@dataclasses.dataclass(frozen=True)
class Virtualization:
    hypervisor: bool               # some file says this is a guest
    flat: bool                     # every GPU and NIC sits directly on a root bus
    evidence: tuple[Evidence, ...]

    @property
    def is_vm(self) -> bool:
        return self.hypervisor or self.flat


@dataclasses.dataclass(frozen=True)
class Topology:
    gpus: tuple[PcieDevice, ...]
    nics: tuple[PcieDevice, ...]
    software_nics: tuple[str, ...]     # RDMA devices with no PCI function (rxe, siw)
    virtualization: Virtualization

    def distance(self, a: PcieDevice, b: PcieDevice) -> str:
        return pcie_distance(a, b)

    def nccl_class(self, a: PcieDevice, b: PcieDevice) -> str:
        return nccl_path_type(a, b)

    def bridges_between(self, a: PcieDevice, b: PcieDevice) -> tuple[str, ...]:
        """Bridges a peer transaction from a to b crosses (all of both chains across host bridges)."""
        common = 0
        if a.host_bridge == b.host_bridge:
            common = common_prefix(a.bridges, b.bridges)
        # The deepest shared bridge is where the switch turns the packet around, so it counts.
        start = max(common - 1, 0)
        return tuple(dict.fromkeys(a.bridges[start:] + b.bridges[start:]))


# ---- building --------------------------------------------------------------


def _endpoint(root: SysRoot, kind: str, name: str, bdf: str) -> PcieDevice:
    path = pci.resolved_path(root, bdf)
    return PcieDevice(kind=kind, name=name, bdf=bdf, numa_node=pci.numa_node(root, bdf),
                      sysfs_path=path, host_bridge=pci.host_bridge(path),
                      local_cpus=pci.local_cpulist(root, bdf),
                      bridges=pci.parent_bridges(path))


def find_gpus(root: SysRoot, bdfs: list[str]) -> tuple[PcieDevice, ...]:
    gpu_bdfs = [bdf for bdf in bdfs if pci.is_nvidia_gpu(root, bdf)]
    return tuple(_endpoint(root, "GPU", f"GPU{i}", bdf) for i, bdf in enumerate(gpu_bdfs))


def find_nics(root: SysRoot) -> tuple[tuple[PcieDevice, ...], tuple[str, ...]]:
    """RDMA devices split into PCI NICs and software devices."""
    nics, software = [], []
    for ibdev in pci.rdma_devices(root):
        bdf = pci.rdma_device_bdf(root, ibdev)
        if bdf is None:
            software.append(ibdev)
        else:
            nics.append(_endpoint(root, "NIC", ibdev, bdf))
    nics.sort(key=lambda nic: (nic.bdf, nic.name))
    return tuple(nics), tuple(software)


def hypervisor_evidence(root: SysRoot, bdfs: list[str]) -> list[Evidence]:
    """Every file that says this machine is a guest; empty on bare metal."""
    found = []
    cpuinfo = root.read(CPUINFO) or ""
    flags = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
    if "hypervisor" in flags.split():
        found.append(Evidence(CPUINFO, "flags include 'hypervisor'"))
    for path in DMI_FILES:
        text = root.read(path)
        if text and any(marker in text.lower() for marker in HYPERVISOR_DMI_MARKERS):
            found.append(Evidence(path, text))
    xen = root.read(XEN_HYPERVISOR_TYPE)
    if xen:
        found.append(Evidence(XEN_HYPERVISOR_TYPE, xen))
    by_vendor: dict[int, list[str]] = {}
    for bdf in bdfs:
        vendor = pci.vendor_id(root, bdf)
        if vendor in HYPERVISOR_PCI_VENDORS:
            by_vendor.setdefault(vendor, []).append(bdf)
    for vendor, devices in by_vendor.items():
        found.append(Evidence(f"{pci.device_dir(devices[0])}/vendor",
                              f"0x{vendor:04x} ({HYPERVISOR_PCI_VENDORS[vendor]}), "
                              f"also on {len(devices) - 1} other device(s)"))
    return found


def detect_virtualization(root: SysRoot, bdfs: list[str],
                          endpoints: tuple[PcieDevice, ...]) -> Virtualization:
    hints = hypervisor_evidence(root, bdfs)
    flat = bool(endpoints) and all(not e.bridges for e in endpoints)
    placement = [Evidence("resolved /sys/bus/pci/devices links",
                          "; ".join(f"{e.name} -> {e.sysfs_path}" for e in endpoints))]
    return Virtualization(hypervisor=bool(hints), flat=flat,
                          evidence=tuple(hints + (placement if flat else [])))


def build_topology(root: SysRoot) -> Topology:
    bdfs = pci.list_devices(root)
    gpus = find_gpus(root, bdfs)
    nics, software = find_nics(root)
    # Flatness only means something when GPUs and NICs would share a tree.
    endpoints = gpus + nics if gpus and nics else ()
    return Topology(gpus=gpus, nics=nics, software_nics=software,
                    virtualization=detect_virtualization(root, bdfs, endpoints))
