/* CPU matmul paths against each other and against a naive double-precision
 * product of the dequantized weights.
 *
 * Tolerances, as a normalised mean squared error over a call's outputs,
 * NMSE = sum (y - ref)^2 / sum_outputs sum_c (w_c x_c)^2 (the denominator is
 * the size of the terms, not of the possibly cancelling sum):
 *   reference path vs naive double  : 1e-10 (f32 rounding of the result only)
 *   GEMV, dense weights             : 1e-9  (f32 accumulation)
 *   GEMV, affine and MXFP4 weights  : 1e-8  (activations in two int8 levels per
 *                                            group: step max|x|/(127*256), about
 *                                            (max|x|/32512)^2/12 per element, i.e.
 *                                            ~1e-9 for gaussian x; a single int8
 *                                            level gives ~1e-4 and fails this)
 *   GEMM, F32 weights (oneDNN f32)  : 1e-9
 *   GEMM, other weights (bf16 AMX)  : 1e-4  (X and the weights rounded to bf16;
 *                                            expected ~1e-5)
 *   AUTO                            : the looser of GEMV and GEMM
 * Weights are placed so their last byte is the last byte before a PROT_NONE
 * page: any read past the end of a weight row faults.
 * MXFP4 weights are checked against their own oracle (mx_row_ref: the
 * format written out from gpt_oss.md with ldexp, not exo_linear_row_f32),
 * exo_linear_row_f32 and the bf16 expansion against it exactly. */
#include <criterion/criterion.h>

