"""GPU arms on the lab: rxe and no CUDA driver. The host arm is measured for real, every
GPU arm ends "not testable: no CUDA driver", and rxe's missing DMA-BUF support is
reported by the real NIC probe."""

import errno
import json

from gdrprobe.rdma.endpoint import Endpoint, EndpointOptions
from gdrprobe.memory.nic_probe import probe_nic_dmabuf
from tests.lab.helpers import gdrprobe, rdma_resources
from tests.lab.loopback.conftest import TOKEN


def check_json(*args: str) -> tuple[int, dict]:
    done = gdrprobe("run", *args, "-n", "50", "--json")
    return done.returncode, json.loads(done.stdout)


def test_rxe_cannot_register_dma_buf():
    with Endpoint(EndpointOptions(), "127.0.0.1") as endpoint:
        support = probe_nic_dmabuf(endpoint.pd)
    assert not support.supported and support.errno == errno.EOPNOTSUPP
    assert "EOPNOTSUPP" in support.reason


def test_auto_falls_back_with_the_reason_and_the_gpu_arm_is_not_testable(baseline):
    code, report = check_json("--loopback", "--mem", "gpu", "--staged", "--repeats", "2")
    assert code == 9
    assert report["kind"] == "check"
    assert report["verdict"]["classification"] == "not testable"
    host, gpu, staged = report["arms"]
    # The GPU arm cannot run: the verdict is known after one host run (issue 12).
    assert host["outcome"] == "measured" and len(host["bandwidths_gbps"]) == 1
    assert all(rate > 0 for rate in host["bandwidths_gbps"])
    assert gpu["outcome"] == "not testable" and "no CUDA driver" in gpu["detail"]
    assert "auto fell back to peermem" in gpu["mechanism_reason"]
    assert "EOPNOTSUPP" in gpu["mechanism_reason"]
    assert staged["outcome"] == "not testable"
    assert rdma_resources() == baseline


def test_dma_buf_requested_on_rxe(baseline):
    code, report = check_json("--loopback", "--mem", "dmabuf", "--repeats", "1")
    assert code == 9
    arm = report["arms"][1]
    assert arm["arm"] == "dmabuf" and "dmabuf requested" in arm["mechanism_reason"]
    assert "cannot register DMA-BUF" in arm["mechanism_reason"]
    assert rdma_resources() == baseline


def test_server_side_gpu_request_is_not_testable_and_the_server_keeps_serving(server, baseline):
    code, report = check_json("127.0.0.1", "--token", TOKEN, "--remote-mem", "peermem",
                              "--repeats", "1")
    assert code == 9
    arm = report["arms"][1]
    assert arm["outcome"] == "not testable" and "server reported" in arm["detail"]
    plain = gdrprobe("run", "127.0.0.1", "--token", TOKEN, "-n", "10", check=True)
    assert " ok" in plain.stdout
    assert rdma_resources() == baseline


def test_latency_with_gpu_memory_is_refused():
    done = gdrprobe("run", "--loopback", "--latency", "--mem", "gpu")
    assert done.returncode == 2
    assert "host memory" in done.stderr or "bandwidth" in done.stderr


def test_table_names_the_verdict():
    done = gdrprobe("run", "--loopback", "--mem", "gpu", "--repeats", "1", "-n", "20")
    assert done.returncode == 9
    assert "GPUDirect RDMA: NOT TESTABLE" in done.stdout
    assert "no CUDA driver" in done.stdout


def test_python_api_check_and_require_as_a_prelaunch_gate(baseline):
    import gdrprobe
    import pytest

    report = gdrprobe.check(time_budget_s=8, repeats=1)
    assert report.verdict.classification == "not testable"
    assert report.arms[0].outcome == "measured" and report.settings.duration_s is not None
    with pytest.raises(gdrprobe.GdrprobeError) as caught:
        gdrprobe.require(time_budget_s=8, repeats=1)
    assert caught.value.exit_code == 9 and "not testable" in str(caught.value)
    run = gdrprobe.run(loopback=True, sizes=(4096,), iterations=20)
    assert run.bandwidth[0].integrity.ok
    assert rdma_resources() == baseline
