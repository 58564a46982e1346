"""gdrprobe.memory.cuda and the GPU providers' CUDA side on a real GPU (no RDMA device needed).

Skips the whole file, with the reason, where there is no CUDA driver or no GPU. ``-s`` shows
what the device reported; paste that into the note of the session that ran it.
"""

from __future__ import annotations

import os
import stat

import pytest

from gdrprobe import _native
from gdrprobe.memory import cuda
from gdrprobe.errors import MissingDependency, NotTestable

MiB = 1 << 20

try:
    cuda.driver()
except (NotTestable, MissingDependency) as error:
    pytest.skip(f"needs a GPU: {error.cause}", allow_module_level=True)

SELECTOR = os.environ.get("GDRPROBE_TEST_GPU", "0")


@pytest.fixture
def gpu():
    with cuda.open_gpu(SELECTOR) as device:
        yield device


def test_open_by_ordinal_reports_the_device(gpu):
    print(f"\nCUDA driver {cuda.driver_version()}; GPU: {gpu.describe()}")
    assert gpu.name and gpu.bus_id.count(":") == 2


def test_open_by_bus_id_finds_the_same_gpu(gpu):
    with cuda.open_gpu(gpu.bus_id) as same:
        assert (same.ordinal, same.bus_id) == (gpu.ordinal, gpu.bus_id)
    with cuda.open_gpu(gpu.bus_id.upper()) as same:
        assert same.ordinal == gpu.ordinal


def test_device_attributes_are_sane(gpu):
    a = gpu.attributes
    print(f"\nattributes: {a.as_dict()} flush available={a.flush_available} "
          f"needed={a.flush_needed}")
    assert a.gpu_direct_rdma_supported in (0, 1)
    assert a.dma_buf_supported in (0, 1, None)
    assert (a.gpu_direct_rdma_flush_writes_options or 0) & ~3 == 0
    assert a.gpu_direct_rdma_writes_ordering in (0, 100, 200, None)


@pytest.mark.parametrize("memory_type", ["device", "managed", "pinned-host"])
def test_each_memory_type_allocates_copies_and_frees(gpu, memory_type):
    with gpu.allocate(memory_type, 4 * MiB) as buffer, gpu.alloc_pinned_host(4 * MiB) as host:
        assert buffer.ptr and host.ptr
        _native.pattern_fill(host.ptr, 4 * MiB, 7)
        gpu.copy_to_device(buffer.ptr, host.ptr, 4 * MiB)
        _native.zero_fill(host.ptr, 4 * MiB)
        gpu.copy_to_host(host.ptr, buffer.ptr, 4 * MiB)
        assert _native.pattern_verify(host.ptr, 4 * MiB, 7) == (0, -1)
    buffer.close()      # idempotent


def test_dmabuf_export_of_an_aligned_range(gpu):
    if not gpu.attributes.dma_buf_supported:
        pytest.skip("this GPU/driver cannot export DMA-BUF")
    with gpu.alloc_device(8 * MiB) as buffer:
        for start, length in ((0, 8 * MiB), (4096 + 0x100, 1 * MiB)):
            fd, offset = gpu.export_dmabuf(buffer.ptr + start, length)
            print(f"\nDMA-BUF of [{buffer.ptr + start:#x}, +{length}): fd {fd}, offset {offset:#x}")
            try:
                assert fd > 0 and not stat.S_ISREG(os.fstat(fd).st_mode)
                assert offset == (buffer.ptr + start) % cuda.HOST_PAGE_BYTES
            finally:
                os.close(fd)
            with pytest.raises(OSError):
                os.fstat(fd)


def test_dmabuf_export_with_pcie_mapping_when_supported(gpu):
    if not gpu.attributes.dma_buf_supported:
        pytest.skip("this GPU/driver cannot export DMA-BUF")
    with gpu.alloc_device(2 * MiB) as buffer:
        try:
            fd, _ = gpu.export_dmabuf(buffer.ptr, 2 * MiB, pcie_mapping=True)
        except NotTestable as error:
            pytest.skip(error.cause)
        except cuda.CudaError as error:
            print(f"\nPCIe mapping refused by this GPU: {error.cause}")
            return
        os.close(fd)


def test_staged_round_trip_through_the_provider(gpu):
    from gdrprobe.memory.gpu import StagedGpuMemory
    with StagedGpuMemory(gpu, 4 * MiB) as memory:
        memory.fill_pattern(0, 4 * MiB, 11)
        _native.zero_fill(memory.address, 4 * MiB)
        out_s = memory.stage_out(0, 4 * MiB)            # GPU -> bounce, as before a send
        assert _native.pattern_verify(memory.address, 4 * MiB, 11) == (0, -1)
        _native.pattern_fill(memory.address + MiB, MiB, 12)  # as if the peer wrote it
        in_s = memory.stage_in(MiB, MiB)
        assert memory.verify_pattern(MiB, MiB, 12) == (0, -1)
        print(f"\nstaged 4 MiB out in {out_s * 1e6:.0f} us, 1 MiB in in {in_s * 1e6:.0f} us")
        memory.poison()
        assert memory.verify_poison(0) == (0, -1)
        print(f"describe: {memory.describe()}")
        assert memory.describe()["gpudirect_proof"] is False


def test_gpu_provider_pattern_and_poison_through_staging(gpu):
    from gdrprobe.memory.gpu import PeermemGpuMemory
    with PeermemGpuMemory(gpu, 2 * MiB) as memory:
        memory.poison()
        memory.fill_pattern(0, MiB, 3)
        assert memory.verify_pattern(0, MiB, 3) == (0, -1)
        assert memory.verify_poison(MiB) == (0, -1)
        bad, first = memory.verify_pattern(0, 2 * MiB, 3)
        assert bad > 0 and first >= MiB      # the poisoned half is no pattern
        assert memory.describe()["gpudirect_proof"] is True


def test_flush_call(gpu):
    flushed = gpu.flush_rdma_writes()
    print(f"\ncuFlushGPUDirectRDMAWrites called: {flushed}")
    assert flushed == (gpu.attributes.flush_available and gpu.attributes.flush_needed)
