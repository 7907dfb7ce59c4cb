/* AMX kernel: the affine (q4, q8) and MXFP4 GEMV of 2 to 16 rows of X at
 * once, on the tile units of Intel CPUs that have them.
 *
 * Why: batched decode multiplies each weight row by up to 16 rows of X. On
 * the vector units that is 16 times the integer work of one row and the
 * work, not the memory, sets the time (16 rows of 2048 x 8192 q4 took 6-8
 * times one row). A tile dot product (TDPBUSD) does 16 weight rows x 16 X
 * rows x 64 codes in about 16 cycles, so the codes cost once.
 *
 * Same bits as the vector kernel's group-sum family (gemv_avx512.c), X row
 * by X row, which a process with tile units uses for all its products. There, a
 * group's integer sum S = (dot(q, xq) << 8) + dot(q, xq2) is exact, and
 * lane g mod 16 of a row's accumulator adds fl(s_g * dx_g) * f32(S) after
 * the bias parts of the same lane, then reduce4's tree sums the lanes.
 * Here a tile pair gives S for 16 weight rows x 16 X rows per group (two
 * accumulator tiles, one per activation level), and the epilogue does the
 * same float operations with the X rows in the vector lanes: acc[m][l] is
 * a vector over X rows, one for each weight row m of the tile and lane l.
 *
 * Data. The A tile is 16 weight rows of one group's codes as bytes, in the
 * group's K order: 8-bit codes straight from the weight (stride: the row),
 * 4-bit codes unpacked (low nibbles of the group's part of a 64-byte block,
 * then high nibbles: the Q4 layout's element order) into a small buffer.
 * The B tiles are the X rows' quantized activations in the same K order,
 * transposed to the tile's 4-byte-interleaved form once per call
 * (exo_qtile_build) and shared by every thread. Per 16 rows and group the
 * tile work is two loads of B, one of A, two TDPBUSD and two stores of the
 * sums; the vector work is the nibble split and the epilogue.
 * Measured on the 2-core Xeon (AMX-INT8): tdpbusd 5.1 ns, a tile load from
 * L1 2.6 ns, a tile store 4.7 ns; a tile load right after the vector
 * stores that fill its memory waits ~15 ns, so the codes of a chunk of
 * groups are unpacked before any of them is loaded, and the sums of a
 * chunk are read back one chunk later. The tile work and the vector work
 * do not overlap on this core (a group's tile sequence 20 ns and its
 * epilogue 18 ns took 36 ns interleaved, with no data shared), so what
 * counts is the sum: per 16 rows x 64 codes about 30 ns of tile work, 20
 * of epilogue, 19 of unpacking, 5 of bias parts.
 *
 * GCC 12's _tile_loadconfig declares an 8-byte operand (TOOLCHAIN.md): the
 * configurations live in static storage. */
#include "engine/cpu/kernels.h"

#include <immintrin.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define INLINE static inline __attribute__((always_inline))

typedef struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* Tiles: 0, 1 the sums of the two activation levels (16 x 16 int32), 2 the
 * codes A (16 rows x K bytes), 3, 4 the activations B of the two levels
 * (K/4 rows x 16 X rows x 4 bytes). K = 64 bytes a tile product, 32 for
 * groups of 32. */
static const tile_config config_k64 __attribute__((aligned(64))) = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16},
};
static const tile_config config_k32 __attribute__((aligned(64))) = {
    .palette = 1,
    .colsb = {64, 64, 32, 64, 64},
    .rows = {16, 16, 16, 8, 8},
};

int exo_amx_usable(void)
{
    static int state = -1; /* set once; a race only repeats the request */
    if (state < 0) {
        /* Linux hands AMX state to a process that asks (ARCH_REQ_XCOMP_PERM
         * for XFEATURE_XTILEDATA); without it the first tile op faults. */
        long rc = syscall(SYS_arch_prctl, 0x1023, 18);
        state = rc == 0;
    }
    return state;
}

int exo_qtile_handles(const exo_linear *w)
{
    if (w->cols % 256)
        return 0;
    if (w->format == EXO_WFORMAT_MXFP4)
        return 1;
    return w->format == EXO_WFORMAT_AFFINE && (w->bits == 4 || w->bits == 8) &&
           (w->group_size == 32 || w->group_size == 64 || w->group_size == 128);
}

/* K bytes of one tile product and tile products a group, for group size G. */
static int tile_k(int G) { return G < 64 ? G : 64; }
static int64_t group_tiles(int G) { return G <= 64 ? 1 : G / 64; }

