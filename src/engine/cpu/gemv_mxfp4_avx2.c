/* AVX2 decode GEMV for MXFP4 weights, and the activation quantization it
 * needs, for CPUs without the AVX-512 kernels (gemv_avx512.c).
 *
 * The arithmetic is the AVX-512 kernel's (see the top of gemv_avx512.c):
 * X is quantized per group of 32 in two int8 levels (EXO_QLAYOUT_Q4, the
 * low nibbles of 64 code bytes against the even elements of 128, the high
 * nibbles against the odd ones), each nibble goes through a vpshufb table
 * to the unsigned code u = 2*e2m1 + 12 in 0..24, and a group contributes
 *   2^(s-128) * (dx * dot(u, xq) - 12 * sx).
 * Without VNNI the byte products are vpmaddubsw (u8 x s8 -> pairs summed to
 * s16: at most 2*24*128, two of them 12288, no saturation) and vpmaddwd
 * with ones (-> s32). 32 code bytes (two groups) a step; EXO_GEMV_ROWS rows
 * share the activation loads, rows of a block lie a page apart and the next
 * super-block is prefetched, as in the AVX-512 kernel. Reads stay inside
 * the rows (a row is a multiple of 16 bytes: the last 16 are loaded alone). */
#include "engine/cpu/kernels.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

/* ---------------------------------------------------------------------- */
/* Activation quantization (exo_qact_build_avx512's twin, same numbers)   */

/* Four vectors of 8 int32 -> 32 int8 in order, saturating (vpmovsdb). */
INLINE __m256i pack32_i8(__m256i a, __m256i b, __m256i c, __m256i d)
{
    __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd),
                                       _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* Q4 layout: even elements of each 128 first, then the odd ones. */
static void permute_q4(const int8_t *plain, int64_t qlen, int8_t *q)
{
    const __m256i lo8 = _mm256_set1_epi16(0x00ff);
    for (int64_t b = 0; b < qlen / 128; b++)
        for (int h = 0; h < 2; h++) {
            __m256i a = _mm256_loadu_si256((const __m256i *)(plain + 128 * b + 64 * h));
            __m256i c = _mm256_loadu_si256((const __m256i *)(plain + 128 * b + 64 * h + 32));
            __m256i even = _mm256_packus_epi16(_mm256_and_si256(a, lo8), _mm256_and_si256(c, lo8));
            __m256i odd = _mm256_packus_epi16(_mm256_srli_epi16(a, 8), _mm256_srli_epi16(c, 8));
            _mm256_storeu_si256((__m256i *)(q + 128 * b + 32 * h),
                                _mm256_permute4x64_epi64(even, 0xd8));
            _mm256_storeu_si256((__m256i *)(q + 128 * b + 64 + 32 * h),
                                _mm256_permute4x64_epi64(odd, 0xd8));
        }
}

/* exo_qact.x16 from the two levels in element order (qlen a multiple of 64). */
static void build_x16(const int8_t *q, const int8_t *q2, int64_t qlen, int q4, int16_t *x16)
{
    for (int64_t c = 0; c < qlen; c += 64)
        for (int e = 0; e < 64; e++)
            x16[c + (q4 ? 16 * (e & 3) + (e >> 2) : e)] = (int16_t)(256 * q[c + e] + q2[c + e]);
}

