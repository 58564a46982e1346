"""``gdrprobe bench``: the microbenchmark sweep, its files and its baseline comparison.

Exit codes: 0 the sweep ran (rows that could not be measured are rows with their outcome);
1 a row fell against ``--baseline`` by more than ``--max-drop``; 130 interrupted, after the
rows measured until then were printed and written; the errors of every command otherwise
(a missing matplotlib or prometheus_client is 3, found before anything is measured).
"""

from __future__ import annotations

import argparse
import sys

import gdrprobe
from gdrprobe import defaults
from gdrprobe.cli.common import (add_timeout_flag, add_verdict_flags, notice,
                                 terminate_as_interrupt)

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def size_list(text: str) -> tuple[int, ...]:
    """An argparse type: sizes in bytes, comma-separated, with K, M or G (powers of 1024)."""
    sizes = []
    for item in (part.strip().upper() for part in text.split(",")):
        number, unit = (item[:-1], item[-1]) if item[-1:] in UNITS else (item, "")
        if not number.isdigit() or int(number) == 0:
            raise argparse.ArgumentTypeError(f"{item!r} is not a size such as 4096, 64K or 1M")
        sizes.append(int(number) * UNITS[unit])
    return tuple(sizes)


def int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a list of numbers such as 1,2,4") from None


def name_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench", help="sweep sizes, memory kinds, QPs and GPU-NIC pairs; tables, files, plots",
        description="The RDMA WRITE sweep in loopback: message sizes x memory kinds x QP "
                    "counts x GPU-NIC pairs, host-memory latency, each bandwidth as a fraction "
                    "of the port's line rate and, for GPU memory, of host memory's.")
    parser.add_argument("-d", "--ib-dev", dest="devices", type=name_list, default=(),
                        metavar="DEV[,DEV]", help="RDMA devices (default: all)")
    parser.add_argument("-i", "--ib-port", dest="ib_port", type=int, default=1, metavar="PORT",
                        help="device port (default 1)")
    parser.add_argument("-x", "--gid-index", dest="gid_index", type=int, metavar="INDEX",
                        help="GID index (default: the RoCE v2 GID of 127.0.0.1's route)")
    parser.add_argument("--gpu", dest="gpus", type=name_list, default=(),
                        metavar="GPU[,GPU]", help="GPUs by bus id or CUDA ordinal "
                        "(default: every GPU CUDA sees)")
    parser.add_argument("--matrix", action="store_true",
                        help="every GPU with every NIC (default: each GPU with NCCL's NIC)")
    parser.add_argument("--sizes", type=size_list, metavar="LIST",
                        help="message sizes, e.g. 4K,64K,1M (default 2 B to 8 MiB)")
    parser.add_argument("--mem", dest="memory", type=name_list,
                        default=defaults.BENCH_MEMORY, metavar="LIST",
                        help=f"memory kinds (default {','.join(defaults.BENCH_MEMORY)})")
    parser.add_argument("-q", "--qp", dest="qps", type=int_list, default=(defaults.QPS,),
                        metavar="LIST", help=f"QP counts, e.g. 1,4 (default {defaults.QPS})")
    parser.add_argument("-n", "--iters", type=int, default=defaults.ITERATIONS,
                        help=f"messages per QP and size (default {defaults.ITERATIONS})")
    parser.add_argument("-D", "--duration", type=float, help="seconds per size instead of -n")
    parser.add_argument("--warmup", type=float, default=defaults.WARMUP_S,
                        help="seconds excluded before a -D window "
                             f"(default {defaults.WARMUP_S:g})")
    parser.add_argument("-t", "--tx-depth", type=int, default=defaults.TX_DEPTH,
                        help=f"outstanding writes per QP (default {defaults.TX_DEPTH})")
    parser.add_argument("-Q", "--cq-mod", type=int, default=defaults.CQ_MODERATION,
                        help=f"one signalled write in N (default {defaults.CQ_MODERATION})")
    parser.add_argument("--latency-iters", type=int, default=defaults.LATENCY_ITERATIONS,
                        help="latency round trips per size, host memory (0: no latency rows; "
                             f"default {defaults.LATENCY_ITERATIONS})")
    add_verdict_flags(parser, None)
    add_timeout_flag(parser)
    parser.add_argument("--json", action="store_true", help="print the JSON document")
    parser.add_argument("-o", "--output", metavar="FILE", help="write the JSON document")
    parser.add_argument("--csv", metavar="FILE", help="write the rows as CSV")
    parser.add_argument("--plot", metavar="DIR",
                        help="write bandwidth.png, matrix.png and latency.png (gdrprobe[plot])")
    parser.add_argument("--baseline", metavar="FILE",
                        help="compare with an earlier --output file; exit 1 when a row fell")
    parser.add_argument("--max-drop", type=float, default=defaults.MAX_DROP, metavar="FRACTION",
                        help="with --baseline: the fall that flags a row "
                             f"(default {defaults.MAX_DROP:g})")
    parser.add_argument("--prometheus", metavar="FILE",
                        help="write node-exporter text-file metrics (gdrprobe[prometheus])")
    parser.set_defaults(handler=run)


class Progress:
    """A bar on stderr while rows arrive: only on a terminal and without --json. tqdm
    (gdrprobe[progress]) draws it; without tqdm there is no bar."""

    def __init__(self, enabled: bool):
        self.bar = None
        self.tqdm = None
        if enabled:
            try:
                from tqdm import tqdm
                self.tqdm = tqdm
            except ImportError:
                notice("pip install 'gdrprobe[progress]' (tqdm) for a progress bar")

    def __call__(self, row, done: int, total: int) -> None:
        if self.tqdm is None:
            return
        if self.bar is None:
            self.bar = self.tqdm(total=total, unit="row", file=sys.stderr, leave=False)
        self.bar.set_postfix_str(f"{row.memory} {row.nic} {row.qps} QP {row.size_bytes} B",
                                 refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run(args) -> int:
    from gdrprobe.report import bench as outputs
    from gdrprobe.report.model import to_json

    # Everything that can refuse does so before the first measurement (the baseline and
    # max_drop inside gdrprobe.bench).
    if args.plot:
        outputs.require_matplotlib()
    if args.prometheus:
        outputs.require_prometheus()
    terminate_as_interrupt()
    progress = Progress(sys.stderr.isatty() and not args.json)
    try:
        report = gdrprobe.bench(
            sizes=args.sizes, memory=args.memory, qps=args.qps, matrix=args.matrix,
            gpus=args.gpus, devices=args.devices, ib_port=args.ib_port,
            gid_index=args.gid_index, iterations=args.iters, duration_s=args.duration,
            warmup_s=args.warmup, tx_depth=args.tx_depth, cq_moderation=args.cq_mod,
            latency_iterations=args.latency_iters, threshold=args.threshold,
            timeout_s=args.timeout, baseline=args.baseline, max_drop=args.max_drop,
            on_row=progress)
    finally:
        progress.close()
    write_files(report, args, outputs)
    print(to_json(report) if args.json else outputs.render_bench(report))
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
