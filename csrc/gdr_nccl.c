#include "gdr_nccl.h"

#include <arpa/inet.h>
#include <sched.h>
#include <string.h>

#include "gdr_pattern.h"
#include "gdr_wait.h"

#define POLL_BATCH 16

/* wr_id: what completed (kind), on which channel, for which step. */
#define WR_DATA 1ull
#define WR_RECV 2ull
#define WR_CTS 3ull
#define WR_FLUSH 4ull
#define WR_ID(kind, channel, id) (((kind) << 56) | ((uint64_t)(channel) << 48) | ((id) & 0xffffffffffffull))
#define WR_KIND(wr_id) ((wr_id) >> 56)
#define WR_CHANNEL(wr_id) ((uint32_t)(((wr_id) >> 48) & 0xff))
#define WR_STEP(wr_id) ((wr_id) & 0xffffffffffffull)

/* ---- what both loops share -------------------------------------------------------------- */

static int post_failed(struct gdr_nccl_result *res, int rc)
{
    res->status = GDR_ERR_POST;
    res->err_errno = rc;   /* ibv_post_* return the error; providers need not set errno */
    return -1;
}

static int completion_failed(struct gdr_nccl_result *res, const struct ibv_wc *wc)
{
    res->status = GDR_ERR_WC;
    res->wc_status = wc->status;
    res->wc_vendor_err = wc->vendor_err;
    res->wc_qp_num = wc->qp_num;
    return -1;
}

/* Poll one CQ: the completions (at most POLL_BATCH), or -1 with the status set. */
static int poll_some(struct ibv_cq *cq, struct ibv_wc *wc, struct gdr_nccl_result *res)
{
    int n = ibv_poll_cq(cq, POLL_BATCH, wc), i;

    if (n < 0) {
        res->status = GDR_ERR_POLL;
        return -1;
    }
    for (i = 0; i < n; i++) {
        if (wc[i].status != IBV_WC_SUCCESS)
            return completion_failed(res, &wc[i]);
    }
    return n;
}

/* A step's phase, from one read of the clock (from) to a later, distinct one (to): in ns,
 * less the one whole read the interval holds (read_ticks: gdr_clock_span_ns), as the
 * latency loop's samples. */
static void record(uint64_t *out, uint64_t index, const struct gdr_clock *clock,
                   uint64_t read_ticks, uint64_t from, uint64_t to)
{
    if (out)
        out[index] = gdr_clock_span_ns(clock, to - from, read_ticks);
}

/* A phase the step did not have (no flush; its clear-to-send there at the first look): 0,
 * with no read in it to take out. */
static void record_none(uint64_t *out, uint64_t index)
{
    if (out)
        out[index] = 0;
}

/* Where the round's message m lands in the receiver's buffer, and which source slot sends it. */
static uint64_t slot_offset(const struct gdr_nccl_shape *shape, uint64_t m)
{
    return m % ((uint64_t)shape->channels * shape->ring_slots) * shape->step_bytes;
}

static uint64_t source_offset(const struct gdr_nccl_shape *shape, uint64_t m)
{
    return m % ((uint64_t)shape->channels * shape->ring_slots + 1) * shape->step_bytes;
}

/* A connection step's message in the round (either side's config). */
#define MESSAGE(cfg, c, id) gdr_nccl_message((cfg)->first_message, (cfg)->steps, (c), (id) - (cfg)->first_id)

static volatile struct gdr_nccl_fifo_elem *fifo_elem(uint64_t base, uint32_t channel, uint64_t id)
{
    return (volatile struct gdr_nccl_fifo_elem *)(uintptr_t)(
        base + channel * GDR_NCCL_FIFO_BYTES + (id % GDR_NCCL_FIFO_SLOTS) * GDR_NCCL_FIFO_SLOT_BYTES);
}

/* One turn of a side's loop: post what may be posted, take the completions in; sets
 * *progressed when anything moved. Returns 0, or -1 with the status set. */
typedef int (*turn_fn)(const void *cfg, void *state, int *progressed, struct gdr_nccl_result *res);

/* Turn until `total` steps are done, the stop flag is set or nothing moves for stall_ns.
 * A turn in which nothing moved yields the CPU, as NCCL's proxy thread does when a progress
 * pass found nothing to do (src/proxy.cc ncclProxyProgress: std::this_thread::yield(), "No
 * request progressed. Let others run."): a software NIC, or the other side in one process,
 * may need it. */
