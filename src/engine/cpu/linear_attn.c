/* Gated DeltaNet kernels on the CPU (see linear_attn.h for the contracts).
 *
 * DESIGN
 *
 * The delta rule is separable by value column. Everything a token does to
 * column c of a head's state S (Dk rows of Dv) reads only column c:
 * kv[c] = sum_d S[d][c] k[d], delta[c], S[:, c] += k delta[c], o[c]. Only
 * the q/k norms and the gates are shared, and they cost O(Dk) a token. So
 * the unit of work is (value head, block of columns): the pool has enough
 * units when a model has fewer value heads than threads, and prefill keeps
 * a 64-column slab of the state (32 KiB at Dk 128) in L1 for every token
 * instead of streaming the 64 KiB head through L2 each token.
 *
 * Recurrent form, per token and column block:
 *   read-only pass:   sk = S^T k,  sq = S^T q       (raw q, k)
 *   then              kv = decay*rk*sk,  delta = (v - kv)*beta,
 *                     o  = decay*rq*sq + (rq*rk*q.k)*delta
 *   update pass:      S  = decay*S + (rk*k) delta^T
 * where rq, rk are the l2-norm factors: the normalised vectors are never
 * formed, so the kernel needs no scratch. o is S_new^T q^ expanded
 * (S_new^T q^ = decay S^T q^ + (k^.q^) delta), so one read-only pass serves
 * both kv and o. Decode is bound by moving the 2 MiB of state a layer: it
 * reads S once and writes it once, whole heads front to back, with the
 * accumulators (2 x 8 vectors for 128 columns) in registers. In prefill
 * the update pass of token t and the read-only pass of token t+1 are one
 * pass (rec_run).
 *
 * Chunked form: transformers' torch_chunk_gated_delta_rule (notes 2.3
 * item 7) on chunks of EXO_GDN_CHUNK tokens, as small register-tiled
 * matrix products (mm below), which run at the FMA peak in isolation. It is
 * the form GPUs use. On these CPUs its arithmetic (~5 M FMA per chunk and
 * head at Dk = Dv = 128, about 1.25x the recurrent form's) plus the
 * per-chunk setup made it 5-15% slower than the recurrent form at every T
 * from 16 to 4096 (bench_linear_attn), so it is not picked by default
 * (EXO_GDN_CHUNKED_MIN_T). No padding: a last chunk of L < 64 tokens runs
 * the same equations on L rows (padded rows, with k = 0, beta = 0, g = 0,
 * would change nothing).
 *
 * Both forms run with denormals flushed (fp_flush_denormals).
 *
 * The conv and the gated norm are element-wise over channels; they split
 * channels (rows) across the pool and run inline when the work is too small
 * to pay for waking a thread. */
#include "engine/cpu/linear_attn.h"

#include "core/alloc.h"
#include "core/cpu_features.h"
#include "engine/cpu/ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xmmintrin.h>

/* The kernels are plain C on GCC vector types, compiled three times: for
 * AVX-512, AVX2 and baseline x86-64, picked at run time by exo_cpu_isa()
 * (EXO_CPU_ISA caps it, for tests). Not target_clones as in ops.c: its
 * "avx512f" clone has no FMA, and -std=c17 turns off contraction, so the
 * products ran as separate multiplies and adds; the targets below include
 * FMA and this file asks GCC to contract (clang contracts by default). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=fast")
#endif
#define ISA_AVX512    __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))
#define ISA_AVX2      __attribute__((target("avx2,fma")))
#define ALWAYS_INLINE inline __attribute__((always_inline))

/* Defines name##_fn(), the variant of the pool worker name##_body (an
 * always-inline function) for this CPU. */
#define ISA_VARIANTS(name)                                                                        \
    static ISA_AVX512 void name##_avx512(void *p, int ith, int nth) { name##_body(p, ith, nth); } \
    static ISA_AVX2 void name##_avx2(void *p, int ith, int nth) { name##_body(p, ith, nth); }     \
    static void name##_generic(void *p, int ith, int nth) { name##_body(p, ith, nth); }           \
    static exo_pool_fn name##_fn(void)                                                            \
    {                                                                                             \
        const exo_isa isa = exo_cpu_isa();                                                        \
        return isa >= EXO_ISA_AVX512 ? name##_avx512                                              \
               : isa >= EXO_ISA_AVX2 ? name##_avx2                                                \
                                     : name##_generic;                                            \
    }

/* 16 floats, 4-byte aligned: one AVX-512 register, two AVX2 ones. Never
 * passed by value (its ABI differs between the ISA variants; GCC warns),
 * hence macros for loads and stores. */
typedef float v16 __attribute__((vector_size(64), aligned(4)));
#define ld16(p)    (*(const v16 *)(p))
#define st16(p, x) (*(v16 *)(p) = (x))

