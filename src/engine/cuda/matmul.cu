/* Matrix products on the GPU: y = x W^T for the weight formats of
 * engine/linear.h, kept on the device exactly as the checkpoint stores them.
 *
 * Decode (T <= EXO_CUDA_GEMV_MAX_T tokens, in launches of 1, 2, 3, 4, 8 or
 * 16 rows of x as the format allows) is memory-bound: every byte of the
 * weight is read once a launch, so the kernel is a streaming GEMV. A warp owns
 * ROWS rows, each lane reads 16 bytes of each of them per step (coalesced:
 * a warp reads 512 contiguous bytes of a row), dequantizes in registers
 * and multiplies by the matching slice of x, which all ROWS rows share
 * (x comes from L1, so more rows per warp means fewer x bytes per weight
 * byte). Sixteen bytes of MLX affine 4-bit are 32 codes of one group
 * (groups are 32, 64 or 128 wide), so a step needs one scale and one bias:
 * sum (s q + b) x = s (q . x) + b sum(x). MXFP4's 16 bytes are exactly one
 * 32-wide block with one E8M0 scale and no bias. One launch runs up to EXO_CUDA_JOBS
 * weights of one format (q, k and v; gate and up; a token's experts), each
 * with its own x and y, blocks dealt to weights by their row counts.
 * Launches of 8 or 16 rows of x (a step of several sequences) of affine
 * weights do their integer dot products on the tensor cores instead
 * (gemv_tc_kernel), adding up in the same order, so a sequence gets the
 * same bits batched or alone.
 *
 * Prompts go to cuBLAS on the tensor cores: x is rounded to bf16, a
 * quantized weight is dequantized to bf16 into scratch first (one read of
 * the weight, one write and read of the bf16 copy: small next to the
 * product at 512 tokens), accumulation in f32. F32 weights (tests) use an
 * f32 product. Shapes the GEMV cannot take (widths off its step, other
 * bit widths) take this path at any T. */
#include "engine/cuda/cuda_internal.h"
#include "engine/cuda/matmul.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdlib.h>
#include <string.h>

/* ---- element decoding ---------------------------------------------------- */

__device__ __forceinline__ float bf16_bits(uint32_t h) { return __uint_as_float(h << 16); }

template <int SDT> __device__ __forceinline__ float scalar_at(const void *p, int64_t i)
{
    if (SDT == EXO_DTYPE_BF16)
        return bf16_bits(((const uint16_t *)p)[i]);
    if (SDT == EXO_DTYPE_F16)
        return __half2float(((const __half *)p)[i]);
    return ((const float *)p)[i];
}

__device__ __forceinline__ float scalar_any(int dt, const void *p, int64_t i)
{
    if (dt == EXO_DTYPE_BF16)
        return scalar_at<EXO_DTYPE_BF16>(p, i);
    if (dt == EXO_DTYPE_F16)
        return scalar_at<EXO_DTYPE_F16>(p, i);
    return scalar_at<EXO_DTYPE_F32>(p, i);
}

/* An E2M1 code's value (sign, two exponent bits, one mantissa bit), by
 * arithmetic: a table in constant memory read at a per-thread index is
 * serialized over the warp's distinct addresses. */
__device__ __forceinline__ float e2m1(uint32_t c)
{
    const uint32_t e = (c >> 1) & 3, m = c & 1;
    const float v = e ? (float)(2 + m) * (float)(1u << e) * 0.25f : 0.5f * (float)m;
    return c & 8 ? -v : v;
}

__device__ __forceinline__ float e8m0(uint32_t s) { return __uint_as_float(s ? s << 23 : 0x00400000u); }

/* Element (r, c) of any weight, as f32 (embedding rows, dequantization). */
__device__ float weight_at(const exo_linear &w, int64_t r, int64_t c)
{
    switch (w.format) {
    case EXO_WFORMAT_DENSE:
        return scalar_any(w.dtype, w.w, r * w.cols + c);
    case EXO_WFORMAT_AFFINE: {
        const uint32_t *row = (const uint32_t *)w.w + r * (w.cols * w.bits / 32);
        int64_t bit = c * w.bits;
        uint64_t pair = row[bit / 32];
        if ((bit % 32) + w.bits > 32)
            pair |= (uint64_t)row[bit / 32 + 1] << 32;
        uint32_t q = (uint32_t)(pair >> (bit % 32)) & ((1u << w.bits) - 1);
        int64_t g = r * (w.cols / w.group_size) + c / w.group_size;
        return scalar_any(w.dtype, w.scales, g) * (float)q + scalar_any(w.dtype, w.biases, g);
    }
    default: { /* MXFP4 */
        uint8_t byte = ((const uint8_t *)w.w)[r * (w.cols / 2) + c / 2];
        float s = e8m0(((const uint8_t *)w.scales)[r * (w.cols / 32) + c / 32]);
        return e2m1((c & 1) ? byte >> 4 : byte & 15) * s;
    }
    }
}

/* ---- the streaming GEMV -------------------------------------------------- */

/* Integer path for affine 4/8-bit and MXFP4: unpacking codes to floats needs an
 * int-to-float conversion per code, a quarter-rate instruction that caps
 * such a kernel at about half the memory bandwidth. As the CPU does
 * (cpu/gemv_avx512.c), x is quantized per 32 columns (16 for 8-bit) in two
 * int8 levels: q1 = round(x / d), d = max|x| / 127, and q2 the residual at
 * d / 256, so x^ = (d / 256)(256 q1 + q2) is within 2^-16 of the block's
 * range (one level, 2^-8, missed transformers by 0.25 on a q4 llama's
 * logits). A step's contribution is s dl (256 dot(q, q1) + dot(q, q2)) +
 * b dl sum(256 q1 + q2), dl = d / 256: exactly dot(w, x^); the dot
 * products are dp4a, four code-by-activation products per instruction.
 * 4-bit codes are split into even (low nibble) and odd (high nibble)
 * elements and the activation is stored in that order, so codes are never
 * shuffled. MXFP4 codes become int8 2 * e2m1 through a table in registers
 * (mxfp4_values), in that same even/odd order, and take signed dp4a; a
 * step is one block, its scale half the E8M0 one. (The float path it
 * replaced read the value table from constant memory at a per-lane index,
 * which the hardware serializes: gpt-oss-20b's experts ran at a few % of
 * the bandwidth.) */

enum gemv_kind { GEMV_F32, GEMV_F16, GEMV_BF16, GEMV_Q4, GEMV_Q8, GEMV_MXFP4 };

/* Weight columns one lane covers per 16-byte step. */
template <int K> struct step_cols { static const int n = K == GEMV_F32 ? 4 : K == GEMV_F16 || K == GEMV_BF16 ? 8
                                                       : K == GEMV_Q8 ? 16 : 32; };
/* Rows a warp takes: more where a step carries many columns (x traffic). */
/* 4-bit rows a warp takes (measured: 2 and 8 rows were 3-7% slower) */
#define GEMV_Q4_ROWS 4
template <int K> struct rows_per_warp { static const int n = K == GEMV_Q4 || K == GEMV_MXFP4 ? GEMV_Q4_ROWS : 2; };

static bool integer_kind(int k) { return k == GEMV_Q4 || k == GEMV_Q8 || k == GEMV_MXFP4; }

