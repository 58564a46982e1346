# cython: language_level=3, boundscheck=False, wraparound=False
"""Thin wrappers over csrc/: plain numbers in, plain numbers out.

Addresses and verbs handles travel as Python ints. Every call that loops releases the
GIL, so the Python side can watch a clock or a Ctrl-C while the C code runs.
"""

from cpython.object cimport PyObject
from libc.errno cimport errno
from libc.stdint cimport uint8_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport free, malloc
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
POISON_BYTE = c.GDR_POISON_BYTE


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


def now_ns():
    return c.gdr_now_ns()


def wc_status_str(int status):
    return c.ibv_wc_status_str(status).decode()


# ---- statistics -----------------------------------------------------------------

cdef dict _summary_dict(c.gdr_latency_summary *s):
    return {"samples": s.samples, "min_ns": s.min_ns, "median_ns": s.median_ns,
            "mean_ns": s.mean_ns, "stdev_ns": s.stdev_ns, "p99_ns": s.p99_ns,
            "p999_ns": s.p999_ns, "max_ns": s.max_ns}


def latency_summary(samples):
    """Min, median, mean, stdev, p99, p99.9 and max of nanosecond samples."""
    cdef size_t n = len(samples), i
    cdef uint64_t *buf
    cdef c.gdr_latency_summary s
    if n == 0:
        raise ValueError("no latency samples")
    buf = <uint64_t *>malloc(n * sizeof(uint64_t))
    if buf == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            buf[i] = samples[i]
        c.gdr_latency_summarize(buf, n, &s)
        return _summary_dict(&s)
    finally:
        free(buf)


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


def read_bytes(uintptr_t addr, size_t length):
    return (<char *>addr)[:length]


def write_bytes(uintptr_t addr, bytes data):
    cdef size_t i
    for i in range(len(data)):
        (<uint8_t *>addr)[i] = data[i]


# ---- host memory ------------------------------------------------------------------

def host_alloc(size_t length, int numa_node=-1, bint huge_pages=False):
    """(address, mapped length) of a page-aligned zeroed mapping; OSError on failure."""
    cdef size_t mapped = 0
    cdef void *addr
    cdef int err = 0
    with nogil:
        addr = c.gdr_host_alloc(length, numa_node, huge_pages, &mapped)
        if addr == NULL:
            err = errno
    if addr == NULL:
        import os
        raise OSError(err, os.strerror(err))
    return <uintptr_t>addr, mapped


def host_free(uintptr_t addr, size_t mapped_len):
    if c.gdr_host_free(<void *>addr, mapped_len) != 0:
        raise OSError("munmap failed")


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


# ---- loops --------------------------------------------------------------------------

def run_bandwidth(qp_ptrs, uintptr_t cq_ptr, uint64_t local_addr, uint32_t lkey,
                  uint64_t remote_addr, uint32_t rkey, uint32_t msg_size,
                  uint64_t iterations, uint64_t warmup_iterations,
                  uint64_t duration_ns, uint64_t warmup_ns, uint32_t tx_depth,
                  uint32_t cq_mod, uint32_t post_list, uint32_t max_inline,
                  uint64_t stall_timeout_ns, StopFlag stop):
    """RDMA WRITE bandwidth loop; returns the C result as a dict."""
    cdef c.gdr_bw_config cfg
    cdef c.gdr_bw_result res
    cdef size_t i
    if not 1 <= len(qp_ptrs) <= c.GDR_MAX_QPS:
        raise ValueError(f"between 1 and {c.GDR_MAX_QPS} QPs are supported")
    memset(&cfg, 0, sizeof(cfg))
    for i in range(len(qp_ptrs)):
        cfg.qps[i] = <c.ibv_qp *><uintptr_t>qp_ptrs[i]
    cfg.num_qps = len(qp_ptrs)
    cfg.cq = <c.ibv_cq *>cq_ptr
    cfg.local_addr, cfg.lkey = local_addr, lkey
    cfg.remote_addr, cfg.rkey = remote_addr, rkey
    cfg.msg_size = msg_size
    cfg.iterations, cfg.warmup_iterations = iterations, warmup_iterations
    cfg.duration_ns, cfg.warmup_ns = duration_ns, warmup_ns
    cfg.tx_depth, cfg.cq_mod, cfg.post_list = tx_depth, cq_mod, post_list
    cfg.max_inline = max_inline
    cfg.stall_timeout_ns = stall_timeout_ns
    cfg.stop = &stop.value
    with nogil:
        c.gdr_bw_run(&cfg, &res)
    return {"status": res.status, "errno": res.err_errno, "wc_status": res.wc_status,
            "wc_vendor_err": res.wc_vendor_err, "wc_qp_num": res.wc_qp_num,
            "messages": res.messages, "elapsed_ns": res.elapsed_ns,
            "peak_bytes_per_s": res.peak_bytes_per_s}


def run_latency(uintptr_t qp_ptr, uintptr_t cq_ptr, uint64_t send_addr, uint32_t lkey,
                uintptr_t recv_addr, uint64_t remote_addr, uint32_t rkey, uint32_t msg_size,
                uint64_t iterations, uint32_t max_inline, bint initiator,
                uint64_t stall_timeout_ns, StopFlag stop):
    """Ping-pong loop; returns the C result as a dict, with a summary of the round trips
    (initiator only)."""
    cdef c.gdr_lat_config cfg
    cdef c.gdr_lat_result res
    cdef c.gdr_latency_summary s
    cdef uint64_t *samples = NULL
    memset(&cfg, 0, sizeof(cfg))
    if initiator:
        samples = <uint64_t *>malloc(iterations * sizeof(uint64_t))
        if samples == NULL:
            raise MemoryError()
    try:
        cfg.qp, cfg.cq = <c.ibv_qp *>qp_ptr, <c.ibv_cq *>cq_ptr
        cfg.send_addr, cfg.lkey = send_addr, lkey
        cfg.recv_buf = <volatile uint8_t *>recv_addr
        cfg.remote_addr, cfg.rkey = remote_addr, rkey
        cfg.msg_size, cfg.iterations, cfg.max_inline = msg_size, iterations, max_inline
        cfg.initiator = initiator
        cfg.samples_ns = samples
        cfg.stall_timeout_ns = stall_timeout_ns
        cfg.stop = &stop.value
        with nogil:
            c.gdr_lat_run(&cfg, &res)
        result = {"status": res.status, "errno": res.err_errno, "wc_status": res.wc_status,
                  "wc_vendor_err": res.wc_vendor_err, "completed": res.completed,
                  "round_trip": None}
        if initiator and res.status == c.GDR_OK:
            c.gdr_latency_summarize(samples, iterations, &s)
            result["round_trip"] = _summary_dict(&s)
        return result
    finally:
        free(samples)
