/* CPU matmul paths against each other and against a naive double-precision
 * product of the dequantized weights.
 *
 * Tolerances, as a normalised mean squared error over a call's outputs,
 * NMSE = sum (y - ref)^2 / sum_outputs sum_c (w_c x_c)^2 (the denominator is
 * the size of the terms, not of the possibly cancelling sum):
 *   reference path vs naive double  : 1e-10 (f32 rounding of the result only)
 *   GEMV, dense weights             : 1e-9  (f32 accumulation)
 *   GEMV, affine weights            : 1e-8  (activations in two int8 levels per
 *                                            group: step max|x|/(127*256), about
 *                                            (max|x|/32512)^2/12 per element, i.e.
 *                                            ~1e-9 for gaussian x; a single int8
 *                                            level gives ~1e-4 and fails this)
 *   GEMM, F32 weights (oneDNN f32)  : 1e-9
 *   GEMM, other weights (bf16 AMX)  : 1e-4  (X and the weights rounded to bf16;
 *                                            expected ~1e-5)
 *   AUTO                            : the looser of GEMV and GEMM
 * Weights are placed so their last byte is the last byte before a PROT_NONE
 * page: any read past the end of a weight row faults. */
#include <criterion/criterion.h>

#include "core/alloc.h"
#include "core/cpu_features.h"
#include "core/threadpool.h"
#include "engine/cpu/matmul.h"
#include "engine/quant.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static uint64_t rng = 0x1234567887654321ull;

static double uniform01(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static float gauss(void)
{
    double s = 0;
    for (int i = 0; i < 12; i++)
        s += uniform01();
    return (float)(s - 6.0);
}

/* Memory whose end touches a guard page. */
typedef struct guarded {
    void *map;
    size_t map_len;
    void *p;
} guarded;

static void *guarded_alloc(guarded *g, size_t n)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t data = (n + page - 1) / page * page;
    g->map_len = data + page;
    g->map = mmap(NULL, g->map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert(g->map != MAP_FAILED);
    cr_assert_eq(mprotect((char *)g->map + data, page, PROT_NONE), 0);
    g->p = (char *)g->map + data - n;
    return g->p;
}

static void guarded_free(guarded *g)
{
    if (g->map)
        munmap(g->map, g->map_len);
    memset(g, 0, sizeof *g);
}

/* A test weight: its exo_linear plus owned storage. */
typedef struct tweight {
    exo_linear l;
    guarded codes, scales, biases;
} tweight;

static void tweight_make(tweight *t, exo_wformat fmt, exo_dtype dt, int64_t rows, int64_t cols,
                         int bits, int G)
{
    memset(t, 0, sizeof *t);
    t->l.format = fmt;
    t->l.dtype = dt;
    t->l.rows = rows;
    t->l.cols = cols;
    float *row = exo_malloc((size_t)cols * sizeof(float));
    if (fmt == EXO_WFORMAT_DENSE) {
        size_t esz = exo_dtype_size(dt);
        unsigned char *w = guarded_alloc(&t->codes, (size_t)(rows * cols) * esz);
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t c = 0; c < cols; c++) {
                float v = gauss() * 0.05f;
                unsigned char *dst = w + (size_t)(r * cols + c) * esz;
                if (dt == EXO_DTYPE_F32) {
                    memcpy(dst, &v, 4);
                } else {
                    uint16_t h = dt == EXO_DTYPE_BF16 ? exo_f32_to_bf16(v) : exo_f32_to_f16(v);
                    memcpy(dst, &h, 2);
                }
            }
        }
        t->l.w = w;
    } else {
        int64_t wpr = cols * bits / 32, ng = cols / G;
        size_t esz = exo_dtype_size(dt);
        unsigned char *codes = guarded_alloc(&t->codes, (size_t)(rows * wpr) * 4);
        unsigned char *sc = guarded_alloc(&t->scales, (size_t)(rows * ng) * esz);
        unsigned char *bi = guarded_alloc(&t->biases, (size_t)(rows * ng) * esz);
        uint32_t *wbuf = exo_malloc((size_t)wpr * 4);
        float *sf = exo_malloc((size_t)ng * 4), *bf = exo_malloc((size_t)ng * 4);
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t c = 0; c < cols; c++)
                row[c] = gauss() * 0.05f + (r % 3 == 0 ? 0.01f : 0.0f);
            cr_assert_eq(exo_affine_quantize_row(row, cols, bits, G, wbuf, sf, bf), 0);
            memcpy(codes + (size_t)(r * wpr) * 4, wbuf, (size_t)wpr * 4);
            for (int64_t g = 0; g < ng; g++) {
                size_t off = (size_t)(r * ng + g) * esz;
                if (dt == EXO_DTYPE_F32) {
                    memcpy(sc + off, &sf[g], 4);
                    memcpy(bi + off, &bf[g], 4);
                } else {
                    uint16_t hs = dt == EXO_DTYPE_BF16 ? exo_f32_to_bf16(sf[g]) : exo_f32_to_f16(sf[g]);
                    uint16_t hb = dt == EXO_DTYPE_BF16 ? exo_f32_to_bf16(bf[g]) : exo_f32_to_f16(bf[g]);
                    memcpy(sc + off, &hs, 2);
                    memcpy(bi + off, &hb, 2);
                }
            }
        }
        exo_free(wbuf);
        exo_free(sf);
        exo_free(bf);
        t->l.w = codes;
        t->l.scales = sc;
        t->l.biases = bi;
        t->l.bits = bits;
        t->l.group_size = G;
    }
    exo_free(row);
}

