/* Gated DeltaNet CPU kernels (engine/cpu/linear_attn.c) against naive
 * double-precision references written token by token from the formulas in
 * linear_attn.h (notes: qwen3_next_and_qwen3_5.md 2.1, 2.3).
 *
 * conv1d: one call == the same tokens split over several calls (state
 * continuation) == naive. gated delta: the recurrent and the chunked form,
 * forced by EXO_GDN_PATH, from a non-zero state, with q/k/v and a/b as
 * strided views into packed rows, at T = 1, 5, 64, 65, 130, 200 (chunk
 * boundaries at 64) on a tiny shape and on Qwen3.5's (Hk 16, Hv 32,
 * Dk = Dv = 128), head sizes that are not multiples of 16, fewer value
 * heads than threads, and a state carried across calls that mix the two
 * forms, and the AVX2 and baseline builds of the kernels (EXO_CPU_ISA).
 * Tolerances: the largest error over a tensor (outputs, then state)
 * divided by its largest reference value; f32 against double. The
 * conv's one call and its split calls agree to 1e-6 (short calls take
 * another code path, so not bit for bit), and its state exactly. */
#include "core/alloc.h"
#include "core/threadpool.h"
#include "engine/cpu/linear_attn.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Conv outputs: f32 sums of K products and SiLU through exo_fast_expf
 * (2e-7 relative); measured <= 1.6e-7. */
#define CONV_TOL 1e-6
/* Delta rule: f32 state updated T times. Measured: recurrent <= 6e-7,
 * chunked (which reassociates: products over 64-token chunks) <= 4e-6. */
#define GDN_TOL 2e-5
/* Gated norm: measured <= 2.2e-7. */
#define NORM_TOL 2e-6

static float frand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static double max_rel_err(const float *got, const double *want, size_t n)
{
    double scale = 1e-30, err = 0;
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(want[i]));
    for (size_t i = 0; i < n; i++)
        err = fmax(err, fabs((double)got[i] - want[i]));
    return err / scale;
}

/* ---- conv1d ------------------------------------------------------------- */

/* x: T rows of C (stride xs); state: (K-1, C) in/out; out: T rows of C */
static void naive_conv(int T, int C, int K, const float *x, int xs, const float *w, double *state,
                       double *out)
{
    double *u = malloc(sizeof(double) * (size_t)(T + K - 1) * C);
    for (int r = 0; r < K - 1; r++)
        for (int c = 0; c < C; c++)
            u[(size_t)r * C + c] = state[(size_t)r * C + c];
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++)
            u[(size_t)(K - 1 + t) * C + c] = x[(size_t)t * xs + c];
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
            double s = 0;
            for (int j = 0; j < K; j++)
                s += (double)w[c * K + j] * u[(size_t)(t + j) * C + c];
            out[(size_t)t * C + c] = s / (1.0 + exp(-s));
        }
    for (int r = 0; r < K - 1; r++)
        for (int c = 0; c < C; c++)
            state[(size_t)r * C + c] = u[(size_t)(T + r) * C + c];
    free(u);
}

