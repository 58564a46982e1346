# cython: language_level=3, boundscheck=False, wraparound=False
"""Thin wrappers over csrc/: plain numbers in, typed immutable results out.

Addresses and verbs handles travel as Python ints; a loop's configuration also holds the
Python objects that own them, so none is collected while the loop reads it. Every call
that loops or sorts releases the GIL, so the Python side can watch a clock or a Ctrl-C
while the C code runs.
"""

cimport cython
from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBUF_WRITABLE
from cpython.buffer cimport PyBuffer_Release, PyObject_GetBuffer
from cpython.object cimport PyObject
from libc.errno cimport errno
from libc.stdint cimport uint8_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport free, malloc
from libc.string cimport strerror
from libc.string cimport memset

from gdrprobe cimport _csrc as c

STATUS_NAMES = {
    c.GDR_OK: "ok",
    c.GDR_ERR_ARGS: "bad loop configuration",
    c.GDR_ERR_POST: "ibv_post_send failed",
    c.GDR_ERR_POLL: "ibv_poll_cq failed",
    c.GDR_ERR_WC: "work completion error",
    c.GDR_ERR_STALL: "no progress",
    c.GDR_ERR_STOPPED: "stopped",
    c.GDR_ERR_PASS: "stopped by the check of a pass",
}
STATUS_OK = c.GDR_OK
STATUS_ARGS = c.GDR_ERR_ARGS
STATUS_STOPPED = c.GDR_ERR_STOPPED
STATUS_STALL = c.GDR_ERR_STALL
STATUS_WC = c.GDR_ERR_WC
STATUS_PASS = c.GDR_ERR_PASS
MAX_QPS = c.GDR_MAX_QPS
MAX_POST_LIST = c.GDR_MAX_POST_LIST
MAX_SIZE = c.GDR_MAX_MSG_SIZE
HAVE_COUNTER = bool(c.GDR_HAVE_COUNTER)


cdef class StopFlag:
    """A flag the C loops poll: setting it from another thread ends a run early (its int
    is declared in _native.pxd, for gdrprobe._nccl's loops too)."""

    def set(self):
        self.value = 1

    def clear(self):
        self.value = 0

    @property
    def is_set(self):
        return self.value != 0


def wc_status_str(int status):
    return c.ibv_wc_status_str(status).decode()


# ---- statistics -----------------------------------------------------------------

@cython.dataclasses.dataclass(frozen=True)
cdef class RoundTripSummary:
    """Round-trip times of a latency run, in ns (struct gdr_latency_summary)."""

    cdef readonly size_t samples
    cdef readonly double min_ns, median_ns, mean_ns, stdev_ns, p99_ns, p999_ns, max_ns


cdef RoundTripSummary _round_trip_summary(uint64_t *samples, size_t n):
    """Sorts the n samples in place, without the GIL: a million samples take a while."""
    cdef c.gdr_latency_summary s
    cdef int rc
    with nogil:
        rc = c.gdr_latency_summarize(samples, n, &s)
    if rc != 0:
        raise ValueError("no samples to summarise")
    return RoundTripSummary(s.samples, s.min_ns, s.median_ns, s.mean_ns, s.stdev_ns,
                            s.p99_ns, s.p999_ns, s.max_ns)


