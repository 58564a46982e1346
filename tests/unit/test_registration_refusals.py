"""A refused registration, worded in one place (MemoryProvider._register_with hands the
refusal to the provider's _refused): host memory and the staged arm's pinned host copy hit
a resource limit or a verbs error, GPU memory is a failed GPU registration whose cause and
fix follow its errno, mechanism and peer-memory client. pyverbs is a fake that refuses; no
NIC here, so what is tested is the words and the exit codes, not a registration."""

from __future__ import annotations

import errno
import types

import pytest

from gdrprobe.errors import ExitCode, RdmaError, RegistrationFailed, ResourceLimit
from gdrprobe.memory.causes import MEMLOCK_FIX, REGISTRATION_CAUSES
from gdrprobe.memory.gpu import DmaBufGpuMemory, PeermemGpuMemory, StagedGpuMemory
from gdrprobe.memory.host import HostMemory
from gdrprobe.rdma import verbs
from tests.unit.fake_cuda import fake_gpu

LENGTH = 8192


class Refused(Exception):
    """pyverbs' PyverbsRDMAError as far as a refusal is read: its errno."""

    def __init__(self, code: int):
        super().__init__(f"Failed to register a MR. Errno: {code}")
        self.error_code = code


@pytest.fixture
def refusing(monkeypatch):
    """pyverbs whose MR (and DmaBufMR) refuses with ``state["errno"]``."""
    state = {"errno": errno.ENOMEM}

    def refuse(*args, **kwargs):
        raise Refused(state["errno"])

    fake = types.SimpleNamespace(PyverbsRDMAError=Refused, mr=types.SimpleNamespace(MR=refuse, DmaBufMR=refuse))
    monkeypatch.setattr(verbs, "pyverbs", lambda: fake)
    return state


def refusal_of(memory):
    with pytest.raises(Exception) as raised:
        memory.register("pd")
    assert isinstance(raised.value.__cause__, Refused)     # chained to pyverbs' own error
    assert memory.mr is None and memory.lkey == memory.rkey == 0
    return raised.value


def host_memory():
    return HostMemory(LENGTH)


def staged_memory():
    return StagedGpuMemory(fake_gpu()[1], LENGTH)


@pytest.mark.parametrize("make, words", [(host_memory, "host memory"),
                                         (staged_memory, "pinned host memory")])
def test_host_memory_refused_for_its_lock_limit_is_a_resource_limit_with_the_memlock_fix(
        refusing, make, words):
    with make() as memory:
        error = refusal_of(memory)
    assert isinstance(error, ResourceLimit) and error.exit_code == ExitCode.RESOURCE_LIMIT
    assert error.cause == (f"registering {LENGTH} bytes of {words} failed: ENOMEM (the "
                           "locked-memory limit is the usual cause)")
    assert error.fix == MEMLOCK_FIX and "Errno: 12" in error.evidence


@pytest.mark.parametrize("make, words", [(host_memory, "host memory"),
                                         (staged_memory, "pinned host memory")])
def test_host_memory_refused_otherwise_is_a_verbs_error_pointing_at_the_doctor(refusing, make, words):
    refusing["errno"] = errno.EINVAL
    with make() as memory:
        error = refusal_of(memory)
    assert type(error) is RdmaError and error.exit_code == ExitCode.RDMA
    assert error.cause == f"registering {LENGTH} bytes of {words} failed"
    assert "gdrprobe doctor" in error.fix


def test_gpu_memory_by_address_refused_names_the_peer_memory_client_and_its_fix(refusing):
    refusing["errno"] = errno.EFAULT
    _, gpu = fake_gpu()
    with PeermemGpuMemory(gpu, LENGTH) as memory:
        error = refusal_of(memory)
    known = REGISTRATION_CAUSES[errno.EFAULT]
    assert isinstance(error, RegistrationFailed) and error.exit_code == ExitCode.RDMA
    assert error.cause == f"registering {LENGTH} bytes of GPU memory through peermem failed: {known.cause}"
    assert (error.fix, error.error_code, error.mechanism) == (known.fix, errno.EFAULT, "peermem")
    assert error.peer_memory == gpu.attributes.peer_memory == "nvidia-peermem"


def test_a_refused_dmabuf_registration_names_no_peer_memory_client(refusing):
    refusing["errno"] = errno.EOPNOTSUPP
    with DmaBufGpuMemory(fake_gpu()[1], LENGTH) as memory:
        error = refusal_of(memory)
    known = REGISTRATION_CAUSES[errno.EOPNOTSUPP]
    assert isinstance(error, RegistrationFailed) and error.mechanism == "dmabuf"
    assert error.cause.startswith(f"registering {LENGTH} bytes of GPU memory through dmabuf failed: "
                                  f"{known.cause}")
    assert error.fix.endswith(known.fix) and getattr(error, "peer_memory", "") == ""
