"""Which kernel path gives the NIC access to GPU memory: DMA-BUF or legacy peer memory.

The two paths have mirror-image prerequisites (NVIDIA GPU Operator documentation):

=====================  ==========================  ======================
                       DMA-BUF (recommended)       legacy nvidia-peermem
=====================  ==========================  ======================
GPU driver             Open Kernel Module          any supported driver
CUDA driver            11.7 or newer               no minimum
Linux kernel           5.12 or newer               no minimum
MLNX_OFED / DOCA-OFED  optional                    required
=====================  ==========================  ======================

The table says what is possible; whether NCCL uses a path is decided per NIC the way NCCL
decides it (:mod:`gdrprobe.nccl.gdr_support`), so ``stack.path`` fails exactly where
NCCL would log "GPU Direct RDMA Disabled for HCA".
"""

from __future__ import annotations

import dataclasses
import functools

from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.doctor.facts.memory_path import (DMABUF_MIN_KERNEL, DRIVER_VERSION_FILE,
                                               KERNEL_RELEASE_FILE, MEMORY_PEERS_DIR,
                                               NVIDIA_PEERMEM_MODULE, kernel_version)
from gdrprobe.nccl.gdr_support import DMABUF_MIN_CUDA_DRIVER, MemoryPaths, format_cuda_version
from gdrprobe.nccl.versions import PEERMEM_MODULE_FILE
from gdrprobe.report import finding_ids as ids
from gdrprobe.report.model import Evidence, Finding, Status
from gdrprobe.sysroot import SysRoot

GROUP = ids.STACK
finding = functools.partial(Finding, group=GROUP)

# MLNX_OFED and DOCA-OFED both build their modules on the mlx_compat layer; the inbox
# kernel drivers have no such module. ofed_info ships with both packages.
OFED_MARKERS = ("/sys/module/mlx_compat", "/usr/bin/ofed_info")

LEGACY_PEER_MEM_MODULE = "/sys/module/nv_peer_mem"
GDRCOPY_MODULE = "/sys/module/gdrdrv"
# Kernel 6.6 dropped /sys/kernel/mm/memory_peers; NCCL before 2.23.4 looked only there.
NO_MEMORY_PEERS_KERNEL = (6, 6)

INSTALL_ORDER_FIX = (
    "Install MLNX_OFED or DOCA-OFED first, then reinstall the GPU driver so that "
    "nvidia-peermem is built against it, and load it with `modprobe nvidia-peermem` "
    "(nothing loads it at boot unless you add it to /etc/modules-load.d/)."
)
DMABUF_ENABLE_FIX = ("Unset NCCL_DMABUF_ENABLE (or set it to 1): DMA-BUF is this node's only path to GPU "
                     "memory, and NCCL_DMABUF_ENABLE=0 switches it off.")


# ---- facts: one small reader per fact ---------------------------------------


def ofed_marker(root: SysRoot) -> str | None:
    """The first path that shows an OFED stack is installed, or None."""
    return next((path for path in OFED_MARKERS if root.exists(path)), None)


# ---- the inventory the table is read against --------------------------------


@dataclasses.dataclass(frozen=True)
class StackInventory:
    driver_line: str | None
    kernel_release: str | None
    cuda_driver: int | None
    ofed_marker: str | None
    peermem_loaded: bool             # /sys/module/nvidia_peermem
    nv_peer_mem_loaded: bool         # /sys/module/nv_peer_mem
    paths: MemoryPaths
    peermem_module_file: bool = False          # /sys/module/nvidia_peermem/version
    memory_peers: tuple[str, ...] | None = None  # the peer-memory API's clients; None: no such directory
    nccl_version_known: bool = False

    @property
    def open_module(self) -> bool:
        return bool(self.driver_line) and "Open Kernel Module" in self.driver_line

    @property
    def kernel(self) -> tuple[int, int] | None:
        return kernel_version(self.kernel_release)


