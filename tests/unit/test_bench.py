"""The sweep's bookkeeping and its outputs, on recorded results: which runs, rows as they
arrive, failures as rows, Ctrl-C, ratios and line-rate fractions, pair verdicts, the
baseline comparison, CSV, JSON, Prometheus text and the data behind the plots."""

import csv
import json
import math
import sys

import pytest

from gdrprobe.errors import (IntegrityError, MissingDependency, NotTestable, RdmaError,
                             RegistrationFailed, UsageError)
from gdrprobe.campaign import bench
from gdrprobe.campaign.gate import GpuFacts, MachineFacts, NicChoice
from gdrprobe.report import bench as outputs
from gdrprobe.report.model import (to_json)
from tests.unit.fakes.bench import GPU, HOST_GBPS, PLAN, bw, lat, report_of, settings

def execute_with(gpu_factor=0.95, peermem_error=None, interrupt_at=None):
    calls = []

    def execute(run, options, on_result):
        calls.append(run)
        if interrupt_at is not None and len(calls) == interrupt_at:
            on_result(bw(options.sizes[0], 1.0))
            raise KeyboardInterrupt
        if run.memory == "peermem" and peermem_error is not None:
            raise peermem_error
        for size in options.sizes:
            if run.mode == "latency":
                on_result(lat(size))
            else:
                factor = 1.0 if run.memory == "host" else gpu_factor
                on_result(bw(size, HOST_GBPS[size] * factor))

    return execute, calls


def sweep(**kwargs):
    execute, calls = execute_with(**kwargs)
    result = bench.run_sweep(PLAN, execute)
    rates = {"mlx5_0": 100.0}
    result.rows = bench.with_ratios(result.rows, rates)
    pairs = bench.pair_verdicts(PLAN.pairs, result.rows, result.errors, PLAN.memory_kinds,
                                rates, 0.9)
    return report_of(result, pairs), calls


def test_runs_host_first_then_latency_then_gpu_kinds():
    runs = PLAN.runs()
    assert [(r.mode, r.memory, r.qps) for r in runs] == [
        ("bandwidth", "host", 1), ("bandwidth", "host", 2), ("latency", "host", 1),
        ("bandwidth", "dmabuf", 1), ("bandwidth", "dmabuf", 2),
        ("bandwidth", "peermem", 1), ("bandwidth", "peermem", 2)]
    assert runs[3].gpu == GPU and runs[0].gpu == ""
    latency = PLAN.run_options(runs[2])
    assert (latency.mode, latency.qps, latency.iterations, latency.duration_s) == (
        "latency", 1, 100, None)
    assert PLAN.row_count() == 7 * 2


def test_pairs_follow_nccl_unless_matrix():
    decisions = {GPU: bench.PairPlan(GPU, "mlx5_1", "NCCL: PXB")}   # anything with nic, reason
    gpus, nics = (GPU, "0000:43:00.0"), ("mlx5_0", "mlx5_1")
    pairs = bench.bench_pairs(gpus, nics, decisions, matrix=False)
    assert [(p.gpu, p.nic) for p in pairs] == [(GPU, "mlx5_1"), ("0000:43:00.0", "mlx5_0"),
                                               ("0000:43:00.0", "mlx5_1")]
    assert pairs[0].reason == "NCCL: PXB" and "every NIC" in pairs[1].reason
    assert len(bench.bench_pairs(gpus, nics, decisions, matrix=True)) == 4


def test_rows_ratios_line_rate_and_the_pair_verdict():
    report, calls = sweep()
    assert len(calls) == 7 and len(report.rows) == 14 and not report.interrupted
    dmabuf = [r for r in report.rows if r.memory == "dmabuf" and r.qps == 1]
    assert [r.gpu_host_ratio for r in dmabuf] == [pytest.approx(0.95)] * 2
    assert dmabuf[1].line_rate_fraction == pytest.approx(90 * 0.95 / 100)
    host = report.rows[0]
    assert host.gpu_host_ratio is None and host.line_rate_fraction == pytest.approx(0.2)
    verdict = report.pairs[0].verdict
    assert (verdict.classification, verdict.mechanism) == ("engaged", "dmabuf")
    # the bandwidth rows' windows and the latency rows' timed round trips
    assert report.measured_s == pytest.approx(0.5 * 12 + 0.0003 * 2)


