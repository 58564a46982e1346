"""check's extra answers (issue 31, re-founded on NCCL's traffic by issue 39 items 5 and 6):
"latency degraded" from the latency A/B with the buffers where NCCL's LL protocol puts them
(a warning, exit 13, never a drain), "GDR read degraded" from WRITEs out of GPU memory (the
NIC reading it as the source of sends, NCCL_NET_GDR_READ=0 named) while the two-ended WRITE
A/B passes, NCCL's flush in the report and in the bidirectional rounds; reachable from the
CLI, the API and the JSON. The runs are recorded ones, shaped by the options each runner is
made with."""

from __future__ import annotations

import dataclasses
import json

import pytest

import gdrprobe
from gdrprobe.campaign import prelaunch, secondary
from gdrprobe.campaign.ab import plan_arms, run_ab
from gdrprobe.campaign.gate import Budget, rank_pair
from gdrprobe.campaign.machine import machine_facts
from gdrprobe.campaign.plan import Buffer, CheckPlan, Criteria
from gdrprobe.cli import main
from gdrprobe.errors import DRAIN_CODES, SCHEDULER_ACTION, WARN, ExitCode, UsageError
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.memory.spec import MemorySpec
from gdrprobe.report.check_text import render_check
from gdrprobe.report.model import Integrity, LatencyResult, to_json
from tests.unit.doctor import nccl_machines as nm
from tests.unit.fakes.runs import SETTINGS, fake_probe, recorded_run
GPU = MemorySpec.from_choice("gpu")
GPU_BUS = "0000:1b:00.0"


def latency_run(median_us: float, memory: dict):
    ok = Integrity(True, 8, 0, None, 0, None)
    rows = tuple(LatencyResult(size, 1000, median_us, median_us, median_us, 0.0, median_us,
                               median_us, median_us, ok, 0.01) for size in (8, 4096))
    report = recorded_run(1.0, memory)
    return dataclasses.replace(report, bandwidth=(), latency=rows)


@dataclasses.dataclass
class Machine:
    """What each kind of run measures: WRITE bandwidth (Gb/s) with GPU memory at both ends,
    out of GPU memory into host memory (the NIC reading it: NCCL's sends), READ bandwidth,
    latency (us)."""

    gpu_write: float = 380.0
    gpu_send: float = 380.0
    gpu_read: float = 380.0
    gpu_latency_us: float | list = 2.1     # a list: each GPU latency run's, in turn
    gpu_bidir: float = 380.0
    made: list = dataclasses.field(default_factory=list)
    options: list = dataclasses.field(default_factory=list)
    memory: list = dataclasses.field(default_factory=list)

    def runner(self, options, endpoint, host=None, port=None, token=None, **ignored):
        def probe(local, remote):
            self.made.append((options.mode, "bidir" if options.bidir else options.opcode))
            self.options.append(options)
            self.memory.append((local.kind, remote.kind))
            gpu = "gpu" in (local.kind, remote.kind)
            memory = {"kind": "gpu", "mechanism": "dmabuf"} if gpu else {"kind": "host"}
            if options.mode == "latency":
                return latency_run(self.next_gpu_latency() if gpu else 2.0, memory)
            sends = (local.kind, remote.kind) == ("gpu", "host")
            gbps = (self.gpu_bidir if options.bidir else self.gpu_read if options.opcode == "read"
                    else self.gpu_send if sends else self.gpu_write) if gpu else 390.0
            return recorded_run(gbps, memory)
        return probe

    def next_gpu_latency(self) -> float:
        if isinstance(self.gpu_latency_us, list):
            return self.gpu_latency_us.pop(0)
        return self.gpu_latency_us


@pytest.fixture
def machine(monkeypatch):
    from gdrprobe.measure import loopback

    measured = Machine()
    monkeypatch.setattr(loopback, "runner", measured.runner)
    return measured


def check(tmp_path, environ=None, **asked):
    nm.hgx_8gpu_4nic(tmp_path)
    facts = machine_facts(str(tmp_path), environ or {})
    answers = tuple(name for name in prelaunch.EXTRA_ANSWERS if asked.pop(name, False))
    gate = CheckPlan(options=ProbeOptions(sizes=(1 << 20,), qps=2), send=Buffer("gpu"),
                     receive=Buffer("gpu"), criteria=Criteria(answers=answers, **asked))
    pair = rank_pair({}, facts.gpus, facts.nics, gpu=GPU_BUS)
    return prelaunch.check_pair(pair, facts, gate, Budget(30.0),
                                {"GDRPROBE_LOCK_DIR": str(tmp_path / "locks")})


