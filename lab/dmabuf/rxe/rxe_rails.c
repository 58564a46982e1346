// SPDX-License-Identifier: GPL-2.0-only
/*
 * Rails for Soft-RoCE (the gdrprobe lab's addition to Debian's rdma_rxe; rxe-dmabuf.patch
 * wires it in): what `gdrprobe check --node --all-rails` needs to meet in a guest.
 *
 * 1. A place in the PCI tree. rxe registers its IB device without a parent, so
 *    /sys/class/infiniband/rxeN has no `device` link and neither NCCL (net_ib's
 *    ncclIbGetPciPath, then xml.cc ncclTopoFillNet: "Virtual NIC, no PCI device, attach to
 *    first CPU") nor gdrprobe's doctor can place it. Here a device whose netdev sits on a PCI
 *    function takes that function as its parent, as a PCI RDMA NIC's driver does (mlx5 sets
 *    ib_dev.dev.parent to its PCI device), so both place it where its netdev is.
 *
 * 2. A line rate per rail and one uplink the rails share, for the loopback path. rxe hands a
 *    packet whose destination MAC is its own netdev's straight to its receive path
 *    (rxe_net.c: rxe_prepare sets RXE_LOOPBACK_MASK, rxe_xmit_packet calls rxe_loopback),
 *    so no netdev, qdisc or wire ever sees a node check's traffic. rxe_rails_deliver takes
 *    that hand-over: with rail_mbit each device's packets are serialised at that rate, with
 *    uplink_mbit every device's packets then pass one serialisation at that rate, a tandem
 *    of two token-bucket shapers like a NIC's port behind a PCIe uplink. A packet is held
 *    (not the sender: it is queued and released by an hrtimer in softirq context, where
 *    rxe_rcv runs for a packet off the wire) until both have sent its bytes. Every packet
 *    takes the queue, acknowledgements and READ requests too: one that passed a held WRITE
 *    of its QP would arrive out of sequence and make the requester retry. Both knobs 0 by
 *    default: no queue.
 *    A held request counts against its QP's packets in flight, as one in a netdev's queue
 *    does (rxe_net.c rxe_send and rxe_skb_tx_dtor: skb_out, need_req_skb), so the
 *    requester stops at RXE_INFLIGHT_SKBS_PER_QP_HIGH held: back-pressure, as a NIC's port
 *    gives, rather than a queue that grows until the QP's retransmit time-out.
 *
 * 3. A wire's length, for NCCL's pattern (lab/nccl_pattern.py). delay_us holds every
 *    loopback packet that long on its way, as a wire's one-way delay: a round trip of
 *    2 x delay_us, which NCCL's steps wait for and a deep stream hides. A packet is in the
 *    shapers until its serialisation ends (counted against its QP's packets in flight, as
 *    in a netdev's queue), then on the wire (not counted) until it arrives; none arrives
 *    before the one ahead of it. A wire with a rate (rail_mbit) and a length (delay_us):
 *    the CPU's copies then set neither the stream's rate nor the step time. unacked_psns is how many
 *    packets an RC QP may have unacknowledged (Debian's rxe: RXE_MAX_UNACKED_PSNS, 128, half
 *    a MiB at rxe's 4 KiB MTU): a window of 128 packets caps every QP at 512 KiB a round
 *    trip, where a hardware NIC's transport keeps far more in flight; a delayed wire needs a
 *    window past its bandwidth-delay product. Both 0 and 128 by default: as Debian's.
 *
 * 4. A longer retransmit time-out. An emulated guest on a busy host stalls for tens of
 *    milliseconds now and then; a QP whose acknowledgement a stall delays past its time-out
 *    (gdrprobe asks 4.096 us * 2^14, 67 ms, as perftest does) goes back and sends again, and
 *    the resends take their share of a shaped rail. timeout_scale multiplies every RC QP's
 *    time-out set after it is written (rxe_qp.c computes qp_timeout_jiffies from the QP's
 *    attribute; rxe-dmabuf.patch passes it through rxe_rails_timeout). 1 by default.
 *
 * Emulation, not hardware: the rates are the lab's, the PCI functions are QEMU's.
 */
