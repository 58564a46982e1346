"""The A/B's reports: its arms, the verdict (with NCCL's own decision and the line-rate
floor), the pair a check measured, and the node check. Part of the one report model
(:mod:`gdrprobe.report.model`), serialised by its :func:`~gdrprobe.report.model.to_json`."""

from __future__ import annotations

import dataclasses
import statistics

from gdrprobe import defaults
from gdrprobe.errors import DRAIN_CODES, ExitCode
from gdrprobe.report.gin import GinCheck
from gdrprobe.report.model import BidirResult, LatencyRatio, RunSettings
from gdrprobe.report.nccl_pattern import NcclPatternCheck

HOST_ARM = "host"       # the A/B's reference: host memory at both ends
DECIDES = "decides"     # the role of the one GPU arm whose result is the verdict's


@dataclasses.dataclass(frozen=True)
class ArmReport:
    """One arm of the A/B: which memory each side used and what it measured."""

    arm: str                       # host | dmabuf | peermem | staged | gpu (auto, not run)
    outcome: str                   # measured | not testable | registration failed | data path broken
    size_bytes: int
    bandwidths_gbps: tuple[float, ...]   # one per repeat, at size_bytes
    local_memory: dict
    remote_memory: dict
    mechanism_reason: str
    detail: str                    # the error, when the arm did not run
    fix: str
    # The staged arm only: per repeat, what a perfect bounce pipeline reaches (the lower of
    # the measured copy rate and the host arm's bandwidth); bandwidths_gbps is serialised.
    pipelined_bound_gbps: tuple[float, ...] = ()
    # Where the GPU memory is: "read" (the NIC reads it: the source, NCCL's sends), "write"
    # (the NIC writes it: the destination, NCCL's receives), "both"; "" for the host arm.
    direction: str = ""
    role: str = ""                 # decides | reference (staged) | diagnoses (one direction)
    line_rate_fraction: float | None = None   # median bandwidth over the port's line rate
    # A bidirectional run (-b): per repeat, each direction and the sum at size_bytes.
    bidirectional: tuple[BidirResult, ...] = ()

    @property
    def median_gbps(self) -> float | None:
        """The median of its repeats' bandwidths; None where it measured none."""
        return statistics.median(self.bandwidths_gbps) if self.bandwidths_gbps else None


# ---- the A/B's verdict -----------------------------------------------------------

ENGAGED = "engaged"
DEGRADED = "degraded"
NOT_ENGAGED = "not engaged"
NOT_TESTABLE = "not testable"
NOT_USED = "not used by NCCL"      # NCCL's own rules keep this GPU off GPUDirect RDMA

EXIT_CODES = {ENGAGED: ExitCode.OK, DEGRADED: ExitCode.VERDICT_NOT_OK,
              NOT_ENGAGED: ExitCode.VERDICT_NOT_OK, NOT_TESTABLE: ExitCode.NOT_TESTABLE}

# The directions of a GPU arm: where its GPU memory is.
READ = "read"      # the NIC reads GPU memory: the source buffer (NCCL's sends, gdr_read)
WRITE = "write"    # the NIC writes GPU memory: the destination (NCCL's receives, gdr_write)
BOTH = "both"      # GPU memory at both ends, as an NCCL transfer between two nodes has
DIRECTION_WORDS = {READ: "the NIC reading GPU memory (NCCL's sends, gdr_read)",
                   WRITE: "the NIC writing GPU memory (NCCL's receives, gdr_write)",
                   BOTH: "GPU memory at both ends (the NIC reads one GPU buffer and writes "
                         "another)"}


@dataclasses.dataclass(frozen=True)
class ArmRatio:
    """One GPU arm against the host arm: median of paired per-repeat ratios, and its range
    (None where the arm measured nothing: its outcome says why)."""

    arm: str
    mechanism: str | None
    memory_kind: str
    ratio: float | None
    ratio_min: float | None
    ratio_max: float | None
    repeats: int
    direction: str = ""
    outcome: str = "measured"      # measured | registration failed | data path broken | not testable
    role: str = DECIDES            # decides | reference | diagnoses
    line_rate_fraction: float | None = None   # median bandwidth over the port's line rate
    # The median's confidence interval (campaign.verdict.median_interval) of the per-repeat
    # ratios, and of the per-repeat shares of line rate: what decides "conclusive".
    interval: tuple[float, float] | None = None
    line_rate_interval: tuple[float, float] | None = None


