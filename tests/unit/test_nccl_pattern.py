"""NCCL's pattern, the pure half: the job's NCCL settings as NCCL reads them, the connections
and steps they make, the answer per size (sustains, round-trip bound and what would raise
it), the A/B's comparison of the GPU arm's pattern with the host arm's and the verdict it
joins, the run's options and their wire form."""

from __future__ import annotations

import array
import dataclasses
from types import SimpleNamespace

import pytest

from gdrprobe.campaign import nccl_pattern
from gdrprobe.errors import UsageError
from gdrprobe.measure.nccl_shape import NcclShape, pattern_passes
from gdrprobe.nccl.pattern import NcclTransport, transport_settings
from gdrprobe.report.check import DEGRADED, ENGAGED, Verdict
from gdrprobe.report.model import Integrity
from gdrprobe.report.nccl_pattern import (BELOW_PREDICTION, ROUND_TRIP_BOUND, SUSTAINS,
                                          NcclPatternResult, StepPhases)

pytest.importorskip("gdrprobe._native")

from gdrprobe.measure.nccl_sender import Sent, pattern_result  # noqa: E402
from gdrprobe.measure.options import ProbeOptions  # noqa: E402
from gdrprobe.protocol.messages import (Received, Setup, Start, RemoteBuffer,  # noqa: E402
                                        Verified)


# ---- the job's settings ------------------------------------------------------------------

def test_nccl_defaults_give_its_two_step_sizes_one_qp_and_no_split():
    transport = transport_settings({})
    assert transport.step_sizes() == (("p2p", 131072), ("collective", 524288))
    assert (transport.qps_per_connection, transport.split_data_on_qps, transport.use_inline) == \
        (1, False, False)
    assert transport.set == ()


def test_the_variables_are_read_as_ncclloadparam_reads_them():
    transport = transport_settings({"NCCL_P2P_NET_CHUNKSIZE": "0x10000", "NCCL_BUFFSIZE": "8388608",
                                    "NCCL_IB_QPS_PER_CONNECTION": "4",
                                    "NCCL_IB_SPLIT_DATA_ON_QPS": "1",
                                    "NCCL_NCHANNELS_PER_NET_PEER": "0"})
    assert transport.step_sizes() == (("p2p", 65536), ("collective", 1048576))
    assert transport.qps_per_connection == 4 and transport.split_data_on_qps
    assert transport.channels_per_net_peer is None      # 0: NCCL leaves its own choice
    assert "NCCL_BUFFSIZE" in transport.set and "NCCL_IB_USE_INLINE" not in transport.set


@pytest.mark.parametrize("environ,gbps,channels", [
    ({}, None, 1), ({}, 2.5, 1), ({}, 100.0, 1), ({}, 200.0, 2), ({}, 400.0, 4),
    ({}, 800.0, 8), ({"NCCL_NCHANNELS_PER_NET_PEER": "3"}, 400.0, 4),
    ({"NCCL_P2P_PER_CHANNEL_NET_BW": "7"}, 200.0, 4)])
def test_point_to_point_channels_follow_ncclTopoGetNchannels(environ, gbps, channels):
    assert transport_settings(environ).channels(gbps) == channels


def test_adaptive_routing_is_on_for_infiniband_unless_set():
    assert NcclTransport().adaptive_routing_on(True)
    assert not NcclTransport().adaptive_routing_on(False)
    assert transport_settings({"NCCL_IB_ADAPTIVE_ROUTING": "1"}).adaptive_routing_on(False)


@pytest.mark.parametrize("environ", [{"NCCL_IB_QPS_PER_CONNECTION": "65"},
                                     {"NCCL_P2P_NET_CHUNKSIZE": "0"},
                                     {"NCCL_BUFFSIZE": "4"}])
def test_settings_gdrprobe_cannot_run_are_refused_with_the_variable_named(environ):
    with pytest.raises(UsageError, match=next(iter(environ))):
        transport_settings(environ)


# ---- one size's answer -----------------------------------------------------------------

