/*
 * What the stand-in libcuda.so.1's files share (standin.c: the driver and its controls;
 * standin_vmm.c: the virtual memory management calls; standin_host.c: host registration).
 * Binding call shapes, not a GPU.
 * Shared symbols are hidden: only the driver's entry points and the standin_* controls
 * leave the library.
 */
#ifndef STANDIN_H
#define STANDIN_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct standin_context *CUcontext;

/* CUresult values used here (cuda.h; identical in cuda-bindings 12.x and 13.x). */
enum {
    SUCCESS = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3,
    DEVICE_UNAVAILABLE = 46, NO_DEVICE = 100, INVALID_DEVICE = 101, INVALID_CONTEXT = 201,
    NOT_FOUND = 500, NOT_SUPPORTED = 801,
};

#define MAX_DEVICES 8
#define HOST_PAGE 4096ULL
#define HIDDEN __attribute__((visibility("hidden")))

HIDDEN extern int initialised;
HIDDEN extern __thread CUcontext current;
HIDDEN extern long calls_without_context;
HIDDEN extern int attributes[MAX_DEVICES][256];

/* The result a test asked this call to return, or SUCCESS to go on normally. */
HIDDEN CUresult injected(const char *name);
HIDDEN int valid_device(CUdevice device);

#define ENTER(name) do { CUresult r_ = injected(name); if (r_) return r_; } while (0)
#define NEEDS_INIT() do { if (!initialised) return NOT_INITIALIZED; } while (0)
#define NEEDS_CONTEXT() do { if (!current) { calls_without_context++; \
                                             return INVALID_CONTEXT; } } while (0)

/* ---- standin_vmm.c ---- */

/* A mapped range of VMM memory the GPU may access: the memfd behind it and where it is. */
struct vmm_span { int memfd; CUdeviceptr start; size_t length; int device; };

/* The accessible VMM mapping holding [address, address+length), into *span; 0 if none. */
HIDDEN int vmm_find(CUdeviceptr address, size_t length, struct vmm_span *span);
/* VMM allocations and reservations still live. */
HIDDEN int vmm_live(void);
/* Free every VMM object. */
HIDDEN void vmm_reset(void);
/* The VMM entry point called name, or NULL. */
HIDDEN void *vmm_entry(const char *name);

/* ---- standin_host.c ---- */

/* The host registration entry point called name, or NULL. */
HIDDEN void *host_entry(const char *name);
/* Host ranges still registered. */
HIDDEN int host_live(void);
/* Forget every registration and the IOMEMORY setting. */
HIDDEN void host_reset(void);
/* GDRPROBE_STANDIN_IOMEMORY. */
HIDDEN void host_apply_environment(void);

#endif
