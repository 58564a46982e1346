"""gdrprobe.memory.cuda and the GPU providers' CUDA side on a real GPU (no RDMA device needed).

Skips the whole file, with the reason, where there is no CUDA driver or no GPU. What the
device reports goes to the summary at the end (see conftest.py); ``./dev gpu`` runs it.
"""

from __future__ import annotations

import os
import stat

import pytest

from gdrprobe import _native
from gdrprobe.errors import MissingDependency, NotTestable
from gdrprobe.memory import cuda
from gdrprobe.memory import runtime
from gdrprobe.memory import cuda_driver
from gdrprobe.memory.gpu import PeermemGpuMemory, StagedGpuMemory

MiB = 1 << 20

try:
    cuda_driver.driver()
except (NotTestable, MissingDependency) as error:
    pytest.skip(f"needs a GPU: {error.cause}", allow_module_level=True)

SELECTOR = os.environ.get("GDRPROBE_TEST_GPU", "0")


@pytest.fixture
def gpu():
    with cuda.open_gpu(SELECTOR) as device:
        yield device


def test_open_by_ordinal_reports_the_device(gpu, facts):
    version = cuda_driver.driver_version()
    facts["CUDA driver"] = f"{version // 1000}.{version % 1000 // 10}"
    facts["GPU"] = f"{gpu.name} at {gpu.bus_id} (ordinal {gpu.ordinal})"
    assert gpu.name and gpu.bus_id.count(":") == 2


def test_open_by_bus_id_finds_the_same_gpu(gpu):
    with cuda.open_gpu(gpu.bus_id) as same:
        assert (same.ordinal, same.bus_id) == (gpu.ordinal, gpu.bus_id)
    with cuda.open_gpu(gpu.bus_id.upper()) as same:
        assert same.ordinal == gpu.ordinal


def test_device_attributes_are_sane(gpu, facts):
    a = gpu.attributes
    facts["attributes"] = (f"GPUDirect RDMA {a.gpu_direct_rdma_supported}, DMA-BUF "
                           f"{a.dma_buf_supported}, flush options "
                           f"{a.gpu_direct_rdma_flush_writes_options}, writes ordering "
                           f"{a.gpu_direct_rdma_writes_ordering}")
    assert a.gpu_direct_rdma_supported in (0, 1)
    assert a.dma_buf_supported in (0, 1, None)
    assert (a.gpu_direct_rdma_flush_writes_options or 0) & ~3 == 0
    assert a.gpu_direct_rdma_writes_ordering in (0, 100, 200, None)


@pytest.mark.parametrize("memory_type", ["device", "managed", "pinned-host"])
def test_each_memory_type_allocates_copies_and_frees(gpu, memory_type):
    with gpu.allocate(memory_type, 4 * MiB + 1) as buffer, \
            gpu.alloc_pinned_host(4 * MiB) as host:
        assert buffer.ptr and host.ptr
        if memory_type != "pinned-host":
            assert buffer.allocated % cuda_driver.GPU_PAGE_BYTES == 0   # whole 64 KiB GPU pages
        _native.pattern_fill(host.ptr, 4 * MiB, 7)
        gpu.copy_to_device(buffer.ptr, host.ptr, 4 * MiB)
        _native.zero_fill(host.ptr, 4 * MiB)
        gpu.copy_to_host(host.ptr, buffer.ptr, 4 * MiB)
        assert _native.pattern_verify(host.ptr, 4 * MiB, 7) == (0, -1)
    buffer.close()      # idempotent


def exported_name(fd: int) -> str | None:
    """The exporter's name in /proc/self/fdinfo: only a real dma-buf fd has one."""
    with open(f"/proc/self/fdinfo/{fd}") as info:
        for line in info:
            if line.startswith("exp_name:"):
                return line.split(":", 1)[1].strip()
    return None


