/* AVX2 decode GEMV for affine and dense weights, for CPUs without the
 * AVX-512 kernels (gemv_avx512.c; MXFP4 has its own AVX2 file).
 *
 * Affine rows take the AVX-512 kernel's arithmetic (the top of
 * gemv_avx512.c): X quantized per weight group in two int8 levels
 * (exo_qact), a group contributing s_g dx_g dot(q, 256 xq + xq2) + b_g sx_g,
 * the int32 lanes converted to f32 and multiplied by their group's s_g dx_g
 * (its "lane sums" family), the row reduced once at the end. Without VNNI
 * the byte products are vpmaddubsw (unsigned x signed bytes, pairs summed
 * to s16, saturating) and vpmaddwd (pairs to s32, the first level times
 * 256):
 *  - 4-bit codes (0..15, EXO_QLAYOUT_Q4: low nibbles against the even
 *    elements, high nibbles the odd ones) go in as they are: a pair is at
 *    most 2 * 15 * 127;
 *  - byte codes (8-bit, and 2/3/5/6-bit unpacked to bytes first, Q8
 *    layout) would saturate (2 * 255 * 127), so they are centred, c = q -
 *    128, and multiplied as |c| (0..128, unsigned) by xq with c's sign
 *    (vpsignb): a pair is at most 2 * 128 * 127 = 32512. The 128 comes
 *    back in the bias: b'_g = b_g + 128 s_g, since sx_g = dx_g sum(xhat).
 * Dense rows multiply X itself: bf16 and f16 converted to f32, four rows
 * at once, 8 partial sums a row; f32 rows (the test models' exact format)
 * in double, whose parity limits f32 sums missed (qwen3_next-f32 0.00126
 * against 0.001 with 8 partial sums, 0.00109 with 32).
 *
 * EXO_GEMV_ROWS rows share X's loads; rows of a block lie a page apart and
 * the next super-block is prefetched, as in the AVX-512 kernel. Each row
 * of X is its own pass with the same instructions, so a row gets the same
 * bits at any row count (a batch of decode rows gives each sequence what
 * it would get alone). Reads stay inside the rows. */
#include "engine/cpu/kernels.h"
#include "engine/quant.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

