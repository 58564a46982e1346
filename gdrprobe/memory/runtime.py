"""The seam between gdrprobe and a GPU runtime (CUDA, ROCm): the one record per runtime, and
what a GPU provider asks of one.

A runtime is one record (:class:`GpuRuntime`) and one file set: ``memory/<key>.py`` opens
its GPUs (finds its library, opens a GPU by ordinal or PCI bus id; the open GPU,
:class:`GpuDevice`, allocates, frees, copies in and out, names itself by PCI bus id,
reports the attribute that decides DMA-BUF, exports a range as a DMA-BUF and flushes the
NIC's writes), ``doctor/facts/<key>.py`` collects what the doctor reads of its node (its
inventory, the GPUs its driver lists and lost, its collective library and that library's
rules: NCCL's, RCCL's in ``nccl/``). Every failure is a :class:`gdrprobe.errors.GdrprobeError`
the runtime mapped from its own result (:class:`gdrprobe.errors.GpuRuntimeError` the base of
the rest), so a caller never reads a runtime's result codes. The shape follows perftest's
``struct memory_ctx`` (src/memory.h): one interface, one file per runtime (cuda_memory.c,
rocm_memory.c there), and UCX's per-vendor ``uct/`` folders.

Which runtime a node uses is asked once, here (:func:`machine_runtime`): the one
GDRPROBE_GPU_RUNTIME names, else the one whose vendor's GPUs the PCI bus holds. The GPU
providers (:mod:`gdrprobe.memory.gpu`, :mod:`gdrprobe.memory.buffers`), the doctor and
everything above use only this module, so campaigns and the CLI never name a runtime.
:data:`RUNTIME_MODULES` is the registry: a new runtime is its file set and one line there
(docs/ARCHITECTURE.md, "How to add a GPU runtime").
"""

from __future__ import annotations

import dataclasses
import importlib
import mmap
import os
import re
from collections.abc import Callable, Mapping
from typing import Protocol

from gdrprobe.errors import UsageError, quoted
from gdrprobe.numbers import decimal, is_decimal
from gdrprobe.sysroot import GPU_CLASSES, PCI_DEVICES_DIR, SysRoot, is_pci_bus_id

HOST_PAGE_BYTES = mmap.PAGESIZE

# The registry: one module per runtime, each exposing RUNTIME (a GpuRuntime); imported when
# the runtime is asked for, which loads no bindings (they load when a GPU is opened), so
# that `import gdrprobe` loads none. The first is the default where the bus shows no GPU of
# any runtime's vendor: its "no driver" answer is the one a person expects.
RUNTIME_MODULES = ("gdrprobe.memory.cuda", "gdrprobe.memory.rocm")
# Names the runtime where the PCI bus cannot show the GPUs (a container without the GPU's
# sysfs, the lab's stand-in HIP runtime): a runtime's key (cuda, rocm).
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
    """One GPU runtime, the record everything that needs the node's runtime asks:

    - ``name`` as people write it (CUDA, ROCm), ``key`` as GDRPROBE_GPU_RUNTIME and the
      doctor's finding ids (``gpu.<key>``) spell it;
    - the vendor whose PCI functions of ``gpu_classes`` it drives (``vendor_id``);
    - ``visible_devices``: the variables by which a process's runtime hides GPUs, in the
      order the runtime applies them;
    - ``facts``: the doctor's collector of its node (``doctor/facts/<facts>.py``, or a full
      dotted module name), which also names its collective library and that library's
      rules: resolved by the doctor, above this layer;
    - how to tell that its library loads (``require_library`` raises NotTestable with the
      loader's reason; cheap, no bindings loaded) and how to open one of its GPUs by
      ordinal or bus id (``open``)."""

    name: str
    key: str
    vendor_id: int
    require_library: Callable[[], None]
    open: Callable[[str], GpuDevice]
    gpu_classes: tuple[int, ...] = GPU_CLASSES
    visible_devices: tuple[str, ...] = ()
    facts: str = ""

    def drives(self, root: SysRoot, bdf: str) -> bool:
        """Whether the PCI function is one of this runtime's GPUs."""
        return (read_hex(root, f"{PCI_DEVICES_DIR}/{bdf}/vendor") == self.vendor_id
                and (read_hex(root, f"{PCI_DEVICES_DIR}/{bdf}/class") or 0) >> 8
                in self.gpu_classes)

    def bus_gpus(self, root: SysRoot) -> tuple[str, ...]:
        """This runtime's GPU functions on the PCI bus, in bus order, whatever their driver
        says of them (a GPU the driver lost stays on the bus)."""
        return tuple(bdf for bdf in pci_functions(root) if self.drives(root, bdf))

    def hidden_by(self, environ: Mapping[str, str]) -> tuple[str, ...]:
        """Which of its visible-devices variables the environment sets."""
        return tuple(name for name in self.visible_devices if name in environ)


