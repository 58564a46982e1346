/* NCCL's flush of a GPUDirect receive: one RDMA READ of the received bytes on a loopback
 * QP, waited on.
 *
 * NCCL (src/transport/net_ib/p2p.cc ncclIbIflush) posts a signalled IBV_WR_RDMA_READ of 1
 * byte at the start of the last receive buffer, with that buffer's rkey, into a small
 * registered host buffer, on an RC QP connected to itself (connect.cc gpuFlush.qp: same PD,
 * REMOTE_READ allowed). The NIC's read of GPU memory cannot pass its earlier writes there,
 * so when the READ completes they have landed. The call here does exactly that once and
 * waits for it; it is outside any timed region, and a latency loop can call it between its
 * own clock reads (its elapsed time is returned). */
#ifndef GDR_FLUSH_H
#define GDR_FLUSH_H

#include <infiniband/verbs.h>
#include <stdint.h>

#include "gdr_clock.h"

#define GDR_FLUSH_MAX_BYTES 64   /* NCCL reads 1; a few more may be asked, never a message */

struct gdr_flush_target {
    struct ibv_qp *qp;            /* the loopback QP, connected to itself */
    struct ibv_cq *cq;            /* its send CQ: used by nothing else while this runs */
    uint64_t remote_addr;         /* the received bytes to read back, in the receive MR */
    uint32_t rkey;                /* the receive MR's rkey (registered with REMOTE_READ) */
    volatile uint8_t *landing;    /* where the READ lands: registered host memory */
    uint32_t lkey;
    uint32_t length;              /* bytes read: 1 .. GDR_FLUSH_MAX_BYTES */
};

struct gdr_flush_result {
    int status;                   /* enum gdr_status (gdr_loop.h) */
    int err_errno;
    int wc_status;
    uint32_t wc_vendor_err;
    uint32_t wc_qp_num;
    uint64_t elapsed_ns;          /* post to completion, by the clock given */
};

/* Set the landing bytes to fill (so a READ that lands nothing is seen), post the READ and
 * poll the CQ until it completes, *stop is set or stall_timeout_ns pass without it.
 * Returns res->status. */
int gdr_flush(const struct gdr_flush_target *target, uint8_t fill, const struct gdr_clock *clock,
              uint64_t stall_timeout_ns, volatile int *stop, struct gdr_flush_result *res);

#endif
