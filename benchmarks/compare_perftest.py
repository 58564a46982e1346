"""gdrprobe against perftest on the same RDMA device, in one run, as ratios.

Runs inside a lab guest (or on any host with an RDMA device and perftest installed):
both programs run as a server process and a client process over 127.0.0.1 on the same
device, with the same message sizes, iterations, queue depth and CQ moderation. Each
pair of runs is repeated in ABBA order (perftest first in odd pairs, gdrprobe first in
even ones, so drift over time favours neither), and the median of the per-pair ratios is
reported with their range: > 1.0 means gdrprobe moved more bytes (or messages) per
second, and for latency < 1.0 means gdrprobe was faster. perftest's bandwidth is read
from its MB/sec column (2^20 byte/s with two decimals), its most precise figure.

    python -m lab loopback -- .venv/bin/python benchmarks/compare_perftest.py

``--opcode read`` compares READ with ``ib_read_bw`` and ``ib_read_lat``; ``--opcode write_imm``
compares gdrprobe's WRITE-with-immediate latency (the ping-pong GPU memory needs, each side
polling its CQ) with ``ib_write_lat --write_with_imm`` where perftest has that flag, else with
plain ``ib_write_lat`` and says so; ``--bidir`` compares both directions at once with
``ib_write_bw -b`` (perftest reports the two directions' sum, gdrprobe's ``sum_gbps`` is set
against it).

Each table gives, beside the median of the pairs' ratios, the ratio of the two programs' best
runs (the most messages a second, the shortest latency) and every pair's two figures: on a
shared host, a run is slowed (never sped up) by what else runs, and the lab's guest then runs
at half speed for a while (benchmarks/RESULTS.md), so a pair can straddle a change of load.

By default gdrprobe's bandwidth runs check every message in a slot of its own (a ring of up
to 4 MiB, its pauses left out of the window), perftest checks nothing and writes one buffer
over and over;
``--perftest-footprint`` runs gdrprobe's bandwidth in that footprint (``--sample-integrity
--integrity-bytes SIZE``: one receive slot, the last message checked), so the two loops
compare on the same memory.

gdrprobe times with the clock ``--clock`` names (default auto: the cycle counter where the
kernel reports the TSC constant and non-stop, else CLOCK_MONOTONIC; the lab's guest reports
neither, so auto is CLOCK_MONOTONIC there and ``--clock counter`` reads the TSC as perftest
does).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

from gdrprobe.measure.clock import CLOCK_CHOICES

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKEN = "benchmark-token-0123"
PERFTEST_PORT = 18515
GDRPROBE_PORT = 18750


def start(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=REPO)


def finish(process: subprocess.Popen, timeout: float = 600) -> str:
    output, _ = process.communicate(timeout=timeout)
    if process.returncode != 0:
        raise RuntimeError(f"{process.args} exited {process.returncode}:\n{output}")
    return output


def perftest_numbers(output: str, columns: int) -> list[float]:
    """The data row of a perftest table: the one line of `columns` plain numbers."""
    for line in output.splitlines():
        fields = line.split()
        if len(fields) == columns:
            try:
                return [float(f) for f in fields]
            except ValueError:
                continue
    raise RuntimeError(f"no {columns}-number row in perftest output:\n{output}")


BANDWIDTH_TOOLS = {"write": "ib_write_bw", "read": "ib_read_bw"}
LATENCY_TOOLS = {"write": "ib_write_lat", "read": "ib_read_lat", "write_imm": "ib_write_lat"}


def perftest_has(tool: str, flag: str) -> bool:
    """Whether this perftest's tool takes the flag (Debian 12's 4.5+0.17 has no --write_with_imm)."""
    done = subprocess.run([tool, "--help"], capture_output=True, text=True, timeout=30)
    return flag in done.stdout + done.stderr


def perftest_version() -> str:
    """The installed perftest's own version line (ib_write_bw --version), and where it is."""
    done = subprocess.run(["ib_write_bw", "--version"], capture_output=True, text=True, timeout=30)
    found = shutil.which("ib_write_bw") or "ib_write_bw"
    return f"{(done.stdout + done.stderr).strip().splitlines()[-1]} ({found})"


def perftest(tool: str, device: str, gid: int, common: list[str], columns: int) -> list[float]:
    base = [tool, "-d", device, "-x", str(gid), "-p", str(PERFTEST_PORT), "-F", *common]
    server = start(base)
    time.sleep(1.0)
    client = start([*base, "127.0.0.1"])
    output = finish(client)
    finish(server)
    return perftest_numbers(output, columns)


