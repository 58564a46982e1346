"""NCCL's environment variables read as NCCL reads them, and its GDR level: one table, one
parser, used by NCCL's decision (:mod:`gdrprobe.nccl.decision`) and every doctor check that
needs them.

The rules follow NCCL 2.30.7's source (NVIDIA/nccl): the path types the GDR level compares
are :data:`gdrprobe.nccl.topo.PATH_RANK` (``src/include/graph.h``); integer variables are
read by ``ncclLoadParam`` (``src/misc/param.cc``) with ``strtoll(str, NULL, 0)``
(:mod:`gdrprobe.nccl.cparse`), so ``0x10`` is hex, ``010`` is octal (8), ``08`` is 0 and
``yes`` is 0; NCCL_NET_GDR_LEVEL is parsed by ``ncclGetLevel``
(``src/graph/paths.cc``): an exact, case-sensitive path name, else, when the first
character is a digit, ``strtol(str, NULL, 0)`` into the old levels (0..3, anything larger
SYS), else NCCL keeps its default and says nothing.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable
from collections.abc import Mapping

from gdrprobe.nccl import params
from gdrprobe.nccl.cparse import INT64_MAX, atoi, c_int, strtoll
from gdrprobe.nccl.topo import PATH_RANK

# Integers NCCL_NET_GDR_LEVEL accepted before the names existed; 4 and above mean SYS.
LEGACY_LEVELS = ("LOC", "PIX", "PXB", "PHB", "SYS")


def relaxed_ordering_wanted(environ: Mapping[str, str]) -> bool:
    """NCCL_IB_PCI_RELAXED_ORDERING (default 2): 1 and 2 ask for relaxed ordering where the
    verbs library offers it (IBVERBS_1.8), any other value turns it off (net_ib
    ncclIbRelaxedOrderingCapable: ``roMode == 1 || roMode == 2``). The one reading of it:
    :meth:`gdrprobe.nccl.versions.NcclRules.relaxed_ordering` adds the release that has it,
    and ``run``, ``check``, ``bench`` and the doctor all ask that."""
    return params.IB_PCI_RELAXED_ORDERING.number(environ) in (1, 2)


def gpu_allocation(environ: Mapping[str, str]) -> str:
    """How NCCL 2.19.1+ allocates its GPU buffers (src/misc/cudawrap.cc ncclCuMemEnable:
    ``param >= 0 ? param : (param == -2 && ncclCuMemSupported)``, default -2): a positive
    value forces the cuMem (VMM) API, -2 uses it where the driver and GPU support it
    (ncclIsCuMemSupported: CUDA driver 12.0+ and the VMM attributes), 0 and every other
    negative value (-1 too) allocate with cudaMalloc. "vmm" falls back to cuMemAlloc where
    VMM is unsupported, as NCCL's auto does (memory/cuda_vmm.py). Older releases:
    :meth:`gdrprobe.nccl.versions.NcclRules.gpu_allocation`."""
    setting = params.CUMEM_ENABLE.number(environ)
    return "vmm" if setting > 0 or setting == -2 else "malloc"


# ncclIsCuMemSupported (src/misc/cudawrap.cc): "Need CUDA_VISIBLE_DEVICES support"
VMM_MIN_DRIVER = 12000


def vmm_unsupported(driver: int, vmm_attribute: int | None) -> str | None:
    """Why ncclIsCuMemSupported says no, where it does: the CUDA driver before 12.0, or the
    GPU without CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED; NCCL_CUMEM_ENABLE's
    default (-2) then allocates with cudaMalloc. None: VMM is supported."""
    if driver < VMM_MIN_DRIVER:
        return (f"the driver is CUDA {driver // 1000}.{driver % 1000 // 10} and NCCL allocates with VMM "
                "from CUDA 12.0 on")
    if not vmm_attribute:
        return (f"the GPU does not support VMM (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED="
                f"{vmm_attribute})")
    return None


@dataclasses.dataclass(frozen=True)
class GdrLevel:
    """The threshold NCCL_NET_GDR_LEVEL sets: GDR is used up to and including ``name``."""

    name: str
    raw: str | None                # the variable's value; None when unset
    ignored: bool                  # set to something NCCL does not parse, so the default holds
    undefined: bool = False        # a number NCCL reads outside its table: ``name`` is the default, assumed
    # the release's path numbers (NcclRules.path_rank): the level is compared as a number
    rank: Mapping[str, int] = dataclasses.field(default_factory=lambda: PATH_RANK, compare=False, repr=False)

    def admits(self, nccl_class: str) -> bool:
        return self.rank[nccl_class] <= self.rank[self.name]


def default_gdr_level(environ: Mapping[str, str]) -> str:
    """NCCL's own threshold: P2C while NCCL_NET_GDR_C2C is on (its default), else PXB."""
    return "P2C" if params.NET_GDR_C2C.number(environ) else "PXB"


