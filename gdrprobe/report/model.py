"""The one report model: everything a user sees is one of these dataclasses.

JSON output is this model serialised by :func:`to_json`; field names carry their
units (``bandwidth_avg_gbps``, ``latency_us_p99``). Renderers format these objects;
they never build their own dictionaries. The A/B's reports (arms, verdict, check, node
check) are in :mod:`gdrprobe.report.check`.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import TYPE_CHECKING, Any

from gdrprobe.errors import ExitCode
from gdrprobe.report import finding_ids

if TYPE_CHECKING:   # the bench's pairs hold the A/B's verdict; report.check imports this module
    from gdrprobe.report.check import RailsReport, Verdict
    from gdrprobe.report.nccl_pattern import NcclAnswer, NcclPatternResult

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
class NcclChannel:
    """The network device one of a GPU's channels uses, and GPUDirect RDMA on it."""

    channel: int
    nic: str                      # the RDMA device (the first one of a fused virtual NIC)
    net: str                      # NCCL's network device: mlx5_0, mlx5_0:2 (a port), mlx5_0+mlx5_1 (fused)
    path_type: str
    via_gpu: str | None           # PXN: bus id of the peer GPU the channel relays through
    gdr_write: bool
    gdr_read: bool


@dataclasses.dataclass(frozen=True)
class NcclGpuDecision:
    """What NCCL will do with one GPU's network traffic, decided by NCCL's rules (doctor)."""

    gpu: str                      # GPU0, GPU1, ... in PCI bus order
    gpu_bdf: str
    nic: str | None               # the NIC channel 0 uses; None: no NIC NCCL may use
    path: str                     # direct, pxn (through an NVLink peer), c2c (Grace), socket (host memory), none
    via_gpu: str | None           # pxn: bus id of the peer GPU whose NIC it is
    path_type: str | None         # NCCL's path type (PIX, PXB, P2C, PXN, PHB, SYS)
    bandwidth_gbs: float          # NCCL's path bandwidth, GB/s
    gdr_write: bool               # receives: the NIC writes GPU memory directly
    gdr_read: bool                # sends: the NIC reads GPU memory directly
    why: tuple[str, ...]
    candidates: tuple[str, ...]   # NICs NCCL rates equal; channels take them in turn
    net: str | None = None        # NCCL's network device channel 0 uses (see NcclChannel.net)
    gdr_mode: str = "disabled"    # receives: default, pci (a PCIe mapping forced on a C2C system), disabled
    mechanism: str | None = None  # what GPU memory is registered through: dmabuf, peermem; None without GDR
    channels: tuple[NcclChannel, ...] = ()  # channel c uses channels[c % len(channels)]
    detour_from: str | None = None  # the path type NCCL had before GDR was found off on it and it
                                    # routed the path through the CPU (path_type is then PHB or P2C)
    mechanism_reason: str = ""    # the rule and the NCCL release that chose the mechanism; the other as information
    nccl_version: str | None = None  # the job's NCCL whose rules decided; None: unknown, 2.30.7's rules
    data_direct: str | None = None  # net is <dev>_dma: the bus id of the data-direct device NCCL places it at
    unread: str = ""              # GPUDirect is off here but facts NCCL reads and the doctor could not
                                  # (NVLink, C2C) could turn it on: not decided, never a node fault


@dataclasses.dataclass(frozen=True)
class NcclCandidate:
    """The libnccl one Python on the machine (or a program that is none) would load (doctor)."""

    python: str                   # which Python, and how it was found
    path: str | None              # None: none found
    version: str | None
    source: str                   # the rule that picked it


@dataclasses.dataclass(frozen=True)
class NcclLibrary:
    """The libnccl the job will load, found without loading it (doctor)."""

    path: str | None              # None: none found
    version: str | None           # 2.21.5; None: not readable
    source: str                   # the rule that picked it: --nccl, torch's RPATH, LD_LIBRARY_PATH, ld.so.cache, ...
    version_from: str | None      # the file name, the wheel's metadata, or the library's bytes
    shadowed: tuple[str, ...] = ()     # other copies found later in the loader's order
    differences: tuple[str, ...] = ()  # what this release does differently from the rules of 2.30.7
    python: str | None = None     # the Python the answer is for (None: --nccl names the library)
    python_named: bool = True     # False: no --nccl, the answer is the default's; see candidates
    candidates: tuple[NcclCandidate, ...] = ()  # without --nccl: what each Python found would load
    library: str = "NCCL"         # or RCCL, looked for on an AMD node (librccl.so.1)


