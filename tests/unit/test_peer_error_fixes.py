"""A message this gdrprobe cannot take from its peer is an error that says what to do about
it, not only what was wrong: whatever the field or message, the fix is to run the same
gdrprobe version at both ends."""

from __future__ import annotations

import pytest

from gdrprobe.errors import PeerError
from gdrprobe.protocol.channel import parse_message
from gdrprobe.protocol.fields import SAME_VERSION_FIX, field, int_list
from gdrprobe.protocol.handshake import hex_field
from gdrprobe.protocol.messages import address_from_message, findings_from_message

ADDRESS = {"gid": "fe80:0000:0000:0000:0000:0000:0000:0001", "lid": 0, "mtu": 1024,
           "qp_numbers": [17], "psns": [5]}


@pytest.mark.parametrize("read", [
    lambda: field({"type": "start"}, "size", int),
    lambda: field({"size": "64"}, "size", int),
    lambda: field({"size": float("nan")}, "size", float),
    lambda: field({"text": "x" * 5000}, "text", str),
    lambda: field({"size": 10}, "size", int, low=64),
    lambda: int_list({"qps": []}, "qps", low=1, high=10, max_items=4),
    lambda: hex_field({"nonce": "zz"}, "nonce", 32),
    lambda: hex_field({"nonce": "ab"}, "nonce", 32),
    lambda: parse_message(b'{"no": "type"}', "server"),
    lambda: address_from_message({**ADDRESS, "mtu": 1000}),
    lambda: address_from_message({**ADDRESS, "psns": [5, 6]}),
    lambda: address_from_message({**ADDRESS, "gid": "not a gid"}),
    lambda: findings_from_message({"findings": ["not a finding"]}),
    lambda: findings_from_message({"findings": [{"status": "owned"}]}),
])
def test_a_message_this_version_cannot_take_says_to_run_the_same_version(read):
    with pytest.raises(PeerError) as raised:
        read()
    assert raised.value.fix == SAME_VERSION_FIX
