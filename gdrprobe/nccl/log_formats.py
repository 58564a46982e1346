"""The lines of an NCCL_DEBUG=INFO log that say something about GPUDirect RDMA, in every
format NCCL 2.4 to 2.31 and its network plugins print them, each read by one pattern.

Every pattern below was written from the format string in the source that prints it
(file and function named next to it; NCCL tags v2.4.8-1 .. v2.30.7-1 and the dev branch at
2.31.0a7, the nccl-rdma-sharp-plugins history, aws-ofi-nccl v1.0 .. v1.21). 2.31's
diagnostics block (``NCCL DIAG`` lines, ``src/diagnostics.cc``) is read by
:mod:`gdrprobe.nccl.log_diag`. A line is split into records
first: the log prefix NCCL puts before every message (``debug.cc`` ncclDebugLog:
``host:pid:tid [cudaDev] NCCL INFO``) marks where a record starts, so several records glued
on one line, and launcher prefixes before them, are read like clean lines.

Every pattern is linear in the text it reads: nothing is tried at every position of a run
whose end decides the match (tests/unit/test_nccl_log_scale.py feeds each the line that
would cost it the square of its length; benchmarks/nccl_log_speed.py times them).
"""

from __future__ import annotations

import dataclasses
import re
from typing import NamedTuple

# Every number read into an int is at most 9 digits (group "(?P<nic>\d{1,9})"): no NCCL index,
# channel or distance is longer, and Python refuses to convert a string of over 4300 digits.

# ---- records: the prefix NCCL writes before each message ---------------------------------

# debug.cc ncclDebugLog: "%s:%d:%d [%d] NCCL INFO ", "... %s:%d NCCL WARN ", "... %f %s:%d
# NCCL TRACE " (2.4: misc/utils.cc, the same INFO prefix).
RECORD_MARK = re.compile(r"NCCL (?:INFO|WARN|TRACE) ")
# The host, pid and tid before a mark, then nothing but words each followed by one space
# ("[0] ", TRACE's "0.1 func:12 "); the host is what keys a node's NICs. Found in two linear
# steps (host_before), never by one pattern searched over the text: "[\w.-]+" tried at every
# start of a long run of word characters, or "(?:\S+ )*$" at every word of a long run of
# them, costs the square of the run.
# The last character the words may not hold: whitespace other than one space between words.
NOT_A_WORD_GAP = re.compile(r" (?=\s|\Z)|[^\S ]")     # searched in the reversed text
# host:pid:tid ending a word, from the start of the host's run of characters only.
HOST_TRIPLE = re.compile(r"(?<![\w.-])([\w.-]+):\d+:\d+ ")
# NCCL_DEBUG=VERSION prints the version line without the prefix (debug.cc, NCCL_LOG_VERSION);
# RCCL prints its own to stdout whatever NCCL_DEBUG_FILE says (ROCm/rccl 0cbce2a7 src/init.cc
# showVersion: printf of "RCCL version : %d.%d.%d-<git hash>").
# DOCA GPUNetIO, inside NCCL's GDAKI backend, logs on its own (doca_gpunetio_log.cpp
# doca_gpu_log_print: "<ctime> [WARNING] [<file>]: <line>: <function>(): ", only with
# DOCA_GPUNETIO_LOG at 4 or more): its function name starts the record (GIN_DOCA_FORMATS).
MESSAGE_START = re.compile(r"NCCL version \d|RCCL version : \d|doca_gpu_verbs_export_qp\(\): ")

# Which lines a reader looks at at all: everything below starts with or contains one of these.
KEYWORDS = re.compile(rb" via |GPU Direct RDMA|Using|DMA-BUF|NCCL version|virtual device|"
                      rb"set by environment|GDR|No device found|"
                      rb"RCCL version|memory_peers|peer_memory|mabuf|DMA_BUF|"
                      rb"GIN|gin[: ]|Created a QP|ymmetric memory|CPU proxy mode|NCCL DIAG ")
