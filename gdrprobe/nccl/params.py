"""Every NCCL and RCCL environment variable gdrprobe reads or names, declared once: its name,
how the library parses it, its default by release (the first NVIDIA/nccl tag with each
default), which library reads it and where. The pattern is NCCL's own: one
``NCCL_PARAM(name, "ENV", default)`` line per integer variable (``src/include/param.h``,
``src/misc/param.cc`` ncclLoadParam), ``ncclGetEnv`` for text, ``ncclGetLevel`` for a
path-type level (``src/graph/paths.cc``); RCCL adds ``RCCL_PARAM`` (``RCCL_`` prefix, ROCm/rccl
``src/include/param.h``).

The table was read from NVIDIA/nccl's tags v2.9.6-1 .. v2.30.7-1 and the 2.31 development line
(2.31.0a7): a default first seen in 2.9.6 is declared from :data:`ALWAYS` (read by every
release gdrprobe models). ``source`` names where 2.30.7 declares or reads it. Release-keyed
rules that use a variable live in :mod:`gdrprobe.nccl.versions` (:class:`NcclRules`) and the
modules beside it; this module only says what a variable is and what its value reads as.

Readers: :meth:`Param.value` (as a release of NCCL or RCCL reads it; None where it does not
read it), :meth:`Param.number`, :meth:`Param.raw`, and :meth:`NcclRules.param` of
:mod:`gdrprobe.nccl.versions`. Outside :mod:`gdrprobe.nccl` no module reads a variable by
name: it asks a reader here or in the rules, and names a variable in its wording only
(``tests/unit/test_nccl_params.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Protocol, Union

from gdrprobe.nccl.cparse import strtoll

Version = tuple[int, int, int]
Value = Union[int, str, None]
ALWAYS: Version = (0, 0, 0)        # read at least since 2.9.6, the oldest tag the table was read from
LATEST: Version = (2, 31, 0)       # the release whose rules gdrprobe models where none is known:
#                                    the 2.31 dev line (2.31.0a7), whose defaults are 2.30.7's

INT = "int"          # NCCL_PARAM / RCCL_PARAM: ncclLoadParam, strtoll(value, NULL, 0) into an int64;
#                      unset, empty or out of range (ERANGE): the default
TEXT = "text"        # ncclGetEnv / getenv: the text as set; None: unset
LEVEL = "level"      # ncclGetLevel: a path type's name, else a number in the old levels (env.gdr_level)
NCCL, RCCL = "NCCL", "RCCL"
BOTH = (NCCL, RCCL)
PREFIXES = ("NCCL_", "RCCL_")      # the variables' own prefixes (RCCL reads NCCL_ ones too)


class Rules(Protocol):
    """What a reader needs of :class:`gdrprobe.nccl.versions.NcclRules`."""

    library: str

    @property
    def effective(self) -> Version: ...


@dataclasses.dataclass(frozen=True)
class Param:
    """One environment variable as NCCL (or RCCL) declares it."""

    name: str
    kind: str                                   # INT, TEXT or LEVEL
    defaults: tuple[tuple[Version, Value], ...]   # (first release, the default from it), oldest first
    source: str                                 # where 2.30.7 declares or reads it
    library: tuple[str, ...] = BOTH             # which libraries read it
    until: Version | None = None                # the last release that reads it; None: still read
    # RCCL's own defaults by ROCm release (oldest first) where they differ from NCCL's
    rccl: tuple[tuple[Version, Value], ...] = ()
    meaning: str = ""

    @property
    def since(self) -> Version:
        return self.defaults[0][0]

    def read_by(self, version: Version, library: str = NCCL) -> bool:
        """Whether this release of ``library`` reads the variable at all."""
        if library not in self.library:
            return False
        return self.since <= version and (self.until is None or version <= self.until)

    def default(self, version: Version = LATEST, library: str = NCCL, rocm: Version | None = None) -> Value:
        """The default this release uses (the last one declared at or before it); RCCL's own
        by its ROCm release (``rocm``; None: the newest declared) where it has one."""
        table, at = (self.rccl, rocm or (1 << 30,) * 3) if library == RCCL and self.rccl else (self.defaults, version)
        return next((value for since, value in reversed(table) if since <= at), table[0][1])

    def first_with(self, default: Value, library: str = NCCL) -> Version:
        """The first release whose default is ``default`` (RCCL's: its ROCm release)."""
        table = self.rccl if library == RCCL and self.rccl else self.defaults
        return next(since for since, value in table if value == default)

    def raw(self, environ: Mapping[str, str]) -> str | None:
        return environ.get(self.name)

    def is_set(self, environ: Mapping[str, str]) -> bool:
        return self.name in environ

    def value(self, environ: Mapping[str, str], rules: Rules | None = None) -> Value:
        """The value the release of ``rules`` (None: 2.30.7's NCCL) works with: an integer
        read as ncclLoadParam reads it, a text as set, else the default; None where that
        release does not read the variable."""
        version, library = (rules.effective, rules.library) if rules is not None else (LATEST, NCCL)
        if not self.read_by(version, library):
            return None
        rocm = getattr(rules, "release", None) if library == RCCL else None
        return parsed(self, environ.get(self.name), self.default(version, library, rocm))

    def number(self, environ: Mapping[str, str], rules: Rules | None = None) -> int:
        """An integer variable's value; a release that does not read it counts its first default."""
        found = self.value(environ, rules)
        return int(found) if isinstance(found, int) else int(self.defaults[0][1] or 0)


def parsed(param: Param, text: str | None, default: Value) -> Value:
    if param.kind != INT:
        return default if text is None else text
    number = strtoll(text) if text else None
    return default if number is None else number


def int_value(text: str) -> int | None:
    """The integer ncclLoadParam reads from a set variable's text: None for an empty value
    or an overflow, where NCCL keeps its default."""
    return strtoll(text) if text else None


def _param(name: str, kind: str, *defaults: tuple[Version, Value], source: str, **more) -> Param:
    return Param(name, kind, tuple(defaults), source, **more)


def _int(name: str, *defaults: tuple[Version, Value], source: str, **more) -> Param:
    return _param(name, INT, *defaults, source=source, **more)


def _text(name: str, since: Version, source: str, **more) -> Param:
    return _param(name, TEXT, (since, None), source=source, **more)


# ---- GPUDirect RDMA: the GDR decision (src/graph/paths.cc ncclTopoCheckGdr) ----------------
NET_GDR_LEVEL = _param("NCCL_NET_GDR_LEVEL", LEVEL, (ALWAYS, "PXB"), ((2, 29, 2), "P2C"),
                       source="src/graph/paths.cc ncclTopoCheckGdr (ncclGetLevel)",
                       meaning="GDR up to this path type; P2C only while NCCL_NET_GDR_C2C is on")
NET_GDR_READ = _int("NCCL_NET_GDR_READ", (ALWAYS, -2), source="src/graph/paths.cc NCCL_PARAM NetGdrRead",
                    meaning="the NIC reads GPU memory for sends; -2: not before sm80 without NVLink")
NET_GDR_C2C = _int("NCCL_NET_GDR_C2C", ((2, 26, 2), 0), ((2, 27, 3), 1),
                   source="src/graph/paths.cc NCCL_PARAM NetGdrC2c", meaning="GDR to NICs behind a C2C CPU")
NET_GDR_MLOPART = _int("NCCL_NET_GDR_MLOPART", ((2, 30, 7), 0), source="src/graph/paths.cc NCCL_PARAM NetGdrMlopart",
                       library=(NCCL,), meaning="GDR for an MLO partition")
DMABUF_ENABLE = _int("NCCL_DMABUF_ENABLE", ((2, 13, 4), 1), source="src/init.cc NCCL_PARAM DmaBufEnable",
                     rccl=((ALWAYS, 0), ((7, 12, 0), 1)),
                     meaning="DMA-BUF registration; RCCL's default 0, 1 from ROCm 7.12 (ROCm/rccl CHANGELOG "
                             "\"RCCL 2.28.3 for ROCm 7.12\", src/misc/rocmwrap.cc)")
GDR_FLUSH_DISABLE = _int("NCCL_GDR_FLUSH_DISABLE", (ALWAYS, 0),
                         source="src/transport/net_ib/connect.cc NCCL_PARAM GdrFlushDisable")
NET_FORCE_FLUSH = _int("NCCL_NET_FORCE_FLUSH", ((2, 15, 1), 1), ((2, 19, 1), 0),
                       source="src/graph/paths.cc NCCL_PARAM NetForceFlush")
GDRCOPY_ENABLE = _int("NCCL_GDRCOPY_ENABLE", (ALWAYS, 0), source="src/init.cc NCCL_PARAM GdrCopyEnable",
                      library=(NCCL,), meaning="GDRCopy: a CPU-side copy, not the NIC's GPUDirect")
GDRCOPY_FLUSH_ENABLE = _int("NCCL_GDRCOPY_FLUSH_ENABLE", (ALWAYS, 0),
                            source="src/transport/net.cc NCCL_PARAM GdrCopyFlushEnable", library=(NCCL,))
CUMEM_ENABLE = _int("NCCL_CUMEM_ENABLE", ((2, 18, 1), 0), ((2, 19, 1), -2),
                    source="src/misc/cudawrap.cc NCCL_PARAM CuMemEnable", rccl=((ALWAYS, 0),),
                    meaning="GPU buffers through cuMem (VMM); -2: where the driver supports it; RCCL from "
                            "ROCm 7.12: above 0 turns DMA-BUF on")
CUMEM_HOST_ENABLE = _int("NCCL_CUMEM_HOST_ENABLE", ((2, 23, 4), 0), ((2, 24, 3), -1),
                         source="src/misc/cudawrap.cc NCCL_PARAM CuMemHostEnable", library=(NCCL,))

# ---- the network: which transport and devices (src/plugin/net.cc, net_ib/init.cc) --------------
IB_DISABLE = _int("NCCL_IB_DISABLE", (ALWAYS, 0), source="src/transport/net_ib/init.cc NCCL_PARAM IbDisable")
NET = _text("NCCL_NET", (2, 10, 3), "src/init.cc (ncclGetEnv), matched in src/plugin/net.cc ncclNetInit")
NET_PLUGIN = _text("NCCL_NET_PLUGIN", (2, 11, 4), "src/plugin/net.cc (ncclGetEnv)")
IB_HCA = _text("NCCL_IB_HCA", ALWAYS, "src/transport/net_ib/init.cc ncclIbInitDevices (ncclGetEnv)")
IB_MERGE_VFS = _int("NCCL_IB_MERGE_VFS", ((2, 18, 1), 1), source="src/transport/net_ib/init.cc NCCL_PARAM IbMergeVfs")
IB_MERGE_NICS = _int("NCCL_IB_MERGE_NICS", ((2, 20, 3), 1),
                     source="src/transport/net_ib/init.cc NCCL_PARAM IbMergeNics")
NET_MERGE_LEVEL = _text("NCCL_NET_MERGE_LEVEL", (2, 24, 3), "src/graph/topo.cc ncclTopoGetFusionEnv (ncclGetEnv)")
NET_FORCE_MERGE = _text("NCCL_NET_FORCE_MERGE", (2, 24, 3), "src/graph/topo.cc ncclTopoGetFusionEnv (ncclGetEnv)")
NET_MERGE_POLICY = _text("NCCL_NET_MERGE_POLICY", (2, 30, 7), "src/graph/topo.cc (ncclGetEnv)", library=(NCCL,))
NETDEVS_POLICY = _text("NCCL_NETDEVS_POLICY", (2, 28, 3), "src/graph/topo.cc getNetDevsPolicyOnce (ncclGetEnv)",
                       library=(NCCL,))
IB_DATA_DIRECT = _int("NCCL_IB_DATA_DIRECT", ((2, 27, 3), 1),
                      source="src/transport/net_ib/init.cc NCCL_PARAM IbDataDirect", library=(NCCL,))
IB_PCI_RELAXED_ORDERING = _int("NCCL_IB_PCI_RELAXED_ORDERING", ((2, 12, 7), 2),
                               source="src/transport/net_ib/init.cc NCCL_PARAM IbPciRelaxedOrdering")
COLLNET_ENABLE = _text("NCCL_COLLNET_ENABLE", ALWAYS, "src/init.cc (ncclGetEnv; NCCL_PARAM before 2.12.10)")
SOCKET_IFNAME = _text("NCCL_SOCKET_IFNAME", ALWAYS, "src/misc/socket.cc (ncclGetEnv)")

# ---- the GID NCCL picks on a RoCE port (src/transport/net_ib/connect.cc ncclIbGetGidIndex) ------
IB_GID_INDEX = _int("NCCL_IB_GID_INDEX", (ALWAYS, 0), ((2, 21, 5), -1),
                    source="src/transport/net_ib/connect.cc NCCL_PARAM IbGidIndex",
                    meaning="the GID index on RoCE; -1 (2.21.5 on): NCCL walks the table")
IB_ADDR_FAMILY = _text("NCCL_IB_ADDR_FAMILY", (2, 21, 5), "src/transport/net_ib/connect.cc envIbAddrFamily")
IB_ADDR_RANGE = _text("NCCL_IB_ADDR_RANGE", (2, 21, 5), "src/transport/net_ib/connect.cc envIbAddrRange")
IB_ROCE_VERSION_NUM = _int("NCCL_IB_ROCE_VERSION_NUM", ((2, 21, 5), 2),
                           source="src/transport/net_ib/connect.cc NCCL_PARAM IbRoceVersionNum")

# ---- the QPs and their traffic (net_ib/connect.cc, p2p.cc, common.cc) --------------------------
IB_QPS_PER_CONNECTION = _int("NCCL_IB_QPS_PER_CONNECTION", ((2, 10, 3), 1),
                             source="src/transport/net_ib/connect.cc NCCL_PARAM IbQpsPerConn")
IB_SPLIT_DATA_ON_QPS = _int("NCCL_IB_SPLIT_DATA_ON_QPS", ((2, 18, 1), 1), ((2, 20, 3), 0),
                            source="src/transport/net_ib/common.cc NCCL_PARAM IbSplitDataOnQps")
IB_AR_THRESHOLD = _int("NCCL_IB_AR_THRESHOLD", (ALWAYS, 8192), ((2, 30, 3), -2),
                       source="src/transport/net_ib/p2p.cc NCCL_PARAM IbArThreshold")
IB_ADAPTIVE_ROUTING = _int("NCCL_IB_ADAPTIVE_ROUTING", ((2, 16, 2), -2),
                           source="src/transport/net_ib/init.cc NCCL_PARAM IbAdaptiveRouting",
                           meaning="-2: on for InfiniBand, off for RoCE")
IB_TIMEOUT = _int("NCCL_IB_TIMEOUT", (ALWAYS, 14), ((2, 14, 3), 18), ((2, 23, 4), 20),
                  source="src/transport/net_ib/connect.cc NCCL_PARAM IbTimeout")
IB_RETRY_CNT = _int("NCCL_IB_RETRY_CNT", (ALWAYS, 7), source="src/transport/net_ib/connect.cc NCCL_PARAM IbRetryCnt")
IB_USE_INLINE = _int("NCCL_IB_USE_INLINE", (ALWAYS, 0), source="src/transport/net_ib/connect.cc NCCL_PARAM IbUseInline")
IB_SL = _int("NCCL_IB_SL", (ALWAYS, 0), ((2, 26, 2), -1), source="src/transport/net_ib/connect.cc NCCL_PARAM IbSl")
IB_TC = _int("NCCL_IB_TC", (ALWAYS, 0), ((2, 26, 2), -1), source="src/transport/net_ib/connect.cc NCCL_PARAM IbTc")
IB_FIFO_TC = _int("NCCL_IB_FIFO_TC", ((2, 22, 3), 0), ((2, 24, 3), -1),
                  source="src/transport/net_ib/connect.cc NCCL_PARAM IbFifoTc")
IB_ECE_ENABLE = _int("NCCL_IB_ECE_ENABLE", ((2, 23, 4), 1),
                     source="src/transport/net_ib/connect.cc NCCL_PARAM IbEceEnable")
IB_OOO_RQ = _int("NCCL_IB_OOO_RQ", ((2, 30, 3), 0), source="src/transport/net_ib/init.cc NCCL_PARAM IbOooRq",
                 library=(NCCL,))
NET_SHARED_BUFFERS = _int("NCCL_NET_SHARED_BUFFERS", (ALWAYS, -2),
                          source="src/transport/net.cc NCCL_PARAM NetSharedBuffers")
NET_OPTIONAL_RECV_COMPLETION = _int("NCCL_NET_OPTIONAL_RECV_COMPLETION", ((2, 24, 3), 1),
                                    source="src/transport/net.cc NCCL_PARAM NetOptionalRecvCompletion")

# ---- buffers, chunks and channels (src/init.cc, src/graph/connect.cc, paths.cc) ------------------
# -2: NCCL's own size (init.cc DEFAULT_BUFFSIZE 4 MiB for Simple; LL and LL128 by their layout)
BUFFSIZE = _int("NCCL_BUFFSIZE", (ALWAYS, -2), source="src/init.cc NCCL_PARAM BuffSize (-2: DEFAULT_BUFFSIZE)")
LL_BUFFSIZE = _int("NCCL_LL_BUFFSIZE", (ALWAYS, -2), source="src/init.cc NCCL_PARAM LlBuffSize")
LL128_BUFFSIZE = _int("NCCL_LL128_BUFFSIZE", (ALWAYS, -2), source="src/init.cc NCCL_PARAM Ll128BuffSize")
P2P_NET_CHUNKSIZE = _int("NCCL_P2P_NET_CHUNKSIZE", ((2, 14, 3), 1 << 17),
                         source="src/init.cc NCCL_PARAM P2pNetChunkSize")
P2P_PCI_CHUNKSIZE = _int("NCCL_P2P_PCI_CHUNKSIZE", ((2, 16, 2), 1 << 17),
                         source="src/init.cc NCCL_PARAM P2pPciChunkSize")
P2P_NVL_CHUNKSIZE = _int("NCCL_P2P_NVL_CHUNKSIZE", ((2, 16, 2), 1 << 19),
                         source="src/init.cc NCCL_PARAM P2pNvlChunkSize")
MIN_NCHANNELS = _int("NCCL_MIN_NCHANNELS", (ALWAYS, -2), source="src/graph/connect.cc NCCL_PARAM MinNchannels")
MAX_NCHANNELS = _int("NCCL_MAX_NCHANNELS", (ALWAYS, -2), source="src/graph/connect.cc NCCL_PARAM MaxNchannels")
# NCCL_CONFIG_UNDEF_INT (INT_MIN) from 2.28.3: the communicator's config decides
NCHANNELS_PER_NET_PEER = _int("NCCL_NCHANNELS_PER_NET_PEER", ((2, 12, 7), 2), ((2, 20, 3), -1),
                              ((2, 28, 3), -(1 << 31)), source="src/init.cc NCCL_PARAM NChannelsPerNetPeer")
P2P_PER_CHANNEL_NET_BW = _int("NCCL_P2P_PER_CHANNEL_NET_BW", ((2, 29, 2), 14), library=(NCCL,),
                              source="src/graph/paths.cc NCCL_PARAM P2pPerChannelNetBw",
                              meaning="GB/s a point-to-point channel to a peer over the network carries")
PROTO = _text("NCCL_PROTO", ALWAYS, "src/enqueue.cc, src/graph/tuning.cc (ncclGetEnv)")
ALGO = _text("NCCL_ALGO", ALWAYS, "src/enqueue.cc, src/graph/tuning.cc (ncclGetEnv)")

# ---- PXN and other paths (src/graph/paths.cc) ----------------------------------------------------
PXN_DISABLE = _int("NCCL_PXN_DISABLE", ((2, 12, 7), 0), source="src/graph/paths.cc NCCL_PARAM PxnDisable")
PXN_C2C = _int("NCCL_PXN_C2C", ((2, 27, 3), 0), ((2, 28, 3), 1), source="src/graph/paths.cc NCCL_PARAM PxnC2c",
               library=(NCCL,))
P2P_LEVEL = _param("NCCL_P2P_LEVEL", LEVEL, (ALWAYS, None), source="src/graph/paths.cc (ncclGetLevel)")
P2P_DISABLE = _int("NCCL_P2P_DISABLE", (ALWAYS, 0), source="src/graph/paths.cc (ncclGetLevel's disable: strtol == 1)")
SHM_DISABLE = _int("NCCL_SHM_DISABLE", (ALWAYS, 0), source="src/transport/shm.cc NCCL_PARAM ShmDisable")

# ---- the GPU drives the NIC (GIN), windows and NVLS (src/gin, src/init.cc, src/transport/nvls.cc) --
GIN_ENABLE = _int("NCCL_GIN_ENABLE", ((2, 28, 7), 1), source="src/gin/gin_host.cc NCCL_PARAM GinEnable",
                  library=(NCCL,))
GIN_TYPE = _int("NCCL_GIN_TYPE", ((2, 28, 7), -1), source="src/transport/net_ib/gin.cc NCCL_PARAM GinType",
                library=(NCCL,), meaning="-1: NCCL picks the GIN backend")
GIN_PLUGIN = _text("NCCL_GIN_PLUGIN", (2, 29, 7), "src/plugin/gin.cc (ncclGetEnv)", library=(NCCL,))
GIN_NCONNECTIONS = _int("NCCL_GIN_NCONNECTIONS", ((2, 29, 7), -2),
                        source="src/gin/gin_host.cc NCCL_PARAM GinNconnections", library=(NCCL,))
GIN_GDAKI_NIC_HANDLER = _int("NCCL_GIN_GDAKI_NIC_HANDLER", ((2, 28, 7), 0),
                             source="src/transport/net_ib/gdaki/gin_host_gdaki.cc NCCL_PARAM GinGdakiNicHandler",
                             library=(NCCL,), meaning="DOCA GPUNetIO's doorbell handler: 0 auto, 1 the CPU")
GDAKI_USE_RELIABLE_DB = _int("NCCL_GDAKI_USE_RELIABLE_DB", ((2, 29, 7), 0),
                             source="src/transport/net_ib/gdaki/gin_host_gdaki.cc NCCL_PARAM GdakiUseReliableDb",
                             library=(NCCL,))
SYM_GIN_KERNELS_ENABLE = _int("NCCL_SYM_GIN_KERNELS_ENABLE", ((2, 29, 7), 1),
                              source="src/sym_kernels.cc NCCL_PARAM SymGinKernelsEnable", library=(NCCL,))
WIN_ENABLE = _int("NCCL_WIN_ENABLE", ((2, 27, 3), 1), source="src/init.cc NCCL_PARAM WinEnable", library=(NCCL,))
NVLS_ENABLE = _int("NCCL_NVLS_ENABLE", ((2, 17, 1), 1), ((2, 18, 1), 2),
                   source="src/transport/nvls.cc NCCL_PARAM NvlsEnable", library=(NCCL,), meaning="2: where supported")

# ---- files and logs (src/misc/param.cc, src/graph/topo.cc, src/debug.cc) --------------------------
CONF_FILE = _text("NCCL_CONF_FILE", (2, 23, 4), "src/misc/param.cc initEnvFunc (getenv)",
                  meaning="before 2.23.4 only ~/.nccl.conf and /etc/nccl.conf")
TOPO_FILE = _text("NCCL_TOPO_FILE", ALWAYS, "src/graph/topo.cc ncclTopoGetSystem (ncclGetEnv)")
DEBUG = _text("NCCL_DEBUG", ALWAYS, "src/debug.cc (DEFINE_NCCL_PARAM ncclParamDebugLevel from 2.30)")
DEBUG_SUBSYS = _text("NCCL_DEBUG_SUBSYS", ALWAYS, "src/debug.cc (DEFINE_NCCL_PARAM ncclParamDebugSubsys from 2.30)")
DEBUG_FILE = _text("NCCL_DEBUG_FILE", ALWAYS, "src/debug.cc (DEFINE_NCCL_PARAM ncclParamDebugFile from 2.30)")
RUN_DIAGNOSTICS = _int("NCCL_RUN_DIAGNOSTICS", ((2, 31, 0), 0),
                       source="src/diagnostics.cc (2.31 dev line; user guide, Troubleshooting: "
                              "Diagnostics: active diagnostics are off by default)", library=(NCCL,))

# ---- removed long ago: named by old job scripts, read by no release gdrprobe models -------------
IB_CUDA_SUPPORT = _int("NCCL_IB_CUDA_SUPPORT", (ALWAYS, None), source="removed in 2.4.0", until=(2, 3, 7))
IB_GDR_LEVEL = _param("NCCL_IB_GDR_LEVEL", LEVEL, (ALWAYS, None), source="renamed NCCL_NET_GDR_LEVEL in 2.4.0",
                      until=(2, 3, 7))

# ---- RCCL's own (ROCm/rccl src/, the 6.3 line; later ones from its CHANGELOG) -----------------------
RCCL_FORCE_ENABLE_GDRDMA = _int("RCCL_FORCE_ENABLE_GDRDMA", (ALWAYS, -1), library=(RCCL,),
                                source="ROCm/rccl src/transport/net_ib.cc RCCL_PARAM ForceEnableGdrdma",
                                meaning="1: peer memory on without any check")
RCCL_FORCE_ENABLE_DMABUF = _int("RCCL_FORCE_ENABLE_DMABUF", (ALWAYS, 0), library=(RCCL,),
                                source="ROCm/rccl src/misc/rocmwrap.cc (CHANGELOG \"RCCL 2.27.7 for ROCm 7.1.0\")",
                                meaning="1: DMA-BUF without the kernel's checks (ROCm 7.1 on)")
RCCL_ROCR_PATH = _text("RCCL_ROCR_PATH", ALWAYS, "ROCm/rccl src/misc/rocmwrap.cc initOnceFunc (getenv): "
                       "a prefix to libhsa-runtime64.so", library=(RCCL,))
HSA_FORCE_FINE_GRAIN_PCIE = _text("HSA_FORCE_FINE_GRAIN_PCIE", ALWAYS, "ROCm/rccl src/init.cc (getenv): warns "
                                  "unless 1", library=(RCCL,))

# Every declaration above, by the variable's name (test_nccl_params holds that there is one each).
DECLARED: dict[str, Param] = {param.name: param for param in globals().copy().values() if isinstance(param, Param)}

# Names from NCCL's and RCCL's source that gdrprobe's words cite and that are no variables:
# macros, log levels, enum values.
NOT_VARIABLES = frozenset({
    "NCCL_PARAM", "RCCL_PARAM", "NCCL_PTR_CUDA", "NCCL_PTR_DMABUF", "NCCL_STEPS", "NCCL_NET_MAX_PLUGINS",
    "NCCL_NET_MAX_DEVS_PER_NIC", "NCCL_NET_MAX_DEVS_PER_NIC_V11", "NCCL_TOPO_XML_VERSION",
    "NCCL_TOPO_XML_MAX_NODES", "NCCL_LOG_VERSION", "NCCL_NET_MAP_ADD_POINTER", "NCCL_CONFIG_UNDEF_INT",
    "NCCL_PROTO_LL", "NCCL_SHARED_STEPS"})


def declared(name: str) -> Param:
    """The declaration of a variable by its name (a KeyError for one never declared)."""
    return DECLARED[name]


def library_variables(environ: Mapping[str, str]) -> list[str]:
    """The names of the set variables NCCL or RCCL take as their own (by their prefix), sorted."""
    return sorted(name for name in environ if name.startswith(PREFIXES))


def without(environ: Mapping[str, str], *dropped: Param | str) -> dict[str, str]:
    """The environment with these variables unset (a what-if); a name stands for itself."""
    names = {getattr(name, "name", name) for name in dropped}
    return {name: value for name, value in environ.items() if name not in names}
