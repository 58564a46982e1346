#include "gdr_loop.h"

#include <arpa/inet.h>
#include <string.h>

#include "gdr_pattern.h"
#include "gdr_wait.h"

#define POLL_BATCH 16

/* wr_id of a signalled request: the QP index and how many messages it completes. */
#define WR_ID(qp_index, covered) (((uint64_t)(qp_index) << 32) | (uint32_t)(covered))
#define WR_QP_INDEX(wr_id) ((uint32_t)((wr_id) >> 32))
#define WR_COVERED(wr_id) ((uint32_t)(wr_id))

struct qp_progress {
    uint64_t target;       /* messages this QP will post in total */
    uint64_t pass_limit;   /* ... and by the end of the current pass (UINT64_MAX: no passes) */
    uint64_t posted;
    uint64_t completed;
    uint64_t unsignaled;   /* messages posted since the last signalled one */
};


/* The measured window and the current peak window, in ticks of the run's clock. */
struct bw_window {
    uint64_t warmup_ticks, duration_ticks;
    int measuring;
    uint64_t start, start_msgs;
    uint64_t end, end_msgs;
    uint64_t peak_start, peak_msgs;
};

static int bw_config_valid(const struct gdr_bw_config *cfg)
{
    return cfg->num_qps >= 1 && cfg->num_qps <= GDR_MAX_QPS && cfg->cq && cfg->msg_size > 0 &&
           cfg->tx_depth >= 1 && cfg->cq_mod >= 1 && cfg->cq_mod <= cfg->tx_depth &&
           cfg->post_list >= 1 && cfg->post_list <= GDR_MAX_POST_LIST &&
           cfg->post_list <= cfg->tx_depth && (cfg->duration_ns > 0 || cfg->iterations > 0) &&
           cfg->slots >= 1 && cfg->src_slots >= cfg->slots && cfg->stop &&
           gdr_clock_valid(&cfg->clock);
}

static void fail_wc(struct gdr_bw_result *res, const struct ibv_wc *wc)
{
    res->status = GDR_ERR_WC;
    res->wc_status = wc->status;
    res->wc_vendor_err = wc->vendor_err;
    res->wc_qp_num = wc->qp_num;
}

/* What a QP posts before it stops: its messages, or those of the current pass. */
static uint64_t qp_limit(const struct qp_progress *p)
{
    return p->target < p->pass_limit ? p->target : p->pass_limit;
}

/* Where the round's next message comes from and goes to (see gdr_bw_config.slots). */
struct slot_cursor {
    uint32_t dst, src;
};

/* Post as many messages on one QP as its send queue has room for, each to its slot. */
static int post_burst(const struct gdr_bw_config *cfg, uint32_t qp_index, struct qp_progress *p,
                      struct ibv_send_wr *wrs, struct ibv_sge *sges, struct slot_cursor *slot,
                      struct gdr_bw_result *res)
{
    /* A READ carries no data of its own: never inline. */
    unsigned int inline_flag = !cfg->read && cfg->msg_size <= cfg->max_inline ? IBV_SEND_INLINE : 0;
    uint64_t limit = qp_limit(p);

