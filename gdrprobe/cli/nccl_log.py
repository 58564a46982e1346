"""``gdrprobe nccl-log FILE``: what an NCCL_DEBUG=INFO log proves about GPUDirect RDMA (``-``:
the log on standard input, as ``NCCL_DEBUG=INFO ... 2>&1 | gdrprobe nccl-log -``).

Exit codes: 0 when the log was read (whatever it says, unless below); 1 when the log shows
network channels and none used GPUDirect RDMA, or GDR off on every NIC; 2 when the file
cannot be read, is empty or binary, or holds no NCCL line; 9 when its network lines could
not be read (a format not recognised, or cut short).
"""

from __future__ import annotations

import argparse

import gdrprobe


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "nccl-log",
        help="read an NCCL_DEBUG=INFO log and say where GPUDirect RDMA was used",
        description="Per NIC and channel, whether NCCL used GPUDirect RDMA and, where the log says so, "
                    "how. Reads NCCL 2.4 to 2.30 and the IBext, SHARP and AWS OFI plugins; the file "
                    "is streamed, so logs of any size are read whole, in bounded time and memory.",
        epilog="example: NCCL_DEBUG=INFO torchrun ... 2> train.log; gdrprobe nccl-log train.log "
               "(or through a pipe: ... 2>&1 | gdrprobe nccl-log -)",
    )
    parser.add_argument("file", metavar="FILE",
                        help="log written with NCCL_DEBUG=INFO; - reads standard input")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--lines", action="store_true",
                        help="include the network channel lines in the report, up to a bound the report "
                             "names (default: the summary per NIC; the lines of a large job's log can run "
                             "to many thousands)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from gdrprobe.report.model import to_json
    from gdrprobe.report.text import render_nccl_log

    report = gdrprobe.read_nccl_log(args.file, lines=args.lines)
    print(to_json(report) if args.json else render_nccl_log(report))
    return report.exit_code
