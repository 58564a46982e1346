"""What this machine has, for unit tests that assume its absence: they skip, not fail, on a
developer's machine with a NIC or a GPU."""

import ctypes
import os

import pytest


def has_rdma_device() -> bool:
    try:
        return bool(os.listdir("/sys/class/infiniband"))
    except OSError:
        return False


def has_cuda_driver() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


no_rdma_device_only = pytest.mark.skipif(has_rdma_device(),
                                         reason="this machine has an RDMA device (the lab covers it)")
no_cuda_driver_only = pytest.mark.skipif(has_cuda_driver(),
                                         reason="a CUDA driver is installed here (tests/gpu covers it)")
