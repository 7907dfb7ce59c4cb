/* AVX-512 kernels: decode GEMV for affine and dense weights, activation
 * quantization for the integer path, and weight expansion to bf16 for the
 * oneDNN prefill path.
 *
 * Why integer dot products: a float-unpacking GEMV is compute-bound at well
 * under half the memory bandwidth on this class of CPU (TOOLCHAIN.md). With
 * X quantized per weight group to int8 (scale dx_g), a group's contribution
 * is  s_g*dx_g*dot(q, xq) + b_g*sum_g(x), and dot(q, xq) is one vpdpbusd
 * (unsigned codes x signed activations) per 64 bytes of 8-bit codes, two per
 * 64 bytes of 4-bit codes. The int32 lanes of a block are not reduced per
 * group: each lane is converted to f32 and multiplied by a per-lane factor
 * s_g*dx_g (lane -> group by a permute), and the row is reduced once at the
 * end. 4-bit codes are split into low/high nibbles, i.e. even/odd elements,
 * and the activation is pre-permuted to match (EXO_QLAYOUT_Q4), so weights
 * are never shuffled. EXO_GEMV_ROWS rows run together to reuse activation
 * loads; for T > 1 the rows' codes stay in L1 while each row of X passes.
 * 2/3/5/6-bit rows are unpacked to bytes first and take the 8-bit kernel.
 * Weight reads never go past the end of a row (masked tail loads), so a
 * weight at the very end of a mmapped file is safe. */
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

void exo_qact_build_avx512(const float *x, int64_t cols, int G, int layout, exo_qact *out,
                           int8_t *tmp)
{
    int64_t ng = cols / G;
    int64_t qlen = exo_qact_q_len(cols);
    int8_t *plain = layout == EXO_QLAYOUT_Q4 ? tmp : out->q;
    memset(plain + cols, 0, (size_t)(qlen - cols));
    memset(out->sx, 0, (size_t)exo_qact_sx_len(cols) * sizeof(float));
    memset(out->dx, 0, (size_t)exo_qact_sx_len(cols) * sizeof(float));
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int64_t g = 0; g < ng; g++) {
        const float *xg = x + g * G;
        __m512 amax = _mm512_setzero_ps();
        for (int j = 0; j < G; j += 16)
            amax = _mm512_max_ps(amax, _mm512_and_ps(_mm512_loadu_ps(xg + j), absmask));
        float m = _mm512_reduce_max_ps(amax);
        float d = m / 127.0f;
        float id = m > 0.0f ? 127.0f / m : 0.0f;
        __m512 vid = _mm512_set1_ps(id);
        __m512i qsum = _mm512_setzero_si512();
        for (int j = 0; j < G; j += 16) {
            __m512i qi = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xg + j), vid));
            qsum = _mm512_add_epi32(qsum, qi);
            _mm_storeu_si128((__m128i *)(plain + g * G + j), _mm512_cvtsepi32_epi8(qi));
        }
        /* the sum of the dequantized activations, not of x: then the result
         * is exactly sum w * xhat, an error proportional to the weights
         * (about 7x smaller than s*q*(x - xhat) for zero-mean weights,
         * where |s*q| runs up to the group's range) */
        out->sx[g] = d * (float)_mm512_reduce_add_epi32(qsum);
        out->dx[g] = d;
    }
    if (layout != EXO_QLAYOUT_Q4)
        return;
    const __m512i lo8 = _mm512_set1_epi16(0x00ff);
    const __m512i fix = _mm512_set_epi64(7, 5, 3, 1, 6, 4, 2, 0);
    for (int64_t b = 0; b < qlen / 128; b++) {
        __m512i a = _mm512_loadu_si512(plain + 128 * b);
        __m512i c = _mm512_loadu_si512(plain + 128 * b + 64);
        __m512i even = _mm512_packus_epi16(_mm512_and_si512(a, lo8), _mm512_and_si512(c, lo8));
        __m512i odd = _mm512_packus_epi16(_mm512_srli_epi16(a, 8), _mm512_srli_epi16(c, 8));
        _mm512_storeu_si512(out->q + 128 * b, _mm512_permutexvar_epi64(fix, even));
        _mm512_storeu_si512(out->q + 128 * b + 64, _mm512_permutexvar_epi64(fix, odd));
    }
}

/* ---------------------------------------------------------------------- */
/* Affine GEMV                                                            */

