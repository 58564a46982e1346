"""The latency A/B of `run --latency` with GPU memory: the host arm (host memory at both
ends) and the GPU arm (the memory asked for), alternately, each repeat a whole run with the
same opcode and settings: the ping-pong of WRITEs with immediate, which no CPU polls, so
either end may be GPU memory (perftest's ib_write_lat --write_with_imm), or READs, whose
initiator polls its CQ, so the fetched (remote) end may be (ib_read_lat). Per size, each
arm's median of its repeats' medians and the GPU arm's over the host arm's: the
small-message cost of GPUDirect, reported, not judged."""

from __future__ import annotations

import statistics
from typing import Callable

from gdrprobe.memory.spec import MemorySpec
from gdrprobe.report.model import LatencyABReport, LatencyRatio, RunReport

RunOnce = Callable[[MemorySpec, "MemorySpec | None"], RunReport]


def latency_ratios(host: list[RunReport], gpu: list[RunReport]) -> tuple[LatencyRatio, ...]:
    """Per size: each arm's median over its repeats' medians, and GPU over host."""
    def medians(runs: list[RunReport]) -> dict[int, float]:
        sizes = [row.size_bytes for row in runs[0].latency]
        return {size: statistics.median(row.latency_us_median for run in runs
                                        for row in run.latency if row.size_bytes == size)
                for size in sizes}

    host_medians, gpu_medians = medians(host), medians(gpu)
    return tuple(LatencyRatio(size, host_medians[size], gpu_medians[size],
                              gpu_medians[size] / host_medians[size])
                 for size in host_medians)


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
