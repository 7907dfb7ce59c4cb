/* The CPU backend: the exo_backend vtable over host memory.
 *
 * Weights from a checkpoint are copied out of the file mapping into one
 * arena of 2 MiB-aligned chunks backed by transparent huge pages, packed in
 * load order: 4 KiB page-cache pages cost a nested page walk per page on a
 * VM and stop the hardware prefetchers at every page, and streaming reads
 * of page-cache memory ran ~15% below huge-page memory here. Weights built
 * in memory (synthetic models) are used in place. Affine 4- and 8-bit and
 * MXFP4 weights are repacked into that arena as panels (linear.h) where
 * the matmul context runs them fastest so (exo_cpu_matmul_wants_panels),
 * from a file, or from memory while there is room for the second copy.
 * Activations and KV cache are
 * 64-byte aligned host buffers. Matrix products go to cpu/matmul.c, the rest
 * to cpu/ops.c; both share one thread pool. */
#include "engine/backend.h"
#include "core/alloc.h"
#include "core/arena.h"
#include "core/meminfo.h"
#include "core/threadpool.h"
#include "engine/cpu/linear_attn.h"
#include "engine/cpu/matmul.h"
#include "engine/cpu/ops.h"
#include "engine/quant.h"
#include "engine/router.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct cpu_backend {
    exo_backend base;
    exo_pool *pool;
    exo_cpu_matmul_ctx *mm;
    exo_arena *weights; /* copies of weights loaded from files, and repacked ones */
    float **scratch;   /* per-thread attention scores (and a prompt tile's queries and outputs) */
    size_t scratch_len;
} cpu_backend;

/* Prompts of at least this many tokens attend in tiles of tokens. */
#define TILED_ATTENTION_MIN_T 8

static cpu_backend *cpu(exo_backend *be) { return (cpu_backend *)be; }

static void cpu_free(exo_backend *be)
{
    cpu_backend *c = cpu(be);
    int n = exo_pool_size(c->pool);
    for (int i = 0; i < n; i++)
        exo_free_aligned(c->scratch ? c->scratch[i] : NULL);
    exo_free(c->scratch);
    exo_cpu_matmul_ctx_free(c->mm);
    exo_pool_free(c->pool);
    exo_arena_free(c->weights);
    exo_free(c);
}

static void *cpu_alloc(exo_backend *be, size_t bytes) { return exo_alloc_aligned(bytes); }
static void cpu_release(exo_backend *be, void *p) { exo_free_aligned(p); }

static int cpu_copy(exo_backend *be, void *dst, const void *src, size_t bytes)
{
    if (dst != src)
        memcpy(dst, src, bytes);
    return 0;
}

/* Copies n bytes into the weight arena; NULL when memory runs out. */
static const void *arena_copy(cpu_backend *c, const void *src, size_t n)
{
    void *p = exo_arena_alloc(c->weights, n);
    if (p)
        memcpy(p, src, n);
    return p;
}

/* Whether the machine has room for `bytes` more and still an eighth of its
 * memory free: a weight held in memory that outlives the model (a synthetic
 * model's) stays there, so repacking it is a second copy, made only while it
 * fits (a 17 GB model would otherwise need 34 on a 24 GB machine); a weight
 * left as it is runs on the row-format kernels. */
static bool room_for(size_t bytes)
{
    uint64_t total, avail;
    return exo_meminfo(&total, &avail, NULL) == 0 && avail > bytes + total / 8;
}

static int cpu_load_linear(exo_backend *be, const exo_linear *host, bool from_file, exo_linear *dev,
                           exo_err *err)
{
    cpu_backend *c = cpu(be);
    *dev = *host;
    if (exo_linear_panels_ok(host) && exo_cpu_matmul_wants_panels(c->mm) &&
        (from_file || room_for(exo_linear_panels_bytes(host)))) {
        void *p = exo_arena_alloc(c->weights, exo_linear_panels_bytes(host));
        if (p) { /* else as below: the weight as it is */
            exo_linear_to_panels(host, p, dev, c->pool);
            return 0;
        }
    }
    if (!from_file)
        return 0;
    size_t wb, sb, bb;
    exo_linear_part_bytes(host, &wb, &sb, &bb);
    const void *w = arena_copy(c, host->w, wb);
    const void *sc = w && sb ? arena_copy(c, host->scales, sb) : NULL;
    const void *bi = sc && bb ? arena_copy(c, host->biases, bb) : NULL;
    /* out of memory: stream from the mapping instead (slower, same
     * numbers); what was copied of this weight stays unused in the arena */
    if (!w || (sb && !sc) || (bb && !bi))
        return 0;
    dev->w = w;
    dev->scales = sc;
    dev->biases = bi;
    (void)err;
    return 0;
}

