#include "gdr_flush.h"

#include <errno.h>
#include <string.h>

#include "gdr_loop.h"

/* The wait looks at the stop flag every SPINS_PER_STOP_CHECK empty polls and at the clock,
 * for the stall deadline, every SPINS_PER_CLOCK_CHECK (a clock read may be a system call). */
#define SPINS_PER_STOP_CHECK 1024
#define SPINS_PER_CLOCK_CHECK 65536
#define FLUSH_WR_ID 0x666c7573ull   /* "flus": the only request on this QP */

static int target_valid(const struct gdr_flush_target *t)
{
    return t->qp && t->cq && t->landing && t->length >= 1 && t->length <= GDR_FLUSH_MAX_BYTES;
}

static int post_read(const struct gdr_flush_target *t, struct gdr_flush_result *res)
{
    struct ibv_sge sge;
    struct ibv_send_wr wr, *bad = NULL;
    int rc;

    memset(&sge, 0, sizeof(sge));
    sge.addr = (uint64_t)(uintptr_t)t->landing;
    sge.length = t->length;
    sge.lkey = t->lkey;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = FLUSH_WR_ID;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = t->remote_addr;
    wr.wr.rdma.rkey = t->rkey;
    rc = ibv_post_send(t->qp, &wr, &bad);
    if (rc == 0)
        return GDR_OK;
    res->err_errno = rc;
    return GDR_ERR_POST;
}

/* Poll until the READ's completion: GDR_OK, or the status that ended the wait. */
static int wait_completion(const struct gdr_flush_target *t, const struct gdr_clock *clock,
                           uint64_t stall_ticks, uint64_t start, volatile int *stop,
                           struct gdr_flush_result *res)
{
    struct ibv_wc wc;
    uint64_t spins = 0;
    int n;

    for (;;) {
        n = ibv_poll_cq(t->cq, 1, &wc);
        if (n < 0) {
            res->err_errno = errno;
            return GDR_ERR_POLL;
        }
        if (n == 1) {
            if (wc.status == IBV_WC_SUCCESS)
                return GDR_OK;
            res->wc_status = wc.status;
            res->wc_vendor_err = wc.vendor_err;
            res->wc_qp_num = wc.qp_num;
            return GDR_ERR_WC;
        }
        if (++spins % SPINS_PER_STOP_CHECK)
            continue;
        if (*stop)
            return GDR_ERR_STOPPED;
        if (spins % SPINS_PER_CLOCK_CHECK == 0 && gdr_clock_ticks(clock) - start > stall_ticks)
            return GDR_ERR_STALL;
    }
}

int gdr_flush(const struct gdr_flush_target *target, uint8_t fill, const struct gdr_clock *clock,
              uint64_t stall_timeout_ns, volatile int *stop, struct gdr_flush_result *res)
{
    uint64_t start;

    memset(res, 0, sizeof(*res));
    if (!target_valid(target) || !clock || clock->ns_per_tick <= 0 || !stop) {
        res->status = GDR_ERR_ARGS;
        return res->status;
    }
    memset((void *)target->landing, fill, target->length);
    start = gdr_clock_ticks(clock);
    res->status = post_read(target, res);
    if (res->status == GDR_OK)
        res->status = wait_completion(target, clock, gdr_clock_ticks_in(clock, stall_timeout_ns),
                                      start, stop, res);
    res->elapsed_ns = (uint64_t)gdr_clock_ns(clock, gdr_clock_ticks(clock) - start);
    return res->status;
}