void exo_qact_build_avx2(const float *x, int64_t cols, int G, int layout, exo_qact *out,
                         int8_t *tmp)
{
    const int64_t ng = cols / G, qlen = exo_qact_q_len(cols);
    const int q4 = layout == EXO_QLAYOUT_Q4;
    int8_t *plain = q4 ? tmp : out->q;
    int8_t *plain2 = q4 ? tmp + qlen : out->q2;
    memset(plain + cols, 0, (size_t)(qlen - cols));
    memset(plain2 + cols, 0, (size_t)(qlen - cols));
    memset(out->sx, 0, (size_t)exo_qact_sx_len(cols) * sizeof(float));
    memset(out->dx, 0, (size_t)exo_qact_sx_len(cols) * sizeof(float));
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
    for (int64_t g = 0; g < ng; g++) {
        const float *xg = x + g * G;
        __m256 amax = _mm256_setzero_ps();
        for (int j = 0; j < G; j += 8)
            amax = _mm256_max_ps(amax, _mm256_and_ps(_mm256_loadu_ps(xg + j), absmask));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float m = _mm_cvtss_f32(m4);
        const float d = m / 127.0f, id = m > 0.0f ? 127.0f / m : 0.0f;
        const __m256 vd = _mm256_set1_ps(d), vid = _mm256_set1_ps(id),
                     vid2 = _mm256_set1_ps(id * 256.0f);
        __m256i qsum = _mm256_setzero_si256();
        for (int j = 0; j < G; j += 32) {
            __m256i qi[4], q2[4];
            for (int k = 0; k < 4; k++) {
                __m256 xv = _mm256_loadu_ps(xg + j + 8 * k);
                qi[k] = _mm256_cvtps_epi32(_mm256_mul_ps(xv, vid));
                /* residual of the first level, exact in f32 (|r| <= d/2) */
                __m256 r = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(qi[k]), vd, xv);
                q2[k] = _mm256_cvtps_epi32(_mm256_mul_ps(r, vid2));
                q2[k] = _mm256_max_epi32(_mm256_min_epi32(q2[k], lim), nlim);
                qsum = _mm256_add_epi32(qsum, _mm256_add_epi32(_mm256_slli_epi32(qi[k], 8), q2[k]));
            }
            _mm256_storeu_si256((__m256i *)(plain + g * G + j),
                                pack32_i8(qi[0], qi[1], qi[2], qi[3]));
            _mm256_storeu_si256((__m256i *)(plain2 + g * G + j),
                                pack32_i8(q2[0], q2[1], q2[2], q2[3]));
        }
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(qsum), _mm256_extracti128_si256(qsum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        const float dl = d * (1.0f / 256.0f);
        out->sx[g] = dl * (float)_mm_cvtsi128_si32(s4);
        out->dx[g] = dl;
    }
    if (out->x16)
        build_x16(plain, plain2, qlen, q4, out->x16);
    if (q4) {
        permute_q4(plain, qlen, out->q);
        permute_q4(plain2, qlen, out->q2);
    }
}

/* ---------------------------------------------------------------------- */
/* GEMV                                                                   */

INLINE float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* sd[g] = 2^(s_g-128) * dx_g (zero-padded by 8) and the bias part
 * -12 * sum_g 2^(s_g-128) * sx_g. Eight groups a step, the last ng % 8
 * one by one (the scales may end the mapping). */
static float prep_row(const exo_linear *w, int64_t r, int64_t ng, const exo_qact *qa, float *sd)
{
    const uint8_t *sc = (const uint8_t *)w->scales + r * ng;
    const __m256i sub = _mm256_set1_epi32(0x00400000); /* 2^-127: s = 0 */
    __m256 bacc = _mm256_setzero_ps();
    int64_t g = 0;
    for (; g + 8 <= ng; g += 8) {
        __m256i sv = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sc + g)));
        __m256i bits = _mm256_blendv_epi8(_mm256_slli_epi32(sv, 23), sub,
                                          _mm256_cmpeq_epi32(sv, _mm256_setzero_si256()));
        __m256 s = _mm256_mul_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(0.5f));
        _mm256_storeu_ps(sd + g, _mm256_mul_ps(s, _mm256_loadu_ps(qa->dx + g)));
        bacc = _mm256_fmadd_ps(s, _mm256_loadu_ps(qa->sx + g), bacc);
    }
    float bias = hsum8(bacc);
    for (; g < ng; g++) {
        float s = exo_e8m0_to_f32(sc[g]) * 0.5f;
        sd[g] = s * qa->dx[g];
        bias = fmaf(s, qa->sx[g], bias);
    }
    _mm256_storeu_ps(sd + ng, _mm256_setzero_ps());
    return -12.0f * bias;
}

/* 32 code bytes (chunk k: elements 64k..64k+63, groups 2k and 2k+1) of R
 * rows; tail: only the first 16 bytes exist. */
