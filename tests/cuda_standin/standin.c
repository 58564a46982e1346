/*
 * A stand-in libcuda.so.1: binding call shapes, not a GPU.
 *
 * It lets the real cuda.bindings layer (which dlopens libcuda.so.1 and resolves every
 * entry point through cuGetProcAddress_v2) drive gdrprobe's CUDA and GPU-memory code on
 * a machine without a GPU. It implements the driver entry points gdrprobe calls with the
 * driver's C signatures, checks their arguments the way the documentation states them,
 * and backs "device" memory with host memory (a memfd mapping, so a DMA-BUF export can
 * hand out a real file descriptor to the same pages: in the lab, with its exporter loaded,
 * a kernel dma-buf of exactly the exported range; docs/dmabuf-lab.md). It proves argument
 * marshalling, return shapes, enum values, alignment of exported ranges, that a context is
 * current before each call that needs one, fd and allocation lifetimes, and what gdrprobe
 * makes of every CUresult: tests ask for any result of any call through the standin_* control
 * functions (ctypes). It proves nothing about a GPU, GPUDirect or a driver's behaviour
 * beyond its documented interface; tests/gpu is where a real GPU is checked.
 *
 * Built by tests/cuda_standin/build.py at test time; found through LD_LIBRARY_PATH.
 * -DSTANDIN_NO_PROC_ADDRESS_V2 builds a "driver older than CUDA 12.0" that lacks
 * cuGetProcAddress_v2 (what R470-era drivers export).
 */
#define _GNU_SOURCE
#include "standin.h"
#include "gdr_dmabuf_uapi.h"   /* lab/dmabuf: the lab's dma-buf exporter */

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_ALLOCATIONS 256
#define MAX_RULES 64
#define NAME_BYTES 64

enum kind { KIND_NONE, KIND_DEVICE, KIND_MANAGED, KIND_HOST };

struct standin_context { int device; };

struct allocation {
    enum kind kind;
    int device;
    int memfd;                 /* -1 for pinned host memory */
    void *mapping;
    size_t mapped;
    CUdeviceptr address;       /* mapping + the configured offset */
    size_t length;
    int sync_memops;
};

struct rule { char name[NAME_BYTES]; int result; int times; int hidden; };
struct counter { char name[NAME_BYTES]; long calls; };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct standin_context contexts[MAX_DEVICES];
static int retained[MAX_DEVICES];
static struct allocation allocations[MAX_ALLOCATIONS];
static struct rule rules[MAX_RULES];
static struct counter counters[MAX_RULES * 2];
int attributes[MAX_DEVICES][256];
static int device_count = 1;
static int first_bus = 0x3B;           /* device 0's PCI bus (GDRPROBE_STANDIN_FIRST_BUS) */
static int driver_version = 12080;
int initialised;
static size_t alloc_offset;
long calls_without_context;
static int exported_fds[MAX_ALLOCATIONS];
static int exported_count;
static CUdeviceptr last_export_address;
static size_t last_export_length;
static unsigned long long last_export_flags;
static int flushes;
static int compute_held;      /* another process holds the GPU, or no process may use it */
static int pcie_mapping_refused;
static int export_short;      /* a faulty driver: its dma-buf is a page short of the range */
__thread CUcontext current;

/* ---- configuration and failure injection ------------------------------------------ */

static void default_attributes(void)
{
    memset(attributes, 0, sizeof attributes);
    for (int d = 0; d < MAX_DEVICES; d++) {
        attributes[d][116] = 1;   /* GPU_DIRECT_RDMA_SUPPORTED */
        attributes[d][117] = 1;   /* GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS: HOST */
        attributes[d][118] = 0;   /* GPU_DIRECT_RDMA_WRITES_ORDERING: NONE */
        attributes[d][124] = 1;   /* DMA_BUF_SUPPORTED */
        attributes[d][102] = 1;   /* VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED */
        attributes[d][110] = 1;   /* GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED */
    }
}

static void apply_environment(void);
void standin_set_devices(int count);

