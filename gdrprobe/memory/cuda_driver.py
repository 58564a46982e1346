"""The CUDA driver itself, through cuda-python: loading and starting it, one call and its
result, device attributes, the driver's version and the size of its allocations.

cuda-python is imported on first use (only a GPU arm needs it). Every driver call goes
through :func:`call`, which turns an error CUresult into a :class:`GdrprobeError` naming
the call and the error (:func:`check`), and an entry point the driver lacks into "the
driver is too old" rather than a traceback.

Supported bindings: cuda-python 12.6.2.post1 (the first on PyPI with ``cuda.bindings``)
up to 13.x. The 12.x line needs driver 525.60.13+, the 13.x line 580.65.06+ (cuda-bindings
install notes), so the package depends on ``cuda-python>=12.6.2.post1,<13``: the line that
runs on the R535-R570 drivers still in service and on newer ones. tests/cuda_standin runs
every call here through the real bindings of each line (binding call shapes, not a GPU).

The device, its memory and the runtime seam's CUDA side are :mod:`gdrprobe.memory.cuda`;
:mod:`gdrprobe.memory.cuda_vmm` builds on this module too, so neither imports the other.
"""

from __future__ import annotations

import ctypes
import functools

from gdrprobe.errors import MissingDependency, NotTestable, pip_install
from gdrprobe.memory.cuda_results import UPGRADE_DRIVER_FIX, result_error, result_name, unknown_result

# The GPU's page: nvidia-peermem pins whole 64 KiB pages (GPU_PAGE_SIZE in the driver's
# nv-p2p.h), and perftest rounds cuMemAlloc to it for that reason (ACCEL_PAGE_SIZE in
# src/cuda_memory.c). Allocations are whole GPU pages; what is registered is what the run
# needs, so a registration never reaches past the allocation.
GPU_PAGE_BYTES = 64 << 10

CUDA_PYTHON_FIX = (f"{pip_install('cuda-python>=12.6.2.post1,<13')} (the 13.x line needs "
                   "driver 580.65.06 or newer)")
NO_DRIVER_FIX = ("install the NVIDIA driver (libcuda.so.1) on a machine with a GPU, and in a "
                 "container run with the NVIDIA container runtime (--gpus all); without a GPU "
                 "only the host arm can run")
DRIVER_MISMATCH_FIX = ("use a cuda-python whose major version the installed driver supports "
                       "(cuda-bindings 12.x needs driver 525.60.13+, 13.x needs 580.65.06+), "
                       "or upgrade the NVIDIA driver")


# cuda.h's CUmemhostregister flags: what NCCL's GIN (DOCA GPUNetIO's cudaHostRegister with
# Portable | Mapped | IoMemory: doca_gpu_verbs_can_gpu_register_uar, doca_gpu_verbs_export_uar)
# and aws-ofi-nccl (IOMEMORY | DEVICEMAP: nccl_net_ofi_gpu_host_register_iomem) register a
# NIC's doorbell page with.
CU_MEMHOSTREGISTER_PORTABLE, CU_MEMHOSTREGISTER_DEVICEMAP, CU_MEMHOSTREGISTER_IOMEMORY = 0x01, 0x02, 0x04
IO_MEMORY_FLAGS = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_IOMEMORY


def check(result: tuple, what: str):
    """The value of a driver call's ``(CUresult, value)`` tuple, or the error it means
    (:func:`gdrprobe.memory.cuda_results.result_error`)."""
    err, *values = result
    if int(err) == 0:
        return values[0] if values else None
    raise result_error(err, what)


def attempt(module, name: str, *args) -> tuple:
    """module.<name>(*args)'s raw result tuple. The bindings resolve every entry point when
    they load the driver and raise RuntimeError when called for one it lacks (an old driver):
    that is said as such. A result they do not know (a newer driver) comes back as a result
    with its number (:func:`gdrprobe.memory.cuda_results.unknown_result`)."""
    try:
        return getattr(module, name)(*args)
    except RuntimeError as error:
        raise NotTestable(f"not testable: the CUDA driver has no {name} (it is older than "
                          "this call needs)", UPGRADE_DRIVER_FIX,
                          evidence=f"{name}: {error}") from error
    except ValueError as error:
        return unknown_or_raise(error)


