# cython: language_level=3, boundscheck=False, wraparound=False
"""Thin wrappers over csrc/gdr_nccl.h, NCCL's traffic pattern: the schedule of one step's
verbs, and the receiver's and sender's loops, each run with the GIL released.

As in gdrprobe._native, a loop's configuration holds the Python objects that own what its
C struct points at (the raw handles, the memory providers), and every address a loop touches
is checked to lie inside its buffer before the loop may run.
"""

cimport cython
from libc.stdint cimport uint8_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport calloc, free
from libc.string cimport memset

from gdrprobe cimport _csrc as c
from gdrprobe._native cimport StopFlag, _check_inside, _loop_clock
from gdrprobe._native import ClockCheck

STEPS = c.GDR_NCCL_STEPS                 # NCCL_STEPS
FIFO_SLOTS = c.GDR_NCCL_FIFO_SLOTS       # NET_IB_MAX_REQUESTS
FIFO_BYTES = c.GDR_NCCL_FIFO_BYTES       # one connection's FIFO (and its clear-to-send elements)
MAX_CHANNELS = c.GDR_NCCL_MAX_CHANNELS
STATUS_PROTOCOL = c.GDR_ERR_PROTOCOL
VERBS = {c.GDR_NCCL_RECV: "recv", c.GDR_NCCL_CTS: "cts_write", c.GDR_NCCL_DATA: "write",
         c.GDR_NCCL_DATA_IMM: "write_imm", c.GDR_NCCL_FLUSH: "flush_read"}


cdef c.gdr_nccl_shape _shape(dict shape) except *:
    """The C shape from its fields (channels, qps_per_conn, split, adaptive_routing,
    ar_threshold, inline_cts, step_bytes, ring_slots)."""
    cdef c.gdr_nccl_shape s
    memset(&s, 0, sizeof(s))
    s.channels, s.qps_per_conn = shape["channels"], shape["qps_per_conn"]
    s.split, s.adaptive_routing = shape["split"], shape["adaptive_routing"]
    s.ar_threshold, s.inline_cts = shape["ar_threshold"], shape["inline_cts"]
    s.step_bytes, s.ring_slots = shape["step_bytes"], shape["ring_slots"]
    if not 1 <= s.channels <= c.GDR_NCCL_MAX_CHANNELS or s.qps_per_conn < 1 or \
            s.channels * s.qps_per_conn > c.GDR_MAX_QPS or s.step_bytes < 1 or s.ring_slots < 1:
        raise ValueError(f"not a shape the NCCL-pattern loops take: {shape}")
    return s


cdef list _posts(c.gdr_nccl_post *posts, size_t n):
    return [(VERBS[posts[i].verb], posts[i].qp, posts[i].length, bool(posts[i].signaled),
             bool(posts[i].inline_), posts[i].imm) for i in range(n)]


def step_posts(dict shape, uint64_t step, bint flush):
    """The verbs step `step` of a connection posts, in order, each (verb, the connection's
    QP index, bytes, signalled, inline, immediate): the schedule both loops post from."""
    cdef c.gdr_nccl_shape s = _shape(shape)
    cdef c.gdr_nccl_post posts[c.GDR_NCCL_MAX_POSTS]
    cdef size_t n = c.gdr_nccl_step_posts(&s, step, flush, posts, c.GDR_NCCL_MAX_POSTS)
    return _posts(posts, n)


def message(uint64_t first_message, uint64_t steps, uint32_t channel, uint64_t k):
    """The round's message number of a pass's k-th step of a channel (gdr_nccl_message)."""
    return c.gdr_nccl_message(first_message, steps, channel, k)


@cython.dataclasses.dataclass(frozen=True)
cdef class NcclLoopResult:
    """What one side's pass did (struct gdr_nccl_result), with its per-step times in ns
    (uint64 bytes, index channel * steps + step): the receiver's step_ns, recv_ns and
    flush_ns, the sender's wait_ns and data_ns (b"" for the other side's)."""

    cdef readonly int status
    cdef readonly int errno "errno_"
    cdef readonly int wc_status
    cdef readonly uint32_t wc_vendor_err
    cdef readonly uint32_t wc_qp_num
    cdef readonly uint64_t steps
    cdef readonly uint64_t elapsed_ns
    cdef readonly uint64_t bad_imm
    cdef readonly uint64_t flush_bad
    cdef readonly uint64_t first_flush_bad
    cdef readonly object clock_check                 # a gdrprobe._native.ClockCheck
    cdef readonly bytes step_ns
    cdef readonly bytes recv_ns
    cdef readonly bytes flush_ns
    cdef readonly bytes wait_ns
    cdef readonly bytes data_ns


