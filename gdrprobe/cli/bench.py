"""``gdrprobe bench``: the microbenchmark sweep, its files and its baseline comparison.

Exit codes: 0 the sweep ran (rows that could not be measured are rows with their outcome);
1 a row fell against ``--baseline`` by more than ``--max-drop``; 130 interrupted, after the
rows measured until then were printed and written; the errors of every command otherwise
(a missing matplotlib or prometheus_client is 3, found before anything is measured).
"""

from __future__ import annotations

import sys

import gdrprobe
from gdrprobe import defaults
from gdrprobe.errors import extra_fix
from gdrprobe.cli.common import (add_bidir_flag, add_opcode_flag, add_qps_flag,
                                 add_timeout_flag, add_verdict_flags, notice,
                                 size_list, terminate_as_interrupt)
from gdrprobe.cli.common import real_number, whole


def name_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench", help="sweep sizes, memory kinds, QPs and GPU-NIC pairs; tables, files, plots",
        description="The RDMA WRITE sweep in loopback: message sizes x memory kinds x QP "
                    "counts x GPU-NIC pairs, host-memory latency, each bandwidth as a fraction "
                    "of the port's line rate and, for GPU memory, of host memory's. Each row "
                    "is printed as it is measured.",
        epilog="example: gdrprobe bench --sizes 4K,64K,1M -q 1,4 -o sweep.json --csv sweep.csv")
    parser.add_argument("-d", "--ib-dev", dest="devices", type=name_list, default=(),
                        metavar="DEV[,DEV]", help="RDMA devices (default: all)")
    parser.add_argument("-i", "--ib-port", dest="ib_port", type=whole, default=1, metavar="PORT",
                        help="device port (default 1)")
    parser.add_argument("-x", "--gid-index", dest="gid_index", type=whole, metavar="INDEX",
                        help="GID index (default: the RoCE v2 GID of 127.0.0.1's route)")
    parser.add_argument("--gpu", dest="gpus", type=name_list, default=(),
                        metavar="GPU[,GPU]", help="GPUs by bus id or CUDA ordinal "
                        "(default: every GPU CUDA sees)")
    parser.add_argument("--matrix", action="store_true",
                        help="every GPU with every NIC (default: each GPU with NCCL's NIC)")
    parser.add_argument("--sizes", type=size_list, metavar="LIST",
                        help="message sizes in bytes, or with K, M or G, e.g. 4K,64K,1M "
                             "(default 2 B to 8 MiB)")
    parser.add_argument("--mem", dest="memory", type=name_list,
                        default=defaults.BENCH_MEMORY, metavar="LIST",
                        help=f"memory kinds (default {','.join(defaults.BENCH_MEMORY)})")
    add_qps_flag(parser, several=True, default_text=f"default {defaults.QPS}")
    parser.add_argument("-n", "--iters", type=whole, default=defaults.ITERATIONS,
                        help=f"messages per QP and size (default {defaults.ITERATIONS})")
    parser.add_argument("-D", "--duration", type=real_number, help="seconds per size instead of -n")
    parser.add_argument("--warmup", type=real_number, default=defaults.WARMUP_S,
                        help="seconds excluded before a -D window "
                             f"(default {defaults.WARMUP_S:g})")
    parser.add_argument("-t", "--tx-depth", type=whole, default=defaults.TX_DEPTH,
                        help=f"outstanding writes per QP (default {defaults.TX_DEPTH})")
    parser.add_argument("-Q", "--cq-mod", type=whole, default=defaults.CQ_MODERATION,
                        help=f"one signalled write in N (default {defaults.CQ_MODERATION})")
    add_opcode_flag(parser)
    add_bidir_flag(parser, "every bandwidth row gets the other direction and the sum "
                           "(a number of iterations: no -D)")
    parser.add_argument("--pattern", choices=defaults.PATTERNS, default=None,
                        help="nccl: each bandwidth size also as NCCL's steps over its IB "
                             "transport (the job's NCCL_* settings): the row's NCCL-pattern "
                             "rate, its ceiling per connection and answer (NCCL's step sizes "
                             "unless --sizes)")
    latency = parser.add_mutually_exclusive_group()
    latency.add_argument("--latency-iters", type=whole, default=defaults.LATENCY_ITERATIONS,
                         metavar="N", help="latency round trips per size, host memory, 1 or "
                         f"more (default {defaults.LATENCY_ITERATIONS})")
    latency.add_argument("--no-latency", dest="latency_iters", action="store_const",
                         const=None, help="no latency rows")
    add_verdict_flags(parser, None)
    add_timeout_flag(parser)
    parser.add_argument("--all-rails", action="store_true",
                        help="on an idle node, after the sweep: every rail (a NIC and its "
                             "GPU) at once at the largest size and QP count, behind one "
                             "barrier, against its own sweep row; exit 13 where rails "
                             "contend (docs/check.md, 'All rails at once')")
    parser.add_argument("--json", action="store_true", help="print the JSON document")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="write the JSON document (its directory must exist)")
    parser.add_argument("--csv", metavar="FILE", help="write the rows as CSV")
    parser.add_argument("--plot", metavar="DIR",
                        help="write bandwidth.png, matrix.png and latency.png into DIR, created "
                             "if its parent exists (gdrprobe[plot])")
    parser.add_argument("--baseline", metavar="FILE",
                        help="compare with an earlier --output file; exit 1 when a row fell")
    parser.add_argument("--max-drop", type=real_number, default=defaults.MAX_DROP, metavar="FRACTION",
                        help="with --baseline: the fall that flags a row "
                             f"(default {defaults.MAX_DROP:g})")
    parser.add_argument("--prometheus", metavar="FILE",
                        help="write node-exporter text-file metrics (gdrprobe[prometheus])")
    parser.set_defaults(handler=run)