def test_a_kind_that_cannot_run_is_tried_once_and_becomes_rows():
    error = RegistrationFailed("ibv_reg_mr failed", "load nvidia-peermem", error_code=14)
    report, calls = sweep(gpu_factor=0.5, peermem_error=error)
    assert sum(run.memory == "peermem" for run in calls) == 1
    peermem = [r for r in report.rows if r.memory == "peermem"]
    assert len(peermem) == 4 and {r.outcome for r in peermem} == {"registration failed"}
    assert peermem[0].fix == "load nvidia-peermem"
    assert report.pairs[0].verdict.classification == "degraded"


def test_a_failed_run_keeps_its_measured_sizes_and_the_next_qp_count_runs():
    def execute(run, options, on_result):
        if run.memory == "dmabuf" and run.qps == 1:
            on_result(bw(options.sizes[0], 10.0))
            raise RdmaError("work completion failed", "check the NIC")
        for size in options.sizes:
            on_result(lat(size) if run.mode == "latency" else bw(size, 50.0))

    result = bench.run_sweep(PLAN, execute)
    dmabuf = [(r.qps, r.size_bytes, r.outcome) for r in result.rows if r.memory == "dmabuf"]
    assert dmabuf == [(1, 4096, "measured"), (1, 65536, "failed"), (2, 4096, "measured"),
                      (2, 65536, "measured")]


def test_ctrl_c_keeps_the_rows_measured_so_far():
    execute, calls = execute_with(interrupt_at=4)
    result = bench.run_sweep(PLAN, execute)
    assert result.interrupted and len(calls) == 4
    assert len(result.rows) == 2 + 2 + 2 + 1      # host x2, latency, one dmabuf size


def test_a_pair_with_nothing_measured_on_the_gpu_is_not_testable_and_nan_in_the_matrix():
    # dmabuf moved no bytes, peermem could not run: no ratio, and the reason is peermem's.
    report, _ = sweep(peermem_error=NotTestable("not testable: no CUDA driver", "install it"),
                      gpu_factor=0.0)
    verdict = report.pairs[0].verdict
    assert verdict.classification == "not testable" and verdict.ratio is None
    assert verdict.likely_causes == ("not testable: no CUDA driver",)
    _, _, values = outputs.matrix_data(report)
    assert math.isnan(values[0][0])
    assert (f" GPU {GPU} - mlx5_0: not testable: no CUDA driver  (NIC: NCCL: PIX)"
            in outputs.render_bench(report))


def test_baseline_flags_a_drop_a_rise_in_latency_and_a_lost_kind():
    before, _ = sweep()
    old_rows = json.loads(to_json(before))["rows"]
    error = RegistrationFailed("ibv_reg_mr failed", "load nvidia-peermem", error_code=14)
    after, _ = sweep(gpu_factor=0.8, peermem_error=error)
    comparison = bench.compare_rows(after.rows, old_rows, "before.json", max_drop=0.1)
    assert comparison.compared == 14 and comparison.not_in_this_run == 0
    reasons = {(c.row.memory, c.row.qps, c.row.size_bytes): c.reason for c in comparison.changes}
    assert "bandwidth fell by 16%" in reasons[("dmabuf", 1, 4096)]
    assert "now registration failed" in reasons[("peermem", 2, 65536)]
    assert not any(c.row.memory == "host" for c in comparison.changes)
    same = bench.compare_rows(before.rows, old_rows, "before.json")
    assert same.changes == ()


def test_csv_and_json_round_trip(tmp_path):
    report, _ = sweep()
    outputs.write_csv(report, str(tmp_path / "rows.csv"))
    outputs.write_json(report, str(tmp_path / "bench.json"))
    with open(tmp_path / "rows.csv") as handle:
        lines = list(csv.DictReader(handle))
    assert len(lines) == len(report.rows) and tuple(lines[0]) == outputs.CSV_FIELDS
    assert float(lines[0]["bandwidth_avg_gbps"]) == report.rows[0].bandwidth_avg_gbps
    assert lines[0]["latency_us_median"] == ""
    rows = outputs.read_baseline(str(tmp_path / "bench.json"))
    assert [bench.row_key(r) for r in rows] == [bench.row_key(r) for r in report.rows]


