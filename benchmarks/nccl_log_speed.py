"""How fast `gdrprobe nccl-log` reads a large NCCL_DEBUG=INFO log, and its peak memory
(issue 20: at least 20 MB/s, at most 200 MB resident on a 60 MB log).

The log is generated from NCCL 2.21's format strings (src/init.cc, transport/net_ib.cc,
graph/topo.cc, transport/net.cc, transport/p2p.cc): a job of many 8-GPU nodes where every
rank logs its NICs and its channels, intra-node (P2P) and across the network, as the
launcher's merged output holds them. Each reading runs in a fresh process, so its peak
resident size (getrusage) is the reader's alone.

    .venv/bin/python benchmarks/nccl_log_speed.py [--mb 60] [--runs 3]
    .venv/bin/python benchmarks/nccl_log_speed.py --write PATH --mb 60   (the log only)
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
# What one reading reports: seconds, peak RSS in MiB, the verdict and the lines counted.
READ = ("import json, resource, sys, time; import gdrprobe; t = time.perf_counter(); "
        "c = time.process_time(); r = gdrprobe.read_nccl_log(sys.argv[1]); "
        "s, cpu = time.perf_counter() - t, time.process_time() - c; "
        "print(json.dumps({'seconds': s, 'cpu_seconds': cpu, 'rss_mib': resource.getrusage(resource.RUSAGE_SELF)"
        ".ru_maxrss / 1024, 'verdict': r.verdict, 'network_channels': r.network_channels, "
        "'lines_read': r.lines_read}))")


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


def write_log(path: str, megabytes: float) -> None:
    """A log of about this size: nodes are added until it is reached."""
    target, written, node = megabytes * (1 << 20), 0, 0
    with open(path, "w") as out:
        while written < target:
            for local in range(GPUS_PER_NODE):
                text = "\n".join(rank_lines(node, local, nodes=1024)) + "\n"
                out.write(text)
                written += len(text)
            node += 1


def read_once(path: str) -> dict:
    out = subprocess.run([sys.executable, "-c", READ, path], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=60)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--write", metavar="PATH", help="only write the log to PATH")
    args = parser.parse_args()
    if args.write:
        write_log(args.write, args.mb)
        return 0
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "nccl.log")
        write_log(path, args.mb)
        size_mb = os.path.getsize(path) / (1 << 20)
        runs = [read_once(path) for _ in range(args.runs)]
    seconds = statistics.median(run["seconds"] for run in runs)
    cpu = statistics.median(run["cpu_seconds"] for run in runs)
    print(f"{platform.node()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}: {size_mb:.1f} MiB, "
          f"{runs[0]['lines_read']} lines, {runs[0]['network_channels']} network channel lines, "
          f"verdict {runs[0]['verdict']}")
    print(f"median of {args.runs}: {seconds:.2f} s = {size_mb / seconds:.1f} MiB/s "
          f"({cpu:.2f} s of CPU = {size_mb / cpu:.1f} MiB/s); "
          f"peak RSS {max(run['rss_mib'] for run in runs):.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
