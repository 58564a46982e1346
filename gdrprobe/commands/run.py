"""gdrprobe run: measure RDMA WRITE bandwidth or latency against a server (or loopback)."""

from __future__ import annotations

from gdrprobe.commands.common import (add_endpoint_flags, add_memory_flags, endpoint_options,
                                     memory_spec, terminate_as_interrupt, token_from)
from gdrprobe.errors import UsageError


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "run", help="run a probe against 'gdrprobe serve' (or --loopback)",
        description="Measure RDMA WRITE bandwidth (default) or latency to a server.")
    parser.add_argument("host", nargs="?", help="the server's address (omit with --loopback)")
    parser.add_argument("--loopback", action="store_true",
                        help="both ends in this process, on the local device")
    add_endpoint_flags(parser)
    parser.add_argument("--latency", action="store_true",
                        help="ping-pong latency instead of bandwidth")
    parser.add_argument("-s", "--size", type=int, default=65536, help="message size in bytes")
    parser.add_argument("-a", "--all", action="store_true", help="sizes 2 B to 8 MiB")
    parser.add_argument("-n", "--iters", type=int, default=None,
                        help="iterations per QP and size (default 1000)")
    parser.add_argument("--warmup-iters", type=int, default=0,
                        help="iterations before timing starts (bandwidth)")
    parser.add_argument("-D", "--duration", type=float, help="seconds per size instead of -n")
    parser.add_argument("--warmup", type=float, default=0.5,
                        help="seconds excluded before a -D window (default 0.5)")
    parser.add_argument("-q", "--qp", type=int, default=1, help="number of QPs (bandwidth)")
    parser.add_argument("-t", "--tx-depth", type=int, default=128,
                        help="outstanding writes per QP (default 128)")
    parser.add_argument("-Q", "--cq-mod", type=int, default=None,
                        help="signal one write in N (default min(100, tx depth))")
    parser.add_argument("-l", "--post-list", type=int, default=1,
                        help="writes chained per post (default 1)")
    parser.add_argument("-m", "--mtu", type=int, help="path MTU in bytes (default: the port's)")
    parser.add_argument("--report-gbits", action="store_true", help="bandwidth in Gb/s")
    add_memory_flags(parser, remote=True)
    parser.add_argument("--staged", action="store_true",
                        help="with a GPU buffer: add the staged arm (the bounce through host "
                             "memory) to the A/B")
    parser.add_argument("--repeats", type=int, default=3,
                        help="with a GPU buffer: A/B repeats (default 3)")
    parser.add_argument("--threshold", type=float, default=0.9,
                        help="with a GPU buffer: GPU/host bandwidth ratio that counts as "
                             "engaged (default 0.9)")
    parser.add_argument("--json", action="store_true", help="print the JSON document")
    parser.set_defaults(handler=run)


def probe_options(args):
    from gdrprobe.probe import SWEEP_SIZES, ProbeOptions

    sizes = SWEEP_SIZES if args.all else (args.size,)
    tx_depth = 1 if args.latency else args.tx_depth
    return ProbeOptions(
        mode="latency" if args.latency else "bandwidth",
        sizes=sizes,
        iterations=args.iters or 1000,
        warmup_iterations=args.warmup_iters,
        duration_s=args.duration,
        warmup_s=args.warmup,
        qps=args.qp,
        tx_depth=tx_depth,
        cq_moderation=args.cq_mod or min(100, tx_depth),
        post_list=args.post_list,
        mtu=args.mtu,
        timeout_s=args.timeout,
    )


def one_run(args, options):
    """A function running one probe with the given memories, against the server or in
    loopback, with everything else as the flags say."""
    from gdrprobe.probe import DEFAULT_PORT, ProbeClient, run_loopback

    endpoint = endpoint_options(args)
    if args.loopback:
        return lambda local, remote: run_loopback(options, endpoint, local, remote)
    token = token_from(args, True)
    return lambda local, remote: ProbeClient(args.host, args.port or DEFAULT_PORT, token,
                                             options, endpoint, local, remote).run()


def run(args) -> int:
    from gdrprobe.render import render_check, render_run
    from gdrprobe.report import to_json

    if bool(args.host) == bool(args.loopback):
        raise UsageError("give either a server HOST or --loopback", "e.g. 'gdrprobe run "
                         "10.0.0.2 --token TOKEN' or 'gdrprobe run --loopback'")
    terminate_as_interrupt()
    options = probe_options(args)
    local = memory_spec(args, args.mem)
    remote = memory_spec(args, args.remote_mem) if args.remote_mem else None
    probe = one_run(args, options)
    if local.kind == "host" and (remote is None or remote.kind == "host"):
        report = probe(local, remote)
        print(to_json(report) if args.json else render_run(report, gbits=args.report_gbits))
        return 0
    report = a_b(args, probe, local, remote)
    print(to_json(report) if args.json else render_check(report))
    return report.verdict.exit_code


def a_b(args, probe, local, remote):
    """Host arm against the GPU arm(s), with the local doctor's findings for the causes."""
    from gdrprobe.buffers import MemorySpec
    from gdrprobe.check import plan_arms, run_ab
    from gdrprobe.doctor.runner import run_doctor

    if not 1 <= args.repeats <= 100:
        raise UsageError("--repeats must be 1 to 100", "")
    if not 0 < args.threshold <= 1:
        raise UsageError("--threshold must be over 0 and at most 1", "e.g. 0.9")
    if args.latency:
        raise UsageError("the GPU A/B measures bandwidth", "drop --latency")
    arms = plan_arms(local, remote or MemorySpec(), args.staged)
    return run_ab(probe, arms, args.repeats, args.threshold, run_doctor().findings)
