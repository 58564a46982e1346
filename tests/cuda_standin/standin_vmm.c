/*
 * The stand-in's virtual memory management calls: the ones NCCL allocates its buffers with
 * (cuMemGetAllocationGranularity, cuMemCreate, cuMemAddressReserve, cuMemMap,
 * cuMemSetAccess, and cuMemUnmap, cuMemRelease, cuMemAddressFree to free them), with the
 * driver's C signatures and structures and the rules the CUDA driver API documentation
 * states: sizes and addresses in whole granules, a whole allocation mapped into a reserved
 * range, memory the GPU may touch only after cuMemSetAccess, a range freed only once
 * unmapped, an allocation kept until its last mapping goes. Physical memory is a memfd, so
 * a mapping is host memory a NIC can register and a DMA-BUF export has a real fd.
 * Binding call shapes, not a GPU.
 */
#define _GNU_SOURCE
#include "standin.h"

#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define GRANULARITY (2ULL << 20)   /* the minimum granularity a GPU reports */
#define MAX_VMM 64

typedef unsigned long long CUmemGenericAllocationHandle;
/* cuda.h's structures: identical in size and layout in the 12.x and 13.x headers (13.x
 * adds a 2-byte alternative to CUmemLocation's id, in a union the size of an int). */
typedef struct { int type; int id; } CUmemLocation;
typedef struct {
    int type;                       /* CUmemAllocationType */
    int requestedHandleTypes;       /* CUmemAllocationHandleType, a bit mask */
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc;

enum {
    ALLOCATION_TYPE_PINNED = 1, LOCATION_TYPE_DEVICE = 1, HANDLE_TYPES_KNOWN = 0xF,
    HANDLE_TYPE_FABRIC = 0x8, ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED = 128,
    ACCESS_NONE = 0, ACCESS_READ = 1, ACCESS_READWRITE = 3, GRANULARITY_RECOMMENDED = 1,
};

struct physical { int live, device, memfd, gdr_capable, released, mappings, handle_types; size_t size; };
struct reservation { int live; void *base; size_t mapped; CUdeviceptr start; size_t size; };
struct mapping { int live, physical, accessible; CUdeviceptr start; size_t size; };

static pthread_mutex_t vmm_lock = PTHREAD_MUTEX_INITIALIZER;
static struct physical physicals[MAX_VMM];
static struct reservation reservations[MAX_VMM];
static struct mapping mappings[MAX_VMM];

static int valid_location(const CUmemLocation *location)
{
    return location->type == LOCATION_TYPE_DEVICE && valid_device(location->id);
}

static int valid_prop(const CUmemAllocationProp *prop)
{
    return prop && prop->type == ALLOCATION_TYPE_PINNED && valid_location(&prop->location)
        && !(prop->requestedHandleTypes & ~HANDLE_TYPES_KNOWN);
}

static int whole_granules(unsigned long long value) { return value % GRANULARITY == 0; }

static struct physical *physical_of(CUmemGenericAllocationHandle handle)
{
    if (handle == 0 || handle > MAX_VMM || !physicals[handle - 1].live)
        return NULL;
    return &physicals[handle - 1];
}

static void free_physical(struct physical *p)
{
    close(p->memfd);
    memset(p, 0, sizeof *p);
}

static struct mapping *mapping_at(CUdeviceptr start, size_t size)
{
    for (int i = 0; i < MAX_VMM; i++)
        if (mappings[i].live && mappings[i].start == start && mappings[i].size == size)
            return &mappings[i];
    return NULL;
}

static int overlaps_a_mapping(CUdeviceptr start, size_t size)
{
    for (int i = 0; i < MAX_VMM; i++)
        if (mappings[i].live && start < mappings[i].start + mappings[i].size &&
            mappings[i].start < start + size)
            return 1;
    return 0;
}

static struct reservation *reservation_holding(CUdeviceptr start, size_t size)
{
    for (int i = 0; i < MAX_VMM; i++) {
        struct reservation *r = &reservations[i];
        if (r->live && start >= r->start && start + size <= r->start + r->size)
            return r;
    }
    return NULL;
}

/* ---- the entry points ---------------------------------------------------------------- */

static CUresult cuMemGetAllocationGranularity_(size_t *granularity,
                                               const CUmemAllocationProp *prop, int option)
{
    ENTER("cuMemGetAllocationGranularity");
    NEEDS_INIT();
    if (!granularity || !valid_prop(prop) || option < 0 || option > GRANULARITY_RECOMMENDED)
        return INVALID_VALUE;
    *granularity = GRANULARITY;
    return SUCCESS;
}

static CUresult cuMemCreate_(CUmemGenericAllocationHandle *handle, size_t size,
                             const CUmemAllocationProp *prop, unsigned long long flags)
{
    ENTER("cuMemCreate");
    NEEDS_INIT();
    if (!handle || flags != 0 || !valid_prop(prop) || size == 0 || !whole_granules(size))
        return INVALID_VALUE;
    int device = prop->location.id;
    if (!attributes[device][102])                       /* no VMM on this GPU */
        return NOT_SUPPORTED;
    if (prop->allocFlags.gpuDirectRDMACapable && !attributes[device][110])
        return NOT_SUPPORTED;                           /* no GPUDirect RDMA for VMM memory */
    if ((prop->requestedHandleTypes & HANDLE_TYPE_FABRIC)
        && !attributes[device][ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED])
        return NOT_SUPPORTED;                           /* no fabric handles on this GPU */
    pthread_mutex_lock(&vmm_lock);
    CUresult result = OUT_OF_MEMORY;
    for (int i = 0; i < MAX_VMM; i++) {
        if (physicals[i].live)
            continue;
        int memfd = memfd_create("gdrprobe-standin-vmm-memory", MFD_CLOEXEC);
        if (memfd >= 0 && ftruncate(memfd, (off_t)size) == 0) {
            physicals[i] = (struct physical){1, device, memfd,
                                             prop->allocFlags.gpuDirectRDMACapable, 0, 0,
                                             prop->requestedHandleTypes, size};
            *handle = (CUmemGenericAllocationHandle)i + 1;
            result = SUCCESS;
        } else if (memfd >= 0) {
            close(memfd);
        }
        break;
    }
    pthread_mutex_unlock(&vmm_lock);
    return result;
}

static CUresult cuMemAddressReserve_(CUdeviceptr *ptr, size_t size, size_t alignment,
                                     CUdeviceptr addr, unsigned long long flags)
{
    ENTER("cuMemAddressReserve");
    NEEDS_INIT();
    size_t align = alignment ? alignment : GRANULARITY;
    if (!ptr || flags != 0 || addr != 0 || size == 0 || !whole_granules(size) ||
        (align & (align - 1)) || !whole_granules(align))
        return INVALID_VALUE;
    size_t mapped = size + align;
    void *base = mmap(NULL, mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED)
        return OUT_OF_MEMORY;
    pthread_mutex_lock(&vmm_lock);
    CUresult result = OUT_OF_MEMORY;
    for (int i = 0; i < MAX_VMM && result != SUCCESS; i++) {
        if (reservations[i].live)
            continue;
        CUdeviceptr start = ((CUdeviceptr)(uintptr_t)base + align - 1) & ~(CUdeviceptr)(align - 1);
        reservations[i] = (struct reservation){1, base, mapped, start, size};
        *ptr = start;
        result = SUCCESS;
    }
    pthread_mutex_unlock(&vmm_lock);
    if (result != SUCCESS)
        munmap(base, mapped);
    return result;
}

static CUresult cuMemMap_(CUdeviceptr ptr, size_t size, size_t offset,
                          CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    ENTER("cuMemMap");
    NEEDS_INIT();
    pthread_mutex_lock(&vmm_lock);
    struct physical *p = physical_of(handle);
    CUresult result = INVALID_VALUE;
    if (p && !p->released && offset == 0 && flags == 0 && size == p->size &&
        reservation_holding(ptr, size) && !overlaps_a_mapping(ptr, size)) {
        for (int i = 0; i < MAX_VMM; i++) {
            if (mappings[i].live)
                continue;
            void *at = mmap((void *)(uintptr_t)ptr, size, PROT_READ | PROT_WRITE,
                            MAP_SHARED | MAP_FIXED, p->memfd, 0);
            if (at == MAP_FAILED) {
                result = OUT_OF_MEMORY;
                break;
            }
            mappings[i] = (struct mapping){1, (int)(p - physicals), 0, ptr, size};
            p->mappings++;
            result = SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&vmm_lock);
    return result;
}

static CUresult cuMemSetAccess_(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                size_t count)
{
    ENTER("cuMemSetAccess");
    NEEDS_INIT();
    if (!desc || count == 0)
        return INVALID_VALUE;
    for (size_t k = 0; k < count; k++)
        if (!valid_location(&desc[k].location) || (desc[k].flags != ACCESS_NONE &&
                                                   desc[k].flags != ACCESS_READ &&
                                                   desc[k].flags != ACCESS_READWRITE))
            return INVALID_VALUE;
    pthread_mutex_lock(&vmm_lock);
    struct mapping *m = mapping_at(ptr, size);
    if (m)
        m->accessible = desc[count - 1].flags == ACCESS_READWRITE;
    pthread_mutex_unlock(&vmm_lock);
    return m ? SUCCESS : INVALID_VALUE;
}

static CUresult cuMemUnmap_(CUdeviceptr ptr, size_t size)
{
    ENTER("cuMemUnmap");
    NEEDS_INIT();
    pthread_mutex_lock(&vmm_lock);
    struct mapping *m = mapping_at(ptr, size);
    if (m) {
        /* The range stays reserved: back to inaccessible anonymous pages. */
        mmap((void *)(uintptr_t)ptr, size, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
        struct physical *p = &physicals[m->physical];
        if (--p->mappings == 0 && p->released)
            free_physical(p);
        memset(m, 0, sizeof *m);
    }
    pthread_mutex_unlock(&vmm_lock);
    return m ? SUCCESS : INVALID_VALUE;
}

static CUresult cuMemRelease_(CUmemGenericAllocationHandle handle)
{
    ENTER("cuMemRelease");
    NEEDS_INIT();
    pthread_mutex_lock(&vmm_lock);
    struct physical *p = physical_of(handle);
    if (p && !p->released) {
        if (p->mappings)
            p->released = 1;      /* freed when its last mapping goes */
        else
            free_physical(p);
    }
    pthread_mutex_unlock(&vmm_lock);
    return p ? SUCCESS : INVALID_VALUE;
}

static CUresult cuMemAddressFree_(CUdeviceptr ptr, size_t size)
{
    ENTER("cuMemAddressFree");
    NEEDS_INIT();
    pthread_mutex_lock(&vmm_lock);
    struct reservation *r = reservation_holding(ptr, size);
    int ok = r && r->start == ptr && r->size == size && !overlaps_a_mapping(ptr, size);
    if (ok) {
        munmap(r->base, r->mapped);
        memset(r, 0, sizeof *r);
    }
    pthread_mutex_unlock(&vmm_lock);
    return ok ? SUCCESS : INVALID_VALUE;
}

/* ---- what standin.c and the tests ask ---------------------------------------------- */

int vmm_find(CUdeviceptr address, size_t length, struct vmm_span *span)
{
    int found = 0;
    pthread_mutex_lock(&vmm_lock);
    for (int i = 0; i < MAX_VMM && !found; i++) {
        struct mapping *m = &mappings[i];
        if (m->live && m->accessible && address >= m->start &&
            address + length <= m->start + m->size) {
            struct physical *p = &physicals[m->physical];
            *span = (struct vmm_span){p->memfd, m->start, m->size, p->device};
            found = 1;
        }
    }
    pthread_mutex_unlock(&vmm_lock);
    return found;
}

int vmm_live(void)
{
    int live = 0;
    for (int i = 0; i < MAX_VMM; i++)
        live += physicals[i].live + reservations[i].live;
    return live;
}

void vmm_reset(void)
{
    pthread_mutex_lock(&vmm_lock);
    for (int i = 0; i < MAX_VMM; i++) {
        if (reservations[i].live)
            munmap(reservations[i].base, reservations[i].mapped);
        if (physicals[i].live)
            close(physicals[i].memfd);
    }
    memset(reservations, 0, sizeof reservations);
    memset(physicals, 0, sizeof physicals);
    memset(mappings, 0, sizeof mappings);
    pthread_mutex_unlock(&vmm_lock);
}

static struct mapping *mapping_starting_at(CUdeviceptr ptr)
{
    for (int i = 0; i < MAX_VMM; i++)
        if (mappings[i].live && mappings[i].start == ptr)
            return &mappings[i];
    return NULL;
}

/* Whether the VMM allocation mapped at ptr asked for GPUDirect RDMA; -1: none mapped there. */
int standin_vmm_gdr_capable(CUdeviceptr ptr)
{
    struct mapping *m = mapping_starting_at(ptr);
    return m ? physicals[m->physical].gdr_capable : -1;
}

/* The handle types the VMM allocation mapped at ptr asked for; -1: none mapped there. */
int standin_vmm_handle_types(CUdeviceptr ptr)
{
    struct mapping *m = mapping_starting_at(ptr);
    return m ? physicals[m->physical].handle_types : -1;
}

/* Whether the VMM memory at ptr is mapped (1) and accessible (2); 0: not mapped. */
int standin_vmm_state(CUdeviceptr ptr)
{
    struct mapping *m = mapping_starting_at(ptr);
    return m ? 1 + m->accessible : 0;
}

static const struct { const char *name; void *function; } vmm_entries[] = {
    {"cuMemGetAllocationGranularity", (void *)cuMemGetAllocationGranularity_},
    {"cuMemCreate", (void *)cuMemCreate_},
    {"cuMemAddressReserve", (void *)cuMemAddressReserve_},
    {"cuMemMap", (void *)cuMemMap_},
    {"cuMemSetAccess", (void *)cuMemSetAccess_},
    {"cuMemUnmap", (void *)cuMemUnmap_},
    {"cuMemRelease", (void *)cuMemRelease_},
    {"cuMemAddressFree", (void *)cuMemAddressFree_},
};

void *vmm_entry(const char *name)
{
    for (size_t i = 0; i < sizeof vmm_entries / sizeof vmm_entries[0]; i++)
        if (strcmp(vmm_entries[i].name, name) == 0)
            return vmm_entries[i].function;
    return NULL;
}
