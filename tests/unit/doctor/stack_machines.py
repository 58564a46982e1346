"""Small fixture trees for the stack, gpu, memlock, nccl and nic checks.

Each builder writes only the files those checks read, under a tmp_path that stands for
the machine's "/", and returns a DoctorContext on it.
"""

from __future__ import annotations

import dataclasses
import json
import os

from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.doctor.facts.cuda import FACTS_FILE as CUDA_FACTS_FILE
from gdrprobe.sysroot import SysRoot

OPEN_DRIVER = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  "
               "Release Build  (dvs-builder@U16-I3-B03-4-3)")
PROPRIETARY_DRIVER = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.06  Wed Jun 26 06:46:07 UTC 2024"
GPU_BDF = "0000:1b:00.0"


def write(root, path: str, text: str = "") -> None:
    target = os.path.join(str(root), path.lstrip("/"))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "w") as handle:
        handle.write(text)


class DenyingRoot(SysRoot):
    """A root where some files exist but may not be read, as for a non-root user (the tests
    run as root, for whom chmod changes nothing)."""

    def __init__(self, root: str, denied: set[str]):
        super().__init__(root)
        self.deny = denied

    def open(self, path: str):
        if path in self.deny:
            raise PermissionError(13, "Permission denied", self.host_path(path))
        return super().open(path)


def context(root, environ: dict[str, str] | None = None, topology=None) -> DoctorContext:
    ctx = DoctorContext(SysRoot(str(root)), environ=environ or {})
    ctx.topology = topology or FakeTopology()
    return ctx


def cuda_facts(root, driver_version: int = 12080, dma_buf: int = 1, rdma: int = 1, bdf: str = GPU_BDF) -> None:
    """The cuda.json a capture writes, for one GPU."""
    gpu = {"ordinal": 0, "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": bdf,
           "total_memory_bytes": 85 << 30, "gpu_direct_rdma_supported": rdma, "dma_buf_supported": dma_buf,
           "gpu_direct_rdma_flush_writes_options": 1, "gpu_direct_rdma_writes_ordering": 100}
    write(root, CUDA_FACTS_FILE, json.dumps({"driver_version": driver_version, "gpus": [gpu]}))


def module(root, name: str) -> None:
    write(root, f"/sys/module/{name}/refcnt", "0")


def dmabuf_inventory(root) -> DoctorContext:
    """Seed 003, first node: Open Kernel Module 570, kernel 5.15, no peermem, no OFED."""
    write(root, "/proc/driver/nvidia/version", OPEN_DRIVER + "\nGCC version:  gcc version 12.3.0")
    write(root, "/proc/sys/kernel/osrelease", "5.15.0-118-generic")
    cuda_facts(root)
    return context(root)


def legacy_inventory(root) -> DoctorContext:
    """Seed 003, second node: proprietary 535 driver, kernel 4.18, MLNX_OFED, nvidia_peermem loaded."""
    write(root, "/proc/driver/nvidia/version", PROPRIETARY_DRIVER)
    write(root, "/proc/sys/kernel/osrelease", "4.18.0-553.el8_10.x86_64")
    module(root, "mlx_compat")
    module(root, "nvidia_peermem")
    write(root, "/sys/kernel/mm/memory_peers/nv_mem/version", "1.3")
    cuda_facts(root, driver_version=12020, dma_buf=0)
    return context(root)


def peermem_unregistered(root) -> DoctorContext:
    """A /sys/module/nvidia_peermem directory without its version file (a module unloading):
    none of NCCL's three peer-memory files exists."""
    write(root, "/proc/driver/nvidia/version", PROPRIETARY_DRIVER)
    write(root, "/proc/sys/kernel/osrelease", "4.18.0-553.el8_10.x86_64")
    module(root, "mlx_compat")
    module(root, "nvidia_peermem")
    return context(root)


def limits_text(soft: str, hard: str) -> str:
    return ("Limit                     Soft Limit           Hard Limit           Units     \n"
            "Max open files            1024                 1048576              files     \n"
            f"Max locked memory         {soft:<20} {hard:<20} bytes     \n")


def memlock_machine(root, soft: str, hard: str, cap_eff: str = "0000000000000000",
                    environ: dict[str, str] | None = None, cgroup: str = "0::/") -> DoctorContext:
    write(root, "/proc/self/limits", limits_text(soft, hard))
    write(root, "/proc/self/status", f"Name:\tpython\nCapInh:\t0000000000000000\nCapEff:\t{cap_eff}\n")
    write(root, "/proc/1/cgroup", cgroup)
    return context(root, environ)


def resource_line(start: int, size: int, flags: int = 0x14220C) -> str:
    return f"0x{start:016x} 0x{start + size - 1:016x} 0x{flags:016x}"


def gpu_resource(root, bar1_bytes: int, bdf: str = GPU_BDF) -> None:
    zero = "0x0000000000000000 0x0000000000000000 0x0000000000000000"
    bar0 = resource_line(0xA0000000, 16 << 20, 0x40200)
    bar1 = resource_line(0x38000000000, bar1_bytes)
    write(root, f"/sys/bus/pci/devices/{bdf}/resource", "\n".join([bar0, bar1, zero]) + "\n")


def rdma_port(root, device: str, port: int = 1, state: str = "4: ACTIVE", link_layer: str = "Ethernet",
              gids: dict[int, tuple[str, str]] | None = None) -> None:
    """One port; gids maps index -> (gid, type) for the populated GID table entries."""
    port_dir = f"/sys/class/infiniband/{device}/ports/{port}"
    write(root, port_dir + "/state", state)
    write(root, port_dir + "/phys_state", "5: LinkUp" if "ACTIVE" in state else "3: Disabled")
    write(root, port_dir + "/link_layer", link_layer)
    for index, (gid, kind) in (gids or {}).items():
        write(root, f"{port_dir}/gids/{index}", gid)
        write(root, f"{port_dir}/gid_attrs/types/{index}", kind)


def rdma_device(root, device: str, uverbs: str, driver: str = "mlx5_core") -> None:
    os.makedirs(os.path.join(str(root), "sys/bus/pci/drivers", driver), exist_ok=True)
    device_dir = os.path.join(str(root), "sys/class/infiniband", device, "device")
    os.makedirs(os.path.join(device_dir, "infiniband_verbs", uverbs), exist_ok=True)
    os.symlink(f"../../../../bus/pci/drivers/{driver}", os.path.join(device_dir, "driver"))


def pci_bus(root) -> None:
    write(root, f"/sys/bus/pci/devices/{GPU_BDF}/class", "0x030200")


# ---- a topology with the interface of gdrprobe.doctor.facts.topology --------------


@dataclasses.dataclass(frozen=True)
class FakeDevice:
    bdf: str
    name: str
    numa_node: int = 0


@dataclasses.dataclass
class FakeTopology:
    gpus: list = dataclasses.field(default_factory=list)
    nics: list = dataclasses.field(default_factory=list)
    nearest: dict = dataclasses.field(default_factory=dict)     # gpu bdf -> (nic, distance)

    def nearest_nic(self, gpu):
        return self.nearest.get(gpu.bdf, (None, None))
