/* Causal softmax attention over the KV cache on the GPU.
 *
 * The cache of a layer is (slots, n_kv_heads, head_dim) f32 or bf16 for K
 * and V (backend_cuda.cu), in one run or in pages of 2^k slots through the
 * sequence's page table (backend.h exo_kv_view: a slot's row is then one
 * table load away); a sliding layer's is a ring, position p in slot
 * p % ring. The call's own keys and values are read from its inputs, not
 * the cache, while one block per (KV head, token) writes them into it: no
 * second kernel, and no block reads a slot another is writing (a ring
 * holds the window plus a call's tokens, so the slots written hold
 * positions no query of the call can see). A bf16 cache holds keys and
 * values rounded to nearest even as they are written, and a call rounds
 * its own keys and values the same way as it reads them from its inputs,
 * so a position scores alike whichever call reads it (and as the CPU's
 * bf16 cache, which attends to what it has just appended); the scores,
 * softmax and sums stay f32. Every kernel is built for each cache type
 * (HALF), so an f32 cache's code is what it was before bf16 ones; a
 * kv_row says what a row is (f32 or bf16 in the cache, or the call's
 * input, rounded or not), and the decode kernel keeps the call's own row,
 * rounded, in shared memory, so its rounds load one kind of row.
 *
 * One block of 128 threads per (query head, token, split): a thread scores
 * one key of each run of 128 (q from shared memory, the key row from L2),
 * the block keeps a running max and sum (online softmax), and each warp
 * accumulates the weighted values of a quarter of the run's positions, a
 * lane owning every 32nd dim (a value row is read by one warp, coalesced;
 * four rows in flight per block), the warps' sums added at the end. Decode has one
 * token and few heads, too few blocks to keep the GPU's memory busy on a
 * long context, so the positions are split over blocks (flash-decoding):
 * each split writes its max, sum and unnormalised output, and a second
 * kernel combines them, adding the sinks' share of the denominator
 * (gpt-oss). A prompt has blocks enough, and takes one split.
 *
 * A prompt of at least TILE_MIN_T tokens with head_dim 64, 128 or 256
 * takes attention_tile_kernel instead (flash attention in tiles: a block's
 * query rows share each tile of keys and values it loads; below).
 *
 * A decode step (one token) whose KV groups are small enough takes
 * attention_decode_kernel instead: one block per (KV head, split) serves
 * every query head of the group, so each key and value row is read once,
 * by one warp, coalesced (a lane holds head_dim / 32 of its dims); the
 * block's 8 warps take interleaved positions with their own running max
 * and sum per head and merge in shared memory at the end. Its splits
 * combine themselves: the last block of a KV head to finish (a counter
 * per KV head) reads the others' partials, so a token's attention is one
 * kernel, and each warp loads a round of positions before it uses any, so
 * it waits on memory once a round. The kernel is bound by the length of
 * each warp's instruction stream, not by memory (Nsight on an H200: ~1430
 * instructions a warp at 9 cycles each, DRAM nearly idle), so a round's
 * scores go down one transposing butterfly together and its softmax is
 * updated once, in log2 units (one ex2 an exponential). Given the
 * layer's rotation (exo_attn_rope), it norms and rotates the group's
 * queries and the new key itself (a warp a head, before its first
 * round), sparing the chain the q/k rotation kernel (2-3 us of a 1B
 * layer's ~35 us on an H200; docs/PERFORMANCE.md). A trace of
 * llama-3.1-8b q4 decode on an H200 at ~600 positions
 * (tools/cuda_kernel_trace.c) had attention and its combine at 8.2 + 8.7
 * us of a 70 us layer before, waiting on one position's load at a time
 * and on the combine's 3 x 33 loads in turn. */
#include "engine/cuda/cuda_internal.h"

#include <cuda_bf16.h>
#include <type_traits>

#define ATT_THREADS 128
#define ATT_WARPS (ATT_THREADS / 32)
#define ATT_MAX_DIMS 32 /* head_dim <= 32 * ATT_MAX_DIMS = 1024: a lane's dims */
#define ATT_MAX_SPLITS 64

struct att_args {
    const float *q, *kin, *vin, *sinks;
    char *kc, *vc;                /* one run of slots (pages NULL) */
    char *const *pages;           /* else the page table: run i at pages[i] + koff, + voff values */
    size_t koff, voff;
    bool half;                    /* the cache is bf16 (else f32) */
    int page_shift;               /* a run is 1 << page_shift slots */
    float *out, *partial;
    const int *pos_dev; /* a recorded step's position, read at run time; else pos0 */
    int n_heads, n_kv, hd, window, ring, pos0, per_split, n_split;
    int n_tokens;       /* the call's T */
    bool dynamic;       /* one token: splits planned for the cache, sized by the position */
    float scale;
    /* the decode kernel's own rotation (exo_attn_rope; rope_freq NULL: none) */
    const float *rope_freq, *q_norm, *k_norm;
    float mscale, eps;
    int rope_half;
};

/* Positions a split takes. A one-token step's grid is planned for the
 * whole cache (a recorded one replays at later positions), but the split
 * length follows the positions there are now (at least `least`, a
 * multiple of `unit`), so that a short context still spreads over many
 * blocks; the splits past the end are empty. Recorded or not, a token is
 * split alike, so its sums add up in the same order. */
__device__ __forceinline__ int split_len(const att_args &a, int span, int least, int unit)
{
    if (!a.dynamic)
        return a.per_split;
    int per = (span + a.n_split - 1) / a.n_split;
    per = per < least ? least : per;
    return (per + unit - 1) / unit * unit;
}

/* Max and sum over groups of `lanes` lanes (a power of two up to 32): the
 * whole warp, or the half-warp of a tile row. */
