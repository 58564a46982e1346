"""Fixture machines for GPU-initiated networking (issue 44): what GIN's and IBGDA's rules read
besides NCCL's decision: /proc/driver/nvidia/params (as the driver prints its module
parameters: ``Name: value``, strings quoted), the kernel driver bound to each NIC, gdrdrv,
the instance type, and on an EFA node what a capture keeps of the aws-ofi-nccl plugin and
libfabric (gin.json). The expected modes, and the source line behind each, are in
test_gin.py."""

from __future__ import annotations

import json

from tests.unit.doctor import machines, nccl_machines as nm
from tests.unit.doctor.nccl_libraries import built_library

CAPTURE = nm.CAPTURE
AMAZON, EFA_DEVICE, ETHERNET = 0x1D0F, 0xEFA2, machines.ETHERNET_CLASS
BROADCOM_NIC, THOR = 0x14E4, 0x1750
KEY = "PeerMappingOverride=1;"


def driver_params(tree: machines.SysfsTree, registry: str = "", memops: int = 0) -> None:
    """/proc/driver/nvidia/params: a few of the driver's lines, RegistryDwords among them."""
    tree.write("/proc/driver/nvidia/params",
               "ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nModifyDeviceFiles: 1\n"
               f"EnableStreamMemOPs: {memops}\nEnableResizableBar: 0\n"
               f"RegistryDwords: \"{registry}\"\nRegistryDwordsPerDevice: \"\"\nRmMsg: \"\"\n")


def bind(tree: machines.SysfsTree, bdf: str, driver: str) -> None:
    """The kernel driver bound to a PCI function: its ``driver`` link, as the PCI core makes it."""
    tree.path(f"/sys/bus/pci/drivers/{driver}").mkdir(parents=True, exist_ok=True)
    tree.symlink(f"{tree.devices[bdf]}/driver", f"/sys/bus/pci/drivers/{driver}")


def mlx5_bound(tree: machines.SysfsTree, nics: dict[str, str]) -> None:
    for bdf in nics:
        bind(tree, bdf, "mlx5_core")


def pix_gin(root, registry: str = KEY, nccl: str | None = "2.30.7") -> machines.SysfsTree:
    """Two GPU/ConnectX pairs under their own switches (PIX), DMA-BUF and nvidia-peermem both
    there, mlx5_core bound, the job's libnccl at ``nccl``."""
    tree = nm.pix_pairs(root)
    nm.healthy_stack(tree, nm.gpu_bdfs(tree), ["mlx5_0", "mlx5_1"])
    nm.nvidia_peermem(tree)
    mlx5_bound(tree, nic_functions(tree))
    driver_params(tree, registry)
    if nccl:
        built_library(tree, "/usr/lib64", nccl)
    return tree


def nic_functions(tree: machines.SysfsTree) -> dict[str, str]:
    """PCI function -> RDMA device, for every ConnectX of the fixture."""
    found = {}
    for bdf, directory in tree.devices.items():
        ib = tree.path(f"{directory}/infiniband")
        if ib.is_dir():
            found[bdf] = next(iter(p.name for p in ib.iterdir()))
    return found


def legacy_nv_peer_mem(root) -> machines.SysfsTree:
    """The deprecated nv_peer_mem alone (no DMA-BUF: proprietary driver, kernel 5.4), the key set."""
    tree = nm.nv_peer_mem_only(root)
    mlx5_bound(tree, nic_functions(tree))
    driver_params(tree, KEY)
    built_library(tree, "/usr/lib64", "2.30.7")
    return tree


def peermem_without_key(root) -> machines.SysfsTree:
    """nvidia-peermem on kernel 6.8, proprietary driver (no DMA-BUF), RegistryDwords empty."""
    tree = nm.peermem_kernel_6_8(root)
    mlx5_bound(tree, nic_functions(tree))
    driver_params(tree, "")
    built_library(tree, "/usr/lib64", "2.30.7")
    return tree