# The lines a large job's log is mostly made of, with NCCL's own prefix at the line's start,
# each read from its bytes in one match: a channel in NCCL 2.12-2.30's format (net.cc, as
# CHANNEL_FORMATS[0]; groups net, nic, /GDRDMA, flush), one inside the node (p2p.cc, shm.cc: group
# "via"), and 2.13+'s NIC verdict (topo.cc, as the last nic-gdr format; groups net, state,
# index, name). Any other line, or one of these with anything around it, is read record by
# record.
FAST_LINE = re.compile(
    rb"([\w.-]+):\d+:\d+ \[\d+\] NCCL INFO (?:"
    rb"Channel \d+/\d+ : \d+\[\w+\] -> \d+\[\w+\] (?:\[(?:send|receive)\] via NET/([^/]+?)/(\d{1,9})"
    rb"(?:\(\d+\))?(/GDRDMA)?(?:\(PCI\))?(?:/Shared)?(?:/flush=(None|Always|C2c|Unknown))?|(via) (?!NET/|COLLNET/).*)"
    rb"|NET/([^:]+?) : GPU Direct RDMA (Enabled|Disabled) for HCA (\d{1,9}) '([^']*)')\r?")
# Lines that look like network facts; one that no format reads is "format not recognised".
CANDIDATE = re.compile(r"via (?:NET|COLLNET)/|GPU Direct RDMA")


class Record(NamedTuple):
    host: str          # "" when the line carries no NCCL prefix
    message: str
    glued: bool        # written right after the previous record, no space between


def host_before(line: str, begin: int, end: int) -> tuple[str, int] | None:
    """The host of the prefix that ends at ``end`` (where a mark starts) and where it
    starts, or None: the leftmost ``host:pid:tid `` in line[begin:end] followed by nothing
    but words each followed by one space. Linear in end - begin."""
    if end <= begin or line[end - 1] != " ":
        return None
    gap = NOT_A_WORD_GAP.search(line[begin:end][::-1])
    start = begin if gap is None else end - gap.start()
    found = HOST_TRIPLE.search(line, start, end)
    return None if found is None else (found.group(1), found.start())


def records(line: str) -> list[Record]:
    """The records of one log line: one per NCCL prefix, or the version line NCCL prints bare,
    or a line of 2.31's diagnostics block (diag_record)."""
    first = RECORD_MARK.search(line)
    if first is None:
        start = MESSAGE_START.search(line)
        if start is None:
            return diag_record(line)
        return [Record("", line[start.start():], False)]
    if RECORD_MARK.search(line, first.end()) is None:       # one record: most lines
        prefix = host_before(line, 0, first.start())
        return [Record(prefix[0] if prefix else "", line[first.end():], False)]
    marks = list(RECORD_MARK.finditer(line))
    hosts, ends, glued = [], [], []
    for number, mark in enumerate(marks):
        begin = marks[number - 1].end() if number else 0
        prefix = host_before(line, begin, mark.start())
        hosts.append(prefix[0] if prefix else "")
        # The previous record ends where this one's prefix starts, unless the two are glued
        # with no space between: then the host may have swallowed the end of the previous
        # message ("/GDRDMAnode2:..."), and that message keeps every character.
        clean = prefix and (prefix[1] == begin or line[prefix[1] - 1].isspace())
        ends.append(prefix[1] if clean else mark.start())
        glued.append(number > 0 and not clean)
    ends = ends[1:] + [len(line)]
    return [Record(host, line[mark.end():end], stuck)
            for host, mark, end, stuck in zip(hosts, marks, ends, glued)]


# 2.31's diagnostics report (NCCL_RUN_DIAGNOSTICS=1): printed to the standard output of rank
# 0's process, outside NCCL's debug log, each line "NCCL DIAG " after "host:pid "
# (src/diagnostics.cc ncclRunDiagnosticsActive, DIAG_PRINT; docs/userguide troubleshooting
# "Diagnostics"). Its message keeps the mark, which its format reads.
DIAG_MARK = "NCCL DIAG "
HOST_PID = re.compile(r"([\w.-]+):\d+")


def diag_record(line: str) -> list[Record]:
    """A line of the diagnostics block as one record (the host from the "host:pid" word
    right before the mark, "" where there is none), or none. Linear in the line."""
    at = line.find(DIAG_MARK)
    if at < 0:
        return []
    before = line[:at]
    word = before[:-1].rsplit(None, 1)[-1] if before.endswith(" ") and before.strip() else ""
    host = HOST_PID.fullmatch(word)
    return [Record(host.group(1) if host else "", line[at:], False)]


