"""Binding call shapes, not a GPU: gdrprobe's CUDA and GPU-memory code through the real
cuda.bindings over the stand-in libcuda.so.1 (see conftest.py and standin.c).

What this proves: argument marshalling and return tuples of every driver call gdrprobe
makes, enum names, the alignment of exported DMA-BUF ranges, that a context is current
before each call that needs one (from any thread), fd and allocation lifetimes, and that
every result the driver can return for each call lands on a defined outcome. What it does
not prove: anything about a GPU, GPUDirect RDMA or a driver's behaviour; tests/gpu does
that on a machine with a GPU.
"""

from __future__ import annotations

import os
import threading

import pytest

from gdrprobe import _native
from gdrprobe.errors import (ExitCode, GdrprobeError, GpuOutOfMemory, GpuUnusable, NotTestable,
                             RegistrationFailed, UsageError)
from gdrprobe.memory.causes import DMABUF_EXPORT_REFUSED
from gdrprobe.memory import cuda
from gdrprobe.memory import cuda_driver
from gdrprobe.memory.gpu import DmaBufGpuMemory, PeermemGpuMemory, StagedGpuMemory
from tests.cuda_standin.conftest import error_of, real_driver_present

HOST_PAGE = 4096
GPU_PAGE = 64 << 10


def results():
    """Every CUresult this cuda-python knows, but success."""
    return [r for r in cuda_driver.import_driver().CUresult if int(r) != 0]


@pytest.fixture
def gpu(standin):
    with cuda.open_gpu("0") as device:
        yield device
    standin.assert_nothing_held()


# ---- call shapes ---------------------------------------------------------------------


@pytest.mark.parametrize("selector", ["0", "0000:3b:00.0", "0000:3B:00.0", "00000000:3b:00.0"])
def test_a_gpu_opens_by_ordinal_or_any_spelling_of_its_bus_id(standin, selector):
    with cuda.open_gpu(selector) as gpu:
        assert (gpu.ordinal, gpu.bus_id) == (0, "0000:3b:00.0")
        assert "stand-in" in gpu.name
        assert standin.retained() == 1
        assert standin.calls("cuCtxSetCurrent") >= 1
    standin.assert_nothing_held()


def test_the_attributes_are_read_by_their_enum_names(standin):
    standin.set_attribute(118, 100)
    standin.set_attribute(124, 0)
    with cuda.open_gpu("0") as gpu:
        assert gpu.attributes == cuda.GpuAttributes(1, 0, 1, 100)
        assert gpu.describe()["dma_buf_supported"] == 0


def test_an_ordinal_past_the_last_gpu_says_how_many_there_are(standin):
    standin.set_devices(2)
    with cuda.open_gpu("1") as second:
        assert second.bus_id == "0000:3c:00.0"
    with pytest.raises(UsageError, match="this machine has 2 GPU"):
        cuda.open_gpu("5")
    with pytest.raises(UsageError, match="no GPU '0000:99:00.0'"):
        cuda.open_gpu("0000:99:00.0")
    standin.assert_nothing_held()


@pytest.mark.parametrize("memory_type", ["device", "managed"])
def test_gpu_memory_is_whole_gpu_pages_and_copies_both_ways(standin, gpu, memory_type):
    with gpu.allocate(memory_type, 5000) as buffer, gpu.alloc_pinned_host(5000) as host:
        assert standin.length(buffer.ptr) == GPU_PAGE == buffer.allocated
        assert buffer.length == 5000
        _native.pattern_fill(host.ptr, 5000, 3)
        gpu.copy_to_device(buffer.ptr, host.ptr, 5000)
        _native.zero_fill(host.ptr, 5000)
        gpu.copy_to_host(host.ptr, buffer.ptr, 5000)
        assert _native.pattern_verify(host.ptr, 5000, 3) == (0, -1)
    assert standin.live(-1) == 0


def test_device_memory_gets_sync_memops(standin, gpu):
    with gpu.allocate("device", 4096) as buffer:
        assert standin.sync_memops(buffer.ptr) == 1