def gdrprobe(device: str, args: list[str]) -> dict:
    python = sys.executable
    server = start([python, "-m", "gdrprobe", "serve", "--once", "--bind", "127.0.0.1",
                    "-p", str(GDRPROBE_PORT), "-d", device, "--token", TOKEN])
    server.stdout.readline()
    client = start([python, "-m", "gdrprobe", "run", "127.0.0.1", "-p", str(GDRPROBE_PORT),
                    "-d", device, "--token", TOKEN, "--json", *args])
    report = json.loads(finish(client))
    finish(server)
    return report


def in_abba_order(pair: int, perftest_run, gdrprobe_run) -> tuple:
    """(perftest's result, gdrprobe's), run perftest first in even pairs (0, 2, ...)."""
    if pair % 2 == 0:
        theirs = perftest_run()
        return theirs, gdrprobe_run()
    mine = gdrprobe_run()
    return perftest_run(), mine


def bandwidth_pair(pair: int, args, size: int, iters: int):
    common = ["-s", str(size), "-n", str(iters), "-t", str(args.tx_depth), "-Q", str(args.cq_mod)]
    both = ["-b"] if args.bidir else []
    footprint = ["--sample-integrity", "--integrity-bytes", str(size)] \
        if args.perftest_footprint else []
    numbers, report = in_abba_order(
        pair, lambda: perftest(BANDWIDTH_TOOLS[args.opcode], args.device, args.gid_index,
                               [*common, *both], 5),
        lambda: gdrprobe(args.device, [*common, *both, *footprint, "--opcode", args.opcode,
                                       "--clock", args.clock]))
    _, _, _, avg_mib_s, rate = numbers
    if args.bidir:   # perftest's figures are both directions together
        total = report["bidirectional"][0]["sum_gbps"] * 1e9 / 8
        mine_mib_s, mine_mpps = total / 2**20, total / size / 1e6
    else:
        row = report["bandwidth"][0]
        mine_mib_s, mine_mpps = row["bandwidth_avg_mib_s"], row["message_rate_mpps"]
    return {"perftest_mib_s": avg_mib_s, "gdrprobe_mib_s": mine_mib_s,
            "perftest_mpps": rate, "gdrprobe_mpps": mine_mpps}


def latency_pair(pair: int, args, size: int, with_imm: list[str]):
    common = ["-s", str(size), "-n", str(args.lat_iters)]
    if args.opcode != "read":   # a READ carries no inline data (perftest refuses -I there)
        common += ["-I", str(args.inline_size)]
    numbers, report = in_abba_order(
        pair, lambda: perftest(LATENCY_TOOLS[args.opcode], args.device, args.gid_index,
                               [*common, *with_imm], 9),
        lambda: gdrprobe(args.device, [*common, "--latency", "--opcode", args.opcode,
                                       "--clock", args.clock]))
    row = report["latency"][0]
    return {"perftest_us": numbers[4], "gdrprobe_us": row["latency_us_median"],
            "perftest_avg_us": numbers[5], "gdrprobe_avg_us": row["latency_us_mean"]}


def ratios(runs: list[dict], mine: str, theirs: str) -> list[float]:
    return [r[mine] / r[theirs] for r in runs if r[theirs] > 0]


def median_and_range(runs: list[dict], mine: str, theirs: str) -> str:
    values = ratios(runs, mine, theirs)
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def best_ratio(runs: list[dict], mine: str, theirs: str, best=max) -> str:
    """Each program's least disturbed run against the other's (best: max for a rate, min
    for a latency). On a shared host a run is slowed, never sped up, by what else runs, and
    a pair can straddle a change of load; the best runs compare the two loops undisturbed."""
    return f"{best(r[mine] for r in runs) / best(r[theirs] for r in runs):.3f}"


