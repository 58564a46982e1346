"""The settings a client asks for, as the server re-checks them."""

import pytest

from gdrprobe.errors import PeerError, UsageError
from gdrprobe.measure.options import SWEEP_SIZES, ProbeOptions


def test_defaults_and_sweep():
    options = ProbeOptions()
    # 64 slots of 64 KiB (the 4 MiB cap) and one message past them
    assert options.sizes == (65536,) and options.buffer_bytes == 65 * 65536
    assert SWEEP_SIZES[0] == 2 and SWEEP_SIZES[-1] == 8 << 20 and len(SWEEP_SIZES) == 23
    assert ProbeOptions(sizes=(5000,), iterations=1).buffer_bytes == 2 * 8192
    assert ProbeOptions(mode="latency", sizes=(5000,), tx_depth=1,
                        cq_moderation=1).buffer_bytes == 2 * 8192


def test_integrity_slots_are_bounded_and_cover_short_rounds():
    from gdrprobe.measure.options import INTEGRITY_CAP_BYTES, MAX_SLOTS

    assert ProbeOptions(iterations=10).slots(65536) == 10                  # every message
    assert ProbeOptions(iterations=10, qps=2, warmup_iterations=5).slots(4096) == 30
    assert ProbeOptions().slots(65536) == INTEGRITY_CAP_BYTES // 65536     # the last 64
    assert ProbeOptions(iterations=5000).slots(2) == MAX_SLOTS
    assert ProbeOptions(sizes=(8 << 20,)).slots(8 << 20) == 1
    assert ProbeOptions(duration_s=1).slots(4096) == MAX_SLOTS
    sweep = ProbeOptions(sizes=SWEEP_SIZES, iterations=20)
    assert sweep.buffer_bytes == 16 << 20       # as before: 8 MiB and 8 MiB past it


def test_round_trip_through_a_message():
    options = ProbeOptions(mode="latency", sizes=(2, 64), iterations=10, tx_depth=1,
                           cq_moderation=1)
    assert ProbeOptions.from_message(options.to_message()) == options


@pytest.mark.parametrize("changes, text", [
    ({"mode": "read"}, "mode"),
    ({"sizes": (0,)}, "sizes"),
    ({"tx_depth": 8, "cq_moderation": 16}, "CQ moderation"),
    ({"qps": 0}, "QPs"),
    ({"post_list": 65}, "post list"),
    ({"mtu": 1500}, "MTU"),
    ({"mode": "latency", "sizes": (1,)}, "at least 2 bytes"),
    ({"mode": "latency", "qps": 2}, "one QP"),
    ({"duration_s": -1}, "duration"),
    ({"window_bytes": 1 << 20}, "window bytes .* fixed duration"),
    ({"duration_s": 1, "window_bytes": 0}, "window bytes"),
])
def test_impossible_settings_are_usage_errors(changes, text):
    with pytest.raises(UsageError, match=text):
        ProbeOptions(**changes)


def test_a_window_bounded_in_bytes_counts_whole_messages_and_crosses_the_wire():
    options = ProbeOptions(sizes=(1 << 20,), duration_s=1.0, window_bytes=65536 * 5000)
    assert options.window_messages(1 << 20) == 313          # 312.5 rounded up
    assert options.window_messages(65536) == 5000
    assert ProbeOptions(duration_s=1.0).window_messages(65536) == 0   # time alone
    assert ProbeOptions.from_message(options.to_message()) == options
    # A peer of an earlier version sends no window_bytes: time alone ends its windows.
    older = {k: v for k, v in options.to_message().items() if k != "window_bytes"}
    assert ProbeOptions.from_message(older).window_bytes is None


def test_a_hostile_message_is_refused():
    message = ProbeOptions().to_message()
    for key, value in (("sizes", [1 << 40]), ("iterations", "many"), ("qps", True),
                       ("sizes", list(range(1, 100))), ("window_bytes", 1 << 60)):
        with pytest.raises((PeerError, UsageError)):
            ProbeOptions.from_message(message | {key: value})


@pytest.mark.parametrize("changes, text", [
    ({"iterations": 0}, "iterations"), ({"sizes": (0,)}, "sizes"),
    ({"cq_moderation": 0}, "CQ moderation"), ({"tx_depth": 0}, "TX depth"),
    ({"timeout_s": float("nan")}, "time-out"), ({"timeout_s": 1}, "time-out must be 5"),
    ({"duration_s": float("inf")}, "duration"), ({"warmup_s": float("nan")}, "warm-up"),
])
def test_zero_negative_and_non_finite_values_are_refused(changes, text):
    with pytest.raises(UsageError, match=text):
        ProbeOptions(**changes)


def test_watchdog_grows_with_what_is_in_flight():
    from gdrprobe.measure.loops import (STALL_FLOOR_S, bandwidth_in_flight, latency_in_flight,
                                        stall_timeout_s)

    # the lab demo: 20 writes of 8 MiB, only the last signalled, on a 2.5 Gb/s port
    in_flight = bandwidth_in_flight(8 << 20, 1, 128, 20)
    assert in_flight == 20 * (8 << 20)
    assert stall_timeout_s(in_flight, 2.5) == pytest.approx(10 + 100 * in_flight / 312.5e6)
    assert stall_timeout_s(in_flight, 2.5) > 14 * 4     # it needed 14 s in the lab
    # a fast port and a default run: the floor
    assert stall_timeout_s(bandwidth_in_flight(65536, 1, 128, 1000), 100.0) < STALL_FLOOR_S + 1
    # unknown rate: the slowest rate verbs names; duration mode: the whole tx depth
    assert stall_timeout_s(1 << 20, None) == stall_timeout_s(1 << 20, 2.5)
    assert bandwidth_in_flight(4096, 2, 64, None) == 4096 * 2 * 64
    assert latency_in_flight(8) == 16


def test_queue_depths_are_checked_against_the_device_limits_by_name():
    from types import SimpleNamespace

    from gdrprobe.rdma.endpoint import EndpointOptions, check_queue_limits

    rxe = SimpleNamespace(max_qp_wr=16384, max_cqe=32767, max_qp=1048576)
    check_queue_limits("rxe0", rxe, EndpointOptions(num_qps=1, tx_depth=16384))
    with pytest.raises(UsageError, match="32769 completion entries is over rxe0's max_cqe 32767"):
        check_queue_limits("rxe0", rxe, EndpointOptions(num_qps=2, tx_depth=16384))
    small = SimpleNamespace(max_qp_wr=64, max_cqe=4096, max_qp=1)
    with pytest.raises(UsageError, match="max_qp_wr 64.*max_qp 1"):
        check_queue_limits("mlx5_0", small, EndpointOptions(num_qps=2, tx_depth=128))