size_t exo_qtile_bytes(int64_t cols, int G)
{
    int64_t ng = cols / G, ng16 = (ng + 15) / 16 * 16;
    return (size_t)(ng * group_tiles(G) * 2 * 1024) + (size_t)(2 * ng16 * 16) * sizeof(float) + 64;
}

/* The Q4 layout's 64 + 64 bytes of a block (even elements, odd elements)
 * as the block's groups in order, each its evens then its odds: the order
 * the A tile's unpacked codes take (q4_unpack). out0, out1: 64 bytes each. */
INLINE void q4_group_order(int G, __m512i lo, __m512i hi, __m512i *out0, __m512i *out1)
{
    __m512i i0, i1;
    if (G == 32) {
        i0 = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
        i1 = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
    } else if (G == 64) {
        i0 = _mm512_set_epi64(11, 10, 9, 8, 3, 2, 1, 0);
        i1 = _mm512_set_epi64(15, 14, 13, 12, 7, 6, 5, 4);
    } else {
        *out0 = lo;
        *out1 = hi;
        return;
    }
    *out0 = _mm512_permutex2var_epi64(lo, i0, hi);
    *out1 = _mm512_permutex2var_epi64(lo, i1, hi);
}

void exo_qtile_build(const exo_qact *qa, int T, int64_t cols, int G, int layout, exo_qtile *out,
                     void *mem)
{
    const int64_t ng = cols / G, ng16 = (ng + 15) / 16 * 16, nt = group_tiles(G);
    const int K = tile_k(G);
    unsigned char *p = (unsigned char *)(((uintptr_t)mem + 63) & ~(uintptr_t)63);
    out->T = T;
    out->ng = ng;
    out->b = (int8_t *)p;
    out->dx = (float *)(p + ng * nt * 2 * 1024);
    out->sx = out->dx + ng16 * 16;
    memset(out->dx, 0, (size_t)(2 * ng16 * 16) * sizeof(float));
    for (int n = 0; n < T; n++)
        for (int64_t g = 0; g < ng; g++) {
            out->dx[g * 16 + n] = qa[n].dx[g];
            out->sx[g * 16 + n] = qa[n].sx[g];
        }
    /* each X row's activations in the groups' K order, then the tile
     * interleave: B[k][4n + i] = seq_n[4k + i] */
    for (int lvl = 0; lvl < 2; lvl++) {
        for (int64_t c = 0; c < cols; c += 128) {
            int8_t seq[16][128] __attribute__((aligned(64)));
            for (int n = 0; n < 16; n++) {
                if (n >= T) {
                    memset(seq[n], 0, 128);
                    continue;
                }
                const int8_t *q = (lvl ? qa[n].q2 : qa[n].q) + c;
                __m512i a = _mm512_loadu_si512(q), b = _mm512_loadu_si512(q + 64);
                if (layout == EXO_QLAYOUT_Q4)
                    q4_group_order(G, a, b, &a, &b);
                _mm512_store_si512(seq[n], a);
                _mm512_store_si512(seq[n] + 64, b);
            }
            /* the 128 bytes are 128 / K tile products of the groups from c */
            for (int h = 0; h < 128 / K; h++) {
                int64_t kt = (c + (int64_t)h * K) / K; /* tile product index over the row */
                int64_t g = kt * K / G, sub = kt - g * nt;
                int8_t *dst = out->b + ((g * nt + sub) * 2 + lvl) * 1024;
                const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                       _mm512_set1_epi32(128));
                for (int k = 0; k < K / 4; k++)
                    _mm512_store_si512(dst + 64 * k,
                                       _mm512_i32gather_epi32(idx, (const void *)(&seq[0][h * K + 4 * k]), 1));
            }
        }
    }
}

/* Rows [m0, m1) of a tile's chunk of codes (the chunk's codes of a row start
 * at byte off) as bytes in group order, `stride` a row; rows past nrows are
 * zeros. 4-bit codes: 64-byte blocks split into nibbles (mx: MXFP4 codes
 * through the table u = 2 * e2m1 + 12); 8-bit codes: copied. */
INLINE void unpack_rows(int q4, int G, int mx, const uint8_t *const *row, int nrows, int m0, int m1,
                        int64_t off, int64_t code_bytes, int64_t pf, uint8_t *abuf, int64_t stride)
{
    const __m512i nib = _mm512_set1_epi8(0x0f);
    const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8,
                                                             6, 4, 0));
    for (int m = m0; m < m1; m++) {
        for (int64_t h = 0; h < code_bytes; h += 64) {
            __m512i v = _mm512_setzero_si512();
            if (m < nrows) {
                const uint8_t *p = row[m] + off + h;
                _mm_prefetch((const char *)p + pf, _MM_HINT_T0);
                v = _mm512_loadu_si512(p);
            }
            if (!q4) {
                _mm512_store_si512(abuf + stride * m + h, v);
                continue;
            }
            __m512i lo = _mm512_and_si512(v, nib);
            __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
            if (mx) {
                lo = _mm512_shuffle_epi8(lut, lo);
                hi = _mm512_shuffle_epi8(lut, hi);
            }
            __m512i o0, o1;
            q4_group_order(G, lo, hi, &o0, &o1);
            _mm512_store_si512(abuf + stride * m + 2 * h, o0);
            _mm512_store_si512(abuf + stride * m + 2 * h + 64, o1);
        }
    }
}