__device__ __forceinline__ float warp_max(float v, int lanes = 32)
{
    for (int o = lanes / 2; o; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v, int lanes = 32)
{
    for (int o = lanes / 2; o; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* 2^x, flushing denormals (the decode kernel's scores are in log2 units):
 * one instruction, where __expf adds a multiply and a denormal fix-up. */
#define LOG2E 1.4426950408889634f
__device__ __forceinline__ float exp2_ftz(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* Where a row of keys or values is read from: the cache (f32 or bf16), or
 * the call's own input (f32), rounded to bf16 on the way where the cache
 * is bf16. */
enum { KV_F32, KV_BF16, KV_ROUNDED };
struct kv_row {
    const char *p;
    int kind;
    __device__ __forceinline__ kv_row at(int elems) const
    {
        return {p + (size_t)elems * (kind == KV_BF16 ? 2 : 4), kind};
    }
};

__device__ __forceinline__ float bf16_round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

/* N consecutive values of a row from element i (N of 1, 2 or 4, i a
 * multiple of N), through the read-only path unless GENERIC (a row in
 * shared memory), of bf16 where BF16 says so at compile time. */
template <int N, bool GENERIC = false, bool BF16 = false>
__device__ __forceinline__ void kv_load(const kv_row &r, int i, float *out)
{
    if (BF16 || r.kind == KV_BF16) {
        const uint16_t *h = (const uint16_t *)r.p + i;
        if constexpr (N == 1) {
            out[0] = bf16_lo(GENERIC ? *h : __ldg(h));
        } else if constexpr (N == 2) {
            const uint32_t w = GENERIC ? *(const uint32_t *)h : __ldg((const uint32_t *)h);
            out[0] = bf16_lo(w);
            out[1] = bf16_hi(w);
        } else {
            const uint2 w = GENERIC ? *(const uint2 *)h : __ldg((const uint2 *)h);
            out[0] = bf16_lo(w.x);
            out[1] = bf16_hi(w.x);
            out[2] = bf16_lo(w.y);
            out[3] = bf16_hi(w.y);
        }
        return;
    }
    const float *f = (const float *)r.p + i;
    if constexpr (N == 1) {
        out[0] = GENERIC ? *f : __ldg(f);
    } else if constexpr (N == 2) {
        const float2 v = GENERIC ? *(const float2 *)f : __ldg((const float2 *)f);
        out[0] = v.x;
        out[1] = v.y;
    } else {
        const float4 v = GENERIC ? *(const float4 *)f : __ldg((const float4 *)f);
        out[0] = v.x;
        out[1] = v.y;
        out[2] = v.z;
        out[3] = v.w;
    }
    if (r.kind == KV_ROUNDED)
#pragma unroll
        for (int n = 0; n < N; n++)
            out[n] = bf16_round(out[n]);
}

/* Element d of a cache row (f32, or bf16 rounded to nearest even). */
__device__ __forceinline__ void kv_store(char *row, int d, float v, bool half)
{
    if (half)
        ((__nv_bfloat16 *)row)[d] = __float2bfloat16_rn(v);
    else
        ((float *)row)[d] = v;
}

/* Slot s's row of keys (value false) or values, every KV head's, in a
 * cache of bf16 (HALF: the kernels are built for each type, so an f32
 * cache's loads are what they were before bf16 caches) or f32. */
template <bool HALF>
__device__ __forceinline__ char *cache_row(const att_args &a, int s, bool value, size_t row_stride)
{
    const int shift = HALF ? 1 : 2; /* log2 of a value's bytes */
    if (!a.pages)
        return (value ? a.vc : a.kc) + ((size_t)s * row_stride << shift);
    const int mask = (1 << a.page_shift) - 1;
    return a.pages[s >> a.page_shift] + (((value ? a.voff : a.koff) + (size_t)(s & mask) * row_stride) << shift);
}

/* KV head kvh's part of slot s's row. */
template <bool HALF>
__device__ __forceinline__ char *cache_head(const att_args &a, int s, bool value, size_t row_stride, int kvh)
{
    return cache_row<HALF>(a, s, value, row_stride) + ((size_t)kvh * a.hd << (HALF ? 1 : 2));
}

/* Position j's key (or value) row of KV head kvh: from the call's input
 * when the call appends it, else from the cache. */
template <bool HALF>
__device__ __forceinline__ kv_row key_row(const att_args &a, int pos0, int j, int kvh, size_t row_stride,
                                          const float *in, bool value)
{
    if (j >= pos0)
        return {(const char *)(in + ((size_t)(j - pos0) * a.n_kv + kvh) * a.hd), HALF ? KV_ROUNDED : KV_F32};
    return {cache_head<HALF>(a, a.ring ? j % a.ring : j, value, row_stride, kvh), HALF ? KV_BF16 : KV_F32};
}

template <bool HALF>
__global__ void __launch_bounds__(ATT_THREADS) attention_kernel(const __grid_constant__ att_args a)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    extern __shared__ float smem[]; /* q (hd), p (ATT_THREADS), the warps' outputs (ATT_WARPS * hd) */
    __shared__ float red[2][ATT_THREADS / 32];
    float *qs = smem, *ps = smem + a.hd;
    const int h = blockIdx.x, t = blockIdx.y, sp = blockIdx.z, tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int pos0 = a.pos_dev ? *a.pos_dev : a.pos0;
    const int kvh = h / (a.n_heads / a.n_kv), qpos = pos0 + t;
    const int lo = a.window > 0 && qpos - a.window + 1 > 0 ? qpos - a.window + 1 : 0;
    const int per = split_len(a, pos0 + (int)gridDim.y - lo, 32, 32);
    const int start = lo + sp * per, end = min(qpos + 1, start + per);
    const float *qrow = a.q + ((size_t)t * a.n_heads + h) * a.hd;
    for (int d = tid; d < a.hd; d += ATT_THREADS)
        qs[d] = qrow[d] * a.scale;
    if (sp == 0 && h % (a.n_heads / a.n_kv) == 0) { /* this token's key and value into the cache */
        int slot = a.ring ? qpos % a.ring : qpos;
        const size_t in = ((size_t)t * a.n_kv + kvh) * a.hd, rs = (size_t)a.n_kv * a.hd;
        char *kc = cache_head<HALF>(a, slot, false, rs, kvh), *vc = cache_head<HALF>(a, slot, true, rs, kvh);
        for (int d = tid; d < a.hd; d += ATT_THREADS) {
            kv_store(kc, d, a.kin[in + d], HALF);
            kv_store(vc, d, a.vin[in + d], HALF);
        }
    }
    __syncthreads();
    float m = -INFINITY, l = 0.0f, acc[ATT_MAX_DIMS];
#pragma unroll
    for (int i = 0; i < ATT_MAX_DIMS; i++)
        acc[i] = 0.0f;
    const size_t row_stride = (size_t)a.n_kv * a.hd;
    for (int base = start; base < end; base += ATT_THREADS) {
        int j = base + tid;
        float s = -INFINITY;
        if (j < end) {
            const kv_row kr = key_row<HALF>(a, pos0, j, kvh, row_stride, a.kin, false);
            const float4 *q4 = (const float4 *)qs;
            float dot = 0.0f;
#pragma unroll 8
            for (int d = 0; d < a.hd / 4; d++) {
                float kv[4];
                kv_load<4>(kr, 4 * d, kv);
                const float4 qv = q4[d];
                dot += kv[0] * qv.x + kv[1] * qv.y + kv[2] * qv.z + kv[3] * qv.w;
            }
            s = dot;
        }
        float cmax = warp_max(s);
        if (lane == 0)
            red[0][warp] = cmax;
        __syncthreads();
        for (int w = 0; w < ATT_THREADS / 32; w++)
            cmax = fmaxf(cmax, red[0][w]);
        const float mnew = fmaxf(m, cmax);
        const float p = j < end ? __expf(s - mnew) : 0.0f;
        ps[tid] = p;
        float csum = warp_sum(p);
        if (lane == 0)
            red[1][warp] = csum;
        __syncthreads();
        csum = 0.0f;
        for (int w = 0; w < ATT_THREADS / 32; w++)
            csum += red[1][w];
        const float corr = m == -INFINITY ? 0.0f : __expf(m - mnew);
        l = l * corr + csum;
        m = mnew;
        const int n = min(ATT_THREADS, end - base);
#pragma unroll
        for (int i = 0; i < ATT_MAX_DIMS; i++)
            acc[i] *= corr;
#pragma unroll 2
        for (int jj = warp; jj < n; jj += ATT_WARPS) {
            const float pj = ps[jj];
            const kv_row vr = key_row<HALF>(a, pos0, base + jj, kvh, row_stride, a.vin, true);
#pragma unroll
            for (int i = 0; i < ATT_MAX_DIMS; i++) {
                int d = lane + i * 32;
                if (d < a.hd) {
                    float v;
                    kv_load<1>(vr, d, &v);
                    acc[i] += pj * v;
                }
            }
        }
        __syncthreads(); /* ps and red are rewritten by the next run */
    }
    /* the warps' partial outputs, summed into the first hd floats of wsum */
    float *wsum = ps + ATT_THREADS;
#pragma unroll
    for (int i = 0; i < ATT_MAX_DIMS; i++) {
        int d = lane + i * 32;
        if (d < a.hd)
            wsum[warp * a.hd + d] = acc[i];
    }
    __syncthreads();
    for (int d = tid; d < a.hd; d += ATT_THREADS) {
        float s = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            s += wsum[w * a.hd + d];
        wsum[d] = s;
    }
    __syncthreads();
    if (a.n_split == 1) {
        if (a.sinks)
            l += __expf(a.sinks[h] - m);
        float *orow = a.out + ((size_t)t * a.n_heads + h) * a.hd;
        for (int d = tid; d < a.hd; d += ATT_THREADS)
            orow[d] = l > 0 ? wsum[d] / l : 0.0f;
        return;
    }
    float *part = a.partial + (((size_t)t * a.n_heads + h) * a.n_split + sp) * (size_t)(a.hd + 2);
    if (tid == 0) {
        part[0] = m;
        part[1] = l;
    }
    for (int d = tid; d < a.hd; d += ATT_THREADS)
        part[2 + d] = wsum[d];
}

/* Query head h of token t: its splits' (max, sum, output) combined. */
__device__ __forceinline__ void combine_splits(const att_args &a, int h, int t)
{
    const float *part = a.partial + ((size_t)t * a.n_heads + h) * a.n_split * (size_t)(a.hd + 2);
    float M = -INFINITY;
    for (int s = 0; s < a.n_split; s++)
        M = fmaxf(M, part[s * (a.hd + 2)]);
    float L = 0.0f;
    for (int s = 0; s < a.n_split; s++) {
        float ms = part[s * (a.hd + 2)];
        L += ms == -INFINITY ? 0.0f : part[s * (a.hd + 2) + 1] * __expf(ms - M);
    }
    if (a.sinks)
        L += __expf(a.sinks[h] - M);
    float *orow = a.out + ((size_t)t * a.n_heads + h) * a.hd;
    for (int d = threadIdx.x; d < a.hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < a.n_split; s++) {
            float ms = part[s * (a.hd + 2)];
            if (ms != -INFINITY)
                acc += part[s * (a.hd + 2) + 2 + d] * __expf(ms - M);
        }
        orow[d] = L > 0 ? acc / L : 0.0f;
    }
}

__global__ void attention_combine_kernel(const __grid_constant__ att_args a)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    combine_splits(a, blockIdx.x, blockIdx.y);
}

/* Up to ATT_ROWS_MAX sequences of one token each, in one launch
 * (exo_cuda_attention_rows): blockIdx.z picks the sequence. */
#define ATT_ROWS_MAX 16
struct att_rows {
    att_args a[ATT_ROWS_MAX];
};

/* The decode kernel: head_dim 64, 128 or 256, and a KV group's query
 * heads times head_dim at most 1024 (what a lane keeps in registers). */
#define DEC_WARPS 8
#define DEC_GROUP_DIMS 1024

static bool decode_kernel_takes(const exo_attn_shape *sh, int T)
{
    int hd = sh->head_dim, g = sh->n_heads / sh->n_kv_heads;
    return T == 1 && (hd == 64 || hd == 128 || hd == 256) && g * hd <= DEC_GROUP_DIMS &&
           sh->n_kv_heads * ATT_ROWS_MAX <= EXO_CUDA_ATT_ARRIVALS;
}

/* Positions a decode block takes at least: one round of each of its 8
 * warps loading 4 positions before using any (decode_attend). */
#define DEC_LEAST 32

/* The last block of a KV head's splits (decode_attend): each query head's
 * splits combined, a warp a head for the weights (the splits' maxima and
 * sums across its lanes), then every thread some of the group's dims, its
 * splits' loads issued four at a time. The partials were written by other
 * blocks: read through L2 (__ldcg), never a stale L1 line. */
template <int GMAX>
__device__ __forceinline__ void combine_group(const att_args &a, int kvh, int live)
{
    __shared__ float weight[GMAX][ATT_MAX_SPLITS], total[GMAX];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = a.n_heads / a.n_kv, hd = a.hd;
    const size_t stride = (size_t)hd + 2;
    for (int h = warp; h < g; h += DEC_WARPS) {
        const int head = kvh * g + h;
        const float *part = a.partial + (size_t)head * a.n_split * stride;
        float m[2], l[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int s = lane + 32 * i;
            m[i] = s < live ? __ldcg(part + s * stride) : -INFINITY;
            l[i] = s < live ? __ldcg(part + s * stride + 1) : 0.0f;
        }
        const float M = warp_max(fmaxf(m[0], m[1]));
        float L = 0.0f;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const float w = m[i] == -INFINITY ? 0.0f : exp2_ftz(m[i] - M);
            L += l[i] * w;
            if (lane + 32 * i < live)
                weight[h][lane + 32 * i] = w;
        }
        L = warp_sum(L);
        if (a.sinks)
            L += exp2_ftz(a.sinks[head] * LOG2E - M);
        if (lane == 0)
            total[h] = L;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < g * hd; e += DEC_WARPS * 32) {
        const int h = e / hd, d = e % hd, head = kvh * g + h;
        const float *part = a.partial + (size_t)head * a.n_split * stride + 2 + d;
        float acc = 0.0f;
        int s = 0;
        for (; s + 4 <= live; s += 4) {
            float p[4];
#pragma unroll
            for (int i = 0; i < 4; i++)
                p[i] = __ldcg(part + (s + i) * stride);
#pragma unroll
            for (int i = 0; i < 4; i++)
                acc += p[i] * weight[h][s + i];
        }
        for (; s < live; s++)
            acc += __ldcg(part + s * stride) * weight[h][s];
        a.out[(size_t)head * hd + d] = total[h] > 0 ? acc / total[h] : 0.0f;
    }
}

/* The decode kernel's rotation (backend.h exo_attn_rope): the KV group's
 * query heads and the new key through their norms and RoPE, a warp a head
 * in registers (a lane's DPL dims from d0, as the loads of keys hold
 * them; the partner dims, d and d + rot / 2, P lanes apart), into rot
 * ((g + 1) x head_dim floats of shared memory, the key last) for all the
 * block's warps after one barrier. Lanes past rot_dim have cos 1, sin 0
 * and are their own partners. The arithmetic is spelled out (no
 * contraction left to the compiler), so the rows kernel and the
 * one-sequence kernel give the same bits. */
template <int DPL, int GMAX>
__device__ __forceinline__ void rotate_heads(const att_args &a, int kvh, int pos0, float *rot)
{
    /* a warp's heads, warp + k * DEC_WARPS for k < HPW (the key is head
     * g): all their loads first, then each head's arithmetic, and the
     * angles once for all of them (they depend on the dim, not the head):
     * a group of 8 has 9 heads for 8 warps, and warp 0 took its second
     * head's loads and angles only after the first's shuffles */
    constexpr int HPW = (GMAX + DEC_WARPS) / DEC_WARPS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, d0 = lane * DPL;
    const int g = a.n_heads / a.n_kv, hd = a.hd, half = a.rope_half, P = half / DPL;
    const bool first = d0 < half, rotated = d0 < 2 * half;
    const int partner = !rotated ? lane : first ? lane + P : lane - P;
    float x[HPW][DPL], nw[HPW][DPL], cs[DPL], sn[DPL];
#pragma unroll
    for (int k = 0; k < HPW; k++) {
        const int h = warp + k * DEC_WARPS;
        const bool key = h == g;
        const float *src = key ? a.kin + (size_t)kvh * hd : a.q + (size_t)(kvh * g + h) * hd;
        const float *w = key ? a.k_norm : a.q_norm;
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            x[k][i] = h <= g ? src[d0 + i] : 0.0f;
            nw[k][i] = h <= g && w ? w[d0 + i] : 0.0f;
        }
    }
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        const float2 c = rotated ? exo_cuda_rope_cs(pos0, a.rope_freq[(first ? d0 : d0 - half) + i], a.mscale)
                                 : make_float2(1.0f, 0.0f);
        cs[i] = c.x;
        sn[i] = first ? -c.y : c.y; /* first half: a cos - b sin; second: b cos + a sin */
    }
