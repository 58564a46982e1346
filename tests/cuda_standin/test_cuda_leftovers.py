"""Issue 39 item 10's CUDA leftovers, through the real cuda.bindings over the stand-in
libcuda.so.1 (binding call shapes, not a GPU): VMM memory asks for FABRIC handles where the
GPU has them, as NCCL's allocator does; the PCIe mapping of DMA-BUF follows the driver, not
the bindings; every result the policy names is a CUresult; a failing attribute query is
the driver's answer, not "unknown"; cleaning up after an error never hides the error."""

from __future__ import annotations

import os

import pytest

from gdrprobe.errors import CudaError, NotTestable
from gdrprobe.memory import cuda, cuda_driver
from gdrprobe.memory.cuda_results import NEWER_RESULT_NAMES, RESULT_ERRORS

POSIX_FD, FABRIC = 0x1, 0x8
FABRIC_SUPPORTED = 128            # CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED
NOT_PERMITTED, UNKNOWN, INVALID_VALUE = 800, 999, 1
GPU_PAGE = 64 << 10


# ---- FABRIC handles (NCCL 2.30.7 src/allocator.cc ncclMemAlloc) ---------------------------


@pytest.mark.parametrize("fabric, types", [(0, POSIX_FD), (1, POSIX_FD | FABRIC)])
def test_vmm_memory_asks_for_fabric_handles_where_the_gpu_has_them(standin, fabric, types):
    standin.set_attribute(FABRIC_SUPPORTED, fabric)
    with cuda.open_gpu("0") as gpu, gpu.allocate("device", 4096, "vmm") as buffer:
        if "cannot ask for FABRIC" in buffer.allocation_reason:      # cuda-python 12.6
            types = POSIX_FD
        assert standin.vmm_handle_types(buffer.ptr) == types
        assert ("FABRIC" in buffer.allocation_reason) is bool(fabric)
    standin.assert_nothing_held()


def bindings_take_a_handle_mask() -> bool:
    """cuda-python 12.6 takes one CUmemAllocationHandleType member, no mask of two."""
    prop = cuda_driver.import_driver().CUmemAllocationProp()
    try:
        prop.requestedHandleTypes = POSIX_FD | FABRIC
    except AttributeError:
        return False
    return True


def test_fabric_refused_by_the_platform_falls_back_to_file_descriptors(standin):
    """No IMEX channel: cuMemCreate with FABRIC is not permitted, and NCCL allocates again
    without it."""
    if not bindings_take_a_handle_mask():
        pytest.skip("these bindings cannot ask for FABRIC beside file descriptors")
    standin.set_attribute(FABRIC_SUPPORTED, 1)
    standin.fail("cuMemCreate", NOT_PERMITTED, 1)
    with cuda.open_gpu("0") as gpu, gpu.allocate("device", 4096, "vmm") as buffer:
        assert standin.vmm_handle_types(buffer.ptr) == POSIX_FD
        assert "without FABRIC (CUDA_ERROR_NOT_PERMITTED)" in buffer.allocation_reason
    standin.assert_nothing_held()


# ---- the PCIe mapping follows the driver (NCCL net.cc getHandleForAddressRangeFlags) -------


def test_the_pcie_mapping_flag_is_the_drivers_whatever_the_bindings_define(standin):
    with cuda.open_gpu("0") as gpu, gpu.allocate("device", GPU_PAGE) as buffer:
        fd, _ = gpu.export_dmabuf(buffer.ptr, GPU_PAGE, pcie_mapping=True)
        os.close(fd)
        assert standin.last_export()[2] == 1
        standin.set_driver_version(12040)
        with pytest.raises(NotTestable, match="needs CUDA 12.8"):
            gpu.export_dmabuf(buffer.ptr, GPU_PAGE, pcie_mapping=True)


# ---- every named result is one a binding defines ----------------------------------------


def test_every_result_the_policy_names_is_a_curesult():
    module = cuda_driver.import_driver()
    known = {member.name for member in module.CUresult} | set(NEWER_RESULT_NAMES.values())
    assert set(RESULT_ERRORS) - known == set()


# ---- an attribute query that fails is the driver's answer -------------------------------


def test_a_failing_attribute_query_is_the_drivers_error_not_an_unknown_attribute(standin):
    standin.fail("cuDeviceGetAttribute", UNKNOWN)
    with pytest.raises(CudaError, match="cuDeviceGetAttribute.*CUDA_ERROR_UNKNOWN"):
        cuda.open_gpu("0")
    standin.assert_nothing_held()


def test_an_attribute_this_driver_does_not_know_is_none(standin):
    standin.fail("cuDeviceGetAttribute", INVALID_VALUE)
    with cuda.open_gpu("0") as gpu:
        assert gpu.attributes.dma_buf_supported is None


# ---- cleaning up after an error keeps the error ------------------------------------------


def test_a_failed_release_after_a_failed_open_keeps_the_first_error(standin):
    standin.fail("cuCtxSetCurrent", UNKNOWN, 1)
    standin.fail("cuDevicePrimaryCtxRelease", UNKNOWN, 1)
    with pytest.raises(CudaError, match="cuCtxSetCurrent") as raised:
        cuda.open_gpu("0")
    assert any("cuDevicePrimaryCtxRelease" in note for note in raised.value.__notes__)


def test_a_failed_free_after_a_failed_vmm_map_keeps_the_first_error(standin):
    standin.fail("cuMemMap", UNKNOWN, 1)
    standin.fail("cuMemAddressFree", UNKNOWN, 1)
    with cuda.open_gpu("0") as gpu:
        with pytest.raises(CudaError, match="cuMemMap") as raised:
            gpu.allocate("device", 4096, "vmm")
    assert any("cuMemAddressFree" in note for note in raised.value.__notes__)
