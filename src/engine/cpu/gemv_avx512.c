/* AVX-512 kernels: decode GEMV for affine and dense weights, activation
 * quantization for the integer path, and weight expansion to bf16 for the
 * oneDNN prefill path.
 *
 * Why integer dot products: a float-unpacking GEMV is compute-bound at well
 * under half the memory bandwidth on this class of CPU (TOOLCHAIN.md). With
 * X quantized per weight group to int8 (scale dx_g), a group's contribution
 * is  s_g*dx_g*dot(q, xq) + b_g*dx_g*sum(xq), exactly dot(w, xhat) for the
 * dequantized activation xhat (using sum(x) instead would make the error
 * scale with s*q, several times larger than w). dot(q, xq) is one vpdpbusd
 * (unsigned codes x signed activations) per 64 bytes of 8-bit codes, two per
 * 64 bytes of 4-bit codes. The int32 lanes are then combined in one of two
 * ways, a numerics family chosen per process (exo_gemv_scratch.group_sums):
 *  - group sums: a group's lanes are summed exactly (a merge tree over 16
 *    groups' blocks) and each group sum is converted to f32 and multiplied
 *    by s_g*dx_g. The AMX kernel (gemv_amx.c) computes exactly this, many
 *    rows of X at a time; CPUs with tile units use this family.
 *  - lane sums: each lane is converted to f32 and multiplied by its
 *    group's s_g*dx_g, and the row is reduced once at the end. Less vector
 *    work where rows of X share a pass; CPUs without tile units use this
 *    for the weights they do not load as affine panels (linear.h,
 *    gemv_panels_avx512.c: 4- and 8-bit weights of 16k rows go there).
 * Within a family a row of X gets the same bits at any row count. 4-bit
 * codes are split into low/high nibbles, i.e. even/odd elements, and the
 * activation is pre-permuted to match (EXO_QLAYOUT_Q4), so weights are never
 * shuffled. EXO_GEMV_ROWS rows run together to reuse activation loads; for
 * T > 1 two X rows at a time pass over a row block's codes (their nibbles
 * split once for both), which stay in L1/L2 after the first pass.
 * 2/3/5/6-bit rows are unpacked to bytes first (vpermw + variable shifts,
 * 16 codes at a time) and take the 8-bit kernel: correct, but compute-bound
 * at roughly 3-7 GB/s of codes per core.
 * Memory order. The rows of a row block are taken a page or more apart:
 * with rows shorter than 4 KiB, a super-block of EXO_GEMV_ROWS * S rows
 * (S = exo_gemv_page_stride, S rows covering at least a page) is read as
 * S row blocks, block j taking row j of each of the EXO_GEMV_ROWS runs of
 * S consecutive rows, so each row block streams from EXO_GEMV_ROWS
 * different pages and each run is read front to back. Four rows
 * interleaved inside one page look like no stream at all to the L2
 * streamer, which tracks one stream per page: 16384 x 2048 q4 read at
 * 19.6 GB/s in consecutive order and 24.6 GB/s page-strided (2 threads,
 * DRAM probe 29 GB/s). Runs rather than page-sized strides also cover
 * rows that do not divide a page (qwen3-4b's 1280-byte q4 rows). Every
 * block also
 * software-prefetches the same bytes one super-block ahead into L1 (T0 was
 * 3-5% faster than T1 on every shape; without any software prefetch the
 * GEMV reads at ~14 GB/s, since the hardware prefetchers stop at page
 * boundaries).
 * Weight reads never go past the end of a row (masked tail loads), so a
 * weight at the very end of a mmapped file is safe.
 * MXFP4 weights not in panels (AVX-512 with AMX tiles; the panels kernel
 * takes the same table) take the q4 kernel with one more step: each nibble goes
 * through a vpshufb table to u = 2*e2m1 + 12 in 0..24 (an unsigned code,
 * what vpdpbusd wants), so that w = 2^(s-128) * (u - 12): an affine group
 * with scale 2^(s-128) and bias -12 * 2^(s-128), whose E8M0 scale bytes
 * prep_row_mx turns into floats. Same activations (Q4 layout, group 32),
 * same loop, two vpshufb more per 64 bytes of codes. */
#include "engine/cpu/codes_avx512.h"
#include "engine/cpu/kernels.h"
#include "engine/quant.h"

#include <immintrin.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

INLINE __m512 load16_param(exo_dtype t, const void *p, int64_t i, __mmask16 m)
{
    if (t == EXO_DTYPE_F32)
        return _mm512_maskz_loadu_ps(m, (const float *)p + i);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i);
    if (t == EXO_DTYPE_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

static inline __mmask16 mask16(int64_t n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1); }
static inline __mmask64 mask64(int64_t n) { return n >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << n) - 1); }

/* ---------------------------------------------------------------------- */
/* Activation quantization                                                */

/* Q4 layout: even elements of each 128 first, then the odd ones. */
static void permute_q4(const int8_t *plain, int64_t qlen, int8_t *q)
{
    const __m512i lo8 = _mm512_set1_epi16(0x00ff);
    const __m512i fix = _mm512_set_epi64(7, 5, 3, 1, 6, 4, 2, 0);
    for (int64_t b = 0; b < qlen / 128; b++) {
        __m512i a = _mm512_loadu_si512(plain + 128 * b);
        __m512i c = _mm512_loadu_si512(plain + 128 * b + 64);
        __m512i even = _mm512_packus_epi16(_mm512_and_si512(a, lo8), _mm512_and_si512(c, lo8));
        __m512i odd = _mm512_packus_epi16(_mm512_srli_epi16(a, 8), _mm512_srli_epi16(c, 8));
        _mm512_storeu_si512(q + 128 * b, _mm512_permutexvar_epi64(fix, even));
        _mm512_storeu_si512(q + 128 * b + 64, _mm512_permutexvar_epi64(fix, odd));
    }
}

