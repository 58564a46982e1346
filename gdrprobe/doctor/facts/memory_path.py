"""The facts behind which kernel path gives a NIC access to GPU memory: the NVIDIA driver's
flavour, the kernel, NCCL's peer-memory files, and each DMA-BUF half (the GPU's from the
CUDA driver's facts, the NIC's from NCCL's probe), handed to NCCL's rules
(:mod:`gdrprobe.nccl.gdr_support`) as a :class:`~gdrprobe.nccl.gdr_support.MemoryPaths`.

Where a live fact is missing (a replay of an old capture, no pyverbs, no CUDA driver) the
DMA-BUF halves are inferred from the driver flavour and the kernel, and marked inferred.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from gdrprobe.nccl import params
from gdrprobe.nccl.gdr_support import Half, MemoryPaths, dmabuf_enabled, gpu_dmabuf_half
from gdrprobe.sysroot import SysRoot

DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
KERNEL_RELEASE_FILE = "/proc/sys/kernel/osrelease"
NVIDIA_PEERMEM_MODULE = "/sys/module/nvidia_peermem"
MEMORY_PEERS_DIR = "/sys/kernel/mm/memory_peers"
DMABUF_MIN_KERNEL = (5, 12)


def driver_version_line(root: SysRoot) -> str | None:
    """The NVIDIA kernel driver's version line (its flavour: "Open Kernel Module" or not)."""
    text = root.read(DRIVER_VERSION_FILE)
    return text.splitlines()[0] if text else None


def kernel_version(release: str | None) -> tuple[int, int] | None:
    match = re.match(r"([0-9]{1,9})\.([0-9]{1,9})", release or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def platform_half(driver_line: str | None, release: str | None) -> Half:
    """DMA-BUF guessed from the platform alone: the Open Kernel Module and kernel 5.12+."""
    blockers = []
    if not driver_line or "Open Kernel Module" not in driver_line:
        blockers.append("the GPU driver is not the Open Kernel Module flavour")
    kernel = kernel_version(release)
    if kernel is None or kernel < DMABUF_MIN_KERNEL:
        blockers.append(f"kernel {release} is older than 5.12")
    if blockers:
        return Half(False, "; ".join(blockers), inferred=True)
    return Half(True, "inferred from the Open Kernel Module driver on kernel 5.12+", inferred=True)


def gpu_halves(cuda_facts: dict[str, Any] | None, platform: Half) -> tuple[dict[str, Half], Half]:
    """Each GPU's DMA-BUF half from the CUDA driver's facts, and the half of a GPU they do
    not list (the platform's guess)."""
    if not cuda_facts or "error" in cuda_facts:
        return {}, dataclasses.replace(platform, reason=platform.reason + " (no CUDA driver facts)")
    driver = cuda_facts.get("driver_version")
    halves = {gpu["pci_bus_id"]: gpu_dmabuf_half(driver, gpu.get("dma_buf_supported"))
              for gpu in cuda_facts.get("gpus", [])}
    return halves, dataclasses.replace(platform, reason=platform.reason + " (GPU not in the CUDA facts)")


def nic_halves(nic_facts: dict[str, Any] | None, release: str | None) -> tuple[dict[str, Half], Half]:
    """gdr.cc ncclIbDmaBufSupport, read back from the probe's errno per NIC."""
    from gdrprobe.memory.nic_probe import interpret_nic_probe

    kernel = kernel_version(release)
    fallback_ok = kernel is not None and kernel >= DMABUF_MIN_KERNEL
    why = (nic_facts or {}).get("error", "no NIC probe was captured")
    default = Half(fallback_ok, f"NIC probe not run ({why}); inferred from kernel {release} "
                                f"{'>=' if fallback_ok else '<'} 5.12", inferred=True)
    halves = {}
    for nic, result in ((nic_facts or {}).get("dmabuf_probe") or {}).items():
        if "error" in result:
            halves[nic] = dataclasses.replace(default, reason=f"NIC probe failed ({result['error']}); "
                                                              f"inferred from kernel {release}")
            continue
        probe = interpret_nic_probe(result.get("errno"))
        halves[nic] = Half(probe.supported, probe.reason)
    return halves, default


def peermem_file(root: SysRoot, files: tuple[str, ...]) -> str | None:
    """The first of the files the NCCL in use looks for that exists."""
    return next((path for path in files if root.exists(path)), None)


def peermem_registered(root: SysRoot) -> bool | None:
    """Whether a loaded nvidia-peermem registered with MLNX_OFED's peer-memory API: then
    the API's directory lists its client, nv_mem (and nv_mem_nc with the legacy client)
    (open-gpu-kernel-modules nvidia-peermem.c nv_mem_client_init registers them by those
    names). None where it cannot be told: no module loaded, or no such directory (inbox
    RDMA stack, kernels 6.6+)."""
    if not root.exists(NVIDIA_PEERMEM_MODULE) or not root.exists(MEMORY_PEERS_DIR):
        return None
    return bool({"nv_mem", "nv_mem_nc"} & set(root.listdir(MEMORY_PEERS_DIR)))


def read_memory_paths(ctx) -> MemoryPaths:
    root = ctx.root
    release = ctx.kernel_release
    platform = platform_half(ctx.driver_line, release)
    gpus, default_gpu = gpu_halves(ctx.cuda_facts, platform)
    nics, default_nic = nic_halves(ctx.nic_facts, release)
    cuda = ctx.cuda_facts if ctx.cuda_facts and "error" not in ctx.cuda_facts else {}
    gpu_bdfs = tuple(g.bdf for g in ctx.topology.gpus) or tuple(g["pci_bus_id"] for g in cuda.get("gpus", []))
    rules = ctx.nccl_rules
    return MemoryPaths(peermem_file=peermem_file(root, rules.peermem_files),
                       dmabuf_enabled=dmabuf_enabled(ctx.environ, rules),
                       dmabuf_enable_raw=params.DMABUF_ENABLE.raw(ctx.environ),
                       gpu_halves=gpus, default_gpu_half=default_gpu,
                       nic_halves=nics, default_nic_half=default_nic,
                       nics=tuple(n.name for n in ctx.topology.nics) or ("any NIC",),
                       gpus=gpu_bdfs or ("any GPU",),
                       rules=rules,
                       peermem_registered=peermem_registered(root))
