"""A bug in gdrprobe on the server's side of a run ends that run and reaches whoever waits
on it: `serve --once` raises it (the command line's internal error, exit 70) instead of
serving on, and a loopback run raises it instead of the client's "the server closed the
connection" (a peer error, exit 5). The server itself stays up for other clients."""

from __future__ import annotations

import socket
import threading

import pytest

from gdrprobe.measure.client import ProbeClient
from gdrprobe.measure.loopback import run_loopback
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.measure.server import ProbeServer
from gdrprobe.protocol.channel import Channel
from gdrprobe.protocol.handshake import ServerSecret, authenticate_as_client
from gdrprobe.rdma.endpoint import EndpointOptions


class Bug(RuntimeError):
    pass


@pytest.fixture
def buggy_server_side(monkeypatch):
    def serve_one(self, channel, source):
        raise Bug("a bug in the server's side of a run")

    monkeypatch.setattr(ProbeServer, "serve_one", serve_one)


def test_a_bug_in_the_last_run_is_raised_by_serve(buggy_server_side):
    secret, lines, outcome = ServerSecret(None), [], {}
    server = ProbeServer(secret, EndpointOptions(), bind="127.0.0.1", port=0, timeout_s=5.0,
                         log=lines.append, preflight=False)

    def serve():
        try:
            server.serve(runs=1)
        except BaseException as error:
            outcome["error"] = error

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    channel = Channel(socket.create_connection(("127.0.0.1", server.port), timeout=10), 10.0,
                      peer="server")
    try:
        authenticate_as_client(channel, secret)
        thread.join(10)
        ended = not thread.is_alive()
    finally:
        channel.close()
        server.close()
        thread.join(10)
    assert ended and isinstance(outcome.get("error"), Bug)
    assert any("hit a gdrprobe bug" in line for line in lines)


def test_a_bug_in_a_loopback_server_is_raised_not_a_peer_error(buggy_server_side, monkeypatch):
    def run(self):
        channel = self.authenticated()
        try:
            channel.receive("setup_ok")   # the server hangs up: a PeerError here
        finally:
            channel.close()

    monkeypatch.setattr(ProbeClient, "run", run)
    with pytest.raises(Bug):
        run_loopback(ProbeOptions(timeout_s=5.0), EndpointOptions())


def test_a_server_closed_while_it_admits_a_client_joins_it_without_error(monkeypatch):
    """close() arriving between a client's admission and the start of its thread."""
    import gdrprobe.measure.server as server_module

    server = ProbeServer(ServerSecret(None), EndpointOptions(), bind="127.0.0.1", port=0,
                         timeout_s=5.0, log=lambda text: None, preflight=False)
    closing: dict = {}

    def close():
        try:
            server.close()
        except BaseException as error:
            closing["error"] = error

    plain_thread = threading.Thread

    class LateThread(plain_thread):
        def start(self):
            closer = plain_thread(target=close, daemon=True)
            closing["thread"] = closer
            closer.start()
            closer.join(0.5)   # what close() can do before this thread has started
            super().start()

    monkeypatch.setattr(server_module.threading, "Thread", LateThread)
    a, b = socket.socketpair()
    try:
        server._admitted(Channel(a, 5.0, peer="client"), "127.0.0.1")
        closing["thread"].join(10)
    finally:
        b.close()
        server.close()
    assert not closing["thread"].is_alive() and "error" not in closing
