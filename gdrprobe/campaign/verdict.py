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
  nothing about GPUDirect (managed, pinned host);
- **not used by NCCL** (:func:`with_nccl`): the A/B found nothing wrong with the node, but
  NCCL's own rules keep this GPU off GPUDirect RDMA (its GDR level, NCCL_IB_DISABLE, a NIC
  NCCL_IB_HCA excludes, no peer memory and no DMA-BUF for NCCL, ...).

Directions. A two-ended arm (GPU memory at both ends) decides; where it falls short, the
one-direction arms (GPU source, host destination: the NIC reads GPU memory, NCCL's sends;
host source, GPU destination: the NIC writes it, NCCL's receives) name the direction that
fails (:func:`failing_direction`).

The floor. Where the port's line rate is known and the device is hardware, the deciding
arm must also reach ``floor`` of it: two arms crippled alike (a translating IOMMU, a far
NUMA node, a NIC on a narrower PCIe link) give a ratio near 1 and say nothing otherwise.

Ratio and spread: the probe runs the arms in alternation, so repeat ``i`` of the host arm
and repeat ``i`` of a GPU arm saw the same conditions. The ratio is the median of those
paired per-repeat ratios; the spread is their minimum and maximum (with the 3 to 10 repeats
a probe affords, an interquartile range would rest on one or two points).

Conclusive or not (:func:`answer_side`). Whether the median is above or below the threshold
is the sign test's question: the distribution-free confidence interval of a median from n
values is the span between the (d+1)-th smallest and the (d+1)-th largest, d the most each
end may drop with P(Binomial(n, 1/2) <= d) <= (1 - MEDIAN_CONFIDENCE) / 2
(:func:`median_interval`; with fewer than 5 values no d qualifies and the interval is the
whole range, so 2 to 4 repeats are conclusive only when all of them agree). The answer is
conclusive when that interval of the deciding arm's ratios lies on one side of the
threshold, and, where the floor applies, the interval of its per-repeat line-rate fractions
on one side of the floor (one side below either is a conclusive "degraded"). Otherwise the
verdict keeps the median's classification as information, sets ``inconclusive`` with an
evidence line, and its exit code is 12 (inconclusive, warn), never a drain
(:func:`gdrprobe.report.check.verdict_exit_code`): this one rule serves check, the node
check, require(), run's A/B, bench and cluster alike. More repeats narrow the interval (a
wider range never makes a straddle conclusive, a median's interval does), which is why the
A/B samples on while its answer is inconclusive (:mod:`gdrprobe.campaign.ab`). Another
job's traffic on the port during the runs (:func:`disturbed`) makes a measured answer
inconclusive the same way.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Sequence

from gdrprobe import defaults
from gdrprobe.errors import UsageError
from gdrprobe.memory.causes import errno_name, registration_cause
from gdrprobe.memory.spec import peer_memory_of
from gdrprobe.report import finding_ids
from gdrprobe.report.check import (BOTH, DECIDES, DEGRADED, DIRECTION_WORDS, ENGAGED,
                                   NOT_ENGAGED, NOT_TESTABLE, NOT_USED, READ, WRITE, ArmRatio,
                                   FloorCheck, NcclUse, Verdict)

DIRECT_ARMS = ("dmabuf", "peermem")   # arms whose speed proves or disproves GPUDirect
STAGED_ARM = "staged"                 # the bounce through host memory: a reference only
PROOF_MEMORY_KIND = "device"          # managed and pinned-host memory prove nothing
DIAGNOSES = "diagnoses"               # a one-direction arm run to name the failing direction
UNKNOWN = "unknown"                   # a direction the arms could not isolate


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
    direction: str = ""                       # read | write | both; "" where not said
    role: str = DECIDES                       # decides | diagnoses
    # The host arm's bandwidth in the repeats this arm ran in (empty: the host arm's
    # repeats pair with this arm's by index).
    host_gbps: tuple[float, ...] = ()

    @property
    def proves_gpudirect(self) -> bool:
        return self.arm in DIRECT_ARMS and self.memory_kind == PROOF_MEMORY_KIND

    @property
    def measured(self) -> bool:
        return (not self.not_testable and self.registration_errno is None
                and not self.data_path_error
                and any(value > 0 for value in self.bandwidths_gbps))

    @property
    def key(self) -> str:
        return f"{self.arm}/{self.direction}" if self.direction else self.arm

    @property
    def label(self) -> str:
        return f"{self.arm} ({self.direction})" if self.direction else self.arm

    @property
    def outcome(self) -> str:
        return ("registration failed" if self.registration_errno is not None else
                "data path broken" if self.data_path_error else
                "not testable" if self.not_testable else "measured")


# ---- ratios ------------------------------------------------------------------------


def paired_ratios(host: Sequence[float], gpu: Sequence[float]) -> list[float]:
    """GPU over host per repeat; repeats beyond the shorter arm have no partner and are dropped."""
    return [g / h for h, g in zip(host, gpu) if h > 0]


# The confidence of the median's interval that decides whether an answer is conclusive: a
# two-sided sign test at 0.1, 0.05 a side (the convention of a 90% interval).
MEDIAN_CONFIDENCE = 0.9


def trimmed_per_end(n: int, confidence: float = MEDIAN_CONFIDENCE) -> int:
    """The most values each end of n may drop while the span left still covers the median
    with at least `confidence`: the largest d with P(Binomial(n, 1/2) <= d) <= (1 -
    confidence) / 2 (the span [x(d+1), x(n-d)] covers it with 1 - 2 P(B <= d)); 0 when even
    the whole range falls short (n < 5 at 0.9)."""
    tail, cumulative, kept = (1 - confidence) / 2, 0.0, 0
    for d in range(n):
        cumulative += math.comb(n, d) / 2 ** n
        if cumulative > tail:
            break
        kept = d
    return kept


def median_interval(values: Sequence[float],
                    confidence: float = MEDIAN_CONFIDENCE) -> tuple[float, float]:
    """The distribution-free confidence interval of the median of values (sign test)."""
    ordered = sorted(values)
    d = trimmed_per_end(len(ordered), confidence)
    return ordered[d], ordered[len(ordered) - 1 - d]


def line_rate_fraction(bandwidths: Sequence[float], floor: FloorCheck | None) -> float | None:
    if floor is None or not floor.line_rate_gbps or not bandwidths:
        return None
    return round(statistics.median(bandwidths) / floor.line_rate_gbps, 4)


def line_rate_interval(bandwidths: Sequence[float],
                       floor: FloorCheck | None) -> tuple[float, float] | None:
    """The median's interval of the per-repeat shares of line rate (None: no rate)."""
    if floor is None or not floor.line_rate_gbps or not bandwidths:
        return None
    return median_interval([value / floor.line_rate_gbps for value in bandwidths])


def arm_ratio(host: ArmMeasurement, gpu: ArmMeasurement,
              floor: FloorCheck | None = None) -> ArmRatio | None:
    """The arm against the host runs of its own repeats; None when it measured nothing."""
    ratios = paired_ratios(gpu.host_gbps or host.bandwidths_gbps, gpu.bandwidths_gbps)
    if not ratios or not gpu.measured:
        return None
    return ArmRatio(gpu.arm, gpu.mechanism, gpu.memory_kind, statistics.median(ratios),
                    min(ratios), max(ratios), len(ratios), gpu.direction, gpu.outcome,
                    gpu.role, line_rate_fraction(gpu.bandwidths_gbps, floor),
                    median_interval(ratios),
                    line_rate_interval(gpu.bandwidths_gbps, floor))


def unmeasured_ratio(arm: ArmMeasurement) -> ArmRatio:
    """An arm that measured nothing, as the verdict lists it: its outcome says why."""
    return ArmRatio(arm.arm, arm.mechanism, arm.memory_kind, None, None, None, 0,
                    arm.direction, arm.outcome, arm.role)


def format_ratio(r: ArmRatio) -> str:
    direction = f", {r.direction}" if r.direction else ""
    rate = (f"; {r.line_rate_fraction:.2f} of line rate"
            if r.line_rate_fraction is not None else "")
    interval = ("" if r.interval in (None, (r.ratio_min, r.ratio_max)) else
                f", the median's {MEDIAN_CONFIDENCE:.0%} interval "
                f"{r.interval[0]:.2f}..{r.interval[1]:.2f}")
    return (f"{r.arm} ({r.memory_kind} memory{direction}): {r.ratio:.2f} of host bandwidth "
            f"(per-repeat {r.ratio_min:.2f}..{r.ratio_max:.2f}{interval}, {r.repeats} "
            f"repeats{rate})")


def side(interval: tuple[float, float], bound: float) -> int:
    """1: the whole interval at or above bound; -1: all of it below; 0: it straddles."""
    low, high = interval
    return 1 if low >= bound else -1 if high < bound else 0


def answer_side(r: ArmRatio, threshold: float, floor: FloorCheck | None = None) -> int:
    """Where the arm's answer lies: 1 engaged (its ratios' interval at or above the
    threshold and, where the floor applies, its line-rate shares' at or above the floor), -1
    degraded (either interval wholly below), 0 not known (inconclusive)."""
    ratio = side(r.interval or (r.ratio_min, r.ratio_max), threshold)
    rate = (side(r.line_rate_interval, floor.floor)
            if floor is not None and floor.applied and r.line_rate_interval else 1)
    if -1 in (ratio, rate):
        return -1
    return 1 if ratio == rate == 1 else 0


def settled(r: ArmRatio, threshold: float, floor: FloorCheck | None = None) -> bool:
    """Whether the arm's answer is conclusive (:func:`answer_side`)."""
    return answer_side(r, threshold, floor) != 0


# ---- degraded: likely causes and what the doctor says about them -----------------


def _is_bar1(finding_id: str) -> bool:
    return finding_ids.is_gpu_bar1(finding_id)


# (cause, does a finding id speak to it)
DISTANCE = ("distance: the NIC and GPU do not share a PCIe switch (the path crosses the CPU "
            "or the socket interconnect)", lambda fid: fid == finding_ids.TOPOLOGY_DISTANCE)
ACS = ("ACS: PCIe Access Control Services on the switch where GPU and NIC meet redirect peer "
       "traffic up to the root complex",
       lambda fid: fid == finding_ids.ACS_BRIDGE)
IOMMU = ("IOMMU: a translating IOMMU sits in the peer-to-peer path (GPUDirect needs 1:1 or "
         "off)", lambda fid: finding_ids.in_group(fid, finding_ids.IOMMU))
BAR1 = ("BAR1: the GPU's BAR1 aperture is small (resizable BAR not enabled)", _is_bar1)
ROOT_COMPLEX = ("root complex: the CPU's root complex does not forward peer-to-peer traffic "
                "between these two devices", lambda fid: False)   # no finding can tell
DEGRADED_CAUSES = (DISTANCE, ACS, IOMMU, BAR1)
# What loses or refuses the NIC's peer-to-peer traffic once registration has succeeded.
DATA_PATH_CAUSES = (ACS, IOMMU, ROOT_COMPLEX)
# What slows the host arm as much as the GPU arm: the floor's causes.
FLOOR_CAUSES = (
    ("the NIC's PCIe link: trained below its width or speed (a 400 Gb/s NIC needs PCIe Gen5 "
     "x16; Gen4 x16 carries at most 252 Gb/s)", lambda fid: False),
    IOMMU,
    ("NUMA: the buffers or the polling thread sit on the socket far from the NIC",
     lambda fid: False),
    ("the port: running below its rated speed, or a queue setting that cannot fill it (-q, "
     "-t)", lambda fid: False))
# The finding behind the MLX5 hint of not engaged.
SCATTER_TO_CQE = finding_ids.NIC_MLX5_SCATTER_TO_CQE


def speaks_to_verdict(finding_id: str) -> bool:
    """Whether a doctor finding confirms or rules out something the verdict can name (the
    server sends only these about its GPU buffer)."""
    return finding_id == SCATTER_TO_CQE or any(
        speaks(finding_id) for _, speaks in (*DEGRADED_CAUSES, *DATA_PATH_CAUSES))


DATA_PATH_FIX = ("run 'gdrprobe doctor' on the host that owns the GPU buffer: disable ACS "
                 "redirection on the ports of the PCIe switch where the GPU and the NIC meet, "
                 "put the IOMMU in passthrough (iommu=pt) or off; if both are clear, pair the "
                 "GPU with a NIC under the same PCIe switch")
FLOOR_FIX = ("check the NIC's PCIe link (lspci -vv: LnkSta against LnkCap), the IOMMU "
             "(iommu=pt) and the port's speed ('gdrprobe devices'); 'gdrprobe doctor' names "
             "what it can see")


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


def _not_testable(reason: str, fix: str, threshold: float, evidence=(), arms=()) -> Verdict:
    return Verdict(NOT_TESTABLE, threshold=threshold, likely_causes=(reason,), fix=fix,
                   evidence=tuple(evidence), arms=tuple(arms))


def spread_note(best: ArmRatio, threshold: float, floor: FloorCheck | None) -> list[str]:
    if settled(best, threshold, floor):
        return []
    low, high = best.interval or (best.ratio_min, best.ratio_max)
    line = (f"inconclusive: the per-repeat GPU/host ratios {best.ratio_min:.2f}.."
            f"{best.ratio_max:.2f} (the median's {MEDIAN_CONFIDENCE:.0%} interval "
            f"{low:.2f}..{high:.2f}, {best.repeats} repeats) straddle the threshold "
            f"{threshold:.2f}")
    if side((low, high), threshold) != 0:
        low, high = best.line_rate_interval
        line = (f"inconclusive: the per-repeat shares of line rate (the median's "
                f"{MEDIAN_CONFIDENCE:.0%} interval {low:.2f}..{high:.2f}, {best.repeats} "
                f"repeats) straddle the floor {floor.floor:.2f}")
    return [line + "; the answer is not known: exit 12 (warn), never a drain; check again "
                   "when the node is quiet"]


def below_floor(best: ArmRatio, floor: FloorCheck | None) -> bool:
    return (floor is not None and floor.applied and best.line_rate_fraction is not None
            and best.line_rate_fraction < floor.floor)


def _measured_verdict(best: ArmRatio, ratios: Sequence[ArmRatio], threshold, evidence,
                      findings, floor: FloorCheck | None) -> Verdict:
    """Engaged or degraded: by the best direct arm's median ratio, then by the floor."""
    evidence = list(evidence) + spread_note(best, threshold, floor)
    common = dict(mechanism=best.mechanism, ratio=best.ratio, ratio_min=best.ratio_min,
                  ratio_max=best.ratio_max, threshold=threshold,
                  inconclusive=not settled(best, threshold, floor), arms=tuple(ratios),
                  below_floor=below_floor(best, floor))
    if common["below_floor"]:
        evidence.append(f"below the floor: {best.arm} reached {best.line_rate_fraction:.2f} "
                        f"of the port's {floor.line_rate_gbps:g} Gb/s line rate, under "
                        f"--floor {floor.floor:.2f}")
    if best.ratio >= threshold and not common["below_floor"]:
        return Verdict(ENGAGED, evidence=tuple(evidence), **common)
    if best.ratio >= threshold:   # both arms slow alike: what is common to them
        causes, doctor_evidence, fixes = doctor_causes(findings, FLOOR_CAUSES)
        return Verdict(DEGRADED, evidence=tuple(evidence + doctor_evidence),
                       likely_causes=tuple(causes), fix=" ".join(fixes) or FLOOR_FIX,
                       direction=None, **common)
    staged = next((r for r in ratios if r.arm == STAGED_ARM and r.ratio is not None), None)
    if staged is not None and best.ratio <= staged.ratio:
        evidence.append(f"{best.arm} is no faster than the staged bounce through host memory "
                        f"({best.ratio:.2f} vs {staged.ratio:.2f})")
    causes, doctor_evidence, fixes = doctor_causes(findings)
    fix = " ".join(fixes) or "run 'gdrprobe doctor' to find which of the likely causes applies"
    return Verdict(DEGRADED, evidence=tuple(evidence + doctor_evidence),
                   likely_causes=tuple(causes), fix=fix, direction=best.direction or None,
                   **common)


def _not_engaged(failed: Sequence[ArmMeasurement], threshold, evidence, findings,
                 arms) -> Verdict:
    causes, fixes = [], []
    for arm in failed:
        known = registration_cause(arm.registration_errno, peer_memory_of(arm.mechanism))
        causes.append(f"{arm.arm}: registration failed with "
                      f"{errno_name(arm.registration_errno)}: {known.cause}")
        if known.fix not in fixes:
            fixes.append(known.fix)
    flagged = [f for f in findings if f.id == SCATTER_TO_CQE
               and _status(f) in ("fail", "warn")]
    evidence = list(evidence) + [f"doctor: {f.summary}" for f in flagged]
    return Verdict(NOT_ENGAGED, failed[0].mechanism, threshold=threshold,
                   evidence=tuple(evidence), likely_causes=tuple(causes),
                   fix=" | ".join(fixes), arms=tuple(arms),
                   direction=failed[0].direction or None)


def _data_path_broken(broken: Sequence[ArmMeasurement], threshold, evidence,
                      findings, arms) -> Verdict:
    """Registered, but the NIC's traffic to or from GPU memory is lost or refused."""
    arm = broken[0]
    causes, doctor_evidence, fixes = doctor_causes(findings, DATA_PATH_CAUSES)
    summary = (f"the data path is broken: {arm.arm} registered the GPU memory, but the NIC's "
               "peer-to-peer traffic to it was lost or refused (the host arm passed)")
    return Verdict(NOT_ENGAGED, arm.mechanism, threshold=threshold,
                   evidence=tuple(list(evidence) + doctor_evidence),
                   likely_causes=(summary, *causes), fix=" ".join(fixes) or DATA_PATH_FIX,
                   arms=tuple(arms), direction=arm.direction or None)


def arm_evidence(host: ArmMeasurement, arms: Iterable[ArmMeasurement],
                 ratios: dict[str, ArmRatio]) -> list[str]:
    size = f" at {host.message_bytes} B messages" if host.message_bytes else ""
    lines = [f"host: median {statistics.median(host.bandwidths_gbps):.1f} Gb/s{size} "
             f"over {len(host.bandwidths_gbps)} repeats"]
    for arm in arms:
        if arm.mechanism_reason:
            lines.append(f"{arm.arm}: {arm.mechanism_reason}")
        if arm.key in ratios:
            lines.append(format_ratio(ratios[arm.key]))
            if arm.arm in DIRECT_ARMS and not arm.proves_gpudirect:
                lines.append(f"{arm.arm}: {arm.memory_kind} memory is not a GPUDirect proof "
                             "(the NIC reaches it through host memory)")
        elif arm.registration_errno is not None:
            lines.append(f"{arm.label}: memory registration failed with "
                         f"{errno_name(arm.registration_errno)}")
        elif arm.data_path_error:
            lines.append(f"{arm.label}: {arm.data_path_error}")
        elif arm.not_testable:
            lines.append(f"{arm.label}: {arm.not_testable}")
    return lines


def check_threshold(threshold: float) -> None:
    """A threshold a person gave, refused with its fix before anything is measured
    (:func:`classify` would refuse it only once everything was)."""
    if not 0 < threshold <= 1:
        raise UsageError(f"threshold {threshold} must be over 0 and at most 1",
                         f"e.g. {defaults.THRESHOLD:g}")


def check_repeats(repeats: int) -> None:
    """The A/B's repeats a person gave, refused with its fix before anything is measured."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or not 1 <= repeats <= 100:
        raise UsageError(f"--repeats {repeats}: use a whole number from 1 to 100",
                         f"e.g. --repeats {defaults.REPEATS} (the default)")


def classify(host: ArmMeasurement, gpu_arms: Sequence[ArmMeasurement],
             threshold: float = defaults.THRESHOLD, doctor_findings: Sequence = (),
             floor: FloorCheck | None = None) -> Verdict:
    """The verdict on GPUDirect RDMA from the host arm and the GPU arms of one run (floor:
    the port's line rate and the fraction of it the deciding arm must reach)."""
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold {threshold} must be in (0, 1]")
    if host.not_testable:
        return _not_testable(host.not_testable, host.fix, threshold)
    if not host.measured:
        return _not_testable("the host arm measured no bandwidth, so there is nothing to "
                             "compare with", "run 'gdrprobe run' with the host arm alone "
                             "and fix what it reports", threshold)
    ratios = {arm.key: r for arm in gpu_arms for r in [arm_ratio(host, arm, floor)]
              if r is not None}
    listed = [ratios.get(arm.key) or unmeasured_ratio(arm) for arm in gpu_arms]
    evidence = arm_evidence(host, gpu_arms, ratios)
    verdict = _decide([a for a in gpu_arms if a.role == DECIDES], ratios, listed,
                      threshold, evidence, doctor_findings, floor)
    return with_direction(verdict, [a for a in gpu_arms if a.role == DIAGNOSES], host,
                          threshold)


def _decide(deciding: Sequence[ArmMeasurement], ratios: dict[str, ArmRatio],
            listed: Sequence[ArmRatio], threshold, evidence, findings, floor) -> Verdict:
    direct = [ratios[arm.key] for arm in deciding if arm.proves_gpudirect and arm.key in ratios]
    if direct:
        best = max(direct, key=lambda r: r.ratio)
        return _measured_verdict(best, listed, threshold, evidence, findings, floor)
    broken = [arm for arm in deciding if arm.proves_gpudirect and arm.data_path_error]
    if broken:
        return _data_path_broken(broken, threshold, evidence, findings, listed)
    failed = [arm for arm in deciding
              if arm.proves_gpudirect and arm.registration_errno is not None]
    if failed:
        return _not_engaged(failed, threshold, evidence, findings, listed)
    # Whatever happened to an arm on managed or pinned-host memory, it says nothing about
    # GPUDirect: the NIC reaches such memory through host pages.
    unproven = [arm for arm in deciding
                if arm.arm in DIRECT_ARMS and arm.memory_kind != PROOF_MEMORY_KIND]
    if unproven:
        return _not_testable(f"memory that proves nothing: the GPU arm used "
                             f"{unproven[0].memory_kind} memory, which the NIC reaches "
                             "through host memory, not GPUDirect",
                             "rerun with device memory (--gpu-mem-type device, the default)",
                             threshold, evidence, listed)
    blocked = [arm for arm in deciding if arm.not_testable]
    if blocked:
        return _not_testable(blocked[0].not_testable, blocked[0].fix, threshold, evidence,
                             listed)
    return _not_testable("no GPU arm ran (the DMA-BUF or peermem arm is needed for a verdict)",
                         "rerun with a GPU arm, e.g. --mem gpu", threshold, evidence, listed)


# ---- which direction fails ------------------------------------------------------


def arm_fails(arm: ArmMeasurement, host: ArmMeasurement, threshold: float) -> bool | None:
    """True: the arm shows the fault; False: it keeps up; None: it did not run."""
    if arm.registration_errno is not None or arm.data_path_error:
        return True
    ratio = arm_ratio(host, arm)
    return None if ratio is None else ratio.ratio < threshold


def failing_direction(diagnosing: Sequence[ArmMeasurement], host: ArmMeasurement,
                      threshold: float) -> tuple[str, str]:
    """(direction, why) from the one-direction arms run after a two-ended arm fell short:
    the direction whose arm fails; both when both fail, or when each keeps up alone (the
    fault needs both at once); unknown when an arm could not run."""
    outcome = {arm.direction: arm_fails(arm, host, threshold) for arm in diagnosing}
    read, write = outcome.get(READ), outcome.get(WRITE)
    if read is None or write is None:
        missing = [arm.label + (f": {arm.not_testable}" if arm.not_testable else "")
                   for arm in diagnosing if outcome.get(arm.direction) is None]
        return UNKNOWN, ("the one-direction arms could not isolate it ("
                         + ("; ".join(missing) or "they did not run") + ")")
    if read and write:
        return BOTH, "the read and the write arm each fall short alone"
    if read or write:
        return (READ if read else WRITE), (f"the {READ if read else WRITE} arm falls short "
                                           f"alone; the {WRITE if read else READ} arm keeps up")
    return BOTH, ("each direction alone keeps up; only GPU memory at both ends at once "
                  "falls short")


def with_direction(verdict: Verdict, diagnosing: Sequence[ArmMeasurement],
                   host: ArmMeasurement, threshold: float) -> Verdict:
    """A degraded or broken two-ended verdict names the direction that fails (a verdict
    below the floor alone has none: both arms are slow alike)."""
    if verdict.classification not in (DEGRADED, NOT_ENGAGED) or verdict.direction != BOTH \
            or not diagnosing:
        return _direction_line(verdict, "")
    direction, why = failing_direction(diagnosing, host, threshold)
    return _direction_line(dataclasses.replace(verdict, direction=direction), why)


def _direction_line(verdict: Verdict, why: str) -> Verdict:
    if verdict.direction is None:
        return verdict
    words = DIRECTION_WORDS.get(verdict.direction, "not isolated")
    line = f"failing direction: {verdict.direction}: {words}" + (f"; {why}" if why else "")
    return dataclasses.replace(verdict, evidence=(line, *verdict.evidence))


# ---- NCCL's own decision ----------------------------------------------------------


def nccl_line(use: NcclUse) -> str:
    """What NCCL will do for the GPU, in one line."""
    where = f" through {use.nic}" + (f" (PXN: sends through {use.via_gpu}'s memory)"
                                     if use.path == "pxn" else "")
    if use.receives and use.sends:
        return f"NCCL: uses GPUDirect RDMA for receives and sends{where}"
    if use.uses_gdr:
        on, off = ("receives", "sends") if use.receives else ("sends", "receives")
        reason = next((r for r in use.reasons if r.startswith(off[:-1])), "")
        return f"NCCL: uses GPUDirect RDMA for {on} only{where}; {reason}".rstrip("; ")
    return f"NCCL: will not use GPUDirect RDMA here: {use.cause}"


def with_nccl(verdict: Verdict, use: NcclUse | None) -> Verdict:
    """The A/B's verdict with NCCL's own decision for the GPU: "not used by NCCL" where NCCL
    will not use GPUDirect for it at all, unless the A/B already found the node at fault
    (degraded or not engaged, conclusively: that stays, a node fault whatever NCCL does) or
    the decision rests on facts the doctor could not read (then it is evidence only)."""
    if use is None:
        return verdict
    evidence = (nccl_line(use), *verdict.evidence)
    node_fault = (verdict.classification in (DEGRADED, NOT_ENGAGED)
                  and not verdict.inconclusive)
    if use.uses_gdr or not use.firm or node_fault:
        return dataclasses.replace(verdict, nccl=use, evidence=evidence)
    measured = (f"the A/B: {verdict.classification}"
                + (f" (GPU/host {verdict.ratio:.2f})" if verdict.ratio is not None else ""))
    return dataclasses.replace(
        verdict, classification=NOT_USED, nccl=use, evidence=(*evidence, measured),
        likely_causes=(use.cause,), fix=use.fix, direction=None)


# ---- another job's traffic ---------------------------------------------------------


def disturbed(verdict: Verdict, foreign: Sequence[str]) -> Verdict:
    """The verdict when other traffic crossed the port during the runs (foreign: one line
    per run that saw it, :mod:`gdrprobe.campaign.port_traffic`): a measured answer (engaged
    or degraded) compared bandwidths another job shared, so it says nothing for or against
    the node: inconclusive (exit 12). A refused registration or a broken data path is not a
    matter of bandwidth and stays; the lines are evidence either way."""
    if not foreign:
        return verdict
    lines = tuple(f"another job's traffic: {line}" for line in foreign)
    if verdict.classification not in (ENGAGED, DEGRADED):
        return dataclasses.replace(verdict, evidence=(*verdict.evidence, *lines))
    note = ("inconclusive: other traffic shared the port during the runs, so the bandwidths "
            "compared are not the node's; exit 12 (warn), never a drain; check again when "
            "the port is quiet")
    return dataclasses.replace(verdict, inconclusive=True,
                               evidence=(note, *lines, *verdict.evidence))