#pragma unroll
    for (int k = 0; k < HPW; k++) {
        const int h = warp + k * DEC_WARPS;
        if (h > g)
            break;
        if (h == g ? a.k_norm : a.q_norm) { /* rmsnorm's arithmetic, the sum in a warp's order */
            float ss = 0.0f;
#pragma unroll
            for (int i = 0; i < DPL; i++)
                ss = __fmaf_rn(x[k][i], x[k][i], ss);
            const float inv = 1.0f / sqrtf(warp_sum(ss) / (float)hd + a.eps);
#pragma unroll
            for (int i = 0; i < DPL; i++)
                x[k][i] = __fmul_rn(nw[k][i], __fmul_rn(x[k][i], inv));
        }
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            const float other = __shfl_sync(0xffffffffu, x[k][i], partner);
            rot[(size_t)h * hd + d0 + i] = __fmaf_rn(x[k][i], cs[i], __fmul_rn(other, sn[i]));
        }
    }
    __syncthreads();
}

/* Shared memory of the decode kernel beyond its fixed arrays: the warps'
 * outputs, and with a rotation its heads (rotate_heads). */
static size_t decode_smem(const exo_attn_shape *sh)
{
    const size_t g = (size_t)(sh->n_heads / sh->n_kv_heads), hd = (size_t)sh->head_dim;
    return sizeof(float) * (DEC_WARPS * g * hd + (sh->rope ? (g + 1) * hd : 0));
}