__device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c)
{
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ int dp4a_ss(int a, int b, int c)
{
    int d;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* MXFP4 codes to int8 2 * e2m1 (0, +-1, +-2, +-3, +-4, +-6, +-8, +-12), a
 * word of 8 codes at a time: evens gets codes 0, 2, 4, 6 (the low nibbles,
 * the Q4 activation layout's order), odds 1, 3, 5, 7. The 16-entry table
 * is four registers read by byte permutes (a per-lane index into memory
 * would serialize the warp's distinct addresses): a nibble's low three bits
 * pick among the non-negative or the negative half, its top bit which. */
__device__ __forceinline__ void mxfp4_values(uint32_t w, int &evens, int &odds)
{
    const uint32_t pos_lo = 0x03020100u, pos_hi = 0x0c080604u; /* 0 1 2 3, 4 6 8 12 */
    const uint32_t neg_lo = 0xfdfeff00u, neg_hi = 0xf4f8fafcu; /* -0 -1 -2 -3, -4 -6 -8 -12 */
    const uint32_t idx = w & 0x77777777u, half = 0x32103210u | ((w & 0x88888888u) >> 1);
    uint32_t a = __byte_perm(__byte_perm(pos_lo, pos_hi, idx), __byte_perm(neg_lo, neg_hi, idx), half);
    uint32_t b = __byte_perm(__byte_perm(pos_lo, pos_hi, idx >> 16), __byte_perm(neg_lo, neg_hi, idx >> 16),
                             half >> 16);
    evens = (int)__byte_perm(a, b, 0x6420);
    odds = (int)__byte_perm(a, b, 0x7531);
}

__device__ __forceinline__ void x_slice(const float *x, int n, float *out)
{
    const float4 *x4 = (const float4 *)x;
#pragma unroll
    for (int i = 0; i < n / 4; i++) {
        float4 v = __ldg(x4 + i);
        out[4 * i] = v.x;
        out[4 * i + 1] = v.y;
        out[4 * i + 2] = v.z;
        out[4 * i + 3] = v.w;
    }
}

/* A step's contribution to a row's sum, spelled out operation by operation
 * (no contraction left to the compiler): the tensor-core kernel below
 * forms the same sums from the same integer dot products and must round
 * them alike. */
template <int K>
__device__ __forceinline__ float integer_step(float acc, float sc, float bi, float2 xs, int dot, int dot2)
{
    const float d = __int2float_rn(dot * 256 + dot2);
    if (K == GEMV_MXFP4)
        return __fmaf_rn(__fmul_rn(sc, xs.x), d, acc);
    return __fmaf_rn(__fmul_rn(sc, xs.x), d, __fmaf_rn(bi, xs.y, acc));
}

struct gemv_job_dev {
    const void *w, *scales, *biases;
    const void *const *pick_table; /* set: w, scales, biases are read there, at entry 3 * *pick */
    const int32_t *pick;
    int64_t pick_stride; /* row t of x takes pick[t * pick_stride] (each row its own launch, gemv_kernel's EACH) */
    const float *x;      /* float kinds */
    const int8_t *xq;    /* integer kinds: T rows of cols int8, level 1, then level 2
                          * (or quantize_32's tensor-core layout) */
    const float2 *xs;    /* and per block {dl, dl * sum(256 q1 + q2)}: [row of x][block], or
                          * [block][x_rows_alloc(T)] for the tensor-core kernel */
    float *y;
    const float *bias; /* the weight's out_bias, added before y's accumulation */
    int64_t rows, cols;
    int64_t rows_x; /* T: where level 2 of xq starts, in rows of cols */
    int ldx, ldy;
    bool accumulate; /* y += x W^T */
};

struct gemv_batch {
    gemv_job_dev job[EXO_CUDA_JOBS];
    int first_block[EXO_CUDA_JOBS + 1];
    int n;
    int group_size;
    int group_shift; /* log2(group_size): affine groups are a power of two wide */
    int k_split; /* warps of a block that share its rows, each a slice of the columns: 1, 2 or 4 */
    int k_shift; /* log2(k_split) */
    bool each_rows; /* every job's rows of x take experts of their own (pick_stride): gemv_kernel's EACH */
};

#define GEMV_WARPS 4
/* Steps of each row a lane has in flight, every kind (bench_cuda_matmul on
 * an H200: q4 48% of the copy bandwidth with two, 41% with four; bf16 93%
 * with two). 8-bit once took one (71% against 58% with two then); measured
 * again on 2026-12-04, two is faster there too: llama-3.1-8b q8 decode
 * 328.7-330.6 -> 336.6-339.7 tok/s, llama-3.2-1b q8 1135-1165 -> 1224-1233,
 * alternating in one run. */
#define GEMV_UNROLL 2

template <int K, int SDT>
__device__ __forceinline__ float float_step(uint4 wv, const float *xs)
{
    const uint32_t wd[4] = {wv.x, wv.y, wv.z, wv.w};
    float acc = 0.0f;
    if (K == GEMV_F32) {
#pragma unroll
        for (int i = 0; i < 4; i++)
            acc += __uint_as_float(wd[i]) * xs[i];
    } else if (K == GEMV_BF16) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            acc += bf16_bits(wd[i] & 0xffff) * xs[2 * i];
            acc += __uint_as_float(wd[i] & 0xffff0000u) * xs[2 * i + 1];
        }
    } else if (K == GEMV_F16) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 f = __half22float2(*(const __half2 *)&wd[i]);
            acc += f.x * xs[2 * i] + f.y * xs[2 * i + 1];
        }
    }
    return acc;
}

template <int ROWS, int T>
__device__ __forceinline__ void gemv_finish_each(float (&acc)[ROWS][T], int lane, int warp, int ks, int slice,
                                                 bool live, int64_t row0, const gemv_job_dev &job);

/* The end of a GEMV warp: its ROWS x T sums over the lanes, then over the
 * k_split warps sharing its rows (in slice order, through shared memory),
 * then y. Where ROWS x T is a power of two the values go down one
 * butterfly together: at each level a lane keeps half of them and sends
 * its partner the other half, so four rows take 6 shuffles, not 20, and
 * lanes 0, 8, 16 and 24 write a row each instead of lane 0 writing all
 * four in turn. Every sum pairs the same two operands as a butterfly of
 * each value alone would (a + b and b + a are the same float): the same
 * bits. */
template <int ROWS, int T>
__device__ __forceinline__ void gemv_finish(float (&acc)[ROWS][T], int lane, int warp, int ks, int slice, bool live,
                                            int64_t row0, const gemv_job_dev &job)
{
    constexpr int N = ROWS * T;
    if constexpr ((N & (N - 1)) == 0) {
        constexpr int LEFT = N > 32 ? N / 32 : 1; /* values a lane holds at the end */
        float v[N];
#pragma unroll
        for (int i = 0; i < N; i++)
            v[i] = acc[i / T][i % T];
        int idx = 0; /* the first of this lane's values */
        exo_cuda_butterfly<N, 16>(v, lane, idx);
        /* lanes that differ only in the bits no level split on hold the same values */
        const bool first = (lane & (32 / (N < 32 ? N : 32) - 1)) == 0;
        __shared__ float part[GEMV_WARPS][N];
        if (ks > 1) {
            if (first)
#pragma unroll
                for (int i = 0; i < LEFT; i++)
                    part[warp][idx + i] = v[i];
            __syncthreads();
            if (slice)
                return;
            if (first)
#pragma unroll
                for (int i = 0; i < LEFT; i++)
#pragma unroll
                    for (int k = 1; k < 4; k++) /* ks <= 4: unrolled, no loop */
                        if (k < ks)
                            v[i] += part[warp + k][idx + i];
        }
        if (first && live)
#pragma unroll
            for (int i = 0; i < LEFT; i++) {
                const int r = (idx + i) / T, t = (idx + i) % T;
                if (row0 + r < job.rows) {
                    float *y = job.y + (int64_t)t * job.ldy + row0 + r, s = v[i];
                    if (job.bias) /* as add_bias would add it to the product */
                        s += job.bias[row0 + r];
                    *y = job.accumulate ? *y + s : s;
                }
            }
    } else {
        gemv_finish_each<ROWS, T>(acc, lane, warp, ks, slice, live, row0, job);
    }
}

/* gemv_finish one value at a time (ROWS x T not a power of two: 3 rows of x). */
template <int ROWS, int T>
__device__ __forceinline__ void gemv_finish_each(float (&acc)[ROWS][T], int lane, int warp, int ks, int slice,
                                                 bool live, int64_t row0, const gemv_job_dev &job)
{
    __shared__ float part[GEMV_WARPS][ROWS][T];
#pragma unroll
    for (int r = 0; r < ROWS; r++)
#pragma unroll
        for (int t = 0; t < T; t++) {
            float v = acc[r][t];
#pragma unroll
            for (int o = 16; o; o >>= 1)
                v += __shfl_xor_sync(0xffffffffu, v, o);
            acc[r][t] = v;
            if (ks > 1 && lane == 0)
                part[warp][r][t] = v;
        }
    if (ks > 1) {
        __syncthreads();
        if (slice)
            return;
#pragma unroll
        for (int r = 0; r < ROWS; r++)
#pragma unroll
            for (int t = 0; t < T; t++)
#pragma unroll
                for (int k = 1; k < 4; k++) /* ks <= 4: unrolled, no loop */
                    if (k < ks)
                        acc[r][t] += part[warp + k][r][t];
    }
    if (lane == 0 && live)
#pragma unroll
        for (int r = 0; r < ROWS; r++)
#pragma unroll
            for (int t = 0; t < T; t++)
                if (row0 + r < job.rows) {
                    float *y = job.y + (int64_t)t * job.ldy + row0 + r, s = acc[r][t];
                    if (job.bias) /* as add_bias would add it to the product */
                        s += job.bias[row0 + r];
                    *y = job.accumulate ? *y + s : s;
                }
}

