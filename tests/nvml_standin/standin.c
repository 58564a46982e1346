/*
 * A stand-in libnvidia-ml.so.1: NVML's C interface as NCCL calls it, not a GPU.
 *
 * It exports the entry points NCCL resolves with dlsym (NVIDIA/nccl src/misc/nvmlwrap.cc:
 * nvmlInit_v2, nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex,
 * nvmlDeviceGetHandleByPciBusId, nvmlDeviceGetCudaComputeCapability,
 * nvmlDeviceGetNvLinkCapability, nvmlDeviceGetNvLinkState, nvmlDeviceGetNvLinkRemotePciInfo,
 * nvmlDeviceGetNvLinkRemoteDeviceType (2.31), nvmlDeviceGetFieldValues, nvmlErrorString,
 * nvmlShutdown) with NVML's C signatures and struct layouts, and answers from the
 * environment, read again at every nvmlInit:
 *
 *   GDRPROBE_NVML_GPUS     "BUS@SM,..."  the GPUs in NVML's index order, with sm (90: Hopper)
 *   GDRPROBE_NVML_NVLINKS  "BUS>END*N[:inactive|:nop2p],..."  N NVLinks of GPU BUS to END:
 *                          a GPU's bus id, "switch" (an NVSwitch this machine does not
 *                          show: remote type switch, empty bus id) or "switch=BUS"
 *   GDRPROBE_NVML_C2C      "BUS=N[/ACTIVE],..."  C2C links of GPU BUS, ACTIVE of them up
 *   GDRPROBE_NVML_FAIL     "call=result,..."  an NVML result for a call (9: driver not loaded)
 *   GDRPROBE_NVML_HANG_S   "call=seconds,..."  the call sleeps first (a wedged driver)
 *
 * standin_nvml_called() lists the entry points called since the last nvmlInit, so a test
 * can hold gdrprobe to NCCL's. Built by tests/nvml_standin/build.py at test time;
 * -DSTANDIN_NO_REMOTE_DEVICE_TYPE builds a driver without
 * nvmlDeviceGetNvLinkRemoteDeviceType. Proves call shapes and NCCL's reading of them,
 * nothing about a GPU or a driver's behaviour.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define MAX_GPUS 32
#define MAX_LINKS 18
#define MAX_RULES 16
#define BUS_BYTES 16
#define NAME_BYTES 64
#define CALLED_BYTES 2048

enum { SUCCESS = 0, ERROR_UNINITIALIZED = 1, ERROR_INVALID_ARGUMENT = 2, ERROR_NOT_SUPPORTED = 3,
       ERROR_NOT_FOUND = 6 };
enum { TYPE_GPU = 0, TYPE_SWITCH = 2 };
enum { FI_NVLINK_GET_STATE = 165, FI_C2C_LINK_COUNT = 170, FI_C2C_LINK_GET_STATUS = 171,
       FI_C2C_LINK_GET_MAX_BW = 172 };
#define C2C_MAX_BW_MBPS 450000u

struct link { int used, active, p2p, type; char end[BUS_BYTES]; };
struct gpu { char bus[BUS_BYTES]; int sm; struct link links[MAX_LINKS]; unsigned c2c, c2c_active; };
struct rule { char name[NAME_BYTES]; int value; };

/* nvml.h's layouts (NCCL's copy: src/include/nvmlwrap.h) */
typedef struct { char busId[BUS_BYTES]; unsigned domain, bus, device, pciDeviceId, pciSubSystemId,
                 reserved[4]; } nvmlPciInfo_t;
typedef union { double dVal; unsigned uiVal; unsigned long ulVal; unsigned long long ullVal;
                long long sllVal; } nvmlValue_t;
typedef struct { unsigned fieldId, scopeId; long long timestamp, latencyUsec; unsigned valueType;
                 int nvmlReturn; nvmlValue_t value; } nvmlFieldValue_t;

static struct gpu gpus[MAX_GPUS];
static unsigned ngpus;
static int initialised;
static struct rule fails[MAX_RULES], hangs[MAX_RULES];
static char called[CALLED_BYTES];

