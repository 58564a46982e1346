"""Can NCCL register GPU memory with a NIC, and through which kernel path? Decided per NIC
(and per GPU) the way NCCL 2.30.7 decides it:

- peer memory (``src/transport/net_ib/gdr.cc`` ncclIbGdrSupport): any of
  ``/sys/kernel/mm/memory_peers/nv_mem/version``, ``.../nv_mem_nc/version`` or
  ``/sys/module/nvidia_peermem/version`` exists. On kernels 6.6+ ``memory_peers`` is gone
  and only the module file is left (NCCL 2.23.4 release notes); nvidia-peermem's init
  fails unless its peer-memory clients registered (open-gpu-kernel-modules
  ``nvidia-peermem.c`` nv_mem_client_init), so a loaded module is a registered one. The
  deprecated nv_peer_mem registers the same ``nv_mem`` client and counts too.
- DMA-BUF on the NIC (``gdr.cc`` ncclIbDmaBufSupport): ``ibv_reg_dmabuf_mr(fd=-1)`` does not
  fail with EOPNOTSUPP or EPROTONOSUPPORT (:mod:`gdrprobe.doctor.nic_facts` runs the probe).
- DMA-BUF on the GPU (``src/init.cc`` dmaBufSupported): NCCL_DMABUF_ENABLE != 0, CUDA
  driver >= 11.7 and CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED != 0.
- the NIC's verdict (``src/graph/topo.cc`` ncclTopoPopulateNics): GDR when peer memory, or
  both DMA-BUF halves; otherwise NCCL logs "GPU Direct RDMA Disabled for HCA".

Where a live fact is missing (a replay of an old capture, no pyverbs, no CUDA driver) the
DMA-BUF halves are inferred from the driver flavour and the kernel, and marked inferred.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from gdrprobe.memory.nic_probe import interpret_nic_probe
from gdrprobe.nccl.env import int_param
from gdrprobe.report.model import Evidence

PEERMEM_FILES = (
    "/sys/kernel/mm/memory_peers/nv_mem/version",
    "/sys/kernel/mm/memory_peers/nv_mem_nc/version",
    "/sys/module/nvidia_peermem/version",
)
DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
KERNEL_RELEASE_FILE = "/proc/sys/kernel/osrelease"
DMABUF_MIN_KERNEL = (5, 12)
DMABUF_MIN_CUDA_DRIVER = 11070          # cuDriverGetVersion() encoding of 11.7


@dataclasses.dataclass(frozen=True)
class Half:
    """One prerequisite of DMA-BUF (the GPU's or the NIC's): yes/no, why, and whether guessed."""

    supported: bool
    reason: str
    inferred: bool = False


def kernel_version(release: str | None) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", release or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def format_cuda_version(encoded: int) -> str:
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


@dataclasses.dataclass(frozen=True)
class MemoryPaths:
    peermem_file: str | None               # the first of NCCL's files that exists
    dmabuf_enabled: bool                   # NCCL_DMABUF_ENABLE as NCCL reads it
    dmabuf_enable_raw: str | None
    gpu_halves: dict[str, Half]            # GPU bus id -> its DMA-BUF half
    default_gpu_half: Half                 # for GPUs the CUDA facts do not list
    nic_halves: dict[str, Half]            # NIC name -> its DMA-BUF half (NCCL's probe)
    default_nic_half: Half
    # The pairs NCCL would register memory for; unnamed stand-ins when the bus has none.
    nics: tuple[str, ...] = ("any NIC",)
    gpus: tuple[str, ...] = ("any GPU",)

    def gpu_half(self, bdf: str) -> Half:
        return self.gpu_halves.get(bdf, self.default_gpu_half)

    def nic_half(self, nic: str) -> Half:
        return self.nic_halves.get(nic, self.default_nic_half)

    def dmabuf(self, nic: str, gpu: str, enabled: bool | None = None) -> bool:
        on = self.dmabuf_enabled if enabled is None else enabled
        return on and self.gpu_half(gpu).supported and self.nic_half(nic).supported

    def nic_gdr(self, nic: str, gpu: str) -> bool:
        """topo.cc ncclTopoPopulateNics: (ptrSupport & CUDA) || (dmaBufSupport && (ptrSupport & DMABUF))."""
        return self.peermem_file is not None or self.dmabuf(nic, gpu)

    def mechanism(self, nic: str, gpu: str) -> str | None:
        """What NCCL registers GPU memory with for this pair: DMA-BUF is preferred (net.cc)."""
        if self.dmabuf(nic, gpu):
            return "DMA-BUF"
        return "peer memory (nvidia-peermem)" if self.peermem_file else None

    def disabled_pairs(self, dmabuf_enabled: bool | None = None) -> list[tuple[str, str]]:
        """(NIC, GPU) pairs NCCL reports "GPU Direct RDMA Disabled" for (``dmabuf_enabled``
        overrides NCCL_DMABUF_ENABLE: what would happen without it)."""
        return [(nic, gpu) for nic in self.nics for gpu in self.gpus
                if not (self.peermem_file or self.dmabuf(nic, gpu, dmabuf_enabled))]

    def dmabuf_everywhere(self) -> bool:
        return all(self.dmabuf(nic, gpu) for nic in self.nics for gpu in self.gpus)

    def why_not(self, nic: str, gpu: str) -> str:
        """Why NCCL says "GPU Direct RDMA Disabled" for this NIC and GPU."""
        parts = ["no peer-memory module (none of " + ", ".join(PEERMEM_FILES) + " exists)"]
        if not self.dmabuf_enabled:
            parts.append(f"DMA-BUF is switched off by NCCL_DMABUF_ENABLE={self.dmabuf_enable_raw}")
        for half in (self.gpu_half(gpu), self.nic_half(nic)):
            if not half.supported:
                parts.append(half.reason)
        return "; ".join(parts)

    def evidence(self) -> tuple[Evidence, ...]:
        found = [Evidence(self.peermem_file or "peer-memory files", "present" if self.peermem_file
                          else "none of NCCL's three files exists")]
        found += [Evidence(f"DMA-BUF, GPU {bdf}", half.reason) for bdf, half in sorted(self.gpu_halves.items())]
        found += [Evidence(f"DMA-BUF, NIC {nic}", half.reason) for nic, half in sorted(self.nic_halves.items())]
        if not self.gpu_halves:
            found.append(Evidence("DMA-BUF, GPU", self.default_gpu_half.reason))
        return tuple(found)


# ---- the halves ---------------------------------------------------------------------


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
    """src/init.cc dmaBufSupported, less NCCL_DMABUF_ENABLE (kept apart to say which blocks)."""
    if not cuda_facts or "error" in cuda_facts:
        return {}, dataclasses.replace(platform, reason=platform.reason + " (no CUDA driver facts)")
    driver = cuda_facts.get("driver_version")
    halves = {}
    for gpu in cuda_facts.get("gpus", []):
        attribute = gpu.get("dma_buf_supported")
        if driver is not None and driver < DMABUF_MIN_CUDA_DRIVER:
            halves[gpu["pci_bus_id"]] = Half(False, f"CUDA driver {format_cuda_version(driver)} is older than 11.7")
        elif not attribute:
            halves[gpu["pci_bus_id"]] = Half(False, f"CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED={attribute} "
                                                    "(needs the Open Kernel Module driver)")
        else:
            halves[gpu["pci_bus_id"]] = Half(True, "CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED=1")
    return halves, dataclasses.replace(platform, reason=platform.reason + " (GPU not in the CUDA facts)")


def nic_halves(nic_facts: dict[str, Any] | None, release: str | None) -> tuple[dict[str, Half], Half]:
    """gdr.cc ncclIbDmaBufSupport, read back from the probe's errno per NIC."""
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


