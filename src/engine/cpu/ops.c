/* CPU element-wise kernels and attention (see ops.h).
 *
 * These are a small share of decode time next to the weight-streaming matrix
 * products, so they are plain C written so GCC vectorises them (independent
 * accumulators instead of one serial sum) and split across the thread pool
 * by rows or by (token, head). Numerics follow Hugging Face: RMSNorm and
 * softmax in f32, cos/sin from f32 angles. */
#include "engine/cpu/ops.h"

#include <math.h>
#include <string.h>

/* The loops below are plain C; this clones each hot function for AVX-512
 * and lets the loader pick the clone the CPU supports (GCC's ifunc
 * dispatch), so the same source runs 16 lanes wide where it can. */
#define EXO_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

static inline float dot_f32(const float *a, const float *b, int n)
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

EXO_SIMD_CLONES
float exo_cpu_dot_f32(const float *a, const float *b, int n) { return dot_f32(a, b, n); }

typedef struct rmsnorm_job {
    float *out;
    const float *x, *w;
    int rows, dim;
    float eps;
} rmsnorm_job;

EXO_SIMD_CLONES
static void rmsnorm_worker(void *p, int ith, int nth)
{
    rmsnorm_job *j = p;
    long r0, r1;
    exo_split_range(j->rows, 1, ith, nth, &r0, &r1);
    /* locals, not j->: a store through o could alias *j as far as the
     * compiler knows (-fno-strict-aliasing), which blocks vectorisation */
    const int dim = j->dim;
    const float *w = j->w;
    for (long r = r0; r < r1; r++) {
        const float *x = j->x + r * dim;
        float *o = j->out + r * dim;
        float ss = dot_f32(x, x, dim);
        float inv = 1.0f / sqrtf(ss / (float)dim + j->eps);
        for (int i = 0; i < dim; i++)
            o[i] = w[i] * (x[i] * inv);
    }
}

void exo_cpu_rmsnorm(exo_pool *pool, float *out, const float *x, const float *w, int rows, int dim,
                     float eps)
{
    rmsnorm_job j = {out, x, w, rows, dim, eps};
    if ((long)rows * dim < 16384)
        rmsnorm_worker(&j, 0, 1);
    else
        exo_pool_run(pool, rmsnorm_worker, &j);
}

void exo_cpu_rope(exo_pool *pool, float *x, int T, int n_heads, int head_dim, int pos0,
                  const float *inv_freq, float mscale)
{
    (void)pool;
    int half = head_dim / 2;
    float cs[512], sn[512]; /* head_dim <= 1024 is checked at model load */
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            float ang = (float)(pos0 + t) * inv_freq[i];
            cs[i] = (float)cos((double)ang) * mscale;
            sn[i] = (float)sin((double)ang) * mscale;
        }
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((long)t * n_heads + h) * head_dim;
            for (int i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * cs[i] - b * sn[i];
                v[i + half] = b * cs[i] + a * sn[i];
            }
        }
    }
}

/* Decode attention, per (token, KV head): the query heads that share the KV
 * head are processed together so each key and value is loaded once for all
 * of them. K is cached transposed, Kt[kv][d][pos], so the scores of 16
 * consecutive keys are 16 lanes of one vector and accumulate with plain
 * FMAs over d, with no horizontal sums (the cache is padded to a multiple of
 * 16 positions, so the last block may read past qpos but never past the
 * cache; those lanes are ignored). */
typedef struct attn_job {
    const exo_attn_shape *shape;
    float *out;
    const float *q;
    const float *k_cache, *v_cache;
    int capacity, T, pos0;
    float *const *scratch;
} attn_job;

#define ATT_PREFETCH_BLOCKS 4 /* 16-key blocks of K */
#define ATT_PREFETCH_ROWS 8    /* positions of V */

EXO_SIMD_CLONES
static void attn_worker(void *p, int ith, int nth)
{
    attn_job *j = p;
    const exo_attn_shape *s = j->shape;
    int hd = s->head_dim, group = s->n_heads / s->n_kv_heads, cap = j->capacity;
    long kv_stride = (long)s->n_kv_heads * hd;
    long n_items = (long)j->T * s->n_kv_heads, i0, i1;
    exo_split_range(n_items, 1, ith, nth, &i0, &i1);
    float *scores = j->scratch[ith]; /* (group, cap) */
    for (long it = i0; it < i1; it++) {
        int t = (int)(it / s->n_kv_heads), kvh = (int)(it % s->n_kv_heads);
        int qpos = j->pos0 + t;
        int lo = 0;
        if (s->sliding_window > 0 && qpos - s->sliding_window + 1 > 0)
            lo = qpos - s->sliding_window + 1;
        const float *kt = j->k_cache + (long)kvh * hd * cap;
        const float *q = j->q + ((long)t * s->n_heads + (long)kvh * group) * hd;
        /* K of one block is head_dim lines a cache row apart, and after a
         * token's worth of weights went through the caches all of them
         * miss: request the first blocks now and each later block a few
         * blocks ahead, so the misses overlap */
        for (int b = lo / 16 * 16, k = 0; b <= qpos && k < ATT_PREFETCH_BLOCKS; b += 16, k++)
            for (int d = 0; d < hd; d++)
                __builtin_prefetch(kt + (long)d * cap + b);
        for (int b = lo / 16 * 16; b <= qpos; b += 16) {
            if (b + 16 * ATT_PREFETCH_BLOCKS <= qpos)
                for (int d = 0; d < hd; d++)
                    __builtin_prefetch(kt + (long)d * cap + b + 16 * ATT_PREFETCH_BLOCKS);
            /* one head at a time keeps its 16 scores in a register; the
             * 16-key block of K (head_dim lines) stays in L1 across heads */
            for (int g = 0; g < group; g++) {
                const float *qg = q + (long)g * hd;
                float acc[16] = {0};
                for (int d = 0; d < hd; d++) {
                    const float *kr = kt + (long)d * cap + b;
                    float qv = qg[d];
                    for (int x = 0; x < 16; x++)
                        acc[x] += qv * kr[x];
                }
                float *sc = scores + (long)g * cap + b;
                for (int x = 0; x < 16; x++)
                    sc[x] = acc[x] * s->scale;
            }
        }
        for (int g = 0; g < group; g++) {
            float *sc = scores + (long)g * cap;
            float mx = -INFINITY;
            for (int sp = lo; sp <= qpos; sp++)
                mx = sc[sp] > mx ? sc[sp] : mx;
            for (int sp = lo; sp <= qpos; sp++)
                sc[sp] = exo_fast_expf(sc[sp] - mx);
            float sum = 0;
            for (int sp = lo; sp <= qpos; sp++)
                sum += sc[sp];
            float inv = 1.0f / sum;
            /* restrict: out and the cache never overlap, and saying so is
             * what lets the compiler vectorise this loop */
            float *restrict o = j->out + ((long)t * s->n_heads + (long)kvh * group + g) * hd;
            for (int d = 0; d < hd; d++)
                o[d] = 0.0f;
            for (int sp = lo; sp <= qpos; sp++) {
                float pw = sc[sp] * inv;
                const float *restrict vv = j->v_cache + sp * kv_stride + (long)kvh * hd;
                if (g == 0 && sp + ATT_PREFETCH_ROWS <= qpos) /* V rows, likewise */
                    for (int d = 0; d < hd; d += 16)
                        __builtin_prefetch(vv + ATT_PREFETCH_ROWS * kv_stride + d);
                for (int d = 0; d < hd; d++)
                    o[d] += pw * vv[d];
            }
        }
    }
}

