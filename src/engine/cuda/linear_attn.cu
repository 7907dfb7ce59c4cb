/* Gated DeltaNet on the GPU: the causal conv, the delta rule and the gated
 * RMSNorm, computing what engine/cpu/linear_attn.c computes (see
 * engine/cpu/linear_attn.h for the contracts). All f32; the delta rule runs
 * only the recurrent form, token by token.
 *
 * DESIGN
 *
 * conv1d_silu: one thread per (channel, block of 16 tokens). The conv has
 * no recurrence through its outputs, only a K-1 input window, so token
 * blocks are independent: each thread rebuilds its window from the K-1
 * inputs before its block (the state for the first block) and keeps it in
 * registers (the kernel is templated on K, so the window is K-1 named
 * registers and the shift is unrolled). Threads of a warp are consecutive
 * channels, so every load and store of a token row is coalesced. Splitting
 * tokens gives prefill T/16 times the threads of a thread-per-channel loop
 * (8192 channels alone are 2 warps an SM, too few to hide memory latency).
 * Only the first token block reads the state, and that same thread writes
 * the new state, so no thread overwrites a state value another still has
 * to read; blocks are at least 15 tokens, so with more than one block the
 * new state comes from x alone.
 *
 * gated_delta: the rule is separable by value column (CPU DESIGN): all a
 * token does to column j of a head's state reads only column j, plus the
 * head's q, k and scalar gates. A block owns one value head and a tile of
 * its columns; in a warp, G lanes share a column, each holding Dk/G of its
 * rows in registers (G = 4 lanes of 16 or 32 rows for Dk up to 64 or 128,
 * G = 8 lanes of 32 rows up to 256; a shorter Dk masks the rows past it to
 * zero, which stay zero; 64 rows a lane spilled). A warp thus has 32/G
 * columns and a block 1, 2 or 4 warps, fewer for more blocks when there are
 * few heads (Hv = 32, Dv = 128: 256 blocks of 2 warps, 16 columns). S is
 * read from memory once at the start and written once at the end, whatever
 * T is: decode is one read and one write of the 2 MiB of a layer's state,
 * and prefill touches S only in registers. Per token a lane does 3 FMA per
 * state element it holds and one log2(G)-step shuffle reduction across its
 * column's lanes. A warp's state loads and stores are rows of 8 (4)
 * contiguous columns: whole 32-byte sectors at G = 4.
 *
 * Per token the block needs q and k of its key head, v of its columns and
 * the gates. These are staged into shared memory 16 tokens at a time (8 at
 * Dk > 128, to stay within 48 KiB) by asynchronous copies (cp.async),
 * double-buffered: the next stage's copies are in flight while the
 * current stage runs, so only the first stage's load latency is exposed,
 * not one per token. After a stage lands, a short phase computes each
 * token's scalars (q and k norms, q.k, beta, decay) once for the block,
 * with a few lanes per token, instead of once per lane. q and k sit in
 * shared memory as G row-group slices padded by 4 floats, so the float4
 * loads of the G groups fall on different banks.
 *
 * The arithmetic is the CPU recurrent form's, in the same factoring (rq,
 * rk: the l2-norm factors, the normalised vectors are never formed):
 *   kv = decay*rk*(S^T k)    delta = (v - kv)*beta
 *   o  = decay*rq*(S^T q) + rq*rk*(q.k)*delta        (= S_new^T q^)
 *   S  = decay*S + k (rk*delta)^T
 * so the two backends differ only in summation order and libm ulps.
 * Dk > 256 takes a plain kernel that keeps S in global memory (no model
 * uses it; it exists so no shape is refused below 4096).
 *
 * rmsnorm_gated: one warp per (token, head) row: a shuffle reduction of
 * the sum of squares, then the scaled, gated row written in place. */
#include "engine/cuda/cuda_internal.h"

#include <cuda_pipeline_primitives.h>
#include <stdint.h>

