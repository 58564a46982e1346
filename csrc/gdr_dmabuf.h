/* Registering a DMA-BUF through libibverbs itself, for where pyverbs cannot.
 *
 * pyverbs' DmaBufMR takes a file descriptor only from rdma-core 44 on (pyverbs/mr.pyx, commit
 * "pyverbs: Generalize DmaBufMR's dmabuf input"); from rdma-core 34 to 43 it takes a pyverbs
 * DmaBuf object only, so the fd the CUDA driver exports cannot reach it. libibverbs has
 * ibv_reg_dmabuf_mr from rdma-core 34 on (IBVERBS_1.12 in libibverbs/libibverbs.map.in),
 * which is what NCCL calls. It is resolved when called, as NCCL resolves it
 * (src/misc/ibvsymbols.cc), so the extension still loads against an older libibverbs. */
#ifndef GDR_DMABUF_H
#define GDR_DMABUF_H

#include <stddef.h>
#include <stdint.h>

#include <infiniband/verbs.h>

/* ibv_reg_dmabuf_mr(pd, offset, length, iova, fd, access), or NULL with *err set: the
 * errno of the registration, or EOPNOTSUPP where libibverbs lacks the call (what NCCL's
 * wrapper sets then, src/misc/ibvwrap.cc wrap_direct_ibv_reg_dmabuf_mr). */
struct ibv_mr *gdr_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
                                 uint64_t iova, int fd, int access, int *err);

/* Whether the loaded libibverbs has ibv_reg_dmabuf_mr (rdma-core 34 or newer). */
int gdr_have_reg_dmabuf_mr(void);

/* ibv_dereg_mr: 0, or an errno value. */
int gdr_dereg_mr(struct ibv_mr *mr);

#endif