/* The epilogue of one group g for the tile's 16 weight rows: sums from the
 * two level tiles (16 x 16 int32 each, row m = weight row, lane = X row). */
INLINE void group_epilogue(const int32_t *c1, const int32_t *c2, const float *sc, int64_t sc_stride,
                           int64_t g, const exo_qtile *qt, float *acc)
{
    const __m512 dx = _mm512_load_ps(qt->dx + g * 16);
    float *a = acc + (g & 15) * 16;
    #pragma GCC unroll 4
    for (int m = 0; m < 16; m++) {
        __m512i s = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(c1 + 16 * m), 8),
                                     _mm512_load_si512(c2 + 16 * m));
        __m512 sd = _mm512_mul_ps(_mm512_set1_ps(sc[m * sc_stride + g]), dx);
        float *am = a + m * 256;
        _mm512_store_ps(am, _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), sd, _mm512_load_ps(am)));
    }
}

/* Groups a chunk: 4 (the codes of 128 or 256 columns), 2 of 128. */
enum { CHUNK_GROUPS = 4 };

size_t exo_gemv_amx_scratch_bytes(int64_t cols)
{
    int64_t ng16 = (cols / 32 + 15) / 16 * 16;
    /* acc 16 x 16 x 16 floats, codes 2 x 16 x 256, sums 2 x 4 groups x 2 x
     * 1 KiB, scales and biases 16 x ng16 each */
    return 16384 + 8192 + 16384 + (size_t)(2 * 16 * ng16) * sizeof(float) + 64;
}

/* Rows [r0, r1) of an affine q4/q8 or MXFP4 weight (mx) against qt's X rows.
 * A tile of 16 rows goes through its groups a chunk at a time, three
 * chunks in flight: while the tile units take chunk c's groups, the vector
 * units unpack chunk c + 1's codes and finish chunk c - 1's sums, a group's
 * worth of each after each group's tile products, so neither waits on
 * memory the other just wrote. */
