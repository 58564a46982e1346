"""What this machine has, for unit tests that assume its absence: they skip, not fail, on a
developer's machine with a NIC or a GPU, or one without pyverbs."""

from __future__ import annotations

import ctypes
import importlib.util
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


def has_pyverbs() -> bool:
    """Whether rdma-core's Python bindings import here (their package, not their devices)."""
    try:
        return importlib.util.find_spec("pyverbs.device") is not None
    except ImportError:          # the pyverbs package itself is missing or refuses to load
        return False


def why_not_a_machine_without_rdma() -> str | None:
    """These tests ask verbs, through pyverbs, for the devices of a machine that has none:
    with a device there is something to find, and without pyverbs nothing to ask."""
    if has_rdma_device():
        return "this machine has an RDMA device (the lab covers it)"
    if not has_pyverbs():
        return ("pyverbs is not importable here, so verbs cannot be asked "
                "(Debian: apt-get install python3-pyverbs)")
    return None


NOT_A_MACHINE_WITHOUT_RDMA = why_not_a_machine_without_rdma()
no_rdma_device_only = pytest.mark.skipif(NOT_A_MACHINE_WITHOUT_RDMA is not None,
                                         reason=NOT_A_MACHINE_WITHOUT_RDMA or "")
no_cuda_driver_only = pytest.mark.skipif(has_cuda_driver(),
                                         reason="a CUDA driver is installed here (tests/gpu covers it)")