/* A block is GEMV_WARPS warps: GEMV_WARPS / k_split groups of ROWS rows,
 * each group's k_split warps taking interleaved runs of 32 * GEMV_UNROLL
 * steps of its rows and adding up in shared memory at the end. k_split is
 * picked so that a warp's share is about one run: then every warp issues
 * all its loads at once, however wide the rows (a 14336-wide down
 * projection as well as a 4096-wide q), and the grid has as many warps in
 * flight as the rows allow. The first run's weights (and scales) are
 * loaded before exo_cuda_wait_inputs: weights are never written, so these
 * loads overlap the kernels before this one. */
template <int K, int SDT, int ROWS, int T>
__device__ __forceinline__ void gemv_job_run(const gemv_batch &b, int64_t block, const gemv_job_dev &job)
{
    const void *wbase = job.w, *sbase = job.scales, *bbase = job.biases;
    if (job.pick) { /* an expert chosen by the kernel before this one */
        exo_cuda_wait_inputs();
        const void *const *e = job.pick_table + 3 * (int64_t)*job.pick;
        wbase = e[0];
        sbase = e[1];
        bbase = e[2];
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    /* shifts, not divisions: a division by a kernel argument is a few
     * dozen instructions, and a warp issues only some hundreds in all */
    const int ks = b.k_split, slice = warp & (ks - 1);
    const int64_t row0 =
        (block * (GEMV_WARPS >> b.k_shift) + (warp >> b.k_shift)) * ROWS;
    const bool live = row0 < job.rows;
    const int SC = step_cols<K>::n;
    const int64_t cols = job.cols, steps = cols / SC;
    const int64_t row_bytes = K == GEMV_F32 ? cols * 4 : K == GEMV_F16 || K == GEMV_BF16 ? cols * 2
                              : K == GEMV_Q8 ? cols : cols / 2;
    const int64_t groups = K == GEMV_MXFP4 ? cols >> 5 : (K == GEMV_Q4 || K == GEMV_Q8) ? cols >> b.group_shift : 0;
    const bool affine = K == GEMV_Q4 || K == GEMV_Q8;
    const bool integer = affine || K == GEMV_MXFP4;
    int64_t rowc[ROWS];
    const uint4 *wrow[ROWS];
    int first_group[ROWS]; /* integer kinds: where the rows' scales (and biases) start (fewer than 2^31) */
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        rowc[r] = row0 + r < job.rows ? row0 + r : job.rows - 1;
        wrow[r] = (const uint4 *)((const char *)wbase + rowc[r] * row_bytes);
        first_group[r] = (int)(rowc[r] * groups);
    }
    float acc[ROWS][T];
#pragma unroll
    for (int r = 0; r < ROWS; r++)
#pragma unroll
        for (int t = 0; t < T; t++)
            acc[r][t] = 0.0f;
    /* GEMV_UNROLL steps of every row in flight before the first is used */
    uint4 wvu[GEMV_UNROLL][ROWS];
    float sc[GEMV_UNROLL][ROWS], bi[GEMV_UNROLL][ROWS]; /* bi: affine only */
    const int64_t first = lane + (int64_t)32 * GEMV_UNROLL * slice, stride = (int64_t)32 * GEMV_UNROLL * ks;
    auto fetch = [&](int64_t s0) {
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            const int64_t s = s0 + 32 * u;
            const int g = (int)(((s < steps ? s : 0) * SC) >> b.group_shift); /* the step's group in its row */
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                wvu[u][r] = s < steps ? __ldcs(wrow[r] + s) : make_uint4(0, 0, 0, 0);
                if (affine) {
                    sc[u][r] = scalar_at<SDT>(sbase, first_group[r] + g);
                    bi[u][r] = scalar_at<SDT>(bbase, first_group[r] + g);
                } else if (K == GEMV_MXFP4) { /* the table holds 2 * e2m1: half the block's scale */
                    sc[u][r] = 0.5f * e8m0(((const uint8_t *)sbase)[first_group[r] + g]);
                }
            }
        }
    };
    if (live && first < steps)
        fetch(first);
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    for (int64_t s0 = first; live && s0 < steps; s0 += stride) {
        if (s0 != first)
            fetch(s0);
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
        const int64_t s = s0 + 32 * u;
        if (s >= steps)
            break;
        const uint4 *wv = wvu[u];
        const int64_t col = s * SC;
        if (integer) {
#pragma unroll
            for (int t = 0; t < T; t++) {
                const int8_t *xq = job.xq + (int64_t)t * cols + col, *xq2 = xq + job.rows_x * cols;
                const float2 xs = __ldg(job.xs + (((int64_t)t * cols + col) >> (K == GEMV_Q8 ? 4 : 5)));
                int xv[8], xv2[8];
                if (K != GEMV_Q8) {
                    int4 a = __ldg((const int4 *)xq), c = __ldg((const int4 *)xq + 1);
                    int4 a2 = __ldg((const int4 *)xq2), c2 = __ldg((const int4 *)xq2 + 1);
                    xv[0] = a.x; xv[1] = a.y; xv[2] = a.z; xv[3] = a.w;
                    xv[4] = c.x; xv[5] = c.y; xv[6] = c.z; xv[7] = c.w;
                    xv2[0] = a2.x; xv2[1] = a2.y; xv2[2] = a2.z; xv2[3] = a2.w;
                    xv2[4] = c2.x; xv2[5] = c2.y; xv2[6] = c2.z; xv2[7] = c2.w;
                } else {
                    int4 a = __ldg((const int4 *)xq), a2 = __ldg((const int4 *)xq2);
                    xv[0] = a.x; xv[1] = a.y; xv[2] = a.z; xv[3] = a.w;
                    xv2[0] = a2.x; xv2[1] = a2.y; xv2[2] = a2.z; xv2[3] = a2.w;
                }
#pragma unroll
                for (int r = 0; r < ROWS; r++) {
                    const uint32_t wd[4] = {wv[r].x, wv[r].y, wv[r].z, wv[r].w};
                    int dot = 0, dot2 = 0;
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        if (K == GEMV_Q4) {
                            uint32_t lo = wd[i] & 0x0f0f0f0fu, hi = (wd[i] >> 4) & 0x0f0f0f0fu;
                            dot = dp4a_us(lo, xv[2 * i], dot);
                            dot = dp4a_us(hi, xv[2 * i + 1], dot);
                            dot2 = dp4a_us(lo, xv2[2 * i], dot2);
                            dot2 = dp4a_us(hi, xv2[2 * i + 1], dot2);
                        } else if (K == GEMV_MXFP4) {
                            int ev, od;
                            mxfp4_values(wd[i], ev, od);
                            dot = dp4a_ss(ev, xv[2 * i], dot);
                            dot = dp4a_ss(od, xv[2 * i + 1], dot);
                            dot2 = dp4a_ss(ev, xv2[2 * i], dot2);
                            dot2 = dp4a_ss(od, xv2[2 * i + 1], dot2);
                        } else {
                            dot = dp4a_us(wd[i], xv[i], dot);
                            dot2 = dp4a_us(wd[i], xv2[i], dot2);
                        }
                    }
                    acc[r][t] = integer_step<K>(acc[r][t], sc[u][r], bi[u][r], xs, dot, dot2);
                }
            }
        } else {
#pragma unroll
            for (int t = 0; t < T; t++) {
                float xs[SC];
                x_slice(job.x + (int64_t)t * job.ldx + col, SC, xs);
#pragma unroll
                for (int r = 0; r < ROWS; r++)
                    acc[r][t] += float_step<K, SDT>(wv[r], xs);
            }
        }
        }
    }
    gemv_finish<ROWS, T>(acc, lane, warp, ks, slice, live, row0, job);
}

/* EACH: the job's rows of x each take their own expert (pick_stride), so
 * each is a product of its own, run as a launch of that row alone would run
 * it (the same bits), its quantized x read at row t of the rows quantized
 * together (quantize_32's dp4a layout). Its jobs (the k slots of a token's
 * experts) have one shape, and block (row-block, slot, row of x) is
 * ((row-block * n) + slot) * T + row: every row's every slot of one
 * row-block runs side by side, so rows that chose one expert read it while
 * L2 still holds it (16 rows of qwen3-30b-a3b's experts on an H100: 152.6 ->
 * 137.6 us) rather than T/2 waves of blocks apart, as a grid of (blocks, T)
 * would deal them. */