#include "core/alloc.h"
#include "core/cpu_features.h"
#include "core/threadpool.h"
#include "engine/cpu/kernels.h"
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
    if (fmt == EXO_WFORMAT_MXFP4) {
        /* random codes, E8M0 scales 120..130 (2^-7 .. 2^3) */
        unsigned char *codes = guarded_alloc(&t->codes, (size_t)(rows * cols / 2));
        unsigned char *sc = guarded_alloc(&t->scales, (size_t)(rows * cols / 32));
        for (int64_t i = 0; i < rows * cols / 2; i++)
            codes[i] = (unsigned char)(uniform01() * 256.0);
        for (int64_t i = 0; i < rows * cols / 32; i++)
            sc[i] = (unsigned char)(120 + (int)(uniform01() * 11.0));
        t->l.dtype = EXO_DTYPE_U8;
        t->l.w = codes;
        t->l.scales = sc;
        t->l.bits = 4;
        t->l.group_size = 32;
    } else if (fmt == EXO_WFORMAT_DENSE) {
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

/* An exo_qact of `cols` columns (exo_qact_q_len / sx_len), and its release. */
static void qact_alloc(exo_qact *qa, int64_t cols)
{
    qa->q = exo_malloc((size_t)exo_qact_q_len(cols));
    qa->q2 = exo_malloc((size_t)exo_qact_q_len(cols));
    qa->dx = exo_malloc((size_t)exo_qact_sx_len(cols) * sizeof(float));
    qa->sx = exo_malloc((size_t)exo_qact_sx_len(cols) * sizeof(float));
    qa->x16 = exo_malloc((size_t)exo_qact_q_len(cols) * sizeof(int16_t));
}

static void qact_free(exo_qact *qa)
{
    exo_free(qa->q);
    exo_free(qa->q2);
    exo_free(qa->x16);
    exo_free(qa->dx);
    exo_free(qa->sx);
}

/* Row r of an MXFP4 weight, written from the format's definition
 * (gpt_oss.md, "MXFP4 format exactly"): element 2b of a group is the low
 * nibble of its byte b, value FP4[code] * 2^(scale - 127). */
static void mx_row_ref(const exo_linear *w, int64_t r, double *out)
{
    static const double fp4[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
    const uint8_t *blocks = (const uint8_t *)w->w + r * (w->cols / 2);
    const uint8_t *scales = (const uint8_t *)w->scales + r * (w->cols / 32);
    for (int64_t g = 0; g < w->cols / 32; g++)
        for (int b = 0; b < 16; b++) {
            uint8_t blk = blocks[16 * g + b];
            out[32 * g + 2 * b] = ldexp(fp4[blk & 0x0f], scales[g] - 127);
            out[32 * g + 2 * b + 1] = ldexp(fp4[blk >> 4], scales[g] - 127);
        }
}

/* y = W x in double; energy[t][r] = sum_c (w_rc x_tc)^2, the scale of the
 * rounding errors of the products, used to normalise errors so a dot
 * product that cancels to ~0 does not blow up the metric. */
static void naive(const exo_linear *w, const float *x, int T, float *y, double *energy)
{
    float *row = exo_malloc((size_t)w->cols * sizeof(float));
    double *rowd = exo_malloc((size_t)w->cols * sizeof(double));
    for (int64_t r = 0; r < w->rows; r++) {
        if (w->format == EXO_WFORMAT_MXFP4) {
            mx_row_ref(w, r, rowd);
        } else {
            exo_linear_row_f32(w, r, row);
            for (int64_t c = 0; c < w->cols; c++)
                rowd[c] = row[c];
        }
        for (int t = 0; t < T; t++) {
            double acc = 0, en = 0;
            for (int64_t c = 0; c < w->cols; c++) {
                double p = rowd[c] * x[t * w->cols + c];
                acc += p;
                en += p * p;
            }
            y[t * w->rows + r] = (float)acc;
            energy[t * w->rows + r] = en;
        }
    }
    exo_free(row);
    exo_free(rowd);
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

/* exo_cpu_matmul_each: weight i reads its own input; each against the
 * naive product of that input. */
static void check_each(exo_cpu_matmul_ctx *ctx, exo_matmul_path path, int n, tweight *tw, int T)
{
    int64_t cols = tw[0].l.cols;
    const exo_linear *ws[8];
    const float *xs[8];
    float *ys[8], *refs[8];
    double *ens[8];
    for (int i = 0; i < n; i++) {
        ws[i] = &tw[i].l;
        xs[i] = rand_x(T, cols);
        ys[i] = exo_malloc((size_t)T * (size_t)tw[i].l.rows * sizeof(float));
        for (int64_t k = 0; k < T * tw[i].l.rows; k++)
            ys[i][k] = NAN;
        refs[i] = exo_malloc((size_t)T * (size_t)tw[i].l.rows * sizeof(float));
        ens[i] = exo_malloc((size_t)T * (size_t)tw[i].l.rows * sizeof(double));
        naive(ws[i], xs[i], T, refs[i], ens[i]);
    }
    exo_cpu_matmul_force_path(ctx, path);
    exo_cpu_matmul_each(ctx, n, ws, xs, T, ys);
    for (int i = 0; i < n; i++) {
        double e = nmse(ys[i], refs[i], ens[i], T * ws[i]->rows);
        cr_expect(e <= tolerance(path, ws[i]), "each %s: weight %d fmt %d T %d: nmse %g", path_name(path), i,
                  ws[i]->format, T, e);
        exo_free((void *)xs[i]);
        exo_free(ys[i]);
        exo_free(refs[i]);
        exo_free(ens[i]);
    }
}

/* The down projections of a token's experts: several weights (mixed
 * formats), one input each, one dispatch. */
Test(matmul, each_weight_its_own_input)
{
    for (int nth = 1; nth <= 2; nth++) {
        exo_pool *pool = exo_pool_create(nth);
        exo_cpu_matmul_ctx *ctx = exo_cpu_matmul_ctx_create(pool);
        tweight tw[5];
        tweight_make(&tw[0], EXO_WFORMAT_AFFINE, EXO_DTYPE_BF16, 130, 256, 4, 64);
        tweight_make(&tw[1], EXO_WFORMAT_AFFINE, EXO_DTYPE_BF16, 130, 256, 8, 64);
        tweight_make(&tw[2], EXO_WFORMAT_MXFP4, EXO_DTYPE_U8, 65, 256, 4, 32);
        tweight_make(&tw[3], EXO_WFORMAT_DENSE, EXO_DTYPE_BF16, 9, 256, 0, 0);
        tweight_make(&tw[4], EXO_WFORMAT_AFFINE, EXO_DTYPE_BF16, 64, 256, 4, 64);
        for (size_t p = 0; p < 4; p++)
            for (int T = 1; T <= 5; T += 2) {
                check_each(ctx, all_paths[p], 5, tw, T);
                check_each(ctx, all_paths[p], 1, tw + 2, T);
            }
        for (int i = 0; i < 5; i++)
            tweight_free(&tw[i]);
        exo_cpu_matmul_ctx_free(ctx);
        exo_pool_free(pool);
    }
}

static void dense_all_paths(void)
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

Test(matmul, dense_all_paths) { dense_all_paths(); }

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

/* ---------------------------------------------------------------------- */
/* MXFP4                                                                  */

/* The layout on hand-made bytes: nibble order, the LUT, E8M0 scales (also
 * the edge bytes 0 and 1), the byte count, and MLX's uint32 packing (code k
 * of a word at bits 4k) being the same bytes as Hugging Face's blocks. */
Test(matmul, mxfp4_format)
{
    cr_assert_eq(exo_e8m0_to_f32(127), 1.0f);
    cr_assert_eq(exo_e8m0_to_f32(130), 8.0f);
    cr_assert_eq(exo_e8m0_to_f32(120), 1.0f / 128.0f);
    cr_assert_eq(exo_e8m0_to_f32(1), ldexpf(1.0f, -126));
    cr_assert_eq(exo_e8m0_to_f32(0), ldexpf(1.0f, -127));
    cr_assert(isinf(exo_e8m0_to_f32(255)));

    uint8_t codes[64]; /* two rows of 64 columns: 2 groups each */
    uint8_t blocks[2 * 32];
    for (int i = 0; i < 64; i++)
        codes[i] = (uint8_t)((i * 7 + 3) & 15);
    for (int i = 0; i < 64; i++) { /* row 1 repeats row 0's codes */
        uint8_t c = codes[i];
        blocks[i / 2] = (uint8_t)(i % 2 ? (blocks[i / 2] & 0x0f) | (c << 4) : c);
    }
    memcpy(blocks + 32, blocks, 32);
    uint8_t scales[4] = {127, 128, 126, 0};
    exo_linear w = {.format = EXO_WFORMAT_MXFP4, .dtype = EXO_DTYPE_U8, .rows = 2, .cols = 64,
                    .w = blocks, .scales = scales, .bits = 4, .group_size = 32};
    cr_assert_eq(exo_linear_bytes(&w), 2 * 32 + 2 * 2);
    size_t wb, sb, bb;
    exo_linear_part_bytes(&w, &wb, &sb, &bb);
    cr_assert(wb == 64 && sb == 4 && bb == 0);
    exo_linear aff = {.format = EXO_WFORMAT_AFFINE, .dtype = EXO_DTYPE_BF16, .rows = 3, .cols = 128,
                      .bits = 3, .group_size = 64};
    exo_linear_part_bytes(&aff, &wb, &sb, &bb);
    cr_assert(wb == 3 * 48 && sb == 3 * 2 * 2 && bb == sb && exo_linear_bytes(&aff) == wb + sb + bb);
    exo_linear den = {.format = EXO_WFORMAT_DENSE, .dtype = EXO_DTYPE_F32, .rows = 3, .cols = 5};
    exo_linear_part_bytes(&den, &wb, &sb, &bb);
    cr_assert(wb == 60 && sb == 0 && bb == 0);
    float row[64];
    static const float fp4[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int r = 0; r < 2; r++) {
        exo_linear_row_f32(&w, r, row);
        for (int c = 0; c < 64; c++) {
            float want = ldexpf(fp4[codes[c]], scales[2 * r + c / 32] - 127);
            cr_assert(row[c] == want && signbit(row[c]) == signbit(want),
                      "r %d c %d: %g, want %g", r, c, row[c], want);
        }
    }
    /* first byte 0x73 would be element 0 = code 3 (1.5), element 1 = code 7 (6) */
    uint8_t one[16] = {0x73}, s1[1] = {128};
    exo_linear w1 = {.format = EXO_WFORMAT_MXFP4, .dtype = EXO_DTYPE_U8, .rows = 1, .cols = 32,
                     .w = one, .scales = s1, .bits = 4, .group_size = 32};
    float r1[32];
    exo_linear_row_f32(&w1, 0, r1);
    cr_assert(r1[0] == 3.0f && r1[1] == 12.0f && r1[2] == 0.0f);

    /* MLX: words[k/8] |= code_k << 4*(k%8), stored little-endian */
    uint32_t words[8] = {0};
    for (int k = 0; k < 64; k++)
        words[k / 8] |= (uint32_t)codes[k] << (4 * (k % 8));
    uint8_t bytes[32];
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 4; j++)
            bytes[4 * i + j] = (uint8_t)(words[i] >> (8 * j));
    cr_assert_eq(memcmp(bytes, blocks, 32), 0);
}

static void check_row_f32(const exo_linear *w)
{
    float *row = exo_malloc((size_t)w->cols * sizeof(float));
    double *ref = exo_malloc((size_t)w->cols * sizeof(double));
    for (int64_t r = 0; r < w->rows; r++) {
        exo_linear_row_f32(w, r, row);
        mx_row_ref(w, r, ref);
        for (int64_t c = 0; c < w->cols; c++)
            if ((double)row[c] != ref[c])
                cr_assert_fail("row_f32 r %lld c %lld: %g vs %g", (long long)r, (long long)c,
                               row[c], ref[c]);
    }
    exo_free(row);
    exo_free(ref);
}

/* Every path against the oracle: cols 32 / 64 / 2880 (gpt-oss hidden, 90
 * groups, 1440-byte rows: a 32-byte tail after 22 full 64-byte blocks),
 * odd row counts, T = 1, 3, 17, 64. */
Test(matmul, mxfp4_all_paths, .timeout = 120)
{
    static const int64_t colsv[] = {32, 64, 2880};
    static const int64_t rowsv[] = {1, 7, 33, 131};
    static const int Ts[] = {1, 3, 17, 64};
    for (int nth = 1; nth <= 2; nth++) {
        exo_pool *pool = exo_pool_create(nth);
        exo_cpu_matmul_ctx *ctx = exo_cpu_matmul_ctx_create(pool);
        for (size_t c = 0; c < 3; c++)
            for (size_t r = 0; r < 4; r++) {
                tweight tw;
                tweight_make(&tw, EXO_WFORMAT_MXFP4, EXO_DTYPE_U8, rowsv[r], colsv[c], 4, 32);
                cr_assert_eq(exo_linear_bytes(&tw.l), (size_t)(rowsv[r] * colsv[c] / 32 * 17));
                if (nth == 1)
                    check_row_f32(&tw.l);
                for (size_t p = 0; p < 4; p++)
                    for (size_t t = 0; t < sizeof Ts / sizeof Ts[0]; t++)
                        check_call(ctx, all_paths[p], 1, &tw, Ts[t]);
                tweight_free(&tw);
            }
        exo_cpu_matmul_ctx_free(ctx);
        exo_pool_free(pool);
    }
}

/* Page-strided row blocks (see page_strided_row_blocks) with MXFP4 rows. */
Test(matmul, mxfp4_page_strided)
{
    static const int64_t cases[][2] = {
        {517, 256},  /* 128-byte rows: super-blocks of 128 rows, + 5 */
        {70, 2880},  /* 1440-byte rows: runs of 4 rows */
        {129, 1024}, /* 512-byte rows */
        {300, 5760}, /* 2880-byte rows: runs of 2 */
    };
    for (int nth = 1; nth <= 2; nth++) {
        exo_pool *pool = exo_pool_create(nth);
        exo_cpu_matmul_ctx *ctx = exo_cpu_matmul_ctx_create(pool);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            tweight tw;
            tweight_make(&tw, EXO_WFORMAT_MXFP4, EXO_DTYPE_U8, cases[c][0], cases[c][1], 4, 32);
            for (int T = 1; T <= 2; T++)
                check_call(ctx, EXO_MATMUL_GEMV, 1, &tw, T);
            tweight_free(&tw);
        }
        exo_cpu_matmul_ctx_free(ctx);
        exo_pool_free(pool);
    }
}

/* MXFP4 weights next to affine ones (q4 g32 shares their activations) and
 * dense ones in one call. */
Test(matmul, mxfp4_mixed_formats)
{
    for (int nth = 1; nth <= 2; nth++) {
        exo_pool *pool = exo_pool_create(nth);
        exo_cpu_matmul_ctx *ctx = exo_cpu_matmul_ctx_create(pool);
        tweight tw[5];
        tweight_make(&tw[0], EXO_WFORMAT_MXFP4, EXO_DTYPE_U8, 65, 576, 4, 32);
        tweight_make(&tw[1], EXO_WFORMAT_AFFINE, EXO_DTYPE_BF16, 33, 576, 4, 32);
        tweight_make(&tw[2], EXO_WFORMAT_AFFINE, EXO_DTYPE_BF16, 17, 576, 8, 64);
        tweight_make(&tw[3], EXO_WFORMAT_DENSE, EXO_DTYPE_BF16, 9, 576, 0, 0);
        tweight_make(&tw[4], EXO_WFORMAT_MXFP4, EXO_DTYPE_U8, 7, 576, 4, 32);
        static const int Ts[] = {1, 3, 5, 17};
        for (size_t p = 0; p < 4; p++)
            for (size_t t = 0; t < 4; t++) {
                check_call(ctx, all_paths[p], 5, tw, Ts[t]);
                check_call(ctx, all_paths[p], 2, tw + 3, Ts[t]);
            }
        for (int i = 0; i < 5; i++)
            tweight_free(&tw[i]);
        exo_cpu_matmul_ctx_free(ctx);
        exo_pool_free(pool);
    }
}

/* The kernels the driver does not pick on this CPU, called directly: the
 * AVX2 GEMV (on AVX2 activations, and on AVX-512 ones: the two builders
 * must agree on the layout) and, with AVX-512, the exact bf16 expansion. */
Test(matmul, mxfp4_kernels_direct)
{
    if (exo_cpu_isa() < EXO_ISA_AVX2)
        return;
    static const int64_t cases[][2] = {{1, 32}, {7, 64}, {33, 2880}, {131, 256}, {517, 96}};
    static const int Ts[] = {1, 3};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const int64_t rows = cases[k][0], cols = cases[k][1];
        tweight tw;
        tweight_make(&tw, EXO_WFORMAT_MXFP4, EXO_DTYPE_U8, rows, cols, 4, 32);
        int8_t *tmp = exo_malloc((size_t)(2 * exo_qact_q_len(cols)));
        exo_gemv_scratch s = {.sf_stride = exo_gemv_sf_stride(cols),
                              .code_stride = exo_gemv_code_stride(cols)};
        s.sd = exo_malloc((size_t)(EXO_GEMV_SD_SLOTS * s.sf_stride) * sizeof(float));
        s.codes = exo_malloc((size_t)(EXO_GEMV_ROWS * s.code_stride));
        for (size_t ti = 0; ti < 2; ti++) {
            const int T = Ts[ti];
            float *x = rand_x(T, cols);
            float *ref = exo_malloc((size_t)(T * rows) * sizeof(float));
            double *en = exo_malloc((size_t)(T * rows) * sizeof(double));
            float *y = exo_malloc((size_t)(T * rows) * sizeof(float));
            naive(&tw.l, x, T, ref, en);
            exo_qact qa[3];
            for (int b = 0; b < (exo_cpu_isa() >= EXO_ISA_AVX512 ? 2 : 1); b++) {
                for (int t = 0; t < T; t++) {
                    qact_alloc(&qa[t], cols);
                    if (b == 0)
                        exo_qact_build_avx2(x + t * cols, cols, 32, EXO_QLAYOUT_Q4, &qa[t], tmp);
                    else
                        exo_qact_build_avx512(x + t * cols, cols, 32, EXO_QLAYOUT_Q4, &qa[t], tmp);
                }
                for (int64_t i = 0; i < T * rows; i++)
                    y[i] = NAN;
                /* two ranges, the first ending inside a super-block */
                int64_t mid = rows / 2 / EXO_GEMV_SPAN_ROWS * EXO_GEMV_SPAN_ROWS;
                exo_gemv_mxfp4_avx2(&tw.l, 0, mid, T, qa, y, rows, &s);
                exo_gemv_mxfp4_avx2(&tw.l, mid, rows, T, qa, y, rows, &s);
                double e = nmse(y, ref, en, T * rows);
                cr_expect(e <= 1e-8, "avx2 gemv (qact %s) rows %lld cols %lld T %d: nmse %g",
                          b ? "avx512" : "avx2", (long long)rows, (long long)cols, T, e);
                if (exo_cpu_isa() >= EXO_ISA_AVX512) {
                    for (int64_t i = 0; i < T * rows; i++)
                        y[i] = NAN;
                    exo_gemv_mxfp4_avx512(&tw.l, 0, rows, T, qa, y, rows, &s);
                    e = nmse(y, ref, en, T * rows);
                    cr_expect(e <= 1e-8, "avx512 gemv (qact %s) rows %lld cols %lld T %d: nmse %g",
                              b ? "avx512" : "avx2", (long long)rows, (long long)cols, T, e);
                }
                for (int t = 0; t < T; t++)
                    qact_free(&qa[t]);
            }
            exo_free(x);
            exo_free(ref);
            exo_free(en);
            exo_free(y);
        }
        if (exo_cpu_isa() >= EXO_ISA_AVX512) {
            uint16_t *bf = exo_malloc((size_t)(rows * cols) * 2);
            double *refrow = exo_malloc((size_t)cols * sizeof(double));
            exo_dequant_rows_bf16_avx512(&tw.l, 0, rows, bf, s.codes);
            for (int64_t r = 0; r < rows; r++) {
                mx_row_ref(&tw.l, r, refrow);
                for (int64_t c = 0; c < cols; c++)
                    if ((double)exo_bf16_to_f32(bf[r * cols + c]) != refrow[c])
                        cr_assert_fail("bf16 r %lld c %lld: %g vs %g", (long long)r, (long long)c,
                                       exo_bf16_to_f32(bf[r * cols + c]), refrow[c]);
            }
            exo_free(bf);
            exo_free(refrow);
        }
        exo_free(tmp);
        exo_free(s.sd);
        exo_free(s.codes);
        tweight_free(&tw);
    }
}

