/* Node information gathering (see node_info.h).
 *
 * Memory and CPUs are read fresh on every call (the worker reports them
 * periodically and MemAvailable moves). The CUDA probe runs once per process:
 * libcuda is dlopen'ed without any CUDA header or link-time dependency, and
 * cuInit + cuDeviceGetCount are looked up by name, so the same binary runs on
 * machines without a driver; NVML (libnvidia-ml.so.1) is found the same way
 * for the GPUs' names and memory. The libraries are never dlclose'd: after cuInit
 * the driver may own threads and atexit handlers that live in it. Runners
 * are started with fork+exec, so initialising the driver in the node process
 * does not leak CUDA state into them. */
#include "cluster/node_info.h"

#include "core/alloc.h"
#include "core/log.h"
#include "core/meminfo.h"
#include "core/threadpool.h"
#include "download/catalogue.h"
#include "download/model_store.h"
#include "engine/cpu/membw.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/utsname.h>
#include <unistd.h>

/* CUresult cuInit(unsigned), cuDeviceGetCount(int *); CUDA_SUCCESS == 0. */
typedef int (*cu_init_fn)(unsigned int flags);
typedef int (*cu_device_get_count_fn)(int *count);

static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;

/* Memory read bandwidth with every core, measured once per process: 256 MiB
 * (past any cache here), best of 3 passes, ~0.1 s. */
static pthread_once_t membw_once = PTHREAD_ONCE_INIT;
static uint64_t membw_bps;

static void membw_probe(void)
{
    exo_membw *probe = exo_membw_create((size_t)256 << 20);
    if (!probe)
        return;
    exo_pool *pool = exo_pool_create(0);
    double bps = exo_membw_read(probe, pool, 3);
    exo_pool_free(pool);
    exo_membw_free(probe);
    membw_bps = bps > 0 ? (uint64_t)bps : 0;
}
static int            cuda_devices;

static void cuda_probe(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        EXO_LOG_DEBUG("node info: no CUDA driver (%s)", dlerror());
        return;
    }
    cu_init_fn cu_init;
    cu_device_get_count_fn cu_count;
    /* POSIX allows converting dlsym's void * to a function pointer; copy
     * the bits so ISO C's -pedantic does not object. */
    void *s1 = dlsym(lib, "cuInit"), *s2 = dlsym(lib, "cuDeviceGetCount");
    if (!s1 || !s2) {
        EXO_LOG_DEBUG("node info: libcuda.so.1 lacks cuInit/cuDeviceGetCount");
        return;
    }
    memcpy(&cu_init, &s1, sizeof cu_init);
    memcpy(&cu_count, &s2, sizeof cu_count);
    int rc = cu_init(0), n = 0;
    if (rc != 0) {
        EXO_LOG_DEBUG("node info: cuInit failed (CUresult %d)", rc);
        return;
    }
    if ((rc = cu_count(&n)) != 0) {
        EXO_LOG_DEBUG("node info: cuDeviceGetCount failed (CUresult %d)", rc);
        return;
    }
    cuda_devices = n;
    EXO_LOG_DEBUG("node info: %d CUDA device(s)", n);
}

/* What a node reports goes into events: every name is copied as printable
 * ASCII, '?' for anything else (and for spaces where `no_space`, as in
 * addresses). */
static void printable_ex(char *dst, size_t cap, const char *src, bool no_space)
{
    size_t n = 0;
    for (; src[n] && n + 1 < cap; n++) {
        unsigned char c = (unsigned char)src[n];
        dst[n] = c < 0x20 || c >= 0x7f || (no_space && c == ' ') ? '?' : (char)c;
    }
    dst[n] = 0;
}

static void printable(char *dst, size_t cap, const char *src) { printable_ex(dst, cap, src, false); }

/* The host name, made acceptable to exo_node_info_validate: bytes outside
 * printable ASCII become '?', and an empty or unknown name is "exo". */
static void friendly_name(char *out, size_t cap)
{
    char host[256];
    if (gethostname(host, sizeof host) < 0)
        host[0] = 0;
    host[sizeof host - 1] = 0;
    printable(out, cap, host);
    if (!out[0])
        snprintf(out, cap, "exo");
}

/* ---- GPUs through NVML ---- */

/* nvmlReturn_t nvmlInit_v2(void); nvmlDeviceGetCount_v2(unsigned *);
 * nvmlDeviceGetHandleByIndex_v2(unsigned, nvmlDevice_t *);
 * nvmlDeviceGetName(nvmlDevice_t, char *, unsigned);
 * nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t *); NVML_SUCCESS == 0.
 * nvmlMemory_t is {unsigned long long total, free, used}. */
