/*
 * The stand-in's host registration calls: cuMemHostRegister, cuMemHostUnregister and
 * cuMemHostGetDevicePointer, the three NCCL's GIN (through DOCA GPUNetIO's
 * doca_gpu_verbs_can_gpu_register_uar and doca_gpu_verbs_export_uar) and aws-ofi-nccl
 * (nccl_net_ofi_gpu_host_register_iomem) make on a NIC's doorbell page, with the rules the
 * CUDA driver API documentation states: flags among PORTABLE, DEVICEMAP, IOMEMORY and
 * READ_ONLY; a range registered once (CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED), unregistered
 * by its start only (CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED); a device pointer only for a range
 * registered with DEVICEMAP, the same address under UVA.
 *
 * GDRPROBE_STANDIN_IOMEMORY=refused makes every IOMEMORY registration return
 * CUDA_ERROR_OPERATING_SYSTEM (304: what libgdsync logged where a driver refused
 * cuMemHostRegister(..., 0x7) of a NIC's page, gpudirect/libgdsync issue 97), as a driver
 * that may not map another device's MMIO for the GPU does; refused=N returns CUresult N;
 * accepted (the default) registers it. Binding call shapes, not a GPU: no page is mapped for
 * any device, and the doorbell is never rung.
 */
#define _GNU_SOURCE
#include "standin.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define MAX_HOST 64
enum { PORTABLE = 1, DEVICEMAP = 2, IOMEMORY = 4, READ_ONLY = 8 };
enum { OPERATING_SYSTEM = 304, ALREADY_REGISTERED = 712, NOT_REGISTERED = 713 };

struct registration { int live; uintptr_t start; size_t length; unsigned int flags; };

static pthread_mutex_t host_lock = PTHREAD_MUTEX_INITIALIZER;
static struct registration registrations[MAX_HOST];
static int iomemory_refusal;      /* the CUresult an IOMEMORY registration gets; 0: accepted */
static long iomemory_asked;

static struct registration *holding(uintptr_t address)
{
    for (int i = 0; i < MAX_HOST; i++)
        if (registrations[i].live && address >= registrations[i].start &&
            address < registrations[i].start + registrations[i].length)
            return &registrations[i];
    return NULL;
}

static int overlaps(uintptr_t start, size_t length)
{
    for (int i = 0; i < MAX_HOST; i++)
        if (registrations[i].live && start < registrations[i].start + registrations[i].length &&
            registrations[i].start < start + length)
            return 1;
    return 0;
}

static CUresult cuMemHostRegister_(void *p, size_t bytesize, unsigned int flags)
{
    ENTER("cuMemHostRegister");
    NEEDS_INIT();
    NEEDS_CONTEXT();
    if (!p || bytesize == 0 || (flags & ~(unsigned)(PORTABLE | DEVICEMAP | IOMEMORY | READ_ONLY)))
        return INVALID_VALUE;
    pthread_mutex_lock(&host_lock);
    CUresult result = SUCCESS;
    if (flags & IOMEMORY)
        iomemory_asked++;
    if (overlaps((uintptr_t)p, bytesize))
        result = ALREADY_REGISTERED;
    else if ((flags & IOMEMORY) && iomemory_refusal)
        result = iomemory_refusal;
    else {
        struct registration *slot = NULL;
        for (int i = 0; !slot && i < MAX_HOST; i++)
            if (!registrations[i].live)
                slot = &registrations[i];
        if (!slot)
            result = OUT_OF_MEMORY;
        else
            *slot = (struct registration){1, (uintptr_t)p, bytesize, flags};
    }
    pthread_mutex_unlock(&host_lock);
    return result;
}

static CUresult cuMemHostUnregister_(void *p)
{
    ENTER("cuMemHostUnregister");
    NEEDS_INIT();
    NEEDS_CONTEXT();
    pthread_mutex_lock(&host_lock);
    struct registration *found = holding((uintptr_t)p);
    CUresult result = found && found->start == (uintptr_t)p ? SUCCESS : NOT_REGISTERED;
    if (result == SUCCESS)
        memset(found, 0, sizeof *found);
    pthread_mutex_unlock(&host_lock);
    return result;
}

static CUresult cuMemHostGetDevicePointer_(CUdeviceptr *pdptr, void *p, unsigned int flags)
{
    ENTER("cuMemHostGetDevicePointer");
    NEEDS_INIT();
    NEEDS_CONTEXT();
    if (!pdptr || !p || flags != 0)
        return INVALID_VALUE;
    pthread_mutex_lock(&host_lock);
    struct registration *found = holding((uintptr_t)p);
    CUresult result = found && (found->flags & DEVICEMAP) ? SUCCESS : INVALID_VALUE;
    if (result == SUCCESS)
        *pdptr = (CUdeviceptr)(uintptr_t)p;
    pthread_mutex_unlock(&host_lock);
    return result;
}

/* ---- the rest of the stand-in's view -------------------------------------------------- */

void host_apply_environment(void)
{
    const char *text = getenv("GDRPROBE_STANDIN_IOMEMORY");
    if (!text)
        return;
    if (strcmp(text, "refused") == 0)
        iomemory_refusal = OPERATING_SYSTEM;
    else if (strncmp(text, "refused=", 8) == 0)
        iomemory_refusal = atoi(text + 8);
    else
        iomemory_refusal = 0;
}

int host_live(void)
{
    int live = 0;
    pthread_mutex_lock(&host_lock);
    for (int i = 0; i < MAX_HOST; i++)
        live += registrations[i].live;
    pthread_mutex_unlock(&host_lock);
    return live;
}

void host_reset(void)
{
    pthread_mutex_lock(&host_lock);
    memset(registrations, 0, sizeof registrations);
    iomemory_refusal = 0;
    iomemory_asked = 0;
    pthread_mutex_unlock(&host_lock);
}

/* Controls for tests (ctypes): how many IOMEMORY registrations were asked; refuse them or not. */
long standin_iomemory_asked(void) { return iomemory_asked; }
void standin_refuse_iomemory(int result) { iomemory_refusal = result; }
int standin_host_registered(void) { return host_live(); }

void *host_entry(const char *name)
{
    if (strcmp(name, "cuMemHostRegister") == 0)
        return (void *)cuMemHostRegister_;
    if (strcmp(name, "cuMemHostUnregister") == 0)
        return (void *)cuMemHostUnregister_;
    if (strcmp(name, "cuMemHostGetDevicePointer") == 0)
        return (void *)cuMemHostGetDevicePointer_;
    return NULL;
}
