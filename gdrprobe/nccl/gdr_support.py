"""Can NCCL register GPU memory with a NIC, and through what: NCCL's own rules (NVIDIA/nccl
2.30.7) over the facts the doctor reads (:mod:`gdrprobe.doctor.facts.memory_path`).

- peer memory (``src/transport/net_ib/gdr.cc`` ncclIbGdrSupport): any of
  ``/sys/kernel/mm/memory_peers/nv_mem/version``, ``.../nv_mem_nc/version`` or
  ``/sys/module/nvidia_peermem/version`` exists. On kernels 6.6+ ``memory_peers`` is gone
  and only the module file is left, which NCCL reads from 2.23.4 (an older release looks
  only at the first two: :attr:`MemoryPaths.peermem_files`). NCCL checks only that a file
  exists: a module loaded but not listed among the peer-memory API's clients
  (:attr:`MemoryPaths.peermem_registered`, a fact NCCL does not read) still counts, and its
  registrations fail. The deprecated nv_peer_mem registers the same ``nv_mem`` client and
  counts too.
- DMA-BUF (from NCCL 2.13.4) on the NIC (``gdr.cc`` ncclIbDmaBufSupport): ``ibv_reg_dmabuf_mr(fd=-1)`` does not
  fail with EOPNOTSUPP or EPROTONOSUPPORT (:mod:`gdrprobe.doctor.facts.nic_facts` runs the
  probe).
- DMA-BUF on the GPU (``src/init.cc`` dmaBufSupported): NCCL_DMABUF_ENABLE != 0, CUDA
  driver >= 11.7 and CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED != 0.
- the NIC's verdict (``src/graph/topo.cc`` ncclTopoPopulateNics): GDR when peer memory, or
  both DMA-BUF halves; otherwise NCCL logs "GPU Direct RDMA Disabled for HCA".
- the registration NCCL then makes (``src/transport/net.cc`` useDmaBuf, set in
  sendProxySetup and recvProxySetup): DMA-BUF where the GPU half holds
  (``proxyState->dmaBufSupport``) and the NIC registers DMA-BUF (``props.ptrSupport &
  NCCL_PTR_DMABUF``), else peer memory (``ncclNetRegMr`` with the CUDA address). NCCL
  2.13.x does not ask the NIC (:attr:`gdrprobe.nccl.versions.NcclRules.dmabuf_needs_nic`);
  before 2.13.4 there is no DMA-BUF at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from gdrprobe.nccl import params
from gdrprobe.nccl.versions import NcclRules
from gdrprobe.report.model import Evidence

DMABUF_MIN_CUDA_DRIVER = 11070          # cuDriverGetVersion() encoding of 11.7


@dataclasses.dataclass(frozen=True)
class Half:
    """One prerequisite of DMA-BUF (the GPU's or the NIC's): yes/no, why, and whether guessed."""

    supported: bool
    reason: str
    inferred: bool = False


def format_cuda_version(encoded: int) -> str:
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


def dmabuf_enabled(environ: Mapping[str, str], rules: NcclRules | None = None) -> bool:
    """NCCL_DMABUF_ENABLE as src/init.cc dmaBufSupported reads it (NCCL's default 1, RCCL's 0)."""
    return params.DMABUF_ENABLE.number(environ, rules) != 0


def gpu_dmabuf_half(driver: int | None, attribute: int | None) -> Half:
    """src/init.cc dmaBufSupported for one GPU, less NCCL_DMABUF_ENABLE (kept apart to say
    which blocks): the CUDA driver's version and CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED."""
    if driver is not None and driver < DMABUF_MIN_CUDA_DRIVER:
        return Half(False, f"CUDA driver {format_cuda_version(driver)} is older than 11.7")
    if not attribute:
        return Half(False, f"CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED={attribute} (needs the Open Kernel Module driver)")
    return Half(True, "CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED=1")


