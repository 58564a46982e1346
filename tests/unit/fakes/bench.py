"""A sweep's recorded rows and reports (campaign/bench, report/bench)."""

import dataclasses

from gdrprobe.campaign import bench
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.report.model import (BandwidthResult, BenchEnvironment, BenchReport,
                                   BenchSettings, Integrity, LatencyResult)

OK = Integrity(True, 1, 0, None, 0, None)
SIZES = (4096, 65536)
GPU = "0000:1b:00.0"
PAIR = bench.PairPlan(GPU, "mlx5_0", "NCCL: PIX")
PLAN = bench.BenchPlan(pairs=(PAIR,), memory_kinds=("host", "dmabuf", "peermem"), qps=(1, 2),
                       options=ProbeOptions(sizes=SIZES), latency_iterations=100)
HOST_GBPS = {4096: 20.0, 65536: 90.0}


def bw(size, gbps):
    return BandwidthResult(size, 1000, 0.5, gbps, gbps * 1.05, 0, 0, gbps / size, OK)


def lat(size):
    return LatencyResult(size, 100, 1.0, 1.5, 1.6, 0.1, 2.5, 3.0, 4.0, OK, 0.0003)


def report_of(result, pairs):
    return BenchReport(
        environment=BenchEnvironment("node1", "6.1", "0.1.0", "44.0", None, None, None, ()),
        devices=(), settings=BenchSettings(SIZES, PLAN.memory_kinds, PLAN.qps, False, 1000,
                                           None, 0.5, 128, 100, 100, 0.9, 1),
        pairs=pairs, rows=tuple(result.rows), interrupted=result.interrupted, wall_s=3.0,
        measured_s=result.measured_s)


def settings(**changes):
    base = BenchSettings(SIZES, ("host", "dmabuf"), (1,), False, 1000, None, 0.5, 128, 100,
                         100, 0.9, 1)
    return dataclasses.replace(base, **changes)
