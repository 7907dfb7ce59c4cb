/* The CPU backend: the exo_backend vtable over host memory.
 *
 * Weights stay where the checkpoint was mmapped (load_linear is a view), so
 * loading a model costs page faults, not copies. Activations and KV cache are
 * 64-byte aligned host buffers. Matrix products go to cpu/matmul.c, the rest
 * to cpu/ops.c; both share one thread pool. */
#include "engine/backend.h"
#include "core/alloc.h"
#include "core/threadpool.h"
#include "engine/cpu/matmul.h"
#include "engine/cpu/ops.h"

#include <string.h>

typedef struct cpu_backend {
    exo_backend base;
    exo_pool *pool;
    exo_cpu_matmul_ctx *mm;
    float **scratch;   /* per-thread attention score rows */
    size_t scratch_len;
} cpu_backend;

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
    exo_free(c);
}

static void *cpu_alloc(exo_backend *be, size_t bytes) { return exo_alloc_aligned(bytes); }
static void cpu_release(exo_backend *be, void *p) { exo_free_aligned(p); }

static void cpu_copy(exo_backend *be, void *dst, const void *src, size_t bytes)
{
    if (dst != src)
        memcpy(dst, src, bytes);
}

static int cpu_load_linear(exo_backend *be, const exo_linear *host, exo_linear *dev, exo_err *err)
{
    *dev = *host;
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

static void cpu_embed(exo_backend *be, const exo_linear *table, const int32_t *tokens, int T,
                      float *out)
{
    for (int t = 0; t < T; t++)
        exo_linear_row_f32(table, tokens[t], out + (size_t)t * (size_t)table->cols);
}

static void cpu_rmsnorm(exo_backend *be, float *out, const float *x, const float *w, int rows,
                        int dim, float eps)
{
    exo_cpu_rmsnorm(cpu(be)->pool, out, x, w, rows, dim, eps);
}

static void cpu_matmul(exo_backend *be, int n, const exo_linear *const *w, const float *x, int T,
                       float *const *y)
{
    exo_cpu_matmul(cpu(be)->mm, n, w, x, T, y);
}

static void cpu_add_bias(exo_backend *be, float *y, const float *b, int T, int dim)
{
    for (int t = 0; t < T; t++)
        for (int j = 0; j < dim; j++)
            y[(size_t)t * (size_t)dim + (size_t)j] += b[j];
}

static void cpu_rope(exo_backend *be, float *x, int T, int n_heads, int head_dim, int pos0,
                     const float *inv_freq, float mscale)
{
    exo_cpu_rope(cpu(be)->pool, x, T, n_heads, head_dim, pos0, inv_freq, mscale);
}

static void cpu_attention(exo_backend *be, const exo_attn_shape *shape, float *out, const float *q,
                          const float *k, const float *v, float *k_cache, float *v_cache, int T,
                          int pos0)
{
    cpu_backend *c = cpu(be);
    size_t need = (size_t)pos0 + (size_t)T;
    if (need > c->scratch_len) {
        int n = exo_pool_size(c->pool);
        size_t len = need < 1024 ? 1024 : need * 2;
        for (int i = 0; i < n; i++) {
            exo_free_aligned(c->scratch[i]);
            c->scratch[i] = exo_alloc_aligned(len * sizeof(float));
        }
        c->scratch_len = len;
    }
    exo_cpu_attention(c->pool, shape, out, q, k, v, k_cache, v_cache, T, pos0, c->scratch);
}

static void cpu_silu_mul(exo_backend *be, float *g, const float *u, size_t n)
{
    exo_cpu_silu_mul(cpu(be)->pool, g, u, n);
}

static void cpu_add(exo_backend *be, float *x, const float *y, size_t n)
{
    exo_cpu_add(cpu(be)->pool, x, y, n);
}

static void cpu_sync(exo_backend *be) {}

static const exo_backend_ops cpu_ops = {
    .name = "cpu",
    .free = cpu_free,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .load_linear = cpu_load_linear,
    .load_vector = cpu_load_vector,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .add_bias = cpu_add_bias,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .silu_mul = cpu_silu_mul,
    .add = cpu_add,
    .sync = cpu_sync,
};

exo_backend *exo_backend_cpu_create(int n_threads, exo_err *err)
{
    cpu_backend *c = exo_calloc(1, sizeof *c);
    c->base.ops = &cpu_ops;
    c->pool = exo_pool_create(n_threads);
    c->mm = exo_cpu_matmul_ctx_create(c->pool);
    c->scratch = exo_calloc((size_t)exo_pool_size(c->pool), sizeof(float *));
    return &c->base;
}
