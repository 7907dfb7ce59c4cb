/* Microbenchmark of the Gated DeltaNet CPU kernels at Qwen3.5-35B-A3B
 * shapes (Hk 16, Hv 32, Dk = Dv = 128, conv_dim 8192, K 4).
 *
 *   decode: one token through the delta rule, on one state (hot: 2 MiB,
 *     stays in L2/L3) and cycling over enough states that each call's comes
 *     from DRAM (cold: what a real decode sees, the weight stream having
 *     evicted it); the cold time against the time to read the state (2 MiB)
 *     and to read+write it (4 MiB) at the read bandwidth probed in the same
 *     run with the same threads. Also the conv step (C 8192) and the gated
 *     norm (32 x 128).
 *   prefill: tokens/s of the recurrent and the chunked form at several T
 *     (T = 512 is the headline), which sets EXO_GDN_CHUNKED_MIN_T; and the
 *     conv at T = 512.
 *
 * Usage: bench_linear_attn [threads=2] */
#include "core/alloc.h"
#include "core/clock.h"
#include "core/threadpool.h"
#include "engine/cpu/linear_attn.h"
#include "engine/cpu/membw.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { HK = 16, HV = 32, DK = 128, DV = 128, CONV = 2 * HK * DK + HV * DV, KC = 4 };
#define STATE_FLOATS ((size_t)HV * DK * DV)

