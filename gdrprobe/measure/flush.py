"""NCCL's flush on the receiving side of a run: before the receiver reads a GPU buffer the
NIC wrote, an RDMA READ of the received bytes on a QP connected to itself, waited on, as
NCCL issues it after every GPUDirect receive (``src/transport/net_ib/p2p.cc`` ncclIbIflush:
1 byte at the start of the last receive buffer, into a small registered host buffer; the
rules for where NCCL flushes are :mod:`gdrprobe.nccl.flush`'s).

The READ also proves something: it must bring back the byte the last message put there.
Anything else (the poison, an older message's byte) means the NIC's writes had not landed
when their completion said so, or landed elsewhere.

It runs where the integrity check runs, between passes or after the round: outside the
measured window, as the check itself.
"""

from __future__ import annotations

import contextlib
import typing

from gdrprobe import _native
from gdrprobe.measure.loops import check_status, stall_timeout_s
from gdrprobe.memory.buffers import open_buffer
from gdrprobe.memory.provider import MemoryProvider
from gdrprobe.memory.spec import MemorySpec
from gdrprobe.rdma.endpoint import Endpoint

FLUSH_BYTES = 1           # what NCCL reads (connect.cc: gpuFlush.sge.length = 1)
LANDING_BYTES = 4096      # one page of host memory for it to land in (NCCL: an int)


class FlushRead(typing.NamedTuple):
    """What one flush READ brought back, and its time from post to completion."""

    byte: int
    elapsed_ns: int


def wants_flush(rule: str, spec: MemorySpec) -> bool:
    """Whether a receive buffer of this spec is flushed: the run asks for NCCL's flush (rule:
    what demands it, "" for none) and the NIC will write GPU memory directly (a staged
    buffer lands in host memory, which NCCL never flushes)."""
    return bool(rule) and spec.kind == "gpu" and spec.mechanism != "staged"


class Flusher:
    """NCCL's flush QP and its landing buffer on one endpoint, for one receive buffer; use as
    a context manager (both are released on every path)."""

    def __init__(self, endpoint: Endpoint, memory: MemoryProvider, stop: _native.StopFlag,
                 port_gbps: float | None = None, depth: int = 1):
        self.stall_s = stall_timeout_s(FLUSH_BYTES, port_gbps)
        self.stop = stop
        self._resources = contextlib.ExitStack()
        try:
            # depth READs may be in flight (NCCL's pattern: one per step in flight), each
            # landing in a byte of its own
            self.landing = self._resources.enter_context(
                open_buffer(MemorySpec(), endpoint, LANDING_BYTES, remote_write=False,
                            relaxed_ordering=False))
            loopback = endpoint.loopback_qp(depth)
            self._resources.callback(loopback.close)
            self.handles = loopback.handles()
            self.config = _native.FlushConfig(self.handles, memory, self.landing,
                                              length=FLUSH_BYTES,
                                              stall_timeout_ns=int(self.stall_s * 1e9))
        except BaseException:
            self._resources.close()
            raise

    def read_back(self, offset: int, expected: int) -> FlushRead:
        """Flush: READ the byte at offset of the receive buffer, after setting the landing
        byte to something else than expected (so a READ that lands nothing shows); the
        byte it brought back and how long the READ took, post to completion (what every
        GPUDirect receive of NCCL waits for)."""
        result = _native.run_flush(self.config, offset, expected ^ 0xFF, self.stop)
        check_status(result, f"NCCL's flush (an RDMA READ of {FLUSH_BYTES} byte at offset "
                             f"{offset} of the receive buffer)", self.stall_s)
        return FlushRead(result.landed[0], result.elapsed_ns)

    def close(self) -> None:
        self.config = None
        self._resources.close()

    def __enter__(self) -> Flusher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

