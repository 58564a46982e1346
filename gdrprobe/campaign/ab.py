"""The A/B: the host arm and the GPU arm(s) with identical settings, repeated in
alternation, then the verdict.

Each arm of each repeat is one full run (its own connection, endpoint and buffers), so
the arms differ only in the memory behind the QPs. An arm that cannot run (no CUDA driver,
a registration the NIC refuses) becomes evidence for the verdict instead of an error.

With GPU memory at both ends (the NIC reads one GPU buffer and writes another, as an NCCL
transfer between two nodes does) that two-ended arm decides. Only where it falls short
(degraded, or its data path broken) do the two one-direction arms run, alternating with
the host arm as before: GPU source and host destination (the NIC reads GPU memory: NCCL's
sends, gdr_read) and host source and GPU destination (it writes GPU memory: NCCL's
receives, gdr_write); they name the direction that fails. An engaged node pays for two
arms, not four.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from gdrprobe import defaults
from gdrprobe.memory.spec import MemorySpec, reported_mechanism
from gdrprobe.doctor.facts.pci import rdma_nics_without_device
from gdrprobe.errors import (CompletionError, GdrprobeError, GpuRuntimeError, IntegrityError,
                             NoDevice, NoRdmaDevice, NotTestable, RegistrationFailed,
                             UsageError)
from gdrprobe.sysroot import SysRoot
from gdrprobe.report.check import BOTH, HOST_ARM, READ, WRITE, ArmReport, CheckReport, FloorCheck
from gdrprobe.report.model import RunReport
from gdrprobe.campaign import nccl_pattern
from gdrprobe.campaign.secondary import flush_check
from gdrprobe.campaign.verdict import (check_repeats, DECIDES, DIAGNOSES, STAGED_ARM, ArmMeasurement,
                                      arm_ratio, check_threshold, classify,
                                      line_rate_fraction, settled)

HOST = MemorySpec()
REFERENCE = "reference"   # the staged arm's role: it informs a degraded verdict

RDMA_DRIVER_FIX = ("load the NIC's RDMA driver (ConnectX: modprobe mlx5_ib; make it load at "
                   "boot), then 'rdma link show' lists the device")


@dataclasses.dataclass(frozen=True)
class ArmPlan:
    name: str
    local: MemorySpec
    remote: MemorySpec
    role: str = DECIDES   # decides | reference | diagnoses; the host arm: ""
    opcode: str = "write"  # the runs' RDMA operation: which buffer the NIC reads follows from it

    @property
    def direction(self) -> str:
        """Where the GPU memory is: the source the NIC reads (read), the destination it
        writes (write), both. A WRITE's source is the local buffer; an RDMA READ's is the
        remote one, which the responder's NIC reads, and the local one it writes."""
        source, destination = (self.remote, self.local) if self.opcode == "read" else \
            (self.local, self.remote)
        gpu = (source.kind == "gpu", destination.kind == "gpu")
        return {(True, True): BOTH, (True, False): READ, (False, True): WRITE}.get(gpu, "")

    @property
    def gpu_side(self) -> MemorySpec:
        """The GPU buffer whose mechanism names the arm (the source where both are)."""
        return self.local if self.local.kind == "gpu" else self.remote


def plan_arms(local: MemorySpec, remote: MemorySpec, with_staged: bool,
              opcode: str = "write") -> list[ArmPlan]:
    """The host arm first, then the GPU arm as asked, then (optionally) the staged one; with
    GPU memory at both ends, the two one-direction arms that diagnose it. opcode: the runs'
    RDMA operation, which tells each arm's direction (ArmPlan.direction)."""
    def arm(name: str, arm_local: MemorySpec, arm_remote: MemorySpec, role: str = DECIDES) -> ArmPlan:
        return ArmPlan(name, arm_local, arm_remote, role, opcode)

    gpu_side = local if local.kind == "gpu" else remote
    arms = [arm(HOST_ARM, HOST, HOST, role=""), arm(gpu_side.label, local, remote)]
    if with_staged and gpu_side.mechanism != "staged":
        staged = dataclasses.replace(gpu_side, mechanism="staged")
        arms.append(arm("staged", staged if local.kind == "gpu" else HOST,
                        staged if remote.kind == "gpu" else HOST, role=REFERENCE))
    if local.kind == "gpu" and remote.kind == "gpu":
        arms += [arm(local.label, local, HOST, role=DIAGNOSES),
                 arm(remote.label, HOST, remote, role=DIAGNOSES)]
    return arms