static int run_turns(const struct gdr_clock *clock, uint64_t stall_ns, volatile int *stop,
                     uint64_t total, turn_fn turn, const void *cfg, void *state,
                     struct gdr_nccl_result *res)
{
    struct gdr_watchdog watch;
    struct gdr_clock_mark mark;

    gdr_watchdog_init(&watch, gdr_clock_ticks_in(clock, stall_ns));
    gdr_clock_mark(clock, &mark);
    while (res->steps < total) {
        int progressed = 0;

        if (*stop) {
            res->status = GDR_ERR_STOPPED;
            return res->status;
        }
        if (turn(cfg, state, &progressed, res))
            return res->status;
        if (progressed) {
            watch.progressed = 1;
            continue;
        }
        if ((res->status = gdr_watchdog_spin(&watch, clock, stop)))
            return res->status;
        sched_yield();
    }
    gdr_check_clock(clock, &mark, &res->clock_check);
    res->status = GDR_OK;
    return res->status;
}

/* ---- the receiver (ncclIbIrecv, ncclIbPostFifo, ncclIbTest, ncclIbIflush) ---------------- */

struct recv_step {
    uint32_t events;              /* immediates still to come */
    int flushed;
    uint64_t cts_at, recv_at, flush_at;
};

struct recv_channel {
    uint64_t posted, received, consumed;   /* steps, in order */
    struct recv_step steps[GDR_NCCL_STEPS];
};

struct recv_state {
    struct recv_channel chs[GDR_NCCL_MAX_CHANNELS];
    uint64_t started, now;        /* the loop's start and its last look at the clock */
    uint64_t read_ticks;          /* one read of the clock (gdr_clock_read_ticks) */
};

static int recv_config_valid(const struct gdr_nccl_recv_config *cfg)
{
    return gdr_nccl_shape_valid(&cfg->shape) && cfg->cq && cfg->steps > 0 &&
           cfg->window >= 1 &&
           cfg->window <= GDR_NCCL_STEPS && cfg->cts_addr && cfg->stop &&
           (!cfg->flush_qp || (cfg->flush_cq && cfg->flush_landing)) &&
           gdr_clock_valid(&cfg->clock);
}

/* Post step `id`'s receives and clear-to-send (the element filled first, as ncclIbIrecv). */
static int post_cts(const struct gdr_nccl_recv_config *cfg, uint32_t c, uint64_t id,
                    struct gdr_nccl_result *res)
{
    const struct gdr_nccl_shape *shape = &cfg->shape;
    struct gdr_nccl_post posts[GDR_NCCL_MAX_POSTS];
    size_t n = gdr_nccl_step_posts(shape, id, 0, posts, GDR_NCCL_MAX_POSTS), i;
    uint64_t elem_addr = (uint64_t)(uintptr_t)fifo_elem(cfg->cts_addr, c, id);
    volatile struct gdr_nccl_fifo_elem *elem = fifo_elem(cfg->cts_addr, c, id);
    struct ibv_recv_wr rwr, *bad_recv = NULL;
    struct ibv_send_wr wr, *bad = NULL;
    struct ibv_sge sge;
    int rc;

    memset(&rwr, 0, sizeof(rwr));   /* no scatter entry: a WRITE with immediate carries its
                                      * bytes to the address it names */
    rwr.wr_id = WR_ID(WR_RECV, c, id);
    memset((void *)elem, 0, sizeof(*elem));
    elem->addr = cfg->ring_addr + slot_offset(shape, MESSAGE(cfg, c, id));
    elem->size = shape->step_bytes;
    elem->rkeys[0] = cfg->ring_rkey;
    elem->nreqs = 1;
    elem->tag = c;
    elem->idx = id + 1;
    for (i = 0; i < n; i++) {
        struct ibv_qp *qp = cfg->qps[c * shape->qps_per_conn + posts[i].qp];

        if (posts[i].verb == GDR_NCCL_RECV) {
            if ((rc = ibv_post_recv(qp, &rwr, &bad_recv)))
                return post_failed(res, rc);
        } else if (posts[i].verb == GDR_NCCL_CTS) {
            sge.addr = elem_addr;
            sge.length = posts[i].length;
            sge.lkey = cfg->cts_lkey;
            memset(&wr, 0, sizeof(wr));
            wr.wr_id = WR_ID(WR_CTS, c, id);
            wr.sg_list = &sge;
            wr.num_sge = 1;
            wr.opcode = IBV_WR_RDMA_WRITE;
            wr.send_flags = (posts[i].signaled ? IBV_SEND_SIGNALED : 0) |
                            (posts[i].inline_ ? IBV_SEND_INLINE : 0);
            wr.wr.rdma.remote_addr = cfg->fifo_addr + ((uint64_t)(uintptr_t)elem - cfg->cts_addr);
            wr.wr.rdma.rkey = cfg->fifo_rkey;
            if ((rc = ibv_post_send(qp, &wr, &bad)))
                return post_failed(res, rc);
        }
    }
    return 0;
}

