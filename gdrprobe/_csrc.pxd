# Declarations of the C library in csrc/: one block per header, nothing else.
from libc.stdint cimport uint8_t, uint32_t, uint64_t


cdef extern from "<infiniband/verbs.h>" nogil:
    struct ibv_context:
        pass
    struct ibv_cq:
        ibv_context *context
        int cqe
    struct ibv_qp:
        ibv_cq *send_cq
        uint32_t qp_num
        int qp_type
    struct ibv_pd:
        ibv_context *context
        uint32_t handle
    struct ibv_mr:
        size_t length
        uint32_t lkey
        uint32_t rkey
    const char *ibv_wc_status_str(int status)


cdef extern from "gdr_stats.h" nogil:
    struct gdr_latency_summary:
        size_t samples
        double min_ns, median_ns, mean_ns, stdev_ns, p99_ns, p999_ns, max_ns
    int gdr_latency_summarize(uint64_t *samples, size_t n, gdr_latency_summary *out)


cdef extern from "gdr_pattern.h" nogil:
    int GDR_POISON_BYTE
    uint64_t gdr_pattern_seed(uint64_t size, uint64_t round)
    uint8_t gdr_pattern_byte(uint64_t seed, uint64_t offset)
    void gdr_pattern_fill(uint8_t *buf, size_t length, uint64_t seed)
    size_t gdr_pattern_verify(const uint8_t *buf, size_t length, uint64_t seed, size_t *first_bad)
    uint64_t gdr_slot_seed(uint64_t seed, uint64_t slot)
    void gdr_slots_fill(uint8_t *buf, size_t size, size_t slots, uint64_t seed)
    size_t gdr_messages_verify(const uint8_t *buf, size_t size, size_t slots, size_t src_slots,
                               uint64_t seed, uint64_t first, size_t count,
                               size_t *bad_messages, size_t *first_bad)
    size_t gdr_poison_verify(const uint8_t *buf, size_t length, size_t *first_bad)


cdef extern from "gdr_peek.h" nogil:
    int gdr_peek(void *dst, const void *src, size_t len)


cdef extern from "gdr_dmabuf.h" nogil:
    ibv_mr *gdr_reg_dmabuf_mr(ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova,
                              int fd, int access, int *err)
    int gdr_have_reg_dmabuf_mr()
    int gdr_dereg_mr(ibv_mr *mr)


cdef extern from "gdr_hostmem.h" nogil:
    void *gdr_host_alloc(size_t length, int numa_node, int huge_pages, size_t *mapped_len)
    int gdr_host_free(void *addr, size_t mapped_len)


cdef extern from "gdr_clock.h" nogil:
    enum gdr_clock_source:
        GDR_CLOCK_MONOTONIC, GDR_CLOCK_COUNTER
    enum:
        GDR_HAVE_COUNTER
    struct gdr_clock:
        int source
        double ns_per_tick
    double gdr_counter_calibrate(uint64_t window_ns)


cdef extern from "gdr_loop.h" nogil:
    enum:
        GDR_MAX_QPS
        GDR_MAX_POST_LIST
        GDR_MAX_MSG_SIZE
    enum gdr_status:
        GDR_OK, GDR_ERR_ARGS, GDR_ERR_POST, GDR_ERR_POLL, GDR_ERR_WC, GDR_ERR_STALL, GDR_ERR_STOPPED,
        GDR_ERR_PASS
    ctypedef int (*gdr_pass_fn)(void *ctx, uint64_t pass_, uint64_t messages)

    struct gdr_bw_config:
        ibv_qp *qps[GDR_MAX_QPS]
        uint32_t num_qps
        ibv_cq *cq
        uint64_t local_addr
        uint32_t lkey
        uint64_t remote_addr
        uint32_t rkey
        uint32_t msg_size
        uint64_t iterations
        uint64_t warmup_iterations
        uint64_t duration_ns
        uint64_t warmup_ns
        uint64_t window_messages
        uint32_t tx_depth
        uint32_t cq_mod
        uint32_t post_list
        uint32_t max_inline
        uint32_t slots
        uint32_t src_slots
        int read
        gdr_pass_fn pass_end
        void *pass_ctx
        uint64_t stall_timeout_ns
        gdr_clock clock
        volatile int *stop

    struct gdr_clock_check:
        double agreement
        uint64_t span_ns

    struct gdr_bw_result:
        int status
        int err_errno
        int wc_status
        uint32_t wc_vendor_err
        uint32_t wc_qp_num
        uint64_t messages
        uint64_t posted
        uint64_t elapsed_ns
        double peak_bytes_per_s
        uint64_t passes
        uint64_t paused_ns
        gdr_clock_check clock_check

    struct gdr_lat_config:
        ibv_qp *qp
        ibv_cq *cq
        uint64_t send_addr
        uint32_t lkey
        volatile uint8_t *recv_buf
        uint64_t seed
        uint64_t remote_addr
        uint32_t rkey
        uint32_t msg_size
        uint64_t iterations
        uint32_t max_inline
        int initiator
        int imm
        uint32_t slots
        uint64_t first
        int post_recv
        int read
        uint64_t *samples_ns
        uint64_t stall_timeout_ns
        gdr_clock clock
        volatile int *stop

    struct gdr_lat_result:
        int status
        int err_errno
        int wc_status
        uint32_t wc_vendor_err
        uint32_t wc_qp_num
        uint64_t completed
        uint64_t bad_messages
        uint64_t bad_bytes
        uint64_t first_bad_offset
        gdr_clock_check clock_check

    int gdr_bw_run(const gdr_bw_config *cfg, gdr_bw_result *res)
    int gdr_lat_run(const gdr_lat_config *cfg, gdr_lat_result *res)


