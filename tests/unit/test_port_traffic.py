"""Other traffic on the port (campaign/port_traffic.py): the counters sysfs keeps, what a run
itself puts on the wire, the tolerance, and a check whose answer another job's traffic
makes inconclusive; and a GPU another process holds (campaign/prelaunch.held_elsewhere).
The runs are recorded ones; the counters a fixture tree or a stand-in."""

from __future__ import annotations

import dataclasses
import enum

import pytest

from gdrprobe.campaign import port_traffic as pt
from gdrprobe.campaign import prelaunch
from gdrprobe.campaign.gate import Budget, rank_pair
from gdrprobe.campaign.machine import machine_facts
from gdrprobe.errors import GpuUnusable, Inconclusive
from gdrprobe.memory import cuda
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor import nccl_machines as nm
from tests.unit.fake_cuda import FakeDriver
from tests.unit.fakes.runs import SIZE, recorded_run
from tests.unit.fakes.prelaunch import GATE
RXE = "/sys/class/infiniband/rxe0/ports/1/hw_counters"
MLX = "/sys/class/infiniband/mlx5_0/ports/1/counters"


def write(root, path: str, text: str) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def test_octet_counters_count_4_octet_words_and_rxe_counts_packets(tmp_path):
    write(tmp_path, f"{MLX}/port_xmit_data", "1000\n")
    write(tmp_path, f"{MLX}/port_rcv_data", "250\n")
    write(tmp_path, f"{RXE}/sent_pkts", "17\n")
    write(tmp_path, f"{RXE}/rcvd_pkts", "16\n")
    root = SysRoot(str(tmp_path))
    mlx = pt.read_counts("mlx5_0", 1, root)
    assert (mlx.unit, mlx.sent, mlx.received) == ("octets", 4000, 1000)
    rxe = pt.read_counts("rxe0", 1, root)
    assert (rxe.unit, rxe.sent, rxe.received) == ("packets", 17, 16)
    assert pt.read_counts("siw0", 1, root) is None


def test_the_packets_a_responder_received_again_are_read_with_the_counters(tmp_path):
    write(tmp_path, f"{RXE}/sent_pkts", "17\n")
    write(tmp_path, f"{RXE}/rcvd_pkts", "16\n")
    write(tmp_path, f"{RXE}/duplicate_request", "5\n")
    write(tmp_path, f"{RXE}/out_of_seq_request", "2\n")
    assert pt.read_counts("rxe0", 1, SysRoot(str(tmp_path))).resent == 7
    write(tmp_path, f"{MLX}/port_xmit_data", "1000\n")
    write(tmp_path, f"{MLX}/port_rcv_data", "250\n")
    write(tmp_path, "/sys/class/infiniband/mlx5_0/ports/1/hw_counters/out_of_sequence", "3\n")
    assert pt.read_counts("mlx5_0", 1, SysRoot(str(tmp_path))).resent == 3


def test_a_runs_own_resent_packets_are_not_another_jobs_traffic():
    """rxe under a stalled emulator: the run's requesters time out and send again, and the
    responder acknowledges each duplicate again: in loopback, two packets each way."""
    own = pt.OwnTraffic(payload=1000, sent_most=1100, received_most=1100)
    before = pt.PortCounts(pt.PACKETS, 0, 0, "x", resent=10)
    resending = pt.PortCounts(pt.PACKETS, 1500, 1500, "x", resent=210)
    assert pt.foreign_line(before, resending, own, 0.9) is None
    other_job = pt.PortCounts(pt.PACKETS, 1700, 1700, "x", resent=210)
    line = pt.foreign_line(before, other_job, own, 0.9)
    assert "at most 1500 out and 1500 in (with 200 packets its responders received again)" in line
    # Octet counters: a resent request is a path MTU and headers, its acknowledgement headers;
    # against a server the requests come in and the acknowledgements go out.
    octets = pt.own_traffic(posted_run(10, 8192, mtu=4096), pt.OCTETS, loopback=False)
    assert (octets.per_resend_in, octets.per_resend_out) == (4096 + pt.HEADER_BYTES, pt.HEADER_BYTES)
    looped = pt.own_traffic(posted_run(10, 8192, mtu=4096), pt.OCTETS, loopback=True)
    assert looped.per_resend_in == looped.per_resend_out == 4096 + 2 * pt.HEADER_BYTES


