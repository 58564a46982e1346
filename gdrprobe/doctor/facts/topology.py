"""Where the GPUs and RDMA NICs sit on the PCIe tree, and whether this is a virtual machine,
read from sysfs once (:attr:`gdrprobe.doctor.facts.context.DoctorContext.topology`); and
NCCL's topology file, read once as NCCL reads it, with where it puts each of those devices
(:attr:`gdrprobe.doctor.facts.context.DoctorContext.nccl_topology_file`).

Distances between them are NCCL's rule and vocabulary: :mod:`gdrprobe.nccl.topo`; the
file's format and NCCL's use of it: :mod:`gdrprobe.nccl.topo_file`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping

from gdrprobe.doctor.facts import pci
from gdrprobe.doctor.facts.runtimes import listed_gpus
from gdrprobe.nccl import params
from gdrprobe.nccl.nets import mapped_function, merge_vfs
from gdrprobe.nccl.topo import common_prefix, nccl_path_type, pci_parents, pcie_distance
from gdrprobe.nccl.topo_file import (MAX_FILE_BYTES, OversizedFile, Placement, TopoFileError, TopoFileSetting,
                                     TopologyXml, Version, parse_topology, place_device, topo_file_setting)
from gdrprobe.report.model import Evidence
from gdrprobe.sysroot import LINK_LOOP, SysRoot

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
    # Where NCCL's topology file puts it: the switches above it (NCCL's view only, see
    # gdrprobe.doctor.facts.nccl_node); None: NCCL places it from sysfs.
    nccl_parents: tuple[str, ...] | None = None


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

    def meeting_ports(self, a: PcieDevice, b: PcieDevice) -> tuple[str, ...]:
        """The downstream ports of the switch where a's and b's paths meet, through which their
        peer traffic enters it, one per side that has one; () where they meet only in the
        root complex (other root ports, other host bridges), which the traffic crosses
        whatever ACS says. A port below that switch forwards it upstream either way: the peer
        is not below it."""
        if a.host_bridge != b.host_bridge:
            return ()
        common = common_prefix(a.bridges, b.bridges)
        if common == 0:
            return ()
        return tuple(dict.fromkeys(chain[common] for chain in (a.bridges, b.bridges) if len(chain) > common))

    def bridges_between(self, a: PcieDevice, b: PcieDevice) -> tuple[str, ...]:
        """Bridges a peer transaction from a to b crosses (all of both chains across host bridges)."""
        common = 0
        if a.host_bridge == b.host_bridge:
            common = common_prefix(a.bridges, b.bridges)
        # The deepest shared bridge is where the switch turns the packet around, so it counts.
        start = max(common - 1, 0)
        return tuple(dict.fromkeys(a.bridges[start:] + b.bridges[start:]))


# ---- building --------------------------------------------------------------


def pcie_endpoint(root: SysRoot, kind: str, name: str, bdf: str) -> PcieDevice:
    path = pci.resolved_path(root, bdf)
    return PcieDevice(kind=kind, name=name, bdf=bdf, numa_node=pci.numa_node(root, bdf),
                      sysfs_path=path, host_bridge=pci.host_bridge(path),
                      local_cpus=pci.local_cpulist(root, bdf),
                      bridges=pci.parent_bridges(path))


def find_gpus(root: SysRoot, bdfs: list[str]) -> tuple[PcieDevice, ...]:
    """The GPUs every registered runtime's driver lists (its collector's ``listed_gpus``:
    NVIDIA's GPU functions, the GPUs amdkfd lists), in PCI bus order."""
    listed = listed_gpus(root)
    gpu_bdfs = [bdf for bdf in bdfs if bdf in listed]
    return tuple(pcie_endpoint(root, "GPU", f"GPU{i}", bdf) for i, bdf in enumerate(gpu_bdfs))


def find_nics(root: SysRoot) -> tuple[tuple[PcieDevice, ...], tuple[str, ...]]:
    """RDMA devices split into PCI NICs and software devices."""
    nics, software = [], []
    for ibdev in pci.rdma_devices(root):
        bdf = pci.rdma_device_bdf(root, ibdev)
        if bdf is None:
            software.append(ibdev)
        else:
            nics.append(pcie_endpoint(root, "NIC", ibdev, bdf))
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


# ---- NCCL's topology file ---------------------------------------------------------------------

# What became of the file: NCCL looks for none; it cannot open it (and goes on without);
# gdrprobe cannot read this user's copy; too long to judge; NCCL fails on it; NCCL reads it.
# A FIFO there: NCCL's fopen waits for a writer.
NO_FILE, ABSENT, UNREADABLE, TOO_LARGE, MALFORMED, LOADED, HANGS = (
    "none", "absent", "unreadable", "too large", "malformed", "loaded", "hangs")