typedef struct append_job {
    const exo_attn_shape *shape;
    const float *k, *v;
    float *k_cache, *v_cache;
    int capacity, T, pos0;
} append_job;

/* Split by kv head. K is transposed, so a new position writes head_dim
 * floats a whole cache row apart: each is a cache line that the weights
 * streamed since the last token have evicted. Asking for all of this
 * thread's lines before writing any overlaps those misses instead of
 * queueing the stores behind them (decode shape, 8 kv heads x 64: 22 us
 * without the prefetches, 20 per head, 15 all at once). */
static void append_worker(void *p, int ith, int nth)
{
    append_job *j = p;
    int hd = j->shape->head_dim, KV = j->shape->n_kv_heads, cap = j->capacity;
    size_t row = (size_t)KV * (size_t)hd;
    long h0, h1;
    exo_split_range(KV, 1, ith, nth, &h0, &h1);
    for (long h = h0; h < h1; h++)
        for (int d = 0; d < hd; d++)
            __builtin_prefetch(j->k_cache + ((size_t)h * hd + d) * cap + j->pos0, 1);
    for (long h = h0; h < h1; h++) {
        float *kc = j->k_cache + (size_t)h * hd * cap + j->pos0;
        for (int t = 0; t < j->T; t++) {
            const float *kt = j->k + (size_t)t * row + (size_t)h * hd;
            for (int d = 0; d < hd; d++)
                kc[(size_t)d * cap + t] = kt[d];
            memcpy(j->v_cache + (size_t)(j->pos0 + t) * row + (size_t)h * hd,
                   j->v + (size_t)t * row + (size_t)h * hd, sizeof(float) * (size_t)hd);
        }
    }
}

void exo_cpu_kv_append(exo_pool *pool, const exo_attn_shape *shape, const float *k, const float *v,
                       float *k_cache, float *v_cache, int capacity, int T, int pos0)
{
    append_job j = {shape, k, v, k_cache, v_cache, capacity, T, pos0};
    exo_pool_run(pool, append_worker, &j);
}

void exo_cpu_attention(exo_pool *pool, const exo_attn_shape *shape, float *out, const float *q,
                       const float *k, const float *v, float *k_cache, float *v_cache, int capacity,
                       int T, int pos0, float *const *scratch)
{
    exo_cpu_kv_append(pool, shape, k, v, k_cache, v_cache, capacity, T, pos0);
    attn_job j = {shape, out, q, k_cache, v_cache, capacity, T, pos0, scratch};
    exo_pool_run(pool, attn_worker, &j);
}

typedef struct ew_job {
    float *a;
    const float *b;
    size_t n;
    int op;
} ew_job;

EXO_SIMD_CLONES
static void ew_worker(void *p, int ith, int nth)
{
    ew_job *j = p;
    long b0, b1;
    exo_split_range((long)j->n, 64, ith, nth, &b0, &b1);
    /* bounds in registers: with -fno-strict-aliasing a float store could
     * alias b0/b1 (their address was taken), which stops vectorisation */
    const long lo = b0, hi = b1;
    float *restrict a = j->a;
    const float *restrict b = j->b;
    if (j->op == 0) {
        for (long i = lo; i < hi; i++)
            a[i] = a[i] / (1.0f + exo_fast_expf(-a[i])) * b[i];
    } else {
        for (long i = lo; i < hi; i++)
            a[i] += b[i];
    }
}

static void run_ew(exo_pool *pool, float *a, const float *b, size_t n, int op)
{
    ew_job j = {a, b, n, op};
    if (n < 32768)
        ew_worker(&j, 0, 1);
    else
        exo_pool_run(pool, ew_worker, &j);
}

void exo_cpu_silu_mul(exo_pool *pool, float *g, const float *u, size_t n) { run_ew(pool, g, u, n, 0); }
void exo_cpu_add(exo_pool *pool, float *x, const float *y, size_t n) { run_ew(pool, x, y, n, 1); }
