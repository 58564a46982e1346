"""GPUs the PCI bus has and CUDA lost, and a DMA-BUF export the driver refuses: what the job
will meet decides the exit code (gdrprobe/memory/cuda_results.py, the doctor's gpu.cuda,
the gate). Fixture machines give sysfs; the CUDA driver's answer is what a capture stores
(cuda.json) or what the fake driver answers."""

from __future__ import annotations

import json

import pytest

import gdrprobe
from gdrprobe.campaign import machine
from gdrprobe.campaign.ab import plan_arms, run_ab
from gdrprobe.doctor.checks import gpu
from gdrprobe.doctor.facts import cuda as cuda_collector
from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.doctor.facts.cuda import FACTS_FILE as CUDA_FACTS_FILE, collect_cuda_facts
from gdrprobe.errors import SCHEDULER_ACTION, ExitCode, GpuUnusable
from gdrprobe.memory.causes import DMABUF_EXPORT_REFUSED, dmabuf_export_refused
from gdrprobe.memory.cuda_results import lost_gpus_error, missing_gpus_error
from gdrprobe.memory.spec import MemorySpec
from gdrprobe.report.model import Status
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor.machines import pix_node
from tests.unit.fake_cuda import FakeDriver, FakeResult
from tests.unit.fakes.runs import HOST, probe_by_mechanism
GPU0, GPU1 = "0000:1b:00.0", "0000:2d:00.0"      # the two GPUs of a two-pair PIX node
LOST_RESULTS = ("CUDA_ERROR_NO_DEVICE", "CUDA_ERROR_OPERATING_SYSTEM", "CUDA_ERROR_UNKNOWN")


def two_gpu_node(tmp_path, cuda_facts: dict):
    """A node whose sysfs lists two NVIDIA GPUs bound to nvidia, and CUDA's answer."""
    tree = pix_node(tmp_path, pairs=2)
    for bdf in (GPU0, GPU1):
        tree.symlink(f"{tree.devices[bdf]}/driver", "/sys/bus/pci/drivers/nvidia")
    tree.write(CUDA_FACTS_FILE, json.dumps(cuda_facts))
    return tree


def cuinit_failed(result: str) -> dict:
    return {"error": f"a CUDA driver call failed (cuInit(0) returned {result})",
            "result": result, "call": "cuInit(0)"}


def cuda_lists(*bus_ids: str, name: str = "NVIDIA H100 80GB HBM3") -> dict:
    return {"driver_version": 12080,
            "gpus": [{"ordinal": i, "name": name, "pci_bus_id": bus_id,
                      "gpu_direct_rdma_supported": 1, "dma_buf_supported": 1}
                     for i, bus_id in enumerate(bus_ids)]}


def doctor(tmp_path, environ: dict | None = None) -> DoctorContext:
    return DoctorContext(SysRoot(str(tmp_path)), environ=environ or {})


def cuda_finding(ctx: DoctorContext):
    return next(f for f in gpu.check(ctx) if f.id == "gpu.cuda")


# ---- the rules -------------------------------------------------------------------------


@pytest.mark.parametrize("result", LOST_RESULTS)
def test_a_lost_gpu_result_with_gpus_on_the_bus_is_a_gpu_no_job_can_use(result):
    error = lost_gpus_error(result, (GPU0, GPU1))
    assert isinstance(error, GpuUnusable) and error.exit_code == ExitCode.GPU_UNUSABLE
    assert SCHEDULER_ACTION[error.exit_code] == "drain"
    assert f"sysfs lists 2 NVIDIA GPU(s) and cuInit(0) returned {result}" in error.cause
    assert error.evidence == (f"sysfs: 2 NVIDIA GPU(s) ({GPU0}, {GPU1}); "
                              f"CUDA: cuInit(0) returned {result}")
    assert "Xid 79" in error.fix


@pytest.mark.parametrize("result, gpus", [("CUDA_ERROR_NO_DEVICE", ()),
                                          ("CUDA_ERROR_STUB_LIBRARY", (GPU0,)),
                                          ("CUDA_ERROR_MPS_CONNECTION_FAILED", (GPU0,))])