#include <linux/hrtimer.h>
#include <linux/ktime.h>
#include <linux/moduleparam.h>
#include <linux/pci.h>
#include <linux/skbuff.h>
#include <linux/spinlock.h>

#include "rxe.h"
#include "rxe_loc.h"

static unsigned int rail_mbit;
module_param(rail_mbit, uint, 0644);
MODULE_PARM_DESC(rail_mbit, "lab: each rxe device's loopback line rate in Mbit/s (0: unshaped)");
static unsigned int uplink_mbit;
module_param(uplink_mbit, uint, 0644);
MODULE_PARM_DESC(uplink_mbit, "lab: the rate in Mbit/s every rxe device's loopback shares (0: none)");
static unsigned int delay_us;
module_param(delay_us, uint, 0644);
MODULE_PARM_DESC(delay_us, "lab: microseconds every rxe device's loopback packet spends on its way (0: none)");
static unsigned int unacked_psns = 128;
module_param(unacked_psns, uint, 0644);
MODULE_PARM_DESC(unacked_psns, "lab: packets an RC QP may have unacknowledged (RXE_MAX_UNACKED_PSNS, 128)");
static unsigned int timeout_scale = 1;
module_param(timeout_scale, uint, 0644);
MODULE_PARM_DESC(timeout_scale, "lab: factor on every RC QP's retransmit time-out set after it is written");

/* The most unacknowledged packets unacked_psns may allow: under half the 24-bit PSN space,
 * where psn_compare tells ahead from behind. */
#define RXE_RAILS_MAX_UNACKED (1U << 22)
/* A held skb that counts against its QP's packets in flight (skb->mark, unused on rxe's
 * loopback path until rxe_rcv): rate-shaped ones do, only-delayed ones do not. */
#define RXE_RAILS_HELD_MARK 0x72786521

/* Devices with a rail of their own; more share the last slot's clock (still shaped). */
#define RXE_RAILS_MAX 16

struct rail_clock {
	const struct rxe_dev *rxe;
	ktime_t free_at;	/* when this rail's serialisation is next free */
};

static DEFINE_SPINLOCK(rails_lock);
static struct sk_buff_head held;	/* in the shapers: by their serialisation's end (tstamp) */
static struct sk_buff_head wire;	/* on the wire (delay_us): by their arrival (tstamp) */
static struct rail_clock rails[RXE_RAILS_MAX];
static ktime_t uplink_free_at;
static struct hrtimer release_timer;
static bool stopping;

unsigned long rxe_rails_timeout(unsigned long jiffies)
{
	return jiffies * max(1U, READ_ONCE(timeout_scale));
}

unsigned int rxe_rails_unacked_psns(void)
{
	return clamp(READ_ONCE(unacked_psns), 1U, RXE_RAILS_MAX_UNACKED);
}

void rxe_rails_set_parent(struct rxe_dev *rxe)
{
	struct device *parent = rxe->ndev->dev.parent;

	if (parent && dev_is_pci(parent))
		rxe->ib_dev.dev.parent = parent;
}

static ktime_t *rail_free_at(const struct rxe_dev *rxe)
{
	int slot;

	for (slot = 0; slot < RXE_RAILS_MAX - 1; slot++) {
		if (rails[slot].rxe == rxe || !rails[slot].rxe) {
			rails[slot].rxe = rxe;
			return &rails[slot].free_at;
		}
	}
	return &rails[RXE_RAILS_MAX - 1].free_at;
}

/* The time `bytes` take at `mbit` Mbit/s, in ns. */
static s64 wire_ns(unsigned int bytes, unsigned int mbit)
{
	return mbit ? div_u64((u64)bytes * 8000, mbit) : 0;
}

