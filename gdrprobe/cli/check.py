"""``gdrprobe check``: the prelaunch gate, for a scheduler's prolog or an init container.

The A/B as NCCL will move the bytes of the GPU this process's rank will use
(``LOCAL_RANK`` / ``SLURM_LOCALID`` through ``CUDA_VISIBLE_DEVICES``, or ``--gpu``) over
the NIC NCCL will use for it (or ``-d``), GPU memory at both ends, inside a hard time
budget; with ``--node`` every GPU of the job (``--gpu LIST``, SLURM_STEP_GPUS,
SLURM_JOB_GPUS, NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES; none: the node's) in one
process. The exit code is the verdict's (0 engaged, 1 degraded, not engaged or refused by
NCCL on this node, 9 not testable, 10 an NCCL setting keeps NCCL off GPUDirect, 12
inconclusive, 13 engaged with a performance warning: rails that contend under --all-rails,
--latency, --read or --bidir falling short, or --gin's doorbell refused; --gin adds 1 or 10
where the job asked for GIN explicitly) or an error's;
:data:`gdrprobe.errors.SCHEDULER_ACTION` says which of them should drain the node and
which only warn, and the README's table mirrors it.

``-q N`` is the number of QPs, as in ``run`` and ``bench`` (perftest's spelling); a bare
``-q``, as prolog scripts wrote it when it meant quiet, still means ``--quiet`` and says so
on stderr.
"""

from __future__ import annotations

import argparse
import sys

import gdrprobe
from gdrprobe import defaults
from gdrprobe.cli.common import (add_device_flags, add_verdict_flags, size,
                                 terminate_as_interrupt, with_range)
from gdrprobe.cli.common import real_number, whole
from gdrprobe.errors import (SCHEDULER_ACTION, WARN, ExitCode, GdrprobeError, UsageError,
                             exit_codes_epilog, printable, quoted)
from gdrprobe.report.check_metrics import (check_prometheus_file, write_check_error,
                                           write_check_prometheus)

BARE_Q = object()   # what a -q without a number stands for (never a count: no type applies)
BARE_Q_NOTE = ("gdrprobe check: a bare -q means --quiet (its old meaning); -q N is now the "
               "number of QPs, as in run and bench: write --quiet")


