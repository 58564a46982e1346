"""How fast `gdrprobe nccl-log` reads a large NCCL_DEBUG=INFO log, and its peak memory
(issue 20: at least 20 MB/s, at most 200 MB resident on a 60 MB log); and the same on
hostile logs (issue 30): lines crafted to cost a backtracking pattern the square of their
length, a log naming a million distinct hosts and NICs, and one that fills every bound of
the reader with the longest names it keeps.

The job's log is generated from NCCL 2.21's format strings (src/init.cc, transport/net_ib.cc,
graph/topo.cc, transport/net.cc, transport/p2p.cc): a job of many 8-GPU nodes where every
rank logs its NICs and its channels, intra-node (P2P) and across the network, as the
launcher's merged output holds them. Each reading runs in a fresh process, so its peak
resident size (VmHWM, which starts afresh at exec) is the reader's alone.

    .venv/bin/python benchmarks/nccl_log_speed.py [--mb 60] [--runs 3]
    .venv/bin/python benchmarks/nccl_log_speed.py --hostile
    .venv/bin/python benchmarks/nccl_log_speed.py --write PATH --kind job --mb 60   (a log only)
    .venv/bin/python benchmarks/nccl_log_speed.py --read PATH [--lines] [--output json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

GPUS_PER_NODE = 8
CHANNELS = 16
# What one reading reports: seconds, CPU seconds, peak resident MiB (VmHWM), and what it read;
# argv: the log, then "lines" to keep the channel lines, then the output: none, text or json.
READ = ("import json, re, sys, time; import gdrprobe; "
        "from gdrprobe.report.model import to_json; from gdrprobe.report.text import render_nccl_log; "
        "t = time.perf_counter(); c = time.process_time(); "
        "r = gdrprobe.read_nccl_log(sys.argv[1], lines=sys.argv[2] == 'lines'); "
        "out = {'json': to_json, 'text': render_nccl_log}.get(sys.argv[3], lambda r: '')(r); "
        "s, cpu = time.perf_counter() - t, time.process_time() - c; "
        "hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()); "
        "print(json.dumps({'seconds': s, 'cpu_seconds': cpu, 'rss_mib': int(hwm.group(1)) / 1024, "
        "'verdict': r.verdict, 'network_channels': r.network_channels, 'gdrdma_channels': "
        "r.gdrdma_channels, 'cut_lines': r.cut_lines, 'unrecognised_lines': r.unrecognised_lines, "
        "'nics': len(r.nics), 'hosts': len(r.hosts), 'channels': len(r.channels), "
        "'pairs': len(r.pair_decisions), 'lines_read': r.lines_read, 'summarised': len(r.summarised), "
        "'output_chars': len(out)}))")

# ---- the job's log ------------------------------------------------------------------------


def rank_lines(node: int, local: int, nodes: int) -> list[str]:
    """One rank's INFO lines: its set-up, then its channels."""
    host, rank, pid = f"gpu-node-{node:04d}", node * GPUS_PER_NODE + local, 20000 + local
    prefix = f"{host}:{pid}:{pid + 1} [{local}] NCCL INFO "
    nics = " ".join(f"[{n}]mlx5_{n}:1/IB" for n in range(GPUS_PER_NODE))
    lines = ["NCCL version 2.21.5+cuda12.4" if rank == 0 else "Bootstrap : Using ib0:10.0.0.1<0>",
             f"NET/IB : Using {nics} [RO]; OOB ib0:10.1.{node % 250}.1<0>",
             "Using network IB", f"DMA-BUF is available on GPU device {local}",
             f"comm 0x5566778899 rank {rank} nRanks {nodes * GPUS_PER_NODE} nNodes {nodes} "
             f"localRanks {GPUS_PER_NODE} localRank {local} MNNVL 0"]
    lines += [f"NET/IB : GPU Direct RDMA Enabled for HCA {n} 'mlx5_{n}'" for n in range(GPUS_PER_NODE)]
    lines += [f"Setting affinity for GPU {local} to ffff,ffffffff", "P2P Chunksize set to 524288"]
    for channel in range(CHANNELS):
        peer = node * GPUS_PER_NODE + (local + 1) % GPUS_PER_NODE
        lines.append(f"Channel {channel:02d}/0 : {rank}[{local}] -> {peer}[{(local + 1) % 8}] "
                     f"via P2P/CUMEM/read")
        remote = ((node + 1) % nodes) * GPUS_PER_NODE + local
        lines.append(f"Channel {channel:02d}/0 : {rank}[{local}] -> {remote}[{local}] [send] "
                     f"via NET/IB/{local}/GDRDMA")
        lines.append(f"Channel {channel:02d}/0 : {remote}[{local}] -> {rank}[{local}] [receive] "
                     f"via NET/IB/{local}/GDRDMA")
        lines.append(f"Channel {channel:02d}/0 : {rank}[{local}] -> {remote}[{local}] [send] via "
                     f"NET/IB/{local}/GDRDMA/Shared")
    lines += ["Connected all rings, use ring PXN 0 GDR 1", "Connected all trees",
              f"ncclCommInitRank comm 0x5566778899 rank {rank} nranks {nodes * GPUS_PER_NODE} "
              "cudaDev 0 nvmlDev 0 busId 1b000 commId 0x1234 - Init COMPLETE"]
    return [prefix + line for line in lines]


