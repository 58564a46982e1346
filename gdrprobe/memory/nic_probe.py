"""NCCL's NIC-side DMA-BUF probe: can this NIC register a DMA-BUF at all?

NCCL 2.30.7 ``src/transport/net_ib/gdr.cc`` (ibDmaBufSupportInitOnce) calls
``ibv_reg_dmabuf_mr(pd, 0, 0, 0, fd=-1, 0)`` once per NIC and reads errno: EOPNOTSUPP or
EPROTONOSUPPORT mean the kernel, the provider or libibverbs (no ``ibv_reg_dmabuf_mr``
symbol, rdma-core < 34) lacks DMA-BUF; anything else (EBADF) means the path exists.
Kept apart from the GPU providers so that the doctor, which never loads the native
extension, runs the same probe.
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


OLD_PYVERBS = ("DMA-BUF not testable with this pyverbs (rdma-core < 44): its DmaBufMR takes "
               "only a pyverbs DmaBuf, not the file descriptor the CUDA driver exports")
OLD_PYVERBS_FIX = ("install rdma-core 44 or newer (python3-pyverbs), or use the peermem "
                   "mechanism")


def dmabuf_mr(pv, pd, length: int, access: int, fd: int, offset: int):
    """pyverbs' DmaBufMR over an external fd. Before rdma-core 44 pyverbs/mr.pyx types the
    dmabuf argument as a DmaBuf object (TypeError for an int), and before rdma-core 35
    there is no DmaBufMR: DMA-BUF cannot be tested with such a pyverbs (peermem can)."""
    try:
        return pv.mr.DmaBufMR(pd, length, access, dmabuf=fd, offset=offset)
    except (TypeError, AttributeError) as error:
        raise NotTestable(f"not testable: {OLD_PYVERBS}", OLD_PYVERBS_FIX,
                          evidence=f"DmaBufMR: {error}") from error


def probe_nic_dmabuf(pd) -> NicDmaBufSupport:
    """NCCL's probe: register a DMA-BUF with fd -1 and read the errno."""
    pv = verbs.pyverbs()
    try:
        mr = dmabuf_mr(pv, pd, 0, 0, -1, 0)
    except pv.PyverbsRDMAError as error:
        return interpret_nic_probe(error.error_code)
    except NotTestable:
        return NicDmaBufSupport(False, None, OLD_PYVERBS)
    mr.close()
    return interpret_nic_probe(None)
