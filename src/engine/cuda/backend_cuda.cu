/* The CUDA backend: the exo_backend vtable on one NVIDIA GPU.
 *
 * Everything a forward pass touches lives on the device: weights, uploaded
 * once in their checkpoint format into a bump arena of large cudaMalloc
 * chunks (a model is thousands of tensors; one allocation each would cost
 * a driver call and alignment slack apiece); activations, KV cache and
 * linear-attention state. Ops queue on one stream and return at once; the
 * host waits only in to_host, sync and moe_route (prompts: the host groups
 * the tokens by expert, so it needs the router's logits; decode picks its
 * experts on the device, moe_pick, and its products read the choice from
 * there). Host arrays an op takes (token ids, row indices and scales) go
 * up from a pinned staging ring (stage_upload), so the caller may reuse
 * them at once.
 *
 * The KV cache of a layer is (slots, n_kv_heads, head_dim) f32 or bf16
 * for K and for V: appending a token writes one contiguous row, and
 * attention reads a KV head's keys as rows. Matrix products are in matmul.cu, Gated
 * DeltaNet in linear_attn.cu, attention in attention.cu. */
#include "engine/cuda/cuda_internal.h"
#include "engine/cuda/group.h"
#include "engine/cuda/matmul.h"
#include "engine/cuda/pick.h"
#include "engine/cuda/plugin.h"

extern "C" {
#include "engine/dtype.h"
#include "engine/router.h"
}

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WEIGHT_CHUNK ((size_t)256 << 20)

/* Device scratch buffers, each grown to the largest call that needs it. */
enum { SCRATCH_WEIGHT, SCRATCH_ACT, SCRATCH_SMALL, SCRATCH_ATTENTION, SCRATCH_NORM, N_SCRATCH };

/* What changes from one recorded decode step to the next: the graph's
 * first node copies it from pinned host memory to the device, and the ops
 * that depend on it (embed, rope, attention) read it there. */
#define STEP_MAX_T 4
struct step_io {
    int pos0;
    int32_t tokens[STEP_MAX_T];
};

/* A recorded step (backend.h step_begin): LRU over a few keys, since a
 * runner decodes one or a few sequences at a time. */
#define STEP_GRAPHS 8
struct step_graph {
    uint64_t key;
    cudaGraphExec_t exec;
    unsigned scratch_gen; /* the scratch buffers it was recorded against */
    int T;
    bool seen;            /* ran once eagerly: the scratch buffers have grown */
    int fails;            /* recordings that broke; after three the key stays eager */
    uint64_t used;
};

#define HOST_BUFFERS 8 /* host_alloc's at once: a runner's logits, a rank's */

typedef struct cuda_backend {
    exo_backend base;
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    /* the weight arena */
    void **chunks;
    size_t n_chunks, cap_chunks;
    char *bump;
    size_t bump_left;
    /* dequantized weights and half-precision activations for cuBLAS, GEMV
     * activation codes, host arrays brought up, split attention's partials */
    void *scratch[N_SCRATCH];
    size_t scratch_bytes[N_SCRATCH];
    int *arrivals; /* the split decode attention's counters (EXO_CUDA_ATT_ARRIVALS) */
    /* EXO_MATMUL_PATH=gemv|gemm pins one product path whatever T is (as on
     * the CPU: tests hold each path to its own tolerance) */
    bool force_gemv, force_gemm;
    struct profile *prof; /* EXO_CUDA_PROFILE=1: GPU time per op, printed at free */
    /* recorded decode steps */
    bool graphs_off;              /* EXO_CUDA_GRAPH=0, or profiling */
    struct step_graph graphs[STEP_GRAPHS];
    uint64_t graph_clock;
    struct step_io *step_host;    /* pinned */
    struct step_io *step_dev;
    cudaEvent_t step_read;        /* the last replay has read step_host */
    struct step_graph *recording; /* the step being captured, or NULL */
    bool broken;                  /* something in the capture cannot be replayed */
    int rec_pos0, rec_T;
    unsigned scratch_gen;         /* bumped whenever a scratch buffer moves */
    void *retired[8];             /* scratch replaced during a capture, freed at the next sync */
    int n_retired;
    void *pinned;                 /* host staging for large copies to the host */
    size_t pinned_bytes;
    struct { char *p; size_t bytes; } host[HOST_BUFFERS]; /* host_alloc's: copies land there directly */
    exo_cuda_picker *picker;      /* pick's buffers (pick.cu) */
    char *up_host;                /* pinned upload ring: two halves (stage_upload) */
    size_t up_used;
    int up_half;
    cudaEvent_t up_done[2];
    void *group; /* a tensor-parallel group's communicator (group.cu), or NULL */
    /* prefetch: weights read into L2 on a stream of their own */
    cudaStream_t side;
    cudaEvent_t side_fork, side_join;
    bool side_in_capture; /* the recording forked to it: join before it ends */
    size_t prefetch_min, prefetch_max; /* what a call's weights must come to; max 0: prefetch off */
} cuda_backend;

/* GPU time per op: events around every op, read back at each
 * synchronisation, summed by op name and printed when the backend is
 * freed (the one way to see where a decode step's time goes on a machine
 * without a profiler). */
#define PROF_EVENTS 8192
#define PROF_OPS 32
struct profile {
    cudaEvent_t ev[PROF_EVENTS];
    const char *pending[PROF_EVENTS / 2];
    int n_pending;
    const char *name[PROF_OPS];
    double ms[PROF_OPS];
    long calls[PROF_OPS];
};

static void profile_collect(struct profile *p)
{
    for (int i = 0; i < p->n_pending; i++) {
        float ms = 0;
        cudaEventElapsedTime(&ms, p->ev[2 * i], p->ev[2 * i + 1]);
        int k = 0;
        while (k < PROF_OPS && p->name[k] && strcmp(p->name[k], p->pending[i]))
            k++;
        if (k == PROF_OPS)
            continue;
        p->name[k] = p->pending[i];
        p->ms[k] += ms;
        p->calls[k]++;
    }
    p->n_pending = 0;
}

struct prof_scope {
    struct profile *p;
    cudaStream_t s;
    prof_scope(cuda_backend *c, const char *what) : p(c->prof), s(c->stream)
    {
        if (!p)
            return;
        if (p->n_pending == PROF_EVENTS / 2) {
            cudaStreamSynchronize(s);
            profile_collect(p);
        }
        p->pending[p->n_pending] = what;
        cudaEventRecord(p->ev[2 * p->n_pending], s);
    }
    ~prof_scope()
    {
        if (p)
            cudaEventRecord(p->ev[2 * p->n_pending++ + 1], s);
    }
};

static cuda_backend *cu(exo_backend *be) { return (cuda_backend *)be; }

static int check(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    EXO_LOG_ERROR("cuda: %s: %s", what, cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? EXO_ENOMEM : EXO_EINTERNAL;
}

int exo_cuda_launched(const char *what) { return check(cudaGetLastError(), what); }

bool exo_cuda_overlap;

/* Launches overlap (cuda_internal.h) where every GPU is Hopper or later:
 * decided once, so that a launch never asks which device it is on. */
static void decide_overlap(int n_devices)
{
    static bool decided;
    if (decided)
        return;
    decided = true;
    const char *env = getenv("EXO_CUDA_PDL");
    bool all = !(env && !strcmp(env, "0"));
    for (int d = 0; d < n_devices && all; d++) {
        int major = 0;
        all = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) == cudaSuccess && major >= 9;
    }
    exo_cuda_overlap = all;
}

static void free_retired(cuda_backend *c)
{
    for (int i = 0; i < c->n_retired; i++)
        cudaFree(c->retired[i]);
    c->n_retired = 0;
}

static void *scratch(cuda_backend *c, int which, size_t bytes)
{
    if (c->scratch_bytes[which] >= bytes)
        return c->scratch[which];
    c->scratch_gen++; /* recorded steps that use the old buffer are stale */
    if (c->recording) {
        /* the stream cannot wait while it is captured: the old buffer is
         * kept until the next sync, and this recording is thrown away
         * (the next step records again, with the buffer grown) */
        c->broken = true;
        if (c->n_retired == (int)(sizeof c->retired / sizeof *c->retired))
            return NULL;
        c->retired[c->n_retired++] = c->scratch[which];
    } else {
        /* queued work may still read the old buffer */
        cudaStreamSynchronize(c->stream);
        cudaFree(c->scratch[which]);
    }
    size_t want = bytes + bytes / 4;
    if (cudaMalloc(&c->scratch[which], want) != cudaSuccess) {
        c->scratch[which] = NULL;
        c->scratch_bytes[which] = 0;
        cudaGetLastError();
        return NULL;
    }
    c->scratch_bytes[which] = want;
    return c->scratch[which];
}

/* ---- memory -------------------------------------------------------------- */

/* A recorded step with a group's all-reduces in it holds NCCL's resources
 * for them until it is destroyed, and the communicator's destruction waits
 * for those: the recordings go first (after the stream has run them). */
static void leave_group(cuda_backend *c)
{
    if (!c->group)
        return;
    cudaStreamSynchronize(c->stream);
    for (int i = 0; i < STEP_GRAPHS; i++)
        if (c->graphs[i].exec) {
            cudaGraphExecDestroy(c->graphs[i].exec);
            c->graphs[i].exec = NULL;
        }
    exo_cuda_group_leave(c->group);
    c->group = NULL;
}