static ALWAYS_INLINE float silu_f(float x) { return x / (1.0f + exo_fast_expf(-x)); }


/* ---- conv1d + SiLU ------------------------------------------------------ */

/* Channels per block: the taps of a block, transposed to (K, 64), stay in
 * L1 while the block's T tokens stream past. */
#define CONV_CB 64

typedef struct conv_job {
    float *out;
    const float *x, *w;
    float *state;
    int out_stride, x_stride, T, C, K;
} conv_job;

/* Channels [cb, cb + n) of token t for K = 4, taps read in place: 16
 * channels' taps are 4 vectors, split into one vector per tap by 12
 * shuffles. Transposing the taps through memory, as the general path does,
 * cost a scalar store per tap: 18 us of a 20 us decode step at C = 8192. */
#define SHUF16(a, b, i0, s) \
    __builtin_shufflevector(a, b, i0, i0 + s, i0 + 2 * s, i0 + 3 * s, i0 + 4 * s, i0 + 5 * s, \
                            i0 + 6 * s, i0 + 7 * s, 0, 0, 0, 0, 0, 0, 0, 0)
#define LO8HI8(a, b) \
    __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)

static ALWAYS_INLINE void conv_token_k4(float *o, const float *x, long xs, const float *state,
                                        long C, const float *w, long cb, int n, int t)
{
    const float *src[4];
    for (int k = 0; k < 4; k++) {
        const int tau = t - 3 + k;
        src[k] = tau < 0 ? state + (long)(3 + tau) * C + cb : x + (long)tau * xs + cb;
    }
    const float *wb = w + cb * 4;
    int c = 0;
    for (; c + 16 <= n; c += 16) {
        const v16 a = ld16(wb + 4 * c), b = ld16(wb + 4 * c + 16);
        const v16 e = ld16(wb + 4 * c + 32), f = ld16(wb + 4 * c + 48);
        const v16 w0 = LO8HI8(SHUF16(a, b, 0, 4), SHUF16(e, f, 0, 4));
        const v16 w1 = LO8HI8(SHUF16(a, b, 1, 4), SHUF16(e, f, 1, 4));
        const v16 w2 = LO8HI8(SHUF16(a, b, 2, 4), SHUF16(e, f, 2, 4));
        const v16 w3 = LO8HI8(SHUF16(a, b, 3, 4), SHUF16(e, f, 3, 4));
        v16 acc = w0 * ld16(src[0] + c);
        acc += w1 * ld16(src[1] + c);
        acc += w2 * ld16(src[2] + c);
        acc += w3 * ld16(src[3] + c);
        float r[16];
        st16(r, acc);
        for (int l = 0; l < 16; l++)
            o[c + l] = silu_f(r[l]);
    }
    for (; c < n; c++) {
        float acc = 0;
        for (int k = 0; k < 4; k++)
            acc += wb[c * 4 + k] * src[k][c];
        o[c] = silu_f(acc);
    }
}

static ALWAYS_INLINE void conv_worker_body(void *p, int ith, int nth)
{
    const conv_job *j = p;
    float *const out = j->out, *const state = j->state;
    const float *const x = j->x, *const w = j->w;
    const long os = j->out_stride, xs = j->x_stride, C = j->C;
    const int T = j->T, K = j->K;
    long c0, c1;
    exo_split_range(C, 16, ith, nth, &c0, &c1);
    float wt[EXO_CONV_MAX_K][CONV_CB];
    for (long cb = c0; cb < c1; cb += CONV_CB) {
        const int n = c1 - cb < CONV_CB ? (int)(c1 - cb) : CONV_CB;
        if (K == 4 && T < 8) {
            /* decode: transposing the taps would cost more than the conv */
            for (int t = 0; t < T; t++)
                conv_token_k4(out + (long)t * os + cb, x, xs, state, C, w, cb, n, t);
        } else {
            for (int k = 0; k < K; k++)
                for (int c = 0; c < n; c++)
                    wt[k][c] = w[(cb + c) * K + k];
            for (int t = 0; t < T; t++) {
                float acc[CONV_CB] = {0};
                for (int k = 0; k < K; k++) {
                    /* input tau = t - (K-1) + k: from the state while negative */
                    const int tau = t - (K - 1) + k;
                    const float *src = tau < 0 ? state + (long)(K - 1 + tau) * C + cb
                                               : x + (long)tau * xs + cb;
                    for (int c = 0; c < n; c++)
                        acc[c] += wt[k][c] * src[c];
                }
                float *o = out + (long)t * os + cb;
                for (int c = 0; c < n; c++)
                    o[c] = silu_f(acc[c]);
            }
        }
        /* new state row i = input T + i of (state, x); ascending i reads a
         * row at or after T + i > i, never one already overwritten */
        for (int i = 0; i < K - 1; i++) {
            const int tau = T + i - (K - 1);
            const float *src = tau >= 0 ? x + (long)tau * xs + cb : state + (long)(T + i) * C + cb;
            memmove(state + (long)i * C + cb, src, sizeof(float) * (size_t)n);
        }
    }
}
ISA_VARIANTS(conv_worker)

