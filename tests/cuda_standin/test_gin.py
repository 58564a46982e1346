"""check --gin's calls through the real cuda.bindings over the stand-in libcuda.so.1 and the
stand-in libmlx5.so.1 (issue 44): NCCL's doorbell registration (a UAR from
mlx5dv_devx_alloc_uar, cuMemHostRegister with PORTABLE | DEVICEMAP | IOMEMORY,
cuMemHostGetDevicePointer), both answers of the driver, and everything released after an
error or a Ctrl-C. Binding call shapes, not a GPU and not a NIC: no device is opened here (the
stand-in libmlx5 ignores the context; the lab opens a real one over Soft-RoCE), and nothing
rings a doorbell (tests/gpu does, on a machine with a GPU and an mlx5 NIC)."""

from __future__ import annotations

import contextlib
import ctypes
import shutil

import pytest

from gdrprobe.campaign import gin
from gdrprobe.errors import ExitCode
from gdrprobe.memory import cuda_driver
from gdrprobe.report.gin import CAN_MAP, CPU_PROXIED, MAPPED, NOT_RUN, REFUSED

pytestmark = pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler")
OPERATING_SYSTEM = 304


@pytest.fixture(scope="module")
def libmlx5():
    from gdrprobe.rdma import mlx5dv
    from tests.mlx5_standin.build import build

    path = str(build())
    try:
        mlx5dv.loaded(path)
    except mlx5dv.Unavailable as error:      # no libibverbs on this machine
        pytest.skip(str(error))
    library = ctypes.CDLL(path)
    return path, library.standin_mlx5_live_uars


@contextlib.contextmanager
def no_device(library, nic):
    """The stand-in libmlx5 ignores the context: no RDMA device is opened here."""
    yield None


def step(libmlx5, environ=None, **modes):
    return gin.gin_check("0", "mlx5_0", environ or {}, libmlx5=libmlx5[0], opener=no_device, **modes)


def held(standin, libmlx5) -> tuple[int, int, int]:
    return standin.host_registered(), libmlx5[1](), standin.retained()


def test_the_driver_maps_the_doorbell(standin, libmlx5):
    answer = step(libmlx5)
    assert answer.outcome == MAPPED and answer.summary.startswith(CAN_MAP) and answer.exit_code is None
    assert "non-cached dedicated" in answer.doorbell
    assert [call.split("(")[0] for call in answer.calls] == ["cuMemHostRegister", "cuMemHostGetDevicePointer",
                                                             "cuMemHostUnregister"]
    assert ", 8, PORTABLE | DEVICEMAP | IOMEMORY): CUDA_SUCCESS" in answer.calls[0]
    assert standin.iomemory_asked() == 1 and held(standin, libmlx5) == (0, 0, 0)


def test_a_refused_registration_is_gin_cpu_proxied_a_warning(standin, libmlx5):
    standin.refuse_iomemory(OPERATING_SYSTEM)
    answer = step(libmlx5)
    assert answer.outcome == REFUSED and answer.summary.startswith(CPU_PROXIED)
    assert "CUDA_ERROR_OPERATING_SYSTEM" in answer.calls[-1] and len(answer.calls) == 1
    assert answer.exit_code == ExitCode.PERFORMANCE_WARNING and "PeerMappingOverride=1" in answer.fix
    assert held(standin, libmlx5) == (0, 0, 0)


@pytest.mark.parametrize("environ, code, words", [
    ({"NCCL_GIN_ENABLE": "1"}, ExitCode.VERDICT_NOT_OK, "GIN will run CPU-proxied"),
    ({"NCCL_GIN_TYPE": "3", "NCCL_GIN_GDAKI_NIC_HANDLER": "2"}, ExitCode.VERDICT_NOT_OK, "GIN will not start"),
    ({"NVSHMEM_IB_ENABLE_IBGDA": "1"}, ExitCode.PERFORMANCE_WARNING, "GIN will run CPU-proxied")])
