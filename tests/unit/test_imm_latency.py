"""Latency with GPU memory (issue 31): the ping-pong of RDMA WRITEs with immediate (perftest's
ib_write_lat --write_with_imm), where each side waits on its receive completions and no CPU
polls GPU memory; the receive slots are checked after each pass through the memory provider.
The loop itself runs in the lab (tests/lab/loopback/test_integrity_lab.py, and with dma-buf
memory at both ends tests/lab/loopback/test_flush_lab.py)."""

from __future__ import annotations

import ctypes
import dataclasses
import types

import pytest

from gdrprobe import _native, defaults
from gdrprobe.errors import UsageError
from gdrprobe.measure.client import integrity_method, perftest_program
from gdrprobe.measure.options import ProbeOptions, check_latency_memory
from gdrprobe.measure.side import ImmCheck, Receives, imm_passes, prepare_imm_round, send_half
from gdrprobe.memory.host import HostMemory
from gdrprobe.memory.spec import MemorySpec

GPU = MemorySpec.from_choice("gpu")
SIZE, SLOTS, SEED = 256, 4, 0x5EED


def imm_options(**settings) -> ProbeOptions:
    return ProbeOptions(mode="latency", opcode="write_imm", **settings)


def test_latency_with_immediate_takes_gpu_memory_at_either_end():
    check_latency_memory(imm_options(sizes=(64,)), GPU, GPU)
    with pytest.raises(UsageError, match="--opcode write_imm") as raised:
        check_latency_memory(ProbeOptions(mode="latency", sizes=(64,)), GPU, None)
    assert raised.value.exit_code == 2


def test_write_with_immediate_measures_latency_only():
    with pytest.raises(UsageError, match="write_imm measures latency"):
        ProbeOptions(opcode="write_imm")


def test_the_receive_slots_are_a_ring_as_bandwidth_slots_are_and_fit_below_the_send_half():
    options = imm_options(sizes=(1 << 20, 4096), iterations=10)
    assert options.slots(1 << 20) == 4          # 4 MiB of slots
    assert options.slots(4096) == 10            # no more than the round's messages
    # Twice a bandwidth buffer: the slots, then the send half (the message sent).
    assert options.buffer_bytes == 2 * defaults.buffer_bytes(1 << 20, 4)
    memory = types.SimpleNamespace(length=options.buffer_bytes)
    assert send_half(memory) >= 4 * (1 << 20)
    assert ProbeOptions(mode="latency", sizes=(64,)).slots(64) == 1


def test_a_round_runs_in_passes_of_its_slots():
    assert imm_passes(10, 4) == [(0, 4), (4, 4), (8, 2)]
    assert imm_passes(3, 4) == [(0, 3)]


def test_only_the_first_loop_of_a_run_posts_the_receive():
    receives = Receives()
    assert [receives.first_post() for _ in range(3)] == [True, False, False]


LOOP_CLEAN = types.SimpleNamespace(bad_messages=0, bad_bytes=0, first_bad_offset=0)


@pytest.fixture
def memory():
    buffer = HostMemory(2 * defaults.buffer_bytes(SIZE, SLOTS))
    yield buffer
    buffer.close()


def land(memory, slots):
    """What the peer's WRITEs put in these slots: the round's pattern."""
    for slot in slots:
        _native.pattern_fill(memory.cpu_view + slot * SIZE, SIZE, SEED)


def test_every_slot_of_every_pass_is_checked_and_poisoned_again(memory):
    prepare_imm_round(memory, SIZE, SEED, SLOTS)
    assert memory.verify_pattern(send_half(memory), SIZE, SEED) == (0, -1)   # what we send
    check = ImmCheck(memory, SIZE, SEED)
    land(memory, range(4))
    check.check_pass(LOOP_CLEAN, 4)
    assert _native.poison_verify(memory.cpu_view, 4 * SIZE) == (0, -1)   # poisoned again
    land(memory, range(2))
    check.check_pass(LOOP_CLEAN, 2)
    integrity = check.integrity()
    assert integrity.ok and (integrity.messages_checked, integrity.bytes_checked) == (6, 6 * SIZE)


def test_a_write_that_did_not_land_or_landed_wrong_is_caught(memory):
    prepare_imm_round(memory, SIZE, SEED, SLOTS)
    check = ImmCheck(memory, SIZE, SEED)
    land(memory, (0, 1, 3))                 # slot 2 never written: still poison
    ctypes.c_uint8.from_address(memory.cpu_view + 3 * SIZE + 5).value ^= 0x5A
    check.check_pass(LOOP_CLEAN, 4)
    integrity = check.integrity()
    assert not integrity.ok and integrity.bad_messages == 2
    assert integrity.bad_bytes == SIZE + 1 - sum(   # poison bytes equal to the pattern's
        _native.pattern_byte(SEED, i) == 0xA5 for i in range(SIZE))
    assert integrity.first_bad_offset == 2 * SIZE


def test_a_message_whose_immediate_was_not_its_number_is_wrong(memory):
    prepare_imm_round(memory, SIZE, SEED, SLOTS)
    check = ImmCheck(memory, SIZE, SEED)
    land(memory, range(4))
    check.check_pass(types.SimpleNamespace(bad_messages=1, bad_bytes=4, first_bad_offset=SIZE), 4)
    integrity = check.integrity()
    assert not integrity.ok and (integrity.bad_messages, integrity.first_bad_offset) == (1, SIZE)


def test_the_report_names_perftests_spelling_and_the_check():
    options = imm_options(sizes=(64,))
    assert perftest_program(options) == "ib_write_lat --write_with_imm"
    assert "receive slots read back after each pass" in integrity_method(options)


