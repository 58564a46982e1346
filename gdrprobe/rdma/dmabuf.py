"""DMA-BUF registration through libibverbs itself, where pyverbs cannot make it.

pyverbs' DmaBufMR takes the file descriptor the CUDA driver exports only from rdma-core 44
on; rdma-core 34 to 43 (still in service on older LTS distributions) type its argument as a
pyverbs DmaBuf object. libibverbs has ibv_reg_dmabuf_mr from 34 on, and that is what NCCL
calls, so on those versions gdrprobe calls it too, through its extension
(csrc/gdr_dmabuf.c), on the PD pyverbs owns (:func:`gdrprobe.rdma.handles.pd_pointer`).
pyverbs stays the way wherever it can: this is used only where its DmaBufMR refuses the fd.
"""

from __future__ import annotations

import errno

from gdrprobe import _native
from gdrprobe.rdma import verbs
from gdrprobe.rdma.handles import pd_pointer

ROUTE = ("libibverbs' ibv_reg_dmabuf_mr through gdrprobe's extension (this pyverbs' DmaBufMR "
         "takes no file descriptor: rdma-core < 44)")


def register_dmabuf(pd, length: int, access: int, fd: int, offset: int):
    """ibv_reg_dmabuf_mr(pd, offset, length, iova=offset, fd, access), as pyverbs' DmaBufMR
    registers (its iova is the offset): a region with lkey, rkey and close(). A refusal is
    pyverbs' own PyverbsRDMAError with the errno, so callers handle both routes alike."""
    pv = verbs.pyverbs()
    if not _native.HAVE_REG_DMABUF_MR:
        # rdma-core < 34: NCCL's wrapper answers EOPNOTSUPP then (ibvwrap.cc), and so do we.
        raise refused(pv, "this libibverbs has no ibv_reg_dmabuf_mr (rdma-core < 34)",
                      errno.EOPNOTSUPP)
    pointer = pd_pointer(pd)
    try:
        return _native.DmaBufRegion(pd, pointer, offset, length, offset, fd, access)
    except OSError as error:
        raise refused(pv, f"Failed to register a dma-buf MR through libibverbs. length: "
                          f"{length}, access flags: {access}", error.errno) from error


def refused(pv, text: str, code: int):
    """pyverbs' error for a refused registration, marked with the route it took."""
    error = pv.PyverbsRDMAError(text, code)
    error.route = ROUTE
    return error
