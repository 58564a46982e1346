"""gdrprobe run: measure RDMA WRITE (or READ) bandwidth or latency against a server (or loopback);
with a GPU buffer at either end, the host/GPU A/B and its verdict."""

from __future__ import annotations

import gdrprobe
from gdrprobe import defaults
from gdrprobe.cli.common import (add_bidir_flag, add_endpoint_flags, add_memory_flags,
                                 add_opcode_flag,
                                 add_qps_flag, add_verdict_flags, endpoint_arguments,
                                 memory_arguments, notice, printed_document, size,
                                 terminate_as_interrupt, token_from)
from gdrprobe.cli.common import real_number, whole


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "run", help="run a probe against 'gdrprobe serve' (or --loopback)",
        description="Measure RDMA WRITE (or, with --opcode read, READ) bandwidth "
                    "(default) or latency to a server.",
        epilog="example: gdrprobe run --loopback --mem gpu (the host/GPU A/B in one process)")
    parser.add_argument("host", nargs="?", help="the server's address (omit with --loopback)")
    parser.add_argument("--loopback", action="store_true",
                        help="both ends in this process, on the local device")
    add_endpoint_flags(parser)
    parser.add_argument("--latency", action="store_true",
                        help="ping-pong latency instead of bandwidth")
    add_opcode_flag(parser)
    add_bidir_flag(parser, "each direction and the sum reported")
    parser.add_argument("-s", "--size", type=size, metavar="SIZE",
                        help="message size in bytes, or with K, M or G such as 64K "
                             f"(default {defaults.SIZE}; {defaults.A_B_SIZE} for a GPU A/B)")
    parser.add_argument("-a", "--all", action="store_true", help="sizes 2 B to 8 MiB")
    parser.add_argument("-n", "--iters", type=whole, default=None,
                        help=f"iterations per QP and size (default {defaults.ITERATIONS})")
    parser.add_argument("--warmup-iters", type=whole, default=0,
                        help="iterations before timing starts (bandwidth; default 0)")
    parser.add_argument("-D", "--duration", type=real_number, help="seconds per size instead of -n")
    parser.add_argument("--warmup", type=real_number,
                        help="seconds excluded before a -D window "
                             f"(default {defaults.WARMUP_S:g})")
    parser.add_argument("--window-bytes", type=whole, default=None,
                        help="with -D: the warm-up and the window each also end once this many "
                             "bytes have landed (what 'gdrprobe check' does: perftest's "
                             "default run, 65536 x 5000 B)")
    add_qps_flag(parser, several=False, default_text=f"bandwidth; default {defaults.QPS}")
    parser.add_argument("-t", "--tx-depth", type=whole,
                        help=f"outstanding writes per QP (default {defaults.TX_DEPTH}; 1 for "
                             "latency)")
    parser.add_argument("-Q", "--cq-mod", type=whole,
                        help=f"signal one write in N (default min({defaults.CQ_MODERATION}, "
                             "tx depth))")
    parser.add_argument("-l", "--post-list", type=whole,
                        help=f"writes chained per post (default {defaults.POST_LIST})")
    parser.add_argument("-m", "--mtu", type=whole, help="path MTU in bytes (default: the port's)")
    parser.add_argument("-I", "--inline-size", type=whole,
                        help="messages up to this size are sent inline (default 220 for "
                             "latency, 0 for bandwidth)")
    parser.add_argument("--relaxed-ordering", choices=("on", "off"),
                        help="register with IBV_ACCESS_RELAXED_ORDERING where rdma-core has it, "
                             "as NCCL does (default: on, or off when "
                             "NCCL_IB_PCI_RELAXED_ORDERING=0)")
    parser.add_argument("--clock", choices=defaults.CLOCKS, default=defaults.CLOCK,
                        help="what the loops time with: auto (default) the CPU's cycle counter "
                             "where the kernel reports it constant and non-stop, else "
                             "CLOCK_MONOTONIC; counter: the cycle counter anyway (each run is "
                             "still cross-checked against CLOCK_MONOTONIC)")
    parser.add_argument("--sample-integrity", action="store_true",
                        help="check only the messages the receiver's slots hold at the end of "
                             "each size, not every message (no pauses between passes; "
                             "corruption that comes and goes can be missed; one QP; with -b "
                             "each side its own slots)")
    parser.add_argument("--integrity-bytes", type=size, default=None, metavar="SIZE",
                        help="the bytes of a pass's slots, each message checked before its "
                             "slot is written again (default 4M): every pass drains the queue "
                             "once, a round trip lost; a long round trip (a delayed wire) "
                             f"wants more, up to {defaults.MAX_INTEGRITY_BYTES >> 20}M")
    parser.add_argument("--flush", action="store_true",
                        help="with a GPU receive buffer: read back the last message's first "
                             "byte with an RDMA READ on a loopback QP before each check, as "
                             "NCCL flushes every GPUDirect receive where its rules ask for it "
                             "('gdrprobe check' follows those rules by itself)")
    parser.add_argument("--pattern", choices=defaults.PATTERNS, default=None,
                        help="nccl: after each size's stream, the size as NCCL's steps over its "
                             "IB transport (clear-to-send, data, flush; 8 in flight; the "
                             "job's NCCL_* settings), and whether the path sustains it or the "
                             "round trip caps NCCL (sizes: NCCL's step sizes unless -s)")
    parser.add_argument("--report-gbits", action="store_true", help="bandwidth in Gb/s")
    parser.add_argument("--connect-wait", type=real_number, default=0.0, metavar="SECONDS",
                        help="keep retrying a refused connection this long (a server that "
                             "is still starting; default 0: no retry)")
    add_memory_flags(parser, remote=True)
    parser.add_argument("--staged", action="store_true",
                        help="with a GPU buffer: add the staged arm (the bounce through host "
                             "memory) to the A/B")
    add_verdict_flags(parser, "with a GPU buffer: A/B repeats")
    parser.add_argument("--json", action="store_true", help="print the JSON document")
    parser.set_defaults(handler=run)