def posted_run(posted: int, size: int = SIZE, mtu: int = 4096):
    run = recorded_run(390.0, {"kind": "host"})          # near a 400 Gb/s port's line rate
    row = dataclasses.replace(run.bandwidth[0], size_bytes=size, messages_posted=posted)
    ends = {side: dataclasses.replace(getattr(run, side), mtu_bytes=mtu)
            for side in ("local", "remote")}
    return dataclasses.replace(run, bandwidth=(row,), **ends)


def test_a_runs_own_traffic_in_rxe_packets_follows_rxes_acknowledgement_rule():
    # 64 KiB at a 4096 B path MTU: 16 request packets, one acknowledgement (the last asks).
    own = pt.own_traffic(posted_run(100, 65536), pt.PACKETS, loopback=True)
    assert (own.payload, own.sent_most, own.received_most) == (1600, 1700, 1700)
    # 1 MiB: 256 packets, acknowledgements asked on packets 66, 132, 198 and the last.
    big = pt.own_traffic(posted_run(10, 1 << 20), pt.PACKETS, loopback=False)
    assert (big.payload, big.sent_most, big.received_most) == (2560, 2560, 40)


def test_a_runs_own_traffic_in_octets_allows_headers_and_an_ack_per_packet():
    own = pt.own_traffic(posted_run(10, 8192, mtu=4096), pt.OCTETS, loopback=False)
    assert own.payload == 81920
    assert own.sent_most == 81920 + 20 * pt.HEADER_BYTES
    assert own.received_most == 20 * pt.HEADER_BYTES


def test_the_tolerance_is_what_could_turn_the_verdict_by_itself():
    assert pt.tolerance(0.9) == pytest.approx(1 / 9)
    counts = lambda sent: pt.PortCounts(pt.PACKETS, sent, sent, "x")   # noqa: E731
    own = pt.OwnTraffic(payload=1000, sent_most=1100, received_most=1100)
    assert pt.foreign_line(counts(0), counts(1211), own, 0.9) is None
    line = pt.foreign_line(counts(0), counts(2100), own, 0.9)
    assert line.startswith("the port sent 2100 and received 2100 packets while the run's own "
                           "traffic was at most 1100 out and 1100 in: 1000 packets more")


class Counters:
    """A port whose counters move with each run's own octets, plus `foreign` per run."""

    def __init__(self, foreign: int = 0):
        self.sent = self.received = 0
        self.foreign = foreign

    def read(self, device, port):
        return pt.PortCounts(pt.OCTETS, self.sent, self.received, f"{device}:{port}")

    def runner(self, options, endpoint, host=None, port=None, token=None, **ignored):
        def probe(local, remote):
            gpu = "gpu" in (local.kind, remote.kind)
            run = posted_run(100, SIZE)
            memory = {"kind": "gpu", "mechanism": "dmabuf"} if gpu else {"kind": "host"}
            run = dataclasses.replace(run, local=dataclasses.replace(run.local, memory=memory))
            moved = 100 * SIZE + self.foreign
            self.sent += moved
            self.received += moved
            return run
        return probe


@pytest.fixture
def machine(tmp_path, monkeypatch):
    nm.hgx_8gpu_4nic(tmp_path)
    return machine_facts(str(tmp_path), {}), {"GDRPROBE_LOCK_DIR": str(tmp_path / "locks")}


def check_with(counters, facts, locks, monkeypatch, gate=GATE, gpu="0000:1b:00.0"):
    from gdrprobe.measure import loopback

    monkeypatch.setattr(loopback, "runner", counters.runner)
    monkeypatch.setattr(pt, "read_counts", counters.read)
    pair = rank_pair({}, facts.gpus, facts.nics, gpu=gpu)
    return prelaunch.check_pair(pair, facts, gate, Budget(60.0), locks)


def test_a_quiet_port_leaves_the_answer_as_measured(machine, monkeypatch):
    facts, locks = machine
    report = check_with(Counters(), facts, locks, monkeypatch)
    assert report.verdict.classification == "engaged" and report.verdict.exit_code == 0
    assert report.placement.port_traffic.startswith(
        "mlx5_0 port 1's counters read around each run: no other traffic in 4 runs")