# ---- the formats ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LineFormat:
    """One way NCCL or a plugin prints a fact, and where."""

    name: str              # what the line says: channel, nic-gdr, pair-gdr, ...
    versions: str          # the NCCL (or plugin) versions that print it this way
    source: str            # the file and function whose format string it follows
    pattern: re.Pattern


def fmt(name: str, versions: str, source: str, pattern: str) -> LineFormat:
    return LineFormat(name, versions, source, re.compile(pattern))


# "/GDRDMA" when the connection registered GPU memory with the NIC; "(PCI)" from 2.26 when
# that registration maps through PCIe on a C2C platform; "/Shared" from 2.8.
_SUFFIX = r"(?P<gdr>/GDRDMA)?(?P<pci>\(PCI\))?(?P<shared>/Shared)?"
# 2.31, receives with GDR only: NCCL's flush of them, "/flush=" and ncclTopoFlushTypeStr's
# None, Always, C2c (Unknown for a value it does not name) (src/transport/net.cc recvSetup).
FLUSH_TYPES = ("None", "Always", "C2c", "Unknown")
_FLUSH = r"(?:/flush=(?P<flush>" + "|".join(FLUSH_TYPES) + r"))?"
_NET = r"(?P<net>[^/]+?)/(?P<nic>\d{1,9})"        # plugin names may hold spaces: "AWS Libfabric"

CHANNEL_FORMATS = (   # the newest first: most logs in use today are in it
    # 2.12 adds the connection index and the PXN proxy rank "(%d)"; 2.18.3 prints nvmlDev
    # instead of the bus id; 2.26 adds "(PCI)"; 2.31 "/flush=" on a GDR receive.
    fmt("channel", "2.12-2.31", "src/transport/net.cc sendSetup/recvSetup",
        r"Channel (?P<channel>\d{1,9})/(?P<conn>\d{1,9}) : (?P<rank>\d+)\[(?P<dev>\w+)\] -> "
        r"(?P<peer>\d+)\[(?P<pdev>\w+)\] \[(?P<dir>send|receive)\] via NET/" + _NET
        + r"(?:\((?P<proxy>\d{1,9})\))?" + _SUFFIX + _FLUSH),
    fmt("channel", "2.4", "src/transport/net.cc netSendSetup/netRecvSetup",
        r"Ring (?P<channel>\d{1,9}) : (?P<rank>\d+) -> (?P<peer>\d+) \[(?P<dir>send|receive)\] "
        r"via NET/" + _NET + _SUFFIX),
    fmt("channel", "2.5-2.6", "src/transport/net.cc netSendSetup/netRecvSetup (busId)",
        r"Ring (?P<channel>\d{1,9}) : (?P<rank>\d+)\[(?P<dev>\w+)\] -> (?P<peer>\d+)\[(?P<pdev>\w+)\] "
        r"\[(?P<dir>send|receive)\] via NET/" + _NET + _SUFFIX),
    fmt("channel", "2.7-2.11", "src/transport/net.cc sendSetup/recvSetup",
        r"Channel (?P<channel>\d{1,9}) : (?P<rank>\d+)\[(?P<dev>\w+)\] -> (?P<peer>\d+)\[(?P<pdev>\w+)\] "
        r"\[(?P<dir>send|receive)\] via NET/" + _NET + _SUFFIX),
    # CollNet (SHARP): "Coll" 2.6-2.8, "CollNet" 2.9-2.13, "CollNet %02d/%1d" from 2.14.
    fmt("collnet", "2.6-2.30", "src/transport/coll_net.cc sendSetup/recvSetup",
        r"Coll(?:Net)? (?P<channel>\d{1,9})(?:/(?P<conn>\d{1,9}))? : (?P<rank>\d+) "
        r"\[(?P<dir>send|receive)\] via COLLNET/" + _NET + _SUFFIX),
)

SUFFIXES = ("/GDRDMA", "(PCI)", "/Shared") + tuple(f"/flush={kind}" for kind in FLUSH_TYPES)
PROXY_CUT = re.compile(r"\(\d*$")


