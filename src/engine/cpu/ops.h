/* Element-wise and attention kernels of the CPU backend (everything but the
 * matrix products, which live in matmul.c). Internal to the CPU backend. */
#ifndef EXO_ENGINE_CPU_OPS_H
#define EXO_ENGINE_CPU_OPS_H

#include "core/threadpool.h"
#include "engine/backend.h"

#include <stdint.h>
#include <string.h>

/* expf written so GCC vectorises loops that call it (glibc's expf is a call
 * per element): exp(x) = 2^n * exp(r), n = round(x / ln 2) by the 1.5*2^23
 * trick, r = x - n ln 2 in two parts (Cody-Waite), exp(r) by its degree-7
 * Taylor polynomial (|r| <= ln2/2, truncation < 6e-8 relative), 2^n built
 * in the exponent bits. Within 2e-7 relative of expf for x in [-87, 88];
 * 0 below, +inf above (tests/unit/test_attention.c). */
static inline float exo_fast_expf(float x)
{
    x = x < -87.3f ? -87.3f : x;
    x = x > 88.7f ? 88.7f : x;
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float n = (x * 1.44269504088896341f + magic) - magic;
    float r = x - n * 0.693145751953125f;  /* ln2, high bits: n * hi is exact */
    r = r - n * 1.428606765330187e-06f;    /* ln2, low bits */
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t e = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &e, sizeof scale);
    return x <= -87.3f ? 0.0f : p * scale;
}

/* Dot product in 16 independent lanes (a serial float sum would be one
 * dependency chain GCC may not reorder): vectorises in any clone. */
static inline float exo_cpu_dot_f32(const float *a, const float *b, int n)
{
    float acc[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++)
            acc[j] += a[i + j] * b[i + j];
    float s = 0;
    for (int j = 0; j < 16; j++)
        s += acc[j];
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* Index of the largest value (the lowest index on ties; NaN never wins;
 * 0 when nothing is larger than -inf). */
int exo_cpu_argmax_f32(const float *x, int n);
/* Largest value (-inf for n == 0 or all NaN). */
float exo_cpu_max_f32(const float *x, int n);
/* sum exp(x[i] - shift), each term within 2e-7 of libm (exo_fast_expf);
 * the terms also go to out[i] unless out is NULL (out may be x). */
double exo_cpu_exp_sum_f32(const float *x, int n, float shift, float *out);

void exo_cpu_rmsnorm(exo_pool *pool, float *out, const float *x, const float *w, int rows, int dim,
                     float eps);
void exo_cpu_rope(exo_pool *pool, float *x, int T, int n_heads, int head_dim, int rot_dim, int pos0,
                  const float *inv_freq, float mscale);
/* KV cache layout (see backend.h and ops.c): a run of `page` slots holds,
 * per KV head, K in blocks of EXO_KV_BLOCK positions, each head_dim rows of
 * EXO_KV_BLOCK keys ((n_kv, page/16, head_dim, 16); a bf16 cache's in dim
 * pairs, (n_kv, page/16, head_dim/2, 16, 2)), and V as rows ((n_kv, page,
 * head_dim)). kv_append writes T new positions at pos0. */
void exo_cpu_kv_append(exo_pool *pool, const exo_attn_shape *shape, const float *k, const float *v,
                       const exo_kv_view *cache, int T, int pos0);
/* Attends q (T tokens at pos0, already appended) over positions
 * [0, pos0+t] for each token t, as exo_cpu_attention does a token at a
 * time (the same bits), in tiles of tokens that share the cache's reads:
 * for prompts. scratch: per-thread buffers of exo_cpu_prefill_scratch()
 * floats each, for a cache of `capacity` slots. */
void exo_cpu_attention_prefill(exo_pool *pool, const exo_attn_shape *shape, float *out, const float *q,
                               const exo_kv_view *cache, int T, int pos0, float *const *scratch);
size_t exo_cpu_prefill_scratch(const exo_attn_shape *shape, int capacity);
/* Appends k, v (T tokens at pos0) and attends q over positions [0, pos0+t]
 * for each token t. scratch: per-thread buffers of at least
 * min(group, 4) * capacity floats each (n_threads of them),
 * group = n_heads / n_kv_heads. */
void exo_cpu_attention(exo_pool *pool, const exo_attn_shape *shape, float *out, const float *q,
                       const float *k, const float *v, const exo_kv_view *cache, int T, int pos0,
                       float *const *scratch);
void exo_cpu_glu(exo_pool *pool, exo_glu_kind kind, float *g, const float *u, size_t n, float limit);
void exo_cpu_add(exo_pool *pool, float *x, const float *y, size_t n);

#endif