def test_another_jobs_traffic_on_the_port_is_inconclusive_not_degraded(machine, monkeypatch):
    facts, locks = machine
    report = check_with(Counters(foreign=60 * SIZE), facts, locks, monkeypatch)
    verdict = report.verdict
    assert verdict.exit_code == 12 and verdict.inconclusive
    assert verdict.classification == "engaged"           # what the median said, kept
    assert "inconclusive: other traffic shared the port during the runs" in verdict.evidence[1]
    assert any(line.startswith("another job's traffic: run 1 on mlx5_0 port 1: the port sent")
               for line in verdict.evidence)
    assert "other traffic in" in report.placement.port_traffic


def test_other_traffic_stops_the_extra_repeats_that_could_not_settle_it(machine, monkeypatch):
    """The straddling ratios would sample on to 16 repeats; with the port shared, the
    planned three are all there is to learn."""
    facts, locks = machine
    counters = Counters(foreign=60 * SIZE)
    runner = counters.runner
    speeds = iter([390.0, 300.0] * 20)

    def straddling(*args, **kwargs):
        probe = runner(*args, **kwargs)

        def run(local, remote):
            report = probe(local, remote)
            if "gpu" not in (local.kind, remote.kind):
                return report
            row = dataclasses.replace(report.bandwidth[0], bandwidth_avg_gbps=next(speeds))
            return dataclasses.replace(report, bandwidth=(row,))
        return run

    counters.runner = straddling
    report = check_with(counters, facts, locks, monkeypatch)
    assert report.repeats == GATE.criteria.repeats == 3 and report.verdict.exit_code == 12


# ---- a GPU another process holds (CUDA_ERROR_DEVICE_UNAVAILABLE) -------------------------


class Held(enum.IntEnum):
    CUDA_ERROR_DEVICE_UNAVAILABLE = 46     # cuda.h


class HeldDriver(FakeDriver):
    """A GPU in exclusive-process mode another process holds: no context can be made."""

    def cuDevicePrimaryCtxRetain(self, device):
        self.calls.append("cuDevicePrimaryCtxRetain")
        return (Held.CUDA_ERROR_DEVICE_UNAVAILABLE, None)


def held_error(bus: str) -> GpuUnusable:
    """The error gdrprobe's own CUDA layer raises opening that GPU."""
    driver = HeldDriver(bus_id=("0000" + bus.upper()).encode())
    with pytest.raises(GpuUnusable) as raised:
        cuda.GpuDevice(driver, 0, bus)
    return raised.value


def test_the_error_names_the_gpu_that_is_held():
    assert prelaunch.held_gpu(held_error("0000:1b:00.0")) == "0000:1b:00.0"
    assert prelaunch.held_gpu(GpuUnusable("fabric manager", evidence="cuInit(0): "
                                          "CUDA_ERROR_SYSTEM_NOT_READY")) is None


def held_runner(bus: str):
    def runner(options, endpoint, host=None, port=None, token=None, **ignored):
        def probe(local, remote):
            if bus in (local.gpu if local.kind == "gpu" else "",
                       remote.gpu if remote.kind == "gpu" else ""):
                raise held_error(bus)
            return posted_run(100)
        return probe
    return runner


# GPU 0000:1d:00.0 sends through its PXN peer 0000:1b:00.0's memory (the fixture node).
CHECKED, PEER = "0000:1d:00.0", "0000:1b:00.0"


@pytest.mark.parametrize("held, job_gpus, expected", [
    (PEER, None, Inconclusive),                      # a rank's check: the peer may be a rank's
    (PEER, (CHECKED,), Inconclusive),                # a node check: the peer is not the job's
    (PEER, (CHECKED, PEER), GpuUnusable),            # the peer is the job's: it would crash
    (CHECKED, None, GpuUnusable),                    # the checked GPU itself
])
def test_a_held_gpu_that_is_not_the_jobs_is_inconclusive_never_a_drain(
        machine, monkeypatch, held, job_gpus, expected):
    from gdrprobe.measure import loopback

    facts, locks = machine
    monkeypatch.setattr(loopback, "runner", held_runner(held))
    pair = rank_pair({}, facts.gpus, facts.nics, gpu=CHECKED)
    gate = dataclasses.replace(GATE, job_gpus=job_gpus)
    with pytest.raises(expected) as raised:
        prelaunch.check_pair(pair, facts, gate, Budget(60.0), locks)
    assert type(raised.value) is expected
    if expected is Inconclusive:
        assert raised.value.exit_code == 12
        assert raised.value.cause.startswith(f"inconclusive: GPU {PEER}, which this check "
                                             f"opened for {CHECKED}'s sends")
    else:
        assert raised.value.exit_code == 11