/* The AVX2 activation quantizer gives the AVX-512 one's bytes and floats. */
Test(matmul, qact_builders_agree)
{
    if (exo_cpu_isa() < EXO_ISA_AVX512)
        return;
    static const int64_t colsv[] = {128, 576, 2880, 4096};
    static const int Gs[] = {32, 64, 128};
    for (size_t c = 0; c < 4; c++)
        for (size_t g = 0; g < 3; g++)
            for (int layout = 0; layout < 2; layout++) {
                const int64_t cols = colsv[c], qlen = exo_qact_q_len(cols);
                const int64_t sxl = exo_qact_sx_len(cols);
                if (cols % Gs[g])
                    continue;
                float *x = rand_x(1, cols);
                x[3] = 0.0f; /* a group of zeros too */
                if (cols >= 256)
                    memset(x + 128, 0, 128 * sizeof(float));
                int8_t *tmp = exo_malloc((size_t)(2 * qlen));
                exo_qact a[2];
                for (int k = 0; k < 2; k++)
                    qact_alloc(&a[k], cols);
                exo_qact_build_avx512(x, cols, Gs[g], layout, &a[0], tmp);
                exo_qact_build_avx2(x, cols, Gs[g], layout, &a[1], tmp);
                cr_expect(memcmp(a[0].q, a[1].q, (size_t)qlen) == 0 &&
                              memcmp(a[0].q2, a[1].q2, (size_t)qlen) == 0 &&
                              memcmp(a[0].dx, a[1].dx, (size_t)sxl * sizeof(float)) == 0 &&
                              memcmp(a[0].sx, a[1].sx, (size_t)sxl * sizeof(float)) == 0,
                          "cols %lld G %d layout %d", (long long)cols, Gs[g], layout);
                for (int k = 0; k < 2; k++)
                    qact_free(&a[k]);
                exo_free(tmp);
                exo_free(x);
            }
}