    while (p->posted < limit && p->posted - p->completed < cfg->tx_depth) {
        uint64_t room = cfg->tx_depth - (p->posted - p->completed);
        uint64_t left = limit - p->posted;
        uint32_t count = cfg->post_list, i;
        struct ibv_send_wr *bad = NULL;

        if (count > room)
            count = (uint32_t)room;
        if (count > left)
            count = (uint32_t)left;
        for (i = 0; i < count; i++) {
            uint64_t number = p->posted + i + 1;
            /* The last message before the QP stops is signalled: its completion is the
             * QP's last, and the drain (or the pass) waits for it. */
            int signalled = number % cfg->cq_mod == 0 || number == limit;

            /* A WRITE sends from a local source slot to a remote slot; a READ fetches
             * from a remote source slot into a local slot. */
            uint64_t src = (uint64_t)slot->src * cfg->msg_size;
            uint64_t dst = (uint64_t)slot->dst * cfg->msg_size;

            sges[i].addr = cfg->local_addr + (cfg->read ? dst : src);
            wrs[i].wr.rdma.remote_addr = cfg->remote_addr + (cfg->read ? src : dst);
            if (++slot->dst == cfg->slots)   /* the next message's slots, over all QPs */
                slot->dst = 0;
            if (++slot->src == cfg->src_slots)
                slot->src = 0;

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

static int pass_completed(const struct qp_progress *qps, uint32_t num_qps)
{
    uint32_t q;

    for (q = 0; q < num_qps; q++) {
        if (qps[q].completed < qp_limit(&qps[q]))
            return 0;
    }
    return 1;
}

/* The round's messages are dealt to the QPs in turn, message k to QP k mod num_qps: of the
 * first `end`, QP q sends this many. Each pass so ends with `slots` messages sent in all,
 * however many QPs, and every QP sends in a run of more passes than QPs. */
static uint64_t qp_share(uint64_t end, uint32_t q, uint32_t num_qps)
{
    return (end + num_qps - 1 - q) / num_qps;
}

static uint64_t total_posted(const struct qp_progress *qps, uint32_t num_qps)
{
    uint64_t posted = 0;
    uint32_t q;

    for (q = 0; q < num_qps; q++)
        posted += qps[q].posted;
    return posted;
}

/* Let the QPs post the messages of pass `pass` (all of theirs when there are no passes). */
static void open_pass(const struct gdr_bw_config *cfg, struct qp_progress *qps, uint64_t pass)
{
    uint32_t q;

    for (q = 0; q < cfg->num_qps; q++)
        qps[q].pass_limit = cfg->pass_end ? qp_share((pass + 1) * cfg->slots, q, cfg->num_qps)
                                          : UINT64_MAX;
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
        wrs[i].opcode = cfg->read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
        wrs[i].wr.rdma.rkey = cfg->rkey;
    }
}

/* Whether a duration-mode warm-up or window has completed the messages that bound it. */
static int window_full(const struct gdr_bw_config *cfg, uint64_t messages)
{
    return cfg->window_messages && messages >= cfg->window_messages;
}

/* Advance the measured window and the peak window after completions. The clock is read
 * only when a window may open or close: at the end of the warm-up, when a peak window of
 * tx_depth x QPs messages is complete, and (duration mode) to see whether time is up; a
 * duration-mode warm-up or window also ends early once it holds window_messages. */
static void track_window(const struct gdr_bw_config *cfg, struct bw_window *w, struct qp_progress *qps,
                         uint64_t t0, uint64_t total, double *peak)
{
    uint64_t peak_span = (uint64_t)cfg->tx_depth * cfg->num_qps;
    int peak_due;
    uint64_t now;
    uint32_t q;

    if (!w->measuring) {
        if (!cfg->duration_ns && total < cfg->warmup_iterations * cfg->num_qps)
            return;
        now = gdr_clock_ticks(&cfg->clock);
        if (cfg->duration_ns && now - t0 < w->warmup_ticks && !window_full(cfg, total))
            return;
        w->measuring = 1;
        w->start = w->peak_start = now;
        w->start_msgs = w->peak_msgs = total;
        return;
    }
    if (w->end)
        return;
    peak_due = total - w->peak_msgs >= peak_span;
    if (!peak_due && !cfg->duration_ns)
        return;
    now = gdr_clock_ticks(&cfg->clock);
    if (peak_due && now > w->peak_start) {
        double rate = (double)(total - w->peak_msgs) * cfg->msg_size * 1e9 /
                      gdr_clock_ns(&cfg->clock, now - w->peak_start);
        if (rate > *peak)
            *peak = rate;
        w->peak_start = now;
        w->peak_msgs = total;
    }
    if (cfg->duration_ns && (now - w->start >= w->duration_ticks ||
                             window_full(cfg, total - w->start_msgs))) {
        w->end = now;
        w->end_msgs = total;
        /* Stop posting; one more signalled message per QP lets the drain see every write
         * land. In passes, the current pass is finished instead, so its check is whole. */
        for (q = 0; q < cfg->num_qps; q++)
            qps[q].target = cfg->pass_end ? qp_limit(&qps[q]) : qps[q].posted + 1;
    }
}

/* The pass check, between passes with nothing in flight. Its time is the check's, not the
 * link's: the warm-up and the window go on where they stopped, and the peak window starts
 * afresh (the queues drained for the check). */
static int end_pass(const struct gdr_bw_config *cfg, struct bw_window *w, struct gdr_watchdog *watch,
                    uint64_t *t0, uint64_t pass, uint64_t messages, uint64_t total,
                    struct gdr_bw_result *res)
{
    uint64_t before = gdr_clock_ticks(&cfg->clock), after, paused;
    int rc = cfg->pass_end(cfg->pass_ctx, pass, messages);

    after = gdr_clock_ticks(&cfg->clock);
    paused = after - before;
    res->passes++;
    res->paused_ns += (uint64_t)gdr_clock_ns(&cfg->clock, paused);
    *t0 += paused;
    if (w->measuring && !w->end)
        w->start += paused;
    w->peak_start = after;
    w->peak_msgs = total;
    watch->progressed = 1;
    if (rc) {
        res->status = GDR_ERR_PASS;
        return -1;
    }
    return 0;
}

int gdr_bw_run(const struct gdr_bw_config *cfg, struct gdr_bw_result *res)
{
    struct qp_progress qps[GDR_MAX_QPS];
    struct ibv_send_wr wrs[GDR_MAX_POST_LIST];
    struct ibv_wc wc[POLL_BATCH];
    struct ibv_sge sges[GDR_MAX_POST_LIST];
    struct slot_cursor slot = {0, 0};
    struct bw_window w;
    struct gdr_watchdog watch;
    struct gdr_clock_mark mark;
    uint64_t total = 0, t0, pass = 0, pass_first = 0;
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
    open_pass(cfg, qps, pass);
    w.warmup_ticks = gdr_clock_ticks_in(&cfg->clock, cfg->warmup_ns);
    w.duration_ticks = gdr_clock_ticks_in(&cfg->clock, cfg->duration_ns);
    gdr_watchdog_init(&watch, gdr_clock_ticks_in(&cfg->clock, cfg->stall_timeout_ns));

    gdr_clock_mark(&cfg->clock, &mark);
    t0 = mark.ticks;
    track_window(cfg, &w, qps, t0, 0, &res->peak_bytes_per_s);
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
        if (pass_completed(qps, cfg->num_qps)) {
            int last = all_completed(qps, cfg->num_qps);
            uint64_t posted = total_posted(qps, cfg->num_qps);

            if (last && !w.end) {   /* iteration mode: the window closes at the last completion */
                w.end = gdr_clock_ticks(&cfg->clock);
                w.end_msgs = total;
            }
            if (cfg->pass_end && end_pass(cfg, &w, &watch, &t0, pass, posted - pass_first,
                                          total, res))
                return res->status;
            if (last)
                break;
            pass_first = posted;
            open_pass(cfg, qps, ++pass);
            continue;
        }

        n = ibv_poll_cq(cfg->cq, POLL_BATCH, wc);
        if (n < 0) {
            res->status = GDR_ERR_POLL;
            return res->status;
        }
        if (n == 0) {
            if ((res->status = gdr_watchdog_spin(&watch, &cfg->clock, cfg->stop)))
                return res->status;
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
        watch.progressed = 1;
        track_window(cfg, &w, qps, t0, total, &res->peak_bytes_per_s);
    }

    gdr_check_clock(&cfg->clock, &mark, &res->clock_check);
    res->messages = w.end_msgs - w.start_msgs;
    res->posted = total_posted(qps, cfg->num_qps);
    res->elapsed_ns = (uint64_t)gdr_clock_ns(&cfg->clock, w.end - w.start);
    res->status = GDR_OK;
    return res->status;
}

/* ---- latency ------------------------------------------------------------------ */

static int lat_config_valid(const struct gdr_lat_config *cfg)
{
    /* With immediate the loop never reads its buffer, whose address may be a DMA-BUF
     * region's IOVA (0 for a fresh one). */
    return cfg->qp && cfg->cq && (cfg->recv_buf || cfg->imm) && cfg->msg_size > 0 &&
           cfg->iterations > 0 &&
           cfg->stop && (!cfg->initiator || cfg->samples_ns) && (!cfg->read || cfg->initiator) &&
           !(cfg->read && cfg->imm) && (!cfg->imm || cfg->slots >= 1) && gdr_clock_valid(&cfg->clock);
}

/* Spin until the last byte of the receive buffer carries tag. */
static int wait_for_tag(const struct gdr_lat_config *cfg, uint64_t stall_ticks, uint8_t tag,
                        struct gdr_lat_result *res)
{
    volatile uint8_t *last = cfg->recv_buf + cfg->msg_size - 1;
    struct gdr_watchdog watch;

    gdr_watchdog_init(&watch, stall_ticks);
    while (*last != tag) {
        if ((res->status = gdr_watchdog_spin(&watch, &cfg->clock, cfg->stop)))
            return -1;
    }
    return 0;
}

static int wait_for_send(const struct gdr_lat_config *cfg, uint64_t stall_ticks,
                         struct gdr_lat_result *res)
{
    struct ibv_wc wc;
    struct gdr_watchdog watch;
    int n;

    gdr_watchdog_init(&watch, stall_ticks);
    while ((n = ibv_poll_cq(cfg->cq, 1, &wc)) == 0) {
        if ((res->status = gdr_watchdog_spin(&watch, &cfg->clock, cfg->stop)))
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
        res->wc_qp_num = wc.qp_num;
        return -1;
    }
    return 0;
}

static int send_tag(const struct gdr_lat_config *cfg, uint64_t stall_ticks,
                    struct ibv_send_wr *wr, uint8_t tag, struct gdr_lat_result *res)
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
    return wait_for_send(cfg, stall_ticks, res);
}

/* Check the message that has just arrived: all but its last byte (the tag) carry the
 * round's pattern. Every message is checked: a path that corrupts some is caught. A READ's
 * landing is checked the same way over all its length (a READ has no tag). */
static void verify_received(const struct gdr_lat_config *cfg, size_t length,
                            struct gdr_lat_result *res)
{
    size_t first = 0;
    size_t bad = gdr_pattern_verify((const uint8_t *)(uintptr_t)cfg->recv_buf, length,
                                    cfg->seed, &first);