def suffix_cut(rest: str) -> bool:
    """Whether the text after a channel line's last field is a suffix cut short ("/GDR",
    "(PC", a PXN rank "(1")."""
    rest = rest.rstrip()
    return any(suffix.startswith(rest) for suffix in SUFFIXES) or PROXY_CUT.match(rest) is not None


# Channel lines of connections inside a node (P2P, SHM, NVLS ...): no NIC involved.
LOCAL_CHANNEL = re.compile(r"(?:Channel|Ring) \d+(?:/\d+)? : \d+(?:\[\w+\])? -> \d+(?:\[\w+\])? via ")

NIC_LIST_FORMAT = fmt(
    "nic-list", "2.4-2.30, IBext",
    "src/transport/net_ib.cc (2.29+: net_ib/init.cc) ncclIbInit, net_socket.cc; plugin p2p_plugin.c",
    r"NET/(?P<net>IB|Socket) ?: Using(?P<devices>.*)")
# One entry of the IB list: " [%d]%s:%d/%s" (2.4-2.29; plugin "/SHARP" after it); 2.30 may
# put ":rail" and ":plane" after the port; 2.20-2.23 print a merged NIC as
# " [%d]={[%d] %s:%d/%s, ...}" (the outer index is the NIC NCCL uses).
_ENTRY = r"\[\d+\] ?(?P<name>[^\s:\[\]{}=,]+):(?P<port>\d{1,9})(?::\d*)*(?:/(?P<layer>\w+))?"
NIC_ENTRY = re.compile(_ENTRY)
# The members stop at the next brace either way ("[^}]*" tried at every "[0]={" of a line
# holding many and no "}" would cost the square of the line).
NIC_LIST_ITEM = re.compile(r"\[\d+\]=\{(?P<members>[^{}]*)\}|" + _ENTRY)
# net_socket.cc: " [%d]%s:%s" (interface and address).
SOCKET_ENTRY = re.compile(r"\[\d+\](?P<name>[^\s:\[\]]+):(?P<address>\S+)")

# NCCL's own verdict per NIC from 2.13: peer memory, or DMA-BUF on both sides
# (gdrSupport = NCCL_PTR_CUDA || (dmaBufSupport && NCCL_PTR_DMABUF)).
NIC_GDR_FORMAT = fmt(
    "nic-gdr", "2.13-2.30", "src/graph/topo.cc ncclTopoGetSystem / ncclTopoPopulateNics",
    r"NET/(?P<net>.+?) : GPU Direct RDMA (?P<state>Enabled|Disabled) for HCA (?P<index>\d{1,9}) "
    r"'(?P<name>[^']*)'")
NEITHER_PATH = "neither peer memory nor DMA-BUF"     # why NIC_GDR_FORMAT says Disabled

NIC_FORMATS = (
    fmt("no-device", "2.4-2.30, IBext", "src/transport/net_ib.cc ncclIbInit",
        r"NET/(?P<net>IB) ?: No device found"),
    # 2.24+ (and the plugin from 2024-10): every NIC, and each NIC merged from several.
    fmt("virtual-nic", "2.24-2.30, IBext", "src/transport/net_ib.cc ncclIbMakeVDeviceInternal",
        r"NET/(?P<net>IB) ?: Made virtual device \[(?P<index>\d{1,9})\] name=(?P<name>\S+) "
        r"speed=\d+ ndevs=(?P<ndevs>\d{1,9})"),
    fmt("nic-gdr", "2.5-2.12, IBext to 2023-05", "src/transport/net_ib.cc ncclIbGdrSupport callers",
        r"NET/(?P<net>IB) : GPU Direct RDMA (?P<state>Disabled) for HCA (?P<index>\d{1,9}) "
        r"'(?P<name>[^']*)' \((?P<reason>no module)\)"),
    fmt("nic-gdr", "2.4", "src/transport/net_ib.cc ncclIbGdrSupport",
        r"NET/(?P<net>IB) : GPU Direct RDMA (?P<state>Disabled) for GPU \w+\[\d+\] / HCA (?P<index>\d{1,9}) "
        r"'(?P<name>[^']*)' \((?P<reason>no module or not supported by GPU)\)"),
    NIC_GDR_FORMAT,
    # nccl-rdma-sharp-plugins from 2023-06 (NCCL 2.18+): which registration path each NIC
    # offers. The format string has no closing quote.
    fmt("nic-path", "IBext 2023-06+", "nccl-rdma-sharp-plugins src/p2p_plugin.c ncclIbGetPhysProperties",
        r"NET/(?P<net>IB) : GPU Direct RDMA \((?P<path>nvidia-peermem|DMABUF)\) enabled for HCA "
        r"(?P<index>\d{1,9}) '(?P<name>[^'\s]*)'?"),
)

