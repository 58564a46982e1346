"""Integrity that sees every message (issues 11 and 23): a wrong write that a later, right
one would have overwritten is caught in its own slot; every pass of the slot ring is
checked before it is written again, so corruption that comes and goes is caught at every
size, in -D runs and in latency runs, where each message is checked each way; the coverage
is reported. Faults are injected at the source (the writer's bytes, from outside the loop,
as a faulty read path would corrupt them), never by mocking verbs."""

import ctypes
import re
import threading
import time

import pytest

from gdrprobe import _native
from gdrprobe.errors import GdrprobeError, IntegrityError
from gdrprobe.measure.client import ProbeClient
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.measure.server import ProbeServer
from gdrprobe.memory.host import HostMemory
from gdrprobe.protocol.token import new_token
from gdrprobe.rdma.endpoint import EndpointOptions
from tests.lab.helpers import Server, gdrprobe_json
from tests.lab.loopback.conftest import TOKEN


@pytest.fixture(scope="module")
def server():
    """One 'gdrprobe serve' for the module, not one per test (conftest.py's): starting one
    costs 3.5-4.5 s in the guest. Safe to share: these tests only run clients against it
    (their faults are injected on the client's side, in this process), none stops, kills or
    reads it, and serve takes run after run."""
    running = Server(TOKEN, timeout=5.0)
    yield running
    running.stop()


def test_every_message_of_a_short_round_is_checked(server):
    report = gdrprobe_json("run", "127.0.0.1", "--token", TOKEN, "-s", "65536", "-n", "10")
    integrity = report["bandwidth"][0]["integrity"]
    assert integrity["messages_checked"] == integrity["messages_total"] == 10
    assert integrity["bad_messages"] == 0 and integrity["bytes_checked"] == 10 * 65536


def test_a_long_round_checks_every_message_pass_by_pass_unless_it_samples(server):
    report = gdrprobe_json("run", "127.0.0.1", "--token", TOKEN, "-s", "1048576", "-n", "20")
    row = report["bandwidth"][0]
    assert (row["integrity"]["messages_checked"], row["integrity"]["messages_total"]) == (20, 20)
    assert row["integrity_passes"] == 5            # 4 slots of 1 MiB: 5 passes of 4
    assert row["integrity_pause_s"] > 0
    assert report["settings"]["integrity"].startswith("every message checked")
    report = gdrprobe_json("run", "127.0.0.1", "--token", TOKEN, "-s", "1048576", "-n", "20",
                           "--sample-integrity")
    row = report["bandwidth"][0]
    assert (row["integrity"]["messages_checked"], row["integrity"]["messages_total"]) == (4, 20)
    assert row["integrity_passes"] == 0


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


