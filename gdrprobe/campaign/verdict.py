"""The verdict: from host and GPU arm measurements to an answer a person can act on.

Pure logic, no I/O. The probe measures; :func:`classify` decides:

- **engaged**: a direct GPU arm (DMA-BUF or peermem, device memory) reaches at least
  ``threshold`` (default 0.9) of the host arm's bandwidth at the large message size;
- **degraded**: a direct arm registered but stays below the threshold; the likely causes
  (distance, ACS, IOMMU, BAR1) are named and, when doctor findings are given, confirmed
  or ruled out by them;
- **not engaged**: no direct arm could register its GPU memory; the errno is turned into a
  cause and a fix by :mod:`gdrprobe.memory.causes` (the GPU providers use the same table);
  or one registered but its data path is broken: after a host arm that passed, the GPU
  arm's payload came back wrong or its writes completed in error, which is what ACS, a
  translating IOMMU or a root complex that drops peer-to-peer traffic do (the doctor's
  findings confirm or rule out the first two);
- **not testable**: no GPU, no CUDA driver, no RDMA device, a mechanism the platform does
  not offer (a CUDA error of the GPU arm, with its cause), or only memory that proves
  nothing about GPUDirect (managed, pinned host).

Ratio and spread: the probe runs the arms in alternation, so repeat ``i`` of the host arm
and repeat ``i`` of a GPU arm saw the same conditions. The ratio is the median of those
paired per-repeat ratios; the spread is their minimum and maximum (with the 3 to 10 repeats
a probe affords, an interquartile range would rest on one or two points). When the spread
straddles the threshold the classification stays the median's, and ``inconclusive`` is set
with an evidence line saying so: the answer is the best estimate, flagged as one to rerun
with more repeats. The exit code follows the classification alone.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Sequence

from gdrprobe import defaults
from gdrprobe.memory.causes import errno_name, registration_cause
from gdrprobe.report import finding_ids
from gdrprobe.report.model import (DEGRADED, ENGAGED, NOT_ENGAGED,
                                    NOT_TESTABLE, ArmRatio, Verdict)

DIRECT_ARMS = ("dmabuf", "peermem")   # arms whose speed proves or disproves GPUDirect
STAGED_ARM = "staged"                 # the bounce through host memory: a reference only
PROOF_MEMORY_KIND = "device"          # managed and pinned-host memory prove nothing


# ---- measurements in -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ArmMeasurement:
    """What one arm produced at the large message size."""

    arm: str                                  # host | dmabuf | peermem | staged
    bandwidths_gbps: tuple[float, ...] = ()   # one per repeat, in alternation with the host arm
    mechanism: str | None = None              # dmabuf | peermem | staged; None for host
    memory_kind: str = "device"               # host | device | managed | pinned-host
    message_bytes: int = 0
    registration_errno: int | None = None     # set when registration failed
    not_testable: str = ""                    # why the arm could not run at all
    fix: str = ""                             # the fix for not_testable
    data_path_error: str = ""                 # corrupt payload or a failed completion
    mechanism_reason: str = ""                # why auto chose this mechanism

    @property
    def proves_gpudirect(self) -> bool:
        return self.arm in DIRECT_ARMS and self.memory_kind == PROOF_MEMORY_KIND

    @property
    def measured(self) -> bool:
        return (not self.not_testable and self.registration_errno is None
                and not self.data_path_error
                and any(value > 0 for value in self.bandwidths_gbps))


# ---- verdict out -----------------------------------------------------------------


def paired_ratios(host: Sequence[float], gpu: Sequence[float]) -> list[float]:
    """GPU over host per repeat; repeats beyond the shorter arm have no partner and are dropped."""
    return [g / h for h, g in zip(host, gpu) if h > 0]


def arm_ratio(host: ArmMeasurement, gpu: ArmMeasurement) -> ArmRatio | None:
    ratios = paired_ratios(host.bandwidths_gbps, gpu.bandwidths_gbps)
    if not ratios:
        return None
    return ArmRatio(gpu.arm, gpu.mechanism, gpu.memory_kind, statistics.median(ratios),
                    min(ratios), max(ratios), len(ratios))


def format_ratio(r: ArmRatio) -> str:
    return (f"{r.arm} ({r.memory_kind} memory): {r.ratio:.2f} of host bandwidth "
            f"(per-repeat {r.ratio_min:.2f}..{r.ratio_max:.2f}, {r.repeats} repeats)")


def straddles(r: ArmRatio, threshold: float) -> bool:
    return r.ratio_min < threshold <= r.ratio_max


# ---- degraded: likely causes and what the doctor says about them -----------------


def _is_bar1(finding_id: str) -> bool:
    return finding_ids.is_gpu_bar1(finding_id)


# (cause, does a finding id speak to it)
DISTANCE = ("distance: the NIC and GPU do not share a PCIe switch (the path crosses the CPU "
            "or the socket interconnect)", lambda fid: fid == finding_ids.TOPOLOGY_DISTANCE)
ACS = ("ACS: PCIe Access Control Services redirect peer traffic up to the root complex",
       lambda fid: fid == finding_ids.ACS_BRIDGE)
IOMMU = ("IOMMU: a translating IOMMU sits in the peer-to-peer path (GPUDirect needs 1:1 or "
         "off)", lambda fid: finding_ids.in_group(fid, finding_ids.IOMMU))
BAR1 = ("BAR1: the GPU's BAR1 aperture is small (resizable BAR not enabled)", _is_bar1)
ROOT_COMPLEX = ("root complex: the CPU's root complex does not forward peer-to-peer traffic "
                "between these two devices", lambda fid: False)   # no finding can tell
DEGRADED_CAUSES = (DISTANCE, ACS, IOMMU, BAR1)
# What loses or refuses the NIC's peer-to-peer traffic once registration has succeeded.
DATA_PATH_CAUSES = (ACS, IOMMU, ROOT_COMPLEX)
# The finding behind the MLX5 hint of not engaged.
SCATTER_TO_CQE = finding_ids.NIC_MLX5_SCATTER_TO_CQE


def speaks_to_verdict(finding_id: str) -> bool:
    """Whether a doctor finding confirms or rules out something the verdict can name (the
    server sends only these about its GPU buffer)."""
    return finding_id == SCATTER_TO_CQE or any(
        speaks(finding_id) for _, speaks in (*DEGRADED_CAUSES, *DATA_PATH_CAUSES))


DATA_PATH_FIX = ("run 'gdrprobe doctor' on the host that owns the GPU buffer: disable ACS "
                 "redirection on the bridges between the GPU and the NIC, put the IOMMU in "
                 "passthrough (iommu=pt) or off; if both are clear, pair the GPU with a NIC "
                 "under the same PCIe switch")


def _status(finding) -> str:
    return str(getattr(finding.status, "value", finding.status))


def doctor_causes(findings: Sequence, candidates=DEGRADED_CAUSES
                  ) -> tuple[list[str], list[str], list[str]]:
    """(likely causes, evidence lines, fixes): a cause a finding flags is confirmed, one a
    finding clears is ruled out, one no finding covers stays possible."""
    causes, evidence, fixes = [], [], []
    for cause, speaks_to in candidates:
        relevant = [f for f in findings if speaks_to(f.id)]
        flagged = [f for f in relevant if _status(f) in ("fail", "warn")]
        if flagged:
            causes.append(f"{cause} (confirmed by doctor: "
                          f"{'; '.join(f.summary for f in flagged)})")
            fixes += [f.fix for f in flagged if f.fix and f.fix not in fixes]
        elif any(_status(f) == "ok" for f in relevant):
            evidence.append(f"ruled out by doctor: {cause.split(':')[0]}")
        else:
            causes.append(f"{cause} (possible; not checked)")
    return causes, evidence, fixes


# ---- classification -------------------------------------------------------------


def _not_testable(reason: str, fix: str, threshold: float, evidence=()) -> Verdict:
    return Verdict(NOT_TESTABLE, threshold=threshold, likely_causes=(reason,), fix=fix,
                   evidence=tuple(evidence))


def spread_note(best: ArmRatio, threshold: float) -> list[str]:
    if not straddles(best, threshold):
        return []
    return [f"inconclusive: per-repeat ratios {best.ratio_min:.2f}..{best.ratio_max:.2f} "
            f"straddle the threshold {threshold:.2f}; rerun with more repeats"]


def _measured_verdict(best: ArmRatio, ratios, threshold, evidence, findings) -> Verdict:
    """Engaged or degraded, by the best direct arm's median ratio."""
    evidence = list(evidence) + spread_note(best, threshold)
    common = dict(mechanism=best.mechanism, ratio=best.ratio, ratio_min=best.ratio_min,
                  ratio_max=best.ratio_max, threshold=threshold,
                  inconclusive=straddles(best, threshold), arms=tuple(ratios))
    if best.ratio >= threshold:
        return Verdict(ENGAGED, evidence=tuple(evidence), **common)
    staged = next((r for r in ratios if r.arm == STAGED_ARM), None)
    if staged is not None and best.ratio <= staged.ratio:
        evidence.append(f"{best.arm} is no faster than the staged bounce through host memory "
                        f"({best.ratio:.2f} vs {staged.ratio:.2f})")
    causes, doctor_evidence, fixes = doctor_causes(findings)
    fix = " ".join(fixes) or "run 'gdrprobe doctor' to find which of the likely causes applies"
    return Verdict(DEGRADED, evidence=tuple(evidence + doctor_evidence),
                   likely_causes=tuple(causes), fix=fix, **common)


