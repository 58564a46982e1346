"""Human renderings of the report model: devices, runs, the A/B, the doctor and NCCL logs.
Renderers format; they never decide."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gdrprobe.report import finding_ids as ids
from gdrprobe.report.model import (BandwidthResult, ClusterPair, ClusterReport,
                                   DeviceReport, DoctorReport, Finding, LatencyABReport,
                                   LatencyResult, RunReport, Status)
from gdrprobe.report.nccl_log import ChannelUse, GinLog, NcclLogReport, NicUse
from gdrprobe.report.nccl_pattern import render_run_pattern


def render_devices(report: DeviceReport) -> str:
    lines = []
    for device in report.devices:
        lines.append(f"{device.name}  node GUID {device.node_guid}  transport {device.transport}"
                     f"  firmware {device.firmware_version or '-'}"
                     f"  vendor 0x{device.vendor_id:x}:0x{device.vendor_part_id:x}")
        for port in device.ports:
            rate = f"{port.rate_gbps:g} Gb/s" if port.rate_gbps else "rate unknown"
            lines.append(f"  port {port.port}: {port.state} ({port.physical_state}), "
                         f"{port.link_layer}, MTU {port.active_mtu_bytes} "
                         f"(max {port.max_mtu_bytes}), {port.active_width} x "
                         f"{port.active_speed} = {rate}, LID {port.lid}")
            for gid in port.gids:
                behind = ", ".join(x for x in (gid.netdev, gid.ip_address) if x)
                lines.append(f"    GID[{gid.index:>3}] {gid.gid}  {gid.type:<7}"
                             f"  {behind}".rstrip())
    lines += [f"not opened: {note}" for note in report.skipped]
    return "\n".join(lines)


RULE = "-" * 87


def render_endpoints(report: RunReport) -> list[str]:
    lines = []
    for role, end in (("local", report.local), ("remote", report.remote)):
        qpns = ",".join(f"0x{q:06x}" for q in end.qp_numbers)
        lines.append(f" {role:<6} {end.host}  {end.device} port {end.port}  GID[{end.gid_index}]"
                     f" {end.gid}  MTU {end.mtu_bytes}  QPN {qpns}  memory "
                     f"{end.memory.get('kind', '?')}"
                     + ("  relaxed ordering" if end.memory.get("relaxed_ordering") else ""))
    return lines


def render_run(report: RunReport, gbits: bool = False) -> str:
    rows = report.bandwidth or report.latency
    table = [result_columns(rows[0], gbits)] + [result_row(r, gbits) for r in rows] if rows else []
    return "\n".join([render_run_settings(report), *table, RULE])


def render_latency_ab(report: LatencyABReport) -> str:
    """The latency A/B: the GPU arm's settings, then per size each arm's median and the
    GPU arm's over the host arm's."""
    repeats = len(report.gpu)
    lines = [render_run_settings(report.gpu[-1]),
             f" latency A/B, {repeats} repeat(s) per arm: one-way median [usec]",
             f" {'#bytes':<10} {'host':<10} {'GPU':<10} GPU/host"]
    lines += [f" {r.size_bytes:<10} {r.host_median_us:<10.2f} {r.gpu_median_us:<10.2f} "
              f"{r.gpu_over_host:.2f}" for r in report.ratios]
    return "\n".join(lines + [RULE])


def render_run_settings(report: RunReport) -> str:
    """What a run used: the settings, each side's endpoint and memory."""
    s = report.settings
    # perftest's titles (RDMA_Write BW Test, RDMA_Read Latency Test ...), its program named
    verb = "RDMA_Read" if s.opcode == "read" else "RDMA_Write"
    title = f"{verb} {'BW' if s.mode == 'bandwidth' else 'Latency'} Test"
    same = f", as perftest's {s.perftest}" if s.perftest else ""
    return "\n".join([
        RULE, f" {title} (gdrprobe, in-process{same})",
        f" QPs {s.qps}  TX depth {s.tx_depth}  CQ moderation {s.cq_moderation}"
        f"  post list {s.post_list}  MTU {s.mtu_bytes}  inline {s.inline_bytes} B"
        f"  handles via {report.handle_route}",
        *([f" {s.inline_note}"] if s.inline_note else []),
        *([f" clock: {s.clock}"] if s.clock else []),
        *([f" integrity: {s.integrity}"] if s.integrity else []),
        *([f" flush: {s.flush}"] if s.flush else []),
        *[f" bidirectional {r.size_bytes} B: client to server {r.client_to_server_gbps:.2f}"
          f" Gb/s, server to client {r.server_to_client_gbps:.2f} Gb/s, sum "
          f"{r.sum_gbps:.2f} Gb/s" for r in report.bidirectional],
        *([f" pattern: {s.pattern}"] if s.pattern else []),
        *[f" {line}" for line in render_run_pattern(report.nccl, report.nccl_answers)],
        *render_endpoints(report), RULE])