static void check_conv(exo_pool *pool, int T, int C, int K, const int *pieces)
{
    unsigned seed = (unsigned)(T * 7919 + C * 31 + K);
    const int xs = C + 5, os = C + 3;
    float *x = exo_malloc(sizeof(float) * (size_t)T * xs);
    float *w = exo_malloc(sizeof(float) * (size_t)C * K);
    float *st0 = exo_malloc(sizeof(float) * (size_t)(K > 1 ? K - 1 : 1) * C);
    float *st1 = exo_malloc(sizeof(float) * (size_t)(K > 1 ? K - 1 : 1) * C);
    float *st2 = exo_malloc(sizeof(float) * (size_t)(K > 1 ? K - 1 : 1) * C);
    float *o1 = exo_calloc((size_t)T * os, sizeof(float)), *o2 = exo_calloc((size_t)T * os, sizeof(float));
    double *stn = exo_malloc(sizeof(double) * (size_t)(K > 1 ? K - 1 : 1) * C);
    double *on = exo_malloc(sizeof(double) * (size_t)T * C);
    for (size_t i = 0; i < (size_t)T * xs; i++)
        x[i] = 3 * frand(&seed);
    for (size_t i = 0; i < (size_t)C * K; i++)
        w[i] = frand(&seed);
    for (size_t i = 0; i < (size_t)(K - 1) * C; i++) {
        st0[i] = st1[i] = st2[i] = 2 * frand(&seed);
        stn[i] = st0[i];
    }
    naive_conv(T, C, K, x, xs, w, stn, on);
    exo_cpu_conv1d_silu(pool, o1, os, x, xs, w, st1, T, C, K);
    int t0 = 0;
    for (int p = 0; t0 < T; p++) {
        int n = pieces[p] < T - t0 ? pieces[p] : T - t0;
        exo_cpu_conv1d_silu(pool, o2 + (size_t)t0 * os, os, x + (size_t)t0 * xs, xs, w, st2, n, C, K);
        t0 += n;
    }
    /* compact the strided outputs for the comparison */
    float *c1 = exo_malloc(sizeof(float) * (size_t)T * C), *c2 = exo_malloc(sizeof(float) * (size_t)T * C);
    for (int t = 0; t < T; t++) {
        memcpy(c1 + (size_t)t * C, o1 + (size_t)t * os, sizeof(float) * (size_t)C);
        memcpy(c2 + (size_t)t * C, o2 + (size_t)t * os, sizeof(float) * (size_t)C);
    }
    double e1 = max_rel_err(c1, on, (size_t)T * C), e2 = max_rel_err(c2, on, (size_t)T * C);
    cr_expect(e1 < CONV_TOL && e2 < CONV_TOL, "conv T %d C %d K %d: err %g (one call) %g (pieces)",
              T, C, K, e1, e2);
    double split = 0, scale = 1e-30;
    for (size_t i = 0; i < (size_t)T * C; i++) {
        split = fmax(split, fabs((double)c1[i] - c2[i]));
        scale = fmax(scale, fabs(on[i]));
    }
    cr_expect(split / scale <= 1e-6, "conv T %d C %d K %d: one call vs pieces differ by %g", T, C,
              K, split / scale);
    if (K > 1) {
        double es = max_rel_err(st1, stn, (size_t)(K - 1) * C);
        cr_expect(es == 0, "conv state T %d C %d K %d: err %g", T, C, K, es);
        cr_expect(memcmp(st1, st2, sizeof(float) * (size_t)(K - 1) * C) == 0,
                  "conv state one call vs pieces");
    }
    /* the padding between rows is not written */
    for (int t = 0; t < T; t++)
        for (int c = C; c < os; c++)
            cr_expect(o1[(size_t)t * os + c] == 0.0f && o2[(size_t)t * os + c] == 0.0f);
    exo_free(x);
    exo_free(w);
    exo_free(st0);
    exo_free(st1);
    exo_free(st2);
    exo_free(o1);
    exo_free(o2);
    exo_free(stn);
    exo_free(on);
    exo_free(c1);
    exo_free(c2);
}

Test(linear_attn, conv1d_silu)
{
    exo_pool *pool = exo_pool_create(2);
    static const int ones[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                               1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                               1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    static const int mixed[] = {2, 1, 5, 3, 17, 1, 64, 100, 1000};
    check_conv(pool, 1, 40, 4, ones);
    check_conv(pool, 2, 40, 4, ones);  /* fewer tokens than the window */
    check_conv(pool, 7, 100, 4, ones);
    check_conv(pool, 50, 100, 4, mixed);
    check_conv(pool, 33, 37, 1, mixed); /* no state */
    check_conv(pool, 9, 37, 2, mixed);
    check_conv(pool, 20, 130, 7, mixed);
    check_conv(pool, 40, 8192, 4, mixed); /* Qwen3.5 conv_dim, threaded */
    check_conv(pool, 3, 8192, 4, ones);
    exo_pool_free(pool);
}

/* ---- gated delta rule --------------------------------------------------- */

typedef struct gdn_case {
    int T, Hk, Hv, Dk, Dv;
    int row;      /* packed row: [q (Hk Dk) | k (Hk Dk) | v (Hv Dv) | pad] */
    int ab;       /* packed gate row: [b (Hv) | a (Hv) | pad] */
    float *x, *g; /* T rows each */
    float *A_log, *dt_bias;
} gdn_case;

static gdn_case make_case(int T, int Hk, int Hv, int Dk, int Dv, unsigned seed)
{
    gdn_case c = {T, Hk, Hv, Dk, Dv, 2 * Hk * Dk + Hv * Dv + 3, 2 * Hv + 1, NULL, NULL, NULL, NULL};
    c.x = exo_malloc(sizeof(float) * (size_t)T * c.row);
    c.g = exo_malloc(sizeof(float) * (size_t)T * c.ab);
    c.A_log = exo_malloc(sizeof(float) * (size_t)Hv);
    c.dt_bias = exo_malloc(sizeof(float) * (size_t)Hv);
    for (size_t i = 0; i < (size_t)T * c.row; i++)
        c.x[i] = 2 * frand(&seed);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < Hv; h++) {
            c.g[(size_t)t * c.ab + h] = 4 * frand(&seed);                  /* b */
            float a = 3 * frand(&seed);
            if ((t * 7 + h) % 23 == 0)
                a = 21.0f + frand(&seed); /* softplus' linear branch: decay ~ 0 */
            c.g[(size_t)t * c.ab + Hv + h] = a;
        }
    for (int h = 0; h < Hv; h++) {
        c.A_log[h] = 1.2f * frand(&seed) - 0.5f;
        c.dt_bias[h] = frand(&seed);
    }
    return c;
}