def gdr_level(environ: Mapping[str, str], default: str | None = None,
              rank: Mapping[str, int] | None = None) -> GdrLevel:
    """NCCL_NET_GDR_LEVEL as NCCL parses it (src/graph/paths.cc ncclGetLevel): exact names;
    else, when the first character is a digit, ``int oldLevel = strtol(str, NULL, 0)`` (the
    long truncated to a C int; an overflow saturates at LONG_MAX first), clamped at the end
    of levelsOldToNew, where a negative int indexes before the table: undefined behaviour,
    reported as such with the default assumed; else ignored. ``default``: the release's own
    (:meth:`gdrprobe.nccl.versions.NcclRules.default_gdr_level`), else 2.30.7's; ``rank``:
    the release's path numbers."""
    raw = params.NET_GDR_LEVEL.raw(environ)
    level = functools.partial(GdrLevel, raw=raw, rank=rank or PATH_RANK)
    default = default or default_gdr_level(environ)
    if raw is None:
        return level(default, ignored=False)
    if raw in PATH_RANK:
        return level(raw, ignored=False)
    if raw[:1] in "0123456789":
        number = strtoll(raw)
        number = c_int(INT64_MAX if number is None else number)
        if number < 0:
            return level(default, ignored=False, undefined=True)
        return level(LEGACY_LEVELS[min(number, len(LEGACY_LEVELS) - 1)], ignored=False)
    return level(default, ignored=True)


# NCCL_NET_MERGE_LEVEL's names (src/graph/topo.cc nicPathKvList) with the path type each
# stands for: PORT is PATH_PORT, which graph.h defines as PATH_NVL.
MERGE_LEVELS = (("LOC", "LOC"), ("PORT", "NVL"), ("PIX", "PIX"), ("PXB", "PXB"), ("P2C", "P2C"),
                ("PXN", "PXN"), ("PHB", "PHB"), ("SYS", "SYS"))


@dataclasses.dataclass(frozen=True)
class MergeLevel:
    """NCCL_NET_MERGE_LEVEL: NICs at most this far from each other fuse into one virtual NIC."""

    name: str                      # LOC, PORT, PIX, ...
    rank: int                      # the path type's rank in PATH_RANK
    raw: str | None = None


def merge_level(environ: Mapping[str, str]) -> MergeLevel:
    """src/graph/topo.cc ncclTopoGetFusionEnv: unset is PORT; a value is matched by
    kvConvertToInt, the first name it starts with, and one that starts with none is LOC (the
    table's terminator, 0): no fusion."""
    raw = params.NET_MERGE_LEVEL.raw(environ)
    if raw is None:
        return MergeLevel("PORT", PATH_RANK["NVL"])
    name, path = next(((n, p) for n, p in MERGE_LEVELS if raw.startswith(n)), ("LOC", "LOC"))
    return MergeLevel(name, PATH_RANK[path], raw)


def pxn_disabled(environ: Mapping[str, str]) -> bool:
    """NCCL_PXN_DISABLE turns PXN off only when it reads exactly 1 (src/graph/paths.cc
    ncclPxnDisable and ncclTopoComputePaths ``if (ncclPxnDisable(comm) != 1)``): 2 or -1
    leave PXN on."""
    return params.PXN_DISABLE.number(environ) == 1