static float *cpu_load_vector(exo_backend *be, exo_dtype t, const void *host, size_t n, exo_err *err)
{
    float *v = exo_alloc_aligned(n * sizeof(float));
    if (!v) {
        exo_err_set(err, EXO_ENOMEM, "cannot allocate %zu floats", n);
        return NULL;
    }
    exo_convert_to_f32(t, host, v, n);
    return v;
}

static int cpu_embed(exo_backend *be, const exo_linear *table, const int32_t *tokens, int T,
                      float *out)
{
    for (int t = 0; t < T; t++)
        exo_linear_row_f32(table, tokens[t], out + (size_t)t * (size_t)table->cols);
    return 0;
}

static int cpu_rmsnorm(exo_backend *be, float *out, const float *x, const float *w, int rows,
                        int dim, float eps)
{
    exo_cpu_rmsnorm(cpu(be)->pool, out, x, w, rows, dim, eps);
    return 0;
}

/* The weights' output biases (exo_linear.out_bias), after the products,
 * as add_bias adds them. */
static void add_out_biases(int n, const exo_linear *const *w, int T, float *const *y)
{
    for (int i = 0; i < n; i++)
        if (w[i]->out_bias)
            for (int t = 0; t < T; t++)
                for (int64_t j = 0; j < w[i]->rows; j++)
                    y[i][(size_t)t * (size_t)w[i]->rows + (size_t)j] += w[i]->out_bias[j];
}

static int cpu_matmul(exo_backend *be, int n, const exo_linear *const *w, const float *x, int T,
                       float *const *y)
{
    exo_cpu_matmul(cpu(be)->mm, n, w, x, T, y);
    add_out_biases(n, w, T, y);
    return 0;
}

static int cpu_matmul_rows(exo_backend *be, int n, const exo_linear *const *w, const float *x, int T,
                           float *const *y)
{
    exo_cpu_matmul_rows(cpu(be)->mm, n, w, x, T, y);
    add_out_biases(n, w, T, y);
    return 0;
}

static int cpu_matmul_each(exo_backend *be, int n, const exo_linear *const *w, const float *const *xs,
                           int T, float *const *y)
{
    exo_cpu_matmul_each(cpu(be)->mm, n, w, xs, T, y);
    add_out_biases(n, w, T, y);
    return 0;
}

static int cpu_add_bias(exo_backend *be, float *y, const float *b, int T, int dim)
{
    for (int t = 0; t < T; t++)
        for (int j = 0; j < dim; j++)
            y[(size_t)t * (size_t)dim + (size_t)j] += b[j];
    return 0;
}

static int cpu_rope(exo_backend *be, float *x, int T, int n_heads, int head_dim, int rot_dim,
                    int pos0, const float *inv_freq, float mscale)
{
    exo_cpu_rope(cpu(be)->pool, x, T, n_heads, head_dim, rot_dim, pos0, inv_freq, mscale);
    return 0;
}

/* Decode and short prompts attend a token at a time (each thread owns KV
 * heads); longer prompts in tiles of tokens sharing the cache's reads
 * (ops.h). Both give a token the same bits, so where a prompt's chunks
 * fall changes nothing. The threads' score buffers fit the larger. */
static int cpu_attention(exo_backend *be, const exo_attn_shape *shape, float *out, const float *q,
                          const float *k, const float *v, const exo_kv_view *cache, int T, int pos0)
{
    cpu_backend *c = cpu(be);
    if (shape->cache == EXO_DTYPE_BF16 && shape->head_dim % 2) /* a bf16 block pairs dims (ops.c) */
        return EXO_EUNSUPPORTED;
    const bool tiles = T >= TILED_ATTENTION_MIN_T;
    int group = shape->n_heads / shape->n_kv_heads;
    size_t need = tiles ? exo_cpu_prefill_scratch(shape, cache->capacity)
                        : (size_t)cache->capacity * (size_t)(group < 4 ? group : 4);
    if (need > c->scratch_len) {
        int n = exo_pool_size(c->pool);
        for (int i = 0; i < n; i++) {
            exo_free_aligned(c->scratch[i]);
            c->scratch[i] = exo_alloc_aligned(need * sizeof(float));
            if (!c->scratch[i]) { /* about a layer's K cache per thread */
                c->scratch_len = 0;
                return EXO_ENOMEM;
            }
        }
        c->scratch_len = need;
    }
    if (tiles) {
        exo_cpu_kv_append(c->pool, shape, k, v, cache, T, pos0);
        exo_cpu_attention_prefill(c->pool, shape, out, q, cache, T, pos0, c->scratch);
    } else {
        exo_cpu_attention(c->pool, shape, out, q, k, v, cache, T, pos0, c->scratch);
    }
    return 0;
}