void exo_qact_build_avx512(const float *x, int64_t cols, int G, int layout, exo_qact *out,
                           int8_t *tmp)
{
    int64_t ng = cols / G;
    int64_t qlen = exo_qact_q_len(cols);
    int q4 = layout == EXO_QLAYOUT_Q4;
    int8_t *plain = q4 ? tmp : out->q;
    int8_t *plain2 = q4 ? tmp + qlen : out->q2;
    memset(plain + cols, 0, (size_t)(qlen - cols));
    memset(plain2 + cols, 0, (size_t)(qlen - cols));
    memset(out->sx, 0, (size_t)exo_qact_sx_len(cols) * sizeof(float));
    memset(out->dx, 0, (size_t)exo_qact_sx_len(cols) * sizeof(float));
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    const __m512i lim = _mm512_set1_epi32(127);
    for (int64_t g = 0; g < ng; g++) {
        const float *xg = x + g * G;
        __m512 amax = _mm512_setzero_ps();
        for (int j = 0; j < G; j += 16)
            amax = _mm512_max_ps(amax, _mm512_and_ps(_mm512_loadu_ps(xg + j), absmask));
        float m = _mm512_reduce_max_ps(amax);
        float d = m / 127.0f;
        float id = m > 0.0f ? 127.0f / m : 0.0f;
        __m512 vd = _mm512_set1_ps(d), vid = _mm512_set1_ps(id),
               vid2 = _mm512_set1_ps(id * 256.0f);
        __m512i qsum = _mm512_setzero_si512();
        for (int j = 0; j < G; j += 16) {
            __m512 xv = _mm512_loadu_ps(xg + j);
            __m512i qi = _mm512_cvtps_epi32(_mm512_mul_ps(xv, vid));
            /* residual of the first level, exact in f32 (|r| <= d/2) */
            __m512 r = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(qi), vd, xv);
            __m512i q2 = _mm512_cvtps_epi32(_mm512_mul_ps(r, vid2));
            q2 = _mm512_max_epi32(_mm512_min_epi32(q2, lim), _mm512_sub_epi32(_mm512_setzero_si512(), lim));
            qsum = _mm512_add_epi32(qsum, _mm512_add_epi32(_mm512_slli_epi32(qi, 8), q2));
            _mm_storeu_si128((__m128i *)(plain + g * G + j), _mm512_cvtsepi32_epi8(qi));
            _mm_storeu_si128((__m128i *)(plain2 + g * G + j), _mm512_cvtepi32_epi8(q2));
        }
        /* the sum of the dequantized activations, not of x: then the result
         * is exactly sum w * xhat, an error proportional to the weights
         * (several times smaller than s*q*(x - xhat) for zero-mean weights,
         * where |s*q| runs up to the group's range) */
        float dl = d * (1.0f / 256.0f);
        out->sx[g] = dl * (float)_mm512_reduce_add_epi32(qsum);
        out->dx[g] = dl;
    }
    if (q4) {
        permute_q4(plain, qlen, out->q);
        permute_q4(plain2, qlen, out->q2);
    }
}

/* ---------------------------------------------------------------------- */
/* Unpacking 2/3/5/6-bit codes to bytes                                   */

/* 16 codes at a time: chunk c0 (a multiple of 16) starts at bit c0*bits,
 * a multiple of 16, so at a 16-bit word. Code k of the chunk lies in the
 * 32-bit window of words (k*bits)>>4 and the next, at shift (k*bits)&15:
 * one vpermw gathers the 16 windows, a variable shift and a mask extract
 * the codes, vpmovdb narrows them. Reads stay inside the row (masked). */
static void unpack_row_avx512(const uint8_t *src, int64_t cols, int bits, uint8_t *out)
{
    uint16_t idx16[32];
    uint32_t sh32[16];
    for (int k = 0; k < 16; k++) {
        int wi = (k * bits) >> 4;
        idx16[2 * k] = (uint16_t)wi;
        idx16[2 * k + 1] = (uint16_t)(wi + 1);
        sh32[k] = (uint32_t)((k * bits) & 15);
    }
    const __m512i idx = _mm512_loadu_si512(idx16);
    const __m512i sh = _mm512_loadu_si512(sh32);
    const __m512i mask = _mm512_set1_epi32((1 << bits) - 1);
    const int64_t rowbytes = cols * bits / 8;
    for (int64_t c0 = 0; c0 < cols; c0 += 16) {
        int64_t off = c0 * bits / 8;
        int64_t left = rowbytes - off;
        __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        __m512i v = _mm512_castsi128_si512(_mm_maskz_loadu_epi8(m, src + off));
        v = _mm512_permutexvar_epi16(idx, v);
        v = _mm512_and_si512(_mm512_srlv_epi32(v, sh), mask);
        _mm_storeu_si128((__m128i *)(out + c0), _mm512_cvtepi32_epi8(v));
    }
}

/* ---------------------------------------------------------------------- */
/* Affine GEMV                                                            */

/* For row r and one quantized X row: sd[g] = scale_g * dx_g (zero-padded to
 * a multiple of 16 plus 16, for the permuting loads of affine_rows), and
 * the bias part sum_g bias_g * sx_g as a vector of partial sums. */
static __m512 prep_row(const exo_linear *w, int64_t r, int64_t ng, const exo_qact *qa, float *sd)
{
    int64_t base = r * ng;
    __m512 bacc = _mm512_setzero_ps();
    int64_t g = 0;
    for (; g < ng; g += 16) {
        __mmask16 m = mask16(ng - g);
        __m512 sc = load16_param(w->dtype, w->scales, base + g, m);
        __m512 bi = load16_param(w->dtype, w->biases, base + g, m);
        _mm512_storeu_ps(sd + g, _mm512_mul_ps(sc, _mm512_loadu_ps(qa->dx + g)));
        bacc = _mm512_fmadd_ps(bi, _mm512_loadu_ps(qa->sx + g), bacc);
    }
    _mm512_storeu_ps(sd + g, _mm512_setzero_ps());
    return bacc;
}

/* prep_row for MXFP4: scale 2^(s-128) and bias -12 * 2^(s-128) per group
 * (see the top). */
static __m512 prep_row_mx(const exo_linear *w, int64_t r, int64_t ng, const exo_qact *qa, float *sd)
{
    const uint8_t *sc = (const uint8_t *)w->scales + r * ng;
    __m512 bacc = _mm512_setzero_ps();
    int64_t g = 0;
    for (; g < ng; g += 16) {
        __mmask16 m = mask16(ng - g);
        __m512 s = _mm512_maskz_mov_ps(m, exo_e8m0_half16(_mm_maskz_loadu_epi8(m, sc + g)));
        _mm512_storeu_ps(sd + g, _mm512_mul_ps(s, _mm512_loadu_ps(qa->dx + g)));
        bacc = _mm512_fmadd_ps(s, _mm512_loadu_ps(qa->sx + g), bacc);
    }
    _mm512_storeu_ps(sd + g, _mm512_setzero_ps());
    return _mm512_mul_ps(bacc, _mm512_set1_ps(-12.0f));
}

/* Rows of codes against several X rows: a row's scales and biases as f32
 * once (exo_gemv_row_params; MXFP4: its 2^(s-128) scales, no biases), then per X
 * row prep_pair, which computes what prep_row / prep_row_mx compute from
 * them (the same products, the same order: the same bits) without
 * converting them again for every X row. */
static float *row_sc(exo_gemv_scratch *s, int i) { return s->sd + (2 * EXO_GEMV_ROWS + i) * s->sf_stride; }
static float *row_bi(exo_gemv_scratch *s, int i) { return s->sd + (3 * EXO_GEMV_ROWS + i) * s->sf_stride; }

void exo_gemv_row_params(const exo_linear *w, int mx, int64_t r, int64_t ng, int64_t g0, int64_t n, float *sc,
                         float *bi)
{
    const int64_t base = r * ng + g0;
    for (int64_t g = 0; g < n; g += 16) {
        __mmask16 m = mask16(n - g);
        if (mx) {
            const uint8_t *e = (const uint8_t *)w->scales + base;
            _mm512_storeu_ps(sc + g, _mm512_maskz_mov_ps(m, exo_e8m0_half16(_mm_maskz_loadu_epi8(m, e + g))));
        } else {
            _mm512_storeu_ps(sc + g, load16_param(w->dtype, w->scales, base + g, m));
            _mm512_storeu_ps(bi + g, load16_param(w->dtype, w->biases, base + g, m));
        }
    }
}

