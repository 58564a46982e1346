"""Fixture machines: only the sysfs and procfs files the doctor reads, laid out like the kernel's.

A :class:`SysfsTree` writes under a temporary root: PCI functions as directories nested
under ``/sys/devices/pciDDDD:BB`` with real binary config space, the
``/sys/bus/pci/devices`` and ``/sys/class/infiniband`` symbolic links, IOMMU groups,
``/proc/cmdline`` and ``/proc/cpuinfo``. The machine functions at the bottom build whole
nodes and return the tree, so a test can add to them (another check's files, a broken
setting) before running the doctor.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

INTEL, NVIDIA, MELLANOX, BROADCOM, REDHAT_VIRTIO = 0x8086, 0x10DE, 0x15B3, 0x1000, 0x1AF4
HOST_BRIDGE_CLASS, PCI_BRIDGE_CLASS = 0x060000, 0x060400
GPU_3D_CLASS, INFINIBAND_CLASS, ETHERNET_CLASS = 0x030200, 0x020700, 0x020000
H100_SXM, CONNECTX7, PEX_SWITCH, Q35_HOST = 0x2330, 0x1021, 0xC030, 0x29C0

AER_OFFSET, ACS_OFFSET = 0x100, 0x148
ACS_REDIRECTING = 0x001D          # SrcValid+ ReqRedir+ CmpltRedir+ UpstreamFwd+, what Linux sets
BARE_METAL_CMDLINE = "BOOT_IMAGE=/boot/vmlinuz-6.8.0 root=UUID=0000 ro iommu=pt"

# Host bridge buses of a DGX-H100-like node: one root complex per GPU/NIC pair.
PIX_NODE_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


def config_space(vendor: int, device: int, class_code: int, *, bridge: bool = False,
                 acs_control: int | None = None) -> bytes:
    """4096 bytes of PCIe config space: header, a PCIe capability, AER, and ACS when given."""
    space = bytearray(4096)
    space[0:2] = vendor.to_bytes(2, "little")
    space[2:4] = device.to_bytes(2, "little")
    space[6:8] = (0x0010).to_bytes(2, "little")            # status: capability list present
    space[9:12] = class_code.to_bytes(3, "little")
    space[0x0E] = 0x01 if bridge else 0x00
    space[0x34] = 0x40
    space[0x40:0x42] = bytes((0x10, 0x00))                  # PCI Express capability, last
    next_offset = ACS_OFFSET if acs_control is not None else 0
    space[AER_OFFSET:AER_OFFSET + 4] = (0x0001 | 1 << 16 | next_offset << 20).to_bytes(4, "little")
    if acs_control is not None:
        space[ACS_OFFSET:ACS_OFFSET + 4] = (0x000D | 1 << 16).to_bytes(4, "little")
        space[ACS_OFFSET + 4:ACS_OFFSET + 6] = (0x007F).to_bytes(2, "little")   # ACSCap: all
        space[ACS_OFFSET + 6:ACS_OFFSET + 8] = acs_control.to_bytes(2, "little")
    return bytes(space)


class SysfsTree:
    """Builds a machine's sysfs/procfs under ``root``; paths given to methods are machine paths."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.devices: dict[str, str] = {}            # bdf -> machine path of its directory
        self._numa: dict[str, tuple[int, str]] = {}  # host bridge -> (NUMA node, local CPUs)
        self._host_dirs: dict[str, str] = {}         # host bridge -> machine path of its directory
        self._next_iommu_group = 0
        self.cmdline(BARE_METAL_CMDLINE)
        self.cpuinfo(hypervisor=False)

    # -- raw files -------------------------------------------------------------
    def path(self, machine_path: str) -> Path:
        return self.root / machine_path.lstrip("/")

    def write(self, machine_path: str, data: str | bytes) -> None:
        target = self.path(machine_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            target.write_bytes(data)
        else:
            target.write_text(data)

    def symlink(self, machine_link: str, machine_target: str) -> None:
        """A relative link, as sysfs makes them (../../../devices/...)."""
        link = self.path(machine_link)
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(machine_target, os.path.dirname(machine_link)), link)

    # -- procfs and platform ---------------------------------------------------
    def cmdline(self, text: str) -> None:
        self.write("/proc/cmdline", text + "\n")

    def cpuinfo(self, hypervisor: bool) -> None:
        flags = "fpu vme de pse tsc msr pae" + (" hypervisor" if hypervisor else "")
        self.write("/proc/cpuinfo", f"processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: {flags}\n\n")

    def dmi(self, vendor: str, product: str) -> None:
        self.write("/sys/devices/virtual/dmi/id/sys_vendor", vendor + "\n")
        self.write("/sys/devices/virtual/dmi/id/product_name", product + "\n")

    def environ(self, variables: dict[str, str]) -> None:
        """What a capture stores of the environment; replays of this root read it."""
        self.write("/gdrprobe-capture/environ.json", json.dumps(variables))

    # -- PCI -------------------------------------------------------------------
    def host_bridge(self, bus: int, numa: int = 0, cpus: str = "0-55", domain: int = 0,
                    under: str = "/sys/devices", function: bool = True) -> str:
        """A root complex pciDDDD:BB (``under`` another device: a Hyper-V VMBus channel) with
        its host bridge function unless ``function`` is False; returns its name."""
        name = f"pci{domain:04x}:{bus:02x}"
        self._numa[name] = (numa, cpus)
        self._host_dirs[name] = f"{under}/{name}"
        self.path(self._host_dirs[name]).mkdir(parents=True, exist_ok=True)
        if function:
            self.function(name, f"{domain:04x}:{bus:02x}:00.0", INTEL, 0x09A2, HOST_BRIDGE_CLASS)
        return name

    def function(self, parent: str, bdf: str, vendor: int, device: int, class_code: int,
                 *, acs_control: int | None = None) -> str:
        """A PCI function under ``parent`` (a host bridge name or a bridge BDF); returns its BDF."""
        parent_dir = self.devices.get(parent) or self._host_dirs[parent]
        host = next(part for part in parent_dir.split("/") if part.startswith("pci"))
        numa, cpus = self._numa[host]
        directory = f"{parent_dir}/{bdf}"
        self.devices[bdf] = directory
        self.write(f"{directory}/vendor", f"0x{vendor:04x}\n")
        self.write(f"{directory}/device", f"0x{device:04x}\n")
        self.write(f"{directory}/class", f"0x{class_code:06x}\n")
        self.write(f"{directory}/numa_node", f"{numa}\n")
        self.write(f"{directory}/local_cpulist", f"{cpus}\n")
        self.write(f"{directory}/config", config_space(
            vendor, device, class_code, bridge=class_code >> 8 == 0x0604, acs_control=acs_control))
        self.symlink(f"/sys/bus/pci/devices/{bdf}", directory)
        return bdf

    def bridge(self, parent: str, bdf: str, acs_control: int = 0, vendor: int = BROADCOM) -> str:
        return self.function(parent, bdf, vendor, PEX_SWITCH, PCI_BRIDGE_CLASS,
                             acs_control=acs_control)

    def switch(self, parent: str, upstream: str, downstream: list[str]) -> list[str]:
        """A PCIe switch: one upstream port and its downstream ports; returns the downstream BDFs."""
        self.bridge(parent, upstream)
        return [self.bridge(upstream, port) for port in downstream]

    def gpu(self, parent: str, bdf: str) -> str:
        return self.function(parent, bdf, NVIDIA, H100_SXM, GPU_3D_CLASS)

    def nic(self, parent: str, bdf: str, ibdev: str, class_code: int = INFINIBAND_CLASS) -> str:
        """A ConnectX function with its RDMA device, linked from /sys/class/infiniband."""
        self.function(parent, bdf, MELLANOX, CONNECTX7, class_code)
        ib_dir = f"{self.devices[bdf]}/infiniband/{ibdev}"
        self.symlink(f"{ib_dir}/device", self.devices[bdf])
        self.symlink(f"/sys/class/infiniband/{ibdev}", ib_dir)
        return bdf

    def software_rdma(self, ibdev: str = "rxe0") -> None:
        """A Soft-RoCE device: it lives under /sys/devices/virtual, with no PCI function."""
        ib_dir = f"/sys/devices/virtual/infiniband/{ibdev}"
        self.write(f"{ib_dir}/node_type", "1: CA\n")
        self.symlink(f"/sys/class/infiniband/{ibdev}", ib_dir)

    # -- settings applied to devices already built ------------------------------
    def link(self, bdf: str, speed: str, width: int) -> None:
        """The link a port or device negotiated, as sysfs states it."""
        self.write(f"{self.devices[bdf]}/current_link_speed", f"{speed}\n")
        self.write(f"{self.devices[bdf]}/current_link_width", f"{width}\n")

    def set_acs(self, bdf: str, acs_control: int = ACS_REDIRECTING) -> None:
        config = bytearray(self.path(f"{self.devices[bdf]}/config").read_bytes())
        config[ACS_OFFSET:ACS_OFFSET + 4] = (0x000D | 1 << 16).to_bytes(4, "little")
        config[ACS_OFFSET + 6:ACS_OFFSET + 8] = acs_control.to_bytes(2, "little")
        header = int.from_bytes(config[AER_OFFSET:AER_OFFSET + 4], "little")
        config[AER_OFFSET:AER_OFFSET + 4] = (header & 0xFFFFF | ACS_OFFSET << 20).to_bytes(4, "little")
        self.write(f"{self.devices[bdf]}/config", bytes(config))

    def unprivileged_config(self) -> None:
        """What a non-root reader gets: the first 64 bytes of every config space."""
        for directory in self.devices.values():
            config = self.path(f"{directory}/config")
            config.write_bytes(config.read_bytes()[:64])

    def iommu_groups(self, domain_type: str | None, bdfs: list[str] | None = None,
                     unit: str | None = None) -> None:
        """Put each device (all by default) in its own IOMMU group of the given default domain type.

        ``domain_type=None`` leaves out the type file, as kernels before 5.11 do. ``unit``: the
        IOMMU each device links to (dmar0, smmu3.0x0000000011000000), as the kernel links them.
        """
        for bdf in bdfs if bdfs is not None else sorted(self.devices):
            group = f"/sys/kernel/iommu_groups/{self._next_iommu_group}"
            self._next_iommu_group += 1
            self.path(f"{group}/devices").mkdir(parents=True, exist_ok=True)
            if domain_type is not None:
                self.write(f"{group}/type", domain_type + "\n")
            self.symlink(f"{self.devices[bdf]}/iommu_group", group)
            if unit is not None:
                self.path(f"/sys/class/iommu/{unit}").mkdir(parents=True, exist_ok=True)
                self.symlink(f"{self.devices[bdf]}/iommu", f"/sys/class/iommu/{unit}")