def write_job(out, megabytes: float) -> None:
    """A log of about this size: nodes are added until it is reached."""
    target, written, node = megabytes * (1 << 20), 0, 0
    while written < target:
        for local in range(GPUS_PER_NODE):
            text = "\n".join(rank_lines(node, local, nodes=1024)) + "\n"
            out.write(text)
            written += len(text)
        node += 1


# ---- hostile logs -------------------------------------------------------------------------

VERSION = "n1:1:2 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
PREFIX = "h:1:1 [0] NCCL INFO "
# Ends every crafted line: a record the junk before it must not keep from being read.
RECORD = " n1:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA"

# Junk that would cost a backtracking pattern the square of its length, by the pattern it
# aims at: each returns n characters (about) of it.
CRAFTED = {
    # "([\w.-]+):\d+:\d+ ..." searched: tried at every start of a run of word characters
    "host-run": lambda n: "x" * n,
    # "(?:\S+ )*$" after host:pid:tid: every word re-read from every host before a bad gap
    "host-words": lambda n: "a:1:1 " * (n // 6) + "x\t",
    # ".+?\s*$" of "Using network": "\s*$" tried over the spaces after every character
    "network-spaces": lambda n: PREFIX + "Using network a" + " " * n + "b ",
    # "[^}]*" of a merged NIC, tried at every "[0]={" of a list without a "}"
    "nic-list-braces": lambda n: PREFIX + "NET/IB : Using " + "[0]={" * (n // 5),
    # ".+?" of "NET/%s : GPU Direct RDMA" over a line of near misses
    "nic-gdr-near": lambda n: PREFIX + "NET/" + "x : GPU Direct RDMA Enabled for HCA 1 " * (n // 38),
    # records glued on records: the host of each looked up against every known host
    "glued-records": lambda n: "".join(f"h{i:07d}:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] "
                                       f"[send] via NET/IB/0x" for i in range(n // 76)),
    # a number Python would refuse to convert (over 4300 digits)
    "long-number": lambda n: PREFIX + "Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/" + "1" * n,
    # marks alone
    "marks": lambda n: "NCCL INFO " * (n // 10),
}


JUNK_SLACK = 100   # what a junk maker may write past the n characters asked (its prefix)


def crafted_line(kind: str, length: int) -> str:
    """A line of `length` characters: the junk, filler, then RECORD at its very end."""
    junk = CRAFTED[kind](length - len(RECORD) - JUNK_SLACK)
    return junk + "y" * (length - len(RECORD) - len(junk)) + RECORD


def write_crafted(out, length: int, copies: int = 1) -> None:
    """Each crafted line `copies` times, `length` characters long."""
    out.write(VERSION)
    for kind in CRAFTED:
        for _ in range(copies):
            out.write(crafted_line(kind, length) + "\n")


def write_distinct(out, lines: int) -> None:
    """Lines that each name a new host and NIC, in the record-by-record path (text after
    the channel's suffix keeps them out of the one-match path): what grew the reader before."""
    out.write(VERSION)
    for i in range(lines):
        out.write(f"host{i}:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via "
                  f"NET/IB/{i % 1000}/GDRDMA x\n")


def write_worst(out, rows: int) -> None:
    """Every bound of the reader filled, with names as long as it keeps them: `rows` rounds
    of a new host, NIC, GPU, pair, variable value and listed channel, each name 255
    characters long (the reader cuts longer ones)."""
    out.write(VERSION)
    for i in range(rows):
        tag = f"{i:09d}"
        host = "h" * 246 + tag
        prefix = f"{host}:1:1 [0] NCCL INFO "
        name = "n" * 246 + tag
        out.write(prefix + f"NET/IB : GPU Direct RDMA Enabled for HCA {i} '{name}'\n")
        out.write(prefix + f"NET/IB : Made virtual device [{i}] name={'m' * 120}{tag}+{'k' * 120}{tag} "
                           f"speed=400000 ndevs=2\n")
        out.write(prefix + f"GPU Direct RDMA Disabled for GPU {'g' * 246}{tag} / HCA {'c' * 246}{tag} "
                           f"(distance {i} > 4), read 1 mode {'o' * 246}{tag}\n")
        out.write(prefix + f"DMA-BUF is available on GPU device {i}\n")
        out.write(prefix + f"NCCL_IB_HCA set by environment to {'v' * 246}{tag}\n")
        out.write(prefix + f"NET/OFI GDR disabled on GDR-supported instance type {'t' * 246}{tag}\n")
        out.write(prefix + "NET/IB : No device found.\n")
        out.write(prefix + f"Channel 00/0 : {'1' * 255}[{'d' * 255}] -> {'2' * 255}[{'e' * 255}] "
                           f"[send] via NET/{'p' * 246}{tag}/{i}/GDRDMA x\n")


def write_long_hosts(out, rows: int) -> None:
    """Lines of the one-match format, each naming a new host of 60,000 characters."""
    out.write(VERSION)
    for i in range(rows):
        out.write(f"{'h' * 60000}{i:07d}:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via "
                  "NET/IB/0/GDRDMA\n")


WRITERS = {"job": lambda out, args: write_job(out, args.mb),
           "crafted": lambda out, args: write_crafted(out, args.length, args.copies),
           "distinct": lambda out, args: write_distinct(out, args.rows),
           "worst": lambda out, args: write_worst(out, args.rows),
           "long-hosts": lambda out, args: write_long_hosts(out, args.rows)}


# ---- reading --------------------------------------------------------------------------------


def read_once(path: str, lines: bool = False, output: str = "none") -> dict:
    out = subprocess.run([sys.executable, "-c", READ, path, "lines" if lines else "summary", output],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def machine() -> str:
    return f"{platform.node()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"


def job(args) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "nccl.log")
        with open(path, "w") as out:
            write_job(out, args.mb)
        size_mb = os.path.getsize(path) / (1 << 20)
        runs = [read_once(path) for _ in range(args.runs)]
    seconds = statistics.median(run["seconds"] for run in runs)
    cpu = statistics.median(run["cpu_seconds"] for run in runs)
    print(f"{machine()}: {size_mb:.1f} MiB, {runs[0]['lines_read']} lines, "
          f"{runs[0]['network_channels']} network channel lines, verdict {runs[0]['verdict']}")
    print(f"median of {args.runs}: {seconds:.2f} s = {size_mb / seconds:.1f} MiB/s "
          f"({cpu:.2f} s of CPU = {size_mb / cpu:.1f} MiB/s); "
          f"peak RSS {max(run['rss_mib'] for run in runs):.0f} MiB")


HOSTILE = (   # name, writer, its argument
    ("crafted, 60 KiB lines x 4", lambda out: write_crafted(out, 60 << 10, 4)),
    ("crafted, 1 MiB lines", lambda out: write_crafted(out, 1 << 20)),
    ("10^6 distinct hosts and NICs", lambda out: write_distinct(out, 1_000_000)),
    ("every bound filled, 255-character names", lambda out: write_worst(out, 40_000)),
    ("4000 hosts of 60,000 characters", lambda out: write_long_hosts(out, 4000)),
)


def hostile(args) -> None:
    print(machine())
    for name, writer in HOSTILE:
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "nccl.log")
            with open(path, "w") as out:
                writer(out)
            size_mb = os.path.getsize(path) / (1 << 20)
            for lines, output in ((False, "text"), (True, "text"), (True, "json")):
                run = read_once(path, lines, output)
                print(f"{name} ({size_mb:.1f} MiB), {'--lines ' if lines else ''}{output}: "
                      f"{run['cpu_seconds']:.2f} s of CPU ({size_mb / run['cpu_seconds']:.1f} MiB/s), "
                      f"peak {run['rss_mib']:.0f} MiB; verdict {run['verdict']}, "
                      f"{run['network_channels']} channels ({run['gdrdma_channels']} GDRDMA), "
                      f"{run['cut_lines']} cut, {run['hosts']} hosts, {run['nics']} NICs, "
                      f"{run['pairs']} pairs, {run['channels']} listed, "
                      f"{run['summarised']} bound(s) summarised", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=60)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--hostile", action="store_true", help="time the hostile logs")
    parser.add_argument("--write", metavar="PATH", help="only write a log to PATH")
    parser.add_argument("--read", metavar="PATH", help="only read the log at PATH, in a fresh "
                        "process, and print what it measured as JSON")
    parser.add_argument("--lines", action="store_true", help="read: keep the channel lines")
    parser.add_argument("--output", choices=("none", "text", "json"), default="none",
                        help="read: render the report too")
    parser.add_argument("--kind", choices=sorted(WRITERS), default="job")
    parser.add_argument("--length", type=int, default=60 << 10, help="crafted: each line's length")
    parser.add_argument("--copies", type=int, default=1, help="crafted: lines of each kind")
    parser.add_argument("--rows", type=int, default=100_000, help="distinct, worst, long-hosts: rounds")
    args = parser.parse_args()
    if args.write:
        with open(args.write, "w") as out:
            WRITERS[args.kind](out, args)
    elif args.read:
        print(json.dumps(read_once(args.read, args.lines, args.output)))
    elif args.hostile:
        hostile(args)
    else:
        job(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