def result_columns(result: BandwidthResult | LatencyResult, gbits: bool = False) -> str:
    """The column titles of a table of results like this one."""
    if isinstance(result, BandwidthResult):
        unit = "Gb/sec" if gbits else "MiB/sec"
        return (f" {'#bytes':<10} {'#iterations':<13} {'BW peak[' + unit + ']':<20}"
                f" {'BW average[' + unit + ']':<23} {'MsgRate[Mpps]':<15} integrity")
    return (f" {'#bytes':<9} {'#iters':<8} {'min[us]':<9} {'median[us]':<11}"
            f" {'mean[us]':<9} {'stdev[us]':<10} {'p99[us]':<9} {'p99.9[us]':<10}"
            f" {'max[us]':<9} integrity")


def result_row(r: BandwidthResult | LatencyResult, gbits: bool = False) -> str:
    """One size's row, in perftest's columns."""
    if isinstance(r, BandwidthResult):
        peak = r.bandwidth_peak_gbps if gbits else r.bandwidth_peak_mib_s
        avg = r.bandwidth_avg_gbps if gbits else r.bandwidth_avg_mib_s
        return (f" {r.size_bytes:<10} {r.iterations:<13} {rate(peak):<20}"
                f" {rate(avg):<23} {r.message_rate_mpps:<15.6f}"
                f" {integrity_word(r.integrity)}")
    return (f" {r.size_bytes:<9} {r.iterations:<8} {r.latency_us_min:<9.2f}"
            f" {r.latency_us_median:<11.2f} {r.latency_us_mean:<9.2f}"
            f" {r.latency_us_stdev:<10.2f} {r.latency_us_p99:<9.2f}"
            f" {r.latency_us_p999:<10.2f} {r.latency_us_max:<9.2f}"
            f" {integrity_word(r.integrity)}")


def rate(value: float) -> str:
    """Two decimals, or six below 0.1 so that slow links do not print as zero (perftest's
    rule)."""
    return f"{value:.6f}" if value < 0.1 else f"{value:.2f}"


def integrity_word(integrity) -> str:
    """ok or CORRUPT, and the messages checked of those sent ("ok 64/1000": the last 64)."""
    word = "ok" if integrity.ok else "CORRUPT"
    return f"{word} {integrity.messages_checked}/{integrity.messages_total}"