INLINE float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Eight f32, bf16 or f16 values from p + i as f32. */
INLINE __m256 load8_f32(exo_dtype t, const void *p, int64_t i)
{
    if (t == EXO_DTYPE_F32)
        return _mm256_loadu_ps((const float *)p + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    if (t == EXO_DTYPE_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

/* ---------------------------------------------------------------------- */
/* Affine                                                                 */

/* sd[g] = s_g * dx_g of row r (zero-padded by 8 past ng) and the row's
 * bias term sum_g (b_g + centre * s_g) * sx_g. */
INLINE float prep_row_as(exo_dtype t, const exo_linear *w, int64_t r, int64_t ng, const exo_qact *qa, float centre,
                         float *sd)
{
    const size_t ps = t == EXO_DTYPE_F32 ? 4 : 2;
    const char *sc = (const char *)w->scales + (size_t)(r * ng) * ps;
    const char *bi = (const char *)w->biases + (size_t)(r * ng) * ps;
    const __m256 vc = _mm256_set1_ps(centre);
    __m256 bacc = _mm256_setzero_ps();
    int64_t g = 0;
    for (; g + 8 <= ng; g += 8) {
        __m256 s = load8_f32(t, sc, g), b = _mm256_fmadd_ps(vc, s, load8_f32(t, bi, g));
        _mm256_storeu_ps(sd + g, _mm256_mul_ps(s, _mm256_loadu_ps(qa->dx + g)));
        bacc = _mm256_fmadd_ps(b, _mm256_loadu_ps(qa->sx + g), bacc);
    }
    float bias = hsum8(bacc);
    for (; g < ng; g++) { /* one by one: the parameters may end the mapping */
        float s = exo_affine_param_f32(t, sc, g), b = fmaf(centre, s, exo_affine_param_f32(t, bi, g));
        sd[g] = s * qa->dx[g];
        bias = fmaf(b, qa->sx[g], bias);
    }
    _mm256_storeu_ps(sd + ng, _mm256_setzero_ps());
    return bias;
}

static float prep_row(const exo_linear *w, int64_t r, int64_t ng, const exo_qact *qa, float centre, float *sd)
{
    switch (w->dtype) {
    case EXO_DTYPE_F32: return prep_row_as(EXO_DTYPE_F32, w, r, ng, qa, centre, sd);
    case EXO_DTYPE_F16: return prep_row_as(EXO_DTYPE_F16, w, r, ng, qa, centre, sd);
    default: return prep_row_as(EXO_DTYPE_BF16, w, r, ng, qa, centre, sd);
    }
}

/* The scales and biases of row r into L1 ahead of their use (a row's
 * codes are prefetched a super-block ahead; without its parameters too
 * each row block waited on their loads). */
static void prefetch_params(const exo_linear *w, int64_t r, int64_t ng)
{
    const size_t bytes = (size_t)ng * exo_dtype_size(w->dtype);
    const char *sc = (const char *)w->scales + (size_t)r * bytes, *bi = (const char *)w->biases + (size_t)r * bytes;
    for (size_t o = 0; o < bytes; o += 64) {
        _mm_prefetch(sc + o, _MM_HINT_T0);
        _mm_prefetch(bi + o, _MM_HINT_T0);
    }
}
/* A chunk's s_g dx_g for its 8 lanes: with groups of 32, chunk k of 64
 * nibble codes spans groups 2k (lanes 0-3) and 2k + 1; else one group. */
INLINE __m256 chunk_scales(const float *sd, int64_t first_group, int two)
{
    if (two)
        return _mm256_permutevar8x32_ps(_mm256_loadu_ps(sd + first_group), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
    return _mm256_broadcast_ss(sd + first_group);
}

/* The R rows of a block lie rstride bytes apart (a page run apart, or
 * consecutive), their s_g dx_g sdstride floats apart: one pointer each,
 * so the loop keeps its rows and scales in registers. */
typedef struct row_block {
    const uint8_t *w;
    int64_t rstride;
    const float *sd;
    int64_t sdstride;
} row_block;

/* 32 bytes of 4-bit codes (chunk k: elements 64k .. 64k + 63) of R rows;
 * tail: only the first 16 bytes exist. Groups of 2^gshift elements. */
INLINE void nibble_chunk(int R, row_block b, int64_t k, int tail, int g32, int gshift, const exo_qact *qa,
                         __m256 *acc)
{
    const __m256i nib = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1), x256 = _mm256_set1_epi16(256);
    const int64_t xo = 128 * (k >> 1) + 32 * (k & 1), g = (64 * k) >> gshift;
    const __m256i xa = _mm256_loadu_si256((const __m256i *)(qa->q + xo));
    const __m256i xb = _mm256_loadu_si256((const __m256i *)(qa->q + xo + 64));
    const __m256i xa2 = _mm256_loadu_si256((const __m256i *)(qa->q2 + xo));
    const __m256i xb2 = _mm256_loadu_si256((const __m256i *)(qa->q2 + xo + 64));
    #pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        const uint8_t *p = b.w + i * b.rstride + 32 * k;
        __m256i v = tail ? _mm256_inserti128_si256(_mm256_setzero_si256(), _mm_loadu_si128((const __m128i *)p), 0)
                         : _mm256_loadu_si256((const __m256i *)p);
        __m256i lo = _mm256_and_si256(v, nib), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
        __m256i s1 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xa), _mm256_maddubs_epi16(hi, xb));
        __m256i s2 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xa2), _mm256_maddubs_epi16(hi, xb2));
        __m256i d = _mm256_add_epi32(_mm256_madd_epi16(s1, x256), _mm256_madd_epi16(s2, ones));
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), chunk_scales(b.sd + i * b.sdstride, g, g32), acc[i]);
    }
}