void exo_cpu_conv1d_silu(exo_pool *pool, float *out, int out_stride, const float *x, int x_stride,
                         const float *w, float *state, int T, int C, int K)
{
    if (T <= 0 || C <= 0 || K < 1 || K > EXO_CONV_MAX_K)
        return;
    conv_job j = {out, x, w, state, out_stride, x_stride, T, C, K};
    /* a decode step at C = 8192 is a few microseconds: one thread unless
     * there is more (measured: bench_linear_attn "conv") */
    if ((long)T * C * K < 65536)
        conv_worker_fn()(&j, 0, 1);
    else
        exo_pool_run(pool, conv_worker_fn(), &j);
}

/* ---- gates and norms ---------------------------------------------------- */

typedef struct gdn_args {
    float *out;
    const float *q, *k, *v, *a, *b, *A_log, *dt_bias;
    float *S;
    int qk_stride, v_stride, ab_stride, T, Hk, Hv, Dk, Dv;
    int ub;    /* columns of a unit, in blocks of 16 (the last may be shorter) */
    int upr;   /* units per head */
    int wide;  /* recurrent: 128-column register blocks allowed */
    float *scratch; /* chunked: one region of chunk_floats per share */
    size_t chunk_floats;
} gdn_args;

/* log-decay g (<= 0) and beta of value head h for one token */
static inline void gdn_gate(const gdn_args *j, int t, int h, float *g, float *beta)
{
    const float a = j->a[(long)t * j->ab_stride + h] + j->dt_bias[h];
    const float b = j->b[(long)t * j->ab_stride + h];
    const float sp = a > 20.0f ? a : log1pf(expf(a));
    *g = -expf(j->A_log[h]) * sp;
    *beta = 1.0f / (1.0f + expf(-b));
}

/* Flush denormals to zero (FTZ and DAZ in MXCSR) while a delta-rule
 * worker runs. The chunked form multiplies by exp(G) of a cumulative
 * log-decay, which falls below f32's normal range (e^-87) within a chunk
 * on strongly decaying heads; each denormal operand or result then costs a
 * microcode assist: the chunked prefill ran 6x slower on random gates
 * (bench_linear_attn). The values flushed are below 1e-38 of the state. */
static inline unsigned fp_flush_denormals(void)
{
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040);
    return csr;
}

/* ---- recurrent form ----------------------------------------------------- */

/* Per-token scalars of one head, for a block of tokens: the l2-norm
 * factors folded with the decay (the normalised q, k are never formed),
 * beta and the decay. Computed once per head and token, not per unit. */
#define REC_TB 128

typedef struct tok_scalars {
    float fk[REC_TB];    /* decay * rk: kv = fk * (S^T k) */
    float fq[REC_TB];    /* decay * rq: S^T q^ = fq * (S^T q) */
    float fo[REC_TB];    /* rq * rk * (q.k): o += fo * delta */
    float rk[REC_TB];    /* S += (rk k) delta^T */
    float beta[REC_TB];
    float decay[REC_TB];
} tok_scalars;

/* sum q^2, sum k^2, q.k in one pass */
static ALWAYS_INLINE void dot3(const float *q, const float *k, int n, float *qq, float *kk,
                               float *qk)
{
    float a[16] = {0}, b[16] = {0}, c[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) {
            a[l] += q[i + l] * q[i + l];
            b[l] += k[i + l] * k[i + l];
            c[l] += q[i + l] * k[i + l];
        }
    for (int l = 0; i + l < n; l++) {
        a[l] += q[i + l] * q[i + l];
        b[l] += k[i + l] * k[i + l];
        c[l] += q[i + l] * k[i + l];
    }
    for (int w = 8; w; w >>= 1)
        for (int l = 0; l < w; l++) {
            a[l] += a[l + w];
            b[l] += b[l + w];
            c[l] += c[l + w];
        }
    *qq = a[0];
    *kk = b[0];
    *qk = c[0];
}