namespace {

const unsigned FULL_WARP = 0xffffffffu;

/* SiLU as the CPU writes it, x / (1 + e^-x) (with libm-accurate expf, not
 * the CPU's polynomial: both within ~2e-7). */
__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

/* ---- conv1d + SiLU ------------------------------------------------------ */

/* EXO_CONV_MAX_K of engine/cpu/linear_attn.h (not included: it is the CPU
 * backend's header). */
const int CONV_MAX_TAPS = 16;
/* Tokens per thread. At least CONV_MAX_TAPS - 1: only the first token
 * block then reaches back into the state. */
const int CONV_TOKENS_PER_THREAD = 16;
const int CONV_THREADS = 128;

template <int K>
__global__ void __launch_bounds__(CONV_THREADS)
conv1d_silu_kernel(float *__restrict__ out, long out_stride, const float *__restrict__ x, long x_stride,
                   const float *__restrict__ w, float *__restrict__ state, int T, int C)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    const int c = blockIdx.x * CONV_THREADS + threadIdx.x;
    if (c >= C)
        return;
    const int HIST = K - 1;               /* inputs before the current one */
    float taps[K], window[K > 1 ? K - 1 : 1]; /* window[j]: input t - HIST + j, oldest first */
#pragma unroll
    for (int j = 0; j < K; j++)
        taps[j] = w[(long)c * K + j];

    const int t_begin = blockIdx.y * CONV_TOKENS_PER_THREAD;
    const int t_end = min(T, t_begin + CONV_TOKENS_PER_THREAD);
#pragma unroll
    for (int j = 0; j < HIST; j++) {
        const int tau = t_begin - HIST + j; /* negative: row HIST + tau of the state */
        window[j] = tau < 0 ? state[(long)(HIST + tau) * C + c] : x[(long)tau * x_stride + c];
    }

#pragma unroll 4
    for (int t = t_begin; t < t_end; t++) {
        const float xt = x[(long)t * x_stride + c];
        /* the CPU's order: oldest tap first, from 0 */
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < HIST; j++)
            acc += taps[j] * window[j];
        acc += taps[HIST] * xt;
        out[(long)t * out_stride + c] = silu(acc);
#pragma unroll
        for (int j = 0; j + 1 < HIST; j++)
            window[j] = window[j + 1];
        if (HIST > 0)
            window[HIST > 0 ? HIST - 1 : 0] = xt;
    }

    /* The new state: the last HIST inputs of (state, x). The first block's
     * thread is the only one to read this channel's state, so it writes it. */
    if (blockIdx.y != 0)
        return;
    if (gridDim.y == 1) {
        /* this thread ran all T tokens: its window is exactly that */
#pragma unroll
        for (int j = 0; j < HIST; j++)
            state[(long)j * C + c] = window[j];
    } else {
        /* T > CONV_TOKENS_PER_THREAD >= HIST: all from x */
#pragma unroll
        for (int j = 0; j < HIST; j++)
            state[(long)j * C + c] = x[(long)(T - HIST + j) * x_stride + c];
    }
}

/* ---- gated delta rule --------------------------------------------------- */

/* Per-token scalars in shared memory: fk, fq, fo, rk, beta, decay, 2 spare
 * (two float4 loads). */
const int GDN_SCALARS = 8;
/* Enough blocks for about two an SM on an H100/H200 (132 SMs); fewer warps
 * per block until a model's heads give that many. */
const int GDN_TARGET_BLOCKS = 256;
const int GDN_MAX_WARPS = 4;
/* The global-memory kernel: columns per block, and the largest Dk (its
 * shared q and k must fit in 48 KiB). */
const int GDN_GLOBAL_THREADS = 128;
const int GDN_MAX_DK = 4096;

struct GdnArgs {
    float *out;
    const float *q, *k, *v, *a, *b, *A_log, *dt_bias;
    float *S;
    long qk_stride, v_stride, ab_stride;
    int T, Hv, Dk, Dv;
    int heads_per_key; /* Hv / Hk: value head h reads key head h / heads_per_key */
    int tiles;         /* column tiles per head: blockIdx.x = h * tiles + tile */
    int vec4;          /* q, k, v rows can be copied 16 bytes at a time */
};