def read_inventory(ctx: DoctorContext) -> StackInventory:
    root = ctx.root
    facts = ctx.cuda_facts if ctx.cuda_facts and "error" not in ctx.cuda_facts else {}
    return StackInventory(
        driver_line=ctx.driver_line,
        kernel_release=ctx.kernel_release,
        cuda_driver=facts.get("driver_version"),
        ofed_marker=ofed_marker(root),
        peermem_loaded=root.exists(NVIDIA_PEERMEM_MODULE),
        nv_peer_mem_loaded=root.exists(LEGACY_PEER_MEM_MODULE),
        paths=ctx.memory_paths,
        peermem_module_file=root.exists(PEERMEM_MODULE_FILE),
        memory_peers=tuple(root.listdir(MEMORY_PEERS_DIR)) if root.exists(MEMORY_PEERS_DIR) else None,
        nccl_version_known=ctx.nccl_rules.version is not None,
    )


# ---- findings ---------------------------------------------------------------


def driver_finding(inventory: StackInventory) -> Finding:
    flavour = "Open Kernel Module" if inventory.open_module else "proprietary kernel module"
    return finding(
        id=ids.STACK_DRIVER,
        status=Status.INFO,
        summary=f"NVIDIA driver: {flavour}",
        evidence=(Evidence(DRIVER_VERSION_FILE, inventory.driver_line),),
    )


def kernel_finding(inventory: StackInventory) -> Finding:
    meets = inventory.kernel is not None and inventory.kernel >= DMABUF_MIN_KERNEL
    verdict = "meets" if meets else "is below"
    return finding(
        id=ids.STACK_KERNEL,
        status=Status.INFO,
        summary=f"kernel {inventory.kernel_release} {verdict} the 5.12 floor of DMA-BUF",
        evidence=(Evidence(KERNEL_RELEASE_FILE, str(inventory.kernel_release)),),
    )


def cuda_driver_finding(inventory: StackInventory) -> Finding:
    if inventory.cuda_driver is None:
        return finding(
            id=ids.STACK_CUDA_DRIVER,
            status=Status.SKIP,
            summary="CUDA driver version unknown (no CUDA driver facts); the 11.7 floor of DMA-BUF is unconfirmed",
            evidence=(Evidence("cuDriverGetVersion()", "unavailable"),),
        )
    version = format_cuda_version(inventory.cuda_driver)
    meets = inventory.cuda_driver >= DMABUF_MIN_CUDA_DRIVER
    return finding(
        id=ids.STACK_CUDA_DRIVER,
        status=Status.INFO,
        summary=f"CUDA driver {version} {'meets' if meets else 'is below'} the 11.7 floor of DMA-BUF",
        evidence=(Evidence("cuDriverGetVersion()", str(inventory.cuda_driver)),),
    )


def ofed_finding(inventory: StackInventory) -> Finding:
    if inventory.ofed_marker:
        return finding(
            id=ids.STACK_OFED,
            status=Status.INFO,
            summary="MLNX_OFED or DOCA-OFED is installed",
            evidence=(Evidence(inventory.ofed_marker, "present"),),
        )
    return finding(
        id=ids.STACK_OFED,
        status=Status.INFO,
        summary="no MLNX_OFED or DOCA-OFED (inbox RDMA drivers); the legacy nvidia-peermem path needs one",
        evidence=tuple(Evidence(path, "absent") for path in OFED_MARKERS),
    )


def path_finding(inventory: StackInventory) -> Finding:
    """NCCL's per-NIC verdict (topo.cc ncclTopoPopulateNics): a path for every NIC, or the fix."""
    paths = inventory.paths
    evidence = (Evidence(DRIVER_VERSION_FILE, inventory.driver_line),
                Evidence(KERNEL_RELEASE_FILE, str(inventory.kernel_release))) + paths.evidence()
    disabled = inventory.paths.disabled_pairs()
    unasked = paths.unasked_nics()
    if unasked:
        return finding(id=ids.STACK_PATH, status=Status.FAIL,
                       summary=f"{paths.nccl_name} registers GPU memory through DMA-BUF with {', '.join(unasked)} "
                               "without asking whether the NIC can (src/transport/net.cc before 2.14.3): "
                               + paths.nic_half(unasked[0]).reason + "; its registrations will fail",
                       evidence=evidence,
                       fix="Upgrade the job's NCCL to 2.14.3 or newer, or set NCCL_DMABUF_ENABLE=0 so that it "
                           "registers through peer memory.")
    if not disabled:
        mechanisms = sorted({paths.mechanism(nic, gpu) for nic in paths.nics for gpu in paths.gpus})
        inferred = any(paths.nic_half(nic).inferred for nic in paths.nics for gpu in paths.gpus
                       if paths.mechanism(nic, gpu) == "DMA-BUF")
        also = ("; peer memory is there too, NCCL prefers DMA-BUF"
                if paths.peermem_file and mechanisms == ["DMA-BUF"] else "")
        return finding(id=ids.STACK_PATH, status=Status.OK,
                       summary="NCCL can register GPU memory with every NIC through "
                               + " and ".join(mechanisms) + (" (NIC side inferred)" if inferred else "") + also,
                       evidence=evidence)
    nics = sorted({nic for nic, _ in disabled})
    nic, gpu = disabled[0]
    return finding(
        id=ids.STACK_PATH,
        status=Status.FAIL,
        summary=f"NCCL will log \"GPU Direct RDMA Disabled for HCA\" for {', '.join(nics)}: "
                + paths.why_not(nic, gpu),
        evidence=evidence,
        fix=neither_path_fix(inventory),
    )


