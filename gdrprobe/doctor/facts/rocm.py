"""What the doctor reads of a ROCm node (the ROCm runtime's collector,
:mod:`gdrprobe.doctor.facts.runtimes`): the GPUs amdkfd lists and the ones the PCI bus holds
that it lost, RCCL as the collective library, and what RCCL reads (:mod:`gdrprobe.nccl.rccl`
has its rules), read through the doctor's :class:`~gdrprobe.sysroot.SysRoot` so that a
capture copies it: amdkfd's GPUs and their PCI bus ids, the peer-memory files, the BIOS
version and numa_balancing, the kernel's configuration, /proc/cmdline and /proc/version.

Two facts are not files a capture can copy, and are stored with it instead
(``CAPTURE_DIR/rocm.json``): whether /proc/kallsyms has RCCL's peer-memory symbol (the file
is tens of MiB) and what HSA says of DMA-BUF (a live call into libhsa-runtime64).
"""

from __future__ import annotations

import ctypes
import gzip
import zlib
import dataclasses
from typing import TYPE_CHECKING, Any

from gdrprobe.doctor.facts import CAPTURE_DIR, pci
from gdrprobe.doctor.facts.nccl_library import RCCL
from gdrprobe.errors import GpuUnusable
from gdrprobe.numbers import decimal
from gdrprobe.nccl.rccl import (BIOS_VERSION, DMABUF_SYMBOLS, KALLSYMS, KERNEL_CONFIG_FILES,
                                KERNEL_OPTIONS, MEMORY_PEERS_DIRS, MEMORY_PEERS_FILES,
                                NUMA_BALANCING, PEER_MEMORY_SYMBOL, RcclFacts, hsa_library)
from gdrprobe.sysroot import SysRoot

if TYPE_CHECKING:
    from gdrprobe.doctor.facts.context import DoctorContext
    from gdrprobe.nccl.gdr_support import MemoryPaths

COLLECTIVE = RCCL
FACTS_FILE = CAPTURE_DIR + "/rocm.json"
KFD_NODES = "/sys/class/kfd/kfd/topology/nodes"
PROC_CONFIG = "/proc/config.gz"
CONFIG_BYTES = 1 << 20
# HSA_AMD_SYSTEM_INFO_DMABUF_SUPPORTED, the value rocmwrap.cc passes to hsa_system_get_info.
HSA_DMABUF_SUPPORTED = 0x204


def node_properties(root: SysRoot, node: str) -> dict[str, int]:
    """A kfd topology node's ``name value`` lines (libhsakmt topology.c
    topology_sysfs_get_node_props reads them the same way)."""
    found = {}
    for line in (root.read(f"{KFD_NODES}/{node}/properties") or "").splitlines():
        name, _, value = line.partition(" ")
        number = decimal(value.strip())
        if number is not None:
            found[name] = number
    return found


def kfd_gpus(root: SysRoot) -> tuple[str, ...]:
    """The PCI bus ids of amdkfd's GPU nodes (a node with SIMDs: libhsakmt treats one with
    ``simd_count`` 0 as a CPU), from ``domain`` and ``location_id`` (bus << 8 | device << 3
    | function, as HSA's BDF id encodes it)."""
    found = []
    for node in sorted(root.listdir(KFD_NODES), key=lambda name: (len(name), name)):
        props = node_properties(root, node)
        if not props.get("simd_count"):
            continue
        location = props.get("location_id", 0)
        found.append(f"{props.get('domain', 0):04x}:{location >> 8 & 0xFF:02x}:"
                     f"{location >> 3 & 0x1F:02x}.{location & 0x7}")
    return tuple(found)


def kernel_options(text: str | None) -> tuple[str, ...] | None:
    """Which of RCCL's two options the configuration has (as strstr finds them); None for
    no configuration."""
    if text is None:
        return None
    return tuple(option for option in KERNEL_OPTIONS if option in text)


def proc_config(root: SysRoot) -> str | None:
    raw = root.read_bytes(PROC_CONFIG, CONFIG_BYTES)
    if raw is None:
        return None
    try:
        return gzip.decompress(raw).decode("utf-8", "replace")
    except (OSError, EOFError, zlib.error):
        return None


