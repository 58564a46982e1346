// SPDX-License-Identifier: GPL-2.0-only
/*
 * gdr_dmabuf: the lab's dma-buf exporter. /dev/gdr_dmabuf's one ioctl turns a page-aligned
 * range of a memfd into a dma-buf, the way a GPU driver exports a range of device memory
 * (cuMemGetHandleForAddressRange): the stand-in CUDA driver backs "device" memory with a
 * memfd and exports through here, so an importer (the patched Soft-RoCE) reaches the same
 * pages the stand-in reads and writes.
 *
 * Host pages, not a GPU BAR: this exercises the kernel's dma-buf import path (arguments,
 * attach, map, pinning, lifetimes), never PCIe peer-to-peer.
 *
 * The pages are referenced for the dma-buf's whole life (as udmabuf does), so freeing the
 * memfd and its mapping while an importer holds the dma-buf leaves the pages alive until the
 * last reference goes (Documentation/driver-api/dma-buf.rst, "Reference Counting").
 *
 * Fault switch: /sys/module/gdr_dmabuf/parameters/refuse_peer2peer. When set, attach
 * returns -EOPNOTSUPP to importers asking for peer-to-peer (attach->peer2peer), as an
 * exporter does whose memory the importer could only reach over PCIe P2P when the platform
 * refuses it (drivers/gpu/drm/amd/amdgpu/amdgpu_dma_buf.c: VRAM without P2P is not
 * attachable). RDMA's pinned import always asks for it (drivers/infiniband/core/
 * umem_dmabuf.c: allow_peer2peer = true).
 */
#include <linux/dma-buf.h>
#include <linux/dma-mapping.h>
#include <linux/file.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/scatterlist.h>
#include <linux/shmem_fs.h>
#include <linux/slab.h>

#include "gdr_dmabuf_uapi.h"

MODULE_IMPORT_NS(DMA_BUF);

static bool refuse_peer2peer;
module_param(refuse_peer2peer, bool, 0644);
MODULE_PARM_DESC(refuse_peer2peer,
		 "refuse attaches that ask for peer-to-peer with -EOPNOTSUPP (fault injection)");

/* Bound the pages one export may hold, as udmabuf does with its size_limit_mb. */
static unsigned int size_limit_mb = 256;
module_param(size_limit_mb, uint, 0644);
MODULE_PARM_DESC(size_limit_mb, "largest dma-buf one ioctl may create, in MiB");

struct gdr_buffer {
	pgoff_t page_count;
	struct page **pages;
};

static int gdr_attach(struct dma_buf *dmabuf, struct dma_buf_attachment *attach)
{
	if (READ_ONCE(refuse_peer2peer) && attach->peer2peer)
		return -EOPNOTSUPP;
	return 0;
}

static struct sg_table *gdr_map(struct dma_buf_attachment *attach,
				enum dma_data_direction direction)
{
	struct gdr_buffer *buffer = attach->dmabuf->priv;
	struct sg_table *table;
	int err;

	table = kzalloc(sizeof(*table), GFP_KERNEL);
	if (!table)
		return ERR_PTR(-ENOMEM);
	err = sg_alloc_table_from_pages(table, buffer->pages, buffer->page_count, 0,
					buffer->page_count << PAGE_SHIFT, GFP_KERNEL);
	if (err)
		goto free_table;
	/* The importer's device maps the pages: its DMA addresses are what it will use. */
	err = dma_map_sgtable(attach->dev, table, direction, 0);
	if (err)
		goto free_pages;
	return table;

free_pages:
	sg_free_table(table);
free_table:
	kfree(table);
	return ERR_PTR(err);
}

static void gdr_unmap(struct dma_buf_attachment *attach, struct sg_table *table,
		      enum dma_data_direction direction)
{
	dma_unmap_sgtable(attach->dev, table, direction, 0);
	sg_free_table(table);
	kfree(table);
}

static void gdr_release_pages(struct gdr_buffer *buffer, pgoff_t count)
{
	while (count--)
		put_page(buffer->pages[count]);
	kvfree(buffer->pages);
	kfree(buffer);
}

static void gdr_release(struct dma_buf *dmabuf)
{
	struct gdr_buffer *buffer = dmabuf->priv;

	gdr_release_pages(buffer, buffer->page_count);
}

