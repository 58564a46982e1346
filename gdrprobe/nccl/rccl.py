"""Can RCCL register GPU memory with a NIC on an AMD node, and through what: RCCL's own rules
(ROCm/rccl at 0cbce2a7, rocm-test-09212024-66, the 6.3 line) over the facts the doctor reads
(:mod:`gdrprobe.doctor.facts.rocm`), as a :class:`~gdrprobe.nccl.gdr_support.MemoryPaths` the
per-GPU decision (:mod:`gdrprobe.nccl.decision`) reads as it reads NCCL's.

- peer memory (``src/transport/net_ib.cc`` ncclIbGdrSupport): ``RCCL_FORCE_ENABLE_GDRDMA=1``
  says yes and skips every check. Otherwise the first of
  ``/sys/kernel/mm/memory_peers/amdkfd/version``, ``/sys/kernel/memory_peers/amdkfd/version``
  and ``/sys/memory_peers/amdkfd/version`` that exists says yes (kernels before 6.6 with an
  OFED peer-memory module put it in the first; newer ones elsewhere or nowhere). Then, on a
  Hyper-V guest (``/sys/devices/virtual/dmi/id/bios_version`` starts with "Hyper-V UEFI
  Release"), ``/proc/sys/kernel/numa_balancing`` = 1 with ``NCCL_IB_PCI_RELAXED_ORDERING``
  = 0 says no even where a file was found, and /proc/kallsyms is never read; elsewhere, with
  no file found, a ``t`` or ``T`` ``ib_register_peer_memory_client`` symbol in
  ``/proc/kallsyms`` (the inbox kernel's peer-memory API) says yes.
- DMA-BUF on the GPU (``src/misc/rocmwrap.cc`` initOnceFunc, ``src/init.cc`` dmaBufSupported
  of a HIP build): ``NCCL_DMABUF_ENABLE`` not 0 (default 0: off unless set), HSA's
  ``HSA_AMD_SYSTEM_INFO_DMABUF_SUPPORTED`` (system info 0x204) true,
  ``hsa_amd_portable_export_dmabuf`` in libhsa-runtime64, and both ``CONFIG_DMABUF_MOVE_NOTIFY=y``
  and ``CONFIG_PCI_P2PDMA=y`` in ``/boot/config-<uname -r>``. RCCL reads no other kernel
  configuration (not /proc/config.gz), and does not check that the file opened before
  reading it.
- DMA-BUF on the NIC and how the two combine: as NCCL (``net_ib.cc`` ncclIbDmaBufSupport's
  ``ibv_reg_dmabuf_mr(fd=-1)`` probe, ``src/graph/topo.cc`` gdrSupport, ``src/transport/net.cc``
  useDmaBuf with the NIC's ``NCCL_PTR_DMABUF``), so :class:`RcclRules` asks the NIC.
- warnings RCCL prints at init (``src/init.cc`` ncclInit): ``numa_balancing`` = 1; outside
  Hyper-V and Cray kernels, no ``iommu=pt`` on ``/proc/cmdline`` and
  ``HSA_FORCE_FINE_GRAIN_PCIE`` not 1. They decide nothing; the doctor shows them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from gdrprobe.nccl.env import int_param
from gdrprobe.nccl.gdr_support import Half, MemoryPaths
from gdrprobe.nccl.versions import NcclRules

MEMORY_PEERS_FILES = ("/sys/kernel/mm/memory_peers/amdkfd/version",
                      "/sys/kernel/memory_peers/amdkfd/version",
                      "/sys/memory_peers/amdkfd/version")
KALLSYMS = "/proc/kallsyms"
PEER_MEMORY_SYMBOL = "ib_register_peer_memory_client"
BIOS_VERSION = "/sys/devices/virtual/dmi/id/bios_version"
HYPER_V_BIOS = "Hyper-V UEFI Release"
NUMA_BALANCING = "/proc/sys/kernel/numa_balancing"
KERNEL_OPTIONS = ("CONFIG_DMABUF_MOVE_NOTIFY=y", "CONFIG_PCI_P2PDMA=y")
FORCE_GDR = "RCCL_FORCE_ENABLE_GDRDMA"
PEERMEM_LABEL = "peer memory (amdkfd)"


# The NCCL release the modelled RCCL forks (makefiles/version.mk): its topology rules apply.
RCCL_NCCL_BASE = (2, 21, 5)


@dataclasses.dataclass(frozen=True)
class RcclRules(NcclRules):
    """RCCL's memory rules; its topology follows the NCCL it forks (:data:`RCCL_NCCL_BASE`),
    less the send-side NVLink rule its HIP build compiles out (``src/graph/paths.cc``
    ncclTopoCheckGdr: the pre-Ampere block sits under ``#if !__HIP_PLATFORM_AMD__``)."""

    version: tuple[int, int, int] | None = RCCL_NCCL_BASE
    library = "RCCL"
    gdr_read_needs_nvlink = False

    @property
    def name(self) -> str:
        return "RCCL"

    @property
    def described(self) -> str:
        return f"RCCL (ROCm/rccl's GDR rules, on NCCL {'.'.join(map(str, self.effective))}'s topology)"

    @property
    def peermem_files(self) -> tuple[str, ...]:
        return MEMORY_PEERS_FILES

    @property
    def dmabuf(self) -> bool:
        return True

    @property
    def dmabuf_needs_nic(self) -> bool:
        return True


@dataclasses.dataclass(frozen=True)
class RcclFacts:
    """What RCCL reads of an AMD node, as the doctor read it."""

    memory_peers_file: str | None       # the first of MEMORY_PEERS_FILES that exists
    kallsyms_symbol: bool | None        # None: /proc/kallsyms could not be read
    bios_version: str | None
    numa_balancing: str | None
    hsa_dmabuf: bool | None             # HSA_AMD_SYSTEM_INFO_DMABUF_SUPPORTED; None: not asked
    hsa_export: bool | None             # hsa_amd_portable_export_dmabuf exported; None: not asked
    kernel_config_file: str             # /boot/config-<release>
    kernel_options: tuple[str, ...] | None   # KERNEL_OPTIONS found there; None: no such file
    proc_config_options: tuple[str, ...] | None = None   # in /proc/config.gz, which RCCL ignores
    cmdline: str = ""
    kernel_version_line: str = ""       # /proc/version

    @property
    def hyper_v(self) -> bool:
        return (self.bios_version or "").startswith(HYPER_V_BIOS)

    def peer_memory(self, environ: Mapping[str, str]) -> tuple[str | None, str]:
        """(what says RCCL has peer memory, or None; why), as ncclIbGdrSupport decides."""
        if int_param(environ, FORCE_GDR, -1) == 1:
            return f"{FORCE_GDR}=1", f"{FORCE_GDR}=1 turns peer memory on without checking"
        found = self.memory_peers_file
        if self.hyper_v:
            relaxed = int_param(environ, "NCCL_IB_PCI_RELAXED_ORDERING", 2)
            if self.numa_balancing == "1" and relaxed == 0:
                return None, (f"on Hyper-V ({BIOS_VERSION}: {self.bios_version}) RCCL turns peer "
                              f"memory off where {NUMA_BALANCING} is 1 and "
                              "NCCL_IB_PCI_RELAXED_ORDERING=0")
            if found is None:
                return None, ("none of " + ", ".join(MEMORY_PEERS_FILES) + " exists, and on "
                              f"Hyper-V RCCL does not look in {KALLSYMS}")
            return found, f"{found} exists"
        if found is not None:
            return found, f"{found} exists"
        if self.kallsyms_symbol:
            where = f"{KALLSYMS}: {PEER_MEMORY_SYMBOL}"
            return where, f"{where} (the kernel's peer-memory API)"
        symbol = ("could not be read" if self.kallsyms_symbol is None
                  else f"has no {PEER_MEMORY_SYMBOL}")
        return None, ("none of " + ", ".join(MEMORY_PEERS_FILES) + f" exists and {KALLSYMS} "
                      f"{symbol} (amdkfd's PeerDirect needs a peer-memory module: "
                      "RCCL logs \"GDRDMA not enabled\")")

    def gpu_half(self) -> Half:
        """rocmwrap.cc's DMA-BUF checks after NCCL_DMABUF_ENABLE, in its order: HSA's
        attribute, its export function, then the kernel's configuration."""
        if self.hsa_dmabuf is False:
            return Half(False, "HSA_AMD_SYSTEM_INFO_DMABUF_SUPPORTED is false (this ROCm "
                               "cannot export DMA-BUF)")
        if self.hsa_export is False:
            return Half(False, "libhsa-runtime64 has no hsa_amd_portable_export_dmabuf")
        if self.kernel_options is None:
            return Half(False, self._no_config())
        missing = [option for option in KERNEL_OPTIONS if option not in self.kernel_options]
        if missing:
            return Half(False, f"{self.kernel_config_file} lacks {' and '.join(missing)}")
        kernel = f"{self.kernel_config_file} has {' and '.join(KERNEL_OPTIONS)}"
        if self.hsa_dmabuf is None:
            return Half(True, f"{kernel}; HSA's DMA-BUF support not asked (no ROCm runtime "
                              "facts), assumed", inferred=True)
        return Half(True, f"HSA_AMD_SYSTEM_INFO_DMABUF_SUPPORTED is true; {kernel}")

    def _no_config(self) -> str:
        absent = f"{self.kernel_config_file} does not exist (RCCL reads only that file)"
        if self.proc_config_options is None:
            return absent
        has = " and ".join(self.proc_config_options) or "neither option"
        return f"{absent}; /proc/config.gz has {has}, which RCCL does not read"

    def warnings(self, environ: Mapping[str, str]) -> list[str]:
        """What RCCL warns of at init (ncclInit); they change no decision."""
        found = []
        if self.numa_balancing == "1":
            found.append(f"{NUMA_BALANCING} is 1: RCCL warns of variable performance "
                         "(sysctl kernel.numa_balancing=0)")
        if self.hyper_v or "cray" in self.kernel_version_line:
            return found
        if "iommu=pt" not in self.cmdline.split():
            found.append("no iommu=pt on /proc/cmdline: RCCL warns of instability or hangs")
        if environ.get("HSA_FORCE_FINE_GRAIN_PCIE") != "1":
            found.append("HSA_FORCE_FINE_GRAIN_PCIE is not 1: RCCL warns of low performance, "
                         "instability or hangs")
        return found

    def paths_under(self, paths: MemoryPaths, environ: Mapping[str, str]) -> MemoryPaths:
        """The node's memory paths with RCCL's environment read from ``environ``."""
        found, why = self.peer_memory(environ)
        enabled = int_param(environ, "NCCL_DMABUF_ENABLE", 0) != 0
        raw = environ.get("NCCL_DMABUF_ENABLE")
        half = self.gpu_half()
        return dataclasses.replace(
            paths, peermem_file=found, dmabuf_enabled=enabled, dmabuf_enable_raw=raw,
            gpu_halves={gpu: half for gpu in paths.gpus if gpu != "any GPU"},
            default_gpu_half=half, peermem_label=PEERMEM_LABEL,
            no_peermem_reason=why if found is None else "",
            dmabuf_off_reason="" if raw is not None else (
                "NCCL_DMABUF_ENABLE is not set and RCCL's default is 0 (it logs \"Dmabuf "
                "feature disabled without NCCL_DMABUF_ENABLE=1\")"),
            notes=tuple(self.warnings(environ)))
