"""What RCCL reads of an AMD node (:mod:`gdrprobe.nccl.rccl` has its rules), read through the
doctor's :class:`~gdrprobe.sysroot.SysRoot` so that a capture copies it: amdkfd's GPUs and
their PCI bus ids, the peer-memory files, the BIOS version and numa_balancing, the kernel's
configuration, /proc/cmdline and /proc/version.

Two facts are not files a capture can copy, and are stored with it instead
(``CAPTURE_DIR/rocm.json``): whether /proc/kallsyms has RCCL's peer-memory symbol (the file
is tens of MiB) and what HSA says of DMA-BUF (a live call into libhsa-runtime64).
"""

from __future__ import annotations

import ctypes
import gzip
import zlib
from typing import Any

from gdrprobe.nccl.rccl import (BIOS_VERSION, KALLSYMS, KERNEL_OPTIONS, MEMORY_PEERS_FILES,
                                NUMA_BALANCING, PEER_MEMORY_SYMBOL, RcclFacts)
from gdrprobe.sysroot import SysRoot

KFD_NODES = "/sys/class/kfd/kfd/topology/nodes"
PROC_CONFIG = "/proc/config.gz"
CONFIG_BYTES = 1 << 20
# HSA_AMD_SYSTEM_INFO_DMABUF_SUPPORTED, the value rocmwrap.cc passes to hsa_system_get_info.
HSA_DMABUF_SUPPORTED = 0x204
HSA_LIBRARY = "libhsa-runtime64.so"   # RCCL dlopens it by this name, after RCCL_ROCR_PATH


def node_properties(root: SysRoot, node: str) -> dict[str, int]:
    """A kfd topology node's ``name value`` lines (libhsakmt topology.c
    topology_sysfs_get_node_props reads them the same way)."""
    found = {}
    for line in (root.read(f"{KFD_NODES}/{node}/properties") or "").splitlines():
        name, _, value = line.partition(" ")
        if value.strip().isdigit():
            found[name] = int(value)
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


def has_peer_memory_symbol(root: SysRoot) -> bool | None:
    """Whether /proc/kallsyms lists RCCL's symbol as a text symbol (``t`` or ``T``), read a
    line at a time as RCCL does; None when it cannot be read."""
    wanted = (f" t {PEER_MEMORY_SYMBOL}".encode(), f" T {PEER_MEMORY_SYMBOL}".encode())
    try:
        with root.open(KALLSYMS) as lines:
            return any(any(word in line for word in wanted) for line in lines)
    except OSError:
        return None


def collect_rocm_facts(root: SysRoot, environ) -> dict[str, Any]:
    """The live facts a capture stores: the kallsyms answer and HSA's word on DMA-BUF."""
    return {"kallsyms_symbol": has_peer_memory_symbol(root), "hsa": collect_hsa_facts(environ)}


def collect_hsa_facts(environ) -> dict[str, Any]:
    """HSA_AMD_SYSTEM_INFO_DMABUF_SUPPORTED and whether hsa_amd_portable_export_dmabuf is
    exported, asked of the libhsa-runtime64 RCCL loads (rocmwrap.cc initOnceFunc), or
    ``{"error": why}``."""
    path = environ.get("RCCL_ROCR_PATH", "") + HSA_LIBRARY
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
    symbol = live["kallsyms_symbol"] if "kallsyms_symbol" in live else has_peer_memory_symbol(root)
    return RcclFacts(
        memory_peers_file=next((path for path in MEMORY_PEERS_FILES if root.exists(path)), None),
        kallsyms_symbol=symbol,
        bios_version=root.read(BIOS_VERSION),
        numa_balancing=root.read(NUMA_BALANCING),
        hsa_dmabuf=hsa.get("dmabuf_supported"), hsa_export=hsa.get("export_symbol"),
        kernel_config_file=config_file,
        kernel_options=kernel_options(None if kernel_config is None
                                      else kernel_config.decode("utf-8", "replace")),
        proc_config_options=kernel_options(proc_config(root)),
        cmdline=root.read("/proc/cmdline") or "",
        kernel_version_line=root.read("/proc/version") or "")
