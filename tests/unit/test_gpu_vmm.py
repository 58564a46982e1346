"""GPU memory allocated as NCCL allocates it (VMM), on the fake driver: the steps, their
order, the GPUDirect flag, the fallback to cuMemAlloc where NCCL falls back, and that every
step failing frees what came before. The real bindings' call shapes are in
tests/cuda_standin."""

from __future__ import annotations

import pytest

from gdrprobe import defaults
from gdrprobe.errors import CudaError, UsageError
from gdrprobe.memory.gpu import DmaBufGpuMemory, PeermemGpuMemory
from gdrprobe.memory.spec import MemorySpec
from tests.unit.fake_cuda import FakeDriver, FakeResult, fake_gpu

VMM = {102: 1, 110: 1}     # VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, GPU_DIRECT_RDMA_WITH_CUDA_VMM
STEPS = ["cuMemGetAllocationGranularity", "cuMemCreate", "cuMemAddressReserve", "cuMemMap",
         "cuMemSetAccess"]
UNDO = ["cuMemUnmap", "cuMemAddressFree", "cuMemRelease"]


def memory_calls(driver) -> list[str]:
    return [name for name in driver.calls if name.startswith("cuMem")]


def test_nccls_default_is_the_default_allocation():
    assert defaults.GPU_ALLOCATION == "vmm" == MemorySpec().allocation


def test_vmm_memory_is_made_in_nccls_four_steps_and_freed_in_reverse():
    driver, gpu = fake_gpu(attributes=VMM)
    with gpu.allocate("device", 5000, "vmm") as buffer:
        assert buffer.allocation == "vmm" and "NCCL_CUMEM_ENABLE" in buffer.allocation_reason
        assert memory_calls(driver) == STEPS
        size, prop = driver.created
        assert size == buffer.allocated == FakeDriver.GRANULARITY   # rounded to granularity
        assert driver.reserved == (size, FakeDriver.GRANULARITY)
        assert prop.type == driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        assert prop.requestedHandleTypes == \
            driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        assert (prop.location.type, prop.location.id) == (1, 0)
        assert prop.allocFlags.gpuDirectRDMACapable == 1 and buffer.gpu_direct_rdma_capable
        ptr, mapped_size, descriptors, count = driver.access
        assert (ptr, mapped_size, count) == (buffer.ptr, size, 1)
        assert descriptors[0].flags == 3 and descriptors[0].location.id == 0
        assert "cuPointerSetAttribute" not in driver.calls       # NCCL sets none on VMM memory
    assert memory_calls(driver) == STEPS + UNDO
    assert driver.live == {}


def test_without_the_vmm_gpudirect_attribute_the_flag_is_not_asked_for():
    driver, gpu = fake_gpu(attributes={102: 1, 110: 0})
    with gpu.allocate("device", 4096, "vmm") as buffer:
        assert driver.created[1].allocFlags.gpuDirectRDMACapable == 0
        assert buffer.gpu_direct_rdma_capable is False


@pytest.mark.parametrize("attributes, version, words", [
    ({102: 0}, 12080, "the GPU does not support VMM"),
    ({}, 12080, "the GPU does not support VMM"),          # a driver that lacks the attribute
    (VMM, 11080, "the driver is CUDA 11.8"),
])
def test_where_nccl_would_not_use_vmm_cumemalloc_is_used_and_said(attributes, version, words):
    driver, gpu = fake_gpu(attributes=attributes, driver_version=version)
    with gpu.allocate("device", 4096, "vmm") as buffer:
        assert buffer.allocation == "malloc"
        assert words in buffer.allocation_reason and "ncclIsCuMemSupported" in \
            buffer.allocation_reason
    assert "cuMemCreate" not in driver.calls and "cuMemAlloc" in driver.calls


def test_malloc_is_cumemalloc_and_other_memory_types_keep_their_allocators():
    driver, gpu = fake_gpu(attributes=VMM)
    with gpu.allocate("device", 4096, "malloc") as buffer:
        assert (buffer.allocation, buffer.allocation_reason) == ("malloc", "cuMemAlloc requested")
    with gpu.allocate("pinned-host", 4096, "vmm") as buffer:
        assert buffer.memory_type == "pinned-host"
    assert "cuMemCreate" not in driver.calls


@pytest.mark.parametrize("failing", STEPS)
def test_a_failed_step_frees_what_came_before(failing):
    driver, gpu = fake_gpu(attributes=VMM, fail={failing})
    with pytest.raises(CudaError, match=failing):
        gpu.allocate("device", 4096, "vmm")
    done = STEPS[:STEPS.index(failing) + 1]
    undone = {"cuMemCreate": "cuMemRelease", "cuMemAddressReserve": "cuMemAddressFree",
              "cuMemMap": "cuMemUnmap"}
    expected = [undone[step] for step in reversed(done) if step in undone and step != failing]
    assert memory_calls(driver) == done + expected
    assert driver.live == {}


def test_a_failed_free_still_frees_the_rest_and_says_so():
    driver, gpu = fake_gpu(attributes=VMM)
    buffer = gpu.allocate("device", 4096, "vmm")
    driver.fail = {"cuMemUnmap": FakeResult.CUDA_ERROR_INVALID_VALUE}
    with pytest.raises(CudaError, match="cuMemUnmap"):
        buffer.close()
    assert memory_calls(driver)[-3:] == UNDO and driver.live == {}
    buffer.close()                                           # nothing left to do twice


@pytest.mark.parametrize("provider", [PeermemGpuMemory, DmaBufGpuMemory])
def test_a_provider_describes_its_allocation(provider):
    driver, gpu = fake_gpu(attributes=VMM)
    with provider(gpu, 4096, "device", "vmm") as memory:
        described = memory.describe()
        assert described["allocation"] == "vmm" and described["gpu_direct_rdma_capable"]
        assert "NCCL" in described["allocation_reason"]
    with provider(gpu, 4096, "device", "malloc") as memory:
        assert memory.describe()["allocation"] == "malloc"


def test_the_allocation_travels_in_the_handshake_and_is_checked():
    spec = MemorySpec.from_choice("gpu", allocation="malloc")
    assert MemorySpec.from_message(spec.to_message()) == spec
    older_peer = {key: value for key, value in spec.to_message().items() if key != "allocation"}
    assert MemorySpec.from_message(older_peer).allocation == defaults.GPU_ALLOCATION
    with pytest.raises(UsageError, match="unknown GPU allocation 'cudaMalloc'"):
        MemorySpec(kind="gpu", allocation="cudaMalloc")