def render_nccl_log(report: NcclLogReport) -> str:
    several_hosts = len(report.hosts) > 1
    lines = [f"{report.library} log {report.source}: {report.library} "
             f"{report.nccl_version or 'version not in log'}"
             f"{'; network ' + ', '.join(report.net_plugins) if report.net_plugins else ''}",
             f"verdict: {report.verdict}", f"mechanism: {report.mechanism}",
             f"network channel lines: {report.network_channels} ({report.gdrdma_channels} GDRDMA, "
             f"{report.host_memory_channels} host memory, {report.unknown_channels} cut short); "
             f"{report.local_channels} inside a node; {report.lines_read} lines read"]
    if report.nics:
        lines.append("NICs:")
        lines += [f"  {row}" for row in nic_rows(report.nics, several_hosts)]
    if report.channels:
        lines.append("channels:")
        lines += [f"  {render_channel(channel, several_hosts)}" for channel in report.channels]
    if report.gin is not None:
        lines += render_gin_log(report.gin, several_hosts)
    lines += ["what the log shows:"] + [f"  - {text}" for text in
                                          report.conclusions or ("nothing about GPUDirect RDMA",)]
    lines += ["what it cannot show:"] + [f"  - {text}" for text in report.cannot_conclude]
    return "\n".join(lines)


def render_gin_log(gin: GinLog, several_hosts: bool) -> list[str]:
    """GPU-initiated networking: one line overall, one per host where there are several."""
    lines = [f"GIN (GPU-initiated networking): {gin.mode}"]
    for host in gin.hosts:
        where = f"{host.host or '(no host in the line)'}: {host.mode}: " if several_hosts or len(gin.hosts) > 1 else ""
        lines.append(f"  {where}{host.why}" if host.why else f"  {where}".rstrip(": "))
    return [line for line in lines if line.strip()]


NIC_ROWS = 32     # more NICs than this (a large job's merged log) print one row per NIC name


def nic_rows(nics: Sequence[NicUse], several_hosts: bool) -> list[str]:
    """One row per NIC and host; past NIC_ROWS, the hosts' rows of one NIC, alike in what
    NCCL said of it, are added up into one."""
    if len(nics) <= NIC_ROWS:
        return [render_nic(nic, several_hosts) for nic in nics]
    groups: dict[tuple, list[NicUse]] = {}
    for nic in nics:
        groups.setdefault((nic.transport, nic.index, nic.name, nic.gdr_capable), []).append(nic)
    return [render_nic(dataclasses.replace(
        alike[0], host=f"{len(alike)} host(s):",
        gdrdma_channels=sum(nic.gdrdma_channels for nic in alike),
        host_memory_channels=sum(nic.host_memory_channels for nic in alike),
        unknown_channels=sum(nic.unknown_channels for nic in alike)), True) for alike in groups.values()]


def render_nic(nic: NicUse, several_hosts: bool) -> str:
    capable = {True: "GDR capable", False: "GDR unavailable",
               None: "GDR capability not logged"}[nic.gdr_capable]
    where = f"{nic.host} " if several_hosts and nic.host else ""
    port = f":{nic.port}" if nic.port is not None else ""
    layer = f"/{nic.link_layer}" if nic.link_layer else ""
    offers = f" (offers {', '.join(nic.gdr_paths)})" if nic.gdr_paths else ""
    cut = f", {nic.unknown_channels} cut short" if nic.unknown_channels else ""
    return (f"{where}{nic.transport}[{nic.index}] {nic.name or '(name not in log)'}{port}{layer}  "
            f"{capable}{offers}; {nic.gdrdma_channels} channel(s) GDRDMA, "
            f"{nic.host_memory_channels} through host memory{cut}")


def render_channel(channel: ChannelUse, several_hosts: bool) -> str:
    via = f"{'COLLNET' if channel.collnet else 'NET'}/{channel.net_plugin}/{channel.nic_name or channel.nic_index}"
    how = {True: "GDRDMA", False: "host memory", None: "cut short: GDR use unknown"}[channel.gdrdma]
    where = f"{channel.host} " if several_hosts and channel.host else ""
    peer = f" -> {channel.remote}" if channel.remote else ""
    return (f"line {channel.line}: {where}channel {channel.channel:02d} {channel.local}{peer} "
            f"[{channel.direction}] via {via}: {how}")


# ---- the doctor: the first failure printed is the first thing to fix ------------------

