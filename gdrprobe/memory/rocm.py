"""ROCm behind the GPU-runtime seam (:mod:`gdrprobe.memory.runtime`): an AMD GPU, its memory
and DMA-BUF export, through hip-python (AMD's bindings, imported on first use as cuda-python
is; the optional extra ``gdrprobe[rocm]``).

The shape is perftest's ``src/rocm_memory.c``: ``hipMalloc`` device memory (registered by its
address for peer memory: amdkfd's PeerDirect resolves it for the NIC), ``hipHostMalloc``
staging, ``hipMemcpy`` both ways, and DMA-BUF export through HSA's
``hsa_amd_portable_export_dmabuf`` (RCCL exports with it too: ``src/transport/net.cc``), which
needs HSA's ``HSA_AMD_SYSTEM_INFO_DMABUF_SUPPORTED``. hip-python returns ``(hipError_t,
value...)`` tuples; a failed call becomes the error its result means (:data:`RESULT_ERRORS`).
HIP has no call that flushes the NIC's writes (RCCL orders them with an RDMA READ, as NCCL
does), so :meth:`RocmDevice.flush_rdma_writes` has nothing to do.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import importlib.metadata
import os
from typing import ClassVar

from gdrprobe.errors import (GdrprobeError, GpuOutOfMemory, HipError, MissingDependency,
                             NotTestable, UsageError, pip_install)
from gdrprobe.numbers import decimal, is_decimal
from gdrprobe.memory.causes import dmabuf_export_refused
from gdrprobe.memory.runtime import GpuRuntime, check_gpu_selector, dmabuf_range, is_bus_id
from gdrprobe.nccl.rccl import HSA_LIBRARY
from gdrprobe.sysroot import AMD_GPU_CLASSES, AMD_VENDOR_ID, pci_bus_id

HIP_LIBRARY = "libamdhip64.so"          # the name hip-python's chip module dlopens
HSA_DMABUF_SUPPORTED = 0x204            # HSA_AMD_SYSTEM_INFO_DMABUF_SUPPORTED
HIP_PYTHON_FIX = (f"{pip_install('gdrprobe[rocm]')} 'hip-python==X.Y.*' (X.Y: the node's ROCm "
                  "release, /opt/rocm/.info/version)")
NO_ROCM_FIX = ("install ROCm (libamdhip64.so) on a machine with an AMD GPU, and in a container "
               "pass /dev/kfd and /dev/dri; without a GPU only the host arm can run")
GENERIC_FIX = "check dmesg for amdgpu errors and 'rocm-smi' for the GPU's state"

# hipError_t name -> (error class, cause, fix); every other result is a HipError.
RESULT_ERRORS: dict[str, tuple[type[GdrprobeError], str, str]] = {
    "hipErrorNoDevice": (NotTestable, "not testable: no GPU: HIP sees none",
                         "check that rocm-smi lists the GPU and that HIP_VISIBLE_DEVICES and "
                         "ROCR_VISIBLE_DEVICES do not hide it"),
    "hipErrorOutOfMemory": (GpuOutOfMemory, "not testable: HIP is out of memory (GPU memory "
                            "other processes hold, or pinned host memory)",
                            "free GPU memory (other processes: rocm-smi --showpids) or use "
                            "smaller sizes, and run the check again"),
}


def result_error(err, what: str) -> GdrprobeError:
    name = getattr(err, "name", None) or f"hipError_t {int(err)}"
    error_class, cause, fix = RESULT_ERRORS.get(name, (HipError, "a HIP call failed", GENERIC_FIX))
    error = error_class(f"{cause} ({what} returned {name})", fix, evidence=f"{what}: {name}")
    error.hip_result = name
    return error


def check(result: tuple, what: str):
    """The value of a hip-python call's ``(hipError_t, value...)`` tuple, or its error."""
    err, *values = result
    if int(err) != 0:
        raise result_error(err, what)
    return values[0] if values else None


def library_error() -> str | None:
    """Why the dynamic loader cannot open libamdhip64.so, or None when it can."""
    try:
        ctypes.CDLL(HIP_LIBRARY)
    except OSError as error:
        return str(error)
    return None


def require_hip_library() -> None:
    missing = library_error()
    if missing:
        raise NotTestable(f"not testable: no ROCm runtime ({HIP_LIBRARY} could not be loaded)",
                          NO_ROCM_FIX, evidence=f"dlopen({HIP_LIBRARY}): {missing}")


@functools.cache
def hip():
    """hip-python's HIP module after hipInit(0), its line checked against the HIP runtime's
    (:func:`require_matching_line`); cached only on success."""
    require_hip_library()
    try:
        from hip import hip as module
    except ImportError as error:
        raise MissingDependency(f"hip-python is not installed ({error})", HIP_PYTHON_FIX) from error
    check(module.hipInit(0), "hipInit(0)")
    require_matching_line(module, hip_python_version())
    return module