typedef int (*nvml_init_fn)(void);
typedef int (*nvml_count_fn)(unsigned int *n);
typedef int (*nvml_handle_fn)(unsigned int i, void **dev);
typedef int (*nvml_name_fn)(void *dev, char *name, unsigned int len);
typedef struct nvml_memory { unsigned long long total, free, used; } nvml_memory;
typedef int (*nvml_mem_fn)(void *dev, nvml_memory *m);
/* nvmlDeviceGetMaxClockInfo(dev, NVML_CLOCK_MEM = 2, &MHz) and
 * nvmlDeviceGetMemoryBusWidth(dev, &bits): the peak memory bandwidth is
 * 2 transfers a clock (DDR) times the bus width. */
typedef int (*nvml_clock_fn)(void *dev, int type, unsigned int *mhz);
typedef int (*nvml_bus_fn)(void *dev, unsigned int *bits);

static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;
static struct {
    bool           ok;
    nvml_count_fn  count;
    nvml_handle_fn handle;
    nvml_name_fn   name;
    nvml_mem_fn    mem;
    nvml_clock_fn  max_clock; /* optional: older drivers may lack them */
    nvml_bus_fn    bus_width;
} nvml;

static bool sym(void *lib, const char *name, void *fn_out, size_t size)
{
    void *p = dlsym(lib, name);
    if (p)
        memcpy(fn_out, &p, size);
    return p != NULL;
}

static void nvml_probe(void)
{
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        EXO_LOG_DEBUG("node info: no NVML (%s)", dlerror());
        return;
    }
    nvml_init_fn init;
    if (!sym(lib, "nvmlInit_v2", &init, sizeof init) || !sym(lib, "nvmlDeviceGetCount_v2", &nvml.count, sizeof nvml.count) ||
        !sym(lib, "nvmlDeviceGetHandleByIndex_v2", &nvml.handle, sizeof nvml.handle) ||
        !sym(lib, "nvmlDeviceGetName", &nvml.name, sizeof nvml.name) ||
        !sym(lib, "nvmlDeviceGetMemoryInfo", &nvml.mem, sizeof nvml.mem)) {
        EXO_LOG_DEBUG("node info: libnvidia-ml.so.1 lacks a function it should have");
        return;
    }
    sym(lib, "nvmlDeviceGetMaxClockInfo", &nvml.max_clock, sizeof nvml.max_clock);
    sym(lib, "nvmlDeviceGetMemoryBusWidth", &nvml.bus_width, sizeof nvml.bus_width);
    int rc = init();
    if (rc != 0) {
        EXO_LOG_DEBUG("node info: nvmlInit failed (%d)", rc);
        return;
    }
    nvml.ok = true;
}

/* The NVML indices of the GPUs this node's runners can open, in CUDA
 * ordinal order: CUDA_VISIBLE_DEVICES when it lists indices (PCI bus
 * order, which main() makes CUDA's), else all of them. Returns the count. */
static unsigned int visible_gpus(unsigned int n, unsigned int *out)
{
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    unsigned int k = 0;
    if (!v)
        goto all;
    for (const char *p = v; *p && k < EXO_NODE_MAX_GPUS;) {
        char *end;
        long i = strtol(p, &end, 10);
        if (end == p || (*end && *end != ','))
            break; /* UUIDs, MIG names: not ours to map; CUDA stops at the first bad entry too */
        if (i < 0 || (unsigned long)i >= n)
            return k; /* CUDA ignores the rest of the list */
        out[k++] = (unsigned int)i;
        p = *end ? end + 1 : end;
    }
    if (k || !*v)
        return k;
all:
    for (k = 0; k < n && k < EXO_NODE_MAX_GPUS; k++)
        out[k] = k;
    return k;
}