static void cuda_free_backend(exo_backend *be)
{
    cuda_backend *c = cu(be);
    cudaSetDevice(c->device);
    cudaStreamSynchronize(c->stream);
    leave_group(c);
    if (c->side) {
        cudaStreamSynchronize(c->side);
        cudaStreamDestroy(c->side);
        cudaEventDestroy(c->side_fork);
        cudaEventDestroy(c->side_join);
    }
    if (c->prof) {
        profile_collect(c->prof);
        double total = 0;
        for (int k = 0; k < PROF_OPS && c->prof->name[k]; k++)
            total += c->prof->ms[k];
        for (int k = 0; k < PROF_OPS && c->prof->name[k]; k++)
            fprintf(stderr, "cuda profile: %-18s %9.3f ms %5.1f%% %8ld calls %8.2f us/call\n", c->prof->name[k],
                    c->prof->ms[k], 100 * c->prof->ms[k] / total, c->prof->calls[k],
                    1e3 * c->prof->ms[k] / (double)c->prof->calls[k]);
        for (int i = 0; i < PROF_EVENTS; i++)
            cudaEventDestroy(c->prof->ev[i]);
        free(c->prof);
    }
    for (int i = 0; i < STEP_GRAPHS; i++)
        if (c->graphs[i].exec)
            cudaGraphExecDestroy(c->graphs[i].exec);
    free_retired(c);
    cudaFreeHost(c->pinned);
    for (int i = 0; i < HOST_BUFFERS; i++)
        cudaFreeHost(c->host[i].p);
    exo_cuda_picker_free(c->picker);
    cudaFreeHost(c->up_host);
    cudaEventDestroy(c->up_done[0]);
    cudaEventDestroy(c->up_done[1]);
    cudaFreeHost(c->step_host);
    cudaFree(c->step_dev);
    cudaEventDestroy(c->step_read);
    for (size_t i = 0; i < c->n_chunks; i++)
        cudaFree(c->chunks[i]);
    for (int i = 0; i < N_SCRATCH; i++)
        cudaFree(c->scratch[i]);
    cudaFree(c->arrivals);
    free(c->chunks);
    cublasDestroy(c->blas);
    cudaStreamDestroy(c->stream);
    free(c);
}

/* Every copy and fill goes on the backend's stream: it does not wait for
 * the legacy default stream (cudaStreamNonBlocking), so a cudaMemset there
 * could land after a copy queued here. */
static void *cuda_alloc(exo_backend *be, size_t bytes)
{
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    if (cudaMemsetAsync(p, 0, bytes, cu(be)->stream) != cudaSuccess) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cuda_release(exo_backend *be, void *p)
{
    if (p) {
        cudaStreamSynchronize(cu(be)->stream);
        cudaFree(p);
    }
}

/* A host copy or a wait cannot be part of a recorded step: the recording
 * is marked broken (step_end then has the caller run the step eagerly). */
static bool refuse_in_capture(cuda_backend *c)
{
    if (c->recording)
        c->broken = true;
    return c->recording != NULL;
}

static int cuda_to_device(exo_backend *be, void *dst, const void *src, size_t bytes)
{
    if (refuse_in_capture(cu(be)))
        return EXO_EBUSY;
    return check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cu(be)->stream), "copy to device");
}

static int cuda_to_host(exo_backend *be, void *dst, const void *src, size_t bytes)
{
    cuda_backend *c = cu(be);
    if (refuse_in_capture(c))
        return EXO_EBUSY;
    /* a large copy (a step's logits) lands in pinned memory first: the
     * driver copies pageable memory through its own small staging buffer
     * at a fraction of the bus's speed (90 us for 128k logits on an H200
     * host, against about 20 + 15 us this way); in host_alloc's memory it
     * lands directly */
    bool pinned_dst = false;
    for (int i = 0; i < HOST_BUFFERS && !pinned_dst; i++)
        pinned_dst = c->host[i].p && (char *)dst >= c->host[i].p &&
                     (char *)dst + bytes <= c->host[i].p + c->host[i].bytes;
    bool staged = !pinned_dst && bytes >= ((size_t)64 << 10) && bytes <= ((size_t)64 << 20);
    if (staged && c->pinned_bytes < bytes) {
        cudaStreamSynchronize(c->stream);
        cudaFreeHost(c->pinned);
        c->pinned_bytes = 0;
        if (cudaMallocHost(&c->pinned, bytes) == cudaSuccess)
            c->pinned_bytes = bytes;
        else
            c->pinned = NULL;
        cudaGetLastError();
    }
    staged = staged && c->pinned_bytes >= bytes;
    int rc;
    {
        prof_scope prof(c, "to_host");
        rc = check(cudaMemcpyAsync(staged ? c->pinned : dst, src, bytes, cudaMemcpyDeviceToHost, c->stream),
                   "copy to host");
    }
    rc = rc ? rc : check(cudaStreamSynchronize(c->stream), "copy to host");
    if (!rc && staged)
        memcpy(dst, c->pinned, bytes);
    free_retired(c);
    if (c->prof)
        profile_collect(c->prof);
    return rc;
}

static void *cuda_host_alloc(exo_backend *be, size_t bytes)
{
    cuda_backend *c = cu(be);
    for (int i = 0; i < HOST_BUFFERS; i++) {
        if (c->host[i].p)
            continue;
        void *p = NULL;
        if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
            cudaGetLastError();
            return NULL;
        }
        c->host[i].p = (char *)p;
        c->host[i].bytes = bytes;
        return p;
    }
    return NULL;
}

static bool cuda_host_free(exo_backend *be, void *p)
{
    cuda_backend *c = cu(be);
    for (int i = 0; i < HOST_BUFFERS; i++)
        if (p && c->host[i].p == (char *)p) {
            cudaFreeHost(p);
            c->host[i].p = NULL;
            return true;
        }
    return false;
}

static int cuda_sync(exo_backend *be)
{
    cuda_backend *c = cu(be);
    if (refuse_in_capture(c))
        return EXO_EBUSY;
    int rc = check(cudaStreamSynchronize(c->stream), "sync");
    if (c->side && !rc)
        rc = check(cudaStreamSynchronize(c->side), "sync");
    free_retired(c);
    if (c->prof)
        profile_collect(c->prof);
    return rc;
}

/* n bytes of the weight arena, 256-byte aligned. */
static void *arena_take(cuda_backend *c, size_t n)
{
    n = (n + 255) / 256 * 256;
    if (n > c->bump_left) {
        size_t chunk = n > WEIGHT_CHUNK ? n : WEIGHT_CHUNK;
        void *p = NULL;
        if (cudaMalloc(&p, chunk) != cudaSuccess) {
            cudaGetLastError();
            return NULL;
        }
        if (c->n_chunks == c->cap_chunks) {
            c->cap_chunks = c->cap_chunks ? 2 * c->cap_chunks : 16;
            c->chunks = (void **)realloc(c->chunks, c->cap_chunks * sizeof *c->chunks);
        }
        c->chunks[c->n_chunks++] = p;
        c->bump = (char *)p;
        c->bump_left = chunk;
    }
    void *p = c->bump;
    c->bump += n;
    c->bump_left -= n;
    return p;
}

static int upload(cuda_backend *c, const void *host, size_t bytes, const void **out, exo_err *err)
{
    *out = NULL;
    if (!bytes)
        return 0;
    void *d = arena_take(c, bytes);
    if (!d)
        return exo_err_set(err, EXO_ENOMEM, "GPU %d: out of memory for weights (%zu bytes more)", c->device,
                           bytes);
    int rc = check(cudaMemcpyAsync(d, host, bytes, cudaMemcpyHostToDevice, c->stream), "weight upload");
    rc = rc ? rc : check(cudaStreamSynchronize(c->stream), "weight upload");
    if (rc)
        return exo_err_set(err, rc, "GPU %d: weight upload failed", c->device);
    *out = d;
    return 0;
}

static int cuda_load_linear(exo_backend *be, const exo_linear *host, bool from_file, exo_linear *dev, exo_err *err)
{
    cuda_backend *c = cu(be);
    size_t wb, sb, bb;
    exo_linear_part_bytes(host, &wb, &sb, &bb);
    *dev = *host;
    int rc = upload(c, host->w, wb, &dev->w, err);
    if (!rc && host->scales)
        rc = upload(c, host->scales, sb, &dev->scales, err);
    if (!rc && host->biases)
        rc = upload(c, host->biases, bb, &dev->biases, err);
    return rc;
}

static float *cuda_load_vector(exo_backend *be, exo_dtype t, const void *host, size_t n, exo_err *err)
{
    float *tmp = (float *)malloc(n * sizeof(float) + 1);
    if (!tmp) {
        exo_err_set(err, EXO_ENOMEM, "cannot allocate %zu floats", n);
        return NULL;
    }
    exo_convert_to_f32(t, host, tmp, n);
    float *d = (float *)cuda_alloc(be, n * sizeof(float));
    if (!d || cudaMemcpyAsync(d, tmp, n * sizeof(float), cudaMemcpyHostToDevice, cu(be)->stream) != cudaSuccess ||
        cudaStreamSynchronize(cu(be)->stream) != cudaSuccess) {
        exo_err_set(err, EXO_ENOMEM, "GPU %d: cannot hold a vector of %zu floats", cu(be)->device, n);
        cuda_release(be, d);
        d = NULL;
    }
    free(tmp);
    return d;
}

/* Small host arrays an op takes (token ids, expert rows and weights) go
 * up from a pinned ring: a copy from pageable memory waits for all the
 * work queued before it (the driver synchronises the stream first), one
 * from pinned memory queues like a kernel. The ring is two halves; a half
 * is written again once the copies from it have run (its event). Arrays
 * larger than a half go from where they are. */
#define UPLOAD_HALF ((size_t)64 << 10)
static const void *stage_upload(cuda_backend *c, const void *host, size_t bytes)
{
    if (!c->up_host || bytes > UPLOAD_HALF)
        return host;
    if (c->up_used + bytes > UPLOAD_HALF) {
        cudaEventRecord(c->up_done[c->up_half], c->stream);
        c->up_half ^= 1;
        cudaEventSynchronize(c->up_done[c->up_half]);
        c->up_used = 0;
    }
    char *p = c->up_host + (size_t)c->up_half * UPLOAD_HALF + c->up_used;
    memcpy(p, host, bytes);
    c->up_used += (bytes + 15) / 16 * 16;
    return p;
}

/* Host values up to the device's small scratch, in stream order. */
static void *bring_up(cuda_backend *c, const void *host, size_t bytes)
{
    if (refuse_in_capture(c))
        return NULL;
    void *d = scratch(c, SCRATCH_SMALL, bytes);
    if (!d || cudaMemcpyAsync(d, stage_upload(c, host, bytes), bytes, cudaMemcpyHostToDevice, c->stream) !=
                  cudaSuccess)
        return NULL;
    return d;
}

