"""Facts about PCI devices, read from sysfs under a :class:`SysRoot`, one fact per function.

sysfs is the only source: ``/sys/bus/pci/devices/<BDF>`` links into the device tree
under ``/sys/devices/pciDDDD:BB/...``, and the directories on that resolved path are
the bridges between the device and its host bridge. Every function takes the root
and a BDF (``0000:1b:00.0``) and returns None (or -1 for NUMA) when sysfs does not say.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gdrprobe.nccl.topo import PcieLink, Port, pci_device_id
from gdrprobe.numbers import decimal
from gdrprobe.sysroot import (GPU_CLASSES, NVIDIA_VENDOR_ID, PCI_DEVICES_DIR, SysRoot,
                              is_pci_bus_id)

INFINIBAND_CLASS_DIR = "/sys/class/infiniband"

# Without CAP_SYS_ADMIN the kernel serves only the standard header of config space.
UNPRIVILEGED_CONFIG_BYTES = 64
EXTENDED_CONFIG_BYTES = 4096
EXTENDED_CAPABILITIES_START = 0x100

NCCL_ID_ATTRIBUTES = ("vendor", "device", "subsystem_vendor", "subsystem_device")

HOST_BRIDGE_PATTERN = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")


def device_dir(bdf: str) -> str:
    return f"{PCI_DEVICES_DIR}/{bdf}"


def list_devices(root: SysRoot) -> list[str]:
    """Every PCI function the kernel knows, by BDF, in bus order."""
    return [name for name in root.listdir(PCI_DEVICES_DIR) if is_pci_bus_id(name)]


def resolved_path(root: SysRoot, bdf: str) -> str:
    """The device's real directory, e.g. /sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0."""
    return root.resolve(device_dir(bdf))


def _read_hex(root: SysRoot, path: str) -> int | None:
    text = root.read(path)
    if not text:
        return None
    try:
        return int(text, 16)
    except ValueError:
        return None


def nccl_device_id(root: SysRoot, bdf: str, in_file: Mapping[str, str] | None = None) -> int:
    """The id NCCL gives a PCI switch (:func:`gdrprobe.nccl.topo.pci_device_id`) from the
    same four sysfs attributes it reads (src/graph/xml.cc ncclTopoGetXmlFromSys), each one
    NCCL's topology file gives for the switch (``in_file``) taken from the file instead."""
    in_file = in_file or {}
    return pci_device_id(*(in_file[name] if name in in_file else root.read(f"{device_dir(bdf)}/{name}") or ""
                           for name in NCCL_ID_ATTRIBUTES))


def vendor_id(root: SysRoot, bdf: str) -> int | None:
    return _read_hex(root, f"{device_dir(bdf)}/vendor")


def class_code(root: SysRoot, bdf: str) -> int | None:
    """The 24-bit class code (class, subclass, programming interface)."""
    return _read_hex(root, f"{device_dir(bdf)}/class")


def numa_node(root: SysRoot, bdf: str) -> int:
    """The device's NUMA node; -1 when the platform does not say (also single-node boxes)."""
    text = root.read(f"{device_dir(bdf)}/numa_node")
    try:
        return int(text) if text else -1
    except ValueError:
        return -1


def host_bridge(path: str) -> str | None:
    """The host bridge (root complex) a resolved device path hangs off, e.g. pci0000:00."""
    for part in path.split("/"):
        if HOST_BRIDGE_PATTERN.match(part):
            return part
    return None


def parent_bridges(path: str) -> tuple[str, ...]:
    """BDFs of the bridges above a device, from its root port down to its direct parent."""
    functions = [part for part in path.split("/") if is_pci_bus_id(part)]
    return tuple(functions[:-1])


def is_nvidia_gpu(root: SysRoot, bdf: str) -> bool:
    code = class_code(root, bdf)
    return (vendor_id(root, bdf) == NVIDIA_VENDOR_ID and code is not None
            and code >> 8 in GPU_CLASSES)


# Drivers that hand a PCI function to a virtual machine: such a GPU is not this host's
# runtime's.
PASSTHROUGH_DRIVERS = ("vfio-pci", "pci-stub")


def bound_driver(root: SysRoot, bdf: str) -> str | None:
    """The kernel driver a PCI function is bound to (its sysfs ``driver`` link), or None."""
    link = root.readlink(f"{device_dir(bdf)}/driver")
    return link.rstrip("/").rsplit("/", 1)[-1] if link else None