@dataclasses.dataclass(frozen=True)
class DoctorReport:
    kind = "doctor"
    root: str
    findings: tuple[Finding, ...]
    nccl: tuple[NcclGpuDecision, ...] = ()
    nccl_library: NcclLibrary | None = None

    @property
    def exit_code(self) -> int:
        """1 when a check failed; warnings, skips and infos do not change it. A check that
        crashed is a bug in gdrprobe, not a fault of the node: alone it exits 70 (internal
        error), which a prolog does not drain on."""
        failed = [finding for finding in self.findings if finding.status is Status.FAIL]
        if any(not finding_ids.is_crashed(finding.id) for finding in failed):
            return int(ExitCode.VERDICT_NOT_OK)
        return int(ExitCode.INTERNAL if failed else ExitCode.OK)


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

    def port_info(self, port: int) -> PortInfo | None:
        """The listed port numbered `port` (verbs numbers from 1); None: not listed."""
        return next((p for p in self.ports if p.port == port), None)


@dataclasses.dataclass(frozen=True)
class DeviceReport:
    kind = "devices"
    devices: tuple[DeviceInfo, ...]
    # Devices libibverbs lists that this process cannot open, each with why (NCCL skips them).
    skipped: tuple[str, ...] = ()


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
    messages_checked: int = 1      # this many messages of the size were checked (all, or
    messages_total: int = 1        # the last ones of a run that samples), of this many
    bad_messages: int = 0          # of those checked, how many had a wrong byte
    # NCCL's flush before each check (an RDMA READ of the last message's first byte, on a
    # loopback QP): how many ran, and how many brought back another byte than it put there
    flush_reads: int = 0
    flush_bad: int = 0
    first_flush_bad_offset: int | None = None
    flush_us_median: float | None = None   # the flush READs' median time, post to completion

    @property
    def coverage(self) -> str:
        if self.messages_checked >= self.messages_total:
            return f"checked {self.messages_checked}/{self.messages_total} messages"
        return f"checked the last {self.messages_checked} of {self.messages_total} messages"

    @property
    def ok(self) -> bool:
        return (self.checked and self.bad_bytes == 0 and self.stray_bytes == 0
                and self.flush_bad == 0)


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
    # A staged side's GPU<->host copies of one message, as a rate (None without staging).
    stage_copy_gbps: float | None = None
    # The time the sender waited, between passes, for the receiver to check every message
    # (outside elapsed_s), and how many passes it checked; 0 for a run that samples.
    integrity_pause_s: float = 0.0
    integrity_passes: int = 0
    # Every message the run posted, warm-up and window, all QPs: what it put on the wire.
    messages_posted: int = 0


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
    elapsed_s: float               # the timed round trips added up: the time spent measuring


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
    notes: tuple[str, ...] = ()   # why this device and GID: devices skipped, the GID's rule


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
    window_bytes: int | None = None   # with duration_s: a warm-up or window ends at this too
    inline_bytes: int = 0          # messages up to this size were posted inline
    inline_note: str = ""          # why inline was forced off (a GPU source buffer)
    clock: str = ""                # what the loops timed with, and why (measure/clock.py)
    integrity: str = ""            # which messages the receiver checked, and when
    flush: str = ""                # NCCL's flush before each check, and the rule that asked
                                   # for it ("" where none ran)
    opcode: str = "write"          # the RDMA operation measured: write or read
    perftest: str = ""             # perftest's program for the same test (ib_read_bw ...)
    send_memory: str = ""          # latency: "host" where each side sent from a host buffer of its
                                   # own (NCCL's LL placement); "": from its own buffer
    pattern: str = ""              # --pattern nccl: its connections (measure.nccl_shape)


@dataclasses.dataclass(frozen=True)
class BidirResult:
    """One size of a bidirectional run (perftest's -b): each direction's average, Gb/s."""

    size_bytes: int
    client_to_server_gbps: float
    server_to_client_gbps: float
    sum_gbps: float


@dataclasses.dataclass(frozen=True)
class RunReport:
    kind = "run"
    settings: RunSettings
    local: EndpointSummary
    remote: EndpointSummary
    handle_route: str              # how the raw verbs handles were found
    bandwidth: tuple[BandwidthResult, ...]
    latency: tuple[LatencyResult, ...]
    # The server's doctor findings about its own GPU buffer's path (empty for host memory).
    remote_findings: tuple[Finding, ...] = ()
    # --bidir: the server's WRITEs into this side, timed by the server, and per size both
    # directions with their sum
    reverse: tuple[BandwidthResult, ...] = ()
    bidirectional: tuple[BidirResult, ...] = ()
    # --pattern nccl: per size, NCCL's pattern after the stream (report.nccl_pattern), and
    # its answer against the stream of the same size
    nccl: tuple[NcclPatternResult, ...] = ()
    nccl_answers: tuple[NcclAnswer, ...] = ()


