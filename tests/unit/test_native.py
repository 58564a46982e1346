"""The C helpers through their Cython wrapper: statistics, payload pattern, host memory."""

import array
import ctypes
import mmap

import pytest

from gdrprobe import _native as native


def latency_summary(samples):
    return native.summarize_round_trips(array.array("Q", samples))


def test_latency_summary_percentiles_use_nearest_rank():
    samples = array.array("Q", reversed(range(1, 1001)))   # 1..1000 ns
    summary = native.summarize_round_trips(samples)
    assert summary.samples == 1000
    assert summary.min_ns == 1
    assert summary.max_ns == 1000
    assert summary.median_ns == 500.5
    assert summary.mean_ns == 500.5
    assert summary.p99_ns == 990
    assert summary.p999_ns == 999
    assert list(samples) == list(range(1, 1001))   # sorted in place


def test_latency_summary_of_one_sample():
    assert latency_summary([7]).p99_ns == 7
    assert latency_summary([7]).stdev_ns == 0


@pytest.fixture
def buffer():
    host = native.HostBuffer(10000)
    yield host.address, host.mapped_length
    host.close()


def test_host_buffer_is_page_aligned_zeroed_and_whole_pages(buffer):
    addr, mapped = buffer
    assert addr % mmap.PAGESIZE == 0
    assert mapped == -(-10000 // mmap.PAGESIZE) * mmap.PAGESIZE
    assert ctypes.string_at(addr, 16) == bytes(16)


def test_host_buffer_close_is_idempotent_and_clears_the_address():
    host = native.HostBuffer(4096)
    host.close()
    host.close()
    assert host.address == 0


def test_pattern_round_trip_and_seed_depends_on_size_and_round(buffer):
    addr, _ = buffer
    seed = native.pattern_seed(4099, 3)
    assert seed not in (native.pattern_seed(4098, 3), native.pattern_seed(4099, 4))
    native.pattern_fill(addr, 4099, seed)
    assert native.pattern_verify(addr, 4099, seed) == (0, -1)
    assert native.pattern_verify(addr, 4099, native.pattern_seed(4099, 4))[0] > 4000


def test_pattern_verify_reports_first_bad_offset_and_count(buffer):
    addr, _ = buffer
    seed = native.pattern_seed(9000, 1)
    native.pattern_fill(addr, 9000, seed)
    for offset in (8997, 4242, 4243):   # one in the tail bytes, two in one word
        ctypes.c_uint8.from_address(addr + offset).value ^= 0xFF
    assert native.pattern_verify(addr, 9000, seed) == (3, 4242)


def test_slots_each_have_their_own_pattern_and_a_wrong_one_is_counted(buffer):
    addr, length = buffer
    seed, size, slots = native.pattern_seed(1000, 2), 1000, 5
    native.slots_fill(addr, size, slots, seed)
    assert native.messages_verify(addr, size, slots, slots, seed, 0, slots) == (0, 0, -1)
    assert native.slot_seed(seed, 0) == seed
    assert native.slot_seed(seed, 1) == (seed + 0x9E3779B97F4A7C15) % (1 << 64)
    assert native.pattern_verify(addr + 3 * size, size, native.slot_seed(seed, 3)) == (0, -1)
    # slot 2 written with slot 1's pattern (a message in the wrong slot), one byte of slot 4
    native.pattern_fill(addr + 2 * size, size, native.slot_seed(seed, 1))
    ctypes.c_uint8.from_address(addr + 4 * size + 17).value ^= 0xFF
    bad_messages, bad, first = native.messages_verify(addr, size, slots, slots, seed, 0, slots)
    assert (bad_messages, first) == (2, 2 * size)
    assert size * 0.9 < bad <= size + 1


def test_a_message_is_known_by_its_number_so_a_slot_left_from_the_last_pass_fails(buffer):
    """Message k lands in slot k mod 3 from source slot k mod 4: the second pass (messages
    3 to 5) must carry the patterns of source slots 3, 0 and 1, so slots still holding the
    first pass's messages (a write that never landed) fail, and the right ones pass."""
    addr, _ = buffer
    seed, size, slots, sources = native.pattern_seed(512, 7), 512, 3, 4
    native.slots_fill(addr, size, slots, seed)                 # the first pass landed
    assert native.messages_verify(addr, size, slots, sources, seed, 0, 3) == (0, 0, -1)
    assert native.messages_verify(addr, size, slots, sources, seed, 3, 3)[0] == 3
    for k in (3, 4):                                            # message 5 never lands
        native.pattern_fill(addr + k % slots * size, size, native.slot_seed(seed, k % sources))
    bad_messages, bad, first = native.messages_verify(addr, size, slots, sources, seed, 3, 3)
    assert (bad_messages, first // size) == (1, 2)
    assert bad > size * 0.9
    # The last messages of a run of 8 (a sampling run checks messages 5, 6 and 7).
    for k in (5, 6, 7):
        native.pattern_fill(addr + k % slots * size, size, native.slot_seed(seed, k % sources))
    assert native.messages_verify(addr, size, slots, sources, seed, 5, 3) == (0, 0, -1)
    with pytest.raises(ValueError):
        native.messages_verify(addr, size, slots, sources, seed, 0, 4)   # more than slots


def test_poison_detects_stray_writes(buffer):
    addr, _ = buffer
    native.poison_fill(addr, 1000)
    assert native.poison_verify(addr, 1000) == (0, -1)
    ctypes.c_uint8.from_address(addr + 700).value = 0
    assert native.poison_verify(addr, 1000) == (1, 700)
    # Checked a word at a time: two bad bytes in one word, and one in the odd tail.
    native.poison_fill(addr, 1003)
    for offset in (1001, 5, 6, 700):
        ctypes.c_uint8.from_address(addr + offset).value = 0
    assert native.poison_verify(addr, 1003) == (4, 5)
    assert native.poison_verify(addr + 7, 1003 - 7) == (2, 700 - 7)   # unaligned start


def test_host_buffer_failure_is_an_oserror():
    with pytest.raises(OSError):
        native.HostBuffer(1 << 50)


def test_stop_flag():
    flag = native.StopFlag()
    assert not flag.is_set
    flag.set()
    assert flag.is_set
    flag.clear()
    assert not flag.is_set