@pytest.mark.parametrize("start, length", [(0, GPU_PAGE), (100, 5000), (4095, 2), (0x1234, 1)])
def test_a_dmabuf_export_is_host_page_aligned_and_a_file_descriptor(standin, gpu, start, length):
    standin.set_alloc_offset(0x200)          # cuMemAlloc may return sub-page addresses
    with gpu.allocate("device", GPU_PAGE) as buffer:
        ptr = buffer.ptr + start
        fd, offset = gpu.export_dmabuf(ptr, length)
        try:
            aligned, exported, flags = standin.last_export()
            assert aligned % HOST_PAGE == 0 and exported % HOST_PAGE == 0 and flags == 0
            assert aligned + offset == ptr and aligned + exported >= ptr + length
            assert os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:gdrprobe-standin")
        finally:
            os.close(fd)


@pytest.mark.parametrize("ordering, flushed", [(0, 1), (100, 0), (200, 0)])
def test_the_flush_goes_to_the_owner_only_when_writes_are_unordered(standin, ordering, flushed):
    standin.set_attribute(118, ordering)
    with cuda.open_gpu("0") as gpu:
        assert gpu.flush_rdma_writes() is bool(flushed)
    assert standin.flushes() == flushed


def test_every_call_makes_its_context_current_on_the_calling_thread(standin, gpu):
    """The loopback server opens and uses GPU memory on its own thread; contexts are per
    thread, so each call must make the GPU's context current first."""
    errors = []

    def elsewhere():
        try:
            with PeermemGpuMemory(gpu, 3 * HOST_PAGE) as memory:
                memory.poison()
                memory.fill_pattern(0, HOST_PAGE, 8)
                assert memory.verify_pattern(0, HOST_PAGE, 8) == (0, -1)
                assert memory.verify_poison(HOST_PAGE) == (0, -1)
                fd, _ = gpu.export_dmabuf(memory.buffer.ptr, HOST_PAGE)
                os.close(fd)
                memory.flush_remote_writes()
        except Exception as error:       # reported on the test's thread
            errors.append(error)

    worker = threading.Thread(target=elsewhere)
    worker.start()
    worker.join(30)
    assert errors == []
    assert standin.calls_without_context() == 0
    assert standin.flushes() == 1


@pytest.mark.parametrize("allocation, live", [("malloc", 2), ("vmm", 3)])
@pytest.mark.parametrize("provider", [PeermemGpuMemory, StagedGpuMemory, DmaBufGpuMemory])
def test_each_provider_frees_all_it_allocated(standin, gpu, provider, allocation, live):
    with provider(gpu, 5000, "device", allocation) as memory:
        memory.fill_pattern(0, 5000, 4)
        _native.zero_fill(memory.staging.ptr, 5000)
        assert memory.verify_pattern(0, 5000, 4) == (0, -1)
        assert memory.describe()["mechanism"] == provider.mechanism
        assert memory.describe()["allocation"] == allocation
        # the GPU buffer (VMM: its memory and its address range) and the staging copy
        assert standin.live(-1) == live
    assert standin.live(-1) == 0


# ---- every result lands on a defined outcome -------------------------------------------


def open_and_close(gpu):
    with cuda.open_gpu("0"):
        pass


def allocate(memory_type):
    return lambda gpu: gpu.allocate(memory_type, 4096).close()


def copy_round_trip(gpu):
    with gpu.allocate("device", 4096) as buffer, gpu.alloc_pinned_host(4096) as host:
        gpu.copy_to_device(buffer.ptr, host.ptr, 4096)
        gpu.copy_to_host(host.ptr, buffer.ptr, 4096)


def export(gpu):
    with gpu.allocate("device", 4096) as buffer:
        fd, _ = gpu.export_dmabuf(buffer.ptr, 4096)
        os.close(fd)


def allocate_vmm(gpu):
    gpu.allocate("device", 4096, "vmm").close()