/* A row of X gets the same bits from a GEMV call of 1 row and of 2..16 rows,
 * in both numerics families: per-lane sums (vector units alone) and exact
 * group sums (where the CPU has AMX: the vector kernel below 5 rows, the
 * tile kernel from 5). What batched decode's "same tokens as alone" rests
 * on. Shapes cover ragged row tiles (rows not a multiple of 16), groups of
 * 32/64/128, 4 and 8 bits, MXFP4, and column counts the tile kernel takes
 * (multiples of 256) and one it leaves to the vector kernel. */
static void batched_rows_same_bits_as_one_row(void)
{
    static const struct { exo_wformat fmt; int bits, G; int64_t rows, cols; } cases[] = {
        {EXO_WFORMAT_AFFINE, 4, 64, 70, 2048},  {EXO_WFORMAT_AFFINE, 4, 32, 33, 512},
        {EXO_WFORMAT_AFFINE, 4, 128, 17, 768},  {EXO_WFORMAT_AFFINE, 8, 64, 40, 1024},
        {EXO_WFORMAT_AFFINE, 8, 32, 16, 256},   {EXO_WFORMAT_AFFINE, 8, 128, 5, 1280},
        {EXO_WFORMAT_MXFP4, 4, 32, 48, 512},    {EXO_WFORMAT_AFFINE, 4, 64, 9, 320},
        {EXO_WFORMAT_AFFINE, 3, 64, 20, 512},   {EXO_WFORMAT_DENSE, 0, 0, 21, 300},
    };
    static const int Ts[] = {2, 3, 4, 5, 9, 16};
    exo_pool *pool = exo_pool_create(2);
    exo_cpu_matmul_ctx *ctx = exo_cpu_matmul_ctx_create(pool);
    exo_cpu_matmul_force_path(ctx, EXO_MATMUL_GEMV);
    int amx_here = exo_cpu_matmul_use_amx(ctx, 1);
    cr_log_info("tile units: %s", amx_here ? "yes (both families)" : "no (per-lane sums only)");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tweight tw;
        tweight_make(&tw, cases[c].fmt, cases[c].fmt == EXO_WFORMAT_MXFP4 ? EXO_DTYPE_U8 : EXO_DTYPE_BF16,
                     cases[c].rows, cases[c].cols, cases[c].bits, cases[c].G);
        cr_assert(exo_cpu_matmul_has_gemv(&tw.l), "the GEMV takes fmt %d bits %d G %d on %s", tw.l.format,
                  tw.l.bits, tw.l.group_size, exo_isa_name(exo_cpu_isa()));
        const exo_linear *w = &tw.l;
        const int64_t rows = w->rows, cols = w->cols;
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            const int T = Ts[ti];
            float *x = rand_x(T, cols);
            float *alone = exo_malloc((size_t)(T * rows) * sizeof(float));
            float *together = exo_malloc((size_t)(T * rows) * sizeof(float));
            for (int amx = 0; amx <= amx_here; amx++) {
                exo_cpu_matmul_use_amx(ctx, amx);
                for (int t = 0; t < T; t++)
                    exo_cpu_matmul(ctx, 1, &w, x + t * cols, 1, (float *const[]){alone + t * rows});
                for (int64_t i = 0; i < T * rows; i++)
                    together[i] = NAN;
                exo_cpu_matmul(ctx, 1, &w, x, T, (float *const[]){together});
                for (int64_t i = 0; i < T * rows; i++)
                    if (memcmp(&alone[i], &together[i], sizeof(float)))
                        cr_assert_fail("%s fmt %d bits %d G %d rows %lld cols %lld T %d: X row %lld row %lld "
                                       "%.9g alone, %.9g among %d",
                                       amx ? "group sums" : "lane sums", w->format, w->bits, w->group_size,
                                       (long long)rows, (long long)cols, T, (long long)(i / rows),
                                       (long long)(i % rows), alone[i], together[i], T);
            }
            exo_free(x);
            exo_free(alone);
            exo_free(together);
        }
        tweight_free(&tw);
    }
    exo_cpu_matmul_ctx_free(ctx);
    exo_pool_free(pool);
}

