"""gdrprobe run: measure RDMA WRITE bandwidth or latency against a server (or loopback)."""

from __future__ import annotations

import os

from gdrprobe.cli.common import (add_endpoint_flags, add_memory_flags, add_verdict_flags,
                                 endpoint_options, memory_spec, notice,
                                 terminate_as_interrupt, token_from)
from gdrprobe.errors import UsageError
from gdrprobe.nccl.env import relaxed_ordering_wanted

DEFAULT_SIZE = 65536
A_B_SIZE = 1 << 20


def register(subparsers) -> None:
    from gdrprobe.measure.clock import CLOCK_CHOICES

    parser = subparsers.add_parser(
        "run", help="run a probe against 'gdrprobe serve' (or --loopback)",
        description="Measure RDMA WRITE bandwidth (default) or latency to a server.")
    parser.add_argument("host", nargs="?", help="the server's address (omit with --loopback)")
    parser.add_argument("--loopback", action="store_true",
                        help="both ends in this process, on the local device")
    add_endpoint_flags(parser)
    parser.add_argument("--latency", action="store_true",
                        help="ping-pong latency instead of bandwidth")
    parser.add_argument("-s", "--size", type=int,
                        help=f"message size in bytes (default {DEFAULT_SIZE}; "
                             f"{A_B_SIZE} for a GPU A/B)")
    parser.add_argument("-a", "--all", action="store_true", help="sizes 2 B to 8 MiB")
    parser.add_argument("-n", "--iters", type=int, default=None,
                        help="iterations per QP and size (default 1000)")
    parser.add_argument("--warmup-iters", type=int, default=0,
                        help="iterations before timing starts (bandwidth)")
    parser.add_argument("-D", "--duration", type=float, help="seconds per size instead of -n")
    parser.add_argument("--warmup", type=float, default=0.5,
                        help="seconds excluded before a -D window (default 0.5)")
    parser.add_argument("--window-bytes", type=int, default=None,
                        help="with -D: the warm-up and the window each also end once this many "
                             "bytes have landed (what 'gdrprobe check' does: perftest's "
                             "default run, 65536 x 5000 B)")
    parser.add_argument("-q", "--qp", type=int, default=1, help="number of QPs (bandwidth)")
    parser.add_argument("-t", "--tx-depth", type=int, default=128,
                        help="outstanding writes per QP (default 128)")
    parser.add_argument("-Q", "--cq-mod", type=int, default=None,
                        help="signal one write in N (default min(100, tx depth))")
    parser.add_argument("-l", "--post-list", type=int, default=1,
                        help="writes chained per post (default 1)")
    parser.add_argument("-m", "--mtu", type=int, help="path MTU in bytes (default: the port's)")
    parser.add_argument("-I", "--inline-size", type=int,
                        help="messages up to this size are sent inline (default 220 for "
                             "latency, 0 for bandwidth)")
    parser.add_argument("--relaxed-ordering", choices=("on", "off"),
                        default="on" if relaxed_ordering_wanted(os.environ) else "off",
                        help="register with IBV_ACCESS_RELAXED_ORDERING where rdma-core has it, "
                             "as NCCL does (default: on, or off when "
                             "NCCL_IB_PCI_RELAXED_ORDERING=0)")
    parser.add_argument("--clock", choices=CLOCK_CHOICES, default="auto",
                        help="what the loops time with: auto (default) the CPU's cycle counter "
                             "where the kernel reports it constant and non-stop, else "
                             "CLOCK_MONOTONIC; counter: the cycle counter anyway (each run is "
                             "still cross-checked against CLOCK_MONOTONIC)")
    parser.add_argument("--report-gbits", action="store_true", help="bandwidth in Gb/s")
    parser.add_argument("--connect-wait", type=float, default=0.0, metavar="SECONDS",
                        help="keep retrying a refused connection this long (a server that "
                             "is still starting)")
    add_memory_flags(parser, remote=True)
    parser.add_argument("--staged", action="store_true",
                        help="with a GPU buffer: add the staged arm (the bounce through host "
                             "memory) to the A/B")
    add_verdict_flags(parser, "with a GPU buffer: A/B repeats")
    parser.add_argument("--json", action="store_true", help="print the JSON document")
    parser.set_defaults(handler=run)


