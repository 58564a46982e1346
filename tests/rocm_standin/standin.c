/* A stand-in for the HIP runtime (libamdhip64.so) and HSA (libhsa-runtime64.so) that
 * hip-python and gdrprobe.memory.rocm load: the calls gdrprobe makes, with "device" memory in
 * host memory, so the real bindings' call shapes run without an AMD GPU. Not GPU proof.
 *
 * hipMalloc's memory is a shared mapping of a memfd, so that hsa_amd_portable_export_dmabuf
 * can hand out a real dma-buf of the same pages where the lab's exporter is loaded
 * (lab/dmabuf/exporter, /dev/gdr_dmabuf: ./dev demo-rocm); elsewhere a memfd of the range's
 * size stands in, and the registration that follows fails where the NIC checks the fd.
 *
 * Knobs (environment, read on each call):
 *   GDRPROBE_HIP_DEVICES   GPUs listed (default 1; 0: hipInit fails with hipErrorNoDevice)
 *   GDRPROBE_HIP_FAIL      NAME=CODE: the call NAME returns hipError_t CODE
 *   GDRPROBE_HSA_DMABUF    HSA_AMD_SYSTEM_INFO_DMABUF_SUPPORTED (default 1)
 *   GDRPROBE_HSA_EXPORT    0: hsa_amd_portable_export_dmabuf refuses (HSA_STATUS_ERROR)
 *   GDRPROBE_HSA_SHORT     1: the export covers less than was asked (offset past the range)
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gdr_dmabuf_uapi.h"   /* lab/dmabuf: the lab's dma-buf exporter */

#define HIP_SUCCESS 0
#define HIP_ERROR_INVALID_VALUE 1
#define HIP_ERROR_NO_DEVICE 100
#define HIP_ERROR_INVALID_DEVICE 101
#define HSA_STATUS_ERROR 0x1000
#define HSA_DMABUF_SUPPORTED 0x204

static int current_device;

static int knob(const char *name, int fallback) {
    const char *value = getenv(name);
    return value && *value ? atoi(value) : fallback;
}

/* The code GDRPROBE_HIP_FAIL gives the call, or 0. */
static int forced(const char *call) {
    const char *rule = getenv("GDRPROBE_HIP_FAIL");
    size_t length = strlen(call);
    if (!rule || strncmp(rule, call, length) != 0 || rule[length] != '=')
        return 0;
    return atoi(rule + length + 1);
}

#define FORCED(call) do { int code_ = forced(call); if (code_) return code_; } while (0)

int hipInit(unsigned int flags) {
    (void)flags;
    FORCED("hipInit");
    return knob("GDRPROBE_HIP_DEVICES", 1) > 0 ? HIP_SUCCESS : HIP_ERROR_NO_DEVICE;
}

int hipGetDeviceCount(int *count) {
    FORCED("hipGetDeviceCount");
    *count = knob("GDRPROBE_HIP_DEVICES", 1);
    return HIP_SUCCESS;
}

static int valid(int device) { return device >= 0 && device < knob("GDRPROBE_HIP_DEVICES", 1); }

int hipSetDevice(int device) {
    FORCED("hipSetDevice");
    if (!valid(device))
        return HIP_ERROR_INVALID_DEVICE;
    current_device = device;
    return HIP_SUCCESS;
}

/* GPU k sits at bus 0x1b + k, as an MI300X would. */
int hipDeviceGetPCIBusId(char *bus_id, int length, int device) {
    FORCED("hipDeviceGetPCIBusId");
    if (!valid(device))
        return HIP_ERROR_INVALID_DEVICE;
    snprintf(bus_id, (size_t)length, "0000:%02x:00.0", 0x1b + device);
    return HIP_SUCCESS;
}

int hipDeviceGetByPCIBusId(int *device, const char *bus_id) {
    unsigned domain, bus, slot, function;
    FORCED("hipDeviceGetByPCIBusId");
    if (sscanf(bus_id, "%x:%x:%x.%x", &domain, &bus, &slot, &function) != 4 || domain || slot
        || function || !valid((int)bus - 0x1b))
        return HIP_ERROR_INVALID_DEVICE;
    *device = (int)bus - 0x1b;
    return HIP_SUCCESS;
}

int hipDeviceGetName(char *name, int length, int device) {
    FORCED("hipDeviceGetName");
    if (!valid(device))
        return HIP_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)length, "gdrprobe stand-in MI300X %d", device);
    return HIP_SUCCESS;
}

static int allocate(void **pointer, size_t size) {
    *pointer = NULL;
    if (size == 0)
        return HIP_SUCCESS;
    return posix_memalign(pointer, 65536, size) == 0 ? HIP_SUCCESS : 2;
}

