"""RDMA READ runs (issue 31, --opcode read): the options, the wire, the QP's READ credits, the
server's side of a READ round, the report's perftest names and latency as perftest reports a
READ's. The READs themselves run in the lab (tests/lab/loopback/test_integrity_lab.py)."""

from __future__ import annotations

import ctypes
import dataclasses
import types

import pytest

from gdrprobe import _native
from gdrprobe.campaign import bench
from gdrprobe.campaign.machine import machine_facts
from gdrprobe.errors import UsageError
from gdrprobe.measure.client import integrity_method, perftest_program
from gdrprobe.measure.loops import latency_result
from gdrprobe.measure.options import ProbeOptions, check_latency_memory
from gdrprobe.measure.server import ProbeServer
from gdrprobe.memory.host import HostMemory
from gdrprobe.memory.spec import MemorySpec
from gdrprobe.protocol.messages import READY, Verified
from gdrprobe.rdma.endpoint import EndpointOptions, read_credits
from gdrprobe.report.model import BenchSettings, Integrity
from gdrprobe.report.text import render_run_settings
from tests.unit.doctor import nccl_machines as nm
from tests.unit.fakes.runs import recorded_run
GPU = MemorySpec.from_choice("gpu")
HOST = MemorySpec()


# ---- options --------------------------------------------------------------------------------


def test_a_read_run_crosses_the_wire_with_its_opcode():
    options = ProbeOptions(opcode="read", sizes=(4096,))
    assert ProbeOptions.from_message(options.to_message()).opcode == "read"
    assert ProbeOptions.from_message(ProbeOptions().to_message()).opcode == "write"


@pytest.mark.parametrize("settings, words", [
    ({"opcode": "send"}, "opcode 'send' is not one of write, write_imm, read"),
    ({"opcode": "read", "flush": "asked"}, "a READ run has none"),
])
def test_a_bad_opcode_is_refused_before_anything_runs(settings, words):
    with pytest.raises(UsageError, match=words) as raised:
        ProbeOptions(**settings)
    assert raised.value.exit_code == 2


def test_only_the_servers_qps_are_read_and_nothing_is_written_or_inlined():
    options = ProbeOptions(opcode="read", mode="latency", sizes=(64,))
    server = options.endpoint_options(EndpointOptions(), server=True)
    client = options.endpoint_options(EndpointOptions(), server=False)
    assert (server.remote_read, server.remote_write) == (True, False)
    assert (client.remote_read, client.remote_write) == (False, False)
    assert options.max_inline == server.max_inline == 0   # WRITE latency inlines 220 B
    assert ProbeOptions(mode="latency", sizes=(64,)).max_inline == 220


def test_read_latency_lands_in_host_memory_and_may_read_gpu_memory():
    reads = ProbeOptions(opcode="read", mode="latency", sizes=(64,))
    check_latency_memory(reads, HOST, GPU)          # the NIC reads GPU memory: allowed
    with pytest.raises(UsageError, match="READ latency lands in host memory"):
        check_latency_memory(reads, GPU, HOST)
    with pytest.raises(UsageError, match="host memory on both sides"):
        check_latency_memory(ProbeOptions(mode="latency", sizes=(64,)), HOST, GPU)
    check_latency_memory(ProbeOptions(opcode="read"), GPU, GPU)   # bandwidth: either


# ---- READ credits, as perftest sets them --------------------------------------------------


@pytest.mark.parametrize("init, answer, expected", [
    (16, 16, (16, 16)),      # mlx5: max_qp_init_rd_atom = max_qp_rd_atom = 16
    (128, 128, (128, 128)),  # rxe: RXE_MAX_QP_INIT_RD_ATOM / RXE_MAX_QP_RD_ATOM
    (0, 0, (1, 1)),          # a device that reports none still answers one at a time
    (1000, 300, (255, 255)),  # the QP attributes are 8 bits
])
def test_the_qps_read_credits_are_the_devices(init, answer, expected):
    attr = types.SimpleNamespace(max_qp_init_rd_atom=init, max_qp_rd_atom=answer)
    assert read_credits(attr) == expected


def test_a_qp_never_has_more_reads_out_than_the_peer_answers(monkeypatch):
    from gdrprobe.rdma import endpoint as endpoint_module

    monkeypatch.setattr(endpoint_module.verbs, "pyverbs", lambda: None)
    side = object.__new__(endpoint_module.Endpoint)
    monkeypatch.setattr(endpoint_module.Endpoint, "mtu", 4096)
    side.qps, side.psns = [types.SimpleNamespace(qp_num=5)], (1,)
    side.reads_out, side.reads_in = 16, 16
    side._access_flags = lambda pv: 0
    monkeypatch.setattr(endpoint_module.verbs, "mtu_enum", lambda mtu: mtu)
    seen = []
    side._to_rts = lambda *args: seen.append(args[-1])
    peer = endpoint_module.EndpointAddress("fe80::1", 0, 0, 4096, qp_numbers=(7,), psns=(1,),
                                           read_credits=4)
    side.connect(peer)
    assert seen == [(4, 16)]      # max_rd_atomic by the peer's, max_dest_rd_atomic our own