def peermem_with_key(root) -> machines.SysfsTree:
    tree = peermem_without_key(root)
    driver_params(tree, "RMUseSwI2c=0x01;" + KEY)
    return tree


def gpu_beside_nic(tree: machines.SysfsTree, ibdev: str, vendor: int, driver: str,
                   link_layer: str, gbps: int = 400) -> str:
    """One GPU and a NIC of another maker (``vendor``, its kernel ``driver``) under one switch,
    with the stack files and the job's environment the rules read; returns the GPU's bus id."""
    host = tree.host_bridge(0x18)
    root_port = tree.bridge(host, "0000:18:01.0", vendor=machines.INTEL)
    gpu_port, nic_port = tree.switch(root_port, "0000:19:00.0", ["0000:1a:00.0", "0000:1a:01.0"])
    gpu = tree.gpu(gpu_port, "0000:1b:00.0")
    tree.nic(nic_port, "0000:1c:00.0", ibdev, class_code=ETHERNET)
    tree.write(f"{tree.devices['0000:1c:00.0']}/vendor", f"0x{vendor:04x}\n")
    bind(tree, "0000:1c:00.0", driver)
    nm.finish(tree, [ibdev], gbps=gbps)      # links, port rate, the stack, CUDA facts, DMA-BUF probe
    tree.write(f"/sys/class/infiniband/{ibdev}/ports/1/link_layer", link_layer + "\n")
    return gpu


def broadcom_roce(root) -> machines.SysfsTree:
    """A GPU beside a Broadcom RoCE NIC (bnxt_en, bnxt_re): no libmlx5 device."""
    tree = machines.SysfsTree(root)
    gpu_beside_nic(tree, "bnxt_re0", BROADCOM_NIC, "bnxt_en", "Ethernet")
    nm.nvidia_peermem(tree)
    driver_params(tree, KEY)
    built_library(tree, "/usr/lib64", "2.30.7")
    return tree


def efa_node(root, plugin: str | None = "1.21.1", libfabric: tuple[int, int] | None = (2, 6),
             nccl: str = "2.31.2", product: str = "p5en.48xlarge", gdrdrv: str | None = "2.5",
             registry: str = KEY) -> machines.SysfsTree:
    """A P5en-like node: a GPU beside an EFA device (driver efa) under one switch, DMA-BUF, the
    aws-ofi-nccl plugin and libfabric as a capture keeps them (gin.json)."""
    tree = machines.SysfsTree(root)
    tree.dmi("Amazon EC2", product)
    gpu_beside_nic(tree, "rdmap28s0", AMAZON, "efa", "Unspecified", gbps=200)
    tree.write(f"{tree.devices['0000:1c:00.0']}/device", f"0x{EFA_DEVICE:04x}\n")
    driver_params(tree, registry)
    if gdrdrv:
        tree.write("/sys/module/gdrdrv/version", gdrdrv + "\n")
    built_library(tree, "/usr/lib64", nccl)
    facts = {"ofi_plugin": {"path": "/opt/amazon/ofi-nccl/lib/libnccl-net.so", "version": plugin},
             "libfabric": ({"api": list(libfabric), "path": "/opt/amazon/efa/lib/libfabric.so.1"}
                           if libfabric else {"error": "libfabric.so.1: cannot open shared object file"})}
    tree.write(f"{CAPTURE}/gin.json", json.dumps(facts))
    return tree


def ofi_plugin_library(tree: machines.SysfsTree, directory: str, version: str) -> str:
    """aws-ofi-nccl's libnccl-net.so with the PACKAGE_STRING its configure builds in."""
    path = f"{directory}/libnccl-net.so"
    tree.write(path, b"\x7fELF" + b"\0" * 8192 + b"aws-ofi-nccl " + version.encode() + b"\0" + b"\0" * 64)
    return path
