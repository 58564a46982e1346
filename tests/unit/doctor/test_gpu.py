from __future__ import annotations

import json

from .stack_machines import GPU_BDF, FakeDevice, FakeTopology, context, cuda_facts, gpu_resource

from gdrprobe.doctor import gpu
from gdrprobe.report import Status
from tests.unit.fake_cuda import CUdevice_attribute, FakeResult

MiB = 1 << 20


def by_id(findings):
    return {finding.id: finding for finding in findings}




class FakeDriver:
    """The call shapes of cuda.bindings.driver for one H100, tuples and all."""

    CUdevice_attribute = CUdevice_attribute

    values = {116: 1, 117: 1, 118: 100}     # 124 unknown to this "old" driver

    def cuInit(self, flags):
        return (FakeResult.CUDA_SUCCESS,)

    def cuDriverGetVersion(self):
        return FakeResult.CUDA_SUCCESS, 12080

    def cuDeviceGetCount(self):
        return FakeResult.CUDA_SUCCESS, 1

    def cuDeviceGet(self, ordinal):
        return FakeResult.CUDA_SUCCESS, ordinal

    def cuDeviceGetName(self, length, device):
        return FakeResult.CUDA_SUCCESS, b"NVIDIA H100 80GB HBM3\0" + b" " * 10

    def cuDeviceGetPCIBusId(self, length, device):
        return FakeResult.CUDA_SUCCESS, b"00000000:1B:00.0\0   "

    def cuDeviceTotalMem(self, device):
        return FakeResult.CUDA_SUCCESS, 85 << 30

    def cuDeviceGetAttribute(self, attribute, device):
        if int(attribute) in self.values:
            return FakeResult.CUDA_SUCCESS, self.values[int(attribute)]
        return FakeResult.CUDA_ERROR_INVALID_VALUE, None


class NoLibcuda(FakeDriver):
    def cuInit(self, flags):
        raise RuntimeError("Failed to dlopen libcuda.so.1")


def test_collect_from_driver_is_json_and_sysfs_spelled():
    facts = gpu.collect_cuda_facts(FakeDriver())
    assert json.loads(json.dumps(facts)) == facts
    assert facts["driver_version"] == 12080
    (only,) = facts["gpus"]
    assert only["pci_bus_id"] == "0000:1b:00.0"
    assert only["name"] == "NVIDIA H100 80GB HBM3"
    assert only["gpu_direct_rdma_supported"] == 1
    assert only["dma_buf_supported"] is None


def test_collect_without_libcuda_keeps_the_reason():
    assert gpu.collect_cuda_facts(NoLibcuda()) == {"error": "no CUDA driver: Failed to dlopen libcuda.so.1"}


def test_collect_on_this_machine_has_no_driver():
    # The test machine has cuda-python but no NVIDIA driver: the real first call raises.
    facts = gpu.collect_cuda_facts()
    assert set(facts) == {"error"}
    assert facts["error"].startswith(("no CUDA driver", "cuda-python is not installed"))


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
    ctx.cuda_facts = {"error": "no CUDA driver: Failed to dlopen libcuda.so.1"}
    gpu_resource(tmp_path, 64 << 30)
    found = by_id(gpu.check(ctx))
    assert found["gpu.cuda"].status is Status.SKIP
    assert "no CUDA driver" in found["gpu.cuda"].summary
    assert found[f"gpu.{GPU_BDF}.bar1"].status is Status.OK


def test_no_captured_facts_and_no_gpus(tmp_path):
    assert [(f.id, f.status) for f in gpu.check(context(tmp_path))] == [("gpu.cuda", Status.SKIP)]
