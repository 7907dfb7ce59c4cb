/* Microbenchmark of the CPU matmul kernels.
 *
 *   decode GEMV: GB/s of weight streamed for 2048x8192 and 8192x2048 weights
 *     (q4 and q8, group 64, bf16 scales/biases; bf16 dense for reference),
 *     cycling over enough distinct weights (> 64 MiB) that they come from
 *     DRAM, and the ratio to a streaming-read bandwidth measured in the same
 *     run with the same thread count; and a decode step's worth of calls
 *     over Llama-3.2-1B's 16 layers (q4 and q8);
 *   prefill GEMM: GFLOP/s of 512 x 2048 x 8192 through the oneDNN paths
 *     (q4 -> bf16 panels, bf16 weights, f32 weights) and through the plain
 *     AVX2 GEMM exo_gemm_f32_avx2 on the same shape;
 *   MXFP4 (gpt-oss experts): GEMV at gpt-oss-20b's expert shapes, gate_up
 *     5760 x 2880 and down 2880 x 2880, against affine q4 g32 (bf16 scales
 *     and biases) on the same shapes, as GB/s, ratio to the read bandwidth
 *     and time per matrix (MXFP4 reads 4.25 bits a weight, q4 g32 5); and
 *     the prefill GEMM of 512 tokens through gate_up (bf16 panels).
 *
 *   q4 and q8 weights run in both layouts where the CPU backend would load
 *   them as affine panels (linear.h: CPUs whose GEMV runs on the vector
 *   units), the row format first, then "panels", each against its own reads;
 *
 *   batched decode ("rows"): the same GEMV with T = 1, 2, 4, 8 and 16 rows
 *     of X (T sequences decoding together), as each T's speed-up over T
 *     one-row calls: T would be the ideal of a memory-bound kernel, 1 means
 *     batching bought nothing. Where the CPU has AMX, each T also runs on
 *     the vector kernel alone ("vector"), the tile kernel's peer. For q4 and
 *     q8, "% dot" is the share of the CPU's int8 dot product peak
 *     (dotpeak.h) the call's products (two activation levels) would take:
 *     the compute limit batched rows approach once memory no longer binds.
 *
 * Usage: bench_matmul [threads=2] [scale of GEMV rounds=1.0 -> 8 rounds] [mxfp4|rows]
 * ("mxfp4" or "rows" runs only that part; EXO_CPU_ISA=avx2 measures the AVX2 kernels.) */
#include "core/alloc.h"
#include "core/clock.h"
#include "core/cpu_features.h"
#include "core/threadpool.h"
#include "engine/cpu/dotpeak.h"
#include "engine/cpu/matmul.h"
#include "engine/cpu/membw.h"
#include "engine/linear.h"
#include "engine/quant.h"

#include "bench_weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { GROUP = 64, MXFP4 = BENCH_MXFP4 }; /* make_weight's bits: MXFP4 for an MXFP4 weight */

static exo_linear make_weight(int bits, int64_t rows, int64_t cols)
{
    return make_weight_g(bits, GROUP, rows, cols);
}

/* w as affine panels (linear.h) when `panels` and the weight can be, else
 * as it is: the layout the CPU backend loads q4/q8 weights in where the
 * GEMV runs on the vector units (exo_cpu_matmul_wants_panels). */
static exo_linear as_layout(exo_linear w, int panels)
{
    if (!panels || !exo_linear_panels_ok(&w))
        return w;
    void *mem = exo_alloc_aligned(exo_linear_panels_bytes(&w));
    if (!mem) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    exo_linear out;
    exo_linear_to_panels(&w, mem, &out, NULL);
    free_weight(&w);
    return out;
}

static const char *layout_name(int panels) { return panels ? " panels" : ""; }

static const char *weight_name(int bits, int G)
{
    static char buf[32];
    if (bits == MXFP4)
        return "mxfp4";
    if (bits == 16)
        return "bf16 dense";
    snprintf(buf, sizeof buf, "q%d g%d bf16", bits, G);
    return buf;
}


/* GEMV passes over >= 256 MiB of distinct weights, interleaved with
 * streaming-read passes over a 256 MiB buffer, so both see the same load
 * from whatever else shares the machine. Reports the best GEMV rate, the
 * best read rate, and the median of the per-round ratios. */