def hip_python_version() -> str | None:
    try:
        return importlib.metadata.version("hip-python")
    except importlib.metadata.PackageNotFoundError:
        return None


def runtime_line(module) -> tuple[int, int] | None:
    """The HIP runtime's major.minor (hipRuntimeGetVersion: HIP_VERSION, major * 10000000 +
    minor * 100000 + patch), which is the ROCm release's; None where it cannot be asked."""
    try:
        err, version = module.hipRuntimeGetVersion()
    except Exception:      # a runtime or binding without the call: nothing to compare
        return None
    if int(err) != 0:
        return None
    return int(version) // 10000000, int(version) // 100000 % 100


def require_matching_line(module, installed: str | None) -> None:
    """hip-python's releases follow ROCm's (ROCM_MAJOR.MINOR.PATCH.<codegen>.<release>, the
    hip-python installation guide: one matching the ROCm release's numbers suits it); its
    Python functions load HIP's lazily, so a pair of another line may still work, but types
    and enums are generated from its own HIP's headers. A hip-python of another major.minor
    than the HIP runtime is refused with the line to install."""
    line = runtime_line(module)
    parts = (installed or "").split(".")
    if line is None or len(parts) < 2 or not all(is_decimal(part) for part in parts[:2]):
        return
    if (decimal(parts[0]), decimal(parts[1])) != line:
        wanted = f"{line[0]}.{line[1]}"
        raise MissingDependency(
            f"hip-python {installed} does not match the HIP runtime of ROCm {wanted}",
            f"{pip_install(f'hip-python=={wanted}.*')} (docs/install.md: the hip-python line "
            "is the node's ROCm release)",
            evidence=f"hip-python {installed}; hipRuntimeGetVersion: ROCm {wanted}")


@functools.cache
def hsa():
    """libhsa-runtime64 after hsa_init, for DMA-BUF; None where it cannot be loaded."""
    try:
        library = ctypes.CDLL(HSA_LIBRARY)
    except OSError:
        return None
    return library if library.hsa_init() == 0 else None


def hsa_dmabuf_supported() -> int | None:
    """HSA_AMD_SYSTEM_INFO_DMABUF_SUPPORTED as 0/1, None where HSA cannot be asked."""
    library = hsa()
    if library is None:
        return None
    flag = ctypes.c_bool(False)
    if library.hsa_system_get_info(HSA_DMABUF_SUPPORTED, ctypes.byref(flag)) != 0:
        return None
    return int(flag.value and hasattr(library, "hsa_amd_portable_export_dmabuf"))


@dataclasses.dataclass(frozen=True)
class RocmAttributes:
    dma_buf_supported: int | None
    dma_buf_attribute: ClassVar[str] = "HSA_AMD_SYSTEM_INFO_DMABUF_SUPPORTED"
    peer_memory: ClassVar[str] = "amdkfd"     # its PeerDirect client resolves HIP addresses

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class HipAllocation:
    """One HIP allocation; ``ptr`` works for copies and for verbs (amdkfd's PeerDirect)."""

    allocation = "malloc"
    allocation_reason = ""

    def __init__(self, gpu: RocmDevice, pointer, length: int, memory_type: str, free_call: str):
        self.ptr = int(pointer)
        self.length = length
        self.memory_type = memory_type
        self._pointer = pointer
        self._gpu = gpu
        self._free_call = free_call

    def close(self) -> None:
        if self._free_call is not None:
            name, self._free_call = self._free_call, None
            self._gpu.call(name, self._pointer, what=f"{name}({self.memory_type} memory)")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def find_ordinal(module, selector: str) -> int:
    check_gpu_selector(selector)
    count = check(module.hipGetDeviceCount(), "hipGetDeviceCount()")
    if is_bus_id(selector):
        err, ordinal = module.hipDeviceGetByPCIBusId(selector.encode())
        found = int(err) == 0
    else:
        ordinal = int(selector)
        found = ordinal < count
    if not found:
        raise UsageError(f"no GPU {selector!r} (HIP lists {count})",
                         f"this machine has {count} GPU(s): use an ordinal below {count} or a "
                         "bus id from 'rocm-smi --showbus'")
    return ordinal


