/* AVX-512 VNNI kernels for panels (linear.h: affine 4/8-bit, MXFP4): the decode GEMV, the
 * interleaved rows of X it reads (exo_qpanel), and the expansion to bf16
 * W^T for the oneDNN prefill path.
 *
 * Why panels: with a row's codes along a vector (gemv_avx512.c), every 64
 * bytes of codes leave 16 lanes of partial sums from two or more groups,
 * each to be converted and scaled by its group's factor before the next
 * block: per 128 products of one row of X a conversion, a multiply-add and
 * the lanes' factors, beside four vpdpbusd. With 16 rows in the lanes, a
 * lane sums its row's whole group exactly in int32 (vpdpbusd against an
 * activation word broadcast to all lanes), and the conversion, the scale
 * and the bias are paid once per group and 16 rows: nearly all vector work
 * is the products. Cache-resident, one Zen 5 core, 16 rows of X: 0.68 ns
 * per 128 products of one row against 1.16 for the row kernel (its floor
 * on the two vpdpbusd pipes: 0.58); docs/PERFORMANCE.md.
 *
 * MXFP4 panels (linear.h) take the 4-bit path with each nibble through
 * exo_mx_table (u = 2 * e2m1 + 12, unsigned as vpdpbusd wants) and the
 * group's E8M0 byte as an affine group of scale 2^(s-128) and bias -12
 * times it: two vpshufb more per 64 bytes of codes, the rest as q4 g32.
 *
 * Numerics: per (row, X row), group g's integer sum S_g of the codes times
 * the two-level activations (kernels.h, 256*q + q2: the Q8 layout with the
 * weight's group size) is exact; then, group by group,
 *   f = fma(float(S_g), scale_g * dx_g, f);  f = fma(bias_g, sx_g, f)
 * from f = 0. Nothing depends on how many rows of X share a pass or which
 * rows of the weight a thread takes, so a row of X gets the same bits at any
 * row count (batched decode). How a lane's integer sum is split across
 * accumulators does not matter either (integer addition is exact), which
 * lets one row of X keep four chains a level in flight. The rows of X
 * come interleaved word by word (exo_qpanel, built once a call), so a pass
 * addresses all of its rows from one pointer: with a pointer per row, 16
 * of them spilled out of the general registers (16 rows: 820 us against
 * 681, PERFORMANCE.md).
 *
 * Memory order: a panel is one contiguous run (its groups' blocks in order,
 * parameters inline), so the weight streams front to back; every block is
 * also software-prefetched PANEL_PREFETCH bytes ahead (the hardware
 * prefetchers stop at 4 KiB pages). */
#include "engine/cpu/codes_avx512.h"
#include "engine/cpu/kernels.h"
#include "engine/quant.h"

#include <immintrin.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

#define PANEL_PREFETCH 4096