/* ---- recorded decode steps ------------------------------------------------ */

/* While a step is recorded, the position its ops were given must be the
 * step's (it is read from the device at replay); anything else cannot be
 * replayed. NULL when not recording. */
static const int *step_pos(cuda_backend *c, int T, int pos0)
{
    if (!c->recording)
        return NULL;
    if (T != c->rec_T || pos0 != c->rec_pos0)
        c->broken = true;
    return &c->step_dev->pos0;
}

static void stage_step(cuda_backend *c, const int32_t *tokens, int T, int pos0)
{
    cudaEventSynchronize(c->step_read); /* the previous replay's copy has read it */
    c->step_host->pos0 = pos0;
    memcpy(c->step_host->tokens, tokens, sizeof(int32_t) * (size_t)T);
}

static int cuda_step_begin(exo_backend *be, uint64_t key, const int32_t *tokens, int T, int pos0)
{
    cuda_backend *c = cu(be);
    if (c->graphs_off || c->recording || !tokens || T < 1 || T > STEP_MAX_T)
        return 0;
    struct step_graph *g = NULL, *lru = &c->graphs[0];
    for (int i = 0; i < STEP_GRAPHS; i++) {
        if (c->graphs[i].used && c->graphs[i].key == key && c->graphs[i].T == T)
            g = &c->graphs[i];
        if (c->graphs[i].used < lru->used)
            lru = &c->graphs[i];
    }
    if (!g) { /* a new key takes the least recently used slot */
        g = lru;
        if (g->exec)
            cudaGraphExecDestroy(g->exec);
        memset(g, 0, sizeof *g);
        g->key = key;
        g->T = T;
    }
    g->used = ++c->graph_clock;
    if (g->exec && g->scratch_gen == c->scratch_gen) {
        stage_step(c, tokens, T, pos0);
        if (check(cudaGraphLaunch(g->exec, c->stream), "replay a decode step") ||
            check(cudaEventRecord(c->step_read, c->stream), "replay a decode step"))
            return EXO_EINTERNAL;
        return 1;
    }
    if (g->exec) {
        cudaGraphExecDestroy(g->exec);
        g->exec = NULL;
    }
    if (!g->seen || g->fails >= 3) { /* the first time eagerly: scratch buffers grow to size */
        g->seen = true;
        return 0;
    }
    stage_step(c, tokens, T, pos0);
    if (c->side) /* it joins the capture at its first fork: nothing of before in it */
        cudaStreamSynchronize(c->side);
    if (cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeRelaxed) != cudaSuccess ||
        cudaMemcpyAsync(c->step_dev, c->step_host, sizeof *c->step_host, cudaMemcpyHostToDevice, c->stream) !=
            cudaSuccess) {
        cudaGraph_t dropped = NULL;
        cudaStreamEndCapture(c->stream, &dropped);
        if (dropped)
            cudaGraphDestroy(dropped);
        cudaGetLastError();
        g->fails = 3;
        return 0;
    }
    c->recording = g;
    c->broken = false;
    c->rec_T = T;
    c->rec_pos0 = pos0;
    return 0;
}

static int cuda_step_end(exo_backend *be)
{
    cuda_backend *c = cu(be);
    struct step_graph *g = c->recording;
    if (!g)
        return 0;
    c->recording = NULL;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    if (c->side_in_capture) { /* a capture ends with every stream it forked joined */
        c->side_in_capture = false;
        if (cudaEventRecord(c->side_join, c->side) != cudaSuccess ||
            cudaStreamWaitEvent(c->stream, c->side_join, 0) != cudaSuccess)
            c->broken = true;
    }
    bool ok = cudaStreamEndCapture(c->stream, &graph) == cudaSuccess && graph && !c->broken &&
              cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
    if (graph)
        cudaGraphDestroy(graph);
    if (!ok) {
        cudaGetLastError();
        if (exec)
            cudaGraphExecDestroy(exec);
        g->fails++;
        return 1; /* nothing ran: the caller issues the step again, eagerly */
    }
    g->exec = exec;
    g->scratch_gen = c->scratch_gen;
    if (check(cudaGraphLaunch(exec, c->stream), "run a recorded decode step") ||
        check(cudaEventRecord(c->step_read, c->stream), "run a recorded decode step"))
        return EXO_EINTERNAL;
    return 0;
}

/* ---- weights into L2 ahead of their products -------------------------------- */

/* Decode at batch 1 is a chain of short kernels, each waiting on the one
 * before (rotations, attention, its combine, the quantization of a
 * product's input) between the products that stream the weights: while
 * that chain runs, memory idles. prefetch reads the products' weights
 * into L2 on a stream of its own, forked from the main one where it is
 * called, and nothing waits on it (it only reads weights, which no kernel
 * writes); a recording joins it back at its end. The fork costs the step
 * about as much as a few MB of weights take to stream, so it is all or
 * nothing, and only for weights worth it: on an H200, llama-3.2-1b q4 (o,
 * gate and up of a layer: 21 MB) decoded 4-5% faster with them in L2,
 * qwen3-0.6b q4 (4.7 MB) 3% slower, and llama-3.1-8b q4, whose 76 MB do
 * not fit, 5% slower with 4, 10 or 25 MB of them. So from 8 MB
 * (EXO_CUDA_PREFETCH_MIN_MB) to half of L2 (EXO_CUDA_PREFETCH_MB; 0 turns
 * prefetch off). */
#define PREFETCH_RANGES 16
#define PREFETCH_CHUNK 16384 /* bytes a thread asks for */
struct prefetch_ranges {
    const char *p[PREFETCH_RANGES];
    uint32_t bytes[PREFETCH_RANGES];
};

__global__ void l2_prefetch_kernel(const __grid_constant__ prefetch_ranges r)
{
    const char *p = r.p[blockIdx.y];
    const uint32_t n = r.bytes[blockIdx.y];
    const uint64_t off = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) * PREFETCH_CHUNK;
    if (off >= n)
        return;
    const uint32_t len = n - off < PREFETCH_CHUNK ? (uint32_t)(n - off) & ~15u : PREFETCH_CHUNK;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (len)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(len) : "memory");
#else
    for (uint32_t i = 0; i < len; i += 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off + i));
#endif
}

static int cuda_prefetch(exo_backend *be, int n, const exo_linear *const *w)
{
    cuda_backend *c = cu(be);
    if (!c->prefetch_max || !c->side)
        return 0;
    prefetch_ranges r = {};
    int nr = 0;
    size_t total = 0, most = 0;
    for (int i = 0; i < n; i++) {
        const exo_linear *l = w[i];
        if (l->pick_table || !l->w)
            continue;
        size_t bytes[3];
        exo_linear_part_bytes(l, &bytes[0], &bytes[1], &bytes[2]);
        const void *part[3] = {l->w, l->scales, l->biases};
        for (int k = 0; k < 3; k++) {
            if (!part[k] || !bytes[k])
                continue;
            if (nr == PREFETCH_RANGES || bytes[k] >= UINT32_MAX)
                return 0;
            r.p[nr] = (const char *)part[k];
            r.bytes[nr++] = (uint32_t)bytes[k];
            total += bytes[k];
            most = bytes[k] > most ? bytes[k] : most;
        }
    }
    if (!nr || total < c->prefetch_min || total > c->prefetch_max)
        return 0;
    const unsigned per_block = 128;
    dim3 grid((unsigned)((most + (size_t)PREFETCH_CHUNK * per_block - 1) / ((size_t)PREFETCH_CHUNK * per_block)),
              (unsigned)nr);
    if (check(cudaEventRecord(c->side_fork, c->stream), "prefetch") ||
        check(cudaStreamWaitEvent(c->side, c->side_fork, 0), "prefetch"))
        return EXO_EINTERNAL;
    l2_prefetch_kernel<<<grid, per_block, 0, c->side>>>(r);
    if (c->recording)
        c->side_in_capture = true;
    int rc = exo_cuda_launched("prefetch");
    return rc ? rc : 1;
}

/* ---- element-wise ops ------------------------------------------------------ */

static unsigned blocks_for(size_t n, unsigned per = 256) { return exo_cuda_blocks(n, per); }

#define GRID_LOOP(i, n) for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); \
                             i += (size_t)gridDim.x * blockDim.x)

__global__ void glu_kernel(int kind, float *g, const float *u, size_t n, float lim)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    GRID_LOOP(i, n) g[i] = exo_cuda_glu(kind, g[i], u[i], lim);
}

__global__ void add_kernel(float *x, const float *y, size_t n)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    GRID_LOOP(i, n) x[i] += y[i];
}
__global__ void scale_kernel(float *x, float s, size_t n)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    GRID_LOOP(i, n) x[i] *= s;
}

__global__ void add_bias_kernel(float *y, const float *b, size_t T, size_t dim)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    GRID_LOOP(i, T * dim) y[i] += b[i % dim];
}

/* T rows of dim at stride ldy (a product's output: exo_linear.out_bias) */
__global__ void add_bias_rows_kernel(float *y, const float *b, size_t T, size_t dim, size_t ldy)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    GRID_LOOP(i, T * dim) y[i / dim * ldy + i % dim] += b[i % dim];
}

__global__ void sigmoid_mul_kernel(float *x, const float *gate, size_t rows, size_t dim, size_t gate_dim)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    GRID_LOOP(i, rows * dim) {
        size_t r = i / dim, j = i % dim;
        x[i] *= 1.0f / (1.0f + expf(-gate[r * gate_dim + (gate_dim == 1 ? 0 : j)]));
    }
}

static int cuda_glu(exo_backend *be, exo_glu_kind kind, float *g, const float *u, size_t n, float limit)
{
    prof_scope prof(cu(be), "glu");
    exo_cuda_launch(glu_kernel, dim3(blocks_for(n)), dim3(256), 0, cu(be)->stream, (int)kind, g, u, n, limit);
    return exo_cuda_launched("glu");
}

static int cuda_add(exo_backend *be, float *x, const float *y, size_t n)
{
    prof_scope prof(cu(be), "add");
    exo_cuda_launch(add_kernel, dim3(blocks_for(n)), dim3(256), 0, cu(be)->stream, x, y, n);
    return exo_cuda_launched("add");
}