static void gemv_amx(const exo_linear *w, int mx, int64_t r0, int64_t r1, const exo_qtile *qt, float *y,
                     int64_t ldy, void *scratch)
{
    const int64_t cols = w->cols;
    const int bits = mx ? 4 : w->bits, G = mx ? 32 : w->group_size;
    const int q4 = bits == 4;
    const int64_t ng = cols / G, ng16 = (ng + 15) / 16 * 16;
    const int64_t rowbytes = cols * bits / 8;
    const int K = tile_k(G);
    const int64_t nt = group_tiles(G);
    const int CG = G <= 64 ? CHUNK_GROUPS : 2;
    const int64_t chunk_codes = (int64_t)CG * G;          /* 128 or 256 */
    const int64_t chunk_bytes = chunk_codes * bits / 8;
    const int64_t nchunks = ng / CG; /* cols is a multiple of 256 */
    unsigned char *mem = (unsigned char *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    float *acc = (float *)mem;                             /* [m][l][n] */
    uint8_t *abuf = mem + 16384;                           /* [2][m][chunk_codes] */
    int32_t *cbuf = (int32_t *)(mem + 16384 + 8192);       /* [2][CG][2 levels][256] */
    float *sc = (float *)(mem + 16384 + 8192 + 16384);
    float *bi = sc + 16 * ng16;
    _tile_loadconfig(K == 64 ? &config_k64 : &config_k32);
    for (int64_t r = r0; r < r1; r += 16) {
        const int nrows = r1 - r >= 16 ? 16 : (int)(r1 - r);
        const uint8_t *row[16];
        for (int m = 0; m < 16; m++) {
            row[m] = (const uint8_t *)w->w + (size_t)(r + (m < nrows ? m : 0)) * (size_t)rowbytes;
            if (m < nrows) {
                exo_gemv_row_params(w, mx, r + m, ng, sc + m * ng16, bi + m * ng16);
            } else {
                memset(sc + m * ng16, 0, (size_t)ng16 * sizeof(float));
                memset(bi + m * ng16, 0, (size_t)ng16 * sizeof(float));
            }
        }
        /* lane l of each accumulator starts from the bias parts of groups
         * l, l + 16, ...: prep_row's fused multiply-adds, in its order
         * (its padding lanes too); 16 chains at a time */
        for (int m = 0; m < 16; m++) {
            __m512 a[16];
            #pragma GCC unroll 16
            for (int l = 0; l < 16; l++)
                a[l] = _mm512_setzero_ps();
            const float *bm = (mx ? sc : bi) + m * ng16;
            for (int64_t g0 = 0; g0 < ng16; g0 += 16) {
                #pragma GCC unroll 16
                for (int l = 0; l < 16; l++)
                    a[l] = _mm512_fmadd_ps(_mm512_set1_ps(bm[g0 + l]), _mm512_load_ps(qt->sx + (g0 + l) * 16), a[l]);
            }
            #pragma GCC unroll 16
            for (int l = 0; l < 16; l++)
                _mm512_store_ps(acc + m * 256 + l * 16, mx ? _mm512_mul_ps(a[l], _mm512_set1_ps(-12.0f)) : a[l]);
        }
        /* 8-bit codes load straight into A when all 16 rows are there */
        const int direct = !q4 && nrows == 16;
        const int64_t pf = (int64_t)(rowbytes < 2048 ? 32 : 16) * rowbytes;
        if (!direct)
            unpack_rows(q4, G, mx, row, nrows, 0, 16, 0, chunk_bytes, pf, abuf, chunk_codes);
        for (int64_t c = 0; c <= nchunks; c++) {
            const uint8_t *ab = abuf + (c & 1) * 16 * chunk_codes;
            int32_t *cb = cbuf + (c & 1) * (CG * 2 * 256);
            const int32_t *pb = cbuf + ((c - 1) & 1) * (CG * 2 * 256);
            for (int h = 0; h < CG; h++) {
                const int64_t g = c * CG + h;
                if (c < nchunks) {
                    _tile_zero(0);
                    _tile_zero(1);
                    for (int64_t t = 0; t < nt; t++) {
                        const int64_t kb = (int64_t)h * G + t * K; /* codes into the chunk */
                        if (direct)
                            _tile_loadd(2, row[0] + c * chunk_bytes + kb, rowbytes);
                        else
                            _tile_loadd(2, ab + kb, chunk_codes);
                        const int8_t *b = qt->b + (g * nt + t) * 2 * 1024;
                        _tile_loadd(3, b, 64);
                        _tile_loadd(4, b + 1024, 64);
                        _tile_dpbusd(0, 2, 3);
                        _tile_dpbusd(1, 2, 4);
                    }
                    _tile_stored(0, cb + h * 512, 64);
                    _tile_stored(1, cb + h * 512 + 256, 64);
                }
                if (c + 1 < nchunks) {
                    const int m0 = h * 16 / CG, m1 = (h + 1) * 16 / CG;
                    if (direct)
                        for (int m = m0; m < m1; m++)
                            for (int64_t k = 0; k < chunk_bytes; k += 64)
                                _mm_prefetch((const char *)row[m] + (c + 1) * chunk_bytes + k + pf, _MM_HINT_T0);
                    else
                        unpack_rows(q4, G, mx, row, nrows, m0, m1, (c + 1) * chunk_bytes, chunk_bytes, pf,
                                    abuf + ((c + 1) & 1) * 16 * chunk_codes, chunk_codes);
                }
                if (c > 0) /* chunk c - 1's sums, stored a chunk ago */
                    group_epilogue(pb + h * 512, pb + h * 512 + 256, sc, ng16, (c - 1) * CG + h, qt, acc);
            }
        }
        /* reduce4's tree over the lanes, X rows in the vector */
        for (int m = 0; m < nrows; m++) {
            const float *a = acc + m * 256;
            __m512 p[8];
            for (int k = 0; k < 8; k++)
                p[k] = _mm512_add_ps(_mm512_load_ps(a + 16 * k), _mm512_load_ps(a + 16 * (k + 8)));
            __m512 o = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(p[0], p[1]), _mm512_add_ps(p[2], p[3])),
                                     _mm512_add_ps(_mm512_add_ps(p[4], p[5]), _mm512_add_ps(p[6], p[7])));
            float ov[16];
            _mm512_storeu_ps(ov, o);
            for (int n = 0; n < qt->T; n++)
                y[(int64_t)n * ldy + r + m] = ov[n];
        }
    }
    _tile_release();
}

void exo_gemv_affine_amx(const exo_linear *w, int64_t r0, int64_t r1, const exo_qtile *qt, float *y,
                         int64_t ldy, void *scratch)
{
    gemv_amx(w, w->format == EXO_WFORMAT_MXFP4, r0, r1, qt, y, ldy, scratch);
}