__attribute__((constructor)) static void standin_load(void)
{
    default_attributes();
    for (int d = 0; d < MAX_DEVICES; d++)
        contexts[d].device = d;
    apply_environment();
}

static struct rule *find_rule(const char *name)
{
    for (int i = 0; i < MAX_RULES; i++)
        if (rules[i].name[0] && strcmp(rules[i].name, name) == 0)
            return &rules[i];
    return NULL;
}

static struct rule *new_rule(const char *name)
{
    struct rule *rule = find_rule(name);
    for (int i = 0; !rule && i < MAX_RULES; i++)
        if (!rules[i].name[0]) {
            rule = &rules[i];
            snprintf(rule->name, NAME_BYTES, "%s", name);
        }
    return rule;
}

static void count_call(const char *name)
{
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++) {
        if (!counters[i].name[0])
            snprintf(counters[i].name, NAME_BYTES, "%s", name);
        if (strcmp(counters[i].name, name) == 0) {
            counters[i].calls++;
            return;
        }
    }
}

CUresult injected(const char *name)
{
    pthread_mutex_lock(&lock);
    count_call(name);
    struct rule *rule = find_rule(name);
    CUresult result = SUCCESS;
    if (rule && rule->times != 0 && rule->result != SUCCESS) {
        result = rule->result;
        if (rule->times > 0)
            rule->times--;
    }
    pthread_mutex_unlock(&lock);
    return result;
}

void standin_fail(const char *name, int result, int times)
{
    pthread_mutex_lock(&lock);
    struct rule *rule = new_rule(name);
    if (rule) { rule->result = result; rule->times = times; }
    pthread_mutex_unlock(&lock);
}

void standin_hide(const char *name)
{
    pthread_mutex_lock(&lock);
    struct rule *rule = new_rule(name);
    if (rule) rule->hidden = 1;
    pthread_mutex_unlock(&lock);
}

void standin_set_attribute(int attribute, int value)
{
    for (int d = 0; d < MAX_DEVICES; d++)
        if (attribute >= 0 && attribute < 256)
            attributes[d][attribute] = value;
}

/* ---- configuration by environment, for a process a test starts (the lab's gdrprobe) ---- */

/* Each "key=number" of a comma-separated list, to apply(key, number). */
static void each_setting(const char *list, void (*apply)(const char *key, int value))
{
    char copy[1024], *saved = NULL;
    snprintf(copy, sizeof copy, "%s", list);
    for (char *item = strtok_r(copy, ",", &saved); item; item = strtok_r(NULL, ",", &saved)) {
        char *equals = strchr(item, '=');
        if (equals) {
            *equals = '\0';
            apply(item, atoi(equals + 1));
        }
    }
}

static void fail_always(const char *name, int result) { standin_fail(name, result, -1); }
static void attribute_setting(const char *key, int value) { standin_set_attribute(atoi(key), value); }

/*
 * GDRPROBE_STANDIN_FAIL        call=result,...: those calls always return that CUresult,
 *                              known to the bindings or not (cuInit=802, cuInit=916)
 * GDRPROBE_STANDIN_ATTRIBUTES  attribute=value,...: device attributes by number (102=0: no VMM)
 * GDRPROBE_STANDIN_DRIVER_VERSION  the CUDA version the driver reports (12040, 11080)
 * GDRPROBE_STANDIN_COMPUTE_MODE    default, prohibited, exclusive-process, or
 *                              exclusive-process-held (another process has the GPU): the
 *                              COMPUTE_MODE attribute, and CUDA_ERROR_DEVICE_UNAVAILABLE from
 *                              cuDevicePrimaryCtxRetain where no context may be made, as the
 *                              CUcomputemode documentation describes
 * GDRPROBE_STANDIN_PCIE_MAPPING    refused: the platform refuses the PCIe mapping type of a
 *                              DMA-BUF export (CUDA_ERROR_NOT_SUPPORTED), as a GPU without a
 *                              C2C link to its CPU may
 * GDRPROBE_STANDIN_DMABUF_EXPORT   short: a faulty driver whose dma-buf is one page shorter
 *                              than the range asked (where the lab's exporter makes real
 *                              dma-bufs): registering the range runs past its end
 * GDRPROBE_STANDIN_DEVICES     how many GPUs the driver lists (0 to MAX_DEVICES; default 1),
 *                              device d at bus 0000:3b+d:00.0: fewer than a test's sysfs
 *                              lists is a GPU lost to CUDA; 0 makes cuInit return
 *                              CUDA_ERROR_NO_DEVICE
 * GDRPROBE_STANDIN_FIRST_BUS   device 0's PCI bus in hex (default 3b), device d's that plus
 *                              d: where a lab guest has functions shown as GPUs (lab/rails.py)
 * GDRPROBE_STANDIN_IOMEMORY    refused (or refused=N): cuMemHostRegister with IOMEMORY fails
 *                              (standin_host.c), as where the driver may not map a NIC's MMIO
 *                              for the GPU; accepted (the default) registers it
 */
