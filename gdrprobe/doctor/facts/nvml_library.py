"""NVML as NCCL reads it: the driver's own ``libnvidia-ml.so.1`` opened with dlopen (ctypes),
the entry points NCCL resolves, called as NCCL calls them. No Python package is needed, so
the default install and the OCI image read what NCCL reads.

NCCL opens ``libnvidia-ml.so.1`` by that name (NVIDIA/nccl 2.30.7 ``src/os/linux.cc``
ncclOsNvmlOpen), resolves its entry points with dlsym (``src/misc/nvmlwrap.cc``
ncclNvmlEnsureInitialized: nvmlInit_v2 where the library has it, else nvmlInit; likewise
nvmlDeviceGetCount_v2) and reads, for each of its GPUs (``src/graph/xml.cc``
ncclTopoGetXmlFromGpu, from the handle nvmlDeviceGetHandleByPciBusId gives for the GPU's
bus id, ncclTopoFillGpu):

- its index (ncclNvmlDeviceGetIndex: the position of that handle among
  nvmlDeviceGetHandleByIndex's), which NCCL's channels count from;
- its compute capability (nvmlDeviceGetCudaComputeCapability), which sets how many NVLinks
  it asks about: none before sm60, 4, 6, 12, then 18 from sm90;
- for each such link: nvmlDeviceGetNvLinkCapability(NVML_NVLINK_CAP_P2P_SUPPORTED) must
  answer non-zero; the link must be up (from sm90 the field NVML_FI_DEV_NVLINK_GET_STATE
  with the link as scope, before nvmlDeviceGetNvLinkState); then what is at its far end:
  nvmlDeviceGetNvLinkRemotePciInfo's bus id (2.30.7; an empty or unprintable one is an
  NVSwitch this machine does not show, "fffffff:ffff:ff"), or from 2.31
  nvmlDeviceGetNvLinkRemoteDeviceType first (a switch is that sentinel; a GPU or an IBM NPU
  gives its bus id; a link whose type or bus id cannot be read is skipped);
- from sm90, its C2C links (NVML_FI_DEV_C2C_LINK_COUNT, then for each link
  NVML_FI_DEV_C2C_LINK_GET_STATUS = 1 and NVML_FI_DEV_C2C_LINK_GET_MAX_BW): the active ones.

A call that fails is what NCCL makes of it (a link it skips, no C2C). What NCCL cannot do
without (the library, nvmlInit, a GPU's handle) is an error the caller reports as unread.
Every read is bounded: at most NCCL's 32 devices, NCCL's links per GPU, 64 C2C links, and
16 bytes of bus id, as NCCL's struct holds; the caller bounds the time (nvml.py).
"""

from __future__ import annotations

import ctypes
import string
from typing import Any

from gdrprobe.nccl.topo import NOT_VISIBLE
from gdrprobe.sysroot import pci_bus_id

LIBRARY = "libnvidia-ml.so.1"          # src/os/linux.cc ncclOsNvmlOpen
MAX_DEVICES = 32                       # src/include/nvmlwrap.h ncclNvmlMaxDevices
BUS_ID_BYTES = 16                      # NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE in NCCL's copy of nvml.h
MAX_C2C_LINKS = 64                     # gdrprobe's bound; NCCL loops over NVML's count
SUCCESS, NOT_SUPPORTED = 0, 3
FEATURE_ENABLED = 1
NVLINK_CAP_P2P_SUPPORTED = 0
FI_NVLINK_GET_STATE, FI_C2C_LINK_COUNT = 165, 170
FI_C2C_LINK_GET_STATUS, FI_C2C_LINK_GET_MAX_BW = 171, 172
REMOTE_GPU, REMOTE_IBMNPU, REMOTE_SWITCH = 0, 1, 2   # nvmlIntNvLinkDeviceType_t (2.31)
# NCCL's entry points (nvmlwrap.cc's table) that the facts below need; nothing else is called.
ENTRY_POINTS = ("nvmlInit_v2", "nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount_v2", "nvmlDeviceGetCount",
                "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByPciBusId", "nvmlErrorString",
                "nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetNvLinkCapability",
                "nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkRemotePciInfo",
                "nvmlDeviceGetNvLinkRemoteDeviceType", "nvmlDeviceGetFieldValues")


class PciInfo(ctypes.Structure):
    """nvmlPciInfo_t as NCCL declares it (the legacy 16-byte bus id first), padded to the
    size of NVML's newest layout so no driver writes past it."""

    _fields_ = [("busId", ctypes.c_char * BUS_ID_BYTES), ("rest", ctypes.c_uint * 16)]


