"""The A/B: the host arm and the GPU arm(s) with identical settings, repeated in
alternation, then the verdict.

Each arm of each repeat is one full run (its own connection, endpoint and buffers), so
the arms differ only in the memory behind the QPs. An arm that cannot run (no CUDA driver,
a registration the NIC refuses) becomes evidence for the verdict instead of an error.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from gdrprobe.memory.spec import MemorySpec
from gdrprobe.errors import MissingDependency, NotTestable, RegistrationFailed, UsageError
from gdrprobe.report.model import ArmReport, CheckReport, RunReport
from gdrprobe.measure.verdict import DEFAULT_THRESHOLD, ArmMeasurement, classify

HOST = MemorySpec()


@dataclasses.dataclass(frozen=True)
class ArmPlan:
    name: str
    local: MemorySpec
    remote: MemorySpec


def plan_arms(local: MemorySpec, remote: MemorySpec, with_staged: bool) -> list[ArmPlan]:
    """The host arm first, then the GPU arm as asked, then (optionally) the staged one."""
    gpu_side = local if local.kind == "gpu" else remote
    arms = [ArmPlan("host", HOST, HOST), ArmPlan(gpu_side.label, local, remote)]
    if with_staged and gpu_side.mechanism != "staged":
        staged = dataclasses.replace(gpu_side, mechanism="staged")
        arms.append(ArmPlan("staged", staged if local.kind == "gpu" else HOST,
                            staged if remote.kind == "gpu" else HOST))
    return arms


@dataclasses.dataclass
class ArmRecord:
    plan: ArmPlan
    bandwidths: list[float] = dataclasses.field(default_factory=list)
    runs: list[RunReport] = dataclasses.field(default_factory=list)
    error: Exception | None = None

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

    def measurement(self, size: int) -> ArmMeasurement:
        spec = self.plan.local if self.plan.local.kind == "gpu" else self.plan.remote
        # Why this mechanism: from the provider that ran, else what was known when it failed.
        reason = (self.gpu_memory().get("mechanism_reason")
                  or (self.error.evidence if self.error else ""))
        common = dict(arm=self.arm, mechanism=None if self.arm == "host" else self.arm,
                      memory_kind="host" if self.plan.name == "host" else spec.memory_type,
                      message_bytes=size, mechanism_reason=reason)
        if isinstance(self.error, RegistrationFailed):
            return ArmMeasurement(registration_errno=self.error.error_code, **common)
        if self.error is not None:
            return ArmMeasurement(not_testable=self.error.cause, fix=self.error.fix, **common)
        return ArmMeasurement(bandwidths_gbps=tuple(self.bandwidths), **common)

    def report(self, size: int) -> ArmReport:
        last = self.runs[-1] if self.runs else None
        outcome = ("measured" if self.error is None else
                   "registration failed" if isinstance(self.error, RegistrationFailed)
                   else "not testable")
        return ArmReport(
            arm=self.arm, outcome=outcome, size_bytes=size,
            bandwidths_gbps=tuple(self.bandwidths),
            local_memory=last.local.memory if last else self.plan.local.to_message(),
            remote_memory=last.remote.memory if last else self.plan.remote.to_message(),
            mechanism_reason=self.measurement(size).mechanism_reason,
            detail=str(self.error.cause) if self.error else "",
            fix=getattr(self.error, "fix", "") if self.error else "")


# What makes an arm "not testable here" rather than a failed run.
ARM_ERRORS = (NotTestable, RegistrationFailed, MissingDependency)


def run_ab(run_once: Callable[[MemorySpec, MemorySpec], RunReport], arms: list[ArmPlan],
           repeats: int, threshold: float = DEFAULT_THRESHOLD,
           doctor_findings=()) -> CheckReport:
    """Alternate the arms `repeats` times and classify. run_once(local, remote) runs one
    probe; errors of the host arm are the run's errors and propagate."""
    records = [ArmRecord(plan) for plan in arms]
    for _ in range(repeats):
        for record in records:
            if record.error is not None:
                continue   # an arm that cannot run will not run on the next repeat either
            try:
                run = run_once(record.plan.local, record.plan.remote)
            except ARM_ERRORS as error:
                if record.plan.name == "host":
                    raise
                record.error = error
                continue
            record.runs.append(run)
            record.bandwidths.append(run.bandwidth[-1].bandwidth_avg_gbps)
    host, gpu_arms = records[0], records[1:]
    size = host.runs[-1].bandwidth[-1].size_bytes
    verdict = classify(host.measurement(size), [r.measurement(size) for r in gpu_arms],
                       threshold, doctor_findings)
    return CheckReport(verdict=verdict, arms=tuple(r.report(size) for r in records),
                       settings=host.runs[-1].settings, repeats=repeats)


def ab_test(run_once: Callable[[MemorySpec, MemorySpec], RunReport], local: MemorySpec,
            remote: MemorySpec | None = None, *, staged: bool = False, repeats: int = 3,
            threshold: float = DEFAULT_THRESHOLD, doctor_findings=()) -> CheckReport:
    """The whole A/B: plan the arms, run them, and classify. doctor_findings are the
    findings of the host that owns the GPU buffer (the caller runs the doctor there); they
    confirm or rule out the likely causes of a degraded result."""
    if not 1 <= repeats <= 100:
        raise UsageError(f"{repeats} repeats: use 1 to 100", "")
    if not 0 < threshold <= 1:
        raise UsageError(f"threshold {threshold} must be over 0 and at most 1", "e.g. 0.9")
    remote = remote or HOST
    if local.kind == "host" and remote.kind == "host":
        raise UsageError("an A/B needs a GPU buffer on one side", "e.g. --mem gpu")
    arms = plan_arms(local, remote, staged)
    return run_ab(run_once, arms, repeats, threshold, doctor_findings)