/* Row scales and biases as f32, zero-padded to a multiple of 16 plus 16. */
static void row_params(const exo_linear *w, int64_t r, int64_t ng, float *sf, float *bf)
{
    int64_t base = r * ng;
    int64_t g = 0;
    for (; g < ng; g += 16) {
        __mmask16 m = mask16(ng - g);
        _mm512_storeu_ps(sf + g, load16_param(w->dtype, w->scales, base + g, m));
        _mm512_storeu_ps(bf + g, load16_param(w->dtype, w->biases, base + g, m));
    }
    _mm512_storeu_ps(sf + g, _mm512_setzero_ps());
    _mm512_storeu_ps(bf + g, _mm512_setzero_ps());
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

/* R rows of codes against one quantized activation row:
 *   out[i] = sum_g sd_i[g] * dot_g(q_i, xq) + bf_i[g] * sx[g]
 * where sd = scale * dx. q4: packed 4-bit codes against the Q4 layout; else
 * bytes against the Q8 layout. lpg_shift: log2 of 32-bit lanes per group. */
INLINE void affine_rows(int R, int q4, const uint8_t *const *wrow, int64_t rowbytes,
                        const float *const *sd, const float *const *bf, const exo_qact *qa,
                        int64_t ng, int lpg_shift, float *out)
{
    __m512 acc[EXO_GEMV_ROWS];
    #pragma GCC unroll 8
    for (int i = 0; i < R; i++)
        acc[i] = _mm512_setzero_ps();
    /* bias terms, 16 groups at a time (arrays are zero-padded) */
    for (int64_t g = 0; g < ng; g += 16) {
        __m512 sx = _mm512_loadu_ps(qa->sx + g);
        #pragma GCC unroll 8
        for (int i = 0; i < R; i++)
            acc[i] = _mm512_fmadd_ps(_mm512_loadu_ps(bf[i] + g), sx, acc[i]);
    }
    const __m512i nib = _mm512_set1_epi8(0x0f);
    /* lane -> group offset inside a block */
    __m512i idx = _mm512_srli_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        (unsigned)(lpg_shift < 4 ? lpg_shift : 4));
    if (lpg_shift >= 4)
        idx = _mm512_setzero_si512();
    const int8_t *xq = qa->q;
    int64_t nfull = rowbytes / 64;
    int64_t tail = rowbytes % 64;
    int64_t nb = nfull + (tail ? 1 : 0);
    for (int64_t b = 0; b < nb; b++) {
        __mmask64 m = b < nfull ? ~(__mmask64)0 : mask64(tail);
        int64_t g0 = (b << 4) >> lpg_shift;
        __m512i xa, xb = _mm512_setzero_si512();
        if (q4) {
            xa = _mm512_loadu_si512(xq + 128 * b);
            xb = _mm512_loadu_si512(xq + 128 * b + 64);
        } else {
            xa = _mm512_loadu_si512(xq + 64 * b);
        }
        #pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            __m512i v = b < nfull ? _mm512_loadu_si512(wrow[i] + 64 * b)
                                  : _mm512_maskz_loadu_epi8(m, wrow[i] + 64 * b);
            __m512i d;
            if (q4) {
                __m512i lo = _mm512_and_si512(v, nib);
                __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
                d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xa);
                d = _mm512_dpbusd_epi32(d, hi, xb);
            } else {
                d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v, xa);
            }
            __m512 c = lpg_shift >= 4 ? _mm512_set1_ps(sd[i][g0])
                                      : _mm512_permutexvar_ps(idx, _mm512_loadu_ps(sd[i] + g0));
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), c, acc[i]);
        }
    }
    if (R == 4) {
        _mm_storeu_ps(out, reduce4(acc[0], acc[1], acc[2], acc[3]));
    } else {
        #pragma GCC unroll 8
        for (int i = 0; i < R; i++)
            out[i] = _mm512_reduce_add_ps(acc[i]);
    }
}

static int ilog2(int v)
{
    int s = 0;
    while ((1 << s) < v)
        s++;
    return s;
}

/* sd[g] = sf[g] * dx[g] over the zero-padded length */
static void scale_by_dx(const float *sf, const float *dx, int64_t ng, float *sd)
{
    for (int64_t g = 0; g < ng; g += 16)
        _mm512_storeu_ps(sd + g, _mm512_mul_ps(_mm512_loadu_ps(sf + g), _mm512_loadu_ps(dx + g)));
}

