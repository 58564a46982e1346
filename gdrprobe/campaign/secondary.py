"""check's extra answers on an engaged node: small-message latency, the NIC reading GPU
memory for sends, both directions at once, and NCCL's flush. Pure logic, no I/O:
:mod:`gdrprobe.campaign.prelaunch` measures, these decide. Each is founded on the traffic
NCCL makes (NVIDIA/nccl 2.30.7): its data goes as RDMA WRITE and WRITE with immediate
(``src/transport/net_ib/p2p.cc`` ncclIbMultiSend), RDMA READ only in its flush of a
GPUDirect receive (ncclIbIflush).

- **latency degraded** (``check --latency``): the latency A/B (:mod:`latency_ab`: WRITE with
  immediate, host memory at both ends against the check's GPU memory, each side sending from
  host memory as NCCL's LL protocol does: its send buffers stay in host memory even with
  GPUDirect, its receive buffers are GPU memory, ``src/transport/net.cc``
  NCCL_NET_MAP_ADD_POINTER in sendProxyConnect and recvProxyConnect; no flush: NCCL flushes
  SIMPLE receives only, recvProxyProgress) puts the GPU arm's median over the host arm's by
  more than a factor at some size, in every repeat's pair (inconclusive where only in
  some; default :data:`gdrprobe.defaults.LATENCY_FACTOR`, where its evidence is cited).
- **GDR read degraded** (``check --read``): WRITEs out of GPU memory into host memory, the
  NIC reading GPU memory as the source of its sends as NCCL's sends with GPUDirect do
  (NCCL_NET_GDR_READ governs exactly this: ``src/graph/paths.cc`` ncclTopoCheckGdr with
  read=1 for the send side), fall short (degraded or broken) while the two-ended WRITE A/B
  passed. Not measured where NCCL's decision keeps this GPU's sends off GPUDirect (nothing
  of NCCL's reads it then). NCCL's own mitigation is named: NCCL_NET_GDR_READ=0. RDMA READ
  is no evidence here: NCCL's data never travels by it.
- **GDR read degraded** (``check --bidir``): both ends WRITEing at once (each NIC reading
  one GPU buffer as the source of its sends while writing another, NCCL's flush before each
  check where NCCL flushes) falls short while the one-way WRITE A/B passed.
- **the flush**: every flush READ of the deciding arm brought back the byte its message
  wrote last (a wrong byte already ends the arm as a broken data path, exit 1); the READ
  evidence the check keeps is this one.

Both warnings are reported, never drained on (exit 13, :class:`gdrprobe.errors.ExitCode`),
until hardware calibrates the bounds; neither is asked where the WRITE A/B's answer is not a
conclusive "engaged": that answer comes first.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

from gdrprobe import defaults
from gdrprobe.errors import UsageError
from gdrprobe.report.check import (DEGRADED, ENGAGED, GDR_READ_DEGRADED, INCONCLUSIVE,
                                   LATENCY_DEGRADED, NOT_ENGAGED, NOT_RUN, NOT_TESTABLE, WITHIN,
                                   CheckReport, FlushCheck, LatencyCheck, ReadCheck, Verdict)
from gdrprobe.report.model import LatencyABReport, RunReport

READ_WHAT = "WRITEs out of GPU memory"                    # check --read's A/B: NCCL's sends
BIDIR_WHAT = "bidirectional WRITE"                        # check --bidir's A/B
DEFAULT_FACTOR_SOURCE = ("the default: a doubling is the symptom users report "
                         "(gdrprobe.defaults.LATENCY_FACTOR); uncalibrated, so a warning")
# NCCL reads NCCL_NET_GDR_READ in ncclTopoCheckGdr (NCCL_PARAM NetGdrRead, default -2:
# NVIDIA/nccl src/graph/paths.cc, 2.30.7; early releases read it in src/transport/net.cc
# netGetGdrSupport): 0 keeps the NIC from reading GPU memory on sends, which then stage
# through host memory, while receives keep GPUDirect (gdrprobe.nccl.decision read_refusal).
READ_MITIGATION = ("NCCL_NET_GDR_READ=0 in the job's environment: NCCL's sends then stage "
                   "through host memory instead of the NIC reading GPU memory, receives keep "
                   "GPUDirect RDMA (NCCL src/graph/paths.cc ncclTopoCheckGdr); measure the job "
                   "with and without it")


def check_latency_factor(factor: float, latency: bool) -> None:
    """A factor a person gave (for the latency A/B, which latency asks for), refused with
    its fix before anything is measured."""
    if not latency:
        raise UsageError("--latency-factor bounds the latency A/B, which --latency asks for",
                         "add --latency (latency=True), or drop --latency-factor")
    if isinstance(factor, bool) or not 1 < factor <= 100:
        raise UsageError(f"--latency-factor {factor:g}: use a ratio over 1 and at most 100",
                         f"e.g. --latency-factor {defaults.LATENCY_FACTOR:g} (the default)")


def blocked_by(verdict: Verdict) -> str:
    """Why the extra answers are not asked ("": they are): only an engaged, conclusive
    WRITE A/B leaves a question for them."""
    if verdict.classification == ENGAGED and not verdict.inconclusive:
        return ""
    state = verdict.classification + (", inconclusive" if verdict.inconclusive else "")
    return f"the WRITE A/B's answer ({state}) comes first"


def latency_check(report: LatencyABReport, factor: float, source: str) -> LatencyCheck:
    """Latency degraded at the sizes where the GPU arm's median is over factor times the
    host arm's in every repeat's pair; where the medians are over it but some pair is not
    (load that came and went slows a run, never speeds one up), inconclusive at that size,
    a warning about nothing, as the other A/Bs straddling their bound."""
    slow = [r for r in report.ratios if r.gpu_over_host > factor]
    degraded = tuple(r.size_bytes for r in slow if min(r.pair_ratios, default=r.gpu_over_host)
                     > factor)
    straddled = tuple(r.size_bytes for r in slow if r.size_bytes not in degraded)
    outcome = LATENCY_DEGRADED if degraded else INCONCLUSIVE if straddled else WITHIN
    return LatencyCheck(outcome, factor, source, ratios=report.ratios, degraded_sizes=degraded,
                        inconclusive_sizes=straddled, repeats=len(report.host))


def latency_not_run(factor: float, source: str, why: str) -> LatencyCheck:
    return LatencyCheck(NOT_RUN, factor, source, detail=why)


def read_check(read: CheckReport, what: str = READ_WHAT) -> ReadCheck:
    """The READ (or bidirectional) A/B's answer, asked after the one-way WRITE A/B passed:
    GDR read degraded where it conclusively falls short or its data path broke; its median
    alone where inconclusive."""
    verdict = read.verdict
    if verdict.classification == NOT_TESTABLE:
        return ReadCheck(NOT_RUN, verdict, read.arms,
                         detail=(verdict.likely_causes or ("not testable",))[0])
    if verdict.inconclusive:
        return ReadCheck(INCONCLUSIVE, verdict, read.arms,
                         detail=f"the {what} A/B's ratios straddle the threshold")
    if verdict.classification in (DEGRADED, NOT_ENGAGED):
        return ReadCheck(GDR_READ_DEGRADED, verdict, read.arms, mitigation=READ_MITIGATION,
                         detail=_read_shortfall(verdict, what))
    return ReadCheck(WITHIN, verdict, read.arms)


def _read_shortfall(verdict: Verdict, what: str) -> str:
    subject = what if what == READ_WHAT else f"{what} of GPU memory"
    tail = ("while WRITE with GPU memory at both ends passes" if what == READ_WHAT
            else "while one-way WRITE passes")
    if verdict.ratio is None:
        return (f"{subject} {verdict.classification} {tail}: "
                + (verdict.likely_causes or ("",))[0]).rstrip(": ")
    return (f"{subject} (the NIC reading GPU memory as NCCL's sends do) reach {verdict.ratio:.2f} of host "
            f"memory's, under the threshold {verdict.threshold:g}, {tail}" if what == READ_WHAT else
            f"{subject} reaches {verdict.ratio:.2f} of host memory's, under the threshold "
            f"{verdict.threshold:g}, {tail}")


def read_not_run(why: str) -> ReadCheck:
    return ReadCheck(NOT_RUN, detail=why)


def sends_not_used(use) -> str:
    """Why the sends' answer is not asked ("": it is): NCCL's decision (an NcclUse, firm)
    keeps this GPU's sends off GPUDirect, so no NIC of NCCL's reads its memory."""
    if use is None or not use.firm or use.sends:
        return ""
    reason = next((r[len("send: "):] for r in use.reasons if r.startswith("send: ")), use.cause)
    return f"NCCL sends this GPU's data from host memory, so nothing of NCCL's reads its memory: {reason}"


def with_warnings(verdict: Verdict, latency: LatencyCheck | None,
                  *reads: ReadCheck | None) -> Verdict:
    """The verdict with the extra answers that fell short as warnings (exit 13 on an engaged
    answer: verdict_exit_code)."""
    lines = []
    if latency is not None and latency.outcome == LATENCY_DEGRADED:
        worst = max(latency.ratios, key=lambda r: r.gpu_over_host)
        sizes = ", ".join(f"{size} B" for size in latency.degraded_sizes)
        lines.append(f"{LATENCY_DEGRADED}: GPU memory's median one-way latency over host "
                     f"memory's by more than {latency.factor:g}x at {sizes} (worst "
                     f"{worst.gpu_over_host:.2f}x at {worst.size_bytes} B: "
                     f"{worst.gpu_median_us:.2f} against {worst.host_median_us:.2f} us)")
    lines += [f"{GDR_READ_DEGRADED}: {read.detail}; mitigation: {read.mitigation}"
              for read in reads if read is not None and read.outcome == GDR_READ_DEGRADED]
    if not lines:
        return verdict
    return dataclasses.replace(verdict, warnings=tuple(lines))


def flush_check(runs: Sequence[RunReport], error: Exception | None = None) -> FlushCheck | None:
    """NCCL's flush across the deciding arm's runs (None where it did not flush); an error
    that ended the arm in a flush READ says what that READ brought back."""
    rows = [row for run in runs if run.settings.flush for row in run.bandwidth]
    cause = str(getattr(error, "cause", ""))
    failed = cause if "flush" in cause else ""
    if not rows and not failed:
        return None
    reads = sum(row.integrity.flush_reads for row in rows)
    bad = sum(row.integrity.flush_bad for row in rows)
    times = [row.integrity.flush_us_median for row in rows
             if row.integrity.flush_us_median is not None]
    if failed:
        outcome = f"failed, and ended the arm as a broken data path: {failed}"
    elif bad:
        outcome = f"{bad} of {reads} flush READs brought back another byte than was written"
    else:
        outcome = f"each of {reads} flush READs brought back the byte its message wrote last"
    return FlushCheck(rule=runs[-1].settings.flush if runs else "", reads=reads, bad=bad,
                      median_us=round(statistics.median(times), 3) if times else None,
                      outcome=outcome)