static void free_case(gdn_case *c)
{
    exo_free(c->x);
    exo_free(c->g);
    exo_free(c->A_log);
    exo_free(c->dt_bias);
}

/* Tokens [t0, t1) of case c, naive, on state S (Hv, Dk, Dv); out rows of
 * Hv*Dv for those tokens. */
static void naive_gdn(const gdn_case *c, int t0, int t1, double *S, double *out)
{
    const int Dk = c->Dk, Dv = c->Dv, r = c->Hv / c->Hk;
    double *qn = malloc(sizeof(double) * (size_t)Dk), *kn = malloc(sizeof(double) * (size_t)Dk);
    double *kv = malloc(sizeof(double) * (size_t)Dv);
    for (int t = t0; t < t1; t++)
        for (int h = 0; h < c->Hv; h++) {
            const int hk = h / r;
            const float *q = c->x + (size_t)t * c->row + (size_t)hk * Dk;
            const float *k = q + (size_t)c->Hk * Dk;
            const float *v = c->x + (size_t)t * c->row + 2 * (size_t)c->Hk * Dk + (size_t)h * Dv;
            double sq = 0, sk = 0;
            for (int d = 0; d < Dk; d++) {
                sq += (double)q[d] * q[d];
                sk += (double)k[d] * k[d];
            }
            for (int d = 0; d < Dk; d++) {
                qn[d] = q[d] / sqrt(sq + 1e-6) / sqrt((double)Dk);
                kn[d] = k[d] / sqrt(sk + 1e-6);
            }
            const double b = c->g[(size_t)t * c->ab + h];
            const double a = (double)c->g[(size_t)t * c->ab + c->Hv + h] + c->dt_bias[h];
            const double sp = a > 20 ? a : log1p(exp(a));
            const double g = -exp((double)c->A_log[h]) * sp;
            const double decay = exp(g), beta = 1.0 / (1.0 + exp(-b));
            double *Sh = S + (size_t)h * Dk * Dv;
            for (size_t i = 0; i < (size_t)Dk * Dv; i++)
                Sh[i] *= decay;
            for (int j = 0; j < Dv; j++) {
                kv[j] = 0;
                for (int d = 0; d < Dk; d++)
                    kv[j] += Sh[(size_t)d * Dv + j] * kn[d];
            }
            for (int j = 0; j < Dv; j++) {
                const double delta = ((double)v[j] - kv[j]) * beta;
                for (int d = 0; d < Dk; d++)
                    Sh[(size_t)d * Dv + j] += kn[d] * delta;
            }
            double *o = out + ((size_t)(t - t0) * c->Hv + h) * Dv;
            for (int j = 0; j < Dv; j++) {
                o[j] = 0;
                for (int d = 0; d < Dk; d++)
                    o[j] += Sh[(size_t)d * Dv + j] * qn[d];
            }
        }
    free(qn);
    free(kn);
    free(kv);
}

static void run_gdn(exo_pool *pool, const gdn_case *c, int t0, int t1, float *S, float *out)
{
    const float *row = c->x + (size_t)t0 * c->row, *gr = c->g + (size_t)t0 * c->ab;
    exo_cpu_gated_delta(pool, out, row, row + (size_t)c->Hk * c->Dk, c->row,
                        row + 2 * (size_t)c->Hk * c->Dk, c->row, gr + c->Hv, gr, c->ab, c->A_log,
                        c->dt_bias, S, t1 - t0, c->Hk, c->Hv, c->Dk, c->Dv);
}

/* Runs tokens [0, T) in the calls given by `pieces` (0-terminated; NULL:
 * one call), each with the path named in `paths` (cycled), from a random
 * state, against the naive rule. */