static __m512 prep_pair(int mx, const float *sc, const float *bi, int64_t ng, const exo_qact *qa, float *sd)
{
    __m512 bacc = _mm512_setzero_ps();
    int64_t g = 0;
    for (; g < ng; g += 16) {
        __m512 s = _mm512_loadu_ps(sc + g);
        _mm512_storeu_ps(sd + g, _mm512_mul_ps(s, _mm512_loadu_ps(qa->dx + g)));
        bacc = _mm512_fmadd_ps(mx ? s : _mm512_loadu_ps(bi + g), _mm512_loadu_ps(qa->sx + g), bacc);
    }
    _mm512_storeu_ps(sd + g, _mm512_setzero_ps());
    return mx ? _mm512_mul_ps(bacc, _mm512_set1_ps(-12.0f)) : bacc;
}

/* Sums of four vectors: {sum a, sum b, sum c, sum d}. */
INLINE __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d)
{
    __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    __m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b), _mm512_extractf32x8_ps(b, 1));
    __m256 c8 = _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
    __m256 d8 = _mm256_add_ps(_mm512_castps512_ps256(d), _mm512_extractf32x8_ps(d, 1));
    __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a8, b8), _mm256_hadd_ps(c8, d8));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

/* Per-group sums. A block's vpdpbusd leaves 16 int32 lanes, each the dot
 * product of a few codes (q4: 8, q8: 4) of one group; a group covers
 * LPG = 2^lpg_shift lanes (q4 G/8, q8 G/4). The lanes of NB consecutive
 * blocks, 16 groups (a chunk), are summed into one vector of the 16
 * groups' exact integer sums by a tree of merges: merge level j pairs the
 * vectors of two runs of 2^j blocks and leaves, in the lanes whose bit j is
 * 0, the first run's sums of lane pairs 2^j apart, in the others the
 * second's. After log2(LPG) levels (at most 4; longer groups first add
 * their blocks) lane l holds group sigma(l) = (l mod LPG) * 16/LPG + l/LPG
 * of the chunk, and one permute puts group g in lane g.
 * Each merge is two blends, one shuffle (or rotate) and one add; per block
 * of one row about the vector work of converting and scaling every lane,
 * and the sums are exact, which is what lets the AMX kernel (gemv_amx.c),
 * whose tiles give exact group sums, produce the same bits. */
INLINE __m512i merge_level(int j, __m512i a, __m512i b)
{
    static const __mmask16 second[4] = {0xaaaa, 0xcccc, 0xf0f0, 0xff00};
    __m512i keep = _mm512_mask_blend_epi32(second[j], a, b);
    __m512i other = _mm512_mask_blend_epi32(second[j], b, a);
    switch (j) {
    case 0:  other = _mm512_rol_epi64(other, 32); break; /* lane l <-> l^1, off the shuffle port */
    case 1:  other = _mm512_shuffle_epi32(other, (_MM_PERM_ENUM)0x4e); break; /* l <-> l^2 */
    case 2:  other = _mm512_shuffle_i64x2(other, other, 0xb1); break;         /* l <-> l^4 */
    default: other = _mm512_shuffle_i64x2(other, other, 0x4e); break;         /* l <-> l^8 */
    }
    return _mm512_add_epi32(keep, other);
}

/* The permute from the merge tree's lane order to group order (above). */
static __m512i group_order(int levels)
{
    int32_t idx[16];
    const int lpg = 1 << levels, per_block = 16 / lpg;
    for (int g = 0; g < 16; g++)
        idx[g] = g / per_block + lpg * (g % per_block);
    return _mm512_loadu_si512(idx);
}

/* One X row's activations for block b of codes: the Q4 layout's 64 even
 * and 64 odd elements (a, b), or the Q8 layout's 64 (b = a), both levels. */
typedef struct block_acts {
    __m512i a, b, a2, b2;
} block_acts;

INLINE block_acts load_acts(int q4, const exo_qact *qa, int64_t b)
{
    const int xstep = q4 ? 128 : 64;
    const int8_t *xp = qa->q + xstep * b, *xp2 = qa->q2 + xstep * b;
    block_acts x;
    x.a = _mm512_loadu_si512(xp);
    x.a2 = _mm512_loadu_si512(xp2);
    x.b = q4 ? _mm512_loadu_si512(xp + 64) : x.a;
    x.b2 = q4 ? _mm512_loadu_si512(xp2 + 64) : x.a2;
    return x;
}

/* One row's 64-byte block of codes at p: full blocks with the prefetch of
 * the same block one super-block ahead (every line of the next super-block
 * requested exactly once, a page or more ahead of the stream; prefetches
 * never fault, and pf_dist 0 touches the block itself, i.e. nothing), a
 * row's last partial block masked. 4-bit codes come back as their low and
 * high nibbles (mx: MXFP4 codes through the table; masked-off tail bytes
 * become u = 12, whose activations are the zero padding), bytes as both. */
INLINE void load_codes(int q4, int mx, const uint8_t *p, int full, __mmask64 m, int64_t pf_dist,
                       __m512i *lo, __m512i *hi)
{
    __m512i v;
    if (full) {
        _mm_prefetch((const char *)p + pf_dist, _MM_HINT_T0);
        v = _mm512_loadu_si512(p);
    } else {
        v = _mm512_maskz_loadu_epi8(m, p);
    }
    *lo = *hi = v;
    if (q4)
        exo_split_nibbles(v, mx, lo, hi);
}

/* Dot products of one 64-byte block of codes (q4: its nibbles lo/hi; bytes:
 * lo = hi) with one activation row: two levels in one accumulator,
 * (dot(q, xq) << 8) + dot(q, xq2), at most 4*255*127*257 per lane. */
INLINE __m512i block_dot(int q4, __m512i lo, __m512i hi, block_acts x)
{
    __m512i d;
    if (q4) {
        d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, x.a);
        d = _mm512_dpbusd_epi32(d, hi, x.b);
        d = _mm512_slli_epi32(d, 8);
        d = _mm512_dpbusd_epi32(d, lo, x.a2);
        d = _mm512_dpbusd_epi32(d, hi, x.b2);
    } else {
        d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, x.a);
        d = _mm512_slli_epi32(d, 8);
        d = _mm512_dpbusd_epi32(d, lo, x.a2);
    }
    return d;
}

/* R rows of codes against TT quantized activation rows (qa[0..TT)):
 *   out[t*R + i] = sum_g sd_{t*R+i}[g] * S_tig + (bias part, bacc[t*R + i])
 * with S_tig the exact integer sum of group g and sd = scale * dx. Lane l of
 * an accumulator takes the groups g = l (mod 16) in order, after the bias
 * parts of the same groups (bacc), and the 16 lanes are summed by reduce4's
 * tree: exo_gemv_affine_amx computes each product the same way, and so
 * does a pass of any TT. TT = 2 splits a block's nibbles once for two X
 * rows. q4: packed 4-bit codes against the Q4 layout (mx: MXFP4 codes
 * through the table), else bytes against the Q8 layout. pf_dist: prefetch
 * distance in bytes (0: prefetches the block itself, i.e. nothing). */
