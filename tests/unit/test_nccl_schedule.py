"""The verbs NCCL's pattern posts per step (csrc/gdr_nccl.c gdr_nccl_step_posts, which both
loops post from) against the sequence in NVIDIA/nccl v2.30.7-1
src/transport/net_ib/p2p.cc, transcribed here from that source, function by function:

- ncclIbIrecv: for i < nqps (ncclIbCommBaseGetNqpsPerRequest: every QP with
  NCCL_IB_SPLIT_DATA_ON_QPS, else nDataQps = 1 for one device), ibv_post_recv on
  qps[(id * nqps + i) % nqps_total] (ncclIbCommBaseGetQpForRequest, common.h); then
  ncclIbPostFifo: one RDMA WRITE of nreqs * sizeof(struct ncclIbSendFifo) = 64 bytes on the
  device's first QP (ncclIbRecvCommGetQpForCts, p2p.h), IBV_SEND_SIGNALED when
  slot == devIndex (slot = id % NET_IB_MAX_REQUESTS = id % 256, devIndex 0), IBV_SEND_INLINE
  with NCCL_IB_USE_INLINE (remCtsFifo.flags, connect.cc);
- ncclIbMultiSend: per QP of the step (the same QP choice), the chunk
  DIVUP(DIVUP(size, nqps), IB_WRITE_CHUNK_ALIGNMENT=128) * 128 capped by what is left
  (0 on a QP past the end); the last WR a signalled IBV_WR_RDMA_WRITE_WITH_IMM with imm =
  size (BY_INDEX matching, NCCL's default); with comm->ar and size > ncclIbArThreshold the
  data first as an unsignalled IBV_WR_RDMA_WRITE and the WRITE_WITH_IMM after it with no
  bytes;
- ncclIbIflush (a GPUDirect receive that NCCL flushes): one signalled IBV_WR_RDMA_READ of
  gpuFlush.sge (1 byte, connect.cc) on the flush QP.
"""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("gdrprobe._nccl")

from gdrprobe import _nccl  # noqa: E402

FIFO_ELEMENT = 64          # sizeof(struct ncclIbSendFifo) with NCCL_IB_MAX_DEVS_PER_NIC 8
NET_IB_MAX_REQUESTS = 256  # NCCL_NET_MAX_REQUESTS 32 x NCCL_NET_IB_MAX_RECVS 8
CHUNK_ALIGNMENT = 128      # IB_WRITE_CHUNK_ALIGNMENT


def divup(x: int, y: int) -> int:
    return (x + y - 1) // y


def p2p_cc(step: int, size: int, qps: int, split: bool, ar: bool, threshold: int,
           inline: bool, flush: bool) -> list[tuple]:
    """The verbs of one step, in the order p2p.cc posts them (the module docstring)."""
    nqps = qps if split else 1
    used = [(step * nqps + i) % qps for i in range(nqps)]
    posts = [("recv", qp, 0, False, False, 0) for qp in used]
    posts.append(("cts_write", 0, FIFO_ELEMENT, step % NET_IB_MAX_REQUESTS == 0, inline, 0))
    chunk = divup(divup(size, nqps), CHUNK_ALIGNMENT) * CHUNK_ALIGNMENT
    sent = 0
    for qp in used:
        length = min(size - sent, chunk)
        sent += length
        if ar and size > threshold:
            posts.append(("write", qp, length, False, False, 0))
            length = 0
        posts.append(("write_imm", qp, length, True, False, size))
    if flush:
        posts.append(("flush_read", 0, 1, True, False, 0))
    return posts


def shape(size: int, qps: int, split: bool, ar: bool, threshold: int, inline: bool) -> dict:
    return {"channels": 1, "qps_per_conn": qps, "split": int(split), "adaptive_routing": int(ar),
            "ar_threshold": threshold, "inline_cts": int(inline), "step_bytes": size,
            "ring_slots": 8}


CASES = list(itertools.product(
    (1, 100, 8192, 8193, 131072, 524288, 1000003),   # sizes around the AR threshold, odd
    (1, 2, 3, 4),                                     # NCCL_IB_QPS_PER_CONNECTION
    (False, True),                                    # NCCL_IB_SPLIT_DATA_ON_QPS
    (False, True)))                                   # comm->ar


@pytest.mark.parametrize("size,qps,split,ar", CASES)
def test_a_step_posts_what_p2p_cc_posts(size, qps, split, ar):
    for step in (0, 1, 5, 255, 256, 257, 1000):
        for flush in (False, True):
            assert _nccl.step_posts(shape(size, qps, split, ar, 8192, False), step, flush) == \
                p2p_cc(step, size, qps, split, ar, 8192, False, flush), (step, flush)


def test_the_clear_to_send_is_signalled_once_a_fifo_round_and_inline_where_asked():
    verbs = shape(131072, 1, False, False, 8192, True)
    cts = [post for step in range(600) for post in _nccl.step_posts(verbs, step, False)
           if post[0] == "cts_write"]
    assert [step for step, post in enumerate(cts) if post[3]] == [0, 256, 512]
    assert all(post[4] and post[2] == FIFO_ELEMENT for post in cts)


def test_a_step_split_over_more_qps_than_it_has_chunks_sends_no_bytes_on_the_rest():
    posts = _nccl.step_posts(shape(100, 4, True, False, 8192, False), 0, False)
    assert [post[2] for post in posts if post[0] == "write_imm"] == [100, 0, 0, 0]


def test_the_threshold_is_a_setting():
    over = _nccl.step_posts(shape(131072, 1, False, True, 1 << 20, False), 0, False)
    assert [post[0] for post in over] == ["recv", "cts_write", "write_imm"]


def test_a_pass_is_the_rounds_next_messages_channel_by_channel():
    # a pass of 4 steps per channel after 10 messages: channel c's k-th step is 10 + 4c + k
    numbers = [[_nccl.message(10, 4, channel, step) for step in range(4)] for channel in range(3)]
    assert numbers == [[10, 11, 12, 13], [14, 15, 16, 17], [18, 19, 20, 21]]


def test_a_shape_the_loop_cannot_run_is_refused():
    with pytest.raises(ValueError):
        _nccl.step_posts(dict(shape(4096, 1, False, False, 8192, False), channels=33), 0, False)
    with pytest.raises(ValueError):
        _nccl.step_posts(dict(shape(4096, 40, False, False, 8192, False), channels=2), 0, False)