/* 16 parameters of type t at p as f32. */
INLINE __m512 load_params(exo_dtype t, const unsigned char *p)
{
    if (t == EXO_DTYPE_F32)
        return _mm512_loadu_ps(p);
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    if (t == EXO_DTYPE_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

INLINE __m512i bcast_word(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

size_t exo_qpanel_bytes(int T, int64_t cols, int G)
{
    return (size_t)T * (size_t)cols * 2 + (size_t)(cols / G) * 2 * (size_t)T * sizeof(float) + 64;
}

void exo_qpanel_build(const exo_qact *qa, int T, int64_t cols, int G, exo_qpanel *out, void *mem)
{
    int8_t *x = mem;
    float *dxs = (float *)(x + (size_t)T * (size_t)cols * 2);
    for (int64_t k = 0; k < cols / 4; k++)
        for (int t = 0; t < T; t++) {
            memcpy(x + (k * T + t) * 8, qa[t].q + 4 * k, 4);
            memcpy(x + (k * T + t) * 8 + 4, qa[t].q2 + 4 * k, 4);
        }
    for (int64_t g = 0; g < cols / G; g++)
        for (int t = 0; t < T; t++) {
            dxs[g * 2 * T + t] = qa[t].dx[g];
            dxs[g * 2 * T + T + t] = qa[t].sx[g];
        }
    out->T = T;
    out->x = x;
    out->dxs = dxs;
}

/* One panel (16 rows) against rows [t0, t0 + TR) of X: out[t] = the 16
 * rows' products with X row t0 + t. NS: integer accumulators per (X row,
 * level), so that a pass keeps at least 8 vpdpbusd chains in flight. The
 * activations of the TR rows are 8 bytes apart (exo_qpanel), so the loop
 * addresses them all from one pointer. */
INLINE void panel_rows(int q4, int mx, int TR, const unsigned char *panel, int64_t ng, size_t block, int G,
                       exo_dtype dt, const exo_qpanel *xp, int t0, __m512 *out)
{
    enum { NSMAX = 4 };
    __m512 f[8]; /* not out itself: its stores could alias the activations' bytes */
    const int NS = TR >= 4 ? 1 : 4 / TR;
    const int nvec = q4 ? G / 8 : G / 4;
    const size_t codes = (size_t)nvec * 64, esz = dt == EXO_DTYPE_F32 ? 4 : 2;
    const int64_t T = xp->T, wstride = 8 * T; /* bytes from one activation word to the next */
    #pragma GCC unroll 8
    for (int t = 0; t < TR; t++)
        f[t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        const unsigned char *b = panel + (size_t)g * block;
        const int8_t *xg = xp->x + g * (G / 4) * wstride + 8 * t0;
        __m512i a1[8][NSMAX], a2[8][NSMAX];
        #pragma GCC unroll 8
        for (int t = 0; t < TR; t++)
            #pragma GCC unroll 4
            for (int s = 0; s < NS; s++)
                a1[t][s] = a2[t][s] = _mm512_setzero_si512();
        /* two vectors a trip: 8-bit codes' 16 rows of X at 16 rows (bench_matmul rows, 2048 x 8192) took
         * 997-1016 us one a trip, 811-850 two */
        #pragma GCC unroll 2
        for (int o0 = 0; o0 < nvec; o0 += NS) {
            #pragma GCC unroll 4
            for (int s = 0; s < NS; s++) {
                const int o = o0 + s;
                const unsigned char *vp = b + (size_t)o * 64;
                _mm_prefetch((const char *)vp + PANEL_PREFETCH, _MM_HINT_T0);
                __m512i v = _mm512_loadu_si512(vp);
                if (q4) { /* columns 8o..8o+3 in the low nibbles (word 2o), 8o+4.. in the high (2o+1) */
                    const int8_t *xl = xg + 2 * o * wstride, *xh = xl + wstride;
                    __m512i lo, hi;
                    exo_split_nibbles(v, mx, &lo, &hi); /* mx: u = 2 * e2m1 + 12 */
                    #pragma GCC unroll 8
                    for (int t = 0; t < TR; t++) {
                        a1[t][s] = _mm512_dpbusd_epi32(a1[t][s], lo, bcast_word(xl + 8 * t));
                        a1[t][s] = _mm512_dpbusd_epi32(a1[t][s], hi, bcast_word(xh + 8 * t));
                        a2[t][s] = _mm512_dpbusd_epi32(a2[t][s], lo, bcast_word(xl + 8 * t + 4));
                        a2[t][s] = _mm512_dpbusd_epi32(a2[t][s], hi, bcast_word(xh + 8 * t + 4));
                    }
                } else {
                    const int8_t *xw = xg + o * wstride;
                    #pragma GCC unroll 8
                    for (int t = 0; t < TR; t++) {
                        a1[t][s] = _mm512_dpbusd_epi32(a1[t][s], v, bcast_word(xw + 8 * t));
                        a2[t][s] = _mm512_dpbusd_epi32(a2[t][s], v, bcast_word(xw + 8 * t + 4));
                    }
                }
            }
        }
        /* mx: w = 2^(s-128) * (u - 12), an affine group of scale 2^(s-128) and bias -12 times it */
        const __m512 sc = mx ? exo_e8m0_half16(_mm_loadu_si128((const __m128i *)(b + codes))) : load_params(dt, b + codes);
        const __m512 bi = mx ? _mm512_mul_ps(sc, _mm512_set1_ps(-12.0f)) : load_params(dt, b + codes + 16 * esz);
        const float *dx = xp->dxs + g * 2 * T + t0, *sx = dx + T;
        #pragma GCC unroll 8
        for (int t = 0; t < TR; t++) {
            __m512i s1 = a1[t][0], s2 = a2[t][0];
            #pragma GCC unroll 4
            for (int s = 1; s < NS; s++) {
                s1 = _mm512_add_epi32(s1, a1[t][s]);
                s2 = _mm512_add_epi32(s2, a2[t][s]);
            }
            __m512i d = _mm512_add_epi32(_mm512_slli_epi32(s1, 8), s2);
            __m512 c = _mm512_mul_ps(sc, _mm512_set1_ps(dx[t]));
            f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), c, f[t]);
            f[t] = _mm512_fmadd_ps(bi, _mm512_set1_ps(sx[t]), f[t]);
        }
    }
    #pragma GCC unroll 8
    for (int t = 0; t < TR; t++)
        out[t] = f[t];
}

/* Constant-argument instances, one loop each. */
#define PANEL_ROWS_FN(TR)                                                                                   \
    static void panel_rows_##TR(int q4, int mx, const unsigned char *panel, int64_t ng, size_t block,     \
                                int G, exo_dtype dt, const exo_qpanel *xp, int t0, __m512 *f)              \
    {                                                                                                       \
        if (mx)                                                                                             \
            panel_rows(1, 1, TR, panel, ng, block, G, dt, xp, t0, f);                                       \
        else if (q4)                                                                                        \
            panel_rows(1, 0, TR, panel, ng, block, G, dt, xp, t0, f);                                       \
        else                                                                                                \
            panel_rows(0, 0, TR, panel, ng, block, G, dt, xp, t0, f);                                       \
    }
