"""check --gin (issue 44): the doorbell registration's answer joins the check's verdict as
the job will meet it: a refused registration warns (exit 13) unless the job asked for GIN
explicitly (drain, 1), a setting of the job's own is 10, a mapped doorbell adds nothing; the
text, the JSON and the CLI carry it. The A/B's runs are recorded ones and the registration's
outcome is given (the calls themselves run in the binding suite, tests/cuda_standin/test_gin.py,
and the lab)."""

from __future__ import annotations

import json

import pytest

import gdrprobe
from gdrprobe.campaign import gin, prelaunch
from gdrprobe.campaign.ab import plan_arms, run_ab
from gdrprobe.campaign.gate import Budget, rank_pair
from gdrprobe.campaign.machine import machine_facts
from gdrprobe.campaign.plan import Buffer, CheckPlan, Criteria
from gdrprobe.cli import main
from gdrprobe.errors import DRAIN_CODES, ExitCode, VerdictNotOk
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.memory.spec import MemorySpec
from gdrprobe.report.check import main_cause
from gdrprobe.report.check_text import render_check
from gdrprobe.report.gin import CAN_MAP, CPU_PROXIED, MAPPED, REFUSED
from gdrprobe.report.model import to_json
from tests.unit.doctor import gin_machines as gm
from tests.unit.fakes.runs import fake_probe, recorded_run

GPU_BUS = "0000:1b:00.0"
CALL = "cuMemHostRegister(0x7f0000000800, 8, PORTABLE | DEVICEMAP | IOMEMORY): CUDA_ERROR_OPERATING_SYSTEM"


def gpu_buffer(gpu: str) -> MemorySpec:
    return MemorySpec.from_choice("gpu", gpu=gpu)


@pytest.fixture
def measured(monkeypatch):
    """The A/B's runs: GPU memory at 380 Gb/s (engaged) unless a test says otherwise."""
    from gdrprobe.measure import loopback

    speed = {"gpu": 380.0}

    def runner(options, endpoint, host=None, port=None, token=None, **ignored):
        def probe(local, remote):
            gpu = "gpu" in (local.kind, remote.kind)
            memory = {"kind": "gpu", "mechanism": "dmabuf"} if gpu else {"kind": "host"}
            return recorded_run(speed["gpu"] if gpu else 390.0, memory)
        return probe

    monkeypatch.setattr(loopback, "runner", runner)
    return speed


@pytest.fixture
def registration(monkeypatch):
    """What the registration answers (binding suite and lab: the real calls)."""
    answer = {"outcome": REFUSED}

    def register(gpu, nic, libmlx5=None, opener=None):
        calls = (CALL,) if answer["outcome"] == REFUSED else (CALL.replace("_ERROR_OPERATING_SYSTEM", "_SUCCESS"),)
        return gin.Registration(answer["outcome"], f"{nic}'s UAR page 1 (non-cached dedicated)", calls)

    monkeypatch.setattr(gin, "register_doorbell", register)
    return answer


def check(tmp_path, environ=None, build=gm.peermem_without_key):
    build(tmp_path)
    environ = environ or {}
    facts = machine_facts(str(tmp_path), environ)
    gate = CheckPlan(options=ProbeOptions(sizes=(1 << 20,), qps=2), send=Buffer("gpu"), receive=Buffer("gpu"),
                     criteria=Criteria(answers=("gin",)))
    pair = rank_pair({}, facts.gpus, facts.nics, gpu=GPU_BUS)
    return prelaunch.check_pair(pair, facts, gate, Budget(30.0),
                                {**environ, "GDRPROBE_LOCK_DIR": str(tmp_path / "locks")})


def test_a_refused_registration_warns_a_job_that_did_not_ask(tmp_path, measured, registration):
    report = check(tmp_path)
    assert report.verdict.classification == "engaged"
    assert report.verdict.exit_code == ExitCode.PERFORMANCE_WARNING
    assert report.gin.outcome == REFUSED and report.gin.summary.startswith(CPU_PROXIED)
    assert main_cause(report.verdict) == report.gin.summary
    assert "PeerMappingOverride=1" in report.verdict.fix
    text = render_check(report)
    assert "GIN doorbell (refused; exit 13: warn)" in text and CALL in text
    assert "the doctor predicted: CPU proxy" in text
    document = json.loads(to_json(report))
    assert document["gin"]["outcome"] == REFUSED and document["verdict"]["gin"]["exit_code"] == 13


def test_a_job_that_asked_for_gin_drains_where_the_driver_refuses(tmp_path, measured, registration):
    report = check(tmp_path, {"NCCL_GIN_ENABLE": "1"})
    assert report.verdict.exit_code == ExitCode.VERDICT_NOT_OK and report.verdict.exit_code in DRAIN_CODES
    assert "NCCL_GIN_ENABLE=1" in report.gin.summary


def test_a_mapped_doorbell_settles_the_prediction_and_adds_nothing(tmp_path, measured, registration):
    """The doctor predicted CPU proxy (no registry key); the driver mapped it anyway: the
    registration decides."""
    registration["outcome"] = MAPPED
    report = check(tmp_path, {"NCCL_GIN_ENABLE": "1"})
    assert report.verdict.exit_code == ExitCode.OK
    assert report.gin.summary.startswith(CAN_MAP) and report.gin.mode == "GPU-initiated (GDAKI)"
    assert report.gin.predicted.startswith("CPU proxy")


def test_the_jobs_own_setting_is_10_whatever_the_doorbell(tmp_path, measured, registration):
    registration["outcome"] = MAPPED
    report = check(tmp_path, {"NCCL_GIN_ENABLE": "1", "NCCL_CUMEM_ENABLE": "0"}, build=gm.peermem_with_key)
    assert report.verdict.exit_code == ExitCode.NCCL_SETTING and "symmetric memory" in report.gin.summary


def test_a_drain_of_the_a_b_stays_a_drain(tmp_path, measured, registration):
    measured["gpu"] = 40.0                   # degraded
    report = check(tmp_path)
    assert report.verdict.classification != "engaged"
    assert report.verdict.exit_code == ExitCode.VERDICT_NOT_OK and report.gin.exit_code == 13


def test_the_cli_and_require_ask_for_it(monkeypatch, tmp_path, measured, registration):
    asked = []

    def recorded_check(**kwargs):
        asked.append(kwargs)
        run_once, _ = fake_probe(gpu_gbps=97.0)
        return run_ab(run_once, plan_arms(gpu_buffer("0"), gpu_buffer("0"), False), repeats=2)

    monkeypatch.setattr(gdrprobe, "check", recorded_check)
    assert main(["check", "--gin", "--quiet"]) == 0 and asked[-1]["gin"] is True
    assert main(["check", "--quiet"]) == 0 and asked[-1]["gin"] is False
    drained = check(tmp_path, {"NCCL_GIN_TYPE": "3"})
    monkeypatch.setattr(gdrprobe, "check", lambda **kwargs: drained)
    with pytest.raises(VerdictNotOk, match="GIN will run CPU-proxied"):
        gdrprobe.require(gin=True)
