# cython: language_level=3, boundscheck=False, wraparound=False
"""Thin wrappers over csrc/: plain numbers in, plain numbers out.

Addresses and verbs handles travel as Python ints. Every call that loops releases the
GIL, so the Python side can watch a clock or a Ctrl-C while the C code runs.
"""

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
}
STATUS_OK = c.GDR_OK
STATUS_STOPPED = c.GDR_ERR_STOPPED
STATUS_STALL = c.GDR_ERR_STALL
STATUS_WC = c.GDR_ERR_WC
MAX_QPS = c.GDR_MAX_QPS
MAX_POST_LIST = c.GDR_MAX_POST_LIST
MAX_SIZE = c.GDR_MAX_MSG_SIZE
HAVE_COUNTER = bool(c.GDR_HAVE_COUNTER)


cdef class StopFlag:
    """A flag the C loops poll: setting it from another thread ends a run early."""

    cdef int value

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

cdef dict _summary_dict(c.gdr_latency_summary *s):
    return {"samples": s.samples, "min_ns": s.min_ns, "median_ns": s.median_ns,
            "mean_ns": s.mean_ns, "stdev_ns": s.stdev_ns, "p99_ns": s.p99_ns,
            "p999_ns": s.p999_ns, "max_ns": s.max_ns}


# ---- payload pattern --------------------------------------------------------------

def pattern_seed(uint64_t size, uint64_t round):
    return c.gdr_pattern_seed(size, round)


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


def slots_verify(uintptr_t addr, size_t size, size_t slots, uint64_t seed):
    """(slots with a wrong byte, wrong bytes, first wrong offset from addr or -1)."""
    cdef size_t bad_slots = 0, first = 0, bad
    with nogil:
        bad = c.gdr_slots_verify(<const uint8_t *>addr, size, slots, seed, &bad_slots, &first)
    return bad_slots, bad, (first if bad else -1)


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

def object_slot(obj, size_t offset):
    """The pointer-sized word at offset inside a Python object's C struct."""
    return (<uintptr_t *>(<char *><PyObject *>obj + offset))[0]


def qp_fields(uintptr_t ptr):
    """The ibv_qp fields the handle validation compares with pyverbs' own values."""
    cdef c.ibv_qp *qp = <c.ibv_qp *>ptr
    return {"send_cq": <uintptr_t>qp.send_cq, "qp_num": qp.qp_num, "qp_type": qp.qp_type}


def cq_fields(uintptr_t ptr):
    """The ibv_cq fields the handle validation compares with pyverbs' own values."""
    cdef c.ibv_cq *cq = <c.ibv_cq *>ptr
    return {"context": <uintptr_t>cq.context, "cqe": cq.cqe}


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


cdef dict _clock_check_dict(c.gdr_clock_check *check):
    return {"agreement": check.agreement, "span_ns": check.span_ns}


cdef class BandwidthConfig:
    """The bandwidth loop's settings, held in the C struct the loop reads."""

    cdef c.gdr_bw_config cfg

    def __init__(self, qps, uintptr_t cq, *, uint64_t local_addr, uint32_t lkey,
                 uint64_t remote_addr, uint32_t rkey, uint32_t msg_size, uint64_t iterations,
                 uint32_t tx_depth, uint32_t cq_mod, uint64_t stall_timeout_ns,
                 uint64_t warmup_iterations=0, uint64_t duration_ns=0, uint64_t warmup_ns=0,
                 uint64_t window_messages=0, uint32_t post_list=1, uint32_t max_inline=0,
                 uint32_t slots=1, bint counter=False, double ns_per_tick=1.0):
        cdef size_t i
        if not 1 <= len(qps) <= c.GDR_MAX_QPS:
            raise ValueError(f"between 1 and {c.GDR_MAX_QPS} QPs are supported")
        memset(&self.cfg, 0, sizeof(self.cfg))
        for i in range(len(qps)):
            self.cfg.qps[i] = <c.ibv_qp *><uintptr_t>qps[i]
        self.cfg.num_qps = len(qps)
        self.cfg.cq = <c.ibv_cq *>cq
        self.cfg.local_addr, self.cfg.lkey = local_addr, lkey
        self.cfg.remote_addr, self.cfg.rkey = remote_addr, rkey
        self.cfg.msg_size = msg_size
        self.cfg.iterations, self.cfg.warmup_iterations = iterations, warmup_iterations
        self.cfg.duration_ns, self.cfg.warmup_ns = duration_ns, warmup_ns
        self.cfg.window_messages = window_messages
        self.cfg.tx_depth, self.cfg.cq_mod, self.cfg.post_list = tx_depth, cq_mod, post_list
        self.cfg.max_inline = max_inline
        self.cfg.slots = slots
        self.cfg.stall_timeout_ns = stall_timeout_ns
        self.cfg.clock = _loop_clock(counter, ns_per_tick)