static void lower_bus(char *out, const char *in, size_t n) {
    /* 00000000:1B:00.0 and 0000:1b:00.0 alike: a 4-digit domain, lower case */
    const char *colon = strchr(in, ':');
    size_t domain = colon ? (size_t)(colon - in) : 0;
    const char *start = domain > 4 ? in + domain - 4 : in;
    size_t i;
    for (i = 0; i + 1 < n && start[i] && !strchr(",*>@=", start[i]); i++)
        out[i] = (char)tolower((unsigned char)start[i]);
    out[i] = 0;
}

static void note_call(const char *name) {
    size_t used = strlen(called), len = strlen(name);
    char needle[NAME_BYTES + 2];
    snprintf(needle, sizeof needle, ",%s,", name);
    char haystack[CALLED_BYTES + 2];
    snprintf(haystack, sizeof haystack, ",%s", called);
    if (strstr(haystack, needle) || used + len + 2 >= CALLED_BYTES) return;
    memcpy(called + used, name, len);
    called[used + len] = ',';
    called[used + len + 1] = 0;
}

static int read_rules(const char *variable, struct rule *rules) {
    memset(rules, 0, sizeof(struct rule) * MAX_RULES);
    const char *text = getenv(variable);
    int n = 0;
    while (text && *text && n < MAX_RULES) {
        const char *end = strchr(text, ','), *eq = strchr(text, '=');
        size_t item = end ? (size_t)(end - text) : strlen(text);
        if (eq && (size_t)(eq - text) < item && (size_t)(eq - text) < NAME_BYTES) {
            memcpy(rules[n].name, text, (size_t)(eq - text));
            rules[n].value = atoi(eq + 1);
            n++;
        }
        text += item + (end ? 1 : 0);
    }
    return n;
}

static int rule_of(const struct rule *rules, const char *name, int *value) {
    for (int i = 0; i < MAX_RULES && rules[i].name[0]; i++)
        if (strcmp(rules[i].name, name) == 0) { *value = rules[i].value; return 1; }
    return 0;
}

/* Every call: noted, then its hang and its forced result, if any. */
static int enter(const char *name) {
    int value;
    note_call(name);
    if (rule_of(hangs, name, &value) && value > 0) sleep((unsigned)value);
    return rule_of(fails, name, &value) ? value : SUCCESS;
}

static struct gpu *find(const char *bus) {
    char want[BUS_BYTES];
    lower_bus(want, bus, sizeof want);
    for (unsigned i = 0; i < ngpus; i++)
        if (strcmp(gpus[i].bus, want) == 0) return &gpus[i];
    return NULL;
}

static void read_gpus(void) {
    const char *text = getenv("GDRPROBE_NVML_GPUS");
    memset(gpus, 0, sizeof gpus);
    ngpus = 0;
    while (text && *text && ngpus < MAX_GPUS) {
        const char *at = strchr(text, '@'), *end = strchr(text, ',');
        lower_bus(gpus[ngpus].bus, text, BUS_BYTES);
        gpus[ngpus].sm = at && (!end || at < end) ? atoi(at + 1) : 90;
        ngpus++;
        text = end ? end + 1 : "";
    }
}

static void read_nvlinks(void) {
    const char *text = getenv("GDRPROBE_NVML_NVLINKS");
    while (text && *text) {
        const char *end = strchr(text, ','), *to = strchr(text, '>');
        size_t item = end ? (size_t)(end - text) : strlen(text);
        char entry[128] = "";
        if (item < sizeof entry) memcpy(entry, text, item);
        entry[item < sizeof entry ? item : 0] = 0;
        text += item + (end ? 1 : 0);
        struct gpu *gpu = to ? find(entry) : NULL;
        char *target = strchr(entry, '>'), *star = strchr(entry, '*');
        if (!gpu || !target) continue;
        int count = star ? atoi(star + 1) : 1;
        int active = !strstr(entry, ":inactive"), p2p = !strstr(entry, ":nop2p");
        if (star) *star = 0;
        target++;
        int type = strncmp(target, "switch", 6) == 0 ? TYPE_SWITCH : TYPE_GPU;
        const char *end_bus = type == TYPE_SWITCH ? (target[6] == '=' ? target + 7 : "") : target;
        for (int l = 0; l < MAX_LINKS && count > 0; l++) {
            struct link *link = &gpu->links[l];
            if (link->used) continue;
            link->used = 1; link->active = active; link->p2p = p2p; link->type = type;
            lower_bus(link->end, end_bus, BUS_BYTES);
            count--;
        }
    }
}

