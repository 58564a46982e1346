"""bench --all-rails (campaign/bench_rails.py): the sweep's rows at the largest size and QP
count are each rail alone; every rail then runs at once through the sweep's executor, in
real threads behind one barrier. The executor is a double: no device is opened."""

from __future__ import annotations

import dataclasses
import threading
import time

from gdrprobe.campaign import bench
from gdrprobe.campaign.bench_rails import bench_rails, bench_solos
from gdrprobe.campaign.gate import GpuFacts, MachineFacts, NicChoice
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.report import bench as outputs
from tests.unit.fakes.bench import bw, report_of
GPUS = ("0000:1b:00.0", "0000:3d:00.0")
PAIRS = tuple(bench.PairPlan(gpu, f"mlx5_{i}", "NCCL: PIX") for i, gpu in enumerate(GPUS))
PLAN = bench.BenchPlan(pairs=PAIRS, memory_kinds=("host", "dmabuf"), qps=(1, 2),
                       options=ProbeOptions(sizes=(4096, 65536)), latency_iterations=0)
FACTS = MachineFacts(GpuFacts(GPUS, GPUS), {gpu: NicChoice(f"mlx5_{i}", "") for i, gpu in enumerate(GPUS)})
ALONE = 90.0
WINDOW_S = 0.5       # long against a thread's wake-up on a loaded machine (test_all_rails.py)


def sweep_rows():
    """The sweep, every row at ALONE Gb/s."""
    def execute(run, options, on_result):
        for size in options.sizes:
            on_result(bw(size, ALONE))

    return bench.run_sweep(PLAN, execute)


def together(gpu_gbps: float):
    """The executor run by every rail at once: it meets the barrier, then measures."""
    seen: list = []
    lock = threading.Lock()

    def execute(run, options, on_result, on_ready=None):
        with lock:
            seen.append((run.memory, run.nic, run.qps, options.sizes))
        on_ready()
        time.sleep(WINDOW_S)
        measured = bw(options.sizes[0], ALONE if run.memory == "host" else gpu_gbps)
        on_result(dataclasses.replace(measured, elapsed_s=WINDOW_S))

    return execute, seen


def test_each_rail_alone_is_its_sweep_row_at_the_largest_size_and_qps():
    solos = bench_solos(PLAN, sweep_rows().rows)
    assert [(alone.pair.gpu, alone.pair.nic, alone.gbps, alone.host_gbps, kind)
            for alone, kind in solos.values()] == [
        (GPUS[0], "mlx5_0", ALONE, ALONE, "dmabuf"), (GPUS[1], "mlx5_1", ALONE, ALONE, "dmabuf")]


def test_rails_together_run_the_largest_size_and_qps_and_contend_below_the_ratio():
    execute, seen = together(40.0)
    rails = bench_rails(PLAN, sweep_rows().rows, FACTS, execute, 1)
    assert sorted(seen) == [("dmabuf", "mlx5_0", 2, (65536,)), ("dmabuf", "mlx5_1", 2, (65536,)),
                            ("host", "mlx5_0", 2, (65536,)), ("host", "mlx5_1", 2, (65536,))]
    assert rails.verdict == "contention" and rails.exit_code == 13
    assert [r.ratio for r in rails.rails] == [0.444, 0.444] and rails.overlap.fraction >= 0.8
    report = dataclasses.replace(report_of(sweep_rows(), ()), rails=rails)
    assert report.exit_code == 13
    assert "all rails at once:" in outputs.render_bench_summary(report)


def test_rails_that_keep_their_bandwidth_together_leave_bench_s_exit_code_alone():
    execute, _ = together(ALONE)
    rails = bench_rails(PLAN, sweep_rows().rows, FACTS, execute, 1)
    assert rails.verdict == "together" and rails.exit_code == 0