def test_gpu_latency_over_the_factor_is_latency_degraded_a_warning_never_a_drain(
        tmp_path, machine):
    machine.gpu_latency_us = 5.0            # 2.5x the host arm's 2.0 us
    report = check(tmp_path, latency=True)
    assert ("latency", "write_imm") in machine.made
    # NCCL's LL protocol: send buffers in host memory, receives in GPU memory, no flush, data
    # posted without inline (net.cc NCCL_NET_MAP_ADD_POINTER; net_ib/p2p.cc)
    latency = [o for o in machine.options if o.mode == "latency"]
    assert all((o.send_memory, o.flush, o.max_inline) == ("host", "", 0) for o in latency)
    assert report.latency.outcome == "latency degraded"
    assert report.latency.degraded_sizes == (8, 4096)
    assert report.latency.factor == 2.0 and "default" in report.latency.factor_source
    assert report.verdict.classification == "engaged"
    assert report.verdict.exit_code == ExitCode.PERFORMANCE_WARNING
    assert SCHEDULER_ACTION[report.verdict.exit_code] == WARN
    assert report.verdict.exit_code not in DRAIN_CODES
    assert "latency degraded" in report.verdict.warnings[0]
    assert "warning: latency degraded" in render_check(report)


def test_gpu_latency_near_the_hosts_is_within_bounds_and_starts_the_job(tmp_path, machine):
    report = check(tmp_path, latency=True)
    assert report.latency.outcome == "within bounds"
    assert report.latency.ratios[0].gpu_over_host == pytest.approx(1.05)
    assert report.verdict.exit_code == ExitCode.OK and not report.verdict.warnings


def test_latency_over_the_factor_in_some_pairs_only_is_inconclusive_and_warns_of_nothing(
        tmp_path, machine):
    # Load that came and went: two of three GPU runs at 2.5x the host runs before them, one
    # at par. The medians are over the factor; one pair is not: no answer, no warning.
    machine.gpu_latency_us = [5.0, 5.0, 2.1]
    report = check(tmp_path, latency=True, repeats=3)
    assert report.latency.outcome == "inconclusive"
    assert report.latency.inconclusive_sizes == (8, 4096) and report.latency.degraded_sizes == ()
    assert report.latency.ratios[0].pair_ratios == pytest.approx((2.5, 2.5, 1.05))
    assert report.verdict.exit_code == ExitCode.OK and not report.verdict.warnings
    assert "(each pair: 2.50, 2.50, 1.05)" in render_check(report)
    assert json.loads(to_json(report))["latency"]["inconclusive_sizes"] == [8, 4096]


def test_latency_over_the_factor_in_every_pair_is_degraded(tmp_path, machine):
    machine.gpu_latency_us = [5.0, 4.5, 6.0]
    report = check(tmp_path, latency=True, repeats=3)
    assert report.latency.outcome == "latency degraded"
    assert report.latency.degraded_sizes == (8, 4096) and report.latency.inconclusive_sizes == ()
    assert report.verdict.exit_code == ExitCode.PERFORMANCE_WARNING


def test_a_given_factor_bounds_the_ratio(tmp_path, machine):
    machine.gpu_latency_us = 5.0
    report = check(tmp_path, latency=True, latency_factor=3.0,
                   latency_factor_source="as given")
    assert report.latency.outcome == "within bounds"
    assert report.verdict.exit_code == ExitCode.OK


def test_sends_out_of_gpu_memory_below_the_threshold_are_gdr_read_degraded(tmp_path, machine):
    """NCCL's data path is RDMA WRITE (net_ib/p2p.cc): "GDR read" is the NIC reading GPU
    memory as the source of its WRITEs. Was: an RDMA READ A/B, which NCCL never runs."""
    machine.gpu_send = 150.0
    report = check(tmp_path, read=True)
    assert ("bandwidth", "read") not in machine.made
    assert ("gpu", "host") in machine.memory            # GPU source, host destination
    assert report.read.outcome == "GDR read degraded"
    assert "NCCL_NET_GDR_READ=0" in report.read.mitigation
    assert "WRITEs out of GPU memory" in report.read.detail
    assert report.read.verdict.classification == "degraded"
    assert report.read.verdict.arms[0].direction == "read"
    assert report.verdict.classification == "engaged"       # GPU memory at both ends passes
    assert report.verdict.exit_code == ExitCode.PERFORMANCE_WARNING
    assert "NCCL_NET_GDR_READ=0" in report.verdict.warnings[0]