template <int K, int SDT, int ROWS, int T, bool EACH>
__global__ void __launch_bounds__(GEMV_WARPS * 32) gemv_kernel(const __grid_constant__ gemv_batch b)
{
    exo_cuda_start_next();
    if constexpr (EACH) {
        static_assert(T == 1, "a row a product");
        const int64_t rows_x = b.job[0].rows_x, t = blockIdx.x % rows_x, slots = blockIdx.x / rows_x;
        const int j = (int)(slots % b.n);
        gemv_job_dev job = b.job[j];
        job.pick += t * job.pick_stride;
        job.y += t * job.ldy;
        if constexpr (K == GEMV_Q4 || K == GEMV_Q8 || K == GEMV_MXFP4) {
            job.xq += t * job.cols;
            job.xs += (t * job.cols) >> (K == GEMV_Q8 ? 4 : 5);
        } else {
            job.x += t * job.ldx;
        }
        gemv_job_run<K, SDT, ROWS, T>(b, slots / b.n, job);
    } else {
        int j = 0;
        while (j + 1 < b.n && (int)blockIdx.x >= b.first_block[j + 1])
            j++;
        gemv_job_run<K, SDT, ROWS, T>(b, (int64_t)blockIdx.x - b.first_block[j], b.job[j]);
    }
}

/* One warp quantizes 32 columns of row t from c0, v being its lane's
 * value: xq in the order the kind reads it, xs[block] = {dx, dx * sum(xq)}
 * where a q8 "block" is 16 columns (one step). With xs_rows (the
 * tensor-core kernel's layout, rows of x padded to xs_rows) a block's rows
 * of x sit side by side, each as four pieces of its two levels, level 1
 * then level 2 (8 bytes each for 4-bit, 4 for 8-bit): the piece a lane of
 * a quad feeds to B, one load for both levels. */
template <bool Q4>
__device__ __forceinline__ void quantize_32(float v, int lane, int64_t t, int64_t c0, int64_t T, int64_t cols,
                                            int64_t xs_rows, int8_t *xq, float2 *xs)
{
    float amax = fabsf(v);
#pragma unroll
    for (int o = Q4 ? 16 : 8; o; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float dx = amax / 127.0f;
    int q = dx > 0 ? __float2int_rn(v * (127.0f / amax)) : 0;
    float r = v - (float)q * dx; /* |r| <= dx / 2: exact in f32 */
    int q2 = dx > 0 ? max(-127, min(127, __float2int_rn(r * (127.0f * 256.0f / amax)))) : 0;
    int sum = 256 * q + q2;
#pragma unroll
    for (int o = Q4 ? 16 : 8; o; o >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    int pos = lane;
    if (Q4) { /* word w = lane / 8 holds elements 8w..8w+7: evens, then odds */
        int w = lane / 8, e = lane % 8;
        pos = w * 8 + (e & 1) * 4 + (e >> 1);
    }
    const int64_t blk = Q4 ? c0 / 32 : (c0 + lane) / 16;
    if (xs_rows) {
        const int bytes = Q4 ? 32 : 16, piece = bytes / 4, at = Q4 ? pos : lane & 15;
        int8_t *row = xq + (blk * xs_rows + t) * 2 * bytes + (at / piece) * 2 * piece + at % piece;
        row[0] = (int8_t)q;
        row[piece] = (int8_t)q2;
    } else {
        xq[t * cols + c0 + pos] = (int8_t)q;
        xq[T * cols + t * cols + c0 + pos] = (int8_t)q2;
    }
    const int64_t sblk = xs_rows ? blk * xs_rows + t : t * (cols / (Q4 ? 32 : 16)) + blk;
    float dl = dx * (1.0f / 256.0f);
    if (Q4 ? lane == 0 : (lane & 15) == 0)
        xs[sblk] = make_float2(dl, dl * (float)sum);
}

/* The inputs of one GEMV launch that need quantizing, all of T rows of
 * cols: one kernel for all of them (the down projections of k experts
 * have k inputs; a launch each cost more than their quantization). */
struct quant_batch {
    const float *x[EXO_CUDA_JOBS];
    const float *u[EXO_CUDA_JOBS]; /* set: x' = act(x) * u (exo_cuda_glu) */
    int glu_kind[EXO_CUDA_JOBS];
    float glu_limit[EXO_CUDA_JOBS];
    int64_t ldx[EXO_CUDA_JOBS];
    int8_t *xq[EXO_CUDA_JOBS];
    float2 *xs[EXO_CUDA_JOBS];
    int n;
    int64_t T, cols;
    int64_t xs_rows; /* 0: the dp4a kernel's layout; else the tensor-core one, rows of x padded to this (quantize_32) */
};

/* Input blockIdx.y (T rows of cols at stride ldx, through the gated MLP's
 * activation where u is set) to int8 per block of 32 columns, one warp a
 * block. */
template <bool Q4>
__global__ void quantize_x_kernel(const __grid_constant__ quant_batch q)
{
    exo_cuda_start_next(); /* before the wait: the product after it starts loading its weights (cuda_internal.h) */
    exo_cuda_wait_inputs();
    const int i = blockIdx.y;
    int64_t blk = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x & 31;
    int64_t per_row = q.cols / 32;
    if (blk >= q.T * per_row)
        return;
    int64_t t = blk / per_row, c0 = (blk % per_row) * 32, at = t * q.ldx[i] + c0 + lane;
    float v = q.x[i][at];
    if (q.u[i])
        v = exo_cuda_glu(q.glu_kind[i], v, q.u[i][at], q.glu_limit[i]);
    quantize_32<Q4>(v, lane, t, c0, q.T, q.cols, q.xs_rows, q.xq[i], q.xs[i]);
}

/* The same of x / rms(x) * norm: the RMSNorm a product's input would
 * otherwise take a kernel and a trip through memory for, in the rmsnorm
 * op's arithmetic (backend_cuda.cu: EXO_CUDA_NORM_THREADS threads, each
 * summing every EXO_CUDA_NORM_THREADS-th square, then the same
 * reduction). Block (t, b) quantizes the b-th run of NORM_Q_THREADS
 * columns of row t, so each warp has one block of 32 and
 * the norm's weights load before the kernel waits for its input: the
 * blocks of a row each sum the whole row's squares (from L2), which is
 * quicker than one block quantizing the row in turns (6.6 us a call for
 * 4096 columns on an H200, each turn waiting on its loads). */
#define NORM_Q_THREADS EXO_CUDA_NORM_THREADS
template <bool Q4>
__global__ void __launch_bounds__(NORM_Q_THREADS)
norm_quantize_x_kernel(const float *x, const float *norm, float eps, int64_t T, int64_t cols, int64_t ldx,
                       int64_t xs_rows, int8_t *xq, float2 *xs)
{
    const int64_t t = blockIdx.x, c = (int64_t)blockIdx.y * NORM_Q_THREADS + threadIdx.x;
    exo_cuda_start_next(); /* before the wait, as quantize_x_kernel */
    const float nv = c < cols ? norm[c] : 0.0f; /* a weight: no kernel writes it */
    exo_cuda_wait_inputs();
    __shared__ float part[NORM_Q_THREADS / 32];
    const float *xr = x + t * ldx;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float ss = 0, mine = 0;
    for (int64_t i = threadIdx.x; i < cols; i += NORM_Q_THREADS) {
        float v = xr[i];
        if (i == c)
            mine = v;
        ss += v * v;
    }
#pragma unroll
    for (int o = 16; o; o >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0)
        part[warp] = ss;
    __syncthreads();
    ss = 0;
    for (int w = 0; w < NORM_Q_THREADS / 32; w++)
        ss += part[w];
    const float inv = 1.0f / sqrtf(ss / (float)cols + eps);
    const int64_t c0 = c - lane; /* cols is a multiple of 32: the warp's block is all in or all out */
    if (c0 < cols)
        quantize_32<Q4>(nv * (mine * inv), lane, t, c0, T, cols, xs_rows, xq, xs);
}

/* ---- several rows of x on the tensor cores -------------------------------- */

/* Batched decode (8 or 16 rows of x: a step of several sequences) of
 * affine 4- and 8-bit weights. The dp4a kernel's arithmetic grows with T
 * (each row of x is its own dp4a chain over every code), so at 8-16 rows
 * it is bound by issue, not by the weights (16 streams of llama-3.1-8b q4
 * ran at 2.4x one stream). Here a warp's integer dot products are mma.sync: 16 weight rows
 * (M) by 8 rows of x (N) by one activation block (K: m16n8k32 for 4-bit,
 * m16n8k16 for 8-bit), exact in s32 like dp4a's.
 *
 * The bits are those of each row of x alone in the dp4a kernel, so a
 * sequence decodes alike batched or not. That kernel's lane L sums the
 * steps s = L (mod 32) of its slice of the row (k_split warps take
 * interleaved runs of 32 * GEMV_UNROLL steps) with integer_step, in order;
 * the 32 lanes' sums meet in a butterfly (level 16 first), then the slices
 * in order. Here warp w of a block takes, for its 16 rows, the chunks of
 * four steps 32m + 4w .. 32m + 4w + 3 (lanes L = 4w .. 4w + 3) in the same
 * order, each with integer_step on the same integers, keeping a sum per
 * (L, row, row of x); a slice's sums go to shared memory, and a thread per
 * (row, row of x) adds them up in the butterfly's order, then the slices.
 *
 * Fragments: lane (g, q) loads 16 bytes (one step) of rows g and g + 8 of
 * the chunk's step q, so a row's chunk is 64 contiguous bytes; a 4 x 4
 * transpose within the quad (two rounds of shuffles) leaves it word q of
 * every step of the chunk; a step's scale and bias come from the quad's
 * lane that read them, by shuffles. mma's A then takes, for step j, word
 * q's low nibbles at K slots 4q .. 4q + 3 and its high nibbles at 16 + 4q ..
 * (rows g and g + 8); x's int8 order (evens, then odds, per word) puts
 * exactly those codes' activations at bytes 8q .. 8q + 7 of the block, B's
 * slots for column g. 8-bit: word q at slots 4q .. 4q + 3, activation
 * bytes 4q .. 4q + 3. Each level of x is its own mma; the lane gets C for
 * rows g, g + 8 and rows of x 2q, 2q + 1. x is quantized for this kernel
 * in a layout of its own (quantize_32's xs_rows): a lane's piece of both
 * levels is one load, a warp's B loads of a step 512 contiguous bytes
 * (read as x was for dp4a, B's loads were most of what held L1 busy), and
 * a step's scales of rows of x 2q and 2q + 1 are one 16-byte load. Rows of
 * x are computed in columns of 8; the padding's sums are never written.
 *
 * Tried on the way (bench_cuda_matmul, H100): the 8-byte B loads from x's
 * dp4a layout and every lane loading all four steps' scales: at 16 rows
 * 330 us a llama-3.1-8b q4 layer, slower than dp4a's 283 (L1 81% busy);
 * each warp's chunks prefetched into L2 up front: 162 against 149 us. */

#define TC_WARPS 8 /* a block: 16 weight rows, warp w the lanes 4w .. 4w + 3 of the dp4a kernel */

__device__ __forceinline__ void mma_k32(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint2 bx)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(bx.x), "r"(bx.y));
}

