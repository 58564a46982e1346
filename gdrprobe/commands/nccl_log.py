"""``gdrprobe nccl-log FILE``: what an NCCL_DEBUG=INFO log proves about GPUDirect RDMA.

Exit codes: 0 when the log was read (whatever it says, unless below); 1 when the log shows
network channels and none used GPUDirect RDMA; 2 when the file cannot be read.
"""

from __future__ import annotations

import argparse

from gdrprobe.errors import ExitCode, UsageError

# NCCL INFO logs of large jobs run to tens of MiB; more than this is read only in part.
MAX_LOG_BYTES = 64 << 20


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "nccl-log",
        help="read an NCCL_DEBUG=INFO log and say where GPUDirect RDMA was used",
        description="Per NIC and channel, whether NCCL used GPUDirect RDMA and, where the log says so, how.",
    )
    parser.add_argument("file", metavar="FILE", help="log written with NCCL_DEBUG=INFO")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(handler=run)


def read_bounded(path: str) -> tuple[str, bool]:
    """The text of the log (at most MAX_LOG_BYTES) and whether it was cut."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_LOG_BYTES + 1)
    except OSError as error:
        raise UsageError(f"cannot read NCCL log {path}: {error.strerror}",
                         fix="pass the file the job wrote with NCCL_DEBUG=INFO (NCCL_DEBUG_FILE names it)") from None
    return data[:MAX_LOG_BYTES].decode("utf-8", "replace"), len(data) > MAX_LOG_BYTES


def render(report) -> str:
    lines = [f"NCCL log {report.source}: NCCL {report.nccl_version or 'version not in log'}",
             f"verdict: {report.verdict}", f"mechanism: {report.mechanism}"]
    if report.nics:
        lines.append("NICs:")
        for nic in report.nics:
            capable = {True: "GDR capable", False: "GDR unavailable", None: "GDR capability not logged"}[nic.gdr_capable]
            lines.append(f"  [{nic.index}] {nic.name}:{nic.port}/{nic.link_layer}  {capable}; "
                         f"{nic.gdrdma_channels} channel(s) GDRDMA, {nic.host_memory_channels} through host memory")
    if report.channels:
        lines.append("channels:")
        for channel in report.channels:
            via = f"NET/{channel.transport}/{channel.nic_name or channel.nic_index}"
            how = "GDRDMA" if channel.gdrdma else "host memory"
            lines.append(f"  line {channel.line}: channel {channel.channel:02d} {channel.local} -> {channel.remote} "
                         f"[{channel.direction}] via {via}: {how}")
    lines += ["what the log shows:"] + [f"  - {text}" for text in report.conclusions]
    lines += ["what it cannot show:"] + [f"  - {text}" for text in report.cannot_conclude]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from gdrprobe.nccl_log import parse_nccl_log
    from gdrprobe.report import to_json

    text, truncated = read_bounded(args.file)
    report = parse_nccl_log(text, source=args.file, truncated=truncated)
    print(to_json(report) if args.json else render(report))
    return int(ExitCode.VERDICT_NOT_OK if report.verdict in ("gdr-none", "socket") else ExitCode.OK)
