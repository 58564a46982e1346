"""The one report model: everything a user sees is one of these dataclasses.

JSON output is this model serialised by :func:`to_json`; field names carry their
units (``bandwidth_gbps``, ``latency_us_p99``). Renderers format these objects;
they never build their own dictionaries.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any

from gdrprobe.errors import ExitCode

SCHEMA_VERSION = 1


class Status(str, enum.Enum):
    """Status of one doctor finding."""

    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"
    INFO = "info"


@dataclasses.dataclass(frozen=True)
class Evidence:
    """Where a fact came from (a file, a call) and the value read there."""

    source: str
    value: str


@dataclasses.dataclass(frozen=True)
class Finding:
    """One doctor check's answer."""

    id: str
    group: str                # flowchart group: topology, stack, gpu, memlock, iommu, acs, nccl, nic
    status: Status
    summary: str
    evidence: tuple[Evidence, ...] = ()
    fix: str = ""


@dataclasses.dataclass(frozen=True)
class DoctorReport:
    kind = "doctor"
    root: str
    findings: tuple[Finding, ...]


# ---- RDMA device inventory -------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GidEntry:
    index: int
    gid: str
    type: str                 # "IB", "RoCE v1", "RoCE v2"
    netdev: str | None        # the network interface behind a RoCE GID
    ip_address: str | None    # the IP address a RoCE GID encodes


@dataclasses.dataclass(frozen=True)
class PortInfo:
    port: int
    state: str                # "ACTIVE", "DOWN", ...
    physical_state: str       # "LINK_UP", "DISABLED", ...
    link_layer: str           # "Ethernet" or "InfiniBand"
    active_mtu_bytes: int
    max_mtu_bytes: int
    active_speed: str         # verbs speed name, e.g. "25.0 Gbps"
    active_width: str         # "1X", "4X", ...
    rate_gbps: float | None   # speed x width, when both are known
    lid: int
    gids: tuple[GidEntry, ...]


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    name: str
    node_guid: str
    transport: str            # "InfiniBand", "iWARP", ...
    node_type: str
    firmware_version: str
    vendor_id: int
    vendor_part_id: int
    ports: tuple[PortInfo, ...]


@dataclasses.dataclass(frozen=True)
class DeviceReport:
    kind = "devices"
    devices: tuple[DeviceInfo, ...]


# ---- serialisation ---------------------------------------------------------