def test_dmabuf_export_is_a_real_dmabuf_of_an_aligned_range(gpu, facts):
    if not gpu.attributes.dma_buf_supported:
        facts["DMA-BUF export"] = "not supported by this GPU/driver"
        pytest.skip("this GPU/driver cannot export DMA-BUF")
    with gpu.alloc_device(8 * MiB) as buffer:
        for start, length in ((0, 8 * MiB), (4096 + 0x100, 1 * MiB)):
            fd, offset = gpu.export_dmabuf(buffer.ptr + start, length)
            try:
                assert fd > 0 and not stat.S_ISREG(os.fstat(fd).st_mode)
                assert offset == (buffer.ptr + start) % runtime.HOST_PAGE_BYTES
                name = exported_name(fd)
                assert name, "the exported fd is not a dma-buf (no exp_name in fdinfo)"
                facts["DMA-BUF export"] = f"fd with exp_name {name}"
            finally:
                os.close(fd)
            with pytest.raises(OSError):
                os.fstat(fd)


def test_dmabuf_export_with_pcie_mapping_when_supported(gpu, facts):
    if not gpu.attributes.dma_buf_supported:
        pytest.skip("this GPU/driver cannot export DMA-BUF")
    with gpu.alloc_device(2 * MiB) as buffer:
        try:
            fd, _ = gpu.export_dmabuf(buffer.ptr, 2 * MiB, pcie_mapping=True)
        except NotTestable as error:
            facts["DMA-BUF PCIe mapping"] = error.cause
            return
        os.close(fd)
        facts["DMA-BUF PCIe mapping"] = "exported"


def test_staged_round_trip_through_the_provider(gpu, facts):
    with StagedGpuMemory(gpu, 4 * MiB) as memory:
        memory.fill_pattern(0, 4 * MiB, 11)
        _native.zero_fill(memory.address, 4 * MiB)
        out_s = memory.stage_out(0, 4 * MiB)            # GPU -> bounce, as before a send
        assert _native.pattern_verify(memory.address, 4 * MiB, 11) == (0, -1)
        _native.pattern_fill(memory.address + MiB, MiB, 12)  # as if the peer wrote it
        in_s = memory.stage_in(MiB, MiB)
        assert memory.verify_pattern(MiB, MiB, 12) == (0, -1)
        facts["staged copies"] = (f"4 MiB GPU->host in {out_s * 1e6:.0f} us, 1 MiB host->GPU "
                                  f"in {in_s * 1e6:.0f} us")
        memory.poison()
        assert memory.verify_poison(0) == (0, -1)
        assert memory.describe()["gpudirect_proof"] is False


def test_gpu_provider_pattern_and_poison_through_staging(gpu):
    with PeermemGpuMemory(gpu, 2 * MiB) as memory:
        memory.poison()
        memory.fill_pattern(0, MiB, 3)
        assert memory.verify_pattern(0, MiB, 3) == (0, -1)
        assert memory.verify_poison(MiB) == (0, -1)
        bad, first = memory.verify_pattern(0, 2 * MiB, 3)
        assert bad > 0 and first >= MiB      # the poisoned half is no pattern
        assert memory.describe()["gpudirect_proof"] is True


def test_flush_call(gpu, facts):
    flushed = gpu.flush_rdma_writes()
    facts["cuFlushGPUDirectRDMAWrites"] = "called" if flushed else "not needed here"
    assert flushed == (gpu.attributes.flush_available and gpu.attributes.flush_needed)


def test_the_doctor_reads_bar1(gpu, facts):
    from gdrprobe.doctor.runner import run_doctor
    from gdrprobe.report.finding_ids import gpu_bar1
    bar1 = [f for f in run_doctor().findings if f.id == gpu_bar1(gpu.bus_id)]
    assert bar1, "the doctor has no BAR1 finding for this GPU"
    facts["BAR1 (doctor)"] = f"{bar1[0].status.value}: {bar1[0].summary}"