def test_a_job_that_asked_for_gin_drains_where_the_driver_refuses(standin, libmlx5, environ, code, words):
    """NVSHMEM's variables alone ask nothing of NCCL: without the doctor's IBGDA mode (no
    decision for this GPU) the NCCL answer stands, a warning."""
    standin.refuse_iomemory(OPERATING_SYSTEM)
    answer = step(libmlx5, environ)
    assert (answer.exit_code, answer.summary.startswith(words)) == (code, True)


def test_without_a_dedicated_uar_nccls_order_takes_the_non_cached_one(standin, libmlx5, monkeypatch):
    """doca_gpunetio_high_level.cpp create_uar: NC_DEDICATED, then NC (rdma-core before the
    dedicated flag answers EOPNOTSUPP)."""
    monkeypatch.setenv("GDRPROBE_MLX5_STANDIN_UAR_NO_DEDICATED", "1")
    answer = step(libmlx5)
    assert answer.outcome == MAPPED and "(non-cached; " in answer.doorbell and "EOPNOTSUPP" in answer.doorbell


def test_no_uar_is_no_registration_and_nothing_held(standin, libmlx5, monkeypatch):
    monkeypatch.setenv("GDRPROBE_MLX5_STANDIN_UAR_ERRNO", "95")
    answer = step(libmlx5)
    assert answer.outcome == NOT_RUN and "EOPNOTSUPP" in answer.summary and answer.exit_code is None
    assert standin.iomemory_asked() == 0 and held(standin, libmlx5) == (0, 0, 0)


def test_a_device_pointer_refused_after_the_registration_unregisters_it(standin, libmlx5):
    standin.fail("cuMemHostGetDevicePointer", 1)
    answer = step(libmlx5)
    assert answer.outcome == REFUSED and answer.calls[-1].startswith("cuMemHostUnregister")
    assert held(standin, libmlx5) == (0, 0, 0)


def test_a_ctrl_c_with_the_doorbell_registered_releases_everything(standin, libmlx5, monkeypatch):
    """A SIGINT between the registration and the device pointer (Python raises
    KeyboardInterrupt there): the mapping, the UAR and the GPU's context are all released on
    the way out."""
    real = cuda_driver.attempt

    def interrupted(module, name, *args):
        if name == "cuMemHostGetDevicePointer":
            raise KeyboardInterrupt
        return real(module, name, *args)

    monkeypatch.setattr(cuda_driver, "attempt", interrupted)
    with pytest.raises(KeyboardInterrupt):
        step(libmlx5)
    assert standin.iomemory_asked() == 1 and held(standin, libmlx5) == (0, 0, 0)


def test_the_io_memory_flags_are_the_ones_nccl_and_aws_ofi_nccl_use():
    assert cuda_driver.IO_MEMORY_FLAGS == 0x7
    from cuda.bindings import driver
    assert int(driver.CU_MEMHOSTREGISTER_IOMEMORY) | int(driver.CU_MEMHOSTREGISTER_DEVICEMAP) \
        | int(driver.CU_MEMHOSTREGISTER_PORTABLE) == cuda_driver.IO_MEMORY_FLAGS


def test_the_stand_in_holds_cuda_s_documented_rules_for_host_registration(standin):
    """CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED for an overlap, _NOT_REGISTERED for an
    address that starts no registration, INVALID_VALUE for a device pointer of memory
    registered without DEVICEMAP."""
    from cuda.bindings import driver

    from gdrprobe.memory import cuda

    page = ctypes.create_string_buffer(8192)
    address = ctypes.addressof(page)
    with cuda.open_gpu("0") as device:
        device.activate()
        assert int(driver.cuMemHostRegister(address, 4096, 0)[0]) == 0
        assert int(driver.cuMemHostRegister(address + 8, 8, 0x7)[0]) == 712
        assert int(driver.cuMemHostGetDevicePointer(address, 0)[0]) == 1
        assert int(driver.cuMemHostUnregister(address + 8)[0]) == 713
        assert int(driver.cuMemHostUnregister(address)[0]) == 0
    standin.assert_nothing_held()