def read_kallsyms(root: SysRoot) -> dict[str, Any] | None:
    """What RCCL looks for in /proc/kallsyms, read a line at a time as RCCL does: its
    peer-memory symbol as a text symbol (``t`` or ``T``), and, from ROCm 7.11, the DMA-BUF
    symbols anywhere in a line; None when it cannot be read."""
    wanted = (f" t {PEER_MEMORY_SYMBOL}".encode(), f" T {PEER_MEMORY_SYMBOL}".encode())
    dmabuf = {symbol: symbol.encode() for symbol in DMABUF_SYMBOLS}
    symbol, found = False, set()
    try:
        with root.open(KALLSYMS) as lines:
            for line in lines:
                symbol = symbol or any(word in line for word in wanted)
                found.update(name for name, word in dmabuf.items() if word in line)
    except OSError:
        return None
    return {"kallsyms_symbol": symbol, "kallsyms_dmabuf": sorted(found)}


def has_peer_memory_symbol(root: SysRoot) -> bool | None:
    """Whether /proc/kallsyms lists RCCL's peer-memory symbol; None when it cannot be read."""
    read = read_kallsyms(root)
    return None if read is None else read["kallsyms_symbol"]


def collect_rocm_facts(root: SysRoot, environ) -> dict[str, Any]:
    """The live facts a capture stores: the kallsyms answers and HSA's word on DMA-BUF."""
    kallsyms = read_kallsyms(root) or {"kallsyms_symbol": None, "kallsyms_dmabuf": None}
    return {**kallsyms, "hsa": collect_hsa_facts(environ)}


def peer_clients(root: SysRoot) -> tuple[str, ...]:
    """Every peer-memory client's version file, as ROCm 7.14's RCCL scans: the first of
    the memory_peers directories with a client, any subdirectory holding ``version``."""
    for base in MEMORY_PEERS_DIRS:
        found = tuple(f"{base}/{name}/version" for name in sorted(root.listdir(base))
                      if not name.startswith(".") and root.exists(f"{base}/{name}/version"))
        if found:
            return found
    return ()


def kernel_configs(root: SysRoot, release: str | None) -> tuple[tuple[str, tuple[str, ...] | None], ...]:
    """RCCL's kernel configuration files from ROCm 7.11 in its order, each with the options
    found (None: it does not open)."""
    read = []
    for pattern in KERNEL_CONFIG_FILES:
        path = pattern.replace("%s", release or "")
        if path == "/proc/config.gz":
            read.append((path, kernel_options(proc_config(root))))
            continue
        raw = root.read_bytes(path, CONFIG_BYTES)
        read.append((path, kernel_options(None if raw is None else raw.decode("utf-8", "replace"))))
    return tuple(read)


def collect_hsa_facts(environ) -> dict[str, Any]:
    """HSA_AMD_SYSTEM_INFO_DMABUF_SUPPORTED and whether hsa_amd_portable_export_dmabuf is
    exported, asked of the libhsa-runtime64 RCCL loads (rocmwrap.cc initOnceFunc), or
    ``{"error": why}``."""
    path = hsa_library(environ)
    try:
        library = ctypes.CDLL(path)
    except OSError as error:
        return {"error": f"dlopen({path}): {error}"}
    export = hasattr(library, "hsa_amd_portable_export_dmabuf")
    status = library.hsa_init()
    if status != 0:
        return {"error": f"hsa_init() returned {status:#x}", "export_symbol": export}
    try:
        flag = ctypes.c_bool(False)
        status = library.hsa_system_get_info(HSA_DMABUF_SUPPORTED, ctypes.byref(flag))
    finally:
        library.hsa_shut_down()
    return {"dmabuf_supported": status == 0 and flag.value, "export_symbol": export}