# Each driver call gdrprobe makes, and an action of gdrprobe's that makes it.
ACTIONS = {
    "cuInit": lambda gpu: (cuda_driver.driver.cache_clear(), cuda_driver.driver()),
    "cuDriverGetVersion": lambda gpu: cuda_driver.driver_version(),
    "cuDeviceGet": open_and_close,
    "cuDeviceGetName": open_and_close,
    "cuDeviceGetPCIBusId": open_and_close,
    "cuDeviceGetAttribute": open_and_close,
    "cuDevicePrimaryCtxRetain": open_and_close,
    "cuCtxSetCurrent": open_and_close,
    "cuDevicePrimaryCtxRelease": open_and_close,
    "cuDeviceGetByPCIBusId": lambda gpu: cuda.open_gpu("0000:3b:00.0").close(),
    "cuDeviceGetCount": lambda gpu: cuda.open_gpu("9"),
    "cuMemAlloc": allocate("device"),
    "cuPointerSetAttribute": allocate("device"),
    "cuMemFree": allocate("device"),
    "cuMemAllocManaged": allocate("managed"),
    "cuMemHostAlloc": allocate("pinned-host"),
    "cuMemFreeHost": allocate("pinned-host"),
    "cuMemcpyHtoD": copy_round_trip,
    "cuMemcpyDtoH": copy_round_trip,
    "cuMemGetHandleForAddressRange": export,
    "cuFlushGPUDirectRDMAWrites": lambda gpu: gpu.flush_rdma_writes(),
    **{call: allocate_vmm for call in ("cuMemGetAllocationGranularity", "cuMemCreate",
                                       "cuMemAddressReserve", "cuMemMap", "cuMemSetAccess",
                                       "cuMemUnmap", "cuMemAddressFree", "cuMemRelease")},
}
DOCUMENTED_EXIT_CODES = {int(code) for code in ExitCode}


@pytest.mark.parametrize("call", sorted(ACTIONS))
def test_every_result_of_each_call_is_a_named_error(standin, call):
    outcomes = {}
    for result in results():
        standin.reset()
        with cuda.open_gpu("0") as gpu:
            standin.fail(call, result, 1)
            try:
                ACTIONS[call](gpu)
                outcome = "handled"          # e.g. an attribute read as "unknown"
            except GdrprobeError as error:
                assert result.name in f"{error.cause} {error.evidence}", error
                assert error.fix and int(error.exit_code) in DOCUMENTED_EXIT_CODES
                outcome = type(error).__name__
        outcomes[result.name] = outcome
        if call != "cuDevicePrimaryCtxRelease":   # a context the driver will not release stays
            assert standin.retained() == 0
    assert standin.calls(call) >= 1
    # A call that can fail says so: only the attribute reads degrade to "unknown".
    handled = {name for name, outcome in outcomes.items() if outcome == "handled"}
    assert not handled or call == "cuDeviceGetAttribute", handled


@pytest.mark.parametrize("allocation, calls", [
    ("malloc", ("cuPointerSetAttribute", "cuMemHostAlloc")),
    ("vmm", ("cuMemGetAllocationGranularity", "cuMemCreate", "cuMemAddressReserve", "cuMemMap",
             "cuMemSetAccess", "cuMemHostAlloc")),
])
def test_a_failed_allocation_step_frees_what_came_before(standin, gpu, allocation, calls):
    for call in calls:
        standin.fail(call, 1, 1)
        with pytest.raises(GdrprobeError, match=call):
            PeermemGpuMemory(gpu, 4096, "device", allocation)
        assert standin.live(-1) == 0, call