static void tweight_free(tweight *t)
{
    guarded_free(&t->codes);
    guarded_free(&t->scales);
    guarded_free(&t->biases);
}

static float *rand_x(int T, int64_t cols)
{
    float *x = exo_malloc((size_t)T * (size_t)cols * sizeof(float));
    for (int64_t i = 0; i < T * cols; i++)
        x[i] = gauss();
    return x;
}

/* y = W x in double; energy[t][r] = sum_c (w_rc x_tc)^2, the scale of the
 * rounding errors of the products, used to normalise errors so a dot
 * product that cancels to ~0 does not blow up the metric. */
static void naive(const exo_linear *w, const float *x, int T, float *y, double *energy)
{
    float *row = exo_malloc((size_t)w->cols * sizeof(float));
    for (int64_t r = 0; r < w->rows; r++) {
        exo_linear_row_f32(w, r, row);
        for (int t = 0; t < T; t++) {
            double acc = 0, en = 0;
            for (int64_t c = 0; c < w->cols; c++) {
                double p = (double)row[c] * x[t * w->cols + c];
                acc += p;
                en += p * p;
            }
            y[t * w->rows + r] = (float)acc;
            energy[t * w->rows + r] = en;
        }
    }
    exo_free(row);
}

static double nmse(const float *y, const float *ref, const double *energy, int64_t n)
{
    double e = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        e += ((double)y[i] - ref[i]) * ((double)y[i] - ref[i]);
        s += energy ? energy[i] : (double)ref[i] * ref[i];
    }
    return s > 0 ? e / s : e;
}

static double tolerance(exo_matmul_path path, const exo_linear *w)
{
    int f32 = w->format == EXO_WFORMAT_DENSE && w->dtype == EXO_DTYPE_F32;
    switch (path) {
    case EXO_MATMUL_REFERENCE: return 1e-10;
    case EXO_MATMUL_GEMV: return w->format == EXO_WFORMAT_DENSE ? 1e-9 : 1e-8;
    case EXO_MATMUL_GEMM: return f32 ? 1e-9 : 1e-4;
    default: return f32 ? 1e-9 : 1e-4;
    }
}

static const char *path_name(exo_matmul_path p)
{
    return p == EXO_MATMUL_REFERENCE ? "reference" : p == EXO_MATMUL_GEMV ? "gemv" : p == EXO_MATMUL_GEMM ? "gemm" : "auto";
}

/* Runs one call with n weights through `path` and checks every output. */
static void check_call(exo_cpu_matmul_ctx *ctx, exo_matmul_path path, int n, tweight *tw, int T)
{
    int64_t cols = tw[0].l.cols;
    float *x = rand_x(T, cols);
    const exo_linear *ws[8];
    float *ys[8], *refs[8];
    double *ens[8];
    for (int i = 0; i < n; i++) {
        ws[i] = &tw[i].l;
        ys[i] = exo_malloc((size_t)T * (size_t)tw[i].l.rows * sizeof(float));
        for (int64_t k = 0; k < T * tw[i].l.rows; k++)
            ys[i][k] = NAN;
        refs[i] = exo_malloc((size_t)T * (size_t)tw[i].l.rows * sizeof(float));
        ens[i] = exo_malloc((size_t)T * (size_t)tw[i].l.rows * sizeof(double));
        naive(ws[i], x, T, refs[i], ens[i]);
    }
    exo_cpu_matmul_force_path(ctx, path);
    exo_cpu_matmul(ctx, n, ws, x, T, ys);
    for (int i = 0; i < n; i++) {
        const exo_linear *w = ws[i];
        double e = nmse(ys[i], refs[i], ens[i], T * w->rows);
        cr_expect(e <= tolerance(path, w),
                  "%s: weight %d fmt %d dtype %s bits %d G %d rows %lld cols %lld T %d: nmse %g",
                  path_name(path), i, w->format, exo_dtype_name(w->dtype), w->bits, w->group_size,
                  (long long)w->rows, (long long)cols, T, e);
        exo_free(ys[i]);
        exo_free(refs[i]);
        exo_free(ens[i]);
    }
    exo_free(x);
}

