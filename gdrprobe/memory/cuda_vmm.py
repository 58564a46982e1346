"""GPU memory allocated as NCCL allocates its buffers: the CUDA virtual memory management
(VMM) API, so that the memory a check registers is the memory a job registers.

NCCL 2.19 and later allocate with VMM wherever it is supported (NCCL_CUMEM_ENABLE, default
-2: auto). NCCL 2.30.7's ``src/misc/cudawrap.cc`` (ncclIsCuMemSupported) calls it supported
when the driver is CUDA 12.0 or newer, cuMemCreate exists and the GPU reports
``CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED``; elsewhere NCCL uses cuMemAlloc,
and so does :func:`allocation_plan`. ``src/include/alloc.h`` (ncclCuMemAlloc) makes a buffer
in four steps, which :class:`VmmAllocation` repeats:

1. ``cuMemCreate`` of pinned device memory on the GPU, POSIX file descriptor handles and,
   where the GPU reports ``CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED``, FABRIC ones
   too, allocated again without FABRIC where the platform refuses it
   (``CUDA_ERROR_NOT_PERMITTED`` or ``CUDA_ERROR_NOT_SUPPORTED``: no IMEX channel), as
   NCCL's allocator makes the buffers a job registers (``src/allocator.cc`` ncclMemAlloc;
   NCCL's own buffers take FABRIC on a multi-node NVLink system, ``src/mnnvl.cc``),
   ``allocFlags.gpuDirectRDMACapable`` set where the GPU reports
   ``CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED`` (a platform whose IOMMU
   refuses GPU memory without it, Grace-Blackwell's SMMU among them, fails the registration
   otherwise), the size rounded up to the minimum granularity;
2. ``cuMemAddressReserve`` of as many bytes, aligned to that granularity;
3. ``cuMemMap`` of the whole allocation there;
4. ``cuMemSetAccess`` read-write for the GPU.

NCCL sets no pointer attribute on such memory (no SYNC_MEMOPS): neither does this module.
Freed in reverse order on every path.
"""

from __future__ import annotations

from gdrprobe.errors import GdrprobeError
from gdrprobe.memory.cuda_driver import close_after, device_attribute, driver_version, gpu_pages
from gdrprobe.nccl.env import VMM_MIN_DRIVER, vmm_unsupported

VMM_SUPPORTED = "VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED"
VMM_GDR_SUPPORTED = "GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED"
FABRIC_SUPPORTED = "HANDLE_TYPE_FABRIC_SUPPORTED"
# cuMemCreate's answers that make ncclMemAlloc allocate again without FABRIC handles.
FABRIC_REFUSED = ("CUDA_ERROR_NOT_PERMITTED", "CUDA_ERROR_NOT_SUPPORTED")
NCCL_FALLBACK = "as NCCL does where VMM is unsupported (ncclIsCuMemSupported)"


def allocation_plan(gpu, requested: str) -> tuple[str, str]:
    """(allocation, why): VMM where asked and supported, else cuMemAlloc."""
    if requested != "vmm":
        return "malloc", "cuMemAlloc requested"
    version = driver_version(gpu.bindings)
    supported = device_attribute(gpu.bindings, gpu.device, VMM_SUPPORTED) if version >= VMM_MIN_DRIVER else None
    unsupported = vmm_unsupported(version, supported)
    if unsupported:
        return "malloc", f"cuMemAlloc: {unsupported}, {NCCL_FALLBACK}"
    return "vmm", ("VMM (cuMemCreate, cuMemMap), as NCCL allocates its buffers by default "
                   "(NCCL_CUMEM_ENABLE)")