/* The register kernel's geometry: GROUPS lanes share a value column, each
 * holding ROWS of its rows (Dk <= GROUPS * ROWS), so a warp has 32 / GROUPS
 * columns. And its shared-memory stage, which holds TOKENS tokens:
 *   scalars  [TOKENS][GDN_SCALARS]
 *   qk       [TOKENS][QK_SLOT]: q then k, each GROUPS row-group slices of SEG
 *   v        [TOKENS][cols]     the block's columns
 *   ab       [TOKENS][2]        raw a, b
 * Every region and slot is a multiple of 4 floats, so float4 loads and
 * 16-byte copies stay aligned. */
template <int ROWS, int GROUPS> struct GdnStage {
    static const int COLS_PER_WARP = 32 / GROUPS;
    /* a row group's slice; +4 floats puts the float4 loads of the groups
     * (ROWS a multiple of 32 or 16) on different banks */
    static const int SEG = ROWS + 4;
    static const int VEC = GROUPS * SEG;
    /* +4 floats: consecutive tokens on different banks in the scalar phase */
    static const int QK_SLOT = 2 * VEC + 4;
    static const int TOKENS = VEC <= 160 ? 16 : 8; /* two stages stay under 48 KiB */

    __host__ __device__ static int floats(int cols) { return TOKENS * (GDN_SCALARS + QK_SLOT + cols + 2); }
    /* where row i of q (or k) sits in its slot */
    __device__ static int row_at(int i) { return (i / ROWS) * SEG + i % ROWS; }
};

/* Queues the copies of tokens [t0, t0 + nt) into a stage. */
template <int ROWS, int GROUPS>
__device__ void gdn_stage_copy(const GdnArgs &p, float *stage, int cols, int cols_log2, int col0, int h,
                               int hk, int t0, int nt)
{
    typedef GdnStage<ROWS, GROUPS> L;
    const int tid = threadIdx.x, nthreads = blockDim.x;
    float *qk = stage + L::TOKENS * GDN_SCALARS, *vs = qk + L::TOKENS * L::QK_SLOT, *ab = vs + L::TOKENS * cols;
    const int Dk = p.Dk;

    for (int tt = 0; tt < nt; tt++) {
        const long t = t0 + tt;
        const float *qsrc = p.q + t * p.qk_stride + (long)hk * Dk, *ksrc = p.k + t * p.qk_stride + (long)hk * Dk;
        float *qdst = qk + tt * L::QK_SLOT, *kdst = qdst + L::VEC;
        if (p.vec4) {
            /* items 0..Dk/4-1: q, then k, 4 rows each (a float4 never
             * straddles a slice: ROWS is a multiple of 4) */
            const int per_vec = Dk >> 2;
            for (int j = tid; j < 2 * per_vec; j += nthreads) {
                const bool is_k = j >= per_vec;
                const int i = (is_k ? j - per_vec : j) * 4;
                __pipeline_memcpy_async((is_k ? kdst : qdst) + L::row_at(i), (is_k ? ksrc : qsrc) + i, 16);
            }
        } else {
            for (int j = tid; j < 2 * Dk; j += nthreads) {
                const bool is_k = j >= Dk;
                const int i = is_k ? j - Dk : j;
                __pipeline_memcpy_async((is_k ? kdst : qdst) + L::row_at(i), (is_k ? ksrc : qsrc) + i, 4);
            }
        }
    }

    /* v: the block's columns of each token (cols is a power of two) */
    const float *vsrc = p.v + (long)t0 * p.v_stride + (long)h * p.Dv + col0;
    if (p.vec4) {
        const int shift = cols_log2 - 2;
        for (int j = tid; j < nt << shift; j += nthreads) {
            const int tt = j >> shift, c = (j & ((1 << shift) - 1)) * 4;
            if (col0 + c < p.Dv) /* Dv % 4 == 0: all 4 or none */
                __pipeline_memcpy_async(vs + tt * cols + c, vsrc + tt * p.v_stride + c, 16);
        }
    } else {
        for (int j = tid; j < nt << cols_log2; j += nthreads) {
            const int tt = j >> cols_log2, c = j & (cols - 1);
            if (col0 + c < p.Dv)
                __pipeline_memcpy_async(vs + tt * cols + c, vsrc + tt * p.v_stride + c, 4);
        }
    }

    /* a, b of head h */
    for (int j = tid; j < 2 * nt; j += nthreads) {
        const float *src = (j & 1 ? p.b : p.a) + (long)(t0 + (j >> 1)) * p.ab_stride + h;
        __pipeline_memcpy_async(ab + j, src, 4);
    }
}

