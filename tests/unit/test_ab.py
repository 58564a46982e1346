"""The A/B's bookkeeping: arms planned, repeats alternated, arm failures turned into
evidence, the verdict reached. run_once is the seam: here it returns recorded runs."""

import pytest

from gdrprobe.memory.spec import MemorySpec
from gdrprobe.measure.ab import plan_arms, run_ab
from gdrprobe.errors import NoDevice, NotTestable, RegistrationFailed
from gdrprobe.report.model import (BandwidthResult, EndpointSummary, Integrity, RunReport,
                             RunSettings)

HOST = MemorySpec()
GPU = MemorySpec.from_choice("gpu")
SIZE = 8 << 20
SETTINGS = RunSettings("bandwidth", (SIZE,), 100, 0, None, 0.0, 1, 128, 100, 1, 4096)


def recorded_run(gbps: float, memory: dict) -> RunReport:
    ok = Integrity(True, SIZE, 0, None, 0, None)
    row = BandwidthResult(SIZE, 100, 1.0, gbps, gbps, 0, 0, 0, ok)
    end = EndpointSummary("h", "mlx5_0", 1, 3, "::ffff:10.0.0.1", 4096, (17,), memory)
    remote = EndpointSummary("peer", "mlx5_0", 1, 3, "::ffff:10.0.0.2", 4096, (18,),
                             {"kind": "host"})
    return RunReport(SETTINGS, end, remote, "layout", (row,), ())


def fake_probe(gpu_gbps=None, gpu_error=None, mechanism="dmabuf", host_gbps=100.0):
    calls = []

    def run_once(local: MemorySpec, remote: MemorySpec) -> RunReport:
        calls.append(local.label)
        if local.kind == "host":
            return recorded_run(host_gbps, {"kind": "host"})
        if gpu_error is not None:
            raise gpu_error
        return recorded_run(gpu_gbps, {"kind": "gpu", "mechanism": mechanism,
                                       "mechanism_reason": "auto: both can"})

    return run_once, calls


def test_plan_puts_host_first_and_staged_last():
    arms = plan_arms(GPU, HOST, with_staged=True)
    assert [a.name for a in arms] == ["host", "gpu", "staged"]
    assert arms[2].local.mechanism == "staged" and arms[2].remote == HOST
    remote_side = plan_arms(HOST, MemorySpec.from_choice("peermem"), with_staged=False)
    assert [(a.local.kind, a.remote.mechanism) for a in remote_side] == [
        ("host", "auto"), ("host", "peermem")]


def test_engaged_when_the_gpu_arm_keeps_up():
    run_once, calls = fake_probe(gpu_gbps=97.0)
    report = run_ab(run_once, plan_arms(GPU, HOST, False), repeats=3)
    assert calls == ["host", "gpu"] * 3             # alternating, repeat by repeat
    assert report.verdict.classification == "engaged"
    assert report.verdict.mechanism == "dmabuf"
    assert report.verdict.ratio == pytest.approx(0.97)
    assert report.arms[1].arm == "dmabuf" and report.arms[1].mechanism_reason == "auto: both can"
    assert report.verdict.exit_code == 0


def test_degraded_when_it_does_not():
    run_once, _ = fake_probe(gpu_gbps=30.0, mechanism="peermem")
    report = run_ab(run_once, plan_arms(GPU, HOST, False), repeats=2)
    assert report.verdict.classification == "degraded"
    assert report.verdict.exit_code == 1


def test_no_cuda_driver_is_not_testable_and_the_arm_is_tried_once():
    error = NotTestable("not testable: no CUDA driver", "install the driver",
                        evidence="auto fell back to peermem: the NIC cannot register DMA-BUF")
    run_once, calls = fake_probe(gpu_error=error)
    report = run_ab(run_once, plan_arms(GPU, HOST, False), repeats=3)
    assert calls == ["host", "gpu", "host", "host"]
    assert report.verdict.classification == "not testable"
    assert report.verdict.exit_code == 9
    gpu_arm = report.arms[1]
    assert gpu_arm.outcome == "not testable" and "no CUDA driver" in gpu_arm.detail
    assert "cannot register DMA-BUF" in gpu_arm.mechanism_reason
    assert report.arms[0].bandwidths_gbps == (100.0, 100.0, 100.0)


def test_refused_registration_is_not_engaged_with_the_cause():
    error = RegistrationFailed("registering GPU memory through peermem failed", "modprobe",
                               error_code=14, mechanism="peermem")
    run_once, _ = fake_probe(gpu_error=error)
    report = run_ab(run_once, plan_arms(GPU, HOST, False), repeats=1)
    assert report.verdict.classification == "not engaged"
    assert report.arms[1].arm == "peermem" and report.arms[1].outcome == "registration failed"
    assert any("nvidia-peermem" in cause for cause in report.verdict.likely_causes)


def test_a_host_arm_failure_is_the_run_failure():
    def run_once(local, remote):
        raise NoDevice("no RDMA device found")

    with pytest.raises(NoDevice):
        run_ab(run_once, plan_arms(GPU, HOST, False), repeats=1)