@dataclasses.dataclass(frozen=True)
class NetDevsPolicy:
    """NCCL_NETDEVS_POLICY (src/graph/topo.cc getNetDevsPolicyOnce): how many of its local
    NICs each GPU spreads its channels over. AUTO: DIVUP(local NICs, local GPUs); ALL:
    every local NIC; MAX:n: at most n (n read with atoi, must be > 0). Names are matched
    case-insensitively; anything else is AUTO."""

    kind: str                      # "AUTO", "ALL" or "MAX"
    limit: int = 0                 # n of MAX:n
    raw: str | None = None
    recognised: bool = True

    def nets_per_gpu(self, local_nets: int, local_gpus: int) -> int:
        """ncclTopoGetLocalNetType's netsPerGpu."""
        if self.kind == "ALL":
            return local_nets
        if self.kind == "MAX":
            return min(self.limit, local_nets)
        return -(-local_nets // max(local_gpus, 1))


def netdevs_policy(environ: Mapping[str, str]) -> NetDevsPolicy:
    raw = params.NETDEVS_POLICY.raw(environ)
    if raw is None:
        return NetDevsPolicy("AUTO")
    if raw.upper() in ("AUTO", "ALL"):
        return NetDevsPolicy(raw.upper(), raw=raw)
    if raw[:4].upper() == "MAX:" and atoi(raw[4:]) > 0:
        return NetDevsPolicy("MAX", atoi(raw[4:]), raw=raw)
    return NetDevsPolicy("AUTO", raw=raw, recognised=False)


@dataclasses.dataclass(frozen=True)
class HcaEntry:
    """One NCCL_IB_HCA entry (src/misc/utils.cc parseStringList): ``prefix[:port[:rail[:plane]]]``;
    the port is atoi'd, -1 when absent or empty (any port)."""

    prefix: str
    port: int = -1


@dataclasses.dataclass(frozen=True)
class HcaFilter:
    """NCCL_IB_HCA parsed and matched as NCCL does (src/transport/net_ib/init.cc
    ncclIbInitDevices; src/misc/utils.cc parseStringList, matchIfList, matchIf, matchPort):
    a leading "^" excludes, then "=" asks for exact names, else names are prefixes; an entry's
    port must equal the port's number unless either is -1. An empty list matches everything,
    so "^" alone (or "^=") excludes every device, and "" or "=" selects every one. Entries are
    not trimmed: NCCL compares " mlx5_0" with its blank."""

    exclude: bool
    exact: bool
    entries: tuple[HcaEntry, ...]

    def matches(self, device: str, port: int = -1) -> bool:
        """matchIfList for one device port (-1: any port)."""
        if not self.entries:
            return True
        return any((device == e.prefix if self.exact else device.startswith(e.prefix))
                   and (port == -1 or e.port == -1 or port == e.port) for e in self.entries)

    def selects(self, device: str, ports: tuple[int, ...] = ()) -> bool:
        """Whether NCCL keeps some of the device's ``ports`` (none known: any port)."""
        return any(self.matches(device, port) != self.exclude for port in ports or (-1,))


def parse_hca_filter(value: str) -> HcaFilter:
    exclude = value.startswith("^")
    rest = value[1:] if exclude else value
    exact = rest.startswith("=")
    rest = rest[1:] if exact else rest
    entries = []
    for entry in (e for e in rest.split(",") if e):          # strtok_r skips empty entries
        prefix, _, tail = entry.partition(":")
        if prefix:
            port = tail.partition(":")[0]
            entries.append(HcaEntry(prefix, atoi(port) if port else -1))
    return HcaFilter(exclude, exact, tuple(entries))


# ---- net plugins (src/plugin/net.cc, src/plugin/plugin_open.cc) ---------------------------
NET_PLUGIN_PREFIX = "libnccl-net"


def net_plugin_names(environ: Mapping[str, str]) -> list[str]:
    """NCCL_NET_PLUGIN's entries in order (net.cc initPluginLibsOnceFunc: a comma list,
    strtok_r skipping empty entries; "none", in any case, none); [] where unset."""
    raw = params.NET_PLUGIN.raw(environ)
    if raw is None or raw.lower() == "none":
        return []
    return [name for name in raw.split(",") if name]


def net_plugin_files(name: str) -> tuple[str, ...]:
    """The files NCCL dlopens for one entry (plugin_open.cc openPluginLib): the name as given,
    then, for a name with no '/' that is not already lib*.so, libnccl-net-<name>.so."""
    library = name.startswith("lib") and name.endswith(".so")
    return (name,) if "/" in name or library else (name, f"{NET_PLUGIN_PREFIX}-{name}.so")


# ---- NCCL's configuration files ---------------------------------------------------------
SYSTEM_CONF_FILE = "/etc/nccl.conf"
CONF_NAME_MAX = 1023               # setEnvFile's envVar and envValue buffers, less the NUL
# RCCL's own files (ROCm/rccl src/misc/param.cc initEnvFunc, the 6.3 line): no NCCL_CONF_FILE
RCCL_CONF_NAME, RCCL_SYSTEM_CONF_FILE = ".rccl.conf", "/etc/rccl.conf"


def conf_files(environ: Mapping[str, str], rules: params.Rules | None = None) -> list[str]:
    """The files the library loads, in order (src/misc/param.cc initEnvFunc): NCCL_CONF_FILE
    when set and non-empty (2.23.4 on; before, NCCL does not read it), else
    $HOME/.nccl.conf; then /etc/nccl.conf. RCCL: $HOME/.rccl.conf, then /etc/rccl.conf."""
    rccl = rules is not None and rules.library == params.RCCL
    home = environ.get("HOME")
    user = None if rccl else params.CONF_FILE.value(environ, rules)
    if user:
        first = [user]
    else:
        first = [f"{home}/{RCCL_CONF_NAME if rccl else '.nccl.conf'}"] if home is not None else []
    return first + [RCCL_SYSTEM_CONF_FILE if rccl else SYSTEM_CONF_FILE]


def conf_assignments(text: str) -> list[tuple[str, str]]:
    """setEnvFile's reading of one file: per line, one trailing newline and then one carriage
    return dropped; lines starting with '#' or without '=' skipped; the name is everything
    before the first '=' and the value everything after it, nothing trimmed."""
    assignments = []
    for line in text.split("\n"):
        line = line[:-1] if line.endswith("\r") else line
        name, equals, value = line.partition("=")
        if line.startswith("#") or not equals or not name:
            continue
        assignments.append((name[:CONF_NAME_MAX], value[:CONF_NAME_MAX]))
    return assignments


def with_conf_files(environ: Mapping[str, str], read: Callable[[str], str | None],
                    rules: params.Rules | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """The environment the library of ``rules`` (None: 2.30.7's NCCL) ends up with, and where
    each value came from ("environment" or a file's path). NCCL sets each file's variables
    with setenv(name, value, 0): the environment wins, and an earlier file (or line) wins
    over a later one."""
    merged = dict(environ)
    sources = {name: "environment" for name in environ}
    for path in conf_files(environ, rules):
        text = read(path)
        for name, value in conf_assignments(text or ""):
            if name not in merged:
                merged[name], sources[name] = value, path
    return merged, sources