/* The gates of value head h for one token, as the CPU's gdn_gate:
 * beta = sigmoid(b), decay = exp(-exp(A_log) * softplus(a + dt_bias)),
 * softplus(x) = x above 20. neg_exp_A_log = -expf(A_log[h]). */
__device__ __forceinline__ void gdn_gates(float a_raw, float b_raw, float dt_bias, float neg_exp_A_log,
                                          float *beta, float *decay)
{
    const float a = a_raw + dt_bias;
    const float softplus = a > 20.0f ? a : log1pf(expf(a));
    const float g = neg_exp_A_log * softplus;
    *beta = 1.0f / (1.0f + expf(-b_raw));
    *decay = expf(g);
}

/* The per-token factors of the CPU's tok_scalars from the raw sums q.q,
 * k.k, q.k: rq = Dk^-1/2 / sqrt(q.q + 1e-6), rk = 1 / sqrt(k.k + 1e-6).
 * Writes fk = decay rk, fq = decay rq, fo = rq rk (q.k), rk, beta, decay. */
__device__ __forceinline__ void gdn_token_scalars(float *dst, float qq, float kk, float qk, float q_scale,
                                                  float beta, float decay)
{
    const float rq = q_scale / sqrtf(qq + 1e-6f), rk = 1.0f / sqrtf(kk + 1e-6f);
    *(float4 *)dst = make_float4(decay * rk, decay * rq, qk * rq * rk, rk);
    *(float4 *)(dst + 4) = make_float4(beta, decay, 0.0f, 0.0f);
}

/* Register kernel (GdnStage: the geometry). */
template <int ROWS, int GROUPS>
__global__ void __launch_bounds__(32 * GDN_MAX_WARPS) gated_delta_kernel(GdnArgs p)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    typedef GdnStage<ROWS, GROUPS> L;
    extern __shared__ float4 gdn_smem4[]; /* float4: 16-byte aligned */
    float *const smem = (float *)gdn_smem4;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nthreads = blockDim.x;
    const int cols = L::COLS_PER_WARP * (nthreads >> 5), cols_log2 = 31 - __clz(cols);
    const int h = blockIdx.x / p.tiles, tile = blockIdx.x - h * p.tiles, hk = h / p.heads_per_key;
    const int Dk = p.Dk, Dv = p.Dv, T = p.T;
    /* lane = group * COLS_PER_WARP + column: the lanes of a column are
     * COLS_PER_WARP apart, and a row of the warp's columns is contiguous */
    const int group = lane / L::COLS_PER_WARP;
    const int col_in_block = warp * L::COLS_PER_WARP + lane % L::COLS_PER_WARP;
    const int col0 = tile * cols, col = col0 + col_in_block, row0 = group * ROWS;
    const bool col_ok = col < Dv;
    const int stage_floats = L::floats(cols); /* stage i at smem + i * stage_floats */

    /* Zero both stages once: rows of q, k past Dk and columns of v past
     * Dv are never copied, and must read as 0 (zero rows of S stay zero;
     * a column past Dv computes zeros it never stores). */
    for (int i = tid; i < 2 * stage_floats; i += nthreads)
        smem[i] = 0.0f;
    __syncthreads();

    const int n_stages = (T + L::TOKENS - 1) / L::TOKENS;
    gdn_stage_copy<ROWS, GROUPS>(p, smem, cols, cols_log2, col0, h, hk, 0, min(T, L::TOKENS));
    __pipeline_commit();

    /* this lane's rows of column col */
    float *const S_head = p.S + (long)h * Dk * Dv;
    float s[ROWS];