/* The layout is per KV head (cpu/ops.h): a head's slots lie at the start of
 * its region whatever the capacity, so each head's first n moves as one
 * run (keys in whole blocks of EXO_KV_BLOCK). */
static int cpu_kv_copy(exo_backend *be, const exo_attn_shape *shape, void *dst_k, void *dst_v, int dst_capacity,
                       const void *src_k, const void *src_v, int src_capacity, int n)
{
    (void)be;
    const size_t hd = (size_t)shape->head_dim, bytes = exo_dtype_size(shape->cache);
    const size_t k_run = (size_t)(n + EXO_KV_BLOCK - 1) / EXO_KV_BLOCK * EXO_KV_BLOCK * hd, v_run = (size_t)n * hd;
    for (int h = 0; h < shape->n_kv_heads; h++) {
        memcpy((char *)dst_k + (size_t)h * dst_capacity * hd * bytes,
               (const char *)src_k + (size_t)h * src_capacity * hd * bytes, bytes * k_run);
        memcpy((char *)dst_v + (size_t)h * dst_capacity * hd * bytes,
               (const char *)src_v + (size_t)h * src_capacity * hd * bytes, bytes * v_run);
    }
    return 0;
}

static int cpu_glu(exo_backend *be, exo_glu_kind kind, float *g, const float *u, size_t n, float limit)
{
    exo_cpu_glu(cpu(be)->pool, kind, g, u, n, limit);
    return 0;
}

static int cpu_sigmoid_mul(exo_backend *be, float *x, const float *gate, int rows, int dim,
                           int gate_dim)
{
    for (int r = 0; r < rows; r++) {
        float *xr = x + (size_t)r * (size_t)dim;
        const float *gr = gate + (size_t)r * (size_t)gate_dim;
        for (int j = 0; j < dim; j++)
            xr[j] *= 1.0f / (1.0f + expf(-gr[gate_dim == 1 ? 0 : j]));
    }
    return 0;
}

static int cpu_scale(exo_backend *be, float *x, float s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
    return 0;
}

static int cpu_copy2d(exo_backend *be, float *dst, size_t dst_ld, const float *src, size_t src_ld,
                      int rows, int cols)
{
    for (int r = 0; r < rows; r++)
        memcpy(dst + (size_t)r * dst_ld, src + (size_t)r * src_ld, sizeof(float) * (size_t)cols);
    return 0;
}

/* Decode (one token): every head's product in one dispatch, each weight
 * reading its head's slice in place (matmul_each). A prompt: one head at a
 * time through the matmul kernels (each multithreaded), its rows gathered
 * into and out of contiguous scratch. */
static int cpu_head_matmul(exo_backend *be, int H, const exo_linear *w, const float *x, size_t x_head,
                           size_t x_tok, float *y, size_t y_head, size_t y_tok, int T)
{
    cpu_backend *c = cpu(be);
    if (T == 1 && H <= 1024) {
        const exo_linear *ws[1024];
        const float *xs[1024];
        float *ys[1024];
        for (int h = 0; h < H; h++) {
            ws[h] = &w[h];
            xs[h] = x + (size_t)h * x_head;
            ys[h] = y + (size_t)h * y_head;
        }
        exo_cpu_matmul_each(c->mm, H, ws, xs, 1, ys);
        return 0;
    }
    size_t in = (size_t)w[0].cols, out = (size_t)w[0].rows;
    float *xs = exo_alloc_aligned(sizeof(float) * (size_t)T * in);
    float *ys = exo_alloc_aligned(sizeof(float) * (size_t)T * out);
    if (!xs || !ys) {
        exo_free_aligned(xs);
        exo_free_aligned(ys);
        return EXO_ENOMEM;
    }
    for (int h = 0; h < H; h++) {
        for (int t = 0; t < T; t++)
            memcpy(xs + (size_t)t * in, x + (size_t)t * x_tok + (size_t)h * x_head, sizeof(float) * in);
        const exo_linear *wh[1] = {&w[h]};
        float *const yo[1] = {ys};
        exo_cpu_matmul(c->mm, 1, wh, xs, T, yo);
        for (int t = 0; t < T; t++)
            memcpy(y + (size_t)t * y_tok + (size_t)h * y_head, ys + (size_t)t * out, sizeof(float) * out);
    }
    exo_free_aligned(xs);
    exo_free_aligned(ys);
    return 0;
}

