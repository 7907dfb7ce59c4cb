/* Node information gathering (see node_info.h).
 *
 * Memory and CPUs are read fresh on every call (the worker reports them
 * periodically and MemAvailable moves). The CUDA probe runs once per process:
 * libcuda is dlopen'ed without any CUDA header or link-time dependency, and
 * cuInit + cuDeviceGetCount are looked up by name, so the same binary runs on
 * machines without a driver. The library is never dlclose'd: after cuInit
 * the driver may own threads and atexit handlers that live in it. Runners
 * are started with fork+exec, so initialising the driver in the node process
 * does not leak CUDA state into them. */
#include "cluster/node_info.h"

#include "core/log.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* CUresult cuInit(unsigned), cuDeviceGetCount(int *); CUDA_SUCCESS == 0. */
typedef int (*cu_init_fn)(unsigned int flags);
typedef int (*cu_device_get_count_fn)(int *count);

static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
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

/* MemTotal and MemAvailable in bytes. Kernels before 3.14 have no
 * MemAvailable; MemFree + Buffers + Cached approximates it there. */
static int read_meminfo(uint64_t *total, uint64_t *avail, exo_err *err)
{
    const char *path = "/proc/meminfo";
    FILE *f = fopen(path, "r");
    if (!f)
        return exo_err_set(err, EXO_EIO, "%s: %s", path, strerror(errno));
    unsigned long long mem_total = 0, mem_avail = 0, mem_free = 0, buffers = 0, cached = 0;
    bool have_total = false, have_avail = false;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        char key[64];
        unsigned long long kb;
        if (sscanf(line, "%63[^:]: %llu", key, &kb) != 2)
            continue;
        if (!strcmp(key, "MemTotal"))
            mem_total = kb, have_total = true;
        else if (!strcmp(key, "MemAvailable"))
            mem_avail = kb, have_avail = true;
        else if (!strcmp(key, "MemFree"))
            mem_free = kb;
        else if (!strcmp(key, "Buffers"))
            buffers = kb;
        else if (!strcmp(key, "Cached"))
            cached = kb;
    }
    fclose(f);
    if (!have_total || mem_total == 0)
        return exo_err_set(err, EXO_EIO, "%s: no MemTotal line", path);
    if (!have_avail)
        mem_avail = mem_free + buffers + cached;
    if (mem_avail > mem_total)
        mem_avail = mem_total;
    *total = (uint64_t)mem_total * 1024;
    *avail = (uint64_t)mem_avail * 1024;
    return 0;
}

/* The host name, made acceptable to exo_node_info_validate: bytes outside
 * printable ASCII become '?', and an empty or unknown name is "exo". */
static void friendly_name(char *out, size_t cap)
{
    char host[256];
    if (gethostname(host, sizeof host) < 0)
        host[0] = 0;
    host[sizeof host - 1] = 0;
    size_t n = 0;
    for (; host[n] && n + 1 < cap; n++) {
        unsigned char c = (unsigned char)host[n];
        out[n] = c < 0x20 || c >= 0x7f ? '?' : (char)c;
    }
    out[n] = 0;
    if (n == 0)
        snprintf(out, cap, "exo");
}

int exo_node_info_gather(exo_node_info *info, exo_err *err)
{
    memset(info, 0, sizeof *info);
    int rc = read_meminfo(&info->memory_total, &info->memory_available, err);
    if (rc < 0)
        return rc;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    info->cpu_count = cpus < 1 ? 1 : cpus > INT32_MAX ? INT32_MAX : (int32_t)cpus;
    friendly_name(info->friendly_name, sizeof info->friendly_name);
    info->backends = 1u << EXO_BACKEND_CPU;
    pthread_once(&cuda_once, cuda_probe);
    if (cuda_devices > 0)
        info->backends |= 1u << EXO_BACKEND_CUDA;
    return 0;
}