static void read_c2c(void) {
    const char *text = getenv("GDRPROBE_NVML_C2C");
    while (text && *text) {
        const char *end = strchr(text, ','), *eq = strchr(text, '=');
        struct gpu *gpu = find(text);
        if (gpu && eq && (!end || eq < end)) {
            const char *slash = strchr(eq, '/');
            gpu->c2c = (unsigned)atoi(eq + 1);
            gpu->c2c_active = slash && (!end || slash < end) ? (unsigned)atoi(slash + 1) : gpu->c2c;
        }
        text = end ? end + 1 : "";
    }
}

static struct gpu *handle_gpu(void *device) {
    struct gpu *gpu = device;
    return initialised && gpu >= gpus && gpu < gpus + ngpus ? gpu : NULL;
}

static struct link *handle_link(void *device, unsigned link) {
    struct gpu *gpu = handle_gpu(device);
    return gpu && link < MAX_LINKS && gpu->links[link].used ? &gpu->links[link] : NULL;
}

/* One NvLink query's start, as NVML answers it: the failure a rule asks for, a bad handle or
   output, or a link the GPU does not have (NOT_SUPPORTED); SUCCESS with *found set. */
static int enter_link(const char *name, void *device, unsigned link, const void *out,
                      struct link **found) {
    int result = enter(name);
    if (result != SUCCESS) return result;
    if (!handle_gpu(device) || !out) return ERROR_INVALID_ARGUMENT;
    *found = handle_link(device, link);
    return *found ? SUCCESS : ERROR_NOT_SUPPORTED;
}

/* ---- control, for tests ---- */
const char *standin_nvml_called(void) { return called; }

/* ---- NVML ---- */
int nvmlInit_v2(void) {
    called[0] = 0;
    read_rules("GDRPROBE_NVML_FAIL", fails);
    read_rules("GDRPROBE_NVML_HANG_S", hangs);
    int result = enter("nvmlInit_v2");
    if (result != SUCCESS) return result;
    read_gpus();
    read_nvlinks();
    read_c2c();
    initialised = 1;
    return SUCCESS;
}

int nvmlInit(void) { return nvmlInit_v2(); }

int nvmlShutdown(void) {
    int result = enter("nvmlShutdown");
    initialised = 0;
    return result;
}

