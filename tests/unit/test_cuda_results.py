"""What a CUDA driver result becomes (gdrprobe/memory/cuda_results.py): its error, exit code
and scheduler action, with the call, the cause and a fix; results the installed cuda-python
does not know included."""

from __future__ import annotations

import enum

import pytest

from gdrprobe.errors import (SCHEDULER_ACTION, CudaError, ExitCode, GpuOutOfMemory,
                             GpuUnusable, NotTestable)
from gdrprobe.memory import cuda
from gdrprobe.memory import cuda_driver
from gdrprobe.memory.cuda_results import RESULT_ERRORS
from tests.unit.fake_cuda import FakeDriver, FakeResult


def test_check_returns_the_value_or_none():
    assert cuda_driver.check((FakeResult.CUDA_SUCCESS, 42), "cuDeviceGetCount()") == 42
    assert cuda_driver.check((FakeResult.CUDA_SUCCESS,), "cuInit(0)") is None


@pytest.mark.parametrize("result, error_class, words", [
    (FakeResult.CUDA_ERROR_INVALID_VALUE, CudaError, "a CUDA driver call failed"),
    (FakeResult.CUDA_ERROR_OUT_OF_MEMORY, GpuOutOfMemory, "out of memory"),
    (FakeResult.CUDA_ERROR_NO_DEVICE, NotTestable, "not testable: no GPU"),
])
def test_check_names_the_call_and_the_error(result, error_class, words):
    with pytest.raises(error_class) as raised:
        cuda_driver.check((result, None), "cuMemAlloc(4096)")
    assert words in raised.value.cause
    assert f"cuMemAlloc(4096) returned {result.name}" in raised.value.cause
    assert raised.value.fix


# ---- what cuInit may return at start-up --------------------------------------------------


class StartUpResult(enum.IntEnum):
    """CUresult names and values of cuda.h for the results cuInit can return at start-up."""
    CUDA_ERROR_STUB_LIBRARY = 34
    CUDA_ERROR_DEVICE_UNAVAILABLE = 46
    CUDA_ERROR_SYSTEM_NOT_READY = 802
    CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803
    CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE = 804
    CUDA_ERROR_MPS_CONNECTION_FAILED = 805
    CUDA_ERROR_UNKNOWN = 999


def start_up_error(result, error_class, words: str):
    """What cuInit's result raises: of error_class, naming its cause and a fix."""
    with pytest.raises(error_class) as raised:
        cuda_driver.check((result,), "cuInit(0)")
    assert words in raised.value.cause and raised.value.fix
    return raised.value


@pytest.mark.parametrize("result, words", [
    (StartUpResult.CUDA_ERROR_STUB_LIBRARY, "stub"),
    (StartUpResult.CUDA_ERROR_MPS_CONNECTION_FAILED, "MPS"),
])
def test_start_up_results_of_the_checks_own_environment_are_not_testable(result, words):
    assert start_up_error(result, NotTestable, words).exit_code == ExitCode.NOT_TESTABLE


@pytest.mark.parametrize("result, words", [
    (StartUpResult.CUDA_ERROR_SYSTEM_NOT_READY, "fabric manager"),
    (StartUpResult.CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, "forward-compatibility"),
    (StartUpResult.CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "kernel module"),
    (StartUpResult.CUDA_ERROR_DEVICE_UNAVAILABLE, "exclusive-process"),
])
def test_start_up_results_every_job_would_meet_drain(result, words):
    error = start_up_error(result, GpuUnusable, words)
    assert error.exit_code == ExitCode.GPU_UNUSABLE
    assert SCHEDULER_ACTION[error.exit_code] == "drain"
    assert not isinstance(error, NotTestable)     # the A/B does not absorb it


def test_an_unknown_start_up_result_is_a_cuda_error_naming_it():
    with pytest.raises(CudaError, match="cuInit.0. returned CUDA_ERROR_UNKNOWN"):
        cuda_driver.check((StartUpResult.CUDA_ERROR_UNKNOWN,), "cuInit(0)")


def test_insufficient_driver_is_not_a_driver_api_result():
    assert "CUDA_ERROR_INSUFFICIENT_DRIVER" not in RESULT_ERRORS


# ---- results the installed bindings do not know (a driver newer than cuda-python) -------


class NewerDriver(FakeDriver):
    """cuda-python 12.6.2.post1 builds each result with CUresult(value): a value its enum
    lacks raises ValueError instead of returning a result."""

    def __init__(self, value: int, call: str):
        super().__init__()
        self.value, self.call = value, call

    def __getattribute__(self, name):
        if name == object.__getattribute__(self, "call"):
            value = object.__getattribute__(self, "value")

            def unknown(*args):
                raise ValueError(f"{value} is not a valid CUresult")
            return unknown
        return object.__getattribute__(self, name)


@pytest.mark.parametrize("value, error_class, name", [
    (226, GpuUnusable, "CUDA_ERROR_CONTAINED (CUresult 226, unknown to this cuda-python)"),
    (916, CudaError, "CUDA_ERROR_KEY_ROTATION (CUresult 916, unknown to this cuda-python)"),
    (4242, CudaError, "CUresult 4242 (unknown to this cuda-python)"),
])
@pytest.mark.parametrize("call", ["cuInit", "cuMemAlloc"])
def test_a_result_the_bindings_do_not_know_is_a_named_error(value, error_class, name, call):
    driver = NewerDriver(value, call)
    with pytest.raises(error_class) as raised:
        if call == "cuInit":
            cuda_driver.initialised(driver)
        else:
            cuda.GpuDevice(driver, 0, "0").alloc_device(4096)
    assert name in raised.value.cause and raised.value.fix