static void check_gdn(exo_pool *pool, int T, int Hk, int Hv, int Dk, int Dv, const int *pieces,
                      const char *const *paths)
{
    unsigned seed = (unsigned)(T * 131 + Hk * 17 + Hv * 5 + Dk * 3 + Dv);
    gdn_case c = make_case(T, Hk, Hv, Dk, Dv, seed);
    const size_t ns = (size_t)Hv * Dk * Dv, no = (size_t)T * Hv * Dv;
    float *S = exo_malloc(sizeof(float) * ns), *out = exo_calloc(no, sizeof(float));
    double *Sn = exo_malloc(sizeof(double) * ns), *on = exo_malloc(sizeof(double) * no);
    for (size_t i = 0; i < ns; i++)
        Sn[i] = S[i] = 0.3f * frand(&seed);
    naive_gdn(&c, 0, T, Sn, on);
    int t0 = 0;
    for (int p = 0; t0 < T; p++) {
        int n = pieces && pieces[p] ? pieces[p] : T - t0;
        n = n < T - t0 ? n : T - t0;
        int np = 0;
        while (paths[np])
            np++;
        setenv("EXO_GDN_PATH", paths[p % np], 1);
        run_gdn(pool, &c, t0, t0 + n, S, out + (size_t)t0 * Hv * Dv);
        t0 += n;
    }
    unsetenv("EXO_GDN_PATH");
    double eo = max_rel_err(out, on, no), es = max_rel_err(S, Sn, ns);
    cr_expect(eo < GDN_TOL && es < GDN_TOL,
              "gdn %s%s T %d Hk %d Hv %d Dk %d Dv %d: err out %.3g state %.3g", paths[0],
              paths[1] ? "+" : "", T, Hk, Hv, Dk, Dv, eo, es);
    exo_free(S);
    exo_free(out);
    exo_free(Sn);
    exo_free(on);
    free_case(&c);
}

static const char *const RECURRENT[] = {"recurrent", NULL};
static const char *const CHUNKED[] = {"chunked", NULL};
static const char *const AUTO[] = {"auto", NULL};
static const char *const MIXED[] = {"chunked", "recurrent", NULL};

static const int TS[] = {1, 5, 64, 65, 130, 200};

Test(linear_attn, gated_delta_recurrent_small)
{
    exo_pool *pool = exo_pool_create(2);
    for (size_t i = 0; i < sizeof TS / sizeof TS[0]; i++)
        check_gdn(pool, TS[i], 2, 4, 16, 16, NULL, RECURRENT);
    exo_pool_free(pool);
}

Test(linear_attn, gated_delta_chunked_small)
{
    exo_pool *pool = exo_pool_create(2);
    for (size_t i = 0; i < sizeof TS / sizeof TS[0]; i++)
        check_gdn(pool, TS[i], 2, 4, 16, 16, NULL, CHUNKED);
    exo_pool_free(pool);
}

/* Qwen3.5-35B-A3B's GDN shape (Hk 16, Hv 32, Dk = Dv = 128). */
Test(linear_attn, gated_delta_qwen35_shape)
{
    exo_pool *pool = exo_pool_create(2);
    static const int ts[] = {1, 5, 65};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        check_gdn(pool, ts[i], 16, 32, 128, 128, NULL, RECURRENT);
        check_gdn(pool, ts[i], 16, 32, 128, 128, NULL, CHUNKED);
    }
    exo_pool_free(pool);
}

/* Head sizes that are not multiples of 16 (scalar column tails, odd Dk),
 * one value head per key head, and fewer value heads than threads (heads
 * split into column blocks across the pool). */
Test(linear_attn, gated_delta_odd_shapes)
{
    exo_pool *pool = exo_pool_create(3);
    static const int ts[] = {1, 7, 70};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        check_gdn(pool, ts[i], 1, 3, 20, 24, NULL, RECURRENT);
        check_gdn(pool, ts[i], 1, 3, 20, 24, NULL, CHUNKED);
        check_gdn(pool, ts[i], 2, 2, 16, 40, NULL, RECURRENT);
        check_gdn(pool, ts[i], 2, 2, 16, 40, NULL, CHUNKED);
        check_gdn(pool, ts[i], 1, 1, 128, 128, NULL, RECURRENT);
        check_gdn(pool, ts[i], 1, 1, 128, 128, NULL, CHUNKED);
        check_gdn(pool, ts[i], 1, 2, 32, 8, NULL, RECURRENT);
        check_gdn(pool, ts[i], 1, 2, 32, 8, NULL, CHUNKED);
    }
    exo_pool_free(pool);
}

/* The state carries across calls: prefill pieces, then decode steps, the
 * forms alternating, and the default choice by T. */
