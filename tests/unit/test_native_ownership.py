"""A loop's configuration owns what its C struct points at: the pyverbs QPs and CQ behind
the raw handles and the memory provider behind the local addresses and lkey. Without a
device the pointers are never followed here: only who keeps whom alive is checked."""

import ctypes
import gc
import types
import weakref

import pytest

from gdrprobe import _native
from gdrprobe.rdma import handles
from gdrprobe.rdma.handles import RawHandles


class Owner:
    """Stands in for a pyverbs QP or CQ: something a weak reference can watch."""


class Memory:
    """Stands in for a memory provider (it owns the buffer and the MR behind lkey)."""

    def __init__(self, length: int = 8192):
        self.address, self.lkey, self.length = 0x7F0000000000, 0x1234, length


PEER = types.SimpleNamespace(address=0x7E0000000000, rkey=0x4321, length=8192)


def bandwidth_config(raw, memory, **settings):
    settings = {"msg_size": 1024, "iterations": 10, "tx_depth": 4, "cq_mod": 1,
                "stall_timeout_ns": 10**9} | settings
    return _native.BandwidthConfig(raw, memory, PEER, **settings)


def latency_config(raw, memory, **settings):
    settings = {"send_offset": 4096, "msg_size": 64, "iterations": 10, "initiator": True,
                "stall_timeout_ns": 10**9, "seed": 1} | settings
    return _native.LatencyConfig(raw, memory, PEER, **settings)


def owned_handles(*owners):
    return RawHandles((0x1000,), 0x2000, "layout", owners=owners)


@pytest.mark.parametrize("make_config", [bandwidth_config, latency_config])
def test_a_config_keeps_the_owners_of_its_pointers_alive(make_config):
    qp, cq, memory = Owner(), Owner(), Memory()
    watched = [weakref.ref(owner) for owner in (qp, cq, memory)]
    config = make_config(owned_handles(qp, cq), memory)
    del qp, cq, memory
    gc.collect()
    assert all(ref() is not None for ref in watched)
    assert config.memory is watched[2]()
    assert config.handles.owners == (watched[0](), watched[1]())
    del config
    gc.collect()
    assert all(ref() is None for ref in watched)


def test_a_config_refuses_messages_past_the_end_of_its_buffer():
    raw = owned_handles()
    with pytest.raises(ValueError, match="source slots end at byte 8448, past the 8192-byte"):
        bandwidth_config(raw, Memory(8192), msg_size=1056, slots=8)
    bandwidth_config(raw, Memory(8192), msg_size=1024, slots=8)
    bandwidth_config(raw, Memory(8192), msg_size=1024, slots=7, src_slots=8)
    with pytest.raises(ValueError, match="source slots end at byte 9216"):
        bandwidth_config(raw, Memory(8192), msg_size=1024, slots=8, src_slots=9)
    with pytest.raises(ValueError, match="the message sent end at byte 4160, past the 4096"):
        latency_config(raw, Memory(4096), send_offset=4096, msg_size=64)


def test_a_config_needs_one_to_the_most_qps():
    with pytest.raises(ValueError, match="between 1 and 64 QPs"):
        bandwidth_config(RawHandles((), 0x2000, "layout", owners=()), Memory())


# ---- raw_handles records the owners ------------------------------------------------------

class IbvQp(ctypes.Structure):   # the head of struct ibv_qp (infiniband/verbs.h)
    _fields_ = [("context", ctypes.c_void_p), ("qp_context", ctypes.c_void_p),
                ("pd", ctypes.c_void_p), ("send_cq", ctypes.c_void_p),
                ("recv_cq", ctypes.c_void_p), ("srq", ctypes.c_void_p),
                ("handle", ctypes.c_uint32), ("qp_num", ctypes.c_uint32),
                ("state", ctypes.c_int), ("qp_type", ctypes.c_int),
                ("rest", ctypes.c_char * 512)]   # the mutex and the rest, zeroed


class IbvCq(ctypes.Structure):   # the head of struct ibv_cq
    _fields_ = [("context", ctypes.c_void_p), ("channel", ctypes.c_void_p),
                ("cq_context", ctypes.c_void_p), ("handle", ctypes.c_uint32),
                ("cqe", ctypes.c_int), ("rest", ctypes.c_char * 512)]


class ModernCQ:
    """A pyverbs CQ of rdma-core 61+, whose property CQ.cq is the ibv_cq pointer."""

    def __init__(self, cqe):
        self.cqe = cqe
        self.struct = IbvCq(context=0xC0FFEE, cqe=cqe)

    @property
    def cq(self):
        return ctypes.addressof(self.struct)


class ModernQP:
    def __init__(self, qp_num, cq):
        self.qp_num = qp_num
        self.struct = IbvQp(send_cq=cq.cq, qp_num=qp_num, qp_type=handles.IBV_QPT_RC)

    @property
    def qp(self):
        return ctypes.addressof(self.struct)


@pytest.fixture
def modern_pyverbs(monkeypatch):
    namespace = types.SimpleNamespace(qp=types.SimpleNamespace(QP=ModernQP),
                                      cq=types.SimpleNamespace(CQ=ModernCQ))
    monkeypatch.setattr(handles.verbs, "pyverbs", lambda: namespace)


def test_raw_handles_hand_on_the_pyverbs_objects_they_point_into(modern_pyverbs):
    cq = ModernCQ(cqe=16)
    qps = [ModernQP(0x11, cq), ModernQP(0x12, cq)]
    found = handles.raw_handles(qps, cq)
    assert found.route == "property"
    assert found.qps == (qps[0].qp, qps[1].qp) and found.cq == cq.cq
    assert found.owners == (*qps, cq)
    watched = weakref.ref(qps[1])
    config = bandwidth_config(found, Memory())
    del qps, found
    gc.collect()
    assert watched() is not None and config.handles.owners[1] is watched()
