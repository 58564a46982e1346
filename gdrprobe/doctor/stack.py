"""Which kernel path gives the NIC access to GPU memory: DMA-BUF or legacy nvidia-peermem.

The two paths have mirror-image prerequisites (NVIDIA GPU Operator documentation):

=====================  ==========================  ======================
                       DMA-BUF (recommended)       legacy nvidia-peermem
=====================  ==========================  ======================
GPU driver             Open Kernel Module          any supported driver
CUDA driver            11.7 or newer               no minimum
Linux kernel           5.12 or newer               no minimum
MLNX_OFED / DOCA-OFED  optional                    required
=====================  ==========================  ======================

So an absent ``nvidia_peermem`` module is evidence of a fault only once the stack is
known not to be on the DMA-BUF path.
"""

from __future__ import annotations

import dataclasses
import functools
import re

from gdrprobe.doctor.context import DoctorContext
from gdrprobe.report.model import Evidence, Finding, Status
from gdrprobe.sysroot import SysRoot

finding = functools.partial(Finding, group="stack")

DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
KERNEL_RELEASE_FILE = "/proc/sys/kernel/osrelease"
DMABUF_MIN_KERNEL = (5, 12)
DMABUF_MIN_CUDA_DRIVER = 11070          # cuDriverGetVersion() encoding of 11.7

# MLNX_OFED and DOCA-OFED both build their modules on the mlx_compat layer; the inbox
# kernel drivers have no such module. ofed_info ships with both packages.
OFED_MARKERS = ("/sys/module/mlx_compat", "/usr/bin/ofed_info")

NVIDIA_PEERMEM_MODULE = "/sys/module/nvidia_peermem"
LEGACY_PEER_MEM_MODULE = "/sys/module/nv_peer_mem"
GDRCOPY_MODULE = "/sys/module/gdrdrv"
# A peer-memory client that registered with the OFED ib_core shows up here; NCCL 2.22+
# probes nv_mem and nv_mem_nc (the non-coherent client of newer drivers).
MEMORY_PEER_FILES = (
    "/sys/kernel/mm/memory_peers/nv_mem/version",
    "/sys/kernel/mm/memory_peers/nv_mem_nc/version",
)

INSTALL_ORDER_FIX = (
    "Install MLNX_OFED or DOCA-OFED first, then reinstall the GPU driver so that "
    "nvidia-peermem is built against it, and load it with `modprobe nvidia-peermem` "
    "(nothing loads it at boot unless you add it to /etc/modules-load.d/)."
)


# ---- facts: one small reader per fact ---------------------------------------


def driver_version_line(root: SysRoot) -> str | None:
    text = root.read(DRIVER_VERSION_FILE)
    return text.splitlines()[0] if text else None


def is_open_kernel_module(version_line: str) -> bool:
    return "Open Kernel Module" in version_line


def kernel_release(root: SysRoot) -> str | None:
    return root.read(KERNEL_RELEASE_FILE)


