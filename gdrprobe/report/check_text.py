"""The verdict screen of the A/B (``check``, ``run --mem gpu``) and the node check's lines.
Renderers format; they never decide."""

from __future__ import annotations

from gdrprobe.errors import SCHEDULER_ACTION, ExitCode
from gdrprobe.report.nccl_pattern import render_check_pattern
from gdrprobe.report.check import (DIRECTION_WORDS, NOT_TESTABLE, ArmReport, CheckReport,
                                   FloorCheck, LatencyCheck, NodeCheckReport, NodeGpuCheck,
                                   RailsReport, RankPair, Verdict, main_cause)
from gdrprobe.report.gin import GinCheck
from gdrprobe.report.model import RunSettings
from gdrprobe.report.text import RULE

NOT_TESTABLE_MEANS = ("not testable: the check could not measure GPUDirect RDMA here, so it "
                      "says nothing for or against this node")
INCONCLUSIVE_MEANS = ("inconclusive: the measurement cannot tell whether GPUDirect RDMA is "
                      "engaged here, so it says nothing for or against this node; the "
                      "classification above is its best estimate")


def render_check(report: CheckReport) -> str:
    v = report.verdict
    lines = [RULE, headline(v)]
    if v.classification == NOT_TESTABLE:
        lines.append(f" {NOT_TESTABLE_MEANS}")
    if v.exit_code == ExitCode.INCONCLUSIVE:
        lines.append(f" {INCONCLUSIVE_MEANS}")
    if v.direction:
        lines.append(f" failing direction: {v.direction}: "
                     f"{DIRECTION_WORDS.get(v.direction, 'not isolated by the arms')}")
    if v.ratio is not None:
        lines.append(f" GPU/host bandwidth {v.ratio:.2f} (per repeat {v.ratio_min:.2f}.."
                     f"{v.ratio_max:.2f}; engaged at >= {v.threshold:.2f})")
    if report.floor is not None:
        lines += render_floor(report.floor)
    if report.placement is not None:
        lines += render_placement(report.placement)
    if report.settings is not None:       # None: not one run could start
        lines += [RULE, render_settings(report.settings, report.gpu_settings), RULE]
        lines += render_arms(report.arms)
    lines += render_extras(report)
    lines.append(RULE)
    shown = {text for arm in report.arms for text in (arm.mechanism_reason, arm.detail) if text}
    evidence = [line for line in v.evidence if line.partition(": ")[2] not in shown
                and not line.startswith("failing direction: ")]
    for title, items in (("evidence", evidence), ("likely causes", v.likely_causes)):
        if items:
            lines.append(f" {title}:")
            lines += [f"   - {item}" for item in items]
    if v.fix:
        lines.append(f" fix: {v.fix}")
    lines.append(RULE)
    return "\n".join(lines)


def render_extras(report: CheckReport) -> list[str]:
    """NCCL's flush, the latency A/B, the READ and bidirectional A/Bs where they ran or were
    asked for, and the warnings they gave."""
    lines = []
    if report.flush is not None:
        median = (f"; median {report.flush.median_us:.2f} us post to completion"
                  if report.flush.median_us is not None else "")
        lines.append(f" NCCL's flush: {report.flush.outcome}{median}")
    if report.latency is not None:
        lines += render_latency(report.latency)
    for title, read in (("sends out of GPU memory", report.read), ("bidirectional WRITE", report.bidir)):
        if read is None:
            continue
        ratio = (f": GPU/host {read.verdict.ratio:.2f}"
                 if read.verdict is not None and read.verdict.ratio is not None else "")
        lines.append(f" {title} A/B: {read.outcome}{ratio}"
                     + (f" ({read.detail})" if read.detail else ""))
    lines += [f" {line}" for line in render_check_pattern(report.pattern)]
    lines += [f" warning: {line}" for line in report.verdict.warnings]
    if report.gin is not None:
        lines += render_gin(report.gin)
    return lines


def render_gin(gin: GinCheck) -> list[str]:
    """check --gin: the doorbell registration, each call with its result, and what it adds."""
    added = (f"; exit {gin.exit_code}: {SCHEDULER_ACTION[gin.exit_code]}"
             if gin.exit_code is not None else "")
    lines = [f" GIN doorbell ({gin.outcome}{added}): {gin.summary}"]
    lines += [f"   {call}" for call in gin.calls]
    if gin.predicted:
        lines.append(f"   the doctor predicted: {gin.predicted}")
    return lines