static void bench_gemv(exo_cpu_matmul_ctx *ctx, exo_pool *pool, exo_membw *probe, int bits,
                       int G, int64_t rows, int64_t cols, int rounds, int panels)
{
    enum { MAXW = 64 };
    exo_linear w[MAXW];
    size_t bytes = 0;
    int NW = 0;
    while (NW < MAXW && bytes < ((size_t)256 << 20)) {
        w[NW] = as_layout(make_weight_g(bits, G, rows, cols), panels);
        bytes += exo_linear_bytes(&w[NW]);
        NW++;
    }
    float *x = exo_malloc((size_t)cols * sizeof(float)), *y = exo_malloc((size_t)rows * sizeof(float));
    for (int64_t c = 0; c < cols; c++)
        x[c] = (float)((int)(next_u64() % 2001) - 1000) / 1000.0f;
    exo_cpu_matmul_force_path(ctx, EXO_MATMUL_AUTO);
    for (int i = 0; i < NW; i++) { /* warm up */
        const exo_linear *wp = &w[i];
        exo_cpu_matmul(ctx, 1, &wp, x, 1, &y);
    }
    double best = 0, best_bw = 0, ratio[64], best_dt = 0;
    for (int k = 0; k < rounds && k < 64; k++) {
        double bw = exo_membw_read(probe, pool, 1);
        double t0 = exo_clock_seconds();
        for (int i = 0; i < NW; i++) {
            const exo_linear *wp = &w[i];
            exo_cpu_matmul(ctx, 1, &wp, x, 1, &y);
        }
        double dt = exo_clock_seconds() - t0;
        double gbs = (double)bytes / dt;
        ratio[k] = gbs / bw;
        if (gbs > best) {
            best = gbs;
            best_dt = dt;
        }
        if (bw > best_bw)
            best_bw = bw;
    }
    for (int i = 1; i < rounds; i++) /* insertion sort for the median */
        for (int j = i; j > 0 && ratio[j] < ratio[j - 1]; j--) {
            double t = ratio[j];
            ratio[j] = ratio[j - 1];
            ratio[j - 1] = t;
        }
    printf("gemv %-11s%-7s %5lld x %-5lld (%3zu MiB, %2d weights): best %6.2f GB/s, read best %6.2f GB/s,"
           " ratio best/best %5.1f%%, median of rounds %5.1f%%, %7.1f us/matrix\n",
           weight_name(bits, G), layout_name(panels), (long long)rows, (long long)cols, bytes >> 20, NW, best / 1e9,
           best_bw / 1e9, 100.0 * best / best_bw, 100.0 * ratio[rounds / 2], best_dt / NW * 1e6);
    for (int i = 0; i < NW; i++)
        free_weight(&w[i]);
    exo_free(x);
    exo_free(y);
}

/* Decode of Llama-3.2-1B's 16 layers (no LM head) the way a forward pass
 * calls the kernels: q/k/v in one call, o, gate/up in one call, down. */
static void bench_layers(exo_cpu_matmul_ctx *ctx, exo_pool *pool, exo_membw *probe, int bits, int rounds,
                         int panels)
{
    enum { L = 16 };
    static const int64_t shp[6][2] = {{2048, 2048}, {512, 2048}, {512, 2048},
                                      {2048, 2048}, {8192, 2048}, {8192, 2048}};
    exo_linear w[L][7];
    size_t bytes = 0;
    for (int l = 0; l < L; l++) {
        for (int k = 0; k < 6; k++)
            w[l][k] = as_layout(make_weight(bits, shp[k][0], shp[k][1]), panels);
        w[l][6] = as_layout(make_weight(bits, 2048, 8192), panels);
        for (int k = 0; k < 7; k++)
            bytes += exo_linear_bytes(&w[l][k]);
    }
    float *x = exo_malloc(8192 * sizeof(float)), *y = exo_malloc(4 * 8192 * sizeof(float));
    for (int c = 0; c < 8192; c++)
        x[c] = (float)((int)(next_u64() % 2001) - 1000) / 1000.0f;
    exo_cpu_matmul_force_path(ctx, EXO_MATMUL_AUTO);
    double best = 0, best_bw = 0, best_ms = 0;
    for (int k = 0; k < rounds; k++) {
        double bw = exo_membw_read(probe, pool, 1);
        double t0 = exo_clock_seconds();
        for (int l = 0; l < L; l++) {
            const exo_linear *qkv[3] = {&w[l][0], &w[l][1], &w[l][2]};
            float *yq[3] = {y, y + 8192, y + 16384};
            exo_cpu_matmul(ctx, 3, qkv, x, 1, yq);
            const exo_linear *o = &w[l][3];
            exo_cpu_matmul(ctx, 1, &o, x, 1, &y);
            const exo_linear *gu[2] = {&w[l][4], &w[l][5]};
            float *yg[2] = {y, y + 8192};
            exo_cpu_matmul(ctx, 2, gu, x, 1, yg);
            const exo_linear *dn = &w[l][6];
            exo_cpu_matmul(ctx, 1, &dn, x, 1, &y);
        }
        double dt = exo_clock_seconds() - t0;
        if (bytes / dt > best) {
            best = bytes / dt;
            best_ms = dt * 1e3;
        }
        if (bw > best_bw)
            best_bw = bw;
    }
    printf("decode layers (Llama-3.2-1B shapes, %s%s, 16 layers, %zu MiB): best %.2f ms = %.2f GB/s,"
           " %.1f%% of best read %.2f GB/s\n",
           bits == 4 ? "q4 g64" : bits == 8 ? "q8 g64" : "bf16", layout_name(panels), bytes >> 20, best_ms, best / 1e9,
           100.0 * best / best_bw, best_bw / 1e9);
    for (int l = 0; l < L; l++)
        for (int k = 0; k < 7; k++)
            free_weight(&w[l][k]);
    exo_free(x);
    exo_free(y);
}