def each_pair(runs: list[dict], mine: str, theirs: str) -> str:
    """Every pair's two figures, perftest's first, so a pair disturbed by load shows."""
    return ", ".join(f"{r[theirs]:.2f}/{r[mine]:.2f}" for r in runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-d", "--device", default="rxe0")
    parser.add_argument("-x", "--gid-index", type=int, default=1)
    parser.add_argument("--sizes", default="2,64,1024,4096,65536,1048576,8388608")
    parser.add_argument("--bytes-per-run", type=int, default=64 << 20,
                        help="iterations are sized so each run moves about this much")
    parser.add_argument("--max-iters", type=int, default=5000)
    parser.add_argument("--lat-iters", type=int, default=1000)
    parser.add_argument("--pairs", type=int, default=9,
                        help="ABBA pairs per size (9 resolve a few percent in the lab)")
    parser.add_argument("-t", "--tx-depth", type=int, default=128)
    parser.add_argument("-Q", "--cq-mod", type=int, default=100)
    parser.add_argument("-I", "--inline-size", type=int, default=0,
                        help="inline size for both programs' latency runs (perftest picks 0 "
                             "on rxe)")
    parser.add_argument("--clock", choices=CLOCK_CHOICES, default="auto",
                        help="gdrprobe's --clock")
    parser.add_argument("--only", choices=("bandwidth", "latency"),
                        help="measure only bandwidth and message rate, or only latency")
    parser.add_argument("--opcode", choices=sorted(LATENCY_TOOLS), default="write",
                        help="the operation both programs measure (write_imm: latency only)")
    parser.add_argument("-b", "--bidir", action="store_true",
                        help="bandwidth in both directions at once (perftest's -b)")
    parser.add_argument("--perftest-footprint", action="store_true",
                        help="gdrprobe's bandwidth runs in one receive slot, the last message "
                             "checked, as perftest's one buffer (default: every message "
                             "checked in a slot of its own)")
    parser.add_argument("--perftest-dir",
                        help="where the perftest tools are (a perftest built from source), "
                             "else the PATH's")
    args = parser.parse_args()
    if args.perftest_dir:
        os.environ["PATH"] = os.pathsep.join((args.perftest_dir, os.environ.get("PATH", "")))
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.opcode == "write_imm" and args.only != "latency":
        parser.error("--opcode write_imm is a latency comparison: add --only latency")
    if args.bidir and args.only != "bandwidth":
        parser.error("--bidir is a bandwidth comparison: add --only bandwidth")

    print(f"# gdrprobe vs perftest on {args.device}, {platform.node()}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}, kernel {platform.release()}")
    print(f"# TX depth {args.tx_depth}, CQ moderation {args.cq_mod}, latency inline size "
          f"{args.inline_size}, {args.pairs} ABBA pairs, gdrprobe --clock {args.clock}, "
          f"--opcode {args.opcode}{' -b' if args.bidir else ''}"
          f"{', bandwidth in perftest footprint (one slot)' if args.perftest_footprint else ''}; "
          "ratio = median (range) over pairs of gdrprobe / perftest; best = gdrprobe's best "
          "run over perftest's best run")
    print(f"# perftest: {perftest_version()}")
    if args.only != "latency":
        bandwidth_table(args, sizes)
    if args.only != "bandwidth":
        latency_table(args, sizes)
    return 0


def bandwidth_table(args, sizes: list[int]) -> None:
    print("| size B | iters | perftest MiB/s | gdrprobe MiB/s | BW ratio | best BW ratio "
          "| msg-rate ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    pairs = []
    for size in sizes:
        iters = max(100, min(args.max_iters, args.bytes_per_run // size))
        runs = [bandwidth_pair(pair, args, size, iters) for pair in range(args.pairs)]
        print(f"| {size} | {iters} | {statistics.median(r['perftest_mib_s'] for r in runs):.2f}"
              f" | {statistics.median(r['gdrprobe_mib_s'] for r in runs):.2f}"
              f" | {median_and_range(runs, 'gdrprobe_mib_s', 'perftest_mib_s')}"
              f" | {best_ratio(runs, 'gdrprobe_mib_s', 'perftest_mib_s')}"
              f" | {median_and_range(runs, 'gdrprobe_mpps', 'perftest_mpps')} |", flush=True)
        pairs.append(f"# {size} B, MiB/s per pair (perftest/gdrprobe): "
                     + each_pair(runs, 'gdrprobe_mib_s', 'perftest_mib_s'))
    print("\n".join(pairs), end="\n\n")


def latency_table(args, sizes: list[int]) -> None:
    tool = LATENCY_TOOLS[args.opcode]
    with_imm = []
    if args.opcode == "write_imm":
        with_imm = ["--write_with_imm"] if perftest_has(tool, "--write_with_imm") else []
        print(f"# perftest: {tool} {' '.join(with_imm) or '(plain WRITE: this perftest has no --write_with_imm)'}")
    print("| size B | iters | perftest typical us | gdrprobe median us | latency ratio "
          "| best latency ratio | avg ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    pairs = []
    for size in [s for s in sizes if s <= 65536]:
        runs = [latency_pair(pair, args, max(size, 2), with_imm) for pair in range(args.pairs)]
        print(f"| {max(size, 2)} | {args.lat_iters}"
              f" | {statistics.median(r['perftest_us'] for r in runs):.2f}"
              f" | {statistics.median(r['gdrprobe_us'] for r in runs):.2f}"
              f" | {median_and_range(runs, 'gdrprobe_us', 'perftest_us')}"
              f" | {best_ratio(runs, 'gdrprobe_us', 'perftest_us', best=min)}"
              f" | {median_and_range(runs, 'gdrprobe_avg_us', 'perftest_avg_us')} |",
              flush=True)
        pairs.append(f"# {max(size, 2)} B, us per pair (perftest/gdrprobe): "
                     + each_pair(runs, 'gdrprobe_us', 'perftest_us'))
    print("\n".join(pairs))


if __name__ == "__main__":
    sys.exit(main())