INLINE void mx_chunk(int R, const uint8_t *const *wrow, int64_t k, int tail, const int8_t *xq,
                     const int8_t *xq2, const float *const *sd, int64_t pf_dist, __m256 *acc)
{
    const __m256i nib = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1),
                  x256 = _mm256_set1_epi16(256);
    const __m256i lut = _mm256_broadcastsi128_si256(
        _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
    const __m256i gidx = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    const int64_t xo = 128 * (k >> 1) + 32 * (k & 1);
    const __m256i xa = _mm256_loadu_si256((const __m256i *)(xq + xo));
    const __m256i xb = _mm256_loadu_si256((const __m256i *)(xq + xo + 64));
    const __m256i xa2 = _mm256_loadu_si256((const __m256i *)(xq2 + xo));
    const __m256i xb2 = _mm256_loadu_si256((const __m256i *)(xq2 + xo + 64));
    #pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        const uint8_t *p = wrow[i] + 32 * k;
        __m256i v;
        if (tail) {
            v = _mm256_inserti128_si256(_mm256_setzero_si256(),
                                        _mm_loadu_si128((const __m128i *)p), 0);
        } else {
            if (pf_dist && !(k & 1))
                _mm_prefetch((const char *)p + pf_dist, _MM_HINT_T0);
            v = _mm256_loadu_si256((const __m256i *)p);
        }
        /* zero tail bytes become u = 12 against zero activation padding */
        __m256i lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, nib));
        __m256i hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), nib));
        __m256i s1 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xa), _mm256_maddubs_epi16(hi, xb));
        __m256i s2 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xa2), _mm256_maddubs_epi16(hi, xb2));
        __m256i d = _mm256_add_epi32(_mm256_madd_epi16(s1, x256), _mm256_madd_epi16(s2, ones));
        __m256 c = _mm256_permutevar8x32_ps(_mm256_loadu_ps(sd[i] + 2 * k), gidx);
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), c, acc[i]);
        /* (no compiler barrier as in affine_block: with 16 ymm registers it
         * made GCC reload the row pointers and spill the accumulators) */
    }
}

INLINE void mx_rows(int R, const uint8_t *const *wrow, int64_t rowbytes, const float *const *sd,
                    const float *bias, const exo_qact *qa, int64_t pf_dist, float *out)
{
    __m256 acc[EXO_GEMV_ROWS];
    #pragma GCC unroll 8
    for (int i = 0; i < R; i++)
        acc[i] = _mm256_setzero_ps();
    const int64_t nfull = rowbytes / 32;
    for (int64_t k = 0; k < nfull; k++)
        mx_chunk(R, wrow, k, 0, qa->q, qa->q2, sd, pf_dist, acc);
    if (rowbytes % 32)
        mx_chunk(R, wrow, nfull, 1, qa->q, qa->q2, sd, 0, acc);
    #pragma GCC unroll 8
    for (int i = 0; i < R; i++)
        out[i] = hsum8(acc[i]) + bias[i];
}

static void mx_rows4(const uint8_t *const *wrow, int64_t rowbytes, const float *const *sd,
                     const float *bias, const exo_qact *qa, int64_t pf_dist, float *out)
{
    mx_rows(EXO_GEMV_ROWS, wrow, rowbytes, sd, bias, qa, pf_dist, out);
}

static void mx_rows1(const uint8_t *const *wrow, int64_t rowbytes, const float *const *sd,
                     const float *bias, const exo_qact *qa, float *out)
{
    mx_rows(1, wrow, rowbytes, sd, bias, qa, 0, out);
}

void exo_gemv_mxfp4_avx2(const exo_linear *w, int64_t r0, int64_t r1, int T, const exo_qact *qa,
                         float *y, int64_t ldy, exo_gemv_scratch *s)
{
    const int64_t cols = w->cols, ng = cols / 32, wbytes = cols / 2;
    const uint8_t *base = w->w;
    const int64_t S = exo_gemv_page_stride(wbytes);
    const int64_t SB = EXO_GEMV_ROWS * S;
    for (int64_t sb = r0; sb < r1; sb += SB) {
        int strided;
        int64_t end;
        const int64_t nblocks = exo_gemv_superblock(sb, r1, S, &strided, &end);
        for (int64_t j = 0; j < nblocks; j++) {
            int64_t rix[EXO_GEMV_ROWS];
            const uint8_t *wrow[EXO_GEMV_ROWS];
            const float *sd[EXO_GEMV_ROWS];
            float bias[EXO_GEMV_ROWS];
            int R = exo_gemv_block_rows(sb, j, S, strided, end, rix);
            for (int i = 0; i < R; i++) {
                wrow[i] = base + (size_t)rix[i] * (size_t)wbytes;
                sd[i] = s->sd + i * s->sf_stride;
            }
            for (int t = 0; t < T; t++) {
                float out[EXO_GEMV_ROWS];
                for (int i = 0; i < R; i++)
                    bias[i] = prep_row(w, rix[i], ng, &qa[t], s->sd + i * s->sf_stride);
                if (R == EXO_GEMV_ROWS) {
                    mx_rows4(wrow, wbytes, sd, bias, &qa[t], t == 0 ? SB * wbytes : 0, out);
                } else {
                    for (int i = 0; i < R; i++)
                        mx_rows1(&wrow[i], wbytes, &sd[i], &bias[i], &qa[t], &out[i]);
                }
                for (int i = 0; i < R; i++)
                    y[(int64_t)t * ldy + rix[i]] = out[i];
            }
        }
    }
}
