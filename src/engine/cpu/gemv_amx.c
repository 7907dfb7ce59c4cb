/* AMX kernel: the affine (q4, q8) and MXFP4 GEMV of up to 16 rows of X at
 * once (matmul.c sends it 4 or 5 and more), on the tile units of Intel CPUs that have them.
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
 * Here a tile pair gives S for 16 weight rows x N X rows per group (two
 * accumulator tiles, one per activation level; N = 4, 8 or 16, the X rows
 * rounded up), and the epilogue does the same float operations with
 * (weight row, X row) pairs in the vector lanes: acc[v][l] is a vector of
 * 16/N weight rows x N X rows, for lane l of the row accumulators.
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
#include "engine/cpu/codes_avx512.h"
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

/* Tiles: 0, 1 the sums of the two activation levels (16 weight rows x N X
 * rows, int32), 2 the codes A (16 rows x K bytes), 3, 4 the activations B
 * of the two levels (K/4 rows x N X rows x 4 bytes). K = 64 bytes a tile
 * product, 32 for groups of 32; N = 4, 8 or 16 columns, the X rows rounded
 * up, so that fewer rows of X cost fewer sums to store and finish. */
#define TILE_CONFIG(K, N)                                                                     \
    {.palette = 1, .colsb = {4 * (N), 4 * (N), (K), 4 * (N), 4 * (N)}, .rows = {16, 16, 16, (K) / 4, (K) / 4}}
static const tile_config tile_configs[2][3] __attribute__((aligned(64))) = {
    {TILE_CONFIG(32, 4), TILE_CONFIG(32, 8), TILE_CONFIG(32, 16)},
    {TILE_CONFIG(64, 4), TILE_CONFIG(64, 8), TILE_CONFIG(64, 16)},
};

int exo_amx_usable(void)
{
    static _Atomic int state = -1; /* set once; a race only repeats the request */
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
 * the A tile's unpacked codes take (unpack_rows). out0, out1: 64 bytes each. */
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
            __m512i lo, hi, o0, o1;
            exo_split_nibbles(v, mx, &lo, &hi);
            q4_group_order(G, lo, hi, &o0, &o1);
            _mm512_store_si512(abuf + stride * m + 2 * h, o0);
            _mm512_store_si512(abuf + stride * m + 2 * h + 64, o1);
        }
    }
}

/* A vector of the tile's sums holds 16 / N weight rows of N X rows: lane
 * -> (row v * 16/N + lane / N, X row lane mod N). Per group, the X rows'
 * values (dx, sx: 16 a group) repeat every N lanes ... */
INLINE __m512 per_x_row(const float *p, int N)
{
    if (N == 4)
        return _mm512_broadcast_f32x4(_mm_load_ps(p));
    if (N == 8)
        return _mm512_broadcast_f32x8(_mm256_load_ps(p));
    return _mm512_load_ps(p);
}

/* ... and the weight rows' values (scales, biases) repeat each N times. The
 * table t holds them [16 rows][ng16]; for N < 16 each 16 x 16 block is
 * transposed in place, so that a group's 16 rows lie together and one
 * permute spreads them (for N = 16 a lane takes one row's: a broadcast, no
 * transpose). */
INLINE __m512 per_row(const float *t, int64_t ng16, int64_t g, int N, int v)
{
    if (N == 16)
        return _mm512_set1_ps(t[v * ng16 + g]);
    const float *p = t + (g & 15) * ng16 + (g & ~(int64_t)15);
    const int rpv = 16 / N;
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(v * rpv), _mm512_srli_epi32(lane, N == 4 ? 2 : 3));
    return _mm512_permutexvar_ps(idx, _mm512_loadu_ps(p));
}

/* The epilogue of one group g: sums from the two level tiles (16 x N
 * int32 each, packed) into the accumulators of lane g mod 16, acc[v][l]. */