static int cuda_scale(exo_backend *be, float *x, float s, size_t n)
{
    prof_scope prof(cu(be), "scale");
    exo_cuda_launch(scale_kernel, dim3(blocks_for(n)), dim3(256), 0, cu(be)->stream, x, s, n);
    return exo_cuda_launched("scale");
}

static int cuda_zero(exo_backend *be, float *x, size_t n)
{
    return check(cudaMemsetAsync(x, 0, n * sizeof(float), cu(be)->stream), "zero");
}

static int cuda_add_bias(exo_backend *be, float *y, const float *b, int T, int dim)
{
    prof_scope prof(cu(be), "add_bias");
    exo_cuda_launch(add_bias_kernel, dim3(blocks_for((size_t)T * dim)), dim3(256), 0, cu(be)->stream, y, b, (size_t)T, (size_t)dim);
    return exo_cuda_launched("add_bias");
}

static int cuda_sigmoid_mul(exo_backend *be, float *x, const float *gate, int rows, int dim, int gate_dim)
{
    prof_scope prof(cu(be), "sigmoid_mul");
    exo_cuda_launch(sigmoid_mul_kernel, dim3(blocks_for((size_t)rows * dim)), dim3(256), 0, cu(be)->stream, x, gate, (size_t)rows,
                                                                                    (size_t)dim, (size_t)gate_dim);
    return exo_cuda_launched("sigmoid_mul");
}

static int cuda_copy2d(exo_backend *be, float *dst, size_t dst_ld, const float *src, size_t src_ld, int rows,
                       int cols)
{
    prof_scope prof(cu(be), "copy2d");
    return check(cudaMemcpy2DAsync(dst, dst_ld * sizeof(float), src, src_ld * sizeof(float),
                                   (size_t)cols * sizeof(float), (size_t)rows, cudaMemcpyDeviceToDevice,
                                   cu(be)->stream),
                 "copy2d");
}

/* The layout is by position (attention.cu), so slot n starts at the same
 * offset whatever the capacity: one run each for K and V. */
static int cuda_kv_copy(exo_backend *be, const exo_attn_shape *shape, void *dst_k, void *dst_v, int dst_capacity,
                        const void *src_k, const void *src_v, int src_capacity, int n)
{
    (void)dst_capacity;
    (void)src_capacity;
    if (shape->cache != EXO_DTYPE_F32 && shape->cache != EXO_DTYPE_BF16)
        return EXO_EUNSUPPORTED;
    prof_scope prof(cu(be), "kv_copy");
    size_t bytes = (size_t)n * (size_t)shape->n_kv_heads * (size_t)shape->head_dim * exo_dtype_size(shape->cache);
    int rc = check(cudaMemcpyAsync(dst_k, src_k, bytes, cudaMemcpyDeviceToDevice, cu(be)->stream), "kv_copy");
    return rc ? rc : check(cudaMemcpyAsync(dst_v, src_v, bytes, cudaMemcpyDeviceToDevice, cu(be)->stream), "kv_copy");
}

/* ---- norms and rotary embedding -------------------------------------------- */

__device__ float block_sum(float v, float *shared)
{
    for (int o = 16; o; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads(); /* shared may still be read by a previous call */
    if (lane == 0)
        shared[warp] = v;
    __syncthreads();
    v = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++)
        v += shared[w];
    return v;
}

__global__ void rmsnorm_kernel(float *out, const float *x, const float *w, int dim, float eps)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    __shared__ float part[32];
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *orow = out + (size_t)blockIdx.x * dim;
    float ss = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        ss += xr[i] * xr[i];
    ss = block_sum(ss, part);
    float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        orow[i] = w[i] * (xr[i] * inv);
}

static int norm_rows(cuda_backend *c, float *out, const float *x, const float *w, int rows, int dim, float eps)
{
    /* EXO_CUDA_NORM_THREADS whatever the width: the sum of squares adds up in
     * the order of the GEMV's norm-and-quantize kernel (matmul.cu), so a
     * row normed here or there is the same bits (a batch of decode rows
     * norms here, one row alone there) */
    exo_cuda_launch(rmsnorm_kernel, dim3(rows), dim3(EXO_CUDA_NORM_THREADS), 0, c->stream, out, x, w, dim, eps);
    return exo_cuda_launched("rmsnorm");
}

static int cuda_rmsnorm(exo_backend *be, float *out, const float *x, const float *w, int rows, int dim, float eps)
{
    prof_scope prof(cu(be), "rmsnorm");
    return norm_rows(cu(be), out, x, w, rows, dim, eps);
}

__global__ void rope_kernel(float *x, int n_heads, int head_dim, int half, int pos0, const int *pos_dev,
                            const float *inv_freq, float mscale)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    if (pos_dev)
        pos0 = *pos_dev;
    int t = blockIdx.y;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n_heads * half; i += gridDim.x * blockDim.x) {
        int h = i / half, d = i % half;
        const float2 cs = exo_cuda_rope_cs(pos0 + t, inv_freq[d], mscale);
        float *v = x + ((size_t)t * n_heads + h) * head_dim;
        float a = v[d], b = v[d + half];
        v[d] = a * cs.x - b * cs.y;
        v[d + half] = b * cs.x + a * cs.y;
    }
}

/* One head of q or k a block (q's heads, then k's; blockIdx.y the token):
 * its RMSNorm in rmsnorm_kernel's arithmetic, then rope_kernel's rotation,
 * with the head held in shared memory between them: one launch where a
 * layer of Qwen3 took four (two norms, two rotations). */
#define QK_MAX_DIM 1024
#define QK_THREADS 128
#define QK_ROWS_MAX 16
/* Rows of several sequences (qk_norm_rope_rows): row t at p[t]; n 0: row t
 * at pos0 + t. */
struct qk_rows {
    int n, p[QK_ROWS_MAX];
};

__global__ void __launch_bounds__(QK_THREADS)
qk_norm_rope_kernel(float *q, float *k, int n_q, int n_k, int head_dim, int half, int pos0, const int *pos_dev,
                    const __grid_constant__ qk_rows rows, const float *inv_freq, float mscale, const float *q_norm,
                    const float *k_norm, float eps)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    __shared__ float v[QK_MAX_DIM], part[32];
    if (pos_dev)
        pos0 = *pos_dev;
    const int t = blockIdx.y, h = blockIdx.x;
    if (rows.n) /* the same angle as pos0 + t at that position */
        pos0 = rows.p[t] - t;
    const bool is_q = h < n_q;
    float *x = is_q ? q + ((size_t)t * n_q + h) * head_dim : k + ((size_t)t * n_k + h - n_q) * head_dim;
    const float *w = is_q ? q_norm : k_norm;
    float ss = 0;
    for (int i = threadIdx.x; i < head_dim; i += QK_THREADS) {
        v[i] = x[i];
        ss += v[i] * v[i];
    }
    if (w) {
        ss = block_sum(ss, part);
        float inv = 1.0f / sqrtf(ss / (float)head_dim + eps);
        for (int i = threadIdx.x; i < head_dim; i += QK_THREADS)
            v[i] = w[i] * (v[i] * inv);
    }
    __syncthreads();
    for (int d = threadIdx.x; d < half; d += QK_THREADS) {
        const float2 cs = exo_cuda_rope_cs(pos0 + t, inv_freq[d], mscale);
        float a = v[d], b = v[d + half];
        v[d] = a * cs.x - b * cs.y;
        v[d + half] = b * cs.x + a * cs.y;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < head_dim; i += QK_THREADS)
        x[i] = v[i];
}

static int cuda_qk_norm_rope(exo_backend *be, float *q, float *k, int T, int n_q, int n_k, int head_dim, int rot_dim,
                             int pos0, const float *inv_freq, float mscale, const float *q_norm, const float *k_norm,
                             float eps)
{
    prof_scope prof(cu(be), "qk_norm_rope");
    cuda_backend *c = cu(be);
    if (head_dim > QK_MAX_DIM || rot_dim > head_dim || T < 1)
        return EXO_EINVAL;
    const int *pos_dev = step_pos(c, T, pos0);
    qk_rows none = {};
    exo_cuda_launch(qk_norm_rope_kernel, dim3((unsigned)(n_q + n_k), (unsigned)T), dim3(QK_THREADS), 0, c->stream, q,
                    k, n_q, n_k, head_dim, rot_dim / 2, pos0, pos_dev, none, inv_freq, mscale, q_norm, k_norm, eps);
    return exo_cuda_launched("qk_norm_rope");
}

static int cuda_qk_norm_rope_rows(exo_backend *be, float *q, float *k, int n, int n_q, int n_k, int head_dim,
                                  int rot_dim, const int *pos, const float *inv_freq, float mscale, const float *q_norm,
                                  const float *k_norm, float eps)
{
    prof_scope prof(cu(be), "qk_norm_rope_rows");
    cuda_backend *c = cu(be);
    if (head_dim > QK_MAX_DIM || rot_dim > head_dim || n < 1)
        return EXO_EINVAL;
    for (int i0 = 0; i0 < n; i0 += QK_ROWS_MAX) {
        qk_rows rows = {};
        rows.n = n - i0 < QK_ROWS_MAX ? n - i0 : QK_ROWS_MAX;
        for (int t = 0; t < rows.n; t++)
            rows.p[t] = pos[i0 + t];
        exo_cuda_launch(qk_norm_rope_kernel, dim3((unsigned)(n_q + n_k), (unsigned)rows.n), dim3(QK_THREADS), 0,
                        c->stream, q + (size_t)i0 * n_q * head_dim, k + (size_t)i0 * n_k * head_dim, n_q, n_k,
                        head_dim, rot_dim / 2, 0, (const int *)NULL, rows, inv_freq, mscale, q_norm, k_norm, eps);
        int rc = exo_cuda_launched("qk_norm_rope_rows");
        if (rc)
            return rc;
    }
    return 0;
}

