#include "gdr_loop.h"

#include <string.h>

#include "gdr_clock.h"

#define POLL_BATCH 16
#define SPINS_BETWEEN_CHECKS 1024

/* wr_id of a signalled request: the QP index and how many messages it completes. */
#define WR_ID(qp_index, covered) (((uint64_t)(qp_index) << 32) | (uint32_t)(covered))
#define WR_QP_INDEX(wr_id) ((uint32_t)((wr_id) >> 32))
#define WR_COVERED(wr_id) ((uint32_t)(wr_id))

struct qp_progress {
    uint64_t target;       /* messages this QP will post in total */
    uint64_t posted;
    uint64_t completed;
    uint64_t unsignaled;   /* messages posted since the last signalled one */
};


struct bw_window {
    int measuring;
    uint64_t start_ns, start_msgs;
    uint64_t end_ns, end_msgs;
    uint64_t peak_ns, peak_msgs;   /* start of the current peak window */
};

static int bw_config_valid(const struct gdr_bw_config *cfg)
{
    return cfg->num_qps >= 1 && cfg->num_qps <= GDR_MAX_QPS && cfg->cq && cfg->msg_size > 0 &&
           cfg->tx_depth >= 1 && cfg->cq_mod >= 1 && cfg->cq_mod <= cfg->tx_depth &&
           cfg->post_list >= 1 && cfg->post_list <= GDR_MAX_POST_LIST &&
           cfg->post_list <= cfg->tx_depth && (cfg->duration_ns > 0 || cfg->iterations > 0) &&
           cfg->slots >= 1 && cfg->stop;
}

static void fail_wc(struct gdr_bw_result *res, const struct ibv_wc *wc)
{
    res->status = GDR_ERR_WC;
    res->wc_status = wc->status;
    res->wc_vendor_err = wc->vendor_err;
    res->wc_qp_num = wc->qp_num;
}

/* Post as many messages on one QP as its send queue has room for, each to its slot. */
static int post_burst(const struct gdr_bw_config *cfg, uint32_t qp_index, struct qp_progress *p,
                      struct ibv_send_wr *wrs, struct ibv_sge *sges, uint32_t *slot,
                      struct gdr_bw_result *res)
{
    unsigned int inline_flag = cfg->msg_size <= cfg->max_inline ? IBV_SEND_INLINE : 0;

    while (p->posted < p->target && p->posted - p->completed < cfg->tx_depth) {
        uint64_t room = cfg->tx_depth - (p->posted - p->completed);
        uint64_t left = p->target - p->posted;
        uint32_t count = cfg->post_list, i;
        struct ibv_send_wr *bad = NULL;

        if (count > room)
            count = (uint32_t)room;
        if (count > left)
            count = (uint32_t)left;
        for (i = 0; i < count; i++) {
            uint64_t number = p->posted + i + 1;
            uint64_t offset = (uint64_t)*slot * cfg->msg_size;
            int signalled = number % cfg->cq_mod == 0 || number == p->target;

            sges[i].addr = cfg->local_addr + offset;
            wrs[i].wr.rdma.remote_addr = cfg->remote_addr + offset;
            if (++*slot == cfg->slots)   /* the next message's slot, over all QPs */
                *slot = 0;

            p->unsignaled++;
            wrs[i].send_flags = (signalled ? IBV_SEND_SIGNALED : 0) | inline_flag;
            wrs[i].wr_id = WR_ID(qp_index, p->unsignaled);
            if (signalled)
                p->unsignaled = 0;
            wrs[i].next = i + 1 < count ? &wrs[i + 1] : NULL;
        }
        /* ibv_post_send returns the error; providers need not set errno. */
        int rc = ibv_post_send(cfg->qps[qp_index], wrs, &bad);
        if (rc) {
            res->status = GDR_ERR_POST;
            res->err_errno = rc;
            return -1;
        }
        p->posted += count;
    }
    return 0;
}

static int all_completed(const struct qp_progress *qps, uint32_t num_qps)
{
    uint32_t q;

    for (q = 0; q < num_qps; q++) {
        if (qps[q].completed < qps[q].target)
            return 0;
    }
    return 1;
}

/* One scatter entry per chained request: each message has its own slot's address. */
static void prepare_wrs(const struct gdr_bw_config *cfg, struct ibv_send_wr *wrs, struct ibv_sge *sges)
{
    uint32_t i;

    memset(wrs, 0, sizeof(*wrs) * cfg->post_list);
    for (i = 0; i < cfg->post_list; i++) {
        sges[i].length = cfg->msg_size;
        sges[i].lkey = cfg->lkey;
        wrs[i].sg_list = &sges[i];
        wrs[i].num_sge = 1;
        wrs[i].opcode = IBV_WR_RDMA_WRITE;
        wrs[i].wr.rdma.rkey = cfg->rkey;
    }
}