#pragma unroll
    for (int m = 0; m < ROWS; m++)
        s[m] = col_ok && row0 + m < Dk ? S_head[(long)(row0 + m) * Dv + col] : 0.0f;

    const float q_scale = 1.0f / sqrtf((float)Dk);
    const float neg_exp_A_log = -expf(p.A_log[h]), dt_bias = p.dt_bias[h];
    /* the scalar phase: lanes_per_token lanes (a power of two dividing 32)
     * sum rows part, part + lanes_per_token, ... of one token */
    const int lanes_per_token = nthreads / L::TOKENS;
    const int my_token = tid / lanes_per_token, part = tid & (lanes_per_token - 1);
    const long out_row = (long)p.Hv * Dv;

    for (int st = 0; st < n_stages; st++) {
        const int t0 = st * L::TOKENS, nt = min(L::TOKENS, T - t0);
        /* queue the next stage into the other buffer (free since the
         * barrier that ended the stage before); commit even when there is
         * none, so "all but the newest group" is always this stage */
        if (st + 1 < n_stages)
            gdn_stage_copy<ROWS, GROUPS>(p, smem + ((st + 1) & 1) * stage_floats, cols, cols_log2, col0, h, hk,
                                         t0 + L::TOKENS, min(L::TOKENS, T - t0 - L::TOKENS));
        __pipeline_commit();
        __pipeline_wait_prior(1);
        __syncthreads();

        float *const scalars = smem + (st & 1) * stage_floats, *const qk = scalars + L::TOKENS * GDN_SCALARS;
        const float *const vs = qk + L::TOKENS * L::QK_SLOT, *const ab = vs + L::TOKENS * cols;

        /* scalar phase: norms, q.k and gates of each token, once a block */
        {
            float qq = 0.0f, kk = 0.0f, qkd = 0.0f;
            if (my_token < nt) {
                const float *qt = qk + my_token * L::QK_SLOT, *kt = qt + L::VEC;
                for (int i = part; i < Dk; i += lanes_per_token) {
                    const float qv = qt[L::row_at(i)], kv = kt[L::row_at(i)];
                    qq += qv * qv;
                    kk += kv * kv;
                    qkd += qv * kv;
                }
            }
            for (int off = lanes_per_token >> 1; off > 0; off >>= 1) {
                qq += __shfl_xor_sync(FULL_WARP, qq, off);
                kk += __shfl_xor_sync(FULL_WARP, kk, off);
                qkd += __shfl_xor_sync(FULL_WARP, qkd, off);
            }
            if (part == 0 && my_token < nt) {
                float beta, decay;
                gdn_gates(ab[2 * my_token], ab[2 * my_token + 1], dt_bias, neg_exp_A_log, &beta, &decay);
                gdn_token_scalars(scalars + my_token * GDN_SCALARS, qq, kk, qkd, q_scale, beta, decay);
            }
        }
        __syncthreads();

        for (int tt = 0; tt < nt; tt++) {
            const float4 *q4 = (const float4 *)(qk + tt * L::QK_SLOT + group * L::SEG);
            const float4 *k4 = (const float4 *)(qk + tt * L::QK_SLOT + L::VEC + group * L::SEG);
            /* S^T k and S^T q over this lane's rows, 4 partial sums each to
             * shorten the dependency chain */
            float ak[4] = {0.0f, 0.0f, 0.0f, 0.0f}, aq[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int m = 0; m < ROWS / 4; m++) {
                const float4 kv = k4[m], qv = q4[m];
                ak[0] += s[4 * m] * kv.x;
                ak[1] += s[4 * m + 1] * kv.y;
                ak[2] += s[4 * m + 2] * kv.z;
                ak[3] += s[4 * m + 3] * kv.w;
                aq[0] += s[4 * m] * qv.x;
                aq[1] += s[4 * m + 1] * qv.y;
                aq[2] += s[4 * m + 2] * qv.z;
                aq[3] += s[4 * m + 3] * qv.w;
            }
            float sk = (ak[0] + ak[1]) + (ak[2] + ak[3]), sq = (aq[0] + aq[1]) + (aq[2] + aq[3]);
#pragma unroll
            for (int off = L::COLS_PER_WARP; off < 32; off *= 2) {
                sk += __shfl_xor_sync(FULL_WARP, sk, off);
                sq += __shfl_xor_sync(FULL_WARP, sq, off);
            }

            const float4 f = *(const float4 *)(scalars + tt * GDN_SCALARS);
            const float4 g = *(const float4 *)(scalars + tt * GDN_SCALARS + 4);
            const float fk = f.x, fq = f.y, fo = f.z, rk = f.w, beta = g.x, decay = g.y;
            const float delta = (vs[tt * cols + col_in_block] - fk * sk) * beta;
            if (group == 0 && col_ok)
                p.out[(long)(t0 + tt) * out_row + (long)h * Dv + col] = fq * sq + fo * delta;
            const float dl = delta * rk; /* k^ delta = k (rk delta) */
#pragma unroll
            for (int m = 0; m < ROWS / 4; m++) {
                const float4 kv = k4[m];
                s[4 * m] = decay * s[4 * m] + kv.x * dl;
                s[4 * m + 1] = decay * s[4 * m + 1] + kv.y * dl;
                s[4 * m + 2] = decay * s[4 * m + 2] + kv.z * dl;
                s[4 * m + 3] = decay * s[4 * m + 3] + kv.w * dl;
            }
        }
        /* everyone is done with this stage before it is refilled */
        __syncthreads();
    }

    if (col_ok) {
#pragma unroll
        for (int m = 0; m < ROWS; m++)
            if (row0 + m < Dk)
                S_head[(long)(row0 + m) * Dv + col] = s[m];
    }
}