def test_without_a_gpu_on_the_bus_or_with_another_result_nothing_is_lost(result, gpus):
    assert lost_gpus_error(result, gpus) is None


def test_a_driver_that_lists_fewer_gpus_than_sysfs_names_the_missing_one():
    error = missing_gpus_error([GPU0], (GPU0, GPU1))
    assert error.exit_code == ExitCode.GPU_UNUSABLE
    assert f"CUDA lists 1 of the 2 NVIDIA GPUs sysfs lists: {GPU1} is lost" in error.cause
    assert "cuDeviceGetCount() = 1 (0000:1b:00.0)" in error.evidence
    assert missing_gpus_error([GPU1, GPU0], (GPU0, GPU1)) is None


# ---- the doctor: sysfs against CUDA's answer -------------------------------------------


@pytest.mark.parametrize("result", LOST_RESULTS)
def test_the_doctor_fails_gpu_cuda_where_cuinit_lost_the_gpus_sysfs_lists(tmp_path, result):
    two_gpu_node(tmp_path, cuinit_failed(result))
    found = cuda_finding(doctor(tmp_path))
    assert found.status is Status.FAIL
    assert f"cuInit(0) returned {result}" in found.summary
    assert f"sysfs: 2 NVIDIA GPU(s) ({GPU0}, {GPU1})" in found.evidence[0].value


def test_no_device_on_a_machine_without_an_nvidia_gpu_stays_a_skip(tmp_path):
    tree = pix_node(tmp_path, pairs=0)
    tree.write(CUDA_FACTS_FILE, json.dumps(cuinit_failed("CUDA_ERROR_NO_DEVICE")))
    ctx = doctor(tmp_path)
    assert cuda_finding(ctx).status is Status.SKIP and gpu.runtime_gpu_fault(ctx) is None


def test_the_doctor_fails_gpu_cuda_where_cuda_lists_fewer_gpus(tmp_path):
    two_gpu_node(tmp_path, cuda_lists(GPU0))
    found = cuda_finding(doctor(tmp_path))
    assert found.status is Status.FAIL and f"{GPU1} is lost to CUDA" in found.summary


def test_the_same_gpus_in_any_order_are_no_finding(tmp_path):
    two_gpu_node(tmp_path, cuda_lists(GPU1, GPU0))
    ctx = doctor(tmp_path)
    assert gpu.runtime_gpu_fault(ctx) is None
    assert "gpu.cuda" not in [f.id for f in gpu.check(ctx)]


def test_a_gpu_handed_to_a_virtual_machine_is_not_cudas(tmp_path):
    tree = two_gpu_node(tmp_path, cuda_lists(GPU0))
    tree.path(f"{tree.devices[GPU1]}/driver").unlink()
    tree.symlink(f"{tree.devices[GPU1]}/driver", "/sys/bus/pci/drivers/vfio-pci")
    assert cuda_collector.gpus_for_cuda(doctor(tmp_path)) == (GPU0,)
    assert gpu.runtime_gpu_fault(doctor(tmp_path)) is None


def test_the_drivers_procfs_list_says_which_gpus_this_process_was_given(tmp_path):
    """A container the NVIDIA runtime set up sees only its GPUs in /proc/driver/nvidia/gpus
    (the driver names them with a 32-bit domain)."""
    tree = two_gpu_node(tmp_path, cuda_lists(GPU1))
    tree.write("/proc/driver/nvidia/gpus/00000000:2d:00.0/information", "Model: H100\n")
    assert cuda_collector.gpus_for_cuda(doctor(tmp_path)) == (GPU1,)
    assert gpu.runtime_gpu_fault(doctor(tmp_path)) is None