INLINE void group_epilogue(int N, const int32_t *c1, const int32_t *c2, const float *sc, int64_t ng16,
                           int64_t g, const exo_qtile *qt, float *acc)
{
    const __m512 dx = per_x_row(qt->dx + g * 16, N);
    float *a = acc + (g & 15) * 16;
    #pragma GCC unroll 4
    for (int v = 0; v < N; v++) {
        __m512i s = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(c1 + 16 * v), 8),
                                     _mm512_load_si512(c2 + 16 * v));
        __m512 sd = _mm512_mul_ps(per_row(sc, ng16, g, N, v), dx);
        float *av = a + v * 256;
        _mm512_store_ps(av, _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), sd, _mm512_load_ps(av)));
    }
}

/* out[j * ld_out + i] = in[i * ld_in + j] for a 16 x 16 block of floats. */
static void transpose16(const float *in, int64_t ld_in, float *out, int64_t ld_out)
{
    __m512 r[16], t[16], u[16], v[16];
    for (int i = 0; i < 16; i++)
        r[i] = _mm512_loadu_ps(in + i * ld_in);
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        u[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xee);
        u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 16; i += 8)
        for (int j = 0; j < 4; j++) {
            v[i + j] = _mm512_shuffle_f32x4(u[i + j], u[i + 4 + j], 0x88);
            v[i + 4 + j] = _mm512_shuffle_f32x4(u[i + j], u[i + 4 + j], 0xdd);
        }
    for (int j = 0; j < 8; j++) {
        _mm512_storeu_ps(out + j * ld_out, _mm512_shuffle_f32x4(v[j], v[8 + j], 0x88));
        _mm512_storeu_ps(out + (8 + j) * ld_out, _mm512_shuffle_f32x4(v[j], v[8 + j], 0xdd));
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
INLINE void gemv_amx(int N, const exo_linear *w, int mx, int64_t r0, int64_t r1, const exo_qtile *qt, float *y,
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
    float *acc = (float *)mem;                             /* [v][l][16 lanes] */
    uint8_t *abuf = mem + 16384;                           /* [2][m][chunk_codes] */
    int32_t *cbuf = (int32_t *)(mem + 16384 + 8192);       /* [2][CG][2 levels][16 x N] */
    /* the rows' scales and biases, [16 rows][ng16] (see per_row) */
    float *sc = (float *)(mem + 16384 + 8192 + 16384);
    float *bi = sc + 16 * ng16;
    _tile_loadconfig(&tile_configs[K == 64][N == 4 ? 0 : N == 8 ? 1 : 2]);
    for (int64_t r = r0; r < r1; r += 16) {
        const int nrows = r1 - r >= 16 ? 16 : (int)(r1 - r);
        const uint8_t *row[16];
        for (int m = 0; m < 16; m++)
            row[m] = (const uint8_t *)w->w + (size_t)(r + (m < nrows ? m : 0)) * (size_t)rowbytes;
        for (int m = 0; m < 16; m++)
            if (m < nrows) {
                exo_gemv_row_params(w, mx, r + m, ng, 0, ng, sc + m * ng16, bi + m * ng16);
            } else {
                memset(sc + m * ng16, 0, (size_t)ng16 * sizeof(float));
                memset(bi + m * ng16, 0, (size_t)ng16 * sizeof(float));
            }
        for (int64_t g0 = 0; g0 < ng16 && N < 16; g0 += 16) {
            transpose16(sc + g0, ng16, sc + g0, ng16);
            if (!mx)
                transpose16(bi + g0, ng16, bi + g0, ng16);
        }
        /* lane l of each accumulator starts from the bias parts of groups
         * l, l + 16, ...: prep_row's fused multiply-adds, in its order
         * (its padding lanes too); 16 chains at a time */
        for (int v = 0; v < N; v++) {
            __m512 a[16];
            #pragma GCC unroll 16
            for (int l = 0; l < 16; l++)
                a[l] = _mm512_setzero_ps();
            const float *bT = mx ? sc : bi;
            for (int64_t g0 = 0; g0 < ng16; g0 += 16) {
                #pragma GCC unroll 16
                for (int l = 0; l < 16; l++)
                    a[l] = _mm512_fmadd_ps(per_row(bT, ng16, g0 + l, N, v), per_x_row(qt->sx + (g0 + l) * 16, N),
                                           a[l]);
            }
            #pragma GCC unroll 16
            for (int l = 0; l < 16; l++)
                _mm512_store_ps(acc + v * 256 + l * 16, mx ? _mm512_mul_ps(a[l], _mm512_set1_ps(-12.0f)) : a[l]);
        }
        /* 8-bit codes load straight into A when all 16 rows are there */
        const int direct = !q4 && nrows == 16;
        const int64_t pf = (int64_t)(rowbytes < 2048 ? 32 : 16) * rowbytes;
        if (!direct)
            unpack_rows(q4, G, mx, row, nrows, 0, 16, 0, chunk_bytes, pf, abuf, chunk_codes);
        const int sums = 16 * N; /* int32 of one level's tile */
        for (int64_t c = 0; c <= nchunks; c++) {
            const uint8_t *ab = abuf + (c & 1) * 16 * chunk_codes;
            int32_t *cb = cbuf + (c & 1) * (CG * 2 * sums);
            const int32_t *pb = cbuf + ((c - 1) & 1) * (CG * 2 * sums);
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
                    /* packed: row m's N sums at m * N */
                    _tile_stored(0, cb + h * 2 * sums, 4 * N);
                    _tile_stored(1, cb + h * 2 * sums + sums, 4 * N);
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
                if (c > 0) { /* chunk c - 1's sums, stored a chunk ago */
                    const int32_t *ps = pb + h * 2 * sums;
                    group_epilogue(N, ps, ps + sums, sc, ng16, (c - 1) * CG + h, qt, acc);
                }
            }
        }
        /* reduce4's tree over the lanes l, then each vector lane to its
         * (row, X row) */
        for (int v = 0; v < N; v++) {
            const float *a = acc + v * 256;
            __m512 p[8];
            for (int k = 0; k < 8; k++)
                p[k] = _mm512_add_ps(_mm512_load_ps(a + 16 * k), _mm512_load_ps(a + 16 * (k + 8)));
            __m512 o = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(p[0], p[1]), _mm512_add_ps(p[2], p[3])),
                                     _mm512_add_ps(_mm512_add_ps(p[4], p[5]), _mm512_add_ps(p[6], p[7])));
            float ov[16];
            _mm512_storeu_ps(ov, o);
            for (int i = 0; i < 16 / N; i++) {
                const int m = v * (16 / N) + i;
                for (int n = 0; m < nrows && n < qt->T; n++)
                    y[(int64_t)n * ldy + r + m] = ov[i * N + n];
            }
        }
    }
    _tile_release();
}