static unsigned seed = 12345;
static float frand(void)
{
    seed = seed * 1103515245u + 12345u;
    return (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static float *rand_buf(size_t n, float scale)
{
    float *p = exo_alloc_aligned(n * sizeof(float));
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        p[i] = scale * frand();
    return p;
}

/* inputs for T tokens: conv-output rows [q | k | v] and gate rows [b | a] */
typedef struct inputs {
    float *x, *ab, *A_log, *dt_bias, *out;
} inputs;

static inputs make_inputs(int T)
{
    inputs in = {rand_buf((size_t)T * CONV, 1.0f), rand_buf((size_t)T * 2 * HV, 2.0f),
                 rand_buf(HV, 1.0f), rand_buf(HV, 1.0f), rand_buf((size_t)T * HV * DV, 0.0f)};
    return in;
}

static void free_inputs(inputs *in)
{
    exo_free_aligned(in->x);
    exo_free_aligned(in->ab);
    exo_free_aligned(in->A_log);
    exo_free_aligned(in->dt_bias);
    exo_free_aligned(in->out);
}

static void gdn(exo_pool *pool, const inputs *in, float *S, int T)
{
    exo_cpu_gated_delta(pool, in->out, in->x, in->x + HK * DK, CONV, in->x + 2 * HK * DK, CONV,
                        in->ab + HV, in->ab, 2 * HV, in->A_log, in->dt_bias, S, T, HK, HV, DK, DV);
}

static void bench_decode(exo_pool *pool, exo_membw *probe)
{
    inputs in = make_inputs(1);
    /* 512 states = 1 GiB, well past the L3 (260 MiB reported; 384 MiB of
     * states still hit in it often enough to beat the read probe) */
    const int NS = 512;
    float *states = rand_buf(STATE_FLOATS * NS, 0.01f);
    const double state_bytes = (double)STATE_FLOATS * sizeof(float);

    double hot = 1e9;
    for (int r = 0; r < 5; r++) {
        double t0 = exo_clock_seconds();
        for (int i = 0; i < 200; i++)
            gdn(pool, &in, states, 1);
        double dt = (exo_clock_seconds() - t0) / 200;
        hot = dt < hot ? dt : hot;
    }
    double cold = 1e9, bw = 0;
    for (int r = 0; r < 5; r++) {
        double b = exo_membw_read(probe, pool, 1);
        bw = b > bw ? b : bw;
        double t0 = exo_clock_seconds();
        for (int i = 0; i < NS; i++)
            gdn(pool, &in, states + (size_t)i * STATE_FLOATS, 1);
        double dt = (exo_clock_seconds() - t0) / NS;
        cold = dt < cold ? dt : cold;
    }
    /* the state is read once and written once; write-backs leave from L2
     * on their own, so read+write can beat the read probe's rate */
    const double rd = state_bytes / bw, rw = 2 * state_bytes / bw;
    printf("decode gated delta (Hv 32, 128x128, 2 MiB state):\n");
    printf("  hot  %7.1f us/call  (%.1f GB/s of state read+written)\n", hot * 1e6,
           2 * state_bytes / hot / 1e9);
    printf("  cold %7.1f us/call  (%.1f GB/s of state read+written); read probe %.1f GB/s:\n"
           "       reading 2 MiB takes %.1f us (%.0f%% of the call), 4 MiB %.1f us (%.0f%%)\n",
           cold * 1e6, 2 * state_bytes / cold / 1e9, bw / 1e9, rd * 1e6, 100 * rd / cold,
           rw * 1e6, 100 * rw / cold);
    printf("  30 GDN layers (Qwen3.5-35B-A3B): %.2f ms/token cold\n", 30 * cold * 1e3);
    exo_free_aligned(states);

    /* conv step and gated norm */
    float *x = rand_buf(CONV, 1.0f), *w = rand_buf((size_t)CONV * KC, 0.5f);
    float *st = rand_buf((size_t)(KC - 1) * CONV, 1.0f), *o = rand_buf(CONV, 0.0f);
    float *z = rand_buf(HV * DV, 1.0f), *nw = rand_buf(DV, 1.0f), *x0 = rand_buf(HV * DV, 1.0f);
    double tc = 1e9, tn = 1e9;
    for (int r = 0; r < 5; r++) {
        double t0 = exo_clock_seconds();
        for (int i = 0; i < 2000; i++)
            exo_cpu_conv1d_silu(pool, o, CONV, x, CONV, w, st, 1, CONV, KC);
        double dt = (exo_clock_seconds() - t0) / 2000;
        tc = dt < tc ? dt : tc;
        t0 = exo_clock_seconds();
        /* from the same input each time (normalising its own output over
         * and over drives some values to denormals); the copy is timed */
        for (int i = 0; i < 2000; i++) {
            memcpy(o, x0, sizeof(float) * HV * DV);
            exo_cpu_rmsnorm_gated(pool, o, z, HV * DV, nw, 1, HV, DV, 1e-6f);
        }
        dt = (exo_clock_seconds() - t0) / 2000;
        tn = dt < tn ? dt : tn;
    }
    printf("decode conv1d+silu C %d K %d: %.2f us/call; gated rmsnorm 32x128: %.2f us/call\n",
           CONV, KC, tc * 1e6, tn * 1e6);
    exo_free_aligned(x);
    exo_free_aligned(w);
    exo_free_aligned(st);
    exo_free_aligned(o);
    exo_free_aligned(z);
    exo_free_aligned(nw);
    exo_free_aligned(x0);
    free_inputs(&in);
}

static double time_prefill(exo_pool *pool, const inputs *in, float *S, int T, const char *path,
                           int reps)
{
    setenv("EXO_GDN_PATH", path, 1);
    double best = 1e9;
    for (int r = 0; r < reps; r++) {
        double t0 = exo_clock_seconds();
        gdn(pool, in, S, T);
        double dt = exo_clock_seconds() - t0;
        best = dt < best ? dt : best;
    }
    unsetenv("EXO_GDN_PATH");
    return best;
}

static void bench_prefill(exo_pool *pool)
{
    static const int Ts[] = {16, 64, 128, 256, 512, 1024};
    inputs in = make_inputs(1024);
    float *S = rand_buf(STATE_FLOATS, 0.01f);
    printf("prefill gated delta, tokens/s (best of 3), recurrent vs chunked (chunk %d):\n",
           EXO_GDN_CHUNK);
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
        const int T = Ts[i];
        double tr = time_prefill(pool, &in, S, T, "recurrent", 3);
        double tk = time_prefill(pool, &in, S, T, "chunked", 3);
        printf("  T %4d: recurrent %8.0f tok/s (%6.2f ms)  chunked %8.0f tok/s (%6.2f ms)  %s\n", T,
               T / tr, tr * 1e3, T / tk, tk * 1e3, tk < tr ? "chunked faster" : "recurrent faster");
    }
    float *w = rand_buf((size_t)CONV * KC, 0.5f), *st = rand_buf((size_t)(KC - 1) * CONV, 1.0f);
    float *o = rand_buf((size_t)512 * CONV, 0.0f);
    double tc = 1e9;
    for (int r = 0; r < 3; r++) {
        double t0 = exo_clock_seconds();
        exo_cpu_conv1d_silu(pool, o, CONV, in.x, CONV, w, st, 512, CONV, KC);
        double dt = exo_clock_seconds() - t0;
        tc = dt < tc ? dt : tc;
    }
    printf("prefill conv1d+silu T 512 C %d: %.2f ms (%.0f tok/s)\n", CONV, tc * 1e3, 512 / tc);
    exo_free_aligned(w);
    exo_free_aligned(st);
    exo_free_aligned(o);
    exo_free_aligned(S);
    free_inputs(&in);
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    exo_pool *pool = exo_pool_create(threads);
    exo_membw *probe = exo_membw_create((size_t)256 << 20);
    if (!pool || !probe) {
        fprintf(stderr, "setup failed\n");
        return 1;
    }
    printf("threads %d\n", exo_pool_size(pool));
    bench_decode(pool, probe);
    bench_prefill(pool);
    exo_membw_free(probe);
    exo_pool_free(pool);
    return 0;
}