Test(matmul, batched_rows_same_bits_as_one_row)
{
    if (exo_cpu_isa() < EXO_ISA_AVX2)
        return;
    batched_rows_same_bits_as_one_row();
}

/* The AVX2 kernels (gemv_avx2.c, gemv_mxfp4_avx2.c) on every CPU that has
 * AVX2, AVX-512 ones included: EXO_CPU_ISA caps the level for the test's
 * own process (Criterion runs each test in one). */
static void cap_at_avx2(void)
{
    setenv("EXO_CPU_ISA", "avx2", 1);
    if (exo_cpu_isa() != EXO_ISA_AVX2)
        cr_skip_test("this CPU has no AVX2, or the ISA was read before the cap (%s)", exo_isa_name(exo_cpu_isa()));
}

Test(matmul, avx2_dense_all_paths)
{
    cap_at_avx2();
    dense_all_paths();
}

Test(matmul, avx2_affine_q4_all_paths)
{
    cap_at_avx2();
    affine_all_paths(4);
}

Test(matmul, avx2_affine_q8_all_paths)
{
    cap_at_avx2();
    affine_all_paths(8);
}

Test(matmul, avx2_affine_q3_all_paths)
{
    cap_at_avx2();
    affine_all_paths(3);
}

/* Without AVX-512 the prefill GEMM is the plain AVX2 one, whose rows keep
 * their bits whatever the call's row count and a row's place in it
 * (oneDNN's f32 GEMM did not, on a Zen 3 guest; model.h
 * exo_model_exact_rows relies on it). */