def kernel_version(release: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", release)
    return (int(match.group(1)), int(match.group(2))) if match else None


def cuda_driver_version(ctx: DoctorContext) -> int | None:
    facts = ctx.cuda_facts or {}
    return facts.get("driver_version")


def format_cuda_version(encoded: int) -> str:
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


def gpus_reporting_no_dmabuf(ctx: DoctorContext) -> list[str]:
    """PCI ids of GPUs whose driver says DMA_BUF_SUPPORTED is 0."""
    gpus = (ctx.cuda_facts or {}).get("gpus", [])
    return [gpu["pci_bus_id"] for gpu in gpus if gpu.get("dma_buf_supported") == 0]


def ofed_marker(root: SysRoot) -> str | None:
    """The first path that shows an OFED stack is installed, or None."""
    return next((path for path in OFED_MARKERS if root.exists(path)), None)


def registered_memory_peer(root: SysRoot) -> str | None:
    """The memory_peers file of a registered NVIDIA peer-memory client, or None."""
    return next((path for path in MEMORY_PEER_FILES if root.exists(path)), None)


def module_loaded(root: SysRoot, module_dir: str) -> bool:
    return root.exists(module_dir)


# ---- the inventory the table is read against --------------------------------


@dataclasses.dataclass(frozen=True)
class StackInventory:
    driver_line: str | None
    kernel_release: str | None
    cuda_driver: int | None
    gpus_without_dmabuf: tuple[str, ...]
    ofed_marker: str | None
    peermem_loaded: bool
    memory_peer: str | None

    @property
    def open_module(self) -> bool:
        return bool(self.driver_line) and is_open_kernel_module(self.driver_line)

    @property
    def kernel(self) -> tuple[int, int] | None:
        return kernel_version(self.kernel_release) if self.kernel_release else None

    def dmabuf_blockers(self) -> list[str]:
        """The DMA-BUF prerequisites this machine does not meet (empty: path available)."""
        blockers = []
        if not self.open_module:
            blockers.append("the GPU driver is not the Open Kernel Module flavour")
        if self.kernel is None or self.kernel < DMABUF_MIN_KERNEL:
            blockers.append(f"kernel {self.kernel_release} is older than 5.12")
        if self.cuda_driver is not None and self.cuda_driver < DMABUF_MIN_CUDA_DRIVER:
            blockers.append(f"CUDA driver {format_cuda_version(self.cuda_driver)} is older than 11.7")
        if self.gpus_without_dmabuf:
            blockers.append("CUDA reports DMA_BUF_SUPPORTED=0 on " + ", ".join(self.gpus_without_dmabuf))
        return blockers

    @property
    def legacy_ready(self) -> bool:
        return self.peermem_loaded and self.memory_peer is not None


def read_inventory(ctx: DoctorContext) -> StackInventory:
    root = ctx.root
    return StackInventory(
        driver_line=driver_version_line(root),
        kernel_release=kernel_release(root),
        cuda_driver=cuda_driver_version(ctx),
        gpus_without_dmabuf=tuple(gpus_reporting_no_dmabuf(ctx)),
        ofed_marker=ofed_marker(root),
        peermem_loaded=module_loaded(root, NVIDIA_PEERMEM_MODULE),
        memory_peer=registered_memory_peer(root),
    )


# ---- findings ---------------------------------------------------------------


def driver_finding(inventory: StackInventory) -> Finding:
    flavour = "Open Kernel Module" if inventory.open_module else "proprietary kernel module"
    return finding(
        id="stack.driver",
        status=Status.INFO,
        summary=f"NVIDIA driver: {flavour}",
        evidence=(Evidence(DRIVER_VERSION_FILE, inventory.driver_line),),
    )


def kernel_finding(inventory: StackInventory) -> Finding:
    meets = inventory.kernel is not None and inventory.kernel >= DMABUF_MIN_KERNEL
    verdict = "meets" if meets else "is below"
    return finding(
        id="stack.kernel",
        status=Status.INFO,
        summary=f"kernel {inventory.kernel_release} {verdict} the 5.12 floor of DMA-BUF",
        evidence=(Evidence(KERNEL_RELEASE_FILE, str(inventory.kernel_release)),),
    )


def cuda_driver_finding(inventory: StackInventory) -> Finding:
    if inventory.cuda_driver is None:
        return finding(
            id="stack.cuda_driver",
            status=Status.SKIP,
            summary="CUDA driver version unknown (no CUDA driver facts); the 11.7 floor of DMA-BUF is unconfirmed",
            evidence=(Evidence("cuDriverGetVersion()", "unavailable"),),
        )
    version = format_cuda_version(inventory.cuda_driver)
    meets = inventory.cuda_driver >= DMABUF_MIN_CUDA_DRIVER
    return finding(
        id="stack.cuda_driver",
        status=Status.INFO,
        summary=f"CUDA driver {version} {'meets' if meets else 'is below'} the 11.7 floor of DMA-BUF",
        evidence=(Evidence("cuDriverGetVersion()", str(inventory.cuda_driver)),),
    )


def ofed_finding(inventory: StackInventory) -> Finding:
    if inventory.ofed_marker:
        return finding(
            id="stack.ofed",
            status=Status.INFO,
            summary="MLNX_OFED or DOCA-OFED is installed",
            evidence=(Evidence(inventory.ofed_marker, "present"),),
        )
    return finding(
        id="stack.ofed",
        status=Status.INFO,
        summary="no MLNX_OFED or DOCA-OFED (inbox RDMA drivers); the legacy nvidia-peermem path needs one",
        evidence=tuple(Evidence(path, "absent") for path in OFED_MARKERS),
    )


def path_finding(inventory: StackInventory) -> Finding:
    """The verdict of the table: which path is available, or why neither is."""
    blockers = inventory.dmabuf_blockers()
    evidence = (
        Evidence(DRIVER_VERSION_FILE, inventory.driver_line),
        Evidence(KERNEL_RELEASE_FILE, str(inventory.kernel_release)),
        Evidence(NVIDIA_PEERMEM_MODULE, "loaded" if inventory.peermem_loaded else "absent"),
    )
    if not blockers:
        unconfirmed = " (CUDA driver version unconfirmed)" if inventory.cuda_driver is None else ""
        also = "; nvidia-peermem is registered too, NCCL prefers DMA-BUF" if inventory.legacy_ready else ""
        return finding(id="stack.path", status=Status.OK,
                       summary=f"DMA-BUF path available{unconfirmed}{also}", evidence=evidence)
    if inventory.legacy_ready:
        return finding(
            id="stack.path",
            status=Status.OK,
            summary="legacy nvidia-peermem path: peermem is loaded and registered (DMA-BUF unavailable: "
            + "; ".join(blockers) + ")",
            evidence=evidence + (Evidence(inventory.memory_peer, "present"),),
        )
    return finding(
        id="stack.path",
        status=Status.FAIL,
        summary="neither DMA-BUF nor nvidia-peermem is available: " + "; ".join(blockers),
        evidence=evidence,
        fix=neither_path_fix(inventory),
    )


def neither_path_fix(inventory: StackInventory) -> str:
    if inventory.peermem_loaded or inventory.ofed_marker:
        # OFED is there: the legacy path is one step away, the install order is the usual cause.
        return "Load nvidia-peermem (`modprobe nvidia-peermem`); if it is missing or does not register, " \
               "the GPU driver was installed before OFED: reinstall the GPU driver."
    return ("For DMA-BUF use the Open Kernel Module driver on kernel 5.12+ with CUDA 11.7+; "
            "for the legacy path: " + INSTALL_ORDER_FIX)


def peermem_findings(inventory: StackInventory) -> list[Finding]:
    module_evidence = Evidence(NVIDIA_PEERMEM_MODULE, "loaded" if inventory.peermem_loaded else "absent")
    if inventory.legacy_ready:
        return [finding(id="stack.peermem", status=Status.OK,
                        summary="nvidia_peermem is loaded and registered as a peer-memory client",
                        evidence=(module_evidence, Evidence(inventory.memory_peer, "present")))]
    if inventory.peermem_loaded:
        return [finding(
            id="stack.peermem.unregistered",
            status=Status.FAIL,
            summary="nvidia_peermem is loaded but not registered with the RDMA core: ibv_reg_mr on GPU memory "
                    "will fail, although NCCL 2.23+ still reports GPU Direct RDMA as supported",
            evidence=(module_evidence,) + tuple(Evidence(path, "absent") for path in MEMORY_PEER_FILES),
            fix=INSTALL_ORDER_FIX,
        )]
    if not inventory.dmabuf_blockers():
        return [finding(id="stack.peermem", status=Status.OK,
                        summary="nvidia_peermem is not loaded, as expected on the DMA-BUF path",
                        evidence=(module_evidence,))]
    # Not loaded and no DMA-BUF either: stack.path carries the failure and the fix.
    return [finding(id="stack.peermem", status=Status.INFO, summary="nvidia_peermem is not loaded",
                    evidence=(module_evidence,))]


def legacy_module_findings(ctx: DoctorContext, inventory: StackInventory) -> list[Finding]:
    findings = []
    if module_loaded(ctx.root, LEGACY_PEER_MEM_MODULE):
        conflict = inventory.peermem_loaded
        findings.append(finding(
            id="stack.nv_peer_mem",
            status=Status.FAIL if conflict else Status.WARN,
            summary="nv_peer_mem is loaded alongside nvidia_peermem; only one may be loaded" if conflict
            else "the deprecated nv_peer_mem module is loaded",
            evidence=(Evidence(LEGACY_PEER_MEM_MODULE, "loaded"),),
            fix="Stop the nv_peer_mem service, `rmmod nv_peer_mem`, uninstall its package, "
                "and use nvidia-peermem (or DMA-BUF) instead.",
        ))
    if module_loaded(ctx.root, GDRCOPY_MODULE):
        findings.append(finding(
            id="stack.gdrcopy",
            status=Status.INFO,
            summary="gdrdrv is loaded: that is GDRCopy (CPU mappings of GPU memory), not GPUDirect RDMA",
            evidence=(Evidence(GDRCOPY_MODULE, "loaded"),),
        ))
    return findings


def check(ctx: DoctorContext) -> list[Finding]:
    inventory = read_inventory(ctx)
    if inventory.driver_line is None:
        return [finding(
            id="stack.driver",
            status=Status.SKIP,
            summary="no NVIDIA kernel driver is loaded, so there is no GPU memory path to classify",
            evidence=(Evidence(DRIVER_VERSION_FILE, "absent"),),
        )]
    return [
        driver_finding(inventory),
        kernel_finding(inventory),
        cuda_driver_finding(inventory),
        ofed_finding(inventory),
        path_finding(inventory),
        *peermem_findings(inventory),
        *legacy_module_findings(ctx, inventory),
    ]
