/* Reading memory at an address nobody vouches for, without the risk of a fault.
 *
 * The raw-handle validation reads the ibv_qp and ibv_cq that a pointer found inside a
 * pyverbs object should point at. Where pyverbs lays its objects out differently from what
 * gdrprobe expects, that pointer may be any word: a plain load through it would end the
 * process with SIGSEGV (or, on a NIC's doorbell page, have a side effect) instead of
 * reporting the wrong layout. Here the kernel does the load, and an address that is not
 * readable ordinary memory comes back as EFAULT. */
#ifndef GDR_PEEK_H
#define GDR_PEEK_H

#include <stddef.h>

#define GDR_PEEK_MAX 4096   /* PIPE_BUF: what the fallback moves in one atomic pipe write */

/* Copy len (at most GDR_PEEK_MAX) bytes from src to dst. Returns 0, or an errno value:
 * EFAULT where src to src + len is not all readable ordinary memory. */
int gdr_peek(void *dst, const void *src, size_t len);

/* The fallback of gdr_peek where process_vm_readv is refused (a seccomp policy). */
int gdr_peek_through_pipe(void *dst, const void *src, size_t len);

#endif