static double time_best(void (*fn)(void *), void *arg, int reps)
{
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = exo_clock_seconds();
        fn(arg);
        double dt = exo_clock_seconds() - t0;
        if (dt < best)
            best = dt;
    }
    return best;
}

typedef struct gemm_arg {
    exo_cpu_matmul_ctx *ctx;
    const exo_linear *w;
    const float *x;
    float *y;
    int M;
    exo_pool *pool;
    const float *wf;
    int N, K;
} gemm_arg;

static void run_onednn(void *p)
{
    gemm_arg *a = p;
    exo_cpu_matmul(a->ctx, 1, &a->w, a->x, a->M, &a->y);
}

static void run_avx2(void *p)
{
    gemm_arg *a = p;
    exo_gemm_f32_avx2(a->M, a->N, a->K, a->x, a->wf, a->y, a->pool);
}

static void bench_rows(exo_cpu_matmul_ctx *ctx, int bits, int64_t rows, int64_t cols, int rounds, double peak,
                       int panels);

/* gpt-oss-20b experts: GEMV of both shapes, MXFP4 against affine q4 g32,
 * in both layouts where the backend would load panels; batched rows of
 * gate_up; and the 512-token prefill GEMM through gate_up. */
static void bench_mxfp4(exo_cpu_matmul_ctx *ctx, exo_pool *pool, exo_membw *probe, int rounds, double peak,
                        int panels)
{
    static const int64_t shp[2][2] = {{5760, 2880}, {2880, 2880}};
    for (int s = 0; s < 2; s++)
        for (int pl = 0; pl <= panels; pl++) {
            bench_gemv(ctx, pool, probe, MXFP4, 32, shp[s][0], shp[s][1], rounds, pl);
            bench_gemv(ctx, pool, probe, 4, 32, shp[s][0], shp[s][1], rounds, pl);
        }
    for (int pl = 0; pl <= panels; pl++)
        bench_rows(ctx, MXFP4, shp[0][0], shp[0][1], rounds, peak, pl);
    const int M = 512, K = 2880, N = 5760;
    double flop = 2.0 * M * N * K;
    float *x = exo_malloc((size_t)M * K * sizeof(float)), *y = exo_malloc((size_t)M * N * sizeof(float));
    for (int64_t i = 0; i < (int64_t)M * K; i++)
        x[i] = (float)((int)(next_u64() % 2001) - 1000) / 1000.0f;
    exo_linear wm = make_weight_g(MXFP4, 32, N, K), wq = make_weight_g(4, 32, N, K);
    gemm_arg a = {.ctx = ctx, .x = x, .y = y, .M = M, .pool = pool, .N = N, .K = K};
    exo_cpu_matmul_force_path(ctx, EXO_MATMUL_GEMM);
    a.w = &wm;
    double t = time_best(run_onednn, &a, 3);
    printf("gemm %dx%dx%d mxfp4 -> bf16 panels, oneDNN:   %7.1f GFLOP/s\n", M, K, N, flop / t / 1e9);
    a.w = &wq;
    t = time_best(run_onednn, &a, 3);
    printf("gemm %dx%dx%d q4 g32 -> bf16 panels, oneDNN:  %7.1f GFLOP/s\n", M, K, N, flop / t / 1e9);
    exo_cpu_matmul_force_path(ctx, EXO_MATMUL_AUTO);
    free_weight(&wm);
    free_weight(&wq);
    exo_free(x);
    exo_free(y);
}

