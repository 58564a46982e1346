"""GPU memory without a GPU: the no-driver outcome for real, and the pure logic around it."""

from __future__ import annotations

import ctypes
import enum
import errno
import os
import sys

import pytest

from gdrprobe import _native
from gdrprobe.memory import cuda
from gdrprobe.memory import runtime
from gdrprobe.memory import cuda_driver
from gdrprobe.errors import (CudaError, ExitCode, GpuOutOfMemory, NotTestable,
                             RegistrationFailed, UsageError)
from gdrprobe.memory.host import HostMemory
from gdrprobe.memory.gpu import DmaBufGpuMemory, PeermemGpuMemory, StagedGpuMemory, choose_mechanism
from gdrprobe.memory.nic_probe import NicDmaBufSupport, interpret_nic_probe
from gdrprobe.memory.causes import DMABUF_EXPORT_REFUSED, REGISTRATION_CAUSES, registration_cause
from gdrprobe.memory.nic_probe import OLD_PYVERBS, dmabuf_mr
from tests.unit.fake_cuda import FakeDriver, FakeResult, fake_gpu
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
    assert error.evidence.startswith("dlopen(libcuda.so.1): libcuda.so.1: cannot open")


@no_cuda_driver_only
def test_no_driver_is_retried_not_cached():
    for _ in range(2):
        with pytest.raises(NotTestable):
            cuda_driver.driver()
    assert cuda_driver.driver.cache_info().currsize == 0


# ---- driver selection ---------------------------------------------------------


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
    span = runtime.dmabuf_range(address, length, page=4096)
    assert (span.aligned_address, span.aligned_length, span.offset) == expected
    assert span.aligned_address + span.offset == address
    assert span.aligned_address + span.aligned_length >= address + length


def test_dmabuf_range_with_64k_pages():
    span = runtime.dmabuf_range(0x10000 + 0x1234, 0x10000, page=0x10000)
    assert (span.aligned_address, span.aligned_length, span.offset) == (0x10000, 0x20000, 0x1234)


def test_dmabuf_range_rejects_an_empty_range():
    with pytest.raises(ValueError):
        runtime.dmabuf_range(0x1000, 0)


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


def test_the_device_retains_and_releases_its_context_once():
    driver, gpu = fake_gpu()
    assert (gpu.name, gpu.bus_id, driver.retained) == ("Fake H100", "0000:3b:00.0", 1)
    assert gpu.describe()["dma_buf_supported"] == 1
    gpu.close()
    gpu.close()
    assert driver.retained == 0


def test_a_failed_context_switch_releases_the_context():
    driver = FakeDriver(fail={"cuCtxSetCurrent"})
    with pytest.raises(CudaError, match="cuCtxSetCurrent returned CUDA_ERROR_INVALID_VALUE"):
        cuda.GpuDevice(driver, 0, "0")
    assert driver.retained == 0


def test_device_memory_is_freed_when_sync_memops_fails():
    driver, gpu = fake_gpu(fail={"cuPointerSetAttribute"})
    with pytest.raises(CudaError, match="SYNC_MEMOPS"):
        gpu.alloc_device(4096)
    assert driver.live == {}


def test_the_gpu_buffer_is_freed_when_the_staging_buffer_fails():
    driver, gpu = fake_gpu(fail={"cuMemHostAlloc"})
    with pytest.raises(CudaError, match="cuMemHostAlloc"):
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
        memory.poison(4096)                                  # the slots only
        assert memory.verify_poison(0) == (1, 5000)
        memory.poison()
        assert memory.verify_poison(0) == (0, -1)
        assert memory.describe()["gpudirect_proof"] is True
        assert memory.stage_out(0, 4096) == 0.0
    assert driver.live == {}
    memory.close()


def test_gpu_provider_slots_go_through_the_staging_copy_in_one_copy_each_way():
    driver, gpu = fake_gpu()
    with PeermemGpuMemory(gpu, 8192) as memory:
        memory.fill_slots(1024, 6, 21)
        _native.zero_fill(memory.staging.ptr, 8192)     # the check must read the GPU side
        assert memory.verify_messages(1024, 6, 7, 21, 0, 6) == (0, 0, -1)
        ctypes.c_uint8.from_address(memory.buffer.ptr + 2 * 1024 + 3).value ^= 0xFF
        assert memory.verify_messages(1024, 6, 7, 21, 0, 6) == (1, 1, 2 * 1024 + 3)
    assert driver.calls.count("cuMemcpyHtoD") == 1    # the six slots' fill, in one copy
    assert driver.calls.count("cuMemcpyDtoH") == 2    # one per verify
    assert driver.live == {}


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