class SourceFault:
    """Corrupts the client's source messages (one byte of each) from outside the loop while
    chosen passes are sent, and puts them right again after: what a read path that fails
    for a while does. The client's source is what it filled last (fill_slots)."""

    def __init__(self, monkeypatch, corrupt_passes: range):
        self.corrupt_passes = corrupt_passes
        self.source = None
        fill = HostMemory.fill_slots

        def recording_fill(memory, size, slots, seed):
            fill(memory, size, slots, seed)
            self.source = (memory, size, slots, seed)

        checked = ProbeClient._pass_checked

        def checked_then_fault(channel, index, messages):
            checked(channel, index, messages)
            memory, size, slots, seed = self.source
            if index + 1 == self.corrupt_passes.start:
                for slot in range(slots):
                    ctypes.c_uint8.from_address(memory.cpu_view + slot * size + size // 2) \
                        .value ^= 0x5A
            elif index + 1 == self.corrupt_passes.stop:
                fill(memory, size, slots, seed)

        monkeypatch.setattr(HostMemory, "fill_slots", recording_fill)
        monkeypatch.setattr(ProbeClient, "_pass_checked", staticmethod(checked_then_fault))


def bad_messages(error: IntegrityError) -> tuple[int, int]:
    """(wrong messages, messages checked) from the error's cause."""
    found = re.search(r"in (\d+) message\(s\) \(checked (\d+)/(\d+) messages\)", error.cause)
    assert found, error.cause
    return int(found.group(1)), int(found.group(2))


# Each size with enough messages for five passes of its slot ring (slots: min(1024,
# 4 MiB / size)); the fault covers the second pass alone, 20% of the round.
PASSES_OF_EACH_SIZE = [(4096, 4100, 1024), (65536, 320, 64), (1048576, 20, 4),
                       (8388608, 5, 1)]


@pytest.mark.parametrize("size, iterations, per_pass", PASSES_OF_EACH_SIZE)
def test_corruption_that_comes_and_goes_is_caught_at_every_size(server, monkeypatch, size,
                                                                 iterations, per_pass):
    SourceFault(monkeypatch, range(1, 2))
    client = ProbeClient("127.0.0.1", server.port, TOKEN,
                         ProbeOptions(sizes=(size,), iterations=iterations, timeout_s=30),
                         EndpointOptions())
    with pytest.raises(IntegrityError) as caught:
        client.run()
    assert bad_messages(caught.value) == (per_pass, iterations)


def test_corruption_that_comes_and_goes_is_caught_in_a_run_of_fixed_duration(server,
                                                                             monkeypatch):
    SourceFault(monkeypatch, range(2, 4))
    client = ProbeClient("127.0.0.1", server.port, TOKEN,
                         ProbeOptions(sizes=(65536,), duration_s=1.0, warmup_s=0.2,
                                      timeout_s=30), EndpointOptions())
    with pytest.raises(IntegrityError) as caught:
        client.run()
    wrong, checked = bad_messages(caught.value)
    assert wrong == 2 * 64                          # passes 2 and 3, 64 slots each
    assert checked > 4 * 64                         # and right ones before and after


def test_corruption_that_comes_and_goes_is_caught_in_a_latency_run(server, monkeypatch):
    """The client's first messages leave corrupted, then the source is put right while
    the run goes on: the server checks every message, not only the last."""
    from gdrprobe.measure import client as client_module

    prepare = client_module.prepare_latency_round
    restored = threading.Event()

    def prepare_then_fault(memory, size, seed):
        prepare(memory, size, seed)
        wrong_byte = ctypes.c_uint8.from_address(memory.cpu_view + memory.length // 2 + 1)
        wrong_byte.value ^= 0x5A

        def put_right():
            time.sleep(0.3)
            wrong_byte.value ^= 0x5A
            restored.set()

        threading.Thread(target=put_right, daemon=True).start()

    monkeypatch.setattr(client_module, "prepare_latency_round", prepare_then_fault)
    options = ProbeOptions(mode="latency", sizes=(4096,), iterations=4000, timeout_s=30)
    client = ProbeClient("127.0.0.1", server.port, TOKEN, options, EndpointOptions())
    started = time.monotonic()
    with pytest.raises(IntegrityError, match="on the server") as caught:
        client.run()
    wrong, checked = bad_messages(caught.value)
    assert checked == 4000 and wrong >= 1
    if restored.is_set() and time.monotonic() - started > 2.0:
        assert wrong < checked   # put right mid-run: the later messages passed


# ---- RDMA READ (issue 31): the reader checks what its READs brought, pass by pass ---------


def test_read_bandwidth_and_latency_against_serve_check_every_message(server):
    """ib_read_bw and ib_read_lat's measurements against 'gdrprobe serve' (the wire carries
    the opcode and the READ credits): every message the READs brought checked by the
    reader, the server's sources found unchanged."""
    report = gdrprobe_json("run", "127.0.0.1", "--token", TOKEN, "--opcode", "read",
                           "-s", "1048576", "-n", "20")
    row = report["bandwidth"][0]
    assert (report["settings"]["opcode"], report["settings"]["perftest"]) == ("read",
                                                                              "ib_read_bw")
    assert (row["integrity"]["messages_checked"], row["integrity"]["messages_total"]) == (20, 20)
    assert row["integrity"]["bad_messages"] == 0 and row["integrity_passes"] == 5
    assert row["bandwidth_avg_gbps"] > 0
    report = gdrprobe_json("run", "127.0.0.1", "--token", TOKEN, "--opcode", "read",
                           "--latency", "-s", "4096", "-n", "200")
    row = report["latency"][0]
    assert report["settings"]["perftest"] == "ib_read_lat"
    assert row["integrity"]["messages_checked"] == 200
    assert row["integrity"]["bytes_checked"] == 200 * 4096 and row["integrity"]["bad_bytes"] == 0
    assert 0 < row["latency_us_min"] <= row["latency_us_median"] <= row["latency_us_p99"]


def test_a_read_source_wrong_for_one_pass_is_caught_by_the_reader(monkeypatch):
    """The server's source slots go wrong after the reader checked pass 0 and are put right
    after it checked pass 1: the 4 messages of pass 1 are caught (1 MiB: 4 slots), and the
    server's own look at its sources at the end finds them right."""
    from gdrprobe.measure.loopback import run_loopback
    from gdrprobe.measure.round_check import RoundCheck

    fill, check_pass = HostMemory.fill_slots, RoundCheck.next_pass
    source = {}

    def recording_fill(memory, size, slots, seed):   # only the server fills in a READ run
        fill(memory, size, slots, seed)
        source.update(memory=memory, size=size, slots=slots, seed=seed)

    def checked_then_fault(check, messages):
        check_pass(check, messages)
        memory, size, slots = source["memory"], source["size"], source["slots"]
        if check.passes == 1:
            for slot in range(slots):
                ctypes.c_uint8.from_address(memory.cpu_view + slot * size + 7).value ^= 0x5A
        elif check.passes == 2:
            fill(memory, size, slots, source["seed"])

    monkeypatch.setattr(HostMemory, "fill_slots", recording_fill)
    monkeypatch.setattr(RoundCheck, "next_pass", checked_then_fault)
    options = ProbeOptions(sizes=(1048576,), iterations=20, opcode="read", timeout_s=30)
    with pytest.raises(IntegrityError, match="this side") as caught:
        run_loopback(options, EndpointOptions())
    assert bad_messages(caught.value) == (4, 20)


def test_latency_with_immediate_checks_every_message_each_way():
    """perftest's ib_write_lat --write_with_imm, both ends in this process: 1 MiB has 4
    slots, so 10 round trips run in passes of 4, 4 and 2, each side's slots checked after
    each; a second size runs on the receive left posted by the first."""
    from gdrprobe.measure.loopback import run_loopback

    options = ProbeOptions(mode="latency", opcode="write_imm", sizes=(64, 1048576),
                           iterations=10, timeout_s=30)
    report = run_loopback(options, EndpointOptions())
    assert report.settings.perftest == "ib_write_lat --write_with_imm"
    for row in report.latency:
        assert row.integrity.ok and row.integrity.messages_checked == 10, row
        assert row.integrity.bytes_checked == 10 * row.size_bytes
        assert 0 < row.latency_us_min <= row.latency_us_median


def test_bidirectional_against_serve_checks_every_message_both_ways(server):
    """perftest's -b against 'gdrprobe serve': both sides WRITE at once, 1 MiB in 4 slots,
    20 messages each way in 5 passes checked in step; each direction and the sum."""
    report = gdrprobe_json("run", "127.0.0.1", "--token", TOKEN, "-b", "-s", "1M", "-n", "20")
    (forward,), (reverse,) = report["bandwidth"], report["reverse"]
    for row in (forward, reverse):
        assert (row["integrity"]["messages_checked"], row["integrity"]["messages_total"]) == (
            20, 20), row
        assert row["integrity"]["bad_bytes"] == row["integrity"]["stray_bytes"] == 0
        assert row["integrity_passes"] == 5 and row["bandwidth_avg_gbps"] > 0
    (both,) = report["bidirectional"]
    assert both["sum_gbps"] == pytest.approx(forward["bandwidth_avg_gbps"]
                                             + reverse["bandwidth_avg_gbps"])


def test_bidirectional_sampling_checks_each_sides_last_message_without_passes(server):
    """-b --sample-integrity with one slot (perftest's footprint): no pauses, and each side
    checks the message its slot holds once the other's loop has ended."""
    report = gdrprobe_json("run", "127.0.0.1", "--token", TOKEN, "-b", "--sample-integrity",
                           "--integrity-bytes", "64K", "-s", "64K", "-n", "30")
    for row in (report["bandwidth"][0], report["reverse"][0]):
        integrity = row["integrity"]
        assert (integrity["messages_checked"], integrity["messages_total"]) == (1, 30), row
        assert integrity["bad_bytes"] == integrity["stray_bytes"] == 0
        assert row["integrity_passes"] == 0 and row["bandwidth_avg_gbps"] > 0