/* Time of one call of T rows through each of >= 256 MiB of distinct
 * weights (so they come from DRAM), best of `rounds`. */
static double gemv_rows_time(exo_cpu_matmul_ctx *ctx, const exo_linear *w, int NW, const float *x, int T,
                             float *y, int rounds)
{
    double best = 1e30;
    for (int k = 0; k < rounds; k++) {
        double t0 = exo_clock_seconds();
        for (int i = 0; i < NW; i++) {
            const exo_linear *wp = &w[i];
            exo_cpu_matmul(ctx, 1, &wp, x, T, &y);
        }
        double dt = (exo_clock_seconds() - t0) / NW;
        if (dt < best)
            best = dt;
    }
    return best;
}

static void bench_rows(exo_cpu_matmul_ctx *ctx, int bits, int64_t rows, int64_t cols, int rounds, double peak,
                       int panels)
{
    enum { MAXW = 64, TMAX = 16 };
    exo_linear w[MAXW];
    size_t bytes = 0;
    int NW = 0;
    while (NW < MAXW && bytes < ((size_t)256 << 20)) {
        w[NW] = as_layout(make_weight(bits, rows, cols), panels);
        bytes += exo_linear_bytes(&w[NW]);
        NW++;
    }
    float *x = exo_malloc((size_t)TMAX * cols * sizeof(float));
    float *y = exo_malloc((size_t)TMAX * rows * sizeof(float));
    for (int64_t c = 0; c < TMAX * cols; c++)
        x[c] = (float)((int)(next_u64() % 2001) - 1000) / 1000.0f;
    exo_cpu_matmul_force_path(ctx, EXO_MATMUL_AUTO);
    gemv_rows_time(ctx, w, NW, x, 1, y, 1); /* warm up */
    double t1 = gemv_rows_time(ctx, w, NW, x, 1, y, rounds);
    printf("rows %-11s%-7s %5lld x %-5lld: T=1 %7.1f us", weight_name(bits, GROUP), layout_name(panels),
           (long long)rows,
           (long long)cols, t1 * 1e6);
    int amx = exo_cpu_matmul_use_amx(ctx, 1);
    for (int T = 2; T <= TMAX; T *= 2) {
        double t = gemv_rows_time(ctx, w, NW, x, T, y, rounds);
        printf(", T=%d %7.1f us x%.2f", T, t * 1e6, T * t1 / t);
        /* the integer path's products: two activation levels a weight a row */
        if (peak > 0 && bits <= 8)
            printf(" (%.0f%% dot)", 100.0 * 2.0 * T * (double)rows * cols / peak / t);
        if (amx) { /* the vector kernel alone, the tile kernel's peer */
            exo_cpu_matmul_use_amx(ctx, 0);
            double tv = gemv_rows_time(ctx, w, NW, x, T, y, rounds);
            exo_cpu_matmul_use_amx(ctx, 1);
            printf(" (vector %.1f us x%.2f)", tv * 1e6, T * t1 / tv);
        }
    }
    printf(" (speed-up over T one-row calls)\n");
    for (int i = 0; i < NW; i++)
        free_weight(&w[i]);
    exo_free(x);
    exo_free(y);
}

