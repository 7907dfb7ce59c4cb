/* AVX2 decode GEMV for affine and dense weights, for CPUs without the
 * AVX-512 kernels (gemv_avx512.c; MXFP4 has its own AVX2 file).
 *
 * Affine rows take the AVX-512 kernel's arithmetic (the top of
 * gemv_avx512.c): X quantized per weight group in two int8 levels
 * (exo_qact), a group contributing s_g dx_g dot(q, 256 xq + xq2) + b_g sx_g,
 * the int32 lanes converted to f32 and multiplied by their group's s_g dx_g
 * (its "lane sums" family), the row reduced once at the end. Without VNNI
 * there is no byte product of unsigned codes and signed activations that
 * cannot saturate, so the kernel takes two forms with the same integers:
 *  - 4-bit codes (0..15; Q4 layout, low nibbles against the even
 *    elements, high nibbles the odd ones) against one row of X: vpmaddubsw
 *    for each level (a pair at most 2 * 15 * 127), vpmaddwd to s32, the
 *    first level times 256;
 *  - codes widened to 16 bits against the two levels as one 16-bit
 *    activation, 256 xq + xq2 (exo_qact.x16): vpmaddwd sums pairs exactly
 *    to s32. Byte codes (8-bit, and 2/3/5/6-bit unpacked to bytes first)
 *    always take this form (zero-extended, no centring needed); 4-bit
 *    codes do where one widening serves four rows of X (x16's Q4 order
 *    puts nibble m of a 16-bit lane of codes against its element, so a
 *    lane sums the same 8 elements as in the first form).
 * Tiles: 4 rows of codes x 1 row of X (X's loads shared), 1 x 4 (the
 * widening shared), 1 x 1 for a short block.
 * Dense rows multiply X itself: bf16 and f16 converted to f32, four rows
 * at once, 8 partial sums a row; f32 rows (the test models' exact format)
 * in double, whose parity limits f32 sums missed (qwen3_next-f32 0.00126
 * against 0.001 with 8 partial sums, 0.00109 with 32).
 *
 * Rows of a block (EXO_GEMV_ROWS) lie a page apart and the next
 * super-block is prefetched, as in the AVX-512 kernel. Every (row, X row)
 * pair has one accumulator fed the same lane sums in the same order in
 * any tile, so a row of X gets the same bits at any row count (a batch of
 * decode rows gives each sequence what it would get alone). Reads stay
 * inside the rows. */
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

/* Four sums of 8 lanes, each added in the same order whichever lane of
 * the result it takes: ((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7)). */