@dataclasses.dataclass
class ArmRecord:
    plan: ArmPlan
    bandwidths: list[float] = dataclasses.field(default_factory=list)
    runs: list[RunReport] = dataclasses.field(default_factory=list)
    error: Exception | None = None
    # The staged arm: per repeat, the pipelined bound (see pipelined_bound).
    bounds: list[float] = dataclasses.field(default_factory=list)
    # The host arm's bandwidth in each repeat this arm ran in: its ratios pair with these.
    host_gbps: list[float] = dataclasses.field(default_factory=list)
    attempted: bool = True   # a diagnosing arm is attempted only when the verdict needs it

    def gpu_memory(self) -> dict:
        """The description of the GPU side's memory in the last run (empty if none ran)."""
        if not self.runs:
            return {}
        run = self.runs[-1]
        return run.local.memory if self.plan.local.kind == "gpu" else run.remote.memory

    @property
    def arm(self) -> str:
        mechanism = self.gpu_memory().get("mechanism") or getattr(self.error, "mechanism", "")
        return mechanism or self.plan.name

    @property
    def role(self) -> str:
        return DECIDES if self.plan.role == REFERENCE else self.plan.role

    def measurement(self, size: int) -> ArmMeasurement:
        spec = self.plan.gpu_side
        # Why this mechanism: from the provider that ran, else what was known when it failed
        # (a broken data path's evidence is the failure itself, kept in data_path_error).
        known = self.error is not None and not is_data_path_error(self.error)
        reason = (self.gpu_memory().get("mechanism_reason")
                  or (self.error.evidence if known else ""))
        # Who resolved the GPU's addresses for peermem: from the buffer, else its refusal.
        peer_memory = self.gpu_memory().get("peer_memory") or getattr(self.error, "peer_memory", "")
        common = dict(arm=self.arm,
                      mechanism=None if self.arm == HOST_ARM else reported_mechanism(self.arm, peer_memory),
                      memory_kind="host" if self.plan.name == HOST_ARM else spec.memory_type,
                      message_bytes=size, mechanism_reason=reason,
                      direction=self.plan.direction, role=self.role or DECIDES,
                      host_gbps=tuple(self.host_gbps))
        if isinstance(self.error, RegistrationFailed):
            return ArmMeasurement(registration_errno=self.error.error_code, **common)
        if is_data_path_error(self.error):
            evidence = f" ({self.error.evidence})" if self.error.evidence else ""
            return ArmMeasurement(data_path_error=self.error.cause + evidence, **common)
        if self.error is not None:
            return ArmMeasurement(not_testable=self.error.cause, fix=self.error.fix, **common)
        if self.bounds:   # the staged arm competes with what a bounce pipeline reaches
            common["mechanism_reason"] = PIPELINED_BOUND
            return ArmMeasurement(bandwidths_gbps=tuple(self.bounds), **common)
        return ArmMeasurement(bandwidths_gbps=tuple(self.bandwidths), **common)

    def report(self, size: int, floor: FloorCheck | None = None) -> ArmReport:
        last = self.runs[-1] if self.runs else None
        outcome = ("measured" if self.error is None else
                   "registration failed" if isinstance(self.error, RegistrationFailed)
                   else "data path broken" if is_data_path_error(self.error)
                   else "not testable")
        return ArmReport(
            arm=self.arm, outcome=outcome, size_bytes=size,
            bandwidths_gbps=tuple(self.bandwidths),
            local_memory=last.local.memory if last else self.plan.local.to_message(),
            remote_memory=last.remote.memory if last else self.plan.remote.to_message(),
            mechanism_reason=self.measurement(size).mechanism_reason,
            detail=(str(self.error.cause) if self.error else
                    SERIALISED if self.bounds else ""),
            fix=getattr(self.error, "fix", "") if self.error else "",
            pipelined_bound_gbps=tuple(self.bounds), direction=self.plan.direction,
            role=self.plan.role, line_rate_fraction=line_rate_fraction(self.bandwidths, floor),
            bidirectional=tuple(run.bidirectional[-1] for run in self.runs
                                if run.bidirectional))


