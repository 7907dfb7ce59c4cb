/* CPU element-wise kernels and attention (see ops.h).
 *
 * These are a small share of decode time next to the weight-streaming matrix
 * products, so they are plain C written so GCC vectorises them (independent
 * accumulators instead of one serial sum) and split across the thread pool
 * by rows or by (token, head). Numerics follow Hugging Face: RMSNorm and
 * softmax in f32, cos/sin from f32 angles. */
#include "engine/cpu/ops.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

/* The loops below are plain C; this clones each hot function for AVX-512
 * and for AVX2 with FMA (x86-64-v3: attention's written-out fused
 * multiply-adds need the FMA unit) and lets the loader pick the clone the
 * CPU supports (GCC's ifunc dispatch), so the same source runs 16 lanes
 * wide where it can. */
#define EXO_SIMD_CLONES __attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))

/* Reductions over a logits row (the sampler's per-token work over the
 * whole vocabulary) and over attention scores: 16 independent lanes so GCC
 * vectorises them. The clones are static behind plain exported functions:
 * clang 14 (the fuzz builds) names a target_clones function's dispatcher
 * `f.ifunc`, so other files could not call `f` itself. */
EXO_SIMD_CLONES
static int argmax_lanes(const float *x, int n)
{
    float m[16];
    int ix[16];
    for (int j = 0; j < 16; j++) {
        m[j] = -INFINITY;
        ix[j] = 0;
    }
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) {
            float v = x[i + j];
            ix[j] = v > m[j] ? i + j : ix[j];
            m[j] = v > m[j] ? v : m[j];
        }
    for (int j = 0; i + j < n; j++)
        if (x[i + j] > m[j]) {
            m[j] = x[i + j];
            ix[j] = i + j;
        }
    int best = 0;
    for (int j = 1; j < 16; j++)
        if (m[j] > m[best] || (m[j] == m[best] && ix[j] < ix[best]))
            best = j;
    return ix[best];
}

EXO_SIMD_CLONES
static float max_lanes(const float *x, int n)
{
    float m[16];
    for (int j = 0; j < 16; j++)
        m[j] = -INFINITY;
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++)
            m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
    for (int j = 0; i + j < n; j++)
        m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
    float r = m[0];
    for (int j = 1; j < 16; j++)
        r = m[j] > r ? m[j] : r;
    return r;
}

EXO_SIMD_CLONES
static double exp_sum_lanes(const float *x, int n, float shift, float *out)
{
    /* f32 lanes over blocks of 1024 values, blocks summed in double: the
     * f32 part adds at most 64 terms a lane */
    double total = 0;
    for (int b = 0; b < n; b += 1024) {
        const int e = n - b < 1024 ? n - b : 1024;
        const float *xb = x + b;
        float acc[16] = {0};
        int i = 0;
        if (out) {
            float *ob = out + b;
            for (; i + 16 <= e; i += 16)
                for (int j = 0; j < 16; j++) {
                    float v = exo_fast_expf(xb[i + j] - shift);
                    ob[i + j] = v;
                    acc[j] += v;
                }
            for (; i < e; i++)
                acc[0] += ob[i] = exo_fast_expf(xb[i] - shift);
        } else {
            for (; i + 16 <= e; i += 16)
                for (int j = 0; j < 16; j++)
                    acc[j] += exo_fast_expf(xb[i + j] - shift);
            for (; i < e; i++)
                acc[0] += exo_fast_expf(xb[i] - shift);
        }
        float sum = 0;
        for (int j = 0; j < 16; j++)
            sum += acc[j];
        total += sum;
    }
    return total;
}

int exo_cpu_argmax_f32(const float *x, int n) { return argmax_lanes(x, n); }
float exo_cpu_max_f32(const float *x, int n) { return max_lanes(x, n); }
double exo_cpu_exp_sum_f32(const float *x, int n, float shift, float *out)
{
    return exp_sum_lanes(x, n, shift, out);
}

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
        float ss = exo_cpu_dot_f32(x, x, dim);
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