/* Dk > 256: S stays in global memory, one thread per column, one token
 * at a time (the same arithmetic, not tuned). Shared: q, k of the token
 * (2 Dk floats) and its scalars. */
__global__ void __launch_bounds__(GDN_GLOBAL_THREADS) gated_delta_global_kernel(GdnArgs p)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    extern __shared__ float4 gdn_smem4[];
    float *const scalars = (float *)gdn_smem4, *const qs = scalars + GDN_SCALARS, *const ks = qs + p.Dk;
    const int tid = threadIdx.x, lane = tid & 31;
    const int h = blockIdx.x / p.tiles, tile = blockIdx.x - h * p.tiles, hk = h / p.heads_per_key;
    const int Dk = p.Dk, Dv = p.Dv, col = tile * GDN_GLOBAL_THREADS + tid;
    float *const S_col = p.S + (long)h * Dk * Dv + col;
    const float q_scale = 1.0f / sqrtf((float)Dk);
    const float neg_exp_A_log = -expf(p.A_log[h]), dt_bias = p.dt_bias[h];

    for (int t = 0; t < p.T; t++) {
        const float *q = p.q + (long)t * p.qk_stride + (long)hk * Dk;
        const float *k = p.k + (long)t * p.qk_stride + (long)hk * Dk;
        for (int i = tid; i < Dk; i += GDN_GLOBAL_THREADS) {
            qs[i] = q[i];
            ks[i] = k[i];
        }
        __syncthreads();
        if (tid < 32) {
            float qq = 0.0f, kk = 0.0f, qkd = 0.0f;
            for (int i = lane; i < Dk; i += 32) {
                qq += qs[i] * qs[i];
                kk += ks[i] * ks[i];
                qkd += qs[i] * ks[i];
            }
            for (int off = 16; off > 0; off >>= 1) {
                qq += __shfl_xor_sync(FULL_WARP, qq, off);
                kk += __shfl_xor_sync(FULL_WARP, kk, off);
                qkd += __shfl_xor_sync(FULL_WARP, qkd, off);
            }
            if (lane == 0) {
                float beta, decay;
                gdn_gates(p.a[(long)t * p.ab_stride + h], p.b[(long)t * p.ab_stride + h], dt_bias, neg_exp_A_log,
                          &beta, &decay);
                gdn_token_scalars(scalars, qq, kk, qkd, q_scale, beta, decay);
            }
        }
        __syncthreads();
        if (col < Dv) {
            const float fk = scalars[0], fq = scalars[1], fo = scalars[2], rk = scalars[3];
            const float beta = scalars[4], decay = scalars[5];
            float sk = 0.0f, sq = 0.0f;
            for (int i = 0; i < Dk; i++) {
                const float sv = S_col[(long)i * Dv];
                sk += ks[i] * sv;
                sq += qs[i] * sv;
            }
            const float delta = (p.v[(long)t * p.v_stride + (long)h * Dv + col] - fk * sk) * beta;
            p.out[(long)t * p.Hv * Dv + (long)h * Dv + col] = fq * sq + fo * delta;
            const float dl = delta * rk;
            for (int i = 0; i < Dk; i++)
                S_col[(long)i * Dv] = decay * S_col[(long)i * Dv] + ks[i] * dl;
        }
        /* the next token overwrites qs, ks, scalars */
        __syncthreads();
    }
}

