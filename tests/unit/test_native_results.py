"""What the loops return: typed, immutable results; time a caller adds is accounted when
the result becomes a report row, never written into it; the latency summary sorts without
the GIL."""

import array
import dataclasses
import os
import threading
import time
import types

import pytest

from gdrprobe import _native
from gdrprobe.errors import CompletionError, ExitCode, GdrprobeError, PeerError, RdmaError
from gdrprobe.measure import loops
from gdrprobe.report.model import Integrity

CLEAN = Integrity(checked=True, bytes_checked=1, bad_bytes=0, first_bad_offset=None,
                  stray_bytes=0, first_stray_offset=None)
NO_CLOCK_CHECK = _native.ClockCheck(agreement=1.0, span_ns=0)


def bandwidth(**fields):
    values = {"status": _native.STATUS_OK, "errno": 0, "wc_status": 0, "wc_vendor_err": 0,
              "wc_qp_num": 0, "messages": 1000, "posted": 1100, "elapsed_ns": 1_000_000,
              "peak_bytes_per_s": 0.0, "passes": 0, "paused_ns": 0,
              "clock_check": NO_CLOCK_CHECK}
    return _native.BandwidthLoopResult(**values | fields)


def latency(**fields):
    values = {"status": _native.STATUS_OK, "errno": 0, "wc_status": 0, "wc_vendor_err": 0,
              "wc_qp_num": 0, "completed": 10, "bad_messages": 0, "bad_bytes": 0,
              "first_bad_offset": 0, "clock_check": NO_CLOCK_CHECK, "round_trip": None,
              "samples": None}
    return _native.LatencyLoopResult(**values | fields)


def test_results_have_named_fields_and_cannot_be_changed():
    assert [f.name for f in dataclasses.fields(_native.BandwidthLoopResult)] == [
        "status", "errno", "wc_status", "wc_vendor_err", "wc_qp_num", "messages", "posted",
        "elapsed_ns", "peak_bytes_per_s", "passes", "paused_ns", "clock_check"]
    assert [f.name for f in dataclasses.fields(_native.LatencyLoopResult)] == [
        "status", "errno", "wc_status", "wc_vendor_err", "wc_qp_num", "completed",
        "bad_messages", "bad_bytes", "first_bad_offset", "clock_check", "round_trip",
        "samples"]
    result = bandwidth(errno=5)
    assert result.errno == 5
    for target, name in ((result, "elapsed_ns"), (result.clock_check, "span_ns"),
                         (latency(), "round_trip")):
        with pytest.raises(AttributeError):
            setattr(target, name, 1)


def test_the_loops_return_typed_results():
    """Settings the C loop refuses end a run before any verbs pointer is followed, so the
    wrappers can be run without a device."""
    memory = types.SimpleNamespace(address=0x7F0000000000, lkey=1, rkey=2, length=8192)
    handles = types.SimpleNamespace(qps=(0x1000,), cq=0x2000)
    config = _native.BandwidthConfig(handles, memory, memory, msg_size=64, iterations=1,
                                     tx_depth=4, cq_mod=8, stall_timeout_ns=10**9)
    result = _native.run_bandwidth(config, _native.StopFlag())
    assert isinstance(result, _native.BandwidthLoopResult)
    assert _native.STATUS_NAMES[result.status] == "bad loop configuration"
    assert isinstance(result.clock_check, _native.ClockCheck)
    config = _native.LatencyConfig(handles, memory, memory, send_offset=4096, msg_size=64,
                                   iterations=0, initiator=True, stall_timeout_ns=10**9,
                                   seed=1)
    result = _native.run_latency(config, _native.StopFlag())
    assert isinstance(result, _native.LatencyLoopResult)
    assert _native.STATUS_NAMES[result.status] == "bad loop configuration"
    assert result.round_trip is None
    with pytest.raises(GdrprobeError, match="refused its configuration") as raised:
        loops.check_status(result, "the round", 10.0)
    assert raised.value.exit_code == ExitCode.INTERNAL          # gdrprobe's bug, not a drain


def test_staging_time_is_charged_to_the_row_not_written_into_the_result():
    result = bandwidth(messages=1000, elapsed_ns=1_000_000)
    row = loops.bandwidth_result(4096, result, CLEAN, stage_s_per_message=1e-6)
    assert row.elapsed_s == pytest.approx(0.002)               # 1 ms measured + 1000 x 1 us
    assert row.bandwidth_avg_gbps == pytest.approx(4096 * 1000 * 8 / 0.002 / 1e9)
    assert row.stage_copy_gbps == pytest.approx(4096 * 8 / 1e-6 / 1e9)
    assert result.elapsed_ns == 1_000_000
    plain = loops.bandwidth_result(4096, result, CLEAN)
    assert plain.elapsed_s == pytest.approx(0.001) and plain.stage_copy_gbps is None


def test_a_latency_row_is_half_of_each_round_trip_in_microseconds():
    samples = array.array("Q", [4000, 2000, 6000])
    row = loops.latency_result(64, 3, _native.summarize_round_trips(samples), CLEAN)
    assert (row.latency_us_min, row.latency_us_median, row.latency_us_max) == (1.0, 2.0, 3.0)
    assert row.elapsed_s == pytest.approx(12_000 / 1e9)


def test_a_failed_completion_names_its_qp_for_either_loop():
    for result in (bandwidth(status=_native.STATUS_WC, wc_status=5, wc_qp_num=0x2A),
                   latency(status=_native.STATUS_WC, wc_status=5, wc_qp_num=0x2A)):
        with pytest.raises(CompletionError) as caught:
            loops.check_status(result, "the round", 10.0)
        assert "QP 0x2a" in caught.value.evidence
    with pytest.raises(PeerError, match="stopped acknowledging"):
        loops.check_status(latency(status=_native.STATUS_WC,
                                   wc_status=loops.WC_RETRY_EXCEEDED), "the round", 10.0)
    with pytest.raises(RdmaError, match=r"ibv_post_send failed \(errno 12\)"):
        loops.check_status(bandwidth(status=2, errno=12), "the round", 10.0)
    loops.check_status(bandwidth(), "the round", 10.0)


def test_the_summary_refuses_what_is_not_uint64():
    with pytest.raises(TypeError, match="unsigned 64-bit"):
        _native.summarize_round_trips(array.array("d", [1.0]))
    with pytest.raises(ValueError, match="no samples"):
        _native.summarize_round_trips(array.array("Q"))


def test_the_latency_summary_sorts_without_the_gil():
    """While another thread sorts a few million samples, this one keeps running: with the
    GIL held through the sort it could not run at all in the middle of it."""
    samples = array.array("Q")
    samples.frombytes(os.urandom(8 * 1_000_000))
    window = {}

    def summarize():
        window["start"] = time.perf_counter()
        _native.summarize_round_trips(samples)
        window["end"] = time.perf_counter()

    sorter = threading.Thread(target=summarize)
    ran_at = []
    sorter.start()
    while sorter.is_alive():
        ran_at.append(time.perf_counter())
    sorter.join()
    span = window["end"] - window["start"]
    assert span > 0.04, "the sort was too quick to tell"
    middle = (window["start"] + span / 4, window["end"] - span / 4)
    assert any(middle[0] < moment < middle[1] for moment in ran_at)