Test(linear_attn, gated_delta_state_continuation)
{
    exo_pool *pool = exo_pool_create(2);
    static const int pieces[] = {1, 63, 66, 1, 1, 64, 3, 0};
    check_gdn(pool, 200, 2, 4, 16, 16, pieces, MIXED);
    check_gdn(pool, 200, 2, 4, 16, 16, pieces, RECURRENT);
    check_gdn(pool, 200, 2, 4, 16, 16, pieces, CHUNKED);
    static const int decode[] = {130, 1, 1, 1, 1, 1, 0};
    check_gdn(pool, 135, 16, 32, 128, 128, decode, MIXED);
    static const int big[] = {300, 1, 260, 0};
    check_gdn(pool, 561, 2, 4, 16, 16, big, AUTO);
    exo_pool_free(pool);
}

/* A single-threaded pool (NULL) takes the same code. */
Test(linear_attn, gated_delta_no_pool)
{
    check_gdn(NULL, 70, 2, 4, 16, 16, NULL, RECURRENT);
    check_gdn(NULL, 70, 2, 4, 16, 16, NULL, CHUNKED);
}

/* ---- gated RMSNorm ------------------------------------------------------ */

static void check_norm(exo_pool *pool, int T, int H, int D)
{
    unsigned seed = (unsigned)(T * 3 + H * 5 + D);
    const int zs = H * D + 9;
    const float eps = 1e-6f;
    float *x = exo_malloc(sizeof(float) * (size_t)T * H * D), *z = exo_malloc(sizeof(float) * (size_t)T * zs);
    float *w = exo_malloc(sizeof(float) * (size_t)D);
    double *want = exo_malloc(sizeof(double) * (size_t)T * H * D);
    for (size_t i = 0; i < (size_t)T * H * D; i++)
        x[i] = 3 * frand(&seed);
    for (size_t i = 0; i < (size_t)T * zs; i++)
        z[i] = 4 * frand(&seed);
    for (int i = 0; i < D; i++)
        w[i] = 1 + 0.5f * frand(&seed);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            const float *xr = x + ((size_t)t * H + h) * D;
            const float *zr = z + (size_t)t * zs + (size_t)h * D;
            double ss = 0;
            for (int i = 0; i < D; i++)
                ss += (double)xr[i] * xr[i];
            const double inv = 1.0 / sqrt(ss / D + eps);
            for (int i = 0; i < D; i++)
                want[((size_t)t * H + h) * D + i] =
                    xr[i] * inv * w[i] * (zr[i] / (1.0 + exp(-(double)zr[i])));
        }
    exo_cpu_rmsnorm_gated(pool, x, z, zs, w, T, H, D, eps);
    double e = max_rel_err(x, want, (size_t)T * H * D);
    cr_expect(e < NORM_TOL, "rmsnorm_gated T %d H %d D %d: err %g", T, H, D, e);
    exo_free(x);
    exo_free(z);
    exo_free(w);
    exo_free(want);
}

Test(linear_attn, rmsnorm_gated)
{
    exo_pool *pool = exo_pool_create(2);
    check_norm(pool, 3, 4, 16);
    check_norm(pool, 1, 32, 128);
    check_norm(pool, 5, 32, 128); /* threaded */
    check_norm(pool, 2, 3, 20);
    exo_pool_free(pool);
}

/* The AVX2 and baseline x86-64 builds of the kernels (the ISA is read once
 * per process, and Criterion runs each test in its own). */
static void all_kernels_small(void)
{
    exo_pool *pool = exo_pool_create(2);
    static const int mixed[] = {2, 1, 5, 3, 17, 1, 64, 100, 1000};
    check_conv(pool, 50, 100, 4, mixed);
    check_conv(pool, 3, 8192, 4, mixed);
    check_conv(pool, 20, 130, 7, mixed);
    static const int ts[] = {1, 5, 70};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        check_gdn(pool, ts[i], 16, 32, 128, 128, NULL, RECURRENT);
        check_gdn(pool, ts[i], 16, 32, 128, 128, NULL, CHUNKED);
        check_gdn(pool, ts[i], 1, 3, 20, 24, NULL, RECURRENT);
        check_gdn(pool, ts[i], 1, 3, 20, 24, NULL, CHUNKED);
    }
    check_norm(pool, 5, 32, 128);
    check_norm(pool, 2, 3, 20);
    exo_pool_free(pool);
}

Test(linear_attn, isa_avx2)
{
    setenv("EXO_CPU_ISA", "avx2", 1);
    all_kernels_small();
}

Test(linear_attn, isa_generic)
{
    setenv("EXO_CPU_ISA", "generic", 1);
    all_kernels_small();
}