def probe_settings(args) -> dict:
    """The run's settings as the public API names them; None: the API's default."""
    return {
        "mode": "latency" if args.latency else "bandwidth",
        "opcode": args.opcode,
        "bidir": args.bidir or None,
        "size": args.size,
        "sizes": defaults.SWEEP_SIZES if args.all else None,
        "iterations": args.iters,
        "warmup_iterations": args.warmup_iters,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "window_bytes": args.window_bytes,
        "qps": args.qps,
        "tx_depth": args.tx_depth,
        "cq_moderation": args.cq_mod,
        "post_list": args.post_list,
        "mtu": args.mtu,
        "timeout_s": args.timeout,
        "inline_size": args.inline_size,
        "relaxed_ordering": None if args.relaxed_ordering is None
        else args.relaxed_ordering == "on",
        "clock": args.clock,
        "sample_integrity": args.sample_integrity or None,
        "integrity_bytes": args.integrity_bytes,
    }


def run(args) -> int:
    from gdrprobe.report.check import CheckReport
    from gdrprobe.report.model import LatencyABReport, to_json
    from gdrprobe.report.check_text import render_check
    from gdrprobe.report.text import render_latency_ab

    terminate_as_interrupt()
    arguments = dict(host=args.host, loopback=args.loopback, port=args.port,
                     token=None if args.loopback else token_from(args),
                     remote_mem=args.remote_mem, staged=args.staged, repeats=args.repeats,
                     threshold=args.threshold, connect_wait_s=args.connect_wait,
                     flush=args.flush, pattern=args.pattern,
                     notice=notice, **endpoint_arguments(args), **memory_arguments(args),
                     **probe_settings(args))
    report = run_rows_as_measured(arguments, args.json, args.report_gbits)
    if isinstance(report, LatencyABReport):
        print(to_json(report) if args.json else render_latency_ab(report))
        return report.exit_code
    if isinstance(report, CheckReport):
        print(to_json(report) if args.json else render_check(report))
        return report.verdict.exit_code
    return 0


def run_rows_as_measured(arguments: dict, as_json: bool, gbits: bool):
    """gdrprobe.run(**arguments). A run (not an A/B) prints each size's row as soon as it
    is measured (a long sweep shows its progress, and a failure keeps what came before it),
    then what the run used. With --json the one document comes at the end; a run that
    fails after some sizes prints a partial-run document with those rows and the error
    before it exits. Returns the report."""
    from gdrprobe.errors import GdrprobeError
    from gdrprobe.report.model import BandwidthResult, PartialRunReport, RunReport, to_json
    from gdrprobe.report.text import render_run_settings, result_columns, result_row

    rows = []

    def on_result(result, reverse=None, nccl=None) -> None:   # -b, --pattern: in the report
        if not as_json:
            if not rows:
                print(result_columns(result, gbits))
            print(result_row(result, gbits), flush=True)
        rows.append(result)

    try:
        report = gdrprobe.run(**arguments, on_result=on_result)
    except GdrprobeError as error:
        if as_json and rows:
            bandwidth = tuple(r for r in rows if isinstance(r, BandwidthResult))
            latency = tuple(r for r in rows if not isinstance(r, BandwidthResult))
            print(to_json(PartialRunReport(bandwidth, latency, error.cause, error.fix,
                                           error.evidence, int(error.exit_code))))
            printed_document(error)     # the document of this error: no second one
        raise
    if isinstance(report, RunReport):
        print(to_json(report) if as_json else render_run_settings(report))
    return report