static ALWAYS_INLINE void token_scalars(const gdn_args *j, int h, int t0, int nt, tok_scalars *ts)
{
    const int Dk = j->Dk, hk = h / (j->Hv / j->Hk);
    const float scale = 1.0f / sqrtf((float)Dk);
    for (int i = 0; i < nt; i++) {
        const int t = t0 + i;
        const float *q = j->q + (long)t * j->qk_stride + (long)hk * Dk;
        const float *k = j->k + (long)t * j->qk_stride + (long)hk * Dk;
        float qq, kk, qk, g;
        dot3(q, k, Dk, &qq, &kk, &qk);
        const float rq = scale / sqrtf(qq + 1e-6f), rk = 1.0f / sqrtf(kk + 1e-6f);
        gdn_gate(j, t, h, &g, &ts->beta[i]);
        const float decay = expf(g);
        ts->fk[i] = decay * rk;
        ts->fq[i] = decay * rq;
        ts->fo[i] = qk * rq * rk;
        ts->rk[i] = rk;
        ts->decay[i] = decay;
    }
}

/* Tokens [t0, t0 + nt) on W vectors (16W columns) of a head's state:
 * s, the block's first row (rows ld floats apart); v, o: the head's rows
 * at the block's columns (token strides vs, os). The update of token i and
 * the read-only pass of token i + 1 are one pass over the block:
 *   S = decay_i S + (rk_i k_i) delta_i^T;  sk = S^T k_{i+1};  sq = S^T q_{i+1}
 * the same operations in the same order as two passes, with half the loads. */
static ALWAYS_INLINE void rec_run(int W, float *s, long ld, int Dk, const float *q0,
                                  const float *k0, long qs, const float *v0, long vs, float *o0,
                                  long os, int nt, const tok_scalars *ts)
{
    v16 ak[8], aq[8], dl[8];
#pragma GCC unroll 8
    for (int w = 0; w < W; w++)
        ak[w] = aq[w] = (v16){0};
    for (int d = 0; d < Dk; d++) {
        const float *r = s + d * ld;
        const float kd = k0[d], qd = q0[d];
#pragma GCC unroll 8
        for (int w = 0; w < W; w++) {
            const v16 sv = ld16(r + 16 * w);
            ak[w] += kd * sv;
            aq[w] += qd * sv;
        }
    }
    for (int i = 0; i < nt; i++) {
        const float *k = k0 + i * qs, *v = v0 + i * vs;
        float *o = o0 + i * os;
        const float fk = ts->fk[i], fq = ts->fq[i], fo = ts->fo[i], rk = ts->rk[i];
        const float beta = ts->beta[i], decay = ts->decay[i];
#pragma GCC unroll 8
        for (int w = 0; w < W; w++) {
            dl[w] = (ld16(v + 16 * w) - fk * ak[w]) * beta;
            st16(o + 16 * w, fq * aq[w] + fo * dl[w]);
            dl[w] *= rk;
        }
        if (i + 1 < nt) {
            const float *k2 = k + qs, *q2 = q0 + (i + 1) * qs;
#pragma GCC unroll 8
            for (int w = 0; w < W; w++)
                ak[w] = aq[w] = (v16){0};
            for (int d = 0; d < Dk; d++) {
                float *r = s + d * ld;
                const float kd = k[d], kd2 = k2[d], qd2 = q2[d];
#pragma GCC unroll 8
                for (int w = 0; w < W; w++) {
                    const v16 sv = decay * ld16(r + 16 * w) + kd * dl[w];
                    st16(r + 16 * w, sv);
                    ak[w] += kd2 * sv;
                    aq[w] += qd2 * sv;
                }
            }
        } else {
            for (int d = 0; d < Dk; d++) {
                float *r = s + d * ld;
                const float kd = k[d];
#pragma GCC unroll 8
                for (int w = 0; w < W; w++)
                    st16(r + 16 * w, decay * ld16(r + 16 * w) + kd * dl[w]);
            }
        }
    }
}

/* The same for n < 16 leftover columns. */
static ALWAYS_INLINE void rec_tail(int n, float *s, long ld, int Dk, const float *q,
                                   const float *k, const float *v, float *o,
                                   const tok_scalars *ts, int i)
{
    float ak[16] = {0}, aq[16] = {0}, dl[16];
    for (int d = 0; d < Dk; d++)
        for (int c = 0; c < n; c++) {
            ak[c] += k[d] * s[d * ld + c];
            aq[c] += q[d] * s[d * ld + c];
        }
    for (int c = 0; c < n; c++) {
        dl[c] = (v[c] - ts->fk[i] * ak[c]) * ts->beta[i];
        o[c] = ts->fq[i] * aq[c] + ts->fo[i] * dl[c];
        dl[c] *= ts->rk[i];
    }
    for (int d = 0; d < Dk; d++)
        for (int c = 0; c < n; c++)
            s[d * ld + c] = ts->decay[i] * s[d * ld + c] + k[d] * dl[c];
}

/* Columns [c0, c1) of head h, tokens [t0, t0 + nt), a column block at a
 * time (tokens inner: the block stays hot). s: the state of column c0,
 * rows ld floats apart. */