def neither_path_fix(inventory: StackInventory) -> str:
    if inventory.peermem_module_file and PEERMEM_MODULE_FILE not in inventory.paths.peermem_files:
        return (f"The job's {inventory.paths.nccl_name} looks for peer memory only in {MEMORY_PEERS_DIR}, which "
                f"this kernel does not have, and misses the loaded nvidia-peermem ({PEERMEM_MODULE_FILE}): "
                "upgrade the job's NCCL to 2.23.4 or newer (the nvidia-nccl wheel, libnccl2), or use DMA-BUF.")
    if not inventory.paths.dmabuf_enabled and not inventory.paths.disabled_pairs(dmabuf_enabled=True):
        return DMABUF_ENABLE_FIX
    if inventory.peermem_loaded or inventory.ofed_marker:
        # OFED is there: the legacy path is one step away, the install order is the usual cause.
        return "Load nvidia-peermem (`modprobe nvidia-peermem`); if it is missing or does not load, " \
               "the GPU driver was installed before OFED: reinstall the GPU driver."
    return ("For DMA-BUF use the Open Kernel Module driver on kernel 5.12+ with CUDA 11.7+ and "
            "rdma-core 34+ (ibv_reg_dmabuf_mr); for the legacy path: " + INSTALL_ORDER_FIX)


def old_nccl_note(inventory: StackInventory) -> str:
    """On 6.6+ only the module's own file is left, which NCCL reads from 2.23.4 on: said
    when the job's NCCL is not known (when it is, its own rule decides)."""
    if inventory.nccl_version_known or inventory.paths.peermem_file != PEERMEM_MODULE_FILE \
            or inventory.kernel is None or inventory.kernel < NO_MEMORY_PEERS_KERNEL:
        return ""
    return (f"; kernel {inventory.kernel_release} has no {MEMORY_PEERS_DIR}, so NCCL older than 2.23.4 "
            "(which looks only there) reports GPU Direct RDMA disabled")


def unregistered_finding(inventory: StackInventory) -> Finding:
    """nvidia-peermem loaded but not among the peer-memory API's clients: NCCL counts the
    module's version file (net_ib.cc ncclIbGdrSupport) and registrations then fail."""
    paths = inventory.paths
    blocks = not paths.dmabuf_everywhere()
    summary = (f"nvidia_peermem is loaded but not registered with MLNX_OFED's peer-memory API: {MEMORY_PEERS_DIR} "
               "lists no nv_mem client. NCCL checks only that the module's files exist, believes GPUDirect "
               "RDMA works, and its registrations of GPU memory will fail (here gdrprobe knows more than NCCL)")
    if not blocks:
        summary += "; NCCL registers through DMA-BUF on every NIC here, so it is not in the way today"
    return finding(
        id=ids.STACK_PEERMEM, status=Status.FAIL if blocks else Status.WARN, summary=summary,
        evidence=(Evidence(NVIDIA_PEERMEM_MODULE, "loaded"), Evidence(paths.peermem_file, "present"),
                  Evidence(MEMORY_PEERS_DIR, ", ".join(inventory.memory_peers or ()) or "no client")),
        fix="Rebuild nvidia-peermem against the installed MLNX_OFED/DOCA-OFED: reinstall the GPU driver (or its "
            "DKMS module) after OFED, then `rmmod nvidia_peermem; modprobe nvidia-peermem` and check that "
            f"{MEMORY_PEERS_DIR}/nv_mem appears.")


