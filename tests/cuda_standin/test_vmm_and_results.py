"""Binding call shapes, not a GPU: GPU memory allocated as NCCL allocates it (VMM), the
results a newer driver returns that older bindings do not know, and the node faults every
CUDA process meets, through the real cuda.bindings over the stand-in libcuda.so.1. The
stand-in configured by environment (GDRPROBE_STANDIN_*) is what the lab's gdrprobe runs
over; here each such case runs in a fresh interpreter (see conftest.run_fresh)."""

from __future__ import annotations

import os

import pytest

from gdrprobe import _native
from gdrprobe.errors import CudaError, ExitCode, GdrprobeError, GpuUnusable, NotTestable
from gdrprobe.memory import cuda
from gdrprobe.memory import cuda_driver
from gdrprobe.memory.cuda_results import NEWER_RESULT_NAMES
from tests.cuda_standin.build import standin_settings
from tests.cuda_standin.conftest import error_of, run_fresh

VMM_GRANULE = 2 << 20


@pytest.fixture
def gpu(standin):
    with cuda.open_gpu("0") as device:
        yield device
    standin.assert_nothing_held()


# ---- VMM memory -----------------------------------------------------------------------


def test_vmm_memory_is_mapped_accessible_gpudirect_capable_and_copies(standin, gpu):
    with gpu.allocate("device", 5000, "vmm") as buffer, gpu.alloc_pinned_host(5000) as host:
        assert (buffer.allocation, buffer.allocated) == ("vmm", VMM_GRANULE)
        assert buffer.ptr % VMM_GRANULE == 0
        assert standin.vmm_state(buffer.ptr) == 2             # mapped and accessible
        assert standin.vmm_gdr_capable(buffer.ptr) == 1       # gpuDirectRDMACapable
        _native.pattern_fill(host.ptr, 5000, 9)
        gpu.copy_to_device(buffer.ptr, host.ptr, 5000)
        _native.zero_fill(host.ptr, 5000)
        gpu.copy_to_host(host.ptr, buffer.ptr, 5000)
        assert _native.pattern_verify(host.ptr, 5000, 9) == (0, -1)
        fd, offset = gpu.export_dmabuf(buffer.ptr, 5000)
        try:
            assert offset == 0
            assert os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:gdrprobe-standin-vmm")
        finally:
            os.close(fd)
    assert standin.vmm_state(buffer.ptr) == 0


def test_without_the_vmm_gpudirect_attribute_the_flag_is_not_asked_for(standin):
    standin.set_attribute(110, 0)
    with cuda.open_gpu("0") as gpu, gpu.allocate("device", 4096, "vmm") as buffer:
        assert standin.vmm_gdr_capable(buffer.ptr) == 0
        assert buffer.gpu_direct_rdma_capable is False


@pytest.mark.parametrize("attribute, version, words", [
    (0, 12080, "does not support VMM"), (1, 11080, "CUDA 11.8")])
def test_where_nccl_uses_cumemalloc_so_does_the_check(standin, attribute, version, words):
    standin.set_attribute(102, attribute)
    standin.set_driver_version(version)
    with cuda.open_gpu("0") as gpu, gpu.allocate("device", 4096, "vmm") as buffer:
        assert buffer.allocation == "malloc" and words in buffer.allocation_reason
    assert standin.calls("cuMemCreate") == 0 and standin.calls("cuMemAlloc") == 1


# ---- results the bindings may not know -------------------------------------------------


@pytest.mark.parametrize("value", [*NEWER_RESULT_NAMES, 9999])
def test_a_result_the_bindings_may_not_know_is_a_named_error(standin, value):
    """cuda-python 12.6.2.post1 raises ValueError for 226, 721 and 916, which 12.9 and 13.x
    name; either way the outcome is the same named error, never a traceback."""
    cuda_driver.driver.cache_clear()
    standin.fail("cuInit", value, 1)
    with pytest.raises(GdrprobeError) as raised:
        cuda_driver.driver()
    name = NEWER_RESULT_NAMES.get(value, f"CUresult {value}")
    assert name in raised.value.cause and raised.value.fix
    expected = GpuUnusable if name == "CUDA_ERROR_CONTAINED" else CudaError
    assert type(raised.value) is expected
    cuda_driver.driver()