/* hipMalloc's allocations: each a memfd mapped shared, found again by address. */
#define MAX_ALLOCATIONS 64
static struct device_allocation { char *start; size_t size; int memfd; } allocations[MAX_ALLOCATIONS];

static struct device_allocation *allocation_of(const void *pointer) {
    for (int i = 0; i < MAX_ALLOCATIONS; i++) {
        struct device_allocation *found = &allocations[i];
        if (found->start && (const char *)pointer >= found->start
            && (const char *)pointer < found->start + found->size)
            return found;
    }
    return NULL;
}

int hipMalloc(void **pointer, size_t size) {
    FORCED("hipMalloc");
    *pointer = NULL;
    if (size == 0)
        return HIP_SUCCESS;
    struct device_allocation *slot = NULL;
    for (int i = 0; !slot && i < MAX_ALLOCATIONS; i++)
        slot = allocations[i].start ? NULL : &allocations[i];
    if (!slot)
        return 2;   /* hipErrorOutOfMemory */
    int memfd = memfd_create("gdrprobe-standin-hip", MFD_CLOEXEC);
    void *start = MAP_FAILED;
    if (memfd >= 0 && ftruncate(memfd, (off_t)size) == 0)
        start = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    if (start == MAP_FAILED) {
        if (memfd >= 0)
            close(memfd);
        return 2;
    }
    *slot = (struct device_allocation){start, size, memfd};
    *pointer = start;
    return HIP_SUCCESS;
}

int hipHostMalloc(void **pointer, size_t size, unsigned int flags) {
    (void)flags;
    FORCED("hipHostMalloc");
    return allocate(pointer, size);
}

int hipFree(void *pointer) {
    FORCED("hipFree");
    struct device_allocation *found = pointer ? allocation_of(pointer) : NULL;
    if (!found)
        return pointer ? HIP_ERROR_INVALID_VALUE : HIP_SUCCESS;
    munmap(found->start, found->size);
    close(found->memfd);
    *found = (struct device_allocation){NULL, 0, -1};
    return HIP_SUCCESS;
}

int hipHostFree(void *pointer) { FORCED("hipHostFree"); free(pointer); return HIP_SUCCESS; }

int hipMemcpy(void *dst, const void *src, size_t size, int kind) {
    (void)kind;
    FORCED("hipMemcpy");
    if (!dst || !src)
        return HIP_ERROR_INVALID_VALUE;
    memcpy(dst, src, size);
    return HIP_SUCCESS;
}

/* ---- HSA ---- */

int hsa_init(void) { return 0; }
int hsa_shut_down(void) { return 0; }

int hsa_system_get_info(int attribute, void *value) {
    if (attribute != HSA_DMABUF_SUPPORTED)
        return HSA_STATUS_ERROR;
    *(_Bool *)value = knob("GDRPROBE_HSA_DMABUF", 1) != 0;
    return 0;
}

/* The fd of [at, at + size) of an allocation's pages and where that range starts in it: a
 * real dma-buf of exactly the range where the lab's exporter is loaded, else the memfd
 * itself (same pages, no kernel dma-buf). */
static int export_pages(const struct device_allocation *found, uint64_t at, size_t size,
                        uint64_t *start) {
    int exporter = open(GDR_DMABUF_DEVICE, O_RDWR | O_CLOEXEC);
    if (exporter < 0) {
        *start = at;
        return fcntl(found->memfd, F_DUPFD_CLOEXEC, 3);
    }
    struct gdr_dmabuf_create request = {found->memfd, 0, at, size};
    int fd = ioctl(exporter, GDR_DMABUF_CREATE, &request);
    close(exporter);
    *start = 0;
    return fd;
}

/* A pointer of no hipMalloc allocation gets a fresh memfd of the size asked, which no NIC
 * takes. GDRPROBE_HSA_SHORT puts the offset at the end of what was exported. */
int hsa_amd_portable_export_dmabuf(const void *pointer, size_t size, int *dmabuf,
                                   uint64_t *offset) {
    if (!knob("GDRPROBE_HSA_EXPORT", 1))
        return HSA_STATUS_ERROR;
    struct device_allocation *found = allocation_of(pointer);
    if (found) {
        *dmabuf = export_pages(found, (uint64_t)((const char *)pointer - found->start), size, offset);
    } else {
        *offset = 0;
        *dmabuf = memfd_create("gdrprobe-standin-dmabuf", MFD_CLOEXEC);
        if (*dmabuf >= 0 && ftruncate(*dmabuf, (off_t)size) != 0) {
            close(*dmabuf);
            *dmabuf = -1;
        }
    }
    if (*dmabuf < 0)
        return HSA_STATUS_ERROR;
    if (knob("GDRPROBE_HSA_SHORT", 0))
        *offset = (uint64_t)lseek(*dmabuf, 0, SEEK_END);
    return 0;
}