def result(rate: float, step_us: float, size: int = 131072, channels: int = 1,
           data_us: float | None = None, flush_us: float = 0.0) -> NcclPatternResult:
    data = step_us * 0.8 if data_us is None else data_us
    alone = StepPhases(step_us, step_us - data - flush_us, data, flush_us)
    return NcclPatternResult(
        size_bytes=size, channels=channels, qps_per_connection=1, split=False,
        adaptive_routing=False, steps_in_flight=8, steps=100, elapsed_s=1.0, rate_gbps=rate,
        connection_gbps=rate / channels, alone=alone, loaded=alone,
        ceiling_gbps=8 * size * 8 / (step_us * 1000), integrity=Integrity(True, 0, 0, None, 0, None))


def test_a_pattern_at_the_streams_rate_sustains():
    answer = nccl_pattern.answer(10.0, result(9.5, 100.0), NcclTransport())
    assert answer.outcome == SUSTAINS
    assert "inside NCCL" in answer.text and answer.raise_by == ()
    assert any("NCCL_P2P_NET_CHUNKSIZE=131072 (NCCL default)" in s for s in answer.settings)


def test_a_step_time_that_caps_the_connection_is_round_trip_bound_with_its_ceiling():
    # 8 x 128 KiB per 2 ms: 4.19 Gb/s per connection, against a 10 Gb/s stream
    answer = nccl_pattern.answer(10.0, result(4.0, 2000.0), NcclTransport())
    assert answer.outcome == ROUND_TRIP_BOUND
    assert answer.ceiling_gbps == pytest.approx(4.194, abs=1e-3)
    assert answer.predicted_gbps == pytest.approx(answer.ceiling_gbps)
    assert "cannot exceed 4.194 Gb/s per connection" in answer.text
    assert "2000.0 us" in answer.text
    assert answer.raise_by[0].startswith("NCCL_NCHANNELS_PER_NET_PEER=4 (now 1)")
    assert answer.raise_by[1].startswith("NCCL_P2P_NET_CHUNKSIZE=")
    assert "NCCL_IB_QPS_PER_CONNECTION does not" in answer.raise_by[-1]


def test_a_larger_step_is_named_as_the_buffer_for_a_collective_step():
    answer = nccl_pattern.answer(10.0, result(3.0, 8000.0, size=524288), NcclTransport())
    assert answer.shape == "collective" and answer.outcome == ROUND_TRIP_BOUND
    assert answer.raise_by[0].startswith("NCCL_MIN_NCHANNELS=")
    assert answer.raise_by[1].startswith("NCCL_BUFFSIZE=")


def test_the_step_named_would_reach_the_target():
    found = result(4.0, 2000.0)
    size = nccl_pattern.larger_step(found, 10.0, 9.0)
    fixed = found.alone.step_us - found.size_bytes / (10.0 * 1e3 / 8)
    assert 8 * size * 8 / ((fixed + size / (10.0 * 1e3 / 8)) * 1e3) >= 9.0
    assert size & (size - 1) == 0


def test_a_pattern_short_of_its_own_ceiling_says_so():
    answer = nccl_pattern.answer(10.0, result(5.0, 100.0), NcclTransport())
    assert answer.outcome == BELOW_PREDICTION


# ---- the A/B --------------------------------------------------------------------------------

@dataclasses.dataclass
class Run:
    nccl: tuple
    bandwidth: tuple = ()


def test_a_gpu_arm_whose_pattern_falls_below_the_host_arms_is_degraded_with_the_phase_named():
    host = [Run((result(4.0, 100.0, flush_us=0.0),)) for _ in range(3)]
    gpu = [Run((result(2.0, 300.0, data_us=80.0, flush_us=200.0),)) for _ in range(3)]
    check = nccl_pattern.pattern_check(host, gpu, NcclTransport())
    assert check.outcome == DEGRADED and check.ratios[0].phase == "flush"
    assert "flush phase" in check.detail
    verdict = nccl_pattern.join(Verdict(ENGAGED, mechanism="dmabuf", ratio=1.0), check)
    assert verdict.classification == DEGRADED and verdict.exit_code == 1
    assert "flush" in verdict.likely_causes[1] and "NCCL_GDR_FLUSH_DISABLE" in verdict.fix


def test_the_phase_named_is_the_one_that_grew():
    host = [Run((result(4.0, 100.0),))]
    gpu = [Run((result(2.0, 400.0, data_us=380.0),))]
    assert nccl_pattern.pattern_check(host, gpu, NcclTransport()).ratios[0].phase == "data"