class Progress:
    """A bar on stderr while rows arrive: only on a terminal and without --json. tqdm
    (gdrprobe[progress]) draws it; without tqdm there is no bar. Lines printed while it
    shows go through it, so the bar stays below them."""

    def __init__(self, enabled: bool):
        self.bar = None
        self.tqdm = None
        if enabled:
            try:
                from tqdm import tqdm
                self.tqdm = tqdm
            except ImportError:
                notice(f"for a progress bar: {extra_fix('progress')}")

    def __call__(self, row, done: int, total: int) -> None:
        if self.tqdm is None:
            return
        if self.bar is None:
            self.bar = self.tqdm(total=total, unit="row", file=sys.stderr, leave=False)
        self.bar.set_postfix_str(f"{row.memory} {row.nic} {row.qps} QP {row.size_bytes} B",
                                 refresh=False)
        self.bar.update(1)

    def print(self, line: str) -> None:
        """A line on stdout now, whatever stdout is (a pipe too)."""
        if self.bar is not None:
            self.tqdm.write(line, file=sys.stdout)
            sys.stdout.flush()
        else:
            print(line, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def check_outputs(args, outputs) -> None:
    """Everything that can refuse does so before the first measurement: each output path,
    the optional libraries (the baseline and max_drop are checked inside gdrprobe.bench)."""
    for flag, path in (("--output", args.output), ("--csv", args.csv),
                       ("--prometheus", args.prometheus)):
        if path:
            outputs.check_output_file(path, flag)
    if args.plot:
        outputs.check_output_directory(args.plot, "--plot")
        outputs.require_matplotlib()
    if args.prometheus:
        outputs.require_prometheus()


def run(args) -> int:
    from gdrprobe.report import bench as outputs
    from gdrprobe.report.model import to_json

    check_outputs(args, outputs)
    terminate_as_interrupt()
    progress = Progress(sys.stderr.isatty() and not args.json)
    table = outputs.BenchTable()

    def on_row(row, done: int, total: int) -> None:
        if not args.json:
            for line in table.lines(row):
                progress.print(line)
        progress(row, done, total)

    try:
        report = gdrprobe.bench(
            sizes=args.sizes, memory=args.memory, qps=args.qps, matrix=args.matrix,
            gpus=args.gpus, devices=args.devices, ib_port=args.ib_port,
            gid_index=args.gid_index, iterations=args.iters, duration_s=args.duration,
            warmup_s=args.warmup, tx_depth=args.tx_depth, cq_moderation=args.cq_mod,
            latency_iterations=args.latency_iters, threshold=args.threshold,
            timeout_s=args.timeout, baseline=args.baseline, max_drop=args.max_drop,
            on_row=on_row, opcode=args.opcode, bidir=args.bidir, all_rails=args.all_rails,
            pattern=args.pattern)
    finally:
        progress.close()
    print(to_json(report) if args.json else outputs.render_bench_summary(report), flush=True)
    write_files(report, args, outputs)
    return report.exit_code


def write_files(report, args, outputs) -> None:
    if args.output:
        outputs.write_json(report, args.output)
    if args.csv:
        outputs.write_csv(report, args.csv)
    if args.plot:
        outputs.write_plots(report, args.plot)
    if args.prometheus:
        outputs.write_prometheus(report, args.prometheus)
