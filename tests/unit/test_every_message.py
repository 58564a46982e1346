"""Every bandwidth message checked: the loop's passes reach the thread that owns the
channel (measure/loops.py PassGate), and the receiver's RoundCheck knows each message by its
number (measure/round_check.py). The lab runs both through Soft-RoCE
(tests/lab/loopback/test_integrity_lab.py)."""

from __future__ import annotations

import threading

import pytest

from gdrprobe import _native
from gdrprobe.measure import loops
from gdrprobe.measure.loops import LoopThread, PassGate
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.measure.round_check import RoundCheck
from gdrprobe.memory.host import HostMemory


def passes_loop(count):
    """Stands in for the C loop: hands `count` passes of 5 messages to its on_pass (the
    gate) from its own thread, and stops at the first the gate does not go on from."""
    def loop(config, stop):
        handed = []
        for index in range(count):
            handed.append(threading.current_thread().name)
            if not config(index, 5):
                return ("stopped", handed)
        return ("done", handed)
    return loop


def test_each_pass_is_answered_in_the_waiting_thread_and_the_loop_goes_on():
    stop = _native.StopFlag()
    gate = PassGate(stop)
    seen = []
    status, handed = LoopThread(passes_loop(4), gate, stop, gate).wait(
        on_pass=lambda index, messages: seen.append(
            (index, messages, threading.current_thread().name)))
    assert status == "done"
    assert handed == ["gdrprobe-loop"] * 4
    assert seen == [(i, 5, threading.current_thread().name) for i in range(4)]


class CountingGate(PassGate):
    """A gate that counts how often the waiting thread woke to look at it."""

    def __init__(self, stop):
        super().__init__(stop)
        self.looks = 0
        self.seen = []

    def next(self, timeout_s):
        self.looks += 1
        self.seen.append(super().next(timeout_s))
        return self.seen[-1]


def test_the_waiting_thread_wakes_for_passes_and_the_loop_s_end_not_to_poll(monkeypatch):
    # The look between heartbeats made long: a waiting thread that polled for the loop's
    # end would look many times while the loop runs; one woken by passes and by the loop's
    # end looks once per pass and once for the end, however long the loop takes.
    monkeypatch.setattr(loops, "IDLE_LOOK_S", 60.0)
    stop = _native.StopFlag()
    gate = CountingGate(stop)
    release = threading.Event()
    threading.Timer(0.3, release.set).start()

    def loop(config, stop):
        config(0, 5)
        release.wait(30)      # the loop runs on after its pass, as a real one does
        config(1, 5)
        return "done"

    seen = []
    assert LoopThread(loop, gate, stop, gate).wait(
        on_pass=lambda index, messages: seen.append(index)) == "done"
    assert seen == [0, 1]
    assert gate.looks == 3


def test_a_loop_started_before_the_wait_still_ends_it_at_once(monkeypatch):
    # The server's side of a bidirectional round starts its loop, says "ready", then waits
    # with a heartbeat: the loop's end must wake that wait, not the next beat.
    monkeypatch.setattr(loops, "IDLE_LOOK_S", 60.0)
    stop = _native.StopFlag()
    gate = CountingGate(stop)
    thread = LoopThread(passes_loop(2), gate, stop, gate)
    thread.start()
    seen = []
    assert thread.wait(tick=lambda: None, tick_every_s=60.0,
                       on_pass=lambda index, messages: seen.append(index))[0] == "done"
    assert seen == [0, 1]
    assert gate.seen == [(0, 5), (1, 5), loops.LOOP_ENDED]   # woken by the end, not a time-out


def test_an_error_in_a_pass_stops_the_loop_and_is_raised():
    stop = _native.StopFlag()
    gate = PassGate(stop)

    def refuse(index, messages):
        if index == 1:
            raise RuntimeError("the server went away")

    thread = LoopThread(passes_loop(4), gate, stop, gate)
    with pytest.raises(RuntimeError, match="went away"):
        thread.wait(on_pass=refuse)
    assert stop.is_set
    assert thread.finish() == ("stopped", ["gdrprobe-loop"] * 2)


