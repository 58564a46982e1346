#define _GNU_SOURCE
#include "gdr_dmabuf.h"

#include <dlfcn.h>
#include <errno.h>

typedef struct ibv_mr *(*reg_dmabuf_mr_fn)(struct ibv_pd *, uint64_t, size_t, uint64_t, int,
                                           int);

/* The loaded libibverbs' ibv_reg_dmabuf_mr, or NULL. The extension links libibverbs.so.1,
 * so it is loaded already; a Python extension is loaded RTLD_LOCAL, so its libraries are
 * not in the global scope RTLD_DEFAULT searches: the library is asked for by name. */
static reg_dmabuf_mr_fn resolve(void)
{
    void *library = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (library == NULL)
        return NULL;
    reg_dmabuf_mr_fn found = (reg_dmabuf_mr_fn)dlvsym(library, "ibv_reg_dmabuf_mr",
                                                      "IBVERBS_1.12");
    dlclose(library);   /* drops the reference NOLOAD took; the link's own keeps it loaded */
    return found;
}

struct ibv_mr *gdr_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
                                 uint64_t iova, int fd, int access, int *err)
{
    reg_dmabuf_mr_fn reg = resolve();
    if (reg == NULL) {
        *err = EOPNOTSUPP;
        return NULL;
    }
    errno = 0;
    struct ibv_mr *mr = reg(pd, offset, length, iova, fd, access);
    if (mr == NULL)
        *err = errno ? errno : EIO;
    return mr;
}

int gdr_have_reg_dmabuf_mr(void)
{
    return resolve() != NULL;
}

int gdr_dereg_mr(struct ibv_mr *mr)
{
    return ibv_dereg_mr(mr);
}