INLINE void affine_rows(int R, int TT, int q4, int mx, int lpg_shift, const uint8_t *const *wrow,
                        int64_t rowbytes, const float *const *sd, const __m512 *bacc,
                        const exo_qact *qa, int64_t pf_dist, float *out)
{
    enum { P = 2 * EXO_GEMV_ROWS }; /* (row, X row) pairs at most */
    const int levels = lpg_shift < 4 ? lpg_shift : 4;
    const int bpg = lpg_shift > 4 ? 1 << (lpg_shift - 4) : 1; /* blocks a group vector adds */
    const int NB = bpg << levels;                              /* blocks a chunk of 16 groups */
    const __m512i order = group_order(levels);
    const int64_t nfull = rowbytes / 64, nblk = (rowbytes + 63) / 64;
    const int64_t ng = rowbytes / (4 << lpg_shift); /* groups of the row */
    __m512 acc[P];
    #pragma GCC unroll 8
    for (int k = 0; k < TT * R; k++)
        acc[k] = bacc[k];
    for (int64_t c = 0; c * NB < nblk; c++) {
        const int whole = (c + 1) * NB <= nfull;
        /* (zeroed only for the compiler: every read follows a write) */
        __m512i st[P][4], gv[P], sums[P];
        #pragma GCC unroll 8
        for (int k = 0; k < TT * R; k++)
            gv[k] = sums[k] = _mm512_setzero_si512();
        #pragma GCC unroll 32
        for (int k = 0; k < NB; k++) {
            const int64_t b = c * NB + k;
            __m512i d[P];
            if (whole || b < nblk) {
                block_acts x[2];
                #pragma GCC unroll 2
                for (int t = 0; t < TT; t++)
                    x[t] = load_acts(q4, &qa[t], b);
                const int full = whole || b < nfull;
                const __mmask64 m = full ? ~(__mmask64)0 : mask64(rowbytes % 64);
                #pragma GCC unroll 4
                for (int i = 0; i < R; i++) {
                    __m512i lo, hi;
                    load_codes(q4, mx, wrow[i] + 64 * b, full, m, pf_dist, &lo, &hi);
                    #pragma GCC unroll 2
                    for (int t = 0; t < TT; t++)
                        d[t * R + i] = block_dot(q4, lo, hi, x[t]);
                    /* Keeps each row's prefetch, load and arithmetic
                     * together. Left alone, GCC issues the R prefetches
                     * back to back, and a burst of misses that finds the
                     * line fill buffers full stalls the loads behind it:
                     * decode-shaped q4 GEMVs ran ~2.5% slower. */
                    __asm__ volatile("" ::: "memory");
                }
            } else {
                #pragma GCC unroll 8
                for (int q = 0; q < TT * R; q++)
                    d[q] = _mm512_setzero_si512();
            }
            #pragma GCC unroll 8
            for (int q = 0; q < TT * R; q++) {
                gv[q] = k % bpg ? _mm512_add_epi32(gv[q], d[q]) : d[q];
                if (k % bpg != bpg - 1)
                    continue;
                /* a binary counter over the chunk's group vectors */
                const int u = k / bpg;
                __m512i v = gv[q];
                int j = 0;
                for (; j < levels && ((u >> j) & 1); j++)
                    v = merge_level(j, st[q][j], v);
                if (j < levels)
                    st[q][j] = v;
                else
                    sums[q] = v;
            }
        }
        const int64_t g0 = 16 * c;
        const __mmask16 live = ng - g0 >= 16 ? (__mmask16)0xffff : mask16(ng - g0);
        #pragma GCC unroll 8
        for (int q = 0; q < TT * R; q++) {
            __m512 s = _mm512_cvtepi32_ps(_mm512_permutexvar_epi32(order, sums[q]));
            acc[q] = _mm512_mask3_fmadd_ps(s, _mm512_loadu_ps(sd[q] + g0), acc[q], live);
        }
    }
    const __m512 z = _mm512_setzero_ps();
    #pragma GCC unroll 2
    for (int t = 0; t < TT; t++) {
        const __m512 *a = acc + t * R;
        _mm_storeu_ps(out + 4 * t, reduce4(a[0], R > 1 ? a[1] : z, R > 2 ? a[2] : z, R > 3 ? a[3] : z));
    }
}

/* Constant-argument instances, so each loop is compiled without branches
 * (mx implies q4 and group 32). out: 4 * TT floats. */
#define AFFINE_CASES(R, TT, pf)                                                                      \
    do {                                                                                             \
        if (mx)                                                                                      \
            affine_rows(R, TT, 1, 1, 2, wrow, rowbytes, sd, bacc, qa, pf, out);                      \
        else if (q4 && lpg_shift == 2)                                                               \
            affine_rows(R, TT, 1, 0, 2, wrow, rowbytes, sd, bacc, qa, pf, out);                      \
        else if (q4 && lpg_shift == 3)                                                               \
            affine_rows(R, TT, 1, 0, 3, wrow, rowbytes, sd, bacc, qa, pf, out);                      \
        else if (q4 && lpg_shift == 4)                                                               \
            affine_rows(R, TT, 1, 0, 4, wrow, rowbytes, sd, bacc, qa, pf, out);                      \
        else if (q4)                                                                                 \
            affine_rows(R, TT, 1, 0, lpg_shift, wrow, rowbytes, sd, bacc, qa, pf, out);              \
        else if (lpg_shift == 3)                                                                     \
            affine_rows(R, TT, 0, 0, 3, wrow, rowbytes, sd, bacc, qa, pf, out);                      \
        else if (lpg_shift == 4)                                                                     \
            affine_rows(R, TT, 0, 0, 4, wrow, rowbytes, sd, bacc, qa, pf, out);                      \
        else                                                                                         \
            affine_rows(R, TT, 0, 0, lpg_shift, wrow, rowbytes, sd, bacc, qa, pf, out);              \
    } while (0)

static void affine_rows4(int q4, int mx, int lpg_shift, const uint8_t *const *wrow, int64_t rowbytes,
                         const float *const *sd, const __m512 *bacc, const exo_qact *qa,
                         int64_t pf_dist, float *out)
{
    AFFINE_CASES(4, 1, pf_dist);
}

/* Two X rows a pass (out: 8 floats, X row by X row). */
static void affine_rows4x2(int q4, int mx, int lpg_shift, const uint8_t *const *wrow, int64_t rowbytes,
                           const float *const *sd, const __m512 *bacc, const exo_qact *qa,
                           int64_t pf_dist, float *out)
{
    AFFINE_CASES(4, 2, pf_dist);
}

static void affine_rows1(int q4, int mx, int lpg_shift, const uint8_t *const *wrow, int64_t rowbytes,
                         const float *const *sd, const __m512 *bacc, const exo_qact *qa, float *dst)
{
    float out[4];
    AFFINE_CASES(1, 1, 0);
    *dst = out[0];
}