class FieldValue(ctypes.Structure):
    """nvmlFieldValue_t."""

    _fields_ = [("fieldId", ctypes.c_uint), ("scopeId", ctypes.c_uint), ("timestamp", ctypes.c_longlong),
                ("latencyUsec", ctypes.c_longlong), ("valueType", ctypes.c_uint), ("nvmlReturn", ctypes.c_int),
                ("value", ctypes.c_ulonglong)]


class NvmlError(Exception):
    """An NVML call that failed (result None: the library lacks the entry point)."""

    def __init__(self, call: str, result: int | None, text: str):
        super().__init__(f"{call}() failed: {text}" if result is not None else f"{call}: {text}")
        self.call, self.result = call, result


class Nvml:
    """The driver's NVML, opened by name or path; ``calling``: the call in progress (for a
    caller whose time bound ran out)."""

    def __init__(self, library: str = LIBRARY):
        self.lib = ctypes.CDLL(library)          # OSError: no such library
        self.calling = ""

    def has(self, name: str) -> bool:
        return hasattr(self.lib, name)

    def error_text(self, result: int) -> str:
        if not self.has("nvmlErrorString"):
            return f"NVML result {result}"
        function = self.lib.nvmlErrorString
        function.restype, function.argtypes = ctypes.c_char_p, [ctypes.c_int]
        return (function(result) or b"").decode("ascii", "replace") + f" ({result})"

    def call(self, name: str, *arguments) -> None:
        if not self.has(name):
            raise NvmlError(name, None, "not in this driver's NVML")
        function = getattr(self.lib, name)
        function.restype = ctypes.c_int
        self.calling = name
        result = function(*arguments)
        self.calling = ""
        if result != SUCCESS:
            raise NvmlError(name, result, self.error_text(result))

    def versioned(self, name: str) -> str:
        """The _v2 entry point where the library has it, as NCCL's have_v2."""
        return name + "_v2" if self.has("nvmlInit_v2") else name

    def init(self) -> None:
        self.call(self.versioned("nvmlInit"))

    def shutdown(self) -> None:
        self.call("nvmlShutdown")

    def count(self) -> int:
        count = ctypes.c_uint()
        self.call(self.versioned("nvmlDeviceGetCount"), ctypes.byref(count))
        return count.value

    def handle_by_index(self, index: int) -> int:
        handle = ctypes.c_void_p()
        self.call("nvmlDeviceGetHandleByIndex", ctypes.c_uint(index), ctypes.byref(handle))
        return handle.value

    def handle_by_bus_id(self, bus_id: str) -> int:
        handle = ctypes.c_void_p()
        self.call("nvmlDeviceGetHandleByPciBusId", bus_id.encode("ascii"), ctypes.byref(handle))
        return handle.value

    def capability(self, handle: int) -> tuple[int, int]:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.call("nvmlDeviceGetCudaComputeCapability", ctypes.c_void_p(handle), ctypes.byref(major),
                  ctypes.byref(minor))
        return major.value, minor.value

    def unsigned(self, name: str, handle: int, link: int, *before) -> int:
        value = ctypes.c_uint()
        self.call(name, ctypes.c_void_p(handle), ctypes.c_uint(link), *before, ctypes.byref(value))
        return value.value

    def fields(self, handle: int, wanted: list[tuple[int, int]]) -> list[int | None]:
        """Field values (field id, scope) as unsigned ints; None where NVML answered none."""
        values = (FieldValue * len(wanted))()
        for value, (field, scope) in zip(values, wanted):
            value.fieldId, value.scopeId = field, scope
        self.call("nvmlDeviceGetFieldValues", ctypes.c_void_p(handle), ctypes.c_int(len(wanted)), values)
        return [value.value & 0xFFFFFFFF if value.nvmlReturn == SUCCESS else None for value in values]

    def remote_bus_id(self, handle: int, link: int) -> str:
        info = PciInfo()
        self.call("nvmlDeviceGetNvLinkRemotePciInfo", ctypes.c_void_p(handle), ctypes.c_uint(link),
                  ctypes.byref(info))
        return bus_id_text(bytes(info.busId))


def bus_id_text(raw: bytes) -> str:
    """A far end's bus id as NCCL 2.30.7 keeps it (xml.cc): lower case; an unprintable one is
    NOT_VISIBLE; "" stays "" (2.30.7 makes it NOT_VISIBLE, 2.31 skips the link)."""
    text = raw[:BUS_ID_BYTES].split(b"\0", 1)[0].decode("latin-1")
    if any(c not in string.printable or c in "\t\n\r\x0b\x0c" for c in text):
        return NOT_VISIBLE
    return pci_bus_id(text.lower()) if text else ""


