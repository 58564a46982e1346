// SPDX-License-Identifier: GPL-2.0-only
/*
 * dma-buf registration for Soft-RoCE (the gdrprobe lab's addition to Debian's rdma_rxe;
 * rxe-dmabuf.patch wires it in).
 *
 * Two parts:
 *
 * 1. A DMA device for rxe. The pinned dma-buf import attaches with the IB device's
 *    dma_device (drivers/infiniband/core/umem_dmabuf.c: dma_buf_dynamic_attach(dmabuf,
 *    device->dma_device, ...)), and dma_buf_dynamic_attach refuses a NULL device
 *    (drivers/dma-buf/dma-buf.c). rxe registers without one, so ib_uses_virt_dma() makes
 *    the core put kernel virtual addresses where DMA addresses go (include/rdma/ib_verbs.h),
 *    and rxe reads and writes through them. Here rxe registers with a device whose DMA
 *    mapping operations do exactly that (a DMA address is the page's kernel virtual
 *    address), so every existing path keeps its meaning and an exporter's dma_map_sgtable()
 *    for this device hands rxe addresses it can use.
 *
 * 2. reg_user_mr_dmabuf: ib_umem_dmabuf_get_pinned() (the kernel's pinned import: attach,
 *    pin, map, trimmed to [offset, offset + length)), then rxe's page map from the mapped
 *    scatterlist's DMA addresses.
 *
 * 3. Two fault knobs that make a dma-buf-backed MR slower, as a platform whose peer-to-peer
 *    path is slow would (rxe-dmabuf.patch calls rxe_dmabuf_delay from the responder):
 *    dmabuf_delay_us holds every message that lands in, or is read from, a dma-buf MR this
 *    long once (added latency, which a long message hides); dmabuf_read_delay_us holds every
 *    packet of an RDMA READ response read from one (PCIe peer reads slower than writes,
 *    which costs READ bandwidth). Both 0 by default, writable at run time under
 *    /sys/module/rdma_rxe/parameters/.
 *
 * Host pages sit behind any dma-buf this sees in the lab: it exercises the import path, not
 * PCIe peer-to-peer.
 */
#include <linux/delay.h>
#include <linux/dma-map-ops.h>
#include <linux/moduleparam.h>
#include <linux/scatterlist.h>
#include <rdma/ib_umem.h>

#include "rxe.h"
#include "rxe_loc.h"

static unsigned int dmabuf_delay_us;
module_param(dmabuf_delay_us, uint, 0644);
MODULE_PARM_DESC(dmabuf_delay_us, "lab fault: microseconds every message into or out of a dma-buf MR waits, once");
static unsigned int dmabuf_read_delay_us;
module_param(dmabuf_read_delay_us, uint, 0644);
MODULE_PARM_DESC(dmabuf_read_delay_us, "lab fault: microseconds every READ response packet from a dma-buf MR waits");

/* The largest wait udelay() is meant for; the knobs are clamped to it. */
#define RXE_DMABUF_MAX_DELAY_US 2000

void rxe_dmabuf_delay(struct rxe_mr *mr, bool first_of_message, bool read)
{
	unsigned int wait = 0;

	if (!mr || !mr->umem || !mr->umem->is_dmabuf)
		return;
	if (first_of_message)
		wait += READ_ONCE(dmabuf_delay_us);
	if (read)
		wait += READ_ONCE(dmabuf_read_delay_us);
	if (wait)
		udelay(min_t(unsigned int, wait, RXE_DMABUF_MAX_DELAY_US));
}

static dma_addr_t rxe_dma_map_page(struct device *dev, struct page *page, unsigned long offset,
				   size_t size, enum dma_data_direction dir, unsigned long attrs)
{
	return (uintptr_t)page_address(page) + offset;
}

static int rxe_dma_map_sg(struct device *dev, struct scatterlist *sgl, int nents,
			  enum dma_data_direction dir, unsigned long attrs)
{
	struct scatterlist *sg;
	int i;

	for_each_sg(sgl, sg, nents, i) {
		sg_dma_address(sg) = (uintptr_t)sg_virt(sg);
		sg_dma_len(sg) = sg->length;
	}
	return nents;
}

/* Nothing to undo: no mapping was made. */
static void rxe_dma_unmap_page(struct device *dev, dma_addr_t address, size_t size,
			       enum dma_data_direction dir, unsigned long attrs)
{
}

static void rxe_dma_unmap_sg(struct device *dev, struct scatterlist *sgl, int nents,
			     enum dma_data_direction dir, unsigned long attrs)
{
}

static void *rxe_dma_alloc(struct device *dev, size_t size, dma_addr_t *address, gfp_t gfp,
			   unsigned long attrs)
{
	void *memory = (void *)__get_free_pages(gfp | __GFP_ZERO, get_order(size));

	if (memory)
		*address = (uintptr_t)memory;
	return memory;
}