/* What the flush of step `id` must bring back: the first byte of its message's pattern. */
static uint8_t flush_expected(const struct gdr_nccl_recv_config *cfg, uint32_t c, uint64_t id)
{
    uint64_t source = source_offset(&cfg->shape, MESSAGE(cfg, c, id)) / cfg->shape.step_bytes;

    return gdr_pattern_byte(gdr_slot_seed(cfg->seed, source), 0);
}

static volatile uint8_t *flush_byte(const struct gdr_nccl_recv_config *cfg, uint32_t c, uint64_t id)
{
    return cfg->flush_landing + c * GDR_NCCL_STEPS + id % GDR_NCCL_STEPS;
}

/* ncclIbIflush (the schedule's last verb of a flushed step): a signalled READ of the step's
 * first byte into host memory, on the QP connected to itself. */
static int post_flush(const struct gdr_nccl_recv_config *cfg, uint32_t c, uint64_t id,
                      struct gdr_nccl_result *res)
{
    volatile uint8_t *landing = flush_byte(cfg, c, id);
    struct ibv_sge sge = {.addr = (uint64_t)(uintptr_t)landing, .length = 1, .lkey = cfg->flush_lkey};
    struct ibv_send_wr wr, *bad = NULL;
    int rc;

    *landing = (uint8_t)~flush_expected(cfg, c, id);   /* a READ that lands nothing shows */
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = WR_ID(WR_FLUSH, c, id);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = cfg->ring_addr + slot_offset(&cfg->shape, MESSAGE(cfg, c, id));
    wr.wr.rdma.rkey = cfg->ring_rkey;
    if ((rc = ibv_post_send(cfg->flush_qp, &wr, &bad)))
        return post_failed(res, rc);
    return 0;
}

/* A receive completion: one immediate of its step in, checked to be the step's size. */
static void immediate_in(const struct gdr_nccl_recv_config *cfg, struct recv_channel *ch,
                         const struct ibv_wc *wc, struct gdr_nccl_result *res)
{
    struct recv_step *st = &ch->steps[WR_STEP(wc->wr_id) % GDR_NCCL_STEPS];

    if (wc->opcode != IBV_WC_RECV_RDMA_WITH_IMM || !(wc->wc_flags & IBV_WC_WITH_IMM) ||
        ntohl(wc->imm_data) != cfg->shape.step_bytes)
        res->bad_imm++;
    if (st->events)
        st->events--;
}

/* Channel c's steps in order: received once every immediate is in (then flushed, where
 * asked), consumed once flushed; each consumed step's times recorded. Each time runs between
 * two distinct reads: the clear-to-send's, this turn's look after its poll (rs->now) and a
 * later turn's, as the flush's completion comes in a poll after the turn that posted it. */
static int advance_recv(const struct gdr_nccl_recv_config *cfg, struct recv_state *rs, uint32_t c,
                        struct gdr_nccl_result *res)
{
    struct recv_channel *ch = &rs->chs[c];
    uint64_t steps = cfg->steps, now = rs->now;