@dataclasses.dataclass(frozen=True)
class NcclUse:
    """Whether NCCL will use GPUDirect RDMA for one GPU, by NCCL's own rules (the doctor's
    per-GPU decision, :mod:`gdrprobe.campaign.nccl_use`)."""

    gpu: str                       # the GPU's PCI bus id
    nic: str | None                # the NIC NCCL uses for it (channel 0); None: none
    path: str                      # direct | pxn | c2c | socket | none
    via_gpu: str | None            # PXN: the NVLink peer whose memory the NIC reads on sends
    receives: bool                 # gdr_write: the NIC writes this GPU's memory directly
    sends: bool                    # gdr_read: the NIC reads GPU memory directly
    reasons: tuple[str, ...]       # NCCL's reasons, receive and send
    cause: str = ""                # why NCCL will not use GPUDirect here ("" when it will)
    settings: tuple[str, ...] = ()   # the NCCL settings that cause it, each with its source
    node_fault: bool = False       # off with NCCL's defaults too: this node's hardware or stack
    firm: bool = True              # False: the decision rests on facts the doctor could not read
    fix: str = ""
    pcie_mapping: bool = False     # NCCL exports this GPU's DMA-BUF with the PCIe mapping type
    flush: bool = False            # NCCL reads back each GPUDirect receive into this GPU (its flush)
    flush_rule: str = ""           # the rule that decides it, with NCCL's source
    mechanism: str | None = None   # what NCCL registers this GPU's memory through: dmabuf, peermem; None: no GDR
    mechanism_reason: str = ""     # the rule and the NCCL release that chose it
    data_direct: bool = False      # NCCL's network device for it is <dev>_dma (registers DATA_DIRECT only)

    @property
    def uses_gdr(self) -> bool:
        return self.nic is not None and (self.receives or self.sends)


@dataclasses.dataclass(frozen=True)
class Verdict:
    classification: str                  # engaged | degraded | not engaged | not testable | not used by NCCL
    mechanism: str | None = None         # the mechanism the classification is about
    ratio: float | None = None           # gpu/host, median of paired repeats
    ratio_min: float | None = None
    ratio_max: float | None = None
    threshold: float = defaults.THRESHOLD
    # Not known now (exit 12): the per-repeat ratios (or line-rate shares) straddle the
    # threshold (the floor), or other traffic shared the port; the classification is the
    # median's, kept as information.
    inconclusive: bool = False
    evidence: tuple[str, ...] = ()
    likely_causes: tuple[str, ...] = ()
    fix: str = ""
    arms: tuple[ArmRatio, ...] = ()      # every GPU arm, measured or not
    direction: str | None = None         # the failing direction: read | write | both | unknown
    below_floor: bool = False            # the deciding arm fell below the line-rate floor
    nccl: NcclUse | None = None          # NCCL's own decision for the GPU, where known
    # What check --latency or --read found short on an engaged node: "latency degraded",
    # "GDR read degraded" lines (exit 13, a warning, never a drain).
    warnings: tuple[str, ...] = ()
    # check --gin: the doorbell registration and what it adds to the exit code (report/gin.py)
    gin: GinCheck | None = None
    exit_code: int = dataclasses.field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "exit_code", int(verdict_exit_code(self)))


def verdict_exit_code(verdict: Verdict) -> ExitCode:
    """The answer's exit code (:func:`answer_exit_code`) with what check --gin adds: a drain
    it adds beats a warning, and a warning it adds replaces only a start (0)."""
    code = answer_exit_code(verdict)
    added = verdict.gin.exit_code if verdict.gin is not None else None
    if added is None or code in DRAIN_CODES:
        return code
    if added in DRAIN_CODES or code == ExitCode.OK:
        return ExitCode(added)
    return code


