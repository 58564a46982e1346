"""GPU memory providers: the same buffer interface as host memory, three ways to reach it.

- :class:`DmaBufGpuMemory`: device memory exported as a DMA-BUF and registered with
  ``DmaBufMR``; no kernel module beyond the GPU and NIC drivers.
- :class:`PeermemGpuMemory`: the GPU address registered with a plain ``MR``; works only
  when a peer-memory client (nvidia-peermem) lets the NIC driver resolve GPU addresses.
- :class:`StagedGpuMemory`: the bounce baseline; the NIC reads and writes a pinned host
  buffer and CUDA copies between it and the GPU around the timed regions.

All three fill and check the payload through a pinned host staging copy (the pattern code
works on host addresses), so a check reads back what the NIC really left in GPU memory.
Providers borrow an open GPU of any runtime (:class:`gdrprobe.memory.runtime.GpuDevice`, CUDA's
is :class:`gdrprobe.memory.cuda.GpuDevice`); they free only what they allocate.

Also here: the choice between the mechanisms (NCCL's NIC DMA-BUF probe is in
:mod:`gdrprobe.memory.nic_probe`).
"""

from __future__ import annotations

import os
import time

from gdrprobe.defaults import GPU_ALLOCATION
from gdrprobe.errors import UsageError
from gdrprobe.memory.causes import gpu_registration_failed
from gdrprobe.memory import rungs
from gdrprobe.nccl.data_direct import REFUSED_CAUSE as DATA_DIRECT_REFUSED
from gdrprobe.nccl.data_direct import REFUSED_FIX as DATA_DIRECT_REFUSED_FIX
from gdrprobe.memory.nic_probe import NicDmaBufSupport, dmabuf_mr
from gdrprobe.rdma.mlx5dv import register_data_direct
from gdrprobe.memory.provider import PROBE_ACCESS, MemoryProvider
from gdrprobe.memory.runtime import DmaBufAttribute, GpuDevice, dmabuf_range
from gdrprobe.memory.spec import GPUDIRECT_PROOF_MEMORY, MECHANISMS, MEMORY_TYPES


class GpuMemory(MemoryProvider):
    """A GPU buffer plus a pinned host staging copy of the same length."""

    kind = "gpu"
    mechanism = "abstract"

    def __init__(self, gpu: GpuDevice, length: int, memory_type: str = "device",
                 allocation: str = GPU_ALLOCATION):
        if memory_type not in MEMORY_TYPES:
            raise UsageError(f"unknown GPU memory type {memory_type!r}",
                             f"use one of: {', '.join(MEMORY_TYPES)}")
        if length <= 0:
            raise ValueError(f"a GPU buffer needs a positive length, not {length}")
        self.gpu = gpu
        self.length = length
        self.memory_type = memory_type
        self.mr = None
        self.buffer = gpu.allocate(memory_type, length, allocation)
        try:
            self.staging = gpu.alloc_pinned_host(length)
        except BaseException:
            self.buffer.close()
            raise

    # -- payload, through the staging copy --

    @property
    def cpu_view(self) -> int:
        return self.staging.ptr

    def push(self, offset: int, length: int) -> None:
        self.gpu.copy_to_device(self.buffer.ptr + offset, self.staging.ptr + offset, length)

    def pull(self, offset: int, length: int) -> None:
        self.gpu.copy_to_host(self.staging.ptr + offset, self.buffer.ptr + offset, length)

    def flush_remote_writes(self) -> None:
        self.gpu.flush_rdma_writes()

    # IBV_SEND_INLINE makes the CPU memcpy the payload from the SGE address: for DMA-BUF
    # that is an IOVA (0 for a fresh allocation), for peermem a GPU address the CPU cannot
    # map; and an inline write bypasses GPUDirect, so it would prove nothing either way.
    # perftest forces inline off for CUDA buffers for the same reason (ctx_set_max_inline).
    inline_capable = False
    gpudirect_target = True
    registered_memory = "GPU memory"

    @property
    def peer_memory(self) -> str:
        """The peer-memory client that resolves the GPU's addresses for the NIC; "": none
        is asked (DMA-BUF hands the NIC the pages itself)."""
        return ""

    def _refused(self, error: Exception) -> Exception:
        """A refused registration of GPU memory, with the cause and fix its errno means for
        this mechanism and peer-memory client."""
        failed = gpu_registration_failed(error, self.mechanism, self._registered_what(),
                                         self.peer_memory)
        failed.peer_memory = self.peer_memory    # the verdict names it: "peermem (amdkfd)"
        return failed

    # -- description and cleanup --

    @property
    def gpudirect_proof(self) -> bool:
        return self.memory_type == GPUDIRECT_PROOF_MEMORY

    def describe(self) -> dict:
        return {"kind": self.kind, "mechanism": self.mechanism, "memory_type": self.memory_type,
                "length_bytes": self.length, "gpudirect_proof": self.gpudirect_proof,
                "pci_bus_id": self.gpu.bus_id, "gpu": self.gpu.describe(),
                **self.allocation_facts()}

    def allocation_facts(self) -> dict:
        """How the GPU buffer was allocated (VMM or cuMemAlloc) and why; for VMM, whether
        it asked for GPUDirect RDMA (gpuDirectRDMACapable)."""
        facts = {"allocation": self.buffer.allocation}
        if getattr(self.buffer, "allocation_reason", ""):
            facts["allocation_reason"] = self.buffer.allocation_reason
        if hasattr(self.buffer, "gpu_direct_rdma_capable"):
            facts["gpu_direct_rdma_capable"] = self.buffer.gpu_direct_rdma_capable
        return facts

    def close(self) -> None:
        # Deregister before freeing: the NIC must stop using the pages first.
        try:
            if self.mr is not None:
                mr, self.mr = self.mr, None
                mr.close()
        finally:
            try:
                self.staging.close()
            finally:
                self.buffer.close()


