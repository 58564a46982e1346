"""The engine on real rxe in one guest: loopback in one process and in two processes."""

import json
import re
import time

from tests.lab.helpers import gdrprobe, gdrprobe_json, rdma_resources
from tests.lab.loopback.conftest import TOKEN

SWEEP = [1 << k for k in range(1, 24)]


def assert_all_verified(rows):
    for row in rows:
        integrity = row["integrity"]
        assert integrity["checked"] and integrity["bad_bytes"] == 0, row
        assert integrity["stray_bytes"] == 0, row


def test_loopback_full_sweep_verifies_every_size(baseline):
    report = gdrprobe_json("run", "--loopback", "-a", "-n", "4")
    assert report["kind"] == "run" and report["settings"]["mode"] == "bandwidth"
    rows = report["bandwidth"]
    assert [r["size_bytes"] for r in rows] == SWEEP
    assert_all_verified(rows)
    assert all(r["iterations"] == 4 and r["bandwidth_avg_gbps"] > 0 for r in rows)
    assert report["handle_route"] == "layout"
    assert rdma_resources() == baseline


def test_loopback_latency(baseline):
    report = gdrprobe_json("run", "--loopback", "--latency", "-s", "64", "-n", "200")
    row = report["latency"][0]
    assert row["iterations"] == 200
    assert 0 < row["latency_us_min"] <= row["latency_us_median"] <= row["latency_us_p99"]
    assert row["latency_us_p99"] <= row["latency_us_p999"] <= row["latency_us_max"]
    assert_all_verified(report["latency"])
    assert rdma_resources() == baseline


def test_each_clock_times_the_loops_and_the_report_names_it(baseline):
    """The guest's kernel distrusts the TSC (TCG: no invariant-TSC flag), so auto falls back
    to CLOCK_MONOTONIC and says why; counter reads the TSC anyway and its runs pass the
    cross-check against CLOCK_MONOTONIC, so they keep it."""
    clocks = {}
    for choice in ("auto", "counter", "monotonic"):
        latency = gdrprobe_json("run", "--loopback", "--latency", "-s", "8", "-n", "300",
                                "--clock", choice)
        bandwidth, lived_s = lifetime(gdrprobe_json, "run", "--loopback", "-s", "65536",
                                      "-D", "0.5", "--warmup", "0.2", "--clock", choice)
        # Each process calibrates the counter itself: the same clock, its rate read anew.
        assert calibration_masked(latency) == calibration_masked(bandwidth)
        clocks[choice] = latency["settings"]["clock"]
        row = latency["latency"][0]
        assert 0 < row["latency_us_min"] <= row["latency_us_median"] <= row["latency_us_max"]
        # No shorter than its 0.5 s window (less a margin for the calibration), and no
        # longer than its process lived
        assert 0.4 <= bandwidth["bandwidth"][0]["elapsed_s"] <= lived_s
    assert clocks["auto"] == ("CLOCK_MONOTONIC (the kernel does not report the TSC "
                              "constant_tsc and nonstop_tsc)")
    assert clocks["counter"].startswith("TSC at ")
    assert "calibrated against CLOCK_MONOTONIC" in clocks["counter"]
    assert clocks["monotonic"] == "CLOCK_MONOTONIC (asked for)"
    assert rdma_resources() == baseline


def test_loopback_several_qps_post_lists_and_moderation():
    report = gdrprobe_json("run", "--loopback", "-s", "4096", "-n", "64", "-q", "4",
                           "-t", "32", "-Q", "8", "-l", "4")
    row = report["bandwidth"][0]
    assert row["iterations"] == 4 * 64   # perftest's convention: iterations x QPs
    assert len(report["local"]["qp_numbers"]) == 4
    assert_all_verified(report["bandwidth"])


def test_duration_mode_excludes_warmup():
    report, lived_s = lifetime(gdrprobe_json, "run", "--loopback", "-s", "65536", "-D", "1",
                               "--warmup", "0.3")
    row = report["bandwidth"][0]
    assert report["settings"]["duration_s"] == 1
    # The measured window: at least its 1 s, and not the 0.3 s of warm-up its process spent
    assert 0.9 <= row["elapsed_s"] <= lived_s - 0.3
    assert row["iterations"] > 0
    assert_all_verified(report["bandwidth"])


def test_a_window_bounded_in_bytes_ends_before_its_time():
    report = gdrprobe_json("run", "--loopback", "-s", "65536", "-D", "30", "--warmup", "20",
                           "--window-bytes", str(4 << 20))
    row = report["bandwidth"][0]
    assert report["settings"]["window_bytes"] == 4 << 20
    assert row["iterations"] >= 64          # 4 MiB of 64 KiB messages, whole completions
    assert row["elapsed_s"] < 30            # the bytes ended the window, not the 30 s
    assert_all_verified(report["bandwidth"])


def test_two_processes_on_one_host_and_server_serves_runs_one_after_another(server, baseline):
    for _ in range(2):
        report = gdrprobe_json("run", "127.0.0.1", "--token", TOKEN, "-s", "1024", "-n", "50")
        assert report["remote"]["memory"]["kind"] == "host"
        assert_all_verified(report["bandwidth"])
    latency = gdrprobe_json("run", "127.0.0.1", "--token", TOKEN, "--latency", "-n", "50")
    assert latency["latency"][0]["iterations"] == 50
    assert rdma_resources() == baseline


def test_table_output_looks_like_perftest():
    done = gdrprobe("run", "--loopback", "-s", "8192", "-n", "20", "--report-gbits", check=True)
    assert "#bytes" in done.stdout and "BW average[Gb/sec]" in done.stdout
    assert " 8192 " in done.stdout and " ok" in done.stdout


def test_json_schema_has_units_in_field_names():
    report = gdrprobe_json("run", "--loopback", "-s", "2048", "-n", "10")
    assert report["schema_version"] == 1
    row = report["bandwidth"][0]
    assert set(row) >= {"size_bytes", "bandwidth_avg_gbps", "bandwidth_peak_gbps",
                        "bandwidth_avg_mib_s", "message_rate_mpps", "elapsed_s"}
    json.dumps(report)


def test_inline_messages_in_both_modes():
    small = gdrprobe_json("run", "--loopback", "-s", "32", "-n", "100", "-I", "64")
    assert_all_verified(small["bandwidth"])
    plain = gdrprobe_json("run", "--loopback", "--latency", "-s", "64", "-n", "50", "-I", "0")
    assert plain["latency"][0]["iterations"] == 50


def lifetime(call, *args):
    """call(*args), and the seconds it took as this test saw them: a time a run reports
    cannot be longer than its process lived."""
    started = time.monotonic()
    outcome = call(*args)
    return outcome, time.monotonic() - started


def calibration_masked(report: dict) -> str:
    """The clock a run used, without the rate its process calibrated."""
    return re.sub(r"[\d.]+ MHz", "N MHz", report["settings"]["clock"])