def test_staged_memory_finds_stray_writes_where_the_nic_wrote_them_in_the_staging_copy():
    driver, gpu = fake_gpu()
    with StagedGpuMemory(gpu, 8192) as memory:
        memory.poison()
        _native.zero_fill(memory.buffer.ptr, 8192)       # the GPU's copy is not where to look
        assert memory.verify_poison(4096) == (0, -1)
        ctypes.c_uint8.from_address(memory.staging.ptr + 5000).value = 0   # a stray write
        assert memory.verify_poison(4096) == (1, 5000)
        assert memory.verify_poison(4096, 5000) == (0, -1) and memory.verify_poison(6000, 6000) == (0, -1)


def test_dmabuf_address_is_the_offset_and_export_is_aligned():
    driver, gpu = fake_gpu()
    with DmaBufGpuMemory(gpu, 8192) as memory:
        assert memory.address == memory.buffer.ptr % runtime.HOST_PAGE_BYTES
        fd, offset = gpu.export_dmabuf(memory.buffer.ptr + 100, 4096)
        os.close(fd)
        assert offset == (memory.buffer.ptr + 100) % runtime.HOST_PAGE_BYTES
        assert driver.exported[1] == 2 * runtime.HOST_PAGE_BYTES


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


# ---- the GPU arm as it meets a real machine (issue 9) ----------------------------------


@pytest.mark.parametrize("memory_type", ["managed", "pinned-host"])
def test_auto_registers_memory_that_cannot_be_exported_by_address(memory_type):
    mechanism, reason = choose_mechanism("auto", attrs(dma_buf=1), NIC_YES, memory_type)
    assert mechanism == "peermem"
    assert f"{memory_type} memory cannot be exported as DMA-BUF" in reason
    assert "proves nothing" in reason


def test_auto_with_device_memory_still_prefers_dmabuf():
    assert choose_mechanism("auto", attrs(dma_buf=1), NIC_YES, "device")[0] == "dmabuf"


class DynamicLibNotFoundError(RuntimeError):
    """cuda.pathfinder's error (12.9, 13.x) when no libcuda.so.1 can be loaded."""


@pytest.mark.parametrize("error, too_old", [
    (RuntimeError('Function "cuGetProcAddress_v2" not found'), True),        # 12.6.2
    (RuntimeError("Failed to get cuGetProcAddress_v2"), True),               # 12.9, 13.x
    (RuntimeError("function cuInit is not found"), True),
    (RuntimeError("Failed to dlopen libcuda.so.1"), False),                  # 12.6
    (DynamicLibNotFoundError('"cuda" is an NVIDIA driver library and can only be found via '
                             'system search. Ensure the NVIDIA display driver is installed.'),
     False),
])
def test_a_driver_the_bindings_cannot_start_is_too_old_or_absent(error, too_old):
    outcome = cuda_driver.unloadable_driver(error)
    assert outcome.exit_code == ExitCode.NOT_TESTABLE
    assert ("too old for this cuda-python" in outcome.cause) is too_old
    assert ("libcuda.so.1 could not be loaded" in outcome.cause) is not too_old
    assert str(error) in outcome.evidence


def test_an_entry_point_the_driver_lacks_is_not_testable_by_name():
    class OldDriver(FakeDriver):
        def cuMemGetHandleForAddressRange(self, *args):
            raise RuntimeError("function cuMemGetHandleForAddressRange is not found")

    gpu = cuda.GpuDevice(OldDriver(), 0, "0")
    with gpu.alloc_device(4096) as buffer, pytest.raises(NotTestable) as raised:
        gpu.export_dmabuf(buffer.ptr, 4096)
    assert "has no cuMemGetHandleForAddressRange" in raised.value.cause


def test_an_export_refused_by_a_gpu_that_can_export_is_a_refused_dmabuf_registration():
    """NCCL exports its buffers with the same call and gives up when it fails (net.cc
    CUCHECK): the DMA-BUF registration failed, not "not testable"."""
    driver, gpu = fake_gpu(fail={"cuMemGetHandleForAddressRange"})
    with gpu.alloc_device(4096) as buffer, pytest.raises(RegistrationFailed) as raised:
        gpu.export_dmabuf(buffer.ptr, 4096)
    error = raised.value
    assert (error.mechanism, error.error_code) == ("dmabuf", DMABUF_EXPORT_REFUSED)
    assert error.exit_code == ExitCode.RDMA and not isinstance(error, NotTestable)
    assert "the GPU driver refused to export the GPU memory as DMA-BUF" in error.cause
    assert "returned CUDA_ERROR_INVALID_VALUE" in error.cause
    assert "NCCL_DMABUF_ENABLE=0" in error.fix


