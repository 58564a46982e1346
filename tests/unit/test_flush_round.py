"""NCCL's flush on the receiving side (measure/flush.py, measure/round_check.py): before each
check of a GPU receive buffer, the first byte of the last message checked is read back, where
NCCL's ncclIbIflush reads, and it must be the byte that message put there; the run's options,
the wire and the report carry it; the check asks for it by NCCL's rule. The READ itself runs
in the lab (tests/lab/loopback/test_flush_lab.py)."""

from __future__ import annotations

import ctypes
import dataclasses

import pytest

from gdrprobe import _native
from gdrprobe.campaign import bench
from gdrprobe.campaign.machine import machine_facts
from gdrprobe.errors import IntegrityError, PeerError, UsageError
from gdrprobe.measure.client import flush_method, raise_if_corrupt
from gdrprobe.measure.flush import FLUSH_BYTES, FlushRead, wants_flush
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.measure.round_check import RoundCheck
from gdrprobe.memory.spec import MemorySpec
from gdrprobe.nccl import flush as nccl_flush
from gdrprobe.protocol.messages import Verified
from gdrprobe.report.model import BenchSettings
from gdrprobe.report.text import render_run_settings
from tests.unit.fakes.runs import recorded_run
from tests.unit.doctor import nccl_machines as nm
from tests.unit.fakes.prelaunch import check

SIZE, SLOTS, SOURCES, SEED = 64, 4, 5, 0x1234


class CheckedMemory:
    """A receive buffer whose every message is right (the check's own verdict is not under
    test here); it records the order of what the check does."""

    def __init__(self):
        self.calls = []

    def flush_remote_writes(self):
        self.calls.append("cuFlushGPUDirectRDMAWrites")

    def stage_in(self, offset, length):
        return 0.0

    def verify_messages(self, *args):
        self.calls.append("verify")
        return 0, 0, -1

    def verify_poison(self, start, end=None):
        return 0, -1

    def poison(self, end=None):
        pass


class Flusher:
    """Reads back what `landed` says (default: the right byte); records each READ."""

    def __init__(self, memory, landed=lambda offset, expected: expected):
        self.memory, self.landed, self.reads = memory, landed, []

    def read_back(self, offset, expected):
        self.memory.calls.append("READ")
        self.reads.append((offset, expected))
        return FlushRead(self.landed(offset, expected), 1000 * (len(self.reads) + 1))


def source_bytes() -> bytes:
    """The sender's source slots, filled as the client fills them."""
    buffer = _native.HostBuffer(SIZE * SOURCES)
    _native.slots_fill(buffer.address, SIZE, SOURCES, SEED)
    return ctypes.string_at(buffer.address, SIZE * SOURCES)


def test_each_check_first_reads_back_the_last_messages_first_byte():
    memory = CheckedMemory()
    flusher = Flusher(memory)
    check = RoundCheck(memory, SIZE, SLOTS, SOURCES, SEED, flusher)
    check.next_pass(SLOTS)      # messages 0..3: the last, 3, in slot 3 from source slot 3
    check.next_pass(2)          # messages 4, 5: the last, 5, in slot 1 from source slot 0
    sent = source_bytes()
    assert flusher.reads == [(3 * SIZE, sent[3 * SIZE]), (1 * SIZE, sent[0])]
    # The READ comes before anything reads the buffer, as NCCL's comes before the kernel.
    assert memory.calls[:3] == ["READ", "cuFlushGPUDirectRDMAWrites", "verify"]
    integrity = check.integrity(SLOTS + 2)
    assert (integrity.flush_reads, integrity.flush_bad, integrity.ok) == (2, 0, True)
    # NCCL's per-receive cost: the READs' median time (2 and 3 us here), post to completion
    assert integrity.flush_us_median == 2.5


def test_a_read_back_that_is_not_the_last_written_byte_is_corruption():
    memory = CheckedMemory()
    stale = Flusher(memory, lambda offset, expected: expected ^ 0xFF if offset else expected)
    check = RoundCheck(memory, SIZE, SLOTS, SOURCES, SEED, stale)
    check.next_pass(SLOTS)
    check.next_pass(2)
    integrity = check.integrity(SLOTS + 2)
    assert (integrity.flush_reads, integrity.flush_bad) == (2, 2)
    assert integrity.first_flush_bad_offset == 3 * SIZE and not integrity.ok
    with pytest.raises(IntegrityError, match="NCCL's flush READ brought back another byte "
                                             "than the last message wrote in 2 of 2 reads, "
                                             f"first at offset {3 * SIZE}"):
        raise_if_corrupt(integrity, SIZE, "the server")


def test_a_sampling_run_flushes_once_for_its_last_messages():
    memory = CheckedMemory()
    flusher = Flusher(memory)
    check = RoundCheck(memory, SIZE, SLOTS, SOURCES, SEED, flusher)
    check.last(11)              # messages 7..10 held; the last, 10, in slot 2 from source 0
    assert flusher.reads == [(2 * SIZE, source_bytes()[0])]


