/* SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-only */
/*
 * The interface of gdr_dmabuf, the lab's dma-buf exporter (lab/dmabuf/exporter/): it turns a
 * range of a memfd into a dma-buf, the way a GPU driver turns a range of device memory into
 * one. Shared by the module and the stand-in CUDA driver (tests/cuda_standin/standin.c).
 */
#ifndef GDR_DMABUF_UAPI_H
#define GDR_DMABUF_UAPI_H

#include <linux/types.h>
#include <linux/ioctl.h>

#define GDR_DMABUF_DEVICE "/dev/gdr_dmabuf"

/* memfd: a shmem file (memfd_create); offset and size: page-aligned, inside the file.
 * The ioctl returns the new dma-buf's file descriptor (close-on-exec, read-write). */
struct gdr_dmabuf_create {
	__s32 memfd;
	__u32 flags;		/* must be 0 */
	__u64 offset;
	__u64 size;
};

#define GDR_DMABUF_CREATE _IOW('G', 0x42, struct gdr_dmabuf_create)

#endif