/* 32 byte codes (chunk k: elements 32k .. 32k + 31) of R rows, centred. */
INLINE void byte_chunk(int R, row_block b, int64_t k, int gshift, const exo_qact *qa, __m256 *acc)
{
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1), x256 = _mm256_set1_epi16(256);
    const __m256i xa = _mm256_loadu_si256((const __m256i *)(qa->q + 32 * k));
    const __m256i xa2 = _mm256_loadu_si256((const __m256i *)(qa->q2 + 32 * k));
    const int64_t g = (32 * k) >> gshift;
    #pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        const uint8_t *p = b.w + i * b.rstride + 32 * k;
        __m256i c = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)p), flip); /* q - 128, signed */
        __m256i mag = _mm256_abs_epi8(c);                                            /* 0..128, unsigned */
        __m256i s1 = _mm256_maddubs_epi16(mag, _mm256_sign_epi8(xa, c));
        __m256i s2 = _mm256_maddubs_epi16(mag, _mm256_sign_epi8(xa2, c));
        __m256i d = _mm256_add_epi32(_mm256_madd_epi16(s1, x256), _mm256_madd_epi16(s2, ones));
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_broadcast_ss(b.sd + i * b.sdstride + g), acc[i]);
    }
}

/* Each row's 64-byte line pf_dist ahead of chunk k (0: none). */
INLINE void prefetch_rows(int R, row_block b, int64_t k, int64_t pf_dist)
{
    if (!pf_dist)
        return;
    #pragma GCC unroll 8
    for (int i = 0; i < R; i++)
        _mm_prefetch((const char *)b.w + i * b.rstride + 32 * k + pf_dist, _MM_HINT_T0);
}

/* R rows of codes (nibbles: rowbytes = cols / 2; bytes: cols) against one
 * row of X, two chunks (a cache line of each row) a step. */
INLINE void affine_rows(int R, int nibbles, int g32, row_block b, int64_t rowbytes, int gshift, const float *bias,
                        const exo_qact *qa, int64_t pf_dist, float *out)
{
    __m256 acc[EXO_GEMV_ROWS];
    #pragma GCC unroll 8
    for (int i = 0; i < R; i++)
        acc[i] = _mm256_setzero_ps();
    const int64_t nfull = rowbytes / 32; /* cols is a multiple of the group, at least 32 */
    int64_t k = 0;
    for (; k + 2 <= nfull; k += 2) {
        prefetch_rows(R, b, k, pf_dist);
        if (nibbles) {
            nibble_chunk(R, b, k, 0, g32, gshift, qa, acc);
            nibble_chunk(R, b, k + 1, 0, g32, gshift, qa, acc);
        } else {
            byte_chunk(R, b, k, gshift, qa, acc);
            byte_chunk(R, b, k + 1, gshift, qa, acc);
        }
    }
    if (k < nfull)
        nibbles ? nibble_chunk(R, b, k, 0, g32, gshift, qa, acc) : byte_chunk(R, b, k, gshift, qa, acc);
    if (nibbles && rowbytes % 32)
        nibble_chunk(R, b, nfull, 1, g32, gshift, qa, acc);
    #pragma GCC unroll 8
    for (int i = 0; i < R; i++)
        out[i] = hsum8(acc[i]) + bias[i];
}

/* One function per (rows, codes, groups of 32 or not), each compiled with
 * its rows in registers and its group arithmetic constant but a shift. */
typedef void rows_fn(row_block b, int64_t rowbytes, int gshift, const float *bias, const exo_qact *qa,
                     int64_t pf_dist, float *out);
#define ROWS_FN(name, R, nibbles, g32)                                                                        \
    static void name(row_block b, int64_t rowbytes, int gshift, const float *bias, const exo_qact *qa,        \
                     int64_t pf_dist, float *out)                                                             \
    {                                                                                                         \
        affine_rows(R, nibbles, g32, b, rowbytes, g32 ? 5 : gshift, bias, qa, pf_dist, out);                  \
    }
ROWS_FN(nibbles4_g32, EXO_GEMV_ROWS, 1, 1)
ROWS_FN(nibbles4, EXO_GEMV_ROWS, 1, 0)
ROWS_FN(bytes4, EXO_GEMV_ROWS, 0, 0)
ROWS_FN(nibbles1_g32, 1, 1, 1)
ROWS_FN(nibbles1, 1, 1, 0)
ROWS_FN(bytes1, 1, 0, 0)