__device__ __forceinline__ void mma_k16(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t bx)
{
    asm("mma.sync.aligned.m16n8k16.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(bx));
}

/* Lane q of a quad holds words 0..3 of step q; afterwards word q of steps
 * 0..3. Two rounds: lanes d apart (2, then 1) swap the words whose index
 * differs from theirs in bit d. */
__device__ __forceinline__ void quad_transpose(uint4 &v, int q)
{
    uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int d = 2; d; d >>= 1) {
        const bool up = q & d;
#pragma unroll
        for (int p = 0; p < 2; p++) {
            const int low = d == 2 ? p : 2 * p; /* the pair's word without bit d */
            const uint32_t r = __shfl_xor_sync(0xffffffffu, up ? w[low] : w[low + d], d);
            if (up)
                w[low] = r;
            else
                w[low + d] = r;
        }
    }
    v = make_uint4(w[0], w[1], w[2], w[3]);
}

/* One chunk's loads: 16 bytes of rows g and g + 8 (step q of the chunk),
 * and that step's scales and biases of both rows (the quad's other lanes
 * read the chunk's other steps'). */
struct tc_chunk {
    uint4 a, b;
    float sa, ba, sb, bb;
};

/* Three blocks an SM at 8 rows of x (80 registers; 8b q4 layer 122 -> 118
 * us), two at 16, whose sums take another 16 registers. */
template <int K, int SDT, int NT>
__global__ void __launch_bounds__(TC_WARPS * 32, NT == 1 ? 3 : 2) gemv_tc_kernel(const __grid_constant__ gemv_batch b)
{
    constexpr bool Q8 = K == GEMV_Q8; /* else 4-bit */
    constexpr int SHIFT = Q8 ? 4 : 5; /* columns a step: 16 or 32 */
    constexpr int TP = 8 * NT;        /* rows of x a launch computes (T rounded up: x_rows_alloc) */
    exo_cuda_start_next();
    int j = 0;
    while (j + 1 < b.n && (int)blockIdx.x >= b.first_block[j + 1])
        j++;
    const gemv_job_dev &job = b.job[j];
    const void *wbase = job.w, *sbase = job.scales, *bbase = job.biases;
    if (job.pick) {
        exo_cuda_wait_inputs();
        const void *const *e = job.pick_table + 3 * (int64_t)*job.pick;
        wbase = e[0];
        sbase = e[1];
        bbase = e[2];
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int ks = b.k_split;
    const int64_t row0 = (int64_t)(blockIdx.x - b.first_block[j]) * 16;
    const int cols = (int)job.cols, steps = cols >> SHIFT;
    const int64_t row_bytes = Q8 ? cols : cols >> 1;
    const int groups = cols >> b.group_shift, ms = (steps + 31) >> 5;
    const int64_t ra = row0 + g < job.rows ? row0 + g : job.rows - 1;
    const int64_t rb = row0 + g + 8 < job.rows ? row0 + g + 8 : job.rows - 1;
    const uint4 *wa = (const uint4 *)((const char *)wbase + ra * row_bytes);
    const uint4 *wb = (const uint4 *)((const char *)wbase + rb * row_bytes);
    const int fga = (int)(ra * groups), fgb = (int)(rb * groups);
    const int gshift = b.group_shift - SHIFT; /* a step's group: a shift away */
    const int first = 4 * warp;               /* this warp's first step of each 32 */

    /* the i-th chunk of slice sig: m = GEMV_UNROLL (sig + ks k) + u, i = GEMV_UNROLL k + u */
    auto m_of = [&](int sig, int i) { return GEMV_UNROLL * (sig + ks * (i / GEMV_UNROLL)) + i % GEMV_UNROLL; };
    auto has = [&](int m) { return m < ms && 32 * m + first < steps; };
    auto fetch = [&](tc_chunk &c, int m) {
        const int s = 32 * m + first + q;
        const bool in = s < steps;
        c.a = in ? __ldcs(wa + s) : make_uint4(0, 0, 0, 0);
        c.b = in ? __ldcs(wb + s) : make_uint4(0, 0, 0, 0);
        const int grp = (in ? s : 0) >> gshift;
        c.sa = scalar_at<SDT>(sbase, fga + grp);
        c.ba = scalar_at<SDT>(bbase, fga + grp);
        c.sb = scalar_at<SDT>(sbase, fgb + grp);
        c.bb = scalar_at<SDT>(bbase, fgb + grp);
    };

    int nsig = 0, ni = 0; /* the next chunk to take */
    while (nsig < ks && !has(m_of(nsig, 0)))
        nsig++;
    tc_chunk nxt;
    if (nsig < ks)
        fetch(nxt, m_of(nsig, 0));
    exo_cuda_wait_inputs();
    exo_cuda_start_next();

    /* B's bytes for this lane: row of x g (+ 8 n), the piece of its slots, both levels (quantize_32) */
    constexpr int XB = Q8 ? 32 : 64; /* bytes of a block's row of x, both levels */
    const int8_t *xb = job.xq + g * XB + (XB / 4) * q;
    const float4 *xsl = (const float4 *)(job.xs + 2 * q); /* rows of x 2q, 2q + 1 of a step */
    __shared__ float part[32][16][TP];
    float total = 0.0f; /* thread (row, row of x)'s sum over the slices so far */
    for (int sig = 0; sig < ks; sig++) {
        float acc[4][NT][4] = {};
        while (nsig == sig) {
            tc_chunk cur = nxt;
            const int m = m_of(nsig, ni);
            ni++; /* the next chunk: this slice's next, or the first of a later slice */
            while (nsig < ks && !has(m_of(nsig, ni))) {
                nsig++;
                ni = 0;
            }
            if (nsig < ks)
                fetch(nxt, m_of(nsig, ni));
            quad_transpose(cur.a, q);
            quad_transpose(cur.b, q);
            const uint32_t wa4[4] = {cur.a.x, cur.a.y, cur.a.z, cur.a.w};
            const uint32_t wb4[4] = {cur.b.x, cur.b.y, cur.b.z, cur.b.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int s = 32 * m + first + i;
                if (s >= steps)
                    break;
                const int src = (lane & ~3) | i; /* the quad's lane that read step i's scales */
                const float sa = __shfl_sync(0xffffffffu, cur.sa, src), sb = __shfl_sync(0xffffffffu, cur.sb, src);
                const float ba = __shfl_sync(0xffffffffu, cur.ba, src), bb = __shfl_sync(0xffffffffu, cur.bb, src);
                uint32_t a0, a1, a2 = 0, a3 = 0;
                if (!Q8) {
                    a0 = wa4[i] & 0x0f0f0f0fu;
                    a1 = wb4[i] & 0x0f0f0f0fu;
                    a2 = (wa4[i] >> 4) & 0x0f0f0f0fu;
                    a3 = (wb4[i] >> 4) & 0x0f0f0f0fu;
                } else {
                    a0 = wa4[i];
                    a1 = wb4[i];
                }
                const int8_t *xbs = xb + (int64_t)s * TP * XB;
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    const int8_t *xp = xbs + 8 * n * XB;
                    int c1[4] = {0, 0, 0, 0}, c2[4] = {0, 0, 0, 0};
                    if (Q8) {
                        const uint2 v = __ldg((const uint2 *)xp);
                        mma_k16(c1, a0, a1, v.x);
                        mma_k16(c2, a0, a1, v.y);
                    } else {
                        const uint4 v = __ldg((const uint4 *)xp);
                        mma_k32(c1, a0, a1, a2, a3, make_uint2(v.x, v.y));
                        mma_k32(c2, a0, a1, a2, a3, make_uint2(v.z, v.w));
                    }
                    const float4 xs = __ldg(xsl + (s * TP + 8 * n) / 2);
                    const float2 x0 = make_float2(xs.x, xs.y), x1 = make_float2(xs.z, xs.w);
                    acc[i][n][0] = integer_step<K>(acc[i][n][0], sa, ba, x0, c1[0], c2[0]);
                    acc[i][n][1] = integer_step<K>(acc[i][n][1], sa, ba, x1, c1[1], c2[1]);
                    acc[i][n][2] = integer_step<K>(acc[i][n][2], sb, bb, x0, c1[2], c2[2]);
                    acc[i][n][3] = integer_step<K>(acc[i][n][3], sb, bb, x1, c1[3], c2[3]);
                }
            }
        }
        /* this slice's sums per dp4a lane, then the butterfly's order over the lanes */
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    part[first + i][g + 8 * (e >> 1)][8 * n + 2 * q + (e & 1)] = acc[i][n][e];
        __syncthreads();
        if (threadIdx.x < 16 * TP) {
            const int r = threadIdx.x / TP, t = threadIdx.x % TP;
            float v[16];
#pragma unroll
            for (int l = 0; l < 16; l++)
                v[l] = part[l][r][t] + part[l + 16][r][t];
#pragma unroll
            for (int l = 0; l < 8; l++)
                v[l] += v[l + 8];
#pragma unroll
            for (int l = 0; l < 4; l++)
                v[l] += v[l + 4];
            v[0] += v[2];
            v[1] += v[3];
            v[0] += v[1];
            total = sig ? total + v[0] : v[0];
        }
        __syncthreads();
    }
    if (threadIdx.x < 16 * TP) {
        const int r = threadIdx.x / TP, t = threadIdx.x % TP;
        const int64_t row = row0 + r;
        if (t < job.rows_x && row < job.rows) {
            float *y = job.y + (int64_t)t * job.ldy + row, s = total;
            if (job.bias) /* as add_bias would add it to the product */
                s += job.bias[row];
            *y = job.accumulate ? *y + s : s;
        }
    }
}

