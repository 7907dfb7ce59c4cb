/* A tensor-parallel group's sums on the GPUs: NCCL, one communicator per
 * backend (backend.h group_*).
 *
 * NCCL is opened with dlopen at the first use, so the plugin loads and runs
 * where it is absent (the group ops then fail and the model keeps summing
 * through the host): EXO_NCCL_LIB names the library, else libnccl.so.2 on
 * the loader's path, else CUDA's own lib directories. The header comes
 * from CUDA's include directory at build time; without it this module
 * builds to "not available".
 *
 * The communicator is made non-blocking, so that a rank that never joins
 * is a timeout and an abort, not a process stuck in ncclCommInitRank; its
 * calls may then answer "in progress", and each is waited out before the
 * next (an all-reduce is queued on the backend's stream within
 * microseconds; its sum runs there like any kernel). */
#include "engine/cuda/group.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if __has_include(<nccl.h>)
#include <nccl.h>
#define HAVE_NCCL 1
#endif

#ifdef HAVE_NCCL
struct nccl_api {
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*init_rank_config)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
    ncclResult_t (*async_error)(ncclComm_t, ncclResult_t *);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                               cudaStream_t);
    ncclResult_t (*abort)(ncclComm_t);
    ncclResult_t (*destroy)(ncclComm_t);
    const char *(*error_string)(ncclResult_t);
};

static struct nccl_api nccl;
static char nccl_missing[256]; /* why it did not load; empty when it did */
static pthread_once_t nccl_once = PTHREAD_ONCE_INIT;

static void load_nccl(void)
{
    const char *env = getenv("EXO_NCCL_LIB");
    const char *tries[] = {env && *env ? env : "libnccl.so.2", "/usr/local/cuda/lib64/libnccl.so.2",
                           "/usr/local/cuda/lib/libnccl.so.2"};
    void *lib = NULL;
    for (size_t i = 0; i < sizeof tries / sizeof *tries && !lib; i++)
        lib = dlopen(tries[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(nccl_missing, sizeof nccl_missing, "NCCL not found (%s; EXO_NCCL_LIB names the library)",
                 dlerror());
        return;
    }
    struct {
        void **slot;
        const char *name;
    } syms[] = {{(void **)&nccl.get_unique_id, "ncclGetUniqueId"},
                {(void **)&nccl.init_rank_config, "ncclCommInitRankConfig"},
                {(void **)&nccl.async_error, "ncclCommGetAsyncError"},
                {(void **)&nccl.all_reduce, "ncclAllReduce"},
                {(void **)&nccl.abort, "ncclCommAbort"},
                {(void **)&nccl.destroy, "ncclCommDestroy"},
                {(void **)&nccl.error_string, "ncclGetErrorString"}};
    for (size_t i = 0; i < sizeof syms / sizeof *syms; i++)
        if (!(*syms[i].slot = dlsym(lib, syms[i].name))) {
            snprintf(nccl_missing, sizeof nccl_missing, "NCCL lacks %s (older than 2.14?)", syms[i].name);
            dlclose(lib);
            return;
        }
}

static int nccl_ready(exo_err *err)
{
    pthread_once(&nccl_once, load_nccl);
    if (nccl_missing[0])
        return exo_err_set(err, EXO_EUNSUPPORTED, "%s", nccl_missing);
    return 0;
}

static int fail(exo_err *err, const char *what, ncclResult_t r)
{
    return exo_err_set(err, EXO_EIO, "NCCL %s: %s", what, nccl.error_string(r));
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Waits out a non-blocking communicator's "in progress". */
static ncclResult_t settle(ncclComm_t comm, double deadline_ms)
{
    ncclResult_t state = ncclInProgress;
    while (nccl.async_error(comm, &state) == ncclSuccess && state == ncclInProgress) {
        if (deadline_ms > 0 && now_ms() > deadline_ms)
            return ncclInProgress;
        struct timespec nap = {0, 100000};
        nanosleep(&nap, NULL);
    }
    return state;
}

int exo_cuda_group_new_id(uint8_t id[EXO_GROUP_ID_BYTES], exo_err *err)
{
    static_assert(sizeof(ncclUniqueId) == EXO_GROUP_ID_BYTES, "a group's name is NCCL's unique id");
    if (nccl_ready(err))
        return err->code;
    if (!id) /* only whether NCCL is there: a name opens a listening socket */
        return 0;
    ncclUniqueId u;
    ncclResult_t r = nccl.get_unique_id(&u);
    if (r != ncclSuccess)
        return fail(err, "unique id", r);
    memcpy(id, &u, sizeof u);
    return 0;
}

int exo_cuda_group_join(void **group, const uint8_t id[EXO_GROUP_ID_BYTES], int world, int rank, int timeout_ms,
                        exo_err *err)
{
    if (nccl_ready(err))
        return err->code;
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = NULL;
    ncclResult_t r = nccl.init_rank_config(&comm, world, u, rank, &config);
    if (r == ncclInProgress)
        r = settle(comm, now_ms() + timeout_ms);
    if (r != ncclSuccess) {
        if (comm)
            nccl.abort(comm);
        if (r == ncclInProgress)
            return exo_err_set(err, EXO_ETIMEDOUT, "NCCL: the group's %d ranks did not all join within %d ms",
                               world, timeout_ms);
        return fail(err, "join", r);
    }
    *group = comm;
    return 0;
}

int exo_cuda_group_allreduce(void *group, float *x, size_t n, cudaStream_t s)
{
    ncclComm_t comm = (ncclComm_t)group;
    ncclResult_t r = nccl.all_reduce(x, x, n, ncclFloat32, ncclSum, comm, s);
    if (r == ncclInProgress)
        r = settle(comm, 0);
    return r == ncclSuccess ? 0 : EXO_EIO;
}

void exo_cuda_group_leave(void *group)
{
    if (group && nccl.destroy((ncclComm_t)group) != ncclSuccess)
        nccl.abort((ncclComm_t)group);
}

#else /* no nccl.h where the plugin was built */

int exo_cuda_group_new_id(uint8_t id[EXO_GROUP_ID_BYTES], exo_err *err)
{
    (void)id;
    return exo_err_set(err, EXO_EUNSUPPORTED, "this CUDA plugin was built without NCCL's header");
}

int exo_cuda_group_join(void **group, const uint8_t id[EXO_GROUP_ID_BYTES], int world, int rank, int timeout_ms,
                        exo_err *err)
{
    (void)group, (void)id, (void)world, (void)rank, (void)timeout_ms;
    return exo_err_set(err, EXO_EUNSUPPORTED, "this CUDA plugin was built without NCCL's header");
}

int exo_cuda_group_allreduce(void *group, float *x, size_t n, cudaStream_t s)
{
    (void)group, (void)x, (void)n, (void)s;
    return EXO_EUNSUPPORTED;
}

void exo_cuda_group_leave(void *group) { (void)group; }

#endif
