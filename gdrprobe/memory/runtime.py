"""The seam between gdrprobe and a GPU runtime (CUDA today): what a GPU provider asks of one.

A runtime finds its library, opens a GPU by ordinal or PCI bus id, and the open GPU
(:class:`GpuDevice`) allocates, frees, copies in and out, names itself by PCI bus id,
reports the attribute that decides DMA-BUF, exports a range as a DMA-BUF and flushes the
NIC's writes. Every failure is a :class:`gdrprobe.errors.GdrprobeError` the runtime mapped
from its own result (CUDA: :mod:`gdrprobe.memory.cuda_results`), so a caller never reads a
runtime's result codes. The shape follows perftest's ``struct memory_ctx`` (src/memory.h):
one interface, one file per runtime (cuda_memory.c, rocm_memory.c there; :mod:`gdrprobe.memory.cuda`
and :mod:`gdrprobe.memory.rocm` here).

Which runtime a node uses is what its PCI bus holds (:func:`machine_runtime`): the GPU
providers (:mod:`gdrprobe.memory.gpu`, :mod:`gdrprobe.memory.buffers`) and everything above
them use only this module, so campaigns and the CLI never name a runtime.
"""

from __future__ import annotations

import dataclasses
import importlib
import mmap
import os
import re
from collections.abc import Callable
from typing import Protocol

from gdrprobe.errors import UsageError
from gdrprobe.sysroot import GPU_CLASSES, PCI_DEVICES_DIR, SysRoot, is_pci_bus_id

HOST_PAGE_BYTES = mmap.PAGESIZE

# One module per runtime, each exposing RUNTIME (a GpuRuntime); imported only when a GPU is
# opened, so that `import gdrprobe` loads none. The first is the default where the bus
# shows no GPU of any runtime's vendor: its "no driver" answer is the one a person expects.
RUNTIME_MODULES = ("gdrprobe.memory.cuda", "gdrprobe.memory.rocm")
# Names the runtime where the PCI bus cannot show the GPUs (a container without the GPU's
# sysfs, the lab's stand-in HIP runtime): cuda or rocm, as the module is named.
RUNTIME_VARIABLE = "GDRPROBE_GPU_RUNTIME"


class GpuAllocation(Protocol):
    """One allocation: ``ptr`` for copies and verbs, ``length`` bytes used, how it was
    allocated (``allocation``); ``close`` frees it and is safe to call twice."""

    ptr: int
    length: int
    allocation: str

    def close(self) -> None: ...


class DmaBufAttribute(Protocol):
    """The GPU attribute that decides DMA-BUF export, and its name in the runtime's terms
    (what a reason quotes); who resolves the GPU's addresses on the peermem path."""

    dma_buf_supported: int | None
    dma_buf_attribute: str
    peer_memory: str


class GpuDevice(Protocol):
    """An open GPU; a context manager whose ``close`` is idempotent."""

    bus_id: str                    # as sysfs spells it
    attributes: DmaBufAttribute

    def allocate(self, memory_type: str, length: int, allocation: str) -> GpuAllocation: ...

    def alloc_pinned_host(self, length: int) -> GpuAllocation: ...

    def copy_to_device(self, device_ptr: int, host_address: int, length: int) -> None: ...

    def copy_to_host(self, host_address: int, device_ptr: int, length: int) -> None: ...

    def export_dmabuf(self, ptr: int, length: int, pcie_mapping: bool) -> tuple[int, int]:
        """(fd, offset of ptr in the DMA-BUF); the caller closes fd."""

    def flush_rdma_writes(self) -> bool: ...

    def describe(self) -> dict: ...

    def close(self) -> None: ...

    def __enter__(self) -> GpuDevice: ...

    def __exit__(self, *exc) -> None: ...


@dataclasses.dataclass(frozen=True)
class GpuRuntime:
    """One GPU runtime: the vendor whose PCI functions it drives, how to tell that its
    library loads (``require_library`` raises NotTestable with the loader's reason; cheap,
    no bindings loaded) and how to open one of its GPUs by ordinal or bus id (``open``)."""

    name: str
    vendor_id: int
    require_library: Callable[[], None]
    open: Callable[[str], GpuDevice]
    gpu_classes: tuple[int, ...] = GPU_CLASSES

    def drives(self, root: SysRoot, bdf: str) -> bool:
        """Whether the PCI function is one of this runtime's GPUs."""
        return (read_hex(root, f"{PCI_DEVICES_DIR}/{bdf}/vendor") == self.vendor_id
                and (read_hex(root, f"{PCI_DEVICES_DIR}/{bdf}/class") or 0) >> 8
                in self.gpu_classes)


