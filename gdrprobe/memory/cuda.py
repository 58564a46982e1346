"""CUDA behind the GPU-runtime seam (:mod:`gdrprobe.memory.runtime`): the GPU, its memory,
DMA-BUF export and flushes, and the doctor's inventory of the GPUs.

Every driver call goes through :mod:`gdrprobe.memory.cuda_driver` (loading the driver, one
call and its result). Whatever is allocated is freed on every path: allocations and the
device are context managers, and their ``close`` is idempotent.

The doctor's inventory of the GPUs (:mod:`gdrprobe.doctor.facts.cuda`, the CUDA runtime's
collector) goes through the same door.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from gdrprobe.errors import GdrprobeError, NotTestable, UsageError
from gdrprobe.memory.causes import dmabuf_export_refused
from gdrprobe.memory import cuda_driver
from gdrprobe.memory.cuda_driver import (attempt, c_string, call, check, close_after, device_attribute,
                                         driver, driver_version, gpu_pages, version_text)
from gdrprobe.memory.cuda_results import RESULT_ERRORS, result_name
from gdrprobe.memory.cuda_vmm import VmmAllocation, allocation_plan
from gdrprobe.memory.runtime import GpuRuntime, check_gpu_selector, dmabuf_range, is_bus_id
from gdrprobe.sysroot import NVIDIA_VENDOR_ID, pci_bus_id

# CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST: cuFlushGPUDirectRDMAWrites is available.
FLUSH_OPTION_HOST = 1
# CUGPUDirectRDMAWritesOrdering: NONE=0, OWNER=100, ALL_DEVICES=200.
WRITES_ORDERING_OWNER = 100
PCIE_MAPPING_MIN_DRIVER = 12080
# cuda.h 12.8's CUmemRangeFlags: the value NCCL passes, compiled in (net.cc).
CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE = 0x1


# ---- device attributes --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GpuAttributes:
    """The four attributes that decide GPUDirect RDMA; None where the driver is too old."""

    gpu_direct_rdma_supported: int | None              # 116: the nvidia_p2p (peermem) path
    dma_buf_supported: int | None                      # 124: DMA-BUF export
    gpu_direct_rdma_flush_writes_options: int | None   # 117: bitmask, HOST=1, MEMOPS=2
    gpu_direct_rdma_writes_ordering: int | None        # 118: NONE=0, OWNER=100, ALL_DEVICES=200

    # What a reason quotes for dma_buf_supported (gdrprobe.memory.runtime.DmaBufAttribute).
    dma_buf_attribute: ClassVar[str] = "CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED"
    # Who resolves a GPU address for the NIC on the peermem path.
    peer_memory: ClassVar[str] = "nvidia-peermem"

    @property
    def flush_available(self) -> bool:
        return bool((self.gpu_direct_rdma_flush_writes_options or 0) & FLUSH_OPTION_HOST)

    @property
    def flush_needed(self) -> bool:
        # A flush scoped to the owner is a no-op when the GPU already orders RDMA writes
        # before the owner's later work.
        return (self.gpu_direct_rdma_writes_ordering or 0) < WRITES_ORDERING_OWNER

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


# CU_DEVICE_ATTRIBUTE_<name> behind each GpuAttributes field.
ATTRIBUTE_NAMES = {
    "gpu_direct_rdma_supported": "GPU_DIRECT_RDMA_SUPPORTED",
    "dma_buf_supported": "DMA_BUF_SUPPORTED",
    "gpu_direct_rdma_flush_writes_options": "GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS",
    "gpu_direct_rdma_writes_ordering": "GPU_DIRECT_RDMA_WRITES_ORDERING",
}


def read_attributes(module, device) -> GpuAttributes:
    return GpuAttributes(**{field: device_attribute(module, device, name)
                            for field, name in ATTRIBUTE_NAMES.items()})


def device_name(module, device) -> str:
    return c_string(call(module, "cuDeviceGetName", 256, device))


def device_bus_id(module, device) -> str:
    """The PCI bus id as sysfs spells it."""
    return pci_bus_id(c_string(call(module, "cuDeviceGetPCIBusId", 64, device)))


# ---- allocations ----------------------------------------------------------------------


class CudaAllocation:
    """One driver allocation of ``allocated`` bytes, of which the run uses ``length``;
    ``ptr`` works for copies and, under UVA, for verbs too."""

    def __init__(self, gpu: GpuDevice, ptr: int, length: int, allocated: int,
                 memory_type: str, free_call: str):
        self.ptr = ptr
        self.length = length
        self.allocated = allocated
        self.memory_type = memory_type
        self.allocation = "malloc"     # the driver's allocator (cuMemAlloc and kin), not VMM
        self.allocation_reason = ""
        self._gpu = gpu
        self._free_call = free_call

    def close(self) -> None:
        if self._free_call is not None:
            free_call, self._free_call = self._free_call, None
            self._gpu.call(free_call, self.ptr,
                           what=f"{free_call}({self.memory_type} memory at {self.ptr:#x})")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---- the device -----------------------------------------------------------------------



# What cuDeviceGet / cuDeviceGetByPCIBusId return for a GPU that is not there.
NO_SUCH_GPU = ("CUDA_ERROR_INVALID_DEVICE", "CUDA_ERROR_INVALID_VALUE")


def find_device(module, selector: str):
    """The CUdevice for a CUDA ordinal ("0") or a full PCI bus id ("0000:3b:00.0")."""
    check_gpu_selector(selector)
    if is_bus_id(selector):
        what = f"cuDeviceGetByPCIBusId({selector!r})"
        result = attempt(module, "cuDeviceGetByPCIBusId", selector.encode())
    else:
        what = f"cuDeviceGet({selector})"
        result = attempt(module, "cuDeviceGet", int(selector))
    if result_name(result[0]) in NO_SUCH_GPU:
        count = call(module, "cuDeviceGetCount", what="cuDeviceGetCount()")
        raise UsageError(f"no GPU {selector!r} ({what} returned {result_name(result[0])})",
                         f"this machine has {count} GPU(s): use an ordinal below {count} or a "
                         "bus id from 'nvidia-smi --query-gpu=pci.bus_id --format=csv'")
    return check(result, what)


class GpuDevice:
    """A GPU with its primary context retained. Contexts are current per thread, so every
    call that needs one makes it current on the calling thread first (:meth:`call`)."""

    def __init__(self, module, device, selector: str):
        self._driver = module
        self._device = device
        self.selector = selector
        self.ordinal = int(device)
        self.name = device_name(module, device)
        self.bus_id = device_bus_id(module, device)
        self.attributes = read_attributes(module, device)
        self._context = call(module, "cuDevicePrimaryCtxRetain", device,
                             what=f"cuDevicePrimaryCtxRetain({self.bus_id})")
        try:
            self.activate()
        except GdrprobeError as error:
            close_after(error, self.close, f"releasing {self.bus_id}'s context")
            raise

    @property
    def bindings(self):
        """cuda-python's driver module this GPU is driven through (its types and enums)."""
        return self._driver

    @property
    def device(self):
        """The CUdevice."""
        return self._device

    def activate(self) -> None:
        """Make this GPU's context current on the calling thread."""
        call(self._driver, "cuCtxSetCurrent", self._context)

    def call(self, name: str, *args, what: str = ""):
        """A driver call with this GPU's context current (see :func:`call`)."""
        self.activate()
        return call(self._driver, name, *args, what=what)

    def describe(self) -> dict:
        return {"ordinal": self.ordinal, "name": self.name, "pci_bus_id": self.bus_id,
                **self.attributes.as_dict()}

    def close(self) -> None:
        if self._context is not None:
            self._context = None
            call(self._driver, "cuDevicePrimaryCtxRelease", self._device,
                 what=f"cuDevicePrimaryCtxRelease({self.bus_id})")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- memory --

    def alloc_device(self, length: int) -> CudaAllocation:
        d = self._driver
        size = gpu_pages(length)
        ptr = int(self.call("cuMemAlloc", size, what=f"cuMemAlloc({size})"))
        allocation = CudaAllocation(self, ptr, length, size, "device", "cuMemFree")
        try:
            # Synchronous memory operations on this buffer: a copy issued after the NIC
            # wrote it sees the data, which the integrity check relies on.
            self.call("cuPointerSetAttribute", 1,
                      d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, ptr,
                      what="cuPointerSetAttribute(SYNC_MEMOPS)")
        except GdrprobeError as error:
            close_after(error, allocation.close, "freeing the allocation")
            raise
        return allocation

    def alloc_managed(self, length: int) -> CudaAllocation:
        size = gpu_pages(length)
        ptr = int(self.call("cuMemAllocManaged", size,
                            self._driver.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL,
                            what=f"cuMemAllocManaged({size})"))
        return CudaAllocation(self, ptr, length, size, "managed", "cuMemFree")

    def alloc_pinned_host(self, length: int) -> CudaAllocation:
        d = self._driver
        flags = d.CU_MEMHOSTALLOC_PORTABLE | d.CU_MEMHOSTALLOC_DEVICEMAP
        ptr = int(self.call("cuMemHostAlloc", length, flags, what=f"cuMemHostAlloc({length})"))
        return CudaAllocation(self, ptr, length, length, "pinned-host", "cuMemFreeHost")

    def allocate(self, memory_type: str, length: int, allocation: str = "malloc"):
        """length bytes of memory_type; device memory through VMM where allocation is "vmm"
        and the GPU supports it, as NCCL allocates (:mod:`gdrprobe.memory.cuda_vmm`), else
        cuMemAlloc. The result says which (``allocation``) and why (``allocation_reason``)."""
        allocators = {"device": self.alloc_device, "managed": self.alloc_managed,
                      "pinned-host": self.alloc_pinned_host}
        if memory_type not in allocators:
            raise UsageError(f"unknown GPU memory type {memory_type!r}",
                             f"use one of: {', '.join(allocators)}")
        if memory_type != "device":
            return allocators[memory_type](length)
        chosen, reason = allocation_plan(self, allocation)
        if chosen != "vmm":
            buffer = self.alloc_device(length)
            buffer.allocation_reason = reason
            return buffer
        buffer = VmmAllocation(self, length)
        buffer.allocation_reason = f"{reason}; {buffer.handle_types}"
        return buffer

    def copy_to_device(self, device_ptr: int, host_address: int, length: int) -> None:
        self.call("cuMemcpyHtoD", device_ptr, host_address, length,
                  what=f"cuMemcpyHtoD({length} bytes)")

    def copy_to_host(self, host_address: int, device_ptr: int, length: int) -> None:
        self.call("cuMemcpyDtoH", host_address, device_ptr, length,
                  what=f"cuMemcpyDtoH({length} bytes)")

    # -- DMA-BUF and flushes --

    def _dmabuf_flags(self, pcie_mapping: bool) -> int:
        """cuMemGetHandleForAddressRange's flags: the PCIe mapping where asked, as NCCL asks
        it (src/transport/net.cc getHandleForAddressRangeFlags): the flag's value from
        cuda.h 12.8, and the driver the judge of it, whatever the bindings' enum holds."""
        if not pcie_mapping:
            return 0
        version = driver_version(self._driver)
        if version < PCIE_MAPPING_MIN_DRIVER:
            raise NotTestable(f"not testable: the PCIe mapping of DMA-BUF needs CUDA 12.8+ "
                              f"(the driver is CUDA {version_text(version)})",
                              "upgrade the NVIDIA driver (R570 or newer), or drop the PCIe "
                              "mapping option")
        return CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE

    def export_dmabuf(self, ptr: int, length: int, pcie_mapping: bool = False) -> tuple[int, int]:
        """(fd, offset of ptr in the DMA-BUF) for [ptr, ptr+length); the caller closes fd.

        A GPU that cannot export (its DMA_BUF_SUPPORTED attribute) is "not testable": NCCL
        does not use DMA-BUF there (NCCL 2.30.7 src/init.cc dmaBufSupported). A GPU that
        can but whose driver refuses the export is a refused DMA-BUF registration
        (:func:`gdrprobe.memory.causes.dmabuf_export_refused`): NCCL makes the same call and
        gives up. A result with a meaning of its own (out of memory, a GPU no process can
        use: :data:`gdrprobe.memory.cuda_results.RESULT_ERRORS`) keeps it."""
        if not self.attributes.dma_buf_supported:
            raise NotTestable(f"not testable: GPU {self.bus_id} cannot export DMA-BUF "
                              f"(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED="
                              f"{self.attributes.dma_buf_supported})",
                              "DMA-BUF export needs the open GPU kernel modules, CUDA 11.7+ "
                              "and Linux 5.12+; otherwise use the peermem mechanism")
        span = dmabuf_range(ptr, length)
        flags = self._dmabuf_flags(pcie_mapping)
        what = (f"cuMemGetHandleForAddressRange({span.aligned_address:#x}, "
                f"{span.aligned_length}, DMA_BUF_FD, flags={int(flags)})")
        self.activate()
        result = attempt(self._driver, "cuMemGetHandleForAddressRange", span.aligned_address,
                         span.aligned_length,
                         self._driver.CUmemRangeHandleType.CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                         flags)
        name = result_name(result[0])
        policy = getattr(result[0], "policy_name", name)
        if int(result[0]) != 0 and policy not in RESULT_ERRORS:
            raise dmabuf_export_refused(what, name, pcie_mapping)
        return int(check(result, what)), span.offset

    def flush_rdma_writes(self) -> bool:
        """Make RDMA writes into this GPU visible to later CUDA work; True if it flushed."""
        if not (self.attributes.flush_available and self.attributes.flush_needed):
            return False
        d = self._driver
        self.call(
            "cuFlushGPUDirectRDMAWrites",
            d.CUflushGPUDirectRDMAWritesTarget.CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
            d.CUflushGPUDirectRDMAWritesScope.CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER,
            what="cuFlushGPUDirectRDMAWrites(CURRENT_CTX, TO_OWNER)")
        return True


def open_gpu(selector: str) -> GpuDevice:
    """Open a GPU by CUDA ordinal or full PCI bus id; use it as a context manager."""
    module = driver()
    return GpuDevice(module, find_device(module, str(selector)), str(selector))


# CUDA behind the seam: NVIDIA's GPU functions, libcuda.so.1, cuda-python. The library check
# is looked up when called, so that a test can stand in for the loader. The GPUs a process
# sees: the NVIDIA container runtime exposes NVIDIA_VISIBLE_DEVICES' (NVIDIA Container
# Toolkit, "GPU Enumeration"), then CUDA keeps CUDA_VISIBLE_DEVICES' (CUDA C++ Programming
# Guide, "CUDA Environment Variables"). The doctor's side: doctor/facts/cuda.py.
RUNTIME = GpuRuntime("CUDA", "cuda", NVIDIA_VENDOR_ID,
                     lambda: cuda_driver.require_driver_library(), open_gpu,
                     visible_devices=("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"),
                     facts="cuda")