    while (ch->received < ch->posted && !ch->steps[(cfg->first_id + ch->received) % GDR_NCCL_STEPS].events) {
        uint64_t id = cfg->first_id + ch->received;
        struct recv_step *st = &ch->steps[id % GDR_NCCL_STEPS];

        st->recv_at = now;
        if (cfg->flush_qp && post_flush(cfg, c, id, res))
            return -1;
        st->flushed = !cfg->flush_qp;
        st->flush_at = now;
        ch->received++;
    }
    while (ch->consumed < ch->received && ch->steps[(cfg->first_id + ch->consumed) % GDR_NCCL_STEPS].flushed) {
        uint64_t k = ch->consumed, index = c * steps + k;
        struct recv_step *st = &ch->steps[(cfg->first_id + k) % GDR_NCCL_STEPS];
        uint64_t done = cfg->flush_qp ? now : st->recv_at;

        record(cfg->step_ns, index, &cfg->clock, rs->read_ticks, st->cts_at, done);
        record(cfg->recv_ns, index, &cfg->clock, rs->read_ticks, st->cts_at, st->recv_at);
        if (cfg->flush_qp)
            record(cfg->flush_ns, index, &cfg->clock, rs->read_ticks, st->flush_at, done);
        else
            record_none(cfg->flush_ns, index);
        ch->consumed++;
        res->steps++;
    }
    return 0;
}

static void flush_in(const struct gdr_nccl_recv_config *cfg, struct recv_channel *chs,
                     const struct ibv_wc *wc, struct gdr_nccl_result *res)
{
    uint32_t c = WR_CHANNEL(wc->wr_id);
    uint64_t id = WR_STEP(wc->wr_id);

    if (*flush_byte(cfg, c, id) != flush_expected(cfg, c, id) && res->flush_bad++ == 0)
        res->first_flush_bad = MESSAGE(cfg, c, id);
    chs[c].steps[id % GDR_NCCL_STEPS].flushed = 1;
}

/* Post every clear-to-send the window allows: GDR_OK, or -1 with the status set. */
static int post_window(const struct gdr_nccl_recv_config *cfg, struct recv_channel *chs,
                       int *progressed, struct gdr_nccl_result *res)
{
    uint32_t c;

    for (c = 0; c < cfg->shape.channels; c++) {
        struct recv_channel *ch = &chs[c];

        while (ch->posted < cfg->steps && ch->posted - ch->consumed < cfg->window) {
            uint64_t id = cfg->first_id + ch->posted;
            struct recv_step *st = &ch->steps[id % GDR_NCCL_STEPS];

            memset(st, 0, sizeof(*st));
            st->events = gdr_nccl_qps_per_step(&cfg->shape);
            st->cts_at = gdr_clock_ticks(&cfg->clock);
            if (post_cts(cfg, c, id, res))
                return -1;
            ch->posted++;
            *progressed = 1;
        }
    }
    return 0;
}

/* The receiver's turn: clear-to-send for every step the window allows, then the
 * immediates and flushes that came in, and the steps they complete, in order. */
static int recv_turn(const void *config, void *state, int *progressed, struct gdr_nccl_result *res)
{
    const struct gdr_nccl_recv_config *cfg = config;
    struct recv_state *st = state;
    struct ibv_wc wc[POLL_BATCH];
    uint32_t c;
    int n, i;

    if (post_window(cfg, st->chs, progressed, res) || (n = poll_some(cfg->cq, wc, res)) < 0)
        return -1;
    for (i = 0; i < n; i++) {
        if (WR_KIND(wc[i].wr_id) == WR_RECV)
            immediate_in(cfg, &st->chs[WR_CHANNEL(wc[i].wr_id)], &wc[i], res);
    }   /* a signalled clear-to-send's completion only drains its send queue */
    if (cfg->flush_qp) {
        int flushed = poll_some(cfg->flush_cq, wc, res);

        if (flushed < 0)
            return -1;
        for (i = 0; i < flushed; i++)
            flush_in(cfg, st->chs, &wc[i], res);
        n += flushed;
    }
    if (n == 0)
        return 0;
    st->now = gdr_clock_ticks(&cfg->clock);
    for (c = 0; c < cfg->shape.channels; c++) {
        if (advance_recv(cfg, st, c, res))
            return -1;
    }
    *progressed = 1;
    return 0;
}

int gdr_nccl_recv_run(const struct gdr_nccl_recv_config *cfg, struct gdr_nccl_result *res)
{
    struct recv_state st;

    memset(res, 0, sizeof(*res));
    if (!recv_config_valid(cfg)) {
        res->status = GDR_ERR_ARGS;
        return res->status;
    }
    memset(&st, 0, sizeof(st));
    st.read_ticks = gdr_clock_read_ticks(&cfg->clock);
    st.started = st.now = gdr_clock_ticks(&cfg->clock);
    if (run_turns(&cfg->clock, cfg->stall_timeout_ns, cfg->stop, cfg->steps * cfg->shape.channels,
                  recv_turn, cfg, &st, res))
        return res->status;
    res->elapsed_ns = (uint64_t)gdr_clock_ns(&cfg->clock, st.now - st.started);   /* first
                                                             * clear-to-send to last consumed */
    return res->status;
}