/* One (KV head, split) of a decode token. Each warp takes every
 * DEC_WARPS-th position of the split, DEC_UNROLL of them loaded at once,
 * so a warp waits on memory once a round, not once a position. A split
 * with no positions (a short context in a grid planned for the whole
 * cache) leaves at once; a token whose positions fit one split writes its
 * output directly; otherwise each split writes its (max, sum, output) and
 * the last of the KV head's splits to arrive (`arrival`, a counter it sets
 * back to 0) combines them: no second kernel. */
template <int DPL, int GMAX, bool ROPE, bool HALF>
__device__ __forceinline__ void decode_attend(const att_args &a, int kvh, int sp, int *arrival)
{
    constexpr int DEC_UNROLL = DPL >= 8 ? 2 : 4;
    __shared__ float merge[DEC_WARPS][GMAX][2];
    __shared__ bool last;
    extern __shared__ float wacc[]; /* [DEC_WARPS][g][hd], then rotate_heads' */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = a.n_heads / a.n_kv, hd = a.hd;
    const int pos0 = a.pos_dev ? *a.pos_dev : a.pos0;
    const int lo = a.window > 0 && pos0 - a.window + 1 > 0 ? pos0 - a.window + 1 : 0;
    const int span = pos0 + 1 - lo, per = split_len(a, span, DEC_LEAST, 1);
    const int live = (span + per - 1) / per; /* splits with positions: at most n_split */
    if (sp >= live)
        return;
    const int start = lo + sp * per, end = min(pos0 + 1, start + per);
    const size_t row_stride = (size_t)a.n_kv * hd;
    /* a lane's dims: DPL consecutive floats (coalesced across the warp) */
    const int d0 = lane * DPL;
    /* A round's scores go GH heads at a time, so that a chunk's U x GH
     * partial dot products (U positions) fit one transposing butterfly;
     * afterwards lane `lane` holds the whole score of pair lane / REP
     * (position pair / GH, head pair % GH), and lanes (h % GH) * REP keep
     * head h's running max and sum. */
    constexpr int U = DEC_UNROLL, GH = U * GMAX <= 32 ? GMAX : 32 / U, N = U * GH, REP = 32 / N;
    /* scores in log2 units (q scaled by log2 e): one exp2 an exponential */
    float q[GMAX][DPL], acc[GMAX][DPL], m[GMAX], l[GMAX];
    float mrun[GMAX], lrun[GMAX]; /* chunk c's (decode rounds below): lanes of head c * GH + lane's head */
    /* the group's queries and the new key: as given, or rotated here */
    const float *qg = a.q + (size_t)kvh * g * hd, *knew = a.kin + (size_t)kvh * hd;
    if constexpr (ROPE) {
        float *rot = wacc + (size_t)DEC_WARPS * g * hd;
        rotate_heads<DPL, GMAX>(a, kvh, pos0, rot);
        qg = rot;
        knew = rot + (size_t)g * hd;
    }
#pragma unroll
    for (int h = 0; h < GMAX; h++) {
        mrun[h] = -INFINITY;
        lrun[h] = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            acc[h][i] = 0.0f;
            q[h][i] = h < g ? qg[(size_t)h * hd + d0 + i] * (a.scale * LOG2E) : 0.0f;
        }
    }
    if (sp == 0 && warp == 0) { /* this token's key and value into the cache */
        int slot = a.ring ? pos0 % a.ring : pos0;
        const size_t in = (size_t)kvh * hd;
        char *kc = cache_head<HALF>(a, slot, false, row_stride, kvh);
        char *vc = cache_head<HALF>(a, slot, true, row_stride, kvh);
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            kv_store(kc, d0 + i, knew[d0 + i], HALF);
            kv_store(vc, d0 + i, a.vin[in + d0 + i], HALF);
        }
    }
    /* A bf16 cache: the new key and value, rounded, in shared memory, so
     * every row a round loads is bf16 and takes one kind of load (rows
     * whose kind was known only at run time made llama-3.2-1b q4 decode
     * 6.5% slower after 512 tokens than with an f32 cache, 4.5% with this,
     * 1.4% with the next round's loads issued early, below). */
    __shared__ __align__(16) __nv_bfloat16 own_kv[HALF ? 2 : 1][HALF ? 32 * DPL : 1];
    if constexpr (HALF) {
        if (warp == 0)
#pragma unroll
            for (int i = 0; i < DPL; i++) {
                own_kv[0][d0 + i] = __float2bfloat16_rn(knew[d0 + i]);
                own_kv[1][d0 + i] = __float2bfloat16_rn(a.vin[(size_t)kvh * hd + d0 + i]);
            }
        __syncthreads();
    }
    /* A round's rows, loaded into k and v; the next round's are loaded
     * before this one's are used. With an f32 cache that changes nothing
     * measurable (an H100, llama-3.1-8b and llama-3.2-1b q4 after 512 to
     * 16384 tokens), with a bf16 one, whose rows are widened after they
     * arrive, it does: llama-3.1-8b q4 after 16384 tokens 236 -> 273
     * tok/s (f32: 268). */
    auto load_round = [&](int j0, float (&k)[DEC_UNROLL][DPL], float (&v)[DEC_UNROLL][DPL]) {
#pragma unroll
        for (int u = 0; u < DEC_UNROLL; u++) {
            const int j = j0 + u * DEC_WARPS;
            if (j >= end) { /* zero: its weight is 0, and 0 x garbage could be NaN */
#pragma unroll
                for (int i = 0; i < DPL; i++)
                    k[u][i] = v[u][i] = 0.0f;
                continue;
            }
            if constexpr (HALF) { /* generic loads: a row may be own_kv's */
                const bool own = j >= pos0;
                const int slot = a.ring ? j % a.ring : j;
                const kv_row kr = {own ? (const char *)own_kv[0] : cache_head<true>(a, slot, false, row_stride, kvh),
                                   KV_BF16};
                const kv_row vr = {own ? (const char *)own_kv[1] : cache_head<true>(a, slot, true, row_stride, kvh),
                                   KV_BF16};
                /* a lane's dims in one load where they are 8 bytes or more */
                constexpr int STEP = DPL % 4 == 0 ? 4 : 2;
#pragma unroll
                for (int i = 0; i < DPL; i += STEP) {
                    kv_load<STEP, true, true>(kr, d0 + i, &k[u][i]);
                    kv_load<STEP, true, true>(vr, d0 + i, &v[u][i]);
                }
            } else {
                /* the new key, rotated here, is in shared memory, so the
                 * rotating kernel loads keys with generic loads (as
                 * measured; only the new key needs one) */
                const bool own = ROPE && j >= pos0;
                const kv_row kr = (own ? kv_row{(const char *)knew, KV_F32}
                                       : key_row<false>(a, pos0, j, kvh, row_stride, a.kin, false)).at(d0);
                const kv_row vr = key_row<false>(a, pos0, j, kvh, row_stride, a.vin, true).at(d0);
#pragma unroll
                for (int i = 0; i < DPL; i += 2) {
                    kv_load<2, ROPE>(kr, i, &k[u][i]);
                    kv_load<2>(vr, i, &v[u][i]);
                }
            }
        }
    };
    float k[DEC_UNROLL][DPL], v[DEC_UNROLL][DPL];
    if (start + warp < end)
        load_round(start + warp, k, v);
    for (int j0 = start + warp; j0 < end; j0 += DEC_UNROLL * DEC_WARPS) {
        float kn[DEC_UNROLL][DPL], vn[DEC_UNROLL][DPL];
        if (j0 + DEC_UNROLL * DEC_WARPS < end)
            load_round(j0 + DEC_UNROLL * DEC_WARPS, kn, vn);
        /* The round's max and sum over positions are a few shuffles after
         * the butterfly, an exponential a lane, and the weights go to every
         * lane by shuffles: 40 shuffles and 2 exponentials a round of 4
         * positions x 4 heads, where a butterfly and an online update per
         * score took 80 and 32. */
        const int pu = lane / REP / GH; /* the position of this lane's pair */
        const bool valid = j0 + pu * DEC_WARPS < end;
#pragma unroll
        for (int c = 0; c < GMAX / GH; c++) {
            if (c * GH >= g)
                break;
            float sv[N];
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int hh = 0; hh < GH; hh++) {
                    float d = 0.0f;
#pragma unroll
                    for (int i = 0; i < DPL; i++)
                        d += q[c * GH + hh][i] * k[u][i];
                    sv[u * GH + hh] = d;
                }
            int pair = 0; /* = lane / REP */
            exo_cuda_butterfly<N, 16>(sv, lane, pair);
            const float sc = valid ? sv[0] : -INFINITY;
            float M = sc;
#pragma unroll
            for (int o = GH * REP; o < 32; o <<= 1)
                M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
            const float mnew = fmaxf(mrun[c], M); /* finite: position u = 0 of a round is always valid */
            const float corr = exp2_ftz(mrun[c] - mnew), pw = valid ? exp2_ftz(sc - mnew) : 0.0f;
            float P = pw;
#pragma unroll
            for (int o = GH * REP; o < 32; o <<= 1)
                P += __shfl_xor_sync(0xffffffffu, P, o);
            lrun[c] = lrun[c] * corr + P;
            mrun[c] = mnew;
#pragma unroll
            for (int hh = 0; hh < GH; hh++) {
                const int h = c * GH + hh;
                const float ch = __shfl_sync(0xffffffffu, corr, hh * REP);
#pragma unroll
                for (int i = 0; i < DPL; i++)
                    acc[h][i] *= ch;
#pragma unroll
                for (int u = 0; u < U; u++) {
                    const float pu_h = __shfl_sync(0xffffffffu, pw, (u * GH + hh) * REP);
#pragma unroll
                    for (int i = 0; i < DPL; i++)
                        acc[h][i] += pu_h * v[u][i];
                }
            }
        }