# The per-pair decision (distance against NCCL_NET_GDR_LEVEL), one format per era.
_DIST = r"distance (?P<distance>\d{1,9}) (?P<op>[<>]=?) (?P<level>\d{1,9})"
PAIR_FORMATS = (
    fmt("pair-gdr", "2.4", "src/transport/net.cc netGetGdrSupport",
        r"NET/[^:]+ : GPU Direct RDMA (?P<state>Enabled|Disabled) for GPU (?P<gpu>\d+\[\d+\]) / "
        r"HCA (?P<nic>\d{1,9}) \(" + _DIST + r"\)(?:, read (?P<read>\d))?"),
    fmt("pair-gdr", "2.5-2.6", "src/transport/net.cc netGetGdrSupport",
        r"NET/[^:]+ : GPU Direct RDMA (?P<state>Enabled|Disabled) for GPU (?P<gpu>[0-9a-f]+) / "
        r"HCA (?P<nic>\d{1,9}) \(" + _DIST + r"\)(?:, read (?P<read>\d))?"),
    # GPU bus id and NIC index (2.7-2.20), NIC id in hex (2.21-2.23), the GPU's rank
    # (2.24-2.28); " mode %s" from 2.26.
    fmt("pair-gdr", "2.7-2.28", "src/graph/paths.cc ncclTopoCheckGdr",
        r"GPU Direct RDMA (?P<state>Enabled|Disabled) for GPU (?P<gpu>\w+) / HCA (?P<nic>\w+) \("
        + _DIST + r"\)(?:, read (?P<read>\d)(?: mode (?P<mode>\w+))?)?"),
    # 2.29 (INFO) and 2.30+ (TRACE only): topology ids, the rank, the PXN GPU.
    fmt("pair-gdr", "2.29-2.30", "src/graph/paths.cc ncclTopoCheckGdr (gpuNetMsg)",
        r"GPU Direct RDMA (?P<state>Enabled|Disabled) for GPU/(?P<gpu>[\d-]+) \(rank \d+\) - "
        r"NET/(?P<nic>[\d-]+) \((?: using PXN via GPU/(?P<pxn>[\d-]+), )?" + _DIST
        + r"(?:, read (?P<read>\d), mode (?P<mode>\w+))?\)"),
)

OTHER_FORMATS = (
    fmt("version", "2.4-2.30", "src/init.cc showVersion (VERSION_STRING)",
        r"NCCL version (?P<major>\d{1,9})\.(?P<minor>\d{1,9})\.(?P<patch>\d{1,9})"),
    fmt("network", "2.6-2.30", "src/init.cc initNet / ncclNetInit",
        # The name up to its last non-space character: ".+?\s*$" would try "\s*$" over the
        # spaces after every character (the square of a line of spaces).
        r"Using network (?P<net>\S(?:.*\S)?)\s*$"),
    fmt("gpu-dmabuf", "2.13-2.30", "src/init.cc dmaBufSupported",
        r"DMA-BUF is available on GPU device (?P<device>\d{1,9})"),
    fmt("env", "2.4-2.30", "src/misc/param.cc ncclLoadParam, graph/paths.cc ncclGetLevel",
        r"(?P<name>NCCL_[A-Z0-9_]+) set by environment to (?P<value>\S+)"),
    # 2.24+: GDR 0 when a ring's network connection (connIndex 0) went without GDR.
    fmt("ring-summary", "2.24-2.30", "src/transport/generic.cc ncclTransportRingConnect",
        r"Connected all rings, use ring PXN (?P<pxn>\d) GDR (?P<gdr>\d)"),
)