def test_ratios_that_straddle_leave_an_engaged_answer_inconclusive():
    host = [Run((result(4.0, 100.0),)) for _ in range(3)]
    gpu = [Run((result(rate, 100.0),)) for rate in (3.0, 3.9, 3.8)]
    check = nccl_pattern.pattern_check(host, gpu, NcclTransport())
    verdict = nccl_pattern.join(Verdict(ENGAGED, ratio=1.0), check)
    assert verdict.inconclusive and verdict.exit_code == 12


def test_a_gpu_arm_that_keeps_the_pattern_leaves_the_verdict():
    host = [Run((result(4.0, 100.0),))]
    gpu = [Run((result(3.9, 102.0),))]
    engaged = Verdict(ENGAGED, ratio=1.0)
    check = nccl_pattern.pattern_check(host, gpu, NcclTransport())
    assert check.outcome == "within" and nccl_pattern.join(engaged, check) == engaged


def test_a_verdict_that_is_not_engaged_is_the_streams_answer():
    host = [Run((result(4.0, 100.0),))]
    gpu = [Run((result(1.0, 400.0),))]
    degraded = Verdict(DEGRADED, ratio=0.5)
    assert nccl_pattern.join(degraded, nccl_pattern.pattern_check(host, gpu, NcclTransport())) \
        == degraded


# ---- a round's report from both sides' step times ------------------------------------------

def sent(wait_ns: tuple[int, ...], data_ns: tuple[int, ...]) -> Sent:
    """The sender's times over a pass (the loop's uint64 ns, each less its clock read)."""
    times = Sent()
    times.add(SimpleNamespace(wait_ns=array.array("Q", wait_ns).tobytes(),
                              data_ns=array.array("Q", data_ns).tobytes()))
    return times


def round_report(alone_step_ns: int, alone_flush_ns: int, alone_data_ns: tuple[int, ...]):
    received = Received(steps=800, elapsed_ns=8_000_000, alone_step_ns=alone_step_ns,
                        alone_recv_ns=alone_step_ns - alone_flush_ns,
                        alone_flush_ns=alone_flush_ns, loaded_step_ns=80_000,
                        loaded_flush_ns=alone_flush_ns, flush_reads=0, flush_bad=0)
    return pattern_result(ProbeOptions(pattern="nccl", sizes=(131072,)), 131072, received,
                          (sent((0,) * 3, alone_data_ns), sent((2_000, 0, 4_000), (9_000,) * 3)),
                          Verified(Integrity(True, 0, 0, None, 0, None), 0.0), passes=2)


def test_a_step_alone_is_its_clear_to_send_data_and_flush_each_less_its_clock_read():
    # The loops take one clock read out of each phase, so the rest of the step (its
    # clear-to-send) is the step less data and flush, none of the three holding a read.
    row = round_report(30_000, 4_000, (20_000, 21_000, 25_000))
    assert row.alone == StepPhases(30.0, 5.0, 21.0, 4.0)
    assert row.loaded == StepPhases(80.0, 2.0, 9.0, 4.0)
    assert row.ceiling_gbps == pytest.approx(8 * 131072 * 8 / 30_000)
    assert row.rate_gbps == pytest.approx(800 * 131072 * 8 / 8_000_000)


def test_a_clear_to_send_left_below_zero_by_two_clocks_is_zero():
    # data is timed on the sender's clock, the step on the receiver's: their medians may
    # leave less than nothing for the clear-to-send, which is then 0, never negative.
    assert round_report(30_000, 4_000, (27_000,)).alone.cts_us == 0.0


# ---- the run's options and the wire ----------------------------------------------------------

def test_a_pattern_run_makes_ncclS_queues_and_lets_the_receiver_write_the_fifo():
    options = ProbeOptions(pattern="nccl", nccl=NcclShape(channels=2, qps_per_connection=3),
                           sizes=(131072,), qps=1)
    client = options.endpoint_options(options_base(), server=False)
    assert (client.num_qps, client.tx_depth, client.rx_depth, client.remote_write) == \
        (6, 512, 256, True)
    assert options.pattern_bytes == 2 * 131072
    assert options.buffer_bytes >= 2 * options.nccl_ring(131072) * 131072