#pragma unroll
        for (int u = 0; u < DEC_UNROLL; u++)
#pragma unroll
            for (int i = 0; i < DPL; i++) {
                k[u][i] = kn[u][i];
                v[u][i] = vn[u][i];
            }
    }
    /* each head's running max and sum, from the lanes that kept them */
#pragma unroll
    for (int h = 0; h < GMAX; h++) {
        m[h] = __shfl_sync(0xffffffffu, mrun[h / GH], (h % GH) * REP);
        l[h] = __shfl_sync(0xffffffffu, lrun[h / GH], (h % GH) * REP);
    }
    /* the warps' (max, sum, output) per head, merged: each warp leaves
     * its max, sum and unscaled output; the warps' factors against a
     * head's max (and the head's total) are worked out once, by a thread
     * a (head, warp) pair, and an output element is then one multiply-add
     * a warp */
    __shared__ float factor[GMAX][DEC_WARPS], head_ml[GMAX][2];
    if (lane == 0)
#pragma unroll
        for (int h = 0; h < GMAX; h++)
            if (h < g) {
                merge[warp][h][0] = m[h];
                merge[warp][h][1] = l[h];
            }
#pragma unroll
    for (int h = 0; h < GMAX; h++) {
        if (h >= g)
            break;
#pragma unroll
        for (int i = 0; i < DPL; i++)
            wacc[((size_t)warp * g + h) * hd + d0 + i] = acc[h][i];
    }
    __syncthreads();
    if (threadIdx.x < GMAX * DEC_WARPS) { /* whole warps: GMAX x 8 is a multiple of 32 */
        const int h = threadIdx.x / DEC_WARPS, w = threadIdx.x % DEC_WARPS;
        const float mw = h < g ? merge[w][h][0] : -INFINITY;
        float M = mw;
#pragma unroll
        for (int o = 1; o < DEC_WARPS; o <<= 1)
            M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        const float f = mw == -INFINITY ? 0.0f : exp2_ftz(mw - M);
        float L = h < g ? merge[w][h][1] * f : 0.0f;
#pragma unroll
        for (int o = 1; o < DEC_WARPS; o <<= 1)
            L += __shfl_xor_sync(0xffffffffu, L, o);
        factor[h][w] = f;
        if (w == 0) {
            head_ml[h][0] = M;
            head_ml[h][1] = L;
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < g * hd; e += DEC_WARPS * 32) {
        const int h = e / hd, d = e % hd, head = kvh * g + h;
        const float M = head_ml[h][0];
        float L = head_ml[h][1], o = 0.0f;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; w++)
            o += wacc[((size_t)w * g + h) * hd + d] * factor[h][w];
        if (live == 1) {
            if (a.sinks)
                L += exp2_ftz(a.sinks[head] * LOG2E - M);
            a.out[(size_t)head * hd + d] = L > 0 ? o / L : 0.0f;
        } else {
            float *part = a.partial + ((size_t)head * a.n_split + sp) * (size_t)(hd + 2);
            if (d == 0) {
                part[0] = M;
                part[1] = L;
            }
            part[2 + d] = o;
        }
    }
    if (live == 1)
        return;
    __threadfence(); /* this block's partials, seen by whichever block comes last */
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(arrival, 1) == live - 1;
        if (last)
            *arrival = 0; /* every split has arrived: ready for the next call */
    }
    __syncthreads();
    if (!last)
        return;
    __threadfence();
    combine_group<GMAX>(a, kvh, live);
}