static void rxe_dma_free(struct device *dev, size_t size, void *memory, dma_addr_t address,
			 unsigned long attrs)
{
	free_pages((unsigned long)memory, get_order(size));
}

static const struct dma_map_ops rxe_dma_ops = {
	.alloc = rxe_dma_alloc,
	.free = rxe_dma_free,
	.map_page = rxe_dma_map_page,
	.unmap_page = rxe_dma_unmap_page,
	.map_sg = rxe_dma_map_sg,
	.unmap_sg = rxe_dma_unmap_sg,
};

/* ib_register_device() wants dma_parms on a DMA device; no segment limit, as for virt DMA
 * (ib_dma_max_seg_size() is UINT_MAX there). */
static struct device_dma_parameters rxe_dma_parms = {
	.max_segment_size = UINT_MAX,
	.segment_boundary_mask = ULONG_MAX,
};

static struct device *rxe_dma_dev;

int rxe_dma_device_register(void)
{
	struct device *dev = root_device_register("rxe_dma");

	if (IS_ERR(dev))
		return PTR_ERR(dev);
	dev->dma_parms = &rxe_dma_parms;
	dev->coherent_dma_mask = DMA_BIT_MASK(64);
	dev->dma_mask = &dev->coherent_dma_mask;
	set_dma_ops(dev, &rxe_dma_ops);
	rxe_dma_dev = dev;
	return 0;
}

void rxe_dma_device_unregister(void)
{
	root_device_unregister(rxe_dma_dev);
	rxe_dma_dev = NULL;
}

struct device *rxe_dma_device(void)
{
	return rxe_dma_dev;
}

/* rxe's page map for the import: one rxe_phys_buf per page of the trimmed, mapped range
 * (ib_umem_dmabuf_map_pages() leaves the table starting at the page holding offset). */
static int rxe_mr_fill_dmabuf(struct rxe_mr *mr, struct ib_umem *umem, int num_buf)
{
	struct sg_dma_page_iter iter;
	struct rxe_map **map = mr->map;
	struct rxe_phys_buf *buf = map[0]->buf;
	int in_map = 0, filled = 0;

	for_each_sgtable_dma_page(&umem->sgt_append.sgt, &iter, 0) {
		if (filled == num_buf)
			break;
		if (in_map == RXE_BUF_PER_MAP) {
			buf = (++map)[0]->buf;
			in_map = 0;
		}
		buf->addr = sg_page_iter_dma_address(&iter);
		buf->size = PAGE_SIZE;
		buf++;
		in_map++;
		filled++;
	}
	return filled == num_buf ? 0 : -EFAULT;
}

static int rxe_mr_init_dmabuf(struct rxe_dev *rxe, u64 offset, u64 length, u64 iova, int fd,
			      int access, struct rxe_mr *mr)
{
	struct ib_umem_dmabuf *umem_dmabuf;
	struct ib_umem *umem;
	int num_buf, err;

	umem_dmabuf = ib_umem_dmabuf_get_pinned(&rxe->ib_dev, offset, length, fd, access);
	if (IS_ERR(umem_dmabuf))
		return PTR_ERR(umem_dmabuf);
	umem = &umem_dmabuf->umem;
	num_buf = (PAGE_ALIGN(offset + length) - (offset & PAGE_MASK)) >> PAGE_SHIFT;

	rxe_mr_init(access, mr);
	err = rxe_mr_alloc(mr, num_buf);
	if (!err)
		err = rxe_mr_fill_dmabuf(mr, umem, num_buf);
	if (err) {
		ib_umem_release(umem);
		return err;
	}
	mr->page_shift = PAGE_SHIFT;
	mr->page_mask = PAGE_SIZE - 1;
	mr->umem = umem;
	mr->access = access;
	mr->offset = ib_umem_offset(umem);
	/* The core's dma-buf method leaves these to the driver (uverbs_std_types_mr.c). */
	mr->ibmr.iova = iova;
	mr->ibmr.length = length;
	mr->state = RXE_MR_STATE_VALID;
	mr->type = IB_MR_TYPE_USER;
	return 0;
}

struct ib_mr *rxe_reg_user_mr_dmabuf(struct ib_pd *ibpd, u64 offset, u64 length, u64 iova,
				     int fd, int access, struct ib_udata *udata)
{
	struct rxe_dev *rxe = to_rdev(ibpd->device);
	struct rxe_pd *pd = to_rpd(ibpd);
	struct rxe_mr *mr;
	int err;

	mr = rxe_alloc(&rxe->mr_pool);
	if (!mr)
		return ERR_PTR(-ENOMEM);
	rxe_get(pd);
	mr->ibmr.pd = ibpd;
	err = rxe_mr_init_dmabuf(rxe, offset, length, iova, fd, access, mr);
	if (err) {
		rxe_cleanup(mr);
		return ERR_PTR(err);
	}
	rxe_finalize(mr);
	return &mr->ibmr;
}