PANEL_ROWS_FN(1)
PANEL_ROWS_FN(2)
PANEL_ROWS_FN(4)
PANEL_ROWS_FN(8)

void exo_gemv_panels_avx512(const exo_linear *w, int64_t r0, int64_t r1, const exo_qpanel *xp, float *y,
                            int64_t ldy)
{
    const int q4 = w->bits == 4, mx = exo_panels_mx(w), G = w->group_size, T = xp->T;
    const int64_t ng = w->cols / G;
    const size_t block = exo_panel_block_bytes(w);
    for (int64_t p = r0 / 16; p * 16 < r1; p++) {
        const unsigned char *panel = (const unsigned char *)w->w + (size_t)p * (size_t)ng * block;
        /* rows of this panel inside [r0, r1): a range may start or end inside one */
        const int64_t lo = r0 > 16 * p ? r0 - 16 * p : 0, hi = r1 < 16 * p + 16 ? r1 - 16 * p : 16;
        const __mmask16 m = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
        for (int t0 = 0; t0 < T;) {
            __m512 f[8];
            const int left = T - t0, TR = left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
            switch (TR) {
            case 8:  panel_rows_8(q4, mx, panel, ng, block, G, w->dtype, xp, t0, f); break;
            case 4:  panel_rows_4(q4, mx, panel, ng, block, G, w->dtype, xp, t0, f); break;
            case 2:  panel_rows_2(q4, mx, panel, ng, block, G, w->dtype, xp, t0, f); break;
            default: panel_rows_1(q4, mx, panel, ng, block, G, w->dtype, xp, t0, f); break;
            }
            for (int t = 0; t < TR; t++)
                _mm512_mask_storeu_ps(y + (int64_t)(t0 + t) * ldy + 16 * p, m, f[t]);
            t0 += TR;
        }
    }
}