static ALWAYS_INLINE void rec_cols(const gdn_args *j, int h, int c0, int c1, float *s, long ld,
                                   int t0, int nt, const tok_scalars *ts)
{
    const int Dk = j->Dk, Dv = j->Dv, hk = h / (j->Hv / j->Hk), n = c1 - c0;
    const long qs = j->qk_stride, vs = j->v_stride, os = (long)j->Hv * Dv;
    const float *q = j->q + (long)t0 * qs + (long)hk * Dk;
    const float *k = j->k + (long)t0 * qs + (long)hk * Dk;
    const float *v = j->v + (long)t0 * vs + (long)h * Dv + c0;
    float *o = j->out + (long)t0 * os + (long)h * Dv + c0;
    int c = 0;
    if (j->wide)
        for (; c + 128 <= n; c += 128)
            rec_run(8, s + c, ld, Dk, q, k, qs, v + c, vs, o + c, os, nt, ts);
    for (; c + 64 <= n; c += 64)
        rec_run(4, s + c, ld, Dk, q, k, qs, v + c, vs, o + c, os, nt, ts);
    for (; c + 16 <= n; c += 16)
        rec_run(1, s + c, ld, Dk, q, k, qs, v + c, vs, o + c, os, nt, ts);
    if (c < n)
        for (int i = 0; i < nt; i++)
            rec_tail(n - c, s + c, ld, Dk, q + i * qs, k + i * qs, v + c + i * vs,
                     o + c + i * os, ts, i);
}

/* Prefill copies a unit's columns into a contiguous slab for its tokens:
 * in place, a 64-column slab of a 128-column state is 128 pieces of 256 B,
 * 512 B apart, which fall into half of L1's sets and thrash. */
#define REC_SLAB_FLOATS 8192 /* 32 KiB: Dk 128 x 64 columns */

static ALWAYS_INLINE void rec_unit(const gdn_args *j, int h, int c0, int c1, int t0, int nt,
                                   const tok_scalars *ts)
{
    const int Dk = j->Dk, Dv = j->Dv, n = c1 - c0;
    float *Sh = j->S + (long)h * Dk * Dv + c0;
    if (nt == 1 || (long)Dk * n > REC_SLAB_FLOATS || n == Dv) {
        rec_cols(j, h, c0, c1, Sh, Dv, t0, nt, ts);
        return;
    }
    float slab[REC_SLAB_FLOATS] __attribute__((aligned(64)));
    for (int d = 0; d < Dk; d++)
        memcpy(slab + d * n, Sh + (long)d * Dv, sizeof(float) * (size_t)n);
    rec_cols(j, h, c0, c1, slab, n, t0, nt, ts);
    for (int d = 0; d < Dk; d++)
        memcpy(Sh + (long)d * Dv, slab + d * n, sizeof(float) * (size_t)n);
}

static ALWAYS_INLINE void unit_cols(const gdn_args *j, long u, int *h, int *c0, int *c1)
{
    *h = (int)(u / j->upr);
    *c0 = (int)(u % j->upr) * j->ub * 16;
    *c1 = *c0 + j->ub * 16 < j->Dv ? *c0 + j->ub * 16 : j->Dv;
}

static ALWAYS_INLINE void rec_worker_body(void *p, int ith, int nth)
{
    const gdn_args *j = p;
    const unsigned csr = fp_flush_denormals();
    tok_scalars ts;
    long u0, u1;
    exo_split_range((long)j->Hv * j->upr, 1, ith, nth, &u0, &u1);
    /* the units of one head in this share, a block of tokens at a time */
    for (long u = u0; u < u1;) {
        const int h = (int)(u / j->upr);
        const long ue = (long)(h + 1) * j->upr < u1 ? (long)(h + 1) * j->upr : u1;
        for (int t0 = 0; t0 < j->T; t0 += REC_TB) {
            const int nt = j->T - t0 < REC_TB ? j->T - t0 : REC_TB;
            token_scalars(j, h, t0, nt, &ts);
            for (long uu = u; uu < ue; uu++) {
                int hh, c0, c1;
                unit_cols(j, uu, &hh, &c0, &c1);
                rec_unit(j, h, c0, c1, t0, nt, &ts);
            }
        }
        u = ue;
    }
    _mm_setcsr(csr);
}
ISA_VARIANTS(rec_worker)

/* ---- chunked form ------------------------------------------------------- */

/* C = cs*C + as*(A B) on an M x N tile, A: M x Kd (lda), B: Kd x N (ldb).
 * cs == 0 does not read C. R rows and W vectors are compile-time. */