def unknown_or_raise(error: ValueError) -> tuple:
    """The result tuple of a result the bindings do not know; any other ValueError is
    raised again (a bug, not a driver's answer)."""
    unknown = unknown_result(error)
    if unknown is None:
        raise error
    return (unknown,)


def call(module, name: str, *args, what: str = ""):
    """The value of module.<name>(*args), or the error its result means (:func:`check`)."""
    return check(attempt(module, name, *args), what or name)


def import_driver():
    """cuda-python's driver module under its 12.6.1+ name or its older one."""
    try:
        from cuda.bindings import driver as module
    except ImportError:
        from cuda import cuda as module
    return module


def c_string(raw: bytes) -> str:
    # The driver fills a space-padded buffer and terminates the string with NUL.
    return raw.split(b"\0")[0].decode("ascii", "replace").strip()


# What cuDeviceGetAttribute returns for an attribute the driver does not know (cuda.h:
# "CUDA_ERROR_INVALID_VALUE ... one or more of the parameters passed to the API call is not
# within an acceptable range"): the attribute is unknown, None.
UNKNOWN_ATTRIBUTE = "CUDA_ERROR_INVALID_VALUE"


def device_attribute(module, device, name: str) -> int | None:
    """One CU_DEVICE_ATTRIBUTE_<name>, or None when the bindings or the driver do not know
    it; any other failure is the driver's answer about the GPU and raised as such (a GPU
    the driver lost is not a GPU without the attribute)."""
    attribute = getattr(module.CUdevice_attribute, "CU_DEVICE_ATTRIBUTE_" + name, None)
    if attribute is None:
        return None
    what = f"cuDeviceGetAttribute({name})"
    result = attempt(module, "cuDeviceGetAttribute", attribute, device)
    if int(result[0]) != 0 and getattr(result[0], "name", "") == UNKNOWN_ATTRIBUTE:
        return None
    return int(check(result, what))


def close_after(error: BaseException, close, what: str) -> None:
    """Clean up after ``error`` without hiding it: ``close`` runs, and a failure there is
    added to ``error`` as a note (PEP 678) instead of replacing it. The caller re-raises
    ``error``."""
    try:
        close()
    except Exception as failure:     # the first error is the one to report
        error.add_note(f"and then, cleaning up after it ({what}): {failure}")


@functools.cache
def driver():
    """cuda-python's driver module, initialised; raises when there is nothing to talk to.

    Cached only on success (lru_cache does not keep exceptions), so a later call retries.
    """
    require_driver_library()
    try:
        module = import_driver()
    except ImportError as error:
        raise MissingDependency(f"cuda-python is not installed ({error})",
                                CUDA_PYTHON_FIX) from error
    return initialised(module)


def require_driver_library() -> None:
    """Raises NotTestable when the dynamic loader cannot open libcuda.so.1: the first thing
    any GPU buffer needs, cheap enough to ask before anything is measured."""
    missing = driver_library_error()
    if missing:
        raise NotTestable("not testable: no CUDA driver (libcuda.so.1 could not be loaded)",
                          NO_DRIVER_FIX, evidence=f"dlopen(libcuda.so.1): {missing}")


