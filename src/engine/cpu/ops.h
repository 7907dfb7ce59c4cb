/* Element-wise and attention kernels of the CPU backend (everything but the
 * matrix products, which live in matmul.c). Internal to the CPU backend. */
#ifndef EXO_ENGINE_CPU_OPS_H
#define EXO_ENGINE_CPU_OPS_H

#include "core/threadpool.h"
#include "engine/backend.h"

void exo_cpu_rmsnorm(exo_pool *pool, float *out, const float *x, const float *w, int rows, int dim,
                     float eps);
void exo_cpu_rope(exo_pool *pool, float *x, int T, int n_heads, int head_dim, int pos0,
                  const float *inv_freq, float mscale);
/* KV cache layout (see backend.h): K transposed, (n_kv, head_dim, capacity);
 * V (capacity, n_kv, head_dim). kv_append writes T new positions at pos0. */
void exo_cpu_kv_append(exo_pool *pool, const exo_attn_shape *shape, const float *k, const float *v,
                       float *k_cache, float *v_cache, int capacity, int T, int pos0);
/* scratch: per-thread buffers of at least group * capacity floats each
 * (n_threads of them), group = n_heads / n_kv_heads. */
void exo_cpu_attention(exo_pool *pool, const exo_attn_shape *shape, float *out, const float *q,
                       const float *k, const float *v, float *k_cache, float *v_cache, int capacity,
                       int T, int pos0, float *const *scratch);
void exo_cpu_silu_mul(exo_pool *pool, float *g, const float *u, size_t n);
void exo_cpu_add(exo_pool *pool, float *x, const float *y, size_t n);

/* Dot product with f32 accumulation in several independent lanes. */
float exo_cpu_dot_f32(const float *a, const float *b, int n);

#endif