static int cuda_rope(exo_backend *be, float *x, int T, int n_heads, int head_dim, int rot_dim, int pos0,
                     const float *inv_freq, float mscale)
{
    prof_scope prof(cu(be), "rope");
    cuda_backend *c = cu(be);
    const int *pos_dev = step_pos(c, T, pos0);
    int half = rot_dim / 2;
    dim3 grid(blocks_for((size_t)n_heads * half, 128), (unsigned)T);
    exo_cuda_launch(rope_kernel, dim3(grid), dim3(128), 0, c->stream, x, n_heads, head_dim, half, pos0, pos_dev, inv_freq, mscale);
    return exo_cuda_launched("rope");
}

/* ---- embedding and matrix products ----------------------------------------- */

static int cuda_embed(exo_backend *be, const exo_linear *table, const int32_t *tokens, int T, float *out)
{
    prof_scope prof(cu(be), "embed");
    cuda_backend *c = cu(be);
    if (c->recording && T == c->rec_T) /* the step's tokens, as step_begin staged them */
        return exo_cuda_embed(c->stream, table, c->step_dev->tokens, T, out);
    const int32_t *d = (const int32_t *)bring_up(c, tokens, sizeof(int32_t) * (size_t)T);
    if (!d)
        return EXO_ENOMEM;
    return exo_cuda_embed(c->stream, table, d, T, out);
}

/* y = x W^T on the tensor cores (see matmul.cu). */
static int gemm(cuda_backend *c, const exo_linear *w, const float *x, int ldx, int T, float *y, int ldy,
                bool accumulate)
{
    const float one = 1.0f, zero = accumulate ? 1.0f : 0.0f; /* beta */
    int m = (int)w->rows, k = (int)w->cols;
    cublasStatus_t st;
    if (w->format == EXO_WFORMAT_DENSE && w->dtype == EXO_DTYPE_F32) {
        st = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, T, k, &one, w->w, CUDA_R_32F, k, x, CUDA_R_32F, ldx,
                          &zero, y, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    } else {
        bool f16 = w->format == EXO_WFORMAT_DENSE && w->dtype == EXO_DTYPE_F16;
        const void *wh = w->w;
        if (w->format != EXO_WFORMAT_DENSE) {
            void *buf = scratch(c, SCRATCH_WEIGHT, (size_t)m * (size_t)k * 2);
            if (!buf)
                return EXO_ENOMEM;
            int rc = exo_cuda_dequant_bf16(c->stream, w, buf);
            if (rc)
                return rc;
            wh = buf;
        }
        void *xh = scratch(c, SCRATCH_ACT, (size_t)T * (size_t)k * 2);
        if (!xh)
            return EXO_ENOMEM;
        int rc = exo_cuda_to_half(c->stream, x, T, k, ldx, !f16, xh);
        if (rc)
            return rc;
        cudaDataType_t ht = f16 ? CUDA_R_16F : CUDA_R_16BF;
        st = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, T, k, &one, wh, ht, k, xh, ht, k, &zero, y,
                          CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    }
    if (st != CUBLAS_STATUS_SUCCESS) {
        EXO_LOG_ERROR("cuda: cublasGemmEx (%d x %d x %d): status %d", m, T, k, (int)st);
        return EXO_EINTERNAL;
    }
    return 0;
}

/* The widest GEMV launch every one of n weights takes at most T rows of
 * x at: a width of the GEMV (exo_cuda_gemv_width), or up to
 * EXO_CUDA_GEMV_ANY_MAX_T for a weight only the any-format GEMV takes. */
static int call_width(int n, const exo_linear *const *w, const float *const *xs, int ldx, int T)
{
    int width = T;
    for (int i = 0; i < n; i++) {
        int wi = exo_cuda_gemv_width(w[i], T);
        if (!exo_cuda_gemv_takes(w[i], xs[i], ldx, wi))
            wi = T < EXO_CUDA_GEMV_ANY_MAX_T ? T : EXO_CUDA_GEMV_ANY_MAX_T;
        width = wi < width ? wi : width;
    }
    return width;
}

/* n products, weight i reading xs[i] (row stride ldx) into ys[i] (row
 * stride ldy; 0: the weight's rows, outputs packed (T, rows)); fold (matmul.h):
 * only where every weight's GEMV quantizes x; glu_us (optional): weight
 * i's own fold.glu_u, at xs[i]'s strides. */
static int products(cuda_backend *c, int n, const exo_linear *const *w, const float *const *xs, int ldx, int T,
                    float *const *ys, int ldy, bool accumulate = false, const exo_cuda_input_fold *fold = NULL,
                    const float *const *glu_us = NULL)
{
    static const exo_cuda_input_fold none = {};
    if (!fold)
        fold = &none;
    /* Up to 16 rows (a batch of decode rows, a short prompt chunk) go as GEMV
     * launches of its widths (16, 8, 4, 3, 2, 1 rows, as the formats allow;
     * a weight the GEMV does not take, as any-format launches of up to 4),
     * the narrowest of the call's weights for all: a pass or two over
     * the weight cost less than dequantizing it for cuBLAS, and a row's
     * product is then the same bits at any row count (batched decode gives
     * each sequence what it would get alone, as on the CPU). Each piece is
     * a width itself, so the call below takes it whole. */
    if (T > call_width(n, w, xs, ldx, T) && (c->force_gemv || (T <= 16 && !c->force_gemm))) {
        const float *xt[64], *ut[64];
        float *yt[64];
        exo_linear row_picked[64]; /* a weight whose rows of x pick their own experts, from row t0 on */
        const exo_linear *wt[64];
        for (int t0 = 0, Tc; t0 < T; t0 += Tc) {
            for (int i = 0; i < n; i++) {
                xt[i] = xs[i] + (size_t)t0 * (size_t)ldx;
                ut[i] = glu_us ? glu_us[i] + (size_t)t0 * (size_t)ldx : NULL;
                yt[i] = ys[i] + (size_t)t0 * (size_t)(ldy > 0 ? ldy : w[i]->rows);
                wt[i] = w[i];
                if (w[i]->pick && w[i]->pick_stride) {
                    row_picked[i] = *w[i];
                    row_picked[i].pick += (size_t)t0 * (size_t)w[i]->pick_stride;
                    wt[i] = &row_picked[i];
                }
            }
            Tc = call_width(n, wt, xt, ldx, T - t0);
            exo_cuda_input_fold part = *fold;
            if (part.glu_u)
                part.glu_u += (size_t)t0 * (size_t)ldx;
            int rc = products(c, n, wt, xt, ldx, Tc, yt, ldy > 0 ? ldy : -1, accumulate, &part, glu_us ? ut : NULL);
            if (rc)
                return rc;
        }
        return 0;
    }
    exo_cuda_gemv_job jobs[EXO_CUDA_JOBS];
    int nj = 0;
    for (int i = 0; i <= n; i++) {
        bool fast = i < n && !c->force_gemm && exo_cuda_gemv_takes(w[i], xs[i], ldx, T);
        int ly = i < n && ldy <= 0 ? (int)w[i]->rows : ldy; /* 0 (or -1): rows of the weight's width */
        if (fast) {
            jobs[nj] = (exo_cuda_gemv_job){*w[i], xs[i], ldx, ys[i], ly, *fold, accumulate};
            if (glu_us)
                jobs[nj].fold.glu_u = glu_us[i];
            nj++;
        }
        if (nj && (!fast || nj == EXO_CUDA_JOBS || i == n)) {
            void *s = scratch(c, SCRATCH_ACT, exo_cuda_gemv_scratch(nj, jobs, T) + 256);
            if (!s)
                return EXO_ENOMEM;
            int rc = exo_cuda_gemv(c->stream, nj, jobs, T, s);
            if (rc)
                return rc;
            nj = 0;
        }
        if (i < n && !fast) {
            if (w[i]->pick) /* moe_pick_table promised the GEMV; only its fast path reads a choice */
                return EXO_EUNSUPPORTED;
            int rc = T <= EXO_CUDA_GEMV_ANY_MAX_T && !c->force_gemm
                         ? exo_cuda_gemv_any(c->stream, w[i], xs[i], ldx, T, ys[i], ly, accumulate)
                         : gemm(c, w[i], xs[i], ldx, T, ys[i], ly, accumulate);
            if (!rc && w[i]->out_bias) {
                exo_cuda_launch(add_bias_rows_kernel, dim3(blocks_for((size_t)T * (size_t)w[i]->rows)), dim3(256), 0,
                                c->stream, ys[i], w[i]->out_bias, (size_t)T, (size_t)w[i]->rows, (size_t)ly);
                rc = exo_cuda_launched("bias");
            }
            if (rc)
                return rc;
        }
    }
    return 0;
}

static int cuda_matmul(exo_backend *be, int n, const exo_linear *const *w, const float *x, int T, float *const *y)
{
    prof_scope prof(cu(be), "matmul");
    const float *xs[64];
    for (int off = 0; off < n; off += 64) {
        int m = n - off < 64 ? n - off : 64;
        for (int i = 0; i < m; i++)
            xs[i] = x;
        /* every weight of one call has the same cols */
        int rc = products(cu(be), m, w + off, xs, (int)w[0]->cols, T, y + off, 0);
        if (rc)
            return rc;
    }
    return 0;
}

/* The products of cuda_matmul with x through RMSNorm first (norm not
 * NULL) and y accumulated: the GEMV norms x as it quantizes it, and adds
 * into y in its last write. Weights the GEMV does not quantize (bf16,
 * prompts) take x normed into scratch by the rmsnorm kernel. */
static int cuda_matmul_fused(exo_backend *be, int n, const exo_linear *const *w, const float *x, const float *norm,
                             float eps, bool accumulate, int T, float *const *y)
{
    prof_scope prof(cu(be), "matmul");
    cuda_backend *c = cu(be);
    int cols = (int)w[0]->cols;
    bool quantized = T <= EXO_CUDA_GEMV_MAX_T && !c->force_gemm && n <= 64;
    for (int i = 0; i < n && quantized; i++)
        quantized = exo_cuda_gemv_quantizes(w[i]) && exo_cuda_gemv_takes(w[i], x, cols, T);
    if (norm && !quantized) {
        float *h = (float *)scratch(c, SCRATCH_NORM, sizeof(float) * (size_t)T * (size_t)cols);
        if (!h)
            return EXO_ENOMEM;
        int rc = norm_rows(c, h, x, norm, T, cols, eps);
        if (rc)
            return rc;
        x = h;
        norm = NULL;
    }
    const float *xs[64];
    for (int off = 0; off < n; off += 64) {
        int m = n - off < 64 ? n - off : 64;
        for (int i = 0; i < m; i++)
            xs[i] = x;
        const exo_cuda_input_fold fold = {norm, eps, NULL, 0, 0.0f};
        int rc = products(c, m, w + off, xs, cols, T, y + off, 0, accumulate, &fold);
        if (rc)
            return rc;
    }
    return 0;
}