template <int K, int SDT, int T> static void launch_t(gemv_batch &b, int blocks, cudaStream_t s)
{
    exo_cuda_launch(gemv_kernel<K, SDT, rows_per_warp<K>::n, T, false>, blocks, GEMV_WARPS * 32, 0, s, b);
}

/* Widest launch of each kind (exo_cuda_gemv_width): the 4-bit dp4a kernels
 * run out of registers first (Q4 and MXFP4: 255 and spills at 16 rows,
 * where 16 streams of llama-3.1-8b q4 went from 1.81x one stream to 1.26x,
 * at 8 rows 1.88x); Q4 takes 16 rows on the tensor cores. */
static bool takes_tc(int kind, int T);
static int max_width_of(int kind)
{
    return kind == GEMV_MXFP4 || kind == GEMV_Q4 ? (takes_tc(kind, 16) ? 16 : 8) : 16;
}

template <int K, int SDT> static void launch_k(gemv_batch &b, int T, int blocks, cudaStream_t s)
{
    if (b.each_rows) { /* T rows, each its own expert: a one-row product each (gemv_kernel's EACH) */
        exo_cuda_launch(gemv_kernel<K, SDT, rows_per_warp<K>::n, 1, true>, dim3((unsigned)blocks * (unsigned)T),
                        GEMV_WARPS * 32, 0, s, b);
        return;
    }
    switch (T) {
    case 1: launch_t<K, SDT, 1>(b, blocks, s); break;
    case 2: launch_t<K, SDT, 2>(b, blocks, s); break;
    case 3: launch_t<K, SDT, 3>(b, blocks, s); break;
    case 4: launch_t<K, SDT, 4>(b, blocks, s); break;
    case 8: launch_t<K, SDT, 8>(b, blocks, s); break;
    default:
        if constexpr (K != GEMV_MXFP4 && K != GEMV_Q4)
            launch_t<K, SDT, 16>(b, blocks, s);
        break;
    }
}

/* Only affine weights have scales of their own type: the other kinds are
 * built once (a kernel per scale type would be three copies of one). */
template <int K> static void launch_sdt(gemv_batch &b, int sdt, int T, int blocks, cudaStream_t s)
{
    if constexpr (K != GEMV_Q4 && K != GEMV_Q8)
        launch_k<K, EXO_DTYPE_F32>(b, T, blocks, s);
    else if (sdt == EXO_DTYPE_BF16)
        launch_k<K, EXO_DTYPE_BF16>(b, T, blocks, s);
    else if (sdt == EXO_DTYPE_F16)
        launch_k<K, EXO_DTYPE_F16>(b, T, blocks, s);
    else
        launch_k<K, EXO_DTYPE_F32>(b, T, blocks, s);
}

/* Launches of 8 and 16 rows of x of affine 4-bit weights, and of 16 of
 * 8-bit, take the tensor-core kernel: where it was faster than dp4a's
 * chains on an H100 (bench_cuda_matmul, a llama-3.1-8b layer: q4 x8 123
 * against 144 us, x16 149 against 283; q8 x16 250 against 270; at 4 rows,
 * and q8 at 8, its fixed cost a chunk loses; MXFP4's gpt-oss-20b decoded
 * 16 streams 4-7% slower with it, its experts' launches being few rows).
 * EXO_CUDA_GEMV_TC=0 keeps every launch on dp4a, the peer it is measured
 * against. Decided once a process. */
static bool takes_tc(int kind, int T)
{
    static int on = -1;
    if (on < 0) {
        const char *env = getenv("EXO_CUDA_GEMV_TC");
        on = !(env && !strcmp(env, "0"));
    }
    return on && (kind == GEMV_Q8 ? T == 16 : kind == GEMV_Q4 && (T == 8 || T == 16));
}

template <int K, int SDT> static void launch_tc_t(gemv_batch &b, int T, int blocks, cudaStream_t s)
{
    if (T > 8)
        exo_cuda_launch(gemv_tc_kernel<K, SDT, 2>, blocks, TC_WARPS * 32, 0, s, b);
    else
        exo_cuda_launch(gemv_tc_kernel<K, SDT, 1>, blocks, TC_WARPS * 32, 0, s, b);
}

template <int K> static void launch_tc(gemv_batch &b, int sdt, int T, int blocks, cudaStream_t s)
{
    if (sdt == EXO_DTYPE_BF16)
        launch_tc_t<K, EXO_DTYPE_BF16>(b, T, blocks, s);
    else if (sdt == EXO_DTYPE_F16)
        launch_tc_t<K, EXO_DTYPE_F16>(b, T, blocks, s);
    else
        launch_tc_t<K, EXO_DTYPE_F32>(b, T, blocks, s);
}