cdef class _Times:
    """Per-step arrays for a loop, freed with this object."""
    cdef uint64_t *arrays[3]
    cdef size_t count

    def __cinit__(self, size_t count):
        self.count = count
        for i in range(3):
            self.arrays[i] = <uint64_t *>calloc(count, sizeof(uint64_t))
            if self.arrays[i] == NULL:
                raise MemoryError()

    cdef bytes take(self, int i):
        return (<char *>self.arrays[i])[:self.count * sizeof(uint64_t)]

    def __dealloc__(self):
        for i in range(3):
            free(self.arrays[i])


cdef object _result(c.gdr_nccl_result *res, list times):
    return NcclLoopResult(res.status, res.err_errno, res.wc_status, res.wc_vendor_err,
                          res.wc_qp_num, res.steps, res.elapsed_ns, res.bad_imm, res.flush_bad,
                          res.first_flush_bad,
                          ClockCheck(res.clock_check.agreement, res.clock_check.span_ns),
                          *times)


cdef int _fill_qps(c.ibv_qp **out, handles, c.gdr_nccl_shape *s) except -1:
    cdef Py_ssize_t i, needed = s.channels * s.qps_per_conn
    if len(handles.qps) < needed:
        raise ValueError(f"{needed} QPs are needed, {len(handles.qps)} given")
    for i in range(needed):
        out[i] = <c.ibv_qp *><uintptr_t>handles.qps[i]
    return 0


cdef class NcclRecvConfig:
    """The receiver's pass (struct gdr_nccl_recv_config: steps first_id.. of each connection,
    the round's messages from first_message on) with the objects that own what it
    points at: handles (the run's QPs and CQ), ring (the receive buffer's provider), cts (a
    registered host buffer for the clear-to-send elements), fifo (the sender's FIFO: address
    and rkey) and flush (None, or an object with the flush QP's handles and its registered
    host landing: measure.flush.Flusher)."""

    cdef c.gdr_nccl_recv_config cfg
    cdef readonly object handles, ring, cts, flush

    def __init__(self, handles, ring, cts, fifo, flush, dict shape, *, uint64_t seed,
                 uint64_t first_id, uint64_t first_message, uint64_t steps, uint32_t window,
                 uint64_t stall_timeout_ns, bint counter=False, double ns_per_tick=1.0):
        memset(&self.cfg, 0, sizeof(self.cfg))
        self.cfg.shape = _shape(shape)
        _fill_qps(self.cfg.qps, handles, &self.cfg.shape)
        ring_bytes = <object>self.cfg.shape.channels * self.cfg.shape.ring_slots * self.cfg.shape.step_bytes
        _check_inside("the receive slots", ring_bytes, ring)
        _check_inside("the clear-to-send elements", self.cfg.shape.channels * FIFO_BYTES, cts)
        if not 1 <= window <= STEPS or steps < 1:
            raise ValueError(f"window {window} (1 to {STEPS}) and {steps} steps")
        self.handles, self.ring, self.cts, self.flush = handles, ring, cts, flush
        self.cfg.cq = <c.ibv_cq *><uintptr_t>handles.cq
        self.cfg.ring_addr, self.cfg.ring_rkey = ring.address, ring.rkey
        self.cfg.cts_addr, self.cfg.cts_lkey = cts.address, cts.lkey
        self.cfg.fifo_addr, self.cfg.fifo_rkey = fifo.address, fifo.rkey
        if flush is not None:
            _check_inside("the flush landing", self.cfg.shape.channels * STEPS, flush.landing)
            self.cfg.flush_qp = <c.ibv_qp *><uintptr_t>flush.handles.qps[0]
            self.cfg.flush_cq = <c.ibv_cq *><uintptr_t>flush.handles.cq
            self.cfg.flush_landing = <volatile uint8_t *><uintptr_t>flush.landing.address
            self.cfg.flush_lkey = flush.landing.lkey
        self.cfg.seed, self.cfg.first_id, self.cfg.steps = seed, first_id, steps
        self.cfg.first_message = first_message
        self.cfg.window = window
        self.cfg.stall_timeout_ns = stall_timeout_ns
        self.cfg.clock = _loop_clock(counter, ns_per_tick)