def read_hex(root: SysRoot, path: str) -> int | None:
    try:
        return int(root.read(path) or "", 16)
    except ValueError:
        return None


def pci_functions(root: SysRoot) -> list[str]:
    return sorted(name for name in root.listdir(PCI_DEVICES_DIR) if is_pci_bus_id(name))


def runtimes() -> list[GpuRuntime]:
    """Every registered runtime, in the registry's order."""
    return [importlib.import_module(name).RUNTIME for name in RUNTIME_MODULES]


def named_runtime(environ: Mapping[str, str] | None = None) -> GpuRuntime | None:
    """The runtime GDRPROBE_GPU_RUNTIME names (by key, any case), or None where it is
    unset; another value is refused before anything is probed."""
    environ = os.environ if environ is None else environ
    named = environ.get(RUNTIME_VARIABLE, "").strip().lower()
    if not named:
        return None
    known = {runtime.key: runtime for runtime in runtimes()}
    if named not in known:
        raise UsageError(f"{RUNTIME_VARIABLE}={environ[RUNTIME_VARIABLE]!r} names no GPU runtime",
                         f"set it to one of {', '.join(known)}, or unset it to take the runtime "
                         "of the GPUs on the PCI bus")
    return known[named]


def machine_runtime(root: SysRoot | None = None,
                    environ: Mapping[str, str] | None = None) -> GpuRuntime:
    """This node's runtime, the one answer to "which runtime is this node": the one
    GDRPROBE_GPU_RUNTIME names (in ``environ``, the process's by default), else the runtime
    whose vendor's GPUs are on the PCI bus (whether or not its driver still lists them: a
    node whose amdgpu failed is still AMD's); the default (the first) where there are none,
    so that its own "no driver" answer says what is missing."""
    named = named_runtime(environ)
    if named is not None:
        return named
    root = root or SysRoot()
    functions = pci_functions(root)
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


GPU_ORDINAL_MAX = (1 << 31) - 1    # a device ordinal is a C int to every GPU runtime
# The forms cuDeviceGetByPCIBusId reads (cuda.h, its documentation), and
# hipDeviceGetByPCIBusId after it: domain:bus:device.function, domain:bus:device and
# bus:device.function, every part hexadecimal.
BUS_ID_FORMS = re.compile(r"[0-9a-f]+:[0-9a-f]+:[0-9a-f]+(\.[0-9a-f]+)?|[0-9a-f]+:[0-9a-f]+\.[0-9a-f]+",
                          re.IGNORECASE)


def check_gpu_selector(selector: str) -> None:
    """A GPU as a runtime names one: an ordinal or a PCI bus id in a form the runtime reads.
    The public API refuses anything else before it probes."""
    if not (decimal(selector, GPU_ORDINAL_MAX + 1) <= GPU_ORDINAL_MAX if is_decimal(selector)
            else BUS_ID_FORMS.fullmatch(selector)):
        raise UsageError(f"GPU {quoted(selector)} is neither a GPU ordinal nor a PCI bus id",
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
