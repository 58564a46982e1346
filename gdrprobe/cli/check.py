"""``gdrprobe check``: the prelaunch gate, for a scheduler's prolog or an init container.

The A/B on the GPU this process's rank will use (``LOCAL_RANK`` / ``SLURM_LOCALID``
through ``CUDA_VISIBLE_DEVICES``, or ``--gpu``) and the NIC NCCL will use for it (or
``-d``), inside a hard time budget. The exit code is the A/B's (0 engaged, 1 degraded or
not engaged, 9 not testable) or an error's (2 to 8);
:data:`gdrprobe.errors.SCHEDULER_ACTION` says which of them should drain the node and
which only warn, and the README's table mirrors it.
"""

from __future__ import annotations

import sys

import gdrprobe
from gdrprobe import defaults
from gdrprobe.cli.common import add_verdict_flags, terminate_as_interrupt
from gdrprobe.errors import SCHEDULER_ACTION, ExitCode


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "check", help="prelaunch gate: is GPUDirect RDMA engaged on this rank's GPU and NIC?",
        description="The host/GPU A/B in loopback on the GPU this rank will use (LOCAL_RANK "
                    "or SLURM_LOCALID among CUDA_VISIBLE_DEVICES) and the NIC NCCL will use "
                    "for it, inside a hard time budget. Exit 0 engaged, 1 degraded or not "
                    "engaged (drain), 9 not testable (warn); see the README for every code.")
    parser.add_argument("--gpu", metavar="ORDINAL|BUS_ID",
                        help="the GPU (default: the one this process's local rank uses)")
    parser.add_argument("-d", "--ib-dev", dest="device", metavar="DEVICE",
                        help="RDMA device (default: the one NCCL will use for the GPU)")
    parser.add_argument("-i", "--ib-port", dest="ib_port", type=int, default=1, metavar="PORT",
                        help="device port (default 1)")
    parser.add_argument("-x", "--gid-index", dest="gid_index", type=int, metavar="INDEX",
                        help="GID index (default: the RoCE v2 GID of 127.0.0.1's route)")
    parser.add_argument("--mem", default=defaults.GPU_MEMORY,
                        choices=("gpu", "dmabuf", "peermem"),
                        help="the GPU arm's mechanism (default gpu: chosen automatically)")
    parser.add_argument("-s", "--size", type=int, default=defaults.A_B_SIZE,
                        help=f"message size in bytes (default {defaults.A_B_SIZE >> 20} MiB)")
    parser.add_argument("--time-budget", type=float, default=defaults.CHECK_TIME_BUDGET_S,
                        metavar="SECONDS", help="hard limit on the whole check, set-up "
                        f"included (default {defaults.CHECK_TIME_BUDGET_S:g})")
    add_verdict_flags(parser, "A/B repeats at most; sampling stops once the verdict is clear")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the JSON document")
    output.add_argument("-q", "--quiet", action="store_true",
                        help="print nothing when engaged, one line otherwise")
    parser.set_defaults(handler=run)


def run(args) -> int:
    from gdrprobe.report.model import to_json
    from gdrprobe.report.text import render_check

    terminate_as_interrupt()
    report = gdrprobe.check(device=args.device, gpu=args.gpu, ib_port=args.ib_port,
                            gid_index=args.gid_index, mem=args.mem, repeats=args.repeats,
                            threshold=args.threshold, time_budget_s=args.time_budget,
                            size=args.size)
    code = report.verdict.exit_code
    if args.json:
        print(to_json(report))
    elif not args.quiet:
        print(render_check(report))
        print(f" exit {code}: {SCHEDULER_ACTION[code]}")
    elif code != ExitCode.OK:
        print(one_line(report), file=sys.stderr)
    return code


def one_line(report) -> str:
    """The quiet mode's line: the verdict, the pair, what a prolog should do and why."""
    verdict, pair = report.verdict, report.placement
    cause = (verdict.likely_causes or verdict.evidence or ("",))[0]
    return (f"gdrprobe check: GPUDirect RDMA {verdict.classification} on GPU {pair.gpu} via "
            f"{pair.nic or 'the first RDMA device'} (exit {verdict.exit_code}: "
            f"{SCHEDULER_ACTION[verdict.exit_code]}): {cause}")