void exo_gemv_affine_avx2(const exo_linear *w, int64_t r0, int64_t r1, int T, const exo_qact *qa, float *y,
                          int64_t ldy, exo_gemv_scratch *s)
{
    const int64_t cols = w->cols, G = w->group_size, ng = cols / G;
    const int nibbles = w->bits == 4, unpack = w->bits != 4 && w->bits != 8;
    const int64_t wbytes = cols * w->bits / 8, rowbytes = nibbles ? cols / 2 : cols;
    const uint8_t *base = w->w;
    const int64_t S = exo_gemv_page_stride(wbytes);
    const int64_t SB = EXO_GEMV_ROWS * S;
    const float centre = nibbles ? 0.0f : 128.0f;
    const int gshift = __builtin_ctzll((unsigned long long)G); /* a power of two (has_gemv_kernel) */
    rows_fn *four = nibbles ? (G == 32 ? nibbles4_g32 : nibbles4) : bytes4;
    rows_fn *one = nibbles ? (G == 32 ? nibbles1_g32 : nibbles1) : bytes1;
    for (int64_t sb = r0; sb < r1; sb += SB) {
        int strided;
        int64_t end;
        const int64_t nblocks = exo_gemv_superblock(sb, r1, S, &strided, &end);
        for (int64_t j = 0; j < nblocks; j++) {
            int64_t rix[EXO_GEMV_ROWS];
            float bias[EXO_GEMV_ROWS];
            const int R = exo_gemv_block_rows(sb, j, S, strided, end, rix);
            /* a whole block's rows are evenly spaced (exo_gemv_block_rows) */
            row_block b = {base + (size_t)rix[0] * (size_t)wbytes, R > 1 ? (rix[1] - rix[0]) * wbytes : 0, s->sd,
                           s->sf_stride};
            if (unpack) { /* 2/3/5/6-bit codes to bytes, once for every row of X */
                for (int i = 0; i < R; i++)
                    exo_affine_unpack_row((const uint32_t *)(base + (size_t)rix[i] * (size_t)wbytes), cols, w->bits,
                                          s->codes + i * s->code_stride);
                b.w = s->codes;
                b.rstride = s->code_stride;
            }
            for (int i = 0; i < R; i++)
                if (rix[i] + SB < r1)
                    prefetch_params(w, rix[i] + SB, ng);
            for (int t = 0; t < T; t++) {
                float out[EXO_GEMV_ROWS];
                for (int i = 0; i < R; i++)
                    bias[i] = prep_row(w, rix[i], ng, &qa[t], centre, s->sd + i * s->sf_stride);
                if (R == EXO_GEMV_ROWS) {
                    four(b, rowbytes, gshift, bias, &qa[t], t == 0 && !unpack ? SB * wbytes : 0, out);
                } else {
                    for (int i = 0; i < R; i++) {
                        row_block bi = {b.w + i * b.rstride, 0, b.sd + i * b.sdstride, 0};
                        one(bi, rowbytes, gshift, &bias[i], &qa[t], 0, &out[i]);
                    }
                }
                for (int i = 0; i < R; i++)
                    y[(int64_t)t * ldy + rix[i]] = out[i];
            }
        }
    }
}

/* ---------------------------------------------------------------------- */
/* Dense                                                                  */

/* R rows against x in f32, a row's 8 lanes of partial sums. */
INLINE void dense_rows(int R, exo_dtype dt, const char *const *wrow, int64_t cols, const float *x, int64_t pf_dist,
                       float *out)
{
    const size_t es = exo_dtype_size(dt);
    const int64_t line = 64 / (int64_t)es - 1; /* elements of a cache line, less one */
    __m256 acc[EXO_GEMV_ROWS];
    #pragma GCC unroll 8
    for (int i = 0; i < R; i++)
        acc[i] = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 8 <= cols; c += 8) {
        const __m256 xv = _mm256_loadu_ps(x + c);
        #pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            if (pf_dist && !(c & line))
                _mm_prefetch(wrow[i] + (size_t)c * es + pf_dist, _MM_HINT_T0);
            acc[i] = _mm256_fmadd_ps(load8_f32(dt, wrow[i], c), xv, acc[i]);
        }
    }
    #pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        float sum = hsum8(acc[i]);
        for (int64_t e = c; e < cols; e++)
            sum = fmaf(exo_affine_param_f32(dt, wrow[i], e), x[e], sum);
        out[i] = sum;
    }
}