# How the staged arm's two figures are obtained.
SERIALISED = ("serialised: measured, each message charged its GPU<->host copies one after "
              "the other (no overlap)")
PIPELINED_BOUND = ("pipelined bound: per repeat, the lower of the measured GPU<->host copy "
                   "rate and the host arm's bandwidth, what a double-buffered bounce pipeline "
                   "reaches at best (used for the comparison)")


def pipelined_bound(run: RunReport, host: ArmRecord) -> float:
    """A perfect pipeline overlaps the copies with the writes: the slower of the two
    stages sets its rate. Without a copy rate (no staging happened) it is the run's own."""
    row = run.bandwidth[-1]
    if row.stage_copy_gbps is None:
        return row.bandwidth_avg_gbps
    return min(row.stage_copy_gbps, host.bandwidths[-1])


# What makes a GPU arm "not testable here" (or not engaged) rather than a failed run. A
# CUDA error is one of them: a driver call that fails in one arm ends that arm, and the
# other arms still run (a DMA-BUF export the driver refuses is a refused registration:
# gdrprobe.memory.causes.dmabuf_export_refused).
# A missing cuda-python is not among them: it is a missing dependency (exit 3) with its fix.
ARM_ERRORS = (NotTestable, RegistrationFailed, GpuRuntimeError)
# ibv_wc_status values a NIC reports when its DMA to or from the buffer fails: local
# length, QP operation, protection and access errors, the remote side's access and
# operation errors, and the general error (verbs.h). Transport retries (RETRY_EXC 12,
# RNR_RETRY_EXC 13) and flushes (5) say the link or the peer went away, not the data path.
DATA_PATH_WC_STATUSES = frozenset({1, 2, 4, 8, 10, 11, 21})


def is_data_path_error(error: Exception) -> bool:
    """After the host arm of the same repeat passed, corrupt payload or a DMA failure in a
    GPU arm is the broken peer-to-peer path the tool exists to find (a host arm's stays the
    run's error)."""
    return isinstance(error, IntegrityError) or (
        isinstance(error, CompletionError) and error.wc_status in DATA_PATH_WC_STATUSES)


class StopSampling(Exception):
    """Raised by a run_once that may start no further run (its time budget is spent): the
    A/B classifies what it has measured so far."""


RunOnce = Callable[[MemorySpec, MemorySpec], RunReport]


def run_ab(run_once: RunOnce, arms: list[ArmPlan], repeats: int,
           threshold: float = defaults.THRESHOLD, doctor_findings=(),
           min_repeats: int | None = None, floor: FloorCheck | None = None,
           settle_repeats: int | None = None,
           disturbed: Callable[[], bool] | None = None, pattern=None) -> CheckReport:
    """Alternate the arms `repeats` times and classify. run_once(local, remote) runs one
    probe; errors of the host arm are the run's errors and propagate. Sampling stops as soon
    as the answer is known: when no GPU arm that could prove GPUDirect can run (after one
    host measurement, kept for the report), when run_once raises StopSampling, and, from
    min_repeats repeats on, when every deciding arm's answer is conclusive
    (:func:`gdrprobe.campaign.verdict.settled`). Where one is still inconclusive after
    `repeats`, sampling goes on, up to settle_repeats (default: SETTLE_REPEATS, or
    `repeats` where that is more) or until run_once's budget says stop: more repeats narrow
    the median's interval until it leaves the threshold, or the verdict stays inconclusive
    (exit 12); not once disturbed() says other traffic shared the runs (more repeats cannot
    settle what is not the node's). The diagnosing arms (one direction each) then run the same way, `repeats`
    at most, only where the deciding two-ended arm fell short."""
    records = [ArmRecord(plan) for plan in arms]
    host = records[0]
    main = [r for r in records[1:] if r.plan.role != DIAGNOSES]
    diagnosing = [r for r in records[1:] if r.plan.role == DIAGNOSES]
    ceiling = max(repeats, settle_repeats or defaults.SETTLE_REPEATS)
    stopped = sample(run_once, host, main, Sampling(repeats, min_repeats, ceiling, threshold,
                                                    floor, disturbed))
    wanted = not stopped and needs_direction(host, main, threshold)
    for record in diagnosing:
        record.attempted = wanted
    if wanted:
        sample(run_once, host, diagnosing, Sampling(repeats, min_repeats, repeats, threshold))
    size = host.runs[-1].bandwidth[-1].size_bytes
    shown = [r for r in records if r.attempted]
    verdict = classify(host.measurement(size), [r.measurement(size) for r in shown[1:]],
                       threshold, owner_findings(shown[1:], doctor_findings), floor)
    deciding = next((r for r in main if r.runs), None)
    nccl = None if pattern is None else nccl_pattern.pattern_check(
        host.runs, deciding.runs if deciding else [], pattern, threshold)
    return CheckReport(verdict=nccl_pattern.join(verdict, nccl),
                       arms=tuple(r.report(size, floor) for r in shown),
                       settings=host.runs[-1].settings, repeats=len(host.runs), floor=floor,
                       gpu_settings=deciding.runs[-1].settings if deciding else None,
                       flush=flush_check(main[0].runs, main[0].error) if main else None,
                       pattern=nccl)


