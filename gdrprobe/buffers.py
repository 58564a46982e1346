"""Which buffer one side of a run uses, and opening it registered on that side's PD.

A :class:`MemorySpec` says host or GPU, and for a GPU the mechanism (auto, dmabuf,
peermem, staged), the GPU (CUDA ordinal or PCI bus id) and the memory type. It travels in
the handshake when the client chooses the server's memory. :func:`open_buffer` turns it
into a registered provider and releases everything it opened, in order, on every path.
"""

from __future__ import annotations

import contextlib
import dataclasses

from gdrprobe.errors import GdrprobeError, UsageError
from gdrprobe.exchange import field
from gdrprobe.cuda import open_gpu
from gdrprobe.memory import LOCAL_ACCESS, PROBE_ACCESS, HostMemory, MemoryProvider
from gdrprobe.memory_gpu import (MECHANISMS, MEMORY_TYPES, PROVIDERS, choose_mechanism,
                                 probe_nic_dmabuf)
from gdrprobe.sysroot import SysRoot

KINDS = ("host", "gpu")
GPU_MECHANISMS = (*MECHANISMS, "staged")
# The --mem spellings: host, gpu (auto), or a mechanism by name.
MEM_CHOICES = ("host", "gpu", "dmabuf", "peermem", "staged")


@dataclasses.dataclass(frozen=True)
class MemorySpec:
    kind: str = "host"
    mechanism: str = "auto"
    gpu: str = "0"
    memory_type: str = "device"
    pcie_mapping: bool = False
    huge_pages: bool = False

    def __post_init__(self):
        if self.kind not in KINDS:
            raise UsageError(f"memory kind {self.kind!r} is not host or gpu", "")
        if self.mechanism not in GPU_MECHANISMS:
            raise UsageError(f"unknown mechanism {self.mechanism!r}",
                             f"use one of: {', '.join(GPU_MECHANISMS)}")
        if self.memory_type not in MEMORY_TYPES:
            raise UsageError(f"unknown GPU memory type {self.memory_type!r}",
                             f"use one of: {', '.join(MEMORY_TYPES)}")

    @classmethod
    def from_choice(cls, choice: str, **details) -> "MemorySpec":
        """From a --mem value: host, gpu (auto mechanism), dmabuf, peermem or staged."""
        if choice not in MEM_CHOICES:
            raise UsageError(f"--mem {choice!r} is not one of {', '.join(MEM_CHOICES)}", "")
        if choice == "host":   # GPU details do not apply to a host buffer
            return cls(kind="host", huge_pages=details.get("huge_pages", False))
        return cls(kind="gpu", mechanism="auto" if choice == "gpu" else choice, **details)

    @property
    def label(self) -> str:
        return "host" if self.kind == "host" else (
            self.mechanism if self.mechanism != "auto" else "gpu")

    def to_message(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_message(cls, message: dict) -> "MemorySpec":
        return cls(kind=field(message, "kind", str), mechanism=field(message, "mechanism", str),
                   gpu=field(message, "gpu", str), memory_type=field(message, "memory_type", str),
                   pcie_mapping=field(message, "pcie_mapping", bool),
                   huge_pages=field(message, "huge_pages", bool))


def nic_numa_node(device: str, root: SysRoot | None = None) -> int:
    """The NUMA node of the RDMA device's PCI function; -1 when unknown or virtual."""
    text = (root or SysRoot()).read(f"/sys/class/infiniband/{device}/device/numa_node")
    try:
        return int(text) if text is not None else -1
    except ValueError:
        return -1


@contextlib.contextmanager
def open_buffer(spec: MemorySpec, endpoint, length: int, remote_write: bool):
    """A registered provider of `length` bytes on the endpoint's PD, as the spec says;
    writable by the peer only when remote_write. A GPU provider also carries
    ``choice_reason``: why this mechanism was used."""
    access = PROBE_ACCESS if remote_write else LOCAL_ACCESS
    if spec.kind == "host":
        with HostMemory(length, nic_numa_node(endpoint.device), spec.huge_pages) as memory:
            memory.register(endpoint.pd, access)
            yield memory
        return
    with open_gpu_buffer(spec, endpoint, length, access) as memory:
        yield memory


@contextlib.contextmanager
def open_gpu_buffer(spec: MemorySpec, endpoint, length: int, access: int):
    nic = probe_nic_dmabuf(endpoint.pd) if spec.mechanism in ("auto", "dmabuf") else None
    # Say what the NIC allows before the GPU is even opened: on a machine without CUDA the
    # reason still reaches the report, as the error's first piece of evidence.
    _, early_reason = mechanism_for(spec, None, nic)
    try:
        gpu = open_gpu(spec.gpu)
    except GdrprobeError as error:
        error.evidence = "; ".join(x for x in (early_reason, error.evidence) if x)
        raise
    with gpu:
        mechanism, reason = mechanism_for(spec, gpu.attributes, nic)
        extra = {"pcie_mapping": spec.pcie_mapping} if mechanism == "dmabuf" else {}
        with PROVIDERS[mechanism](gpu, length, spec.memory_type, **extra) as memory:
            memory.choice_reason = reason
            memory.register(endpoint.pd, access)
            yield memory


def mechanism_for(spec: MemorySpec, attributes, nic) -> tuple[str, str]:
    if spec.mechanism == "staged":
        return "staged", "staged requested: the bounce through pinned host memory"
    if spec.mechanism == "peermem":
        return "peermem", "peermem requested: the CUDA address registered as is"
    return choose_mechanism(spec.mechanism, attributes, nic)


def describe(memory: MemoryProvider) -> dict:
    """The provider's own description plus why its mechanism was chosen."""
    reason = memory.choice_reason
    return memory.describe() | ({"mechanism_reason": reason} if reason else {})
