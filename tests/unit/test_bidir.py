"""Both directions at once (issue 31, perftest's -b: `run --bidir`): the options, the buffer
layout (each side's sources past its receive slots), the step-by-step check of both sides'
passes, the server's loop result on the wire, and each direction with the sum in the report.
The loops run in the lab (tests/lab/loopback/test_integrity_lab.py)."""

from __future__ import annotations

import pytest

from gdrprobe import _native, defaults
from gdrprobe.errors import UsageError
from gdrprobe.measure.loops import bidir_result
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.measure.round_check import RoundCheck
from gdrprobe.measure.side import exchange_passes
from gdrprobe.memory.host import HostMemory
from gdrprobe.protocol.messages import PROGRESS, Sent
from gdrprobe.rdma.endpoint import EndpointOptions
from gdrprobe.report.model import BandwidthResult, Integrity

SIZE = 4096


def test_both_sides_are_written_and_each_keeps_its_sources_past_its_slots():
    options = ProbeOptions(bidir=True, sizes=(SIZE,), iterations=20)
    assert options.endpoint_options(EndpointOptions(), server=False).remote_write
    half = defaults.buffer_bytes(SIZE, options.slots(SIZE))
    assert options.buffer_bytes == 2 * half and options.source_offset(SIZE) == half
    assert options.source_offset(SIZE) + options.source_slots(SIZE) * SIZE <= 2 * half
    assert ProbeOptions(sizes=(SIZE,)).source_offset(SIZE) == 0
    assert ProbeOptions.from_message(options.to_message()).bidir is True


@pytest.mark.parametrize("settings", [{"mode": "latency"}, {"opcode": "read"},
                                      {"duration_s": 1.0}])
def test_bidir_is_write_bandwidth_for_a_number_of_iterations(settings):
    with pytest.raises(UsageError, match="--bidir runs WRITE bandwidth") as raised:
        ProbeOptions(bidir=True, sizes=(SIZE,), **settings)
    assert raised.value.exit_code == 2


def test_bidir_may_sample_in_perftests_footprint_one_slot_and_two_sources():
    from gdrprobe.measure.client import integrity_method

    options = ProbeOptions(bidir=True, sizes=(SIZE,), iterations=50, sample_integrity=True,
                           integrity_bytes=SIZE)
    assert (options.slots(SIZE), options.source_slots(SIZE)) == (1, 2)
    assert integrity_method(options).startswith("sampled")
    assert ProbeOptions.from_message(options.to_message()).sample_integrity is True


def test_bidir_rounds_take_nccls_flush_each_side_receiving_into_gpu_memory():
    """Was: refused. Both sides receive in a bidirectional round, as NCCL's connections do
    both ways, and NCCL flushes a GPUDirect receive where its rule says (net.cc)."""
    options = ProbeOptions(bidir=True, sizes=(SIZE,), flush="asked")
    assert ProbeOptions.from_message(options.to_message()).flush == "asked"


class Peer:
    """The other side of the channel: its heartbeat and pass, then its "checked"."""

    def __init__(self, index, messages):
        self.sent = []
        self.inbox = [{"type": PROGRESS}, {"type": "pass", "index": index, "messages": messages},
                      {"type": PROGRESS}, {"type": "checked", "index": index}]

    def send(self, kind, **fields):
        self.sent.append((kind, fields))

    def receive(self, *kinds):
        message = self.inbox.pop(0)
        assert message["type"] in kinds
        return message


def test_a_pass_is_told_waited_for_checked_here_and_acknowledged_both_ways():
    options = ProbeOptions(bidir=True, sizes=(SIZE,), iterations=8)
    slots, sources = options.slots(SIZE), options.source_slots(SIZE)
    memory = HostMemory(options.buffer_bytes)
    offset = options.source_offset(SIZE)
    memory.poison()
    memory.fill_slots(SIZE, sources, 9, offset)
    _native.slots_fill(memory.cpu_view, SIZE, slots, 9)      # the peer's 8 messages landed
    check = RoundCheck(memory, SIZE, slots, sources, 9, stray_end=offset)
    peer = Peer(0, 8)
    exchange_passes(peer, check, 0, 8)
    assert peer.sent == [("pass", {"index": 0, "messages": 8}), ("checked", {"index": 0})]
    integrity = check.integrity(8)
    # Every message checked; this side's own sources past the slots are not stray writes.
    assert integrity.ok and integrity.messages_checked == 8 and integrity.stray_bytes == 0
    memory.close()


def test_the_servers_loop_result_crosses_the_wire():
    sent = Sent(100, 101, 5_000_000, 2.5e9, 4, 1000, 0.0)
    assert Sent.from_message(sent.to_message()) == sent


def test_each_direction_and_the_sum_are_reported():
    ok = Integrity(True, SIZE, 0, None, 0, None)
    forward = BandwidthResult(SIZE, 10, 1.0, 40.0, 41.0, 0, 0, 0, ok)
    reverse = BandwidthResult(SIZE, 10, 1.0, 35.0, 36.0, 0, 0, 0, ok)
    row = bidir_result(forward, reverse)
    assert (row.client_to_server_gbps, row.server_to_client_gbps, row.sum_gbps) == (40.0, 35.0,
                                                                                   75.0)


def test_run_takes_perftests_b(capsys):
    from gdrprobe.cli import build_parser
    from gdrprobe.cli.run import probe_settings

    args = build_parser().parse_args(["run", "--loopback", "-b"])
    assert probe_settings(args)["bidir"] is True