def test_a_value_error_that_is_no_result_stays_a_value_error():
    def broken():
        raise ValueError("not a CUresult problem")

    with pytest.raises(ValueError, match="not a CUresult problem"):
        cuda_driver.attempt(type("Bindings", (), {"call": staticmethod(broken)}), "call")


# ---- the stand-in configured by environment: what a started gdrprobe meets --------------


def configured(**settings) -> dict:
    return {**os.environ, **standin_settings(**settings)}


OPEN = "from gdrprobe.memory import cuda; cuda.open_gpu('0').close()"


@pytest.mark.parametrize("failing, kind, words", [
    ("cuInit=802", "GpuUnusable", "fabric manager"),
    ("cuInit=804", "GpuUnusable", "forward-compatibility"),
    ("cuInit=916", "CudaError", "CUDA_ERROR_KEY_ROTATION"),
    ("cuMemAlloc=2", None, None),
])
def test_the_failures_a_test_sets_in_the_environment(failing, kind, words):
    outcome = error_of(OPEN, base_env=configured(fail=failing))
    if kind is None:       # opening the GPU allocates nothing
        assert outcome == "no error"
        return
    assert outcome["kind"] == kind and words in outcome["cause"]
    assert outcome["exit_code"] == (ExitCode.GPU_UNUSABLE if kind == "GpuUnusable"
                                    else ExitCode.RDMA)


@pytest.mark.parametrize("mode, opens", [("exclusive-process", True),
                                         ("exclusive-process-held", False),
                                         ("prohibited", False)])
def test_a_gpu_another_process_holds_in_exclusive_mode_is_unusable(mode, opens):
    outcome = error_of(OPEN, base_env=configured(compute_mode=mode))
    if opens:
        assert outcome == "no error"
        return
    assert outcome["kind"] == "GpuUnusable" and outcome["exit_code"] == ExitCode.GPU_UNUSABLE
    assert "exclusive-process" in outcome["cause"] and "nvidia-smi" in outcome["fix"]
    assert "CUDA_ERROR_DEVICE_UNAVAILABLE" in outcome["evidence"]


def test_the_compute_mode_attribute_follows_the_environment():
    code = ("from gdrprobe.memory import cuda, cuda_driver\n"
            "module = cuda_driver.driver()\n"
            "outcome = cuda_driver.device_attribute(module, cuda.find_device(module, '0'), "
            "'COMPUTE_MODE')")
    assert run_fresh(code, base_env=configured(compute_mode="exclusive-process")) == 3


def test_a_platform_that_refuses_the_pcie_mapping_refuses_the_dmabuf_registration():
    """NCCL asks for the PCIe mapping where it exports so (net.cc
    getHandleForAddressRangeFlags) and gives up when the export fails: not engaged."""
    code = ("from gdrprobe.memory import cuda\n"
            "    with cuda.open_gpu('0') as gpu, gpu.allocate('device', 4096, 'vmm') as b:\n"
            "        gpu.export_dmabuf(b.ptr, 4096, pcie_mapping=True)")
    outcome = error_of(code, base_env=configured(pcie_mapping="refused"))
    assert outcome["kind"] == "RegistrationFailed" and outcome["exit_code"] == ExitCode.RDMA
    assert "with the PCIe mapping returned CUDA_ERROR_NOT_SUPPORTED" in outcome["cause"]
    assert "drop --dmabuf-pcie" in outcome["fix"]


def test_vmm_attributes_and_driver_version_come_from_the_environment():
    code = ("from gdrprobe.memory import cuda\n"
            "with cuda.open_gpu('0') as gpu, gpu.allocate('device', 4096, 'vmm') as b:\n"
            "    outcome = [b.allocation, b.allocation_reason]")
    allocation, reason = run_fresh(code, base_env=configured(attributes="102=0"))
    assert allocation == "malloc" and "does not support VMM" in reason
    allocation, reason = run_fresh(code, base_env=configured(driver_version="11080"))
    assert allocation == "malloc" and "CUDA 11.8" in reason
    assert run_fresh(code, base_env=configured())[0] == "vmm"