@pytest.mark.parametrize("result, error_class, cause_words, fix_words", [
    ("CUDA_ERROR_SYSTEM_NOT_READY", GpuUnusable, "fabric manager", "nvidia-fabricmanager"),
    ("CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", GpuUnusable, "forward-compatibility",
     "cuda-compat"),
    ("CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", GpuUnusable, "kernel module", "reload"),
    ("CUDA_ERROR_STUB_LIBRARY", NotTestable, "stub", "LD_LIBRARY_PATH"),
    ("CUDA_ERROR_NO_DEVICE", NotTestable, "no GPU", "nvidia-smi"),
    ("CUDA_ERROR_OUT_OF_MEMORY", GpuOutOfMemory, "out of memory", "free GPU memory"),
])
def test_start_up_results_name_their_cause(standin, result, error_class, cause_words, fix_words):
    code = int(getattr(cuda_driver.import_driver().CUresult, result))
    cuda_driver.driver.cache_clear()
    standin.fail("cuInit", code, 1)
    with pytest.raises(error_class) as raised:
        cuda_driver.driver()
    assert cause_words in raised.value.cause and fix_words in raised.value.fix
    assert f"cuInit(0) returned {result}" in raised.value.cause
    cuda_driver.driver()        # the next attempt starts the driver: failures are not cached


@pytest.mark.parametrize("result", ["CUDA_ERROR_NOT_SUPPORTED", "CUDA_ERROR_INVALID_VALUE",
                                    "CUDA_ERROR_UNKNOWN"])
def test_a_refused_dmabuf_export_is_a_refused_dmabuf_registration(standin, gpu, result):
    """The GPU says it can export (DMA_BUF_SUPPORTED=1) and the driver refuses: NCCL makes
    the same call and gives up (net.cc CUCHECK), so the DMA-BUF registration failed."""
    standin.fail("cuMemGetHandleForAddressRange", int(getattr(cuda_driver.import_driver().CUresult,
                                                               result)))
    with gpu.allocate("device", 4096) as buffer, pytest.raises(RegistrationFailed) as raised:
        gpu.export_dmabuf(buffer.ptr, 4096, pcie_mapping=False)
    error = raised.value
    assert "refused to export the GPU memory as DMA-BUF" in error.cause
    assert f"returned {result}" in error.cause
    assert (error.mechanism, error.error_code) == ("dmabuf", DMABUF_EXPORT_REFUSED)
    assert not isinstance(error, NotTestable)


def test_a_gpu_that_cannot_export_is_not_asked_and_stays_not_testable(standin):
    standin.set_attribute(124, 0)
    with cuda.open_gpu("0") as gpu, gpu.allocate("device", 4096) as buffer, \
            pytest.raises(NotTestable) as raised:
        gpu.export_dmabuf(buffer.ptr, 4096)
    assert raised.value.exit_code == ExitCode.NOT_TESTABLE
    assert standin.calls("cuMemGetHandleForAddressRange") == 0


# ---- load-time outcomes: each in a fresh interpreter -----------------------------------


def test_a_driver_without_cuGetProcAddress_v2_is_too_old_for_these_bindings():
    outcome = error_of("from gdrprobe.memory import cuda_driver; cuda_driver.driver()",
                       variant="no-proc-address-v2")
    if outcome == "no error":
        pytest.skip("these bindings fall back to plain dlsym without cuGetProcAddress_v2")
    assert outcome["kind"] == "NotTestable" and outcome["exit_code"] == 9
    assert "too old for this cuda-python" in outcome["cause"]
    assert "cuGetProcAddress_v2" in outcome["evidence"]
    assert "could not be loaded" not in outcome["cause"]


def test_an_entry_point_the_driver_lacks_is_named():
    outcome = error_of(
        "from gdrprobe.memory import cuda\n"
        "    with cuda.open_gpu('0') as gpu, gpu.allocate('device', 4096) as b:\n"
        "        gpu.export_dmabuf(b.ptr, 4096)",
        before="ctypes.CDLL('libcuda.so.1').standin_hide(b'cuMemGetHandleForAddressRange')")
    assert outcome["kind"] == "NotTestable"
    assert "cuMemGetHandleForAddressRange" in outcome["cause"]
    assert "driver" in outcome["fix"]


def test_no_loadable_libcuda_is_no_cuda_driver():
    if real_driver_present():
        pytest.skip("a CUDA driver is installed here")
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    outcome = error_of("from gdrprobe.memory import cuda_driver; cuda_driver.driver()", base_env=env,
                       variant=None)
    assert outcome["kind"] == "NotTestable"
    assert "libcuda.so.1 could not be loaded" in outcome["cause"]
