"""Locating the raw ibv_qp/ibv_cq behind pyverbs objects, on a real device."""

import pytest

from gdrprobe import _native
from gdrprobe.rdma import handles, verbs
from gdrprobe.rdma.endpoint import Endpoint, EndpointOptions
from gdrprobe.errors import ExitCode, GdrprobeError, NotTestable


@pytest.fixture
def endpoints():
    with Endpoint(EndpointOptions(num_qps=2), "127.0.0.1") as first, \
            Endpoint(EndpointOptions(), "127.0.0.1") as second:
        yield first, second


def test_layout_route_on_this_pyverbs(endpoints):
    first, _ = endpoints
    found = first.handles()
    assert found.route == "layout"
    assert [_native.qp_fields(p)["qp_num"] for p in found.qps] == [q.qp_num for q in first.qps]
    assert _native.cq_fields(found.cq)["cqe"] == first.cq.cqe


def modern_qp_class(pv):
    """A pyverbs QP subclass with rdma-core 61's integer property QP.qp. (pyverbs 44
    accepts only an exact CQ in a QP's init attributes, so the CQ stays a plain one and is
    found through the layout.)"""

    class ModernQP(pv.qp.QP):
        pointer_source = None   # the QP whose pointer the property reports

        @property
        def qp(self):
            return handles.layout_pointer(self.pointer_source or self, pv.qp.QP)

    return ModernQP


def modern_qp(pv, cls, endpoint, cq):
    e = pv.enums
    cap = pv.qp.QPCap(max_send_wr=4, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
    init = pv.qp.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap)
    return cls(endpoint.pd, init)


def test_property_route_is_taken_where_pyverbs_has_the_properties(endpoints):
    first, second = endpoints
    pv = verbs.pyverbs()
    ModernQP = modern_qp_class(pv)
    assert handles.has_pointer_properties(ModernQP)
    assert not handles.has_pointer_properties(pv.qp.QP)
    with pv.cq.CQ(first.ctx, 8) as cq, modern_qp(pv, ModernQP, first, cq) as qp:
        found = handles.raw_handles([qp], cq)
        assert found.route == "property+layout"
        assert _native.qp_fields(found.qps[0])["qp_num"] == qp.qp_num
        # A property that reports another QP's pointer is caught by the validation.
        qp.pointer_source = second.qps[0]
        with pytest.raises(NotTestable, match="does not match"):
            handles.raw_handles([qp], cq)


def test_a_wrong_object_is_refused(endpoints):
    first, second = endpoints
    pv = verbs.pyverbs()
    # Handing the wrong object is gdrprobe's own bug (exit 70), never a node's fault.
    with pytest.raises(GdrprobeError, match="expected a pyverbs QP") as raised:
        handles.layout_pointer(first.cq, pv.qp.QP)
    assert raised.value.exit_code == ExitCode.INTERNAL
    with pytest.raises(GdrprobeError, match="expected a pyverbs CQ"):
        handles.raw_handles(first.qps, first.qps[0])
    # A QP whose pointer belongs to another QP: its number does not match.
    other = handles.layout_pointer(second.qps[0], pv.qp.QP)
    # A located object that does not check out: a layout gdrprobe does not know (exit 9).
    with pytest.raises(NotTestable, match="does not match"):
        handles.check_qp(other, first.qps[0], handles.layout_pointer(second.cq, pv.cq.CQ))
    # A QP checked against a CQ it does not use.
    mine = handles.layout_pointer(first.qps[0], pv.qp.QP)
    with pytest.raises(NotTestable, match="does not use"):
        handles.check_qp(mine, first.qps[0], handles.layout_pointer(second.cq, pv.cq.CQ))


def test_a_closed_object_is_refused(endpoints):
    first, _ = endpoints
    pv = verbs.pyverbs()
    qp = first.qps.pop()
    first.objects.remove(qp)
    qp.close()
    with pytest.raises(GdrprobeError, match="closed") as raised:
        handles.layout_pointer(qp, pv.qp.QP)
    assert raised.value.exit_code == ExitCode.INTERNAL
