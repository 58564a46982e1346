"""DMA-BUF registration through libibverbs (csrc/gdr_dmabuf.c, rdma/dmabuf.py), for where
pyverbs' DmaBufMR takes no fd (rdma-core 34 to 43): the argument handling and the PD
pointer's validation, on fixtures. The call itself reaches rxe in the lab
(tests/lab/loopback/test_platform_lab.py), where rxe answers EOPNOTSUPP."""

from __future__ import annotations

import ctypes
import errno
import types

import pytest

from gdrprobe import _native
from gdrprobe.errors import ExitCode, GdrprobeError, NotTestable
from gdrprobe.rdma import dmabuf, handles, verbs


class IbvPd(ctypes.Structure):
    """struct ibv_pd of libibverbs/verbs.h."""
    _fields_ = [("context", ctypes.c_void_p), ("handle", ctypes.c_uint32)]


def test_the_loaded_libibverbs_is_asked_for_ibv_reg_dmabuf_mr():
    assert _native.HAVE_REG_DMABUF_MR in (True, False)


@pytest.mark.parametrize("pd, pointer", [(None, 0x1000), (object(), 0)])
def test_a_region_needs_a_pd_and_its_pointer_before_libibverbs_is_called(pd, pointer):
    with pytest.raises(ValueError, match="needs a pyverbs PD and its validated ibv_pd"):
        _native.DmaBufRegion(pd, pointer, 0, 4096, 0, -1, 0)


def test_the_pd_fields_are_read_without_trusting_the_pointer():
    pd = IbvPd(context=0xDEAD000, handle=7)
    assert _native.pd_fields(ctypes.addressof(pd)) == {"context": 0xDEAD000, "handle": 7}
    with pytest.raises(OSError):
        _native.pd_fields(8)           # not readable memory: an error, not a crash


class FakePD:
    def __init__(self, struct: IbvPd, handle: int):
        self.struct, self.handle = struct, handle

    @property
    def pd(self):                     # rdma-core 60 on: the ibv_pd * as an integer
        return ctypes.addressof(self.struct)


class FakeQP:
    qp = 0                            # rdma-core 61 on: QP.qp, the property route


def fake_pyverbs(monkeypatch):
    class Error(Exception):
        def __init__(self, text, code=-1):
            super().__init__(text)
            self.error_code = code

    pv = types.SimpleNamespace(pd=types.SimpleNamespace(PD=FakePD),
                               qp=types.SimpleNamespace(QP=FakeQP), PyverbsRDMAError=Error)
    monkeypatch.setattr(verbs, "pyverbs", lambda: pv)
    return pv


def test_the_pd_pointer_is_checked_against_pyverbs_own_handle(monkeypatch):
    fake_pyverbs(monkeypatch)
    struct = IbvPd(context=0x5000, handle=3)
    assert handles.pd_pointer(FakePD(struct, 3)) == ctypes.addressof(struct)
    with pytest.raises(NotTestable, match="does not match its pyverbs PD"):
        handles.pd_pointer(FakePD(struct, 4))
    with pytest.raises(NotTestable, match="does not match its pyverbs PD"):
        handles.pd_pointer(FakePD(IbvPd(context=0, handle=3), 3))     # no context
    with pytest.raises(GdrprobeError, match="expected a pyverbs FakePD, got object") as raised:
        handles.pd_pointer(object())
    assert raised.value.exit_code == ExitCode.INTERNAL


def test_without_ibv_reg_dmabuf_mr_the_answer_is_eopnotsupp_as_nccls(monkeypatch):
    pv = fake_pyverbs(monkeypatch)
    monkeypatch.setattr(_native, "HAVE_REG_DMABUF_MR", False, raising=False)
    monkeypatch.setattr(dmabuf._native, "HAVE_REG_DMABUF_MR", False, raising=False)
    with pytest.raises(pv.PyverbsRDMAError) as raised:
        dmabuf.register_dmabuf(FakePD(IbvPd(context=1, handle=1), 1), 4096, 3, 5, 0)
    assert raised.value.error_code == errno.EOPNOTSUPP and raised.value.route == dmabuf.ROUTE


def test_a_refusal_is_pyverbs_error_with_the_errno_and_the_route(monkeypatch):
    pv = fake_pyverbs(monkeypatch)
    calls = []

    class Region:
        def __init__(self, *args):
            calls.append(args)
            raise OSError(errno.EFAULT, "Bad address")

    monkeypatch.setattr(dmabuf._native, "DmaBufRegion", Region)
    monkeypatch.setattr(dmabuf._native, "HAVE_REG_DMABUF_MR", True, raising=False)
    struct = IbvPd(context=0x5000, handle=9)
    pd = FakePD(struct, 9)
    with pytest.raises(pv.PyverbsRDMAError) as raised:
        dmabuf.register_dmabuf(pd, 8192, 3, 11, 4096)
    assert raised.value.error_code == errno.EFAULT and raised.value.route == dmabuf.ROUTE
    # ibv_reg_dmabuf_mr(pd, offset, length, iova=offset, fd, access), as pyverbs registers
    assert calls == [(pd, ctypes.addressof(struct), 4096, 8192, 4096, 11, 3)]
