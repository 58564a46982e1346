"""Why registering memory failed: errno to cause and fix, in one table.

The memory providers use it to word the error of a refused registration (host memory: a
resource limit or a verbs error; GPU memory: :class:`RegistrationFailed`); the verdict uses
it to explain "not engaged". Pure: no verbs, no CUDA.
"""

from __future__ import annotations

import dataclasses
import errno

from gdrprobe.errors import RdmaError, RegistrationFailed, ResourceLimit, errno_label

MEMLOCK_FIX = ("raise the locked-memory limit: 'ulimit -l unlimited' (limits.conf: "
               "'* soft memlock unlimited' and '* hard memlock unlimited', then log in again), "
               "or add the IPC_LOCK capability to a container that runs as root (a non-root "
               "one gets none that way: raise the container runtime's memlock limit)")


@dataclasses.dataclass(frozen=True)
class RegistrationCause:
    cause: str
    fix: str


PEERMEM_OR_DMABUF = "use the other mechanism (--mem dmabuf or --mem peermem)"
SCATTER_TO_CQE_HINT = ("on mlx5, if the path is present and registration still fails, retry "
                       "with MLX5_SCATTER_TO_CQE=0 (perftest's known 'Couldn't allocate MR' "
                       "issue)")
BAR1_HINT = ("check BAR1 with 'nvidia-smi -q -d MEMORY'; a small BAR1 needs \"Above 4G "
             "Decoding\" and \"Resizable BAR\" in the BIOS")

# A DMA-BUF export the GPU driver refused (cuMemGetHandleForAddressRange failed): the
# registration fails before the NIC is asked, so there is no errno; this code stands for it
# where a registration failure carries one (RegistrationFailed.error_code, the verdict's
# registration_errno). NCCL exports its buffers with the same call and gives up on the
# connection when it fails (NCCL 2.30.7 src/transport/net.cc sendProxyConnect and
# recvProxyConnect: CUCHECK, which returns ncclUnhandledCudaError, src/include/cudawrap.h),
# as it does when the NIC refuses the DMA-BUF (NCCLCHECK of regMrDmaBuf).
DMABUF_EXPORT_REFUSED = -2
DMABUF_EXPORT_CALL = "cuMemGetHandleForAddressRange"

REGISTRATION_CAUSES: dict[int, RegistrationCause] = {
    DMABUF_EXPORT_REFUSED: RegistrationCause(
        "the GPU driver refused to export the GPU memory as DMA-BUF; NCCL makes the same "
        "call for its buffers and gives up on the connection",
        "check dmesg and 'nvidia-smi' for why the driver refused (the GPU says it can "
        "export: CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED); until it is fixed, NCCL registers "
        "through peer memory with NCCL_DMABUF_ENABLE=0 and nvidia-peermem loaded"),
    errno.EOPNOTSUPP: RegistrationCause(
        "the RDMA driver cannot register DMA-BUF memory (its rdma-core provider or kernel "
        "driver has no DMA-BUF registration; rxe and siw never do)",
        "use a NIC whose driver registers DMA-BUF (mlx5, efa and others in recent rdma-core), "
        "or use peermem with nvidia-peermem loaded"),
    errno.EPROTONOSUPPORT: RegistrationCause(
        "the kernel has no DMA-BUF memory registration (Linux older than 5.12)",
        "boot Linux 5.12 or newer, or use peermem with nvidia-peermem loaded"),
    errno.EFAULT: RegistrationCause(
        "no peer-memory client took the GPU address: nvidia-peermem is not loaded (or was "
        "built before MLNX_OFED/DOCA-OFED was installed), or the stack offers DMA-BUF only",
        "modprobe nvidia-peermem (if it will not load, reinstall the GPU driver after the "
        f"OFED stack), or use --mem dmabuf; {SCATTER_TO_CQE_HINT}"),
    errno.ENOMEM: RegistrationCause(
        "the locked-memory limit is reached or the GPU's BAR1 aperture is exhausted",
        f"{MEMLOCK_FIX}; {BAR1_HINT}"),
    errno.EAGAIN: RegistrationCause(
        "pinning failed for now: the locked-memory limit or the BAR1 aperture is exhausted",
        f"{MEMLOCK_FIX}; {BAR1_HINT}"),
    errno.EINVAL: RegistrationCause(
        "the RDMA driver rejected the registration: a GPU address with no peer-memory path, "
        "or a DMA-BUF range or access flag it does not accept",
        f"run 'gdrprobe doctor' and check dmesg; {PEERMEM_OR_DMABUF}; {SCATTER_TO_CQE_HINT}"),
    errno.EPERM: RegistrationCause(
        "memory registration is not permitted (a locked-memory limit of 0, or a container "
        "without IPC_LOCK)", MEMLOCK_FIX),
}