/* One instance per tile width (N a constant in each). */
static void gemv_amx4(const exo_linear *w, int mx, int64_t r0, int64_t r1, const exo_qtile *qt, float *y,
                      int64_t ldy, void *scratch)
{
    gemv_amx(4, w, mx, r0, r1, qt, y, ldy, scratch);
}

static void gemv_amx8(const exo_linear *w, int mx, int64_t r0, int64_t r1, const exo_qtile *qt, float *y,
                      int64_t ldy, void *scratch)
{
    gemv_amx(8, w, mx, r0, r1, qt, y, ldy, scratch);
}

static void gemv_amx16(const exo_linear *w, int mx, int64_t r0, int64_t r1, const exo_qtile *qt, float *y,
                       int64_t ldy, void *scratch)
{
    gemv_amx(16, w, mx, r0, r1, qt, y, ldy, scratch);
}

void exo_gemv_affine_amx(const exo_linear *w, int64_t r0, int64_t r1, const exo_qtile *qt, float *y,
                         int64_t ldy, void *scratch)
{
    const int mx = w->format == EXO_WFORMAT_MXFP4;
    if (qt->T <= 4)
        gemv_amx4(w, mx, r0, r1, qt, y, ldy, scratch);
    else if (qt->T <= 8)
        gemv_amx8(w, mx, r0, r1, qt, y, ldy, scratch);
    else
        gemv_amx16(w, mx, r0, r1, qt, y, ldy, scratch);
}
