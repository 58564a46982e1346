"""A stand-in for cuda.bindings.driver in the unit tests: its call shapes (result tuples,
enumerations with the real values), "device" memory backed by host memory, and every call
recorded, so ownership and staging logic run for real on the CPU. What only a GPU can show
is in tests/gpu."""

import ctypes
import enum
import os

from gdrprobe import _native
from gdrprobe.memory import cuda


class FakeResult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_NO_DEVICE = 100
    CUDA_ERROR_OPERATING_SYSTEM = 304
    CUDA_ERROR_NOT_SUPPORTED = 801
    CUDA_ERROR_UNKNOWN = 999


class CUdevice_attribute(enum.IntEnum):
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
    CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED = 116
    CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS = 117
    CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING = 118
    CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124
    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102
    CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED = 110


class Struct:
    """A cuda.bindings structure: attributes set by the caller, nested ones made on use."""

    def __init__(self, **nested):
        self.__dict__.update(nested)


class FakeDriver:
    """cuda.bindings.driver's call shapes; "device" memory is host memory."""

    CUdevice_attribute = CUdevice_attribute

    class CUpointer_attribute(enum.IntEnum):
        CU_POINTER_ATTRIBUTE_SYNC_MEMOPS = 6

    class CUmemRangeHandleType(enum.IntEnum):
        CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 1

    class CUflushGPUDirectRDMAWritesTarget(enum.IntEnum):
        CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX = 0

    class CUflushGPUDirectRDMAWritesScope(enum.IntEnum):
        CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER = 100

    CU_MEMHOSTALLOC_PORTABLE = 1
    CU_MEMHOSTALLOC_DEVICEMAP = 2
    OK = (FakeResult.CUDA_SUCCESS,)

    # ---- VMM: the enums and structures cuda_vmm uses, with cuda.h's values ----

    class CUmemAllocationType(enum.IntEnum):
        CU_MEM_ALLOCATION_TYPE_PINNED = 1

    class CUmemAllocationHandleType(enum.IntEnum):
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1

    class CUmemLocationType(enum.IntEnum):
        CU_MEM_LOCATION_TYPE_DEVICE = 1

    class CUmemAccess_flags(enum.IntEnum):
        CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3

    class CUmemAllocationGranularity_flags(enum.IntEnum):
        CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0

    @staticmethod
    def CUmemAllocationProp():
        return Struct(location=Struct(), allocFlags=Struct())

    @staticmethod
    def CUmemAccessDesc():
        return Struct(location=Struct())

    GRANULARITY = 2 << 20

    def __init__(self, attributes=None, fail=(), unknown=(), name=b"Fake H100",
                 bus_id=b"00000000:3B:00.0", driver_version=12080):
        # Attribute values by number; those in `unknown` are absent from an older driver.
        self.attributes = {75: 9, 76: 0, 116: 1, 117: 1, 118: 0, 124: 1, **(attributes or {})}
        for number in unknown:
            del self.attributes[number]
        self.name, self.bus_id, self.version = name, bus_id, driver_version
        # The calls that fail: a set of names (CUDA_ERROR_INVALID_VALUE), or name -> result.
        self.fail = (dict(fail) if isinstance(fail, dict)
                     else dict.fromkeys(fail, FakeResult.CUDA_ERROR_INVALID_VALUE))
        self.live = {}              # address -> (mapped length, kind)
        self.calls = []
        self.retained = 0

    def _result(self, name, value=None):
        self.calls.append(name)
        if name in self.fail:
            return (self.fail[name], None)
        return self.OK if value is None else (FakeResult.CUDA_SUCCESS, value)

    def cuInit(self, flags):
        return self._result("cuInit")

    def cuDriverGetVersion(self):
        return self._result("cuDriverGetVersion", self.version)

    def cuDeviceGetCount(self):
        return self._result("cuDeviceGetCount", 1)

    def cuDeviceGet(self, ordinal):
        return self._result("cuDeviceGet", ordinal)

    def cuDeviceTotalMem(self, device):
        return self._result("cuDeviceTotalMem", 85 << 30)

    def cuDeviceGetName(self, size, device):
        # The driver fills a space-padded buffer and terminates the string with NUL.
        return self._result("cuDeviceGetName", self.name + b"\0   ")

    def cuDeviceGetPCIBusId(self, size, device):
        return self._result("cuDeviceGetPCIBusId", self.bus_id + b"\0")

    def cuDeviceGetAttribute(self, attribute, device):
        if int(attribute) not in self.attributes:
            self.calls.append("cuDeviceGetAttribute")
            return (FakeResult.CUDA_ERROR_INVALID_VALUE, None)
        return self._result("cuDeviceGetAttribute", self.attributes[int(attribute)])

    def cuDevicePrimaryCtxRetain(self, device):
        self.retained += 1
        return self._result("cuDevicePrimaryCtxRetain", "ctx")

    def cuDevicePrimaryCtxRelease(self, device):
        self.retained -= 1
        return self._result("cuDevicePrimaryCtxRelease")

    def cuCtxSetCurrent(self, context):
        return self._result("cuCtxSetCurrent")

    def _alloc(self, name, length, kind):
        result = self._result(name, 1)
        if result[0] != 0:
            return result
        buffer = _native.HostBuffer(length)
        self.live[buffer.address] = (buffer, kind)
        return FakeResult.CUDA_SUCCESS, buffer.address

    def _free(self, name, address, kind):
        assert self.live[address][1] == kind
        self.live.pop(address)[0].close()
        return self._result(name)

    def cuMemAlloc(self, length):
        return self._alloc("cuMemAlloc", length, "device")

    def cuMemFree(self, address):
        return self._free("cuMemFree", address, "device")

    def cuMemHostAlloc(self, length, flags):
        return self._alloc("cuMemHostAlloc", length, "host")

    def cuMemFreeHost(self, address):
        return self._free("cuMemFreeHost", address, "host")

    def cuPointerSetAttribute(self, value, attribute, address):
        return self._result("cuPointerSetAttribute")

    def cuMemcpyHtoD(self, dst, src, length):
        ctypes.memmove(dst, src, length)
        return self._result("cuMemcpyHtoD")

    def cuMemcpyDtoH(self, dst, src, length):
        ctypes.memmove(dst, src, length)
        return self._result("cuMemcpyDtoH")

    def cuMemGetHandleForAddressRange(self, address, length, handle_type, flags):
        self.exported = (address, length, flags)
        return self._result("cuMemGetHandleForAddressRange", os.open(os.devnull, os.O_RDONLY))

    def cuFlushGPUDirectRDMAWrites(self, target, scope):
        return self._result("cuFlushGPUDirectRDMAWrites")

    def cuMemGetAllocationGranularity(self, prop, option):
        return self._result("cuMemGetAllocationGranularity", self.GRANULARITY)

    def cuMemCreate(self, size, prop, flags):
        self.created = (size, prop)
        return self._result("cuMemCreate", 0x5000 + size)

    def cuMemAddressReserve(self, size, alignment, address, flags):
        result = self._alloc("cuMemAddressReserve", size, "vmm")
        self.reserved = (size, alignment)
        return result

    def cuMemMap(self, ptr, size, offset, handle, flags):
        self.mapped = (ptr, size, handle)
        return self._result("cuMemMap")

    def cuMemSetAccess(self, ptr, size, descriptors, count):
        self.access = (ptr, size, descriptors, count)
        return self._result("cuMemSetAccess")

    def cuMemUnmap(self, ptr, size):
        return self._result("cuMemUnmap")

    def cuMemAddressFree(self, ptr, size):
        return self._free("cuMemAddressFree", ptr, "vmm")

    def cuMemRelease(self, handle):
        return self._result("cuMemRelease")


def fake_gpu(**kwargs) -> tuple[FakeDriver, cuda.GpuDevice]:
    """GPU 0 of a FakeDriver(**kwargs), and the driver, to read what it was asked."""
    driver = FakeDriver(**kwargs)
    return driver, cuda.GpuDevice(driver, 0, "0")