@pytest.mark.parametrize("environ, facts, why", [
    ({"CUDA_VISIBLE_DEVICES": "0"}, cuda_lists(GPU0), "CUDA_VISIBLE_DEVICES is set"),
    ({"CUDA_VISIBLE_DEVICES": ""}, cuinit_failed("CUDA_ERROR_NO_DEVICE"),
     "CUDA_VISIBLE_DEVICES is set"),
    ({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, cuda_lists(GPU0), "kubernetes container"),
    ({}, cuda_lists(GPU0, name="NVIDIA A100-SXM4-80GB MIG 1g.10gb"), "MIG devices"),
])
def test_where_cudas_view_is_not_the_nodes_nothing_is_compared(tmp_path, environ, facts, why):
    two_gpu_node(tmp_path, facts)
    ctx = doctor(tmp_path, environ)
    assert why in cuda_collector.why_not_compared(ctx, ctx.cuda_facts)
    assert gpu.runtime_gpu_fault(ctx) is None


def test_the_doctors_cuda_facts_keep_the_result_the_driver_answered():
    facts = collect_cuda_facts(FakeDriver(fail={"cuInit": FakeResult.CUDA_ERROR_UNKNOWN}))
    assert (facts["result"], facts["call"]) == ("CUDA_ERROR_UNKNOWN", "cuInit(0)")
    assert "cuInit(0) returned CUDA_ERROR_UNKNOWN" in facts["error"]


def test_a_gpu_the_driver_fails_on_while_listing_them_names_that_call(tmp_path):
    """cuInit passed, then the driver failed on a GPU it lists (a GPU falling off now)."""
    facts = collect_cuda_facts(FakeDriver(fail={"cuDeviceGetName":
                                                FakeResult.CUDA_ERROR_UNKNOWN}))
    two_gpu_node(tmp_path, facts)
    fault = gpu.runtime_gpu_fault(doctor(tmp_path))
    assert "cuDeviceGetName returned CUDA_ERROR_UNKNOWN" in fault.cause


# ---- the gate drains before it measures -------------------------------------------------


@pytest.fixture
def gate_machine(monkeypatch, tmp_path):
    """The gate's machine facts read from a fixture tree; any run fails the test."""
    from gdrprobe.measure import loopback

    def read(result_facts: dict):
        two_gpu_node(tmp_path, result_facts)
        facts = machine.machine_facts(str(tmp_path), {})
        monkeypatch.setattr(machine, "machine_facts", lambda **_: facts)

    monkeypatch.setattr(loopback, "runner", lambda *a, **k: pytest.fail("a run started"))
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    return read


@pytest.mark.parametrize("call", [gdrprobe.check, gdrprobe.check_node])
def test_the_gate_drains_on_gpus_cuinit_lost(gate_machine, call):
    gate_machine(cuinit_failed("CUDA_ERROR_UNKNOWN"))
    with pytest.raises(GpuUnusable) as raised:
        call()
    assert raised.value.exit_code == ExitCode.GPU_UNUSABLE
    assert "sysfs lists 2 NVIDIA GPU(s) and cuInit(0) returned CUDA_ERROR_UNKNOWN" in \
        raised.value.cause
    assert f"({GPU0}, {GPU1})" in raised.value.evidence


def test_the_gate_drains_on_a_gpu_cuda_does_not_list(gate_machine):
    gate_machine(cuda_lists(GPU0))
    with pytest.raises(GpuUnusable, match=f"{GPU1} is lost to CUDA"):
        gdrprobe.check()


# ---- a DMA-BUF export the driver refuses -------------------------------------------------


def test_a_refused_dmabuf_export_is_not_engaged_not_not_testable():
    """NCCL exports its buffers with the same call and gives up on the connection (net.cc
    CUCHECK): the job would not run over GPUDirect, so the answer is "not engaged"."""
    refused = dmabuf_export_refused("cuMemGetHandleForAddressRange(0x0, 4096, DMA_BUF_FD, "
                                    "flags=0)", "CUDA_ERROR_UNKNOWN", pcie_mapping=False)
    report = run_ab(probe_by_mechanism({"dmabuf": refused}, []),
                    plan_arms(MemorySpec.from_choice("dmabuf"), HOST, False), repeats=2)
    verdict = report.verdict
    assert (verdict.classification, verdict.exit_code, verdict.mechanism) == (
        "not engaged", ExitCode.VERDICT_NOT_OK, "dmabuf")
    assert verdict.likely_causes[0].startswith(
        "dmabuf: registration failed with cuMemGetHandleForAddressRange: the GPU driver "
        "refused to export the GPU memory as DMA-BUF")
    assert report.arms[1].outcome == "registration failed"
    assert refused.error_code == DMABUF_EXPORT_REFUSED
