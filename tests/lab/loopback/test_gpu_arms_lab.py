"""GPU arms on the lab: rxe and no CUDA driver. A GPU buffer in this process is "not
testable: no CUDA driver" before anything is measured (test_newcomer_lab.py); a GPU buffer
asked of a server ends that arm, and rxe's missing DMA-BUF support is reported by the real
NIC probe."""

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


def test_server_side_gpu_request_is_not_testable_and_the_server_keeps_serving(server, baseline):
    code, report = check_json("127.0.0.1", "--token", TOKEN, "--remote-mem", "peermem",
                              "--repeats", "1")
    assert code == 9
    arm = report["arms"][1]
    assert arm["outcome"] == "not testable" and "server reported" in arm["detail"]
    plain = gdrprobe("run", "127.0.0.1", "--token", TOKEN, "-n", "10", check=True)
    assert " ok" in plain.stdout
    assert rdma_resources() == baseline


def test_plain_write_latency_with_gpu_memory_is_refused():
    """The plain ping-pong has the CPU poll the receive buffer, which GPU memory cannot
    serve: refused, naming WRITE with immediate (issue 31), which can."""
    done = gdrprobe("run", "--loopback", "--latency", "--mem", "gpu")
    assert done.returncode == 2
    assert "--opcode write_imm" in done.stderr and "fix:" in done.stderr


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