static void gather_gpus(exo_node_info *info)
{
    pthread_once(&nvml_once, nvml_probe);
    unsigned int n = 0, nvml_index[EXO_NODE_MAX_GPUS];
    if (!nvml.ok || nvml.count(&n) != 0 || n == 0 || !(n = visible_gpus(n, nvml_index)))
        return;
    info->gpus.v = exo_calloc(n, sizeof *info->gpus.v);
    for (unsigned int i = 0; i < n; i++) {
        void *dev;
        nvml_memory m = {0};
        exo_gpu_info *g = &info->gpus.v[info->gpus.n];
        if (nvml.handle(nvml_index[i], &dev) != 0)
            continue;
        char name[96] = "";
        nvml.name(dev, name, sizeof name);
        nvml.mem(dev, &m);
        g->index = (int32_t)i;
        printable(g->name, sizeof g->name, name[0] ? name : "GPU");
        g->memory_total = m.total;
        g->memory_used = m.used;
        unsigned int mhz = 0, bits = 0;
        if (nvml.max_clock && nvml.bus_width && nvml.max_clock(dev, 2, &mhz) == 0 && nvml.bus_width(dev, &bits) == 0)
            g->memory_read_bps = (uint64_t)mhz * 1000000ull * 2 * (bits / 8);
        info->gpus.n++;
    }
}

/* ---- system ---- */

static void cpu_model(char *out, size_t cap)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    out[0] = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10))
            continue;
        char *colon = strchr(line, ':');
        if (!colon)
            break;
        colon++;
        while (*colon == ' ' || *colon == '\t')
            colon++;
        colon[strcspn(colon, "\n")] = 0;
        printable(out, cap, colon);
        break;
    }
    if (f)
        fclose(f);
}

static void os_name(char *out, size_t cap)
{
    struct utsname u;
    char raw[128] = "Linux";
    if (uname(&u) == 0)
        snprintf(raw, sizeof raw, "%.40s %.40s %.30s", u.sysname, u.release, u.machine);
    printable(out, cap, raw);
}

/* ---- network interfaces ---- */

static exo_iface_kind iface_kind(const char *name, unsigned int flags)
{
    if (flags & IFF_LOOPBACK)
        return EXO_IFACE_LOOPBACK;
    char path[256];
    snprintf(path, sizeof path, "/sys/class/net/%s/wireless", name);
    if (access(path, F_OK) == 0)
        return EXO_IFACE_WIFI;
    snprintf(path, sizeof path, "/sys/class/net/%s/device", name);
    if (access(path, F_OK) == 0)
        return EXO_IFACE_ETHERNET;
    snprintf(path, sizeof path, "/sys/devices/virtual/net/%s", name);
    if (access(path, F_OK) == 0)
        return EXO_IFACE_VIRTUAL;
    return EXO_IFACE_UNKNOWN;
}

static void gather_interfaces(exo_node_info *info)
{
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) < 0)
        return;
    size_t cap = 0;
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || !(i->ifa_flags & IFF_UP) || info->interfaces.n >= EXO_NODE_MAX_INTERFACES)
            continue;
        int fam = i->ifa_addr->sa_family;
        if (fam != AF_INET && fam != AF_INET6)
            continue;
        char ip[INET6_ADDRSTRLEN] = "";
        if (fam == AF_INET) {
            inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, ip, sizeof ip);
        } else {
            const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)i->ifa_addr;
            inet_ntop(AF_INET6, &a6->sin6_addr, ip, sizeof ip);
        }
        if (!ip[0] || strlen(i->ifa_name) >= EXO_NAME_MAX)
            continue;
        if (info->interfaces.n == cap) {
            cap = cap ? cap * 2 : 8;
            info->interfaces.v = exo_realloc(info->interfaces.v, cap * sizeof *info->interfaces.v);
        }
        exo_net_iface *f = &info->interfaces.v[info->interfaces.n];
        memset(f, 0, sizeof *f);
        char addr[EXO_ADDR_MAX];
        if (fam == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr))
            snprintf(addr, sizeof addr, "%s%%%.20s", ip, i->ifa_name);
        else
            snprintf(addr, sizeof addr, "%s", ip);
        printable_ex(f->name, sizeof f->name, i->ifa_name, true);
        printable_ex(f->ip, sizeof f->ip, addr, true);
        f->kind = iface_kind(i->ifa_name, i->ifa_flags);
        info->interfaces.n++;
    }
    freeifaddrs(ifs);
}

/* ---- models on disk and their filesystem ---- */

void exo_model_card_from_entry(const exo_model_entry *m, exo_model_card *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->model_id, sizeof c->model_id, "%s", m->id);
    c->n_layers = m->n_layers > 0 ? m->n_layers : 0;
    c->hidden_size = m->hidden_size > 0 ? m->hidden_size : 0;
    c->n_kv_heads = m->n_kv_heads > 0 ? m->n_kv_heads : 0;
    c->vocab_size = m->vocab_size > 0 && m->vocab_size <= (1 << 26) ? m->vocab_size : 0;
    c->storage_bytes = m->storage_bytes > 0 ? (uint64_t)m->storage_bytes : 0;
    c->supports_tensor = exo_model_type_supports_tensor(m->model_type);
    printable(c->model_type, sizeof c->model_type, m->model_type);
    printable(c->quantization, sizeof c->quantization, m->quantization);
    c->context_length = m->context_length > 0 ? m->context_length : 0;
    c->supports_tools = m->supports_tools;
    c->supports_thinking = m->supports_thinking;
}

