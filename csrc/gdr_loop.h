/* The measurement loops: RDMA WRITE bandwidth and ping-pong latency over raw verbs
 * handles. No allocation and no Python inside the timed region; besides the provider's
 * calls, only the clock reads (gdr_clock.h: a cycle counter, or CLOCK_MONOTONIC). */
#ifndef GDR_LOOP_H
#define GDR_LOOP_H

#include <infiniband/verbs.h>
#include <stdint.h>

#include "gdr_clock.h"

#define GDR_MAX_QPS 64
#define GDR_MAX_POST_LIST 64
#define GDR_MAX_MSG_SIZE (1u << 30)   /* the largest message a run may ask for */

enum gdr_status {
    GDR_OK = 0,
    GDR_ERR_ARGS = 1,       /* inconsistent configuration */
    GDR_ERR_POST = 2,       /* ibv_post_send failed: errno in err_errno */
    GDR_ERR_POLL = 3,       /* ibv_poll_cq returned < 0 */
    GDR_ERR_WC = 4,         /* a completion with an error status: wc_status, wc_vendor_err */
    GDR_ERR_STALL = 5,      /* no progress for stall_timeout_ns: the peer is gone or stuck */
    GDR_ERR_STOPPED = 6,    /* *stop became non-zero (Ctrl-C, caller's deadline) */
    GDR_ERR_PASS = 7,       /* the pass check (pass_end) asked the loop to stop */
};

/* Called between two passes of a bandwidth loop, with nothing in flight: the receiver
 * checks the pass's messages before any slot is written again. pass counts from 0;
 * messages is how many the pass sent (all QPs), the k-th of the round being message
 * pass * slots + k. Returns 0 to go on. */
typedef int (*gdr_pass_fn)(void *ctx, uint64_t pass, uint64_t messages);

struct gdr_bw_config {
    struct ibv_qp *qps[GDR_MAX_QPS];
    uint32_t num_qps;
    struct ibv_cq *cq;            /* send CQ shared by all QPs */
    uint64_t local_addr;          /* address of the source bytes in the local MR */
    uint32_t lkey;
    uint64_t remote_addr;         /* target address in the peer's MR */
    uint32_t rkey;
    uint32_t msg_size;
    uint64_t iterations;          /* messages per QP (iteration mode) */
    uint64_t warmup_iterations;   /* messages per QP completed before timing starts */
    uint64_t duration_ns;         /* > 0: duration mode; iterations is then ignored */
    uint64_t warmup_ns;           /* duration mode: time before the measured window */
    uint64_t window_messages;     /* duration mode, > 0: the warm-up and the window each also
                                   * end once this many messages (all QPs) completed in it */
    uint32_t tx_depth;            /* outstanding work requests per QP */
    uint32_t cq_mod;              /* one signalled request every cq_mod */
    uint32_t post_list;           /* work requests chained per ibv_post_send */
    uint32_t max_inline;          /* messages up to this size go inline */
    uint32_t slots;               /* >= 1: the k-th message posted (all QPs) goes to slot
                                   * k mod slots of the peer's buffer, at that times
                                   * msg_size */
    uint32_t src_slots;           /* >= slots: ... and is sent from source slot k mod
                                   * src_slots: with one more source slot than slots, the
                                   * message a slot holds differs from the one before it */
    int read;                     /* 0: RDMA WRITE from the local source slots into the
                                   * peer's slots; 1: RDMA READ from the peer's source slots
                                   * into the local slots (the same numbering: message k
                                   * lands in slot k mod slots from source k mod src_slots) */
    gdr_pass_fn pass_end;         /* non-NULL: the round runs in passes of `slots` messages,
                                   * pass_end called after each, outside the window */
    void *pass_ctx;
    uint64_t stall_timeout_ns;
    struct gdr_clock clock;
    volatile int *stop;
};

/* How far the run's clock agreed with CLOCK_MONOTONIC from the loop's start to its end. */
struct gdr_clock_check {
    double agreement;             /* gdr_clock_agreement: 1.0 when they agree */
    uint64_t span_ns;             /* the span, by CLOCK_MONOTONIC */
};

struct gdr_bw_result {
    int status;
    int err_errno;
    int wc_status;
    uint32_t wc_vendor_err;
    uint32_t wc_qp_num;
    uint64_t messages;            /* completed inside the measured window, all QPs */
    uint64_t posted;              /* posted in all, all QPs, warm-up included */
    uint64_t elapsed_ns;          /* length of the measured window */
    double peak_bytes_per_s;      /* best rate over windows of tx_depth x QPs messages */
    uint64_t passes;              /* pass_end calls made */
    uint64_t paused_ns;           /* time in pass_end, left out of the measured window */
    struct gdr_clock_check clock_check;
};

struct gdr_lat_config {
    struct ibv_qp *qp;
    struct ibv_cq *cq;
    uint64_t send_addr;           /* local source of the message (in the local MR) */
    uint32_t lkey;
    volatile uint8_t *recv_buf;   /* local buffer the peer writes into */
    uint64_t seed;                /* every message's first msg_size - 1 bytes carry the
                                   * pattern of seed (gdr_pattern.h); its last, the tag */
    uint64_t remote_addr;         /* the peer's receive buffer */
    uint32_t rkey;
    uint32_t msg_size;
    uint64_t iterations;
    uint32_t max_inline;          /* messages up to this size go inline */
    int initiator;                /* the initiator writes first and times round trips */
    int imm;                      /* RDMA WRITE with immediate (perftest's --write_with_imm):
                                   * each side waits for the peer's message on its receive
                                   * completion, never by reading the buffer (GPU memory);
                                   * the message numbered k (from 1) carries k as its
                                   * immediate and lands in slot (k - 1) mod slots of the
                                   * peer's buffer; the bytes are checked after the pass */
    uint32_t slots;               /* imm: the receive slots of the peer's buffer */
    uint64_t first;               /* imm: the messages before this pass, in the round */
    int post_recv;                /* imm: post a receive first (afterwards one stays posted:
                                   * each receive completion is followed by a new one) */
    int read;                     /* RDMA READ latency (initiator only): each iteration
                                   * READs msg_size bytes of the pattern of seed from
                                   * remote_addr into recv_buf; the sample is post to
                                   * completion, the check of the bytes after it */
    uint64_t *samples_ns;         /* initiator: one round-trip time per iteration */
    uint64_t stall_timeout_ns;
    struct gdr_clock clock;
    volatile int *stop;
};

struct gdr_lat_result {
    int status;
    int err_errno;
    int wc_status;
    uint32_t wc_vendor_err;
    uint32_t wc_qp_num;
    uint64_t completed;           /* round trips completed */
    uint64_t bad_messages;        /* messages received with a byte off the pattern */
    uint64_t bad_bytes;           /* such bytes over all messages received */
    uint64_t first_bad_offset;    /* in the first bad message; valid when bad_bytes > 0 */
    struct gdr_clock_check clock_check;
};

int gdr_bw_run(const struct gdr_bw_config *cfg, struct gdr_bw_result *res);
/* gdr_lat_run: a ping-pong of RDMA WRITEs, or with cfg->read a READ loop (initiator
 * only). */
int gdr_lat_run(const struct gdr_lat_config *cfg, struct gdr_lat_result *res);

#endif