const char *nvmlErrorString(int result) {
    switch (result) {
    case SUCCESS: return "Success";
    case ERROR_UNINITIALIZED: return "Uninitialized";
    case ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case ERROR_NOT_SUPPORTED: return "Not Supported";
    case ERROR_NOT_FOUND: return "Not Found";
    case 9: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

int nvmlDeviceGetCount_v2(unsigned *count) {
    int result = enter("nvmlDeviceGetCount_v2");
    if (result != SUCCESS) return result;
    if (!initialised) return ERROR_UNINITIALIZED;
    if (!count) return ERROR_INVALID_ARGUMENT;
    *count = ngpus;
    return SUCCESS;
}

int nvmlDeviceGetCount(unsigned *count) { return nvmlDeviceGetCount_v2(count); }

int nvmlDeviceGetHandleByIndex(unsigned index, void **device) {
    int result = enter("nvmlDeviceGetHandleByIndex");
    if (result != SUCCESS) return result;
    if (!initialised) return ERROR_UNINITIALIZED;
    if (!device || index >= ngpus) return ERROR_INVALID_ARGUMENT;
    *device = &gpus[index];
    return SUCCESS;
}

int nvmlDeviceGetHandleByPciBusId(const char *bus, void **device) {
    int result = enter("nvmlDeviceGetHandleByPciBusId");
    if (result != SUCCESS) return result;
    if (!initialised) return ERROR_UNINITIALIZED;
    if (!bus || !device) return ERROR_INVALID_ARGUMENT;
    struct gpu *gpu = find(bus);
    if (!gpu) return ERROR_NOT_FOUND;
    *device = gpu;
    return SUCCESS;
}

int nvmlDeviceGetCudaComputeCapability(void *device, int *major, int *minor) {
    int result = enter("nvmlDeviceGetCudaComputeCapability");
    struct gpu *gpu = handle_gpu(device);
    if (result != SUCCESS) return result;
    if (!gpu || !major || !minor) return ERROR_INVALID_ARGUMENT;
    *major = gpu->sm / 10;
    *minor = gpu->sm % 10;
    return SUCCESS;
}

int nvmlDeviceGetNvLinkCapability(void *device, unsigned link, int capability, unsigned *result_out) {
    struct link *found;
    int result = enter_link("nvmlDeviceGetNvLinkCapability", device, link, result_out, &found);
    if (result != SUCCESS) return result;
    if (capability != 0) return ERROR_INVALID_ARGUMENT;
    *result_out = (unsigned)found->p2p;
    return SUCCESS;
}

int nvmlDeviceGetNvLinkState(void *device, unsigned link, int *active) {
    struct link *found;
    int result = enter_link("nvmlDeviceGetNvLinkState", device, link, active, &found);
    if (result != SUCCESS) return result;
    *active = found->active;
    return SUCCESS;
}

int nvmlDeviceGetNvLinkRemotePciInfo(void *device, unsigned link, nvmlPciInfo_t *pci) {
    struct link *found;
    int result = enter_link("nvmlDeviceGetNvLinkRemotePciInfo", device, link, pci, &found);
    if (result != SUCCESS) return result;
    memset(pci, 0, sizeof *pci);
    if (found->end[0]) {
        unsigned domain = 0, bus = 0, dev = 0, fn = 0;
        sscanf(found->end, "%x:%x:%x.%x", &domain, &bus, &dev, &fn);
        /* the legacy busId NVML's first interface fills: 0000:1B:00.0 */
        snprintf(pci->busId, BUS_BYTES, "%04X:%02X:%02X.%X", domain, bus, dev, fn);
        pci->domain = domain; pci->bus = bus; pci->device = dev;
    }
    return SUCCESS;
}

#ifndef STANDIN_NO_REMOTE_DEVICE_TYPE
int nvmlDeviceGetNvLinkRemoteDeviceType(void *device, unsigned link, int *type) {
    struct link *found;
    int result = enter_link("nvmlDeviceGetNvLinkRemoteDeviceType", device, link, type, &found);
    if (result != SUCCESS) return result;
    *type = found->type;
    return SUCCESS;
}
#endif

static int field_value(struct gpu *gpu, nvmlFieldValue_t *value) {
    switch (value->fieldId) {
    case FI_NVLINK_GET_STATE:
        if (value->scopeId >= MAX_LINKS || !gpu->links[value->scopeId].used) return ERROR_NOT_SUPPORTED;
        value->value.uiVal = (unsigned)gpu->links[value->scopeId].active;
        return SUCCESS;
    case FI_C2C_LINK_COUNT:
        if (gpu->sm < 90) return ERROR_NOT_SUPPORTED;
        value->value.uiVal = gpu->c2c;
        return SUCCESS;
    case FI_C2C_LINK_GET_STATUS:
        if (value->scopeId >= gpu->c2c) return ERROR_INVALID_ARGUMENT;
        value->value.uiVal = value->scopeId < gpu->c2c_active;
        return SUCCESS;
    case FI_C2C_LINK_GET_MAX_BW:
        if (value->scopeId >= gpu->c2c) return ERROR_INVALID_ARGUMENT;
        value->value.uiVal = value->scopeId < gpu->c2c_active ? C2C_MAX_BW_MBPS : 0;
        return SUCCESS;
    default:
        return ERROR_NOT_SUPPORTED;
    }
}

int nvmlDeviceGetFieldValues(void *device, int count, nvmlFieldValue_t *values) {
    int result = enter("nvmlDeviceGetFieldValues");
    struct gpu *gpu = handle_gpu(device);
    if (result != SUCCESS) return result;
    if (!gpu || count <= 0 || !values) return ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < count; i++) {
        values[i].valueType = 1;   /* NVML_VALUE_TYPE_UNSIGNED_INT */
        values[i].nvmlReturn = field_value(gpu, &values[i]);
    }
    return SUCCESS;
}