    if (!bad)
        return;
    if (!res->bad_bytes)
        res->first_bad_offset = first;
    res->bad_messages++;
    res->bad_bytes += bad;
}

/* The initiator's samples, taken in ticks of the run's clock, in nanoseconds (the
 * responder takes none), less the one read of the clock each holds (read_ticks,
 * gdr_clock_read_ticks), which is the clock's time, not the path's. */
static void samples_to_ns(const struct gdr_lat_config *cfg, uint64_t read_ticks)
{
    uint64_t i;

    if (!cfg->initiator)
        return;
    for (i = 0; i < cfg->iterations; i++)
        cfg->samples_ns[i] = gdr_clock_span_ns(&cfg->clock, cfg->samples_ns[i], read_ticks);
}

/* READ latency as perftest's ib_read_lat measures it (run_iter_lat in perftest_resources.c:
 * one signalled READ posted, its completion polled): the sample is the post to the
 * completion. Before each post, outside the sample, the first and last landing bytes are set
 * to the complement of what the READ must bring (so a READ that lands nothing shows); after
 * it, every byte is checked. */
static int read_lat_run(const struct gdr_lat_config *cfg, struct ibv_send_wr *wr,
                        uint64_t stall_ticks, struct gdr_lat_result *res)
{
    volatile uint8_t *landing = cfg->recv_buf;
    uint8_t first = gdr_pattern_byte(cfg->seed, 0);
    uint8_t last = gdr_pattern_byte(cfg->seed, cfg->msg_size - 1);
    struct ibv_send_wr *bad = NULL;
    uint64_t i, posted;
    int rc;

    for (i = 0; i < cfg->iterations; i++) {
        landing[0] = (uint8_t)~first;
        landing[cfg->msg_size - 1] = (uint8_t)~last;
        posted = gdr_clock_ticks(&cfg->clock);
        rc = ibv_post_send(cfg->qp, wr, &bad);
        if (rc) {
            res->status = GDR_ERR_POST;
            res->err_errno = rc;
            return -1;
        }
        if (wait_for_send(cfg, stall_ticks, res))
            return -1;
        cfg->samples_ns[i] = gdr_clock_ticks(&cfg->clock) - posted;   /* ticks until the end */
        verify_received(cfg, cfg->msg_size, res);
        res->completed = i + 1;
    }
    return 0;
}

/* ---- RDMA WRITE with immediate: the ping-pong on completions ---------------------------- */

#define IMM_RECV_WR_ID 0x696d6d72ull   /* "immr": a receive; sends carry 0 */

struct imm_progress {
    uint64_t sends, recvs;   /* completions seen in this pass */
};

static int post_recv(const struct gdr_lat_config *cfg, struct gdr_lat_result *res)
{
    struct ibv_recv_wr wr, *bad = NULL;
    int rc;

    memset(&wr, 0, sizeof(wr));   /* no scatter entry: a WRITE with immediate carries its
                                    * bytes to the address it names, the receive only the
                                    * immediate */
    wr.wr_id = IMM_RECV_WR_ID;
    rc = ibv_post_recv(cfg->qp, &wr, &bad);
    if (rc) {
        res->status = GDR_ERR_POST;
        res->err_errno = rc;
        return -1;
    }
    return 0;
}

/* One completion: a send, or a receive whose immediate must be the next message's number
 * (else the message is counted bad) and which is replaced by a new receive at once. */
static int imm_completion(const struct gdr_lat_config *cfg, const struct ibv_wc *wc,
                          struct imm_progress *p, struct gdr_lat_result *res)
{
    if (wc->status != IBV_WC_SUCCESS) {
        res->status = GDR_ERR_WC;
        res->wc_status = wc->status;
        res->wc_vendor_err = wc->vendor_err;
        res->wc_qp_num = wc->qp_num;
        return -1;
    }
    if (wc->wr_id != IMM_RECV_WR_ID) {
        p->sends++;
        return 0;
    }
    p->recvs++;
    if (!(wc->wc_flags & IBV_WC_WITH_IMM) || ntohl(wc->imm_data) != (uint32_t)(cfg->first + p->recvs)) {
        /* The immediate is the message's tag: a wrong one is a wrong message, its 4 bytes
         * wrong bytes (past the payload: the offset of a bad byte in it, if any, stays). */
        res->bad_messages++;
        if (!res->bad_bytes)
            res->first_bad_offset = cfg->msg_size;
        res->bad_bytes += sizeof(uint32_t);
    }
    return post_recv(cfg, res);
}

/* Poll until this pass has seen `sends` send and `recvs` receive completions. */
static int imm_wait(const struct gdr_lat_config *cfg, uint64_t stall_ticks, uint64_t sends,
                    uint64_t recvs, struct imm_progress *p, struct gdr_lat_result *res)
{
    struct ibv_wc wc[2];
    struct gdr_watchdog watch;
    int n, i;

    gdr_watchdog_init(&watch, stall_ticks);
    while (p->sends < sends || p->recvs < recvs) {
        n = ibv_poll_cq(cfg->cq, 2, wc);
        if (n < 0) {
            res->status = GDR_ERR_POLL;
            return -1;
        }
        if (n == 0) {
            if ((res->status = gdr_watchdog_spin(&watch, &cfg->clock, cfg->stop)))
                return -1;
            continue;
        }
        for (i = 0; i < n; i++) {
            if (imm_completion(cfg, &wc[i], p, res))
                return -1;
        }
        watch.progressed = 1;
    }
    return 0;
}

/* The pass's message i: to its slot of the peer's buffer, its number as the immediate. */
static int imm_post(const struct gdr_lat_config *cfg, struct ibv_send_wr *wr, uint64_t i,
                    struct gdr_lat_result *res)
{
    struct ibv_send_wr *bad = NULL;
    uint64_t number = cfg->first + i + 1;
    int rc;