static void apply_environment(void)
{
    const char *text;
    if ((text = getenv("GDRPROBE_STANDIN_FAIL")))
        each_setting(text, fail_always);
    if ((text = getenv("GDRPROBE_STANDIN_ATTRIBUTES")))
        each_setting(text, attribute_setting);
    if ((text = getenv("GDRPROBE_STANDIN_DRIVER_VERSION")))
        driver_version = atoi(text);
    if ((text = getenv("GDRPROBE_STANDIN_COMPUTE_MODE"))) {
        int prohibited = strcmp(text, "prohibited") == 0;
        int exclusive = strncmp(text, "exclusive-process", 17) == 0;
        standin_set_attribute(20, prohibited ? 2 : exclusive ? 3 : 0);   /* COMPUTE_MODE */
        compute_held = prohibited || strcmp(text, "exclusive-process-held") == 0;
    }
    if ((text = getenv("GDRPROBE_STANDIN_PCIE_MAPPING")))
        pcie_mapping_refused = strcmp(text, "refused") == 0;
    if ((text = getenv("GDRPROBE_STANDIN_DMABUF_EXPORT")))
        export_short = strcmp(text, "short") == 0;
    if ((text = getenv("GDRPROBE_STANDIN_DEVICES")))
        standin_set_devices(atoi(text));
    if ((text = getenv("GDRPROBE_STANDIN_FIRST_BUS")))
        first_bus = (int)strtol(text, NULL, 16);
    host_apply_environment();
}

void standin_set_devices(int count)
{
    device_count = count < 0 ? 0 : count > MAX_DEVICES ? MAX_DEVICES : count;
}
void standin_set_driver_version(int version) { driver_version = version; }
void standin_set_alloc_offset(size_t offset) { alloc_offset = offset; }

long standin_calls(const char *name)
{
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++)
        if (strcmp(counters[i].name, name) == 0)
            return counters[i].calls;
    return 0;
}

long standin_calls_without_context(void) { return calls_without_context; }
int standin_flushes(void) { return flushes; }

int standin_live(int kind)
{
    int live = kind < 0 ? vmm_live() + host_live() : 0;
    for (int i = 0; i < MAX_ALLOCATIONS; i++)
        if (allocations[i].kind != KIND_NONE && (kind < 0 || (int)allocations[i].kind == kind))
            live++;
    return live;
}

int standin_retained(void)
{
    int total = 0;
    for (int d = 0; d < MAX_DEVICES; d++)
        total += retained[d];
    return total;
}

/* The length a live allocation was made with, or 0. */
size_t standin_length(CUdeviceptr address)
{
    for (int i = 0; i < MAX_ALLOCATIONS; i++)
        if (allocations[i].kind != KIND_NONE && allocations[i].address == address)
            return allocations[i].length;
    return 0;
}

int standin_sync_memops(CUdeviceptr address)
{
    for (int i = 0; i < MAX_ALLOCATIONS; i++)
        if (allocations[i].kind != KIND_NONE && allocations[i].address == address)
            return allocations[i].sync_memops;
    return -1;
}