def test_the_loop_refuses_slots_past_the_peers_buffer(memory):
    remote = types.SimpleNamespace(address=memory.address, rkey=1, length=SLOTS * SIZE)
    handles = types.SimpleNamespace(qps=[1], cq=1)
    with pytest.raises(ValueError, match="do not fit the peer"):
        _native.LatencyConfig(handles, memory, remote, send_offset=send_half(memory),
                              msg_size=SIZE, iterations=1, initiator=True, stall_timeout_ns=1,
                              seed=SEED, imm=True, slots=SLOTS + 1)
    with pytest.raises(ValueError, match="not both READs and WRITEs"):
        _native.LatencyConfig(handles, memory, remote, send_offset=send_half(memory),
                              msg_size=SIZE, iterations=1, initiator=True, stall_timeout_ns=1,
                              seed=SEED, imm=True, read=True)


# ---- run --latency with GPU memory: the latency A/B --------------------------------------------


TOKEN = "a-token-of-32-characters-or-more-0123"


def latency_run(median_us: float, kind: str, options):
    from tests.unit.fakes.runs import recorded_run
    from gdrprobe.report.model import Integrity, LatencyResult

    ok = Integrity(True, 64, 0, None, 0, None)
    rows = tuple(LatencyResult(size, 100, median_us / 2, median_us, median_us, 0.1,
                               median_us * 2, median_us * 3, median_us * 4, ok, 0.1)
                 for size in options.sizes)
    report = recorded_run(1.0, {"kind": kind})
    return dataclasses.replace(report, bandwidth=(), latency=rows)


@pytest.fixture
def arms(monkeypatch):
    """A machine whose runs return latency rows: 2 us with host memory at both ends, 5 us
    with a GPU buffer on the server's side; each run's (local, remote, options) recorded."""
    from gdrprobe.campaign import machine as campaign_machine
    from gdrprobe.measure import loopback
    from gdrprobe.nccl.versions import NcclRules
    from gdrprobe.rdma import verbs

    made = []

    def runner(options, *args, **kwargs):
        def probe(local, remote):
            made.append((local.kind, remote.kind if remote else None, options))
            gpu = remote is not None and remote.kind == "gpu"
            return latency_run(5.0 if gpu else 2.0, "host", options)
        return probe

    monkeypatch.setattr(verbs, "devices", lambda: {"rxe0": None})
    monkeypatch.setattr(loopback, "runner", runner)
    monkeypatch.setattr(campaign_machine, "run_facts", lambda local, loopback: None)
    monkeypatch.setattr(campaign_machine, "nccl_view", lambda: ({}, NcclRules()))
    return made


def test_latency_with_gpu_memory_is_an_ab_of_medians(arms):
    import gdrprobe
    from gdrprobe.report.model import LatencyABReport

    report = gdrprobe.run("10.0.0.2", token=TOKEN, remote_mem="gpu", mode="latency",
                          opcode="write_imm", repeats=3, sizes=(64, 4096))
    assert isinstance(report, LatencyABReport)
    assert [(local, remote) for local, remote, _ in arms] == [("host", "host"),
                                                              ("host", "gpu")] * 3
    assert {options.opcode for _, _, options in arms} == {"write_imm"}
    assert [(r.size_bytes, r.host_median_us, r.gpu_median_us, r.gpu_over_host)
            for r in report.ratios] == [(64, 2.0, 5.0, 2.5), (4096, 2.0, 5.0, 2.5)]
    assert report.exit_code == 0 and len(report.host) == len(report.gpu) == 3


def test_a_latency_ab_measures_a_runs_default_size_not_the_bandwidth_ab_size(arms):
    import gdrprobe

    gdrprobe.run("10.0.0.2", token=TOKEN, remote_mem="gpu", mode="latency",
                 opcode="write_imm", repeats=1)
    assert {options.sizes for _, _, options in arms} == {(defaults.SIZE,)}


def test_plain_write_latency_with_gpu_memory_names_write_with_immediate(arms):
    import gdrprobe

    with pytest.raises(UsageError, match="needs RDMA WRITE with immediate") as raised:
        gdrprobe.run("10.0.0.2", token=TOKEN, remote_mem="gpu", mode="latency")
    assert "--opcode write_imm" in raised.value.fix and arms == []


def test_read_latency_with_gpu_memory_at_the_fetched_end_is_a_latency_ab(arms):
    """ib_read_lat's loop polls its CQ: the server's buffer, which the READ fetches, may be
    GPU memory, and the A/B runs the host arm with the same opcode."""
    import gdrprobe

    report = gdrprobe.run("10.0.0.2", token=TOKEN, remote_mem="gpu", mode="latency",
                          opcode="read", repeats=1)
    assert report.kind == "latency-ab"
    assert {options.opcode for _, _, options in arms} == {"read"}
    assert [(local, remote) for local, remote, _ in arms] == [("host", "host"), ("host", "gpu")]


def test_read_latency_landing_in_gpu_memory_is_refused_before_any_run(arms):
    import gdrprobe

    with pytest.raises(UsageError, match="READ latency lands in host memory"):
        gdrprobe.run("10.0.0.2", token=TOKEN, mem="gpu", mode="latency", opcode="read",
                     repeats=1)
    assert arms == []


def test_the_command_prints_each_sizes_ratio(arms, capsys):
    from gdrprobe.cli import main

    assert main(["run", "10.0.0.2", "--token", TOKEN, "--remote-mem", "gpu", "--latency",
                 "--opcode", "write_imm", "--repeats", "1", "-s", "64"]) == 0
    out = capsys.readouterr().out
    assert "latency A/B, 1 repeat(s) per arm" in out
    assert " 64         2.00       5.00       2.50" in out