/* ---- the sender (ncclIbIsend, ncclIbMultiSend, ncclIbTest) -------------------------------- */

struct send_channel {
    uint64_t posted, done;        /* steps, in order */
    uint64_t ready_at;            /* when the next step waited for its clear-to-send; 0: not */
    uint32_t events[GDR_NCCL_STEPS];
    uint64_t posted_at[GDR_NCCL_STEPS];
};

struct send_state {
    struct send_channel chs[GDR_NCCL_MAX_CHANNELS];
    uint64_t first_post, now;     /* the first post and the last completion, in ticks */
    uint64_t read_ticks;          /* one read of the clock (gdr_clock_read_ticks) */
};

static int send_config_valid(const struct gdr_nccl_send_config *cfg)
{
    return gdr_nccl_shape_valid(&cfg->shape) && cfg->cq && cfg->steps > 0 && cfg->fifo &&
           cfg->stop &&
           gdr_clock_valid(&cfg->clock);
}

/* What the receiver posted, checked as ncclIbIsend matches it (one request, this tag, the
 * step's size) and to land inside the receiver's buffer. The address may be 0: a DMA-BUF
 * region's is its offset in the DMA-BUF (NCCL registers the GPU's address as the IOVA). */
static int cts_valid(const struct gdr_nccl_send_config *cfg, uint32_t c,
                     const volatile struct gdr_nccl_fifo_elem *elem)
{
    uint64_t size = cfg->shape.step_bytes;

    return elem->nreqs == 1 && elem->tag == c && elem->size == size &&
           elem->addr >= cfg->remote_addr &&
           elem->addr - cfg->remote_addr <= cfg->remote_length &&
           size <= cfg->remote_length - (elem->addr - cfg->remote_addr);
}

/* Post step `id`'s data as the schedule says: each QP's WRITEs chained in one post. */
static int post_data(const struct gdr_nccl_send_config *cfg, uint32_t c, uint64_t id,
                     const volatile struct gdr_nccl_fifo_elem *elem, struct gdr_nccl_result *res)
{
    const struct gdr_nccl_shape *shape = &cfg->shape;
    struct gdr_nccl_post posts[GDR_NCCL_MAX_POSTS];
    struct ibv_send_wr wrs[2], *bad = NULL;
    struct ibv_sge sges[2];
    size_t n = gdr_nccl_step_posts(shape, id, 0, posts, GDR_NCCL_MAX_POSTS), i;
    uint64_t src = cfg->src_addr + source_offset(shape, MESSAGE(cfg, c, id));
    uint64_t dst = elem->addr, offset = 0;
    uint32_t rkey = elem->rkeys[0], chained = 0;
    int rc;

    for (i = 0; i < n; i++) {
        struct ibv_send_wr *wr = &wrs[chained];

        if (posts[i].verb != GDR_NCCL_DATA && posts[i].verb != GDR_NCCL_DATA_IMM)
            continue;
        memset(wr, 0, sizeof(*wr));
        sges[chained].addr = src + offset;
        sges[chained].length = posts[i].length;
        sges[chained].lkey = cfg->src_lkey;
        wr->sg_list = &sges[chained];
        wr->num_sge = posts[i].length ? 1 : 0;
        wr->wr.rdma.remote_addr = posts[i].length ? dst + offset : 0;
        wr->wr.rdma.rkey = rkey;
        offset += posts[i].length;
        if (posts[i].verb == GDR_NCCL_DATA) {
            wr->opcode = IBV_WR_RDMA_WRITE;
            wr->next = &wrs[1];
            chained = 1;
        } else {
            wr->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
            wr->imm_data = htonl(posts[i].imm);
            wr->send_flags = IBV_SEND_SIGNALED;
            wr->wr_id = WR_ID(WR_DATA, c, id);
            if ((rc = ibv_post_send(cfg->qps[c * shape->qps_per_conn + posts[i].qp], wrs, &bad)))
                return post_failed(res, rc);
            chained = 0;
        }
    }
    return 0;
}