template <int ROWS, int GROUPS> void gated_delta_launch(cudaStream_t stream, GdnArgs p)
{
    typedef GdnStage<ROWS, GROUPS> L;
    /* fewer warps (columns) per block until the heads give enough blocks */
    int warps = GDN_MAX_WARPS;
    while (warps > 1 && (long)p.Hv * ((p.Dv + L::COLS_PER_WARP * warps - 1) / (L::COLS_PER_WARP * warps)) <
                            GDN_TARGET_BLOCKS)
        warps /= 2;
    const int cols = L::COLS_PER_WARP * warps;
    p.tiles = (p.Dv + cols - 1) / cols;
    const size_t smem = 2 * (size_t)L::floats(cols) * sizeof(float);
    exo_cuda_launch(gated_delta_kernel<ROWS, GROUPS>, dim3((unsigned)(p.Hv * p.tiles)), dim3(32 * warps), smem, stream, p);
}

/* ---- gated RMSNorm ------------------------------------------------------ */

const int NORM_WARPS = 4;

__global__ void __launch_bounds__(32 * NORM_WARPS)
rmsnorm_gated_kernel(float *x, const float *__restrict__ z, long z_stride, const float *__restrict__ w, int rows,
                     int n_heads, int dim, float eps)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    const int row = blockIdx.x * NORM_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) /* the whole warp leaves together: the shuffles below see all lanes */
        return;
    const int t = row / n_heads, h = row - t * n_heads;
    float *xr = x + (long)row * dim;
    const float *zr = z + (long)t * z_stride + (long)h * dim;
    float ss = 0.0f;
    for (int i = lane; i < dim; i += 32)
        ss += xr[i] * xr[i];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        ss += __shfl_xor_sync(FULL_WARP, ss, off);
    /* the CPU's expression: 1 / sqrt(mean + eps), then (x inv) w silu(z) */
    const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int i = lane; i < dim; i += 32)
        xr[i] = (xr[i] * inv) * w[i] * silu(zr[i]);
}

} // namespace

