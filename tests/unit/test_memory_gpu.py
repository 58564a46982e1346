"""GPU memory without a GPU: the no-driver outcome for real, and the pure logic around it."""

from __future__ import annotations

import ctypes
import enum
import errno
import os

import pytest

from gdrprobe import _native
from gdrprobe.memory import cuda
from gdrprobe.errors import ExitCode, NotTestable, ResourceLimit, UsageError
from gdrprobe.memory.host import HostMemory
from gdrprobe.memory.gpu import (DmaBufGpuMemory, NicDmaBufSupport, PeermemGpuMemory,
                                 StagedGpuMemory, choose_mechanism, interpret_nic_probe)
from gdrprobe.memory.causes import REGISTRATION_CAUSES, registration_cause
from tests.unit.fake_cuda import FakeDriver, FakeResult
from tests.unit.machine import no_cuda_driver_only


# ---- no CUDA driver: real calls, no mocks ---------------------------------------


@no_cuda_driver_only
@pytest.mark.parametrize("selector", ["0", "0000:3b:00.0"])
def test_opening_a_gpu_without_a_driver_is_not_testable(selector):
    with pytest.raises(NotTestable) as raised:
        cuda.open_gpu(selector)
    error = raised.value
    assert "not testable: no CUDA driver" in error.cause
    assert error.exit_code == ExitCode.NOT_TESTABLE == 9
    assert "NVIDIA driver" in error.fix
    assert error.evidence.startswith("cuInit(0)")


@no_cuda_driver_only
def test_no_driver_is_retried_not_cached():
    for _ in range(2):
        with pytest.raises(NotTestable):
            cuda.driver()
    assert cuda.driver.cache_info().currsize == 0


# ---- driver results -------------------------------------------------------------




def test_check_returns_the_value_or_none():
    assert cuda.check((FakeResult.CUDA_SUCCESS, 42), "cuDeviceGetCount()") == 42
    assert cuda.check((FakeResult.CUDA_SUCCESS,), "cuInit(0)") is None


@pytest.mark.parametrize("result, error_class, words", [
    (FakeResult.CUDA_ERROR_INVALID_VALUE, cuda.CudaError, "a CUDA driver call failed"),
    (FakeResult.CUDA_ERROR_OUT_OF_MEMORY, ResourceLimit, "out of memory"),
    (FakeResult.CUDA_ERROR_NO_DEVICE, NotTestable, "not testable: no GPU"),
])
def test_check_names_the_call_and_the_error(result, error_class, words):
    with pytest.raises(error_class) as raised:
        cuda.check((result, None), "cuMemAlloc(4096)")
    assert words in raised.value.cause
    assert f"cuMemAlloc(4096) returned {result.name}" in raised.value.cause
    assert raised.value.fix


def test_a_selector_that_is_neither_ordinal_nor_bus_id_is_a_usage_error():
    with pytest.raises(UsageError):
        cuda.find_device(None, "gpu0")


# ---- device attributes ----------------------------------------------------------


def attrs(dma_buf=1, flush=1, ordering=0, rdma=1):
    return cuda.GpuAttributes(rdma, dma_buf, flush, ordering)


@pytest.mark.parametrize("flush, ordering, available, needed", [
    (1, 0, True, True),        # host flush available, writes not ordered: flush
    (1, 100, True, False),     # ordered to the owner: the flush would be a no-op
    (2, 0, False, True),       # memops only: cuFlushGPUDirectRDMAWrites not offered
    (None, None, False, True),  # driver too old to say
])
def test_flush_is_available_and_needed_from_the_attributes(flush, ordering, available, needed):
    a = attrs(flush=flush, ordering=ordering)
    assert (a.flush_available, a.flush_needed) == (available, needed)


# ---- DMA-BUF alignment ----------------------------------------------------------


@pytest.mark.parametrize("address, length, expected", [
    (0x7f0000200000, 8 << 20, (0x7f0000200000, 8 << 20, 0)),        # cuMemAlloc-aligned
    (0x7f0000200100, 4096, (0x7f0000200000, 8192, 0x100)),          # spills into a 2nd page
    (0x7f0000200100, 100, (0x7f0000200000, 4096, 0x100)),           # fits in one page
    (0x7f0000200fff, 2, (0x7f0000200000, 8192, 0xfff)),             # straddles a boundary
    (0x7f0000201000, 1, (0x7f0000201000, 4096, 0)),
])
def test_dmabuf_range_aligns_start_down_and_size_up(address, length, expected):
    span = cuda.dmabuf_range(address, length, page=4096)
    assert (span.aligned_address, span.aligned_length, span.offset) == expected
    assert span.aligned_address + span.offset == address
    assert span.aligned_address + span.aligned_length >= address + length


def test_dmabuf_range_with_64k_pages():
    span = cuda.dmabuf_range(0x10000 + 0x1234, 0x10000, page=0x10000)
    assert (span.aligned_address, span.aligned_length, span.offset) == (0x10000, 0x20000, 0x1234)