static ALWAYS_INLINE void mm_tile(int R, int W, int Kd, const float *A, long lda, const float *B,
                                  long ldb, float *C, long ldc, float cs, float as)
{
    v16 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int w = 0; w < W; w++)
            acc[r][w] = (v16){0};
    for (int kk = 0; kk < Kd; kk++) {
        const float *b = B + kk * ldb;
#pragma GCC unroll 4
        for (int w = 0; w < W; w++) {
            const v16 bv = ld16(b + 16 * w);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                acc[r][w] += A[r * lda + kk] * bv;
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int w = 0; w < W; w++) {
            float *c = C + r * ldc + 16 * w;
            st16(c, cs != 0.0f ? cs * ld16(c) + as * acc[r][w] : as * acc[r][w]);
        }
}

/* tri: A is lower triangular (A[r][kk] = 0 for kk > r), so row r of the
 * product stops at kk = r. */
static ALWAYS_INLINE void mm_cols(int W, int M, int Kd, const float *A, long lda, const float *B,
                                  long ldb, float *C, long ldc, float cs, float as, int tri)
{
    int r = 0;
    for (; r + 4 <= M; r += 4) {
        const int kd = tri && r + 4 < Kd ? r + 4 : Kd;
        mm_tile(4, W, kd, A + r * lda, lda, B, ldb, C + r * ldc, ldc, cs, as);
    }
    const int kd = tri && M < Kd ? M : Kd;
    switch (M - r) {
    case 3: mm_tile(3, W, kd, A + r * lda, lda, B, ldb, C + r * ldc, ldc, cs, as); break;
    case 2: mm_tile(2, W, kd, A + r * lda, lda, B, ldb, C + r * ldc, ldc, cs, as); break;
    case 1: mm_tile(1, W, kd, A + r * lda, lda, B, ldb, C + r * ldc, ldc, cs, as); break;
    default: break;
    }
}

static ALWAYS_INLINE void mm(int M, int N, int Kd, const float *A, long lda, const float *B,
                             long ldb, float *C, long ldc, float cs, float as, int tri)
{
    int n = 0;
    for (; n + 64 <= N; n += 64)
        mm_cols(4, M, Kd, A, lda, B + n, ldb, C + n, ldc, cs, as, tri);
    for (; n + 16 <= N; n += 16)
        mm_cols(1, M, Kd, A, lda, B + n, ldb, C + n, ldc, cs, as, tri);
    for (; n < N; n++)
        for (int r = 0; r < M; r++) {
            const int kd = tri && r + 1 < Kd ? r + 1 : Kd;
            float s = 0;
            for (int kk = 0; kk < kd; kk++)
                s += A[r * lda + kk] * B[kk * ldb + n];
            float *c = C + r * ldc + n;
            *c = cs != 0.0f ? cs * *c + as * s : as * s;
        }
}

#define CK EXO_GDN_CHUNK

/* Scratch of one share, in floats, for Dk and units of at most ncmax
 * columns (each region a multiple of 16 floats, so all stay 64-byte
 * aligned). */
static size_t chunk_scratch_floats(int Dk, int ncmax)
{
    size_t dk = ((size_t)Dk + 15) / 16 * 16, nc = ((size_t)ncmax + 15) / 16 * 16;
    return 4 * CK * dk /* Q, K, Kb, Wm */ + dk * CK /* Kt */ + 2 * CK * CK /* P, Tm */ +
           2 * CK * nc /* Vb, U */ + 6 * CK /* g, G, eG, beta, ed, row */;
}