def answer_exit_code(verdict: Verdict) -> ExitCode:
    """A classification's exit code; a measured answer (engaged, degraded) that is
    inconclusive is 12 whatever its classification, so an answer the measurement cannot
    stand behind never drains and never says "start" on its own; "not used by NCCL" drains
    where NCCL's rules refuse GPUDirect on this node's hardware or stack, and only warns
    where an NCCL setting (the job's environment, an NCCL configuration file) does: the
    node is fine. An engaged answer with warnings (check --latency, --read) is 13."""
    if verdict.inconclusive and verdict.classification in (ENGAGED, DEGRADED):
        return ExitCode.INCONCLUSIVE
    if verdict.classification == ENGAGED and verdict.warnings:
        return ExitCode.PERFORMANCE_WARNING
    if verdict.classification != NOT_USED:
        return EXIT_CODES[verdict.classification]
    if verdict.nccl is not None and verdict.nccl.node_fault:
        return ExitCode.VERDICT_NOT_OK
    return ExitCode.NCCL_SETTING


def main_cause(verdict: Verdict) -> str:
    """The one line that says why the answer is what it is: for an inconclusive one, what
    made it so; for an engaged one with warnings, the first warning; else the first likely
    cause, else the first evidence line; check --gin's answer where it set the exit code."""
    if verdict.gin is not None and verdict.exit_code != answer_exit_code(verdict):
        return verdict.gin.summary
    if verdict.exit_code == ExitCode.INCONCLUSIVE:
        lines = [line for line in verdict.evidence if line.startswith("inconclusive:")]
    elif verdict.exit_code == ExitCode.PERFORMANCE_WARNING:
        lines = list(verdict.warnings)
    else:
        lines = list(verdict.likely_causes or verdict.evidence)
    return lines[0] if lines else ""


@dataclasses.dataclass(frozen=True)
class FloorCheck:
    """The absolute floor: each arm against the line rate of the port it ran on."""

    nic: str | None
    port: int
    line_rate_gbps: float | None   # the port's rate as the kernel states it
    floor: float                   # the fraction of line rate the deciding GPU arm must reach
    applied: bool                  # False: rate unknown or a software device (note says which)
    software_device: bool | None   # rxe, siw: the CPU moves the bytes, never GPUDirect
    note: str


# The outcomes of check's extra answers (campaign/secondary.py decides them).
LATENCY_DEGRADED = "latency degraded"
GDR_READ_DEGRADED = "GDR read degraded"
WITHIN = "within bounds"
NOT_RUN = "not run"


@dataclasses.dataclass(frozen=True)
class LatencyCheck:
    """check --latency: the latency A/B (WRITE with immediate, host memory at both ends
    against the GPU memory the check measured) and whether the GPU arm's median is over the
    host arm's by more than the factor at some size."""

    outcome: str                   # latency degraded | within bounds | inconclusive | not run
    factor: float                  # the bound on the GPU/host median ratio
    factor_source: str             # where the factor comes from (a default or as given)
    ratios: tuple[LatencyRatio, ...] = ()
    degraded_sizes: tuple[int, ...] = ()       # over the factor in every repeat's pair
    repeats: int = 0
    inconclusive_sizes: tuple[int, ...] = ()   # medians over it, some pair not
    detail: str = ""               # why it did not run, where it did not


@dataclasses.dataclass(frozen=True)
class ReadCheck:
    """check --read: the A/B with WRITEs out of GPU memory into host memory (the NIC reading
    GPU memory as the source of its sends, as NCCL's sends with GPUDirect do), or check
    --bidir: with both ends WRITEing at once; its answer against the two-ended WRITE A/B's."""

    outcome: str                   # GDR read degraded | within bounds | inconclusive | not run
    verdict: Verdict | None = None     # that A/B's own verdict
    arms: tuple[ArmReport, ...] = ()
    mitigation: str = ""           # NCCL's own, where reads fall short
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class FlushCheck:
    """NCCL's flush in the deciding GPU arm's runs: each an RDMA READ of the last message's
    first byte on a loopback QP, which must bring back the byte that message wrote."""

    rule: str                      # why the check flushed (NCCL's rule, with its source)
    reads: int                     # flush READs made, every run of the arm
    bad: int                       # of those, how many brought back another byte
    median_us: float | None        # the median of the runs' median flush times
    outcome: str                   # what the READs showed, in words