static int cpu_conv1d_silu(exo_backend *be, float *out, int out_stride, const float *x, int x_stride,
                           const float *w, float *state, int T, int C, int K)
{
    exo_cpu_conv1d_silu(cpu(be)->pool, out, out_stride, x, x_stride, w, state, T, C, K);
    return 0;
}

static int cpu_gated_delta(exo_backend *be, float *out, const float *q, const float *k, int qk_stride,
                           const float *v, int v_stride, const float *a, const float *b, int ab_stride,
                           const float *A_log, const float *dt_bias, float *S, int T, int Hk, int Hv,
                           int Dk, int Dv)
{
    exo_cpu_gated_delta(cpu(be)->pool, out, q, k, qk_stride, v, v_stride, a, b, ab_stride, A_log,
                        dt_bias, S, T, Hk, Hv, Dk, Dv);
    return 0;
}

static int cpu_rmsnorm_gated(exo_backend *be, float *x, const float *z, int z_stride, const float *w,
                             int T, int n_heads, int dim, float eps)
{
    exo_cpu_rmsnorm_gated(cpu(be)->pool, x, z, z_stride, w, T, n_heads, dim, eps);
    return 0;
}

static int cpu_add(exo_backend *be, float *x, const float *y, size_t n)
{
    exo_cpu_add(cpu(be)->pool, x, y, n);
    return 0;
}

static int cpu_sync(exo_backend *be) { return 0; }

/* The k best of n values (k passes of "largest not taken yet": k and n
 * are small), best first, lowest index on ties. */
static int cpu_moe_route(exo_backend *be, const exo_moe_router *r, const float *logits, int T,
                         int32_t *idx, float *w)
{
    return exo_moe_route_rows(r, logits, r->bias, T, idx, w);
}

static int cpu_zero(exo_backend *be, float *x, size_t n)
{
    memset(x, 0, sizeof(float) * n);
    return 0;
}

static int cpu_gather_rows(exo_backend *be, float *dst, const float *src, const int32_t *rows, int n,
                           int dim)
{
    for (int i = 0; i < n; i++)
        memcpy(dst + (size_t)i * (size_t)dim, src + (size_t)rows[i] * (size_t)dim, sizeof(float) * (size_t)dim);
    return 0;
}

static int cpu_scatter_add_rows(exo_backend *be, float *dst, const float *src, const int32_t *rows,
                                const float *scale, int n, int dim)
{
    for (int i = 0; i < n; i++) {
        float *d = dst + (size_t)rows[i] * (size_t)dim;
        const float *s = src + (size_t)i * (size_t)dim;
        float a = scale[i];
        for (int j = 0; j < dim; j++)
            d[j] += a * s[j];
    }
    return 0;
}

static const exo_backend_ops cpu_ops = {
    .name = "cpu",
    .free = cpu_free,
    .bf16_cache = true,
    .exact_rows = EXO_CPU_GEMV_MAX_ROWS + 1, /* the GEMM's rows (oneDNN, model.c checks it) */
    .alloc = cpu_alloc,
    .release = cpu_release,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .load_linear = cpu_load_linear,
    .load_vector = cpu_load_vector,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .matmul_rows = cpu_matmul_rows,
    .matmul_each = cpu_matmul_each,
    .add_bias = cpu_add_bias,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .kv_copy = cpu_kv_copy,
    .glu = cpu_glu,
    .sigmoid_mul = cpu_sigmoid_mul,
    .scale = cpu_scale,
    .copy2d = cpu_copy2d,
    .head_matmul = cpu_head_matmul,
    .conv1d_silu = cpu_conv1d_silu,
    .gated_delta = cpu_gated_delta,
    .rmsnorm_gated = cpu_rmsnorm_gated,
    .add = cpu_add,
    .zero = cpu_zero,
    .moe_route = cpu_moe_route,
    .gather_rows = cpu_gather_rows,
    .scatter_add_rows = cpu_scatter_add_rows,
    .sync = cpu_sync,
};

exo_pool *exo_backend_cpu_pool(exo_backend *cpu) { return ((cpu_backend *)cpu)->pool; }

exo_backend *exo_backend_cpu_create(int n_threads, exo_err *err)
{
    cpu_backend *c = exo_calloc(1, sizeof *c);
    c->base.ops = &cpu_ops;
    c->pool = exo_pool_create(n_threads);
    c->mm = exo_cpu_matmul_ctx_create(c->pool);
    c->scratch = exo_calloc((size_t)exo_pool_size(c->pool), sizeof(float *));
    c->weights = exo_arena_new(0);
    return &c->base;
}
