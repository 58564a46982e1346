"""The settings a client asks for, as the server re-checks them."""

import pytest

from gdrprobe.errors import PeerError, UsageError
from gdrprobe.measure.options import SWEEP_SIZES, ProbeOptions


def test_defaults_and_sweep():
    options = ProbeOptions()
    assert options.sizes == (65536,) and options.buffer_bytes == 2 * 65536
    assert SWEEP_SIZES[0] == 2 and SWEEP_SIZES[-1] == 8 << 20 and len(SWEEP_SIZES) == 23
    assert ProbeOptions(sizes=(5000,)).buffer_bytes == 2 * 8192


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
])
def test_impossible_settings_are_usage_errors(changes, text):
    with pytest.raises(UsageError, match=text):
        ProbeOptions(**changes)


def test_a_hostile_message_is_refused():
    message = ProbeOptions().to_message()
    for key, value in (("sizes", [1 << 40]), ("iterations", "many"), ("qps", True),
                       ("sizes", list(range(1, 100)))):
        with pytest.raises((PeerError, UsageError)):
            ProbeOptions.from_message(message | {key: value})
