#define _GNU_SOURCE
#include "gdr_hostmem.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define HUGE_PAGE_SIZE (2ul << 20)
#define MPOL_PREFERRED 1
#define NODEMASK_BITS (8 * sizeof(unsigned long))

static size_t round_up(size_t len, size_t unit)
{
    return (len + unit - 1) / unit * unit;
}

/* Prefer the node rather than bind to it: a full node then spills over instead of
 * failing the run. mbind is called directly so no libnuma is needed. */
static int prefer_numa_node(void *addr, size_t len, int node)
{
    unsigned long mask;

    if (node >= (int)NODEMASK_BITS)   /* beyond one mask word: leave placement to the kernel */
        return 0;
    mask = 1ul << node;
    return (int)syscall(SYS_mbind, addr, len, MPOL_PREFERRED, &mask, NODEMASK_BITS + 1, 0);
}

void *gdr_host_alloc(size_t len, int numa_node, int huge_pages, size_t *mapped_len)
{
    size_t unit = huge_pages ? HUGE_PAGE_SIZE : (size_t)sysconf(_SC_PAGESIZE);
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | (huge_pages ? MAP_HUGETLB : 0);
    size_t total = round_up(len ? len : 1, unit);
    void *addr = mmap(NULL, total, PROT_READ | PROT_WRITE, flags, -1, 0);

    if (addr == MAP_FAILED)
        return NULL;
    if (numa_node >= 0 && prefer_numa_node(addr, total, numa_node) != 0 && errno != ENOSYS) {
        int saved = errno;
        munmap(addr, total);
        errno = saved;
        return NULL;
    }
    memset(addr, 0, total);   /* fault every page in now, on the preferred node */
    *mapped_len = total;
    return addr;
}

int gdr_host_free(void *addr, size_t mapped_len)
{
    return munmap(addr, mapped_len);
}