def test_a_file_that_is_not_a_bench_document_is_refused(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"kind": "run"}))
    with pytest.raises(UsageError, match="not a gdrprobe bench document"):
        outputs.read_baseline(str(path))


def test_prometheus_text_parses_back(tmp_path):
    parser = pytest.importorskip("prometheus_client.parser")
    report, _ = sweep()
    path = tmp_path / "gdrprobe.prom"
    outputs.write_prometheus(report, str(path))
    families = {f.name: f for f in parser.text_string_to_metric_families(path.read_text())}
    engaged = families["gdrprobe_gdr_engaged"].samples
    assert [(s.labels, s.value) for s in engaged] == [({"gpu": GPU, "nic": "mlx5_0"}, 1.0)]
    ratio = {(s.labels["memory"], s.labels["qps"], s.labels["size_bytes"]): s.value
             for s in families["gdrprobe_gpu_host_ratio"].samples}
    assert ratio[("dmabuf", "1", "65536")] == pytest.approx(0.95)
    bandwidth = families["gdrprobe_bandwidth_bytes_per_second"].samples
    assert len(bandwidth) == 12
    [row] = [r for r in report.rows if (r.memory, r.qps, r.size_bytes) == ("dmabuf", 1, 65536)]
    [value] = [s.value for s in bandwidth if (s.labels["memory"], s.labels["qps"],
               s.labels["size_bytes"]) == ("dmabuf", "1", "65536")]
    assert value == pytest.approx(row.bandwidth_avg_gbps * 1e9 / 8)   # bytes/s, not Gb/s
    assert len(families["gdrprobe_line_rate_ratio"].samples) == 12


def test_plot_data_and_the_figures_drawn_from_it(tmp_path):
    report, _ = sweep()
    series = outputs.bandwidth_series(report)
    assert series["dmabuf 0000:1b:00.0 mlx5_0 1 QP"] == [(4096, pytest.approx(19.0)),
                                                        (65536, pytest.approx(85.5))]
    gpus, nics, values = outputs.matrix_data(report)
    assert (gpus, nics) == ([GPU], ["mlx5_0"]) and values[0][0] == pytest.approx(0.95)
    latency = outputs.latency_series(report)
    assert latency["mlx5_0 p99"] == [(4096, 2.5), (65536, 2.5)]
    pytest.importorskip("matplotlib")
    drawn = outputs.figures(report)
    lines = {line.get_label(): list(zip(line.get_xdata(), line.get_ydata()))
             for line in drawn["bandwidth.png"].axes[0].lines}
    assert lines == {label: [tuple(p) for p in points] for label, points in series.items()}
    image = drawn["matrix.png"].axes[0].images[0].get_array()
    assert image[0][0] == pytest.approx(0.95)
    paths = outputs.write_plots(report, str(tmp_path / "plots"))
    assert sorted(p.rsplit("/", 1)[1] for p in paths) == ["bandwidth.png", "latency.png",
                                                         "matrix.png"]
    for path in paths:
        with open(path, "rb") as handle:
            assert handle.read(8) == b"\x89PNG\r\n\x1a\n"



def test_the_table_says_each_failure_and_its_fix_once_and_the_pair_verdict():
    error = RegistrationFailed("registering GPU memory through peermem failed",
                               "modprobe nvidia-peermem", error_code=14)
    report, _ = sweep(peermem_error=error)
    text = outputs.render_bench(report)
    assert text.count("peermem failed") == 1 and text.count("fix: modprobe nvidia-peermem") == 1
    assert f" GPU {GPU} - mlx5_0: engaged via dmabuf, GPU/host 0.95  (NIC: NCCL: PIX)" in text
    assert "  20%  measured" in text          # 20 Gb/s on a 100 Gb/s port