template <int DPL, int GMAX, bool ROPE, bool HALF>
__global__ void __launch_bounds__(DEC_WARPS * 32)
attention_decode_kernel(const __grid_constant__ att_args a, int *arrivals)
{
    exo_cuda_start_next(); /* before the wait: see cuda_internal.h */
    exo_cuda_wait_inputs();
    decode_attend<DPL, GMAX, ROPE, HALF>(a, blockIdx.x, blockIdx.y, arrivals + blockIdx.x);
}

template <int DPL, int GMAX, bool ROPE, bool HALF>
__global__ void __launch_bounds__(DEC_WARPS * 32)
attention_decode_rows_kernel(const __grid_constant__ att_rows b, int *arrivals)
{
    exo_cuda_start_next(); /* before the wait: see cuda_internal.h */
    exo_cuda_wait_inputs();
    const att_args &a = b.a[blockIdx.z];
    if ((int)blockIdx.y < a.n_split) /* the sequences' split counts differ; the grid has the most */
        decode_attend<DPL, GMAX, ROPE, HALF>(a, blockIdx.x, blockIdx.y,
                                             arrivals + (size_t)blockIdx.z * a.n_kv + blockIdx.x);
}

/* The prompt kernel: flash attention in tiles, for head_dim 64, 128 or 256
 * and calls of at least TILE_MIN_T tokens. A block takes TILE_Q query rows
 * of one KV head (rows are (token, query head of the group) pairs, so a
 * group's heads share every key and value the block loads) and walks the
 * keys they can see in tiles of TILE_K: K and V of a tile go to shared
 * memory once for all the rows, a thread scores 4 rows x 4 keys, the rows'
 * running max and sum are kept by the 16 threads that share a row (one
 * half-warp), the tile's probabilities go through shared memory, and a
 * thread accumulates its 4 rows' outputs over HD / 16 dims. The
 * one-block-per-(query, head) kernel above reads every key once per query
 * head and token: a 512-token chunk of a llama-3.1-8b prompt at position
 * 3584 took 32.7 ms a layer with it, 1.8 ms with this one. Below
 * TILE_MIN_T tokens a block would have too few rows to share keys among. */
#define TILE_Q 32
#define TILE_K 64
#define TILE_THREADS 128
#define TILE_MIN_T 32
#define TILE_PS (TILE_K + 4) /* a row of probabilities in shared memory */

static bool tile_kernel_takes(const exo_attn_shape *sh, int T)
{
    int hd = sh->head_dim;
    return T >= TILE_MIN_T && (hd == 64 || hd == 128 || hd == 256);
}

static size_t tile_smem(int hd)
{
    return sizeof(float) * ((size_t)TILE_Q * hd + (size_t)TILE_K * (hd + 4) + (size_t)TILE_K * hd +
                            (size_t)TILE_Q * TILE_PS);
}

template <int HD, bool HALF>
__global__ void __launch_bounds__(TILE_THREADS) attention_tile_kernel(const __grid_constant__ att_args a)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    constexpr int DPT = HD / 16, KS = HD + 4, C4 = HD / 4;
    extern __shared__ float4 smem4[];
    float *Qs = (float *)smem4;   /* [TILE_Q][HD], scaled */
    float *Ks = Qs + TILE_Q * HD; /* [TILE_K][KS] */
    float *Vs = Ks + TILE_K * KS; /* [TILE_K][HD] */
    float *Ps = Vs + TILE_K * HD; /* [TILE_Q][TILE_PS] */
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int kvh = blockIdx.x, g = a.n_heads / a.n_kv, rows = a.n_tokens * g, pos0 = a.pos0;
    const int r0 = blockIdx.y * TILE_Q, r_end = min(r0 + TILE_Q, rows);
    const int t_first = r0 / g, t_last = (r_end - 1) / g;
    const size_t rs = (size_t)a.n_kv * HD;
    for (int i = tid; i < TILE_Q * C4; i += TILE_THREADS) {
        const int r = r0 + i / C4, c = i % C4;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < rows) {
            v = ((const float4 *)(a.q + ((size_t)(r / g) * a.n_heads + kvh * g + r % g) * HD))[c];
            v.x *= a.scale;
            v.y *= a.scale;
            v.z *= a.scale;
            v.w *= a.scale;
        }
        ((float4 *)Qs)[i] = v;
    }
    /* the call's keys and values into the cache: a token's by the block
     * holding its first query head (the call reads them from its inputs) */
    for (int t = t_first; t <= t_last; t++) {
        if (t * g < r0)
            continue;
        const int j = pos0 + t, slot = a.ring ? j % a.ring : j;
        char *kc = cache_head<HALF>(a, slot, false, rs, kvh), *vc = cache_head<HALF>(a, slot, true, rs, kvh);
        const float *ki = a.kin + ((size_t)t * a.n_kv + kvh) * HD, *vi = a.vin + ((size_t)t * a.n_kv + kvh) * HD;
        for (int d = tid; d < HD; d += TILE_THREADS) {
            kv_store(kc, d, ki[d], HALF);
            kv_store(vc, d, vi[d], HALF);
        }
    }
    float m[4], l[4], acc[4][DPT];
    int qpos[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = r0 + ty * 4 + i;
        qpos[i] = r < rows ? pos0 + r / g : -1; /* -1: no row, sees nothing */
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int d = 0; d < DPT; d++)
            acc[i][d] = 0.0f;
    }
    const int hi = pos0 + t_last;
    const int lo = a.window > 0 && pos0 + t_first - a.window + 1 > 0 ? pos0 + t_first - a.window + 1 : 0;
    for (int k0 = lo; k0 <= hi; k0 += TILE_K) {
        __syncthreads(); /* Qs written; the last tile's Ks, Vs and Ps read */
        for (int i = tid; i < TILE_K * C4; i += TILE_THREADS) {
            const int kr = i / C4, c = i % C4, j = k0 + kr;
            float kv[4] = {0.0f, 0.0f, 0.0f, 0.0f}, vv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (j <= hi) {
                kv_load<4>(key_row<HALF>(a, pos0, j, kvh, rs, a.kin, false), 4 * c, kv);
                kv_load<4>(key_row<HALF>(a, pos0, j, kvh, rs, a.vin, true), 4 * c, vv);
            }
            ((float4 *)(Ks + kr * KS))[c] = make_float4(kv[0], kv[1], kv[2], kv[3]);
            ((float4 *)(Vs + kr * HD))[c] = make_float4(vv[0], vv[1], vv[2], vv[3]);
        }
        __syncthreads();
        float sc[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int jj = 0; jj < 4; jj++)
                sc[i][jj] = 0.0f;
#pragma unroll 4
        for (int d = 0; d < HD; d += 4) {
            float4 q4[4], k4[4];
#pragma unroll
            for (int i = 0; i < 4; i++)
                q4[i] = *(const float4 *)(Qs + (ty * 4 + i) * HD + d);
#pragma unroll
            for (int jj = 0; jj < 4; jj++)
                k4[jj] = *(const float4 *)(Ks + (tx + 16 * jj) * KS + d);
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int jj = 0; jj < 4; jj++)
                    sc[i][jj] += q4[i].x * k4[jj].x + q4[i].y * k4[jj].y + q4[i].z * k4[jj].z + q4[i].w * k4[jj].w;
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float mx = -INFINITY;
#pragma unroll
            for (int jj = 0; jj < 4; jj++) {
                const int j = k0 + tx + 16 * jj;
                const bool seen = j <= qpos[i] && (a.window <= 0 || j > qpos[i] - a.window);
                sc[i][jj] = seen ? sc[i][jj] : -INFINITY;
                mx = fmaxf(mx, sc[i][jj]);
            }
            const float mnew = fmaxf(m[i], warp_max(mx, 16));
            const float corr = mnew == -INFINITY ? 1.0f : __expf(m[i] - mnew);
            float sum = 0.0f;
#pragma unroll
            for (int jj = 0; jj < 4; jj++) {
                const float p = sc[i][jj] == -INFINITY ? 0.0f : __expf(sc[i][jj] - mnew);
                Ps[(ty * 4 + i) * TILE_PS + tx + 16 * jj] = p;
                sum += p;
            }
            l[i] = l[i] * corr + warp_sum(sum, 16);
            m[i] = mnew;
#pragma unroll
            for (int d = 0; d < DPT; d++)
                acc[i][d] *= corr;
        }
        __syncthreads();
        const int nk = min(TILE_K, hi - k0 + 1);
        for (int k = 0; k < nk; k++) {
            float p[4];
#pragma unroll
            for (int i = 0; i < 4; i++)
                p[i] = Ps[(ty * 4 + i) * TILE_PS + k];
            const float4 *vr = (const float4 *)(Vs + k * HD + tx * DPT);
#pragma unroll
            for (int c = 0; c < DPT / 4; c++) {
                const float4 v = vr[c];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    acc[i][4 * c] += p[i] * v.x;
                    acc[i][4 * c + 1] += p[i] * v.y;
                    acc[i][4 * c + 2] += p[i] * v.z;
                    acc[i][4 * c + 3] += p[i] * v.w;
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = r0 + ty * 4 + i;
        if (r >= rows)
            continue;
        const int h = kvh * g + r % g;
        float L = l[i];
        if (a.sinks)
            L += __expf(a.sinks[h] - m[i]);
        float *orow = a.out + ((size_t)(r / g) * a.n_heads + h) * HD + tx * DPT;
#pragma unroll
        for (int d = 0; d < DPT; d++)
            orow[d] = L > 0 ? acc[i][d] / L : 0.0f;
    }
}