MARKS = {Status.OK: "[ OK ]", Status.WARN: "[WARN]", Status.FAIL: "[FAIL]",
         Status.SKIP: "[SKIP]", Status.INFO: "[INFO]"}
INDENT = " " * 7


# A failure that makes every other one moot: no RDMA device to register anything with, so
# a memlock limit or an IOMMU setting before it in the flowchart cannot be what stops a job.
MOOT_ALL = (ids.NIC_DEVICES,)


def first_blocker(report: DoctorReport) -> Finding | None:
    """What stops GPUDirect RDMA first: no RDMA device where that failed (MOOT_ALL), else
    the first failure in flowchart order (the order the doctor produced the findings in),
    the one the exit code 1 is about. Without a failure, a machine with no NVIDIA GPU or no
    PCI RDMA NIC (a software RDMA device, rxe or siw, has no PCI function and can never do
    GPUDirect) is blocked all the same, although that finding is only a warning."""
    failures = [f for f in report.findings if f.status is Status.FAIL]
    failure = next((f for f in failures if f.id in MOOT_ALL), None) or next(iter(failures), None)
    return failure or next((f for f in report.findings if f.id == ids.TOPOLOGY_DEVICES
                            and f.status is Status.WARN), None)


def doctor_headline(report: DoctorReport) -> str:
    blocker = first_blocker(report)
    if blocker is not None:
        return f"First blocker: {blocker.id}: {blocker.summary}"
    warnings = sum(f.status is Status.WARN for f in report.findings)
    return f"No blocking failure found ({warnings} warning(s))."


def _indented(label: str, text: str) -> list[str]:
    lines = text.splitlines() or [""]
    pad = INDENT + " " * (len(label) + 2)
    return [f"{INDENT}{label}: {lines[0]}"] + [pad + line for line in lines[1:]]


def render_finding(finding: Finding) -> list[str]:
    lines = [f"{MARKS[finding.status]} {finding.id}: {finding.summary}"]
    for evidence in finding.evidence:
        lines += _indented(evidence.source, evidence.value)
    if finding.fix:
        lines += _indented("fix", finding.fix)
    return lines


def render_doctor(report: DoctorReport) -> str:
    lines = [doctor_headline(report), f"(root: {report.root})"]
    group = None
    for finding in report.findings:
        if finding.group != group:
            group = finding.group
            lines += ["", f"== {group} =="]
        lines += render_finding(finding)
    return "\n".join(lines + render_nccl_decisions(report)) + "\n"


def render_nccl_library(report: DoctorReport) -> list[str]:
    library = report.nccl_library
    if library is None:
        return []
    name = library.library
    if library.path is None:
        return [f"{name}: no {name.lower()} library found ({library.source}); "
                + ("RCCL's modelled rules assumed" if name == "RCCL" else "NCCL 2.30.7's rules assumed")]
    version = library.version or ("version unknown, the modelled RCCL's rules assumed" if name == "RCCL"
                                  else "version unknown, 2.30.7's rules assumed")
    return [f"{name}: {version}, {library.path} ({library.source})"]


def render_nccl_decisions(report: DoctorReport) -> list[str]:
    """The job's NCCL, then one line per GPU: the network device NCCL uses, the path, GDR
    for receives and sends; below, the GPUs whose channels spread over several devices or
    whose GDR runs in PCI mode."""
    if not report.nccl:
        return []
    names = {d.gpu_bdf: d.gpu for d in report.nccl}
    rows = [("GPU", "bus id", "NIC", "path", "GDR recv", "GDR send")]
    notes = []
    for d in report.nccl:
        path = {"pxn": f"PXN via {names.get(d.via_gpu, d.via_gpu)}", "c2c": "C2C (P2C)",
                "none": "-"}.get(d.path, f"direct {d.path_type}")
        rows.append((d.gpu, d.gpu_bdf, d.net or d.nic or "-", path, "yes" if d.gdr_write else "no",
                     "yes" if d.gdr_read else "no"))
        if len({c.net for c in d.channels}) > 1:
            notes.append(f"{d.gpu} channels: " + ", ".join(f"{c.channel} {c.net}" for c in d.channels)
                         + ", then again")
        if d.gdr_mode == "pci":
            notes.append(f"{d.gpu} GDR mode: PCI (a PCIe mapping of GPU memory, the GPU being on C2C)")
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["", "== what NCCL will do, per GPU =="] + render_nccl_library(report) + [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows] + notes