/* Expansion for the GEMM, transposed: out holds W^T for rows [r0, r1)
 * (both multiples of 16), out[k * (r1 - r0) + r - r0], which is the panels'
 * own order: every code's byte (or nibble) of a vector's 16 lanes is one
 * column's 16 rows, converted as exo_dequant_rows_bf16_avx512 converts the
 * row format (fma(q, scale, bias) rounded to bf16), so prefill computes with
 * the same bf16 weights either way. */
void exo_dequant_panels_bf16t_avx512(const exo_linear *w, int64_t r0, int64_t r1, uint16_t *out)
{
    const int q4 = w->bits == 4, mx = exo_panels_mx(w), G = w->group_size, nvec = q4 ? G / 8 : G / 4, L = q4 ? 8 : 4;
    const int64_t cols = w->cols, ng = cols / G, n = r1 - r0;
    const size_t block = exo_panel_block_bytes(w), codes = (size_t)nvec * 64;
    const size_t esz = exo_dtype_size(w->dtype);
    const __m512i mask = _mm512_set1_epi32(q4 ? 0x0f : 0xff);
    /* mx: code -> 2 * e2m1 as f32 (code 8 is -0, as the row format's expansion has it) */
    const __m512 mx_v = _mm512_setr_ps(0, 1, 2, 3, 4, 6, 8, 12, -0.0f, -1, -2, -3, -4, -6, -8, -12);
    /* four panels at a time, group by group: each column's 64 rows of the
     * four are two whole lines of out, written together, while each panel
     * is still read front to back (panel by panel, a group's 32-byte
     * pieces fell at a power-of-two stride into a few L1 sets and left as
     * partial lines; group by group over all panels, the reads jumped a
     * panel ahead each block and waited on DRAM) */
    enum { PC = 4 };
    for (int64_t p0 = r0 / 16; p0 < r1 / 16; p0 += PC) {
        const int pc = r1 / 16 - p0 < PC ? (int)(r1 / 16 - p0) : PC;
        uint16_t *o = out + (16 * p0 - r0);
        for (int64_t g = 0; g < ng; g++) {
            const unsigned char *b[PC];
            __m512 sc[PC], bi[PC];
            for (int j = 0; j < pc; j++) {
                b[j] = (const unsigned char *)w->w + ((size_t)(p0 + j) * (size_t)ng + (size_t)g) * block;
                if (mx) { /* 2 * e2m1 * 2^(s-128): exact in f32, and in bf16 but for subnormals */
                    sc[j] = exo_e8m0_half16(_mm_loadu_si128((const __m128i *)(b[j] + codes)));
                    bi[j] = _mm512_setzero_ps();
                } else {
                    sc[j] = load_params(w->dtype, b[j] + codes);
                    bi[j] = load_params(w->dtype, b[j] + codes + 16 * esz);
                }
            }
            for (int v = 0; v < nvec; v++) {
                __m512i x[PC];
                for (int j = 0; j < pc; j++) {
                    _mm_prefetch((const char *)b[j] + (size_t)v * 64 + PANEL_PREFETCH, _MM_HINT_T0);
                    x[j] = _mm512_loadu_si512(b[j] + (size_t)v * 64);
                }
                #pragma GCC unroll 8
                for (int k = 0; k < L; k++) {
                    /* column vL + k: 8 bits, byte k; 4 bits, nibble k%4 low (k < 4) or high */
                    const unsigned shift = q4 ? 8u * (unsigned)(k % 4) + (k < 4 ? 0u : 4u) : 8u * (unsigned)k;
                    uint16_t *row = o + (g * G + (int64_t)v * L + k) * n;
                    for (int j = 0; j < pc; j++) {
                        __m512i c = _mm512_and_si512(_mm512_srli_epi32(x[j], shift), mask);
                        __m512 val = mx ? _mm512_mul_ps(_mm512_permutexvar_ps(c, mx_v), sc[j])
                                        : _mm512_fmadd_ps(_mm512_cvtepi32_ps(c), sc[j], bi[j]);
                        __m256i h = (__m256i)_mm512_cvtneps_pbh(val);
                        _mm256_storeu_si256((__m256i *)(row + 16 * j), h);
                    }
                }
            }
        }
    }
}