def test_dmabuf_range_rejects_an_empty_range():
    with pytest.raises(ValueError):
        cuda.dmabuf_range(0x1000, 0)


def test_dmabuf_export_needs_device_memory():
    with pytest.raises(UsageError):
        DmaBufGpuMemory(None, 4096, memory_type="managed")


# ---- NIC probe and mechanism choice ---------------------------------------------


@pytest.mark.parametrize("code, supported", [
    (errno.EOPNOTSUPP, False),        # rxe, siw: no reg_dmabuf_mr op
    (errno.EPROTONOSUPPORT, False),   # kernel < 5.12
    (errno.EBADF, True),              # got past the support check to the fd
    (errno.EINVAL, True),
    (None, True),
])
def test_nic_probe_reads_errno_like_nccl(code, supported):
    result = interpret_nic_probe(code)
    assert result.supported is supported
    assert result.errno == code
    assert "ibv_reg_dmabuf_mr" in result.reason or code is None


NIC_YES = NicDmaBufSupport(True, errno.EBADF, "NIC path exists")
NIC_NO = interpret_nic_probe(errno.EOPNOTSUPP)


def test_auto_prefers_dmabuf_when_gpu_and_nic_agree():
    mechanism, reason = choose_mechanism("auto", attrs(dma_buf=1), NIC_YES)
    assert mechanism == "dmabuf"
    assert "DMA_BUF_SUPPORTED=1" in reason and "NIC path exists" in reason


def test_auto_falls_back_when_the_nic_cannot_register_dmabuf():
    mechanism, reason = choose_mechanism("auto", attrs(dma_buf=1), NIC_NO)
    assert mechanism == "peermem"
    assert "EOPNOTSUPP" in reason and "cannot register DMA-BUF" in reason
    assert "GPU can export" not in reason        # only the blockers are named


def test_auto_falls_back_when_the_gpu_cannot_export():
    mechanism, reason = choose_mechanism("auto", attrs(dma_buf=0), NIC_YES)
    assert mechanism == "peermem"
    assert "cannot export DMA-BUF" in reason and "NIC" not in reason


def test_auto_names_both_blockers_and_an_unknown_gpu():
    mechanism, reason = choose_mechanism("auto", None, NIC_NO)
    assert mechanism == "peermem"
    assert "unknown" in reason and "EOPNOTSUPP" in reason


@pytest.mark.parametrize("requested", ["dmabuf", "peermem"])
def test_an_explicit_request_is_honoured_with_the_facts(requested):
    mechanism, reason = choose_mechanism(requested, attrs(dma_buf=0), NIC_NO)
    assert mechanism == requested
    assert reason.startswith(f"{requested} requested") and "EOPNOTSUPP" in reason


def test_an_unknown_mechanism_is_a_usage_error():
    with pytest.raises(UsageError):
        choose_mechanism("gdrcopy", attrs(), NIC_YES)


# ---- errno table ------------------------------------------------------------------


@pytest.mark.parametrize("code, cause_words, fix_words", [
    (errno.EOPNOTSUPP, "cannot register DMA-BUF", "peermem"),
    (errno.EPROTONOSUPPORT, "older than 5.12", "5.12"),
    (errno.EFAULT, "nvidia-peermem is not loaded", "modprobe nvidia-peermem"),
    (errno.ENOMEM, "BAR1", "memlock"),
    (errno.EAGAIN, "locked-memory limit", "Resizable BAR"),
    (errno.EINVAL, "rejected", "MLX5_SCATTER_TO_CQE=0"),
    (errno.EPERM, "not permitted", "IPC_LOCK"),
])
def test_registration_errno_maps_to_cause_and_fix(code, cause_words, fix_words):
    known = registration_cause(code)
    assert cause_words in known.cause
    assert fix_words in known.fix


def test_an_unknown_registration_errno_still_names_itself():
    known = registration_cause(errno.EIO)
    assert "errno 5 (EIO)" in known.cause and "dmesg" in known.fix
    assert errno.EIO not in REGISTRATION_CAUSES


def test_the_base_provider_stages_nothing():
    with HostMemory(4096) as memory:
        assert memory.stage_out(0, 4096) == 0.0
        assert memory.stage_in(0, 4096) == 0.0


# ---- the device and providers over a fake driver: ownership and staging logic -------
# Host memory stands in for GPU memory, so copies, patterns and cleanup run for real on
# the CPU; what only a GPU can show is in tests/gpu.


def fake_gpu(**kwargs):
    driver = FakeDriver(**kwargs)
    return driver, cuda.GpuDevice(driver, 0, "0")


def test_the_device_retains_and_releases_its_context_once():
    driver, gpu = fake_gpu()
    assert (gpu.name, gpu.bus_id, driver.retained) == ("Fake H100", "0000:3b:00.0", 1)
    assert gpu.describe()["dma_buf_supported"] == 1
    gpu.close()
    gpu.close()
    assert driver.retained == 0