def driver_library_error() -> str | None:
    """Why the dynamic loader cannot open libcuda.so.1, or None when it can: asked before
    importing cuda-python, whose import alone took 3.6 s in the emulated lab guest, and
    which loads the library by the same system search."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        return str(error)
    return None


def initialised(module):
    """module after a successful cuInit(0), or the error that says why there is no driver."""
    try:
        init_result = module.cuInit(0)
    except RuntimeError as error:
        raise unloadable_driver(error) from error
    except ValueError as error:
        init_result = unknown_or_raise(error)
    check(init_result, "cuInit(0)")
    return module


def unloadable_driver(error: RuntimeError) -> NotTestable:
    """Why the bindings could not start the driver. They load libcuda.so.1 on the first
    call and raise instead of returning a CUresult: DynamicLibNotFoundError (12.9, 13.x) or
    "Failed to dlopen libcuda.so.1" (12.6) when there is none; "Failed to get
    cuGetProcAddress_v2" (12.9, 13.x) or 'Function "cuGetProcAddress_v2" not found' (12.6)
    when the driver predates CUDA 12.0, which these bindings need to resolve entry points."""
    text = str(error)
    evidence = f"cuInit(0): {type(error).__name__}: {text}"
    if type(error).__name__ != "DynamicLibNotFoundError" and (
            "cuGetProcAddress" in text or "not found" in text):
        return NotTestable("not testable: the CUDA driver is too old for this cuda-python "
                           "(it lacks an entry point the bindings need)", DRIVER_MISMATCH_FIX,
                           evidence=evidence)
    return NotTestable("not testable: no CUDA driver (libcuda.so.1 could not be loaded)",
                       NO_DRIVER_FIX, evidence=evidence)


def driver_version(module=None) -> int:
    """The driver's CUDA version as an int, e.g. 12080 for 12.8; module: the bindings to ask
    (cuda-python's driver module when None)."""
    return int(call(module or driver(), "cuDriverGetVersion", what="cuDriverGetVersion()"))


def version_text(version: int) -> str:
    """A CUDA version as the driver encodes it, as people write it: 12080 -> "12.8"."""
    return f"{version // 1000}.{version % 1000 // 10}"


def gpu_pages(length: int) -> int:
    """length rounded up to whole GPU pages."""
    return -(-length // GPU_PAGE_BYTES) * GPU_PAGE_BYTES


class IoMemoryMapping:
    """A NIC's MMIO range (a doorbell page) registered for the GPU whose context is current, as
    NCCL's GIN registers it: ``cuMemHostRegister(address, length, PORTABLE | DEVICEMAP |
    IOMEMORY)``, then ``cuMemHostGetDevicePointer(address, 0)``. ``refused`` names the call and
    the CUresult where the driver said no (nothing is left registered then); else
    ``device_pointer`` is the address the GPU writes. close() unregisters."""

    def __init__(self, module, address: int, length: int):
        self._module, self.address, self.length = module, address, length
        self.registered, self.device_pointer, self.refused = False, None, ""
        self.calls: list[str] = []
        register = (f"cuMemHostRegister({address:#x}, {length}, "
                    "PORTABLE | DEVICEMAP | IOMEMORY)")
        result = attempt(module, "cuMemHostRegister", address, length, IO_MEMORY_FLAGS)
        self.calls.append(f"{register}: {result_name(result[0])}")
        if int(result[0]) != 0:
            self.refused = self.calls[-1]
            return
        self.registered = True
        try:
            pointer = attempt(module, "cuMemHostGetDevicePointer", address, 0)
        except BaseException as error:    # a signal, or an entry point the driver lacks
            close_after(error, self.close, f"cuMemHostUnregister({address:#x})")
            raise
        self.calls.append(f"cuMemHostGetDevicePointer({address:#x}, 0): {result_name(pointer[0])}")
        if int(pointer[0]) != 0:
            self.refused = self.calls[-1]
            self.close()
            return
        self.device_pointer = int(pointer[1])

    def close(self) -> None:
        """Unregister; an unregistration the driver refuses is a gdrprobe bug, raised."""
        if self.registered:
            self.registered = False
            result = attempt(self._module, "cuMemHostUnregister", self.address)
            self.calls.append(f"cuMemHostUnregister({self.address:#x}): {result_name(result[0])}")
            check(result, f"cuMemHostUnregister({self.address:#x})")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