INLINE __m128 hsum8x4(__m256 a, __m256 b, __m256 c, __m256 d)
{
    __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* For each (row i, X row t) pair of a tile, p = i * TX + t: sd + p *
 * sdstride gets s_g dx_g of its groups (zero-padded by 8 past ng), bias[p]
 * its bias term sum_g b_g sx_g. */
INLINE void prep_tile_as(exo_dtype dt, int RW, int TX, const exo_linear *w, const int64_t *rix, int64_t ng,
                         const exo_qact *qa, float *sd, int64_t sdstride, float *bias)
{
    const size_t ps = dt == EXO_DTYPE_F32 ? 4 : 2;
    const char *sc[4], *bi[4];
    __m256 bacc[4];
    for (int i = 0; i < RW; i++) {
        sc[i] = (const char *)w->scales + (size_t)(rix[i] * ng) * ps;
        bi[i] = (const char *)w->biases + (size_t)(rix[i] * ng) * ps;
    }
    for (int p = 0; p < 4; p++)
        bacc[p] = _mm256_setzero_ps();
    int64_t g = 0;
    for (; g + 8 <= ng; g += 8)
        for (int i = 0; i < RW; i++) {
            const __m256 s = load8_f32(dt, sc[i], g), b = load8_f32(dt, bi[i], g);
            for (int t = 0; t < TX; t++) {
                _mm256_storeu_ps(sd + (i * TX + t) * sdstride + g, _mm256_mul_ps(s, _mm256_loadu_ps(qa[t].dx + g)));
                bacc[i * TX + t] = _mm256_fmadd_ps(b, _mm256_loadu_ps(qa[t].sx + g), bacc[i * TX + t]);
            }
        }
    float sums[4];
    _mm_storeu_ps(sums, hsum8x4(bacc[0], bacc[1], bacc[2], bacc[3]));
    for (int i = 0; i < RW; i++)
        for (int t = 0; t < TX; t++) {
            float *sdp = sd + (i * TX + t) * sdstride, sum = sums[i * TX + t];
            for (int64_t e = g; e < ng; e++) { /* one by one: the parameters may end the mapping */
                sdp[e] = exo_affine_param_f32(dt, sc[i], e) * qa[t].dx[e];
                sum = fmaf(exo_affine_param_f32(dt, bi[i], e), qa[t].sx[e], sum);
            }
            _mm256_storeu_ps(sdp + ng, _mm256_setzero_ps());
            bias[i * TX + t] = sum;
        }
}

INLINE void prep_tile(int RW, int TX, const exo_linear *w, const int64_t *rix, int64_t ng, const exo_qact *qa,
                      float *sd, int64_t sdstride, float *bias)
{
    switch (w->dtype) {
    case EXO_DTYPE_F32: prep_tile_as(EXO_DTYPE_F32, RW, TX, w, rix, ng, qa, sd, sdstride, bias); break;
    case EXO_DTYPE_F16: prep_tile_as(EXO_DTYPE_F16, RW, TX, w, rix, ng, qa, sd, sdstride, bias); break;
    default: prep_tile_as(EXO_DTYPE_BF16, RW, TX, w, rix, ng, qa, sd, sdstride, bias); break;
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

/* A tile: RW rows of codes rstride bytes apart (a page run apart, or
 * consecutive) against TX rows of X, the s_g dx_g of row i against X row
 * t at sd + (i * TX + t) * sdstride. One pointer and a stride each, so the
 * loop keeps its rows in registers. */
typedef struct tile {
    const uint8_t *w;
    int64_t rstride;
    float *sd;
    int64_t sdstride;
    const exo_qact *qa;
} tile;

/* Lane sums of 32 bytes of 4-bit codes (chunk k: elements 64k .. 64k +
 * 63; tail: only the first 16 bytes exist) against one row of X in its two
 * int8 levels: low nibbles against the even elements, high nibbles the
 * odd ones (Q4 layout), vpmaddubsw for each level (a pair at most 2 * 15 *
 * 127) and vpmaddwd to s32, the first level times 256. Lane j sums
 * elements 8j .. 8j + 7, as the widened form's lane j does (codes16,
 * sums16), and to the same integer. */
INLINE __m256i nibbles8_sums(const uint8_t *p, int tail, const exo_qact *qa, int64_t k)
{
    const __m256i nib = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1), x256 = _mm256_set1_epi16(256);
    const int64_t xo = 128 * (k >> 1) + 32 * (k & 1);
    __m256i v = tail ? _mm256_inserti128_si256(_mm256_setzero_si256(), _mm_loadu_si128((const __m128i *)p), 0)
                     : _mm256_loadu_si256((const __m256i *)p);
    __m256i lo = _mm256_and_si256(v, nib), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
    __m256i s1 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(qa->q + xo))),
                                  _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(qa->q + xo + 64))));
    __m256i s2 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(qa->q2 + xo))),
                                  _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(qa->q2 + xo + 64))));
    return _mm256_add_epi32(_mm256_madd_epi16(s1, x256), _mm256_madd_epi16(s2, ones));
}

/* A chunk's codes widened to 16 bits, c[m] to be multiplied by the
 * activation at x16 + 16m. Nibbles: a 16-bit lane holds elements 4L ..
 * 4L + 3 as its four nibbles, c[m] nibble m of every lane (x16's Q4
 * order). Bytes: chunk k is 32 codes, elements 32k .. 32k + 31, in order. */
INLINE void codes16(int nibbles, const uint8_t *p, int tail, __m256i *c)
{
    if (nibbles) {
        const __m256i m = _mm256_set1_epi16(0x000f);
        __m256i v = tail ? _mm256_inserti128_si256(_mm256_setzero_si256(), _mm_loadu_si128((const __m128i *)p), 0)
                         : _mm256_loadu_si256((const __m256i *)p);
        c[0] = _mm256_and_si256(v, m);
        c[1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
        c[2] = _mm256_and_si256(_mm256_srli_epi16(v, 8), m);
        c[3] = _mm256_srli_epi16(v, 12);
    } else {
        c[0] = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
        c[1] = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(p + 16)));
    }
}

/* Lane sums of widened codes against one row of X's x16 (a pair of
 * products at most 2 * 255 * 32639, exact in s32). */