def read_hex(root: SysRoot, path: str) -> int | None:
    try:
        return int(root.read(path) or "", 16)
    except ValueError:
        return None


def runtimes() -> list[GpuRuntime]:
    return [importlib.import_module(name).RUNTIME for name in RUNTIME_MODULES]


def named_runtime_module() -> str | None:
    """The module of the runtime GDRPROBE_GPU_RUNTIME names, or None where it is unset;
    another value is refused before anything is probed."""
    named = os.environ.get(RUNTIME_VARIABLE, "").strip().lower()
    if not named:
        return None
    modules = {module.rsplit(".", 1)[1]: module for module in RUNTIME_MODULES}
    if named not in modules:
        raise UsageError(f"{RUNTIME_VARIABLE}={os.environ[RUNTIME_VARIABLE]!r} names no GPU runtime",
                         f"set it to one of {', '.join(modules)}, or unset it to take the runtime "
                         "of the GPUs on the PCI bus")
    return modules[named]


def machine_runtime(root: SysRoot | None = None) -> GpuRuntime:
    """The runtime GDRPROBE_GPU_RUNTIME names, else the runtime of the GPUs on this node's
    PCI bus; the default (the first) where there are none, so that its own "no driver"
    answer says what is missing."""
    named = named_runtime_module()
    if named is not None:
        return importlib.import_module(named).RUNTIME
    root = root or SysRoot()
    functions = [name for name in root.listdir(PCI_DEVICES_DIR) if is_pci_bus_id(name)]
    known = runtimes()
    for runtime in known:
        if any(runtime.drives(root, bdf) for bdf in functions):
            return runtime
    return known[0]


def open_gpu(selector: str) -> GpuDevice:
    """The GPU of an ordinal or a PCI bus id, through this node's runtime; a context manager."""
    return machine_runtime().open(str(selector))


def require_gpu_library() -> None:
    """Raises NotTestable where this node's GPU runtime cannot be loaded."""
    machine_runtime().require_library()


# ---- GPU selectors --------------------------------------------------------------------


def is_bus_id(selector: str) -> bool:
    return ":" in selector


# The forms cuDeviceGetByPCIBusId reads (cuda.h, its documentation), and
# hipDeviceGetByPCIBusId after it: domain:bus:device.function, domain:bus:device and
# bus:device.function, every part hexadecimal.
BUS_ID_FORMS = re.compile(r"[0-9a-f]+:[0-9a-f]+:[0-9a-f]+(\.[0-9a-f]+)?|[0-9a-f]+:[0-9a-f]+\.[0-9a-f]+",
                          re.IGNORECASE)


def check_gpu_selector(selector: str) -> None:
    """A GPU as a runtime names one: an ordinal or a PCI bus id in a form the runtime reads.
    The public API refuses anything else before it probes."""
    if not ((selector.isascii() and selector.isdigit()) or BUS_ID_FORMS.fullmatch(selector)):
        raise UsageError(f"GPU {selector!r} is neither a GPU ordinal nor a PCI bus id",
                         "pass a GPU as an ordinal (0) or a full bus id (0000:3b:00.0)")


# ---- DMA-BUF range arithmetic (pure) ------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DmaBufRange:
    """The host-page-aligned range to export, and where the buffer starts inside it."""

    aligned_address: int
    aligned_length: int
    offset: int


def dmabuf_range(address: int, length: int, page: int = HOST_PAGE_BYTES) -> DmaBufRange:
    """The export calls (cuMemGetHandleForAddressRange, hipMemGetHandleForAddressRange)
    want a host-page-aligned start and size."""
    if length <= 0:
        raise ValueError("a DMA-BUF range needs a positive length")
    aligned_address = address & ~(page - 1)
    offset = address - aligned_address
    aligned_length = (offset + length + page - 1) // page * page
    return DmaBufRange(aligned_address, aligned_length, offset)