cdef extern from "gdr_flush.h" nogil:
    enum:
        GDR_FLUSH_MAX_BYTES

    struct gdr_flush_target:
        ibv_qp *qp
        ibv_cq *cq
        uint64_t remote_addr
        uint32_t rkey
        volatile uint8_t *landing
        uint32_t lkey
        uint32_t length

    struct gdr_flush_result:
        int status
        int err_errno
        int wc_status
        uint32_t wc_vendor_err
        uint32_t wc_qp_num
        uint64_t elapsed_ns

    int gdr_flush(const gdr_flush_target *target, uint8_t fill, const gdr_clock *clock,
                  uint64_t stall_timeout_ns, volatile int *stop, gdr_flush_result *res)


cdef extern from "gdr_nccl.h" nogil:
    enum:
        GDR_NCCL_STEPS
        GDR_NCCL_FIFO_SLOTS
        GDR_NCCL_FIFO_BYTES
        GDR_NCCL_MAX_CHANNELS
        GDR_NCCL_MAX_POSTS
        GDR_ERR_PROTOCOL
    enum gdr_nccl_verb:
        GDR_NCCL_RECV, GDR_NCCL_CTS, GDR_NCCL_DATA, GDR_NCCL_DATA_IMM, GDR_NCCL_FLUSH

    struct gdr_nccl_shape:
        uint32_t channels
        uint32_t qps_per_conn
        int split
        int adaptive_routing
        uint64_t ar_threshold
        int inline_cts
        uint32_t step_bytes
        uint32_t ring_slots

    struct gdr_nccl_post:
        uint32_t verb
        uint32_t qp
        uint32_t length
        uint32_t signaled
        uint32_t inline_
        uint32_t imm

    struct gdr_nccl_recv_config:
        gdr_nccl_shape shape
        ibv_qp *qps[GDR_MAX_QPS]
        ibv_cq *cq
        uint64_t ring_addr
        uint32_t ring_rkey
        uint64_t cts_addr
        uint32_t cts_lkey
        uint64_t fifo_addr
        uint32_t fifo_rkey
        ibv_qp *flush_qp
        ibv_cq *flush_cq
        volatile uint8_t *flush_landing
        uint32_t flush_lkey
        uint64_t seed
        uint64_t first_id
        uint64_t first_message
        uint64_t steps
        uint32_t window
        uint64_t *step_ns
        uint64_t *recv_ns
        uint64_t *flush_ns
        uint64_t stall_timeout_ns
        gdr_clock clock
        volatile int *stop

    struct gdr_nccl_send_config:
        gdr_nccl_shape shape
        ibv_qp *qps[GDR_MAX_QPS]
        ibv_cq *cq
        uint64_t src_addr
        uint32_t src_lkey
        volatile uint8_t *fifo
        uint64_t remote_addr
        uint64_t remote_length
        uint64_t first_id
        uint64_t first_message
        uint64_t steps
        uint64_t *wait_ns
        uint64_t *data_ns
        uint64_t stall_timeout_ns
        gdr_clock clock
        volatile int *stop

    struct gdr_nccl_result:
        int status
        int err_errno
        int wc_status
        uint32_t wc_vendor_err
        uint32_t wc_qp_num
        uint64_t steps
        uint64_t elapsed_ns
        uint64_t bad_imm
        uint64_t flush_bad
        uint64_t first_flush_bad
        gdr_clock_check clock_check

    size_t gdr_nccl_step_posts(const gdr_nccl_shape *shape, uint64_t id, int flush,
                               gdr_nccl_post *out, size_t max)
    uint64_t gdr_nccl_message(uint64_t first_message, uint64_t steps, uint32_t channel,
                              uint64_t k)
    int gdr_nccl_recv_run(const gdr_nccl_recv_config *cfg, gdr_nccl_result *res)
    int gdr_nccl_send_run(const gdr_nccl_send_config *cfg, gdr_nccl_result *res)