@dataclasses.dataclass(frozen=True)
class Sampling:
    """When sampling stops: `planned` repeats, from `least` on as soon as every arm's
    answer is conclusive, beyond `planned` only while one is not, `ceiling` at most."""

    planned: int
    least: int | None               # None: the planned repeats all run
    ceiling: int
    threshold: float
    floor: FloorCheck | None = None
    disturbed: Callable[[], bool] | None = None   # True: other traffic shared the runs

    def done(self, repeat: int, host: ArmRecord, arms: list[ArmRecord]) -> bool:
        answers = [settled(r, self.threshold, self.floor)
                   for r in measured_ratios(host, arms, self.floor)]
        conclusive = bool(answers) and all(answers)
        if repeat >= (self.planned if self.least is None else self.least) and conclusive:
            return True
        return repeat >= self.planned and (
            all(answers) or (self.disturbed is not None and self.disturbed()))


def sample(run_once: RunOnce, host: ArmRecord, arms: list[ArmRecord],
           sampling: Sampling) -> bool:
    """Repeats of the host arm and these arms until `sampling` says done; True when the
    budget ended it (the arms it never reached say so)."""
    for repeat in range(1, sampling.ceiling + 1):
        try:
            run_repeat(run_once, [host, *arms])
        except StopSampling as stop:
            for record in arms:
                if not record.runs and record.error is None:   # the budget ran out first
                    record.error = NotTestable(f"not testable: {stop}",
                                               "give the check a larger time budget")
            return True
        if deciding_arms_failed(arms) or sampling.done(repeat, host, arms):
            break
    return False


def needs_direction(host: ArmRecord, main: list[ArmRecord], threshold: float) -> bool:
    """Whether the deciding two-ended arm fell short: below the threshold, or its data path
    broken (a refused registration is the same in both directions)."""
    both = [r for r in main if r.plan.direction == BOTH and r.plan.role == DECIDES]
    for record in both:
        if is_data_path_error(record.error):
            return True
        ratio = arm_ratio(host.measurement(0), record.measurement(0))
        if ratio is not None and ratio.ratio < threshold:
            return True
    return False


def owner_findings(gpu_arms: list[ArmRecord], doctor_findings) -> tuple:
    """The doctor findings of the host that owns the GPU buffer: the caller's own (passed
    in) for a local buffer, plus what the server sent in the handshake about its buffer
    (from a run, or from the error that ended one)."""
    sent = [findings for record in gpu_arms if record.plan.remote.kind == "gpu"
            for findings in ([run.remote_findings for run in record.runs]
                             + [getattr(record.error, "remote_findings", ())]) if findings]
    return tuple(doctor_findings) + (tuple(sent[-1]) if sent else ())