def test_not_testable_is_never_the_answer_for_a_node_fault():
    assert not issubclass(GpuUnusable, NotTestable)


# ---- GPUs the PCI bus has and CUDA lost: the stand-in's answer against a fixture sysfs ---

LOST_GPUS = """
from gdrprobe.doctor.checks import gpu
from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.doctor.facts.cuda import collect_cuda_facts
from gdrprobe.sysroot import SysRoot
ctx = DoctorContext(SysRoot({root!r}), environ={{}})
ctx.gpu_facts = collect_cuda_facts()
fault = gpu.runtime_gpu_fault(ctx)
outcome = dict(result=ctx.cuda_facts.get("result"), fault=None if fault is None else dict(
    kind=type(fault).__name__, cause=fault.cause, evidence=fault.evidence,
    exit_code=int(fault.exit_code)))
"""
STANDIN_GPUS = ("0000:3b:00.0", "0000:3c:00.0")     # the stand-in's devices 0 and 1


def lost_gpus(tmp_path, gpus_in_sysfs: int, **settings) -> dict:
    """The stand-in configured by settings, against a sysfs with that many of its GPUs."""
    from tests.unit.doctor.machines import SysfsTree

    tree = SysfsTree(tmp_path)
    host = tree.host_bridge(0x3A)
    for bus_id in STANDIN_GPUS[:gpus_in_sysfs]:
        tree.gpu(host, bus_id)
    return run_fresh(LOST_GPUS.format(root=str(tmp_path)), base_env=configured(**settings))


@pytest.mark.parametrize("failing, result", [
    ("cuInit=100", "CUDA_ERROR_NO_DEVICE"), ("cuInit=304", "CUDA_ERROR_OPERATING_SYSTEM"),
    ("cuInit=999", "CUDA_ERROR_UNKNOWN")])
def test_cuinit_failing_while_sysfs_lists_gpus_is_a_gpu_no_job_can_use(tmp_path, failing,
                                                                        result):
    outcome = lost_gpus(tmp_path, 2, fail=failing)
    fault = outcome["fault"]
    assert outcome["result"] == result
    assert (fault["kind"], fault["exit_code"]) == ("GpuUnusable", ExitCode.GPU_UNUSABLE)
    assert fault["evidence"] == ("sysfs: 2 NVIDIA GPU(s) (0000:3b:00.0, 0000:3c:00.0); "
                                 f"CUDA: cuInit(0) returned {result}")


def test_a_driver_that_lists_no_gpu_while_sysfs_has_one_is_a_lost_gpu(tmp_path):
    fault = lost_gpus(tmp_path, 1, devices="0")["fault"]
    assert "cuInit(0) returned CUDA_ERROR_NO_DEVICE" in fault["cause"]


def test_a_driver_that_lists_fewer_gpus_than_sysfs_names_the_lost_one(tmp_path):
    fault = lost_gpus(tmp_path, 2, devices="1")["fault"]
    assert fault["exit_code"] == ExitCode.GPU_UNUSABLE
    assert "CUDA lists 1 of the 2 NVIDIA GPUs sysfs lists: 0000:3c:00.0 is lost" in \
        fault["cause"]
    assert "cuDeviceGetCount() = 1 (0000:3b:00.0)" in fault["evidence"]


@pytest.mark.parametrize("gpus_in_sysfs, settings", [(2, {"devices": "2"}),
                                                     (0, {"fail": "cuInit=100"}),
                                                     (0, {"fail": "cuInit=999"})])
def test_no_gpu_is_lost_where_cuda_lists_them_all_or_sysfs_has_none(tmp_path, gpus_in_sysfs,
                                                                     settings):
    assert lost_gpus(tmp_path, gpus_in_sysfs, **settings)["fault"] is None