@dataclasses.dataclass(frozen=True)
class LatencyRatio:
    """One size of a latency A/B: each arm's median over its repeats' medians (one-way, us)."""

    size_bytes: int
    host_median_us: float
    gpu_median_us: float
    gpu_over_host: float           # the GPU arm's median over the host arm's
    # Each repeat's GPU median over the host median measured just before it: a burst of
    # load that slowed some runs shows as pairs on both sides of a bound.
    pair_ratios: tuple[float, ...] = ()


@dataclasses.dataclass(frozen=True)
class LatencyABReport:
    """`run --latency` with GPU memory: the host arm and the GPU arm, alternately, each
    repeat a whole run with the same opcode (WRITE with immediate) and settings."""

    kind = "latency-ab"
    settings: RunSettings          # the GPU arm's
    host: tuple[RunReport, ...]    # each repeat's run, host memory at both ends
    gpu: tuple[RunReport, ...]     # each repeat's run with the GPU memory asked for
    ratios: tuple[LatencyRatio, ...]
    exit_code: int = 0             # information: latency is not judged here


@dataclasses.dataclass(frozen=True)
class PartialRunReport:
    """A run that failed after some sizes: the rows measured before the failure, and it."""

    kind = "partial-run"
    bandwidth: tuple[BandwidthResult, ...]
    latency: tuple[LatencyResult, ...]
    error_cause: str
    error_fix: str
    error_evidence: str
    exit_code: int


@dataclasses.dataclass(frozen=True)
class ErrorReport:
    """A command that ended in an error instead of its report: its --json document, with
    the exit code and what a scheduler does with it (docs/json.md)."""

    kind = "error"
    command: str                   # devices, run, check ...; "" before a command was known
    exit_code: int
    action: str                    # start the job, drain or warn (errors.SCHEDULER_ACTION)
    error_cause: str
    error_evidence: str
    error_fix: str


# ---- the benchmark sweep (gdrprobe.campaign.bench) -------------------------------------


@dataclasses.dataclass(frozen=True)
class BenchRow:
    """One size of one run of the sweep, or why that run could not be made.

    Bandwidth rows fill the bandwidth fields, latency rows (host memory: the CPU polls)
    the latency fields; the rest stay None, so both kinds share one CSV header."""

    mode: str                      # bandwidth | latency
    gpu: str                       # the GPU's PCI bus id (or CUDA ordinal); "" for host memory
    nic: str
    memory: str                    # host | dmabuf | peermem | staged
    qps: int
    size_bytes: int
    outcome: str                   # measured | not testable | registration failed | failed
    iterations: int | None = None
    elapsed_s: float | None = None
    bandwidth_avg_gbps: float | None = None
    bandwidth_peak_gbps: float | None = None
    message_rate_mpps: float | None = None
    gpu_host_ratio: float | None = None        # over the host row of the same NIC, QPs, size
    line_rate_fraction: float | None = None    # average bandwidth over the port's rate
    latency_us_min: float | None = None
    latency_us_median: float | None = None
    latency_us_mean: float | None = None
    latency_us_stdev: float | None = None
    latency_us_p99: float | None = None
    latency_us_p999: float | None = None
    latency_us_max: float | None = None
    detail: str = ""                # the error, when the run did not measure
    fix: str = ""
    # --bidir: both sides WRITE at once; bandwidth_avg_gbps is this side's WRITEs into the
    # other, reverse_gbps the other side's into this one, in the same window, and the sum.
    reverse_gbps: float | None = None
    bidir_sum_gbps: float | None = None
    # --pattern nccl: NCCL's pattern after the stream at this size (report.nccl_pattern):
    # its rate, its ceiling per connection, a step alone and the answer
    nccl_gbps: float | None = None
    nccl_ceiling_gbps: float | None = None
    nccl_step_us: float | None = None
    nccl_answer: str | None = None


@dataclasses.dataclass(frozen=True)
class BenchPair:
    """One GPU-NIC pair of the sweep and the verdict its largest size gives."""

    gpu: str
    nic: str
    nic_reason: str                # why this NIC: NCCL's choice, --matrix, the only device
    line_rate_gbps: float | None   # the port's speed x width
    verdict: Verdict | None        # None when no GPU memory kind was swept


