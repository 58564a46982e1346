/* The schedule of NCCL's pattern: which verbs a step posts and where its bytes go
 * (gdr_nccl.h), pure: the loops in gdr_nccl.c post from it and the unit test compares it
 * with p2p.cc. */
#include "gdr_nccl.h"

#define DIVUP(x, y) (((x) + (y) - 1) / (y))

/* ---- the schedule: which verbs a step posts (p2p.cc, NCCL v2.30.7-1) --------------------- */

/* ncclIbCommBaseGetNqpsPerRequest (common.h): every QP with NCCL_IB_SPLIT_DATA_ON_QPS, else
 * nDataQps, max(local devices, remote devices) = 1 here. */
uint32_t gdr_nccl_qps_per_step(const struct gdr_nccl_shape *shape)
{
    return shape->split ? shape->qps_per_conn : 1;
}

/* ncclIbCommBaseGetQpForRequest (common.h): (id * nQps + qpIndex) % nqps. */
static uint32_t step_qp(const struct gdr_nccl_shape *shape, uint64_t id, uint32_t i)
{
    return (uint32_t)((id * gdr_nccl_qps_per_step(shape) + i) % shape->qps_per_conn);
}

int gdr_nccl_shape_valid(const struct gdr_nccl_shape *shape)
{
    return shape->channels >= 1 && shape->channels <= GDR_NCCL_MAX_CHANNELS &&
           shape->qps_per_conn >= 1 && shape->channels * shape->qps_per_conn <= GDR_MAX_QPS &&
           shape->step_bytes >= 1 && shape->ring_slots >= 1;
}

static size_t add_post(struct gdr_nccl_post *out, size_t n, size_t max, uint32_t verb, uint32_t qp,
                       uint32_t length, uint32_t signaled, uint32_t inline_, uint32_t imm)
{
    if (n < max) {
        out[n].verb = verb;
        out[n].qp = qp;
        out[n].length = length;
        out[n].signaled = signaled;
        out[n].inline_ = inline_;
        out[n].imm = imm;
    }
    return n + 1;
}

size_t gdr_nccl_step_posts(const struct gdr_nccl_shape *shape, uint64_t id, int flush,
                           struct gdr_nccl_post *out, size_t max)
{
    uint32_t nqps, i, chunk, offset = 0, length;
    int ar;
    size_t n = 0;

    if (!gdr_nccl_shape_valid(shape))
        return 0;
    nqps = gdr_nccl_qps_per_step(shape);
    /* ncclIbIrecv: a receive on each QP the step uses (posted on demand), then
     * ncclIbPostFifo: the clear-to-send on the device's first QP, signalled when its FIFO
     * slot is the device's index (slot 0 of 256), inline with NCCL_IB_USE_INLINE. */
    for (i = 0; i < nqps; i++)
        n = add_post(out, n, max, GDR_NCCL_RECV, step_qp(shape, id, i), 0, 0, 0, 0);
    n = add_post(out, n, max, GDR_NCCL_CTS, 0, sizeof(struct gdr_nccl_fifo_elem),
                 id % GDR_NCCL_FIFO_SLOTS == 0, shape->inline_cts != 0, 0);
    /* ncclIbMultiSend: the step chunked equally over its QPs, each chunk rounded up to
     * IB_WRITE_CHUNK_ALIGNMENT (a QP past the end sends 0 bytes); on each QP its chunk as a
     * signalled WRITE with immediate (the size), or with adaptive routing and a step over
     * the threshold the chunk as a WRITE and a zero-byte WRITE with immediate after it. */
    chunk = DIVUP(DIVUP(shape->step_bytes, nqps), GDR_NCCL_CHUNK_ALIGN) * GDR_NCCL_CHUNK_ALIGN;
    ar = shape->adaptive_routing && shape->step_bytes > shape->ar_threshold;
    for (i = 0; i < nqps; i++) {
        length = shape->step_bytes - offset < chunk ? shape->step_bytes - offset : chunk;
        offset += length;
        if (ar) {
            n = add_post(out, n, max, GDR_NCCL_DATA, step_qp(shape, id, i), length, 0, 0, 0);
            length = 0;
        }
        n = add_post(out, n, max, GDR_NCCL_DATA_IMM, step_qp(shape, id, i), length, 1, 0,
                     shape->step_bytes);
    }
    /* ncclIbIflush: one signalled READ of 1 byte at the start of the receive buffer. */
    if (flush)
        n = add_post(out, n, max, GDR_NCCL_FLUSH, 0, 1, 1, 0, 0);
    return n <= max ? n : 0;
}

uint64_t gdr_nccl_message(uint64_t first_message, uint64_t steps, uint32_t channel, uint64_t k)
{
    return first_message + channel * steps + k;
}