/* Advance the measured window and the peak window after completions at time now. */
static void track_window(const struct gdr_bw_config *cfg, struct bw_window *w, struct qp_progress *qps,
                         uint64_t t0, uint64_t now, uint64_t total, double *peak)
{
    uint64_t peak_span = (uint64_t)cfg->tx_depth * cfg->num_qps;
    uint32_t q;

    if (!w->measuring) {
        int warm = cfg->duration_ns ? now - t0 >= cfg->warmup_ns
                                    : total >= cfg->warmup_iterations * cfg->num_qps;
        if (!warm)
            return;
        w->measuring = 1;
        w->start_ns = w->peak_ns = now;
        w->start_msgs = w->peak_msgs = total;
        return;
    }
    if (w->end_ns)
        return;
    if (total - w->peak_msgs >= peak_span && now > w->peak_ns) {
        double rate = (double)(total - w->peak_msgs) * cfg->msg_size * 1e9 / (double)(now - w->peak_ns);
        if (rate > *peak)
            *peak = rate;
        w->peak_ns = now;
        w->peak_msgs = total;
    }
    if (cfg->duration_ns && now - w->start_ns >= cfg->duration_ns) {
        w->end_ns = now;
        w->end_msgs = total;
        /* Stop posting; one more signalled message per QP lets the drain see every write land. */
        for (q = 0; q < cfg->num_qps; q++)
            qps[q].target = qps[q].posted + 1;
    }
}

int gdr_bw_run(const struct gdr_bw_config *cfg, struct gdr_bw_result *res)
{
    struct qp_progress qps[GDR_MAX_QPS];
    struct ibv_send_wr wrs[GDR_MAX_POST_LIST];
    struct ibv_wc wc[POLL_BATCH];
    struct ibv_sge sges[GDR_MAX_POST_LIST];
    uint32_t slot = 0;
    struct bw_window w;
    uint64_t total = 0, t0, last_progress, spins = 0;
    uint32_t q;

    memset(res, 0, sizeof(*res));
    memset(&w, 0, sizeof(w));
    if (!bw_config_valid(cfg)) {
        res->status = GDR_ERR_ARGS;
        return res->status;
    }
    prepare_wrs(cfg, wrs, sges);
    for (q = 0; q < cfg->num_qps; q++) {
        memset(&qps[q], 0, sizeof(qps[q]));
        qps[q].target = cfg->duration_ns ? UINT64_MAX : cfg->iterations + cfg->warmup_iterations;
    }

    t0 = last_progress = gdr_now_ns();
    track_window(cfg, &w, qps, t0, t0, 0, &res->peak_bytes_per_s);
    for (;;) {
        int n, i;

        if (*cfg->stop) {
            res->status = GDR_ERR_STOPPED;
            return res->status;
        }
        for (q = 0; q < cfg->num_qps; q++) {
            if (post_burst(cfg, q, &qps[q], wrs, sges, &slot, res))
                return res->status;
        }
        if (all_completed(qps, cfg->num_qps))
            break;

        n = ibv_poll_cq(cfg->cq, POLL_BATCH, wc);
        if (n < 0) {
            res->status = GDR_ERR_POLL;
            return res->status;
        }
        if (n == 0) {
            if (++spins % SPINS_BETWEEN_CHECKS == 0 &&
                gdr_now_ns() - last_progress > cfg->stall_timeout_ns) {
                res->status = GDR_ERR_STALL;
                return res->status;
            }
            continue;
        }
        for (i = 0; i < n; i++) {
            if (wc[i].status != IBV_WC_SUCCESS) {
                fail_wc(res, &wc[i]);
                return res->status;
            }
            qps[WR_QP_INDEX(wc[i].wr_id)].completed += WR_COVERED(wc[i].wr_id);
            total += WR_COVERED(wc[i].wr_id);
        }
        last_progress = gdr_now_ns();
        track_window(cfg, &w, qps, t0, last_progress, total, &res->peak_bytes_per_s);
    }

    if (!w.end_ns) {   /* iteration mode: the window closes at the last completion */
        w.end_ns = last_progress;
        w.end_msgs = total;
    }
    res->messages = w.end_msgs - w.start_msgs;
    for (q = 0; q < cfg->num_qps; q++)
        res->posted += qps[q].posted;
    res->elapsed_ns = w.end_ns - w.start_ns;
    res->status = GDR_OK;
    return res->status;
}