def to_dict(obj: Any) -> Any:
    """Turn a report object into plain JSON-compatible data, keeping field order."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [to_dict(item) for item in obj]
    if isinstance(obj, dict):
        return {str(key): to_dict(value) for key, value in obj.items()}
    return obj


def to_json(report: Any) -> str:
    """Serialise a top-level report with its kind and the schema version."""
    document = {"schema_version": SCHEMA_VERSION, "kind": report.kind}
    document.update(to_dict(report))
    return json.dumps(document, indent=2)


# ---- measurements ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Integrity:
    """What the receiver found in its buffer after one size."""

    checked: bool
    bytes_checked: int
    bad_bytes: int                 # bytes of the message that differ from the pattern
    first_bad_offset: int | None
    stray_bytes: int               # bytes past the message that were written
    first_stray_offset: int | None

    @property
    def ok(self) -> bool:
        return self.checked and self.bad_bytes == 0 and self.stray_bytes == 0


@dataclasses.dataclass(frozen=True)
class BandwidthResult:
    size_bytes: int
    iterations: int                # messages in the measured window, all QPs
    elapsed_s: float
    bandwidth_avg_gbps: float      # 10^9 bit/s
    bandwidth_peak_gbps: float
    bandwidth_avg_mib_s: float     # 2^20 byte/s, perftest's default unit
    bandwidth_peak_mib_s: float
    message_rate_mpps: float
    integrity: Integrity


@dataclasses.dataclass(frozen=True)
class LatencyResult:
    """One-way latency: half of each measured round trip, as perftest reports it."""

    size_bytes: int
    iterations: int
    latency_us_min: float
    latency_us_median: float
    latency_us_mean: float
    latency_us_stdev: float
    latency_us_p99: float
    latency_us_p999: float
    latency_us_max: float
    integrity: Integrity


@dataclasses.dataclass(frozen=True)
class EndpointSummary:
    host: str
    device: str
    port: int
    gid_index: int
    gid: str
    mtu_bytes: int
    qp_numbers: tuple[int, ...]
    memory: dict


@dataclasses.dataclass(frozen=True)
class RunSettings:
    mode: str                      # "bandwidth" or "latency"
    sizes_bytes: tuple[int, ...]
    iterations: int
    warmup_iterations: int
    duration_s: float | None
    warmup_s: float
    qps: int
    tx_depth: int
    cq_moderation: int
    post_list: int
    mtu_bytes: int


@dataclasses.dataclass(frozen=True)
class RunReport:
    kind = "run"
    settings: RunSettings
    local: EndpointSummary
    remote: EndpointSummary
    handle_route: str              # how the raw verbs handles were found
    bandwidth: tuple[BandwidthResult, ...]
    latency: tuple[LatencyResult, ...]


@dataclasses.dataclass(frozen=True)
class ArmReport:
    """One arm of the A/B: which memory each side used and what it measured."""

    arm: str                       # host | dmabuf | peermem | staged | gpu (auto, not run)
    outcome: str                   # measured | not testable | registration failed
    size_bytes: int
    bandwidths_gbps: tuple[float, ...]   # one per repeat, at size_bytes
    local_memory: dict
    remote_memory: dict
    mechanism_reason: str
    detail: str                    # the error, when the arm did not run
    fix: str


# ---- the A/B's verdict -----------------------------------------------------------

ENGAGED = "engaged"
DEGRADED = "degraded"
NOT_ENGAGED = "not engaged"
NOT_TESTABLE = "not testable"

EXIT_CODES = {ENGAGED: ExitCode.OK, DEGRADED: ExitCode.VERDICT_NOT_OK,
              NOT_ENGAGED: ExitCode.VERDICT_NOT_OK, NOT_TESTABLE: ExitCode.NOT_TESTABLE}

DEFAULT_THRESHOLD = 0.9   # the GPU/host ratio that counts as engaged


@dataclasses.dataclass(frozen=True)
class ArmRatio:
    """One GPU arm against the host arm: median of paired per-repeat ratios, and its range."""

    arm: str
    mechanism: str | None
    memory_kind: str
    ratio: float
    ratio_min: float
    ratio_max: float
    repeats: int


@dataclasses.dataclass(frozen=True)
class Verdict:
    classification: str                  # engaged | degraded | not engaged | not testable
    mechanism: str | None = None         # the mechanism the classification is about
    ratio: float | None = None           # gpu/host, median of paired repeats
    ratio_min: float | None = None
    ratio_max: float | None = None
    threshold: float = DEFAULT_THRESHOLD
    inconclusive: bool = False           # the per-repeat ratios straddle the threshold
    evidence: tuple[str, ...] = ()
    likely_causes: tuple[str, ...] = ()
    fix: str = ""
    arms: tuple[ArmRatio, ...] = ()
    exit_code: int = dataclasses.field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "exit_code", int(EXIT_CODES[self.classification]))


@dataclasses.dataclass(frozen=True)
class CheckReport:
    """The A/B and its verdict."""

    kind = "check"
    verdict: Verdict
    arms: tuple[ArmReport, ...]
    settings: RunSettings
    repeats: int


# ---- what an NCCL log proves (gdrprobe.nccl.log) ------------------------------------


@dataclasses.dataclass(frozen=True)
class ChannelUse:
    line: int                 # 1-based line number in the log
    channel: int
    direction: str            # "send" or "receive"
    local: str                # "rank[device]" as the log writes it
    remote: str
    transport: str            # "IB" or "Socket"
    nic_index: int
    nic_name: str | None      # from the "NET/IB : Using" list, when the log has it
    proxy_rank: int | None    # PXN: the rank whose NIC carries the data
    gdrdma: bool
    pci_mapping: bool         # "(PCI)": DMA-BUF mapped through PCIe on a C2C platform
    shared: bool


@dataclasses.dataclass(frozen=True)
class NicUse:
    index: int
    name: str
    port: int | None
    link_layer: str | None            # "IB", "RoCE"
    gdr_capable: bool | None          # from "GPU Direct RDMA Enabled/Disabled for HCA"
    gdrdma_channels: int
    host_memory_channels: int


@dataclasses.dataclass(frozen=True)
class PairDecision:
    line: int
    gpu: str
    nic: str
    enabled: bool
    distance: int
    level: int


@dataclasses.dataclass(frozen=True)
class NcclLogReport:
    kind = "nccl-log"
    source: str
    nccl_version: str | None
    verdict: str                      # "gdr-all", "gdr-some", "gdr-none", "socket", "no-net-channels"
    mechanism: str                    # what the log says about DMA-BUF versus peermem
    nics: tuple[NicUse, ...]
    channels: tuple[ChannelUse, ...]
    pair_decisions: tuple[PairDecision, ...]
    dmabuf_gpus: tuple[int, ...]
    conclusions: tuple[str, ...]
    cannot_conclude: tuple[str, ...]
