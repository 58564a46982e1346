"""The latency and bidirectional rounds put the buffers and the flush where NCCL's traffic has
them (issue 39 item 6): NCCL's LL protocol keeps its send buffers in host memory with
GPUDirect too and receives into GPU memory (src/transport/net.cc sendProxyConnect,
recvProxyConnect: NCCL_NET_MAP_ADD_POINTER), so a latency round can send from a host buffer
of its own (ProbeOptions.send_memory); and where a run asks for NCCL's flush, every round
that receives into GPU memory flushes before its check (measure/side.py ImmCheck,
measure/round_check.py). The loops themselves run in the lab."""

from __future__ import annotations

import ctypes
import types

import pytest

from gdrprobe import _native, defaults
from gdrprobe.errors import UsageError
from gdrprobe.measure.flush import FlushRead
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.measure.side import ImmCheck, latency_config, prepare_imm_round, send_half
from gdrprobe.memory.host import HostMemory

SIZE, SLOTS, SEED = 256, 4, 0x5EED


@pytest.fixture
def memory():
    buffer = HostMemory(2 * defaults.buffer_bytes(SIZE, SLOTS))
    yield buffer
    buffer.close()


@pytest.fixture
def source():
    buffer = HostMemory(SIZE)
    yield buffer
    buffer.close()


def test_a_host_send_buffer_apart_is_for_latency_with_immediate():
    options = ProbeOptions(mode="latency", opcode="write_imm", sizes=(8,), send_memory="host")
    assert ProbeOptions.from_message(options.to_message()).send_memory == "host"
    for wrong in ({"mode": "latency", "sizes": (8,)}, {"sizes": (8,)}):
        with pytest.raises(UsageError, match="send buffer in host memory apart"):
            ProbeOptions(send_memory="host", **wrong)
    with pytest.raises(UsageError, match="send memory 'gpu'"):
        ProbeOptions(mode="latency", opcode="write_imm", sizes=(8,), send_memory="gpu")


def test_an_older_peer_without_the_field_sends_from_its_own_buffer():
    message = ProbeOptions(mode="latency", opcode="write_imm", sizes=(8,)).to_message()
    del message["send_memory"]
    assert ProbeOptions.from_message(message).send_memory == ""


def test_the_round_fills_the_send_buffer_apart_and_the_loop_sends_from_it(memory, source):
    prepare_imm_round(memory, SIZE, SEED, SLOTS, source)
    assert source.verify_pattern(0, SIZE, SEED) == (0, -1)
    assert memory.verify_pattern(send_half(memory), SIZE, SEED)[0] > 0     # not filled there
    handles = types.SimpleNamespace(qps=[1], cq=1)
    remote = types.SimpleNamespace(address=memory.address, rkey=1, length=SLOTS * SIZE)
    clock = types.SimpleNamespace(loop_args=lambda: {})
    config = latency_config(handles, memory, remote, SIZE, 10, 0, True, 1.0, clock, SEED,
                            imm={"slots": SLOTS, "first": 0, "post_recv": True}, source=source)
    assert config.source is source and config.memory is memory
    with pytest.raises(ValueError, match="needs WRITEs with immediate"):
        latency_config(handles, memory, remote, SIZE, 10, 0, True, 1.0, clock, SEED, source=source)


class Flusher:
    """Answers each flush READ with the byte the pass's last message left there, or, told to,
    with a stale one (a write that had not landed)."""

    def __init__(self, memory, stale: bool = False):
        self.memory, self.stale, self.reads = memory, stale, []

    def read_back(self, offset: int, expected: int) -> FlushRead:
        self.reads.append(offset)
        byte = ctypes.c_uint8.from_address(self.memory.cpu_view + offset).value
        byte = expected ^ 0xFF if self.stale else byte
        return FlushRead(byte, 2500)


def land(memory, slots):
    for slot in slots:
        _native.pattern_fill(memory.cpu_view + slot * SIZE, SIZE, SEED)


def test_a_latency_pass_is_flushed_before_its_check_where_the_run_asks(memory):
    prepare_imm_round(memory, SIZE, SEED, SLOTS)
    flusher = Flusher(memory)
    check = ImmCheck(memory, SIZE, SEED, flusher)
    clean = types.SimpleNamespace(bad_messages=0, bad_bytes=0, first_bad_offset=0)
    land(memory, range(4))
    check.check_pass(clean, 4)
    land(memory, range(3))
    check.check_pass(clean, 3)
    assert flusher.reads == [3 * SIZE, 2 * SIZE]           # each pass's last message, first byte
    integrity = check.integrity()
    assert integrity.ok and (integrity.flush_reads, integrity.flush_bad) == (2, 0)
    assert integrity.flush_us_median == 2.5


def test_a_flush_that_brings_back_another_byte_is_counted_against_the_round(memory):
    prepare_imm_round(memory, SIZE, SEED, SLOTS)
    check = ImmCheck(memory, SIZE, SEED, Flusher(memory, stale=True))
    land(memory, range(2))
    check.check_pass(types.SimpleNamespace(bad_messages=0, bad_bytes=0, first_bad_offset=0), 2)
    integrity = check.integrity()
    assert (integrity.flush_bad, integrity.first_flush_bad_offset) == (1, SIZE)


def test_without_a_flusher_a_pass_is_only_checked(memory):
    prepare_imm_round(memory, SIZE, SEED, SLOTS)
    check = ImmCheck(memory, SIZE, SEED)
    land(memory, range(1))
    check.check_pass(types.SimpleNamespace(bad_messages=0, bad_bytes=0, first_bad_offset=0), 1)
    assert check.integrity().flush_reads == 0