def test_rdma_read_evidence_does_not_make_a_gdr_read_answer(tmp_path, machine):
    machine.gpu_read = 150.0                      # READ slow: NCCL's data never READs
    report = check(tmp_path, read=True)
    assert report.read.outcome == "within bounds"
    assert report.verdict.exit_code == ExitCode.OK


def test_sends_nccl_keeps_off_gpudirect_are_not_measured(tmp_path, machine):
    report = check(tmp_path, environ={"NCCL_NET_GDR_READ": "0"}, read=True)
    assert report.read.outcome == "not run"
    assert "NCCL sends this GPU's data from host memory" in report.read.detail
    assert ("gpu", "host") not in machine.memory


def test_read_that_keeps_up_is_within_bounds(tmp_path, machine):
    report = check(tmp_path, read=True)
    assert report.read.outcome == "within bounds"
    assert report.verdict.exit_code == ExitCode.OK


def test_the_extra_answers_wait_for_an_engaged_write_answer(tmp_path, machine):
    machine.gpu_write, machine.gpu_read, machine.gpu_latency_us = 100.0, 100.0, 9.0
    report = check(tmp_path, latency=True, read=True)
    assert {kind for kind in machine.made} == {("bandwidth", "write")}
    assert report.latency.outcome == report.read.outcome == "not run"
    assert "comes first" in report.read.detail
    assert report.verdict.exit_code == ExitCode.VERDICT_NOT_OK


def test_unasked_extra_answers_are_not_measured(tmp_path, machine):
    report = check(tmp_path)
    assert report.latency is None and report.read is None
    assert {kind for kind in machine.made} == {("bandwidth", "write")}


def flushed_run(gbps: float, memory: dict, reads: int, bad: int = 0, median_us=3.5):
    report = recorded_run(gbps, memory)
    row = report.bandwidth[0]
    integrity = dataclasses.replace(row.integrity, flush_reads=reads, flush_bad=bad,
                                    flush_us_median=median_us)
    settings = dataclasses.replace(SETTINGS, flush="NCCL flushes here (p2p.cc)")
    return dataclasses.replace(report, settings=settings,
                               bandwidth=(dataclasses.replace(row, integrity=integrity),))


def test_the_flush_s_correctness_is_in_the_check_report():
    def run_once(local, remote):
        if local.kind == "host":
            return recorded_run(100.0, {"kind": "host"})
        return flushed_run(97.0, {"kind": "gpu", "mechanism": "dmabuf"}, reads=12)

    report = run_ab(run_once, plan_arms(GPU, GPU, False), repeats=2)
    assert report.flush.reads == 24 and report.flush.bad == 0
    assert report.flush.median_us == 3.5
    assert "brought back the byte its message wrote last" in report.flush.outcome
    assert "NCCL's flush: each of 24 flush READs" in render_check(report)
    assert json.loads(to_json(report))["flush"]["reads"] == 24


def test_no_flush_no_flush_report():
    run_once, _ = fake_probe(gpu_gbps=97.0)
    assert run_ab(run_once, plan_arms(GPU, GPU, False), repeats=2).flush is None


def test_a_flush_read_that_brought_back_another_byte_is_said():
    from gdrprobe.errors import IntegrityError

    from gdrprobe.measure.client import raise_if_corrupt

    bad = Integrity(True, 8, 0, None, 0, None, flush_reads=4, flush_bad=1,
                    first_flush_bad_offset=0)
    with pytest.raises(IntegrityError) as raised:
        raise_if_corrupt(bad, 8, "the server")
    found = secondary.flush_check([], raised.value)
    assert found.outcome.startswith("failed")
    assert "flush READ brought back another byte than the last message wrote" in found.outcome
    # corruption that is not the flush's says nothing about it
    assert secondary.flush_check([], IntegrityError("payload corrupted: 3 bytes wrong")) is None


def test_the_json_carries_the_extra_answers(tmp_path, machine):
    machine.gpu_latency_us = 5.0
    document = json.loads(to_json(check(tmp_path, latency=True, read=True)))
    assert document["latency"]["outcome"] == "latency degraded"
    assert document["read"]["outcome"] == "within bounds"
    assert document["verdict"]["exit_code"] == 13
    assert document["verdict"]["warnings"]


