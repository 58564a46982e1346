"""Fixture AMD nodes: MI300X GPUs beside ConnectX NICs, with what RCCL reads (ROCm/rccl's
rules: gdrprobe/nccl/rccl.py) added by the helpers below; the expected answers are in
test_rccl.py."""

from __future__ import annotations

import gzip
import json
import os

from tests.unit.doctor import machines, nccl_machines

AMD, MI300X, ACCELERATOR_CLASS = 0x1002, 0x74A1, 0x120000
KERNEL = "6.8.0-45-generic"
KFD_NODES = "/sys/class/kfd/kfd/topology/nodes"
BOTH_OPTIONS = "CONFIG_DMABUF_MOVE_NOTIFY=y\nCONFIG_PCI_P2PDMA=y\n"
ROCM_LIB = "/opt/rocm/lib"
# RCCL's version in the ROCm release that shipped it (RCCL's CHANGELOG.md)
RCCL_OF_ROCM = {"6.3.0": "2.21.5", "6.4.0": "2.22.3", "7.0.0": "2.26.6", "7.1.0": "2.27.7",
                "7.11.0": "2.28.3", "7.12.0": "2.28.3", "7.14.0": "2.30.4"}


def rccl_bytes(version: str) -> bytes:
    """An ELF-looking librccl with the string RCCL keeps (src/init.cc VERSION_STRING)."""
    return b"\x7fELF" + b"\0" * 4096 + b"RCCL version : " + version.encode() + b"\0" + b"\0" * 4096


def rocm_install(tree: machines.SysfsTree, lib: str = ROCM_LIB, version: str | None = None,
                 rocm: str = "6.3.0") -> str:
    """librccl.so.1 -> librccl.so.1.0.<ROCm as MMmmpp>, as ROCm's rccl package lays it out
    (the file name holds ROCm's release, not RCCL's version)."""
    major, minor, patch = (int(part) for part in rocm.split("."))
    name = f"librccl.so.1.0.{major * 10000 + minor * 100 + patch}"
    tree.write(f"{lib}/{name}", rccl_bytes(version or RCCL_OF_ROCM[rocm]))
    os.symlink(name, tree.path(f"{lib}/librccl.so.1"))
    return f"{lib}/librccl.so.1"


def kfd_node(tree: machines.SysfsTree, node: int, bdf: str | None) -> None:
    """An amdkfd topology node: a GPU's (SIMDs, its bus id as domain and location_id) or,
    with no bus id, the CPU's."""
    if bdf is None:
        properties = "cpu_cores_count 96\nsimd_count 0\nlocation_id 0\ndomain 0\n"
    else:
        domain, bus, rest = bdf.split(":")
        device, function = rest.split(".")
        location = int(bus, 16) << 8 | int(device, 16) << 3 | int(function)
        properties = (f"cpu_cores_count 0\nsimd_count 1216\nvendor_id {AMD}\ndevice_id {MI300X}\n"
                      f"location_id {location}\ndomain {int(domain, 16)}\n")
    tree.write(f"{KFD_NODES}/{node}/properties", properties)


def mi300x_node(root, pairs: int = 2, rocm: str | None = "6.3.0") -> machines.SysfsTree:
    """Each MI300X shares a PCIe switch with a ConnectX (PIX), NCCL's probe passing on every
    NIC, kernel 6.8 with no kernel configuration and no peer-memory file yet, and ROCm's
    librccl of ``rocm`` (None: none installed)."""
    tree = machines.SysfsTree(root)
    kfd_node(tree, 0, None)
    for index, bus in enumerate(machines.PIX_NODE_BUSES[:pairs]):
        host = tree.host_bridge(bus, numa=0)
        root_port = tree.bridge(host, f"0000:{bus:02x}:01.0", vendor=machines.INTEL)
        gpu_port, nic_port = tree.switch(root_port, f"0000:{bus + 1:02x}:00.0",
                                         [f"0000:{bus + 2:02x}:00.0", f"0000:{bus + 2:02x}:01.0"])
        gpu = tree.function(gpu_port, f"0000:{bus + 3:02x}:00.0", AMD, MI300X, ACCELERATOR_CLASS)
        tree.nic(nic_port, f"0000:{bus + 4:02x}:00.0", f"mlx5_{index}")
        kfd_node(tree, index + 1, gpu)
    nics = [f"mlx5_{index}" for index in range(pairs)]
    nccl_machines.links_everywhere(tree)
    for nic in nics:
        nccl_machines.port_rate(tree, nic, 400)
    tree.write("/proc/sys/kernel/osrelease", KERNEL + "\n")
    tree.write("/proc/version", f"Linux version {KERNEL} (buildd@lcy02) #45-Ubuntu SMP\n")
    tree.write("/proc/sys/kernel/numa_balancing", "0\n")
    nccl_machines.nic_probe(tree, {nic: nccl_machines.EBADF for nic in nics})
    rocm_facts(tree)
    if rocm is not None:
        rocm_install(tree, rocm=rocm)
    return tree


def amd_gpus(tree: machines.SysfsTree) -> list[str]:
    return sorted(bdf for bdf, path in tree.devices.items()
                  if (tree.path(path) / "vendor").read_text().strip() == f"0x{AMD:04x}")


def rocm_facts(tree: machines.SysfsTree, kallsyms: bool | None = False, hsa_dmabuf: bool = True,
               export: bool = True) -> None:
    """What a capture stores of the live calls: kallsyms' symbol and HSA's DMA-BUF facts."""
    tree.write("/gdrprobe-capture/rocm.json", json.dumps({
        "kallsyms_symbol": kallsyms,
        "hsa": {"dmabuf_supported": hsa_dmabuf, "export_symbol": export}}))


def memory_peers(tree: machines.SysfsTree, path: str) -> None:
    tree.write(path, "1.0\n")


def kernel_config(tree: machines.SysfsTree, text: str = BOTH_OPTIONS) -> None:
    tree.write(f"/boot/config-{KERNEL}", "CONFIG_PCI=y\n" + text)


def proc_config(tree: machines.SysfsTree, text: str = BOTH_OPTIONS) -> None:
    tree.write("/proc/config.gz", gzip.compress(("CONFIG_PCI=y\n" + text).encode()))


def hyper_v(tree: machines.SysfsTree, numa_balancing: str = "1") -> None:
    tree.write("/sys/devices/virtual/dmi/id/bios_version", "Hyper-V UEFI Release v4.1\n")
    tree.write("/proc/sys/kernel/numa_balancing", numa_balancing + "\n")
