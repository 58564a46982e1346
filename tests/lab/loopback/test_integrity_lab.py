"""Integrity that sees every message (issue 11): a wrong write that a later, right one
would have overwritten is caught in its own slot, the coverage is reported, and the
latency echo is verified on the client too. Faults are injected at the source (the
writer's pattern), never by mocking verbs."""

import threading

import pytest

from gdrprobe import _native
from gdrprobe.errors import GdrprobeError, IntegrityError
from gdrprobe.measure.client import ProbeClient
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.measure.server import ProbeServer
from gdrprobe.memory.host import HostMemory
from gdrprobe.protocol.token import new_token
from gdrprobe.rdma.endpoint import EndpointOptions
from tests.lab.helpers import gdrprobe_json
from tests.lab.loopback.conftest import TOKEN


def test_every_message_of_a_short_round_is_checked(server):
    report = gdrprobe_json("run", "127.0.0.1", "--token", TOKEN, "-s", "65536", "-n", "10")
    integrity = report["bandwidth"][0]["integrity"]
    assert integrity["messages_checked"] == integrity["messages_total"] == 10
    assert integrity["bad_messages"] == 0 and integrity["bytes_checked"] == 10 * 65536


def test_a_long_round_reports_the_last_messages_it_checked(server):
    report = gdrprobe_json("run", "127.0.0.1", "--token", TOKEN, "-s", "1048576", "-n", "20")
    integrity = report["bandwidth"][0]["integrity"]
    assert (integrity["messages_checked"], integrity["messages_total"]) == (4, 20)


def test_one_wrong_message_among_right_ones_is_caught(server, monkeypatch):
    """The client writes message 3 of 10 from a wrong pattern; messages after it are right,
    as is the last one, which is all a single-slot check would have seen."""
    fill = HostMemory.fill_slots

    def fill_with_one_wrong(memory, size, slots, seed):
        fill(memory, size, slots, seed)
        memory.fill_pattern(3 * size, size, _native.slot_seed(seed, 3) ^ 1)

    monkeypatch.setattr(HostMemory, "fill_slots", fill_with_one_wrong)
    client = ProbeClient("127.0.0.1", server.port, TOKEN,
                         ProbeOptions(sizes=(4096,), iterations=10, timeout_s=10),
                         EndpointOptions())
    with pytest.raises(IntegrityError, match=r"in 1 message\(s\) \(checked 10/10 messages\)"):
        client.run()


class GarbageEcho(ProbeServer):
    """A server whose latency echo carries the wrong pattern (and which checks the client's
    messages correctly)."""

    def _latency_round(self, channel, options, endpoint, handles, memory, *args):
        fill = memory.fill_pattern
        memory.fill_pattern = lambda offset, length, seed: fill(offset, length, seed ^ 1)
        try:
            return super()._latency_round(channel, options, endpoint, handles, memory, *args)
        finally:
            del memory.fill_pattern


def test_a_garbage_latency_echo_is_caught_by_the_client():
    token = new_token()
    server = GarbageEcho(token, EndpointOptions(), bind="127.0.0.1", port=0, timeout_s=10,
                         log=lambda text: None)
    def serve():
        try:
            server.serve(runs=1)
        except GdrprobeError:
            pass   # the client's abort: the client's side is what this test checks

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    options = ProbeOptions(mode="latency", sizes=(64,), iterations=100, tx_depth=1,
                           cq_moderation=1, timeout_s=10)
    try:
        with pytest.raises(IntegrityError, match="server's echo"):
            ProbeClient("127.0.0.1", server.port, token, options, EndpointOptions()).run()
    finally:
        server.close()
        thread.join(30)