def probe_options(args, a_b: bool):
    from gdrprobe.measure.options import SWEEP_SIZES, ProbeOptions

    # The verdict compares bandwidth at large messages: 1 MiB unless asked otherwise.
    size = (A_B_SIZE if a_b else DEFAULT_SIZE) if args.size is None else args.size
    sizes = SWEEP_SIZES if args.all else (size,)
    tx_depth = 1 if args.latency else args.tx_depth
    return ProbeOptions(
        mode="latency" if args.latency else "bandwidth",
        sizes=sizes,
        iterations=1000 if args.iters is None else args.iters,
        warmup_iterations=args.warmup_iters,
        duration_s=args.duration,
        warmup_s=args.warmup,
        window_bytes=args.window_bytes,
        qps=args.qp,
        tx_depth=tx_depth,
        cq_moderation=min(100, tx_depth) if args.cq_mod is None else args.cq_mod,
        post_list=args.post_list,
        mtu=args.mtu,
        timeout_s=args.timeout,
        inline_size=args.inline_size,
        relaxed_ordering=args.relaxed_ordering == "on",
        clock=args.clock,
    )


def run(args) -> int:
    from gdrprobe.doctor.runner import run_doctor
    from gdrprobe.campaign.ab import ab_test
    from gdrprobe.measure.session import DEFAULT_PORT, runner
    from gdrprobe.report.text import render_check
    from gdrprobe.report.model import to_json

    if bool(args.host) == bool(args.loopback):
        raise UsageError("give either a server HOST or --loopback", "e.g. 'gdrprobe run "
                         "10.0.0.2 --token TOKEN' or 'gdrprobe run --loopback'")
    terminate_as_interrupt()
    local = memory_spec(args, args.mem)
    remote = memory_spec(args, args.remote_mem) if args.remote_mem else None
    a_b = local.kind == "gpu" or (remote is not None and remote.kind == "gpu")
    if a_b and args.latency:
        raise UsageError("the GPU A/B measures bandwidth; latency runs use host memory",
                         "drop --latency, or drop --mem/--remote-mem")
    options = probe_options(args, a_b)
    token = None if args.loopback else token_from(args, True)
    if not 0 <= args.connect_wait <= 3600:
        raise UsageError("--connect-wait must be 0 to 3600 s", "")
    def probe_with(on_result=None):
        return runner(options, endpoint_options(args), args.host,
                      DEFAULT_PORT if args.port is None else args.port, token,
                      args.connect_wait, on_result=on_result, notice=notice)

    if not a_b:
        return run_rows_as_measured(probe_with, local, remote, args.json, args.report_gbits)
    probe = probe_with()
    # The doctor speaks for this host's GPU (in loopback the server's buffer is here too);
    # a server sends its own findings about its GPU buffer in the handshake.
    findings = run_doctor().findings if local.kind == "gpu" or args.loopback else ()
    report = ab_test(probe, local, remote, staged=args.staged, repeats=args.repeats,
                     threshold=args.threshold, doctor_findings=findings)
    print(to_json(report) if args.json else render_check(report))
    return report.verdict.exit_code


def run_rows_as_measured(probe_with, local, remote, as_json: bool, gbits: bool) -> int:
    """A sweep prints each size's row as soon as it is measured (a long sweep shows its
    progress, and a failure keeps what came before it), then what the run used. With
    --json the one document comes at the end; a run that fails after some sizes prints a
    partial-run document with those rows and the error before it exits."""
    from gdrprobe.errors import GdrprobeError
    from gdrprobe.report.model import BandwidthResult, PartialRunReport, to_json
    from gdrprobe.report.text import render_run_settings, result_columns, result_row

    rows = []

    def on_result(result) -> None:
        if not as_json:
            if not rows:
                print(result_columns(result, gbits))
            print(result_row(result, gbits), flush=True)
        rows.append(result)

    try:
        report = probe_with(on_result)(local, remote)
    except GdrprobeError as error:
        if as_json and rows:
            bandwidth = tuple(r for r in rows if isinstance(r, BandwidthResult))
            latency = tuple(r for r in rows if not isinstance(r, BandwidthResult))
            print(to_json(PartialRunReport(bandwidth, latency, error.cause, error.fix,
                                           error.evidence, int(error.exit_code))))
        raise
    print(to_json(report) if as_json else render_run_settings(report))
    return 0