class RocmDevice:
    """An AMD GPU, made current on the calling thread before every call (hipSetDevice)."""

    def __init__(self, module, ordinal: int, selector: str):
        self._hip = module
        self.ordinal = ordinal
        self.selector = selector
        self.name = self.call("hipDeviceGetName", 256, ordinal).decode().strip("\0 ")
        self.bus_id = pci_bus_id(self.call("hipDeviceGetPCIBusId", 64, ordinal).decode().strip("\0 "))
        self.attributes = RocmAttributes(hsa_dmabuf_supported())

    def call(self, name: str, *args, what: str = ""):
        check(self._hip.hipSetDevice(self.ordinal), f"hipSetDevice({self.ordinal})")
        return check(getattr(self._hip, name)(*args), what or name)

    def describe(self) -> dict:
        return {"ordinal": self.ordinal, "name": self.name, "pci_bus_id": self.bus_id,
                **self.attributes.as_dict()}

    def close(self) -> None:
        """Nothing is retained per device (HIP's primary context lives with the process)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def allocate(self, memory_type: str, length: int, allocation: str = "malloc") -> HipAllocation:
        """Device memory from hipMalloc (HIP has no VMM path RCCL registers), or pinned host
        memory from hipHostMalloc."""
        if memory_type == "device":
            pointer = self.call("hipMalloc", length, what=f"hipMalloc({length})")
            return HipAllocation(self, pointer, length, "device", "hipFree")
        if memory_type == "pinned-host":
            return self.alloc_pinned_host(length)
        raise UsageError(f"{memory_type} memory is not supported on ROCm GPUs",
                         "use device memory (the memory that proves GPUDirect)")

    def alloc_pinned_host(self, length: int) -> HipAllocation:
        pointer = self.call("hipHostMalloc", length, 0, what=f"hipHostMalloc({length})")
        return HipAllocation(self, pointer, length, "pinned-host", "hipHostFree")

    def _copy(self, dst: int, src: int, length: int, kind: str) -> None:
        self.call("hipMemcpy", dst, src, length, getattr(self._hip.hipMemcpyKind, kind),
                  what=f"hipMemcpy({length} bytes, {kind})")

    def copy_to_device(self, device_ptr: int, host_address: int, length: int) -> None:
        self._copy(device_ptr, host_address, length, "hipMemcpyHostToDevice")

    def copy_to_host(self, host_address: int, device_ptr: int, length: int) -> None:
        self._copy(host_address, device_ptr, length, "hipMemcpyDeviceToHost")

    def export_dmabuf(self, ptr: int, length: int, pcie_mapping: bool = False) -> tuple[int, int]:
        """(fd, offset of ptr in the DMA-BUF) from hsa_amd_portable_export_dmabuf, as RCCL
        exports; a GPU whose HSA cannot is "not testable" (RCCL does not use DMA-BUF there)."""
        if pcie_mapping:
            raise NotTestable("not testable: the PCIe mapping of DMA-BUF is a CUDA option",
                              "drop the PCIe mapping option on ROCm")
        if not self.attributes.dma_buf_supported:
            raise NotTestable(f"not testable: GPU {self.bus_id} cannot export DMA-BUF "
                              f"(HSA_AMD_SYSTEM_INFO_DMABUF_SUPPORTED="
                              f"{self.attributes.dma_buf_supported})",
                              "DMA-BUF export needs ROCm 5.6+ and a kernel with "
                              "CONFIG_DMABUF_MOVE_NOTIFY and CONFIG_PCI_P2PDMA; otherwise use "
                              "the peermem mechanism")
        span = dmabuf_range(ptr, length)
        fd, offset = ctypes.c_int(-1), ctypes.c_uint64(0)
        status = hsa().hsa_amd_portable_export_dmabuf(
            ctypes.c_void_p(span.aligned_address), ctypes.c_size_t(span.aligned_length),
            ctypes.byref(fd), ctypes.byref(offset))
        what = f"hsa_amd_portable_export_dmabuf({span.aligned_address:#x}, {span.aligned_length})"
        if status != 0:
            raise dmabuf_export_refused(what, f"hsa_status_t {status:#x}", False)
        start = span.offset + offset.value
        exported = os.lseek(fd.value, 0, os.SEEK_END)   # a dma-buf's size (dma_buf_llseek)
        if start + length > exported:
            os.close(fd.value)
            raise dmabuf_export_refused(what, f"a DMA-BUF of {exported} bytes, short of the "
                                              f"{start + length} the buffer needs", False)
        return fd.value, start

    def flush_rdma_writes(self) -> bool:
        return False


def open_gpu(selector: str) -> RocmDevice:
    module = hip()
    return RocmDevice(module, find_ordinal(module, str(selector)), str(selector))


# ROCm behind the seam: AMD's GPU functions, libamdhip64.so, hip-python. The GPUs a process
# sees: ROCr keeps ROCR_VISIBLE_DEVICES', then HIP keeps HIP_VISIBLE_DEVICES' (or, where
# that is unset, CUDA_VISIBLE_DEVICES', which HIP reads the same way) among them (HIP
# documentation, "HIP environment variables"; ROCm's "GPU isolation techniques"). The
# doctor's side: doctor/facts/rocm.py.
RUNTIME = GpuRuntime("ROCm", "rocm", AMD_VENDOR_ID, require_hip_library, open_gpu,
                     AMD_GPU_CLASSES,
                     visible_devices=("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                                      "CUDA_VISIBLE_DEVICES"),
                     facts="rocm")
