/* NCCL's traffic pattern over its IB transport, in C: the receiver posts a clear-to-send
 * (an RDMA WRITE of a FIFO element into the sender's FIFO), the sender waits for it and
 * posts the step's data as RDMA WRITEs over the connection's QPs, the last a WRITE with
 * immediate carrying the size; the receiver completes on the immediate and, on a GPUDirect
 * path, flushes with a one-byte RDMA READ; at most NCCL_STEPS steps are in flight per
 * connection. Every verb, its QP and its flags follow NVIDIA/nccl v2.30.7-1
 * src/transport/net_ib/p2p.cc (ncclIbIrecv, ncclIbPostFifo, ncclIbIsend, ncclIbMultiSend,
 * ncclIbIflush, ncclIbTest) with one device per connection, NCCL's defaults for what is not
 * a setting here (index matching: the immediate is the size; receives posted on demand; no
 * resiliency), and net.cc's proxy for the steps (in order, NCCL_STEPS deep).
 *
 * Which verbs a step posts is one pure function (gdr_nccl_step_posts), which the loops post
 * from and the unit test compares with p2p.cc. The loops allocate nothing and read the clock
 * a few times per step (gdr_clock.h). */
#ifndef GDR_NCCL_H
#define GDR_NCCL_H

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

#include "gdr_clock.h"
#include "gdr_loop.h"

#define GDR_NCCL_STEPS 8            /* NCCL_STEPS (src/include/device.h) */
#define GDR_NCCL_FIFO_SLOTS 256     /* NET_IB_MAX_REQUESTS: NCCL_NET_MAX_REQUESTS 32 x 8 */
#define GDR_NCCL_MAX_RECVS 8        /* NCCL_NET_IB_MAX_RECVS: elements per FIFO slot */
#define GDR_NCCL_MAX_DEVS 8         /* NCCL_IB_MAX_DEVS_PER_NIC (net API v12) */
#define GDR_NCCL_CHUNK_ALIGN 128    /* IB_WRITE_CHUNK_ALIGNMENT in p2p.cc */
#define GDR_NCCL_MAX_CHANNELS 32
#define GDR_NCCL_MAX_POSTS 40       /* verbs one step posts at most: GDR_MAX_QPS-bounded */

/* struct ncclIbSendFifo (src/transport/net_ib/common.h): one element of the sender's FIFO,
 * 64 bytes, written by the receiver's clear-to-send. */
struct gdr_nccl_fifo_elem {
    uint64_t addr;
    uint64_t size;
    uint32_t rkeys[GDR_NCCL_MAX_DEVS];
    uint32_t nreqs;
    uint32_t tag;
    uint64_t idx;
};

#define GDR_NCCL_FIFO_SLOT_BYTES (GDR_NCCL_MAX_RECVS * sizeof(struct gdr_nccl_fifo_elem))
#define GDR_NCCL_FIFO_BYTES (GDR_NCCL_FIFO_SLOTS * GDR_NCCL_FIFO_SLOT_BYTES)   /* per channel */

/* What both sides agree a run's connections look like. */
struct gdr_nccl_shape {
    uint32_t channels;            /* connections, each with its own QPs, FIFO and ring */
    uint32_t qps_per_conn;        /* NCCL_IB_QPS_PER_CONNECTION (one device per connection) */
    int split;                    /* NCCL_IB_SPLIT_DATA_ON_QPS: a step over every QP */
    int adaptive_routing;         /* comm->ar: the data as a WRITE, then a zero-byte WRITE
                                   * with immediate, for steps over ar_threshold bytes */
    uint64_t ar_threshold;        /* NCCL_IB_AR_THRESHOLD (8192) */
    int inline_cts;               /* NCCL_IB_USE_INLINE: the clear-to-send posted inline */
    uint32_t step_bytes;
    uint32_t ring_slots;          /* R: receive slots per channel; a pass is R steps each */
};

enum gdr_nccl_verb {
    GDR_NCCL_RECV = 1,            /* receiver: ibv_post_recv on a data QP */
    GDR_NCCL_CTS = 2,             /* receiver: RDMA WRITE of the FIFO element */
    GDR_NCCL_DATA = 3,            /* sender: RDMA WRITE of the step's bytes */
    GDR_NCCL_DATA_IMM = 4,        /* sender: RDMA WRITE with immediate (the size) */
    GDR_NCCL_FLUSH = 5,           /* receiver: RDMA READ of 1 byte on the flush QP */
};

/* One verb a step posts: on which of the connection's QPs (the flush QP: 0), how many
 * bytes, whether signalled or inline, and the immediate. */
struct gdr_nccl_post {
    uint32_t verb;
    uint32_t qp;
    uint32_t length;
    uint32_t signaled;
    uint32_t inline_;
    uint32_t imm;
};

/* How many of the connection's QPs a step uses (ncclIbCommBaseGetNqpsPerRequest), and
 * whether the loops can run a shape. */