def options_base():
    from gdrprobe.rdma.endpoint import EndpointOptions

    return EndpointOptions()


@pytest.mark.parametrize("settings", [dict(mode="latency"), dict(bidir=True),
                                      dict(duration_s=1.0), dict(opcode="read"),
                                      dict(sample_integrity=True), dict(pattern="gloo")])
def test_a_pattern_run_refuses_what_it_does_not_measure(settings):
    with pytest.raises(UsageError):
        ProbeOptions(**{"pattern": "nccl", **settings})


def test_the_ring_holds_nccl_steps_at_least_and_a_round_is_its_steps_alone_then_rings():
    options = ProbeOptions(pattern="nccl", sizes=(1 << 20,))
    assert options.nccl_ring(1 << 20) == 8 and options.nccl_ring(131072) == 32
    assert pattern_passes(100, 32) == [16, 32, 32, 32, 4]     # the steps alone, then rings
    assert pattern_passes(1, 8) == [8, 1]


def test_the_pattern_travels_in_setup_and_start():
    options = ProbeOptions(pattern="nccl", nccl=NcclShape(channels=2, adaptive_routing=True))
    assert ProbeOptions.from_message(options.to_message()) == options
    start = Start(131072, 3, "nccl", 96)
    assert Start.from_message(start.to_message() | {"type": "start"}, 1 << 20) == start
    assert Start.from_message({"size": 8, "round": 1}, 8) == Start(8, 1)
    fifo = RemoteBuffer(4096, 7, 131072)
    message = Setup(options, address(), None, None, fifo).to_message()
    assert Setup.from_message(message, ProbeOptions.from_message, lambda m: m).fifo == fifo
    received = Received(10, 20, 30, 40, 50, 60, 70, 80, 0)
    assert Received.from_message(received.to_message()) == received


def address():
    from gdrprobe.rdma.endpoint import EndpointAddress

    return EndpointAddress("fe80:0000:0000:0000:0000:0000:0000:0001", 1, 0, 4096, (5,), (9,))


def test_a_start_of_an_unknown_pattern_is_the_peers_fault():
    from gdrprobe.errors import PeerError

    with pytest.raises(PeerError):
        Start.from_message({"size": 8, "round": 1, "pattern": "mpi"}, 8)


def test_the_run_and_check_texts_say_each_rounds_phases_and_answer():
    from gdrprobe.report.nccl_pattern import render_check_pattern, render_run_pattern

    found = result(4.0, 2000.0)
    answer = nccl_pattern.answer(10.0, found, NcclTransport())
    text = "\n".join(render_run_pattern((found,), (answer,)))
    assert "131072 B steps, 1 channel(s) x 1 QP(s), 8 in flight" in text
    assert "a step alone: 2000.0 us (clear-to-send" in text
    assert "round-trip bound: NCCL cannot exceed" in text and "would raise it:" in text
    check = nccl_pattern.pattern_check([Run((found,))], [Run((result(1.0, 4000.0),))],
                                       NcclTransport())
    assert "NCCL's pattern: degraded" in "\n".join(render_check_pattern(check))


def test_check_runs_the_pattern_at_ncclS_steps_for_a_number_of_steps():
    options = ProbeOptions(sizes=(1 << 20,), qps=2, duration_s=0.5)
    shaped = nccl_pattern.check_options(options, host_gbps=100.0, shape=NcclShape(),
                                        transport=NcclTransport())
    assert shaped.sizes == (131072, 524288) and shaped.duration_s is None
    assert shaped.iterations == int(100e9 / 8 * 0.5 / 524288) and shaped.pattern == "nccl"


def test_a_pattern_asked_with_what_it_does_not_measure_is_refused_before_anything():
    nccl_pattern.check_pattern(None, {"mode": "latency"})
    with pytest.raises(UsageError, match="--pattern 'mpi'"):
        nccl_pattern.check_pattern("mpi", {})
    with pytest.raises(UsageError, match="--pattern nccl measures WRITE bandwidth"):
        nccl_pattern.check_pattern("nccl", {"mode": "latency", "sizes": None})