static const exo_matmul_path all_paths[] = {EXO_MATMUL_REFERENCE, EXO_MATMUL_GEMV, EXO_MATMUL_GEMM,
                                            EXO_MATMUL_AUTO};

Test(matmul, dense_all_paths)
{
    static const exo_dtype dts[] = {EXO_DTYPE_F32, EXO_DTYPE_BF16, EXO_DTYPE_F16};
    static const int64_t shapes[][2] = {{1, 16}, {5, 40}, {67, 96}, {130, 257}, {33, 1024}};
    static const int Ts[] = {1, 2, 3, 4, 5, 17};
    for (int nth = 1; nth <= 2; nth++) {
        exo_pool *pool = exo_pool_create(nth);
        exo_cpu_matmul_ctx *ctx = exo_cpu_matmul_ctx_create(pool);
        for (size_t d = 0; d < 3; d++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                tweight tw;
                tweight_make(&tw, EXO_WFORMAT_DENSE, dts[d], shapes[s][0], shapes[s][1], 0, 0);
                for (size_t p = 0; p < 4; p++)
                    for (size_t t = 0; t < sizeof Ts / sizeof Ts[0]; t++)
                        check_call(ctx, all_paths[p], 1, &tw, Ts[t]);
                tweight_free(&tw);
            }
        exo_cpu_matmul_ctx_free(ctx);
        exo_pool_free(pool);
    }
}

static void affine_all_paths(int bits)
{
    static const int Gs[] = {32, 64, 128};
    static const int Ts[] = {1, 2, 3, 5, 17};
    static const int64_t rowsv[] = {1, 7, 66};
    for (int nth = 1; nth <= 2; nth++) {
        exo_pool *pool = exo_pool_create(nth);
        exo_cpu_matmul_ctx *ctx = exo_cpu_matmul_ctx_create(pool);
        for (size_t g = 0; g < 3; g++) {
            int G = Gs[g];
            /* column counts giving no tail, a short tail and full + tail blocks */
            int64_t colsv[] = {G, 3 * G, 512 + G, 2048};
            for (size_t c = 0; c < 4; c++)
                for (size_t r = 0; r < 3; r++) {
                    tweight tw;
                    exo_dtype dt = (c == 1 && r == 1) ? EXO_DTYPE_F16 : (c == 2 && r == 1) ? EXO_DTYPE_F32 : EXO_DTYPE_BF16;
                    tweight_make(&tw, EXO_WFORMAT_AFFINE, dt, rowsv[r], colsv[c], bits, G);
                    for (size_t p = 0; p < 4; p++)
                        for (size_t t = 0; t < sizeof Ts / sizeof Ts[0]; t++) {
                            if (colsv[c] == 2048 && Ts[t] > 3 && p != 2)
                                continue; /* keep the naive oracle affordable */
                            check_call(ctx, all_paths[p], 1, &tw, Ts[t]);
                        }
                    tweight_free(&tw);
                }
        }
        exo_cpu_matmul_ctx_free(ctx);
        exo_pool_free(pool);
    }
}

Test(matmul, affine_q2_all_paths) { affine_all_paths(2); }
Test(matmul, affine_q3_all_paths) { affine_all_paths(3); }
Test(matmul, affine_q4_all_paths) { affine_all_paths(4); }
Test(matmul, affine_q5_all_paths) { affine_all_paths(5); }
Test(matmul, affine_q6_all_paths) { affine_all_paths(6); }
Test(matmul, affine_q8_all_paths) { affine_all_paths(8); }

/* GEMV row blocks take rows a page or more apart: whole super-blocks, a
 * partial one at the end, row counts the stride does not divide and row
 * sizes that do not divide a page must all land in the right output rows. */