static int kind_of(const exo_linear *w)
{
    if (w->format == EXO_WFORMAT_DENSE)
        return w->dtype == EXO_DTYPE_F32 ? GEMV_F32 : w->dtype == EXO_DTYPE_F16 ? GEMV_F16
               : w->dtype == EXO_DTYPE_BF16 ? GEMV_BF16 : -1;
    if (w->format == EXO_WFORMAT_MXFP4)
        return GEMV_MXFP4;
    if (w->bits == 4)
        return GEMV_Q4;
    if (w->bits == 8)
        return GEMV_Q8;
    return -1;
}

static int step_cols_of(int kind)
{
    static const int n[] = {4, 8, 8, 32, 16, 32};
    return n[kind];
}

static int rows_per_warp_of(int kind) { return kind == GEMV_Q4 || kind == GEMV_MXFP4 ? GEMV_Q4_ROWS : 2; }

/* Warps sharing rows: enough that each has about one run of
 * 32 * GEMV_UNROLL steps (see gemv_kernel). */
static int k_split_of(int kind, int64_t cols)
{
    int64_t run = 32 * GEMV_UNROLL, runs = (cols / step_cols_of(kind) + run - 1) / run;
    return runs >= 3 ? 4 : runs == 2 ? 2 : 1;
}

bool exo_cuda_gemv_quantizes(const exo_linear *w) { return integer_kind(kind_of(w)); }

int exo_cuda_gemv_width(const exo_linear *w, int T)
{
    if (w->pick && w->pick_stride) /* a one-row product a row (gemv_kernel's EACH): any count */
        return T < 1 ? 1 : T < EXO_CUDA_GEMV_MAX_T ? T : EXO_CUDA_GEMV_MAX_T;
    int kind = kind_of(w), most = kind < 0 ? 1 : max_width_of(kind);
    T = T < most ? T : most;
    return T >= 16 ? 16 : T >= 8 ? 8 : T >= 4 ? 4 : T < 1 ? 1 : T;
}

bool exo_cuda_gemv_takes(const exo_linear *w, const float *x, int ldx, int T)
{
    int kind = kind_of(w);
    if (kind < 0 || T < 1 || T != exo_cuda_gemv_width(w, T) || w->cols % step_cols_of(kind))
        return false;
    if (kind == GEMV_MXFP4) /* blocks of 32, one a step */
        return w->cols % 32 == 0 && w->rows * (w->cols / 32) < INT32_MAX;
    if (integer_kind(kind)) /* groups of 32, 64, 128, ...: a step's group is a shift away */
        return w->cols % 32 == 0 && w->group_size % 32 == 0 && !(w->group_size & (w->group_size - 1)) &&
               w->rows * (w->cols / w->group_size) < INT32_MAX; /* gemv_kernel's first_group */
    /* x is read as float4, the weight rows as 16-byte steps */
    return (uintptr_t)x % 16 == 0 && (T == 1 || ldx % 4 == 0);
}

/* Rows of x a quantized activation has room for: the tensor-core kernel
 * reads whole columns of 8 (rows past T hold whatever the scratch held:
 * their sums are never written). */
static int64_t x_rows_alloc(int64_t T) { return (T + 7) & ~(int64_t)7; }

/* Bytes of one quantized activation: T rows of int8, then per 16 columns
 * its {dx, dx sum} (q4 uses every other slot's worth). */
static size_t xq_codes_bytes(int64_t T, int64_t cols)
{
    return ((size_t)(2 * x_rows_alloc(T) * cols) + 255) / 256 * 256;
}
static size_t xq_bytes(int64_t T, int64_t cols)
{
    return xq_codes_bytes(T, cols) + (size_t)(x_rows_alloc(T) * cols / 16) * sizeof(float2) + 256;
}

size_t exo_cuda_gemv_scratch(int n, const exo_cuda_gemv_job *jobs, int T)
{
    size_t bytes = 0;
    for (int i = 0; i < n; i++)
        if (integer_kind(kind_of(&jobs[i].lin)))
            bytes += xq_bytes(T, jobs[i].lin.cols);
    return bytes;
}

/* Whether a job's rows of x each take an expert of their own. */
static bool each_row(const exo_cuda_gemv_job &job, int T) { return T > 1 && job.lin.pick && job.lin.pick_stride; }

int exo_cuda_gemv(cudaStream_t stream, int n, const exo_cuda_gemv_job *jobs, int T, void *scratch)
{
    /* each distinct (x, layout) is quantized once: the weights sharing an
     * x (q, k, v; gate, up) share its int8 copy */
    const float *qx[EXO_CUDA_JOBS * 4], *qnorm[EXO_CUDA_JOBS * 4], *qglu[EXO_CUDA_JOBS * 4];
    bool qlayout[EXO_CUDA_JOBS * 4], qtc[EXO_CUDA_JOBS * 4];
    char *qmem[EXO_CUDA_JOBS * 4];
    int nq = 0;
    char *free_at = (char *)scratch;
    for (int i0 = 0; i0 < n;) {
        /* one launch per run of weights of one kind, scale type and group */
        const exo_linear &w0 = jobs[i0].lin;
        int kind = kind_of(&w0);
        gemv_batch b;
        b.n = 0;
        quant_batch pend;
        pend.n = 0;
        pend.T = T;
        pend.cols = w0.cols;
        pend.xs_rows = 0;
        b.group_size = w0.format == EXO_WFORMAT_AFFINE ? w0.group_size : 32;
        b.group_shift = __builtin_ctz((unsigned)b.group_size);
        b.k_split = k_split_of(kind, w0.cols);
        b.k_shift = __builtin_ctz((unsigned)b.k_split);
        b.each_rows = each_row(jobs[i0], T);
        const bool tc = !b.each_rows && takes_tc(kind, T);
        if (tc)
            pend.xs_rows = x_rows_alloc(T);
        const int block_rows = tc ? 16 : rows_per_warp_of(kind) * GEMV_WARPS / b.k_split;
        int blocks = 0, i = i0;
        for (; i < n && b.n < EXO_CUDA_JOBS && nq < EXO_CUDA_JOBS * 4; i++) {
            const exo_cuda_gemv_job &src = jobs[i];
            const exo_linear &w = src.lin;
            if (kind_of(&w) != kind || w.dtype != w0.dtype || w.cols != w0.cols ||
                (w.format == EXO_WFORMAT_AFFINE && w.group_size != b.group_size) || each_row(src, T) != b.each_rows ||
                (b.each_rows && w.rows != w0.rows)) /* EACH deals blocks by row-block: one shape a launch */
                break;
            gemv_job_dev &d = b.job[b.n];
            d.w = w.w;
            d.scales = w.scales;
            d.biases = w.biases;
            d.pick_table = w.pick_table;
            d.pick = w.pick;
            d.pick_stride = w.pick_stride;
            d.x = src.x;
            d.ldx = src.ldx;
            d.y = src.y;
            d.bias = w.out_bias;
            d.ldy = src.ldy;
            d.rows = w.rows;
            d.cols = w.cols;
            d.rows_x = T;
            d.accumulate = src.accumulate;
            d.xq = NULL;
            d.xs = NULL;
            if (integer_kind(kind)) {
                bool q4 = kind != GEMV_Q8; /* MXFP4 takes the 4-bit activation layout */
                int k = 0;
                while (k < nq && !(qx[k] == src.x && qlayout[k] == q4 && qtc[k] == tc && qnorm[k] == src.fold.norm &&
                                   qglu[k] == src.fold.glu_u))
                    k++;
                if (k == nq) {
                    qx[nq] = src.x;
                    qlayout[nq] = q4;
                    qtc[nq] = tc;
                    qnorm[nq] = src.fold.norm;
                    qglu[nq] = src.fold.glu_u;
                    qmem[nq++] = free_at;
                    int8_t *xq = (int8_t *)free_at;
                    float2 *xs = (float2 *)(free_at + xq_codes_bytes(T, w.cols));
                    free_at += xq_bytes(T, w.cols);
                    if (src.fold.norm) {
                        exo_cuda_launch(q4 ? norm_quantize_x_kernel<true> : norm_quantize_x_kernel<false>,
                                        dim3((unsigned)T, (unsigned)((w.cols + NORM_Q_THREADS - 1) / NORM_Q_THREADS)),
                                        dim3(NORM_Q_THREADS), 0, stream, src.x, src.fold.norm, src.fold.eps,
                                        (int64_t)T, (int64_t)w.cols, (int64_t)src.ldx, pend.xs_rows, xq, xs);
                    } else {
                        pend.x[pend.n] = src.x;
                        pend.u[pend.n] = src.fold.glu_u;
                        pend.glu_kind[pend.n] = src.fold.glu_kind;
                        pend.glu_limit[pend.n] = src.fold.glu_limit;
                        pend.ldx[pend.n] = src.ldx;
                        pend.xq[pend.n] = xq;
                        pend.xs[pend.n++] = xs;
                    }
                }
                d.xq = (const int8_t *)qmem[k];
                d.xs = (const float2 *)(qmem[k] + xq_codes_bytes(T, w.cols));
            }
            b.first_block[b.n++] = blocks;
            blocks += (int)((w.rows + block_rows - 1) / block_rows);
        }
        b.first_block[b.n] = blocks;
        if (pend.n) {
            dim3 grid((unsigned)(((int64_t)T * w0.cols + 255) / 256), (unsigned)pend.n);
            exo_cuda_launch(kind != GEMV_Q8 ? quantize_x_kernel<true> : quantize_x_kernel<false>, grid, dim3(256), 0,
                            stream, pend);
        }
        switch (kind) {
        case GEMV_F32: launch_sdt<GEMV_F32>(b, EXO_DTYPE_F32, T, blocks, stream); break;
        case GEMV_F16: launch_sdt<GEMV_F16>(b, EXO_DTYPE_F32, T, blocks, stream); break;
        case GEMV_BF16: launch_sdt<GEMV_BF16>(b, EXO_DTYPE_F32, T, blocks, stream); break;
        case GEMV_Q4:
            if (tc)
                launch_tc<GEMV_Q4>(b, w0.dtype, T, blocks, stream);
            else
                launch_sdt<GEMV_Q4>(b, w0.dtype, T, blocks, stream);
            break;
        case GEMV_Q8:
            if (tc)
                launch_tc<GEMV_Q8>(b, w0.dtype, T, blocks, stream);
            else
                launch_sdt<GEMV_Q8>(b, w0.dtype, T, blocks, stream);
            break;
        default: launch_sdt<GEMV_MXFP4>(b, EXO_DTYPE_F32, T, blocks, stream); break;
        }
        int rc = exo_cuda_launched("gemv");
        if (rc)
            return rc;
        i0 = i;
    }
    return 0;
}