Test(matmul, avx2_gemm_rows_keep_their_bits)
{
    cap_at_avx2();
    enum { ALL = 152 };
    static const int calls[][2] = {{17, 0}, {17, 37}, {40, 100}, {128, 23}, {32, 5}, {64, 60}};
    exo_pool *pool = exo_pool_create(2);
    exo_cpu_matmul_ctx *ctx = exo_cpu_matmul_ctx_create(pool);
    exo_cpu_matmul_force_path(ctx, EXO_MATMUL_GEMM);
    tweight tw[2];
    tweight_make(&tw[0], EXO_WFORMAT_DENSE, EXO_DTYPE_F32, 300, 520, 0, 0);
    tweight_make(&tw[1], EXO_WFORMAT_AFFINE, EXO_DTYPE_BF16, 100, 512, 4, 64);
    for (int k = 0; k < 2; k++) {
        const exo_linear *w = &tw[k].l;
        const int64_t K = w->cols, N = w->rows;
        float *x = rand_x(ALL, K), *all = exo_malloc(sizeof(float) * ALL * (size_t)N);
        float *some = exo_malloc(sizeof(float) * ALL * (size_t)N);
        exo_cpu_matmul(ctx, 1, &w, x, ALL, (float *const[]){all});
        for (size_t c = 0; c < sizeof calls / sizeof calls[0]; c++) {
            const int T = calls[c][0], at = calls[c][1];
            exo_cpu_matmul(ctx, 1, &w, x + (size_t)at * (size_t)K, T, (float *const[]){some});
            int differ = 0;
            for (int64_t i = 0; i < T * N; i++)
                differ += memcmp(&some[i], &all[at * N + i], sizeof(float)) != 0;
            cr_expect_eq(differ, 0, "fmt %d: %d rows from row %d: %d of %lld outputs differ from one call of %d",
                         w->format, T, at, differ, (long long)(T * N), ALL);
        }
        exo_free(x);
        exo_free(all);
        exo_free(some);
        tweight_free(&tw[k]);
    }
    exo_cpu_matmul_ctx_free(ctx);
    exo_pool_free(pool);
}

Test(matmul, avx2_batched_rows_same_bits_as_one_row)
{
    cap_at_avx2();
    batched_rows_same_bits_as_one_row();
}

/* ---- affine panels (linear.h) ------------------------------------------ */

/* w repacked as affine panels into guarded memory (a read past the end faults). */
static exo_linear panels_of(const exo_linear *w, guarded *mem)
{
    cr_assert(exo_linear_panels_ok(w));
    void *p = guarded_alloc(mem, exo_linear_panels_bytes(w));
    exo_linear out;
    exo_linear_to_panels(w, p, &out, NULL);
    cr_assert_eq(exo_linear_bytes(&out), exo_linear_panels_bytes(w));
    return out;
}

/* Which weights can be panels, and that a panels weight holds the same
 * values: every row bit for bit, and the prefill expansion (W^T) the bf16
 * the row format expands to. */
