/* Page-aligned host buffers, optionally on huge pages and bound to a NUMA node. */
#ifndef GDR_HOSTMEM_H
#define GDR_HOSTMEM_H

#include <stddef.h>

/* Maps len bytes (rounded up to the page or huge-page size, written to *mapped_len).
 * numa_node < 0 leaves placement to the kernel. Returns NULL with errno set. */
void *gdr_host_alloc(size_t len, int numa_node, int huge_pages, size_t *mapped_len);

int gdr_host_free(void *addr, size_t mapped_len);

#endif