def render_latency(latency: LatencyCheck) -> list[str]:
    lines = [f" latency A/B (WRITE with immediate, GPU against host memory): "
             f"{latency.outcome}" + (f" ({latency.detail})" if latency.detail else "")
             + (f"; bound {latency.factor:g}x, {latency.factor_source}"
                if latency.ratios else "")]
    lines += [f"   {r.size_bytes:>8} B: host {r.host_median_us:.2f} us, GPU "
              f"{r.gpu_median_us:.2f} us, GPU/host {r.gpu_over_host:.2f}"
              + (f" (each pair: {', '.join(f'{x:.2f}' for x in r.pair_ratios)})"
                 if len(r.pair_ratios) > 1 else "")
              for r in latency.ratios]
    return lines


def headline(v: Verdict) -> str:
    return (f" GPUDirect RDMA: {v.classification.upper()}"
            + (f" via {v.mechanism}" if v.mechanism else "")
            + (" (inconclusive)" if v.inconclusive else "")
            + (" (below the line-rate floor)" if v.below_floor else "")
            + (", with a warning" if v.exit_code == ExitCode.PERFORMANCE_WARNING else ""))


def render_floor(floor: FloorCheck) -> list[str]:
    """The port's line rate and the floor, or why it was not applied; a software device
    said plainly."""
    lines = []
    if floor.software_device:
        lines.append(f" {floor.nic} is a software RDMA device (rxe, siw): the CPU copies "
                     "every byte, so it can never do GPUDirect RDMA; what this check shows "
                     "is the data path through it, not GPUDirect")
    rate_text = f"{floor.line_rate_gbps:g} Gb/s" if floor.line_rate_gbps else "unknown"
    lines.append(f" line rate of {floor.nic} port {floor.port}: {rate_text}; floor: "
                 + ("not applied (software device)" if floor.software_device else floor.note))
    return lines


def render_placement(pair: RankPair) -> list[str]:
    """Which GPU and NIC the check measured, why, and how long it took."""
    budget = f" of a {pair.time_budget_s:g} s budget" if pair.time_budget_s else ""
    lines = [f" GPU {pair.gpu}: {pair.gpu_reason}",
             f" NIC {pair.nic or '(the first RDMA device)'}: {pair.nic_reason}"]
    if pair.send_gpu != pair.gpu and pair.send_gpu_reason:
        lines.append(f" sends from {pair.send_gpu or 'host memory'}: {pair.send_gpu_reason}")
    if pair.lock:
        lines.append(f" NIC lock: {pair.lock}")
    if pair.port_traffic:
        lines.append(f" other traffic: {pair.port_traffic}")
    if pair.elapsed_s is not None:
        lines.append(f" {pair.elapsed_s:.1f} s{budget}, doctor and set-up included")
    return lines


def render_settings(host: RunSettings, gpu: RunSettings | None) -> str:
    """The runs' queue settings, and the inline size of each kind of arm (a GPU source
    buffer is never posted inline: the CPU cannot read it)."""
    gpu_inline = "" if gpu is None else f", GPU arms {gpu.inline_bytes} B"
    note = gpu.inline_note if gpu is not None and gpu.inline_note else host.inline_note
    return (f" QPs {host.qps}  TX depth {host.tx_depth}  CQ moderation {host.cq_moderation}"
            f"  MTU {host.mtu_bytes}  inline: host arm {host.inline_bytes} B{gpu_inline}"
            + (f" ({note})" if note else ""))


def render_arms(arms: tuple[ArmReport, ...]) -> list[str]:
    lines = [f" {'arm':<9} {'memory':<7} {'outcome':<20} {'size[B]':<9} {'line rate':<10} "
             "Gb/s per repeat"]
    for arm in arms:
        rates = " ".join(f"{b:.3f}" for b in arm.bandwidths_gbps) or "-"
        fraction = (f"{arm.line_rate_fraction:.2f}" if arm.line_rate_fraction is not None
                    else "-")
        lines.append(f" {arm.arm:<9} {arm.direction or 'host':<7} {arm.outcome:<20} "
                     f"{arm.size_bytes:<9} {fraction:<10} {rates}")
        if arm.pipelined_bound_gbps:
            bound = " ".join(f"{b:.3f}" for b in arm.pipelined_bound_gbps)
            lines.append(f" {'':<17} {'pipelined bound':<20} {arm.size_bytes:<9} {'':<10} "
                         f"{bound}")
        lines += [f"           {text}" for text in (arm.mechanism_reason, arm.detail) if text]
    return lines