void exo_model_card_from_catalogue(const exo_catalogue_card *c, exo_model_card *out)
{
    exo_model_entry e = {.n_layers = c->n_layers, .hidden_size = c->hidden_size, .n_kv_heads = c->n_kv_heads,
                         .vocab_size = c->vocab_size, .storage_bytes = (int64_t)c->storage_bytes,
                         .context_length = c->context_length, .supports_tools = c->supports_tools,
                         .supports_thinking = c->supports_thinking};
    snprintf(e.id, sizeof e.id, "%s", c->model_id);
    snprintf(e.model_type, sizeof e.model_type, "%s", c->model_type);
    snprintf(e.quantization, sizeof e.quantization, "%s", c->quantization);
    exo_model_card_from_entry(&e, out);
}

static void gather_models(const exo_node_info_opts *o, exo_node_info *info)
{
    for (int d = 0; d < o->n_models_dirs; d++) {
        struct statvfs vfs;
        if (!o->models_dirs[d].read_only && statvfs(o->models_dirs[d].path, &vfs) == 0) {
            info->disk_total = (uint64_t)vfs.f_blocks * vfs.f_frsize;
            info->disk_available = (uint64_t)vfs.f_bavail * vfs.f_frsize;
            break;
        }
    }
    exo_model_store *store = exo_model_store_scan(o->models_dirs, o->n_models_dirs);
    size_t n = exo_model_store_count(store);
    if (n > EXO_NODE_MAX_MODELS)
        n = EXO_NODE_MAX_MODELS;
    info->models.v = n ? exo_calloc(n, sizeof *info->models.v) : NULL;
    for (size_t i = 0; i < n; i++) {
        const exo_model_entry *m = exo_model_store_at(store, i);
        if (m->n_layers < 1 || !exo_model_id_valid(m->id, strlen(m->id)))
            continue; /* not runnable: placement could not use it */
        exo_model_card_from_entry(m, &info->models.v[info->models.n++]);
    }
    exo_model_store_free(store);
}

int exo_node_info_gather(const exo_node_info_opts *opts, exo_node_info *info, exo_err *err)
{
    memset(info, 0, sizeof *info);
    int rc = exo_meminfo(&info->memory_total, &info->memory_available, err);
    if (rc < 0)
        return rc;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    info->cpu_count = cpus < 1 ? 1 : cpus > INT32_MAX ? INT32_MAX : (int32_t)cpus;
    friendly_name(info->friendly_name, sizeof info->friendly_name);
    info->backends = 1u << EXO_BACKEND_CPU;
    pthread_once(&cuda_once, cuda_probe);
    pthread_once(&membw_once, membw_probe);
    info->mem_read_bps = membw_bps;
    /* EXO_DEVICE=cpu keeps this node's runners off its GPUs: placement must
     * not count them either (it names a GPU per rank where there are several) */
    const char *device = getenv("EXO_DEVICE");
    if (cuda_devices > 0 && !(device && !strcmp(device, "cpu")))
        info->backends |= 1u << EXO_BACKEND_CUDA;
    cpu_model(info->cpu_model, sizeof info->cpu_model);
    os_name(info->os, sizeof info->os);
    gather_gpus(info);
    gather_interfaces(info);
    if (opts) {
        info->api_port = opts->api_port;
        info->cluster_port = opts->cluster_port;
        gather_models(opts, info);
    }
    return 0;
}

bool exo_node_info_changed(const exo_node_info *old, const exo_node_info *now)
{
    uint64_t a = old->memory_available, b = now->memory_available;
    uint64_t moved = a > b ? a - b : b - a;
    uint64_t slack = now->memory_total / 100 > (256ull << 20) ? now->memory_total / 100 : 256ull << 20;
    if (moved > slack)
        return true;
    exo_node_info x;
    exo_node_info_copy(&x, old);
    x.memory_available = now->memory_available;
    bool same = exo_node_info_equal(&x, now);
    exo_node_info_clear(&x);
    return !same;
}