def sent(memory, size, slots, sources, seed, first, count):
    """What the loop writes: message k from source slot k mod sources into slot k mod
    slots (the receiver's buffer is also memory here)."""
    for k in range(first, first + count):
        memory.fill_pattern(k % slots * size, size, _native.slot_seed(seed, k % sources))


@pytest.fixture
def memory():
    memory = HostMemory(16 * 4096)
    yield memory
    memory.close()


def test_every_pass_is_checked_and_a_corrupt_message_in_a_middle_pass_is_counted(memory):
    size, slots, seed = 1000, 8, _native.pattern_seed(1000, 3)
    memory.poison()
    check = RoundCheck(memory, size, slots, slots + 1, seed)
    for index, count in enumerate((8, 8, 3)):       # 19 messages: two passes and a part
        sent(memory, size, slots, slots + 1, seed, index * slots, count)
        if index == 1:                              # message 12 corrupted on the way
            memory.fill_pattern(4 * size + 10, 1, 0)
        check.next_pass(count)
    integrity = check.integrity(posted=19)
    assert (integrity.messages_checked, integrity.messages_total) == (19, 19)
    assert integrity.bad_messages == 1
    assert integrity.first_bad_offset == 4 * size + 10
    assert integrity.stray_bytes == 0
    assert not integrity.ok
    # Poisoned again for the next round, up to the slots used.
    assert memory.verify_poison(0) == (0, -1)


def test_a_slot_that_missed_its_write_holds_the_last_pass_and_fails(memory):
    size, slots, seed = 512, 4, _native.pattern_seed(512, 1)
    check = RoundCheck(memory, size, slots, slots + 1, seed)
    sent(memory, size, slots, slots + 1, seed, 0, 4)
    check.next_pass(4)
    sent(memory, size, slots, slots + 1, seed, 4, 3)   # message 7 never lands
    check.next_pass(4)
    assert check.bad_messages == 1
    assert check.first_bad // size == 3


def test_a_sampling_run_checks_only_the_messages_the_slots_hold(memory):
    size, slots, seed = 512, 4, _native.pattern_seed(512, 2)
    memory.poison()
    sent(memory, size, slots, slots + 1, seed, 0, 10)
    check = RoundCheck(memory, size, slots, slots + 1, seed)
    check.last(10)
    integrity = check.integrity(posted=10)
    assert (integrity.messages_checked, integrity.messages_total) == (4, 10)
    assert integrity.ok


def test_the_sender_has_one_source_slot_more_than_the_receiver_has_slots_and_room_for_it():
    options = ProbeOptions(sizes=(65536, 4 << 20), iterations=1000)
    for size in options.sizes:
        assert options.source_slots(size) == options.slots(size) + 1
        assert options.source_slots(size) * size <= options.buffer_bytes
    assert ProbeOptions().sample_integrity is False
    assert ProbeOptions.from_message(ProbeOptions(sample_integrity=True).to_message()) \
        .sample_integrity is True


def test_the_round_settles_by_sampling_or_by_every_pass_checked(memory):
    from gdrprobe.errors import PeerError

    size, slots, seed = 4096, 4, 7
    sent(memory, size, slots, slots + 1, seed, 0, 10)
    sampled = RoundCheck(memory, size, slots, slots + 1, seed)
    sampled.settle(10, sampled=True, writer="the server")
    assert (sampled.messages, sampled.bad_messages) == (4, 0)
    with pytest.raises(PeerError, match="the server ended the 4096-byte round without writing"):
        RoundCheck(memory, size, slots, slots + 1, seed).settle(0, True, "the server")
    unchecked = RoundCheck(memory, size, slots, slots + 1, seed)
    with pytest.raises(PeerError, match="the client posted 10 messages of 4096 B and had 0 "
                                        "checked"):
        unchecked.settle(10, sampled=False, writer="the client")


def test_sampling_is_one_qp_as_rdma_orders_writes_only_within_a_qp():
    from gdrprobe.errors import UsageError

    with pytest.raises(UsageError, match="sample with -q 1") as raised:
        ProbeOptions(sample_integrity=True, qps=2)
    assert raised.value.exit_code == 2
    assert ProbeOptions(sample_integrity=True, qps=1).qps == 1
    assert ProbeOptions(qps=2).qps == 2