/* y[i] (+)= (act(g[i]) * u[i]) W[i]^T: the activation applied as the
 * GEMV quantizes its input (one kernel and a trip through memory fewer),
 * else by the glu kernel into each g[i] first. */
static int cuda_matmul_glu(exo_backend *be, int n, const exo_linear *const *w, exo_glu_kind kind, float *const *g,
                           const float *const *u, float limit, bool accumulate, int T, float *const *y)
{
    cuda_backend *c = cu(be);
    int cols = (int)w[0]->cols;
    const exo_cuda_input_fold fold = {NULL, 0, NULL, (int)kind, limit};
    for (int off = 0; off < n; off += 64) {
        int m = n - off < 64 ? n - off : 64;
        const float *const *x = (const float *const *)g + off;
        bool folds = T <= EXO_CUDA_GEMV_MAX_T && !c->force_gemm;
        for (int i = 0; i < m && folds; i++)
            folds = exo_cuda_gemv_quantizes(w[off + i]) && exo_cuda_gemv_takes(w[off + i], x[i], cols, T);
        for (int i = 0; i < m && !folds; i++) {
            int rc = cuda_glu(be, kind, g[off + i], u[off + i], (size_t)T * (size_t)cols, limit);
            if (rc)
                return rc;
        }
        prof_scope prof(c, "matmul"); /* after the glu kernels' own scopes: scopes do not nest */
        int rc = products(c, m, w + off, x, cols, T, y + off, 0, accumulate, folds ? &fold : NULL,
                          folds ? u + off : NULL);
        if (rc)
            return rc;
    }
    return 0;
}

static int cuda_matmul_each(exo_backend *be, int n, const exo_linear *const *w, const float *const *xs, int T,
                            float *const *y)
{
    prof_scope prof(cu(be), "matmul_each");
    return products(cu(be), n, w, xs, (int)w[0]->cols, T, y, 0);
}

static int cuda_head_matmul(exo_backend *be, int H, const exo_linear *w, const float *x, size_t x_head,
                            size_t x_tok, float *y, size_t y_head, size_t y_tok, int T)
{
    prof_scope prof(cu(be), "head_matmul");
    for (int h0 = 0; h0 < H; h0 += 64) {
        const exo_linear *ws[64];
        const float *xs[64];
        float *ys[64];
        int m = H - h0 < 64 ? H - h0 : 64;
        for (int i = 0; i < m; i++) {
            ws[i] = &w[h0 + i];
            xs[i] = x + (size_t)(h0 + i) * x_head;
            ys[i] = y + (size_t)(h0 + i) * y_head;
        }
        int rc = products(cu(be), m, ws, xs, (int)x_tok, T, ys, (int)y_tok);
        if (rc)
            return rc;
    }
    return 0;
}

static int cuda_group_new_id(exo_backend *be, uint8_t id[EXO_GROUP_ID_BYTES], exo_err *err)
{
    (void)be;
    return exo_cuda_group_new_id(id, err);
}

static int cuda_group_join(exo_backend *be, const uint8_t id[EXO_GROUP_ID_BYTES], int world, int rank, int timeout_ms,
                           exo_err *err)
{
    cuda_backend *c = cu(be);
    if (c->group)
        return exo_err_set(err, EXO_EINVAL, "cuda: this backend is in a group already");
    cudaSetDevice(c->device);
    return exo_cuda_group_join(&c->group, id, world, rank, timeout_ms, err);
}

static int cuda_group_allreduce(exo_backend *be, float *x, size_t n)
{
    cuda_backend *c = cu(be);
    prof_scope prof(c, "group_allreduce");
    if (!c->group)
        return EXO_EINVAL;
    return exo_cuda_group_allreduce(c->group, x, n, c->stream);
}

static void cuda_group_leave(exo_backend *be) { leave_group(cu(be)); }

static int cuda_pick(exo_backend *be, float *x, int rows, int n, const exo_pick_rule *rules, exo_pick *out)
{
    cuda_backend *c = cu(be);
    if (rows < 1 || rows > EXO_PICK_ROWS)
        return EXO_EINVAL;
    if (refuse_in_capture(c) || !c->picker)
        return EXO_EBUSY;
    prof_scope prof(c, "pick");
    return exo_cuda_pick(c->picker, c->stream, x, rows, n, rules, out);
}

/* ---- mixture of experts ------------------------------------------------------ */

static int cuda_moe_route(exo_backend *be, const exo_moe_router *r, const float *logits, int T, int32_t *idx,
                          float *w)
{
    prof_scope prof(cu(be), "moe_route");
    size_t n = (size_t)T * (size_t)r->n_experts;
    float *host = (float *)malloc(sizeof(float) * (n + (size_t)r->n_experts));
    if (!host)
        return EXO_ENOMEM;
    float *bias = r->bias ? host + n : NULL;
    int rc = cuda_to_host(be, host, logits, sizeof(float) * n);
    if (!rc && bias)
        rc = cuda_to_host(be, bias, r->bias, sizeof(float) * (size_t)r->n_experts);
    if (!rc)
        rc = exo_moe_route_rows(r, host, bias, T, idx, w);
    free(host);
    return rc;
}

/* Decode's router on the device (backend.h moe_pick): the same choice as
 * exo_moe_route_rows, whose semantics this follows step by step (best
 * first, the lowest index on ties, masked groups as -inf), so a recorded
 * step needs no host in the middle. One warp a token: k rounds of a warp
 * argmax over shared memory cost well under a microsecond, where a block
 * paid two barriers a round (12.6 us a call for Qwen3-30B-A3B's router). */
#define ROUTE_MAX_EXPERTS 4096
#define ROUTE_MAX_K 64
#define ROUTE_MAX_GROUPS 256

struct route_args {
    int E, k, n_group, topk_group;
    bool sigmoid, norm;
    float scale;
    const float *bias;
};

/* (v, i) becomes the warp's best of every lane's (v, i): the larger value,
 * the lower index on ties; i < 0 is no candidate. */
__device__ void warp_best(float &v, int &i)
{
    for (int o = 16; o; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (oi >= 0 && (i < 0 || ov > v || (ov == v && oi < i))) {
            v = ov;
            i = oi;
        }
    }
}