/* ---------------------------------------------------------------------- */
/* Per-lane sums (the CPUs without tile units)                            */

/* Each 32-bit lane of a block's vpdpbusd is converted to f32 and multiplied
 * by its group's s_g * dx_g, and a row's 16 lanes are summed once at the
 * end: no group sums, so less vector work per block than the merge tree
 * (above) where rows of X share a pass (16 rows of 2048 x 8192 q4: 2.2 ms
 * against 2.7 on the Xeon's vector units alone). The bits differ from the
 * group sums', so a process takes one family for every product
 * (exo_gemv_scratch.group_sums): group sums where the tile units run its
 * batched rows, lane sums elsewhere. */
#define LANE_XTILE 2 /* X rows a pass over a row block's codes */

/* The factor of each 32-bit lane of a block whose first group is g0: sd[g0 +
 * (lane >> lpg_shift)]. Two groups a block (q4 g64, q8 g32) take two
 * broadcasts from memory and a blend, which left more of the vector pipes
 * to the products than a permute (16 rows of X: 8-12% less time); more
 * groups a block take the permute. */
INLINE __m512 lane_scales(int bcast, int lpg_shift, __m512i idx, const float *sd, int64_t g0)
{
    if (bcast)
        return _mm512_set1_ps(sd[g0]);
    if (lpg_shift == 3)
        return _mm512_mask_mov_ps(_mm512_set1_ps(sd[g0]), 0xff00, _mm512_set1_ps(sd[g0 + 1]));
    return _mm512_permutexvar_ps(idx, _mm512_loadu_ps(sd + g0));
}

/* One 64-byte block b of codes for R rows against one activation row:
 * acc[i] += cvt(dot) * the lane's scale. */
INLINE void lane_block(int R, int q4, int bcast, int mx, const uint8_t *const *wrow, int64_t b,
                       int full, __mmask64 m, const float *const *sd, int lpg_shift, int64_t g0,
                       __m512i idx, block_acts x, int64_t pf_dist, __m512 *acc)
{
    #pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        __m512i lo, hi;
        load_codes(q4, mx, wrow[i] + 64 * b, full, m, pf_dist, &lo, &hi);
        __m512 c = lane_scales(bcast, lpg_shift, idx, sd[i], g0);
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(block_dot(q4, lo, hi, x)), c, acc[i]);
        __asm__ volatile("" ::: "memory"); /* each row's work together, as in affine_rows */
    }
}

/* R rows of codes against one quantized activation row:
 *   out[i] = sum_g sd_i[g] * dot_g(q_i, xq) + (bias part, bacc[i])
 * where sd = scale * dx. q4: packed 4-bit codes against the Q4 layout; else
 * bytes against the Q8 layout. lpg_shift: log2 of 32-bit lanes per group;
 * bcast: lpg_shift >= 4 (a block lies in one group). pf_dist: prefetch
 * distance in bytes (0: prefetches the block itself, i.e. nothing). */
INLINE void lane_rows(int R, int q4, int bcast, int mx, const uint8_t *const *wrow, int64_t rowbytes,
                        const float *const *sd, const __m512 *bacc, const exo_qact *qa,
                        int lpg_shift, int64_t pf_dist, float *out)
{
    __m512 acc[EXO_GEMV_ROWS];
    #pragma GCC unroll 8
    for (int i = 0; i < R; i++)
        acc[i] = bacc[i];
    /* lane -> group offset inside a block */
    const __m512i idx = _mm512_srli_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        (unsigned)(bcast ? 0 : lpg_shift));
    const int64_t nfull = rowbytes / 64;
    const int64_t tail = rowbytes % 64;
    for (int64_t b = 0; b < nfull; b++)
        lane_block(R, q4, bcast, mx, wrow, b, 1, 0, sd, lpg_shift, (b << 4) >> lpg_shift, idx,
                   load_acts(q4, qa, b), pf_dist, acc);
    if (tail)
        lane_block(R, q4, bcast, mx, wrow, nfull, 0, mask64(tail), sd, lpg_shift, (nfull << 4) >> lpg_shift,
                   idx, load_acts(q4, qa, nfull), 0, acc);
    if (R == 4) {
        _mm_storeu_ps(out, reduce4(acc[0], acc[1], acc[2], acc[3]));
    } else {
        #pragma GCC unroll 8
        for (int i = 0; i < R; i++)
            out[i] = _mm512_reduce_add_ps(acc[i]);
    }
}

/* Constant-argument instances, so each loop is compiled without branches. */
/* (mx implies q4 and group 32, so bcast is 0) */
static void lane_rows4(int q4, int bcast, int mx, const uint8_t *const *wrow, int64_t rowbytes,
                         const float *const *sd, const __m512 *bacc, const exo_qact *qa,
                         int lpg_shift, int64_t pf_dist, float *out)
{
    if (mx)
        lane_rows(4, 1, 0, 1, wrow, rowbytes, sd, bacc, qa, 2, pf_dist, out);
    else if (q4 && bcast)
        lane_rows(4, 1, 1, 0, wrow, rowbytes, sd, bacc, qa, lpg_shift, pf_dist, out);
    else if (q4 && lpg_shift == 3)
        lane_rows(4, 1, 0, 0, wrow, rowbytes, sd, bacc, qa, 3, pf_dist, out);
    else if (q4)
        lane_rows(4, 1, 0, 0, wrow, rowbytes, sd, bacc, qa, lpg_shift, pf_dist, out);
    else if (bcast)
        lane_rows(4, 0, 1, 0, wrow, rowbytes, sd, bacc, qa, lpg_shift, pf_dist, out);
    else if (lpg_shift == 3)
        lane_rows(4, 0, 0, 0, wrow, rowbytes, sd, bacc, qa, 3, pf_dist, out);
    else
        lane_rows(4, 0, 0, 0, wrow, rowbytes, sd, bacc, qa, lpg_shift, pf_dist, out);
}

static void lane_rows1(int q4, int bcast, int mx, const uint8_t *const *wrow, int64_t rowbytes,
                         const float *const *sd, const __m512 *bacc, const exo_qact *qa,
                         int lpg_shift, float *out)
{
    if (mx)
        lane_rows(1, 1, 0, 1, wrow, rowbytes, sd, bacc, qa, 2, 0, out);
    else if (q4 && bcast)
        lane_rows(1, 1, 1, 0, wrow, rowbytes, sd, bacc, qa, lpg_shift, 0, out);
    else if (q4)
        lane_rows(1, 1, 0, 0, wrow, rowbytes, sd, bacc, qa, lpg_shift, 0, out);
    else if (bcast)
        lane_rows(1, 0, 1, 0, wrow, rowbytes, sd, bacc, qa, lpg_shift, 0, out);
    else
        lane_rows(1, 0, 0, 0, wrow, rowbytes, sd, bacc, qa, lpg_shift, 0, out);
}

