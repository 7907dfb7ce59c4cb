/* Microbenchmark of the CPU matmul kernels.
 *
 *   decode GEMV: GB/s of weight streamed for 2048x8192 and 8192x2048 weights
 *     (q4 and q8, group 64, bf16 scales/biases; bf16 dense for reference),
 *     cycling over enough distinct weights (> 64 MiB) that they come from
 *     DRAM, and the ratio to a streaming-read bandwidth measured in the same
 *     run with the same thread count;
 *   prefill GEMM: GFLOP/s of 512 x 2048 x 8192 through the oneDNN paths
 *     (q4 -> bf16 panels, bf16 weights, f32 weights) and through the plain
 *     AVX2 GEMM exo_gemm_f32_avx2 on the same shape.
 *
 * Usage: bench_matmul [threads=2] [seconds per GEMV case=1.0] */
#include "core/alloc.h"
#include "core/clock.h"
#include "core/cpu_features.h"
#include "core/threadpool.h"
#include "engine/cpu/matmul.h"
#include "engine/linear.h"

#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t rng = 88172645463325252ull;
static uint64_t next_u64(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* ---- streaming read ---------------------------------------------------- */

typedef struct read_job {
    const unsigned char *buf;
    size_t bytes;
    unsigned long long sink[64];
} read_job;

__attribute__((target("avx512f"))) static unsigned long long sum_avx512(const unsigned char *p,
                                                                         size_t n)
{
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 256 <= n; i += 256) {
        a0 = _mm512_xor_si512(a0, _mm512_load_si512(p + i));
        a1 = _mm512_xor_si512(a1, _mm512_load_si512(p + i + 64));
        a2 = _mm512_xor_si512(a2, _mm512_load_si512(p + i + 128));
        a3 = _mm512_xor_si512(a3, _mm512_load_si512(p + i + 192));
    }
    a0 = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
    return (unsigned long long)_mm512_reduce_add_epi64(a0);
}

static void read_worker(void *p, int ith, int nth)
{
    read_job *j = p;
    long b, e;
    exo_split_range((long)j->bytes, 4096, ith, nth, &b, &e);
    j->sink[ith] = sum_avx512(j->buf + b, (size_t)(e - b));
}

static double stream_read_bw(exo_pool *pool, size_t bytes)
{
    unsigned char *buf = exo_alloc_aligned(bytes);
    if (!buf)
        return 0;
    memset(buf, 1, bytes);
    read_job j = {.buf = buf, .bytes = bytes};
    double best = 0;
    for (int pass = 0; pass < 5; pass++) {
        double t0 = exo_clock_seconds();
        exo_pool_run(pool, read_worker, &j);
        double bw = (double)bytes / (exo_clock_seconds() - t0);
        if (bw > best)
            best = bw;
    }
    exo_free_aligned(buf);
    return best;
}

/* ---- weights ------------------------------------------------------------ */

static void fill_bytes(void *p, size_t n)
{
    unsigned char *b = p;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = next_u64();
        memcpy(b + i, &v, n - i < 8 ? n - i : 8);
    }
}

static void fill_bf16(uint16_t *p, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        p[i] = exo_f32_to_bf16(((float)(next_u64() % 2001) / 1000.0f - 1.0f) * scale);
}

static exo_linear make_weight(int bits, int64_t rows, int64_t cols)
{
    exo_linear l = {.dtype = EXO_DTYPE_BF16, .rows = rows, .cols = cols};
    if (bits == 16) {
        l.format = EXO_WFORMAT_DENSE;
        uint16_t *w = exo_alloc_aligned((size_t)(rows * cols) * 2);
        fill_bf16(w, (size_t)(rows * cols), 0.05f);
        l.w = w;
        return l;
    }
    l.format = EXO_WFORMAT_AFFINE;
    l.bits = bits;
    l.group_size = 64;
    size_t cb = (size_t)(rows * cols * bits / 8), ng = (size_t)(rows * cols / 64);
    void *codes = exo_alloc_aligned(cb);
    uint16_t *s = exo_alloc_aligned(ng * 2), *b = exo_alloc_aligned(ng * 2);
    if (!codes || !s || !b) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    fill_bytes(codes, cb);
    fill_bf16(s, ng, 0.01f);
    fill_bf16(b, ng, 0.05f);
    l.w = codes;
    l.scales = s;
    l.biases = b;
    return l;
}

