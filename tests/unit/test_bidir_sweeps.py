"""-b/--bidir for bench and cluster (issue 31): both sides WRITE at once in one window; each
direction and the sum per row (bench) and per pair and arm (cluster), reachable from the CLI
and the API. Recorded results stand in for the runs."""

from __future__ import annotations

import dataclasses
import json

import pytest

import gdrprobe
from gdrprobe.campaign import bench, cluster
from gdrprobe.campaign.ab import plan_arms, run_ab
from gdrprobe.cli import main
from gdrprobe.errors import UsageError
from gdrprobe.measure.loops import bidir_result
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.memory.spec import MemorySpec
from gdrprobe.report import bench as outputs
from gdrprobe.report.model import BidirResult, ClusterReport, to_dict
from gdrprobe.report.text import render_cluster
from tests.unit.fakes.runs import recorded_run
from tests.unit.fakes.bench import GPU, PAIR, SIZES, bw, lat
from tests.unit.fakes.runs import run_report
PLAN = bench.BenchPlan(pairs=(PAIR,), memory_kinds=("host", "dmabuf"), qps=(1,),
                       options=ProbeOptions(sizes=SIZES, bidir=True), latency_iterations=100,
                       flushes={GPU: "NCCL flushes here"})


def both_ways_execute():
    seen = []

    def execute(run, options, on_result):
        seen.append(options)
        for size in options.sizes:
            if run.mode == "latency":
                on_result(lat(size))
            else:
                on_result(bw(size, 40.0), bw(size, 30.0))

    return execute, seen


def test_bench_bidir_rows_carry_each_direction_and_the_sum():
    execute, seen = both_ways_execute()
    rows = bench.run_sweep(PLAN, execute).rows
    bandwidth = [row for row in rows if row.mode == "bandwidth"]
    assert bandwidth and all((row.bandwidth_avg_gbps, row.reverse_gbps, row.bidir_sum_gbps)
                             == (40.0, 30.0, 70.0) for row in bandwidth)
    latency = [row for row in rows if row.mode == "latency"]
    assert latency and all(row.reverse_gbps is None for row in latency)
    # the latency runs ping-pong one way; a bidirectional run checks every message both
    # ways instead of NCCL's flush (the options refuse both at once)
    assert [o.bidir for o in seen] == [True, False, True]
    assert not any(o.flush for o in seen)
    line = outputs.BenchTable().lines(bandwidth[0])[-1]
    assert "(-b: reverse" in line and "sum" in line


def test_bench_bidir_for_a_duration_is_refused_before_the_sweep():
    with pytest.raises(UsageError, match="--bidir"):
        dataclasses.replace(PLAN.options, duration_s=1.0)


def test_bench_and_its_csv_header_know_the_new_columns():
    assert {"reverse_gbps", "bidir_sum_gbps"} <= set(outputs.CSV_FIELDS)


def test_the_bench_cli_asks_the_api_for_both_directions(monkeypatch):
    asked = []

    def recorded_bench(**kwargs):
        asked.append(kwargs)
        raise UsageError("recorded", "nothing to do")

    monkeypatch.setattr(gdrprobe, "bench", recorded_bench)
    assert main(["bench", "-b", "--json"]) == 2
    assert asked[-1]["bidir"] is True
    assert main(["bench", "--json"]) == 2
    assert asked[-1]["bidir"] is False


def bidir_run(forward: float, backward: float, memory: dict):
    report = recorded_run(forward, memory)
    reverse = dataclasses.replace(report.bandwidth[0], bandwidth_avg_gbps=backward)
    return dataclasses.replace(report, reverse=(reverse,),
                               bidirectional=(bidir_result(report.bandwidth[0], reverse),))


def test_a_cluster_host_pair_both_ways():
    host = run_report(90.0)
    reverse = dataclasses.replace(host.bandwidth[0], bandwidth_avg_gbps=80.0)
    host = dataclasses.replace(host, bidirectional=(bidir_result(host.bandwidth[0], reverse),))
    row = cluster.pair_row(0, 1, "a", "b", host)
    assert row.bidirectional == {"host": BidirResult(4096, 90.0, 80.0, 170.0)}


def test_a_cluster_a_b_pair_both_ways_per_arm_the_medians_of_its_repeats():
    gpu_back = iter([50.0, 70.0, 60.0])

    def run_once(local, remote):
        if local.kind == "host":
            return bidir_run(100.0, 90.0, {"kind": "host"})
        return bidir_run(95.0, next(gpu_back), {"kind": "gpu", "mechanism": "dmabuf"})

    report = run_ab(run_once, plan_arms(MemorySpec.from_choice("gpu"), MemorySpec(), False),
                    repeats=3)
    assert [r.server_to_client_gbps for r in report.arms[1].bidirectional] == [50, 70, 60]
    row = cluster.pair_row(0, 1, "a", "b", report)
    assert row.bidirectional["host"].sum_gbps == 190.0
    assert row.bidirectional["gpu"] == BidirResult(8 << 20, 95.0, 60.0, 155.0)
    text = render_cluster(ClusterReport(2, "all", (row,), 100.0, 0.8, (), 0))
    assert "ranks 0<->1 gpu: 95.000 client to server, 60.000 back, sum 155.000" in text
    assert json.dumps(to_dict(row))     # the JSON holds it


def test_one_way_pairs_have_no_bidirectional_entry():
    assert cluster.pair_row(0, 1, "a", "b", run_report(90.0)).bidirectional == {}


def test_the_cluster_cli_asks_the_api_for_both_directions(monkeypatch):
    asked = []
    monkeypatch.setattr(gdrprobe, "cluster", lambda **kwargs: asked.append(kwargs))
    assert main(["cluster", "--bidir"]) == 0
    assert asked[-1]["bidir"] is True