def summarize_round_trips(samples):
    """The summary run_latency gives, of round-trip times in ns measured elsewhere:
    samples is a writable contiguous buffer of uint64 (array('Q')), sorted in place."""
    cdef Py_buffer view
    PyObject_GetBuffer(samples, &view, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS)
    try:
        code = (<bytes>view.format).lstrip(b"@=<")   # native or little-endian order
        if view.itemsize != sizeof(uint64_t) or code not in (b"Q", b"L"):
            raise TypeError(f"samples must be unsigned 64-bit integers, not format "
                            f"{view.format.decode()!r}")
        return _round_trip_summary(<uint64_t *>view.buf, <size_t>view.len // sizeof(uint64_t))
    finally:
        PyBuffer_Release(&view)


# ---- payload pattern --------------------------------------------------------------

def pattern_seed(uint64_t size, uint64_t round):
    return c.gdr_pattern_seed(size, round)


def pattern_byte(uint64_t seed, uint64_t offset):
    """The byte at offset of the pattern of seed."""
    return c.gdr_pattern_byte(seed, offset)


def pattern_fill(uintptr_t addr, size_t length, uint64_t seed):
    with nogil:
        c.gdr_pattern_fill(<uint8_t *>addr, length, seed)


def pattern_verify(uintptr_t addr, size_t length, uint64_t seed):
    """(number of wrong bytes, first wrong offset or -1)."""
    cdef size_t first = 0, bad
    with nogil:
        bad = c.gdr_pattern_verify(<const uint8_t *>addr, length, seed, &first)
    return bad, (first if bad else -1)


def slot_seed(uint64_t seed, uint64_t slot):
    """The pattern seed of one slot of a round."""
    return c.gdr_slot_seed(seed, slot)


def slots_fill(uintptr_t addr, size_t size, size_t slots, uint64_t seed):
    """Each of `slots` messages of `size` bytes from addr with its slot's pattern."""
    with nogil:
        c.gdr_slots_fill(<uint8_t *>addr, size, slots, seed)


def messages_verify(uintptr_t addr, size_t size, size_t slots, size_t src_slots,
                    uint64_t seed, uint64_t first, size_t count):
    """(messages with a wrong byte, wrong bytes, first wrong offset from addr or -1) of the
    round's messages first to first + count - 1, where they landed (gdr_pattern.h)."""
    cdef size_t bad_messages = 0, where = 0, bad
    if count > slots or src_slots < slots:
        raise ValueError(f"{count} messages in {slots} slots from {src_slots} source slots")
    with nogil:
        bad = c.gdr_messages_verify(<const uint8_t *>addr, size, slots, src_slots, seed, first,
                                    count, &bad_messages, &where)
    return bad_messages, bad, (where if bad else -1)


def poison_fill(uintptr_t addr, size_t length):
    with nogil:
        memset(<void *>addr, c.GDR_POISON_BYTE, length)


def zero_fill(uintptr_t addr, size_t length):
    with nogil:
        memset(<void *>addr, 0, length)


def poison_verify(uintptr_t addr, size_t length):
    """(number of bytes that are not poison, first such offset or -1)."""
    cdef size_t first = 0, bad
    with nogil:
        bad = c.gdr_poison_verify(<const uint8_t *>addr, length, &first)
    return bad, (first if bad else -1)


# ---- host memory ------------------------------------------------------------------

cdef class HostBuffer:
    """Page-aligned, zeroed anonymous memory, optionally on huge pages and a NUMA node; this
    object owns the mapping and unmaps it on close() or when it is collected."""

    cdef void *_addr
    cdef size_t _mapped
    cdef readonly size_t length

    def __cinit__(self, size_t length, int numa_node=-1, bint huge_pages=False):
        cdef int err = 0
        with nogil:
            self._addr = c.gdr_host_alloc(length, numa_node, huge_pages, &self._mapped)
            if self._addr == NULL:
                err = errno
        if self._addr == NULL:
            raise OSError(err, strerror(err))
        self.length = length

    @property
    def address(self):
        return <uintptr_t>self._addr

    @property
    def mapped_length(self):
        return self._mapped

    def close(self):
        cdef void *addr = self._addr
        self._addr = NULL
        if addr != NULL and c.gdr_host_free(addr, self._mapped) != 0:
            raise OSError(errno, strerror(errno))

    def __dealloc__(self):
        if self._addr != NULL:
            c.gdr_host_free(self._addr, self._mapped)


# ---- raw verbs handles --------------------------------------------------------------

def object_slot(obj, Py_ssize_t offset):
    """The pointer-sized word at offset inside a Python object's C struct; ValueError
    where that word does not lie inside the struct (its type's basic size)."""
    cdef Py_ssize_t size = type(obj).__basicsize__
    if offset < 0 or offset > size - <Py_ssize_t>sizeof(uintptr_t):
        raise ValueError(f"offset {offset} is outside the {size}-byte C struct of type "
                         f"{type(obj).__name__}")
    return (<uintptr_t *>(<char *><PyObject *>obj + offset))[0]


cdef int _peek(void *dst, uintptr_t address, size_t length) except -1:
    """Copy what address holds without loading through it here (csrc/gdr_peek.h): a pointer
    that is not readable memory raises OSError instead of ending the process."""
    cdef int err = c.gdr_peek(dst, <const void *>address, length)
    if err:
        raise OSError(err, f"{strerror(err).decode()}: {length} bytes at 0x{address:x}")
    return 0


def qp_fields(uintptr_t ptr):
    """The ibv_qp fields the handle validation compares with pyverbs' own values."""
    cdef c.ibv_qp qp
    _peek(&qp, ptr, sizeof(qp))
    return {"send_cq": <uintptr_t>qp.send_cq, "qp_num": qp.qp_num, "qp_type": qp.qp_type}


def cq_fields(uintptr_t ptr):
    """The ibv_cq fields the handle validation compares with pyverbs' own values."""
    cdef c.ibv_cq cq
    _peek(&cq, ptr, sizeof(cq))
    return {"context": <uintptr_t>cq.context, "cqe": cq.cqe}


def pd_fields(uintptr_t ptr):
    """The ibv_pd fields the handle validation compares with pyverbs' own values."""
    cdef c.ibv_pd pd
    _peek(&pd, ptr, sizeof(pd))
    return {"context": <uintptr_t>pd.context, "handle": pd.handle}


# ---- DMA-BUF registration through libibverbs (csrc/gdr_dmabuf.h) -----------------------

HAVE_REG_DMABUF_MR = bool(c.gdr_have_reg_dmabuf_mr())


cdef class DmaBufRegion:
    """A memory region registered with ibv_reg_dmabuf_mr on a PD pyverbs owns, for where
    pyverbs' DmaBufMR takes no file descriptor. pd is that pyverbs PD, held for as long as
    the region is registered; pd_pointer its ibv_pd, validated by the caller
    (gdrprobe.rdma.handles). OSError carries the registration's errno. close() deregisters
    (the region must be closed before its PD)."""

    cdef c.ibv_mr *mr
    cdef readonly object pd

    def __init__(self, pd, uintptr_t pd_pointer, uint64_t offset, size_t length,
                 uint64_t iova, int fd, int access):
        cdef int err = 0
        if self.mr != NULL:
            raise ValueError("this region is registered already")
        if pd is None or pd_pointer == 0:
            raise ValueError("a DMA-BUF region needs a pyverbs PD and its validated ibv_pd")
        with nogil:
            self.mr = c.gdr_reg_dmabuf_mr(<c.ibv_pd *>pd_pointer, offset, length, iova, fd,
                                          access, &err)
        if self.mr == NULL:
            raise OSError(err, f"ibv_reg_dmabuf_mr: {strerror(err).decode()}")
        self.pd = pd

    @property
    def lkey(self):
        self._registered()
        return self.mr.lkey

    @property
    def rkey(self):
        self._registered()
        return self.mr.rkey

    @property
    def length(self):
        self._registered()
        return self.mr.length

    cdef int _registered(self) except -1:
        if self.mr == NULL:
            raise ValueError("the region is closed")
        return 0

    def close(self):
        cdef c.ibv_mr *mr = self.mr
        cdef int rc
        self.mr = NULL
        if mr != NULL:
            rc = c.gdr_dereg_mr(mr)
            self.pd = None
            if rc != 0:
                raise OSError(rc, f"ibv_dereg_mr: {strerror(rc).decode()}")

    def __dealloc__(self):
        if self.mr != NULL:
            c.gdr_dereg_mr(self.mr)


# ---- clock and loops -----------------------------------------------------------------

def calibrate_counter(uint64_t window_ns):
    """The cycle counter's nanoseconds per tick against CLOCK_MONOTONIC over a busy window
    of window_ns; 0.0 where this build has no counter."""
    cdef double ns_per_tick
    with nogil:
        ns_per_tick = c.gdr_counter_calibrate(window_ns)
    return ns_per_tick


cdef c.gdr_clock _loop_clock(bint counter, double ns_per_tick):
    cdef c.gdr_clock clock
    clock.source = c.GDR_CLOCK_COUNTER if counter else c.GDR_CLOCK_MONOTONIC
    clock.ns_per_tick = ns_per_tick if counter else 1.0
    return clock


@cython.dataclasses.dataclass(frozen=True)
cdef class ClockCheck:
    """How far the loop's clock agreed with CLOCK_MONOTONIC over a run (gdr_clock_check)."""

    cdef readonly double agreement     # 1.0 when they agree
    cdef readonly uint64_t span_ns     # the span, by CLOCK_MONOTONIC


cdef ClockCheck _clock_check(const c.gdr_clock_check *check):
    return ClockCheck(check.agreement, check.span_ns)


# The results are immutable: time a caller adds to a loop's (a staged side's copies) is
# accounted where the result becomes a report row (measure/loops.py bandwidth_result).
# errno is a C macro, so the C member behind each result's `errno` field has another name.

@cython.dataclasses.dataclass(frozen=True)
cdef class BandwidthLoopResult:
    """What one bandwidth loop did (struct gdr_bw_result)."""

    cdef readonly int status
    cdef readonly int errno "errno_"
    cdef readonly int wc_status
    cdef readonly uint32_t wc_vendor_err
    cdef readonly uint32_t wc_qp_num
    cdef readonly uint64_t messages          # completed inside the measured window, all QPs
    cdef readonly uint64_t posted            # posted in all, warm-up included
    cdef readonly uint64_t elapsed_ns        # the measured window
    cdef readonly double peak_bytes_per_s
    cdef readonly uint64_t passes            # passes checked by the receiver
    cdef readonly uint64_t paused_ns         # spent on those checks, outside the window
    cdef readonly ClockCheck clock_check


@cython.dataclasses.dataclass(frozen=True)
cdef class LatencyLoopResult:
    """What one ping-pong loop did (struct gdr_lat_result)."""

    cdef readonly int status
    cdef readonly int errno "errno_"
    cdef readonly int wc_status
    cdef readonly uint32_t wc_vendor_err
    cdef readonly uint32_t wc_qp_num
    cdef readonly uint64_t completed                 # round trips completed
    cdef readonly uint64_t bad_messages              # received off the pattern (each checked)
    cdef readonly uint64_t bad_bytes
    cdef readonly uint64_t first_bad_offset          # valid when bad_bytes > 0
    cdef readonly ClockCheck clock_check
    cdef readonly RoundTripSummary round_trip        # None: the responder, or a failed run
    cdef readonly bytes samples                      # round trips, ns (uint64), if asked


cdef int _check_inside(str what, end, memory) except -1:
    """The loop's CPU (the latency tag) and the NIC under the config's lkey touch the local
    buffer: nothing it is told to touch may lie past the buffer's end (a Python int: the
    sum of two C integers could wrap)."""
    if end > memory.length:
        raise ValueError(f"{what} end at byte {end}, past the {memory.length}-byte buffer")
    return 0


cdef int _pass_end(void *ctx, uint64_t pass_, uint64_t messages) noexcept nogil:
    """The bandwidth loop's pass check: the config's on_pass, which answers whether to go on.
    An exception in it (its caller's to report) stops the loop."""
    with gil:
        try:
            return 0 if (<object>ctx)(pass_, messages) else 1
        except BaseException:
            return 1


cdef class BandwidthConfig:
    """The bandwidth loop's settings in the C struct the loop reads, with the objects that
    own what that struct points at: handles (rdma.handles.RawHandles, which holds the pyverbs
    QPs and CQ) and memory (the memory provider: the buffer and its MR). As in pyverbs,
    where a QP holds its PD and CQs, the user holds its owners: the addresses and the lkey
    are read from them, never passed apart from them, and they live at least as long as the
    config, which run_bandwidth holds until the loop returns. remote is the peer's buffer
    (address, rkey). on_pass, if given, is called between passes of `slots` messages from
    the loop's thread (pass, messages) and returns whether to go on: the receiver checks
    each pass before its slots are written again; the source slots start at src_offset.
    read: READs from the peer's source slots into this side's slots instead."""

    cdef c.gdr_bw_config cfg
    cdef readonly object handles, memory, on_pass

    def __init__(self, handles, memory, remote, *, uint32_t msg_size, uint64_t iterations,
                 uint32_t tx_depth, uint32_t cq_mod, uint64_t stall_timeout_ns,
                 uint64_t warmup_iterations=0, uint64_t duration_ns=0, uint64_t warmup_ns=0,
                 uint64_t window_messages=0, uint32_t post_list=1, uint32_t max_inline=0,
                 uint32_t slots=1, uint32_t src_slots=0, on_pass=None, bint read=False,
                 uint64_t src_offset=0, bint counter=False, double ns_per_tick=1.0):
        cdef Py_ssize_t i, num_qps = len(handles.qps)
        if not 1 <= num_qps <= c.GDR_MAX_QPS:
            raise ValueError(f"between 1 and {c.GDR_MAX_QPS} QPs are supported")
        src_slots = src_slots or slots
        _check_inside("the source slots", <object>src_offset + src_slots * msg_size, memory)
        self.handles, self.memory, self.on_pass = handles, memory, on_pass
        memset(&self.cfg, 0, sizeof(self.cfg))
        for i in range(num_qps):
            self.cfg.qps[i] = <c.ibv_qp *><uintptr_t>handles.qps[i]
        self.cfg.num_qps = <uint32_t>num_qps
        self.cfg.cq = <c.ibv_cq *><uintptr_t>handles.cq
        self.cfg.local_addr, self.cfg.lkey = memory.address + src_offset, memory.lkey
        self.cfg.remote_addr, self.cfg.rkey = remote.address, remote.rkey
        self.cfg.msg_size = msg_size
        self.cfg.iterations, self.cfg.warmup_iterations = iterations, warmup_iterations
        self.cfg.duration_ns, self.cfg.warmup_ns = duration_ns, warmup_ns
        self.cfg.window_messages = window_messages
        self.cfg.tx_depth, self.cfg.cq_mod, self.cfg.post_list = tx_depth, cq_mod, post_list
        self.cfg.max_inline = max_inline
        self.cfg.slots, self.cfg.src_slots = slots, src_slots
        self.cfg.read = read
        if on_pass is not None:
            self.cfg.pass_end = _pass_end
            self.cfg.pass_ctx = <void *>on_pass
        self.cfg.stall_timeout_ns = stall_timeout_ns
        self.cfg.clock = _loop_clock(counter, ns_per_tick)


cdef class LatencyConfig:
    """The ping-pong loop's settings (gdr_lat_config) and the owners of what it points at: it
    sends from send_offset in memory (in source, given: NCCL's LL send buffer), the peer writes
    into memory's start, it into remote's. read: the initiator READs remote's start; imm: WRITEs
    with immediate into `slots` slots, the pass after `first`, post_recv its first receive."""

    cdef c.gdr_lat_config cfg
    cdef readonly object handles, memory, source

    def __init__(self, handles, memory, remote, *, uint64_t send_offset, uint32_t msg_size,
                 uint64_t iterations, bint initiator, uint64_t stall_timeout_ns, uint64_t seed,
                 uint32_t max_inline=0, bint read=False, bint imm=False, uint32_t slots=1,
                 uint64_t first=0, bint post_recv=False, bint counter=False,
                 double ns_per_tick=1.0, source=None):
        if read and (imm or not initiator):
            raise ValueError("only an initiator READs, and not both READs and WRITEs with imm")
        if imm and not 1 <= <object>slots * msg_size <= remote.length:
            raise ValueError(f"{slots} slots of {msg_size} B do not fit the peer's buffer")
        if source is not None and not imm:
            raise ValueError("a send buffer of its own needs WRITEs with immediate")
        sender = memory if source is None else source
        _check_inside("the message sent", <object>send_offset + msg_size, sender)
        self.handles, self.memory, self.source = handles, memory, source
        memset(&self.cfg, 0, sizeof(self.cfg))
        self.cfg.qp = <c.ibv_qp *><uintptr_t>handles.qps[0]
        self.cfg.cq = <c.ibv_cq *><uintptr_t>handles.cq
        self.cfg.send_addr, self.cfg.lkey = sender.address + send_offset, sender.lkey
        self.cfg.recv_buf = <volatile uint8_t *><uintptr_t>memory.address
        self.cfg.remote_addr, self.cfg.rkey = remote.address, remote.rkey
        self.cfg.msg_size, self.cfg.iterations = msg_size, iterations
        self.cfg.seed, self.cfg.max_inline = seed, max_inline
        self.cfg.initiator, self.cfg.read, self.cfg.post_recv = initiator, read, post_recv
        self.cfg.imm, self.cfg.slots, self.cfg.first = imm, slots, first
        self.cfg.stall_timeout_ns = stall_timeout_ns
        self.cfg.clock = _loop_clock(counter, ns_per_tick)


def run_bandwidth(BandwidthConfig config, StopFlag stop):
    """RDMA WRITE (or READ) bandwidth loop; a BandwidthLoopResult. This call holds config (and so
    its owners) and stop until the loop has returned."""
    cdef c.gdr_bw_result res
    config.cfg.stop = &stop.value
    try:
        with nogil:
            c.gdr_bw_run(&config.cfg, &res)
    finally:
        config.cfg.stop = NULL   # the flag is the caller's: no pointer to it outlives the call
    return BandwidthLoopResult(res.status, res.err_errno, res.wc_status, res.wc_vendor_err,
                               res.wc_qp_num, res.messages, res.posted, res.elapsed_ns,
                               res.peak_bytes_per_s, res.passes, res.paused_ns,
                               _clock_check(&res.clock_check))


def run_latency(LatencyConfig config, StopFlag stop, bint keep_samples=False):
    """Ping-pong loop; a LatencyLoopResult, with the round trips' summary (initiator only),
    and them too with keep_samples. Holds config and stop until the loop has returned."""
    cdef c.gdr_lat_result res
    cdef uint64_t *samples = NULL
    cdef uint64_t iterations = config.cfg.iterations
    cdef RoundTripSummary round_trip = None
    cdef bytes kept = None
    if config.cfg.initiator:
        samples = <uint64_t *>malloc(iterations * sizeof(uint64_t))
        if samples == NULL:
            raise MemoryError()
    try:
        config.cfg.samples_ns = samples
        config.cfg.stop = &stop.value
        with nogil:
            c.gdr_lat_run(&config.cfg, &res)
        if samples != NULL and res.status == c.GDR_OK:
            if keep_samples:
                kept = (<char *>samples)[:iterations * sizeof(uint64_t)]
            round_trip = _round_trip_summary(samples, iterations)
    finally:
        config.cfg.samples_ns = NULL
        config.cfg.stop = NULL
        free(samples)
    return LatencyLoopResult(res.status, res.err_errno, res.wc_status, res.wc_vendor_err,
                             res.wc_qp_num, res.completed, res.bad_messages, res.bad_bytes,
                             res.first_bad_offset, _clock_check(&res.clock_check), round_trip,
                             kept)


# ---- NCCL's flush: one RDMA READ of received bytes on a loopback QP (csrc/gdr_flush.h) ----

MAX_FLUSH_BYTES = c.GDR_FLUSH_MAX_BYTES


@cython.dataclasses.dataclass(frozen=True)
cdef class FlushResult:
    """One flush READ (struct gdr_flush_result) and the bytes it landed."""

    cdef readonly int status
    cdef readonly int errno "errno_"
    cdef readonly int wc_status
    cdef readonly uint32_t wc_vendor_err
    cdef readonly uint32_t wc_qp_num
    cdef readonly uint64_t elapsed_ns        # post to completion
    cdef readonly bytes landed               # what the READ brought back (valid when ok)


cdef class FlushConfig:
    """The flush READ's target in the C struct gdr_flush reads, with the objects that own
    what it points at (see BandwidthConfig): handles (rdma.handles.RawHandles of the
    loopback QP and its CQ), memory (the receive buffer's provider: its received bytes are
    read back, through its rkey) and landing (a registered host buffer's provider, which
    the READ writes and the CPU then reads)."""

    cdef c.gdr_flush_target target
    cdef c.gdr_clock clock
    cdef readonly object handles, memory, landing
    cdef readonly uint64_t stall_timeout_ns

    def __init__(self, handles, memory, landing, *, uint32_t length,
                 uint64_t stall_timeout_ns, bint counter=False, double ns_per_tick=1.0):
        if not 1 <= length <= c.GDR_FLUSH_MAX_BYTES:
            raise ValueError(f"a flush reads 1 to {c.GDR_FLUSH_MAX_BYTES} bytes, not {length}")
        if landing.kind != "host":
            raise ValueError("the flush lands in host memory, which the CPU reads")
        _check_inside("the landing bytes", length, landing)
        self.handles, self.memory, self.landing = handles, memory, landing
        memset(&self.target, 0, sizeof(self.target))
        self.target.qp = <c.ibv_qp *><uintptr_t>handles.qps[0]
        self.target.cq = <c.ibv_cq *><uintptr_t>handles.cq
        self.target.rkey = memory.rkey
        self.target.landing = <volatile uint8_t *><uintptr_t>landing.address
        self.target.lkey = landing.lkey
        self.target.length = length
        self.stall_timeout_ns = stall_timeout_ns
        self.clock = _loop_clock(counter, ns_per_tick)

    @property
    def length(self):
        return self.target.length


def run_flush(FlushConfig config, uint64_t offset, uint8_t fill, StopFlag stop):
    """One flush READ of config.length bytes at offset in the receive buffer, waited on; the
    landing bytes are set to fill first. A FlushResult. This call holds config (and so its
    owners) and stop until the READ has completed or the wait ended."""
    cdef c.gdr_flush_target target = config.target
    cdef c.gdr_flush_result res
    _check_inside("the bytes read back", <object>offset + target.length, config.memory)
    target.remote_addr = <uint64_t>config.memory.address + offset
    with nogil:
        c.gdr_flush(&target, fill, &config.clock, config.stall_timeout_ns, &stop.value, &res)
    landed = (<char *>target.landing)[:target.length]
    return FlushResult(res.status, res.err_errno, res.wc_status, res.wc_vendor_err,
                       res.wc_qp_num, res.elapsed_ns, landed)