/* Post each of channel c's steps whose clear-to-send has come, in order, NCCL_STEPS in
 * flight at most. The wait runs from the read at the first look that found no clear-to-send
 * to the read at the look that found it: two distinct reads, or no wait at all. */
static int send_ready(const struct gdr_nccl_send_config *cfg, struct send_state *ss, uint32_t c,
                      int *progressed, struct gdr_nccl_result *res)
{
    struct send_channel *ch = &ss->chs[c];

    while (ch->posted < cfg->steps && ch->posted - ch->done < GDR_NCCL_STEPS) {
        uint64_t id = cfg->first_id + ch->posted, now;
        volatile struct gdr_nccl_fifo_elem *elem = fifo_elem((uint64_t)(uintptr_t)cfg->fifo, c, id);

        if (elem->idx != id + 1) {
            if (!ch->ready_at)
                ch->ready_at = gdr_clock_ticks(&cfg->clock);
            return 0;
        }
        __atomic_thread_fence(__ATOMIC_SEQ_CST);   /* idx before the fields it guards */
        if (!cts_valid(cfg, c, elem)) {
            res->status = GDR_ERR_PROTOCOL;
            return -1;
        }
        now = gdr_clock_ticks(&cfg->clock);
        if (ch->ready_at)
            record(cfg->wait_ns, c * cfg->steps + ch->posted, &cfg->clock, ss->read_ticks,
                   ch->ready_at, now);
        else
            record_none(cfg->wait_ns, c * cfg->steps + ch->posted);
        if (post_data(cfg, c, id, elem, res))
            return -1;
        ch->events[id % GDR_NCCL_STEPS] = gdr_nccl_qps_per_step(&cfg->shape);
        ch->posted_at[id % GDR_NCCL_STEPS] = now;
        ch->ready_at = 0;
        ch->posted++;
        *progressed = 1;
    }
    return 0;
}

/* The sender's turn: every step whose clear-to-send has come, then the completions of its
 * WRITEs with immediate, and the steps they complete, in order. */
static int send_turn(const void *config, void *state, int *progressed, struct gdr_nccl_result *res)
{
    const struct gdr_nccl_send_config *cfg = config;
    struct send_state *st = state;
    struct ibv_wc wc[POLL_BATCH];
    uint32_t c;
    int n, i;

    for (c = 0; c < cfg->shape.channels; c++) {
        if (send_ready(cfg, st, c, progressed, res))
            return -1;
        if (!st->first_post && st->chs[c].posted)
            st->first_post = st->chs[c].posted_at[cfg->first_id % GDR_NCCL_STEPS];
    }
    if ((n = poll_some(cfg->cq, wc, res)) <= 0)
        return n;
    st->now = gdr_clock_ticks(&cfg->clock);
    for (i = 0; i < n; i++) {
        struct send_channel *ch = &st->chs[WR_CHANNEL(wc[i].wr_id)];
        uint32_t *events = &ch->events[WR_STEP(wc[i].wr_id) % GDR_NCCL_STEPS];

        if (*events)
            (*events)--;
    }
    for (c = 0; c < cfg->shape.channels; c++) {
        struct send_channel *ch = &st->chs[c];

        while (ch->done < ch->posted && !ch->events[(cfg->first_id + ch->done) % GDR_NCCL_STEPS]) {
            uint64_t at = ch->posted_at[(cfg->first_id + ch->done) % GDR_NCCL_STEPS];

            record(cfg->data_ns, c * cfg->steps + ch->done, &cfg->clock, st->read_ticks, at,
                   st->now);   /* the post's read, then this turn's look after its poll */
            ch->done++;
            res->steps++;
        }
    }
    *progressed = 1;
    return 0;
}

int gdr_nccl_send_run(const struct gdr_nccl_send_config *cfg, struct gdr_nccl_result *res)
{
    struct send_state st;

    memset(res, 0, sizeof(*res));
    if (!send_config_valid(cfg)) {
        res->status = GDR_ERR_ARGS;
        return res->status;
    }
    memset(&st, 0, sizeof(st));
    st.read_ticks = gdr_clock_read_ticks(&cfg->clock);
    if (run_turns(&cfg->clock, cfg->stall_timeout_ns, cfg->stop, cfg->steps * cfg->shape.channels,
                  send_turn, cfg, &st, res))
        return res->status;
    res->elapsed_ns = (uint64_t)gdr_clock_ns(&cfg->clock, st.now - st.first_post);
    return res->status;
}