@dataclasses.dataclass(frozen=True)
class CheckReport:
    """The A/B and its verdict."""

    kind = "check"
    verdict: Verdict
    arms: tuple[ArmReport, ...]
    settings: RunSettings | None   # the host arm's; None where no run could start
    repeats: int                   # repeats run (the host arm's runs)
    placement: RankPair | None = None   # the GPU and NIC gdrprobe.check() chose, and why
    floor: FloorCheck | None = None
    gpu_settings: RunSettings | None = None   # the deciding GPU arm's (inline is off there)
    flush: FlushCheck | None = None            # NCCL's flush in the deciding arm, where it ran
    latency: LatencyCheck | None = None        # check --latency
    read: ReadCheck | None = None              # check --read
    bidir: ReadCheck | None = None             # check --bidir: both ends WRITEing at once
    gin: GinCheck | None = None                # check --gin: can this GPU ring this NIC's doorbell
    # --pattern nccl: the GPU arm's NCCL pattern against the host arm's (report.nccl_pattern)
    pattern: NcclPatternCheck | None = None

    # The arms by what they are, never by their place in ``arms``: the order is the
    # order they were planned in, which says nothing about which is which.

    def host_arm(self) -> ArmReport | None:
        """The host arm, by its name; None where no run could start."""
        return next((arm for arm in self.arms if arm.arm == HOST_ARM), None)

    def deciding_arm(self) -> ArmReport | None:
        """The GPU arm whose result is the verdict's, by its role (the staged arm is a
        reference, the one-direction arms diagnose); None where no run could start."""
        return next((arm for arm in self.arms if arm.role == DECIDES), None)


# ---- the pair a rank will use (gdrprobe.campaign.gate) --------------------------------


@dataclasses.dataclass(frozen=True)
class RankPair:
    """The GPU and NIC a check measured, and why: in a job, the pair its rank will use."""

    rank: str                      # "LOCAL_RANK=3", "SLURM_LOCALID=1"; "" outside a job
    cuda_ordinal: int | None       # the GPU's number among those this process sees
    gpu: str                       # what the GPU arm opened: a PCI bus id, or the ordinal
    gpu_reason: str
    nic: str | None                # None: the first RDMA device
    nic_reason: str
    time_budget_s: float | None = None
    elapsed_s: float | None = None  # the whole check, doctor and set-up included
    # The GPU whose memory the NIC reads for this GPU's sends: this one, or with PXN the
    # NVLink peer NCCL relays through (its receives stay in this GPU's memory).
    send_gpu: str | None = None
    send_gpu_reason: str = ""
    lock: str = ""                 # the NIC's lock file, and how long the check waited for it
    # How the port's own counters watched for other traffic during the runs, and what they saw.
    port_traffic: str = ""


@dataclasses.dataclass(frozen=True)
class NodeGpuCheck:
    """One GPU of a node check: its report, or the error that ended its check."""

    gpu: str
    nic: str | None
    exit_code: int
    report: CheckReport | None = None
    error: str = ""
    fix: str = ""
    label: str = ""                # how a person names it ("": "GPU <gpu>"; NO_GPU_LABEL)

    @property
    def found(self) -> bool:
        """A GPU of the node, not the stand-in for none found."""
        return self.label != NO_GPU_LABEL


NO_GPU_LABEL = "no GPU found"      # the one entry of a node check that found no GPU


@dataclasses.dataclass(frozen=True)
class NodeCheckReport:
    """Every GPU of the node with its NCCL NIC (``gdrprobe check --node``)."""

    kind = "check-node"
    gpus: tuple[NodeGpuCheck, ...]
    time_budget_s: float | None
    elapsed_s: float
    exit_code: int                 # the worst of the GPUs' (a drain code before a warn code)
    memlock: str = ""              # how the locked-memory limit fitted the checks ("": as asked)
    job_gpus: str = ""             # which GPUs are the job's, and who named them
    # check --all-rails: the rails measured together, after each alone (None: not asked)
    rails: RailsReport | None = None


# ---- all rails at once (check --all-rails) ------------------------------------------------