def test_a_gpu_that_cannot_export_stays_not_testable():
    """NCCL does not use DMA-BUF on a GPU whose DMA_BUF_SUPPORTED is 0 (init.cc
    dmaBufSupported): nothing is exported, and that says nothing against the node."""
    driver, gpu = fake_gpu(attributes={124: 0})
    with gpu.alloc_device(4096) as buffer, pytest.raises(NotTestable) as raised:
        gpu.export_dmabuf(buffer.ptr, 4096)
    assert "cannot export DMA-BUF" in raised.value.cause
    assert "cuMemGetHandleForAddressRange" not in driver.calls


def test_a_missing_gpu_is_a_usage_error_but_other_results_are_not():
    driver = FakeDriver(fail={"cuDeviceGet"})            # INVALID_VALUE: no such ordinal
    with pytest.raises(UsageError, match="this machine has"):
        cuda.find_device(driver, "3")

    class Busy(FakeDriver):
        def cuDeviceGet(self, ordinal):
            return (FakeResult.CUDA_ERROR_OUT_OF_MEMORY, None)

    with pytest.raises(GpuOutOfMemory):
        cuda.find_device(Busy(), "0")


@pytest.mark.parametrize("length, pages", [(1, 1), (65536, 1), (65537, 2), (5 << 20, 80)])
def test_gpu_allocations_are_whole_64k_gpu_pages(length, pages):
    assert cuda_driver.gpu_pages(length) == pages * 65536
    driver, gpu = fake_gpu()
    with gpu.alloc_device(length) as buffer:
        assert (buffer.length, buffer.allocated) == (length, pages * 65536)
        assert driver.live[buffer.ptr][0].length == pages * 65536   # what cuMemAlloc got


def test_inline_is_never_used_from_a_non_staged_gpu_buffer():
    driver, gpu = fake_gpu()
    with HostMemory(4096) as host:
        assert host.inline_capable
    for provider, inline in ((PeermemGpuMemory, False), (DmaBufGpuMemory, False),
                             (StagedGpuMemory, True)):
        with provider(gpu, 4096) as memory:
            assert memory.inline_capable is inline, provider


class PyverbsBefore44:
    """pyverbs' DmaBufMR signature before rdma-core 44 (pyverbs/mr.pyx declares
    ``DmaBuf dmabuf=None``): Cython refuses an int fd with a TypeError."""

    class DmaBuf:
        pass

    class mr:
        @staticmethod
        def DmaBufMR(pd, length, access, dmabuf=None, offset=0):
            if not isinstance(dmabuf, PyverbsBefore44.DmaBuf):
                raise TypeError("Argument 'dmabuf' has incorrect type (expected "
                                "pyverbs.dmabuf.DmaBuf, got int)")


def test_where_pyverbs_takes_no_fd_libibverbs_registers_the_dmabuf(monkeypatch):
    """rdma-core 34 to 43: pyverbs refuses the fd, so libibverbs' ibv_reg_dmabuf_mr registers
    it, with the same arguments, and the route says so (never a silent peermem)."""
    from gdrprobe.rdma import dmabuf
    calls = []
    monkeypatch.setattr(dmabuf, "register_dmabuf", lambda *args: calls.append(args) or "mr")
    mr, route = dmabuf_mr(PyverbsBefore44, "pd", 4096, 3, fd=7, offset=512)
    assert (mr, calls) == ("mr", [("pd", 4096, 3, 7, 512)])
    assert route == dmabuf.ROUTE and "ibv_reg_dmabuf_mr" in route and "rdma-core < 44" in route


def test_without_the_extension_an_old_pyverbs_cannot_test_dmabuf(monkeypatch):
    monkeypatch.setitem(sys.modules, "gdrprobe.rdma.dmabuf", None)    # never built
    with pytest.raises(NotTestable) as raised:
        dmabuf_mr(PyverbsBefore44, None, 4096, 3, fd=7, offset=0)
    assert "DMA-BUF not testable with this pyverbs (rdma-core < 44)" in raised.value.cause
    assert "extension" in raised.value.fix and "incorrect type" in raised.value.evidence


def test_a_probe_through_libibverbs_says_so_in_its_reason():
    from gdrprobe.memory.nic_probe import with_route
    from gdrprobe.rdma.dmabuf import ROUTE
    found = with_route(interpret_nic_probe(errno.EBADF), ROUTE)
    assert found.supported and found.reason.endswith(f"registered through {ROUTE}")
    assert with_route(interpret_nic_probe(errno.EBADF), "pyverbs' DmaBufMR").reason == \
        interpret_nic_probe(errno.EBADF).reason