/* lane_rows for X rows [0, TT) of qa at once, on EXO_GEMV_ROWS rows of
 * codes (sd, bacc and out: TT groups of EXO_GEMV_ROWS, X row by X row):
 * a block of a row's codes is loaded and split into nibbles once for all
 * TT, the activations come from L1 as operands. Each (row, X row) pair
 * accumulates its blocks in lane_block's order with the same integer
 * dot products, and reduces as lane_rows does, so its result is the
 * same bits as a pass of that X row alone: batched decode rows get what
 * they get alone. */
INLINE void lane_rows_x(int TT, int q4, int bcast, int mx, const uint8_t *const *wrow, int64_t rowbytes,
                          const float *const *sd, const __m512 *bacc, const exo_qact *qa, int lpg_shift,
                          int64_t pf_dist, float *out)
{
    enum { R = EXO_GEMV_ROWS };
    __m512 acc[LANE_XTILE * R];
    #pragma GCC unroll 16
    for (int k = 0; k < TT * R; k++)
        acc[k] = bacc[k];
    const __m512i idx = _mm512_srli_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        (unsigned)(bcast ? 0 : lpg_shift));
    const int64_t nfull = rowbytes / 64, tail = rowbytes % 64;
    for (int64_t b = 0; b < nfull + (tail != 0); b++) {
        const int full = b < nfull;
        const __mmask64 m = full ? ~(__mmask64)0 : mask64(tail);
        const int64_t g0 = (b << 4) >> lpg_shift;
        block_acts x[LANE_XTILE];
        #pragma GCC unroll 4
        for (int t = 0; t < TT; t++)
            x[t] = load_acts(q4, &qa[t], b);
        #pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            __m512i lo, hi;
            load_codes(q4, mx, wrow[i] + 64 * b, full, m, pf_dist, &lo, &hi);
            #pragma GCC unroll 4
            for (int t = 0; t < TT; t++) {
                __m512i d = block_dot(q4, lo, hi, x[t]);
                __m512 c = lane_scales(bcast, lpg_shift, idx, sd[t * R + i], g0);
                acc[t * R + i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), c, acc[t * R + i]);
            }
            __asm__ volatile("" ::: "memory"); /* each row's work together, as in lane_block */
        }
    }
    #pragma GCC unroll 4
    for (int t = 0; t < TT; t++)
        _mm_storeu_ps(out + t * R, reduce4(acc[t * R], acc[t * R + 1], acc[t * R + 2], acc[t * R + 3]));
}

/* Constant-argument instances of lane_rows_x (see lane_rows4). */
#define LANE_ROWS_X_CASES(TT)                                                                                      \
    do {                                                                                                      \
        if (mx)                                                                                               \
            lane_rows_x(TT, 1, 0, 1, wrow, rowbytes, sd, bacc, qa, 2, pf_dist, out);                        \
        else if (q4 && bcast)                                                                                 \
            lane_rows_x(TT, 1, 1, 0, wrow, rowbytes, sd, bacc, qa, lpg_shift, pf_dist, out);                \
        else if (q4 && lpg_shift == 3)                                                                        \
            lane_rows_x(TT, 1, 0, 0, wrow, rowbytes, sd, bacc, qa, 3, pf_dist, out);                        \
        else if (q4)                                                                                          \
            lane_rows_x(TT, 1, 0, 0, wrow, rowbytes, sd, bacc, qa, lpg_shift, pf_dist, out);                \
        else if (bcast)                                                                                       \
            lane_rows_x(TT, 0, 1, 0, wrow, rowbytes, sd, bacc, qa, lpg_shift, pf_dist, out);                \
        else if (lpg_shift == 3)                                                                              \
            lane_rows_x(TT, 0, 0, 0, wrow, rowbytes, sd, bacc, qa, 3, pf_dist, out);                        \
        else                                                                                                  \
            lane_rows_x(TT, 0, 0, 0, wrow, rowbytes, sd, bacc, qa, lpg_shift, pf_dist, out);                \
    } while (0)

static void lane_rows_xtile(int q4, int bcast, int mx, const uint8_t *const *wrow, int64_t rowbytes,
                              const float *const *sd, const __m512 *bacc, const exo_qact *qa, int lpg_shift,
                              int64_t pf_dist, float *out)
{
    LANE_ROWS_X_CASES(LANE_XTILE);
}

/* log2 of the 32-bit lanes of a 64-byte block one group of G covers: 4-bit
 * codes (Q4 layout) G/8, bytes G/4. */
static int lpg_shift_of(int bits, int G)
{
    int v = (bits == 4 ? G * 4 : G * 8) / 32, s = 0;
    while ((1 << s) < v)
        s++;
    return s;
}

/* Row r's scales (and biases, a line at a time) into L1, one super-block
 * ahead as the codes are. Without it each row block's prep_row waited on
 * their DRAM misses before its products could start: rows of a few KiB
 * have their scales in lines the hardware prefetchers miss (rows a page
 * apart), and on a Zen 5 guest an 8192 x 2048 q4 GEMV from DRAM read at
 * 15-24 GB/s on one core, 37-38 with this; 2048 x 8192 32-35 -> 41-42
 * (llama-3.2-1b q4 decode 39-40 -> 66 tok/s at the same probed bandwidth). */
static void prefetch_params(const exo_linear *w, int mx, int64_t r, int64_t ng)
{
    /* The scale's size asked here, each row block, not once a call and
     * passed in: that form (a6a6ffa), the same prefetches, made GCC 12
     * compile gemv_q_avx512 into a much slower function: on a Zen 5 guest,
     * alternating in one hour, llama-3.2-1b q4 decode 35-42 tok/s against
     * 45-77 with this one, qwen3-0.6b q4 71-79 against 97-139, q8 35-36
     * against 36-37. Not the call's placement (a noinline prefetch_params
     * taking the size was as slow), loop alignment or vzeroupper; the cause
     * is not found, so measure this function against its previous build
     * before changing it. */
    const int64_t esz = mx ? 1 : (int64_t)exo_dtype_size(w->dtype);
    const char *sc = (const char *)w->scales + r * ng * esz, *bi = mx ? NULL : (const char *)w->biases + r * ng * esz;
    for (int64_t o = 0; o < ng * esz; o += 64) {
        _mm_prefetch(sc + o, _MM_HINT_T0);
        if (bi)
            _mm_prefetch(bi + o, _MM_HINT_T0);
    }
}