def qp_count(text: str) -> int:
    try:
        return whole(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{quoted(text)} is not a number of QPs") from None


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "check", help="prelaunch gate: will NCCL move this rank's bytes GPU-direct, at speed?",
        description="The host/GPU A/B in loopback as NCCL will move the bytes of the GPU "
                    "this rank will use (LOCAL_RANK or SLURM_LOCALID among "
                    "CUDA_VISIBLE_DEVICES) over the NIC NCCL will use for it: GPU memory at "
                    "both ends, NCCL's own decision, an absolute floor of line rate, inside "
                    "a hard time budget. Exit 0 engaged, 1 degraded, not engaged or refused "
                    "by NCCL on this node (drain), 9 not testable, 10 an NCCL setting keeps "
                    "NCCL off GPUDirect, 12 inconclusive, 13 engaged with a performance "
                    "warning from --all-rails, --latency, --read or --bidir (warn); see the "
                    "README for every code.",
        epilog="example: gdrprobe check --gpu 0000:3b:00.0 -d mlx5_0 --time-budget 20; in a "
               "Slurm prolog, every GPU of the node: gdrprobe check --node --quiet. "
               + exit_codes_epilog())
    parser.add_argument("--gpu", metavar="ORDINAL|BUS_ID",
                        help="the GPU (default: the one this process's local rank uses); "
                             "with --node the job's GPUs, comma-separated ordinals, bus ids "
                             "or UUIDs (default: SLURM_STEP_GPUS, SLURM_JOB_GPUS, "
                             "NVIDIA_VISIBLE_DEVICES or CUDA_VISIBLE_DEVICES, else every "
                             "GPU of the node)")
    parser.add_argument("--node", action="store_true",
                        help="every GPU of the job with the NIC NCCL will use for it, in "
                             "one process: GPUs sharing a NIC one after the other, NICs in "
                             "parallel; one line per GPU; the exit code is the worst")
    parser.add_argument("--all-rails", action="store_true",
                        help="with --node, on an idle node: each NIC's A/B alone, one NIC at a "
                             "time, then every rail's GPU arm and host arm at once, started "
                             "behind one barrier; per rail solo, together and their ratio, the "
                             "node's aggregate, and 'contention' (exit 13, warn) naming the "
                             "PCIe element the rails share where they fall only together")
    add_device_flags(parser, "the one NCCL will use for the GPU",
                     "NCCL_IB_GID_INDEX on a RoCE port, else the RoCE v2 GID of 127.0.0.1's "
                     "route where the port has one, else the GID NCCL's walk picks under "
                     "NCCL_IB_ADDR_FAMILY, _ROCE_VERSION_NUM and _ADDR_RANGE")
    parser.add_argument("--mem", default=defaults.GPU_MEMORY,
                        choices=("gpu", "dmabuf", "peermem"),
                        help="the GPU arms' mechanism (default gpu: chosen automatically)")
    parser.add_argument("--gpu-alloc", choices=defaults.GPU_ALLOCATIONS,
                        help="how the GPU arms' device memory is allocated, as 'run --help' "
                             "says (default: as NCCL will allocate its buffers, vmm unless "
                             "NCCL_CUMEM_ENABLE=0)")
    parser.add_argument("-s", "--size", type=size, default=defaults.A_B_SIZE, metavar="SIZE",
                        help="message size in bytes, or with K, M or G such as 64K "
                             f"(default {defaults.A_B_SIZE >> 20} MiB)")
    with_range(parser.add_argument(
        "-q", "--qp", dest="qps", type=qp_count, nargs="?", const=BARE_Q, metavar="N",
        help=f"number of QPs, %(range)s (default {defaults.CHECK_QPS}); a bare -q means "
             "--quiet"), "qps")
    parser.add_argument("--floor", type=real_number, default=defaults.FLOOR, metavar="FRACTION",
                        help="the fraction of the port's line rate the GPU arm must reach, "
                             "where the rate is known and the NIC is hardware; 0: none "
                             f"(default {defaults.FLOOR:g})")
    parser.add_argument("--time-budget", type=real_number, default=defaults.CHECK_TIME_BUDGET_S,
                        metavar="SECONDS", help="hard limit on the whole check (--node: on "
                        "all of it), set-up included (default "
                        f"{defaults.CHECK_TIME_BUDGET_S:g})")
    add_verdict_flags(parser, "A/B repeats planned; sampling stops once the answer is clear, "
                              f"and goes on past them while it is inconclusive, up to "
                              f"{defaults.SETTLE_REPEATS} within the budget")
    parser.add_argument("--latency", action="store_true",
                        help="where engaged, also the latency A/B (WRITE with immediate, "
                             "host memory at both ends against the GPU memory): 'latency "
                             "degraded' where the GPU median is over the host median by more "
                             "than --latency-factor at a size; a warning (exit 13), never a "
                             "drain")
    parser.add_argument("--latency-factor", type=real_number, metavar="RATIO",
                        help="the GPU/host median latency ratio --latency accepts (default "
                             f"{defaults.LATENCY_FACTOR:g}: uncalibrated; docs/check.md)")
    parser.add_argument("--read", action="store_true",
                        help="where engaged, also the A/B with WRITEs out of GPU memory into "
                             "host memory (the NIC reading GPU memory as NCCL's sends do): 'GDR "
                             "read degraded' where they fall short while GPU memory at both ends "
                             "passes, with NCCL's mitigation NCCL_NET_GDR_READ=0; not run where "
                             "NCCL sends from host memory; a warning (exit 13), never a drain")
    parser.add_argument("--bidir", action="store_true",
                        help="where engaged, also the A/B with both ends WRITEing at once "
                             "(perftest's -b): 'GDR read degraded' where it falls short while "
                             "the one-way WRITE passes; a warning (exit 13), never a drain")
    parser.add_argument("--gin", action="store_true",
                        help="also make the registration NCCL's GIN makes of the NIC's doorbell "
                             "page for the GPU (cuMemHostRegister with IOMEMORY): 'the GPU can "
                             "map the NIC's doorbell', or GIN runs CPU-proxied: a warning (exit "
                             "13), a drain (1) where the job asked for GIN explicitly "
                             "(NCCL_GIN_ENABLE=1, NCCL_GIN_TYPE, NVSHMEM_IB_ENABLE_IBGDA=1)")
    parser.add_argument("--pattern", choices=defaults.PATTERNS, default=None,
                        help="nccl: where engaged, also the A/B in NCCL's own traffic pattern "
                             "(clear-to-send, data, flush; 8 steps in flight; the job's NCCL_* "
                             "settings) at NCCL's step sizes: a GPU arm whose pattern falls "
                             "below the host arm's is degraded, the phase named (exit 1)")
    parser.add_argument("--prometheus", metavar="FILE",
                        help="also write node-exporter text-file metrics to FILE, atomically: "
                             "bench's metrics, the exit code and time stamp, per GPU "
                             "(gdrprobe[prometheus]); docs/operations.md")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the JSON document")
    output.add_argument("--quiet", action="store_true",
                        help="print nothing when engaged, one line on stderr otherwise "
                             "(--node: one per GPU that is not engaged; an error: one line)")
    parser.set_defaults(handler=run, render_error=render_error)