Test(matmul, panels_same_values)
{
    tweight tw;
    tweight_make(&tw, EXO_WFORMAT_AFFINE, EXO_DTYPE_BF16, 17, 64, 4, 64);
    cr_expect(!exo_linear_panels_ok(&tw.l), "17 rows");
    tw.l.rows = 16;
    cr_expect(exo_linear_panels_ok(&tw.l));
    tweight_free(&tw);
    tweight_make(&tw, EXO_WFORMAT_AFFINE, EXO_DTYPE_BF16, 16, 64, 3, 64);
    cr_expect(!exo_linear_panels_ok(&tw.l), "3 bits");
    tweight_free(&tw);
    tweight_make(&tw, EXO_WFORMAT_MXFP4, EXO_DTYPE_U8, 16, 64, 4, 32);
    cr_expect(exo_linear_panels_ok(&tw.l), "MXFP4");
    tw.l.rows = 8;
    cr_expect(!exo_linear_panels_ok(&tw.l), "MXFP4, 8 rows");
    tweight_free(&tw);

    static const int Gs[] = {32, 64, 128};
    static const exo_dtype dts[] = {EXO_DTYPE_BF16, EXO_DTYPE_F16, EXO_DTYPE_F32};
    for (int bits = 4; bits <= 12; bits += 4) /* 12: MXFP4 (4-bit codes, G 32) */
        for (int gi = 0; gi < (bits == 12 ? 1 : 3); gi++)
            for (int di = 0; di < (bits == 12 ? 2 : 3); di++) {
                const int G = Gs[gi];
                const int64_t rows = 48, cols = di == 0 ? 2048 : 3 * G;
                if (bits == 12)
                    tweight_make(&tw, EXO_WFORMAT_MXFP4, EXO_DTYPE_U8, rows, cols, 4, 32);
                else
                    tweight_make(&tw, EXO_WFORMAT_AFFINE, dts[di], rows, cols, bits, G);
                guarded mem = {0};
                exo_linear p = panels_of(&tw.l, &mem);
                { /* shared among threads: the same bytes */
                    exo_pool *pool = exo_pool_create(3);
                    void *again = exo_malloc(exo_linear_panels_bytes(&tw.l));
                    exo_linear q;
                    exo_linear_to_panels(&tw.l, again, &q, pool);
                    cr_assert(!memcmp(again, p.w, exo_linear_panels_bytes(&tw.l)), "3 threads");
                    exo_free(again);
                    exo_pool_free(pool);
                }
                float *a = exo_malloc((size_t)cols * sizeof(float)), *b = exo_malloc((size_t)cols * sizeof(float));
                for (int64_t r = 0; r < rows; r++) {
                    exo_linear_row_f32(&tw.l, r, a);
                    exo_linear_row_f32(&p, r, b);
                    cr_assert(!memcmp(a, b, (size_t)cols * sizeof(float)), "bits %d G %d %s row %lld", bits, G,
                              exo_dtype_name(dts[di]), (long long)r);
                }
                if (exo_cpu_isa() >= EXO_ISA_AVX512) {
                    const int64_t r0 = 16, r1 = rows, n = r1 - r0;
                    uint16_t *rowwise = exo_malloc((size_t)(n * cols) * 2), *t = exo_malloc((size_t)(n * cols) * 2);
                    uint8_t *codes = exo_malloc((size_t)exo_gemv_code_stride(cols));
                    exo_dequant_rows_bf16_avx512(&tw.l, r0, r1, rowwise, codes);
                    exo_dequant_panels_bf16t_avx512(&p, r0, r1, t);
                    for (int64_t r = 0; r < n; r++)
                        for (int64_t c = 0; c < cols; c++)
                            cr_assert_eq(t[c * n + r], rowwise[r * cols + c], "bits %d G %d %s: bf16 row %lld col %lld: %04x %04x",
                                         bits, G, exo_dtype_name(dts[di]), (long long)(r0 + r), (long long)c, t[c*n+r], rowwise[r*cols+c]);
                    exo_free(rowwise);
                    exo_free(t);
                    exo_free(codes);
                }
                exo_free(a);
                exo_free(b);
                guarded_free(&mem);
                tweight_free(&tw);
            }
}

/* Every path on panels weights against the naive product of the row-format
 * weight they came from, with the row format's tolerances. */
Test(matmul, panels_all_paths, .timeout = 120)
{
    static const int Gs[] = {32, 64, 128};
    static const int Ts[] = {1, 2, 3, 5, 9, 16, 17};
    for (int nth = 1; nth <= 2; nth++) {
        exo_pool *pool = exo_pool_create(nth);
        exo_cpu_matmul_ctx *ctx = exo_cpu_matmul_ctx_create(pool);
        for (int bits = 4; bits <= 12; bits += 4) /* 12: MXFP4 */
            for (int gi = 0; gi < (bits == 12 ? 1 : 3); gi++)
                for (int shape = 0; shape < 3; shape++) {
                    const int G = Gs[gi];
                    const int64_t rows = shape == 0 ? 16 : 80, cols = shape == 0 ? G : shape == 1 ? 3 * G : 2048;
                    tweight tw;
                    if (bits == 12)
                        tweight_make(&tw, EXO_WFORMAT_MXFP4, EXO_DTYPE_U8, rows, cols, 4, 32);
                    else
                        tweight_make(&tw, EXO_WFORMAT_AFFINE, shape == 1 ? EXO_DTYPE_F16 : EXO_DTYPE_BF16, rows,
                                     cols, bits, G);
                    guarded mem = {0};
                    exo_linear p = panels_of(&tw.l, &mem);
                    const exo_linear *pw = &p;
                    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
                        const int T = Ts[ti];
                        float *x = rand_x(T, cols), *y = exo_malloc((size_t)(T * rows) * sizeof(float));
                        float *ref = exo_malloc((size_t)(T * rows) * sizeof(float));
                        double *en = exo_malloc((size_t)(T * rows) * sizeof(double));
                        naive(&tw.l, x, T, ref, en);
                        for (size_t pi = 0; pi < 4; pi++) {
                            for (int64_t i = 0; i < T * rows; i++)
                                y[i] = NAN;
                            exo_cpu_matmul_force_path(ctx, all_paths[pi]);
                            exo_cpu_matmul(ctx, 1, &pw, x, T, (float *const[]){y});
                            double e = nmse(y, ref, en, T * rows);
                            cr_expect(e <= tolerance(all_paths[pi], &tw.l),
                                      "panels %s: bits %d G %d rows %lld cols %lld T %d threads %d: nmse %g",
                                      path_name(all_paths[pi]), bits, G, (long long)rows, (long long)cols, T, nth, e);
                        }
                        exo_free(x);
                        exo_free(y);
                        exo_free(ref);
                        exo_free(en);
                    }
                    guarded_free(&mem);
                    tweight_free(&tw);
                }
        exo_cpu_matmul_ctx_free(ctx);
        exo_pool_free(pool);
    }
}