__device__ float warp_total(float v)
{
    for (int o = 16; o; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__global__ void __launch_bounds__(32) moe_pick_kernel(const float *logits, route_args r, int32_t *idx, float *w)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    __shared__ float choice[ROUTE_MAX_EXPERTS], gscore[ROUTE_MAX_GROUPS];
    __shared__ unsigned char taken[ROUTE_MAX_EXPERTS], kept[ROUTE_MAX_GROUPS];
    __shared__ int picked[ROUTE_MAX_K];
    const float *l = logits + (size_t)blockIdx.x * r.E;
    const int lane = threadIdx.x, E = r.E;
    float mx = 0, sum = 0;
    if (!r.sigmoid) { /* softmax: the order of probabilities is the order of logits */
        float v = -INFINITY;
        int i = -1;
        for (int e = lane; e < E; e += 32)
            if (i < 0 || l[e] > v) {
                v = l[e];
                i = e;
            }
        warp_best(v, i);
        mx = v;
        float part = 0;
        for (int e = lane; e < E; e += 32) {
            part += expf(l[e] - mx);
            choice[e] = l[e];
        }
        sum = warp_total(part);
    } else {
        for (int e = lane; e < E; e += 32)
            choice[e] = 1.0f / (1.0f + expf(-l[e])) + (r.bias ? r.bias[e] : 0.0f);
        __syncwarp();
        if (r.n_group > 1 && r.topk_group < r.n_group) {
            /* keep the topk_group groups whose two best choices sum highest */
            const int per = E / r.n_group;
            for (int g = lane; g < r.n_group; g += 32) {
                const float *c = choice + g * per;
                int b0 = 0, b1 = -1;
                for (int e = 1; e < per; e++)
                    if (c[e] > c[b0])
                        b0 = e;
                for (int e = 0; e < per; e++)
                    if (e != b0 && (b1 < 0 || c[e] > c[b1]))
                        b1 = e;
                gscore[g] = c[b0] + (per < 2 ? 0.0f : c[b1]);
                kept[g] = 0;
            }
            __syncwarp();
            for (int j = 0; j < r.topk_group; j++) {
                float v = -INFINITY;
                int i = -1;
                for (int g = lane; g < r.n_group; g += 32)
                    if (!kept[g] && (i < 0 || gscore[g] > v)) {
                        v = gscore[g];
                        i = g;
                    }
                warp_best(v, i);
                if (lane == 0)
                    kept[i] = 1;
                __syncwarp();
            }
            for (int e = lane; e < E; e += 32)
                if (!kept[e / per])
                    choice[e] = -INFINITY; /* as transformers 5 masks them */
        }
    }
    for (int e = lane; e < E; e += 32)
        taken[e] = 0;
    __syncwarp();
    for (int j = 0; j < r.k; j++) {
        float v = -INFINITY;
        int i = -1;
        for (int e = lane; e < E; e += 32)
            if (!taken[e] && (i < 0 || choice[e] > v)) {
                v = choice[e];
                i = e;
            }
        warp_best(v, i);
        if (lane == 0) {
            taken[i] = 1;
            picked[j] = i;
        }
        __syncwarp();
    }
    /* the weights, each lane its own picks (a softmax's logits are in
     * choice); summed best first by one lane, as the host router sums
     * them; then stored in increasing expert order, the order decode sums
     * them, each pick at its rank among the picks (distinct experts). All
     * in shared memory and registers: one lane doing this in global
     * memory, the sort's loads waiting on its stores, took 9.5 us of a
     * Qwen3-30B-A3B layer's 54 on an H100. */
    __shared__ float pw[ROUTE_MAX_K], total;
    for (int j = lane; j < r.k; j += 32) {
        const int e = picked[j];
        pw[j] = r.sigmoid ? 1.0f / (1.0f + expf(-l[e])) : expf(choice[e] - mx) / sum;
    }
    __syncwarp();
    if (lane == 0) {
        float t = 0;
        for (int j = 0; j < r.k; j++)
            t += pw[j];
        total = t;
    }
    __syncwarp();
    int32_t *ti = idx + (size_t)blockIdx.x * r.k;
    float *tw = w + (size_t)blockIdx.x * r.k;
    for (int j = lane; j < r.k; j += 32) {
        int rank = 0;
        for (int i = 0; i < r.k; i++)
            rank += picked[i] < picked[j];
        ti[rank] = picked[j];
        tw[rank] = (r.norm ? pw[j] / (total + (r.sigmoid ? 1e-20f : 0.0f)) : pw[j]) * r.scale;
    }
}

static int cuda_moe_pick(exo_backend *be, const exo_moe_router *r, const float *logits, int T, int32_t *idx,
                         float *w)
{
    prof_scope prof(cu(be), "moe_pick");
    if (r->n_experts > ROUTE_MAX_EXPERTS || r->k > ROUTE_MAX_K || r->k > r->n_experts || r->k < 1 ||
        (r->sigmoid && r->n_group > ROUTE_MAX_GROUPS) || T < 1)
        return EXO_EINVAL;
    route_args a = {r->n_experts, r->k, r->n_group, r->topk_group, r->sigmoid, r->norm, r->scale, r->bias};
    exo_cuda_launch(moe_pick_kernel, dim3((unsigned)T), dim3(32), 0, cu(be)->stream, logits, a, idx, w);
    return exo_cuda_launched("moe_pick");
}

/* Entry (p * n + e) * 3 holds expert e's part p: its w, scales, biases. */
static void *cuda_moe_pick_table(exo_backend *be, const exo_linear *experts, int n, exo_err *err)
{
    for (int p = 0; p < 3; p++)
        for (int e = 0; e < n; e++) {
            const exo_linear &a = experts[p], &b = experts[3 * e + p];
            if (b.format != a.format || b.dtype != a.dtype || b.rows != a.rows || b.cols != a.cols ||
                b.bits != a.bits || b.group_size != a.group_size || !exo_cuda_gemv_takes(&b, NULL, (int)b.cols, 1)) {
                exo_err_set(err, EXO_EUNSUPPORTED, "experts the GEMV cannot take from a choice on the device");
                return NULL;
            }
        }
    size_t bytes = sizeof(void *) * 9 * (size_t)n;
    const void **host = (const void **)malloc(bytes);
    void *table = host ? cuda_alloc(be, bytes) : NULL;
    if (!table) {
        free(host);
        exo_err_set(err, EXO_ENOMEM, "cannot hold the experts' table");
        return NULL;
    }
    for (int p = 0; p < 3; p++)
        for (int e = 0; e < n; e++) {
            const exo_linear &b = experts[3 * e + p];
            const void **t = host + ((size_t)p * n + e) * 3;
            t[0] = b.w;
            t[1] = b.scales;
            t[2] = b.biases;
        }
    int rc = cuda_to_device(be, table, host, bytes);
    free(host);
    if (rc) {
        cuda_release(be, table);
        exo_err_set(err, rc, "cannot upload the experts' table");
        return NULL;
    }
    return table;
}

/* One thread a column of a row (blockIdx.y); the rows are added in order,
 * as scatter_add_rows adds them, so both decode paths round alike. */
__global__ void add_weighted_rows_kernel(float *dst, const float *src, const float *w, int T, int n, int n_plain,
                                         int dim)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    const int t = blockIdx.y;
    float *d = dst + (size_t)t * dim;
    const float *s = src + (size_t)t * dim, *wt = w + (size_t)t * n;
    const size_t slot = (size_t)T * dim;
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < dim; j += gridDim.x * blockDim.x) {
        float acc = d[j];
        for (int i = 0; i < n_plain; i++)
            acc += s[(size_t)i * slot + j];
        for (int i = 0; i < n; i++)
            acc += wt[i] * s[(size_t)(n_plain + i) * slot + j];
        d[j] = acc;
    }
}

static int cuda_add_weighted_rows(exo_backend *be, float *dst, const float *src, const float *w, int T, int n,
                                  int n_plain, int dim)
{
    prof_scope prof(cu(be), "add_weighted_rows");
    exo_cuda_launch(add_weighted_rows_kernel, dim3(blocks_for((size_t)dim), (unsigned)T), dim3(256), 0,
                    cu(be)->stream, dst, src, w, T, n, n_plain, dim);
    return exo_cuda_launched("add_weighted_rows");
}

/* Block (x, j * T + t): a piece of slot j's row for token t. */
__global__ void add_picked_bias_kernel(float *y, const float *bias, size_t stride, const int32_t *idx, int T, int k,
                                       int dim)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    const int r = blockIdx.y, j = r / T, t = r % T;
    const float *b = bias + (size_t)idx[t * k + j] * stride;
    float *row = y + (size_t)r * dim;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < dim; c += gridDim.x * blockDim.x)
        row[c] += b[c];
}

static int cuda_add_picked_bias(exo_backend *be, float *y, const float *bias, size_t stride, const int32_t *idx, int T,
                                int k, int dim)
{
    prof_scope prof(cu(be), "add_picked_bias");
    exo_cuda_launch(add_picked_bias_kernel, dim3(blocks_for((size_t)dim), (unsigned)(T * k)), dim3(256), 0,
                    cu(be)->stream, y, bias, stride, idx, T, k, dim);
    return exo_cuda_launched("add_picked_bias");
}

__global__ void gather_rows_kernel(float *dst, const float *src, const int32_t *rows, int n, int dim)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    GRID_LOOP(i, (size_t)n * dim) dst[i] = src[(size_t)rows[i / dim] * dim + i % dim];
}

/* One thread a column, adding the rows in order: rows may repeat (decode
 * sums all k experts into row 0), and the order fixes the rounding. */
__global__ void scatter_add_rows_kernel(float *dst, const float *src, const int32_t *rows, const float *scale,
                                        int n, int dim)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < dim; j += gridDim.x * blockDim.x)
        for (int i = 0; i < n; i++)
            dst[(size_t)rows[i] * dim + j] += scale[i] * src[(size_t)i * dim + j];
}

static int cuda_gather_rows(exo_backend *be, float *dst, const float *src, const int32_t *rows, int n, int dim)
{
    prof_scope prof(cu(be), "gather_rows");
    cuda_backend *c = cu(be);
    const int32_t *d = (const int32_t *)bring_up(c, rows, sizeof(int32_t) * (size_t)n);
    if (!d)
        return EXO_ENOMEM;
    exo_cuda_launch(gather_rows_kernel, dim3(blocks_for((size_t)n * dim)), dim3(256), 0, c->stream, dst, src, d, n, dim);
    return exo_cuda_launched("gather_rows");
}

static int cuda_scatter_add_rows(exo_backend *be, float *dst, const float *src, const int32_t *rows,
                                 const float *scale, int n, int dim)
{
    prof_scope prof(cu(be), "scatter_add_rows");
    cuda_backend *c = cu(be);
    size_t rb = ((sizeof(int32_t) * (size_t)n) + 255) / 256 * 256;
    /* one buffer for both, so the second bring-up cannot move the first */
    char *d = (char *)scratch(c, SCRATCH_SMALL, rb + sizeof(float) * (size_t)n);
    if (refuse_in_capture(c) || !d ||
        cudaMemcpyAsync(d, stage_upload(c, rows, sizeof(int32_t) * (size_t)n), sizeof(int32_t) * (size_t)n,
                        cudaMemcpyHostToDevice, c->stream) ||
        cudaMemcpyAsync(d + rb, stage_upload(c, scale, sizeof(float) * (size_t)n), sizeof(float) * (size_t)n,
                        cudaMemcpyHostToDevice, c->stream))
        return EXO_ENOMEM;
    exo_cuda_launch(scatter_add_rows_kernel, dim3(blocks_for((size_t)dim)), dim3(256), 0, c->stream, dst, src, (const int32_t *)d,
                                                                             (const float *)(d + rb), n, dim);
    return exo_cuda_launched("scatter_add_rows");
}

/* ---- attention and linear attention ------------------------------------------ */

static int cuda_attention(exo_backend *be, const exo_attn_shape *shape, float *out, const float *q, const float *k,
                          const float *v, const exo_kv_view *cache, int T, int pos0)
{
    if (shape->cache != EXO_DTYPE_F32 && shape->cache != EXO_DTYPE_BF16)
        return EXO_EUNSUPPORTED;
    prof_scope prof(cu(be), "attention");
    cuda_backend *c = cu(be);
    const int *pos_dev = step_pos(c, T, pos0);
    size_t bytes = exo_cuda_attention_scratch(shape, T, pos0, pos_dev || T == 1 ? cache->capacity : 0);
    float *partial = bytes ? (float *)scratch(c, SCRATCH_ATTENTION, bytes) : NULL;
    if (bytes && !partial)
        return EXO_ENOMEM;
    return exo_cuda_attention(c->stream, shape, out, q, k, v, cache, T, pos0, pos_dev, partial, c->arrivals);
}

static bool cuda_attention_rotates(exo_backend *be, const exo_attn_shape *shape, int T)
{
    (void)be;
    return exo_cuda_attention_rotates(shape, T);
}