static const struct dma_buf_ops gdr_dmabuf_ops = {
	.attach = gdr_attach,
	.map_dma_buf = gdr_map,
	.unmap_dma_buf = gdr_unmap,
	.release = gdr_release,
};

/* The arguments a GPU driver checks before exporting (page-aligned, non-empty, inside
 * the allocation); each refusal is -EINVAL, as udmabuf's. */
static int gdr_check_range(struct file *memfd, const struct gdr_dmabuf_create *request)
{
	u64 end;

	if (request->flags || !request->size)
		return -EINVAL;
	if (!PAGE_ALIGNED(request->offset) || !PAGE_ALIGNED(request->size))
		return -EINVAL;
	if (request->size >> 20 > size_limit_mb)
		return -E2BIG;
	if (!shmem_file(memfd))
		return -EBADFD;
	if (check_add_overflow(request->offset, request->size, &end) ||
	    end > i_size_read(file_inode(memfd)))
		return -EINVAL;
	return 0;
}

static struct gdr_buffer *gdr_take_pages(struct file *memfd,
					 const struct gdr_dmabuf_create *request)
{
	struct gdr_buffer *buffer;
	pgoff_t first = request->offset >> PAGE_SHIFT, index;
	struct page *page;

	buffer = kzalloc(sizeof(*buffer), GFP_KERNEL);
	if (!buffer)
		return ERR_PTR(-ENOMEM);
	buffer->page_count = request->size >> PAGE_SHIFT;
	buffer->pages = kvmalloc_array(buffer->page_count, sizeof(*buffer->pages), GFP_KERNEL);
	if (!buffer->pages) {
		kfree(buffer);
		return ERR_PTR(-ENOMEM);
	}
	for (index = 0; index < buffer->page_count; index++) {
		/* Returns the page with a reference held: ours until release. */
		page = shmem_read_mapping_page(memfd->f_mapping, first + index);
		if (IS_ERR(page)) {
			gdr_release_pages(buffer, index);
			return ERR_CAST(page);
		}
		buffer->pages[index] = page;
	}
	return buffer;
}

static long gdr_create(struct gdr_dmabuf_create __user *argument)
{
	DEFINE_DMA_BUF_EXPORT_INFO(info);
	struct gdr_dmabuf_create request;
	struct gdr_buffer *buffer;
	struct dma_buf *dmabuf;
	struct file *memfd;
	long ret;

	if (copy_from_user(&request, argument, sizeof(request)))
		return -EFAULT;
	memfd = fget(request.memfd);
	if (!memfd)
		return -EBADF;
	ret = gdr_check_range(memfd, &request);
	if (ret)
		goto put_memfd;
	buffer = gdr_take_pages(memfd, &request);
	if (IS_ERR(buffer)) {
		ret = PTR_ERR(buffer);
		goto put_memfd;
	}
	info.exp_name = KBUILD_MODNAME;
	info.owner = THIS_MODULE;
	info.ops = &gdr_dmabuf_ops;
	info.size = request.size;
	info.flags = O_RDWR;
	info.priv = buffer;
	dmabuf = dma_buf_export(&info);
	if (IS_ERR(dmabuf)) {
		gdr_release_pages(buffer, buffer->page_count);
		ret = PTR_ERR(dmabuf);
		goto put_memfd;
	}
	ret = dma_buf_fd(dmabuf, O_CLOEXEC);
	if (ret < 0)
		dma_buf_put(dmabuf);	/* releases the pages through gdr_release */
put_memfd:
	fput(memfd);
	return ret;
}

static long gdr_ioctl(struct file *file, unsigned int command, unsigned long argument)
{
	if (command != GDR_DMABUF_CREATE)
		return -ENOTTY;
	return gdr_create((struct gdr_dmabuf_create __user *)argument);
}

static const struct file_operations gdr_fops = {
	.owner = THIS_MODULE,
	.unlocked_ioctl = gdr_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
};

static struct miscdevice gdr_device = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "gdr_dmabuf",
	.fops = &gdr_fops,
	.mode = 0666,
};

module_misc_device(gdr_device);

MODULE_DESCRIPTION("gdrprobe lab: dma-bufs over memfd pages, with fault injection");
MODULE_LICENSE("GPL");
