"""Can RCCL register GPU memory with a NIC on an AMD node, and through what: RCCL's own rules,
keyed to the ROCm release the job's RCCL belongs to, over the facts the doctor reads
(:mod:`gdrprobe.doctor.facts.rocm`), as a :class:`~gdrprobe.nccl.gdr_support.MemoryPaths` the
per-GPU decision (:mod:`gdrprobe.nccl.decision`) reads as it reads NCCL's.

Sources: ROCm/rccl at 0cbce2a7 (rocm-test-09212024-66, the 6.3 line; the rocm-6.x tags read
the same) for ROCm 6.x; ROCm/rccl's ``src/misc/rocmwrap.cc`` at cdd66a41 (the 7.0 line) and
ROCm/rocm-systems ``projects/rccl`` (``src/misc/rocmwrap.cc`` at 018c383d,
``src/transport/net_ib/gdr.cc`` at 0d92d17d, ``src/misc/gdr_peermem.cc``,
``src/misc/gdr_probe.cc`` at 151b49bc) for 7.x, with the release each change shipped in
from RCCL's ``CHANGELOG.md`` (quoted at each constant below).

- peer memory (``ncclIbGdrSupport``): ``RCCL_FORCE_ENABLE_GDRDMA=1`` says yes and skips
  every check. Before ROCm 7.14, the first of ``/sys/kernel/mm/memory_peers/amdkfd/version``,
  ``/sys/kernel/memory_peers/amdkfd/version`` and ``/sys/memory_peers/amdkfd/version`` that
  exists says yes; on a Hyper-V guest (``bios_version`` starts with "Hyper-V UEFI Release"),
  ``numa_balancing`` = 1 with ``NCCL_IB_PCI_RELAXED_ORDERING`` = 0 says no and /proc/kallsyms
  is never read; elsewhere, with no file found, a ``t`` or ``T``
  ``ib_register_peer_memory_client`` in ``/proc/kallsyms`` says yes. From 7.14
  (``net_ib/gdr.cc`` over ``gdr_peermem.cc`` ncclIbScanPeerMemClients) any client under the
  three ``memory_peers`` directories (a subdirectory holding ``version``) says yes, whatever
  its name; the Hyper-V rule stays; with none, RCCL registers a 4 KiB hipMalloc buffer with
  the NIC (``gdr_probe.cc`` ncclIbProbeGdrSupport, ``ibv_reg_mr`` or, with relaxed ordering,
  ``ibv_reg_mr_iova2``) and believes that: a registration the doctor cannot make, so the
  answer is inferred and the A/B, which registers the same way, measures it.
- DMA-BUF on the GPU (``rocmwrap.cc`` initOnceFunc): ``NCCL_DMABUF_ENABLE`` not 0 (default 0
  before ROCm 7.12, 1 from it; from 7.12 ``NCCL_CUMEM_ENABLE`` > 0 turns it on as well),
  HSA's ``HSA_AMD_SYSTEM_INFO_DMABUF_SUPPORTED`` (0x204) true,
  ``hsa_amd_portable_export_dmabuf`` in libhsa-runtime64, and the kernel's configuration
  with both ``CONFIG_DMABUF_MOVE_NOTIFY=y`` and ``CONFIG_PCI_P2PDMA=y``: before 7.11 only
  ``/boot/config-<uname -r>``; from 7.11 the first of :data:`KERNEL_CONFIG_FILES` that opens
  decides, and where none does, ``dma_buf_move_notify`` and ``pci_p2pdma`` in /proc/kallsyms.
  From 7.1 ``RCCL_FORCE_ENABLE_DMABUF=1`` skips the variable and the kernel's configuration
  (HSA is still asked).
- DMA-BUF on the NIC and how the two combine: as NCCL (``ibv_reg_dmabuf_mr(fd=-1)`` probe,
  ``src/graph/topo.cc`` gdrSupport, ``src/transport/net.cc`` useDmaBuf with the NIC's
  ``NCCL_PTR_DMABUF``), so :class:`RcclRules` asks the NIC. Which one RCCL registers with
  where both hold: DMA-BUF before 7.12, as NCCL; peer memory from 7.12, and DMA-BUF alone
  with ``RCCL_FORCE_ENABLE_DMABUF=1``.
- warnings RCCL prints at init (``src/init.cc`` ncclInit): ``numa_balancing`` = 1; outside
  Hyper-V and Cray kernels, no ``iommu=pt`` on ``/proc/cmdline`` and
  ``HSA_FORCE_FINE_GRAIN_PCIE`` not 1. They decide nothing; the doctor shows them.

The release comes from the library's file name (ROCm's package installs
``librccl.so.1.0.<ROCm as MMmmpp>``: ``rocm_set_soversion``), else from RCCL's own version
(the ROCm releases that shipped it, :data:`ROCM_OF_RCCL`); unknown is the newest modelled.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from collections.abc import Mapping

from gdrprobe.nccl import params
from gdrprobe.nccl.gdr_support import Half, MemoryPaths
from gdrprobe.nccl.versions import NcclRules

Release = tuple[int, int, int]

MEMORY_PEERS_DIRS = ("/sys/kernel/mm/memory_peers", "/sys/kernel/memory_peers", "/sys/memory_peers")
MEMORY_PEERS_FILES = tuple(f"{base}/amdkfd/version" for base in MEMORY_PEERS_DIRS)
KALLSYMS = "/proc/kallsyms"
PEER_MEMORY_SYMBOL = "ib_register_peer_memory_client"
DMABUF_SYMBOLS = ("dma_buf_move_notify", "pci_p2pdma")      # rocmwrap.cc's kallsyms fallback
BIOS_VERSION = "/sys/devices/virtual/dmi/id/bios_version"
HYPER_V_BIOS = "Hyper-V UEFI Release"
NUMA_BALANCING = "/proc/sys/kernel/numa_balancing"
KERNEL_OPTIONS = ("CONFIG_DMABUF_MOVE_NOTIFY=y", "CONFIG_PCI_P2PDMA=y")
# rocmwrap.cc's possiblePaths from 7.11, in its order ("%s": uname's release); /proc/config.gz
# through zcat, skipped where it does not exist.
KERNEL_CONFIG_FILES = ("/proc/config.gz", "/boot/config-%s", "/usr/src/linux-%s/.config",
                       "/usr/src/linux/.config", "/usr/lib/modules/%s/config",
                       "/usr/lib/ostree-boot/config-%s", "/usr/lib/kernel/config-%s",
                       "/usr/src/linux-headers-%s/.config", "/lib/modules/%s/build/.config")
FORCE_GDR = params.RCCL_FORCE_ENABLE_GDRDMA.name
FORCE_DMABUF = params.RCCL_FORCE_ENABLE_DMABUF.name
PEERMEM_LABEL = "peer memory (amdkfd)"
HSA_LIBRARY = "libhsa-runtime64.so"   # RCCL dlopens it by this name, after RCCL_ROCR_PATH
PATH_MAX_CHARS = 1023                 # rocmwrap.cc: snprintf(path, 1024, ...)
PROBE = "RCCL's registration probe (ibv_reg_mr of 4 KiB of hipMalloc memory)"

# CHANGELOG "RCCL 2.27.7 for ROCm 7.1.0": "Added RCCL_FORCE_ENABLE_DMABUF ... forego
# system/kernel checks".
FORCE_DMABUF_SINCE: Release = (7, 1, 0)
# "RCCL 2.28.3 for ROCm 7.11": "support for additional paths when loading the RCCL DMABUF
# kernel configuration file".
CONFIG_PATHS_SINCE: Release = (7, 11, 0)
# "RCCL 2.28.3 for ROCm 7.12": "NCCL_DMABUF_ENABLE now defaults to 1 (previously 0). When
# both peermem and DMAbuf are available, RCCL will use peermem."
DMABUF_DEFAULT_SINCE: Release = params.DMABUF_ENABLE.first_with(1, params.RCCL)
# "RCCL 2.30.4 for ROCm 7.14": "Swapped legacy net_ib with the net_ib implementation from
# NCCL 2.29", whose gdr.cc scans for any peer-memory client and probes where none is.
ANY_PEER_CLIENT_SINCE: Release = (7, 14, 0)
MODELLED_ROCM: Release = (7, 14, 0)

# RCCL's version (the NCCL it follows) -> the newest ROCm release that shipped it
# (CHANGELOG.md); a version between two is taken as the older one's.
ROCM_OF_RCCL: dict[Release, Release] = {
    (2, 18, 3): (6, 0, 0), (2, 18, 6): (6, 1, 0), (2, 20, 5): (6, 2, 1), (2, 21, 5): (6, 3, 1),
    (2, 22, 3): (6, 4, 2), (2, 26, 6): (7, 0, 0), (2, 27, 7): (7, 2, 0), (2, 28, 3): (7, 13, 0),
    (2, 30, 4): (7, 14, 0)}

# The NCCL release the modelled 6.3 RCCL forks (makefiles/version.mk): its topology rules
# apply where the library's version is unknown.
RCCL_NCCL_BASE = (2, 21, 5)
_ROCM_SUFFIX = re.compile(r"librccl\.so\.\d+\.\d+\.(\d{5,})$")


def hsa_library(environ: Mapping[str, str]) -> str:
    """The path RCCL dlopens HSA by (src/misc/rocmwrap.cc initOnceFunc): RCCL_ROCR_PATH, as a
    prefix, then the library's name, cut where snprintf cuts it."""
    return ((params.RCCL_ROCR_PATH.raw(environ) or "") + HSA_LIBRARY)[:PATH_MAX_CHARS]