Test(matmul, page_strided_row_blocks)
{
    static const struct { int bits, G; int64_t rows, cols; } cases[] = {
        {4, 64, 300, 256},  /* 128-byte rows: 32 rows a page, super-blocks of 128 */
        {8, 64, 37, 2048},  /* 2 KiB rows: 2 rows a page */
        {4, 32, 70, 2048},  /* 1 KiB rows: 4 a page, 64-row spans + 6 */
        {4, 128, 129, 1024}, /* 512-byte rows, one row past a super-block */
        {4, 64, 70, 2560},   /* 1280-byte rows (qwen3-4b): runs of 4 rows, 5 KiB */
        {4, 64, 50, 1536},   /* 768-byte rows: runs of 8 rows */
        {8, 32, 23, 2560},   /* 2560-byte rows: runs of 2 rows */
    };
    for (int nth = 1; nth <= 2; nth++) {
        exo_pool *pool = exo_pool_create(nth);
        exo_cpu_matmul_ctx *ctx = exo_cpu_matmul_ctx_create(pool);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            tweight tw;
            tweight_make(&tw, EXO_WFORMAT_AFFINE, EXO_DTYPE_BF16, cases[c].rows, cases[c].cols,
                         cases[c].bits, cases[c].G);
            for (int T = 1; T <= 2; T++)
                check_call(ctx, EXO_MATMUL_GEMV, 1, &tw, T);
            tweight_free(&tw);
        }
        exo_cpu_matmul_ctx_free(ctx);
        exo_pool_free(pool);
    }
}

/* q/k/v-like calls: several weights of mixed formats and row counts share X. */
Test(matmul, several_weights_per_call)
{
    for (int nth = 1; nth <= 2; nth++) {
        exo_pool *pool = exo_pool_create(nth);
        exo_cpu_matmul_ctx *ctx = exo_cpu_matmul_ctx_create(pool);
        tweight tw[5];
        tweight_make(&tw[0], EXO_WFORMAT_AFFINE, EXO_DTYPE_BF16, 130, 256, 4, 64);
        tweight_make(&tw[1], EXO_WFORMAT_AFFINE, EXO_DTYPE_BF16, 33, 256, 8, 64);
        tweight_make(&tw[2], EXO_WFORMAT_AFFINE, EXO_DTYPE_BF16, 17, 256, 4, 32);
        tweight_make(&tw[3], EXO_WFORMAT_DENSE, EXO_DTYPE_BF16, 9, 256, 0, 0);
        tweight_make(&tw[4], EXO_WFORMAT_AFFINE, EXO_DTYPE_F16, 3, 256, 3, 128);
        for (size_t p = 0; p < 4; p++)
            for (int T = 1; T <= 6; T += 2) {
                check_call(ctx, all_paths[p], 5, tw, T);
                check_call(ctx, all_paths[p], 2, tw + 1, T);
            }
        for (int i = 0; i < 5; i++)
            tweight_free(&tw[i]);
        exo_cpu_matmul_ctx_free(ctx);
        exo_pool_free(pool);
    }
}

/* Bigger GEMM shapes: several panels, cached primitives reused, T = 64. */
Test(matmul, gemm_panels_and_cache)
{
    exo_pool *pool = exo_pool_create(2);
    exo_cpu_matmul_ctx *ctx = exo_cpu_matmul_ctx_create(pool);
    tweight tw[2];
    tweight_make(&tw[0], EXO_WFORMAT_AFFINE, EXO_DTYPE_BF16, 2500, 2048, 4, 64);
    tweight_make(&tw[1], EXO_WFORMAT_DENSE, EXO_DTYPE_F32, 300, 2048, 0, 0);
    for (int rep = 0; rep < 2; rep++) {
        check_call(ctx, EXO_MATMUL_GEMM, 1, tw, 64);
        check_call(ctx, EXO_MATMUL_AUTO, 2, tw, 9);
    }
    tweight_free(&tw[0]);
    tweight_free(&tw[1]);
    exo_cpu_matmul_ctx_free(ctx);
    exo_pool_free(pool);
}

/* The plain AVX2 GEMM (the benchmark's peer) against a naive product. */
Test(matmul, avx2_gemm_matches)
{
    if (exo_cpu_isa() < EXO_ISA_AVX2)
        return;
    static const int shapes[][3] = {{1, 1, 1}, {7, 19, 33}, {12, 32, 256}, {50, 70, 300}, {6, 16, 600}};
    for (int nth = 1; nth <= 2; nth++) {
        exo_pool *pool = exo_pool_create(nth);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            float *A = rand_x(M, K), *B = rand_x(N, K);
            float *C = exo_malloc((size_t)M * N * sizeof(float)), *R = exo_malloc((size_t)M * N * sizeof(float));
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double acc = 0;
                    for (int k = 0; k < K; k++)
                        acc += (double)A[i * K + k] * B[j * K + k];
                    R[i * N + j] = (float)acc;
                }
            exo_gemm_f32_avx2(M, N, K, A, B, C, pool);
            cr_expect(nmse(C, R, NULL, (int64_t)M * N) < 1e-10, "M %d N %d K %d nmse %g", M, N, K,
                      nmse(C, R, NULL, (int64_t)M * N));
            exo_free(A);
            exo_free(B);
            exo_free(C);
            exo_free(R);
        }
        exo_pool_free(pool);
    }
}