def _not_engaged(failed: Sequence[ArmMeasurement], threshold, evidence, findings) -> Verdict:
    causes, fixes = [], []
    for arm in failed:
        known = registration_cause(arm.registration_errno)
        causes.append(f"{arm.arm}: registration failed with "
                      f"{errno_name(arm.registration_errno)}: {known.cause}")
        if known.fix not in fixes:
            fixes.append(known.fix)
    flagged = [f for f in findings if f.id == SCATTER_TO_CQE
               and _status(f) in ("fail", "warn")]
    evidence = list(evidence) + [f"doctor: {f.summary}" for f in flagged]
    return Verdict(NOT_ENGAGED, failed[0].mechanism, threshold=threshold,
                   evidence=tuple(evidence), likely_causes=tuple(causes),
                   fix=" | ".join(fixes))


def _data_path_broken(broken: Sequence[ArmMeasurement], threshold, evidence,
                      findings) -> Verdict:
    """Registered, but the NIC's traffic to or from GPU memory is lost or refused."""
    arm = broken[0]
    causes, doctor_evidence, fixes = doctor_causes(findings, DATA_PATH_CAUSES)
    summary = (f"the data path is broken: {arm.arm} registered the GPU memory, but the NIC's "
               "peer-to-peer traffic to it was lost or refused (the host arm passed)")
    return Verdict(NOT_ENGAGED, arm.mechanism, threshold=threshold,
                   evidence=tuple(list(evidence) + doctor_evidence),
                   likely_causes=(summary, *causes), fix=" ".join(fixes) or DATA_PATH_FIX)