def peermem_file(root) -> str | None:
    return next((path for path in PEERMEM_FILES if root.exists(path)), None)


def read_memory_paths(ctx) -> MemoryPaths:
    root = ctx.root
    driver_text = root.read(DRIVER_VERSION_FILE)
    release = root.read(KERNEL_RELEASE_FILE)
    platform = platform_half(driver_text.splitlines()[0] if driver_text else None, release)
    gpus, default_gpu = gpu_halves(ctx.cuda_facts, platform)
    nics, default_nic = nic_halves(ctx.nic_facts, release)
    cuda = ctx.cuda_facts if ctx.cuda_facts and "error" not in ctx.cuda_facts else {}
    gpu_bdfs = tuple(g.bdf for g in ctx.topology.gpus) or tuple(g["pci_bus_id"] for g in cuda.get("gpus", []))
    return MemoryPaths(peermem_file=peermem_file(root),
                       dmabuf_enabled=int_param(ctx.environ, "NCCL_DMABUF_ENABLE", 1) != 0,
                       dmabuf_enable_raw=ctx.environ.get("NCCL_DMABUF_ENABLE"),
                       gpu_halves=gpus, default_gpu_half=default_gpu,
                       nic_halves=nics, default_nic_half=default_nic,
                       nics=tuple(n.name for n in ctx.topology.nics) or ("any NIC",),
                       gpus=gpu_bdfs or ("any GPU",))