/* ---- any format at decode --------------------------------------------------- */

/* Weights the streaming GEMV does not take (2/3/5/6-bit codes, odd widths):
 * one warp a row, every element decoded on its own, f32 throughout. Slow,
 * but as exact as the fast path, where tensor cores would round both
 * sides to bf16. */
template <int T>
__global__ void gemv_any_kernel(exo_linear w, const float *x, int64_t ldx, float *y, int64_t ldy, bool accumulate)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    int64_t row = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (row >= w.rows)
        return;
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; t++)
        acc[t] = 0.0f;
    for (int64_t c = lane; c < w.cols; c += 32) {
        float v = weight_at(w, row, c);
#pragma unroll
        for (int t = 0; t < T; t++)
            acc[t] += v * x[t * ldx + c];
    }
#pragma unroll
    for (int t = 0; t < T; t++) {
        float v = acc[t];
        for (int o = 16; o; o >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0)
            y[t * ldy + row] = accumulate ? y[t * ldy + row] + v : v;
    }
}

int exo_cuda_gemv_any(cudaStream_t s, const exo_linear *w, const float *x, int ldx, int T, float *y, int ldy,
                      bool accumulate)
{
    unsigned blocks = (unsigned)((w->rows + 7) / 8);
    switch (T) {
    case 1: exo_cuda_launch(gemv_any_kernel<1>, dim3(blocks), dim3(256), 0, s, *w, x, ldx, y, ldy, accumulate); break;
    case 2: exo_cuda_launch(gemv_any_kernel<2>, dim3(blocks), dim3(256), 0, s, *w, x, ldx, y, ldy, accumulate); break;
    case 3: exo_cuda_launch(gemv_any_kernel<3>, dim3(blocks), dim3(256), 0, s, *w, x, ldx, y, ldy, accumulate); break;
    default: exo_cuda_launch(gemv_any_kernel<4>, dim3(blocks), dim3(256), 0, s, *w, x, ldx, y, ldy, accumulate); break;
    }
    return exo_cuda_launched("gemv (any format)");
}

/* ---- dequantization and conversions for the tensor-core path ------------- */

__global__ void dequant_bf16_kernel(exo_linear w, __nv_bfloat16 *out)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    int64_t n = w.rows * w.cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16(weight_at(w, i / w.cols, i % w.cols));
}

/* 8 codes (one word) of 4-bit affine per thread: the common prefill case. */
template <int SDT> __global__ void dequant_q4_bf16_kernel(exo_linear w, __nv_bfloat16 *out)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    int64_t words = w.rows * w.cols / 8, per_row = w.cols / 8;
    const uint32_t *q = (const uint32_t *)w.w;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < words; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / per_row, c = (i % per_row) * 8, g = r * (w.cols / w.group_size) + c / w.group_size;
        float s = scalar_at<SDT>(w.scales, g), bias = scalar_at<SDT>(w.biases, g);
        uint32_t v = q[i];
        __align__(16) __nv_bfloat16 o[8];
#pragma unroll
        for (int j = 0; j < 8; j++)
            o[j] = __float2bfloat16(s * (float)((v >> (4 * j)) & 15) + bias);
        *(uint4 *)(out + r * w.cols + c) = *(const uint4 *)o;
    }
}

__global__ void f32_to_bf16_kernel(const float *x, int64_t rows, int64_t cols, int64_t ldx, __nv_bfloat16 *out)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    int64_t n = rows * cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16(x[(i / cols) * ldx + i % cols]);
}

__global__ void f32_to_f16_kernel(const float *x, int64_t rows, int64_t cols, int64_t ldx, __half *out)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    int64_t n = rows * cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __float2half(x[(i / cols) * ldx + i % cols]);
}

int exo_cuda_dequant_bf16(cudaStream_t s, const exo_linear *w, void *out)
{
    if (w->format == EXO_WFORMAT_AFFINE && w->bits == 4 && w->cols % 8 == 0 && w->group_size % 8 == 0) {
        unsigned g = exo_cuda_blocks((size_t)(w->rows * w->cols / 8), 256);
        __nv_bfloat16 *o = (__nv_bfloat16 *)out;
        if (w->dtype == EXO_DTYPE_BF16)
            exo_cuda_launch(dequant_q4_bf16_kernel<EXO_DTYPE_BF16>, dim3(g), dim3(256), 0, s, *w, o);
        else if (w->dtype == EXO_DTYPE_F16)
            exo_cuda_launch(dequant_q4_bf16_kernel<EXO_DTYPE_F16>, dim3(g), dim3(256), 0, s, *w, o);
        else
            exo_cuda_launch(dequant_q4_bf16_kernel<EXO_DTYPE_F32>, dim3(g), dim3(256), 0, s, *w, o);
    } else {
        exo_cuda_launch(dequant_bf16_kernel, dim3(exo_cuda_blocks((size_t)(w->rows * w->cols), 256)), dim3(256), 0, s, *w,
                                                                                         (__nv_bfloat16 *)out);
    }
    return exo_cuda_launched("dequantize");
}

int exo_cuda_to_half(cudaStream_t s, const float *x, int64_t rows, int64_t cols, int64_t ldx, bool bf16, void *out)
{
    unsigned g = exo_cuda_blocks((size_t)(rows * cols), 256);
    if (bf16)
        exo_cuda_launch(f32_to_bf16_kernel, dim3(g), dim3(256), 0, s, x, rows, cols, ldx, (__nv_bfloat16 *)out);
    else
        exo_cuda_launch(f32_to_f16_kernel, dim3(g), dim3(256), 0, s, x, rows, cols, ldx, (__half *)out);
    return exo_cuda_launched("convert");
}

/* ---- embedding rows -------------------------------------------------------- */

__global__ void embed_kernel(exo_linear table, const int32_t *tokens, float *out)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    int t = blockIdx.y;
    int64_t r = tokens[t];
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < table.cols;
         c += (int64_t)gridDim.x * blockDim.x)
        out[(int64_t)t * table.cols + c] = weight_at(table, r, c);
}

int exo_cuda_embed(cudaStream_t s, const exo_linear *table, const int32_t *tokens, int T, float *out)
{
    dim3 grid((unsigned)((table->cols + 255) / 256), (unsigned)T);
    exo_cuda_launch(embed_kernel, dim3(grid), dim3(256), 0, s, *table, tokens, out);
    return exo_cuda_launched("embed");
}