/* A GEMV over a row range that cuts panels writes exactly its rows, with
 * the bits of the whole product; and a row of X gets the same bits among
 * 1 to 16 rows of X (what batched decode rests on). */
Test(matmul, panels_row_ranges_and_batched_bits)
{
    if (exo_cpu_isa() < EXO_ISA_AVX512)
        return;
    static const struct { int bits, G; int64_t rows, cols; } cases[] = {
        {4, 64, 80, 2048}, {4, 32, 32, 512}, {4, 128, 16, 768}, {8, 64, 48, 1024}, {8, 32, 16, 256}, {8, 128, 32, 1280},
        {0, 32, 48, 2880}, {0, 32, 16, 96}, /* bits 0: MXFP4 */
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        tweight tw;
        if (!cases[ci].bits)
            tweight_make(&tw, EXO_WFORMAT_MXFP4, EXO_DTYPE_U8, cases[ci].rows, cases[ci].cols, 4, 32);
        else
            tweight_make(&tw, EXO_WFORMAT_AFFINE, EXO_DTYPE_BF16, cases[ci].rows, cases[ci].cols, cases[ci].bits,
                         cases[ci].G);
        guarded mem = {0};
        exo_linear p = panels_of(&tw.l, &mem);
        const int64_t rows = p.rows, cols = p.cols;
        enum { TMAX = 16 };
        float *x = rand_x(TMAX, cols);
        int8_t *tmp = exo_malloc((size_t)(2 * exo_qact_q_len(cols)));
        exo_qact qa[TMAX];
        for (int t = 0; t < TMAX; t++) {
            qact_alloc(&qa[t], cols);
            exo_qact_build_avx512(x + t * cols, cols, p.group_size, EXO_QLAYOUT_Q8, &qa[t], tmp);
        }
        float *whole = exo_malloc((size_t)(TMAX * rows) * sizeof(float));
        float *y = exo_malloc((size_t)(TMAX * rows) * sizeof(float));
        void *xmem = exo_alloc_aligned(exo_qpanel_bytes(TMAX, cols, p.group_size));
        exo_qpanel xp;
        for (int t = 0; t < TMAX; t++) { /* each row of X alone */
            exo_qpanel_build(&qa[t], 1, cols, p.group_size, &xp, xmem);
            exo_gemv_panels_avx512(&p, 0, rows, &xp, whole + t * rows, rows);
        }
        for (int T = 2; T <= TMAX; T++) {
            for (int64_t i = 0; i < T * rows; i++)
                y[i] = NAN;
            exo_qpanel_build(qa, T, cols, p.group_size, &xp, xmem);
            exo_gemv_panels_avx512(&p, 0, rows, &xp, y, rows);
            cr_assert(!memcmp(y, whole, (size_t)(T * rows) * sizeof(float)), "bits %d G %d: T %d differs from alone",
                      p.bits, p.group_size, T);
        }
        const int64_t cuts[][2] = {{5, 13}, {3, 21}, {16, 32}, {0, 1}, {15, 16}, {rows - 7, rows}};
        for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
            const int64_t r0 = cuts[k][0], r1 = cuts[k][1];
            if (r1 > rows)
                continue;
            for (int64_t i = 0; i < 3 * rows; i++)
                y[i] = NAN;
            exo_qpanel_build(qa, 3, cols, p.group_size, &xp, xmem);
            exo_gemv_panels_avx512(&p, r0, r1, &xp, y, rows);
            for (int t = 0; t < 3; t++)
                for (int64_t r = 0; r < rows; r++) {
                    const float v = y[t * rows + r];
                    if (r < r0 || r >= r1)
                        cr_assert(isnan(v), "rows [%lld, %lld): row %lld written", (long long)r0, (long long)r1,
                                  (long long)r);
                    else
                        cr_assert(!memcmp(&v, &whole[t * rows + r], sizeof v), "rows [%lld, %lld): row %lld",
                                  (long long)r0, (long long)r1, (long long)r);
                }
        }
        for (int t = 0; t < TMAX; t++)
            qact_free(&qa[t]);
        exo_free(tmp);
        exo_free_aligned(xmem);
        exo_free(x);
        exo_free(whole);
        exo_free(y);
        guarded_free(&mem);
        tweight_free(&tw);
    }
}
