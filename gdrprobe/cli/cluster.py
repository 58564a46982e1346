"""gdrprobe cluster: every pair of nodes of an MPI job, host arm and GPU arm across the wire.

Run under mpirun or srun with one rank per node; rank 0 prints the node x node matrix and
exits with the worst pair's code (a slow pair alone: 1). Every other rank exits 0 unless
it failed itself.
"""

from __future__ import annotations

import os
import re
import socket

import gdrprobe
from gdrprobe import defaults
from gdrprobe.cli.common import (add_bidir_flag, add_device_flags, add_memory_flags,
                                 add_timeout_flag,
                                 add_verdict_flags, endpoint_arguments, memory_arguments,
                                 size, terminate_as_interrupt)
from gdrprobe.cli.common import real_number, whole
from gdrprobe.files import check_output_path, replace_file


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "cluster", help="under mpirun/srun: probe every pair of nodes, print the matrix",
        description="Launched with one MPI rank per node (mpirun -np N --map-by ppr:1:node, "
                    "srun --ntasks-per-node=1), measure every pair of nodes (or a ring) from "
                    "one rank's buffer to the other's NIC, round by round, and print on rank 0 "
                    "the node x node matrix with the slow and not-engaged pairs named.",
        epilog="example: mpirun -np 16 --map-by ppr:1:node gdrprobe cluster -d mlx5_0 "
               "-o matrix.json")
    add_device_flags(parser)
    add_timeout_flag(parser)
    add_memory_flags(parser, remote=False, default=defaults.GPU_MEMORY)
    parser.add_argument("--pattern", choices=("all", "ring"), default="all",
                        help="every pair (default) or each rank with the next")
    parser.add_argument("-s", "--size", type=size, default=defaults.A_B_SIZE, metavar="SIZE",
                        help="message size in bytes, or with K, M or G such as 64K "
                             f"(default {defaults.A_B_SIZE})")
    parser.add_argument("-n", "--iters", type=whole, default=defaults.ITERATIONS,
                        help=f"iterations per run (default {defaults.ITERATIONS})")
    add_verdict_flags(parser, "A/B repeats per pair with a GPU buffer")
    add_bidir_flag(parser, "per pair and arm each direction and the sum")
    parser.add_argument("--slow-fraction", type=real_number, default=defaults.SLOW_FRACTION,
                        help="a pair below this fraction of the median pair's host bandwidth "
                             f"is named slow (default {defaults.SLOW_FRACTION:g})")
    parser.add_argument("--oob-address", metavar="ADDR",
                        help="the address other ranks reach this rank's server at (default: "
                             "the IPv4 address of the device's RoCE v2 GID, else the host name's)")
    parser.add_argument("--json", action="store_true", help="rank 0 prints the JSON document")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="rank 0 also writes the JSON here")
    parser.set_defaults(handler=run, render_error=render_error)


# Where each MPI launcher puts a process's rank and the job's size: Open MPI's mpirun, PMIx
# (Open MPI 5, srun --mpi=pmix), MPICH's Hydra (PMI), Slurm's srun.
LAUNCHER_RANKS = (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMIX_RANK", None),
                  ("PMI_RANK", "PMI_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"))


def this_rank(environ=os.environ) -> str:
    """The rank the launcher gave this process, with the job's size and the host: which of
    the N copies of an error this one is."""
    host = socket.gethostname()
    for rank, ranks in LAUNCHER_RANKS:
        if environ.get(rank, "").isdigit():
            of = f" of {environ[ranks]}" if ranks and environ.get(ranks, "").isdigit() else ""
            return f"rank {environ[rank]}{of} ({host})"
    return f"this rank ({host})"


def render_error(parsed, code: int, message: str, cause: str, fix: str) -> str:
    """Every rank of the job prints its own error: each names its rank and host, so that
    the one that failed first is told from the ranks that only lost their peer."""
    rank = this_rank()

    def named(said: re.Match) -> str:
        return f"{said[1]}error on {rank}: " if said[2] else f"{said[1]}on {rank}: "

    return re.sub(r"^(gdrprobe[^:\n]*: )(error: )?", named, message, count=1, flags=re.M)


def run(args) -> int:
    from gdrprobe.report.model import to_json
    from gdrprobe.report.text import render_cluster

    terminate_as_interrupt()
    if args.output:
        check_output_path(args.output, "--output")
    report = gdrprobe.cluster(
        pattern=args.pattern, size=args.size, iterations=args.iters, repeats=args.repeats,
        threshold=args.threshold, slow_fraction=args.slow_fraction, timeout_s=args.timeout,
        oob_address=args.oob_address, bidir=args.bidir, **endpoint_arguments(args),
        **memory_arguments(args))
    if report is None:
        return 0
    document = to_json(report)
    if args.output:
        replace_file(args.output, (document + "\n").encode(), "--output")
    print(document if args.json else render_cluster(report))
    return report.exit_code
