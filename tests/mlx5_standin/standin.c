/* A stand-in libmlx5.so.1 for gdrprobe's lab and tests: the three calls NCCL makes for
 * mlx5 data-direct (NVIDIA/nccl src/misc/mlx5dvsymbols.cc, src/transport/net_ib/init.cc,
 * reg.cc), at the symbol version NCCL asks for (MLX5_1.25, rdma-core
 * providers/mlx5/libmlx5.map), steered by environment variables read at each call:
 *
 *   GDRPROBE_MLX5_STANDIN_PATH         the data-direct path to give (no /sys prefix, as
 *                                      libmlx5 gives it); unset: ENODEV (not data-direct)
 *   GDRPROBE_MLX5_STANDIN_PATH_ERRNO   return this errno from the path lookup instead
 *   GDRPROBE_MLX5_STANDIN_REG_ERRNO    fail every mlx5dv_reg_dmabuf_mr with this errno
 *   GDRPROBE_MLX5_STANDIN_DD_ERRNO     fail it only when MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT
 *                                      is asked (the data-direct rung refused, plain DMA-BUF kept)
 *
 * Otherwise a registration is forwarded to libibverbs' ibv_reg_dmabuf_mr, on whatever the
 * PD's device is (the lab's patched Soft-RoCE): the kernel registers it, the keys are real.
 * Not a ConnectX: no data-direct DMA happens; it proves gdrprobe's calls and their order,
 * never hardware. mlx5dv_is_supported answers yes for any device, so that the lab's rxe
 * device goes through the data-direct sequence. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dlfcn.h>

/* Declared here, found at run time in the process's libibverbs: the stand-in builds
 * without rdma-core's headers or its linker symlink (the lab's guests have neither). */
struct ibv_pd;
struct ibv_mr;
struct ibv_device;
struct ibv_context;
typedef struct ibv_mr *(*reg_dmabuf_mr_fn)(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int);

#define DATA_DIRECT_ACCESS (1 << 0)   /* MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT, mlx5dv.h */

static int knob_errno(const char *name) {
    const char *value = getenv(name);
    return value && *value ? atoi(value) : 0;
}

bool mlx5dv_is_supported(struct ibv_device *device) {
    (void)device;
    return true;
}

int mlx5dv_get_data_direct_sysfs_path(struct ibv_context *context, char *buf, size_t buf_len) {
    (void)context;
    int forced = knob_errno("GDRPROBE_MLX5_STANDIN_PATH_ERRNO");
    if (forced)
        return forced;
    const char *path = getenv("GDRPROBE_MLX5_STANDIN_PATH");
    if (!path || !*path)
        return ENODEV;
    if (strlen(path) + 1 > buf_len)
        return ENOSPC;
    memcpy(buf, path, strlen(path) + 1);
    return 0;
}

struct ibv_mr *mlx5dv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova,
                                    int fd, int access, int mlx5_access) {
    int refused = knob_errno("GDRPROBE_MLX5_STANDIN_REG_ERRNO");
    if (!refused && (mlx5_access & DATA_DIRECT_ACCESS))
        refused = knob_errno("GDRPROBE_MLX5_STANDIN_DD_ERRNO");
    if (refused) {
        errno = refused;
        return NULL;
    }
    reg_dmabuf_mr_fn forward = (reg_dmabuf_mr_fn)dlsym(RTLD_DEFAULT, "ibv_reg_dmabuf_mr");
    if (!forward) {     /* no libibverbs in the process, or one before rdma-core 34 */
        errno = EOPNOTSUPP;
        return NULL;
    }
    return forward(pd, offset, length, iova, fd, access);
}
