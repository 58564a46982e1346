"""The report of ``gdrprobe nccl-log`` (:mod:`gdrprobe.nccl.log`): what an NCCL_DEBUG=INFO
log proves about GPUDirect RDMA. Part of the one report model (:mod:`gdrprobe.report.model`
serialises it with :func:`gdrprobe.report.model.to_json`); kept in a module of its own so
that one stays under the size limit.
"""

from __future__ import annotations

import dataclasses

from gdrprobe.errors import ExitCode

# Where nccl-log counts what it reads past one of its bounds (nccl/log.py): hosts past the
# first ones read as host OTHERS, NICs past the first ones as the one NIC OTHER_NIC
# (host, transport, index), names as OTHERS; the report's `summarised` says which.
OTHERS = "(others)"
OTHER_NIC = (OTHERS, OTHERS, -1)


@dataclasses.dataclass(frozen=True)
class ChannelUse:
    """One network channel line (kept only when the lines are asked for)."""

    line: int                 # 1-based line number in the log
    host: str                 # from the line's NCCL prefix ("" when it has none)
    channel: int
    direction: str            # "send" or "receive"
    local: str                # "rank[device]" (or "rank") as the log writes it
    remote: str               # the peer; "" for CollNet (a collective, no single peer)
    transport: str            # normalised: IB (NCCL's and the IBext plugins), OFI, UCX, Socket, SHARP
    net_plugin: str           # NCCL's name for the network: IB, IBext_v8, AWS Libfabric ...
    nic_index: int
    nic_name: str | None      # from the NIC lines, when the log has them for that host
    proxy_rank: int | None    # PXN: the rank whose NIC carries the data
    gdrdma: bool | None       # None: the line was cut before its suffix
    pci_mapping: bool         # "(PCI)": DMA-BUF mapped through PCIe on a C2C platform
    shared: bool
    collnet: bool
    flush: str | None = None  # 2.31, a GDR receive: NCCL's flush of it (None, Always, C2c), as printed


@dataclasses.dataclass(frozen=True)
class NicUse:
    host: str
    transport: str                    # the NIC list it counts in: IB (also UCX, SHARP), OFI, Socket
    index: int
    name: str | None
    port: int | None
    link_layer: str | None            # "IB", "RoCE"
    members: tuple[str, ...]          # the NICs merged into this one (a virtual NIC)
    net_plugins: tuple[str, ...]      # NCCL's names for the networks that used it
    gdr_capable: bool | None          # "GPU Direct RDMA Enabled/Disabled for HCA" (None: not logged, or both)
    gdr_disabled_because: tuple[str, ...]
    gdr_paths: tuple[str, ...]        # what a plugin said the NIC offers: DMA-BUF, nvidia-peermem
    gdr_mechanism: str | None         # DMA-BUF or peer memory, where the log proves which
    gdrdma_channels: int
    host_memory_channels: int
    unknown_channels: int             # lines cut before their GDR suffix


@dataclasses.dataclass(frozen=True)
class PairDecision:
    host: str
    gpu: str
    nic: str
    enabled: bool
    distance: int
    level: int
    comparison: str                   # as NCCL printed it: "5 > 4" (2.7+), "4 >= 4" (2.4-2.6)
    read: bool | None                 # the decision for sends (GDR read)
    mode: str | None                  # 2.26+: Default, or PCI (mapped through PCIe on C2C)
    pxn_via: str | None               # 2.29+: the GPU whose distance counted (PXN)
    count: int                        # times the log printed this decision


@dataclasses.dataclass(frozen=True)
class DmabufGpu:
    host: str
    device: int


@dataclasses.dataclass(frozen=True)
class DiagnosticResult:
    """One result of NCCL's own diagnostics (2.31+, NCCL_RUN_DIAGNOSTICS=1: nccl/log_diag.py)."""

    host: str
    tag: str                          # OK, or INFO: a failed verification or a check cut short
    check: str                        # p2p, ...
    text: str                         # what NCCL printed after the check's name
    count: int                        # times the log printed it


@dataclasses.dataclass(frozen=True)
class LogLine:
    line: int
    text: str


@dataclasses.dataclass(frozen=True)
class GinHost:
    """What the log says of GPU-initiated networking on one host (gdrprobe.nccl.log_gin)."""

    host: str
    mode: str                         # GPU-initiated, CPU proxy, none, GDAKI with the doorbell not logged
    backend: str | None               # GDAKI, proxy, EFA-GDA, as NCCL assigned it
    plugin: str | None                # NCCL's name for the GIN plugin: GIN_IB_GDAKI, Libfabric ...
    why: str
    reasons: tuple[str, ...]          # NCCL's words where GIN was refused
    cpu_proxy_lines: int              # DOCA GPUNetIO's "Enabling CPU proxy mode"
    gdaki_qps: int                    # GDAKI's "Created a QP" lines


@dataclasses.dataclass(frozen=True)
class GinLog:
    mode: str                         # one mode for every host, or "mixed: ..."
    hosts: tuple[GinHost, ...]


@dataclasses.dataclass(frozen=True)
class NcclLogReport:
    kind = "nccl-log"
    source: str
    library: str          # NCCL, or RCCL where the log holds RCCL's own lines
    nccl_version: str | None          # RCCL's too: it numbers its releases as the NCCL it forks
    verdict: str          # gdr-all, gdr-some, gdr-none, socket, gdr-unavailable, no-net-channels, unknown
    mechanism: str                    # DMA-BUF versus peer memory, as far as the log proves it
    net_plugins: tuple[str, ...]      # NCCL's network names in the log ("Using network", channels)
    hosts: tuple[str, ...]
    nics: tuple[NicUse, ...]
    network_channels: int             # network channel lines read
    gdrdma_channels: int
    host_memory_channels: int
    unknown_channels: int             # cut before their GDR suffix: counted neither way
    local_channels: int               # channel lines inside a node (P2P, SHM, NVLS)
    channels: tuple[ChannelUse, ...]  # every network channel line, when asked for (--lines)
    pair_decisions: tuple[PairDecision, ...]
    dmabuf_gpus: tuple[DmabufGpu, ...]
    env: tuple[str, ...]              # NCCL_*=value the log says the job set, where they matter here
    formats_read: tuple[str, ...]     # the line formats found: "channel (NCCL 2.12-2.30)"
    unrecognised_lines: int           # network lines in a format not recognised
    unrecognised_examples: tuple[LogLine, ...]
    cut_lines: int                    # lines with no line end, or longer than 64 KiB (read in pieces)
    joined_records: int               # records split across a line break (a paste's wrap), read whole
    summarised: tuple[str, ...]       # what the reader's bounds counted together (many hosts, NICs)
    lines_read: int
    conclusions: tuple[str, ...]
    cannot_conclude: tuple[str, ...]
    gin: GinLog | None = None         # GPU-initiated networking, where the log says something of it
    diagnostics: tuple[DiagnosticResult, ...] = ()   # NCCL's own diagnostics (2.31+), as printed

    @property
    def exit_code(self) -> int:
        """1 when the log shows GPUDirect RDMA unused (network channels, none with GDRDMA)
        or off on every NIC; 9 when its network lines could not be read."""
        if self.verdict in ("gdr-none", "socket", "gdr-unavailable"):
            return int(ExitCode.VERDICT_NOT_OK)
        return int(ExitCode.NOT_TESTABLE if self.verdict == "unknown" else ExitCode.OK)