def max_nvlinks(sm: int) -> int:
    """xml.cc ncclTopoGetXmlFromGpu: the links NCCL asks about by compute capability."""
    return 0 if sm < 60 else 4 if sm < 70 else 6 if sm < 80 else 12 if sm < 90 else 18


def tried(read, *arguments):
    """A call NCCL makes through NVMLTRY: its answer, or None where it failed (NCCL skips)."""
    try:
        return read(*arguments)
    except NvmlError:
        return None


def link_up(nvml: Nvml, handle: int, link: int, sm: int) -> bool:
    """xml.cc: the link may carry P2P and is up (from sm90 by its field, before by
    nvmlDeviceGetNvLinkState; a failed read leaves it down)."""
    if not tried(nvml.unsigned, "nvmlDeviceGetNvLinkCapability", handle, link,
                 ctypes.c_int(NVLINK_CAP_P2P_SUPPORTED)):
        return False
    if sm >= 90:
        state = tried(nvml.fields, handle, [(FI_NVLINK_GET_STATE, link)])
        return bool(state) and state[0] == FEATURE_ENABLED
    return tried(nvml.unsigned, "nvmlDeviceGetNvLinkState", handle, link) == FEATURE_ENABLED


def nvlinks(nvml: Nvml, handle: int, sm: int) -> list[dict[str, Any]]:
    """Each link that is up: its far end's type (2.31's question; None where it could not be
    read) and bus id (None where it could not be read)."""
    found = []
    for link in range(max_nvlinks(sm)):
        if link_up(nvml, handle, link, sm):
            found.append({"link": link,
                          "remote_type": tried(nvml.unsigned, "nvmlDeviceGetNvLinkRemoteDeviceType", handle, link),
                          "remote_bus_id": tried(nvml.remote_bus_id, handle, link)})
    return found


def c2c(nvml: Nvml, handle: int, sm: int) -> dict[str, int]:
    """xml.cc (sm90 on): the active C2C links and the last one's bandwidth (MB/s)."""
    counted = tried(nvml.fields, handle, [(FI_C2C_LINK_COUNT, 0)]) if sm >= 90 else None
    active = bw = 0
    for link in range(min(counted[0], MAX_C2C_LINKS) if counted and counted[0] is not None else 0):
        status = tried(nvml.fields, handle, [(FI_C2C_LINK_GET_STATUS, link), (FI_C2C_LINK_GET_MAX_BW, link)])
        if status and status[0] == 1 and status[1] is not None:
            active, bw = active + 1, status[1]
    return {"c2c_link_count": active, "c2c_bw_mbps": bw}


def gpu_entry(nvml: Nvml, handle: int, bus_id: str | None) -> dict[str, Any]:
    sm = tried(nvml.capability, handle)
    entry: dict[str, Any] = {"pci_bus_id": bus_id, "compute_capability": list(sm) if sm else None}
    if bus_id is not None and sm is not None:
        number = sm[0] * 10 + sm[1]
        entry.update(c2c(nvml, handle, number), nvlinks=nvlinks(nvml, handle, number))
    return entry


def read_nccl_facts(nvml: Nvml, bus_ids: list[str]) -> dict[str, Any]:
    """What NCCL reads of NVML for these GPUs (sysfs bus ids): every GPU NVML lists, in its
    index order (an entry's bus id None where it is none of these); ``unread``: the bus ids
    NVML has no handle for, with why. nvmlInit's failure raises NvmlError."""
    nvml.init()
    try:
        count = nvml.count()
        handles = [nvml.handle_by_index(index) for index in range(min(count, MAX_DEVICES))]
        by_handle, unread = {}, {}
        for bus_id in bus_ids:
            try:
                by_handle[nvml.handle_by_bus_id(bus_id)] = bus_id
            except NvmlError as error:
                unread[bus_id] = str(error)
        facts: dict[str, Any] = {"library": LIBRARY, "device_count": count,
                                 "gpus": [gpu_entry(nvml, handle, by_handle.get(handle)) for handle in handles]}
        if count > MAX_DEVICES:
            facts["note"] = f"NVML lists {count} GPUs, more than NCCL's {MAX_DEVICES}: NCCL fails to initialise"
        return {**facts, "unread": unread} if unread else facts
    finally:
        tried(nvml.shutdown)