void exo_cpu_rope(exo_pool *pool, float *x, int T, int n_heads, int head_dim, int rot_dim, int pos0,
                  const float *inv_freq, float mscale)
{
    (void)pool;
    int half = rot_dim / 2;
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

/* KV cache layout (ops.h): per KV head, K in blocks of EXO_KV_BLOCK (16)
 * positions, each block head_dim rows of 16 keys (Kb[kv][pos/16][d][pos%16]),
 * and V as rows (V[kv][pos][d]). One head's keys and values are then two
 * contiguous regions read front to back, which the hardware prefetchers
 * follow; the weight stream of a decode step evicts the whole cache every
 * token, so that is what decode attention costs. (K transposed over the
 * whole capacity, (kv, d, capacity), read each 16-key block as head_dim
 * lines a cache row apart: attention took ~14% of a llama-3.2-1b q4 token
 * at 576 positions, KV append another 4%.) The scores of a 16-key block are
 * the 16 lanes of one vector: plain FMAs over d, no horizontal sums.
 *
 * A bf16 cache (shape's cache) holds the same regions in half the bytes,
 * a key block's dims in pairs (kblock_index): a value is rounded to
 * nearest even as it is written and widened (a shift or a mask) as it is
 * read, so decode's dominant read halves while scores, softmax and sums
 * stay f32. */

/* 16 floats, 4-byte aligned: GCC lowers it to one AVX-512 register, or two
 * AVX2 ones, per clone. Only used inside functions, never passed by value
 * (that would change the ABI between clones). */
typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef uint16_t u16x16 __attribute__((vector_size(32), aligned(2)));
typedef uint32_t u32x16 __attribute__((vector_size(64), aligned(4)));

/* 16 consecutive cache values from element i of p, as f32 (bf: the
 * cache is bf16; a compile-time constant where it matters). A macro: a
 * function returning a v16 would change the ABI between clones. */
#define KV_LOAD16(p, i, bf)                                                                            \
    ((bf) ? (v16)(__builtin_convertvector(*(const u16x16 *)((const uint16_t *)(p) + (i)), u32x16) << 16) \
          : *(const v16 *)((const float *)(p) + (i)))

/* acc = a * b + acc (a a scalar, b and acc v16) rounded once a lane. This
 * file is built without contraction, so every fused multiply-add is
 * written out, the same in decode's kernel and in a prompt's tiles (their
 * outputs are the same bits); the clones with FMA units vectorise it
 * (the portable clone calls fmaf, the same roundings). A macro for
 * KV_LOAD16's reason. */
#define FMA16(acc, a, b)                                          \
    do {                                                          \
        const float a_ = (a);                                     \
        const v16 b_ = (b);                                       \
        for (int l_ = 0; l_ < 16; l_++)                           \
            (acc)[l_] = __builtin_fmaf(a_, b_[l_], (acc)[l_]);    \
    } while (0)

static inline float kv_get(const void *p, size_t i, bool bf)
{
    return bf ? exo_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static inline void kv_put(void *p, size_t i, float x, bool bf)
{
    if (bf)
        ((uint16_t *)p)[i] = exo_f32_to_bf16(x);
    else
        ((float *)p)[i] = x;
}

/* Both regions are read with a software prefetch this far ahead, into L2
 * (a decode-shaped benchmark, llama-3.2-1b's 16 layers at 576 positions
 * with the caches flushed by a layer's worth of weights between calls:
 * 2.7 ms a token without it, 2.2 with it; 1.8 now, against 1.4 for a plain
 * read of the same bytes with the same prefetch). Past a region's end it
 * fetches the start of the next head's keys or values, which this thread
 * usually reads next. */
#define ATT_PREFETCH(p) __builtin_prefetch((const char *)(p) + 8192, 0, 2)

/* A bf16 block holds dims in pairs, (d, d + 1) of a position side by
 * side (Kb[pos/16][d/2][pos%16][d%2]), so a 64-byte load is two dims of 16
 * keys that a shift and a mask widen in place (no lane-crossing
 * conversion); head_dim is even there (attention refuses odd). */
static inline size_t kblock_index(int pos, int d, int hd, bool bf)
{
    size_t block = (size_t)(pos / EXO_KV_BLOCK) * EXO_KV_BLOCK * (size_t)hd;
    if (bf)
        return block + (size_t)(d / 2) * 2 * EXO_KV_BLOCK + (size_t)(pos % EXO_KV_BLOCK) * 2 + (size_t)(d % 2);
    return block + (size_t)d * EXO_KV_BLOCK + (size_t)(pos % EXO_KV_BLOCK);
}

/* KV head h's keys (value 0) or values (1) in the run holding slot s; *at:
 * s's index in that run. A run is laid out as a cache of `page` slots of
 * values of `bytes` each. */
static inline void *kv_head_run(const exo_kv_view *c, int value, int s, long h, int hd, size_t bytes, int *at)
{
    char *base;
    if (c->pages) {
        base = (char *)c->pages[s / c->page] + (value ? c->v_off : c->k_off) * bytes;
        *at = s % c->page;
    } else {
        base = value ? c->v : c->k;
        *at = s;
    }
    return base + (size_t)h * (size_t)c->page * (size_t)hd * bytes;
}

static inline bool cache_bf16(const exo_attn_shape *sh) { return sh->cache == EXO_DTYPE_BF16; }

/* Writes T new positions at pos0 for KV heads [h0, h1). */
static void kv_append_heads(const exo_attn_shape *sh, const float *k, const float *v, const exo_kv_view *c, int T,
                            int pos0, long h0, long h1)
{
    const int hd = sh->head_dim;
    const size_t row = (size_t)sh->n_kv_heads * (size_t)hd;
    const bool bf = cache_bf16(sh);
    const size_t bytes = bf ? 2 : 4;
    for (long h = h0; h < h1; h++)
        for (int t = 0; t < T; t++) {
            const float *kt = k + (size_t)t * row + (size_t)h * hd;
            const float *vt = v + (size_t)t * row + (size_t)h * hd;
            int slot = sh->ring ? (pos0 + t) % sh->ring : pos0 + t, at;
            void *kc = kv_head_run(c, 0, slot, h, hd, bytes, &at);
            for (int d = 0; d < hd; d++)
                kv_put(kc, kblock_index(at, d, hd, bf), kt[d], bf);
            void *vc = kv_head_run(c, 1, slot, h, hd, bytes, &at);
            for (int d = 0; d < hd; d++)
                kv_put(vc, (size_t)at * hd + d, vt[d], bf);
        }
}

/* Scores of G query heads (q: G rows of hd) against 16-key block kb,
 * scaled, into sc[g * ld]. */
static inline __attribute__((always_inline)) void qk_block(int G, bool bf, const float *q, const void *kh,
                                                           size_t at, int hd, float scale, float *sc, long ld)
{
    v16 acc[4] = {{0}};
    if (bf) { /* dims in pairs (kblock_index) */
        const uint16_t *kb = (const uint16_t *)kh + at;
        for (int d = 0; d < hd; d += 2) {
            ATT_PREFETCH(kb + (size_t)d * EXO_KV_BLOCK);
            u32x16 w = *(const u32x16 *)(kb + (size_t)d * EXO_KV_BLOCK);
            v16 k0 = (v16)(w << 16), k1 = (v16)(w & 0xffff0000u);
#pragma GCC unroll 4
            for (int g = 0; g < G; g++) {
                FMA16(acc[g], q[(size_t)g * hd + d], k0);
                FMA16(acc[g], q[(size_t)g * hd + d + 1], k1);
            }
        }
    } else {
        const float *kb = (const float *)kh + at;
        for (int d = 0; d < hd; d++) {
            ATT_PREFETCH(kb + (size_t)d * EXO_KV_BLOCK);
            v16 kv = *(const v16 *)(kb + (size_t)d * EXO_KV_BLOCK);
#pragma GCC unroll 4
            for (int g = 0; g < G; g++)
                FMA16(acc[g], q[(size_t)g * hd + d], kv);
        }
    }
    for (int g = 0; g < G; g++)
        *(v16 *)(sc + g * ld) = acc[g] * scale;
}

/* out[g][c .. c+16W) = sum_sp p[g][sp] * V[sp][c ..] for G heads, W
 * vectors of 16 values: G*W accumulators stay in registers while V streams
 * once. */
static inline __attribute__((always_inline)) void pv_block(int G, int W, bool bf, const float *p, long ld,
                                                           const exo_kv_view *kv, long h, int hd, int c,
                                                           int n, int s0, int ring, float *out)
{
    /* p: the scores of n consecutive positions, the first in slot s0; the
     * slots go on run by run, and past a ring's last slot from 0. A bf16
     * cache with W even: a 64-byte load is 32 dims, widened in place by a
     * shift (the even dims) and a mask (the odd ones) into acc[w] and
     * acc[w + 1], which the stores put back in order. */
    v16 acc[4][8] = {{{0}}};
    const size_t bytes = bf ? 2 : 4;
    const bool pairs = bf && W % 2 == 0;
    for (int i0 = 0, s = s0; i0 < n;) {
        int at;
        const void *vh = kv_head_run(kv, 1, s, h, hd, bytes, &at);
        int len = n - i0 < kv->page - at ? n - i0 : kv->page - at;
        const float *pp = p + i0;
        for (int i = 0; i < len; i++) {
            const size_t vr = ((size_t)at + (size_t)i) * hd + c;
            if (pairs) {
#pragma GCC unroll 4
                for (int w = 0; w < W; w += 2) {
                    ATT_PREFETCH((const char *)vh + (vr + 16 * w) * 2);
                    u32x16 x = *(const u32x16 *)((const uint16_t *)vh + vr + 16 * w);
                    v16 even = (v16)(x << 16), odd = (v16)(x & 0xffff0000u);
#pragma GCC unroll 4
                    for (int g = 0; g < G; g++) {
                        FMA16(acc[g][w], pp[g * ld + i], even);
                        FMA16(acc[g][w + 1], pp[g * ld + i], odd);
                    }
                }
                continue;
            }
#pragma GCC unroll 8
            for (int w = 0; w < W; w++) {
                ATT_PREFETCH((const char *)vh + (vr + 16 * w) * bytes);
                v16 vv = KV_LOAD16(vh, vr + 16 * w, bf);
#pragma GCC unroll 4
                for (int g = 0; g < G; g++)
                    FMA16(acc[g][w], pp[g * ld + i], vv);
            }
        }
        i0 += len;
        s += len;
        if (s == ring)
            s = 0;
    }
    for (int g = 0; g < G; g++) {
        float *o = out + (size_t)g * hd + c;
        if (pairs)
            for (int w = 0; w < W; w += 2)
                for (int l = 0; l < 16; l++) {
                    o[16 * w + 2 * l] = acc[g][w][l];
                    o[16 * w + 2 * l + 1] = acc[g][w + 1][l];
                }
        else
            for (int w = 0; w < W; w++)
                *(v16 *)(o + 16 * w) = acc[g][w];
    }
}

/* G query heads (1 to 4, a compile-time constant) of KV head h.
 * sc: G rows of ld scores; o: G rows of hd outputs. */
static inline __attribute__((always_inline)) void attend_heads(int G, bool bf, const float *q, const exo_kv_view *kv,
                                                               long h, int hd, float scale, int lo,
                                                               int qpos, int ring, float *sc, long ld,
                                                               const float *sinks, float *o)
{
    /* scores are kept from the first block's start on (sc[0] is position
     * base); a ring cache (ring > 0) keeps position p in slot p % ring */
    const int base = lo / EXO_KV_BLOCK * EXO_KV_BLOCK, off = lo - base, n = qpos + 1 - lo;
    const size_t bytes = bf ? 2 : 4;
    for (int b = base; b <= qpos; b += EXO_KV_BLOCK) {
        int at;
        const void *kh = kv_head_run(kv, 0, ring ? b % ring : b, h, hd, bytes, &at);
        qk_block(G, bf, q, kh, (size_t)at * hd, hd, scale, sc + (b - base), ld);
    }
    /* a plain float max or sum over the scores is a serial chain GCC may
     * not reorder (no -ffast-math): ~0.7 ms of a 576-position token */
    float inv[4];
    for (int g = 0; g < G; g++) {
        float *s = sc + g * ld + off;
        float mx = max_lanes(s, n);
        double sum = exp_sum_lanes(s, n, mx, s);
        if (sinks) /* the sink's share of the denominator (it may exceed every score) */
            sum += exp((double)sinks[g] - (double)mx);
        inv[g] = (float)(1.0 / sum);
    }
    const int s0 = ring ? lo % ring : lo;
    int c = 0;
    /* one pass over V for all of a 128-wide head where the accumulators
     * fit (G x 8 vectors): two passes of 64 columns walked each row twice,
     * half of it each time (qwen3-0.6b q4 at 1024-1152 positions, Zen 5:
     * 47.0 -> 50.7 tok/s, six alternating pairs; the sums are the same) */
    for (; G <= 2 && c + 128 <= hd; c += 128)
        pv_block(G, 8, bf, sc + off, ld, kv, h, hd, c, n, s0, ring, o);
    for (; c + 64 <= hd; c += 64)
        pv_block(G, 4, bf, sc + off, ld, kv, h, hd, c, n, s0, ring, o);
    for (; c + 16 <= hd; c += 16)
        pv_block(G, 1, bf, sc + off, ld, kv, h, hd, c, n, s0, ring, o);
    for (; c < hd; c++)
        for (int g = 0; g < G; g++) {
            float a = 0;
            for (int i = 0, sp = s0; i < n; i++, sp = sp + 1 == ring ? 0 : sp + 1) {
                int at;
                const void *vh = kv_head_run(kv, 1, sp, h, hd, bytes, &at);
                a = __builtin_fmaf(sc[g * ld + off + i], kv_get(vh, (size_t)at * hd + c, bf), a);
            }
            o[(size_t)g * hd + c] = a;
        }
    for (int g = 0; g < G; g++)
        for (int d = 0; d < hd; d++)
            o[(size_t)g * hd + d] *= inv[g];
}

typedef struct attn_job {
    const exo_attn_shape *shape;
    float *out;
    const float *q, *k, *v;
    const exo_kv_view *cache;
    int T, pos0;
    float *const *scratch;
} attn_job;

/* Decode (and short prompts): each thread owns a range of KV heads; it
 * appends their new positions, then attends every token's query heads of
 * those KV heads. One fork-join per layer, and the append's misses on the
 * blocks just written are the first reads of the attention that follows. */
EXO_SIMD_CLONES
static void attn_worker(void *p, int ith, int nth)
{
    attn_job *j = p;
    const exo_attn_shape *s = j->shape;
    const exo_kv_view *kv = j->cache;
    const int hd = s->head_dim, group = s->n_heads / s->n_kv_heads, cap = kv->capacity;
    const float scale = s->scale;
    const bool bf = cache_bf16(s);
    long h0, h1;
    exo_split_range(s->n_kv_heads, 1, ith, nth, &h0, &h1);
    kv_append_heads(s, j->k, j->v, kv, j->T, j->pos0, h0, h1);
    float *scores = j->scratch[ith]; /* 4 rows of cap */
    for (long h = h0; h < h1; h++) {
        for (int t = 0; t < j->T; t++) {
            int qpos = j->pos0 + t;
            int lo = s->sliding_window > 0 && qpos - s->sliding_window + 1 > 0
                         ? qpos - s->sliding_window + 1
                         : 0;
            size_t first = ((size_t)t * s->n_heads + (size_t)h * group) * hd;
            /* query heads in passes of up to 4 over the KV head: one pass
             * reads K and V once for all of them (a group of 2 taken one
             * head at a time read them twice and kept one FMA chain busy:
             * qwen3-0.6b's attention was 29% of a decode token) */
            for (int g = 0; g < group; g += 4) {
                const float *qg = j->q + first + (size_t)g * hd;
                float *og = j->out + first + (size_t)g * hd;
                const float *sk = s->sinks ? s->sinks + h * group + g : NULL;
                const int ring = s->ring;
                /* the head count and the cache's type as constants:
                 * each case its own register allocation and loads */
#define ATTEND(G, bf) attend_heads(G, bf, qg, kv, h, hd, scale, lo, qpos, ring, scores, cap, sk, og)
                int heads = group - g < 4 ? group - g : 4;
                switch (heads * 2 + bf) {
                case 8: ATTEND(4, false); break;
                case 9: ATTEND(4, true); break;
                case 6: ATTEND(3, false); break;
                case 7: ATTEND(3, true); break;
                case 4: ATTEND(2, false); break;
                case 5: ATTEND(2, true); break;
                case 3: ATTEND(1, true); break;
                default: ATTEND(1, false); break;
                }
#undef ATTEND
            }
        }
    }
}

typedef struct append_job {
    const exo_attn_shape *shape;
    const float *k, *v;
    const exo_kv_view *cache;
    int T, pos0;
} append_job;

static void append_worker(void *p, int ith, int nth)
{
    append_job *j = p;
    long h0, h1;
    exo_split_range(j->shape->n_kv_heads, 1, ith, nth, &h0, &h1);
    kv_append_heads(j->shape, j->k, j->v, j->cache, j->T, j->pos0, h0, h1);
}

void exo_cpu_kv_append(exo_pool *pool, const exo_attn_shape *shape, const float *k, const float *v,
                       const exo_kv_view *cache, int T, int pos0)
{
    append_job j = {shape, k, v, cache, T, pos0};
    exo_pool_run(pool, append_worker, &j);
}

/* Prompts: a unit of work is one KV head and a tile of the call's tokens,
 * whose query rows (token by token, each token's query heads of the KV
 * head) share every load of the head's keys and values: up to TILE_ROWS
 * rows (more where one token's group is larger). Each row's arithmetic is
 * decode's (attend_heads) step for step, scores from its window's first
 * block, the same lanes for the maximum and the sum, and the values summed
 * position by position from the tile's first (a later first position's
 * row has zeros there, and adding +0 changes no sum), so a token's output
 * is the same bits whether its prompt is taken whole, in chunks, or a
 * token at a time. */
#define TILE_ROWS 16

static int tile_tokens(int group) { return group < TILE_ROWS ? TILE_ROWS / group : 1; }

static inline int first_visible(const exo_attn_shape *s, int qpos)
{
    return s->sliding_window > 0 && qpos - s->sliding_window + 1 > 0 ? qpos - s->sliding_window + 1 : 0;
}

/* Scores of a tile reach from the first visible position's block to the
 * last token's position: at most a whole cache (or ring) and a block. */
static long tile_ld(int capacity) { return ((long)capacity + 2 * EXO_KV_BLOCK) / EXO_KV_BLOCK * EXO_KV_BLOCK; }

size_t exo_cpu_prefill_scratch(const exo_attn_shape *shape, int capacity)
{
    int group = shape->n_heads / shape->n_kv_heads;
    size_t rows = (size_t)tile_tokens(group) * (size_t)group;
    return rows * (2 * (size_t)shape->head_dim + (size_t)tile_ld(capacity) + 1);
}

typedef struct prefill_job {
    const exo_attn_shape *shape;
    float *out;
    const float *q;
    const exo_kv_view *cache;
    int T, pos0;
    long tiles;
    float *const *scratch;
    _Atomic long next; /* the next unit to take */
} prefill_job;

/* Scores of G rows of a tile (qt: the tile's queries transposed, a
 * dimension's rows rs apart; G up to 8) against NB (1 or 2) 16-key blocks
 * kh[0..NB) at slot offsets at[], scaled, into sc[g * ld + 16 * nb]: each
 * row's sums as qk_block makes them. With the rows of a dimension side by
 * side every broadcast is an offset from one pointer (rows hd apart took a
 * register each, which ran out); two blocks give each pass over the
 * dimensions twice the products. */
static inline __attribute__((always_inline)) void tile_qk(int G, int NB, bool bf, const float *qt, int rs,
                                                          const void *const *kh, const size_t *at, int hd,
                                                          float scale, float *sc, long ld)
{
    v16 acc[2][8] = {{{0}}};
    if (bf) {
        const uint16_t *kb[2] = {(const uint16_t *)kh[0] + at[0], (const uint16_t *)kh[NB - 1] + at[NB - 1]};
        for (int d = 0; d < hd; d += 2) {
            const float *q0 = qt + (size_t)d * rs, *q1 = q0 + rs;
#pragma GCC unroll 2
            for (int nb = 0; nb < NB; nb++) {
                u32x16 w = *(const u32x16 *)(kb[nb] + (size_t)d * EXO_KV_BLOCK);
                v16 k0 = (v16)(w << 16), k1 = (v16)(w & 0xffff0000u);
#pragma GCC unroll 8
                for (int g = 0; g < G; g++) {
                    FMA16(acc[nb][g], q0[g], k0);
                    FMA16(acc[nb][g], q1[g], k1);
                }
            }
        }
    } else {
        const float *kb[2] = {(const float *)kh[0] + at[0], (const float *)kh[NB - 1] + at[NB - 1]};
        for (int d = 0; d < hd; d++) {
            const float *qd = qt + (size_t)d * rs;
#pragma GCC unroll 2
            for (int nb = 0; nb < NB; nb++) {
                v16 kv = *(const v16 *)(kb[nb] + (size_t)d * EXO_KV_BLOCK);
#pragma GCC unroll 8
                for (int g = 0; g < G; g++)
                    FMA16(acc[nb][g], qd[g], kv);
            }
        }
    }
    for (int nb = 0; nb < NB; nb++)
        for (int g = 0; g < G; g++)
            *(v16 *)(sc + g * ld + 16 * nb) = acc[nb][g] * scale;
}

/* Every row of a tile against NB blocks, 8 rows at a time and then the
 * rest in 4, 2 and 1 (each a compile-time case). */
static inline __attribute__((always_inline)) void tile_scores(int rows, int NB, bool bf, const float *qt, int rs,
                                                              const void *const *kh, const size_t *at, int hd,
                                                              float scale, float *sc, long ld)
{
    for (int m = 0; m < rows;) {
        int g = rows - m >= 8 ? 8 : rows - m >= 4 ? 4 : rows - m >= 2 ? 2 : 1;
#define QK(G) tile_qk(G, NB, bf, qt + m, rs, kh, at, hd, scale, sc + m * ld, ld)
        switch (g) {
        case 8: QK(8); break;
        case 4: QK(4); break;
        case 2: QK(2); break;
        default: QK(1); break;
        }
#undef QK
        m += g;
    }
}

/* Values of `len` positions of one run (vh, from slot `at`) weighted by
 * rows [m, m + G) of a tile's scores (p, rows ld apart), columns [c, c +
 * 16W), added into the accumulators kept at acc_mem (rows hd apart; zero
 * where first): a span of V stays in L1 while every row group takes it.
 * Each output sums its positions in order, as pv_block does. The
 * accumulators are kept as the registers hold them: a bf16 cache's pairs
 * (W even) leave each 32 columns as 16 even then 16 odd ones, which
 * tile_out puts back in order. */
static inline __attribute__((always_inline)) void tile_values(int G, int W, bool bf, const float *p, long ld,
                                                              const void *vh, int at, int hd, int c, int len,
                                                              float *acc_mem, bool first)
{
    v16 acc[4][4];
    const bool pairs = bf && W % 2 == 0;
    for (int g = 0; g < G; g++)
        for (int w = 0; w < W; w++)
            acc[g][w] = first ? (v16){0} : *(const v16 *)(acc_mem + (size_t)g * hd + c + 16 * w);
    for (int i = 0; i < len; i++) {
        const size_t vr = ((size_t)at + (size_t)i) * hd + c;
        if (pairs) {
#pragma GCC unroll 4
            for (int w = 0; w < W; w += 2) {
                u32x16 x = *(const u32x16 *)((const uint16_t *)vh + vr + 16 * w);
                v16 even = (v16)(x << 16), odd = (v16)(x & 0xffff0000u);
#pragma GCC unroll 4
                for (int g = 0; g < G; g++) {
                    FMA16(acc[g][w], p[g * ld + i], even);
                    FMA16(acc[g][w + 1], p[g * ld + i], odd);
                }
            }
            continue;
        }
#pragma GCC unroll 4
        for (int w = 0; w < W; w++) {
            v16 vv = KV_LOAD16(vh, vr + 16 * w, bf);
#pragma GCC unroll 4
            for (int g = 0; g < G; g++)
                FMA16(acc[g][w], p[g * ld + i], vv);
        }
    }
    for (int g = 0; g < G; g++)
        for (int w = 0; w < W; w++)
            *(v16 *)(acc_mem + (size_t)g * hd + c + 16 * w) = acc[g][w];
}

/* Rows [m, m + G) of a tile through one run of V, every column. */
static inline __attribute__((always_inline)) void tile_values_run(int G, bool bf, const float *p, long ld,
                                                                  const void *vh, int at, int hd, int len,
                                                                  float *acc_mem, bool first)
{
    int c = 0;
    for (; c + 64 <= hd; c += 64)
        tile_values(G, 4, bf, p, ld, vh, at, hd, c, len, acc_mem, first);
    for (; c + 16 <= hd; c += 16)
        tile_values(G, 1, bf, p, ld, vh, at, hd, c, len, acc_mem, first);
    for (; c < hd; c++)
        for (int g = 0; g < G; g++) {
            float a = first ? 0 : acc_mem[(size_t)g * hd + c];
            for (int i = 0; i < len; i++)
                a = __builtin_fmaf(p[g * ld + i], kv_get(vh, ((size_t)at + (size_t)i) * hd + c, bf), a);
            acc_mem[(size_t)g * hd + c] = a;
        }
}

/* A row's accumulators (tile_values' order) times 1/sum, in column order. */
static void tile_out(const float *acc, bool bf, int hd, float inv, float *o)
{
    int pairs = bf ? hd / 64 * 64 : 0; /* the columns taken 64 at a time */
    for (int c = 0; c < pairs; c += 32)
        for (int l = 0; l < 16; l++) {
            o[c + 2 * l] = acc[c + l] * inv;
            o[c + 2 * l + 1] = acc[c + 16 + l] * inv;
        }
    for (int d = pairs; d < hd; d++)
        o[d] = acc[d] * inv;
}

/* Positions a span of V: 32 KiB of f32 values of a 128-wide head. */
#define TILE_SPAN 64

EXO_SIMD_CLONES
static void prefill_worker(void *p, int ith, int nth)
{
    prefill_job *j = p;
    const exo_attn_shape *s = j->shape;
    const exo_kv_view *kv = j->cache;
    const int hd = s->head_dim, H = s->n_heads, group = H / s->n_kv_heads, ring = s->ring;
    const int tokens = tile_tokens(group), pos0 = j->pos0;
    const bool bf = cache_bf16(s);
    const size_t bytes = bf ? 2 : 4;
    const long ld = tile_ld(kv->capacity);
    const int rs = tokens * group; /* rows a tile, at most */
    float *qt = j->scratch[ith], *ot = qt + (size_t)rs * hd, *inv = ot + (size_t)rs * hd;
    float *sc = inv + rs;
    (void)nth;
    /* units taken in turn, not split in ranges: the two vCPUs of a guest
     * often run at different speeds (another guest on one core), and a
     * fixed split left the faster one idle */
    for (long u, units = (long)s->n_kv_heads * j->tiles; (u = atomic_fetch_add(&j->next, 1)) < units;) {
        const long h = u / j->tiles;
        const int t0 = (int)(u % j->tiles) * tokens, t1 = t0 + tokens < j->T ? t0 + tokens : j->T;
        const int rows = (t1 - t0) * group;
        for (int m = 0; m < rows; m++) {
            const float *qm = j->q + ((size_t)(t0 + m / group) * H + (size_t)h * group + (size_t)(m % group)) * hd;
            for (int d = 0; d < hd; d++)
                qt[(size_t)d * rs + m] = qm[d];
        }
        const int lo0 = first_visible(s, pos0 + t0), hi = pos0 + t1 - 1, base = lo0 / EXO_KV_BLOCK * EXO_KV_BLOCK;
        for (int b = base; b <= hi; b += 2 * EXO_KV_BLOCK) {
            const void *kh[2];
            size_t at[2];
            const int nb = b + EXO_KV_BLOCK <= hi ? 2 : 1;
            for (int i = 0; i < nb; i++) {
                int a;
                int slot = b + i * EXO_KV_BLOCK;
                kh[i] = kv_head_run(kv, 0, ring ? slot % ring : slot, h, hd, bytes, &a);
                at[i] = (size_t)a * hd;
            }
            float *sb = sc + (b - base);
            switch (nb * 2 + bf) {
            case 5: tile_scores(rows, 2, true, qt, rs, kh, at, hd, s->scale, sb, ld); break;
            case 4: tile_scores(rows, 2, false, qt, rs, kh, at, hd, s->scale, sb, ld); break;
            case 3: tile_scores(rows, 1, true, qt, rs, kh, at, hd, s->scale, sb, ld); break;
            default: tile_scores(rows, 1, false, qt, rs, kh, at, hd, s->scale, sb, ld); break;
            }
        }
        const int n = hi + 1 - lo0;
        for (int m = 0; m < rows; m++) {
            const int qpos = pos0 + t0 + m / group, lo = first_visible(s, qpos);
            float *row = sc + m * ld, *live = row + (lo - base);
            const int nm = qpos + 1 - lo;
            float mx = max_lanes(live, nm);
            double sum = exp_sum_lanes(live, nm, mx, live);
            if (s->sinks)
                sum += exp((double)s->sinks[h * group + m % group] - (double)mx);
            inv[m] = (float)(1.0 / sum);
            memset(row + (lo0 - base), 0, sizeof(float) * (size_t)(lo - lo0));
            memset(live + nm, 0, sizeof(float) * (size_t)(hi - qpos));
        }
        for (int i0 = 0, sp = ring ? lo0 % ring : lo0, len; i0 < n; i0 += len) {
            int at;
            const void *vh = kv_head_run(kv, 1, sp, h, hd, bytes, &at);
            len = n - i0 < kv->page - at ? n - i0 : kv->page - at;
            len = len < TILE_SPAN ? len : TILE_SPAN;
            for (int m = 0; m < rows; m += 4) {
                const float *pm = sc + m * ld + (lo0 - base) + i0;
                float *am = ot + (size_t)m * hd;
#define PV(G, bf) tile_values_run(G, bf, pm, ld, vh, at, hd, len, am, i0 == 0)
                switch ((rows - m < 4 ? rows - m : 4) * 2 + bf) {
                case 8: PV(4, false); break;
                case 9: PV(4, true); break;
                case 6: PV(3, false); break;
                case 7: PV(3, true); break;
                case 4: PV(2, false); break;
                case 5: PV(2, true); break;
                case 3: PV(1, true); break;
                default: PV(1, false); break;
                }
#undef PV
            }
            sp += len;
            if (sp == ring)
                sp = 0;
        }
        for (int m = 0; m < rows; m++)
            tile_out(ot + (size_t)m * hd, bf, hd, inv[m],
                     j->out + ((size_t)(t0 + m / group) * H + (size_t)h * group + (size_t)(m % group)) * hd);
    }
}

void exo_cpu_attention_prefill(exo_pool *pool, const exo_attn_shape *shape, float *out, const float *q,
                               const exo_kv_view *cache, int T, int pos0, float *const *scratch)
{
    int tokens = tile_tokens(shape->n_heads / shape->n_kv_heads);
    prefill_job j = {shape, out, q, cache, T, pos0, (T + tokens - 1) / tokens, scratch, 0};
    exo_pool_run(pool, prefill_worker, &j);
}

void exo_cpu_attention(exo_pool *pool, const exo_attn_shape *shape, float *out, const float *q,
                       const float *k, const float *v, const exo_kv_view *cache, int T, int pos0,
                       float *const *scratch)
{
    attn_job j = {shape, out, q, k, v, cache, T, pos0, scratch};
    exo_pool_run(pool, attn_worker, &j);
}

enum { EW_SILU_MUL, EW_ADD, EW_GELU_TANH_MUL, EW_OAI_GLU };

typedef struct ew_job {
    float *a;
    const float *b;
    size_t n;
    int op;
    float limit;
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
    const float lim = j->limit;
    switch (j->op) {
    case EW_SILU_MUL:
        for (long i = lo; i < hi; i++)
            a[i] = a[i] / (1.0f + exo_fast_expf(-a[i])) * b[i];
        break;
    case EW_ADD:
        for (long i = lo; i < hi; i++)
            a[i] += b[i];
        break;
    case EW_GELU_TANH_MUL:
        /* 0.5 x (1 + tanh(z)) = x * sigmoid(2z), z = sqrt(2/pi) (x + 0.044715 x^3) */
        for (long i = lo; i < hi; i++) {
            float x = a[i], z = 0.7978845608028654f * (x + 0.044715f * x * x * x);
            a[i] = x / (1.0f + exo_fast_expf(-2.0f * z)) * b[i];
        }
        break;
    case EW_OAI_GLU:
        for (long i = lo; i < hi; i++) {
            float g = a[i] < lim ? a[i] : lim, u = b[i] < -lim ? -lim : b[i] > lim ? lim : b[i];
            a[i] = (u + 1.0f) * (g / (1.0f + exo_fast_expf(-1.702f * g)));
        }
        break;
    }
}

static void run_ew(exo_pool *pool, float *a, const float *b, size_t n, int op, float limit)
{
    ew_job j = {a, b, n, op, limit};
    if (n < 32768)
        ew_worker(&j, 0, 1);
    else
        exo_pool_run(pool, ew_worker, &j);
}

void exo_cpu_glu(exo_pool *pool, exo_glu_kind kind, float *g, const float *u, size_t n, float limit)
{
    int op = kind == EXO_GLU_GELU_TANH ? EW_GELU_TANH_MUL : kind == EXO_GLU_OAI ? EW_OAI_GLU : EW_SILU_MUL;
    run_ew(pool, g, u, n, op, limit);
}

void exo_cpu_add(exo_pool *pool, float *x, const float *y, size_t n) { run_ew(pool, x, y, n, EW_ADD, 0); }