/* The fds exported so far (the caller owns and must close them) and the last range. */
int standin_exported_fd(int index)
{
    return index < exported_count ? exported_fds[index] : -1;
}

int standin_exported_count(void) { return exported_count; }

void standin_last_export(CUdeviceptr *address, size_t *length, unsigned long long *flags)
{
    *address = last_export_address;
    *length = last_export_length;
    *flags = last_export_flags;
}

/* Free everything and forget every rule: each test starts from a clean driver. */
void standin_reset(void)
{
    for (int i = 0; i < MAX_ALLOCATIONS; i++) {
        struct allocation *a = &allocations[i];
        if (a->kind == KIND_NONE)
            continue;
        munmap(a->mapping, a->mapped);
        if (a->memfd >= 0)
            close(a->memfd);
        memset(a, 0, sizeof *a);
    }
    memset(rules, 0, sizeof rules);
    memset(counters, 0, sizeof counters);
    memset(retained, 0, sizeof retained);
    default_attributes();
    device_count = 1;
    driver_version = 12080;
    alloc_offset = 0;
    calls_without_context = 0;
    exported_count = 0;
    flushes = 0;
    compute_held = pcie_mapping_refused = export_short = 0;
    current = NULL;
    vmm_reset();
    host_reset();
    apply_environment();
}

/* ---- allocations ---------------------------------------------------------------------- */

static struct allocation *allocation_at(CUdeviceptr address)
{
    for (int i = 0; i < MAX_ALLOCATIONS; i++)
        if (allocations[i].kind != KIND_NONE && allocations[i].address == address)
            return &allocations[i];
    return NULL;
}

/* The allocation holding [address, address+length), or NULL. */
static struct allocation *allocation_holding(CUdeviceptr address, size_t length)
{
    for (int i = 0; i < MAX_ALLOCATIONS; i++) {
        struct allocation *a = &allocations[i];
        if (a->kind != KIND_NONE && address >= a->address &&
            address + length <= a->address + a->length && address + length >= address)
            return a;
    }
    return NULL;
}

static CUresult allocate(enum kind kind, size_t length, CUdeviceptr *out)
{
    if (!out || length == 0)
        return INVALID_VALUE;
    struct allocation *slot = NULL;
    for (int i = 0; !slot && i < MAX_ALLOCATIONS; i++)
        if (allocations[i].kind == KIND_NONE)
            slot = &allocations[i];
    if (!slot)
        return OUT_OF_MEMORY;
    size_t offset = kind == KIND_HOST ? 0 : alloc_offset;
    size_t mapped = (length + offset + HOST_PAGE - 1) / HOST_PAGE * HOST_PAGE;
    int memfd = -1;
    void *mapping;
    if (kind == KIND_HOST) {
        mapping = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    } else {
        memfd = memfd_create("gdrprobe-standin-device-memory", MFD_CLOEXEC);
        if (memfd < 0 || ftruncate(memfd, (off_t)mapped) != 0) {
            if (memfd >= 0) close(memfd);
            return OUT_OF_MEMORY;
        }
        mapping = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    }
    if (mapping == MAP_FAILED) {
        if (memfd >= 0) close(memfd);
        return OUT_OF_MEMORY;
    }
    *slot = (struct allocation){kind, current ? current->device : 0, memfd, mapping, mapped,
                                (CUdeviceptr)(uintptr_t)mapping + offset, length, 0};
    *out = slot->address;
    return SUCCESS;
}

static CUresult release(enum kind kind, CUdeviceptr address)
{
    struct allocation *a = allocation_at(address);
    if (!a || (kind == KIND_HOST) != (a->kind == KIND_HOST))
        return INVALID_VALUE;
    munmap(a->mapping, a->mapped);
    if (a->memfd >= 0)
        close(a->memfd);
    memset(a, 0, sizeof *a);
    return SUCCESS;
}

/* ---- the driver API ----------------------------------------------------------------- */

static CUresult cuInit_(unsigned int flags)
{
    ENTER("cuInit");
    if (flags != 0)
        return INVALID_VALUE;
    if (device_count == 0)
        return NO_DEVICE;
    initialised = 1;
    return SUCCESS;
}

