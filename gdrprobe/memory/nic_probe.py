"""NCCL's NIC-side DMA-BUF probe: can this NIC register a DMA-BUF at all?

NCCL 2.30.7 ``src/transport/net_ib/gdr.cc`` (ibDmaBufSupportInitOnce) calls
``ibv_reg_dmabuf_mr(pd, 0, 0, 0, fd=-1, 0)`` once per NIC and reads errno: EOPNOTSUPP or
EPROTONOSUPPORT mean the kernel, the provider or libibverbs (no ``ibv_reg_dmabuf_mr``
symbol, rdma-core < 34) lacks DMA-BUF; anything else (EBADF) means the path exists.
Kept apart from the GPU providers so that the doctor runs the same probe; it needs the
native extension only where pyverbs cannot register an fd (rdma-core 34 to 43), and says so
where the extension was never built.
"""

from __future__ import annotations

import errno
from typing import NamedTuple

from gdrprobe.errors import NotTestable
from gdrprobe.memory.causes import errno_name, registration_cause
from gdrprobe.rdma import verbs


class NicDmaBufSupport(NamedTuple):
    supported: bool
    errno: int | None
    reason: str


# NCCL's reading of ibv_reg_dmabuf_mr(fd=-1): these two mean the path does not exist.
DMABUF_UNSUPPORTED_ERRNOS = (errno.EOPNOTSUPP, errno.EPROTONOSUPPORT)


def interpret_nic_probe(error_code: int | None) -> NicDmaBufSupport:
    """What the errno of a DMA-BUF registration with fd -1 says about the NIC."""
    if error_code is None:
        return NicDmaBufSupport(True, None, "the NIC registered a DMA-BUF with fd -1 (unexpected, "
                                            "but the path exists)")
    name = errno_name(error_code)
    if error_code in DMABUF_UNSUPPORTED_ERRNOS:
        return NicDmaBufSupport(False, error_code, "the NIC cannot register DMA-BUF: "
                                f"ibv_reg_dmabuf_mr(fd=-1) failed with {name} "
                                f"({registration_cause(error_code).cause})")
    return NicDmaBufSupport(True, error_code, f"ibv_reg_dmabuf_mr(fd=-1) failed with {name}, "
                                              "past the support check: the NIC path exists")


PYVERBS_ROUTE = "pyverbs' DmaBufMR"
OLD_PYVERBS = ("DMA-BUF not testable with this pyverbs (rdma-core < 44): its DmaBufMR takes "
               "only a pyverbs DmaBuf, not the file descriptor the CUDA driver exports, and "
               "gdrprobe's extension, which registers it through libibverbs instead, is not "
               "built")
OLD_PYVERBS_FIX = ("build gdrprobe's extension (pip install . in the checkout), or install "
                   "rdma-core 44 or newer (python3-pyverbs), or use the peermem mechanism")


def dmabuf_mr(pv, pd, length: int, access: int, fd: int, offset: int):
    """(memory region, route): pyverbs' DmaBufMR over an external fd wherever pyverbs takes
    one (rdma-core 44 on). From rdma-core 34 to 43 pyverbs/mr.pyx types the dmabuf argument
    as a DmaBuf object (TypeError for an int), so the fd is registered through libibverbs'
    own ibv_reg_dmabuf_mr instead (:mod:`gdrprobe.rdma.dmabuf`), as NCCL registers it; the
    route says which. Either refusal is pyverbs' PyverbsRDMAError with the errno."""
    try:
        return pv.mr.DmaBufMR(pd, length, access, dmabuf=fd, offset=offset), PYVERBS_ROUTE
    except (TypeError, AttributeError) as error:   # 34-43: no fd; before 34: no DmaBufMR
        refused = error
    try:
        from gdrprobe.rdma.dmabuf import ROUTE, register_dmabuf
    except ImportError as error:   # the doctor, where the extension was never built
        raise NotTestable(f"not testable: {OLD_PYVERBS}", OLD_PYVERBS_FIX,
                          evidence=f"DmaBufMR: {refused}; {error}") from error
    return register_dmabuf(pd, length, access, fd, offset), ROUTE


def probe_nic_dmabuf(pd) -> NicDmaBufSupport:
    """NCCL's probe: register a DMA-BUF with fd -1 and read the errno."""
    pv = verbs.pyverbs()
    try:
        mr, route = dmabuf_mr(pv, pd, 0, 0, -1, 0)
    except pv.PyverbsRDMAError as error:
        return with_route(interpret_nic_probe(error.error_code), getattr(error, "route", ""))
    except NotTestable:
        return NicDmaBufSupport(False, None, OLD_PYVERBS)
    mr.close()
    return with_route(interpret_nic_probe(None), route)


def with_route(found: NicDmaBufSupport, route: str) -> NicDmaBufSupport:
    """The probe's answer, saying so where it went through libibverbs, not pyverbs."""
    if not route or route == PYVERBS_ROUTE:
        return found
    return found._replace(reason=f"{found.reason}; registered through {route}")