cdef class NcclSendConfig:
    """The sender's pass (struct gdr_nccl_send_config) with its owners: handles, source (the
    source slots' provider), fifo (a registered host buffer the receiver writes its
    clear-to-send into) and remote (the receiver's buffer: address and length, which every
    clear-to-send must name a step inside)."""

    cdef c.gdr_nccl_send_config cfg
    cdef readonly object handles, source, fifo

    def __init__(self, handles, source, fifo, remote, dict shape, *, uint64_t first_id,
                 uint64_t first_message, uint64_t steps, uint64_t stall_timeout_ns,
                 bint counter=False, double ns_per_tick=1.0):
        memset(&self.cfg, 0, sizeof(self.cfg))
        self.cfg.shape = _shape(shape)
        _fill_qps(self.cfg.qps, handles, &self.cfg.shape)
        sources = (<object>self.cfg.shape.channels * self.cfg.shape.ring_slots + 1) * self.cfg.shape.step_bytes
        _check_inside("the source slots", sources, source)
        _check_inside("the FIFO", self.cfg.shape.channels * FIFO_BYTES, fifo)
        if fifo.kind != "host":
            raise ValueError("the FIFO is host memory, which the sender's CPU polls")
        if steps < 1:
            raise ValueError("a pass has at least one step")
        self.handles, self.source, self.fifo = handles, source, fifo
        self.cfg.cq = <c.ibv_cq *><uintptr_t>handles.cq
        self.cfg.src_addr, self.cfg.src_lkey = source.address, source.lkey
        self.cfg.fifo = <volatile uint8_t *><uintptr_t>fifo.address
        self.cfg.remote_addr, self.cfg.remote_length = remote.address, remote.length
        self.cfg.first_id, self.cfg.steps = first_id, steps
        self.cfg.first_message = first_message
        self.cfg.stall_timeout_ns = stall_timeout_ns
        self.cfg.clock = _loop_clock(counter, ns_per_tick)


cdef object _run(c.gdr_nccl_recv_config *recv, c.gdr_nccl_send_config *send, StopFlag stop,
                 size_t steps):
    """One side's pass: its per-step times allocated, the loop run without the GIL, and no
    pointer of this call left in the config afterwards."""
    cdef c.gdr_nccl_result res
    cdef _Times times = _Times(steps)
    try:
        if recv != NULL:
            recv.step_ns, recv.recv_ns, recv.flush_ns = times.arrays[0], times.arrays[1], times.arrays[2]
            recv.stop = &stop.value
            with nogil:
                c.gdr_nccl_recv_run(recv, &res)
            return _result(&res, [times.take(0), times.take(1), times.take(2), b"", b""])
        send.wait_ns, send.data_ns = times.arrays[0], times.arrays[1]
        send.stop = &stop.value
        with nogil:
            c.gdr_nccl_send_run(send, &res)
        return _result(&res, [b"", b"", b"", times.take(0), times.take(1)])
    finally:
        if recv != NULL:
            recv.step_ns = recv.recv_ns = recv.flush_ns = NULL
            recv.stop = NULL
        else:
            send.wait_ns = send.data_ns = NULL
            send.stop = NULL


def run_nccl_recv(NcclRecvConfig config, StopFlag stop):
    """The receiver's pass; an NcclLoopResult. Holds config (and its owners) and stop until
    the loop has returned."""
    return _run(&config.cfg, NULL, stop, config.cfg.steps * config.cfg.shape.channels)


def run_nccl_send(NcclSendConfig config, StopFlag stop):
    """The sender's pass; an NcclLoopResult. Holds config (and its owners) and stop until
    the loop has returned."""
    return _run(NULL, &config.cfg, stop, config.cfg.steps * config.cfg.shape.channels)