static CUresult cuDriverGetVersion_(int *version)
{
    ENTER("cuDriverGetVersion");
    if (!version)
        return INVALID_VALUE;
    *version = driver_version;
    return SUCCESS;
}

static CUresult cuDeviceGetCount_(int *count)
{
    ENTER("cuDeviceGetCount");
    NEEDS_INIT();
    if (!count)
        return INVALID_VALUE;
    *count = device_count;
    return SUCCESS;
}

static CUresult cuDeviceGet_(CUdevice *device, int ordinal)
{
    ENTER("cuDeviceGet");
    NEEDS_INIT();
    if (!device)
        return INVALID_VALUE;
    if (ordinal < 0 || ordinal >= device_count)
        return INVALID_DEVICE;
    *device = ordinal;
    return SUCCESS;
}

int valid_device(CUdevice device) { return device >= 0 && device < device_count; }

static CUresult cuDeviceGetName_(char *name, int length, CUdevice device)
{
    ENTER("cuDeviceGetName");
    NEEDS_INIT();
    if (!name || length <= 0)
        return INVALID_VALUE;
    if (!valid_device(device))
        return INVALID_DEVICE;
    snprintf(name, (size_t)length, "gdrprobe stand-in driver %d (not a GPU)", device);
    return SUCCESS;
}

/* What the doctor records of each GPU (gdrprobe.memory.cuda.device_facts). */
static CUresult cuDeviceTotalMem_(size_t *bytes, CUdevice device)
{
    ENTER("cuDeviceTotalMem");
    NEEDS_INIT();
    if (!bytes)
        return INVALID_VALUE;
    if (!valid_device(device))
        return INVALID_DEVICE;
    *bytes = (size_t)80 << 30;
    return SUCCESS;
}

static CUresult cuDeviceGetPCIBusId_(char *bus_id, int length, CUdevice device)
{
    ENTER("cuDeviceGetPCIBusId");
    NEEDS_INIT();
    if (!bus_id || length < 13)
        return INVALID_VALUE;
    if (!valid_device(device))
        return INVALID_DEVICE;
    /* The driver's spelling: an 8-digit domain, upper-case hex. */
    snprintf(bus_id, (size_t)length, "00000000:%02X:00.0", first_bus + device);
    return SUCCESS;
}

static CUresult cuDeviceGetByPCIBusId_(CUdevice *device, const char *bus_id)
{
    ENTER("cuDeviceGetByPCIBusId");
    NEEDS_INIT();
    unsigned domain, bus, slot, function;
    if (!device || !bus_id ||
        sscanf(bus_id, "%x:%x:%x.%x", &domain, &bus, &slot, &function) != 4)
        return INVALID_VALUE;
    int ordinal = (int)bus - first_bus;
    if (domain != 0 || slot != 0 || function != 0 || !valid_device(ordinal))
        return INVALID_DEVICE;
    *device = ordinal;
    return SUCCESS;
}

static CUresult cuDeviceGetAttribute_(int *value, int attribute, CUdevice device)
{
    ENTER("cuDeviceGetAttribute");
    NEEDS_INIT();
    if (!value || attribute < 0 || attribute >= 256)
        return INVALID_VALUE;
    if (!valid_device(device))
        return INVALID_DEVICE;
    *value = attributes[device][attribute];
    return SUCCESS;
}

static CUresult cuDevicePrimaryCtxRetain_(CUcontext *context, CUdevice device)
{
    ENTER("cuDevicePrimaryCtxRetain");
    NEEDS_INIT();
    if (!context)
        return INVALID_VALUE;
    if (!valid_device(device))
        return INVALID_DEVICE;
    if (compute_held)
        return DEVICE_UNAVAILABLE;
    retained[device]++;
    *context = &contexts[device];
    return SUCCESS;
}