class DmaBufGpuMemory(GpuMemory):
    """Device memory exported as DMA-BUF; verbs addresses it by its offset in the DMA-BUF."""

    mechanism = "dmabuf"

    def __init__(self, gpu, length: int, memory_type: str = "device",
                 allocation: str = GPU_ALLOCATION, pcie_mapping: bool = False, data_direct: str | None = None,
                 face: str = "", face_reason: str = ""):
        if memory_type != "device":
            raise UsageError(f"DMA-BUF export needs device memory, not {memory_type}",
                             "use the device memory type, or the peermem mechanism")
        super().__init__(gpu, length, memory_type, allocation)
        self.pcie_mapping = pcie_mapping
        self.route = ""     # how the DMA-BUF was registered (see nic_probe.dmabuf_mr)
        self.data_direct = data_direct  # the NIC's data-direct path (gdrprobe.nccl.data_direct); None: none
        # the face NCCL registers on (gdrprobe.nccl.data_direct.nccl_face): its rungs alone
        self.ladder = rungs.ladder(data_direct, True, False, face, face_reason)
        self.rung = self.rung_reason = ""   # the rung that registered, and why (memory.rungs)
        # pyverbs' DmaBufMR sets the iova to the offset, so that is the buffer's address.
        self._offset = dmabuf_range(self.buffer.ptr, length).offset

    @property
    def address(self) -> int:
        return self._offset

    def register(self, pd, access: int = PROBE_ACCESS) -> None:
        fd, offset = self.gpu.export_dmabuf(self.buffer.ptr, self.length, self.pcie_mapping)

        def attempt(pv, rung):
            if rung.name == rungs.DATA_DIRECT:
                mr, self.route = register_data_direct(pd, self.length, access, fd, offset)
            else:
                mr, self.route = dmabuf_mr(pv, pd, self.length, access, fd, offset)
            return mr

        def create(pv):
            # The face NCCL registers on; not known: data-direct where the NIC has it, then plain.
            try:
                climbed = rungs.climb(self.ladder, lambda rung: attempt(pv, rung), pv.PyverbsRDMAError)
            except rungs.NoRungHeld as failed:
                failed.last.refused_rungs = rungs.said(failed)
                failed.last.refused_alone = any(rung.alone for rung, _ in failed.refused)
                raise failed.last from failed
            self.rung, self.rung_reason = climbed.rung.name, climbed.reason
            return climbed.region

        try:
            self._register_with(create)
        finally:
            # The MR holds its own reference to the DMA-BUF.
            os.close(fd)

    def _refused(self, error: Exception) -> Exception:
        failed = super()._refused(error)
        route = getattr(error, "route", "")
        if route:   # say that libibverbs, not pyverbs, was asked
            failed.evidence = f"{failed.evidence}; through {route}"
        if getattr(error, "refused_rungs", ""):   # every rung refused: say each
            failed.evidence = f"{failed.evidence}; rungs refused: {error.refused_rungs}"
        if getattr(error, "refused_alone", False):  # NCCL's own face refused: the job's too
            failed.cause = f"{DATA_DIRECT_REFUSED}: {failed.cause}"
            failed.fix = f"{DATA_DIRECT_REFUSED_FIX}; {failed.fix}"
        return failed

    def describe(self) -> dict:
        return {**super().describe(), "pcie_mapping": self.pcie_mapping,
                "dmabuf_offset": self._offset,
                **({"registration_route": self.route} if self.route else {}),
                **({"registration_rung": self.rung, "registration_rung_reason": self.rung_reason}
                   if self.rung else {})}


