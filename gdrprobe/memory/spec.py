"""Which buffer one side of a run uses: host, or a GPU buffer by mechanism, GPU and memory
type. Pure data, checked on creation; it travels in the handshake when the client chooses
the server's memory. Opening it is :func:`gdrprobe.memory.buffers.open_buffer`'s job.
"""

from __future__ import annotations

import dataclasses

from gdrprobe.defaults import GPU_ALLOCATION, GPU_ALLOCATIONS, MEM_CHOICES
from gdrprobe.defaults import GPU_MEMORY_TYPES as MEMORY_TYPES
from gdrprobe.errors import UsageError
from gdrprobe.nccl.data_direct import DATA_DIRECT, ORDINARY
from gdrprobe.protocol.fields import field, peer_text

MECHANISMS = ("auto", "dmabuf", "peermem")
# "peermem" alone names NVIDIA's peer-memory client, as gdrprobe's reports, metrics and the
# scripts reading them always have; another runtime's client is named with it.
PLAIN_PEER_MEMORY = "nvidia-peermem"
# Managed and pinned-host memory sit in (or migrate to) host pages the NIC reaches without
# GPUDirect, so a fast result with them proves nothing.
GPUDIRECT_PROOF_MEMORY = "device"
KINDS = ("host", "gpu")
NIC_FACES = ("", ORDINARY, DATA_DIRECT)      # "": not known, both tried (memory.rungs)
GPU_MECHANISMS = (*MECHANISMS, "staged")
REASON_CHARS = 1000      # a peer's reason for its mechanism, as the server keeps it


@dataclasses.dataclass(frozen=True)
class MemorySpec:
    kind: str = "host"
    mechanism: str = "auto"
    gpu: str = "0"
    memory_type: str = "device"
    pcie_mapping: bool = False
    huge_pages: bool = False
    # Device memory through VMM (NCCL's way, where supported) or cuMemAlloc; see
    # gdrprobe.memory.cuda_vmm. Managed and pinned-host memory have allocators of their own.
    allocation: str = GPU_ALLOCATION
    # Why this mechanism where NCCL's decision chose it for --mem gpu (campaign/nccl_use.py
    # as_nccl_registers); empty: as asked, or chosen when the buffer is opened.
    reason: str = ""
    # On a data-direct NIC, the face NCCL registers this GPU's DMA-BUF on and why
    # (gdrprobe.nccl.data_direct.nccl_face): "data-direct" (<dev>_dma, no fallback),
    # "ordinary" (the device itself) or "" (not known: data-direct first, then plain).
    nic_face: str = ""
    nic_face_reason: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise UsageError(f"memory kind {self.kind!r} is not host or gpu", "")
        if self.mechanism not in GPU_MECHANISMS:
            raise UsageError(f"unknown mechanism {self.mechanism!r}",
                             f"use one of: {', '.join(GPU_MECHANISMS)}")
        if self.memory_type not in MEMORY_TYPES:
            raise UsageError(f"unknown GPU memory type {self.memory_type!r}",
                             f"use one of: {', '.join(MEMORY_TYPES)}")
        if self.allocation not in GPU_ALLOCATIONS:
            raise UsageError(f"unknown GPU allocation {self.allocation!r}",
                             f"use one of: {', '.join(GPU_ALLOCATIONS)}")
        if self.nic_face not in NIC_FACES:
            raise UsageError(f"unknown NIC face {self.nic_face!r}", f"use one of: {', '.join(NIC_FACES)}")
        if self.mechanism == "dmabuf" and self.memory_type != GPUDIRECT_PROOF_MEMORY:
            raise UsageError(f"DMA-BUF export needs device memory, not {self.memory_type}",
                             "use --mem gpu or --mem peermem for that memory type")

    @classmethod
    def from_choice(cls, choice: str, **details) -> MemorySpec:
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
    def from_message(cls, message: dict) -> MemorySpec:
        return cls(kind=field(message, "kind", str), mechanism=field(message, "mechanism", str),
                   gpu=field(message, "gpu", str), memory_type=field(message, "memory_type", str),
                   pcie_mapping=field(message, "pcie_mapping", bool),
                   huge_pages=field(message, "huge_pages", bool),
                   allocation=field(message, "allocation", str, default=GPU_ALLOCATION),
                   reason=peer_text(field(message, "reason", str, default=""), REASON_CHARS),
                   nic_face=field(message, "nic_face", str, default=""),
                   nic_face_reason=peer_text(field(message, "nic_face_reason", str, default=""), REASON_CHARS))


def peer_memory_of(reported: str | None) -> str:
    """The peer-memory client a reported mechanism names ("amdkfd" of "peermem (amdkfd)"),
    "" where it names none."""
    named = (reported or "").partition(" (")[2]
    return named[:-1] if reported and reported.startswith("peermem (") and named.endswith(")") else ""


def reported_mechanism(mechanism: str, peer_memory: str | None) -> str:
    """The mechanism as a verdict names it: "peermem (amdkfd)" where ROCm's amdkfd resolves
    the GPU's addresses for the NIC, "peermem" where nvidia-peermem does, else as it is."""
    if mechanism == "peermem" and peer_memory and peer_memory != PLAIN_PEER_MEMORY:
        return f"peermem ({peer_memory})"
    return mechanism