class VmmAllocation:
    """One VMM allocation of ``allocated`` bytes mapped at ``ptr``, of which the run uses
    ``length``; the same interface as :class:`gdrprobe.memory.cuda.CudaAllocation`
    (:class:`gdrprobe.memory.runtime.GpuAllocation`)."""

    memory_type = "device"
    allocation = "vmm"

    def __init__(self, gpu, length: int):
        self.length = length
        self.ptr = 0
        self.allocated = 0
        self._gpu = gpu
        self._undo: list[tuple] = []      # (call, *args), undone newest first
        gdr = device_attribute(gpu.bindings, gpu.device, VMM_GDR_SUPPORTED)
        self.gpu_direct_rdma_capable = bool(gdr)
        self.handle_types = ""     # what cuMemCreate was given, for the allocation's reason
        try:
            self._create()
        except BaseException as error:
            close_after(error, self.close, "undoing the VMM allocation")
            raise

    def _location(self, target) -> None:
        d = self._gpu.bindings
        target.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        target.id = self._gpu.ordinal

    def _create_handle(self, prop, size: int):
        """cuMemCreate as ncclMemAlloc calls it: with FABRIC handles where the GPU has them,
        again without them where the platform refuses."""
        d, gpu = self._gpu.bindings, self._gpu
        posix = d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        fabric = getattr(d.CUmemAllocationHandleType, "CU_MEM_HANDLE_TYPE_FABRIC", None)
        if fabric is not None and device_attribute(d, gpu.device, FABRIC_SUPPORTED):
            try:
                prop.requestedHandleTypes = int(posix) | int(fabric)
            except AttributeError:      # cuda-python 12.6 takes one enum member, no mask
                self.handle_types = ("POSIX file descriptor handles (this cuda-python cannot "
                                     "ask for FABRIC beside them)")
                prop.requestedHandleTypes = posix
                return gpu.call("cuMemCreate", size, prop, 0, what=f"cuMemCreate({size})")
            try:
                handle = gpu.call("cuMemCreate", size, prop, 0, what=f"cuMemCreate({size}, FABRIC)")
                self.handle_types = "POSIX file descriptor and FABRIC handles"
                return handle
            except GdrprobeError as error:
                if getattr(error, "cuda_result", "") not in FABRIC_REFUSED:
                    raise
                refused = error.cuda_result
            self.handle_types = f"POSIX file descriptor handles, without FABRIC ({refused})"
        else:
            self.handle_types = "POSIX file descriptor handles"
        prop.requestedHandleTypes = posix
        return gpu.call("cuMemCreate", size, prop, 0, what=f"cuMemCreate({size})")

    def _create(self) -> None:
        d, gpu = self._gpu.bindings, self._gpu
        prop = d.CUmemAllocationProp()
        prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.requestedHandleTypes = \
            d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        self._location(prop.location)
        prop.allocFlags.gpuDirectRDMACapable = int(self.gpu_direct_rdma_capable)
        granularity = int(gpu.call(
            "cuMemGetAllocationGranularity", prop,
            d.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            what="cuMemGetAllocationGranularity(MINIMUM)"))
        size = -(-gpu_pages(self.length) // granularity) * granularity
        handle = self._create_handle(prop, size)
        self._undo.append(("cuMemRelease", handle))
        ptr = int(gpu.call("cuMemAddressReserve", size, granularity, 0, 0,
                           what=f"cuMemAddressReserve({size})"))
        self._undo.append(("cuMemAddressFree", ptr, size))
        gpu.call("cuMemMap", ptr, size, 0, handle, 0, what=f"cuMemMap({ptr:#x}, {size})")
        self._undo.append(("cuMemUnmap", ptr, size))
        access = d.CUmemAccessDesc()
        self._location(access.location)
        access.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        gpu.call("cuMemSetAccess", ptr, size, [access], 1,
                 what=f"cuMemSetAccess({ptr:#x}, {size}, READWRITE)")
        self.ptr, self.allocated = ptr, size

    def close(self) -> None:
        """Unmap, free the address range and release the memory; the first failure is
        raised once every step was tried."""
        failures = []
        while self._undo:
            name, *args = self._undo.pop()
            try:
                self._gpu.call(name, *args, what=f"{name}(VMM memory)")
            except Exception as error:   # undo the rest, then report the first failure
                failures.append(error)
        if failures:
            raise failures[0]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