# aws-ofi-nccl logs through NCCL with "NET/OFI " before its own format (nccl_ofi_log.h).
OFI_FORMATS = (
    fmt("ofi-gdr-off", "aws-ofi-nccl 1.7+", "src/nccl_ofi_ofiutils.c nccl_ofi_ofiutils_init_connection",
        r"NET/OFI (?P<reason>Could not disable CUDA API usage for HMEM, disabling GDR)"),
    fmt("ofi-gdr-off", "aws-ofi-nccl 1.8+", "src/platform-aws.c platform_config_endpoint",
        r"NET/OFI (?P<reason>GDR disabled on GDR-supported instance type \S+)"),
    fmt("ofi-dmabuf", "aws-ofi-nccl 1.13+", "src/nccl_ofi_net.c nccl_net_ofi_info_properties",
        r"NET/OFI Support for DMA-BUF registrations: (?P<supported>true|false)"),
)

# RCCL, AMD's fork (ROCm/rccl at 0cbce2a7, the 6.3 line on NCCL 2.21.5), prints NCCL's lines
# above with a HIP build's values (bus ids in hex, " comm %p nRanks %02d" after a channel's
# suffix) and, at init, its own: its version, and why GPU memory can or cannot be registered
# with the NIC through peer memory (amdkfd's PeerDirect) or DMA-BUF.
RCCL_PEER_FOUND = r"/sys/(?:kernel/(?:mm/)?)?memory_peers/amdkfd/version"
RCCL_FORMATS = (
    fmt("rccl-version", "RCCL", "src/init.cc showVersion (VERSION_STRING of a HIP build)",
        r"RCCL version : (?P<major>\d{1,9})\.(?P<minor>\d{1,9})\.(?P<patch>\d{1,9})"),
    # The three memory_peers files in its order, the inbox kernel's peer-memory symbol, the
    # debugging override; "GDRDMA not enabled" when none was found (or Hyper-V's
    # numa_balancing rule turned it off): the NIC then offers no NCCL_PTR_CUDA.
    fmt("rccl-peer-memory", "RCCL", "src/transport/net_ib.cc ncclIbGdrSupport",
        r"(?:Found (?P<found>" + RCCL_PEER_FOUND + r"|ib_register_peer_memory_client)"
        r"|(?P<forced>RCCL_FORCE_ENABLE_GDRDMA) = 1, so explicitly setting moduleLoaded = 1"
        r"|(?P<missing>GDRDMA not enabled)\. Could not find memory_peers directory or peer_memory symbol)"),
    # DMA-BUF off: the variable unset or 0 (its default), HSA without the DMA-BUF attribute,
    # the kernel's configuration without both options, libhsa-runtime64 without the export
    # (a WARN); on: "DMA_BUF Support Enabled". Off also keeps the NIC's NCCL_PTR_DMABUF off
    # (net_ib.cc ncclIbDmaBufSupport calls the same rocmLibraryInit).
    fmt("rccl-dmabuf", "RCCL", "src/misc/rocmwrap.cc initOnceFunc",
        r"(?P<off>Dmabuf feature disabled without NCCL_DMABUF_ENABLE=1"
        r"|Current version of ROCm does not support dmabuf feature"
        r"|DMA_BUF_SUPPORT Failed due to OS kernel support"
        r"|Failed to load ROCr missing symbol hsa_amd_portable_export_dmabuf)"
        r"|(?P<on>DMA_BUF Support Enabled)"),
)