# ---- the cluster matrix ---------------------------------------------------------------


def render_cluster(report: ClusterReport) -> str:
    """Host Gb/s from each client rank (row) to each server rank (column), and the verdict
    of each pair where a GPU arm ran."""
    cells = {(p.client_rank, p.server_rank): p for p in report.pairs}
    width = 12
    lines = [f" {report.ranks} ranks, pattern {report.pattern}: host Gb/s, client rank (row) "
             "-> server rank (column)", RULE,
             (" " * 9 + "".join(f"{'rank ' + str(s):<{width}}"
                                for s in range(report.ranks))).rstrip()]
    for client in range(report.ranks):
        row = "".join(f"{_cluster_cell(cells.get((client, server))):<{width}}"
                      for server in range(report.ranks))
        lines.append(f" rank {client:<2} {row}".rstrip())
    lines.append(RULE)
    nodes = {p.client_rank: p.client_node for p in report.pairs}
    nodes.update({p.server_rank: p.server_node for p in report.pairs})
    lines += [f" rank {rank}: {node}" for rank, node in sorted(nodes.items())]
    verdicts = [p for p in report.pairs if p.verdict]
    if verdicts:
        lines.append(" GPUDirect RDMA per pair:")
        for p in verdicts:
            ratio = f" (GPU/host {p.ratio:.2f})" if p.ratio is not None else ""
            lines += _cluster_pair(p, *answer_and_causes(f"{p.verdict}{ratio}", p.verdict,
                                                         p.likely_causes))
    both = [p for p in report.pairs if p.bidirectional]
    if both:
        lines.append(" both directions at once (-b), Gb/s:")
        lines += [f" ranks {p.client_rank}<->{p.server_rank} {arm}: {r.client_to_server_gbps:.3f}"
                  f" client to server, {r.server_to_client_gbps:.3f} back, sum {r.sum_gbps:.3f}"
                  for p in both for arm, r in p.bidirectional.items()]
    failed = [p for p in report.pairs if p.error]
    if failed:
        lines.append(" failed pairs:")
        for p in failed:
            lines += _cluster_pair(p, p.error, ())
    if report.flagged:
        lines.append(" needs a look:")
        lines += [f"   - {text}" for text in report.flagged]
    else:
        lines.append(" every pair measured, none slow")
    lines.append(RULE)
    return "\n".join(lines)


def answer_and_causes(answer: str, classification: str,
                      causes: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    """A verdict's line and the causes left to list: a first cause that restates the
    classification ("not testable: no CUDA driver ...") becomes the line, so that nothing
    is said twice."""
    if causes and causes[0].startswith(classification):
        return causes[0], tuple(causes[1:])
    return answer, tuple(causes)


def _cluster_pair(pair: ClusterPair, answer: str, causes: tuple[str, ...]) -> list[str]:
    """One pair's answer, then its causes and its fix as check and a finding show them."""
    return ([f"   {pair.client_rank}->{pair.server_rank}: {answer}"]
            + [f"{INDENT}- {cause}" for cause in causes]
            + (_indented("fix", pair.fix) if pair.fix else []))


def _cluster_cell(pair: ClusterPair | None) -> str:
    if pair is None:
        return "-"
    if pair.error:
        return "failed"
    return rate(pair.host_gbps) if pair.host_gbps is not None else "?"