def run_repeat(run_once: RunOnce, records: list[ArmRecord]) -> None:
    """One run of each arm that can still run, in plan order (the host arm first)."""
    for record in records:
        if record.error is not None:
            continue   # an arm that cannot run will not run on the next repeat either
        try:
            run = run_once(record.plan.local, record.plan.remote)
        except NoRdmaDevice as error:
            raise no_device_not_testable(error) from error
        except (*ARM_ERRORS, IntegrityError, CompletionError) as error:
            if record.plan.name == HOST_ARM or (isinstance(error, CompletionError)
                                              and not is_data_path_error(error)):
                raise
            record.error = error
            continue
        record.runs.append(run)
        record.bandwidths.append(run.bandwidth[-1].bandwidth_avg_gbps)
        if record is not records[0]:
            record.host_gbps.append(records[0].bandwidths[-1])
        if record.plan.name == STAGED_ARM:
            record.bounds.append(pipelined_bound(run, records[0]))


def no_device_not_testable(error: NoRdmaDevice, root: SysRoot | None = None) -> GdrprobeError:
    """The README's promise: no RDMA device under a GPU arm is "not testable here", except
    where an RDMA NIC is on the PCI bus without its RDMA driver. That is the node NCCL makes
    slow: with no IB device (NVIDIA/nccl src/transport/net_ib.cc, ncclIbInit: "NET/IB : No
    device found.") it falls back to its socket transport, so the node drains (exit 4)."""
    unbound = rdma_nics_without_device(root or SysRoot())
    if not unbound:
        return NotTestable(f"not testable: {error.cause}", error.fix, evidence=error.evidence)
    return NoDevice(f"no RDMA device, but {len(unbound)} RDMA NIC(s) on the PCI bus "
                    f"({', '.join(unbound)}): the NIC's RDMA driver is not loaded, and NCCL "
                    "would fall back to TCP sockets", RDMA_DRIVER_FIX,
                    evidence=f"{', '.join(unbound)} in /sys/bus/pci/devices; "
                             "/sys/class/infiniband lists no device")


def deciding_arms_failed(records: list[ArmRecord]) -> bool:
    """No GPU arm that decides the verdict can run any more (the staged arm only informs
    a degraded verdict; it decides only when it is the sole GPU arm)."""
    deciding = [r for r in records if r.plan.name != STAGED_ARM] or records
    return all(r.error is not None for r in deciding)


def measured_ratios(host: ArmRecord, records: list[ArmRecord],
                    floor: FloorCheck | None) -> list:
    """The ratio of every arm whose answer counts (not the staged reference) that has
    measured so far."""
    reference = host.measurement(0)
    ratios = [arm_ratio(reference, r.measurement(0), floor) for r in records
              if r.error is None and r.plan.role != REFERENCE]
    return [ratio for ratio in ratios if ratio is not None]


def ab_test(run_once: RunOnce, local: MemorySpec, remote: MemorySpec | None = None, *,
            staged: bool = False, repeats: int = 3, threshold: float = defaults.THRESHOLD,
            doctor_findings=(), min_repeats: int | None = None,
            floor: FloorCheck | None = None, settle_repeats: int | None = None,
            disturbed: Callable[[], bool] | None = None, opcode: str = "write",
            pattern=None) -> CheckReport:
    """The whole A/B: plan the arms, run them, and classify. doctor_findings are the
    findings of the host that owns the GPU buffer (the caller runs the doctor there); they
    confirm or rule out the likely causes of a degraded result. With min_repeats, sampling
    stops once the answer is conclusive; an answer still inconclusive after `repeats`
    samples on up to settle_repeats unless disturbed() (see :func:`run_ab`). floor: the
    port's line rate and the fraction of it the deciding arm must reach. opcode: the RDMA
    operation run_once measures (write or read), which names each arm's direction. pattern:
    the job's NCCL transport where the runs measure NCCL's pattern (see :func:`run_ab`)."""
    check_repeats(repeats)
    check_threshold(threshold)
    remote = remote or HOST
    if local.kind == "host" and remote.kind == "host":
        raise UsageError("an A/B needs a GPU buffer on one side", "e.g. --mem gpu")
    arms = plan_arms(local, remote, staged, opcode)
    return run_ab(run_once, arms, repeats, threshold, doctor_findings, min_repeats, floor,
                  settle_repeats, disturbed, pattern)