def test_without_pyverbs_dmabuf_auto_still_tries_peermem():
    mechanism, reason = choose_mechanism("auto", attrs(dma_buf=1),
                                         NicDmaBufSupport(False, None, OLD_PYVERBS))
    assert mechanism == "peermem" and "rdma-core < 44" in reason


def test_an_explicit_dmabuf_request_for_managed_memory_is_refused_before_anything_runs():
    from gdrprobe.memory.spec import MemorySpec
    with pytest.raises(UsageError, match="DMA-BUF export needs device memory"):
        MemorySpec.from_choice("dmabuf", memory_type="managed")
    assert MemorySpec.from_choice("gpu", memory_type="managed").mechanism == "auto"


# ---- relaxed ordering, as NCCL uses it ----------------------------------------------------


@pytest.mark.parametrize("value, wanted", [(None, True), ("2", True), ("1", True), ("0", False),
                                           ("", True)])
def test_relaxed_ordering_follows_nccl_ib_pci_relaxed_ordering(value, wanted):
    from gdrprobe.nccl.env import relaxed_ordering_wanted
    environ = {} if value is None else {"NCCL_IB_PCI_RELAXED_ORDERING": value}
    assert relaxed_ordering_wanted(environ) is wanted


def test_relaxed_ordering_is_the_verbs_access_flag_where_rdma_core_has_it():
    from gdrprobe.memory.buffers import relaxed_ordering_access
    pyverbs_enums = pytest.importorskip("pyverbs.enums")
    assert relaxed_ordering_access(False) == 0
    assert relaxed_ordering_access(True) == getattr(pyverbs_enums,
                                                    "IBV_ACCESS_RELAXED_ORDERING", 0)


def test_relaxed_ordering_travels_in_the_handshake():
    from gdrprobe.measure.options import ProbeOptions
    options = ProbeOptions(relaxed_ordering=False)
    assert ProbeOptions.from_message(options.to_message()).relaxed_ordering is False
    assert ProbeOptions().relaxed_ordering is True


class RefusesRelaxedOrdering(HostMemory):
    """Host memory whose registration refuses the relaxed-ordering bit, as rxe does on
    kernels whose RXE_ACCESS_SUPPORTED_MR lacks it (EOPNOTSUPP); records what it got."""

    def register(self, pd, access=0):
        from gdrprobe.errors import RdmaError
        self.tried = getattr(self, "tried", []) + [access]
        if access & (1 << 20):
            raise RdmaError("registering host memory failed", "", evidence="Errno: 95")


def test_a_driver_that_refuses_relaxed_ordering_gets_the_plain_registration():
    from gdrprobe.memory.buffers import register
    with RefusesRelaxedOrdering(4096) as memory:
        register(memory, None, 3, 1 << 20)
        assert memory.tried == [3 | (1 << 20), 3] and memory.relaxed_ordering is False
        assert memory.report()["relaxed_ordering"] is False
    with HostMemory(4096) as plain:
        plain.register = lambda pd, access: None
        register(plain, None, 3, 1 << 20)
        assert plain.relaxed_ordering is True


def test_a_run_posts_nothing_inline_from_a_gpu_buffer_and_says_so():
    import types
    from gdrprobe.measure.options import ProbeOptions
    from gdrprobe.measure.client import ProbeClient
    from gdrprobe.rdma.endpoint import EndpointOptions
    client = ProbeClient("127.0.0.1", 18750, "token", ProbeOptions(sizes=(64,), inline_size=128),
                         EndpointOptions())
    endpoint = types.SimpleNamespace(mtu=4096)
    driver, gpu = fake_gpu()
    with PeermemGpuMemory(gpu, 4096) as on_gpu, StagedGpuMemory(gpu, 4096) as staged, \
            HostMemory(4096) as on_host:
        assert [client._inline_bytes(m) for m in (on_gpu, staged, on_host)] == [0, 128, 128]
        settings = client._settings(endpoint, on_gpu)
        assert settings.inline_bytes == 0 and "inline off" in settings.inline_note
        assert client._settings(endpoint, on_host).inline_note == ""


def test_a_refused_peermem_registration_says_whose_peer_memory_refused_it():
    """The A/B names it in the verdict: "peermem (amdkfd)" on ROCm (issue 33)."""
    driver, gpu = fake_gpu()
    with PeermemGpuMemory(gpu, 4096) as memory:
        refusal = OSError(14, "Bad address")
        refusal.error_code = 14
        failed = memory._refused(refusal)
        assert isinstance(failed, RegistrationFailed)
        assert (failed.mechanism, failed.peer_memory) == ("peermem", gpu.attributes.peer_memory)
        assert memory.describe()["peer_memory"] == "nvidia-peermem"