uint32_t gdr_nccl_qps_per_step(const struct gdr_nccl_shape *shape);
int gdr_nccl_shape_valid(const struct gdr_nccl_shape *shape);

/* The verbs step `id` of a connection posts, in order (the receiver's receives and
 * clear-to-send, the sender's data per QP, the receiver's flush where flush is set):
 * the count, or 0 when more than max would be needed or the shape is invalid. */
size_t gdr_nccl_step_posts(const struct gdr_nccl_shape *shape, uint64_t id, int flush,
                           struct gdr_nccl_post *out, size_t max);

/* Where each step's bytes go and come from: the pass's k-th step of channel c is the
 * round's message m = first_message + c * steps + k (the pass's `steps` per channel, after
 * first_message messages of the round), received into slot m mod (channels * R) and sent
 * from source slot m mod (channels * R + 1): gdr_pattern.h's numbering, a pass checked as
 * the next channels * steps messages of the round. */
uint64_t gdr_nccl_message(uint64_t first_message, uint64_t steps, uint32_t channel, uint64_t k);

/* Each side's loop runs one pass: steps first_id .. first_id + steps - 1 of every
 * channel (the connection's step numbers, which NCCL's FIFO and the clear-to-send's idx
 * count over the connection's life), the round's messages from first_message on
 * (gdr_nccl_message: where a step lands and what it carries). Its QPs are the run's first
 * channels * qps_per_conn, channel c's from c * qps_per_conn; per step (index
 * c * steps + k) it records times in ns where asked, each between two reads of the clock
 * and less the one whole read that holds (measured at the loop's start, gdr_clock_read_ticks;
 * never below 0), so the phase is the path's and the loop's, not the clock's; a phase the
 * step did not have (no flush, no wait) is 0. */
struct gdr_nccl_recv_config {
    struct gdr_nccl_shape shape;
    struct ibv_qp *qps[GDR_MAX_QPS];
    struct ibv_cq *cq;
    uint64_t ring_addr;           /* the receive slots (rkey: where the sender writes) */
    uint32_t ring_rkey;
    uint64_t cts_addr;            /* local, registered: the clear-to-send elements */
    uint32_t cts_lkey;
    uint64_t fifo_addr;           /* the sender's FIFO (channel c's at c * FIFO_BYTES) */
    uint32_t fifo_rkey;
    struct ibv_qp *flush_qp;      /* NULL: no flush (host memory, or NCCL's rule) */
    struct ibv_cq *flush_cq;
    volatile uint8_t *flush_landing;   /* one byte per channel and window slot */
    uint32_t flush_lkey;
    uint64_t seed;                /* the round's pattern: what each flush must read back */
    uint64_t first_id;
    uint64_t first_message;
    uint64_t steps;
    uint32_t window;              /* steps in flight per channel: NCCL_STEPS, or 1 */
    uint64_t *step_ns;            /* clear-to-send posted -> step consumed */
    uint64_t *recv_ns;            /* clear-to-send posted -> every immediate of it in */
    uint64_t *flush_ns;           /* flush READ posted -> completed */
    uint64_t stall_timeout_ns;
    struct gdr_clock clock;
    volatile int *stop;
};

struct gdr_nccl_send_config {
    struct gdr_nccl_shape shape;
    struct ibv_qp *qps[GDR_MAX_QPS];
    struct ibv_cq *cq;
    uint64_t src_addr;            /* the source slots (channels * R + 1 of them) */
    uint32_t src_lkey;
    volatile uint8_t *fifo;       /* local, registered for remote writes: the FIFO */
    uint64_t remote_addr;         /* the receiver's buffer: every clear-to-send must name */
    uint64_t remote_length;       /* a step inside it */
    uint64_t first_id;
    uint64_t first_message;
    uint64_t steps;
    uint64_t *wait_ns;            /* ready to send -> its clear-to-send seen */
    uint64_t *data_ns;            /* data posted -> its last WRITE completed */
    uint64_t stall_timeout_ns;
    struct gdr_clock clock;
    volatile int *stop;
};

struct gdr_nccl_result {
    int status;                   /* enum gdr_status; GDR_ERR_PROTOCOL: a bad clear-to-send */
    int err_errno;
    int wc_status;
    uint32_t wc_vendor_err;
    uint32_t wc_qp_num;
    uint64_t steps;               /* consumed (receiver) or completed (sender), all channels */
    uint64_t elapsed_ns;          /* first clear-to-send (receiver) or post (sender) to the last */
    uint64_t bad_imm;             /* immediates that were not the step's size */
    uint64_t flush_bad;           /* flush READs that brought back another byte */
    uint64_t first_flush_bad;     /* the message (gdr_nccl_message) of the first */
    struct gdr_clock_check clock_check;
};

#define GDR_ERR_PROTOCOL 8        /* the peer's clear-to-send named no step we may send */

int gdr_nccl_recv_run(const struct gdr_nccl_recv_config *cfg, struct gdr_nccl_result *res);
int gdr_nccl_send_run(const struct gdr_nccl_send_config *cfg, struct gdr_nccl_result *res);

#endif