# ---- the node check ------------------------------------------------------------------


def node_gpu_label(check: NodeGpuCheck) -> str:
    return check.label or f"GPU {check.gpu}"


def node_line(check: NodeGpuCheck) -> str:
    """One GPU of a node check: the answer, the NIC, the action, and why."""
    action = f"exit {check.exit_code}: {SCHEDULER_ACTION.get(check.exit_code, 'warn')}"
    if check.report is None:
        return f"{node_gpu_label(check)} via {check.nic or '-'}: {check.error} ({action})"
    v = check.report.verdict
    parts = [v.classification + (f" via {v.mechanism}" if v.mechanism else "")
             + (" (inconclusive)" if v.exit_code == ExitCode.INCONCLUSIVE else "")]
    if v.ratio is not None:
        parts.append(f"GPU/host {v.ratio:.2f}")
    deciding = check.report.deciding_arm()
    if deciding is not None and deciding.line_rate_fraction is not None:
        parts.append(f"{deciding.line_rate_fraction:.2f} of line rate")
    if v.direction:
        parts.append(f"failing direction {v.direction}")
    cause = (main_cause(v) if v.exit_code and (v.likely_causes or v.inconclusive or v.warnings)
             else "")
    return (f"{node_gpu_label(check)} via {check.nic or '-'}: {', '.join(parts)} ({action})"
            + (f": {cause}" if cause else ""))


def gbps(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def ratio_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def rails_line(rails: RailsReport) -> str:
    """All rails at once in one line: the verdict, the aggregate, the action, and why."""
    action = f"exit {rails.exit_code}: {SCHEDULER_ACTION.get(rails.exit_code, 'warn')}"
    aggregate = (f", aggregate {rails.aggregate_gbps:.1f} of {rails.solo_sum_gbps:.1f} Gb/s alone"
                 if rails.rails else "")
    return f"{rails.verdict}{aggregate} ({action})" + (f": {rails.detail}" if rails.detail else "")


def render_rails(rails: RailsReport) -> list[str]:
    """Each rail alone against together, the node's aggregate, the windows' overlap."""
    lines = ["all rails at once:"] + ([
        f" {'GPU':<14} {'NIC':<10} {'alone':>8} {'together':>9} {'ratio':>6} "
        f"{'host ratio':>10}  Gb/s"] if rails.rails else [])
    for rail in rails.rails:
        lines.append(f" {rail.gpu:<14} {rail.nic:<10} {gbps(rail.solo_gbps):>8} "
                     f"{gbps(rail.concurrent_gbps):>9} {ratio_text(rail.ratio):>6} "
                     f"{ratio_text(rail.host_ratio):>10}" + ("  contends" if rail.contending else "")
                     + (f"  {rail.error}" if rail.error else ""))
    if rails.rails:
        rates = (f", line rates {rails.line_rate_sum_gbps:.1f}"
                 if rails.line_rate_sum_gbps is not None else "")
        lines.append(f" aggregate {rails.aggregate_gbps:.1f} Gb/s; alone summed "
                     f"{rails.solo_sum_gbps:.1f}{rates}")
    for name, overlap in (("GPU arms", rails.overlap), ("host arms", rails.host_overlap)):
        if overlap is not None:
            lines.append(f" {name}: start skew {overlap.skew_s * 1000:.1f} ms, shortest window "
                         f"{overlap.shortest_s * 1000:.1f} ms, overlap {overlap.fraction:.0%}")
    return lines + [f" rails: {rails_line(rails)}"]


def render_node_check(report: NodeCheckReport) -> str:
    budget = f" of a {report.time_budget_s:g} s budget" if report.time_budget_s else ""
    job = [f"the job's GPUs: {report.job_gpus}"] if report.job_gpus else []
    return "\n".join(job + [node_line(check) for check in report.gpus]
                     + (render_rails(report.rails) if report.rails else [])
                     + ([f"memlock: {report.memlock}"] if report.memlock else [])
                     + [f"node: {gpu_count(report)} in {report.elapsed_s:.1f} s{budget}; "
                        f"exit {report.exit_code}: {SCHEDULER_ACTION[report.exit_code]}"])


def gpu_count(report: NodeCheckReport) -> str:
    """How many GPUs the node check checked: the stand-in for none found is none."""
    found = sum(check.found for check in report.gpus)
    return f"{found} GPU(s)" if found else "no GPU"