def peermem_findings(inventory: StackInventory) -> list[Finding]:
    paths = inventory.paths
    module_evidence = Evidence(NVIDIA_PEERMEM_MODULE, "loaded" if inventory.peermem_loaded else "absent")
    if paths.peermem_file and paths.peermem_registered is False:
        return [unregistered_finding(inventory)]
    if paths.peermem_file:
        return [finding(id=ids.STACK_PEERMEM, status=Status.OK,
                        summary=f"NCCL's peer-memory check passes: {paths.peermem_file} exists"
                                + old_nccl_note(inventory),
                        evidence=(module_evidence, Evidence(paths.peermem_file, "present")))]
    if inventory.peermem_module_file and PEERMEM_MODULE_FILE not in paths.peermem_files:
        return [finding(
            id=ids.STACK_PEERMEM, status=Status.WARN,
            summary=f"nvidia_peermem is loaded, but the job's {paths.nccl_name} looks for peer memory only in "
                    f"{MEMORY_PEERS_DIR}, which is not there: it does not count the module",
            evidence=(module_evidence, Evidence(PEERMEM_MODULE_FILE, "present"))
            + tuple(Evidence(path, "absent") for path in paths.peermem_files),
            fix=neither_path_fix(inventory))]
    if inventory.peermem_loaded:
        # A loaded module has its version file; a module directory without one is loading or unloading.
        return [finding(
            id=ids.STACK_PEERMEM, status=Status.WARN,
            summary="/sys/module/nvidia_peermem exists but none of NCCL's peer-memory files does: "
                    "the module is half loaded or unloading, and NCCL does not count it",
            evidence=(module_evidence,) + tuple(Evidence(path, "absent") for path in paths.peermem_files),
            fix="Reload it (`rmmod nvidia_peermem; modprobe nvidia-peermem`) and read `dmesg`; if it does "
                "not load: " + INSTALL_ORDER_FIX)]
    if inventory.paths.dmabuf_everywhere():
        return [finding(id=ids.STACK_PEERMEM, status=Status.OK,
                        summary="nvidia_peermem is not loaded, as expected on the DMA-BUF path",
                        evidence=(module_evidence,))]
    # Not loaded and no DMA-BUF either: stack.path carries the failure and the fix.
    return [finding(id=ids.STACK_PEERMEM, status=Status.INFO, summary="nvidia_peermem is not loaded",
                    evidence=(module_evidence,))]


def legacy_module_findings(ctx: DoctorContext, inventory: StackInventory) -> list[Finding]:
    findings = []
    if inventory.nv_peer_mem_loaded:
        conflict = inventory.peermem_loaded
        findings.append(finding(
            id=ids.STACK_NV_PEER_MEM,
            status=Status.FAIL if conflict else Status.WARN,
            summary="nv_peer_mem is loaded alongside nvidia_peermem; only one may be loaded" if conflict
            else "the deprecated nv_peer_mem module is the peer-memory path: it works (NCCL counts the "
                 "nv_mem client it registers) but is no longer maintained",
            evidence=(Evidence(LEGACY_PEER_MEM_MODULE, "loaded"),),
            fix="Stop the nv_peer_mem service, `rmmod nv_peer_mem`, uninstall its package, "
                "and use nvidia-peermem (shipped with the GPU driver since R470) or DMA-BUF instead.",
        ))
    if ctx.root.exists(GDRCOPY_MODULE):
        findings.append(finding(
            id=ids.STACK_GDRCOPY,
            status=Status.INFO,
            summary="gdrdrv is loaded: that is GDRCopy (CPU mappings of GPU memory), not GPUDirect RDMA",
            evidence=(Evidence(GDRCOPY_MODULE, "loaded"),),
        ))
    return findings


def check(ctx: DoctorContext) -> list[Finding]:
    inventory = read_inventory(ctx)
    if inventory.driver_line is None:
        if ctx.root.is_denied(DRIVER_VERSION_FILE):
            return [finding(
                id=ids.STACK_DRIVER, status=Status.SKIP,
                summary="the NVIDIA driver's version file exists but may not be read by this user: "
                        "the GPU memory path is unknown",
                evidence=(Evidence(DRIVER_VERSION_FILE, "permission denied"),),
                fix="Run the doctor as root (sudo gdrprobe doctor).")]
        return [finding(
            id=ids.STACK_DRIVER,
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