/* When a packet of `bytes` leaves both serialisations, each starting once it is free. */
static ktime_t release_time(const struct rxe_dev *rxe, unsigned int bytes, ktime_t now)
{
	ktime_t *rail = rail_free_at(rxe);
	ktime_t sent;

	sent = ktime_add_ns(max(now, *rail), wire_ns(bytes, READ_ONCE(rail_mbit)));
	*rail = sent;
	if (READ_ONCE(uplink_mbit)) {
		sent = ktime_add_ns(max(sent, uplink_free_at), wire_ns(bytes, READ_ONCE(uplink_mbit)));
		uplink_free_at = sent;
	}
	return sent;
}

static void hold_in_order(struct sk_buff *skb)
{
	struct sk_buff *before;

	skb_queue_reverse_walk(&held, before) {
		if (ktime_compare(before->tstamp, skb->tstamp) <= 0) {
			__skb_queue_after(&held, before, skb);
			return;
		}
	}
	__skb_queue_head(&held, skb);
}

/* Out of the shapers (or never in one) at skb->tstamp, onto the wire for delay_us, never to
 * arrive before the packet ahead of it: packets keep their order, whatever the knob did
 * meanwhile. */
static void onto_wire(struct sk_buff *skb, unsigned int delay)
{
	struct sk_buff *last = skb_peek_tail(&wire);

	skb->tstamp = ktime_add_us(skb->tstamp, delay);
	if (last && ktime_compare(last->tstamp, skb->tstamp) > 0)
		skb->tstamp = last->tstamp;
	__skb_queue_tail(&wire, skb);
}

/* How late a packet on the wire may arrive so that the timer releases many at once: a
 * fiftieth of the delay, at most RXE_RAILS_MAX_SLACK_NS (an emulated guest takes one timer
 * interrupt per released packet badly). The shapers release on time. */
#define RXE_RAILS_MAX_SLACK_NS (1000 * NSEC_PER_USEC)

static u64 release_slack(void)
{
	return min_t(u64, (u64)READ_ONCE(delay_us) * NSEC_PER_USEC / 50, RXE_RAILS_MAX_SLACK_NS);
}

/* The timer for whichever comes first: a serialisation's end, or an arrival. */
static void arm_for_first(void)
{
	struct sk_buff *shaped = skb_peek(&held), *delayed = skb_peek(&wire);

	if (shaped && (!delayed || ktime_compare(shaped->tstamp, delayed->tstamp) <= 0))
		hrtimer_start(&release_timer, shaped->tstamp, HRTIMER_MODE_ABS_SOFT);
	else if (delayed)
		hrtimer_start_range_ns(&release_timer, delayed->tstamp, release_slack(),
				       HRTIMER_MODE_ABS_SOFT);
}

/* A request in a shaper counts as in flight for the QP that sent it, until serialised: a
 * netdev's queue, not the wire, holds it. */
static void hold_request(struct sk_buff *skb, struct rxe_pkt_info *pkt)
{
	if (pkt->mask & RXE_REQ_MASK) {
		rxe_get(pkt->qp);
		atomic_inc(&pkt->qp->skb_out);
		skb->mark = RXE_RAILS_HELD_MARK;
	}
}

static void release_request(struct sk_buff *skb, struct rxe_pkt_info *pkt)
{
	struct rxe_qp *qp = pkt->qp;

	if (skb->mark != RXE_RAILS_HELD_MARK)
		return;
	skb->mark = 0;
	if (atomic_dec_return(&qp->skb_out) < RXE_INFLIGHT_SKBS_PER_QP_LOW && qp->need_req_skb)
		rxe_sched_task(&qp->req.task);
	rxe_put(qp);
}

