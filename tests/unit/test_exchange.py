"""The out-of-band protocol over a local socket pair: framing, bounds, authentication."""

import socket
import struct
import threading
import time

import pytest

from gdrprobe.errors import PeerError
from gdrprobe.protocol.channel import (HEADER, MAX_MESSAGE_BYTES, Channel,
                                       authenticate_as_client, authenticate_as_server)
from gdrprobe.protocol.fields import field, int_list


def tcp_pair():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        left = socket.create_connection(listener.getsockname())
        right, _ = listener.accept()
    return left, right


@pytest.fixture
def pair():
    left, right = tcp_pair()
    a, b = Channel(left, 2.0, "server"), Channel(right, 2.0, "client")
    yield a, b
    a.close()
    b.close()


def test_messages_round_trip(pair):
    a, b = pair
    a.send("start", size=64, round=3)
    assert b.receive("start") == {"type": "start", "size": 64, "round": 3}


def test_unexpected_type_and_peer_error_and_abort(pair):
    a, b = pair
    a.send("bye")
    with pytest.raises(PeerError, match="'bye' where start was expected"):
        b.receive("start")
    a.send("error", reason="wrong token", fix="give the token")
    with pytest.raises(PeerError, match="reported: wrong token") as caught:
        b.receive("start")
    assert caught.value.fix == "give the token"
    a.send("abort", reason="interrupted")
    with pytest.raises(PeerError, match="gave up: interrupted"):
        b.receive("done")


@pytest.mark.parametrize("raw, message", [
    (b"HTTP/1.1 200 OK\r\n\r\n", "does not speak the gdrprobe protocol"),
    (HEADER.pack(b"GDRP", 9, 2) + b"{}", "speaks protocol 9"),
    (HEADER.pack(b"GDRP", 1, MAX_MESSAGE_BYTES + 1), "the limit is"),
    (HEADER.pack(b"GDRP", 1, 3) + b"{x}", "not JSON"),
    (HEADER.pack(b"GDRP", 1, 2) + b"[]", "without a type"),
])
def test_bad_bytes_are_refused(pair, raw, message):
    a, b = pair
    a.sock.sendall(raw)
    with pytest.raises(PeerError, match=message):
        b.receive("start")


def test_silence_times_out_and_hang_up_is_reported(pair):
    a, b = pair
    with pytest.raises(PeerError, match="did not answer within 0.2 s"):
        b.receive("start", timeout=0.2)
    a.sock.shutdown(socket.SHUT_WR)
    with pytest.raises(PeerError, match="closed the connection"):
        b.receive("start")
    assert b.peer_gone()


def test_a_half_sent_header_is_bounded_by_the_timeout(pair):
    a, b = pair
    a.sock.sendall(struct.pack(">4s", b"GDRP"))
    with pytest.raises(PeerError, match="did not answer"):
        b.receive("start", timeout=0.3)


@pytest.mark.parametrize("value, kind, low, high, ok", [
    (5, int, 0, 10, True), (True, int, 0, 10, False), ("5", int, 0, 10, False),
    (11, int, 0, 10, False), (-1, int, 0, 10, False), (2.5, (int, float), 0, 3, True),
    ("x" * 5000, str, None, None, False),
])
def test_field_checks_type_and_bounds(value, kind, low, high, ok):
    if ok:
        assert field({"type": "t", "f": value}, "f", kind, low=low, high=high) == value
    else:
        with pytest.raises(PeerError):
            field({"type": "t", "f": value}, "f", kind, low=low, high=high)


def test_int_list_bounds_length_and_items():
    assert int_list({"v": [1, 2]}, "v", low=1, high=5, max_items=4) == [1, 2]
    for bad in ([], [1] * 5, [0], ["1"], "12"):
        with pytest.raises(PeerError):
            int_list({"v": bad}, "v", low=1, high=5, max_items=4)


def authenticate(server_token: str, client_token: str):
    left, right = tcp_pair()
    server, client = Channel(left, 2.0, "client"), Channel(right, 2.0, "server")
    outcome = {}

    def serve():
        try:
            authenticate_as_server(server, server_token)
            outcome["server"] = "ok"
        except PeerError as error:
            outcome["server"] = str(error)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        authenticate_as_client(client, client_token)
        outcome["client"] = "ok"
    except PeerError as error:
        outcome["client"] = str(error)
        client.send("abort", reason=error.cause)
    thread.join()
    server.close()
    client.close()
    return outcome


def test_matching_tokens_authenticate_both_ways():
    assert authenticate("token-123456", "token-123456") == {"server": "ok", "client": "ok"}


def test_a_client_with_another_token_is_refused_and_learns_nothing():
    outcome = authenticate("token-123456", "token-654321")
    assert "token" in outcome["client"] and "token" in outcome["server"]


def test_server_reveals_no_proof_before_the_client_proves_the_token():
    """A raw client without the token: the challenge carries no proof to test guesses
    against, and a forged proof gets an error, never a welcome."""
    import hashlib
    import hmac

    left, right = tcp_pair()
    server, raw = Channel(left, 2.0, "client"), Channel(right, 2.0, "server")
    outcome = {}

    def serve():
        try:
            authenticate_as_server(server, "token-123456")
        except PeerError as error:
            outcome["error"] = error

    thread = threading.Thread(target=serve)
    thread.start()
    raw.send("hello", nonce="ab" * 32)
    challenge = raw.receive("challenge")
    assert set(challenge) == {"type", "nonce"}
    forged = hmac.new(b"guess-000000", b"client", hashlib.sha256).hexdigest()
    raw.send("auth", proof=forged)
    reply = raw.receive("error")
    assert reply["reason"] == "wrong token"
    thread.join()
    assert "wrong token" in outcome["error"].cause
    server.close()
    raw.close()


@pytest.mark.parametrize("proof", ["zz" * 32, "ab" * 31, "é" * 64])
def test_malformed_proofs_are_peer_errors(pair, proof):
    a, b = pair
    a.send("auth", proof=proof)
    message = b.receive("auth")
    from gdrprobe.protocol.channel import _proof_matches

    with pytest.raises(PeerError):
        _proof_matches(message, "00" * 32)


def test_a_peer_trickling_bytes_is_as_slow_as_a_silent_one(pair):
    a, b = pair

    def trickle():
        for byte in HEADER.pack(b"GDRP", 1, 4):
            try:
                a.sock.sendall(bytes([byte]))
            except OSError:
                return
            time.sleep(0.1)

    sender = threading.Thread(target=trickle)
    sender.start()
    started = time.monotonic()
    with pytest.raises(PeerError, match="did not answer within 0.5 s"):
        b.receive("start", timeout=0.5)
    assert time.monotonic() - started < 0.9   # one deadline for the message, not per byte
    sender.join()


def test_deeply_nested_json_is_refused(pair):
    a, b = pair
    payload = b"[" * 100000 + b"]" * 100000
    a.sock.sendall(HEADER.pack(b"GDRP", 1, len(payload) if len(payload) <= 65536 else 65536)
                   + payload[:65536])
    with pytest.raises(PeerError):
        b.receive("start")
