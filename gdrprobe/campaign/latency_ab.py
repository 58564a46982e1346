"""The latency A/B of `run --latency` with GPU memory: the host arm (host memory at both
ends) and the GPU arm (the memory asked for), alternately, each repeat a whole run with the
same opcode and settings: the ping-pong of WRITEs with immediate, which no CPU polls, so
either end may be GPU memory (perftest's ib_write_lat --write_with_imm), or READs, whose
initiator polls its CQ, so the fetched (remote) end may be (ib_read_lat). Per size, each
arm's median of its repeats' medians and the GPU arm's over the host arm's, and each
repeat's own ratio: the small-message cost of GPUDirect, reported, not judged (check
--latency judges it: campaign/secondary.py latency_check)."""

from __future__ import annotations

import statistics
from typing import Callable

from gdrprobe.memory.spec import MemorySpec
from gdrprobe.report.model import LatencyABReport, LatencyRatio, RunReport

RunOnce = Callable[[MemorySpec, "MemorySpec | None"], RunReport]


def run_median(run: RunReport, size: int) -> float:
    return next(row.latency_us_median for row in run.latency if row.size_bytes == size)


def latency_ratios(host: list[RunReport], gpu: list[RunReport]) -> tuple[LatencyRatio, ...]:
    """Per size: each arm's median over its repeats' medians, GPU over host, and each
    repeat's pair (the host run and the GPU run after it) as its own ratio."""
    def ratio(size: int) -> LatencyRatio:
        host_median = statistics.median(run_median(run, size) for run in host)
        gpu_median = statistics.median(run_median(run, size) for run in gpu)
        pairs = tuple(run_median(g, size) / run_median(h, size) for h, g in zip(host, gpu))
        return LatencyRatio(size, host_median, gpu_median, gpu_median / host_median, pairs)

    return tuple(ratio(row.size_bytes) for row in host[0].latency)


def latency_ab(run_once: RunOnce, local: MemorySpec, remote: MemorySpec | None,
               repeats: int) -> LatencyABReport:
    """Host arm then GPU arm, `repeats` times (alternating, so drift falls on both)."""
    host_remote = MemorySpec() if remote is not None else None
    host, gpu = [], []
    for _ in range(repeats):
        host.append(run_once(MemorySpec(), host_remote))
        gpu.append(run_once(local, remote))
    return LatencyABReport(settings=gpu[-1].settings, host=tuple(host), gpu=tuple(gpu),
                           ratios=latency_ratios(host, gpu))
