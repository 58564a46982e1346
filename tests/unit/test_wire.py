"""What a peer sends about its endpoint and buffer is checked before verbs sees it."""

import pytest

from gdrprobe.errors import PeerError
from gdrprobe.protocol.messages import RemoteBuffer, address_from_message, integrity_from_message

GOOD = {"gid": "0000:0000:0000:0000:0000:ffff:0a4d:0002", "lid": 0, "mtu": 4096,
        "qp_numbers": [17, 18], "psns": [1, 2]}


def test_a_good_address():
    address = address_from_message(GOOD)
    assert address.qp_numbers == (17, 18) and address.mtu == 4096


@pytest.mark.parametrize("change", [
    {"mtu": 1000}, {"mtu": "4096"}, {"gid": "not-a-gid"}, {"gid": 7}, {"lid": 1 << 20},
    {"qp_numbers": [1 << 24]}, {"psns": [-1]}, {"qp_numbers": list(range(1, 100))},
])
def test_a_bad_address_is_a_peer_error(change):
    with pytest.raises(PeerError):
        address_from_message(GOOD | change)


def test_buffer_and_integrity_bounds():
    assert RemoteBuffer.from_message({"address": 4096, "rkey": 5, "length": 8192}).rkey == 5
    with pytest.raises(PeerError):
        RemoteBuffer.from_message({"address": -1, "rkey": 5, "length": 8192})
    verified = {"bytes_checked": 10, "bad_bytes": 1, "first_bad_offset": 3, "stray_bytes": 0,
                "first_stray_offset": -1, "messages_checked": 4, "messages_total": 20,
                "bad_messages": 1}
    report = integrity_from_message(verified)
    assert report.first_bad_offset == 3 and report.first_stray_offset is None and not report.ok
    assert report.coverage == "checked the last 4 of 20 messages"
    for bad in ({"messages_checked": 21}, {"bad_messages": 5 * 10}, {"messages_total": 0}):
        with pytest.raises(PeerError):
            integrity_from_message(verified | bad)


@pytest.mark.parametrize("gid", ["::1", "fe80::1", "0000:0000:0000:0000:0000:ffff:0a4d:02",
                                 "0000:0000:0000:0000:0000:ffff:0a4d:000g",
                                 "0000:0000:0000:0000:0000:ffff:0a4d:0002:0000"])
def test_a_gid_verbs_would_refuse_is_refused_here(gid):
    """pyverbs' GID() takes 8 groups of 4 hex digits only; '::1' passes ipaddress."""
    with pytest.raises(PeerError, match="form verbs takes"):
        address_from_message(GOOD | {"gid": gid})