INLINE __m256i sums16(int nibbles, const __m256i *c, const int16_t *x)
{
    __m256i d = _mm256_madd_epi16(c[0], _mm256_loadu_si256((const __m256i *)x));
    for (int m = 1; m < (nibbles ? 4 : 2); m++)
        d = _mm256_add_epi32(d, _mm256_madd_epi16(c[m], _mm256_loadu_si256((const __m256i *)(x + 16 * m))));
    return d;
}

/* Chunk k of a tile (nibbles: 32 bytes, 64 elements; bytes: 32 elements),
 * each lane's sum times its group's s_g dx_g into the (row, X row) pair's
 * accumulator. A row of codes against one row of X sums its nibbles in
 * the two int8 levels (fewer instructions than widening when nothing
 * shares the widening); against four, widens them once; bytes are always
 * widened. Each pair's lanes get the same integers either way, so a row
 * of X gets the same bits in any tile. */
INLINE void tile_chunk(int RW, int TX, int nibbles, int g32, tile b, int64_t k, int tail, int gshift, __m256 *acc)
{
    const int64_t xo = nibbles ? 64 * k : 32 * k, g = xo >> gshift;
    #pragma GCC unroll 4
    for (int i = 0; i < RW; i++) {
        const uint8_t *p = b.w + i * b.rstride + 32 * k;
        __m256i c[4];
        if (!(nibbles && TX == 1))
            codes16(nibbles, p, tail, c);
        #pragma GCC unroll 4
        for (int t = 0; t < TX; t++) {
            __m256i d = nibbles && TX == 1 ? nibbles8_sums(p, tail, &b.qa[t], k) : sums16(nibbles, c, b.qa[t].x16 + xo);
            const __m256 sd = chunk_scales(b.sd + (i * TX + t) * b.sdstride, g, nibbles && g32);
            acc[i * TX + t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), sd, acc[i * TX + t]);
        }
    }
}

/* Each row's 64-byte line pf_dist ahead of chunk k (0: none). */
INLINE void prefetch_rows(int R, tile b, int64_t k, int64_t pf_dist)
{
    if (!pf_dist)
        return;
    #pragma GCC unroll 4
    for (int i = 0; i < R; i++)
        _mm_prefetch((const char *)b.w + i * b.rstride + 32 * k + pf_dist, _MM_HINT_T0);
}

/* A whole tile (nibbles: rowbytes = cols / 2; bytes: cols), two chunks (a
 * cache line of each row) a step; out[i * TX + t], bias added. */
INLINE void affine_tile(int RW, int TX, int nibbles, int g32, tile b, int64_t rowbytes, int gshift,
                        const float *bias, int64_t pf_dist, float *out)
{
    __m256 acc[4];
    #pragma GCC unroll 4
    for (int i = 0; i < RW * TX; i++)
        acc[i] = _mm256_setzero_ps();
    const int64_t nfull = rowbytes / 32; /* cols is a multiple of the group, at least 32 */
    int64_t k = 0;
    for (; k + 2 <= nfull; k += 2) {
        prefetch_rows(RW, b, k, pf_dist);
        tile_chunk(RW, TX, nibbles, g32, b, k, 0, gshift, acc);
        tile_chunk(RW, TX, nibbles, g32, b, k + 1, 0, gshift, acc);
    }
    if (k < nfull)
        tile_chunk(RW, TX, nibbles, g32, b, k, 0, gshift, acc);
    if (nibbles && rowbytes % 32)
        tile_chunk(RW, TX, nibbles, g32, b, nfull, 1, gshift, acc);
    for (int i = RW * TX; i < 4; i++)
        acc[i] = _mm256_setzero_ps();
    _mm_storeu_ps(out, _mm_add_ps(hsum8x4(acc[0], acc[1], acc[2], acc[3]), _mm_loadu_ps(bias)));
}

/* One function per tile shape (4 rows x 1 X row, 1 x 4, 1 x 1) and codes
 * (nibbles with groups of 32 or more, bytes), each compiled with its
 * accumulators in registers and its group arithmetic constant but a shift:
 * rows rix (codes from b.w, evenly spaced) against b.qa's rows, their
 * s_g dx_g and biases first, out[i * TX + t]. */
typedef void tile_fn(tile b, const exo_linear *w, const int64_t *rix, int64_t ng, int64_t rowbytes, int gshift,
                     int64_t pf_dist, float *out);
#define TILE_FN(name, RW, TX, nibbles, g32)                                                                     \
    static void name(tile b, const exo_linear *w, const int64_t *rix, int64_t ng, int64_t rowbytes, int gshift, \
                     int64_t pf_dist, float *out)                                                               \
    {                                                                                                           \
        float bias[4] = {0};                                                                                    \
        prep_tile(RW, TX, w, rix, ng, b.qa, b.sd, b.sdstride, bias);                                            \
        affine_tile(RW, TX, nibbles, g32, b, rowbytes, g32 ? 5 : gshift, bias, pf_dist, out);                   \
    }