/* ---- latency ------------------------------------------------------------------ */

/* Bookkeeping of a busy wait: every SPINS_BETWEEN_CHECKS spins, look at the stop flag
 * and the clock. Returns 0 to go on spinning, else the status that ends the wait. */
struct spin {
    uint64_t spins;
    uint64_t started;
};

static int spin_check(struct spin *s, volatile int *stop, uint64_t stall_timeout_ns)
{
    if (++s->spins % SPINS_BETWEEN_CHECKS)
        return GDR_OK;
    if (*stop)
        return GDR_ERR_STOPPED;
    if (!s->started)
        s->started = gdr_now_ns();
    else if (gdr_now_ns() - s->started > stall_timeout_ns)
        return GDR_ERR_STALL;
    return GDR_OK;
}

static int lat_config_valid(const struct gdr_lat_config *cfg)
{
    return cfg->qp && cfg->cq && cfg->recv_buf && cfg->msg_size > 0 && cfg->iterations > 0 &&
           cfg->stop && (!cfg->initiator || cfg->samples_ns);
}

/* Spin until the last byte of the receive buffer carries tag. */
static int wait_for_tag(const struct gdr_lat_config *cfg, uint8_t tag, struct gdr_lat_result *res)
{
    volatile uint8_t *last = cfg->recv_buf + cfg->msg_size - 1;
    struct spin spin = {0, 0};

    while (*last != tag) {
        if ((res->status = spin_check(&spin, cfg->stop, cfg->stall_timeout_ns)))
            return -1;
    }
    return 0;
}

static int wait_for_send(const struct gdr_lat_config *cfg, struct gdr_lat_result *res)
{
    struct ibv_wc wc;
    struct spin spin = {0, 0};
    int n;

    while ((n = ibv_poll_cq(cfg->cq, 1, &wc)) == 0) {
        if ((res->status = spin_check(&spin, cfg->stop, cfg->stall_timeout_ns)))
            return -1;
    }
    if (n < 0) {
        res->status = GDR_ERR_POLL;
        return -1;
    }
    if (wc.status != IBV_WC_SUCCESS) {
        res->status = GDR_ERR_WC;
        res->wc_status = wc.status;
        res->wc_vendor_err = wc.vendor_err;
        return -1;
    }
    return 0;
}

static int send_tag(const struct gdr_lat_config *cfg, struct ibv_send_wr *wr, uint8_t tag,
                    struct gdr_lat_result *res)
{
    struct ibv_send_wr *bad = NULL;
    int rc;

    ((volatile uint8_t *)(uintptr_t)cfg->send_addr)[cfg->msg_size - 1] = tag;
    rc = ibv_post_send(cfg->qp, wr, &bad);
    if (rc) {
        res->status = GDR_ERR_POST;
        res->err_errno = rc;
        return -1;
    }
    return wait_for_send(cfg, res);
}

int gdr_lat_run(const struct gdr_lat_config *cfg, struct gdr_lat_result *res)
{
    struct ibv_sge sge = {.addr = cfg->send_addr, .length = cfg->msg_size, .lkey = cfg->lkey};
    struct ibv_send_wr wr;
    uint64_t i, last_post;

    memset(res, 0, sizeof(*res));
    if (!lat_config_valid(cfg)) {
        res->status = GDR_ERR_ARGS;
        return res->status;
    }
    memset(&wr, 0, sizeof(wr));
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED | (cfg->msg_size <= cfg->max_inline ? IBV_SEND_INLINE : 0);
    wr.wr.rdma.remote_addr = cfg->remote_addr;
    wr.wr.rdma.rkey = cfg->rkey;

    /* One clock read per round trip, between the echo's arrival and the next post: a
     * sample is the time from one post to the next, as perftest times it. */
    last_post = cfg->initiator ? gdr_now_ns() : 0;
    for (i = 0; i < cfg->iterations; i++) {
        uint8_t tag = (uint8_t)(i % 255 + 1);   /* never 0: the buffers start zeroed */

        if (cfg->initiator) {
            uint64_t now;

            if (send_tag(cfg, &wr, tag, res) || wait_for_tag(cfg, tag, res))
                return res->status;
            now = gdr_now_ns();
            cfg->samples_ns[i] = now - last_post;
            last_post = now;
        } else if (wait_for_tag(cfg, tag, res) || send_tag(cfg, &wr, tag, res)) {
            return res->status;
        }
        res->completed = i + 1;
    }
    res->status = GDR_OK;
    return res->status;
}