template <int HD, bool HALF>
static int launch_tile_as(const att_args &a, cudaStream_t stream)
{
    static bool opted_in; /* the shared memory past 48 KiB, asked for once */
    const size_t smem = tile_smem(HD);
    if (!opted_in &&
        cudaFuncSetAttribute(attention_tile_kernel<HD, HALF>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem))
        return exo_cuda_launched("attention tile shared memory");
    opted_in = true;
    const int rows = a.n_tokens * (a.n_heads / a.n_kv);
    exo_cuda_launch(attention_tile_kernel<HD, HALF>, dim3((unsigned)a.n_kv, (unsigned)((rows + TILE_Q - 1) / TILE_Q)),
                    dim3(TILE_THREADS), smem, stream, a);
    return exo_cuda_launched("attention tile");
}

template <int HD> static int launch_tile(const att_args &a, cudaStream_t stream)
{
    return a.half ? launch_tile_as<HD, true>(a, stream) : launch_tile_as<HD, false>(a, stream);
}

/* The decode kernel for a shape: DPL = head_dim / 32 dims a lane, GMAX
 * the group's query heads rounded up to 4, 8 or 16 (a lane's registers
 * hold GMAX heads' queries and sums), ROPE whether it rotates q and the
 * new key: attention_decode_rows_kernel for an att_rows, else
 * attention_decode_kernel for an att_args. */
template <int DPL, int GMAX, bool ROPE, bool HALF, typename Args>
static void launch_decode_half(dim3 grid, size_t smem, cudaStream_t stream, const Args &args, int *arrivals)
{
    if constexpr (std::is_same<Args, att_rows>::value)
        exo_cuda_launch(attention_decode_rows_kernel<DPL, GMAX, ROPE, HALF>, grid, dim3(DEC_WARPS * 32), smem,
                        stream, args, arrivals);
    else
        exo_cuda_launch(attention_decode_kernel<DPL, GMAX, ROPE, HALF>, grid, dim3(DEC_WARPS * 32), smem, stream,
                        args, arrivals);
}

template <int DPL, int GMAX, bool ROPE, typename Args>
static void launch_decode_rope(dim3 grid, size_t smem, cudaStream_t stream, const Args &args, int *arrivals,
                               bool half)
{
    if (half)
        launch_decode_half<DPL, GMAX, ROPE, true>(grid, smem, stream, args, arrivals);
    else
        launch_decode_half<DPL, GMAX, ROPE, false>(grid, smem, stream, args, arrivals);
}

template <int DPL, int GMAX, typename Args>
static void launch_decode_as(dim3 grid, size_t smem, cudaStream_t stream, const Args &args, int *arrivals, bool rope,
                             bool half)
{
    if (rope)
        launch_decode_rope<DPL, GMAX, true>(grid, smem, stream, args, arrivals, half);
    else
        launch_decode_rope<DPL, GMAX, false>(grid, smem, stream, args, arrivals, half);
}

template <typename Args>
static void launch_decode(const exo_attn_shape *sh, dim3 grid, size_t smem, cudaStream_t stream, const Args &args,
                          int *arrivals)
{
    const int g = sh->n_heads / sh->n_kv_heads;
    const bool rope = sh->rope != NULL, half = sh->cache == EXO_DTYPE_BF16;
    if (sh->head_dim == 256)
        launch_decode_as<8, 4>(grid, smem, stream, args, arrivals, rope, half);
    else if (sh->head_dim == 128 && g <= 4)
        launch_decode_as<4, 4>(grid, smem, stream, args, arrivals, rope, half);
    else if (sh->head_dim == 128)
        launch_decode_as<4, 8>(grid, smem, stream, args, arrivals, rope, half);
    else if (g <= 4)
        launch_decode_as<2, 4>(grid, smem, stream, args, arrivals, rope, half);
    else if (g <= 8)
        launch_decode_as<2, 8>(grid, smem, stream, args, arrivals, rope, half);
    else
        launch_decode_as<2, 16>(grid, smem, stream, args, arrivals, rope, half);
}

/* How a call is split: per_split positions a block (a multiple of the
 * block's width), enough blocks to fill the GPU when there are few. A
 * recorded step is planned for the whole cache (capacity > 0), since it
 * replays at later positions; splits past the query's end are empty. */
static void plan(const exo_attn_shape *sh, int T, int pos0, int capacity, int *per_split, int *n_split)
{
    int span = capacity > 0 ? capacity : pos0 + T; /* the most positions any query sees */
    if (sh->sliding_window > 0 && sh->sliding_window < span)
        span = sh->sliding_window;
    if (decode_kernel_takes(sh, T)) { /* about two blocks an SM, at least DEC_LEAST positions a block */
        int n = (2 * 132 + sh->n_kv_heads - 1) / sh->n_kv_heads, most = (span + DEC_LEAST - 1) / DEC_LEAST;
        n = n > most ? most : n;
        n = n < 1 ? 1 : n > ATT_MAX_SPLITS ? ATT_MAX_SPLITS : n;
        *per_split = (span + n - 1) / n;
        *n_split = (span + *per_split - 1) / *per_split;
        return;
    }
    int runs = (span + 31) / 32; /* splits are whole warps' worth of positions */
    int want = (4 * 132 + T * sh->n_heads - 1) / (T * sh->n_heads); /* blocks for a few waves */
    int n = want < runs ? want : runs;
    n = n < 1 ? 1 : n > ATT_MAX_SPLITS ? ATT_MAX_SPLITS : n;
    int per = (runs + n - 1) / n * 32;
    *per_split = per;
    *n_split = (span + per - 1) / per;
}