@dataclasses.dataclass(frozen=True)
class BenchEnvironment:
    """What produced the numbers, so two sweeps can be compared."""

    hostname: str
    kernel: str
    gdrprobe_version: str
    rdma_core_version: str | None
    cuda_python_version: str | None
    cuda_driver_version: int | None   # CUDA's encoding: 12080 is 12.8
    nvidia_driver_version: str | None
    gpus: tuple[dict, ...]         # the CUDA driver's inventory (name, bus id, attributes)


@dataclasses.dataclass(frozen=True)
class BenchSettings:
    sizes_bytes: tuple[int, ...]
    memory_kinds: tuple[str, ...]
    qps: tuple[int, ...]
    matrix: bool
    iterations: int
    duration_s: float | None
    warmup_s: float
    tx_depth: int
    cq_moderation: int
    latency_iterations: int        # 0: no latency rows (bench(latency_iterations=None))
    threshold: float
    ib_port: int
    opcode: str = "write"          # the RDMA operation every run measures: write or read
    bidir: bool = False            # both sides WRITE at once in every bandwidth run (perftest -b)
    all_rails: bool = False        # after the sweep, every rail at once (campaign.rails)
    pattern: str = ""              # nccl: each bandwidth size also as NCCL's steps


@dataclasses.dataclass(frozen=True)
class BaselineChange:
    """A row that fell against the baseline by more than the allowed drop."""

    row: BenchRow                  # as measured now
    before: float                  # the baseline's Gb/s (bandwidth) or median us (latency)
    change: float | None           # now / before - 1 (None: not measured now)
    reason: str


@dataclasses.dataclass(frozen=True)
class BaselineComparison:
    source: str
    max_drop: float                # the allowed fall, as a fraction
    compared: int                  # rows found in both
    not_in_this_run: int           # baseline rows this sweep did not measure
    changes: tuple[BaselineChange, ...]


@dataclasses.dataclass(frozen=True)
class BenchReport:
    kind = "bench"
    environment: BenchEnvironment
    devices: tuple[DeviceInfo, ...]
    settings: BenchSettings
    pairs: tuple[BenchPair, ...]
    rows: tuple[BenchRow, ...]
    interrupted: bool              # Ctrl-C: the rows measured until then
    wall_s: float
    measured_s: float              # the sum of the measurement windows
    baseline: BaselineComparison | None = None
    rails: RailsReport | None = None   # --all-rails: every rail at once after the sweep

    @property
    def exit_code(self) -> int:
        """130 when Ctrl-C ended the sweep, 1 when a row fell against the baseline, else
        with --all-rails the rails' (13 contention, 12 inconclusive)."""
        if self.interrupted:
            return int(ExitCode.INTERRUPTED)
        if self.baseline and self.baseline.changes:
            return int(ExitCode.VERDICT_NOT_OK)
        return self.rails.exit_code if self.rails else int(ExitCode.OK)


# ---- what an NCCL log proves: gdrprobe/report/nccl_log.py (NcclLogReport and its parts) ----


# ---- every pair of nodes of a job (gdrprobe.campaign.cluster) ---------------------------


@dataclasses.dataclass(frozen=True)
class ClusterPair:
    """One pair's probe, from the client rank's node to the server rank's."""

    client_rank: int
    server_rank: int
    client_node: str
    server_node: str
    host_gbps: float | None = None     # the host arm (median of its repeats)
    gpu_gbps: float | None = None      # the GPU arm, where it ran
    ratio: float | None = None         # GPU/host, as the verdict computed it
    verdict: str | None = None         # engaged | degraded | not engaged | not testable
    likely_causes: tuple[str, ...] = ()   # the verdict's: why not engaged, not testable
    error: str = ""                    # why the pair could not be measured
    fix: str = ""                      # the verdict's fix, or the error's
    exit_code: int = 0                 # the pair's own: the verdict's, or the error's
    # --bidir: per arm (host, gpu) each direction and the sum, the medians of its repeats
    bidirectional: dict[str, BidirResult] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ClusterReport:
    kind = "cluster"
    ranks: int
    pattern: str                       # all | ring
    pairs: tuple[ClusterPair, ...]
    median_host_gbps: float | None
    slow_fraction: float               # below this fraction of the median a pair is slow
    flagged: tuple[str, ...]           # the pairs that need a look, and why
    exit_code: int