def render_error(parsed, code: int, message: str, cause: str, fix: str) -> str:
    """check's text contract on an error path as on every answer: the message, then the
    exit line; with --quiet one line, the exit and action first (a prolog's drain reason is
    that line's start), then the cause and the fix. parsed: the parsed arguments, or the
    command line where argparse refused it (never --json here: that prints a document)."""
    quiet = ("--quiet" in parsed if isinstance(parsed, list)
             else parsed.quiet or parsed.qps is BARE_Q)
    action = f"exit {code}: {SCHEDULER_ACTION.get(code, WARN)}"
    if not quiet:
        return f"{message}\n {action}"
    said = " ".join(cause.split()) + (f"; fix: {' '.join(fix.split())}" if fix else "")
    return f"gdrprobe check: error ({action}): {said}"


def output_mode(args) -> tuple[bool, int | None]:
    """(quiet, QPs): a bare -q is --quiet, with a note."""
    if args.qps is not BARE_Q:
        return args.quiet, args.qps
    print(BARE_Q_NOTE, file=sys.stderr)
    if args.json:
        raise UsageError("a bare -q (quiet) and --json ask for two outputs",
                                  "choose one: --json, or --quiet")
    return True, None


def run(args) -> int:
    quiet, qps = output_mode(args)
    if args.prometheus:
        check_prometheus_file(args.prometheus)
    terminate_as_interrupt()
    common = dict(ib_port=args.ib_port, gid_index=args.gid_index, mem=args.mem,
                  gpu_alloc=args.gpu_alloc,
                  repeats=args.repeats, threshold=args.threshold, floor=args.floor,
                  time_budget_s=args.time_budget, size=args.size, qps=qps,
                  latency=args.latency, read=args.read, bidir=args.bidir,
                  latency_factor=args.latency_factor, gin=args.gin,
                  pattern=args.pattern)
    if args.all_rails and not args.node:
        raise UsageError("--all-rails runs every rail of the node at once", "add --node")
    if args.node:
        if args.device is not None:
            raise UsageError("--node checks each GPU with its NCCL NIC",
                             "drop -d, or drop --node")
        return show_node(with_metrics(args, lambda: gdrprobe.check_node(
            gpus=args.gpu, all_rails=args.all_rails, **common)),
                         args.json, quiet)
    return show(with_metrics(args, lambda: gdrprobe.check(device=args.device, gpu=args.gpu,
                                                          **common)), args.json, quiet)


def with_metrics(args, check):
    """The check's report, its metrics written first where --prometheus asks for them; an
    error's exit code is written too before the error goes on (a bug in gdrprobe: the
    internal error's, so that no earlier check's metrics stay in the file as this one's)."""
    try:
        report = check()
    except Exception as error:   # noqa: BLE001 - written, then raised on to cli.main
        if args.prometheus:
            code = (error.exit_code if isinstance(error, GdrprobeError)
                    else ExitCode.INTERNAL)
            write_check_error(code, args.prometheus, gpu=args.gpu or "",
                              nic=args.device or "")
        raise
    if args.prometheus:
        write_check_prometheus(report, args.prometheus)
    return report


def show(report, json_output: bool, quiet: bool) -> int:
    from gdrprobe.report.check_text import render_check
    from gdrprobe.report.model import to_json

    code = report.verdict.exit_code
    if json_output:
        print(to_json(report))
    elif not quiet:
        print(render_check(report))
        print(f" exit {code}: {SCHEDULER_ACTION[code]}")
    elif code != ExitCode.OK:
        print(printable(one_line(report)), file=sys.stderr)
    return code


def show_node(report, json_output: bool, quiet: bool) -> int:
    from gdrprobe.report.check_text import node_line, rails_line, render_node_check
    from gdrprobe.report.model import to_json

    if json_output:
        print(to_json(report))
    elif not quiet:
        print(render_node_check(report))
    else:
        for check in report.gpus:
            if check.exit_code != ExitCode.OK:
                print(printable(f"gdrprobe check: {node_line(check)}"), file=sys.stderr)
        if report.rails is not None and report.rails.exit_code != ExitCode.OK:
            print(printable(f"gdrprobe check: all rails: {rails_line(report.rails)}"), file=sys.stderr)
        if not report.gpus:
            print(printable(f"gdrprobe check: nothing to check: {report.job_gpus} (exit "
                  f"{report.exit_code}: {SCHEDULER_ACTION[report.exit_code]})"), file=sys.stderr)
    return report.exit_code


def one_line(report) -> str:
    """The quiet mode's line: the verdict, the pair, what a prolog should do and why."""
    from gdrprobe.report.check import main_cause

    verdict, pair = report.verdict, report.placement
    cause = main_cause(verdict)
    direction = f", failing direction {verdict.direction}" if verdict.direction else ""
    state = verdict.classification + (", inconclusive" if verdict.exit_code ==
                                      ExitCode.INCONCLUSIVE else "")
    return (f"gdrprobe check: GPUDirect RDMA {state}{direction} on GPU "
            f"{pair.gpu} via {pair.nic or 'the first RDMA device'} (exit {verdict.exit_code}: "
            f"{SCHEDULER_ACTION[verdict.exit_code]}): {cause}")