def test_a_failed_context_switch_releases_the_context():
    driver = FakeDriver(fail={"cuCtxSetCurrent"})
    with pytest.raises(cuda.CudaError, match="cuCtxSetCurrent returned CUDA_ERROR_INVALID_VALUE"):
        cuda.GpuDevice(driver, 0, "0")
    assert driver.retained == 0


def test_device_memory_is_freed_when_sync_memops_fails():
    driver, gpu = fake_gpu(fail={"cuPointerSetAttribute"})
    with pytest.raises(cuda.CudaError, match="SYNC_MEMOPS"):
        gpu.alloc_device(4096)
    assert driver.live == {}


def test_the_gpu_buffer_is_freed_when_the_staging_buffer_fails():
    driver, gpu = fake_gpu(fail={"cuMemHostAlloc"})
    with pytest.raises(cuda.CudaError, match="cuMemHostAlloc"):
        PeermemGpuMemory(gpu, 8192)
    assert driver.live == {}


def test_gpu_provider_patterns_and_poison_go_through_the_staging_copy():
    driver, gpu = fake_gpu()
    with PeermemGpuMemory(gpu, 8192) as memory:
        assert memory.address == memory.buffer.ptr
        memory.poison()
        memory.fill_pattern(0, 4096, 5)
        _native.zero_fill(memory.staging.ptr, 8192)     # the check must read the GPU side
        assert memory.verify_pattern(0, 4096, 5) == (0, -1)
        assert memory.verify_poison(4096) == (0, -1)
        ctypes.c_uint8.from_address(memory.buffer.ptr + 5000).value = 0   # a stray write
        assert memory.verify_poison(4096) == (1, 5000)
        assert memory.describe()["gpudirect_proof"] is True
        assert memory.stage_out(0, 4096) == 0.0
    assert driver.live == {}
    memory.close()


def test_managed_memory_is_described_as_no_proof():
    driver = FakeDriver()
    driver.cuMemAllocManaged = lambda length, flags: driver._alloc("cuMemAllocManaged", length,
                                                                   "device")
    driver.CUmemAttach_flags = enum.IntEnum("CUmemAttach_flags", {"CU_MEM_ATTACH_GLOBAL": 1})
    with PeermemGpuMemory(cuda.GpuDevice(driver, 0, "0"), 4096, "managed") as memory:
        assert memory.describe()["gpudirect_proof"] is False
    assert driver.live == {}


def test_staged_memory_exposes_the_bounce_buffer_and_stages_both_ways():
    driver, gpu = fake_gpu()
    with StagedGpuMemory(gpu, 8192) as memory:
        assert memory.address == memory.staging.ptr
        memory.fill_pattern(0, 8192, 9)
        _native.zero_fill(memory.staging.ptr, 8192)
        assert memory.stage_out(0, 8192) >= 0.0
        assert _native.pattern_verify(memory.staging.ptr, 8192, 9) == (0, -1)
        _native.pattern_fill(memory.staging.ptr, 4096, 10)        # the peer's write lands
        assert memory.verify_pattern(0, 4096, 10)[0] > 0           # a missed stage_in shows
        _native.pattern_fill(memory.staging.ptr, 4096, 10)        # next round, done right
        memory.stage_in(0, 4096)
        assert memory.verify_pattern(0, 4096, 10) == (0, -1)
        memory.flush_remote_writes()
        assert "cuFlushGPUDirectRDMAWrites" not in driver.calls
        assert memory.describe()["mechanism"] == "staged"
        assert memory.describe()["gpudirect_proof"] is False


def test_dmabuf_address_is_the_offset_and_export_is_aligned():
    driver, gpu = fake_gpu()
    with DmaBufGpuMemory(gpu, 8192) as memory:
        assert memory.address == memory.buffer.ptr % cuda.HOST_PAGE_BYTES
        fd, offset = gpu.export_dmabuf(memory.buffer.ptr + 100, 4096)
        os.close(fd)
        assert offset == (memory.buffer.ptr + 100) % cuda.HOST_PAGE_BYTES
        assert driver.exported[1] == 2 * cuda.HOST_PAGE_BYTES


def test_dmabuf_export_is_refused_when_the_gpu_cannot():
    driver, gpu = fake_gpu(attributes={124: 0})
    with gpu.alloc_device(4096) as buffer, pytest.raises(NotTestable, match="DMA_BUF_SUPPORTED=0"):
        gpu.export_dmabuf(buffer.ptr, 4096)
    assert "cuMemGetHandleForAddressRange" not in driver.calls


@pytest.mark.parametrize("options, ordering, called", [(1, 0, True), (1, 100, False),
                                                       (0, 0, False), (2, 200, False)])
def test_flush_is_called_only_when_available_and_needed(options, ordering, called):
    driver, gpu = fake_gpu(attributes={117: options, 118: ordering})
    assert gpu.flush_rdma_writes() is called
    assert ("cuFlushGPUDirectRDMAWrites" in driver.calls) is called