@dataclasses.dataclass(frozen=True)
class MemoryPaths:
    """Per NIC and GPU: does NCCL register GPU memory for RDMA, and through what."""

    peermem_file: str | None               # the first of NCCL's files that exists
    dmabuf_enabled: bool                   # NCCL_DMABUF_ENABLE as NCCL reads it
    dmabuf_enable_raw: str | None
    gpu_halves: dict[str, Half]            # GPU bus id -> its DMA-BUF half
    default_gpu_half: Half                 # for GPUs the CUDA facts do not list
    nic_halves: dict[str, Half]            # NIC name -> its DMA-BUF half (NCCL's probe)
    default_nic_half: Half
    # The pairs NCCL would register memory for; unnamed stand-ins when the bus has none.
    nics: tuple[str, ...] = ("any NIC",)
    gpus: tuple[str, ...] = ("any GPU",)
    rules: NcclRules = NcclRules()         # the NCCL in use: its peer-memory files, DMA-BUF, name
    # A fact NCCL does not read: whether nvidia-peermem registered with the peer-memory API
    # (None: cannot tell; False: loaded, /sys/kernel/mm/memory_peers there, nv_mem not in it).
    peermem_registered: bool | None = None
    # What the reasons call peer memory, and, where the library's own rule says more than
    # "no file", why it has none and why DMA-BUF is off (RCCL: gdrprobe.nccl.rccl).
    peermem_label: str = "peer memory (nvidia-peermem)"
    no_peermem_reason: str = ""
    dmabuf_off_reason: str = ""
    notes: tuple[str, ...] = ()           # what the library warns of, deciding nothing
    # RCCL's facts, re-read under each environment (None: NCCL's rules).
    rccl: Any = None

    def under(self, environ: Mapping[str, str]) -> MemoryPaths:
        """The same facts with NCCL_DMABUF_ENABLE read from ``environ``: the one setting
        among them that the environment decides (a what-if asks with it unset); RCCL's
        facts are read again whole (:meth:`gdrprobe.nccl.rccl.RcclFacts.paths_under`)."""
        if self.rccl is not None:
            return self.rccl.paths_under(self, environ)
        return dataclasses.replace(self, dmabuf_enabled=dmabuf_enabled(environ, self.rules),
                                   dmabuf_enable_raw=params.DMABUF_ENABLE.raw(environ))

    @property
    def peermem_files(self) -> tuple[str, ...]:
        """The files whose presence means peer memory to the NCCL in use."""
        return self.rules.peermem_files

    @property
    def nccl_name(self) -> str:
        """Who the reasons speak of: "NCCL 2.12.12", or "NCCL" when its version is unknown."""
        return self.rules.name

    def gpu_half(self, bdf: str) -> Half:
        return self.gpu_halves.get(bdf, self.default_gpu_half)

    def nic_half(self, nic: str) -> Half:
        return self.nic_halves.get(nic, self.default_nic_half)

    def gpu_dmabuf(self, gpu: str, enabled: bool | None = None) -> bool:
        """The communicator's side (init.cc dmaBufSupported): a release with DMA-BUF,
        NCCL_DMABUF_ENABLE not 0 (``enabled`` overrides it), the GPU's half."""
        on = self.dmabuf_enabled if enabled is None else enabled
        return self.rules.dmabuf and on and self.gpu_half(gpu).supported

    def dmabuf(self, nic: str, gpu: str, enabled: bool | None = None) -> bool:
        return self.gpu_dmabuf(gpu, enabled) and self.nic_half(nic).supported

    def nic_gdr(self, nic: str, gpu: str) -> bool:
        """topo.cc ncclTopoPopulateNics: (ptrSupport & CUDA) || (dmaBufSupport && (ptrSupport & DMABUF))."""
        return self.peermem_file is not None or self.dmabuf(nic, gpu)

    def registers_dmabuf(self, nic: str, gpu: str) -> bool:
        """net.cc useDmaBuf: the GPU side, and the NIC's DMA-BUF property where the release asks it."""
        return self.dmabuf(nic, gpu) if self.rules.dmabuf_needs_nic else self.gpu_dmabuf(gpu)

    def kind(self, nic: str, gpu: str) -> str | None:
        """What NCCL registers GPU memory with for this pair where it can use GDR with it:
        dmabuf (preferred, net.cc useDmaBuf), peermem, or None."""
        if not self.nic_gdr(nic, gpu):
            return None
        if self.peermem_file is not None and self.rules.prefers_peermem:
            return "peermem"
        return "dmabuf" if self.registers_dmabuf(nic, gpu) else "peermem"

    def mechanism(self, nic: str, gpu: str) -> str | None:
        """:meth:`kind` in words."""
        return {"dmabuf": "DMA-BUF", "peermem": self.peermem_label}.get(self.kind(nic, gpu))

    def registration_reason(self, nic: str, gpu: str) -> str:
        """Why NCCL registers this pair's GPU memory the way :meth:`kind` says, with the rule
        and the release; the other mechanism only as information."""
        who = self.rules.described
        peermem = (f"peer memory is there too ({self.peermem_file}), not what NCCL uses" if self.peermem_file
                   else "no peer memory (" + ", ".join(self.peermem_files) + " absent)")
        if self.kind(nic, gpu) == "dmabuf":
            nic_side = (self.nic_half(nic).reason if self.rules.dmabuf_needs_nic
                        else f"the NIC is not asked before 2.14.3 ({self.nic_half(nic).reason})")
            return (f"{who} registers GPU memory through DMA-BUF (src/transport/net.cc useDmaBuf, src/init.cc "
                    f"dmaBufSupported): NCCL_DMABUF_ENABLE is not 0, {self.gpu_half(gpu).reason}, {nic_side}; "
                    + peermem)
        blockers = self.dmabuf_blockers(nic, gpu) or [
            f"{who} registers through peer memory wherever it has it (DMA-BUF is its fallback)"]
        return (f"{who} registers GPU memory through peer memory ({self.peermem_file}, net.cc ncclNetRegMr): "
                f"DMA-BUF is not used because {'; '.join(blockers)} (information only: not measured)")

    def dmabuf_blockers(self, nic: str, gpu: str) -> list[str]:
        """Why NCCL does not register this pair through DMA-BUF."""
        if not self.rules.dmabuf:
            return [f"{self.nccl_name} predates DMA-BUF registration (NCCL 2.13.4)"]
        parts = [self.dmabuf_off] if not self.dmabuf_enabled else []
        halves = (self.gpu_half(gpu), self.nic_half(nic)) if self.rules.dmabuf_needs_nic else (self.gpu_half(gpu),)
        return parts + [half.reason for half in halves if not half.supported]

    def disabled_pairs(self, dmabuf_enabled: bool | None = None) -> list[tuple[str, str]]:
        """(NIC, GPU) pairs NCCL reports "GPU Direct RDMA Disabled" for (``dmabuf_enabled``
        overrides NCCL_DMABUF_ENABLE: what would happen without it)."""
        return [(nic, gpu) for nic in self.nics for gpu in self.gpus
                if not (self.peermem_file or self.dmabuf(nic, gpu, dmabuf_enabled))]

    def dmabuf_everywhere(self) -> bool:
        """NCCL registers every pair's GPU memory through DMA-BUF."""
        return all(self.kind(nic, gpu) == "dmabuf" for nic in self.nics for gpu in self.gpus)

    def unasked_nics(self) -> list[str]:
        """NICs that cannot register DMA-BUF but get DMA-BUF registrations all the same
        (NCCL 2.13.x, :attr:`gdrprobe.nccl.versions.NcclRules.dmabuf_needs_nic`): they fail."""
        return sorted({nic for nic in self.nics for gpu in self.gpus
                       if self.kind(nic, gpu) == "dmabuf" and not self.nic_half(nic).supported})

    def why_not(self, nic: str, gpu: str) -> str:
        """Why NCCL says "GPU Direct RDMA Disabled" for this NIC and GPU."""
        parts = [self.no_peermem_reason or
                 "no peer-memory module (none of " + ", ".join(self.peermem_files) + " exists)"]
        if not self.rules.dmabuf:
            return "; ".join(parts + [f"{self.nccl_name} predates DMA-BUF registration (NCCL 2.13.4)"])
        if not self.dmabuf_enabled:
            parts.append(f"DMA-BUF is off: {self.dmabuf_off}")
        for half in (self.gpu_half(gpu), self.nic_half(nic)):
            if not half.supported:
                parts.append(half.reason)
        return "; ".join(parts)

    @property
    def dmabuf_off(self) -> str:
        """Why NCCL_DMABUF_ENABLE turns DMA-BUF off."""
        return self.dmabuf_off_reason or f"NCCL_DMABUF_ENABLE={self.dmabuf_enable_raw} switches it off"

    def evidence(self) -> tuple[Evidence, ...]:
        found = [Evidence(self.peermem_file or "peer-memory files", "present" if self.peermem_file
                          else f"none of the files {self.nccl_name} looks for exists")]
        found += [Evidence(f"DMA-BUF, GPU {bdf}", half.reason) for bdf, half in sorted(self.gpu_halves.items())]
        found += [Evidence(f"DMA-BUF, NIC {nic}", half.reason) for nic, half in sorted(self.nic_halves.items())]
        if not self.gpu_halves:
            found.append(Evidence("DMA-BUF, GPU", self.default_gpu_half.reason))
        found += [Evidence(f"{self.nccl_name} warns", note) for note in self.notes]
        return tuple(found)