static int cuda_attention_rows(exo_backend *be, const exo_attn_shape *shape, int n, float *out, const float *q,
                               const float *k, const float *v, const exo_kv_view *caches, const int *rings,
                               const int *pos)
{
    if (shape->cache != EXO_DTYPE_F32 && shape->cache != EXO_DTYPE_BF16)
        return EXO_EUNSUPPORTED;
    prof_scope prof(cu(be), "attention_rows");
    cuda_backend *c = cu(be);
    size_t bytes = exo_cuda_attention_rows_scratch(shape, n, caches, pos);
    float *partial = bytes ? (float *)scratch(c, SCRATCH_ATTENTION, bytes) : NULL;
    if (bytes && !partial)
        return EXO_ENOMEM;
    return exo_cuda_attention_rows(c->stream, shape, n, out, q, k, v, caches, rings, pos, partial, c->arrivals);
}

static int cuda_conv1d_silu(exo_backend *be, float *out, int out_stride, const float *x, int x_stride,
                            const float *w, float *state, int T, int C, int K)
{
    prof_scope prof(cu(be), "conv1d_silu");
    return exo_cuda_conv1d_silu(cu(be)->stream, out, out_stride, x, x_stride, w, state, T, C, K);
}

static int cuda_gated_delta(exo_backend *be, float *out, const float *q, const float *k, int qk_stride,
                            const float *v, int v_stride, const float *a, const float *b, int ab_stride,
                            const float *A_log, const float *dt_bias, float *S, int T, int Hk, int Hv, int Dk,
                            int Dv)
{
    prof_scope prof(cu(be), "gated_delta");
    return exo_cuda_gated_delta(cu(be)->stream, out, q, k, qk_stride, v, v_stride, a, b, ab_stride, A_log, dt_bias,
                                S, T, Hk, Hv, Dk, Dv);
}

static int cuda_rmsnorm_gated(exo_backend *be, float *x, const float *z, int z_stride, const float *w, int T,
                              int n_heads, int dim, float eps)
{
    prof_scope prof(cu(be), "rmsnorm_gated");
    return exo_cuda_rmsnorm_gated(cu(be)->stream, x, z, z_stride, w, T, n_heads, dim, eps);
}

/* ---- the plugin ------------------------------------------------------------------ */

static const exo_backend_ops cuda_ops = {
    .name = "cuda",
    .free = cuda_free_backend,
    .bf16_cache = true,
    .exact_rows = 0, /* cuBLAS picks its kernels by shape: a row's bits follow the row count */
    .alloc = cuda_alloc,
    .release = cuda_release,
    .to_device = cuda_to_device,
    .to_host = cuda_to_host,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .load_linear = cuda_load_linear,
    .load_vector = cuda_load_vector,
    .embed = cuda_embed,
    .rmsnorm = cuda_rmsnorm,
    .matmul = cuda_matmul,
    .matmul_rows = NULL, /* its products of more than 16 rows are cuBLAS's, picked by shape (exact_rows 0) */
    .matmul_each = cuda_matmul_each,
    .add_bias = cuda_add_bias,
    .rope = cuda_rope,
    .attention = cuda_attention,
    .attention_rows = cuda_attention_rows,
    .attention_rotates = cuda_attention_rotates,
    .kv_copy = cuda_kv_copy,
    .glu = cuda_glu,
    .sigmoid_mul = cuda_sigmoid_mul,
    .scale = cuda_scale,
    .add = cuda_add,
    .zero = cuda_zero,
    .moe_route = cuda_moe_route,
    .gather_rows = cuda_gather_rows,
    .scatter_add_rows = cuda_scatter_add_rows,
    .conv1d_silu = cuda_conv1d_silu,
    .gated_delta = cuda_gated_delta,
    .rmsnorm_gated = cuda_rmsnorm_gated,
    .copy2d = cuda_copy2d,
    .head_matmul = cuda_head_matmul,
    .sync = cuda_sync,
    .step_begin = cuda_step_begin,
    .step_end = cuda_step_end,
    .group_new_id = cuda_group_new_id,
    .group_join = cuda_group_join,
    .group_allreduce = cuda_group_allreduce,
    .group_leave = cuda_group_leave,
    .matmul_fused = cuda_matmul_fused,
    .matmul_glu = cuda_matmul_glu,
    .prefetch = cuda_prefetch,
    .pick = cuda_pick,
    .moe_pick_table = cuda_moe_pick_table,
    .moe_pick = cuda_moe_pick,
    .add_weighted_rows = cuda_add_weighted_rows,
    .add_picked_bias = cuda_add_picked_bias,
    .qk_norm_rope = cuda_qk_norm_rope,
    .qk_norm_rope_rows = cuda_qk_norm_rope_rows,
};

static int device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

static int memory(int device, size_t *free_bytes, size_t *total_bytes, exo_err *err)
{
    if (device < 0 || device >= device_count())
        return exo_err_set(err, EXO_EINVAL, "no CUDA device %d", device);
    if (cudaSetDevice(device) != cudaSuccess || cudaMemGetInfo(free_bytes, total_bytes) != cudaSuccess) {
        cudaGetLastError();
        return exo_err_set(err, EXO_EUNSUPPORTED, "CUDA device %d does not answer", device);
    }
    return 0;
}

static exo_backend *create(int device, exo_err *err)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        exo_err_set(err, EXO_EUNSUPPORTED, "no CUDA device: %s",
                    e != cudaSuccess ? cudaGetErrorString(e) : "the driver sees none");
        cudaGetLastError();
        return NULL;
    }
    if (device < 0 || device >= n) {
        exo_err_set(err, EXO_EINVAL, "no CUDA device %d (there are %d)", device, n);
        return NULL;
    }
    decide_overlap(n);
    cuda_backend *c = (cuda_backend *)calloc(1, sizeof *c);
    c->base.ops = &cuda_ops;
    c->device = device;
    if (cudaSetDevice(device) != cudaSuccess || cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) ||
        cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS || cublasSetStream(c->blas, c->stream)) {
        exo_err_set(err, EXO_EUNSUPPORTED, "CUDA device %d: cannot start a stream and cuBLAS", device);
        free(c);
        return NULL;
    }
    cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH);
    if (cudaMalloc((void **)&c->arrivals, sizeof(int) * EXO_CUDA_ATT_ARRIVALS) != cudaSuccess ||
        cudaMemset(c->arrivals, 0, sizeof(int) * EXO_CUDA_ATT_ARRIVALS) != cudaSuccess) {
        exo_err_set(err, EXO_ENOMEM, "CUDA device %d: no memory for attention's counters", device);
        cudaGetLastError();
        cudaFree(c->arrivals);
        cublasDestroy(c->blas);
        cudaStreamDestroy(c->stream);
        free(c);
        return NULL;
    }
    const char *prof = getenv("EXO_CUDA_PROFILE");
    if (prof && *prof && strcmp(prof, "0")) {
        c->prof = (struct profile *)calloc(1, sizeof *c->prof);
        for (int i = 0; i < PROF_EVENTS; i++)
            cudaEventCreate(&c->prof->ev[i]);
    }
    const char *graphs = getenv("EXO_CUDA_GRAPH");
    c->graphs_off = c->prof || (graphs && !strcmp(graphs, "0"));
    if (cudaMallocHost((void **)&c->step_host, sizeof *c->step_host) != cudaSuccess ||
        cudaMalloc((void **)&c->step_dev, sizeof *c->step_dev) != cudaSuccess ||
        !(c->picker = exo_cuda_picker_new()) ||
        cudaEventCreateWithFlags(&c->step_read, cudaEventDisableTiming) != cudaSuccess ||
        cudaMallocHost((void **)&c->up_host, 2 * UPLOAD_HALF) != cudaSuccess ||
        cudaEventCreateWithFlags(&c->up_done[0], cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&c->up_done[1], cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        c->graphs_off = true;
    }
    /* prefetch: weights of 8 MB to half of L2 (cuda_prefetch) */
    const char *pf = getenv("EXO_CUDA_PREFETCH_MB"), *pf_min = getenv("EXO_CUDA_PREFETCH_MIN_MB");
    int l2 = 0;
    cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device);
    c->prefetch_max = pf && *pf ? (size_t)(atof(pf) * 1e6) : (size_t)l2 / 2;
    c->prefetch_min = pf_min && *pf_min ? (size_t)(atof(pf_min) * 1e6) : (size_t)8e6;
    if (c->prefetch_max &&
        (cudaStreamCreateWithFlags(&c->side, cudaStreamNonBlocking) != cudaSuccess ||
         cudaEventCreateWithFlags(&c->side_fork, cudaEventDisableTiming) != cudaSuccess ||
         cudaEventCreateWithFlags(&c->side_join, cudaEventDisableTiming) != cudaSuccess)) {
        cudaGetLastError();
        c->prefetch_max = 0;
        c->side = NULL;
    }
    const char *path = getenv("EXO_MATMUL_PATH");
    c->force_gemv = path && !strcmp(path, "gemv");
    c->force_gemm = path && !strcmp(path, "gemm");
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, device) == cudaSuccess)
        EXO_LOG_INFO("cuda: GPU %d: %s, %d SMs, %.1f GiB", device, p.name, p.multiProcessorCount,
                     (double)p.totalGlobalMem / (1 << 30));
    return &c->base;
}

static double copy_bandwidth(int device)
{
    const size_t bytes = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    cudaEvent_t t0, t1;
    double best = 0;
    if (device < 0 || device >= device_count() || cudaSetDevice(device) || cudaMalloc(&a, bytes) ||
        cudaMalloc(&b, bytes)) {
        cudaGetLastError();
        cudaFree(a);
        return 0;
    }
    cudaEventCreate(&t0);
    cudaEventCreate(&t1);
    for (int i = 0; i < 6; i++) {
        float ms = 0;
        cudaEventRecord(t0);
        cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
        cudaEventRecord(t1);
        cudaEventSynchronize(t1);
        cudaEventElapsedTime(&ms, t0, t1);
        if (i && ms > 0 && 2.0 * bytes / (ms * 1e-3) > best) /* the first pass warms up */
            best = 2.0 * bytes / (ms * 1e-3);
    }
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    cudaFree(a);
    cudaFree(b);
    return best;
}

static const exo_cuda_plugin plugin = {EXO_CUDA_PLUGIN_ABI, sizeof(exo_backend_ops), device_count, memory, create,
                                       copy_bandwidth};

extern "C" __attribute__((visibility("default"))) const exo_cuda_plugin *exo_cuda_plugin_entry(void) { return &plugin; }
