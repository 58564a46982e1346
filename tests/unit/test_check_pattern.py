"""check --pattern nccl (issue 40): where the WRITE A/B is engaged, the A/B again in NCCL's own
pattern at NCCL's step sizes; a GPU arm that streams as the host arm does but whose pattern
falls below the host arm's makes the verdict degraded (exit 1), the phase named. Reachable from
the CLI. The runs are recorded ones, shaped by the options each runner is made with."""

from __future__ import annotations

import dataclasses

import pytest

from gdrprobe.campaign import prelaunch
from gdrprobe.campaign.gate import Budget, rank_pair
from gdrprobe.campaign.machine import machine_facts
from gdrprobe.campaign.plan import Buffer, CheckPlan, Criteria
from gdrprobe.errors import ExitCode, UsageError
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.report.check_text import render_check
from gdrprobe.report.model import BandwidthResult, Integrity, to_json
from gdrprobe.report.nccl_pattern import NcclPatternResult, StepPhases
from tests.unit.doctor import nccl_machines as nm
from tests.unit.fakes.runs import recorded_run

GPU_BUS = "0000:1b:00.0"
OK = Integrity(True, 1, 0, None, 0, None)


def pattern_row(size: int, rate: float, flush_us: float) -> NcclPatternResult:
    alone = StepPhases(20.0 + flush_us, 2.0, 18.0, flush_us)
    return NcclPatternResult(size, 1, 1, False, True, 8, 100, 1.0, rate, rate, alone, alone,
                             8 * size * 8 / (alone.step_us * 1000), OK)


@dataclasses.dataclass
class Machine:
    gpu_pattern: float = 300.0      # Gb/s of the GPU arm's NCCL pattern
    gpu_flush_us: float = 2.0
    options: list = dataclasses.field(default_factory=list)

    def runner(self, options, endpoint, host=None, port=None, token=None, **ignored):
        def probe(local, remote):
            self.options.append(options)
            gpu = "gpu" in (local.kind, remote.kind)
            memory = {"kind": "gpu", "mechanism": "dmabuf"} if gpu else {"kind": "host"}
            run = recorded_run(380.0 if gpu else 390.0, memory)
            if not options.pattern:
                return run
            streams = tuple(BandwidthResult(size, 100, 1.0, 390.0, 390.0, 0, 0, 0, OK)
                            for size in options.sizes)
            rows = tuple(pattern_row(size, self.gpu_pattern if gpu else 320.0,
                                     self.gpu_flush_us if gpu else 0.0) for size in options.sizes)
            return dataclasses.replace(run, bandwidth=streams, nccl=rows)
        return probe


@pytest.fixture
def machine(monkeypatch):
    monkeypatch.setattr("gdrprobe.measure.loopback.runner", (measured := Machine()).runner)
    return measured


def check(tmp_path, environ=None):
    nm.hgx_8gpu_4nic(tmp_path)
    facts = machine_facts(str(tmp_path), environ or {})
    gate = CheckPlan(options=ProbeOptions(sizes=(1 << 20,), qps=2), send=Buffer("gpu"),
                     receive=Buffer("gpu"), criteria=Criteria(answers=("pattern",)))
    pair = rank_pair({}, facts.gpus, facts.nics, gpu=GPU_BUS)
    return prelaunch.check_pair(pair, facts, gate, Budget(30.0),
                                {"GDRPROBE_LOCK_DIR": str(tmp_path / "locks")})


def test_the_write_ab_runs_without_the_pattern_then_the_pattern_ab_at_ncclS_steps(
        tmp_path, machine):
    report = check(tmp_path)
    write = [o for o in machine.options if not o.pattern]
    pattern = [o for o in machine.options if o.pattern]
    assert write and all(o.sizes == (1 << 20,) for o in write)
    assert pattern and all(o.sizes == (131072, 524288) and o.duration_s is None
                           for o in pattern)
    assert report.pattern.outcome == "within"
    assert report.verdict.classification == "engaged" and report.verdict.exit_code == 0


def test_a_gpu_pattern_below_the_hosts_is_degraded_with_the_flush_named(tmp_path, machine):
    machine.gpu_pattern, machine.gpu_flush_us = 150.0, 400.0
    report = check(tmp_path)
    assert report.pattern.outcome == "degraded"
    assert report.pattern.ratios[0].phase == "flush"
    assert report.verdict.classification == "degraded"
    assert report.verdict.exit_code == ExitCode.VERDICT_NOT_OK
    assert "flush" in report.verdict.likely_causes[1]
    assert "NCCL's pattern: degraded" in render_check(report)
    assert '"pattern": {' in to_json(report)


def test_the_jobs_settings_shape_the_patterns_connections(tmp_path, machine):
    check(tmp_path, {"NCCL_IB_QPS_PER_CONNECTION": "2", "NCCL_P2P_NET_CHUNKSIZE": "262144"})
    shape = next(o for o in machine.options if o.pattern)
    assert shape.nccl.qps_per_connection == 2 and 262144 in shape.sizes


def test_the_cli_takes_the_pattern(monkeypatch):
    import gdrprobe
    from gdrprobe.cli import main

    asked = {}

    def check(**kwargs):
        asked.update(kwargs)
        raise UsageError("recorded", "")

    monkeypatch.setattr(gdrprobe, "check", check)
    assert main(["check", "--pattern", "nccl"]) == ExitCode.USAGE
    assert asked["pattern"] == "nccl"