# ---- the server's side of a READ round ------------------------------------------------------


class Channel:
    """Records what the server sends; answers "done" when it is waited for. tamper, if
    given, runs when the client would be reading (between "ready" and "done")."""

    def __init__(self, tamper=None):
        self.sent, self.tamper = [], tamper

    def send(self, kind, **fields):
        self.sent.append((kind, fields))

    def receive(self, *kinds):
        if self.tamper:
            self.tamper()
        return {"type": "done", "messages": 20}


def read_round(options: ProbeOptions, size: int, tamper=None):
    memory = HostMemory(options.buffer_bytes)
    channel = Channel(tamper and (lambda: tamper(memory)))
    server = object.__new__(ProbeServer)
    seed = _native.pattern_seed(size, 1)
    server._read_round(channel, options, memory, size, seed)
    return memory, seed, channel.sent


def test_the_server_puts_the_sources_in_place_before_the_client_reads():
    options = ProbeOptions(opcode="read", sizes=(65536,), iterations=20)
    memory, seed, sent = read_round(options, 65536)
    assert [kind for kind, _ in sent] == [READY, Verified.KIND]
    sources = options.source_slots(65536)
    assert memory.verify_messages(65536, sources, sources, seed, 0, sources) == (0, 0, -1)
    verified = Verified.from_message(sent[1][1], bandwidth=True)
    assert verified.integrity.ok and verified.integrity.messages_checked == sources


def test_a_source_the_read_round_changed_is_corruption_the_server_reports():
    options = ProbeOptions(opcode="read", sizes=(4096,), iterations=20)

    def wrong_byte(memory):
        ctypes.c_uint8.from_address(memory.cpu_view + 3 * 4096 + 9).value ^= 0x5A

    _, _, sent = read_round(options, 4096, wrong_byte)
    integrity = Verified.from_message(sent[1][1], bandwidth=True).integrity
    assert (integrity.ok, integrity.bad_messages, integrity.bad_bytes) == (False, 1, 1)
    assert integrity.first_bad_offset == 3 * 4096 + 9


def test_a_read_latency_round_lends_one_message_at_the_start():
    options = ProbeOptions(opcode="read", mode="latency", sizes=(256,), iterations=5)
    memory, seed, sent = read_round(options, 256)
    assert memory.verify_pattern(0, 256, seed) == (0, -1)
    verified = Verified.from_message(sent[1][1], bandwidth=False)
    assert verified.integrity.ok and verified.integrity.bytes_checked == 256


# ---- what the report says -------------------------------------------------------------------


@pytest.mark.parametrize("settings, program", [
    ({}, "ib_write_bw"), ({"mode": "latency"}, "ib_write_lat"),
    ({"opcode": "read"}, "ib_read_bw"), ({"opcode": "read", "mode": "latency"}, "ib_read_lat"),
])
def test_each_run_is_named_as_perftest_names_its_program(settings, program):
    assert perftest_program(ProbeOptions(sizes=(64,), **settings)) == program


def test_the_report_titles_a_read_run_as_perftest_does():
    report = recorded_run(10.0, {"kind": "host"})
    read = dataclasses.replace(report, settings=dataclasses.replace(
        report.settings, opcode="read", perftest="ib_read_bw"))
    assert "RDMA_Read BW Test (gdrprobe, in-process, as perftest's ib_read_bw)" in \
        render_run_settings(read)
    assert "RDMA_Write BW Test" in render_run_settings(report)
    assert "what its READs brought" in integrity_method(ProbeOptions(opcode="read"))


def test_read_latency_is_the_whole_operation_as_perftest_reports_it():
    """perftest halves a WRITE ping-pong's round trip and reports a READ's whole
    (print_report_lat: rtt_factor)."""
    summary = _native.RoundTripSummary(10, 4000.0, 5000.0, 5200.0, 100.0, 6000.0, 7000.0, 8000.0)
    ok = Integrity(True, 640, 0, None, 0, None)
    read = latency_result(64, 10, summary, ok, one_way=False)
    write = latency_result(64, 10, summary, ok)
    assert (read.latency_us_min, read.latency_us_median, read.latency_us_p999) == (4.0, 5.0, 7.0)
    assert (write.latency_us_min, write.latency_us_median) == (2.0, 2.5)


# ---- bench -------------------------------------------------------------------------------------


def test_a_read_sweep_reads_in_every_run_and_flushes_nothing(tmp_path):
    nm.v100_no_nvlink(tmp_path)      # a GPU whose receives NCCL flushes
    facts = machine_facts(str(tmp_path), {})
    settings = BenchSettings((4096,), ("host", "dmabuf"), (1,), False, 100, None, 0.5, 128, 100,
                             10, 0.9, 1, opcode="read")
    plan = bench.bench_plan(settings, facts, (), ["mlx5_0"], 30.0)
    options = [plan.run_options(run) for run in plan.runs()]
    assert {o.opcode for o in options} == {"read"} and {o.flush for o in options} == {""}
    assert {o.mode for o in options} == {"bandwidth", "latency"}