static CUresult cuDevicePrimaryCtxRelease_(CUdevice device)
{
    ENTER("cuDevicePrimaryCtxRelease");
    NEEDS_INIT();
    if (!valid_device(device))
        return INVALID_DEVICE;
    if (retained[device] == 0)
        return INVALID_CONTEXT;
    if (--retained[device] == 0 && current == &contexts[device])
        current = NULL;
    return SUCCESS;
}

static CUresult cuCtxSetCurrent_(CUcontext context)
{
    ENTER("cuCtxSetCurrent");
    NEEDS_INIT();
    if (context && (context < contexts || context >= contexts + MAX_DEVICES ||
                    retained[context->device] == 0))
        return INVALID_CONTEXT;
    current = context;
    return SUCCESS;
}

static CUresult cuCtxGetCurrent_(CUcontext *context)
{
    ENTER("cuCtxGetCurrent");
    NEEDS_INIT();
    if (!context)
        return INVALID_VALUE;
    *context = current;
    return SUCCESS;
}

static CUresult cuMemAlloc_(CUdeviceptr *address, size_t length)
{
    ENTER("cuMemAlloc");
    NEEDS_INIT();
    NEEDS_CONTEXT();
    return allocate(KIND_DEVICE, length, address);
}

static CUresult cuMemAllocManaged_(CUdeviceptr *address, size_t length, unsigned int flags)
{
    ENTER("cuMemAllocManaged");
    NEEDS_INIT();
    NEEDS_CONTEXT();
    if (flags != 1 && flags != 2)   /* CU_MEM_ATTACH_GLOBAL or _HOST */
        return INVALID_VALUE;
    return allocate(KIND_MANAGED, length, address);
}

static CUresult cuMemFree_(CUdeviceptr address)
{
    ENTER("cuMemFree");
    NEEDS_INIT();
    NEEDS_CONTEXT();
    return release(KIND_DEVICE, address);
}

static CUresult cuMemHostAlloc_(void **address, size_t length, unsigned int flags)
{
    ENTER("cuMemHostAlloc");
    NEEDS_INIT();
    NEEDS_CONTEXT();
    if (flags & ~0xfu)   /* PORTABLE 1, DEVICEMAP 2, WRITECOMBINED 4, (13.x) 8 */
        return INVALID_VALUE;
    CUdeviceptr out = 0;
    CUresult result = allocate(KIND_HOST, length, address ? &out : NULL);
    if (result == SUCCESS)
        *address = (void *)(uintptr_t)out;
    return result;
}

static CUresult cuMemFreeHost_(void *address)
{
    ENTER("cuMemFreeHost");
    NEEDS_INIT();
    NEEDS_CONTEXT();
    return release(KIND_HOST, (CUdeviceptr)(uintptr_t)address);
}

static CUresult cuPointerSetAttribute_(const void *value, int attribute, CUdeviceptr address)
{
    ENTER("cuPointerSetAttribute");
    NEEDS_INIT();
    NEEDS_CONTEXT();
    struct allocation *a = allocation_holding(address, 1);
    if (!value || attribute != 6 /* SYNC_MEMOPS */ || !a || a->kind == KIND_HOST)
        return INVALID_VALUE;
    a->sync_memops = *(const int *)value;
    return SUCCESS;
}

static CUresult copy_checked(void *to, const void *from, size_t length, CUdeviceptr device_side)
{
    if (!to || !from)
        return INVALID_VALUE;
    /* Under UVA a pinned host allocation (DEVICEMAP) is a valid device-side address too;
     * VMM memory only once mapped and made accessible (cuMemSetAccess). */
    struct vmm_span span;
    if (!allocation_holding(device_side, length) && !vmm_find(device_side, length, &span))
        return INVALID_VALUE;
    memmove(to, from, length);
    return SUCCESS;
}

static CUresult cuMemcpyHtoD_(CUdeviceptr to, const void *from, size_t length)
{
    ENTER("cuMemcpyHtoD");
    NEEDS_INIT();
    NEEDS_CONTEXT();
    return copy_checked((void *)(uintptr_t)to, from, length, to);
}