@dataclasses.dataclass(frozen=True)
class NcclTopologyFile:
    """NCCL's topology file on this machine and what NCCL makes of it."""

    setting: TopoFileSetting | None        # None: NCCL looks for no file
    state: str                             # one of NO_FILE ... LOADED
    detail: str = ""                       # NCCL's error, or why the file is not read
    path: str = ""                         # the file read, links resolved
    placements: Mapping[str, Placement] = dataclasses.field(default_factory=dict)  # GPU/NIC bus id -> place
    result: str = ""                       # what NCCL's init returns on a malformed file

    @property
    def named(self) -> str:
        return self.setting.describe() if self.setting else "none"

    @property
    def said(self) -> bool:
        """Whether the file is worth a word in each decision: NCCL_TOPO_FILE names it, or it
        is there at NCCL's default path."""
        return self.state != NO_FILE and (self.setting.named or self.state != ABSENT)

    def consequence(self) -> str:
        """What NCCL does about a file it does not load."""
        return {
            ABSENT: f"NCCL cannot open it ({self.detail}), so it detects every device from sysfs",
            UNREADABLE: f"{self.detail}: NCCL run by this user detects every device from sysfs, one run by a user "
                        "who may read it places them as the file says",
            TOO_LARGE: f"{self.detail}: what NCCL makes of it is not judged, every device is judged from sysfs",
            HANGS: f"{self.detail}: NCCL's fopen waits for something to write to it, so every communicator's "
                   "init hangs; the devices are judged from sysfs",
            MALFORMED: f"NCCL fails on it ({self.detail}): every communicator's init returns {self.result}, "
                       "so the job stops before any transfer; the devices are judged from sysfs, as NCCL would "
                       "place them without the file",
        }.get(self.state, "")


def nic_bus_id(nic: PcieDevice, environ: Mapping[str, str]) -> str:
    """The function NCCL's IB transport names for a NIC (net_ib ncclIbGetPciPath,
    NCCL_IB_MERGE_VFS on by default), which NCCL looks up in the file."""
    return mapped_function(nic.bdf, merge_vfs(environ))


def place_devices(root: SysRoot, xml: TopologyXml, topology: Topology,
                  environ: Mapping[str, str]) -> dict[str, Placement]:
    """Where the file puts each GPU and PCI NIC (those it has no say on are left out)."""
    in_sysfs = set(pci.list_devices(root))
    found = {}
    for device in topology.gpus + topology.nics:
        bus_id, name = (device.bdf, None) if device.kind == "GPU" else (nic_bus_id(device, environ), device.name)
        placement = place_device(xml, bus_id, pci_parents(device.bridges), in_sysfs, name)
        if placement is not None:
            found[device.bdf] = placement
    return found


def topology_file_path(root: SysRoot, setting: TopoFileSetting) -> str:
    """The file fopen opens: a relative name from the working directory, links resolved
    inside the root (a replay must not follow an absolute link out of the capture)."""
    return root.realpath(os.path.join(os.getcwd(), setting.path))


def read_nccl_topology_file(root: SysRoot, environ: Mapping[str, str], origin: Callable[[str], str],
                            version: Version, topology: Topology) -> NcclTopologyFile:
    """NCCL's topology file as the NCCL ``version`` finds and reads it (topo.cc
    ncclTopoGetSystem, xml.cc ncclTopoGetXmlFromFile); ``environ`` is NCCL's (its
    configuration files merged), ``origin`` says where a variable of it comes from."""
    setting = topo_file_setting(environ, origin(params.TOPO_FILE.name), version)
    if setting is None:
        return NcclTopologyFile(None, NO_FILE)
    if not setting.path:
        return NcclTopologyFile(setting, ABSENT, "fopen(\"\") fails: the name is empty")
    try:
        path = topology_file_path(root, setting)
    except OSError as error:          # a link loop: fopen fails as the kernel's lookup does
        return NcclTopologyFile(setting, ABSENT, error.strerror, setting.path)
    data = root.read_bytes(path, MAX_FILE_BYTES)
    if data is None:
        return unopened(root, setting, path)
    try:
        xml = parse_topology(data.decode("latin-1"), version)
        placements = place_devices(root, xml, topology, environ)
    except OversizedFile as error:
        return NcclTopologyFile(setting, TOO_LARGE, str(error), path)
    except TopoFileError as error:
        return NcclTopologyFile(setting, MALFORMED, error.message, path, result=error.result)
    detail = "" if xml.has_system else "it holds no <system version=...> element NCCL reads"
    return NcclTopologyFile(setting, LOADED, detail, path, placements)


def unopened(root: SysRoot, setting: TopoFileSetting, path: str) -> NcclTopologyFile:
    """A file gdrprobe could not read: absent (NCCL cannot open it either), or there but
    not readable by this user (NCCL run by this user cannot open it; one run by a user who
    can, can), or a directory (NCCL opens it and reads nothing)."""
    if not root.exists(path):
        return NcclTopologyFile(setting, ABSENT, "no such file", path)
    if root.is_denied(path):
        return NcclTopologyFile(setting, UNREADABLE, "this user may not read it", path)
    kind = root.why_refused(path)
    if kind == LINK_LOOP:
        return NcclTopologyFile(setting, ABSENT, kind, path)
    if kind == "a FIFO":
        return NcclTopologyFile(setting, HANGS, "it is a FIFO, not a regular file", path)
    if kind:
        return NcclTopologyFile(setting, UNREADABLE, f"it is {kind}, not a regular file: what NCCL "
                                "reads from it is not judged", path)
    return NcclTopologyFile(setting, UNREADABLE, "not a file that can be read (a directory?)", path)
