"""The NCCL-pattern loop's own cost per step (csrc/gdr_nccl.c), in ABBA pairs.

A step alone (one in flight) is NCCL's round over the wire: a clear-to-send one way (a
64-byte RDMA WRITE of a FIFO element), the step's data back (a WRITE with immediate of the
step's size), each completed and noticed, plus what the two loops add to it (building and
posting the step's verbs from the schedule, the FIFO poll, the clock reads, the in-order
bookkeeping). The reference is gdrprobe's own WRITE-with-immediate ping-pong (one-way: half
a round trip, each way noticed on a receive completion; against perftest's
``ib_write_lat --write_with_imm`` in RESULTS.md), at 64 bytes for the clear-to-send and at
the step's size for the data, so

    the loop's cost per step = a step alone - (one way at 64 B + one way at the step's size)

At a small step the reference is a small message's round trip; at a large one it holds the
step's bytes once, as the step does (a ping-pong at that size alone would hold them twice).

Each pair runs both in ABBA order (the pattern first in odd pairs, the ping-pong first in even
ones, so drift over time favours neither); the median of the per-pair differences is reported
with their range, and the steps per second with NCCL_STEPS in flight at that size.

    python -m lab loopback -- .venv/bin/python benchmarks/nccl_pattern_cost.py
"""

from __future__ import annotations

import argparse
import platform
import statistics

import gdrprobe

CTS_BYTES = 64      # a clear-to-send: one FIFO element (struct ncclIbSendFifo, csrc/gdr_nccl.h)


def step_alone_us(size: int, steps: int, clock: str) -> tuple[float, float]:
    """(a step alone's median time in us, steps per second in flight) at size."""
    report = gdrprobe.run(loopback=True, pattern="nccl", sizes=(size,), iterations=steps,
                          clock=clock)
    row = report.nccl[0]
    return row.alone.step_us, row.steps * row.channels / row.elapsed_s


def reference_us(size: int, iterations: int, clock: str) -> float:
    """A step's two ways with no loop around them: gdrprobe's WRITE-with-immediate median
    one-way at CTS_BYTES (the clear-to-send) plus at size (the data), one run of both."""
    report = gdrprobe.run(loopback=True, mode="latency", opcode="write_imm",
                          sizes=tuple(sorted({CTS_BYTES, size})), iterations=iterations,
                          clock=clock)
    one_way = {row.size_bytes: row.latency_us_median for row in report.latency}
    return one_way[CTS_BYTES] + one_way[size]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8, help="the step in bytes (default 8)")
    parser.add_argument("--steps", type=int, default=256,
                        help="steps per run in flight (the step alone is a pass of its own)")
    parser.add_argument("--iterations", type=int, default=1000,
                        help="ping-pong round trips per size")
    parser.add_argument("--pairs", type=int, default=9, help="ABBA pairs (default 9)")
    parser.add_argument("--clock", default="auto", help="auto, counter or monotonic")
    args = parser.parse_args()
    pattern, pingpong, rates, differences = [], [], [], []
    for pair in range(args.pairs):
        first_pattern = pair % 2 == 0
        measured = {}
        for which in (("pattern", "pingpong") if first_pattern else ("pingpong", "pattern")):
            if which == "pattern":
                measured[which] = step_alone_us(args.size, args.steps, args.clock)
            else:
                measured[which] = reference_us(args.size, args.iterations, args.clock)
        (alone, rate), trip = measured["pattern"], measured["pingpong"]
        pattern.append(alone)
        pingpong.append(trip)
        rates.append(rate)
        differences.append(alone - trip)
        print(f"pair {pair + 1}: {'pattern first' if first_pattern else 'ping-pong first'}: "
              f"step alone {alone:.1f} us, reference {trip:.1f} us, cost {alone - trip:.1f} "
              f"us, {rate:.0f} steps/s in flight", flush=True)
    print(f"## the NCCL-pattern loop's cost per step, {args.size} B steps, {args.pairs} ABBA "
          f"pairs, clock {args.clock}, {platform.node()} ({platform.machine()})")
    print(f"step alone: median {statistics.median(pattern):.1f} us; reference (WRITE with "
          f"immediate one way at {CTS_BYTES} B + at {args.size} B): median "
          f"{statistics.median(pingpong):.1f} us")
    print(f"the loop's cost per step: median {statistics.median(differences):.1f} us "
          f"(range {min(differences):.1f} .. {max(differences):.1f}); steps in flight: median "
          f"{statistics.median(rates):.0f} steps/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