@pytest.mark.parametrize("asked, message", [
    (dict(latency_factor=3.0), "which --latency asks for"),
    (dict(latency=True, latency_factor=1.0), "over 1 and at most 100"),
])
def test_a_latency_factor_is_refused_before_anything_is_probed(monkeypatch, asked, message):
    from gdrprobe.campaign import machine

    monkeypatch.setattr(machine, "machine_facts",
                        lambda **kwargs: pytest.fail("the doctor ran"))
    with pytest.raises(UsageError, match=message):
        gdrprobe.check(**asked)


def test_the_cli_asks_the_api_for_them(monkeypatch, capsys):
    asked = []

    def recorded_check(**kwargs):
        asked.append(kwargs)
        run_once, _ = fake_probe(gpu_gbps=97.0)
        return run_ab(run_once, plan_arms(GPU, GPU, False), repeats=2)

    monkeypatch.setattr(gdrprobe, "check", recorded_check)
    assert main(["check", "--latency", "--read", "--bidir", "--latency-factor", "3",
                 "--quiet"]) == 0
    assert (asked[-1]["latency"], asked[-1]["read"], asked[-1]["bidir"],
            asked[-1]["latency_factor"]) == (True, True, True, 3.0)
    assert main(["check", "--quiet"]) == 0
    assert (asked[-1]["latency"], asked[-1]["read"], asked[-1]["bidir"]) == (False,) * 3


def test_require_starts_the_job_on_a_warning(monkeypatch, tmp_path, machine):
    machine.gpu_latency_us = 5.0
    warned = check(tmp_path, latency=True)
    monkeypatch.setattr(gdrprobe, "check", lambda **kwargs: warned)
    assert gdrprobe.require(latency=True) is warned


def test_a_node_check_line_and_the_quiet_line_say_the_warning(tmp_path, machine):
    from gdrprobe.cli.check import one_line
    from gdrprobe.report.check import NodeGpuCheck
    from gdrprobe.report.check_text import node_line

    machine.gpu_latency_us = 5.0
    report = check(tmp_path, latency=True)
    line = node_line(NodeGpuCheck(GPU_BUS, "mlx5_0", report.verdict.exit_code, report))
    assert "(exit 13: warn): latency degraded" in line
    assert "(exit 13: warn): latency degraded" in one_line(report)


def test_both_ends_writing_at_once_below_the_threshold_is_gdr_read_degraded(tmp_path, machine):
    machine.gpu_bidir = 150.0
    report = check(tmp_path, bidir=True)
    assert ("bandwidth", "bidir") in machine.made
    both_ways = [o for o in machine.options if o.bidir]
    # a bidirectional run counts iterations (no window), checks every message after NCCL's
    # flush where the WRITE A/B flushes; as many as the host arm moved per QP in one window
    write_flush = machine.options[0].flush
    assert all(o.duration_s is None and o.flush == write_flush and o.iterations >= 10 for o in both_ways)
    assert report.bidir.outcome == "GDR read degraded" and report.read is None
    assert "bidirectional WRITE of GPU memory reaches 0.38" in report.bidir.detail
    assert report.verdict.exit_code == ExitCode.PERFORMANCE_WARNING
    assert "NCCL_NET_GDR_READ=0" in report.verdict.warnings[0]
    assert "bidirectional WRITE A/B: GDR read degraded" in render_check(report)


def test_both_ends_writing_at_once_that_keep_up_are_within_bounds(tmp_path, machine):
    report = check(tmp_path, bidir=True)
    assert report.bidir.outcome == "within bounds"
    assert report.verdict.exit_code == ExitCode.OK


def test_the_bidir_runs_last_as_long_as_a_write_window():
    options = ProbeOptions(sizes=(1 << 20,), qps=2, duration_s=0.5)
    sized = prelaunch.bidir_options(options, host_gbps=80.0)
    assert sized.iterations == int(80e9 / 8 * 0.5 / (1 << 20) / 2)
    assert prelaunch.bidir_options(options, host_gbps=0.0).iterations == 10


def test_the_bidirectional_rounds_flush_where_nccl_flushes(tmp_path, machine):
    """Was: every bidirectional round with its flush dropped. Each side receives into GPU
    memory there, and NCCL flushes such receives where its rule says (net.cc recvProxyProgress)."""
    report = check(tmp_path, environ={"NCCL_NET_FORCE_FLUSH": "1"}, bidir=True)
    both_ways = [o for o in machine.options if o.bidir]
    assert both_ways and all(o.flush.startswith("NCCL_NET_FORCE_FLUSH") for o in both_ways)
    assert report.bidir.outcome == "within bounds"