/* Affine and MXFP4 rows [r0, r1) (mx: the format is MXFP4). */
static void gemv_q_avx512(const exo_linear *w, int mx, int64_t r0, int64_t r1, int T,
                          const exo_qact *qa, float *y, int64_t ldy, exo_gemv_scratch *s)
{
    const int64_t cols = w->cols;
    const int bits = mx ? 4 : w->bits, G = mx ? 32 : w->group_size;
    const int64_t ng = cols / G;
    const int64_t wbytes = cols * bits / 8; /* bytes of codes per row */
    const int q4 = bits == 4, q8 = bits == 8;
    const int64_t rowbytes = (q4 || q8) ? wbytes : cols;
    const int lpg_shift = lpg_shift_of(q4 ? 4 : 8, G);
    const uint8_t *base = w->w;
    /* rows sharing a page go to different row blocks (see the top) */
    const int64_t S = exo_gemv_page_stride(wbytes);
    const int64_t SB = EXO_GEMV_ROWS * S;
    for (int64_t sb = r0; sb < r1; sb += SB) {
        const int strided = S > 1 && sb + SB <= r1;
        const int64_t end = sb + SB < r1 ? sb + SB : r1;
        const int64_t nblocks = strided ? S : (end - sb + EXO_GEMV_ROWS - 1) / EXO_GEMV_ROWS;
        for (int64_t j = 0; j < nblocks; j++) {
            int64_t rix[EXO_GEMV_ROWS];
            const uint8_t *wrow[EXO_GEMV_ROWS];
            int R = exo_gemv_block_rows(sb, j, S, strided, end, rix);
            for (int i = 0; i < R; i++) /* as the codes' prefetch, for prep_row */
                if (rix[i] + SB < r1)
                    prefetch_params(w, mx, rix[i] + SB, ng);
            for (int i = 0; i < R; i++) {
                const uint8_t *codes = base + (size_t)rix[i] * (size_t)wbytes;
                if (q4 || q8) {
                    wrow[i] = codes;
                } else {
                    uint8_t *u = s->codes + i * s->code_stride;
                    unpack_row_avx512(codes, cols, bits, u);
                    wrow[i] = u;
                }
            }
            /* several X rows: the rows' scales and biases as f32 once */
            if (T > 1)
                for (int i = 0; i < R; i++)
                    exo_gemv_row_params(w, mx, rix[i], ng, 0, ng, row_sc(s, i), row_bi(s, i));
            for (int t = 0; t < T;) {
                /* full row blocks take two X rows a pass where there are two */
                const int tt = R == EXO_GEMV_ROWS && T - t >= 2 ? 2 : 1;
                float out[2 * EXO_GEMV_ROWS];
                const float *sdx[2 * EXO_GEMV_ROWS];
                __m512 baccx[2 * EXO_GEMV_ROWS];
                for (int k = 0; k < tt * R; k++) {
                    const int i = k % R;
                    const exo_qact *q = &qa[t + k / R];
                    float *sdk = s->sd + k * s->sf_stride;
                    if (T > 1)
                        baccx[k] = prep_pair(mx, row_sc(s, i), row_bi(s, i), ng, q, sdk);
                    else
                        baccx[k] = mx ? prep_row_mx(w, rix[i], ng, q, sdk) : prep_row(w, rix[i], ng, q, sdk);
                    sdx[k] = sdk;
                }
                /* one super-block ahead, on the first pass over packed codes
                 * only (later passes find them in L1/L2) */
                const int64_t pf = (t == 0 && (q4 || q8)) ? SB * wbytes : 0;
                if (s->group_sums) {
                    if (tt == 2)
                        affine_rows4x2(q4, mx, lpg_shift, wrow, rowbytes, sdx, baccx, &qa[t], pf, out);
                    else if (R == EXO_GEMV_ROWS)
                        affine_rows4(q4, mx, lpg_shift, wrow, rowbytes, sdx, baccx, &qa[t], pf, out);
                    else
                        for (int i = 0; i < R; i++)
                            affine_rows1(q4, mx, lpg_shift, &wrow[i], rowbytes, &sdx[i], &baccx[i], &qa[t],
                                         &out[i]);
                } else {
                    const int bcast = lpg_shift >= 4;
                    if (tt == 2)
                        lane_rows_xtile(q4, bcast, mx, wrow, rowbytes, sdx, baccx, &qa[t], lpg_shift, pf, out);
                    else if (R == EXO_GEMV_ROWS)
                        lane_rows4(q4, bcast, mx, wrow, rowbytes, sdx, baccx, &qa[t], lpg_shift, pf, out);
                    else
                        for (int i = 0; i < R; i++)
                            lane_rows1(q4, bcast, mx, &wrow[i], rowbytes, &sdx[i], &baccx[i], &qa[t], lpg_shift,
                                       &out[i]);
                }
                for (int k = 0; k < tt * R; k++)
                    y[(int64_t)(t + k / R) * ldy + rix[k % R]] = tt == 2 ? out[k] : out[k % R];
                t += tt;
            }
        }
    }
}

void exo_gemv_affine_avx512(const exo_linear *w, int64_t r0, int64_t r1, int T,
                            const exo_qact *qa, float *y, int64_t ldy, exo_gemv_scratch *s)
{
    gemv_q_avx512(w, 0, r0, r1, T, qa, y, ldy, s);
}

void exo_gemv_mxfp4_avx512(const exo_linear *w, int64_t r0, int64_t r1, int T,
                           const exo_qact *qa, float *y, int64_t ldy, exo_gemv_scratch *s)
{
    gemv_q_avx512(w, 1, r0, r1, T, qa, y, ldy, s);
}

/* ---------------------------------------------------------------------- */
/* Dense GEMV                                                             */

INLINE __m512 load16_w(exo_dtype t, const void *row, int64_t c, __mmask16 m)
{
    return load16_param(t, row, c, m);
}

INLINE void dense_rows(int R, exo_dtype dt, const void *const *wrow, const float *x, int64_t cols,
                       int64_t pf_dist, float *out)
{
    const int64_t esz = dt == EXO_DTYPE_F32 ? 4 : 2;
    __m512 acc[EXO_GEMV_ROWS], acc2[EXO_GEMV_ROWS];
    #pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        acc[i] = _mm512_setzero_ps();
        acc2[i] = _mm512_setzero_ps();
    }
    int64_t c = 0;
    for (; c + 32 <= cols; c += 32) {
        __m512 x0 = _mm512_loadu_ps(x + c), x1 = _mm512_loadu_ps(x + c + 16);
        #pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            if (pf_dist) /* one row block ahead, see affine_rows */
                _mm_prefetch((const char *)wrow[i] + c * esz + pf_dist, _MM_HINT_T1);
            acc[i] = _mm512_fmadd_ps(load16_w(dt, wrow[i], c, 0xffff), x0, acc[i]);
            acc2[i] = _mm512_fmadd_ps(load16_w(dt, wrow[i], c + 16, 0xffff), x1, acc2[i]);
        }
    }
    for (; c < cols; c += 16) {
        __mmask16 m = mask16(cols - c);
        __m512 x0 = _mm512_maskz_loadu_ps(m, x + c);
        #pragma GCC unroll 8
        for (int i = 0; i < R; i++)
            acc[i] = _mm512_fmadd_ps(load16_w(dt, wrow[i], c, m), x0, acc[i]);
    }
    #pragma GCC unroll 8
    for (int i = 0; i < R; i++)
        out[i] = _mm512_reduce_add_ps(_mm512_add_ps(acc[i], acc2[i]));
}

/* dense_rows with the type a constant in each branch, so every (rows,
 * type) pair the callers name is compiled as its own kernel. */
INLINE void dense_rows_typed(int R, exo_dtype dt, const void *const *wrow, const float *x, int64_t cols,
                             int64_t pf_dist, float *out)
{
    if (dt == EXO_DTYPE_BF16)
        dense_rows(R, EXO_DTYPE_BF16, wrow, x, cols, pf_dist, out);
    else if (dt == EXO_DTYPE_F16)
        dense_rows(R, EXO_DTYPE_F16, wrow, x, cols, pf_dist, out);
    else
        dense_rows(R, EXO_DTYPE_F32, wrow, x, cols, pf_dist, out);
}