int exo_cuda_conv1d_silu(cudaStream_t stream, float *out, int out_stride, const float *x, int x_stride,
                         const float *w, float *state, int T, int C, int K)
{
    if (T < 0 || C < 0 || K < 1 || K > CONV_MAX_TAPS)
        return EXO_EINVAL;
    if (T == 0 || C == 0)
        return 0;
    const unsigned token_blocks = (unsigned)((T + CONV_TOKENS_PER_THREAD - 1) / CONV_TOKENS_PER_THREAD);
    if (token_blocks > 65535) /* grid y limit: T above ~1M tokens in one call */
        return EXO_EINVAL;
    const dim3 grid((unsigned)((C + CONV_THREADS - 1) / CONV_THREADS), token_blocks);
    switch (K) {
#define CONV_CASE(n)                                                                                        \
    case n:                                                                                                 \
        exo_cuda_launch(conv1d_silu_kernel<n>, dim3(grid), dim3(CONV_THREADS), 0, stream, out, out_stride, x, x_stride, w, state, T, C); \
        break;
        CONV_CASE(1) CONV_CASE(2) CONV_CASE(3) CONV_CASE(4) CONV_CASE(5) CONV_CASE(6) CONV_CASE(7) CONV_CASE(8)
        CONV_CASE(9) CONV_CASE(10) CONV_CASE(11) CONV_CASE(12) CONV_CASE(13) CONV_CASE(14) CONV_CASE(15)
        CONV_CASE(16)
#undef CONV_CASE
    default: return EXO_EINVAL;
    }
    return exo_cuda_launched("conv1d_silu");
}

int exo_cuda_gated_delta(cudaStream_t stream, float *out, const float *q, const float *k, int qk_stride,
                         const float *v, int v_stride, const float *a, const float *b, int ab_stride,
                         const float *A_log, const float *dt_bias, float *S, int T, int Hk, int Hv, int Dk,
                         int Dv)
{
    if (T < 0 || Hk <= 0 || Hv <= 0 || Hv % Hk || Dk <= 0 || Dv <= 0 || Dk > GDN_MAX_DK)
        return EXO_EINVAL;
    if (T == 0)
        return 0;
    GdnArgs p;
    p.out = out;
    p.q = q;
    p.k = k;
    p.v = v;
    p.a = a;
    p.b = b;
    p.A_log = A_log;
    p.dt_bias = dt_bias;
    p.S = S;
    p.qk_stride = qk_stride;
    p.v_stride = v_stride;
    p.ab_stride = ab_stride;
    p.T = T;
    p.Hv = Hv;
    p.Dk = Dk;
    p.Dv = Dv;
    p.heads_per_key = Hv / Hk;
    p.tiles = 0;
    /* 16-byte copies need every row start 16-byte aligned */
    p.vec4 = ((uintptr_t)q % 16 == 0 && (uintptr_t)k % 16 == 0 && (uintptr_t)v % 16 == 0 && qk_stride % 4 == 0 &&
              v_stride % 4 == 0 && Dk % 4 == 0 && Dv % 4 == 0);

    if (Dk <= 64)
        gated_delta_launch<16, 4>(stream, p);
    else if (Dk <= 128)
        gated_delta_launch<32, 4>(stream, p);
    else if (Dk <= 256)
        gated_delta_launch<32, 8>(stream, p);
    else {
        p.tiles = (Dv + GDN_GLOBAL_THREADS - 1) / GDN_GLOBAL_THREADS;
        const size_t smem = (GDN_SCALARS + 2 * (size_t)Dk) * sizeof(float);
        exo_cuda_launch(gated_delta_global_kernel, dim3((unsigned)(Hv * p.tiles)), dim3(GDN_GLOBAL_THREADS), smem, stream, p);
    }
    return exo_cuda_launched("gated_delta");
}

int exo_cuda_rmsnorm_gated(cudaStream_t stream, float *x, const float *z, int z_stride, const float *w, int T,
                           int n_heads, int dim, float eps)
{
    if (T < 0 || n_heads <= 0 || dim <= 0)
        return EXO_EINVAL;
    if (T == 0)
        return 0;
    const long rows = (long)T * n_heads;
    if (rows > 0x7fffffffL)
        return EXO_EINVAL;
    exo_cuda_launch(rmsnorm_gated_kernel, dim3((unsigned)((rows + NORM_WARPS - 1) / NORM_WARPS)), dim3(32 * NORM_WARPS), 0, stream, 
        x, z, z_stride, w, (int)rows, n_heads, dim, eps);
    return exo_cuda_launched("rmsnorm_gated");
}