def test_without_a_flusher_nothing_is_read_back():
    memory = CheckedMemory()
    check = RoundCheck(memory, SIZE, SLOTS, SOURCES, SEED)
    check.next_pass(SLOTS)
    assert "READ" not in memory.calls and check.integrity(SLOTS).flush_reads == 0
    assert check.integrity(SLOTS).flush_us_median is None


def test_the_flush_crosses_the_wire_and_a_run_without_it_sends_what_it_always_sent():
    memory = CheckedMemory()
    check = RoundCheck(memory, SIZE, SLOTS, SOURCES, SEED, Flusher(memory))
    check.next_pass(SLOTS)
    flushed = check.integrity(SLOTS)
    sent = Verified(flushed, 0.0).to_message()
    assert Verified.from_message(sent, bandwidth=True).integrity == flushed
    plain = dataclasses.replace(flushed, flush_reads=0)
    assert "flush_reads" not in Verified(plain, 0.0).to_message()
    with pytest.raises(PeerError):   # a peer claiming more bad reads than reads
        Verified.from_message(sent | {"flush_bad": 2}, bandwidth=True)


def test_the_options_carry_what_asked_for_the_flush():
    options = ProbeOptions(flush="GPU before sm90: ...")
    assert ProbeOptions.from_message(options.to_message()).flush == options.flush
    older_client = {k: v for k, v in options.to_message().items() if k != "flush"}
    assert ProbeOptions.from_message(older_client).flush == ""
    with pytest.raises(UsageError, match="flush rule"):
        ProbeOptions(flush="x" * 5000)


@pytest.mark.parametrize("rule, spec, flushed", [
    ("asked", MemorySpec(kind="gpu", mechanism="dmabuf"), True),
    ("asked", MemorySpec(kind="gpu", mechanism="peermem"), True),
    ("asked", MemorySpec(kind="gpu"), True),
    ("asked", MemorySpec(kind="gpu", mechanism="staged"), False),   # lands in host memory
    ("asked", MemorySpec(), False),
    ("", MemorySpec(kind="gpu", mechanism="dmabuf"), False),
])
def test_only_gpu_memory_the_nic_writes_directly_is_flushed(rule, spec, flushed):
    assert wants_flush(rule, spec) is flushed


def test_the_receiver_reads_what_nccl_reads():
    assert FLUSH_BYTES == 1     # net_ib connect.cc: gpuFlush.sge.length = 1


def test_the_report_says_the_flush_ran_and_what_asked_for_it():
    text = flush_method(ProbeOptions(flush="C2C CPU with a PCIe NIC: ..."))
    assert "RDMA READ on a loopback QP" in text and text.endswith("C2C CPU with a PCIe NIC: ...")


# ---- the campaigns ask for it by NCCL's rule ----------------------------------------------


def flush_asked(made) -> set[tuple[str, str]]:
    return {(remote.kind, options.flush.split(":")[0]) for _, options, _, remote in made}


def test_the_check_flushes_a_gpu_nccl_flushes(tmp_path, runs, locks):  # noqa: F811
    gpu = nm.gpu_bdfs(nm.v100_no_nvlink(tmp_path))[0]
    check(machine_facts(str(tmp_path), {}), gpu, locks)
    # The host arm's options ask too; only a GPU receive buffer is flushed (wants_flush).
    assert {rule for _, rule in flush_asked(runs)} == {nccl_flush.PRE_HOPPER}


def test_the_check_does_not_flush_where_nccl_does_not(tmp_path, runs, locks):  # noqa: F811
    nm.hgx_8gpu_4nic(tmp_path)
    check(machine_facts(str(tmp_path), {}), "0000:1b:00.0", locks)
    assert {rule for _, rule in flush_asked(runs)} == {""}


def test_the_check_flushes_where_c2c_forces_it(tmp_path, runs, locks):  # noqa: F811
    nm.gh200_nic_beside_gpu(tmp_path)
    check(machine_facts(str(tmp_path), {}), "0009:03:00.0", locks)
    assert {rule for _, rule in flush_asked(runs)} == {nccl_flush.C2C}


def test_bench_flushes_each_gpus_receives_by_nccls_rule(tmp_path):
    tree = nm.v100_no_nvlink(tmp_path)
    facts = machine_facts(str(tmp_path), {})
    settings = BenchSettings((4096,), ("host", "dmabuf"), (1,), False, 100, None, 0.5, 128, 100,
                             0, 0.9, 1)
    plan = bench.bench_plan(settings, facts, (), ["mlx5_0"], 30.0)
    flushes = {(run.memory, plan.run_options(run).flush.split(":")[0]) for run in plan.runs()}
    assert ("dmabuf", nccl_flush.PRE_HOPPER) in flushes and ("host", "") in flushes
    assert nm.gpu_bdfs(tree)[0] in plan.flushes


def test_a_run_says_its_flush():
    report = recorded_run(100.0, {"kind": "gpu", "mechanism": "dmabuf"})
    shown = dataclasses.replace(report, settings=dataclasses.replace(report.settings,
                                                                     flush="read back"))
    assert " flush: read back" in render_run_settings(shown)
    assert " flush:" not in render_run_settings(report)