# GPU-initiated networking (GIN, NVIDIA/nccl v2.28.7-1 .. v2.30.7-1; gdrprobe/nccl/log_gin.py
# reads them): whether NCCL gave a communicator GIN, through which backend, and why not.
GIN_FORMATS = (
    fmt("gin-off", "2.28.7-2.30", "src/gin/gin_host.cc ncclGinConnectOnce (WARN)",
        r"(?P<why>GIN is disabled|GIN not supported|No GIN-capable devices found)\."),
    fmt("gin-off", "2.29.7-2.30", "src/transport/net_ib/gin.cc ncclGinIbGdrSupport, ncclGinIbGdrGpuSupport",
        r"(?P<why>Unable to use GIN: Peermem is not supported, (?:nor DMA-BUF|and device \d{1,9} does "
        r"not support DMA-BUF))\."),
    fmt("gin-off", "2.30.3-2.30", "src/plugin/gin.cc ncclGinInit",
        r"(?P<why>Compute Capability \(\d{1,9}\) is not sufficient to enable GIN)"),
    fmt("gin-off", "2.28.7-2.30", "src/dev_runtime.cc, src/gin/gin_host.cc (WARN)",
        r"(?P<why>Communicator does not support symmetric memory!"
        r"|User requested GIN but not all ranks in the communicator support GIN)"),
    fmt("gin-off", "2.30.7", "src/plugin/gin.cc ncclGinInit",
        r"GIN/Plugin: (?P<why>Failed to initialize any GIN plugin)"),
    fmt("gin-symmetric", "2.29.2-2.30", "src/init.cc initTransportsRank",
        r"Symmetric memory is not supported\. cuMemEnable (?P<cumem>-?\d{1,9}), "),
    fmt("gin-plugin", "2.28.7-2.30.3", "src/plugin/net.cc, src/plugin/gin.cc ncclGinPluginAssignToComm",
        r"Assigned GIN plugin (?P<name>\S+) to comm"),
    fmt("gin-plugin", "2.30.7", "src/plugin/gin.cc ncclGinPluginAssignToComm",
        r"GIN/Plugin: Assigned plugin (?P<name>\S+) type (?P<type>\d{1,9}) to comm"),
    # "Created a QP group" from 2.28.7, "Created a QP" (no companion QP) from 2.30.7.
    fmt("gin-gdaki-qp", "2.28.7-2.30", "src/transport/net_ib/gdaki/gin_host_gdaki.cc",
        r"\[\d{1,9}\] Created a QP(?: group)?: qp_idx=\d{1,9}"),
    fmt("gin-cpu-proxy", "DOCA GPUNetIO in NCCL 2.28.7-2.30",
        "src/transport/net_ib/gdaki/doca-gpunetio/src/doca_gpunetio.cpp doca_gpu_verbs_export_qp (WARNING)",
        r"doca_gpu_verbs_export_qp\(\): (?P<why>Enabling CPU proxy mode)"),
)
# aws-ofi-nccl's GIN (src/rdma/gin/nccl_ofi_gin_api.cpp, nccl_ofi_gin_gdaki.cpp).
OFI_GIN_FORMATS = (
    fmt("ofi-gin", "aws-ofi-nccl 1.19+", "src/rdma/gin/nccl_ofi_gin_api.cpp nccl_ofi_gin_init",
        r"NET/OFI (?P<what>gin: Initializing|gin: GDAKI mode enabled)"),
    fmt("ofi-gin-gdaki", "aws-ofi-nccl 1.20+", "src/rdma/gin/nccl_ofi_gin_gdaki.cpp createContext",
        r"NET/OFI gin GDAKI: (?:(?P<done>createContext done)|(?P<why>createContext on a non-GDA-capable "
        r"environment|not supported on this platform|createContext failed))"),
)

# 2.31's diagnostics block: the header, a check's result ("[OK]" or "[INFO]", the check's name,
# what it found) and the closing line (src/diagnostics.cc ncclRunDiagnosticsActive,
# src/diagnostics/p2p.cc). Read by gdrprobe.nccl.log_diag.
DIAG_FORMATS = (
    fmt("diag", "2.31", "src/diagnostics.cc ncclRunDiagnosticsActive, src/diagnostics/p2p.cc",
        r"NCCL DIAG (?:(?P<header>=== NCCL Diagnostics ===)"
        r"|\[(?P<tag>OK|INFO)\] +(?P<check>[\w-]{1,64}): (?P<text>\S(?:.*\S)?)"
        r"|NCCL diagnostics completed in (?P<ms>\d{1,9}(?:\.\d{1,9})?) ms across (?P<ranks>\d{1,9}) ranks)"),
)

FORMATS = (CHANNEL_FORMATS + (NIC_LIST_FORMAT,) + NIC_FORMATS + PAIR_FORMATS + OTHER_FORMATS
           + OFI_FORMATS + RCCL_FORMATS + GIN_FORMATS + OFI_GIN_FORMATS + DIAG_FORMATS)