static ALWAYS_INLINE void chunk_unit(const gdn_args *j, float *scr, int h, int c0, int c1)
{
    const int Dk = j->Dk, Dv = j->Dv, Hv = j->Hv, hk = h / (Hv / j->Hk), nc = c1 - c0;
    const long dk = (Dk + 15) / 16 * 16, ncp = (nc + 15) / 16 * 16;
    const float scale = 1.0f / sqrtf((float)Dk);
    float *Q = scr, *K = Q + CK * dk, *Kb = K + CK * dk, *Wm = Kb + CK * dk, *Kt = Wm + CK * dk;
    float *P = Kt + dk * CK, *Tm = P + CK * CK, *Vb = Tm + CK * CK, *U = Vb + CK * ncp;
    float *g = U + CK * ncp, *G = g + CK, *eG = G + CK, *beta = eG + CK, *ed = beta + CK,
          *row = ed + CK;
    float *Sh = j->S + (long)h * Dk * Dv + c0;
    const long ldo = (long)Hv * Dv;

    for (int t0 = 0; t0 < j->T; t0 += CK) {
        const int L = j->T - t0 < CK ? j->T - t0 : CK;
        const int Lp = (L + 15) / 16 * 16;
        /* normalised q (with Dk^-1/2), k; gates; cumulative log-decay */
        for (int i = 0; i < L; i++) {
            const int t = t0 + i;
            const float *q = j->q + (long)t * j->qk_stride + (long)hk * Dk;
            const float *k = j->k + (long)t * j->qk_stride + (long)hk * Dk;
            float qq, kk, qk;
            dot3(q, k, Dk, &qq, &kk, &qk);
            const float rq = scale / sqrtf(qq + 1e-6f), rk = 1.0f / sqrtf(kk + 1e-6f);
            for (int d = 0; d < Dk; d++) {
                Q[i * dk + d] = q[d] * rq;
                K[i * dk + d] = k[d] * rk;
            }
            gdn_gate(j, t, h, &g[i], &beta[i]);
            G[i] = (i ? G[i - 1] : 0.0f) + g[i];
        }
        for (int i = 0; i < L; i++)
            eG[i] = expf(G[i]);
        /* Kt: K transposed, columns L..Lp zero */
        for (int d = 0; d < Dk; d++) {
            for (int i = 0; i < L; i++)
                Kt[d * CK + i] = K[i * dk + d];
            for (int i = L; i < Lp; i++)
                Kt[d * CK + i] = 0.0f;
        }
        /* P = (Q K^T) . Gamma (lower incl. diagonal); Tm = -(beta K K^T) .
         * Gamma (strictly lower). Gamma_ij = exp(G_i - G_j). */
        mm(L, Lp, Dk, Q, dk, Kt, CK, P, CK, 0.0f, 1.0f, 0);
        mm(L, Lp, Dk, K, dk, Kt, CK, Tm, CK, 0.0f, 1.0f, 0);
        for (int i = 0; i < L; i++) {
            for (int jj = 0; jj < Lp; jj++) {
                const float gm = jj <= i ? exo_fast_expf(G[i] - G[jj]) : 0.0f;
                P[i * CK + jj] *= gm;
                Tm[i * CK + jj] *= jj < i ? -beta[i] * gm : 0.0f;
            }
        }
        /* forward substitution: Tm[i] = row + sum_{m<i} row[m] Tm[m] with
         * row the original (rows m < i already final); then T = Tm + I */
        for (int i = 1; i < L; i++) {
            float *ti = Tm + i * CK;
            for (int jj = 0; jj < Lp; jj++)
                row[jj] = ti[jj];
            for (int m = 0; m < i; m++) {
                const float r = row[m];
                const float *tm = Tm + m * CK;
                for (int jj = 0; jj < Lp; jj++)
                    ti[jj] += r * tm[jj];
            }
        }
        for (int i = 0; i < L; i++)
            Tm[i * CK + i] = 1.0f;
        /* Vb = diag(beta) V, Kb = diag(beta exp G) K; U = T Vb, Wm = T Kb */
        for (int i = 0; i < L; i++) {
            const float *v = j->v + (long)(t0 + i) * j->v_stride + (long)h * Dv + c0;
            for (int c = 0; c < nc; c++)
                Vb[i * ncp + c] = beta[i] * v[c];
            const float f = beta[i] * eG[i];
            for (int d = 0; d < Dk; d++)
                Kb[i * dk + d] = f * K[i * dk + d];
        }
        mm(L, nc, L, Tm, CK, Vb, ncp, U, ncp, 0.0f, 1.0f, 1);
        mm(L, Dk, L, Tm, CK, Kb, dk, Wm, dk, 0.0f, 1.0f, 1);
        /* Vn = U - Wm S (in U) */
        mm(L, nc, Dk, Wm, dk, Sh, Dv, U, ncp, 1.0f, -1.0f, 0);
        /* O = diag(exp G) Q S + P Vn, straight into out */
        for (int i = 0; i < L; i++)
            for (int d = 0; d < Dk; d++)
                Q[i * dk + d] *= eG[i];
        float *o = j->out + (long)t0 * ldo + (long)h * Dv + c0;
        mm(L, nc, Dk, Q, dk, Sh, Dv, o, ldo, 0.0f, 1.0f, 0);
        mm(L, nc, L, P, CK, U, ncp, o, ldo, 1.0f, 1.0f, 1);
        /* S = exp(G_last) S + K^T diag(exp(G_last - G)) Vn */
        for (int i = 0; i < L; i++) {
            ed[i] = expf(G[L - 1] - G[i]);
            for (int c = 0; c < nc; c++)
                U[i * ncp + c] *= ed[i];
        }
        mm(Dk, nc, L, Kt, CK, U, ncp, Sh, Dv, eG[L - 1], 1.0f, 0);
    }
}

