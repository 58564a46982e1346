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
 *   GDRPROBE_MLX5_STANDIN_UAR_ERRNO    fail every mlx5dv_devx_alloc_uar with this errno
 *   GDRPROBE_MLX5_STANDIN_UAR_NO_DEDICATED  1: refuse MLX5DV_UAR_ALLOC_TYPE_NC_DEDICATED with
 *                                      EOPNOTSUPP, as an rdma-core without that flag does
 *
 * mlx5dv_devx_alloc_uar (MLX5_1.7) hands out a doorbell page: one anonymous page of this
 * process, its register at the BlueFlame offset (0x800) as mlx5's UAR pages have it, the flags
 * checked as rdma-core's _mlx5dv_devx_alloc_uar checks them (NC, NC_DEDICATED, or 0 for
 * BlueFlame), so the UAR NCCL's GDAKI path asks for (DOCA GPUNetIO create_uar: non-cached
 * dedicated, else non-cached) reaches cuMemHostRegister. Not a NIC's MMIO: nothing rings it.
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
#include <sys/mman.h>
#include <unistd.h>

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

/* ---- a doorbell page (mlx5dv_devx_alloc_uar, MLX5_1.7) ------------------------------- */

struct mlx5dv_devx_uar {      /* providers/mlx5/mlx5dv.h */
    void *reg_addr;
    void *base_addr;
    uint32_t page_id;
    off_t mmap_off;
    uint64_t comp_mask;
};

#define UAR_ALLOC_TYPE_NC 0x1u                  /* MLX5DV_UAR_ALLOC_TYPE_NC, mlx5_api.h */
#define UAR_ALLOC_TYPE_NC_DEDICATED (1u << 31)  /* MLX5DV_UAR_ALLOC_TYPE_NC_DEDICATED */
#define BF_OFFSET 0x800                         /* MLX5_BF_OFFSET: the register in the page */

static int live_uars;
static uint32_t next_page_id = 1;

struct mlx5dv_devx_uar *mlx5dv_devx_alloc_uar(struct ibv_context *context, uint32_t flags) {
    (void)context;
    int refused = knob_errno("GDRPROBE_MLX5_STANDIN_UAR_ERRNO");
    if (!refused && (flags & ~(UAR_ALLOC_TYPE_NC | UAR_ALLOC_TYPE_NC_DEDICATED)))
        refused = EOPNOTSUPP;
    if (!refused && (flags & UAR_ALLOC_TYPE_NC_DEDICATED) && knob_errno("GDRPROBE_MLX5_STANDIN_UAR_NO_DEDICATED"))
        refused = EOPNOTSUPP;
    if (refused) {
        errno = refused;
        return NULL;
    }
    long page = sysconf(_SC_PAGESIZE);
    void *base = mmap(NULL, (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct mlx5dv_devx_uar *uar = base == MAP_FAILED ? NULL : calloc(1, sizeof *uar);
    if (!uar) {
        if (base != MAP_FAILED)
            munmap(base, (size_t)page);
        errno = ENOMEM;
        return NULL;
    }
    uar->base_addr = base;
    uar->reg_addr = (char *)base + BF_OFFSET;
    uar->page_id = __atomic_fetch_add(&next_page_id, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&live_uars, 1, __ATOMIC_RELAXED);
    return uar;
}

void mlx5dv_devx_free_uar(struct mlx5dv_devx_uar *uar) {
    if (!uar)
        return;
    munmap(uar->base_addr, (size_t)sysconf(_SC_PAGESIZE));
    free(uar);
    __atomic_fetch_sub(&live_uars, 1, __ATOMIC_RELAXED);
}

int standin_mlx5_live_uars(void) {
    return __atomic_load_n(&live_uars, __ATOMIC_RELAXED);
}