# The formats whose messages start "NET/" (the per-pair lines of 2.4-2.6 among them) and
# those that start "GPU " (the per-pair lines from 2.7).
NET_FORMATS = (NIC_LIST_FORMAT,) + NIC_FORMATS + PAIR_FORMATS[:2] + OFI_FORMATS + OFI_GIN_FORMATS
GPU_FORMATS = PAIR_FORMATS[2:]
# The rest: NCCL's other lines, then RCCL's own, then GIN's, then 2.31's diagnostics.
REST_FORMATS = OTHER_FORMATS + RCCL_FORMATS + GIN_FORMATS + DIAG_FORMATS


# ---- reading one message -------------------------------------------------------------------


def first_match(formats: tuple[LineFormat, ...], message: str) -> tuple[LineFormat, re.Match] | None:
    for line_format in formats:
        if match := line_format.pattern.match(message):
            return line_format, match
    return None


def continued(message: str, tail: str) -> str | None:
    """A network channel record whose line broke before its end (a terminal wrapped it in
    a paste: "... via" then " NET/IB/4/GDRDMA"), joined with the next line, which held
    only its end: the joined text when it is one whole channel line and nothing else, as
    written or with the one space a copy drops at the wrap; else None."""
    if message[:4] not in ("Chan", "Ring", "Coll") or not tail.strip():
        return None
    joins = [message + tail]
    if not message[-1:].isspace() and not tail[:1].isspace():
        joins.append(f"{message} {tail}")
    for joined in joins:
        matched = first_match(CHANNEL_FORMATS, joined)
        if matched is not None and not joined[matched[1].end():].strip():
            return joined
    return None


def formats_for(message: str) -> tuple[LineFormat, ...]:
    """The formats a message can be in, from how it starts (most lines need one test)."""
    head = message[:4]
    if head in ("Chan", "Ring", "Coll"):
        return CHANNEL_FORMATS
    if head == "NET/":
        return NET_FORMATS
    if head == "GPU ":
        return GPU_FORMATS
    return REST_FORMATS


def match_message(message: str) -> tuple[LineFormat, re.Match] | None:
    """The format a message is in and its match, or None."""
    return first_match(formats_for(message), message)


def nic_list(devices: str, net: str) -> list[tuple[str, int | None, str | None, tuple[str, ...]]]:
    """The NICs of a "Using" list in NCCL's order (the i-th is NIC i): name, port, link
    layer and, for a merged NIC, its members (2.20-2.23: named a+b as net_ib names it)."""
    devices = devices.split(";")[0]
    if net == "Socket":
        return [(entry.group("name"), None, None, ()) for entry in SOCKET_ENTRY.finditer(devices)]
    found = []
    for item in NIC_LIST_ITEM.finditer(devices):
        if item.group("members") is not None:
            members = list(NIC_ENTRY.finditer(item.group("members")))
            if not members:
                continue
            names = tuple(member.group("name") for member in members)
            first = members[0]
            found.append(("+".join(names), int(first.group("port")), first.group("layer"), names))
        else:
            found.append((item.group("name"), int(item.group("port")), item.group("layer"), ()))
    return found


def transport_of(net: str, collnet: bool = False) -> str:
    """NCCL's network name, normalised: IB for NCCL's own and the IBext plugins (IBext,
    IBext_v8 ..., "NCCL RDMA Plugin vN" as newer NCCL names it), OFI for aws-ofi-nccl
    ("AWS Libfabric", "Libfabric"), UCX, Socket; SHARP for CollNet."""
    if collnet:
        return "SHARP" if net.upper().startswith("SHARP") else net
    if net == "IB" or net.startswith(("IBext", "NCCL RDMA Plugin")):
        return "IB"
    if net.startswith("UCX"):
        return "UCX"
    if "Libfabric" in net or net.startswith("OFI"):
        return "OFI"
    return net


def nic_space(transport: str) -> str:
    """Which NIC list a transport's NIC index counts in. The plugin's UCX and SHARP
    transports use the IB plugin's devices (p2p_plugin.c nccl_p2p_ib_init; sharp_plugin.c
    ncclSharpDevices returns the IB plugin's device count), so their index is an IB NIC's."""
    return "IB" if transport in ("IB", "UCX", "SHARP") else transport
