"""nccl-log reads GPU-initiated networking (issue 44): the backend NCCL assigned, DOCA
GPUNetIO's "Enabling CPU proxy mode", why GIN was refused, and aws-ofi-nccl's EFA-GDA lines.
The fixtures were written from the format strings in NVIDIA/nccl v2.28.7-1 .. v2.30.7-1
(src/gin/gin_host.cc, src/plugin/gin.cc, src/transport/net_ib/gin.cc,
src/transport/net_ib/gdaki/gin_host_gdaki.cc, doca-gpunetio/src/doca_gpunetio.cpp and its
doca_gpunetio_log.cpp prefix) and aws-ofi-nccl v1.21.1 (src/rdma/gin/*.cpp), named in
gdrprobe/nccl/log_formats.py."""

from __future__ import annotations

import json
import pathlib

from gdrprobe.nccl.log import parse_nccl_log, read_nccl_log
from gdrprobe.nccl.log_gin import DOORBELL_NOT_LOGGED
from gdrprobe.report.model import to_json
from gdrprobe.report.text import render_nccl_log

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "nccl_logs"


def gin(name: str):
    return read_nccl_log(str(FIXTURES / name)).gin


def test_gdaki_with_docas_cpu_proxy_line_is_cpu_proxied():
    """The DOCA line carries no NCCL prefix: it goes to the host that assigned GDAKI."""
    report = read_nccl_log(str(FIXTURES / "gin-gdaki-cpu-proxy-nccl-2.30.7.log"))
    (host,) = report.gin.hosts
    assert (report.gin.mode, host.host, host.backend, host.plugin) == ("CPU proxy", "nodea", "GDAKI", "GIN_IB_GDAKI")
    assert (host.cpu_proxy_lines, host.gdaki_qps) == (1, 2) and "Enabling CPU proxy mode" in host.why
    assert "GIN (GPU-initiated networking): CPU proxy" in render_nccl_log(report)
    assert json.loads(to_json(report))["gin"]["hosts"][0]["mode"] == "CPU proxy"


def test_gdaki_without_docas_line_does_not_claim_the_gpu_rings():
    found = gin("gin-gdaki-nccl-2.29.7.log")
    assert found.mode == DOORBELL_NOT_LOGGED and "DOCA_GPUNETIO_LOG" in found.hosts[0].why


def test_gin_disabled_is_none_whatever_was_assigned():
    found = gin("gin-disabled-nccl-2.29.7.log")
    assert found.mode == "none" and found.hosts[0].why == "GIN is disabled"


def test_every_refusal_is_said_in_nccls_words():
    (host,) = gin("gin-unavailable-nccl-2.30.7.log").hosts
    assert host.mode == "none"
    assert set(host.reasons) >= {
        "Unable to use GIN: Peermem is not supported, nor DMA-BUF", "Failed to initialize any GIN plugin",
        "Compute Capability (60) is not sufficient to enable GIN", "GIN not supported",
        "Communicator does not support symmetric memory!", "No GIN-capable devices found",
        "Symmetric memory is not supported: cuMemEnable 0 (NCCL_CUMEM_ENABLE)",
        "User requested GIN but not all ranks in the communicator support GIN",
        "Unable to use GIN: Peermem is not supported, and device 0 does not support DMA-BUF"}


def test_the_proxy_backend_is_cpu_proxied():
    assert gin("gin-proxy-nccl-2.28.7.log").hosts[0].mode == "CPU proxy"


def test_efa_gda_per_host_from_the_plugins_lines():
    found = gin("gin-efa-gda-aws-ofi-nccl-2.31.2.log")
    modes = {host.host: (host.mode, host.backend) for host in found.hosts}
    assert modes == {"nodef": ("GPU-initiated", "EFA-GDA"), "nodeg": ("none", "EFA-GDA")}
    assert found.mode == "mixed: GPU-initiated, none"
    assert "not supported on this platform" in found.hosts[1].why


def test_a_log_that_says_nothing_of_gin_has_no_gin():
    assert read_nccl_log(str(FIXTURES / "nccl-2.30.7-trace.log")).gin is None
    assert parse_nccl_log("h:1:1 [0] NCCL INFO NCCL version 2.30.7+cuda13.0\n").gin is None
