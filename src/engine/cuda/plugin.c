/* Finds and loads the CUDA plugin (see plugin.h): $EXO_CUDA_PLUGIN, else
 * libexo_cuda.so beside the running executable. Loaded once; a plugin that
 * is missing, built against another ABI, or whose CUDA libraries the
 * dynamic loader cannot find leaves the CUDA backend unavailable, saying
 * why, and everything else runs on the CPU. */
#include "engine/cuda/plugin.h"
#include "core/log.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const exo_cuda_plugin *plugin;
static char why[PATH_MAX + 256]; /* the path and the loader's reason */

static void load(void)
{
    char path[PATH_MAX];
    const char *env = getenv("EXO_CUDA_PLUGIN");
    if (env && *env) {
        snprintf(path, sizeof path, "%s", env);
    } else {
        ssize_t n = readlink("/proc/self/exe", path, sizeof path - 32);
        if (n <= 0) {
            snprintf(why, sizeof why, "cannot find the running executable");
            return;
        }
        path[n] = 0;
        char *slash = strrchr(path, '/');
        strcpy(slash ? slash + 1 : path, "libexo_cuda.so");
    }
    if (access(path, F_OK)) {
        snprintf(why, sizeof why, "%s is not there (exo was built without nvcc)", path);
        return;
    }
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(why, sizeof why, "cannot load %s: %s", path, dlerror());
        return;
    }
    const exo_cuda_plugin *(*get)(void) = (const exo_cuda_plugin *(*)(void))dlsym(lib, EXO_CUDA_PLUGIN_SYMBOL);
    const exo_cuda_plugin *p = get ? get() : NULL;
    if (!p || p->abi != EXO_CUDA_PLUGIN_ABI || p->vtable_size != sizeof(exo_backend_ops)) {
        snprintf(why, sizeof why, "%s was built for another version of exo (rebuild it)", path);
        dlclose(lib);
        return;
    }
    plugin = p; /* kept loaded for the life of the process */
}

static const exo_cuda_plugin *get_plugin(exo_err *err)
{
    pthread_once(&once, load);
    if (!plugin)
        exo_err_set(err, EXO_EUNSUPPORTED, "no CUDA backend: %s", why);
    return plugin;
}

/* Whether NVIDIA's driver is there: without it no GPU can answer, and
 * loading cuBLAS (~100 ms) for every process that asks "any GPU?" on a
 * CPU-only machine is waste. The kernel driver's files are the cheap
 * sign; some containers show neither, so the driver's user-space library
 * (libcuda, which the CUDA runtime needs anyway) decides then. Asking for
 * a GPU by name still loads the plugin, to say exactly why there is none. */
static bool driver_present(void)
{
    if (!access("/proc/driver/nvidia/version", F_OK) || !access("/dev/nvidiactl", F_OK))
        return true;
    void *lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (lib)
        dlclose(lib);
    return lib != NULL;
}

exo_backend *exo_backend_cuda_create(int device, exo_err *err)
{
    const exo_cuda_plugin *p = get_plugin(err);
    return p ? p->create(device, err) : NULL;
}

int exo_backend_cuda_devices(void)
{
    if (!driver_present())
        return 0;
    const exo_cuda_plugin *p = get_plugin(NULL);
    return p ? p->device_count() : 0;
}

double exo_backend_cuda_copy_bandwidth(int device)
{
    const exo_cuda_plugin *p = get_plugin(NULL);
    return p ? p->copy_bandwidth(device) : 0;
}

int exo_backend_cuda_memory(int device, size_t *free_bytes, size_t *total_bytes, exo_err *err)
{
    const exo_cuda_plugin *p = get_plugin(err);
    return p ? p->memory(device, free_bytes, total_bytes, err) : EXO_EUNSUPPORTED;
}