void exo_gemv_affine_avx512(const exo_linear *w, int64_t r0, int64_t r1, int T,
                            const exo_qact *qa, float *y, int64_t ldy, exo_gemv_scratch *s)
{
    const int64_t cols = w->cols;
    const int bits = w->bits, G = w->group_size;
    const int64_t ng = cols / G;
    const int64_t wbytes = cols * bits / 8; /* bytes of codes per row */
    const int q4 = bits == 4, q8 = bits == 8;
    const int64_t rowbytes = (q4 || q8) ? wbytes : cols;
    const int lpg_shift = ilog2((q4 ? G * 4 : G * 8) / 32);
    const uint8_t *base = w->w;
    for (int64_t r = r0; r < r1; r += EXO_GEMV_ROWS) {
        int R = r1 - r >= EXO_GEMV_ROWS ? EXO_GEMV_ROWS : (int)(r1 - r);
        const uint8_t *wrow[EXO_GEMV_ROWS];
        const float *sd[EXO_GEMV_ROWS], *bf[EXO_GEMV_ROWS];
        for (int i = 0; i < R; i++) {
            float *sfi = s->sf + i * s->sf_stride, *bfi = s->bf + i * s->sf_stride;
            row_params(w, r + i, ng, sfi, bfi);
            sd[i] = s->sd + i * s->sf_stride;
            bf[i] = bfi;
            const uint8_t *codes = base + (size_t)(r + i) * (size_t)wbytes;
            if (q4 || q8) {
                wrow[i] = codes;
            } else {
                uint8_t *u = s->codes + i * s->code_stride;
                exo_affine_unpack_row((const uint32_t *)codes, cols, bits, u);
                wrow[i] = u;
            }
        }
        for (int t = 0; t < T; t++) {
            float out[EXO_GEMV_ROWS];
            const exo_qact *q = &qa[t];
            for (int i = 0; i < R; i++)
                scale_by_dx(s->sf + i * s->sf_stride, q->dx, ng, s->sd + i * s->sf_stride);
            if (R == EXO_GEMV_ROWS) {
                if (q4)
                    affine_rows(EXO_GEMV_ROWS, 1, wrow, rowbytes, sd, bf, q, ng, lpg_shift, out);
                else
                    affine_rows(EXO_GEMV_ROWS, 0, wrow, rowbytes, sd, bf, q, ng, lpg_shift, out);
            } else {
                for (int i = 0; i < R; i++) {
                    if (q4)
                        affine_rows(1, 1, &wrow[i], rowbytes, &sd[i], &bf[i], q, ng, lpg_shift, &out[i]);
                    else
                        affine_rows(1, 0, &wrow[i], rowbytes, &sd[i], &bf[i], q, ng, lpg_shift, &out[i]);
                }
            }
            for (int i = 0; i < R; i++)
                y[(int64_t)t * ldy + r + i] = out[i];
        }
    }
}

/* ---------------------------------------------------------------------- */
/* Dense GEMV                                                             */

INLINE __m512 load16_w(exo_dtype t, const void *row, int64_t c, __mmask16 m)
{
    return load16_param(t, row, c, m);
}

INLINE void dense_rows(int R, exo_dtype dt, const void *const *wrow, const float *x, int64_t cols,
                       float *out)
{
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
            if (R == EXO_GEMV_ROWS) {
                if (dt == EXO_DTYPE_BF16)
                    dense_rows(EXO_GEMV_ROWS, EXO_DTYPE_BF16, wrow, xt, cols, out);
                else if (dt == EXO_DTYPE_F16)
                    dense_rows(EXO_GEMV_ROWS, EXO_DTYPE_F16, wrow, xt, cols, out);
                else
                    dense_rows(EXO_GEMV_ROWS, EXO_DTYPE_F32, wrow, xt, cols, out);
            } else {
                for (int i = 0; i < R; i++) {
                    if (dt == EXO_DTYPE_BF16)
                        dense_rows(1, EXO_DTYPE_BF16, &wrow[i], xt, cols, &out[i]);
                    else if (dt == EXO_DTYPE_F16)
                        dense_rows(1, EXO_DTYPE_F16, &wrow[i], xt, cols, &out[i]);
                    else
                        dense_rows(1, EXO_DTYPE_F32, &wrow[i], xt, cols, &out[i]);
                }
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
    const int bits = w->bits, G = w->group_size;
    const int64_t ng = cols / G;
    const int64_t wbytes = cols * bits / 8;
    const uint8_t *base = w->w;
    const __m128i nib = _mm_set1_epi16(0x000f), nibhi = _mm_set1_epi16(0x0f00);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *src = base + (size_t)r * (size_t)wbytes;
        uint16_t *o = out + (r - r0) * cols;
        if (bits != 4 && bits != 8) {
            exo_affine_unpack_row((const uint32_t *)src, cols, bits, codes);
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