static CUresult cuMemcpyDtoH_(void *to, CUdeviceptr from, size_t length)
{
    ENTER("cuMemcpyDtoH");
    NEEDS_INIT();
    NEEDS_CONTEXT();
    return copy_checked(to, (const void *)(uintptr_t)from, length, from);
}

/* The DMA-BUF fd for [address, address + length) of span's memfd: a real dma-buf of exactly
 * that range where the lab's exporter is loaded (lab/dmabuf/exporter, /dev/gdr_dmabuf), as
 * the driver exports exactly the range asked; elsewhere the memfd itself (same pages, no
 * kernel dma-buf). Returns the fd or -errno. */
static int export_range(const struct vmm_span *span, CUdeviceptr address, size_t length)
{
    int exporter = open(GDR_DMABUF_DEVICE, O_RDWR | O_CLOEXEC);
    if (exporter < 0) {
        int fd = fcntl(span->memfd, F_DUPFD_CLOEXEC, 3);
        return fd < 0 ? -errno : fd;
    }
    size_t exported = export_short && length > HOST_PAGE ? length - HOST_PAGE : length;
    struct gdr_dmabuf_create request = {span->memfd, 0, address - span->start, exported};
    int fd = ioctl(exporter, GDR_DMABUF_CREATE, &request);
    int error = errno;
    close(exporter);
    return fd < 0 ? -error : fd;
}

static CUresult cuMemGetHandleForAddressRange_(void *handle, CUdeviceptr address, size_t length,
                                               int handle_type, unsigned long long flags)
{
    ENTER("cuMemGetHandleForAddressRange");
    NEEDS_INIT();
    NEEDS_CONTEXT();
    /* The documented rules: a DMA-BUF fd (type 1) of a host-page-aligned range of device
     * memory; flags 0 or the PCIe mapping flag (1, CUDA 12.8+). */
    if (!handle || handle_type != 1 || flags > 1)
        return INVALID_VALUE;
    if (flags == 1 && driver_version < 12080)
        return INVALID_VALUE;
    if (flags == 1 && pcie_mapping_refused)
        return NOT_SUPPORTED;
    if (address % HOST_PAGE || length % HOST_PAGE || length == 0)
        return INVALID_VALUE;
    /* The exported range may start before the buffer (aligned down) inside its mapping;
     * VMM memory exports where it is mapped and accessible. */
    struct vmm_span span = {-1, 0, 0, 0};
    for (int i = 0; i < MAX_ALLOCATIONS; i++) {
        struct allocation *c = &allocations[i];
        CUdeviceptr base = (CUdeviceptr)(uintptr_t)c->mapping;
        if (c->kind == KIND_DEVICE && address >= base && address + length <= base + c->mapped)
            span = (struct vmm_span){c->memfd, base, c->mapped, c->device};
    }
    if (span.memfd < 0 && !vmm_find(address, length, &span))
        return INVALID_VALUE;
    if (!attributes[span.device][124])
        return NOT_SUPPORTED;
    int fd = export_range(&span, address, length);
    if (fd < 0)
        return fd == -EINVAL ? INVALID_VALUE : OUT_OF_MEMORY;
    *(int *)handle = fd;
    last_export_address = address;
    last_export_length = length;
    last_export_flags = flags;
    if (exported_count < MAX_ALLOCATIONS)
        exported_fds[exported_count++] = fd;
    return SUCCESS;
}

static CUresult cuFlushGPUDirectRDMAWrites_(int target, int scope)
{
    ENTER("cuFlushGPUDirectRDMAWrites");
    NEEDS_INIT();
    NEEDS_CONTEXT();
    if (target != 0 || (scope != 100 && scope != 200))
        return INVALID_VALUE;
    flushes++;
    return SUCCESS;
}

static CUresult cuGetErrorName_(CUresult error, const char **name)
{
    if (!name)
        return INVALID_VALUE;
    static char text[32];
    snprintf(text, sizeof text, "CUresult %d", error);
    *name = text;
    return SUCCESS;
}

/* ---- resolution, as the real driver does it ----------------------------------------- */

struct entry { const char *name; void *function; };

