from __future__ import annotations

import json

from .stack_machines import GPU_BDF, FakeDevice, FakeTopology, context, cuda_facts, gpu_resource

from gdrprobe.doctor.checks import gpu
from gdrprobe.doctor.facts import cuda as cuda_collector
from gdrprobe.report.model import Status
from tests.unit.fake_cuda import FakeDriver
from tests.unit.machine import no_cuda_driver_only

MiB = 1 << 20


def by_id(findings):
    return {finding.id: finding for finding in findings}




def h100():
    """One H100 on an older driver that does not know the DMA-BUF attribute (124)."""
    return FakeDriver(attributes={118: 100}, unknown=(124,), name=b"NVIDIA H100 80GB HBM3",
                      bus_id=b"00000000:1B:00.0")


class NoLibcuda(FakeDriver):
    def cuInit(self, flags):
        raise RuntimeError("Failed to dlopen libcuda.so.1")


def test_collect_from_driver_is_json_and_sysfs_spelled():
    facts = cuda_collector.collect_cuda_facts(h100())
    assert json.loads(json.dumps(facts)) == facts
    assert facts["driver_version"] == 12080
    (only,) = facts["gpus"]
    assert only["pci_bus_id"] == "0000:1b:00.0"
    assert only["name"] == "NVIDIA H100 80GB HBM3"
    assert only["gpu_direct_rdma_supported"] == 1
    assert only["dma_buf_supported"] is None
    # NCCL's send-side GDR default depends on it (sm80).
    assert (only["compute_capability_major"], only["compute_capability_minor"]) == (9, 0)


def test_collect_without_libcuda_keeps_the_reason():
    (reason,) = cuda_collector.collect_cuda_facts(NoLibcuda()).values()
    assert "no CUDA driver" in reason and "Failed to dlopen libcuda.so.1" in reason


@no_cuda_driver_only
def test_collect_on_this_machine_has_no_driver():
    # The test machine has cuda-python but no NVIDIA driver: the real first call raises.
    facts = cuda_collector.collect_cuda_facts()
    assert set(facts) == {"error"}
    assert "no CUDA driver" in facts["error"] or "cuda-python is not installed" in facts["error"]


def test_findings_per_gpu_with_large_bar1(tmp_path):
    cuda_facts(tmp_path, dma_buf=0)
    gpu_resource(tmp_path, 128 << 30)
    found = by_id(gpu.check(context(tmp_path)))
    assert found[f"gpu.{GPU_BDF}.rdma"].status is Status.OK
    assert found[f"gpu.{GPU_BDF}.dmabuf"].status is Status.WARN
    assert found[f"gpu.{GPU_BDF}.write_ordering"].summary.endswith("ordering owner, flush options host")
    bar1 = found[f"gpu.{GPU_BDF}.bar1"]
    assert bar1.status is Status.OK and "131072 MiB" in bar1.summary
    assert bar1.evidence[0].source == f"/sys/bus/pci/devices/{GPU_BDF}/resource (line 1)"


def test_tiny_bar1_gets_resizable_bar_advice(tmp_path):
    cuda_facts(tmp_path)
    gpu_resource(tmp_path, 256 * MiB)
    bar1 = by_id(gpu.check(context(tmp_path)))[f"gpu.{GPU_BDF}.bar1"]
    assert bar1.status is Status.WARN
    assert "Resizable BAR" in bar1.fix


def test_bar1_smaller_than_probe_buffers_fails(tmp_path):
    cuda_facts(tmp_path)
    gpu_resource(tmp_path, 8 * MiB)
    assert by_id(gpu.check(context(tmp_path)))[f"gpu.{GPU_BDF}.bar1"].status is Status.FAIL


def test_no_cuda_driver_is_a_skip_and_bar1_still_read_from_topology(tmp_path):
    ctx = context(tmp_path, topology=FakeTopology(gpus=[FakeDevice(GPU_BDF, "GPU0")]))
    ctx.gpu_facts = {"error": "no CUDA driver: Failed to dlopen libcuda.so.1"}
    gpu_resource(tmp_path, 64 << 30)
    found = by_id(gpu.check(ctx))
    assert found["gpu.cuda"].status is Status.SKIP
    assert "no CUDA driver" in found["gpu.cuda"].summary
    assert found[f"gpu.{GPU_BDF}.bar1"].status is Status.OK


def test_no_captured_facts_and_no_gpus(tmp_path):
    assert [(f.id, f.status) for f in gpu.check(context(tmp_path))] == [("gpu.cuda", Status.SKIP)]