TILE_FN(nibbles41_g32, 4, 1, 1, 1)
TILE_FN(nibbles41, 4, 1, 1, 0)
TILE_FN(bytes41, 4, 1, 0, 0)
TILE_FN(nibbles14_g32, 1, 4, 1, 1)
TILE_FN(nibbles14, 1, 4, 1, 0)
TILE_FN(bytes14, 1, 4, 0, 0)
TILE_FN(nibbles11_g32, 1, 1, 1, 1)
TILE_FN(nibbles11, 1, 1, 1, 0)
TILE_FN(bytes11, 1, 1, 0, 0)

/* A tile of rows rix[0..RW) against X rows t0 .. t0 + TX, into y. */
static void run_tile(tile_fn *fn, int RW, int TX, tile b, const exo_linear *w, const int64_t *rix, int t0,
                     const exo_qact *qa, int64_t ng, int64_t rowbytes, int gshift, int64_t pf_dist,
                     exo_gemv_scratch *s, float *y, int64_t ldy)
{
    float out[4];
    b.qa = qa + t0;
    b.sd = s->sd;
    b.sdstride = s->sf_stride;
    fn(b, w, rix, ng, rowbytes, gshift, pf_dist, out);
    for (int i = 0; i < RW; i++)
        for (int t = 0; t < TX; t++)
            y[(int64_t)(t0 + t) * ldy + rix[i]] = out[i * TX + t];
}

void exo_gemv_affine_avx2(const exo_linear *w, int64_t r0, int64_t r1, int T, const exo_qact *qa, float *y,
                          int64_t ldy, exo_gemv_scratch *s)
{
    const int64_t cols = w->cols, G = w->group_size, ng = cols / G;
    const int nibbles = w->bits == 4, unpack = w->bits != 4 && w->bits != 8;
    const int64_t wbytes = cols * w->bits / 8, rowbytes = nibbles ? cols / 2 : cols;
    const uint8_t *base = w->w;
    const int64_t S = exo_gemv_page_stride(wbytes);
    const int64_t SB = EXO_GEMV_ROWS * S;
    const int gshift = __builtin_ctzll((unsigned long long)G); /* a power of two (has_gemv_kernel) */
    const int g32 = nibbles && G == 32;
    tile_fn *four = nibbles ? (g32 ? nibbles41_g32 : nibbles41) : bytes41;
    tile_fn *wide = nibbles ? (g32 ? nibbles14_g32 : nibbles14) : bytes14;
    tile_fn *one = nibbles ? (g32 ? nibbles11_g32 : nibbles11) : bytes11;
    for (int64_t sb = r0; sb < r1; sb += SB) {
        int strided;
        int64_t end;
        const int64_t nblocks = exo_gemv_superblock(sb, r1, S, &strided, &end);
        for (int64_t j = 0; j < nblocks; j++) {
            int64_t rix[EXO_GEMV_ROWS];
            const int R = exo_gemv_block_rows(sb, j, S, strided, end, rix);
            /* a whole block's rows are evenly spaced (exo_gemv_block_rows) */
            tile b = {.w = base + (size_t)rix[0] * (size_t)wbytes, .rstride = R > 1 ? (rix[1] - rix[0]) * wbytes : 0};
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
            const int64_t pf = unpack ? 0 : SB * wbytes; /* the first pass over a row fetches ahead */
            int t = 0;
            for (; t + 4 <= T; t += 4) /* each row's codes widened once for four rows of X */
                for (int i = 0; i < R; i++) {
                    tile bi = b;
                    bi.w += i * b.rstride;
                    run_tile(wide, 1, 4, bi, w, &rix[i], t, qa, ng, rowbytes, gshift, t ? 0 : pf, s, y, ldy);
                }
            for (; t < T; t++) {
                if (R == EXO_GEMV_ROWS) {
                    run_tile(four, 4, 1, b, w, rix, t, qa, ng, rowbytes, gshift, t ? 0 : pf, s, y, ldy);
                } else {
                    for (int i = 0; i < R; i++) {
                        tile bi = b;
                        bi.w += i * b.rstride;
                        run_tile(one, 1, 1, bi, w, &rix[i], t, qa, ng, rowbytes, gshift, 0, s, y, ldy);
                    }
                }
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