static const struct entry entries[] = {
    {"cuInit", (void *)cuInit_},
    {"cuDriverGetVersion", (void *)cuDriverGetVersion_},
    {"cuDeviceGetCount", (void *)cuDeviceGetCount_},
    {"cuDeviceGet", (void *)cuDeviceGet_},
    {"cuDeviceGetName", (void *)cuDeviceGetName_},
    {"cuDeviceGetPCIBusId", (void *)cuDeviceGetPCIBusId_},
    {"cuDeviceTotalMem", (void *)cuDeviceTotalMem_},
    {"cuDeviceGetByPCIBusId", (void *)cuDeviceGetByPCIBusId_},
    {"cuDeviceGetAttribute", (void *)cuDeviceGetAttribute_},
    {"cuDevicePrimaryCtxRetain", (void *)cuDevicePrimaryCtxRetain_},
    {"cuDevicePrimaryCtxRelease", (void *)cuDevicePrimaryCtxRelease_},
    {"cuCtxSetCurrent", (void *)cuCtxSetCurrent_},
    {"cuCtxGetCurrent", (void *)cuCtxGetCurrent_},
    {"cuMemAlloc", (void *)cuMemAlloc_},
    {"cuMemAllocManaged", (void *)cuMemAllocManaged_},
    {"cuMemFree", (void *)cuMemFree_},
    {"cuMemHostAlloc", (void *)cuMemHostAlloc_},
    {"cuMemFreeHost", (void *)cuMemFreeHost_},
    {"cuPointerSetAttribute", (void *)cuPointerSetAttribute_},
    {"cuMemcpyHtoD", (void *)cuMemcpyHtoD_},
    {"cuMemcpyDtoH", (void *)cuMemcpyDtoH_},
    {"cuMemGetHandleForAddressRange", (void *)cuMemGetHandleForAddressRange_},
    {"cuFlushGPUDirectRDMAWrites", (void *)cuFlushGPUDirectRDMAWrites_},
    {"cuGetErrorName", (void *)cuGetErrorName_},
};

CUresult cuGetProcAddress_v2(const char *symbol, void **function, int version,
                             unsigned long long flags, int *status);

/* The bindings ask by base name ("cuMemAlloc"); the version picks the ABI, and every
 * entry here has the 64-bit (_v2) one that CUDA 3.2+ names use. */
static void *resolve(const char *symbol)
{
    pthread_mutex_lock(&lock);
    struct rule *rule = find_rule(symbol);
    int hidden = rule && rule->hidden;
    pthread_mutex_unlock(&lock);
    if (hidden)
        return NULL;
#ifndef STANDIN_NO_PROC_ADDRESS_V2
    if (strcmp(symbol, "cuGetProcAddress") == 0)
        return (void *)cuGetProcAddress_v2;
#endif
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++)
        if (strcmp(entries[i].name, symbol) == 0)
            return entries[i].function;
    void *found = vmm_entry(symbol);
    return found ? found : host_entry(symbol);
}

#ifndef STANDIN_NO_PROC_ADDRESS_V2
CUresult cuGetProcAddress_v2(const char *symbol, void **function, int version,
                             unsigned long long flags, int *status)
{
    (void)version;
    (void)flags;
    if (!symbol || !function)
        return INVALID_VALUE;
    *function = resolve(symbol);
    if (status)
        *status = *function ? 0 : 1;   /* SUCCESS : SYMBOL_NOT_FOUND */
    return *function ? SUCCESS : NOT_FOUND;
}
#endif

CUresult cuGetProcAddress(const char *symbol, void **function, int version,
                          unsigned long long flags)
{
    (void)version;
    (void)flags;
    if (!symbol || !function)
        return INVALID_VALUE;
    *function = resolve(symbol);
    return *function ? SUCCESS : NOT_FOUND;
}

/* Exported under their ABI names too, for loaders that dlsym them directly. */
CUresult cuInit(unsigned int flags) { return cuInit_(flags); }
CUresult cuDriverGetVersion(int *version) { return cuDriverGetVersion_(version); }