    wr->wr.rdma.remote_addr = cfg->remote_addr + ((number - 1) % cfg->slots) * cfg->msg_size;
    wr->imm_data = htonl((uint32_t)number);
    rc = ibv_post_send(cfg->qp, wr, &bad);
    if (rc) {
        res->status = GDR_ERR_POST;
        res->err_errno = rc;
        return -1;
    }
    return 0;
}

/* The ping-pong of WRITEs with immediate (perftest's ib_write_lat --write_with_imm): the
 * initiator's sample is from its post to the echo's receive completion; the responder
 * answers each receive, once its previous echo has completed (one send in flight). The
 * buffers are never touched by the CPU: the caller checks the slots after the pass. */
static int imm_lat_run(const struct gdr_lat_config *cfg, struct ibv_send_wr *wr,
                       uint64_t stall_ticks, struct gdr_lat_result *res)
{
    struct imm_progress p = {0, 0};
    uint64_t i, posted;

    if (cfg->post_recv && post_recv(cfg, res))
        return -1;
    for (i = 0; i < cfg->iterations; i++) {
        if (cfg->initiator) {
            posted = gdr_clock_ticks(&cfg->clock);
            if (imm_post(cfg, wr, i, res) || imm_wait(cfg, stall_ticks, 0, i + 1, &p, res))
                return -1;
            cfg->samples_ns[i] = gdr_clock_ticks(&cfg->clock) - posted;
            if (imm_wait(cfg, stall_ticks, i + 1, i + 1, &p, res))
                return -1;
        } else if (imm_wait(cfg, stall_ticks, i, i + 1, &p, res) || imm_post(cfg, wr, i, res)) {
            return -1;
        }
        res->completed = i + 1;
    }
    return imm_wait(cfg, stall_ticks, cfg->iterations, cfg->iterations, &p, res);
}

int gdr_lat_run(const struct gdr_lat_config *cfg, struct gdr_lat_result *res)
{
    struct ibv_sge sge = {.addr = cfg->send_addr, .length = cfg->msg_size, .lkey = cfg->lkey};
    struct ibv_send_wr wr;
    struct gdr_clock_mark mark;
    uint64_t i, last_post, stall_ticks, read_ticks;

    memset(res, 0, sizeof(*res));
    if (!lat_config_valid(cfg)) {
        res->status = GDR_ERR_ARGS;
        return res->status;
    }
    read_ticks = cfg->initiator ? gdr_clock_read_ticks(&cfg->clock) : 0;
    memset(&wr, 0, sizeof(wr));
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = cfg->read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED |
                    (!cfg->read && cfg->msg_size <= cfg->max_inline ? IBV_SEND_INLINE : 0);
    wr.wr.rdma.remote_addr = cfg->remote_addr;
    wr.wr.rdma.rkey = cfg->rkey;
    stall_ticks = gdr_clock_ticks_in(&cfg->clock, cfg->stall_timeout_ns);   /* once, not per wait */
    if (cfg->imm)
        wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    if (cfg->read || cfg->imm) {
        if (cfg->read)
            sge.addr = (uint64_t)(uintptr_t)cfg->recv_buf;   /* the READ lands where it is checked */
        gdr_clock_mark(&cfg->clock, &mark);
        if (cfg->read ? read_lat_run(cfg, &wr, stall_ticks, res)
                      : imm_lat_run(cfg, &wr, stall_ticks, res))
            return res->status;
        gdr_check_clock(&cfg->clock, &mark, &res->clock_check);
        samples_to_ns(cfg, read_ticks);
        res->status = GDR_OK;
        return res->status;
    }

    /* A sample is the time from one post to the next, as perftest times it (tposted[],
     * read just before each post in perftest_resources.c run_iter_lat_write), less the
     * check of the echo: the clock is read when the echo has arrived and again after its
     * check, just before the next post. The responder checks each message after its
     * reply is on its way, while the initiator checks the echo: off the round trip. A
     * message landing during the responder's check carries the same bytes but its tag. */
    gdr_clock_mark(&cfg->clock, &mark);
    last_post = mark.ticks;
    for (i = 0; i < cfg->iterations; i++) {
        uint8_t tag = (uint8_t)(i % 255 + 1);   /* never 0: the buffers start zeroed */

        if (cfg->initiator) {
            uint64_t now;

            if (send_tag(cfg, stall_ticks, &wr, tag, res) ||
                wait_for_tag(cfg, stall_ticks, tag, res))
                return res->status;
            now = gdr_clock_ticks(&cfg->clock);
            cfg->samples_ns[i] = now - last_post;   /* ticks until the run ends */
            verify_received(cfg, cfg->msg_size - 1, res);
            last_post = gdr_clock_ticks(&cfg->clock);
        } else {
            if (wait_for_tag(cfg, stall_ticks, tag, res) ||
                send_tag(cfg, stall_ticks, &wr, tag, res))
                return res->status;
            verify_received(cfg, cfg->msg_size - 1, res);
        }
        res->completed = i + 1;
    }
    gdr_check_clock(&cfg->clock, &mark, &res->clock_check);
    samples_to_ns(cfg, read_ticks);
    res->status = GDR_OK;
    return res->status;
}