def read_rccl_facts(root: SysRoot, release: str | None, live: dict[str, Any] | None) -> RcclFacts:
    """Everything RCCL reads, ``live`` being :func:`collect_rocm_facts`' answer (captured on
    a replay; None where it was not stored: kallsyms is then read under the root)."""
    live = live or {}
    hsa = live.get("hsa") or {}
    config_file = f"/boot/config-{release or ''}"
    kernel_config = root.read_bytes(config_file, CONFIG_BYTES)
    kallsyms = live if "kallsyms_symbol" in live else (read_kallsyms(root) or {"kallsyms_symbol": None})
    dmabuf_symbols = kallsyms.get("kallsyms_dmabuf")
    return RcclFacts(
        memory_peers_file=next((path for path in MEMORY_PEERS_FILES if root.exists(path)), None),
        kallsyms_symbol=kallsyms["kallsyms_symbol"],
        bios_version=root.read(BIOS_VERSION),
        numa_balancing=root.read(NUMA_BALANCING),
        hsa_dmabuf=hsa.get("dmabuf_supported"), hsa_export=hsa.get("export_symbol"),
        kernel_config_file=config_file,
        kernel_options=kernel_options(None if kernel_config is None
                                      else kernel_config.decode("utf-8", "replace")),
        proc_config_options=kernel_options(proc_config(root)),
        cmdline=root.read("/proc/cmdline") or "",
        kernel_version_line=root.read("/proc/version") or "",
        peer_clients=peer_clients(root), kernel_configs=kernel_configs(root, release),
        kallsyms_dmabuf=None if dmabuf_symbols is None else tuple(dmabuf_symbols))


# ---- the collector's questions (gdrprobe.doctor.facts.runtimes.Collector) ----------------


def collect(ctx: DoctorContext) -> dict[str, Any]:
    return collect_rocm_facts(ctx.root, ctx.environ)


def listed_gpus(root: SysRoot, runtime: Any) -> tuple[str, ...]:
    """amdkfd's GPUs: what RCCL (through HSA, which reads amdkfd's topology) can use."""
    return kfd_gpus(root)


LOST_GPU_FIX = ("check dmesg for amdgpu errors (a failed probe, 'GPU reset', a GPU fallen off "
                "the bus) and 'rocm-smi' for the GPUs it still lists; reload amdgpu (modprobe "
                "amdgpu) or reboot; where amdgpu is not installed, install the amdgpu driver; "
                "have a GPU that keeps falling off replaced")


def gpus_for_amdgpu(ctx: DoctorContext) -> tuple[str, ...]:
    """The AMD GPU functions on the PCI bus amdkfd should list: not handed to a virtual
    machine. amdkfd's topology is the host's in a container too (sysfs is not namespaced),
    and no visible-devices variable changes it, so it is compared wherever it is read."""
    return tuple(bdf for bdf in ctx.runtime.bus_gpus(ctx.root) if not pci.passed_through(ctx.root, bdf))


def lost_gpus(ctx: DoctorContext) -> GpuUnusable | None:
    """The node fault where amdkfd lists fewer of the AMD GPUs the PCI bus holds: amdgpu
    failed (no kfd node at all) or a GPU fell off the bus. As CUDA's lost GPUs
    (:func:`gdrprobe.doctor.facts.cuda.lost_gpus`): a job started here meets it."""
    expected = gpus_for_amdgpu(ctx)
    listed = set(kfd_gpus(ctx.root))
    missing = [bdf for bdf in expected if bdf not in listed]
    if not missing:
        return None
    driver = ", ".join(f"{bdf}: {pci.bound_driver(ctx.root, bdf) or 'no driver bound'}"
                       for bdf in missing)
    return GpuUnusable(
        f"amdkfd lists {len(expected) - len(missing)} of the {len(expected)} AMD GPUs on the "
        f"PCI bus: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} lost to ROCm "
        "(amdgpu failed on it, or it fell off the bus); every ROCm process here meets it",
        LOST_GPU_FIX,
        evidence=f"PCI bus: {len(expected)} AMD GPU(s) ({', '.join(expected)}); {KFD_NODES}: "
                 f"{', '.join(sorted(listed)) or 'no GPU node'}; drivers bound: {driver}")


def memory_paths(ctx: DoctorContext, paths: MemoryPaths) -> MemoryPaths:
    """RCCL's registration rules (:mod:`gdrprobe.nccl.rccl`) over the node's memory paths,
    by the release of the RCCL the job loads."""
    facts = read_rccl_facts(ctx.root, ctx.kernel_release, ctx.gpu_facts)
    return dataclasses.replace(paths, rccl=facts).under(ctx.environ)