static void free_weight(exo_linear *l)
{
    exo_free_aligned((void *)l->w);
    exo_free_aligned((void *)l->scales);
    exo_free_aligned((void *)l->biases);
}

static double bench_gemv(exo_cpu_matmul_ctx *ctx, int bits, int64_t rows, int64_t cols,
                         double seconds, double bw)
{
    enum { NW = 8 };
    exo_linear w[NW];
    size_t bytes = 0;
    for (int i = 0; i < NW; i++) {
        w[i] = make_weight(bits, rows, cols);
        bytes += exo_linear_bytes(&w[i]);
    }
    float *x = exo_malloc((size_t)cols * sizeof(float)), *y = exo_malloc((size_t)rows * sizeof(float));
    for (int64_t c = 0; c < cols; c++)
        x[c] = (float)((int)(next_u64() % 2001) - 1000) / 1000.0f;
    exo_cpu_matmul_force_path(ctx, EXO_MATMUL_AUTO);
    /* warm up: one pass */
    for (int i = 0; i < NW; i++) {
        const exo_linear *wp = &w[i];
        exo_cpu_matmul(ctx, 1, &wp, x, 1, &y);
    }
    double best = 0, t_end = exo_clock_seconds() + seconds;
    while (exo_clock_seconds() < t_end) {
        double t0 = exo_clock_seconds();
        for (int i = 0; i < NW; i++) {
            const exo_linear *wp = &w[i];
            exo_cpu_matmul(ctx, 1, &wp, x, 1, &y);
        }
        double gbs = (double)bytes / (exo_clock_seconds() - t0) / 1e9;
        if (gbs > best)
            best = gbs;
    }
    const char *name = bits == 16 ? "bf16 dense" : bits == 4 ? "q4 g64 bf16" : "q8 g64 bf16";
    printf("gemv %-12s %5lld x %-5lld (%3zu MiB over %d weights): %6.2f GB/s  = %5.1f%% of read bw\n",
           name, (long long)rows, (long long)cols, bytes >> 20, NW, best, 100.0 * best / (bw / 1e9));
    for (int i = 0; i < NW; i++)
        free_weight(&w[i]);
    exo_free(x);
    exo_free(y);
    return best;
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

int main(int argc, char **argv)
{
    int nth = argc > 1 ? atoi(argv[1]) : 2;
    double secs = argc > 2 ? atof(argv[2]) : 1.0;
    exo_pool *pool = exo_pool_create(nth);
    usleep(20000); /* let the workers start (see test_matmul.c make_pool) */
    exo_cpu_matmul_ctx *ctx = exo_cpu_matmul_ctx_create(pool);
    printf("threads %d, isa %s, amx %d\n", nth, exo_isa_name(exo_cpu_isa()), exo_cpu_has_amx());
    double bw = stream_read_bw(pool, (size_t)512 << 20);
    printf("streaming read (512 MiB, best of 5): %.2f GB/s\n", bw / 1e9);
    bench_gemv(ctx, 4, 2048, 8192, secs, bw);
    bench_gemv(ctx, 4, 8192, 2048, secs, bw);
    bench_gemv(ctx, 8, 2048, 8192, secs, bw);
    bench_gemv(ctx, 8, 8192, 2048, secs, bw);
    bench_gemv(ctx, 16, 2048, 8192, secs * 0.5, bw);
    bw = stream_read_bw(pool, (size_t)512 << 20);
    printf("streaming read again: %.2f GB/s\n", bw / 1e9);

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