static ALWAYS_INLINE void chunk_worker_body(void *p, int ith, int nth)
{
    const gdn_args *j = p;
    const unsigned csr = fp_flush_denormals();
    float *scr = j->scratch + (size_t)ith * j->chunk_floats;
    long u0, u1;
    exo_split_range((long)j->Hv * j->upr, 1, ith, nth, &u0, &u1);
    for (long u = u0; u < u1; u++) {
        int h, c0, c1;
        unit_cols(j, u, &h, &c0, &c1);
        chunk_unit(j, scr, h, c0, c1);
    }
    _mm_setcsr(csr);
}
ISA_VARIANTS(chunk_worker)

/* ---- dispatch ----------------------------------------------------------- */

/* Columns of a unit, in blocks of 16: start from `ub` and halve while there
 * are fewer units than shares (so Hv = 4 heads still use every thread). */
static int unit_blocks(int Hv, int Dv, int ub, int nth)
{
    const int nb = (Dv + 15) / 16;
    ub = ub < nb ? ub : nb;
    while (ub > 1 && (long)Hv * ((nb + ub - 1) / ub) < nth)
        ub = (ub + 1) / 2;
    return ub;
}

void exo_cpu_gated_delta(exo_pool *pool, float *out, const float *q, const float *k, int qk_stride,
                         const float *v, int v_stride, const float *a, const float *b, int ab_stride,
                         const float *A_log, const float *dt_bias, float *S,
                         int T, int Hk, int Hv, int Dk, int Dv)
{
    if (T <= 0 || Hv <= 0 || Hk <= 0 || Hv % Hk)
        return;
    const int nth = exo_pool_size(pool);
    gdn_args j = {out, q, k, v, a, b, A_log, dt_bias, S, qk_stride, v_stride, ab_stride,
                  T, Hk, Hv, Dk, Dv, 0, 0, 0, NULL, 0};
    const char *env = getenv("EXO_GDN_PATH");
    int chunked = EXO_GDN_CHUNKED_MIN_T > 0 && T >= EXO_GDN_CHUNKED_MIN_T;
    if (env && strcmp(env, "recurrent") == 0)
        chunked = 0;
    else if (env && strcmp(env, "chunked") == 0)
        chunked = 1;
    if (chunked) {
        j.ub = unit_blocks(Hv, Dv, (Dv + 15) / 16, nth);
        j.upr = ((Dv + 15) / 16 + j.ub - 1) / j.ub;
        j.chunk_floats = chunk_scratch_floats(Dk, j.ub * 16);
        j.scratch = exo_alloc_aligned(sizeof(float) * j.chunk_floats * (size_t)nth);
        if (j.scratch) {
            exo_pool_run(pool, chunk_worker_fn(), &j);
            exo_free_aligned(j.scratch);
            return;
        }
    }
    /* decode: whole heads, read front to back; prefill: 64-column slabs
     * that stay in L1 across tokens. 128-column blocks need 16 vector
     * accumulators plus operands: AVX-512's 32 registers, not AVX2's 16. */
    j.ub = unit_blocks(Hv, Dv, T == 1 ? (Dv + 15) / 16 : 4, nth);
    j.upr = ((Dv + 15) / 16 + j.ub - 1) / j.ub;
    j.wide = exo_cpu_isa() >= EXO_ISA_AVX512;
    exo_pool_run(pool, rec_worker_fn(), &j);
}

/* ---- gated RMSNorm ------------------------------------------------------ */

typedef struct normg_job {
    float *x;
    const float *z, *w;
    int z_stride, n_heads, dim, rows;
    float eps;
} normg_job;

static ALWAYS_INLINE void normg_worker_body(void *p, int ith, int nth)
{
    const normg_job *j = p;
    const int dim = j->dim, nh = j->n_heads;
    const float *const w = j->w;
    long r0, r1;
    exo_split_range(j->rows, 1, ith, nth, &r0, &r1);
    for (long r = r0; r < r1; r++) {
        const long t = r / nh, h = r % nh;
        float *x = j->x + r * dim;
        const float *z = j->z + t * j->z_stride + h * dim;
        const float inv = 1.0f / sqrtf(exo_cpu_dot_f32(x, x, dim) / (float)dim + j->eps);
        for (int i = 0; i < dim; i++)
            x[i] = (x[i] * inv) * w[i] * silu_f(z[i]);
    }
}
ISA_VARIANTS(normg_worker)

void exo_cpu_rmsnorm_gated(exo_pool *pool, float *x, const float *z, int z_stride, const float *w,
                           int T, int n_heads, int dim, float eps)
{
    if (T <= 0 || n_heads <= 0 || dim <= 0)
        return;
    normg_job j = {x, z, w, z_stride, n_heads, dim, T * n_heads, eps};
    if ((long)T * n_heads * dim < 16384)
        normg_worker_fn()(&j, 0, 1);
    else
        exo_pool_run(pool, normg_worker_fn(), &j);
}