int main(int argc, char **argv)
{
    int nth = argc > 1 ? atoi(argv[1]) : 2;
    double secs = argc > 2 ? atof(argv[2]) : 1.0;
    int only_mxfp4 = argc > 3 && !strcmp(argv[3], "mxfp4");
    int only_rows = argc > 3 && !strcmp(argv[3], "rows");
    exo_pool *pool = exo_pool_create(nth);
    exo_cpu_matmul_ctx *ctx = exo_cpu_matmul_ctx_create(pool);
    double peak = exo_dot_peak(pool);
    /* q4/q8 run in both layouts where the backend would load panels */
    const int panels = exo_cpu_matmul_wants_panels(ctx);
    printf("threads %d, isa %s, amx %d, int8 dot peak %.0f G products/s\n", nth, exo_isa_name(exo_cpu_isa()),
           exo_cpu_has_amx(), peak / 1e9);
    exo_membw *probe = exo_membw_create((size_t)256 << 20);
    if (!probe)
        return 1;
    int rounds = (int)(secs * 8);
    if (rounds < 3)
        rounds = 3;
    if (only_mxfp4 || only_rows) {
        if (only_mxfp4)
            bench_mxfp4(ctx, pool, probe, rounds, peak, panels);
        for (int bits = 4; only_rows && bits <= 16; bits *= 2)
            for (int pl = 0; pl <= (bits <= 8 && panels); pl++)
                bench_rows(ctx, bits, 2048, 8192, rounds, peak, pl);
        exo_membw_free(probe);
        exo_cpu_matmul_ctx_free(ctx);
        exo_pool_free(pool);
        return 0;
    }
    static const int cases[][3] = {{4, 2048, 8192}, {4, 8192, 2048}, {8, 2048, 8192},
                                   {8, 8192, 2048}, {16, 2048, 8192}};
    for (int c = 0; c < 5; c++)
        for (int pl = 0; pl <= (cases[c][0] <= 8 && panels); pl++)
            bench_gemv(ctx, pool, probe, cases[c][0], GROUP, cases[c][1], cases[c][2], rounds, pl);
    for (int pl = 0; pl <= panels; pl++)
        bench_layers(ctx, pool, probe, 4, rounds, pl);
    for (int pl = 0; pl <= panels; pl++)
        bench_layers(ctx, pool, probe, 8, rounds, pl);
    bench_mxfp4(ctx, pool, probe, rounds, peak, panels);
    exo_membw_free(probe);
    for (int bits = 4; bits <= 16; bits *= 2)
        for (int pl = 0; pl <= (bits <= 8 && panels); pl++)
            bench_rows(ctx, bits, 2048, 8192, rounds, peak, pl);

    const int M = 512, K = 2048, N = 8192;
    double flop = 2.0 * M * N * K;
    float *x = exo_malloc((size_t)M * K * sizeof(float)), *y = exo_malloc((size_t)M * N * sizeof(float));
    for (int64_t i = 0; i < (int64_t)M * K; i++)
        x[i] = (float)((int)(next_u64() % 2001) - 1000) / 1000.0f;
    exo_linear wq = make_weight(4, N, K), wb = make_weight(16, N, K);
    float *wf = exo_malloc((size_t)N * K * sizeof(float));
    for (int64_t i = 0; i < (int64_t)N * K; i++)
        wf[i] = exo_bf16_to_f32(((const uint16_t *)wb.w)[i]);
    exo_linear wl = {.format = EXO_WFORMAT_DENSE, .dtype = EXO_DTYPE_F32, .rows = N, .cols = K, .w = wf};
    gemm_arg a = {.ctx = ctx, .x = x, .y = y, .M = M, .pool = pool, .wf = wf, .N = N, .K = K};
    exo_cpu_matmul_force_path(ctx, EXO_MATMUL_GEMM);
    a.w = &wq;
    double t = time_best(run_onednn, &a, 4);
    printf("gemm %dx%dx%d q4 g64 -> bf16 panels, oneDNN: %7.1f GFLOP/s\n", M, K, N, flop / t / 1e9);
    if (panels) { /* affine panels expand to W^T; a short prompt's rows too, both layouts */
        exo_linear wp = as_layout(make_weight(4, N, K), 1);
        a.w = &wp;
        t = time_best(run_onednn, &a, 4);
        printf("gemm %dx%dx%d q4 g64 panels -> bf16 W^T:    %7.1f GFLOP/s\n", M, K, N, flop / t / 1e9);
        a.M = 128;
        for (int pl = 0; pl <= 1; pl++) {
            a.w = pl ? &wp : &wq;
            t = time_best(run_onednn, &a, 4);
            printf("gemm %dx%dx%d q4 g64%-7s -> bf16:        %7.1f GFLOP/s\n", a.M, K, N, layout_name(pl),
                   flop / 4 / t / 1e9);
        }
        a.M = M;
        free_weight(&wp);
    }
    a.w = &wb;
    t = time_best(run_onednn, &a, 4);
    printf("gemm %dx%dx%d bf16 weights, oneDNN:         %7.1f GFLOP/s\n", M, K, N, flop / t / 1e9);
    a.w = &wl;
    t = time_best(run_onednn, &a, 3);
    printf("gemm %dx%dx%d f32 weights, oneDNN f32:      %7.1f GFLOP/s\n", M, K, N, flop / t / 1e9);
    double tq = 0;
    if (exo_cpu_isa() >= EXO_ISA_AVX2) {
        tq = time_best(run_avx2, &a, 2);
        printf("gemm %dx%dx%d f32, plain AVX2 GEMM:          %7.1f GFLOP/s\n", M, K, N, flop / tq / 1e9);
    }
    free_weight(&wq);
    free_weight(&wb);
    exo_free(wf);
    exo_free(x);
    exo_free(y);
    exo_cpu_matmul_ctx_free(ctx);
    exo_pool_free(pool);
    return 0;
}
