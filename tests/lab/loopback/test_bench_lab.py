"""The sweep and the prelaunch gate on rxe0 in one guest: real runs, no GPU, no CUDA driver.

The sweep measures host memory for real; the GPU kinds end "not testable" (no CUDA driver)
after one attempt each and stay in the report as rows. ``gdrprobe check`` finds no GPU and no
PCI NIC, says so, measures the host arm once and exits 9.
"""

import csv
import json
import signal
import subprocess
import sys
import time

import pytest

import gdrprobe
from gdrprobe import defaults
from gdrprobe.errors import PeerError
from gdrprobe.report import bench as outputs
from tests.lab.helpers import REPO, Server, gdrprobe as run_cli, rdma_resources
from tests.lab.loopback.conftest import TOKEN

SWEEP = ("--sizes", "4K,64K", "--qp", "1,2", "--mem", "host,dmabuf,staged", "-n", "200",
         "--latency-iters", "100")


def test_a_short_sweep_writes_json_csv_plots_and_prometheus(tmp_path, baseline):
    parser = pytest.importorskip("prometheus_client.parser")
    pytest.importorskip("matplotlib")
    files = {"output": tmp_path / "bench.json", "csv": tmp_path / "bench.csv",
             "plot": tmp_path / "plots", "prometheus": tmp_path / "gdrprobe.prom"}
    done = run_cli("bench", *SWEEP, *(arg for name, path in files.items()
                                      for arg in (f"--{name}", str(path))))
    assert done.returncode == 0, done.stderr
    report = json.loads(files["output"].read_text())
    assert report["kind"] == "bench" and report["environment"]["rdma_core_version"]
    assert report["devices"][0]["name"] == "rxe0"
    rows = report["rows"]
    host = [r for r in rows if r["mode"] == "bandwidth" and r["memory"] == "host"]
    assert [(r["qps"], r["size_bytes"], r["outcome"]) for r in host] == [
        (1, 4096, "measured"), (1, 65536, "measured"), (2, 4096, "measured"),
        (2, 65536, "measured")]
    rate = report["devices"][0]["ports"][0]["rate_gbps"]
    assert all(r["line_rate_fraction"] == pytest.approx(r["bandwidth_avg_gbps"] / rate)
               for r in host)
    latency = [r for r in rows if r["mode"] == "latency"]
    assert [r["outcome"] for r in latency] == ["measured"] * 2
    assert all(0 < r["latency_us_median"] <= r["latency_us_p99"] for r in latency)
    for kind in ("dmabuf", "staged"):
        kind_rows = [r for r in rows if r["memory"] == kind]
        assert len(kind_rows) == 4 and {r["outcome"] for r in kind_rows} == {"not testable"}
        assert "no CUDA driver" in kind_rows[0]["detail"]
    assert report["pairs"][0]["verdict"]["classification"] == "not testable"
    with open(files["csv"]) as handle:
        assert len(list(csv.DictReader(handle))) == len(rows)
    families = {f.name: f for f in parser.text_string_to_metric_families(
        files["prometheus"].read_text())}
    assert [(s.labels, s.value) for s in families["gdrprobe_gdr_engaged"].samples] == [
        ({"gpu": "0", "nic": "rxe0"}, 0.0)]
    assert len(families["gdrprobe_bandwidth_bytes_per_second"].samples) == 4
    for name in ("bandwidth.png", "latency.png", "matrix.png"):
        assert (files["plot"] / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert rdma_resources() == baseline


def test_the_plots_carry_the_measured_rows():
    pytest.importorskip("matplotlib")
    report = gdrprobe.bench(sizes=(4096, 65536), memory=("host",), iterations=200,
                            latency_iterations=50)
    measured = {(r.size_bytes, r.bandwidth_avg_gbps) for r in report.rows
                if r.mode == "bandwidth"}
    figure = outputs.figures(report)["bandwidth.png"]
    (line,) = figure.axes[0].lines
    assert line.get_label() == "host rxe0 1 QP"
    assert set(zip(line.get_xdata(), line.get_ydata())) == measured
    (p99,) = [line for line in outputs.figures(report)["latency.png"].axes[0].lines
              if line.get_label() == "rxe0 p99"]
    assert list(p99.get_ydata()) == [r.latency_us_p99 for r in report.rows
                                     if r.mode == "latency"]


def test_a_baseline_flags_an_injected_drop(tmp_path):
    before = tmp_path / "before.json"
    run_cli("bench", "--sizes", "64K", "--mem", "host", "-n", "200", "--no-latency",
            "--output", str(before), check=True)
    document = json.loads(before.read_text())
    document["rows"][0]["bandwidth_avg_gbps"] *= 10   # as if it had been ten times faster
    before.write_text(json.dumps(document))
    done = run_cli("bench", "--sizes", "64K", "--mem", "host", "-n", "200",
                   "--no-latency", "--baseline", str(before), "--max-drop", "0.5",
                   "--json")
    assert done.returncode == 1, done.stderr
    (change,) = json.loads(done.stdout)["baseline"]["changes"]
    assert (change["row"]["memory"], change["row"]["size_bytes"]) == ("host", 65536)
    assert change["change"] < -0.5 and change["reason"].startswith("bandwidth fell by")


def test_ctrl_c_keeps_the_rows_measured_so_far(baseline):
    sizes = ",".join(str(4096 << k) for k in range(12))     # twelve 3-second windows
    sweep = subprocess.Popen(
        [sys.executable, "-m", "gdrprobe", "bench", "--sizes", sizes, "--mem", "host", "-D", "3",
         "--warmup", "0.1", "--no-latency", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    deadline = time.monotonic() + 120
    while rdma_resources()["qp"] <= baseline["qp"] and time.monotonic() < deadline:
        time.sleep(0.5)          # until the run's QPs exist
    time.sleep(8)                # then two windows or so
    sweep.send_signal(signal.SIGINT)
    stdout, stderr = sweep.communicate(timeout=60)
    assert sweep.returncode == 130, stderr
    report = json.loads(stdout)
    assert report["interrupted"]
    assert 1 <= len(report["rows"]) < 12
    assert all(r["outcome"] == "measured" for r in report["rows"])
    assert rdma_resources() == baseline


def test_check_in_a_torchrun_rank_without_a_gpu_is_not_testable_after_one_host_run(baseline):
    # The emulated guest needs about 5 s of set-up and 3 to 10 s per run.
    done = subprocess.run([sys.executable, "-m", "gdrprobe", "check", "--json",
                           "--time-budget", "60"],
                          capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={"LOCAL_RANK": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 9, done.stderr
    report = json.loads(done.stdout)
    placement = report["placement"]
    assert placement["rank"] == "LOCAL_RANK=1" and placement["cuda_ordinal"] == 1
    assert "first RDMA device" in placement["nic_reason"]
    assert placement["elapsed_s"] <= placement["time_budget_s"] == 60
    host, gpu = report["arms"]
    assert len(host["bandwidths_gbps"]) == 1 and gpu["outcome"] == "not testable"
    assert "no CUDA driver" in gpu["detail"]
    assert rdma_resources() == baseline


@pytest.mark.parametrize("args, code, words", [
    (("-q",), 9, "(exit 9: warn)"),
    (("-q", "-d", "mlx5_9"), 4, "does not exist"),
    (("--time-budget", "2"), 2, "cannot hold one run"),
])
def test_check_exit_codes(args, code, words):
    done = run_cli("check", *args, timeout=120)
    assert done.returncode == code, done.stderr
    assert words in done.stderr and done.stdout == ""


def test_the_budget_holds_against_a_stalled_server(baseline):
    stalled = Server(TOKEN, port=18751, timeout=30.0)
    stalled.process.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        # The doctor and the set-up take seconds of the budget in a loaded guest; what is
        # left must still cover one run's shortest out-of-band time-out (5 s).
        with pytest.raises(PeerError):
            gdrprobe.check("127.0.0.1", token=TOKEN, port=18751, time_budget_s=20)
        # The 20 s budget with a generous margin, and less than a run outside the budget
        # would have waited on the stalled server: set-up, then its whole out-of-band time-out.
        assert time.monotonic() - started < defaults.TIMEOUT_S
    finally:
        stalled.process.send_signal(signal.SIGCONT)
        stalled.stop()
    assert rdma_resources() == baseline


def test_bench_bidir_rows_carry_both_directions_and_the_sum(baseline):
    """issue 31: bench -b in loopback on rxe, host memory: both sides WRITE at once, every
    message checked both ways; each row has the other direction and the sum."""
    done = run_cli("bench", "--sizes", "64K", "--mem", "host", "-n", "200",
                   "--no-latency", "-b", "--json", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (row,) = json.loads(done.stdout)["rows"]
    assert row["outcome"] == "measured" and row["reverse_gbps"] > 0
    assert row["bidir_sum_gbps"] == pytest.approx(row["bandwidth_avg_gbps"]
                                                  + row["reverse_gbps"])
    assert rdma_resources() == baseline