def passed_through(root: SysRoot, bdf: str) -> bool:
    """Whether the function is bound to a driver that hands it to a virtual machine."""
    return bound_driver(root, bdf) in PASSTHROUGH_DRIVERS


def config_path(bdf: str) -> str:
    return f"{device_dir(bdf)}/config"


def read_config(root: SysRoot, bdf: str) -> bytes | None:
    """As much of the config space as the kernel lets this user read (64, 256 or 4096 bytes)."""
    return root.read_bytes(config_path(bdf), EXTENDED_CONFIG_BYTES)


def config_truncated_for_user(config: bytes) -> bool:
    """True when only the unprivileged 64-byte header came back, so capabilities are hidden."""
    return len(config) <= UNPRIVILEGED_CONFIG_BYTES


def extended_capabilities(config: bytes) -> dict[int, int]:
    """Extended capability ID -> offset, walking the list that starts at 0x100."""
    found: dict[int, int] = {}
    offset = EXTENDED_CAPABILITIES_START
    # A corrupt list could loop; there cannot be more capabilities than dwords.
    for _ in range(EXTENDED_CONFIG_BYTES // 4):
        if offset < EXTENDED_CAPABILITIES_START or offset + 4 > len(config):
            break
        header = int.from_bytes(config[offset:offset + 4], "little")
        if header in (0, 0xFFFFFFFF):
            break
        found.setdefault(header & 0xFFFF, offset)
        offset = (header >> 20) & 0xFFC
        if offset == 0:
            break
    return found


ATS_CAPABILITY_ID = 0x000F      # PCIe Base Specification: Address Translation Services
ATS_CONTROL_OFFSET = 6          # ATS Control Register, after the header and ATS Capability
ATS_ENABLE_BIT = 15


def ats_enabled(root: SysRoot, bdf: str) -> bool | None:
    """Whether the device has ATS on (ATS Control's Enable bit); None where its config space
    cannot be read past 64 bytes or shows no ATS capability (a guest may not see it)."""
    config = read_config(root, bdf)
    if config is None or config_truncated_for_user(config):
        return None
    offset = extended_capabilities(config).get(ATS_CAPABILITY_ID)
    if offset is None or offset + ATS_CONTROL_OFFSET + 2 > len(config):
        return None
    control = int.from_bytes(config[offset + ATS_CONTROL_OFFSET:offset + ATS_CONTROL_OFFSET + 2], "little")
    return bool(control >> ATS_ENABLE_BIT & 1)


def iommu_group_link(bdf: str) -> str:
    return f"{device_dir(bdf)}/iommu_group"


def iommu_group(root: SysRoot, bdf: str) -> str | None:
    """The IOMMU group number, or None when the device has no group (IOMMU off)."""
    target = root.readlink(iommu_group_link(bdf))
    return target.rstrip("/").rsplit("/", 1)[-1] if target else None


def iommu_unit_link(bdf: str) -> str:
    return f"{device_dir(bdf)}/iommu"


def iommu_unit(root: SysRoot, bdf: str) -> str | None:
    """The name of the IOMMU that translates the device's DMA (the kernel links each device it
    manages to its IOMMU: drivers/iommu/iommu-sysfs.c, iommu_device_link): dmar0 (Intel
    VT-d), ivhd0 (AMD-Vi), smmu3.0x... (Arm SMMUv3, drivers/iommu/arm/arm-smmu-v3); None
    when there is no link."""
    target = root.readlink(iommu_unit_link(bdf))
    return target.rstrip("/").rsplit("/", 1)[-1] if target else None


# PCI functions that are RDMA NICs whatever driver is bound: an InfiniBand controller (class
# 0x0207, any vendor), and Mellanox/NVIDIA networking's (vendor 0x15b3) network controllers
# (class 0x02: ConnectX in Ethernet mode is 0x0200), the PCI ids the kernel's mlx5_core binds.
MELLANOX_VENDOR_ID = 0x15B3
NETWORK_CLASS = 0x02
INFINIBAND_CLASS = 0x0207


def is_rdma_nic(root: SysRoot, bdf: str) -> bool:
    code = class_code(root, bdf)
    if code is None:
        return False
    return code >> 8 == INFINIBAND_CLASS or (vendor_id(root, bdf) == MELLANOX_VENDOR_ID
                                             and code >> 16 == NETWORK_CLASS)


def rdma_nics_without_device(root: SysRoot) -> list[str]:
    """The RDMA NICs on the PCI bus, by BDF, where /sys/class/infiniband lists no device at
    all: the NIC is there, its RDMA driver (mlx5_ib for ConnectX) is not loaded."""
    if rdma_devices(root):
        return []
    return [bdf for bdf in list_devices(root) if is_rdma_nic(root, bdf)]


def rdma_devices(root: SysRoot) -> list[str]:
    """Names of the RDMA devices (mlx5_0, rxe0, ...) in /sys/class/infiniband."""
    return root.listdir(INFINIBAND_CLASS_DIR)


def rdma_device_bdf(root: SysRoot, ibdev: str) -> str | None:
    """The PCI function behind an RDMA device; None for software devices (rxe, siw).

    Software devices live under /sys/devices/virtual even when their ``device`` link
    points at the PCI function of the Ethernet port they ride on, so that is checked first.
    """
    if root.resolve(f"{INFINIBAND_CLASS_DIR}/{ibdev}").startswith("/sys/devices/virtual/"):
        return None
    link = f"{INFINIBAND_CLASS_DIR}/{ibdev}/device"
    if not root.exists(link):
        return None
    name = root.resolve(link).rstrip("/").rsplit("/", 1)[-1]
    return name if is_pci_bus_id(name) else None


def local_cpulist(root: SysRoot, bdf: str) -> str | None:
    """The CPUs closest to the device, as the kernel lists them (e.g. 0-55,112-167)."""
    return root.read(f"{device_dir(bdf)}/local_cpulist")


def pcie_link(root: SysRoot, bdf: str, in_file: Mapping[str, str] | None = None) -> PcieLink:
    """The device's PCIe link as sysfs states it: its own max_link_speed and max_link_width
    and those of the port above it (NCCL rates them:
    :func:`gdrprobe.nccl.topo.link_bandwidth_gbs`). Where NCCL's topology file gives the
    device's link_speed or link_width (``in_file``), NCCL keeps that instead of reading
    sysfs (src/graph/xml.cc ncclTopoGetXmlFromSys), so it stands for both ends."""
    in_file = in_file or {}
    path = resolved_path(root, bdf)
    parent = path.rsplit("/", 1)[0]
    speeds = ((in_file["link_speed"],) * 2 if "link_speed" in in_file else
              (root.read(path + "/max_link_speed") or "", root.read(parent + "/max_link_speed") or ""))
    widths = ((in_file["link_width"],) * 2 if "link_width" in in_file else
              (root.read(path + "/max_link_width") or "", root.read(parent + "/max_link_width") or ""))
    return PcieLink(device_speed=speeds[0], port_speed=speeds[1], device_width=widths[0], port_width=widths[1])


def rdma_ports(root: SysRoot, ibdev: str) -> tuple[Port, ...]:
    """The ports of an RDMA device with their state and the line rate the kernel states."""
    from gdrprobe.rdma.verbs import rate_file_gbps

    base = f"{INFINIBAND_CLASS_DIR}/{ibdev}/ports"
    return tuple(Port(decimal(name), root.read(f"{base}/{name}/state"),
                      rate_file_gbps(root.read(f"{base}/{name}/rate")),
                      root.read(f"{base}/{name}/link_layer"))
                 for name in root.listdir(base) if decimal(name) is not None)


def line_rate_gbps(ports) -> float | None:
    """The line rate of ports (a NIC's, or one port's alone): the rates the kernel states
    summed, a rate of 0 stating none; None where no port states one. The doctor's rails
    and the check's floor and rails read it here (one port: ``line_rate_gbps([port])``)."""
    rates = [port.rate_gbps for port in ports if port.rate_gbps]
    return float(sum(rates)) if rates else None


def current_link_speed(root: SysRoot, bdf: str) -> str | None:
    """The speed the link negotiated (e.g. "16.0 GT/s PCIe"): a port's, the link below it;
    an endpoint's or a switch upstream port's, the link above it."""
    return root.read(f"{device_dir(bdf)}/current_link_speed")


def current_link_width(root: SysRoot, bdf: str) -> str | None:
    """The lanes the link negotiated (e.g. "8" on a x16 slot trained down)."""
    return root.read(f"{device_dir(bdf)}/current_link_width")