size_t exo_cuda_attention_scratch(const exo_attn_shape *sh, int T, int pos0, int capacity)
{
    int per, n;
    plan(sh, T, pos0, capacity, &per, &n);
    return n > 1 ? sizeof(float) * (size_t)T * sh->n_heads * n * (sh->head_dim + 2) : 0;
}

/* The arguments of one sequence's call. */
static att_args args_for(const exo_attn_shape *sh, float *out, const float *q, const float *k, const float *v,
                         const exo_kv_view *cache, int T, int pos0, const int *pos_dev, float *partial)
{
    att_args a;
    a.q = q;
    a.kin = k;
    a.vin = v;
    a.kc = (char *)cache->k;
    a.vc = (char *)cache->v;
    a.pages = (char *const *)cache->pages;
    a.half = sh->cache == EXO_DTYPE_BF16;
    a.koff = cache->k_off;
    a.voff = cache->v_off;
    a.page_shift = 0;
    while (cache->pages && (1 << a.page_shift) < cache->page)
        a.page_shift++;
    a.sinks = sh->sinks;
    a.out = out;
    a.partial = partial;
    a.n_heads = sh->n_heads;
    a.n_kv = sh->n_kv_heads;
    a.hd = sh->head_dim;
    a.window = sh->sliding_window;
    a.ring = sh->ring;
    a.pos0 = pos0;
    a.n_tokens = T;
    a.pos_dev = pos_dev;
    a.scale = sh->scale;
    a.dynamic = pos_dev || T == 1;
    const exo_attn_rope *r = sh->rope;
    a.rope_freq = r ? r->inv_freq : NULL;
    a.q_norm = r ? r->q_norm : NULL;
    a.k_norm = r ? r->k_norm : NULL;
    a.mscale = r ? r->mscale : 1.0f;
    a.eps = r ? r->eps : 0.0f;
    a.rope_half = r ? r->rot_dim / 2 : 0;
    plan(sh, T, pos0, a.dynamic ? cache->capacity : 0, &a.per_split, &a.n_split);
    return a;
}

bool exo_cuda_attention_rotates(const exo_attn_shape *sh, int T)
{
    const exo_attn_rope *r = sh->rope;
    /* a lane's dims and their partners' are whole lanes apart */
    return r && decode_kernel_takes(sh, T) && r->rot_dim > 0 && r->rot_dim <= sh->head_dim &&
           r->rot_dim % (2 * (sh->head_dim / 32)) == 0;
}

int exo_cuda_attention(cudaStream_t stream, const exo_attn_shape *sh, float *out, const float *q, const float *k,
                       const float *v, const exo_kv_view *cache, int T, int pos0, const int *pos_dev,
                       float *partial, int *arrivals)
{
    if (sh->head_dim % 4 || sh->head_dim > 32 * ATT_MAX_DIMS || sh->n_heads % sh->n_kv_heads ||
        (cache->pages && (cache->page & (cache->page - 1))) || (sh->rope && !exo_cuda_attention_rotates(sh, T)))
        return EXO_EINVAL;
    att_args a = args_for(sh, out, q, k, v, cache, T, pos0, pos_dev, partial);
    if (!a.dynamic && tile_kernel_takes(sh, T)) {
        a.n_split = 1;
        return sh->head_dim == 64 ? launch_tile<64>(a, stream)
               : sh->head_dim == 128 ? launch_tile<128>(a, stream)
                                     : launch_tile<256>(a, stream);
    }
    if (decode_kernel_takes(sh, T)) {
        dim3 grid((unsigned)sh->n_kv_heads, (unsigned)a.n_split);
        launch_decode(sh, grid, decode_smem(sh), stream, a, arrivals);
        return exo_cuda_launched("attention decode"); /* its splits combine themselves */
    }
    size_t smem = sizeof(float) * (size_t)(sh->head_dim + ATT_THREADS + ATT_WARPS * sh->head_dim);
    auto kernel = a.half ? attention_kernel<true> : attention_kernel<false>;
    if (smem > 48 * 1024 && cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem))
        return exo_cuda_launched("attention shared memory");
    exo_cuda_launch(kernel, dim3((unsigned)sh->n_heads, (unsigned)T, (unsigned)a.n_split), dim3(ATT_THREADS), smem,
                    stream, a);
    int rc = exo_cuda_launched("attention");
    if (rc || a.n_split == 1)
        return rc;
    exo_cuda_launch(attention_combine_kernel, dim3((unsigned)sh->n_heads, (unsigned)T), dim3(128), 0, stream, a);
    return exo_cuda_launched("attention combine");
}

/* Floats of one decode token's partial results when its call is split. */
static size_t rows_partial_floats(const exo_attn_shape *sh, int capacity, int pos0)
{
    int per, n;
    plan(sh, 1, pos0, capacity, &per, &n);
    return n > 1 ? (size_t)sh->n_heads * n * (sh->head_dim + 2) : 0;
}

size_t exo_cuda_attention_rows_scratch(const exo_attn_shape *sh, int n, const exo_kv_view *caches, const int *pos)
{
    size_t floats = 0;
    for (int i = 0; i < n; i++)
        floats += rows_partial_floats(sh, caches[i].capacity, pos[i]);
    return floats * sizeof(float);
}

int exo_cuda_attention_rows(cudaStream_t stream, const exo_attn_shape *sh, int n, float *out, const float *q,
                            const float *k, const float *v, const exo_kv_view *caches, const int *rings,
                            const int *pos, float *partial, int *arrivals)
{
    const size_t qrow = (size_t)sh->n_heads * sh->head_dim, kvrow = (size_t)sh->n_kv_heads * sh->head_dim;
    if (!decode_kernel_takes(sh, 1)) { /* the general kernel: a call a sequence */
        for (int i = 0; i < n; i++) {
            exo_attn_shape one = *sh;
            one.ring = rings[i];
            int rc = exo_cuda_attention(stream, &one, out + i * qrow, q + i * qrow, k + i * kvrow, v + i * kvrow,
                                        &caches[i], 1, pos[i], NULL, partial, arrivals);
            if (rc)
                return rc;
        }
        return 0;
    }
    for (int i0 = 0; i0 < n; i0 += ATT_ROWS_MAX) {
        int m = n - i0 < ATT_ROWS_MAX ? n - i0 : ATT_ROWS_MAX, splits = 1;
        att_rows b;
        float *part = partial;
        for (int j = 0; j < m; j++) {
            const int i = i0 + j;
            exo_attn_shape one = *sh;
            one.ring = rings[i];
            if (caches[i].pages && (caches[i].page & (caches[i].page - 1)))
                return EXO_EINVAL;
            b.a[j] = args_for(&one, out + i * qrow, q + i * qrow, k + i * kvrow, v + i * kvrow, &caches[i], 1,
                              pos[i], NULL, part);
            part += rows_partial_floats(sh, caches[i].capacity, pos[i]);
            splits = b.a[j].n_split > splits ? b.a[j].n_split : splits;
        }
        dim3 grid((unsigned)sh->n_kv_heads, (unsigned)splits, (unsigned)m);
        launch_decode(sh, grid, decode_smem(sh), stream, b, arrivals);
        int rc = exo_cuda_launched("attention rows");
        if (rc)
            return rc;
        partial = part;
    }
    return 0;
}
