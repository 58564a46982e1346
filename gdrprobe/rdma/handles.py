"""The raw ibv_qp * and ibv_cq * behind pyverbs objects, for the C loop.

rdma-core 61 and later expose them as integer properties (``QP.qp``, ``CQ.cq``; both
arrived in the same release). Older pyverbs (Debian 12 ships 44) keeps them in the
object's C struct only: right after the fields of ``PyverbsCM``, whose size is its
``__basicsize__``. On those versions never touch ``Context.context`` or ``PD.pd``: they
return the C struct *as a Python object*, and merely reading them corrupts memory.

A property is used only where pyverbs has ``QP.qp``: on 54 to 60 ``CQ.cq`` exists but still
returns the struct as an object. Whichever route found a pointer, it is checked against values pyverbs reports itself
(QP number, QP type, CQ size) and against the other located handle (the QP's send CQ must
be the located CQ) before the C loop may use it. The check never loads through a pointer it
has not yet trusted: the native layer has the kernel copy what it points at, so a pointer
into unmapped memory is an error (below), not a segmentation fault.

The pointers travel with the pyverbs objects that own them (RawHandles.owners), so a loop's
configuration can hold those objects for as long as the loop may use the pointers.

What a failure here means is gdrprobe's, never the node's, so it never exits with a code
that drains: a pyverbs whose objects are laid out in a way gdrprobe does not know
(:func:`unknown_layout`) is "not testable" (exit 9: the check cannot run with this pyverbs,
and that says nothing against the node; jobs do not use pyverbs); an object of the wrong
kind or one already closed is a bug in gdrprobe (:func:`misused`, exit 70).
"""

from __future__ import annotations

import dataclasses

from gdrprobe import _native

from gdrprobe.rdma import verbs
from gdrprobe.errors import GdrprobeError, NotTestable

IBV_QPT_RC = 2
FIX = ("this pyverbs build lays out its objects differently from the ones gdrprobe knows "
       "(rdma-core 44 to 64); please report the rdma-core version ('dpkg -l python3-pyverbs')")
BUG_FIX = ("a bug in gdrprobe, not a fault of this node: please report it with the "
           "rdma-core version ('dpkg -l python3-pyverbs')")


def unknown_layout(cause: str, evidence: str = "") -> NotTestable:
    """A pyverbs build gdrprobe cannot find the verbs objects in: gdrprobe's limitation."""
    return NotTestable(f"not testable: gdrprobe cannot use this pyverbs: {cause}", FIX,
                       evidence=evidence)


def misused(cause: str) -> GdrprobeError:
    """gdrprobe handed this module something it should not have: an internal error."""
    return GdrprobeError(f"internal error: {cause}", BUG_FIX)


@dataclasses.dataclass(frozen=True)
class RawHandles:
    qps: tuple[int, ...]
    cq: int
    route: str   # "property", "layout", or "property+layout" when only some had one
    # The pyverbs QPs and CQ the pointers belong to: whoever holds these handles keeps the
    # verbs objects from being collected (and destroyed) under the pointers.
    owners: tuple = dataclasses.field(repr=False, compare=False)


def has_pointer_properties(qp_class) -> bool:
    """True on rdma-core >= 61, where QP.qp and CQ.cq are integer properties."""
    return hasattr(qp_class, "qp")


def layout_pointer(obj, expected_class) -> int:
    """The first C field after PyverbsCM's, after checking the object's type and size."""
    if not isinstance(obj, expected_class):
        raise misused(f"expected a pyverbs {expected_class.__name__}, got "
                      f"{type(obj).__name__}")
    offset = verbs.pyverbs().base.PyverbsCM.__basicsize__
    try:
        pointer = _native.object_slot(obj, offset)
    except ValueError as error:
        raise unknown_layout(f"pyverbs {type(obj).__name__} is smaller than its pointer field",
                             str(error)) from error
    if not pointer:
        raise misused(f"pyverbs {type(obj).__name__} holds no verbs object (closed?)")
    return pointer


def locate(obj, expected_class, attribute: str, modern: bool) -> tuple[int, str]:
    """(pointer, route): the integer property where this pyverbs has one, else the layout."""
    if not isinstance(obj, expected_class):
        raise misused(f"expected a pyverbs {expected_class.__name__}, got "
                      f"{type(obj).__name__}")
    if modern and hasattr(type(obj), attribute):
        return int(getattr(obj, attribute)), "property"
    return layout_pointer(obj, expected_class), "layout"


def read_fields(reader, pointer: int, what: str) -> dict:
    """What reader (qp_fields, cq_fields) finds at pointer; :func:`unknown_layout` where
    the pointer does not lead to readable memory."""
    try:
        return reader(pointer)
    except OSError as error:
        raise unknown_layout(f"the located {what} is not readable memory",
                             str(error)) from error


def check_qp(pointer: int, qp, cq_pointer: int) -> None:
    fields = read_fields(_native.qp_fields, pointer, "ibv_qp")
    expected = {"qp_num": qp.qp_num, "qp_type": IBV_QPT_RC}
    found = {"qp_num": fields["qp_num"], "qp_type": fields["qp_type"]}
    if found != expected:
        raise unknown_layout("the located ibv_qp does not match its pyverbs QP",
                             f"pyverbs says {expected}, the pointer holds {found}")
    if fields["send_cq"] != cq_pointer:
        raise unknown_layout("the located ibv_qp does not use the located ibv_cq",
                             f"send_cq 0x{fields['send_cq']:x}, CQ 0x{cq_pointer:x}")


def check_cq(pointer: int, cq) -> None:
    fields = read_fields(_native.cq_fields, pointer, "ibv_cq")
    if fields["cqe"] != cq.cqe or not fields["context"]:
        raise unknown_layout("the located ibv_cq does not match its pyverbs CQ",
                             f"pyverbs cqe {cq.cqe}, the pointer holds {fields['cqe']}")


def pd_pointer(pd) -> int:
    """The validated ibv_pd * behind a pyverbs PD, for a registration pyverbs cannot make
    (:mod:`gdrprobe.rdma.dmabuf`). PD.pd is an integer property where QP.qp is one
    (rdma-core 60 and 61 on); before that it returns the C struct as a Python object, so the
    layout is used. Checked against the PD's own handle (PD.handle, rdma-core 34 on) and a
    non-NULL context before anything may use it."""
    pv = verbs.pyverbs()
    pointer, _ = locate(pd, pv.pd.PD, "pd", has_pointer_properties(pv.qp.QP))
    fields = read_fields(_native.pd_fields, pointer, "ibv_pd")
    if fields["handle"] != pd.handle or not fields["context"]:
        raise unknown_layout("the located ibv_pd does not match its pyverbs PD",
                             f"pyverbs handle {pd.handle}, the pointer holds "
                             f"{fields['handle']} (context 0x{fields['context']:x})")
    return pointer


def raw_handles(qps, cq) -> RawHandles:
    """Validated pointers of the QPs and their shared send CQ, with those objects."""
    pv = verbs.pyverbs()
    modern = has_pointer_properties(type(qps[0]))
    cq_pointer, cq_route = locate(cq, pv.cq.CQ, "cq", modern)
    check_cq(cq_pointer, cq)
    pointers, routes = [], {cq_route}
    for qp in qps:
        pointer, route = locate(qp, pv.qp.QP, "qp", modern)
        check_qp(pointer, qp, cq_pointer)
        pointers.append(pointer)
        routes.add(route)
    return RawHandles(tuple(pointers), cq_pointer, "+".join(sorted(routes, reverse=True)),
                      owners=(*qps, cq))