# ---- machines --------------------------------------------------------------------


def pix_pair(tree: SysfsTree, bus: int, numa: int, ibdev: str) -> tuple[str, str]:
    """A root complex with one switch holding one GPU and one NIC: returns (gpu, nic) BDFs."""
    host = tree.host_bridge(bus, numa=numa, cpus="0-55" if numa == 0 else "56-111")
    root_port = tree.bridge(host, f"0000:{bus:02x}:01.0", vendor=INTEL)
    gpu_port, nic_port = tree.switch(root_port, f"0000:{bus + 1:02x}:00.0",
                                     [f"0000:{bus + 2:02x}:00.0", f"0000:{bus + 2:02x}:01.0"])
    return (tree.gpu(gpu_port, f"0000:{bus + 3:02x}:00.0"),
            tree.nic(nic_port, f"0000:{bus + 4:02x}:00.0", ibdev))


def pix_node(root: Path, pairs: int = 8) -> SysfsTree:
    """DGX-H100-like: each GPUi shares a PCIe switch with mlx5_i (PIX); pairs 0-3 on socket 0."""
    tree = SysfsTree(root)
    for index, bus in enumerate(PIX_NODE_BUSES[:pairs]):
        pix_pair(tree, bus, numa=0 if index < len(PIX_NODE_BUSES) // 2 else 1, ibdev=f"mlx5_{index}")
    return tree


def dual_socket_node(root: Path) -> SysfsTree:
    """GPU0 on socket 0 with mlx5_0 behind another host bridge of socket 0 (NODE) and mlx5_1 on
    socket 1 (SYS); GPU1 on socket 1 shares its root complex with mlx5_1 via another root port (PHB)."""
    tree = SysfsTree(root)
    socket0 = tree.host_bridge(0x00, numa=0, cpus="0-31")
    tree.gpu(tree.bridge(socket0, "0000:00:01.0", vendor=INTEL), "0000:01:00.0")
    other_root_complex = tree.host_bridge(0x40, numa=0, cpus="0-31")
    tree.nic(tree.bridge(other_root_complex, "0000:40:01.0", vendor=INTEL), "0000:41:00.0", "mlx5_0")
    socket1 = tree.host_bridge(0x80, numa=1, cpus="32-63")
    tree.gpu(tree.bridge(socket1, "0000:80:01.0", vendor=INTEL), "0000:81:00.0")
    tree.nic(tree.bridge(socket1, "0000:80:03.0", vendor=INTEL), "0000:82:00.0", "mlx5_1")
    return tree


def flat_vm(root: Path) -> SysfsTree:
    """A QEMU guest: two GPUs and two NICs passed through straight onto the root bus."""
    tree = SysfsTree(root)
    tree.cmdline("BOOT_IMAGE=/boot/vmlinuz-6.8.0 root=/dev/vda1 ro console=ttyS0")
    tree.cpuinfo(hypervisor=True)
    tree.dmi("QEMU", "Standard PC (Q35 + ICH9, 2009)")
    host = tree.host_bridge(0x00, numa=-1, cpus="0-15")
    tree.function(host, "0000:00:02.0", REDHAT_VIRTIO, 0x1041, ETHERNET_CLASS)
    tree.gpu(host, "0000:00:05.0")
    tree.gpu(host, "0000:00:06.0")
    tree.nic(host, "0000:00:0a.0", "mlx5_0")
    tree.nic(host, "0000:00:0b.0", "mlx5_1")
    return tree


def acs_node(root: Path, pairs: int = 2) -> SysfsTree:
    """The PIX node with Linux-style ACS (SV RR CR UF) on both downstream ports of pair 0's switch."""
    tree = pix_node(root, pairs)
    tree.set_acs("0000:1a:00.0")
    tree.set_acs("0000:1a:01.0")
    return tree


def translating_iommu_node(root: Path, pairs: int = 2) -> SysfsTree:
    """The PIX node booted with intel_iommu=on and no iommu=pt: every device in a DMA domain."""
    tree = pix_node(root, pairs)
    tree.cmdline("BOOT_IMAGE=/boot/vmlinuz-6.8.0 root=UUID=0000 ro intel_iommu=on")
    tree.iommu_groups("DMA")
    return tree


def narrow_uplink_node(root: Path) -> SysfsTree:
    """Two ConnectX-7 (400 Gb/s) under one PCIe switch whose uplink trained at x8 Gen4
    (126 Gb/s), their GPUs each on a root port of their own on the same socket."""
    tree = SysfsTree(root)
    host = tree.host_bridge(0x00, numa=0, cpus="0-31")
    root_port = tree.bridge(host, "0000:00:01.0", vendor=INTEL)
    nic_ports = tree.switch(root_port, "0000:01:00.0", ["0000:02:00.0", "0000:02:01.0"])
    tree.nic(nic_ports[0], "0000:03:00.0", "mlx5_0")
    tree.nic(nic_ports[1], "0000:04:00.0", "mlx5_1")
    tree.gpu(tree.bridge(host, "0000:00:02.0", vendor=INTEL), "0000:05:00.0")
    tree.gpu(tree.bridge(host, "0000:00:03.0", vendor=INTEL), "0000:06:00.0")
    for port in ("0000:00:01.0", "0000:01:00.0"):
        tree.link(port, "16.0 GT/s PCIe", 8)
    for port in ("0000:02:00.0", "0000:02:01.0", "0000:00:02.0", "0000:00:03.0"):
        tree.link(port, "32.0 GT/s PCIe", 16)
    return tree


def two_root_ports_node(root: Path) -> SysfsTree:
    """One root complex of one socket, two root ports, each with a switch holding a GPU and
    its NIC: the rails share nothing smaller than the root complex."""
    tree = SysfsTree(root)
    host = tree.host_bridge(0x00, numa=0, cpus="0-31")
    for index, bus in enumerate((0x10, 0x20)):
        root_port = tree.bridge(host, f"0000:00:0{index + 1}.0", vendor=INTEL)
        gpu_port, nic_port = tree.switch(root_port, f"0000:{bus:02x}:00.0",
                                         [f"0000:{bus + 1:02x}:00.0", f"0000:{bus + 1:02x}:01.0"])
        tree.gpu(gpu_port, f"0000:{bus + 2:02x}:00.0")
        tree.nic(nic_port, f"0000:{bus + 3:02x}:00.0", f"mlx5_{index}")
    return tree