/* f32 rows, products and sums in double (four lanes of 4): f32 weights are
 * the test models' exact format, whose parity limits f32 sums miss. */
INLINE void dense_rows_f64(int R, const char *const *wrow, int64_t cols, const float *x, int64_t pf_dist, float *out)
{
    __m256d acc[2][4];
    #pragma GCC unroll 8
    for (int i = 0; i < R; i++)
        for (int j = 0; j < 4; j++)
            acc[i][j] = _mm256_setzero_pd();
    int64_t c = 0;
    for (; c + 16 <= cols; c += 16) {
        __m256d xv[4];
        for (int j = 0; j < 4; j++)
            xv[j] = _mm256_cvtps_pd(_mm_loadu_ps(x + c + 4 * j));
        #pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            const float *wr = (const float *)wrow[i];
            if (pf_dist)
                _mm_prefetch(wrow[i] + (size_t)c * 4 + pf_dist, _MM_HINT_T0);
            for (int j = 0; j < 4; j++)
                acc[i][j] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm_loadu_ps(wr + c + 4 * j)), xv[j], acc[i][j]);
        }
    }
    #pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        __m256d s4 = _mm256_add_pd(_mm256_add_pd(acc[i][0], acc[i][1]), _mm256_add_pd(acc[i][2], acc[i][3]));
        __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
        double sum = _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
        const float *wr = (const float *)wrow[i];
        for (int64_t e = c; e < cols; e++)
            sum += (double)wr[e] * (double)x[e];
        out[i] = (float)sum;
    }
}

/* A block of four rows: bf16 and f16 all four at once; f32 as two pairs
 * (four double accumulators a row leave room for two rows' in the 16
 * registers). */
static void dense_rows4(exo_dtype dt, const char *const *wrow, int64_t cols, const float *x, int64_t pf_dist,
                        float *out)
{
    if (dt == EXO_DTYPE_F32) {
        dense_rows_f64(2, wrow, cols, x, pf_dist, out);
        dense_rows_f64(2, wrow + 2, cols, x, pf_dist, out + 2);
    } else {
        dense_rows(EXO_GEMV_ROWS, dt, wrow, cols, x, pf_dist, out);
    }
}

static void dense_rows1(exo_dtype dt, const char *const *wrow, int64_t cols, const float *x, float *out)
{
    if (dt == EXO_DTYPE_F32)
        dense_rows_f64(1, wrow, cols, x, 0, out);
    else
        dense_rows(1, dt, wrow, cols, x, 0, out);
}

void exo_gemv_dense_avx2(const exo_linear *w, int64_t r0, int64_t r1, int T, const float *x, float *y, int64_t ldy)
{
    const int64_t cols = w->cols, wbytes = cols * (int64_t)exo_dtype_size(w->dtype);
    const char *base = w->w;
    const int64_t S = exo_gemv_page_stride(wbytes);
    const int64_t SB = EXO_GEMV_ROWS * S;
    for (int64_t sb = r0; sb < r1; sb += SB) {
        int strided;
        int64_t end;
        const int64_t nblocks = exo_gemv_superblock(sb, r1, S, &strided, &end);
        for (int64_t j = 0; j < nblocks; j++) {
            int64_t rix[EXO_GEMV_ROWS];
            const char *wrow[EXO_GEMV_ROWS];
            int R = exo_gemv_block_rows(sb, j, S, strided, end, rix);
            for (int i = 0; i < R; i++)
                wrow[i] = base + (size_t)rix[i] * (size_t)wbytes;
            for (int t = 0; t < T; t++) {
                float out[EXO_GEMV_ROWS];
                if (R == EXO_GEMV_ROWS) {
                    dense_rows4(w->dtype, wrow, cols, x + (int64_t)t * cols, t == 0 ? SB * wbytes : 0, out);
                } else {
                    for (int i = 0; i < R; i++)
                        dense_rows1(w->dtype, &wrow[i], cols, x + (int64_t)t * cols, &out[i]);
                }
                for (int i = 0; i < R; i++)
                    y[(int64_t)t * ldy + rix[i]] = out[i];
            }
        }
    }
}
