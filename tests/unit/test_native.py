"""The C helpers through their Cython wrapper: clock, statistics, payload pattern, host memory."""

import pytest

from gdrprobe import _native as native


def test_clock_is_monotonic_and_in_nanoseconds():
    first = native.now_ns()
    second = native.now_ns()
    assert second >= first
    assert first > 10**9  # nanoseconds since boot, not seconds


def test_latency_summary_percentiles_use_nearest_rank():
    samples = list(range(1, 1001))  # 1..1000 ns
    summary = native.latency_summary(list(reversed(samples)))
    assert summary["samples"] == 1000
    assert summary["min_ns"] == 1
    assert summary["max_ns"] == 1000
    assert summary["median_ns"] == 500.5
    assert summary["mean_ns"] == 500.5
    assert summary["p99_ns"] == 990
    assert summary["p999_ns"] == 999


def test_latency_summary_of_one_sample_and_of_none():
    assert native.latency_summary([7])["p99_ns"] == 7
    assert native.latency_summary([7])["stdev_ns"] == 0
    with pytest.raises(ValueError):
        native.latency_summary([])


@pytest.fixture
def buffer():
    addr, mapped = native.host_alloc(10000)
    yield addr, mapped
    native.host_free(addr, mapped)


def test_host_alloc_is_page_aligned_and_zeroed(buffer):
    addr, mapped = buffer
    assert addr % 4096 == 0
    assert mapped == 12288
    assert native.read_bytes(addr, 16) == bytes(16)


def test_pattern_round_trip_and_seed_depends_on_size_and_round(buffer):
    addr, _ = buffer
    seed = native.pattern_seed(4099, 3)
    assert seed not in (native.pattern_seed(4098, 3), native.pattern_seed(4099, 4))
    native.pattern_fill(addr, 4099, seed)
    assert native.pattern_verify(addr, 4099, seed) == (0, -1)
    assert native.pattern_verify(addr, 4099, native.pattern_seed(4099, 4))[0] > 4000


def test_pattern_verify_reports_first_bad_offset_and_count(buffer):
    addr, _ = buffer
    seed = native.pattern_seed(9000, 1)
    native.pattern_fill(addr, 9000, seed)
    for offset in (8997, 4242, 4243):   # one in the tail bytes, two in one word
        corrupt = bytes([native.read_bytes(addr + offset, 1)[0] ^ 0xFF])
        native.write_bytes(addr + offset, corrupt)
    assert native.pattern_verify(addr, 9000, seed) == (3, 4242)


def test_poison_detects_stray_writes(buffer):
    addr, _ = buffer
    native.poison_fill(addr, 1000)
    assert native.poison_verify(addr, 1000) == (0, -1)
    native.write_bytes(addr + 700, b"\x00")
    assert native.poison_verify(addr, 1000) == (1, 700)


def test_host_alloc_failure_is_an_oserror():
    with pytest.raises(OSError):
        native.host_alloc(1 << 50)


def test_stop_flag():
    flag = native.StopFlag()
    assert not flag.is_set
    flag.set()
    assert flag.is_set
    flag.clear()
    assert not flag.is_set