def test_the_plan_resolves_gpus_and_refuses_what_cannot_run():
    other = "0000:43:00.0"
    facts = MachineFacts(GpuFacts((GPU, other), (GPU, other)),
                         {GPU: NicChoice("mlx5_0", "NCCL: PIX"),
                          other: NicChoice("mlx5_1", "NCCL: PIX")})
    plan = bench.bench_plan(settings(), facts, ("1",), ("mlx5_0", "mlx5_1"), 30.0)
    assert [(p.gpu, p.nic) for p in plan.pairs] == [(other, "mlx5_1")]   # ordinal 1 -> bus id
    host_only = bench.bench_plan(settings(memory_kinds=("host",)), facts, (), ("mlx5_0",), 30.0)
    assert [(p.gpu, p.nic) for p in host_only.pairs] == [("", "mlx5_0")]
    nothing_known = MachineFacts(GpuFacts(None, ()), {})
    assert bench.bench_plan(settings(), nothing_known, (), ("rxe0",), 30.0).pairs == (
        bench.PairPlan("0", "rxe0", "no NCCL NIC decision for GPU 0: every NIC"),)
    with pytest.raises(UsageError, match="memory kinds gpu"):
        bench.bench_plan(settings(memory_kinds=("gpu",)), facts, (), ("mlx5_0",), 30.0)
    with pytest.raises(UsageError, match="NCCL pairs no GPU with mlx5_9"):
        bench.bench_plan(settings(), facts, (), ("mlx5_9",), 30.0)
    with pytest.raises(UsageError, match="QPs must be"):
        bench.bench_plan(settings(qps=(1, 100000)), facts, (), ("mlx5_0",), 30.0)
    with pytest.raises(UsageError, match="threshold 2 must be over 0 and at most 1"):
        bench.bench_plan(settings(threshold=2), facts, (), ("mlx5_0",), 30.0)


@pytest.mark.parametrize("module, require, extra", [
    ("matplotlib", outputs.require_matplotlib, "gdrprobe[plot]"),
    ("prometheus_client", outputs.require_prometheus, "gdrprobe[prometheus]"),
])
def test_a_missing_optional_library_names_its_extra(monkeypatch, module, require, extra):
    monkeypatch.setitem(sys.modules, module, None)      # as if not installed
    with pytest.raises(MissingDependency) as raised:
        require()
    assert extra in raised.value.fix and raised.value.exit_code == 3


def test_a_broken_gpu_data_path_is_the_pairs_answer():
    corrupt = IntegrityError("payload corrupted at 65536 B on the server", "check ACS")
    report, calls = sweep(peermem_error=corrupt, gpu_factor=0.5)
    peermem = [r for r in report.rows if r.memory == "peermem"]
    assert {r.outcome for r in peermem} == {"data path broken"}
    assert sum(run.memory == "peermem" for run in calls) == 1
    assert report.pairs[0].verdict.classification == "degraded"   # dmabuf ran at 0.5


# ---- the command: output paths before measuring, rows as they are measured ----------------


def bench_command(monkeypatch, on_each_row=lambda: None):
    """gdrprobe.bench replaced by the recorded sweep, each row handed to on_row as the
    engine does (with its ratios); returns the rows the sweep was asked for."""
    import gdrprobe

    report, _ = sweep()
    asked = []

    def fake_bench(on_row, **arguments):
        asked.append(arguments)
        for done, row in enumerate(report.rows, 1):
            on_row(row, done, len(report.rows))
            on_each_row()
        return report
    monkeypatch.setattr(gdrprobe, "bench", fake_bench)
    return report, asked


@pytest.mark.parametrize("flag, path", [
    ("-o", "missing/sweep.json"), ("--csv", "missing/sweep.csv"),
    ("--prometheus", "missing/gdrprobe.prom"), ("--plot", "missing/plots/here"),
    ("-o", "."), ("--csv", "a-file/sweep.csv")])