def dotted(release: Release) -> str:
    return ".".join(map(str, release))


def rocm_from_file_name(path: str | None) -> Release | None:
    """The ROCm release in ROCm's file name for the library (librccl.so.1.0.71200: 7.12.0)."""
    found = _ROCM_SUFFIX.search(posixpath.basename(path or ""))
    if not found:
        return None
    number = int(found.group(1))
    return (number // 10000, number // 100 % 100, number % 100)


def rocm_of_rccl(version: Release | None) -> Release | None:
    """The ROCm release of an RCCL version, by :data:`ROCM_OF_RCCL`; None where unknown."""
    if version is None:
        return None
    known = [rccl for rccl in ROCM_OF_RCCL if rccl <= version]
    return ROCM_OF_RCCL[max(known)] if known else (6, 0, 0)


def rccl_rules(version: Release | None, path: str | None = None) -> RcclRules:
    """RCCL's rules for the job's library: its version (None: the modelled fork's) and the
    ROCm release its file name or version states."""
    named = rocm_from_file_name(path)
    rocm, source = ((named, "its file name") if named else
                    (rocm_of_rccl(version), f"RCCL {dotted(version)}'s" if version else ""))
    return RcclRules(version or RCCL_NCCL_BASE, rocm=rocm, rocm_source=source)


@dataclasses.dataclass(frozen=True)
class RcclRules(NcclRules):
    """RCCL's memory rules by ROCm release (``rocm``; None: unknown, the newest modelled);
    its topology follows the NCCL it forks, less the send-side NVLink rule its HIP build
    compiles out (``src/graph/paths.cc`` ncclTopoCheckGdr: the pre-Ampere block sits under
    ``#if !__HIP_PLATFORM_AMD__``)."""

    version: tuple[int, int, int] | None = RCCL_NCCL_BASE
    rocm: Release | None = None
    rocm_source: str = ""
    library = "RCCL"
    gdr_read_needs_nvlink = False

    @property
    def release(self) -> Release:
        return self.rocm or MODELLED_ROCM

    def rocm_since(self, release: Release) -> bool:
        return self.release >= release

    @property
    def name(self) -> str:
        return "RCCL"

    @property
    def described(self) -> str:
        rocm = (f"of ROCm {dotted(self.rocm)} (by {self.rocm_source})" if self.rocm
                else f"of an unknown ROCm: {dotted(MODELLED_ROCM)}'s")
        return (f"RCCL {rocm} (ROCm/rccl's GDR rules, on NCCL "
                f"{'.'.join(map(str, self.effective))}'s topology)")

    @property
    def peermem_files(self) -> tuple[str, ...]:
        if self.rocm_since(ANY_PEER_CLIENT_SINCE):
            return tuple(f"{base}/<any client>/version" for base in MEMORY_PEERS_DIRS)
        return MEMORY_PEERS_FILES

    @property
    def dmabuf(self) -> bool:
        return True

    @property
    def dmabuf_needs_nic(self) -> bool:
        return True

    @property
    def prefers_peermem(self) -> bool:
        return self.rocm_since(DMABUF_DEFAULT_SINCE)

    @property
    def dmabuf_default(self) -> int:
        return int(params.DMABUF_ENABLE.default(self.effective, params.RCCL, self.release))


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
    proc_config_options: tuple[str, ...] | None = None   # in /proc/config.gz
    cmdline: str = ""
    kernel_version_line: str = ""       # /proc/version
    # every memory_peers client's version file, in RCCL's order (7.14's scan)
    peer_clients: tuple[str, ...] = ()
    # KERNEL_CONFIG_FILES as read: (path, options found, or None where it does not open)
    kernel_configs: tuple[tuple[str, tuple[str, ...] | None], ...] = ()
    kallsyms_dmabuf: tuple[str, ...] | None = None   # DMABUF_SYMBOLS in /proc/kallsyms

    @property
    def hyper_v(self) -> bool:
        return (self.bios_version or "").startswith(HYPER_V_BIOS)

    def peer_memory(self, environ: Mapping[str, str],
                    rules: RcclRules = RcclRules()) -> tuple[str | None, str]:
        """(what says RCCL has peer memory, or None; why), as ncclIbGdrSupport decides."""
        if params.RCCL_FORCE_ENABLE_GDRDMA.number(environ, rules) == 1:
            return f"{FORCE_GDR}=1", f"{FORCE_GDR}=1 turns peer memory on without checking"
        if rules.rocm_since(FORCE_DMABUF_SINCE) and rules.prefers_peermem \
                and params.RCCL_FORCE_ENABLE_DMABUF.number(environ, rules):
            return None, f"{FORCE_DMABUF}=1: RCCL uses DMA-BUF alone, never peer memory"
        scan = rules.rocm_since(ANY_PEER_CLIENT_SINCE)
        found = (self.peer_clients[0] if self.peer_clients else None) if scan else self.memory_peers_file
        if self.hyper_v:
            relaxed = params.IB_PCI_RELAXED_ORDERING.number(environ, rules)
            if self.numa_balancing == "1" and relaxed == 0:
                return None, (f"on Hyper-V ({BIOS_VERSION}: {self.bios_version}) RCCL turns peer "
                              f"memory off where {NUMA_BALANCING} is 1 and "
                              "NCCL_IB_PCI_RELAXED_ORDERING=0")
        if found is not None:
            return found, f"{found} exists" + (" (RCCL takes any peer-memory client)" if scan else "")
        if scan:
            return PROBE, (f"no peer-memory client under {', '.join(MEMORY_PEERS_DIRS)}: RCCL "
                           "registers GPU memory with the NIC to find out (gdr_probe.cc), which "
                           "the doctor cannot; inferred, and the A/B registers the same way")
        if self.hyper_v:
            return None, ("none of " + ", ".join(MEMORY_PEERS_FILES) + " exists, and on "
                          f"Hyper-V RCCL does not look in {KALLSYMS}")
        if self.kallsyms_symbol:
            where = f"{KALLSYMS}: {PEER_MEMORY_SYMBOL}"
            return where, f"{where} (the kernel's peer-memory API)"
        symbol = ("could not be read" if self.kallsyms_symbol is None
                  else f"has no {PEER_MEMORY_SYMBOL}")
        return None, ("none of " + ", ".join(MEMORY_PEERS_FILES) + f" exists and {KALLSYMS} "
                      f"{symbol} (amdkfd's PeerDirect needs a peer-memory module: "
                      "RCCL logs \"GDRDMA not enabled\")")

    def gpu_half(self, rules: RcclRules = RcclRules(), forced: bool = False) -> Half:
        """rocmwrap.cc's DMA-BUF checks after NCCL_DMABUF_ENABLE, in its order: HSA's
        attribute, its export function, then the kernel's configuration (not where
        RCCL_FORCE_ENABLE_DMABUF=1 forces it, ``forced``)."""
        if self.hsa_dmabuf is False:
            return Half(False, "HSA_AMD_SYSTEM_INFO_DMABUF_SUPPORTED is false (this ROCm "
                               "cannot export DMA-BUF)")
        if self.hsa_export is False:
            return Half(False, "libhsa-runtime64 has no hsa_amd_portable_export_dmabuf")
        kernel = (Half(True, f"{FORCE_DMABUF}=1 skips the kernel's configuration") if forced
                  else self.kernel_half(rules))
        if not kernel.supported:
            return kernel
        if self.hsa_dmabuf is None:
            return Half(True, f"{kernel.reason}; HSA's DMA-BUF support not asked (no ROCm "
                              "runtime facts), assumed", inferred=True)
        return Half(True, f"HSA_AMD_SYSTEM_INFO_DMABUF_SUPPORTED is true; {kernel.reason}",
                    inferred=kernel.inferred)

    def kernel_half(self, rules: RcclRules) -> Half:
        """The kernel's configuration as the release reads it."""
        if not rules.rocm_since(CONFIG_PATHS_SINCE):
            return self.options_half(self.kernel_config_file, self.kernel_options,
                                     self._no_config())
        for path, options in self.kernel_configs:
            if options is not None:
                return self.options_half(path, options, "")
        if self.kallsyms_dmabuf is None:
            return Half(True, "none of RCCL's kernel configuration files opens and "
                              f"{KALLSYMS} could not be read: RCCL goes on with DMA-BUF",
                        inferred=True)
        missing = [symbol for symbol in DMABUF_SYMBOLS if symbol not in self.kallsyms_dmabuf]
        if missing:
            return Half(False, "none of RCCL's kernel configuration files opens and "
                               f"{KALLSYMS} lacks {' and '.join(missing)}")
        return Half(True, f"no kernel configuration file opens; {KALLSYMS} has "
                          f"{' and '.join(DMABUF_SYMBOLS)}")

    @staticmethod
    def options_half(path: str, options: tuple[str, ...] | None, absent: str) -> Half:
        if options is None:
            return Half(False, absent or f"{path} does not exist")
        missing = [option for option in KERNEL_OPTIONS if option not in options]
        if missing:
            return Half(False, f"{path} lacks {' and '.join(missing)}")
        return Half(True, f"{path} has {' and '.join(KERNEL_OPTIONS)}")

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
        if params.HSA_FORCE_FINE_GRAIN_PCIE.raw(environ) != "1":
            found.append("HSA_FORCE_FINE_GRAIN_PCIE is not 1: RCCL warns of low performance, "
                         "instability or hangs")
        return found

    def dmabuf_switch(self, environ: Mapping[str, str], rules: RcclRules) -> tuple[bool, str, bool]:
        """(on, why when off, forced): rocmwrap.cc's switches before its checks, by release."""
        if rules.rocm_since(FORCE_DMABUF_SINCE) and params.RCCL_FORCE_ENABLE_DMABUF.number(environ, rules):
            return True, "", True
        if rules.rocm_since(DMABUF_DEFAULT_SINCE) and params.CUMEM_ENABLE.number(environ, rules) > 0:
            return True, "", False
        if params.DMABUF_ENABLE.number(environ, rules) != 0:
            return True, "", False
        if params.DMABUF_ENABLE.is_set(environ):
            return False, "", False
        return False, (f"NCCL_DMABUF_ENABLE is not set and RCCL's default is 0 before ROCm "
                       f"{dotted(DMABUF_DEFAULT_SINCE)} (it logs \"Dmabuf feature disabled "
                       "without NCCL_DMABUF_ENABLE=1\")"), False

    def paths_under(self, paths: MemoryPaths, environ: Mapping[str, str]) -> MemoryPaths:
        """The node's memory paths with RCCL's environment read from ``environ``, by the
        release of ``paths.rules``."""
        rules = paths.rules if isinstance(paths.rules, RcclRules) else RcclRules()
        found, why = self.peer_memory(environ, rules)
        enabled, off_reason, forced = self.dmabuf_switch(environ, rules)
        half = self.gpu_half(rules, forced)
        return dataclasses.replace(
            paths, peermem_file=found, dmabuf_enabled=enabled,
            dmabuf_enable_raw=params.DMABUF_ENABLE.raw(environ),
            gpu_halves={gpu: half for gpu in paths.gpus if gpu != "any GPU"},
            default_gpu_half=half, peermem_label=PEERMEM_LABEL,
            no_peermem_reason=why if found is None else "",
            dmabuf_off_reason=off_reason, notes=tuple(self.warnings(environ)))