TOGETHER = "together"              # every rail keeps its solo bandwidth with all running
CONTENTION = "contention"          # rails fine alone fall only together
# the rails did not measure together, or a rail failed; an extra A/B straddled its bound
INCONCLUSIVE = "inconclusive"
ONE_RAIL = "one rail"              # nothing to run together
NO_RAIL = "no rail"                # no rail engaged alone: the rails cannot be judged

RAILS_EXIT_CODES = {TOGETHER: ExitCode.OK, ONE_RAIL: ExitCode.OK,
                    CONTENTION: ExitCode.PERFORMANCE_WARNING, INCONCLUSIVE: ExitCode.INCONCLUSIVE,
                    NO_RAIL: ExitCode.NOT_TESTABLE}


@dataclasses.dataclass(frozen=True)
class LoopWindow:
    """One loop's measured window on the monotonic clock, and what it measured."""

    gbps: float
    start_s: float
    end_s: float

    @classmethod
    def ended_now(cls, result, end_s: float) -> LoopWindow:
        """The window of a loop whose result came back at end_s: its own elapsed time and
        the integrity pause before that."""
        return cls(result.bandwidth_avg_gbps,
                   end_s - result.elapsed_s - result.integrity_pause_s, end_s)


@dataclasses.dataclass(frozen=True)
class Overlap:
    """How far the rails' windows ran at the same time."""

    skew_s: float                  # the latest start after the earliest
    shortest_s: float              # the shortest window
    overlap_s: float               # the time every window was open (0: none)
    fraction: float                # overlap_s over shortest_s

    @classmethod
    def of(cls, windows) -> Overlap:
        starts, ends = [w.start_s for w in windows], [w.end_s for w in windows]
        shortest = min(w.end_s - w.start_s for w in windows)
        overlap = max(0.0, min(ends) - max(starts))
        return cls(round(max(starts) - min(starts), 6), round(shortest, 6), round(overlap, 6),
                   round(overlap / shortest, 3) if shortest > 0 else 0.0)


def ratio_of(together: float | None, alone: float | None) -> float | None:
    return None if together is None or not alone else round(together / alone, 3)


@dataclasses.dataclass(frozen=True)
class RailResult:
    """One rail (a GPU and its NIC): alone (the A/B's medians) against all rails at once."""

    gpu: str
    nic: str
    solo_gbps: float               # the deciding GPU arm's median, alone
    concurrent_gbps: float | None  # the GPU arm with every rail running; None: it failed
    ratio: float | None            # concurrent over solo
    host_solo_gbps: float | None = None
    host_concurrent_gbps: float | None = None
    host_ratio: float | None = None
    line_rate_gbps: float | None = None
    contending: bool = False       # fine alone, below the ratio threshold together
    error: str = ""                # why the rail's concurrent run failed


@dataclasses.dataclass(frozen=True)
class RailsReport:
    """Every rail at once: per rail solo, concurrent and their ratio; the node's aggregate
    against the sum of solos and of line rates; the windows' overlap; the verdict and, for
    contention, the element the contending rails share (``shared``: its JSON)."""

    verdict: str                   # TOGETHER | CONTENTION | INCONCLUSIVE | ONE_RAIL
    exit_code: int
    rails: tuple[RailResult, ...]
    ratio_threshold: float
    aggregate_gbps: float          # the GPU arms' concurrent bandwidths summed
    solo_sum_gbps: float
    line_rate_sum_gbps: float | None   # None where a NIC states no rate
    overlap: Overlap | None = None
    host_overlap: Overlap | None = None
    shared: dict | None = None
    detail: str = ""

    @classmethod
    def of(cls, verdict: str, rails: tuple[RailResult, ...], **rest) -> RailsReport:
        rates = [rail.line_rate_gbps for rail in rails]
        return cls(verdict, int(RAILS_EXIT_CODES[verdict]), rails,
                   rest.pop("ratio_threshold", defaults.RAIL_RATIO),
                   round(sum(rail.concurrent_gbps or 0.0 for rail in rails), 3),
                   round(sum(rail.solo_gbps for rail in rails), 3),
                   None if not rates or None in rates else round(sum(rates), 3), **rest)