static void deliver_all(struct sk_buff_head *due)
{
	struct sk_buff *skb;

	while ((skb = __skb_dequeue(due))) {
		skb->tstamp = 0;
		release_request(skb, SKB_TO_PKT(skb));	/* before rxe_rcv sets pkt->qp to the receiver */
		rxe_rcv(skb);
	}
}

/* Serialised packets leave the shapers (no longer their QP's in flight) onto the wire; the
 * packets that have arrived are delivered. */
static enum hrtimer_restart release_due(struct hrtimer *timer)
{
	struct sk_buff_head sent, due;
	struct sk_buff *skb;
	unsigned long flags;
	ktime_t now = ktime_get();

	__skb_queue_head_init(&sent);
	__skb_queue_head_init(&due);
	spin_lock_irqsave(&rails_lock, flags);
	while ((skb = skb_peek(&held)) && ktime_compare(skb->tstamp, now) <= 0)
		__skb_queue_tail(&sent, __skb_dequeue(&held));
	spin_unlock_irqrestore(&rails_lock, flags);
	skb_queue_walk(&sent, skb)	/* outside the lock: the QP's last put may free it */
		release_request(skb, SKB_TO_PKT(skb));
	spin_lock_irqsave(&rails_lock, flags);
	while ((skb = __skb_dequeue(&sent)))
		onto_wire(skb, READ_ONCE(delay_us));
	while ((skb = skb_peek(&wire)) && ktime_compare(skb->tstamp, now) <= 0)
		__skb_queue_tail(&due, __skb_dequeue(&wire));
	arm_for_first();
	spin_unlock_irqrestore(&rails_lock, flags);
	deliver_all(&due);
	return HRTIMER_NORESTART;
}

void rxe_rails_deliver(struct sk_buff *skb)
{
	struct rxe_pkt_info *pkt = SKB_TO_PKT(skb);
	unsigned long flags;
	bool shaped = READ_ONCE(rail_mbit) || READ_ONCE(uplink_mbit);
	unsigned int delay = READ_ONCE(delay_us);

	if (!shaped && !delay && skb_queue_empty_lockless(&held) &&
	    skb_queue_empty_lockless(&wire)) {
		rxe_rcv(skb);
		return;
	}
	spin_lock_irqsave(&rails_lock, flags);
	if (stopping) {
		spin_unlock_irqrestore(&rails_lock, flags);
		rxe_rcv(skb);
		return;
	}
	skb->mark = 0;
	if (shaped || !skb_queue_empty(&held)) {
		/* unshaped now but packets still in the shapers: behind them, so a QP's order holds */
		skb->tstamp = release_time(pkt->rxe, shaped ? skb->len : 0, ktime_get());
		if (shaped)
			hold_request(skb, pkt);
		hold_in_order(skb);
		if (skb_peek(&held) == skb)
			arm_for_first();
	} else {
		skb->tstamp = ktime_get();
		onto_wire(skb, delay);
		if (skb_peek(&wire) == skb)
			arm_for_first();
	}
	spin_unlock_irqrestore(&rails_lock, flags);
}

void rxe_rails_init(void)
{
	skb_queue_head_init(&held);
	skb_queue_head_init(&wire);
	hrtimer_init(&release_timer, CLOCK_MONOTONIC, HRTIMER_MODE_ABS_SOFT);
	release_timer.function = release_due;
}

/* Before the devices go: every held packet delivered now, none held after. */
void rxe_rails_stop(void)
{
	struct sk_buff_head due;
	unsigned long flags;

	__skb_queue_head_init(&due);
	spin_lock_irqsave(&rails_lock, flags);
	stopping = true;
	spin_unlock_irqrestore(&rails_lock, flags);
	hrtimer_cancel(&release_timer);
	spin_lock_irqsave(&rails_lock, flags);
	skb_queue_splice_init(&held, &due);
	skb_queue_splice_tail_init(&wire, &due);
	spin_unlock_irqrestore(&rails_lock, flags);
	deliver_all(&due);
}
