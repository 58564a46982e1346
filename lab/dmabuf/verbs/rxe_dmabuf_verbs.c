// SPDX-License-Identifier: Apache-2.0
/*
 * The user-space half of dma-buf registration on Soft-RoCE, for the gdrprobe lab only.
 *
 * Debian 12's rdma-core (44) has no reg_dmabuf_mr in its rxe provider, so libibverbs answers
 * ibv_reg_dmabuf_mr with its placeholder's EOPNOTSUPP (libibverbs/dummy_ops.c) before the
 * kernel is asked. Preloaded (LD_PRELOAD) into a lab process, this library answers that one
 * refusal the way a provider with dma-buf support does (providers/mlx5/verbs.c: allocate a
 * struct verbs_mr, ibv_cmd_reg_dmabuf_mr, return its ibv_mr): it sends the registration to
 * the kernel, where the lab's patched rdma_rxe implements it. Every other answer of the real
 * call is passed on untouched, and on a kernel without the patch the kernel's own
 * EOPNOTSUPP comes back (drivers/infiniband/core/uverbs_std_types_mr.c).
 *
 * Deregistration needs nothing here: ibv_dereg_mr goes to rxe's dereg_mr, which sends the
 * command and frees the struct verbs_mr (providers/rxe/rxe.c), as it does for its own.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include <infiniband/verbs.h>

/* libibverbs' provider interface (libibverbs/driver.h of rdma-core 44, not installed by
 * libibverbs-dev): the MR a provider allocates, and the command that registers a dma-buf,
 * exported at the private ABI IBVERBS_PRIVATE_34. */
enum verbs_mr_type { VERBS_MR_TYPE_MR, VERBS_MR_TYPE_NULL_MR, VERBS_MR_TYPE_IMPORTED_MR,
                     VERBS_MR_TYPE_DMABUF_MR };
struct verbs_mr {
    struct ibv_mr ibv_mr;
    enum verbs_mr_type mr_type;
    int access;
};
int ibv_cmd_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova,
                          int fd, int access, struct verbs_mr *vmr);

typedef struct ibv_mr *(*reg_dmabuf_mr_fn)(struct ibv_pd *, uint64_t, size_t, uint64_t, int,
                                           int);

static struct ibv_mr *register_in_kernel(struct ibv_pd *pd, uint64_t offset, size_t length,
                                         uint64_t iova, int fd, int access)
{
    struct verbs_mr *vmr = calloc(1, sizeof(*vmr));
    if (!vmr) {
        errno = ENOMEM;
        return NULL;
    }
    int error = ibv_cmd_reg_dmabuf_mr(pd, offset, length, iova, fd, access, vmr);
    if (error) {
        free(vmr);
        errno = error;
        return NULL;
    }
    vmr->access = access;
    return &vmr->ibv_mr;
}

struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
                                 uint64_t iova, int fd, int access)
{
    static reg_dmabuf_mr_fn real;
    if (!real)
        real = (reg_dmabuf_mr_fn)dlsym(RTLD_NEXT, "ibv_reg_dmabuf_mr");
    if (real) {
        struct ibv_mr *mr = real(pd, offset, length, iova, fd, access);
        if (mr || errno != EOPNOTSUPP)
            return mr;
    }
    return register_in_kernel(pd, offset, length, iova, fd, access);
}