# Where the peer-memory client is not nvidia-peermem, what its refusal means instead.
# amdkfd's PeerDirect reaches the NIC only through a peer-memory API in the RDMA stack
# (MLNX_OFED/DOCA-OFED's, or a kernel exporting ib_register_peer_memory_client): RCCL looks
# for it as memory_peers/amdkfd/version or that symbol (ROCm/rccl 0cbce2a7
# src/transport/net_ib.cc ncclIbGdrSupport).
PEER_MEMORY_CAUSES: dict[str, dict[int, RegistrationCause]] = {
    "amdkfd": {
        errno.EFAULT: RegistrationCause(
            "no peer-memory client took the GPU address: amdkfd's PeerDirect is not registered "
            "with the RDMA stack (no memory_peers/amdkfd/version, no ib_register_peer_memory_client "
            "in /proc/kallsyms), or the stack offers DMA-BUF only",
            "install the NIC's driver stack with peer-memory support (MLNX_OFED/DOCA-OFED) so that "
            "memory_peers/amdkfd/version appears, or use --mem dmabuf (RCCL then needs "
            f"NCCL_DMABUF_ENABLE=1); 'gdrprobe doctor' shows RCCL's decision; {SCATTER_TO_CQE_HINT}"),
    },
}


def errno_name(code: int | None) -> str:
    """The errno as verbs tools print it (errors.errno_label); the refused DMA-BUF export by
    the call that refused it."""
    return DMABUF_EXPORT_CALL if code == DMABUF_EXPORT_REFUSED else errno_label(code)


def registration_cause(error_code: int, peer_memory: str = "") -> RegistrationCause:
    """Cause and fix of a failed GPU memory registration, by errno and, for peermem, by
    the peer-memory client that refused it (nvidia-peermem where not said)."""
    known = PEER_MEMORY_CAUSES.get(peer_memory, {}).get(error_code) or REGISTRATION_CAUSES.get(error_code)
    if known is not None:
        return known
    return RegistrationCause(f"GPU memory registration failed with errno {error_code} "
                             f"({errno_name(error_code)})",
                             "run 'gdrprobe doctor' and check dmesg for the RDMA driver's "
                             "message")


# What a refused registration of host memory means: pinning hit a limit.
MEMLOCK_ERRNOS = (errno.ENOMEM, errno.EAGAIN, errno.EPERM)


def first_line(error: Exception) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def host_registration_error(error, what: str) -> Exception:
    """A refused registration of host memory: a resource limit, or a verbs error."""
    code = getattr(error, "error_code", -1)
    if code in MEMLOCK_ERRNOS:
        return ResourceLimit(f"registering {what} failed: {errno_name(code)} (the "
                             "locked-memory limit is the usual cause)", MEMLOCK_FIX,
                             evidence=first_line(error))
    return RdmaError(f"registering {what} failed", "check 'gdrprobe doctor' and dmesg",
                     evidence=first_line(error))


def dmabuf_export_refused(call: str, result: str, pcie_mapping: bool) -> RegistrationFailed:
    """A DMA-BUF export the GPU driver refused with CUresult ``result``: the DMA-BUF
    registration failed (the verdict: not engaged), as NCCL's would."""
    known = REGISTRATION_CAUSES[DMABUF_EXPORT_REFUSED]
    mapping = " with the PCIe mapping" if pcie_mapping else ""
    return RegistrationFailed(f"registering GPU memory through dmabuf failed: {known.cause} "
                              f"({call}{mapping} returned {result})",
                              known.fix + ("; or drop --dmabuf-pcie" if pcie_mapping else ""),
                              f"{call}: {result}", DMABUF_EXPORT_REFUSED, "dmabuf")


def gpu_registration_failed(error, mechanism: str, what: str, peer_memory: str = "") -> RegistrationFailed:
    """A refused registration of GPU memory, with the cause and fix its errno means."""
    code = getattr(error, "error_code", -1)
    known = registration_cause(code, peer_memory)
    return RegistrationFailed(f"registering {what} through {mechanism} failed: {known.cause}",
                              known.fix, first_line(error), code, mechanism)