def arm_evidence(host: ArmMeasurement, arms: Iterable[ArmMeasurement],
                 ratios: dict[str, ArmRatio]) -> list[str]:
    size = f" at {host.message_bytes} B messages" if host.message_bytes else ""
    lines = [f"host: median {statistics.median(host.bandwidths_gbps):.1f} Gb/s{size} "
             f"over {len(host.bandwidths_gbps)} repeats"]
    for arm in arms:
        if arm.mechanism_reason:
            lines.append(f"{arm.arm}: {arm.mechanism_reason}")
        if arm.arm in ratios:
            lines.append(format_ratio(ratios[arm.arm]))
            if arm.arm in DIRECT_ARMS and not arm.proves_gpudirect:
                lines.append(f"{arm.arm}: {arm.memory_kind} memory is not a GPUDirect proof "
                             "(the NIC reaches it through host memory)")
        elif arm.registration_errno is not None:
            lines.append(f"{arm.arm}: memory registration failed with "
                         f"{errno_name(arm.registration_errno)}")
        elif arm.data_path_error:
            lines.append(f"{arm.arm}: {arm.data_path_error}")
        elif arm.not_testable:
            lines.append(f"{arm.arm}: {arm.not_testable}")
    return lines


def classify(host: ArmMeasurement, gpu_arms: Sequence[ArmMeasurement],
             threshold: float = defaults.THRESHOLD, doctor_findings: Sequence = ()) -> Verdict:
    """The verdict on GPUDirect RDMA from the host arm and the GPU arms of one run."""
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold {threshold} must be in (0, 1]")
    if host.not_testable:
        return _not_testable(host.not_testable, host.fix, threshold)
    if not host.measured:
        return _not_testable("the host arm measured no bandwidth, so there is nothing to "
                             "compare with", "run 'gdrprobe run' with the host arm alone "
                             "and fix what it reports", threshold)
    ratios = {arm.arm: r for arm in gpu_arms if arm.measured
              for r in [arm_ratio(host, arm)] if r is not None}
    evidence = arm_evidence(host, gpu_arms, ratios)
    direct = [ratios[arm.arm] for arm in gpu_arms if arm.proves_gpudirect and arm.arm in ratios]
    if direct:
        best = max(direct, key=lambda r: r.ratio)
        return _measured_verdict(best, list(ratios.values()), threshold, evidence, doctor_findings)
    broken = [arm for arm in gpu_arms if arm.proves_gpudirect and arm.data_path_error]
    if broken:
        return _data_path_broken(broken, threshold, evidence, doctor_findings)
    failed = [arm for arm in gpu_arms
              if arm.proves_gpudirect and arm.registration_errno is not None]
    if failed:
        return _not_engaged(failed, threshold, evidence, doctor_findings)
    # Whatever happened to an arm on managed or pinned-host memory, it says nothing about
    # GPUDirect: the NIC reaches such memory through host pages.
    unproven = [arm for arm in gpu_arms
                if arm.arm in DIRECT_ARMS and arm.memory_kind != PROOF_MEMORY_KIND]
    if unproven:
        return _not_testable(f"memory that proves nothing: the GPU arm used "
                             f"{unproven[0].memory_kind} memory, which the NIC reaches "
                             "through host memory, not GPUDirect",
                             "rerun with device memory (--gpu-mem-type device, the default)",
                             threshold, evidence)
    blocked = [arm for arm in gpu_arms if arm.not_testable]
    if blocked:
        return _not_testable(blocked[0].not_testable, blocked[0].fix, threshold, evidence)
    return _not_testable("no GPU arm ran (the DMA-BUF or peermem arm is needed for a verdict)",
                         "rerun with a GPU arm, e.g. --mem gpu", threshold, evidence)