def test_every_output_path_is_checked_before_anything_is_measured(flag, path, tmp_path,
                                                                  monkeypatch, capsys):
    from gdrprobe.cli import main

    _, asked = bench_command(monkeypatch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("")
    assert main(["bench", flag, path]) == 2
    assert asked == []                                  # the sweep never started
    error = capsys.readouterr().err
    assert "nothing was measured" in error and "fix:" in error


def test_rows_are_printed_as_they_are_measured_through_a_pipe(monkeypatch, capsys, tmp_path):
    """stdout here is no terminal (capsys): each row is out before the next is measured,
    with its GPU/host ratio; the summary follows without repeating them; files at the end."""
    from gdrprobe.cli import main

    printed = []
    report, _ = bench_command(monkeypatch, lambda: printed.append(capsys.readouterr().out))
    assert main(["bench", "--csv", str(tmp_path / "sweep.csv")]) == 0
    summary = capsys.readouterr().out
    assert len(printed) == len(report.rows) and all(printed)
    assert printed[0].splitlines()[0] == outputs.BANDWIDTH_HEADER
    first = printed[0].splitlines()[1].split()
    assert first[:5] + first[-3:] == ["-", "mlx5_0", "host", "1", "4096", "-", "20%", "measured"]
    latency_start = [i for i, text in enumerate(printed) if outputs.LATENCY_HEADER in text]
    assert len(latency_start) == 1                       # a header where the mode changes
    dmabuf = next(text for text in printed if " dmabuf " in text)
    assert " 0.95 " in dmabuf                            # the ratio, as it is measured
    assert "rows in 3.0 s" in summary and " dmabuf " not in summary
    assert (tmp_path / "sweep.csv").exists()


def test_the_streamed_rows_are_the_table_render_bench_prints():
    report, _ = sweep()
    table = outputs.BenchTable()
    streamed = [line for row in report.rows for line in table.lines(row)]
    assert outputs.render_bench(report).startswith(
        outputs.RULE + "\n" + "\n".join(streamed) + "\n" + outputs.RULE)


def test_the_engine_hands_each_row_over_with_its_ratios():
    seen = []
    report = bench.ratios_as_measured(lambda row, done, total: seen.append(row),
                                      {"mlx5_0": 100.0})
    execute, _ = execute_with()
    bench.run_sweep(PLAN, execute, report)
    assert seen == bench.with_ratios(seen, {"mlx5_0": 100.0})
    assert any(row.gpu_host_ratio == pytest.approx(0.95) for row in seen)


def test_a_pattern_sweep_runs_ncclS_steps_and_each_row_gets_its_pattern():
    from gdrprobe.report.model import DeviceInfo, PortInfo
    from gdrprobe.report.nccl_pattern import NcclPatternResult, StepPhases
    from gdrprobe.report.model import Integrity

    facts = MachineFacts(GpuFacts((GPU,), (GPU,)), {GPU: NicChoice("mlx5_0", "NCCL: PIX")})
    port = PortInfo(1, "ACTIVE", "LINK_UP", "InfiniBand", 4096, 4096, "100.0 Gbps", "4X", 400.0,
                    0, ())
    listed = {"mlx5_0": DeviceInfo("mlx5_0", "", "InfiniBand", "CA", "", 0, 0, (port,))}
    plan = bench.bench_plan(settings(sizes_bytes=(), pattern="nccl"), facts, (), ("mlx5_0",),
                            30.0, listed)
    assert plan.options.sizes == (131072, 524288)
    shaped = plan.run_options(plan.runs()[0])
    assert shaped.pattern == "nccl" and shaped.nccl.channels == 4 and shaped.nccl.adaptive_routing
    alone = StepPhases(100.0, 10.0, 90.0, 0.0)
    found = NcclPatternResult(131072, 4, 1, False, True, 8, 100, 1.0, 20.0, 5.0, alone, alone,
                              83.9, Integrity(True, 1, 0, None, 0, None))
    row = bench.measured_row(plan.runs()[0], bw(131072, 21.0), nccl=found,
                             transport=plan.transport)
    assert (row.nccl_gbps, row.nccl_answer) == (20.0, "sustains")
    assert "NCCL pattern 20.0" in outputs.BenchTable().lines(row)[-1]


def test_the_port_a_run_uses_is_the_one_of_its_number_not_the_first_listed():
    from gdrprobe.campaign import nccl_pattern
    from gdrprobe.report.model import DeviceInfo, PortInfo

    def port(number, link_layer, rate):
        return PortInfo(number, "ACTIVE", "LINK_UP", link_layer, 4096, 4096, "", "4X", rate, 0, ())

    device = DeviceInfo("mlx5_0", "", "InfiniBand", "CA", "", 0, 0,
                        (port(1, "Ethernet", 100.0), port(2, "InfiniBand", 400.0)))
    assert bench.port_rate(device, 2) == 400.0
    assert nccl_pattern.port_of(device, 2) == (True, 400.0)
    assert nccl_pattern.port_of(device, 1) == (False, 100.0)
    assert bench.port_rate(device, 3) is None and nccl_pattern.port_of(device, 3) == (False, None)
    assert nccl_pattern.port_of(None, 1) == (False, None)