class PeermemGpuMemory(GpuMemory):
    """The GPU address registered as is; the runtime's peer-memory client (nvidia-peermem,
    amdkfd) resolves it for the NIC."""

    mechanism = "peermem"

    @property
    def address(self) -> int:
        return self.buffer.ptr

    @property
    def peer_memory(self) -> str:
        return self.gpu.attributes.peer_memory

    def register(self, pd, access: int = PROBE_ACCESS) -> None:
        self._register_with(lambda pv: pv.mr.MR(pd, self.length, access, address=self.buffer.ptr))

    def describe(self) -> dict:
        return {**super().describe(), "peer_memory": self.peer_memory}


class StagedGpuMemory(GpuMemory):
    """The GPU buffer reached through its pinned host copy: what no GPUDirect costs.

    The staging buffer is the registered region. The probe calls :meth:`stage_out` before
    sending and :meth:`stage_in` after the peer's writes arrived, before the checks. The
    payload checks read the GPU buffer (through the staging range they check, which they
    overwrite), so a missed ``stage_in`` shows as corruption; the poison check reads the
    staging buffer, where stray writes land.
    """

    mechanism = "staged"
    inline_capable = True     # the NIC sends from the pinned host copy
    gpudirect_target = False  # ... and writes into it: the CPU copies it home
    # The NIC registers the pinned host copy: a refusal is host memory's (a locked-memory
    # limit or a verbs error), not a GPU registration's.
    registered_memory = "pinned host memory"
    _refused = MemoryProvider._refused

    @property
    def address(self) -> int:
        return self.staging.ptr

    @property
    def gpudirect_proof(self) -> bool:
        return False

    def register(self, pd, access: int = PROBE_ACCESS) -> None:
        self._register_with(lambda pv: pv.mr.MR(pd, self.length, access, address=self.staging.ptr))

    def _pull_nic_writes(self, offset: int, length: int) -> None:
        """Nothing to pull: the NIC writes the staging buffer, the CPU's view itself, and
        pulling the GPU's copy over it would hide the stray writes there."""

    def flush_remote_writes(self) -> None:
        """Nothing to flush: the writes landed in host memory; stage_in moves them."""

    def stage_out(self, offset: int, length: int) -> float:
        started = time.perf_counter()
        self.pull(offset, length)
        return time.perf_counter() - started

    def stage_in(self, offset: int, length: int) -> float:
        started = time.perf_counter()
        self.push(offset, length)
        return time.perf_counter() - started


PROVIDERS = {"dmabuf": DmaBufGpuMemory, "peermem": PeermemGpuMemory, "staged": StagedGpuMemory}


# ---- which mechanism ------------------------------------------------------------------


def gpu_dmabuf_reason(gpu_attrs: DmaBufAttribute | None) -> str:
    if gpu_attrs is None:
        return "the GPU's DMA-BUF support is unknown"
    value = gpu_attrs.dma_buf_supported
    return (f"the GPU {'can' if value else 'cannot'} export DMA-BUF "
            f"({gpu_attrs.dma_buf_attribute}={value})")


def choose_mechanism(requested: str, gpu_attrs: DmaBufAttribute | None,
                     nic_probe: NicDmaBufSupport,
                     memory_type: str = GPUDIRECT_PROOF_MEMORY) -> tuple[str, str]:
    """(mechanism, why): auto takes DMA-BUF when both the GPU and the NIC can, else peermem.
    Only device memory can be exported as DMA-BUF; auto registers managed and pinned-host
    memory by address (peermem), and the verdict calls it memory that proves nothing."""
    if requested not in MECHANISMS:
        raise UsageError(f"unknown registration mechanism {requested!r}",
                         f"use one of: {', '.join(MECHANISMS)}")
    gpu_reason = gpu_dmabuf_reason(gpu_attrs)
    if requested != "auto":
        return requested, f"{requested} requested; {gpu_reason}; {nic_probe.reason}"
    peermem = peermem_label(gpu_attrs)
    if memory_type != GPUDIRECT_PROOF_MEMORY:
        return "peermem", (f"auto: {memory_type} memory cannot be exported as DMA-BUF, so its "
                           f"address is registered as is, {peermem} (memory that proves "
                           "nothing about GPUDirect)")
    gpu_can = gpu_attrs is not None and bool(gpu_attrs.dma_buf_supported)
    if gpu_can and nic_probe.supported:
        return "dmabuf", f"auto: {gpu_reason} and {nic_probe.reason}"
    blockers = [reason for ok, reason in ((gpu_can, gpu_reason),
                                          (nic_probe.supported, nic_probe.reason)) if not ok]
    return "peermem", f"auto fell back to {peermem}: {'; '.join(blockers)}"


def peermem_label(gpu_attrs: DmaBufAttribute | None) -> str:
    """The peermem mechanism with who resolves the GPU's addresses: "peermem (amdkfd)"."""
    return f"peermem ({gpu_attrs.peer_memory})" if gpu_attrs is not None else "peermem"