void exo_gemv_dense_avx512(const exo_linear *w, int64_t r0, int64_t r1, int T, const float *x,
                           float *y, int64_t ldy)
{
    const int64_t cols = w->cols;
    const size_t esz = exo_dtype_size(w->dtype);
    const unsigned char *base = w->w;
    const exo_dtype dt = w->dtype;
    for (int64_t r = r0; r < r1; r += EXO_GEMV_ROWS) {
        int R = r1 - r >= EXO_GEMV_ROWS ? EXO_GEMV_ROWS : (int)(r1 - r);
        const void *wrow[EXO_GEMV_ROWS];
        for (int i = 0; i < R; i++)
            wrow[i] = base + (size_t)(r + i) * (size_t)cols * esz;
        for (int t = 0; t < T; t++) {
            float out[EXO_GEMV_ROWS];
            const float *xt = x + (int64_t)t * cols;
            if (T == 1) {
                /* one sequence: a row at a time, one stream read front to back
                 * with the next row prefetched (llama-3.2-1b bf16 decode on a Zen 5
                 * guest: 74-81% of the reads paired with its tokens as four rows'
                 * streams, 82-97% so); a row's sums are the same bits either way */
                for (int i = 0; i < R; i++)
                    dense_rows_typed(1, dt, &wrow[i], xt, cols, cols * (int64_t)esz, &out[i]);
            } else if (R == EXO_GEMV_ROWS) {
                int64_t pf = t == 0 ? EXO_GEMV_ROWS * cols * (int64_t)esz : 0;
                dense_rows_typed(EXO_GEMV_ROWS, dt, wrow, xt, cols, pf, out);
            } else {
                for (int i = 0; i < R; i++)
                    dense_rows_typed(1, dt, &wrow[i], xt, cols, 0, &out[i]);
            }
            for (int i = 0; i < R; i++)
                y[(int64_t)t * ldy + r + i] = out[i];
        }
    }
}

/* ---------------------------------------------------------------------- */
/* Expansion to bf16 for the GEMM path                                    */

INLINE void store_bf16x16(uint16_t *dst, __m512 v)
{
    _mm256_storeu_si256((__m256i *)dst, (__m256i)_mm512_cvtneps_pbh(v));
}

void exo_f32_to_bf16_avx512(const float *x, int64_t n, uint16_t *out)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        store_bf16x16(out + i, _mm512_loadu_ps(x + i));
    if (i < n) {
        __mmask16 m = mask16(n - i);
        __m256i h = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + i));
        _mm256_mask_storeu_epi16(out + i, m, h);
    }
}

/* MXFP4 rows to bf16, exactly (an e2m1 value times a power of two has at
 * most two significant bits): per group of 32, the 16 e2m1 values times
 * the group's scale form a bf16 table, and one vpermw looks the 32 codes
 * up. The 16 code bytes are widened to 32-bit lanes holding code 2b in the
 * low and code 2b+1 in the high 16 bits, i.e. the codes in element order.
 * (vcvtneps2bf16 flushes subnormals: values below 2^-126, i.e. only scale
 * bytes 0 and 1, would become zero.) */
static void dequant_rows_mx_bf16(const exo_linear *w, int64_t r0, int64_t r1, uint16_t *out)
{
    const int64_t cols = w->cols, ng = cols / 32;
    const uint8_t *base = w->w, *scales = w->scales;
    const __m512 lut = _mm512_loadu_ps(exo_fp4_e2m1);
    const __m512i lo = _mm512_set1_epi32(0x0f), hi = _mm512_set1_epi32(0xf0);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *src = base + (size_t)r * (size_t)(cols / 2);
        const uint8_t *sc = scales + (size_t)r * (size_t)ng;
        uint16_t *o = out + (r - r0) * cols;
        for (int64_t g = 0; g < ng; g++) {
            __m512 t = _mm512_mul_ps(lut, _mm512_set1_ps(exo_e8m0_to_f32(sc[g])));
            __m512i tab = _mm512_castsi256_si512((__m256i)_mm512_cvtneps_pbh(t));
            __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(src + 16 * g)));
            __m512i idx = _mm512_or_si512(_mm512_and_si512(b, lo),
                                          _mm512_slli_epi32(_mm512_and_si512(b, hi), 12));
            _mm512_storeu_si512(o + 32 * g, _mm512_permutexvar_epi16(idx, tab));
        }
    }
}

void exo_dequant_rows_bf16_avx512(const exo_linear *w, int64_t r0, int64_t r1, uint16_t *out,
                                  uint8_t *codes)
{
    const int64_t cols = w->cols;
    if (w->format == EXO_WFORMAT_DENSE) {
        const size_t esz = exo_dtype_size(w->dtype);
        const unsigned char *base = w->w;
        for (int64_t r = r0; r < r1; r++) {
            const void *row = base + (size_t)r * (size_t)cols * esz;
            uint16_t *o = out + (r - r0) * cols;
            if (w->dtype == EXO_DTYPE_BF16) {
                memcpy(o, row, (size_t)cols * 2);
                continue;
            }
            int64_t c = 0;
            for (; c < cols; c += 16) {
                __mmask16 m = mask16(cols - c);
                __m256i h = (__m256i)_mm512_cvtneps_pbh(load16_param(w->dtype, row, c, m));
                _mm256_mask_storeu_epi16(o + c, m, h);
            }
        }
        return;
    }
    if (w->format == EXO_WFORMAT_MXFP4) {
        dequant_rows_mx_bf16(w, r0, r1, out);
        return;
    }
    const int bits = w->bits, G = w->group_size;
    const int64_t ng = cols / G;
    const int64_t wbytes = cols * bits / 8;
    const uint8_t *base = w->w;
    const __m128i nib = _mm_set1_epi16(0x000f), nibhi = _mm_set1_epi16(0x0f00);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *src = base + (size_t)r * (size_t)wbytes;
        uint16_t *o = out + (r - r0) * cols;
        if (bits != 4 && bits != 8) {
            unpack_row_avx512(src, cols, bits, codes);
            src = codes;
        }
        for (int64_t g = 0; g < ng; g++) {
            __m512 s = _mm512_set1_ps(exo_affine_param_f32(w->dtype, w->scales, r * ng + g));
            __m512 b = _mm512_set1_ps(exo_affine_param_f32(w->dtype, w->biases, r * ng + g));
            for (int j = 0; j < G; j += 16) {
                int64_t c = g * G + j;
                __m128i q;
                if (bits == 4) {
                    __m128i x8 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(src + c / 2)));
                    q = _mm_or_si128(_mm_and_si128(x8, nib),
                                     _mm_and_si128(_mm_slli_epi16(x8, 4), nibhi));
                } else {
                    q = _mm_loadu_si128((const __m128i *)(src + c));
                }
                __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q));
                store_bf16x16(o + c, _mm512_fmadd_ps(v, s, b));
            }
        }
    }
}