cdef class LatencyConfig:
    """The ping-pong loop's settings, held in the C struct the loop reads."""

    cdef c.gdr_lat_config cfg

    def __init__(self, uintptr_t qp, uintptr_t cq, *, uint64_t send_addr, uint32_t lkey,
                 uintptr_t recv_addr, uint64_t remote_addr, uint32_t rkey, uint32_t msg_size,
                 uint64_t iterations, bint initiator, uint64_t stall_timeout_ns,
                 uint32_t max_inline=0, bint counter=False, double ns_per_tick=1.0):
        memset(&self.cfg, 0, sizeof(self.cfg))
        self.cfg.qp, self.cfg.cq = <c.ibv_qp *>qp, <c.ibv_cq *>cq
        self.cfg.send_addr, self.cfg.lkey = send_addr, lkey
        self.cfg.recv_buf = <volatile uint8_t *>recv_addr
        self.cfg.remote_addr, self.cfg.rkey = remote_addr, rkey
        self.cfg.msg_size, self.cfg.iterations = msg_size, iterations
        self.cfg.max_inline = max_inline
        self.cfg.initiator = initiator
        self.cfg.stall_timeout_ns = stall_timeout_ns
        self.cfg.clock = _loop_clock(counter, ns_per_tick)


def run_bandwidth(BandwidthConfig config, StopFlag stop):
    """RDMA WRITE bandwidth loop; returns the C result as a dict."""
    cdef c.gdr_bw_result res
    config.cfg.stop = &stop.value
    with nogil:
        c.gdr_bw_run(&config.cfg, &res)
    return {"status": res.status, "errno": res.err_errno, "wc_status": res.wc_status,
            "wc_vendor_err": res.wc_vendor_err, "wc_qp_num": res.wc_qp_num,
            "messages": res.messages, "posted": res.posted, "elapsed_ns": res.elapsed_ns,
            "peak_bytes_per_s": res.peak_bytes_per_s,
            "clock_check": _clock_check_dict(&res.clock_check)}


def run_latency(LatencyConfig config, StopFlag stop):
    """Ping-pong loop; returns the C result as a dict, with a summary of the round trips
    (initiator only)."""
    cdef c.gdr_lat_result res
    cdef c.gdr_latency_summary s
    cdef uint64_t *samples = NULL
    cdef uint64_t iterations = config.cfg.iterations
    if config.cfg.initiator:
        samples = <uint64_t *>malloc(iterations * sizeof(uint64_t))
        if samples == NULL:
            raise MemoryError()
    try:
        config.cfg.samples_ns = samples
        config.cfg.stop = &stop.value
        with nogil:
            c.gdr_lat_run(&config.cfg, &res)
        result = {"status": res.status, "errno": res.err_errno, "wc_status": res.wc_status,
                  "wc_vendor_err": res.wc_vendor_err, "completed": res.completed,
                  "round_trip": None, "clock_check": _clock_check_dict(&res.clock_check)}
        if samples != NULL and res.status == c.GDR_OK:
            c.gdr_latency_summarize(samples, iterations, &s)
            result["round_trip"] = _summary_dict(&s)
        return result
    finally:
        config.cfg.samples_ns = NULL
        free(samples)
