/* Every op of the backend vtable on the CUDA backend against the CPU
 * backend, with the same random inputs over many shapes, in the manner of
 * ggml's test-backend-ops.
 *
 * Design
 *  - Each test opens both backends with both_open(): the CUDA one first;
 *    where it cannot be created for want of a plugin, driver or GPU
 *    (EXO_EUNSUPPORTED) the test is skipped with the reason, any other
 *    failure fails it. Without a GPU the whole suite skips.
 *  - The CPU backend is the oracle. Its matrix products are pinned to the
 *    portable reference path (EXO_MATMUL_PATH=reference, unless the
 *    environment already names a path): that path accumulates in double,
 *    while the CPU's fast paths round activations to int8 (GEMV) or bf16
 *    (GEMM) and would blur the figure being measured, the CUDA kernels'
 *    error. Run with EXO_MATMUL_PATH=gemv or =gemm to measure against those.
 *  - A `dual` is one tensor on both backends: one host array of random
 *    values (a fixed seed per test) uploaded into each backend's own memory
 *    (ops->alloc, to_device). Outputs are prefilled with random values too,
 *    and every dual has GUARD canary floats past its end, so an op that
 *    writes into the gaps of a strided output shows up as a difference and
 *    one that writes past its output as a changed canary.
 *  - Weights are built on the host in every format of linear.h (dense
 *    f32/f16/bf16; MLX affine with 2..8 bits, groups of 32/64/128,
 *    f32/f16/bf16 scales and biases; MXFP4) and loaded into each backend
 *    with load_linear(from_file = false); vectors (norm weights, biases,
 *    sinks, inverse frequencies, router bias) with load_vector.
 *  - Outputs are compared by NMSE = sum (cuda - cpu)^2 / sum cpu^2. Each
 *    test prints the worst NMSE of each op it ran, beside its limit.
 *  - Ops that carry state across calls run a sequence of calls (prefill,
 *    decode steps, a later prefill): the KV caches' layouts differ between
 *    backends by design, so attention is compared on its outputs; the
 *    linear-attention state has one layout (backend.h), compared as well.
 *
 * Limits (NMSE), and why:
 *   0      data movement (zero, copy2d, gather_rows, load_vector, the conv
 *          state): nothing to round.
 *   1e-7   element-wise f32 ops, norms, RoPE, embedding rows, routing
 *          weights, scatter-add, the conv and the gated norm: a few f32 ulp
 *          an element (~1e-14 expected) from fma contraction, another
 *          reduction order or the device's libm; any wrong index, formula or
 *          missing element is orders of magnitude above it (ggml's default).
 *   1e-6   matmul by the GEMV kernels (T <= 4): f32 dequantization and
 *          accumulation against a double-accumulated oracle (~1e-13
 *          expected); a wrong group, scale, bit offset or row is far above.
 *   5e-4   matmul for T > 4, where the GPU rounds activations (and expanded
 *          weights) to bf16 for the tensor cores: 2^-9 relative an operand,
 *          ~1e-5 expected (the CPU's own bf16 GEMM path measures <= 7e-6
 *          against its reference path on these inputs); ggml's limit for
 *          mul_mat. matmul_each and head_matmul take the same two limits
 *          by T.
 *   1e-6   attention (f32 scores and softmax, reordered sums, an online
 *          softmax) and the gated delta rule's outputs and state (an f32
 *          recurrence over up to 64 tokens per call, and its chunked form
 *          reassociates: the CPU kernel is within 4e-6 max-relative of
 *          double, test_linear_attn.c).
 *   exact  moe_route's expert indices (both route on the host through
 *          engine/router.c).
 * Not covered: tables or caches past 2^31 bytes (64-bit offsets). */
#include "core/alloc.h"
#include "engine/backend.h"
#include "engine/cpu/ops.h"
#include "engine/dtype.h"
#include "engine/linear.h"
#include "engine/router.h"
#include "engine/sampler.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NMSE_EXACT 0.0
#define NMSE_ELEMENTWISE 1e-7
#define NMSE_GEMV 1e-6
#define NMSE_GEMM 5e-4
#define NMSE_ATTENTION 1e-6
#define NMSE_DELTA 1e-6

#define GEMV_MAX_T 16 /* the CUDA matmul's GEMV path takes T <= this (backend_cuda.cu products) */
#define GUARD 16     /* canary floats past the end of every dual */
#define MAX_N 16     /* weights in one matmul call */

/* ---- random numbers (xorshift64*, a seed per test) -------------------- */

static uint64_t rng_state = 1;

static uint64_t rng_u64(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}

static double rng_uniform(void) { return (double)(rng_u64() >> 11) * (1.0 / 9007199254740992.0); }

static int rng_int(int n) { return (int)(rng_u64() % (uint64_t)n); }

static float rng_gauss(void)
{
    double u = 1.0 - rng_uniform(), v = rng_uniform(); /* u in (0, 1] */
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* ---- worst NMSE per op, printed when a test closes --------------------- */

typedef struct op_stat {
    char op[40];
    double worst, limit;
    int cases, failed;
    bool nan;
} op_stat;

static op_stat stats[48];
static int n_stats;

/* Records one comparison and expects it within the limit (NaN fails). */
__attribute__((format(printf, 4, 5))) static void record(const char *op, double limit, double nmse,
                                                         const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    op_stat *s = NULL;
    for (int i = 0; i < n_stats && !s; i++)
        if (!strcmp(stats[i].op, op))
            s = &stats[i];
    if (!s && n_stats < (int)(sizeof stats / sizeof stats[0])) {
        s = &stats[n_stats++];
        memset(s, 0, sizeof *s);
        snprintf(s->op, sizeof s->op, "%s", op);
        s->limit = limit;
    }
    bool pass = nmse <= limit;
    if (s) {
        s->cases++;
        s->failed += !pass;
        s->nan |= isnan(nmse);
        if (nmse > s->worst)
            s->worst = nmse;
    }
    cr_expect(pass, "%s, %s: NMSE %.3e above %.0e", op, what, nmse, limit);
}

/* ---- both backends ---------------------------------------------------- */

typedef struct both {
    exo_backend *cpu, *gpu;
    const char *test;
} both;

/* Opens the CUDA backend (or skips the test) and the CPU oracle; seeds the
 * random numbers from the test's name. */
static both both_open(const char *test)
{
    both b = {.test = test};
    exo_err err = {0};
    b.gpu = exo_backend_cuda_create(0, &err);
    if (!b.gpu) {
        if (err.code == EXO_EUNSUPPORTED)
            cr_skip_test("needs the CUDA backend: %s", err.msg);
        cr_assert_fail("cannot create the CUDA backend: %s (%s)", err.msg, exo_err_name(err.code));
    }
    /* the CPU reads the variable when it is created: set it for that only */
    bool pin = !getenv("EXO_MATMUL_PATH");
    if (pin)
        setenv("EXO_MATMUL_PATH", "reference", 1);
    b.cpu = exo_backend_cpu_create(0, &err);
    if (pin)
        unsetenv("EXO_MATMUL_PATH");
    cr_assert(b.cpu, "cannot create the CPU backend: %s", err.msg);
    rng_state = 0x9E3779B97F4A7C15ull;
    for (const char *p = test; *p; p++)
        rng_state = (rng_state ^ (unsigned char)*p) * 0x100000001B3ull;
    n_stats = 0;
    return b;
}

static void both_close(both *b)
{
    for (int i = 0; i < n_stats; i++) {
        const op_stat *s = &stats[i];
        fprintf(stderr, "backend_ops/%s: %-30s worst NMSE %9.3e  limit %.0e  %4d cases%s%s\n", b->test,
                s->op, s->worst, s->limit, s->cases, s->nan ? "  NaN seen" : "",
                s->failed ? "  FAILED" : "");
    }
    b->gpu->ops->free(b->gpu);
    b->cpu->ops->free(b->cpu);
}

static void ok(exo_backend *be, int rc, const char *op)
{
    cr_assert_eq(rc, 0, "%s backend: %s returned %d (%s)", be->ops->name, op, rc, exo_err_name(rc));
}

/* Runs an op on one backend and asserts it returned 0:
 * ON(b->gpu, rope, x.gpu, ...) is b->gpu->ops->rope(b->gpu, x.gpu, ...). */
#define ON(be, op, ...) ok((be), (be)->ops->op((be), __VA_ARGS__), #op)

static float *be_alloc(exo_backend *be, size_t floats)
{
    float *p = be->ops->alloc(be, floats * sizeof(float));
    cr_assert(p, "%s backend: cannot allocate %zu floats", be->ops->name, floats);
    return p;
}

static void upload(exo_backend *be, float *dst, const float *src, size_t floats)
{
    ok(be, be->ops->to_device(be, dst, src, floats * sizeof(float)), "to_device");
}

static void download(exo_backend *be, float *dst, const float *src, size_t floats)
{
    ok(be, be->ops->to_host(be, dst, src, floats * sizeof(float)), "to_host");
}

/* ---- dual tensors: the same values on both backends --------------------- */

typedef struct dual {
    size_t n;
    float *init;      /* host: the values uploaded, n + GUARD */
    float *cpu, *gpu; /* each backend's memory, n + GUARD floats */
} dual;

static void dual_upload(both *b, dual *d)
{
    for (int i = 0; i < GUARD; i++)
        d->init[d->n + (size_t)i] = 1000.0f + (float)i;
    d->cpu = be_alloc(b->cpu, d->n + GUARD);
    d->gpu = be_alloc(b->gpu, d->n + GUARD);
    upload(b->cpu, d->cpu, d->init, d->n + GUARD);
    upload(b->gpu, d->gpu, d->init, d->n + GUARD);
}

/* n random values, N(0, scale^2). */
static dual dual_rand(both *b, size_t n, float scale)
{
    dual d = {.n = n, .init = exo_malloc((n + GUARD) * sizeof(float))};
    for (size_t i = 0; i < n; i++)
        d.init[i] = scale * rng_gauss();
    dual_upload(b, &d);
    return d;
}

static void dual_free(both *b, dual *d)
{
    b->cpu->ops->release(b->cpu, d->cpu);
    b->gpu->ops->release(b->gpu, d->gpu);
    exo_free(d->init);
    memset(d, 0, sizeof *d);
}

/* Copies the CPU's current values over the GPU's, so the next op starts
 * from identical inputs (isolating each op of a chain). */
static void dual_mirror(both *b, dual *d)
{
    float *h = exo_malloc(d->n * sizeof(float));
    download(b->cpu, h, d->cpu, d->n);
    upload(b->gpu, d->gpu, h, d->n);
    exo_free(h);
}

static double nmse(const float *got, const float *want, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)got[i] - (double)want[i];
        num += e * e;
        den += (double)want[i] * (double)want[i];
    }
    if (den == 0)
        return num == 0 ? 0 : INFINITY;
    return num / den;
}

/* Compares floats [off, off + len) of a dual, CUDA against CPU, under
 * `op`'s limit, and checks both backends left its canaries alone. */
__attribute__((format(printf, 7, 8))) static void dual_check_part(both *b, const dual *d, size_t off,
                                                                  size_t len, const char *op,
                                                                  double limit, const char *fmt, ...)
{
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    size_t all = d->n + GUARD;
    float *c = exo_malloc(all * sizeof(float)), *g = exo_malloc(all * sizeof(float));
    ok(b->gpu, b->gpu->ops->sync(b->gpu), "sync");
    download(b->cpu, c, d->cpu, all);
    download(b->gpu, g, d->gpu, all);
    cr_expect(!memcmp(g + d->n, d->init + d->n, GUARD * sizeof(float)),
              "%s, %s: the CUDA backend wrote past the end of its output", op, what);
    cr_expect(!memcmp(c + d->n, d->init + d->n, GUARD * sizeof(float)),
              "%s, %s: the CPU backend wrote past the end of its output", op, what);
    record(op, limit, nmse(g + off, c + off, len), "%s", what);
    exo_free(c);
    exo_free(g);
}

#define dual_check(b, d, op, limit, ...) dual_check_part((b), (d), 0, (d)->n, (op), (limit), __VA_ARGS__)

/* ---- vectors loaded with load_vector ------------------------------------ */

typedef struct dvec {
    float *cpu, *gpu;
} dvec;

/* Stores v as element i of an array of type t (F32, F16 or BF16). */
static void put(exo_dtype t, void *base, size_t i, float v)
{
    if (t == EXO_DTYPE_F32) {
        memcpy((char *)base + 4 * i, &v, 4);
    } else {
        uint16_t h = t == EXO_DTYPE_BF16 ? exo_f32_to_bf16(v) : exo_f32_to_f16(v);
        memcpy((char *)base + 2 * i, &h, 2);
    }
}

/* n values, stored as type t on the host, loaded into both backends. */
static dvec vec_load(both *b, exo_dtype t, const float *v, size_t n)
{
    void *host = exo_malloc(n * exo_dtype_size(t));
    for (size_t i = 0; i < n; i++)
        put(t, host, i, v[i]);
    exo_err err = {0};
    dvec d = {b->cpu->ops->load_vector(b->cpu, t, host, n, &err), NULL};
    cr_assert(d.cpu, "cpu load_vector: %s", err.msg);
    d.gpu = b->gpu->ops->load_vector(b->gpu, t, host, n, &err);
    cr_assert(d.gpu, "cuda load_vector: %s", err.msg);
    exo_free(host);
    return d;
}

/* n random values: mean + N(0, scale^2). */
static dvec vec_rand(both *b, exo_dtype t, size_t n, float mean, float scale)
{
    float *v = exo_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        v[i] = mean + scale * rng_gauss();
    dvec d = vec_load(b, t, v, n);
    exo_free(v);
    return d;
}

static void vec_free(both *b, dvec *v)
{
    b->cpu->ops->release(b->cpu, v->cpu);
    b->gpu->ops->release(b->gpu, v->gpu);
}

/* ---- weights ------------------------------------------------------------ */

typedef struct wfmt {
    exo_wformat format;
    exo_dtype dtype; /* dense: elements; affine: scales and biases */
    int bits, group;
} wfmt;

#define F_DENSE(t) ((wfmt){EXO_WFORMAT_DENSE, EXO_DTYPE_##t, 0, 0})
#define F_AFFINE(bits, g, t) ((wfmt){EXO_WFORMAT_AFFINE, EXO_DTYPE_##t, bits, g})
#define F_MXFP4 ((wfmt){EXO_WFORMAT_MXFP4, EXO_DTYPE_U8, 4, 32})

/* Every format of linear.h: 3 dense, 6 x 3 x 3 affine, MXFP4 (58). */
static int all_formats(wfmt *out)
{
    static const exo_dtype dts[3] = {EXO_DTYPE_F32, EXO_DTYPE_F16, EXO_DTYPE_BF16};
    static const int bits[6] = {2, 3, 4, 5, 6, 8}, groups[3] = {32, 64, 128};
    int n = 0;
    for (int i = 0; i < 3; i++)
        out[n++] = (wfmt){EXO_WFORMAT_DENSE, dts[i], 0, 0};
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 3; k++)
                out[n++] = (wfmt){EXO_WFORMAT_AFFINE, dts[k], bits[i], groups[j]};
    out[n++] = F_MXFP4;
    return n;
}
#define N_FORMATS 58

static const char *fmt_name(wfmt f, char *buf, size_t len)
{
    const char *dt = f.dtype == EXO_DTYPE_F32 ? "f32" : f.dtype == EXO_DTYPE_F16 ? "f16" : "bf16";
    if (f.format == EXO_WFORMAT_DENSE)
        snprintf(buf, len, "%s", dt);
    else if (f.format == EXO_WFORMAT_AFFINE)
        snprintf(buf, len, "q%d/g%d/%s", f.bits, f.group, dt);
    else
        snprintf(buf, len, "mxfp4");
    return buf;
}

static bool fmt_fits(wfmt f, int64_t cols)
{
    return f.format == EXO_WFORMAT_DENSE || cols % f.group == 0;
}

/* A host weight and each backend's copy of it. The host arrays outlive the
 * backends' use (the CPU uses them in place); the backends' copies live
 * until the backend is freed (the vtable has no unload). */
typedef struct weight {
    exo_linear host, cpu, gpu;
    void *w, *scales, *biases;
    char name[24];
} weight;

/* Random values of about unit output variance for unit inputs. */
static void weight_rand(both *b, weight *w, wfmt f, int64_t rows, int64_t cols)
{
    memset(w, 0, sizeof *w);
    fmt_name(f, w->name, sizeof w->name);
    cr_assert(fmt_fits(f, cols), "%s cannot have %lld columns", w->name, (long long)cols);
    exo_linear *l = &w->host;
    *l = (exo_linear){.format = f.format, .dtype = f.dtype, .rows = rows, .cols = cols, .bits = f.bits,
                      .group_size = f.group};
    size_t n = (size_t)(rows * cols);
    const float sd = 1.0f / sqrtf((float)cols);
    if (f.format == EXO_WFORMAT_DENSE) {
        w->w = exo_malloc(n * exo_dtype_size(f.dtype));
        for (size_t i = 0; i < n; i++)
            put(f.dtype, w->w, i, sd * rng_gauss());
    } else if (f.format == EXO_WFORMAT_AFFINE) {
        /* any bit pattern is valid codes; per group w = s*q + b with q
         * uniform in [0, 2^bits): b centres the group around a small mean */
        size_t words = n * (size_t)f.bits / 32, groups = n / (size_t)f.group;
        uint32_t *codes = exo_malloc(words * 4);
        for (size_t i = 0; i < words; i++)
            codes[i] = (uint32_t)(rng_u64() >> 32);
        w->scales = exo_malloc(groups * exo_dtype_size(f.dtype));
        w->biases = exo_malloc(groups * exo_dtype_size(f.dtype));
        const float levels = (float)((1 << f.bits) - 1);
        for (size_t g = 0; g < groups; g++) {
            float s = (float)(0.5 + rng_uniform()) * 3.4f * sd / levels * (rng_u64() & 1 ? 1.0f : -1.0f);
            put(f.dtype, w->scales, g, s);
            put(f.dtype, w->biases, g, -s * levels / 2 + 0.2f * sd * rng_gauss());
        }
        w->w = codes;
    } else {
        /* random E2M1 codes; E8M0 scales 2^-9 .. 2^-4 */
        uint8_t *codes = exo_malloc(n / 2), *sc = exo_malloc(n / 32);
        for (size_t i = 0; i < n / 2; i++)
            codes[i] = (uint8_t)rng_u64();
        for (size_t i = 0; i < n / 32; i++)
            sc[i] = (uint8_t)(118 + rng_int(6));
        w->w = codes;
        w->scales = sc;
    }
    l->w = w->w;
    l->scales = w->scales;
    l->biases = w->biases;
    exo_err err = {0};
    int rc = b->cpu->ops->load_linear(b->cpu, l, false, &w->cpu, &err);
    cr_assert_eq(rc, 0, "cpu load_linear %s (%lld x %lld): %s", w->name, (long long)rows, (long long)cols, err.msg);
    rc = b->gpu->ops->load_linear(b->gpu, l, false, &w->gpu, &err);
    cr_assert_eq(rc, 0, "cuda load_linear %s (%lld x %lld): %s", w->name, (long long)rows, (long long)cols, err.msg);
}

static void weight_free(weight *w)
{
    exo_free(w->w);
    exo_free(w->scales);
    exo_free(w->biases);
}

static const char *matmul_op(const char *op, int T, char *buf, size_t len)
{
    snprintf(buf, len, "%s %s", op, T <= GEMV_MAX_T ? "gemv (T<=16)" : "gemm (T>16)");
    return buf;
}

static double matmul_limit(int T) { return T <= GEMV_MAX_T ? NMSE_GEMV : NMSE_GEMM; }

/* ---- load_vector, embed -------------------------------------------------- */

Test(backend_ops, load_vector)
{
    both b = both_open("load_vector");
    static const exo_dtype dts[3] = {EXO_DTYPE_F32, EXO_DTYPE_F16, EXO_DTYPE_BF16};
    static const size_t lens[3] = {1, 7, 5000};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) {
            size_t n = lens[j];
            dvec v = vec_rand(&b, dts[i], n, 0.0f, 3.0f);
            float *c = exo_malloc(n * sizeof(float)), *g = exo_malloc(n * sizeof(float));
            download(b.cpu, c, v.cpu, n);
            download(b.gpu, g, v.gpu, n);
            record("load_vector", NMSE_EXACT, nmse(g, c, n), "%s n %zu", exo_dtype_name(dts[i]), n);
            exo_free(c);
            exo_free(g);
            vec_free(&b, &v);
        }
    both_close(&b);
}

/* Embedding rows of a table in every format; tokens with repeats, the
 * first and the last row. */
Test(backend_ops, embed)
{
    both b = both_open("embed");
    wfmt fmts[N_FORMATS];
    int nf = all_formats(fmts);
    static const int Ts[3] = {1, 9, 64};
    const int vocab = 300, cols = 256;
    for (int f = 0; f < nf; f++) {
        weight table;
        weight_rand(&b, &table, fmts[f], vocab, cols);
        for (int i = 0; i < 3; i++) {
            int T = Ts[i];
            int32_t tokens[64];
            for (int t = 0; t < T; t++)
                tokens[t] = t == 0 ? vocab - 1 : t == T - 1 ? 0 : t % 5 == 0 ? tokens[t - 1] : rng_int(vocab);
            dual out = dual_rand(&b, (size_t)T * cols, 1.0f);
            ON(b.cpu, embed, &table.cpu, tokens, T, out.cpu);
            ON(b.gpu, embed, &table.gpu, tokens, T, out.gpu);
            dual_check(&b, &out, "embed", NMSE_ELEMENTWISE, "%s T %d", table.name, T);
            dual_free(&b, &out);
        }
        weight_free(&table);
    }
    both_close(&b);
}

/* ---- rmsnorm, add_bias -------------------------------------------------- */

Test(backend_ops, rmsnorm)
{
    both b = both_open("rmsnorm");
    /* rows, dim, eps, in place: hidden states, per-head q/k norms (T*H
     * rows), MLA's latent norms, gpt-oss's width */
    static const struct {
        int rows, dim;
        float eps;
        bool in_place;
    } cases[] = {
        {1, 64, 1e-6f, false},   {7, 896, 1e-6f, false},  {64, 4096, 1e-5f, false}, {512, 128, 1e-6f, true},
        {3, 5120, 1e-6f, true},  {1, 2880, 1e-5f, true},  {17, 1536, 1e-6f, false}, {64, 512, 1e-6f, true},
        {40, 256, 1e-6f, false}, {1, 7168, 1e-6f, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rows = cases[i].rows, dim = cases[i].dim;
        dvec w = vec_rand(&b, EXO_DTYPE_BF16, (size_t)dim, 1.0f, 0.2f);
        dual x = dual_rand(&b, (size_t)rows * dim, 2.0f);
        if (cases[i].in_place) {
            ON(b.cpu, rmsnorm, x.cpu, x.cpu, w.cpu, rows, dim, cases[i].eps);
            ON(b.gpu, rmsnorm, x.gpu, x.gpu, w.gpu, rows, dim, cases[i].eps);
            dual_check(&b, &x, "rmsnorm", NMSE_ELEMENTWISE, "%d x %d in place", rows, dim);
        } else {
            dual out = dual_rand(&b, (size_t)rows * dim, 1.0f);
            ON(b.cpu, rmsnorm, out.cpu, x.cpu, w.cpu, rows, dim, cases[i].eps);
            ON(b.gpu, rmsnorm, out.gpu, x.gpu, w.gpu, rows, dim, cases[i].eps);
            dual_check(&b, &out, "rmsnorm", NMSE_ELEMENTWISE, "%d x %d", rows, dim);
            dual_check(&b, &x, "rmsnorm input untouched", NMSE_EXACT, "%d x %d", rows, dim);
            dual_free(&b, &out);
        }
        dual_free(&b, &x);
        vec_free(&b, &w);
    }
    both_close(&b);
}

Test(backend_ops, add_bias)
{
    both b = both_open("add_bias");
    static const int shapes[][2] = {{1, 64}, {5, 1000}, {64, 4096}, {17, 2880}, {3, 1}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int T = shapes[i][0], dim = shapes[i][1];
        dvec bias = vec_rand(&b, EXO_DTYPE_BF16, (size_t)dim, 0.0f, 1.0f);
        dual y = dual_rand(&b, (size_t)T * dim, 1.0f);
        ON(b.cpu, add_bias, y.cpu, bias.cpu, T, dim);
        ON(b.gpu, add_bias, y.gpu, bias.gpu, T, dim);
        dual_check(&b, &y, "add_bias", NMSE_ELEMENTWISE, "T %d dim %d", T, dim);
        dual_free(&b, &y);
        vec_free(&b, &bias);
    }
    both_close(&b);
}

/* ---- matrix products ------------------------------------------------------ */

/* One matmul call: n weights sharing x (T rows), on both backends; checks
 * every output under the limit of the path T takes. */
static void matmul_case(both *b, int n, weight *const *w, int T, const char *what)
{
    const int64_t cols = w[0]->host.cols;
    dual x = dual_rand(b, (size_t)T * (size_t)cols, 1.0f), y[MAX_N];
    const exo_linear *wc[MAX_N] = {0}, *wg[MAX_N] = {0};
    float *yc[MAX_N] = {0}, *yg[MAX_N] = {0};
    for (int i = 0; i < n; i++) {
        y[i] = dual_rand(b, (size_t)T * (size_t)w[i]->host.rows, 1.0f);
        wc[i] = &w[i]->cpu;
        wg[i] = &w[i]->gpu;
        yc[i] = y[i].cpu;
        yg[i] = y[i].gpu;
    }
    ON(b->cpu, matmul, n, wc, x.cpu, T, yc);
    ON(b->gpu, matmul, n, wg, x.gpu, T, yg);
    char op[48];
    for (int i = 0; i < n; i++) {
        dual_check(b, &y[i], matmul_op("matmul", T, op, sizeof op), matmul_limit(T),
                   "%s: w[%d] %s %lld x %lld, n %d, T %d", what, i, w[i]->name, (long long)w[i]->host.rows,
                   (long long)cols, n, T);
        dual_free(b, &y[i]);
    }
    dual_free(b, &x);
}

static const int MATMUL_T[] = {1, 2, 3, 4, 5, 8, 13, 16, 17, 64};
#define N_MATMUL_T ((int)(sizeof MATMUL_T / sizeof MATMUL_T[0]))

/* For each format that fits each shape: 4 weights of (rows, cols), (3/4
 * rows, cols), ... (q/k/v-like), and every T, with n = 1..4 of them per
 * call (n cycles with the format and T, so every (n, T) pair is met). */
static void matmul_formats(both *b, const wfmt *fmts, int nf, const int (*shapes)[2], int ns)
{
    for (int s = 0; s < ns; s++)
        for (int f = 0; f < nf; f++) {
            int rows = shapes[s][0], cols = shapes[s][1];
            if (!fmt_fits(fmts[f], cols))
                continue;
            weight w[4];
            weight *pw[4];
            for (int i = 0; i < 4; i++) {
                weight_rand(b, &w[i], fmts[f], rows - i * (rows / 4), cols);
                pw[i] = &w[i];
            }
            for (int t = 0; t < N_MATMUL_T; t++)
                matmul_case(b, 1 + (f + t + s) % 4, pw, MATMUL_T[t], "shared x");
            for (int i = 0; i < 4; i++)
                weight_free(&w[i]);
        }
}

Test(backend_ops, matmul_every_format)
{
    both b = both_open("matmul_every_format");
    wfmt fmts[N_FORMATS];
    int nf = all_formats(fmts);
    static const int shapes[][2] = {{64, 64}, {96, 128}, {200, 320}};
    matmul_formats(&b, fmts, nf, shapes, 3);
    both_close(&b);
}

/* matmul_fused against the parts on the CPU: y = rmsnorm(x, norm) W^T and
 * y += x W^T, for the formats whose GEMV folds the norm into quantizing x
 * (q4, q8) and one that takes the rmsnorm kernel first (bf16), at decode
 * and prompt sizes. */
Test(backend_ops, matmul_fused)
{
    both b = both_open("matmul_fused");
    const wfmt fmts[] = {F_AFFINE(4, 64, BF16), F_AFFINE(8, 64, BF16), F_DENSE(BF16), F_AFFINE(3, 128, F32)};
    static const int Ts[] = {1, 2, 4, 9, 16};
    const int rows = 384, cols = 1024;
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++)
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            int T = Ts[ti];
            weight w[2];
            const exo_linear *wc[2], *wg[2];
            for (int i = 0; i < 2; i++) {
                weight_rand(&b, &w[i], fmts[f], rows - 64 * i, cols);
                wc[i] = &w[i].cpu;
                wg[i] = &w[i].gpu;
            }
            dvec norm = vec_rand(&b, EXO_DTYPE_BF16, (size_t)cols, 1.0f, 0.2f);
            dual x = dual_rand(&b, (size_t)T * cols, 2.0f), y[2];
            float *yc[2], *yg[2];
            for (int i = 0; i < 2; i++) {
                y[i] = dual_rand(&b, (size_t)T * (size_t)(rows - 64 * i), 1.0f);
                yc[i] = y[i].cpu;
                yg[i] = y[i].gpu;
            }
            /* normed products, stored */
            float *h = b.cpu->ops->alloc(b.cpu, sizeof(float) * (size_t)T * cols);
            ON(b.cpu, rmsnorm, h, x.cpu, norm.cpu, T, cols, 1e-6f);
            ON(b.cpu, matmul, 2, wc, h, T, yc);
            ON(b.gpu, matmul_fused, 2, wg, x.gpu, norm.gpu, 1e-6f, false, T, yg);
            char op[48];
            for (int i = 0; i < 2; i++)
                dual_check(&b, &y[i], matmul_op("fused norm + matmul", T, op, sizeof op), matmul_limit(T),
                           "%s T %d w[%d]", w[0].name, T, i);
            /* plain products added to what y holds */
            dual r = dual_rand(&b, (size_t)T * rows, 1.0f);
            float *p = b.cpu->ops->alloc(b.cpu, sizeof(float) * (size_t)T * rows);
            float *pc[1] = {p}, *rg[1] = {r.gpu};
            ON(b.cpu, matmul, 1, wc, x.cpu, T, pc);
            ON(b.cpu, add, r.cpu, p, (size_t)T * rows);
            ON(b.gpu, matmul_fused, 1, wg, x.gpu, NULL, 0.0f, true, T, rg);
            dual_check(&b, &r, matmul_op("fused matmul + add", T, op, sizeof op), matmul_limit(T), "%s T %d",
                       w[0].name, T);
            b.cpu->ops->release(b.cpu, h);
            b.cpu->ops->release(b.cpu, p);
            dual_free(&b, &r);
            for (int i = 0; i < 2; i++) {
                dual_free(&b, &y[i]);
                weight_free(&w[i]);
            }
            dual_free(&b, &x);
            vec_free(&b, &norm);
        }
    both_close(&b);
}

/* matmul_glu against glu then matmul on the CPU, added to what y holds,
 * for each activation, two weights each with its own g, u and y: q4 and
 * q8 apply it as they quantize x, bf16 (and the prompt sizes) take the
 * glu kernel first. */
Test(backend_ops, matmul_glu)
{
    both b = both_open("matmul_glu");
    if (!b.gpu->ops->matmul_glu)
        cr_skip_test("the backend under test folds no activation into its products");
    const wfmt fmts[] = {F_AFFINE(4, 64, BF16), F_AFFINE(8, 64, BF16), F_DENSE(BF16)};
    static const int Ts[] = {1, 3, 8, 16, 20};
    static const exo_glu_kind kinds[] = {EXO_GLU_SILU, EXO_GLU_GELU_TANH, EXO_GLU_OAI};
    enum { N = 2 };
    const int rows[N] = {256, 96}, cols = 1536;
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++)
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++)
            for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
                int T = Ts[ti];
                weight w[N];
                dual g[N], u[N], y[N];
                const exo_linear *wg[N];
                float *gg[N], *yg[N];
                const float *ug[N];
                for (int i = 0; i < N; i++) {
                    weight_rand(&b, &w[i], fmts[f], rows[i], cols);
                    g[i] = dual_rand(&b, (size_t)T * cols, 3.0f);
                    u[i] = dual_rand(&b, (size_t)T * cols, 3.0f);
                    y[i] = dual_rand(&b, (size_t)T * rows[i], 1.0f);
                    wg[i] = &w[i].gpu;
                    gg[i] = g[i].gpu;
                    ug[i] = u[i].gpu;
                    yg[i] = y[i].gpu;
                    const exo_linear *wc[1] = {&w[i].cpu};
                    float *p = b.cpu->ops->alloc(b.cpu, sizeof(float) * (size_t)T * rows[i]);
                    float *pc[1] = {p};
                    ON(b.cpu, glu, kinds[k], g[i].cpu, u[i].cpu, (size_t)T * cols, 1.5f);
                    ON(b.cpu, matmul, 1, wc, g[i].cpu, T, pc);
                    ON(b.cpu, add, y[i].cpu, p, (size_t)T * rows[i]);
                    b.cpu->ops->release(b.cpu, p);
                }
                ON(b.gpu, matmul_glu, N, wg, kinds[k], gg, ug, 1.5f, true, T, yg);
                for (int i = 0; i < N; i++) {
                    char op[48];
                    dual_check(&b, &y[i], matmul_op("glu + matmul + add", T, op, sizeof op), matmul_limit(T),
                               "%s weight %d T %d kind %d", w[i].name, i, T, (int)kinds[k]);
                    dual_free(&b, &y[i]);
                    dual_free(&b, &u[i]);
                    dual_free(&b, &g[i]);
                    weight_free(&w[i]);
                }
            }
    both_close(&b);
}

/* A weight's output bias (exo_linear.out_bias: q/k/v/o of Qwen2 and
 * gpt-oss, gpt-oss's router), added by the products themselves: the GPU's
 * matmul (GEMV at 1-16 rows, in its last write; cuBLAS past them) and its
 * matmul_fused into a residual, and the CPU's matmul (exactly), against the
 * product without the bias followed by add_bias on the CPU. */
Test(backend_ops, matmul_out_bias)
{
    both b = both_open("matmul_out_bias");
    const wfmt fmts[] = {F_AFFINE(4, 64, BF16), F_AFFINE(8, 32, F16), F_DENSE(BF16), F_MXFP4};
    static const int Ts[] = {1, 3, 8, 20, 64};
    const int rows = 256, cols = 512;
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++)
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            int T = Ts[ti];
            weight w;
            weight_rand(&b, &w, fmts[f], rows, cols);
            dvec bias = vec_rand(&b, EXO_DTYPE_F32, (size_t)rows, 0.0f, 1.0f);
            dual x = dual_rand(&b, (size_t)T * cols, 1.0f), y = dual_rand(&b, (size_t)T * rows, 1.0f);
            dual r = dual_rand(&b, (size_t)T * rows, 1.0f); /* a residual stream */
            float *want = b.cpu->ops->alloc(b.cpu, sizeof(float) * (size_t)T * rows);
            const exo_linear *plain[1] = {&w.cpu};
            float *wo[1] = {want};
            ON(b.cpu, matmul, 1, plain, x.cpu, T, wo);
            ON(b.cpu, add_bias, want, bias.cpu, T, rows);
            exo_linear cb = w.cpu, gb = w.gpu;
            cb.out_bias = bias.cpu;
            gb.out_bias = bias.gpu;
            const exo_linear *wc[1] = {&cb}, *wg[1] = {&gb};
            float *got = b.cpu->ops->alloc(b.cpu, sizeof(float) * (size_t)T * rows), *go[1] = {got};
            ON(b.cpu, matmul, 1, wc, x.cpu, T, go);
            cr_expect(!memcmp(got, want, sizeof(float) * (size_t)T * rows), "CPU %s T %d: the bias not as add_bias",
                      w.name, T);
            memcpy(y.cpu, want, sizeof(float) * (size_t)T * rows);
            float *yg[1] = {y.gpu};
            ON(b.gpu, matmul, 1, wg, x.gpu, T, yg);
            char op[48];
            dual_check(&b, &y, matmul_op("matmul + bias", T, op, sizeof op), matmul_limit(T), "%s T %d", w.name, T);
            if (b.gpu->ops->matmul_fused) {
                ON(b.cpu, add, r.cpu, want, (size_t)T * rows);
                float *rg[1] = {r.gpu};
                ON(b.gpu, matmul_fused, 1, wg, x.gpu, NULL, 0.0f, true, T, rg);
                dual_check(&b, &r, matmul_op("residual += matmul + bias", T, op, sizeof op), matmul_limit(T),
                           "%s T %d", w.name, T);
            }
            b.cpu->ops->release(b.cpu, want);
            b.cpu->ops->release(b.cpu, got);
            dual_free(&b, &r);
            dual_free(&b, &y);
            dual_free(&b, &x);
            vec_free(&b, &bias);
            weight_free(&w);
        }
    both_close(&b);
}

/* Model-sized shapes for a few formats: dense, the common MLX layouts, one
 * odd bit width with a wide group, MXFP4. */
Test(backend_ops, matmul_large_shapes)
{
    both b = both_open("matmul_large_shapes");
    const wfmt fmts[] = {F_DENSE(F32),         F_DENSE(F16),         F_DENSE(BF16),
                         F_AFFINE(4, 64, BF16), F_AFFINE(8, 32, F16), F_AFFINE(3, 128, F32),
                         F_AFFINE(6, 64, BF16), F_AFFINE(2, 128, BF16), F_MXFP4};
    static const int shapes[][2] = {{4096, 512}, {1000, 1024}};
    matmul_formats(&b, fmts, (int)(sizeof fmts / sizeof fmts[0]), shapes, 2);
    both_close(&b);
}

/* Calls whose weights have very few rows beside wide ones: Qwen3.5's
 * Gated DeltaNet projections (qkv, z, then b and a with one row per value
 * head) and a router of a few experts, at the tiny fixtures' widths. */
Test(backend_ops, matmul_few_rows)
{
    both b = both_open("matmul_few_rows");
    const wfmt fmts[] = {F_AFFINE(4, 64, BF16), F_AFFINE(8, 64, BF16), F_AFFINE(4, 32, F16), F_DENSE(BF16)};
    static const int rows[][4] = {{256, 128, 4, 4}, {1, 2, 3, 5}, {7, 9, 4, 1}};
    static const int cols[] = {128, 64, 256};
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++)
        for (size_t s = 0; s < sizeof rows / sizeof rows[0]; s++)
            for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++) {
                if (!fmt_fits(fmts[f], cols[c]))
                    continue;
                weight w[4];
                weight *pw[4];
                for (int i = 0; i < 4; i++) {
                    weight_rand(&b, &w[i], fmts[f], rows[s][i], cols[c]);
                    pw[i] = &w[i];
                }
                for (int t = 0; t < N_MATMUL_T; t++)
                    matmul_case(&b, 4, pw, MATMUL_T[t], "few rows");
                for (int i = 0; i < 4; i++)
                    weight_free(&w[i]);
            }
    both_close(&b);
}

/* On the GPU, a row's product is the same bits at every launch width
 * (batched decode gives each sequence what it gets alone): 16, 8, 4, 3 and
 * 2 rows of x in one call against each row alone. Launches of 8 and 16
 * rows of affine 4-bit weights, and of 16 of 8-bit, take the tensor-core
 * kernel, which must add its sums in the one-row dp4a kernel's order: rows
 * split over 1, 2 and 4 warps (k_split), a row's last chunk of steps
 * partial (320 columns), a last block of rows partial (1000, 300, 200
 * rows), groups of 32 and 64, scales in bf16, f16 and f32; and the other
 * formats. */
Test(backend_ops, matmul_rows_same_bits_at_every_width)
{
    both b = both_open("matmul_rows_same_bits_at_every_width");
    const wfmt fmts[] = {F_AFFINE(4, 64, BF16), F_AFFINE(8, 64, BF16), F_AFFINE(8, 32, F16), F_AFFINE(4, 32, F32),
                         F_MXFP4, F_DENSE(BF16)};
    static const int shapes[][2] = {{1000, 1024}, {96, 128}, {300, 4096}, {64, 14336}, {200, 320}};
    static const int widths[] = {16, 8, 4, 3, 2};
    const int T = 16;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
            const int rows = shapes[s][0], cols = shapes[s][1];
            weight w;
            weight_rand(&b, &w, fmts[f], rows, cols);
            dual x = dual_rand(&b, (size_t)T * (size_t)cols, 1.0f);
            float *y = be_alloc(b.gpu, (size_t)T * (size_t)rows);
            float *alone = exo_malloc(sizeof(float) * (size_t)T * (size_t)rows);
            float *got = exo_malloc(sizeof(float) * (size_t)T * (size_t)rows);
            const exo_linear *wg[1] = {&w.gpu};
            for (int t = 0; t < T; t++) {
                const float *xt = x.gpu + (size_t)t * (size_t)cols;
                float *yt = y + (size_t)t * (size_t)rows;
                ON(b.gpu, matmul, 1, wg, xt, 1, &yt);
            }
            download(b.gpu, alone, y, (size_t)T * (size_t)rows);
            for (size_t k = 0; k < sizeof widths / sizeof widths[0]; k++) {
                const int wd = widths[k];
                for (int t0 = 0; t0 + wd <= T; t0 += wd) {
                    const float *xt = x.gpu + (size_t)t0 * (size_t)cols;
                    float *yt = y + (size_t)t0 * (size_t)rows;
                    ON(b.gpu, matmul, 1, wg, xt, wd, &yt);
                }
                download(b.gpu, got, y, (size_t)(T / wd * wd) * (size_t)rows);
                cr_expect(!memcmp(got, alone, sizeof(float) * (size_t)(T / wd * wd) * (size_t)rows),
                          "%s %d x %d: rows in launches of %d differ from each row alone", w.name, rows, cols, wd);
            }
            exo_free(alone);
            exo_free(got);
            b.gpu->ops->release(b.gpu, y);
            dual_free(&b, &x);
            weight_free(&w);
        }
    both_close(&b);
}

/* The same for the products that norm or activate x as they quantize it
 * (matmul_fused with a norm, matmul_glu): the kernel that norms (or
 * activates) and quantizes x takes each row alone, so a row in a launch
 * of 8, 4 or 2 is the same bits as the row alone. */
Test(backend_ops, fused_rows_same_bits_at_every_width)
{
    both b = both_open("fused_rows_same_bits_at_every_width");
    if (!b.gpu->ops->matmul_fused || !b.gpu->ops->matmul_glu)
        cr_skip_test("the backend under test folds nothing into its products");
    const wfmt fmts[] = {F_AFFINE(4, 64, BF16), F_AFFINE(8, 64, BF16), F_MXFP4};
    static const int shapes[][2] = {{1000, 1024}, {256, 2048}, {64, 3072}};
    static const int widths[] = {8, 4, 2};
    const int T = 8;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
            const int rows = shapes[s][0], cols = shapes[s][1];
            weight w;
            weight_rand(&b, &w, fmts[f], rows, cols);
            dvec norm = vec_rand(&b, EXO_DTYPE_BF16, (size_t)cols, 1.0f, 0.2f);
            dual x = dual_rand(&b, (size_t)T * (size_t)cols, 2.0f), u = dual_rand(&b, (size_t)T * (size_t)cols, 2.0f);
            float *y = be_alloc(b.gpu, (size_t)T * (size_t)rows);
            float *alone = exo_malloc(sizeof(float) * (size_t)T * (size_t)rows);
            float *got = exo_malloc(sizeof(float) * (size_t)T * (size_t)rows);
            const exo_linear *wg[1] = {&w.gpu};
            for (int glu = 0; glu < 2; glu++) {
                const char *what = glu ? "activated" : "normed";
                for (int k = -1; k < (int)(sizeof widths / sizeof widths[0]); k++) {
                    const int wd = k < 0 ? 1 : widths[k];
                    upload(b.gpu, x.gpu, x.init, x.n); /* matmul_glu may leave act(g) * u in g */
                    for (int t0 = 0; t0 + wd <= T; t0 += wd) {
                        float *xt = x.gpu + (size_t)t0 * (size_t)cols, *yt = y + (size_t)t0 * (size_t)rows;
                        float *const xg[1] = {xt};
                        const float *const ut[1] = {u.gpu + (size_t)t0 * (size_t)cols};
                        if (glu)
                            ON(b.gpu, matmul_glu, 1, wg, EXO_GLU_SILU, xg, ut, 0.0f, false, wd, &yt);
                        else
                            ON(b.gpu, matmul_fused, 1, wg, xt, norm.gpu, 1e-5f, false, wd, &yt);
                    }
                    download(b.gpu, k < 0 ? alone : got, y, (size_t)T * (size_t)rows);
                    if (k >= 0)
                        cr_expect(!memcmp(got, alone, sizeof(float) * (size_t)T * (size_t)rows),
                                  "%s %d x %d, %s: rows in launches of %d differ from each row alone", w.name, rows,
                                  cols, what, wd);
                }
            }
            exo_free(alone);
            exo_free(got);
            b.gpu->ops->release(b.gpu, y);
            dual_free(&b, &u);
            dual_free(&b, &x);
            vec_free(&b, &norm);
            weight_free(&w);
        }
    both_close(&b);
}

/* One call over weights of different formats (MLX mixed quantization, a
 * quantized model's unquantized router or shared expert). */
Test(backend_ops, matmul_mixed_formats)
{
    both b = both_open("matmul_mixed_formats");
    const wfmt fmts[] = {F_AFFINE(4, 64, BF16), F_DENSE(BF16), F_MXFP4, F_AFFINE(8, 32, F16), F_DENSE(F32),
                         F_AFFINE(5, 128, F32)};
    enum { NW = sizeof fmts / sizeof fmts[0] };
    weight w[NW];
    weight *pw[NW];
    for (int i = 0; i < NW; i++) {
        weight_rand(&b, &w[i], fmts[i], 160 - 16 * i, 256);
        pw[i] = &w[i];
    }
    for (int t = 0; t < N_MATMUL_T; t++)
        matmul_case(&b, NW, pw, MATMUL_T[t], "mixed formats");
    for (int i = 0; i < NW; i++)
        weight_free(&w[i]);
    both_close(&b);
}

/* matmul_each: every weight its own input (a token's experts' down
 * projections, plus a shared expert). */
static void matmul_each_case(both *b, int n, weight *const *w, int T, const char *what)
{
    const int64_t cols = w[0]->host.cols;
    dual x[MAX_N], y[MAX_N];
    const exo_linear *wc[MAX_N] = {0}, *wg[MAX_N] = {0};
    const float *xc[MAX_N] = {0}, *xg[MAX_N] = {0};
    float *yc[MAX_N] = {0}, *yg[MAX_N] = {0};
    for (int i = 0; i < n; i++) {
        x[i] = dual_rand(b, (size_t)T * (size_t)cols, 1.0f);
        y[i] = dual_rand(b, (size_t)T * (size_t)w[i]->host.rows, 1.0f);
        wc[i] = &w[i]->cpu;
        wg[i] = &w[i]->gpu;
        xc[i] = x[i].cpu;
        xg[i] = x[i].gpu;
        yc[i] = y[i].cpu;
        yg[i] = y[i].gpu;
    }
    ON(b->cpu, matmul_each, n, wc, xc, T, yc);
    ON(b->gpu, matmul_each, n, wg, xg, T, yg);
    char op[48];
    for (int i = 0; i < n; i++) {
        dual_check(b, &y[i], matmul_op("matmul_each", T, op, sizeof op), matmul_limit(T),
                   "%s: w[%d] %s %lld x %lld, n %d, T %d", what, i, w[i]->name, (long long)w[i]->host.rows,
                   (long long)cols, n, T);
        dual_free(b, &y[i]);
        dual_free(b, &x[i]);
    }
}

Test(backend_ops, matmul_each)
{
    both b = both_open("matmul_each");
    const wfmt fmts[] = {F_DENSE(BF16), F_DENSE(F32), F_AFFINE(4, 64, BF16), F_AFFINE(8, 32, F16), F_MXFP4};
    static const int shapes[][2] = {{256, 512}, {96, 128}};
    static const int ns[] = {1, 2, 4, 9};
    static const int Ts[] = {1, 2, 4, 5, 17};
    for (int s = 0; s < 2; s++)
        for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
            weight w[9];
            weight *pw[9];
            for (int i = 0; i < 9; i++) {
                weight_rand(&b, &w[i], fmts[f], shapes[s][0], shapes[s][1]);
                pw[i] = &w[i];
            }
            for (int i = 0; i < 4; i++)
                for (int t = 0; t < 5; t++)
                    matmul_each_case(&b, ns[i], pw, Ts[t], "own x");
            for (int i = 0; i < 9; i++)
                weight_free(&w[i]);
        }
    /* 8 quantized experts and an unquantized shared expert in one call */
    weight w[9];
    weight *pw[9];
    for (int i = 0; i < 9; i++) {
        weight_rand(&b, &w[i], i < 8 ? F_AFFINE(4, 64, BF16) : F_DENSE(BF16), 256, 512);
        pw[i] = &w[i];
    }
    for (int t = 0; t < 5; t++)
        matmul_each_case(&b, 9, pw, Ts[t], "experts + shared");
    for (int i = 0; i < 9; i++)
        weight_free(&w[i]);
    both_close(&b);
}

/* head_matmul: H weights, x and y strided views (latent attention:
 * y = mqa + dr at (W, H*W), x = q + dr at (dr+dn, H*(dr+dn))). */
Test(backend_ops, head_matmul)
{
    both b = both_open("head_matmul");
    const wfmt fmts[] = {F_DENSE(BF16), F_DENSE(F32), F_AFFINE(4, 64, BF16), F_AFFINE(8, 64, F16)};
    static const struct {
        int H, rows, cols, x_pad, y_pad;
    } shapes[] = {
        {8, 128, 64, 32, 64},   /* absorb: W_UK^T, dn -> r (small) */
        {16, 64, 128, 64, 32},  /* unabsorb: W_UV, r -> dv (small) */
        {4, 512, 128, 64, 64},  /* DeepSeek's absorb per head: dn 128 -> r 512 */
    };
    static const int Ts[] = {1, 2, 5, 17};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
            const int H = shapes[s].H, rows = shapes[s].rows, cols = shapes[s].cols;
            weight w[16];
            exo_linear wc[16], wg[16];
            for (int h = 0; h < H; h++) {
                weight_rand(&b, &w[h], fmts[f], rows, cols);
                wc[h] = w[h].cpu;
                wg[h] = w[h].gpu;
            }
            const size_t x_head = (size_t)(cols + shapes[s].x_pad), x_tok = (size_t)H * x_head;
            const size_t y_head = (size_t)(rows + shapes[s].y_pad), y_tok = (size_t)H * y_head;
            const size_t x_off = (size_t)shapes[s].x_pad, y_off = (size_t)shapes[s].y_pad;
            for (int t = 0; t < 4; t++) {
                int T = Ts[t];
                dual x = dual_rand(&b, (size_t)T * x_tok, 1.0f), y = dual_rand(&b, (size_t)T * y_tok, 1.0f);
                ON(b.cpu, head_matmul, H, wc, x.cpu + x_off, x_head, x_tok, y.cpu + y_off, y_head, y_tok, T);
                ON(b.gpu, head_matmul, H, wg, x.gpu + x_off, x_head, x_tok, y.gpu + y_off, y_head, y_tok, T);
                char op[48];
                dual_check(&b, &y, matmul_op("head_matmul", T, op, sizeof op), matmul_limit(T),
                           "H %d, %s %d x %d, T %d", H, w[0].name, rows, cols, T);
                dual_free(&b, &x);
                dual_free(&b, &y);
            }
            for (int h = 0; h < H; h++)
                weight_free(&w[h]);
        }
    both_close(&b);
}

/* ---- RoPE ------------------------------------------------------------------ */

Test(backend_ops, rope)
{
    both b = both_open("rope");
    /* full and partial rotation (Qwen3.5's 64 of 256, MLA's 64 of 192 and
     * its 64-wide key), positions from 0 to past 4096, yarn's mscale */
    static const struct {
        int T, heads, hd, rot, pos0;
        float mscale;
        double theta;
    } cases[] = {
        {1, 8, 64, 64, 0, 1.0f, 1e4},      {1, 8, 128, 128, 4095, 1.0f, 5e5}, {7, 4, 128, 64, 100, 1.0f, 1e6},
        {64, 16, 192, 64, 37, 1.2f, 1e4},  {5, 2, 256, 64, 3000, 1.0f, 1e7},  {64, 1, 64, 64, 0, 1.3f, 1e4},
        {3, 8, 80, 32, 9000, 1.0f, 1e4},   {17, 32, 128, 96, 1, 0.9f, 1.5e5},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int T = cases[i].T, H = cases[i].heads, hd = cases[i].hd, rot = cases[i].rot;
        float inv[512];
        for (int j = 0; j < rot / 2; j++)
            inv[j] = (float)pow(cases[i].theta, -2.0 * j / rot);
        dvec inv_freq = vec_load(&b, EXO_DTYPE_F32, inv, (size_t)(rot / 2));
        dual x = dual_rand(&b, (size_t)T * H * hd, 1.0f);
        ON(b.cpu, rope, x.cpu, T, H, hd, rot, cases[i].pos0, inv_freq.cpu, cases[i].mscale);
        ON(b.gpu, rope, x.gpu, T, H, hd, rot, cases[i].pos0, inv_freq.gpu, cases[i].mscale);
        dual_check(&b, &x, "rope", NMSE_ELEMENTWISE, "T %d H %d hd %d rot %d pos0 %d mscale %g", T, H, hd, rot,
                   cases[i].pos0, (double)cases[i].mscale);
        dual_free(&b, &x);
        vec_free(&b, &inv_freq);
    }
    both_close(&b);
}

/* qk_norm_rope against the CPU's rmsnorm per head and rope, of q and k,
 * with and without the norms (Qwen3 and Llama), partial rotation. */
Test(backend_ops, qk_norm_rope)
{
    both b = both_open("qk_norm_rope");
    if (!b.gpu->ops->qk_norm_rope) {
        both_close(&b);
        cr_skip_test("the CUDA backend has no qk_norm_rope");
    }
    static const struct {
        int T, nq, nk, hd, rot, pos0;
        bool norms;
    } cases[] = {
        {1, 32, 4, 128, 128, 4095, true}, {1, 32, 8, 128, 128, 17, false}, {7, 16, 2, 256, 64, 100, true},
        {64, 8, 8, 64, 64, 0, true},      {3, 12, 4, 80, 32, 9000, false}, {1, 64, 4, 1024, 512, 3, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int T = cases[i].T, nq = cases[i].nq, nk = cases[i].nk, hd = cases[i].hd, rot = cases[i].rot;
        float inv[512];
        for (int j = 0; j < rot / 2; j++)
            inv[j] = (float)pow(1e6, -2.0 * j / rot);
        dvec inv_freq = vec_load(&b, EXO_DTYPE_F32, inv, (size_t)(rot / 2));
        dvec qn = vec_rand(&b, EXO_DTYPE_F32, (size_t)hd, 1.0f, 0.2f), kn = vec_rand(&b, EXO_DTYPE_F32, (size_t)hd, 1.0f, 0.2f);
        dual q = dual_rand(&b, (size_t)T * nq * hd, 3.0f), k = dual_rand(&b, (size_t)T * nk * hd, 3.0f);
        if (cases[i].norms) {
            ON(b.cpu, rmsnorm, q.cpu, q.cpu, qn.cpu, T * nq, hd, 1e-6f);
            ON(b.cpu, rmsnorm, k.cpu, k.cpu, kn.cpu, T * nk, hd, 1e-6f);
        }
        ON(b.cpu, rope, q.cpu, T, nq, hd, rot, cases[i].pos0, inv_freq.cpu, 1.0f);
        ON(b.cpu, rope, k.cpu, T, nk, hd, rot, cases[i].pos0, inv_freq.cpu, 1.0f);
        ON(b.gpu, qk_norm_rope, q.gpu, k.gpu, T, nq, nk, hd, rot, cases[i].pos0, inv_freq.gpu, 1.0f,
           cases[i].norms ? qn.gpu : NULL, cases[i].norms ? kn.gpu : NULL, 1e-6f);
        dual_check(&b, &q, "qk_norm_rope (q)", NMSE_ELEMENTWISE, "T %d heads %d/%d hd %d rot %d norms %d", T, nq, nk,
                   hd, rot, cases[i].norms);
        dual_check(&b, &k, "qk_norm_rope (k)", NMSE_ELEMENTWISE, "T %d heads %d/%d hd %d rot %d norms %d", T, nq, nk,
                   hd, rot, cases[i].norms);
        dual_free(&b, &q);
        dual_free(&b, &k);
        vec_free(&b, &qn);
        vec_free(&b, &kn);
        vec_free(&b, &inv_freq);
    }
    both_close(&b);
}

/* ---- attention ---------------------------------------------------------- */

typedef struct attn_cfg {
    int heads, kv, hd, window;
    bool ring;   /* the cache is a ring (needs a window) */
    bool sinks;  /* a sink logit per query head */
    bool latent; /* k and v are one tensor (MLA's [rope | latent] cache) */
    float scale; /* 0: 1/sqrt(hd) */
    int page;    /* > 0: the cache in pages of this many slots, scattered */
    int rot;     /* > 0: q and k come unrotated (RoPE of rot dims, and q/k norms where norms is
                    set): the GPU rotates one-token calls in the attention call, prompts with
                    qk_norm_rope first; the CPU with rmsnorm and rope first */
    bool norms;
    bool bf16; /* both backends' caches in bf16 (exo_attn_shape's cache) */
} attn_cfg;

/* The rotation of an attn_cfg on each backend (attn_cfg's rot). */
typedef struct attn_rot {
    dvec inv_freq, q_norm, k_norm;
    exo_attn_rope cpu, gpu;
} attn_rot;

static attn_rot attn_rot_make(both *b, const attn_cfg *cfg)
{
    attn_rot r = {0};
    float inv[512], w[1024];
    for (int j = 0; j < cfg->rot / 2; j++)
        inv[j] = (float)pow(5e5, -2.0 * j / cfg->rot);
    r.inv_freq = vec_load(b, EXO_DTYPE_F32, inv, (size_t)(cfg->rot / 2));
    if (cfg->norms) {
        for (int j = 0; j < cfg->hd; j++)
            w[j] = 1.0f + 0.3f * rng_gauss();
        r.q_norm = vec_load(b, EXO_DTYPE_F32, w, (size_t)cfg->hd);
        for (int j = 0; j < cfg->hd; j++)
            w[j] = 1.0f + 0.3f * rng_gauss();
        r.k_norm = vec_load(b, EXO_DTYPE_F32, w, (size_t)cfg->hd);
    }
    r.cpu = (exo_attn_rope){cfg->rot, r.inv_freq.cpu, 1.0f, r.q_norm.cpu, r.k_norm.cpu, 1e-6f};
    r.gpu = (exo_attn_rope){cfg->rot, r.inv_freq.gpu, 1.0f, r.q_norm.gpu, r.k_norm.gpu, 1e-6f};
    return r;
}

static void attn_rot_free(both *b, attn_rot *r)
{
    vec_free(b, &r->inv_freq);
    if (r->q_norm.cpu) {
        vec_free(b, &r->q_norm);
        vec_free(b, &r->k_norm);
    }
}

/* The CPU's q and k of T tokens at pos through r's norms and rotation. */
static void cpu_rotate(both *b, const attn_cfg *cfg, const attn_rot *r, float *q, float *k, int T, int pos)
{
    if (cfg->norms) {
        ON(b->cpu, rmsnorm, q, q, r->q_norm.cpu, T * cfg->heads, cfg->hd, 1e-6f);
        ON(b->cpu, rmsnorm, k, k, r->k_norm.cpu, T * cfg->kv, cfg->hd, 1e-6f);
    }
    ON(b->cpu, rope, q, T, cfg->heads, cfg->hd, cfg->rot, pos, r->inv_freq.cpu, 1.0f);
    ON(b->cpu, rope, k, T, cfg->kv, cfg->hd, cfg->rot, pos, r->inv_freq.cpu, 1.0f);
}

/* A cache of `capacity` slots on be, as attn_sequence's caches: one run, or
 * pages of `page` slots placed in reverse order in one allocation, their
 * table in be's memory (as model.c keeps a sequence's). */
typedef struct test_kv {
    exo_kv_view view;
    char *mem;
    void **table;
} test_kv;

/* values of `type` (f32 or bf16) */
static test_kv kv_make(exo_backend *be, int capacity, int KV, int hd, int page, exo_dtype type)
{
    test_kv c = {0};
    const size_t vb = exo_dtype_size(type);
    if (!page) {
        size_t run = (size_t)capacity * (size_t)KV * (size_t)hd;
        c.mem = be->ops->alloc(be, 2 * run * vb);
        cr_assert(c.mem);
        c.view = (exo_kv_view){.k = c.mem, .v = c.mem + run * vb, .capacity = capacity, .page = capacity};
        return c;
    }
    int runs = (capacity + page - 1) / page;
    size_t run = 2 * (size_t)page * (size_t)KV * (size_t)hd;
    c.mem = be->ops->alloc(be, (size_t)runs * run * vb);
    cr_assert(c.mem);
    void **host = exo_calloc((size_t)runs, sizeof(void *));
    for (int i = 0; i < runs; i++)
        host[i] = c.mem + (size_t)(runs - 1 - i) * run * vb;
    c.table = be->ops->alloc(be, sizeof(void *) * (size_t)runs);
    cr_assert(c.table);
    ok(be, be->ops->to_device(be, c.table, host, sizeof(void *) * (size_t)runs), "to_device");
    exo_free(host);
    c.view = (exo_kv_view){.pages = c.table, .v_off = (size_t)page * KV * hd, .capacity = capacity, .page = page};
    return c;
}

static void kv_free(exo_backend *be, test_kv *c)
{
    be->ops->release(be, c->mem);
    be->ops->release(be, c->table);
}

/* Runs calls[] (each appending that many tokens, from position 0) on both
 * backends' caches; compares every call's output. A ring is sized as
 * model.c sizes it (the window plus the longest call plus a block, to a
 * block) and must wrap. */
static void attn_sequence(both *b, const attn_cfg *cfg, const int *calls, int n_calls)
{
    int total = 0, most = 0;
    for (int i = 0; i < n_calls; i++) {
        total += calls[i];
        most = calls[i] > most ? calls[i] : most;
    }
    int capacity = (total + EXO_KV_BLOCK - 1) / EXO_KV_BLOCK * EXO_KV_BLOCK, ring = 0;
    if (cfg->ring) {
        ring = (cfg->window + most + 2 * EXO_KV_BLOCK - 1) / EXO_KV_BLOCK * EXO_KV_BLOCK;
        cr_assert(cfg->window > 0 && ring < total, "a ring test needs a window and positions that wrap");
        capacity = ring;
    }
    const int H = cfg->heads, KV = cfg->kv, hd = cfg->hd;
    dvec sinks = {0};
    if (cfg->sinks) {
        float s[128];
        for (int h = 0; h < H; h++) /* around the scores, and one far above them */
            s[h] = h == 1 ? 6.0f : 1.5f * rng_gauss();
        sinks = vec_load(b, EXO_DTYPE_F32, s, (size_t)H);
    }
    float scale = cfg->scale > 0 ? cfg->scale : 1.0f / sqrtf((float)hd);
    const exo_dtype type = cfg->bf16 ? EXO_DTYPE_BF16 : EXO_DTYPE_F32;
    exo_attn_shape sc = {.n_heads = H, .n_kv_heads = KV, .head_dim = hd, .sliding_window = cfg->window,
                         .scale = scale, .sinks = sinks.cpu, .ring = ring, .cache = type};
    exo_attn_shape sg = sc;
    sg.sinks = sinks.gpu;
    test_kv kc = kv_make(b->cpu, capacity, KV, hd, ring ? 0 : cfg->page, type);
    test_kv kg = kv_make(b->gpu, capacity, KV, hd, ring ? 0 : cfg->page, type);
    attn_rot rot = {0};
    if (cfg->rot)
        rot = attn_rot_make(b, cfg);
    for (int i = 0, pos = 0; i < n_calls; pos += calls[i++]) {
        int T = calls[i];
        dual q = dual_rand(b, (size_t)T * H * hd, 1.5f), k = dual_rand(b, (size_t)T * KV * hd, 1.0f);
        dual v = cfg->latent ? k : dual_rand(b, (size_t)T * KV * hd, 1.0f);
        dual out = dual_rand(b, (size_t)T * H * hd, 1.0f);
        exo_attn_shape call = sg;
        if (cfg->rot) {
            cpu_rotate(b, cfg, &rot, q.cpu, k.cpu, T, pos);
            call.rope = &rot.gpu;
            bool fused = b->gpu->ops->attention_rotates && b->gpu->ops->attention_rotates(b->gpu, &call, T);
            /* the decode kernel's shapes rotate in the call */
            cr_assert(fused || T > 1 || !(hd == 64 || hd == 128 || hd == 256) || cfg->rot % (hd / 16),
                      "hd %d: a one-token call not rotated", hd);
            if (!fused) {
                call.rope = NULL;
                ON(b->gpu, qk_norm_rope, q.gpu, k.gpu, T, H, KV, hd, cfg->rot, pos, rot.inv_freq.gpu, 1.0f,
                   rot.q_norm.gpu, rot.k_norm.gpu, 1e-6f);
            }
        }
        ON(b->cpu, attention, &sc, out.cpu, q.cpu, k.cpu, v.cpu, &kc.view, T, pos);
        ON(b->gpu, attention, &call, out.gpu, q.gpu, k.gpu, v.gpu, &kg.view, T, pos);
        dual_check(b, &out, "attention", NMSE_ATTENTION,
                   "H %d KV %d hd %d window %d ring %d sinks %d latent %d page %d rot %d norms %d bf16 %d: call %d, "
                   "T %d at %d",
                   H, KV, hd, cfg->window, ring, cfg->sinks, cfg->latent, cfg->page, cfg->rot, cfg->norms, cfg->bf16,
                   i, T, pos);
        dual_free(b, &q);
        dual_free(b, &k);
        if (!cfg->latent)
            dual_free(b, &v);
        dual_free(b, &out);
    }
    kv_free(b->cpu, &kc);
    kv_free(b->gpu, &kg);
    if (cfg->sinks)
        vec_free(b, &sinks);
    if (cfg->rot)
        attn_rot_free(b, &rot);
}

/* prefill at 0, decode steps, a prefill at pos0 > 0, a short (T = 3)
 * call, a long prefill, decode again */
static const int SEQ[] = {37, 1, 1, 1, 20, 1, 1, 3, 64, 1};
#define N_SEQ ((int)(sizeof SEQ / sizeof SEQ[0]))

Test(backend_ops, attention_gqa_head_dim)
{
    both b = both_open("attention_gqa_head_dim");
    static const int groups[] = {1, 2, 4, 8}, hds[] = {64, 128, 256};
    for (int g = 0; g < 4; g++)
        for (int h = 0; h < 3; h++) {
            attn_cfg cfg = {.heads = 2 * groups[g], .kv = 2, .hd = hds[h]};
            attn_sequence(&b, &cfg, SEQ, N_SEQ);
        }
    /* one KV head for 16 query heads, a scale other than 1/sqrt(hd) (Gemma's
     * query_pre_attn_scalar) */
    attn_cfg one = {.heads = 16, .kv = 1, .hd = 128, .scale = 0.0625f};
    attn_sequence(&b, &one, SEQ, N_SEQ);
    both_close(&b);
}

/* Head sizes other than 64/128/256 (hidden / heads of some checkpoints):
 * not a multiple of 64, nor of 32. */
Test(backend_ops, attention_odd_head_dim)
{
    both b = both_open("attention_odd_head_dim");
    attn_cfg hd96 = {.heads = 8, .kv = 2, .hd = 96};
    attn_sequence(&b, &hd96, SEQ, N_SEQ);
    attn_cfg hd80 = {.heads = 8, .kv = 8, .hd = 80, .scale = 0.1f};
    attn_sequence(&b, &hd80, SEQ, N_SEQ);
    both_close(&b);
}

Test(backend_ops, attention_sliding_window)
{
    both b = both_open("attention_sliding_window");
    /* a window in a full-length cache */
    attn_cfg plain = {.heads = 8, .kv = 2, .hd = 128, .window = 24};
    attn_sequence(&b, &plain, SEQ, N_SEQ);
    attn_cfg tiny = {.heads = 4, .kv = 4, .hd = 64, .window = 7};
    attn_sequence(&b, &tiny, SEQ, N_SEQ);
    /* rings that positions wrap around several times, calls of 1 to 32 */
    static const int ring_seq[] = {32, 1, 1, 1, 32, 32, 32, 5, 1, 1, 1, 1, 1, 1, 17, 32, 1, 1, 1, 1};
    const int n_ring = (int)(sizeof ring_seq / sizeof ring_seq[0]);
    attn_cfg ring = {.heads = 8, .kv = 2, .hd = 128, .window = 24, .ring = true};
    attn_sequence(&b, &ring, ring_seq, n_ring);
    attn_cfg ring_g8 = {.heads = 16, .kv = 2, .hd = 256, .window = 16, .ring = true};
    attn_sequence(&b, &ring_g8, ring_seq, n_ring);
    attn_cfg ring_7 = {.heads = 4, .kv = 1, .hd = 64, .window = 7, .ring = true};
    attn_sequence(&b, &ring_7, ring_seq, n_ring);
    both_close(&b);
}

Test(backend_ops, attention_sinks)
{
    both b = both_open("attention_sinks");
    attn_cfg full = {.heads = 8, .kv = 1, .hd = 64, .sinks = true};
    attn_sequence(&b, &full, SEQ, N_SEQ);
    attn_cfg g2 = {.heads = 8, .kv = 4, .hd = 128, .sinks = true};
    attn_sequence(&b, &g2, SEQ, N_SEQ);
    /* gpt-oss's sliding layers: window 128 as a ring, with sinks */
    static const int seq[] = {64, 64, 64, 1, 1, 1, 1, 1, 1, 1, 1, 40, 64, 1, 1, 1, 1};
    attn_cfg oss = {.heads = 16, .kv = 2, .hd = 64, .window = 128, .ring = true, .sinks = true};
    attn_sequence(&b, &oss, seq, (int)(sizeof seq / sizeof seq[0]));
    both_close(&b);
}

/* q and k handed over unrotated (backend.h exo_attn_rope): the decode
 * kernel's own norms and rotation against the CPU's rmsnorm and rope, at
 * the shapes of Llama 1B/8B, Qwen3 (norms), Qwen3.5's partial rotation,
 * gpt-oss's ring with sinks, Gemma's 256-wide heads, a paged cache, and
 * a context past one split. */
Test(backend_ops, attention_rotated)
{
    both b = both_open("attention_rotated");
    static const int seq[] = {37, 1, 1, 1, 20, 1, 3, 1, 1};
    static const int ring_seq[] = {64, 64, 64, 1, 1, 1, 40, 64, 1, 1, 1};
    static const int long_seq[] = {900, 1, 1, 300, 1, 1};
    static const struct {
        attn_cfg cfg;
        const int *seq;
        int n;
    } cases[] = {
        {{.heads = 32, .kv = 8, .hd = 64, .rot = 64}, seq, 9},
        {{.heads = 32, .kv = 8, .hd = 128, .rot = 128, .norms = true}, seq, 9},
        {{.heads = 8, .kv = 2, .hd = 256, .rot = 64, .norms = true}, seq, 9},
        {{.heads = 16, .kv = 2, .hd = 64, .window = 128, .ring = true, .sinks = true, .rot = 64}, ring_seq, 11},
        {{.heads = 8, .kv = 4, .hd = 256, .window = 24, .rot = 256, .norms = true}, seq, 9},
        {{.heads = 12, .kv = 4, .hd = 128, .rot = 64, .page = 16}, seq, 9},
        {{.heads = 16, .kv = 1, .hd = 64, .rot = 32, .norms = true}, long_seq, 6},
        {{.heads = 8, .kv = 2, .hd = 64, .rot = 18, .norms = true}, seq, 9}, /* not the kernel's: rotated first */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        attn_sequence(&b, &cases[i].cfg, cases[i].seq, cases[i].n);
    both_close(&b);
}

/* Latent attention: one KV head of [rope 64 | latent 512] that is both key
 * and value (the same tensor passed twice). */
Test(backend_ops, attention_latent)
{
    both b = both_open("attention_latent");
    static const int seq[] = {37, 1, 1, 20, 1, 3, 1};
    attn_cfg mla = {.heads = 8, .kv = 1, .hd = 576, .latent = true, .scale = 0.0722f};
    attn_sequence(&b, &mla, seq, (int)(sizeof seq / sizeof seq[0]));
    both_close(&b);
}

/* A paged cache (model.c's full-attention layers): pages of 16 and 64
 * slots, scattered, on the decode kernel, the general one, a window and
 * latent rows. */
Test(backend_ops, attention_paged)
{
    both b = both_open("attention_paged");
    static const int pages[] = {16, 64};
    for (int p = 0; p < 2; p++) {
        attn_cfg g4 = {.heads = 8, .kv = 2, .hd = 128, .page = pages[p]};
        attn_sequence(&b, &g4, SEQ, N_SEQ);
        attn_cfg odd = {.heads = 6, .kv = 2, .hd = 96, .page = pages[p]};
        attn_sequence(&b, &odd, SEQ, N_SEQ);
        attn_cfg win = {.heads = 8, .kv = 4, .hd = 64, .window = 20, .sinks = true, .page = pages[p]};
        attn_sequence(&b, &win, SEQ, N_SEQ);
    }
    static const int seq[] = {37, 1, 1, 20, 1, 3, 1};
    attn_cfg mla = {.heads = 8, .kv = 1, .hd = 576, .latent = true, .scale = 0.0722f, .page = 16};
    attn_sequence(&b, &mla, seq, (int)(sizeof seq / sizeof seq[0]));
    both_close(&b);
}

/* Long contexts on the one-token decode kernel: a token's positions going
 * from one split to many as the context grows (up to the 64 a call may
 * have, with one KV head), each call's splits combined by whichever of
 * them finishes last, the backend's counters for that reused call after
 * call. */
Test(backend_ops, attention_long_decode)
{
    both b = both_open("attention_long_decode");
    static const int seq[] = {1200, 1, 1, 1, 40, 1, 1, 700, 1, 1};
    static const attn_cfg cfgs[] = {
        {.heads = 32, .kv = 8, .hd = 128},               /* llama-3.1-8b's heads */
        {.heads = 32, .kv = 8, .hd = 64},                /* llama-3.2-1b's */
        {.heads = 16, .kv = 1, .hd = 64},                /* one KV head: 64 splits */
        {.heads = 8, .kv = 2, .hd = 256, .sinks = true}, /* two positions a warp's round */
        {.heads = 32, .kv = 8, .hd = 128, .page = 64},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++)
        attn_sequence(&b, &cfgs[i], seq, (int)(sizeof seq / sizeof seq[0]));
    both_close(&b);
}

/* bf16 caches (exo_attn_shape's cache): both backends round keys and
 * values to nearest even as they are appended and score the rounded ones,
 * the call's own too, so they agree as closely as over f32 caches. Every
 * GPU kernel: the decode kernel (head sizes 64, 128 and 256, groups of 1
 * to 16, its rotation, pages, a ring with sinks, contexts of many
 * splits), the prompt tiles (calls of 32 tokens or more), and the general
 * kernel (head size 96, latent rows). */
Test(backend_ops, attention_bf16_cache)
{
    both b = both_open("attention_bf16_cache");
    static const int ring_seq[] = {64, 64, 64, 1, 1, 1, 40, 64, 1, 1, 1};
    static const int long_seq[] = {1200, 1, 1, 1, 40, 1, 1, 700, 1, 1};
    static const int mla_seq[] = {37, 1, 1, 20, 1, 3, 1};
    static const struct {
        attn_cfg cfg;
        const int *seq;
        int n;
    } cases[] = {
        {{.heads = 8, .kv = 2, .hd = 128, .bf16 = true}, SEQ, N_SEQ},
        {{.heads = 16, .kv = 1, .hd = 64, .bf16 = true}, SEQ, N_SEQ},
        {{.heads = 8, .kv = 2, .hd = 256, .bf16 = true}, SEQ, N_SEQ},
        {{.heads = 6, .kv = 2, .hd = 96, .page = 16, .bf16 = true}, SEQ, N_SEQ},
        {{.heads = 32, .kv = 8, .hd = 128, .rot = 128, .norms = true, .page = 64, .bf16 = true}, SEQ, N_SEQ},
        {{.heads = 16, .kv = 2, .hd = 64, .window = 128, .ring = true, .sinks = true, .rot = 64, .bf16 = true},
         ring_seq, 11},
        {{.heads = 32, .kv = 8, .hd = 64, .page = 64, .bf16 = true}, long_seq, 10},
        {{.heads = 8, .kv = 1, .hd = 576, .latent = true, .scale = 0.0722f, .page = 16, .bf16 = true}, mla_seq, 7},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        attn_sequence(&b, &cases[i].cfg, cases[i].seq, cases[i].n);
    both_close(&b);
}

/* With a bf16 cache a call's own keys and values count as the cache will
 * hold them: the first position of a sequence attends only to itself, so
 * its output is its value rounded to bf16, to the bit, on both backends
 * and in every kernel that takes it (one token: the decode kernel; five:
 * a prompt's tiles; head size 96: the general kernel). A kernel that read
 * its own rows unrounded would be 2^-9 off here, which the NMSE checks
 * above cannot see among hundreds of positions. */
Test(backend_ops, attention_bf16_cache_rounds_own_rows)
{
    both b = both_open("attention_bf16_cache_rounds_own_rows");
    enum { H = 8, KV = 2, T_MAX = 5 };
    static const int hds[] = {64, 128, 256, 96}, lens[] = {1, T_MAX};
    exo_backend *const bes[] = {b.cpu, b.gpu};
    for (size_t h = 0; h < sizeof hds / sizeof hds[0]; h++)
        for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++)
            for (size_t e = 0; e < 2; e++) {
                exo_backend *be = bes[e];
                const int hd = hds[h], T = lens[l];
                const size_t qrow = (size_t)H * hd, kvrow = (size_t)KV * hd, n = (size_t)T * (2 * qrow + 2 * kvrow);
                exo_attn_shape shape = {.n_heads = H, .n_kv_heads = KV, .head_dim = hd, .scale = 0.125f,
                                        .cache = EXO_DTYPE_BF16};
                test_kv kv = kv_make(be, EXO_KV_BLOCK, KV, hd, 0, EXO_DTYPE_BF16);
                float *host = exo_malloc(sizeof(float) * n), *got = exo_malloc(sizeof(float) * qrow);
                for (size_t j = 0; j < n; j++)
                    host[j] = rng_gauss();
                float *dev = be_alloc(be, n);
                upload(be, dev, host, n);
                float *q = dev, *k = q + T * qrow, *v = k + T * kvrow, *out = v + T * kvrow;
                ON(be, attention, &shape, out, q, k, v, &kv.view, T, 0);
                download(be, got, out, qrow);
                const float *v0 = host + (size_t)T * (qrow + kvrow);
                int wrong = 0;
                for (int hh = 0; hh < H; hh++)
                    for (int d = 0; d < hd; d++) {
                        float want = exo_bf16_to_f32(exo_f32_to_bf16(v0[(size_t)(hh / (H / KV)) * hd + d]));
                        wrong += memcmp(&want, &got[(size_t)hh * hd + d], sizeof want) != 0;
                    }
                cr_expect_eq(wrong, 0, "%s, head size %d, %d tokens: %d of %zu outputs of position 0 are not its "
                             "value rounded to bf16", e ? "gpu" : "cpu", hd, T, wrong, qrow);
                be->ops->release(be, dev);
                kv_free(be, &kv);
                exo_free(host);
                exo_free(got);
            }
    both_close(&b);
}

/* attention_rows against one attention call a sequence on the GPU: the
 * same bits (backend.h), for sequences of many lengths (one split to
 * many), more of them than one launch takes, four times over, with q and
 * k rotated in the calls (exo_attn_rope) every other time; caches of
 * `type`. */
static void rows_against_single(both *b, exo_dtype type)
{
    exo_backend *g = b->gpu;
    cr_assert(g->ops->attention_rows, "the CUDA backend batches decode attention");
    enum { N = 20, H = 32, KV = 8, HD = 64, ROUNDS = 4 };
    const size_t qrow = (size_t)H * HD, kvrow = (size_t)KV * HD;
    exo_attn_shape shape = {.n_heads = H, .n_kv_heads = KV, .head_dim = HD, .scale = 0.125f, .cache = type};
    test_kv rows_kv[N], one_kv[N];
    exo_kv_view views[N];
    int pos[N], rings[N] = {0};
    for (int i = 0; i < N; i++) {
        pos[i] = 1 + (i * 97) % 1300;
        int capacity = (pos[i] + ROUNDS + EXO_KV_BLOCK - 1) / EXO_KV_BLOCK * EXO_KV_BLOCK;
        rows_kv[i] = kv_make(g, capacity, KV, HD, 0, type);
        one_kv[i] = kv_make(g, capacity, KV, HD, 0, type);
        views[i] = rows_kv[i].view;
        /* the same prompt into both caches */
        size_t n = (size_t)pos[i];
        float *host = exo_malloc(sizeof(float) * n * (2 * qrow + 2 * kvrow));
        for (size_t j = 0; j < n * (2 * qrow + 2 * kvrow); j++)
            host[j] = rng_gauss();
        float *dev = be_alloc(g, n * (2 * qrow + 2 * kvrow));
        upload(g, dev, host, n * (2 * qrow + 2 * kvrow));
        float *q = dev, *k = q + n * qrow, *v = k + n * kvrow, *out = v + n * kvrow;
        ON(g, attention, &shape, out, q, k, v, &rows_kv[i].view, pos[i], 0);
        ON(g, attention, &shape, out, q, k, v, &one_kv[i].view, pos[i], 0);
        g->ops->release(g, dev);
        exo_free(host);
    }
    size_t all = (size_t)N * (2 * qrow + 2 * kvrow);
    float *host = exo_malloc(sizeof(float) * all), *dev = be_alloc(g, all + (size_t)N * qrow);
    float *got = exo_malloc(sizeof(float) * N * qrow), *want = exo_malloc(sizeof(float) * N * qrow);
    const attn_cfg rot_cfg = {.heads = H, .kv = KV, .hd = HD, .rot = HD, .norms = true};
    attn_rot rot = attn_rot_make(b, &rot_cfg);
    for (int round = 0; round < ROUNDS; round++) {
        for (size_t j = 0; j < all; j++)
            host[j] = rng_gauss();
        upload(g, dev, host, all);
        float *q = dev, *k = q + N * qrow, *v = k + N * kvrow;
        float *out_rows = v + N * kvrow, *out_one = out_rows + N * qrow;
        exo_attn_shape sh = shape;
        if (round % 2) {
            sh.rope = &rot.gpu;
            cr_assert(g->ops->attention_rotates(g, &sh, 1), "the decode kernel rotates");
        }
        ON(g, attention_rows, &sh, N, out_rows, q, k, v, views, rings, pos);
        for (int i = 0; i < N; i++)
            ON(g, attention, &sh, out_one + i * qrow, q + i * qrow, k + i * kvrow, v + i * kvrow, &one_kv[i].view, 1,
               pos[i]);
        ok(g, g->ops->sync(g), "sync");
        download(g, got, out_rows, N * qrow);
        download(g, want, out_one, N * qrow);
        for (int i = 0; i < N; i++)
            cr_expect(!memcmp(got + i * qrow, want + i * qrow, sizeof(float) * qrow),
                      "%s cache, round %d, sequence %d at position %d: attention_rows differs from attention",
                      exo_dtype_name(type), round, i, pos[i]);
        for (int i = 0; i < N; i++)
            pos[i]++;
    }
    attn_rot_free(b, &rot);
    g->ops->release(g, dev);
    exo_free(host);
    exo_free(got);
    exo_free(want);
    for (int i = 0; i < N; i++) {
        kv_free(g, &rows_kv[i]);
        kv_free(g, &one_kv[i]);
    }
}

Test(backend_ops, attention_rows_same_bits_as_single)
{
    both b = both_open("attention_rows_same_bits_as_single");
    rows_against_single(&b, EXO_DTYPE_F32);
    rows_against_single(&b, EXO_DTYPE_BF16);
    both_close(&b);
}

/* ---- element-wise --------------------------------------------------------- */

Test(backend_ops, glu)
{
    both b = both_open("glu");
    static const exo_glu_kind kinds[] = {EXO_GLU_SILU, EXO_GLU_GELU_TANH, EXO_GLU_OAI};
    static const char *names[] = {"silu", "gelu_tanh", "oai"};
    static const size_t lens[] = {1, 100, 12288, 70001};
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 4; i++) {
            size_t n = lens[i];
            /* wide enough that gpt-oss's clamp at 7 bites on both sides */
            dual g = dual_rand(&b, n, 5.0f), u = dual_rand(&b, n, 5.0f);
            ON(b.cpu, glu, kinds[k], g.cpu, u.cpu, n, 7.0f);
            ON(b.gpu, glu, kinds[k], g.gpu, u.gpu, n, 7.0f);
            dual_check(&b, &g, "glu", NMSE_ELEMENTWISE, "%s n %zu", names[k], n);
            dual_check(&b, &u, "glu: u untouched", NMSE_EXACT, "%s n %zu", names[k], n);
            dual_free(&b, &g);
            dual_free(&b, &u);
        }
    both_close(&b);
}

Test(backend_ops, sigmoid_mul)
{
    both b = both_open("sigmoid_mul");
    /* one gate per row (a shared expert's gate), and a gate per element
     * (Qwen3-Next's gated attention output) */
    static const int cases[][3] = {{1, 2048, 1}, {5, 2048, 1}, {64, 1024, 1}, {7, 4096, 4096},
                                   {64, 1024, 1024}, {1, 100, 100}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rows = cases[i][0], dim = cases[i][1], gd = cases[i][2];
        dual x = dual_rand(&b, (size_t)rows * dim, 1.0f), gate = dual_rand(&b, (size_t)rows * gd, 4.0f);
        ON(b.cpu, sigmoid_mul, x.cpu, gate.cpu, rows, dim, gd);
        ON(b.gpu, sigmoid_mul, x.gpu, gate.gpu, rows, dim, gd);
        dual_check(&b, &x, "sigmoid_mul", NMSE_ELEMENTWISE, "rows %d dim %d gate_dim %d", rows, dim, gd);
        dual_free(&b, &x);
        dual_free(&b, &gate);
    }
    both_close(&b);
}

Test(backend_ops, scale_add_zero)
{
    both b = both_open("scale_add_zero");
    static const size_t lens[] = {1, 1000, 100003};
    static const float scales[] = {0.125f, -3.0f, 1.0f};
    for (int i = 0; i < 3; i++) {
        size_t n = lens[i];
        dual x = dual_rand(&b, n, 1.0f), y = dual_rand(&b, n, 1.0f);
        ON(b.cpu, scale, x.cpu, scales[i], n);
        ON(b.gpu, scale, x.gpu, scales[i], n);
        dual_check(&b, &x, "scale", NMSE_ELEMENTWISE, "n %zu s %g", n, (double)scales[i]);
        dual_mirror(&b, &x);
        ON(b.cpu, add, x.cpu, y.cpu, n);
        ON(b.gpu, add, x.gpu, y.gpu, n);
        dual_check(&b, &x, "add", NMSE_ELEMENTWISE, "n %zu", n);
        ON(b.cpu, zero, x.cpu, n);
        ON(b.gpu, zero, x.gpu, n);
        dual_check(&b, &x, "zero", NMSE_EXACT, "n %zu", n);
        dual_free(&b, &x);
        dual_free(&b, &y);
    }
    both_close(&b);
}

/* ---- mixture of experts -------------------------------------------------------- */

static const struct {
    const char *name;
    exo_moe_router r;
    bool bias;
} routers[] = {
    /* n_experts, k, sigmoid, norm, bias, n_group, topk_group, scale */
    {"softmax, renormalised (Qwen3-MoE)", {128, 8, false, true, NULL, 1, 1, 1.0f}, false},
    {"softmax (Mixtral-like, unnormalised)", {32, 4, false, false, NULL, 1, 1, 1.0f}, false},
    {"sigmoid, bias, groups (DeepSeek-V3)", {256, 8, true, true, NULL, 8, 4, 2.5f}, true},
    {"sigmoid, bias, one group", {64, 6, true, true, NULL, 1, 1, 1.0f}, true},
    {"sigmoid, no bias, unnormalised", {16, 4, true, false, NULL, 1, 1, 1.5f}, false},
    {"softmax, 512 experts, k 10 (Qwen3.5-397B)", {512, 10, false, true, NULL, 1, 1, 1.0f}, false},
};

/* Router i on T rows of random logits: the CPU's moe_route against the
 * GPU's, or against its moe_pick (the choice left on the device). With
 * ties (softmax routers, which choose by the logits themselves): a third
 * of the neighbouring pairs equal and a third one ulp apart, so choices
 * fall on ties, where both must take the lower index, and on gaps no
 * rounding may close. */
static void route_case(both *b, size_t i, int T, bool on_device, bool ties)
{
    const int E = routers[i].r.n_experts, k = routers[i].r.k;
    exo_moe_router rc = routers[i].r, rg = routers[i].r;
    dvec bias = {0};
    if (routers[i].bias) {
        bias = vec_rand(b, EXO_DTYPE_F32, (size_t)E, 0.0f, 0.1f);
        rc.bias = bias.cpu;
        rg.bias = bias.gpu;
    }
    dual logits = dual_rand(b, (size_t)T * E, 2.0f);
    if (ties) {
        for (int t = 0; t < T; t++)
            for (int e = 0; e + 1 < E; e += 2) {
                float *l = logits.init + (size_t)t * E + e;
                l[1] = e / 2 % 3 == 0 ? l[0] : e / 2 % 3 == 1 ? nextafterf(l[0], INFINITY) : l[1];
            }
        dual_upload(b, &logits);
    }
    int32_t *ic = exo_calloc((size_t)T * k, sizeof(int32_t)), *ig = exo_calloc((size_t)T * k, sizeof(int32_t));
    float *wc = exo_calloc((size_t)T * k, sizeof(float)), *wg = exo_calloc((size_t)T * k, sizeof(float));
    ON(b->cpu, moe_route, &rc, logits.cpu, T, ic, wc);
    if (on_device) /* moe_pick gives each token's experts in increasing order */
        for (int t = 0; t < T; t++)
            exo_moe_by_expert(ic + (size_t)t * k, wc + (size_t)t * k, k);
    if (on_device) {
        int32_t *idx_dev = (int32_t *)be_alloc(b->gpu, (size_t)T * k);
        float *w_dev = be_alloc(b->gpu, (size_t)T * k);
        ON(b->gpu, moe_pick, &rg, logits.gpu, T, idx_dev, w_dev);
        ok(b->gpu, b->gpu->ops->to_host(b->gpu, ig, idx_dev, sizeof(int32_t) * (size_t)T * k), "to_host");
        download(b->gpu, wg, w_dev, (size_t)T * k);
        b->gpu->ops->release(b->gpu, idx_dev);
        b->gpu->ops->release(b->gpu, w_dev);
    } else {
        ON(b->gpu, moe_route, &rg, logits.gpu, T, ig, wg);
    }
    int differ = 0;
    for (int j = 0; j < T * k; j++)
        differ += ic[j] != ig[j];
    record(on_device ? "moe_pick idx (share differing)" : "moe_route idx (share differing)", NMSE_EXACT,
           (double)differ / (T * k), "%s, T %d%s", routers[i].name, T, ties ? ", near ties" : "");
    record(on_device ? "moe_pick weights" : "moe_route weights", NMSE_ELEMENTWISE, nmse(wg, wc, (size_t)T * k),
           "%s, T %d%s", routers[i].name, T, ties ? ", near ties" : "");
    exo_free(ic);
    exo_free(ig);
    exo_free(wc);
    exo_free(wg);
    dual_free(b, &logits);
    if (routers[i].bias)
        vec_free(b, &bias);
}

Test(backend_ops, moe_route)
{
    both b = both_open("moe_route");
    static const int Ts[] = {1, 5, 64};
    for (size_t i = 0; i < sizeof routers / sizeof routers[0]; i++)
        for (int t = 0; t < 3; t++)
            for (int ties = 0; ties <= !routers[i].r.sigmoid; ties++)
                route_case(&b, i, Ts[t], false, ties);
    both_close(&b);
}

/* Decode's experts chosen on the device: moe_pick against the host
 * router (the same experts, weights to rounding), products of weights
 * that name a slot of the choice (moe_pick_table) against the CPU's
 * products of the experts chosen, and add_weighted_rows against
 * scatter_add_rows with the same weights. */
Test(backend_ops, moe_pick)
{
    both b = both_open("moe_pick");
    if (!b.gpu->ops->moe_pick) {
        both_close(&b);
        cr_skip_test("the CUDA backend has no moe_pick");
    }
    static const int Ts[] = {1, 3};
    for (size_t i = 0; i < sizeof routers / sizeof routers[0]; i++)
        for (int t = 0; t < 2; t++)
            for (int ties = 0; ties <= !routers[i].r.sigmoid; ties++)
                route_case(&b, i, Ts[t], true, ties);

    /* experts of one format: gate and up (I, D), down (D, I); four chosen */
    enum { E = 12, K = 4, D = 512, I = 256 };
    const wfmt fmts[] = {F_AFFINE(4, 64, BF16), F_AFFINE(8, 32, F16), F_DENSE(BF16), F_MXFP4};
    const exo_moe_router router = {E, K, false, true, NULL, 1, 1, 1.0f};
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
        weight *w = exo_calloc(3 * E, sizeof *w);
        exo_linear cpu_experts[3 * E], gpu_experts[3 * E];
        for (int e = 0; e < 3 * E; e++) {
            weight_rand(&b, &w[e], fmts[f], e % 3 == 2 ? D : I, e % 3 == 2 ? I : D);
            cpu_experts[e] = w[e].cpu;
            gpu_experts[e] = w[e].gpu;
        }
        exo_err err = {0};
        void *table = b.gpu->ops->moe_pick_table(b.gpu, gpu_experts, E, &err);
        cr_assert(table, "%s: moe_pick_table: %s", w[0].name, err.msg);
        dual logits = dual_rand(&b, E, 2.0f);
        int32_t *idx_dev = (int32_t *)be_alloc(b.gpu, K), idx[K];
        float *w_dev = be_alloc(b.gpu, K), wts[K];
        ON(b.gpu, moe_pick, &router, logits.gpu, 1, idx_dev, w_dev);
        ok(b.gpu, b.gpu->ops->to_host(b.gpu, idx, idx_dev, sizeof idx), "to_host");
        download(b.gpu, wts, w_dev, K);

        exo_linear picked[3 * K];
        const exo_linear *pg[2 * K], *pc[2 * K];
        exo_linear_pick_slots(picked, K, gpu_experts, table, E, idx_dev, 0);
        /* gate and up of the chosen experts, one x */
        dual x = dual_rand(&b, D, 1.0f), gu[2 * K];
        float *yc[2 * K], *yg[2 * K];
        for (int j = 0; j < 2 * K; j++) {
            gu[j] = dual_rand(&b, I, 1.0f);
            pg[j] = &picked[3 * (j / 2) + j % 2];
            pc[j] = &cpu_experts[3 * idx[j / 2] + j % 2];
            yc[j] = gu[j].cpu;
            yg[j] = gu[j].gpu;
        }
        ON(b.cpu, matmul, 2 * K, pc, x.cpu, 1, yc);
        ON(b.gpu, matmul, 2 * K, pg, x.gpu, 1, yg);
        for (int j = 0; j < 2 * K; j++)
            dual_check(&b, &gu[j], "matmul, picked experts", NMSE_GEMV, "%s, slot %d part %d", w[0].name, j / 2,
                       j % 2);
        /* down of each, its own x, and a fixed weight beside them (the shared expert's) */
        weight shared;
        weight_rand(&b, &shared, fmts[f], D, I);
        dual ye[K + 1];
        const float *xc[K + 1], *xg[K + 1];
        float *dc[K + 1], *dg[K + 1];
        for (int j = 0; j <= K; j++) {
            ye[j] = dual_rand(&b, D, 1.0f);
            pg[j] = j < K ? &picked[3 * j + 2] : &shared.gpu;
            pc[j] = j < K ? &cpu_experts[3 * idx[j] + 2] : &shared.cpu;
            xc[j] = gu[j % K].cpu;
            xg[j] = gu[j % K].gpu;
            dc[j] = ye[j].cpu;
            dg[j] = ye[j].gpu;
        }
        ON(b.cpu, matmul_each, K + 1, pc, xc, 1, dc);
        ON(b.gpu, matmul_each, K + 1, pg, xg, 1, dg);
        for (int j = 0; j <= K; j++)
            dual_check(&b, &ye[j], "matmul_each, picked experts", NMSE_GEMV, "%s, slot %d", w[0].name, j);
        /* the sum, a plain row then the weighted ones, as scatter_add_rows on the CPU */
        dual rows = dual_rand(&b, (size_t)(K + 1) * D, 1.0f), sum = dual_rand(&b, D, 1.0f);
        int32_t zero[K + 1] = {0};
        float scale[K + 1];
        for (int j = 0; j <= K; j++)
            scale[j] = j ? wts[j - 1] : 1.0f;
        ON(b.cpu, scatter_add_rows, sum.cpu, rows.cpu, zero, scale, K + 1, D);
        ON(b.gpu, add_weighted_rows, sum.gpu, rows.gpu, w_dev, 1, K, 1, D);
        dual_check(&b, &sum, "add_weighted_rows", NMSE_ELEMENTWISE, "%s", w[0].name);
        /* the chosen experts' biases (gpt-oss), as add_bias adds each one's */
        if (f == 0) {
            enum { STRIDE = 2 * I + D };
            dual bias = dual_rand(&b, (size_t)E * STRIDE, 1.0f), yb = dual_rand(&b, (size_t)K * D, 1.0f);
            for (int j = 0; j < K; j++)
                ON(b.cpu, add_bias, yb.cpu + (size_t)j * D, bias.cpu + (size_t)idx[j] * STRIDE + 2 * I, 1, D);
            ON(b.gpu, add_picked_bias, yb.gpu, bias.gpu + 2 * I, STRIDE, idx_dev, 1, K, D);
            dual_check(&b, &yb, "add_picked_bias", NMSE_EXACT, "k %d, dim %d", K, D);
            dual_free(&b, &bias);
            dual_free(&b, &yb);
        }

        dual_free(&b, &rows);
        dual_free(&b, &sum);
        for (int j = 0; j <= K; j++)
            dual_free(&b, &ye[j]);
        for (int j = 0; j < 2 * K; j++)
            dual_free(&b, &gu[j]);
        dual_free(&b, &x);
        dual_free(&b, &logits);
        weight_free(&shared);
        b.gpu->ops->release(b.gpu, idx_dev);
        b.gpu->ops->release(b.gpu, w_dev);
        b.gpu->ops->release(b.gpu, table);
        for (int e = 0; e < 3 * E; e++)
            weight_free(&w[e]);
        exo_free(w);
    }

    /* experts the GEMV cannot read from a choice: refused, not misread */
    weight odd[6];
    exo_linear mixed[6];
    for (int e = 0; e < 6; e++) {
        weight_rand(&b, &odd[e], e == 3 ? F_AFFINE(8, 64, BF16) : F_AFFINE(4, 64, BF16), 64, 128);
        mixed[e] = odd[e].gpu;
    }
    exo_err err = {0};
    cr_expect_null(b.gpu->ops->moe_pick_table(b.gpu, mixed, 2, &err), "experts of two formats were taken");
    cr_expect_eq(err.code, EXO_EUNSUPPORTED);
    for (int e = 0; e < 6; e++)
        weight_free(&odd[e]);
    weight three[3];
    exo_linear q3[3];
    for (int p = 0; p < 3; p++) {
        weight_rand(&b, &three[p], F_AFFINE(3, 64, BF16), 64, 128);
        q3[p] = three[p].gpu;
    }
    err = (exo_err){0};
    cr_expect_null(b.gpu->ops->moe_pick_table(b.gpu, q3, 1, &err), "3-bit experts were taken");
    cr_expect_eq(err.code, EXO_EUNSUPPORTED);
    for (int p = 0; p < 3; p++)
        weight_free(&three[p]);
    both_close(&b);
}

/* Decode of T tokens whose experts were picked on the device, all at
 * once (each weight's rows of x picking their own experts, pick_stride;
 * outputs slot-major): every token's products, sums and biases the bits
 * the same calls give that token alone, whatever T (batched decode gives
 * each sequence what it gets alone; rows that pick apart are products of
 * their own in the GEMV, never the widths' shared launches). */
Test(backend_ops, moe_pick_rows)
{
    both b = both_open("moe_pick_rows");
    if (!b.gpu->ops->moe_pick) {
        both_close(&b);
        cr_skip_test("the CUDA backend has no moe_pick");
    }
    exo_backend *g = b.gpu;
    enum { E = 12, K = 4, D = 512, I = 256, MAXT = 16 };
    const wfmt fmts[] = {F_AFFINE(4, 64, BF16), F_AFFINE(8, 32, F16), F_DENSE(BF16), F_MXFP4};
    const exo_moe_router router = {E, K, false, true, NULL, 1, 1, 1.0f};
    static const int Ts[] = {16, 8, 5, 2};
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
        weight *w = exo_calloc(3 * E, sizeof *w), shared;
        exo_linear experts[3 * E];
        for (int e = 0; e < 3 * E; e++) {
            weight_rand(&b, &w[e], fmts[f], e % 3 == 2 ? D : I, e % 3 == 2 ? I : D);
            experts[e] = w[e].gpu;
        }
        weight_rand(&b, &shared, fmts[f], D, I);
        exo_err err = {0};
        void *table = g->ops->moe_pick_table(g, experts, E, &err);
        cr_assert(table, "%s: moe_pick_table: %s", w[0].name, err.msg);
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            const int T = Ts[ti];
            const size_t TI = (size_t)T * I, TD = (size_t)T * D;
            dual logits = dual_rand(&b, (size_t)T * E, 2.0f), x = dual_rand(&b, TD, 1.0f);
            dual norm = dual_rand(&b, D, 1.0f);
            int32_t *idx = (int32_t *)be_alloc(g, (size_t)T * K);
            float *wts = be_alloc(g, (size_t)T * K);
            ON(g, moe_pick, &router, logits.gpu, T, idx, wts);
            exo_linear picked[3 * K], alone[3 * K];
            exo_linear_pick_slots(picked, K, experts, table, E, idx, K);
            memcpy(alone, picked, sizeof alone);
            /* gate and up of every token, x normed in the products */
            float *gu = be_alloc(g, 2 * K * TI), *gu1 = be_alloc(g, 2 * K * I);
            float *gate_up_host = exo_malloc(2 * K * TI * sizeof(float)), *one = exo_malloc(2 * K * I * sizeof(float));
            const exo_linear *pw[2 * K + 1];
            float *py[2 * K + 1];
            const float *px[K + 1];
            for (int j = 0; j < 2 * K; j++) {
                pw[j] = &picked[3 * (j / 2) + j % 2];
                py[j] = gu + (size_t)j * TI;
            }
            ON(g, matmul_fused, 2 * K, pw, x.gpu, norm.gpu, 1e-5f, false, T, py);
            download(g, gate_up_host, gu, 2 * K * TI);
            for (int t = 0; t < T; t++) {
                for (int j = 0; j < 2 * K; j++) {
                    alone[3 * (j / 2) + j % 2].pick = idx + (size_t)t * K + j / 2;
                    pw[j] = &alone[3 * (j / 2) + j % 2];
                    py[j] = gu1 + (size_t)j * I;
                }
                ON(g, matmul_fused, 2 * K, pw, x.gpu + (size_t)t * D, norm.gpu, 1e-5f, false, 1, py);
                download(g, one, gu1, 2 * K * I);
                for (int j = 0; j < 2 * K; j++)
                    cr_expect(!memcmp(gate_up_host + (size_t)j * TI + (size_t)t * I, one + (size_t)j * I,
                                      I * sizeof(float)),
                              "%s T %d: gate/up slot %d part %d of token %d not its bits alone", w[0].name, T, j / 2,
                              j % 2, t);
            }
            /* down: each slot's rows its own x, the shared expert beside
             * them; first with the activation applied as the products read
             * their inputs (matmul_glu: each slot's gate rows a copy of
             * their own, which the formats it does not fold activate in
             * place, restored before each call), then plain (matmul_each),
             * whose outputs the weighted sums below take */
            float *dn = be_alloc(g, (K + 1) * TD), *dn1 = be_alloc(g, (K + 1) * (size_t)D);
            float *down_host = exo_malloc((K + 1) * TD * sizeof(float));
            float *down1 = exo_malloc((K + 1) * D * sizeof(float));
            float *ga = be_alloc(g, (K + 1) * TI), *gs[K + 1];
            const float *us[K + 1];
            for (int act = g->ops->matmul_glu ? 1 : 0; act >= 0; act--) {
                const char *what = act ? "activated down" : "down";
                for (int t = -1; t < T; t++) { /* -1: all rows at once */
                    const size_t at = t < 0 ? 0 : (size_t)t;
                    for (int j = 0; j <= K; j++) {
                        pw[j] = j == K ? &shared.gpu : t < 0 ? &picked[3 * j + 2] : &alone[3 * j + 2];
                        if (j < K && t >= 0)
                            alone[3 * j + 2].pick = idx + at * K + j;
                        upload(g, ga + (size_t)j * TI, gate_up_host + (size_t)(2 * (j % K)) * TI, TI);
                        gs[j] = ga + (size_t)j * TI + at * I;
                        px[j] = gu + (size_t)(2 * (j % K)) * TI + at * I;
                        us[j] = gu + (size_t)(2 * (j % K) + 1) * TI + at * I;
                        py[j] = t < 0 ? dn + (size_t)j * TD : dn1 + (size_t)j * D;
                    }
                    if (act)
                        ON(g, matmul_glu, K + 1, pw, EXO_GLU_SILU, gs, us, 0.0f, false, t < 0 ? T : 1, py);
                    else
                        ON(g, matmul_each, K + 1, pw, px, t < 0 ? T : 1, py);
                    if (t < 0) {
                        download(g, down_host, dn, (K + 1) * TD);
                        continue;
                    }
                    download(g, down1, dn1, (K + 1) * (size_t)D);
                    for (int j = 0; j <= K; j++)
                        cr_expect(!memcmp(down_host + (size_t)j * TD + at * D, down1 + (size_t)j * D,
                                          D * sizeof(float)),
                                  "%s T %d: %s %d of token %d not its bits alone", w[0].name, T, what, j, t);
                }
            }
            g->ops->release(g, ga);
            /* the weighted sums (the shared row first) and the picked biases */
            if (f == 0) {
                enum { STRIDE = 2 * I + D };
                dual bias = dual_rand(&b, (size_t)E * STRIDE, 1.0f), sum = dual_rand(&b, TD, 1.0f);
                float *src1 = be_alloc(g, (K + 1) * (size_t)D), *row = exo_malloc(D * sizeof(float));
                float *sum_host = exo_malloc(TD * sizeof(float));
                float *biased = exo_malloc(K * TD * sizeof(float));
                ON(g, add_picked_bias, dn + TD, bias.gpu + 2 * I, STRIDE, idx, T, K, D);
                download(g, biased, dn + TD, K * TD);
                ON(g, add_weighted_rows, sum.gpu, dn, wts, T, K, 1, D);
                download(g, sum_host, sum.gpu, TD);
                for (int t = 0; t < T; t++) {
                    for (int j = 0; j <= K; j++) /* token t's rows side by side, unbiased */
                        upload(g, src1 + (size_t)j * D, down_host + (size_t)j * TD + (size_t)t * D, D);
                    ON(g, add_picked_bias, src1 + D, bias.gpu + 2 * I, STRIDE, idx + (size_t)t * K, 1, K, D);
                    download(g, down1, src1, (K + 1) * (size_t)D);
                    for (int j = 0; j < K; j++)
                        cr_expect(!memcmp(biased + (size_t)j * TD + (size_t)t * D, down1 + (size_t)(j + 1) * D,
                                          D * sizeof(float)),
                                  "T %d: the bias of slot %d of token %d not as alone", T, j, t);
                    float *s1 = be_alloc(g, D);
                    upload(g, s1, sum.init + (size_t)t * D, D);
                    ON(g, add_weighted_rows, s1, src1, wts + (size_t)t * K, 1, K, 1, D);
                    download(g, row, s1, D);
                    cr_expect(!memcmp(sum_host + (size_t)t * D, row, D * sizeof(float)),
                              "T %d: the weighted sum of token %d not as alone", T, t);
                    g->ops->release(g, s1);
                }
                g->ops->release(g, src1);
                exo_free(row);
                exo_free(sum_host);
                exo_free(biased);
                dual_free(&b, &bias);
                dual_free(&b, &sum);
            }
            g->ops->release(g, dn);
            g->ops->release(g, dn1);
            exo_free(down_host);
            exo_free(down1);
            g->ops->release(g, gu);
            g->ops->release(g, gu1);
            exo_free(gate_up_host);
            exo_free(one);
            g->ops->release(g, idx);
            g->ops->release(g, wts);
            dual_free(&b, &logits);
            dual_free(&b, &x);
            dual_free(&b, &norm);
        }
        g->ops->release(g, table);
        weight_free(&shared);
        for (int e = 0; e < 3 * E; e++)
            weight_free(&w[e]);
        exo_free(w);
    }
    both_close(&b);
}

Test(backend_ops, gather_rows)
{
    both b = both_open("gather_rows");
    static const int cases[][3] = {{40, 384, 25}, {64, 2048, 64}, {5, 2880, 1}, {200, 64, 300}}; /* R, dim, n */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int R = cases[i][0], dim = cases[i][1], n = cases[i][2];
        int32_t *rows = exo_malloc((size_t)n * sizeof(int32_t));
        for (int j = 0; j < n; j++) /* the last row, the first, repeats */
            rows[j] = j == 0 ? R - 1 : j == n - 1 ? 0 : j % 4 == 0 ? rows[j - 1] : rng_int(R);
        dual src = dual_rand(&b, (size_t)R * dim, 1.0f), dst = dual_rand(&b, (size_t)n * dim, 1.0f);
        ON(b.cpu, gather_rows, dst.cpu, src.cpu, rows, n, dim);
        ON(b.gpu, gather_rows, dst.gpu, src.gpu, rows, n, dim);
        dual_check(&b, &dst, "gather_rows", NMSE_EXACT, "R %d dim %d n %d", R, dim, n);
        dual_free(&b, &src);
        dual_free(&b, &dst);
        exo_free(rows);
    }
    both_close(&b);
}

Test(backend_ops, scatter_add_rows)
{
    both b = both_open("scatter_add_rows");
    enum { DISTINCT, REPEATED, ALL_ZERO };
    static const struct {
        int R, dim, n, kind;
    } cases[] = {
        {33, 512, 20, DISTINCT},  /* a prompt's tokens routed to one expert */
        {8, 2880, 40, REPEATED},  /* many repeats of few rows */
        {1, 2048, 9, ALL_ZERO},   /* decode: k experts and a shared one, all into row 0 */
        {1, 7168, 8, ALL_ZERO},
        {64, 1024, 64, DISTINCT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int R = cases[i].R, dim = cases[i].dim, n = cases[i].n;
        int32_t *rows = exo_malloc((size_t)n * sizeof(int32_t));
        float *scale = exo_malloc((size_t)n * sizeof(float));
        for (int j = 0; j < n; j++) {
            rows[j] = cases[i].kind == REPEATED ? rng_int(R) : 0;
            scale[j] = 0.5f + (float)rng_uniform();
        }
        if (cases[i].kind == DISTINCT) /* n of the R rows, increasing (selection sampling) */
            for (int r = 0, j = 0; r < R && j < n; r++)
                if (rng_int(R - r) < n - j)
                    rows[j++] = r;
        dual src = dual_rand(&b, (size_t)n * dim, 1.0f), dst = dual_rand(&b, (size_t)R * dim, 1.0f);
        ON(b.cpu, scatter_add_rows, dst.cpu, src.cpu, rows, scale, n, dim);
        ON(b.gpu, scatter_add_rows, dst.gpu, src.gpu, rows, scale, n, dim);
        dual_check(&b, &dst, "scatter_add_rows", NMSE_ELEMENTWISE, "R %d dim %d n %d kind %d", R, dim, n,
                   cases[i].kind);
        dual_free(&b, &src);
        dual_free(&b, &dst);
        exo_free(rows);
        exo_free(scale);
    }
    both_close(&b);
}

/* copy2d into a strided destination at an offset within its rows
 * (latent attention assembling [rope | latent] rows). */
Test(backend_ops, copy2d)
{
    both b = both_open("copy2d");
    static const struct {
        int rows, cols, dst_ld, src_ld, dst_off;
    } cases[] = {
        {7 * 16, 64, 576, 192, 0}, /* queries' rope parts */
        {7, 64, 576, 64, 0},       /* the key's rope part */
        {7, 512, 576, 512, 64},    /* the latent after it */
        {1, 100, 100, 100, 0},     /* contiguous */
        {300, 1, 3, 2, 1},         /* one column */
        {64, 130, 200, 131, 70},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rows = cases[i].rows, cols = cases[i].cols;
        size_t dld = (size_t)cases[i].dst_ld, sld = (size_t)cases[i].src_ld, off = (size_t)cases[i].dst_off;
        dual src = dual_rand(&b, (size_t)rows * sld, 1.0f), dst = dual_rand(&b, (size_t)rows * dld, 1.0f);
        ON(b.cpu, copy2d, dst.cpu + off, dld, src.cpu, sld, rows, cols);
        ON(b.gpu, copy2d, dst.gpu + off, dld, src.gpu, sld, rows, cols);
        dual_check(&b, &dst, "copy2d", NMSE_EXACT, "%d x %d, ld %zu <- %zu, at %zu", rows, cols, dld, sld, off);
        dual_free(&b, &src);
        dual_free(&b, &dst);
    }
    both_close(&b);
}

/* ---- Gated DeltaNet -------------------------------------------------------------- */

typedef struct gdn_cfg {
    int Hk, Hv, Dk, Dv, K;
} gdn_cfg;

/* The linear-attention chain of model.c's linear_forward over calls[],
 * continuing from a random non-zero state (conv window and delta state in
 * one block, as a sequence keeps them): conv1d_silu over packed q|k|v
 * rows, gated_delta on strided views of its output, rmsnorm_gated with a
 * strided gate. Each op starts from the CPU's inputs (mirrored), while
 * each backend's state carries on from its own previous call. */
static void linear_attn_sequence(both *b, const gdn_cfg *c, const int *calls, int n_calls)
{
    const int KD = c->Hk * c->Dk, VD = c->Hv * c->Dv, CD = 2 * KD + VD, K = c->K;
    const int xs = CD + 8, os = CD + 4, ab_stride = 2 * c->Hv + 3, zs = VD + 32; /* row strides */
    const size_t conv_n = (size_t)(K - 1) * CD, S_n = (size_t)c->Hv * c->Dk * c->Dv;
    dual state = dual_rand(b, conv_n + S_n, 0.5f);
    dvec conv_w = vec_rand(b, EXO_DTYPE_BF16, (size_t)CD * K, 0.0f, 0.5f);
    float A[64];
    for (int h = 0; h < c->Hv; h++)
        A[h] = (float)log(1.0 + 15.0 * rng_uniform());
    dvec A_log = vec_load(b, EXO_DTYPE_F32, A, (size_t)c->Hv);
    dvec dt_bias = vec_rand(b, EXO_DTYPE_BF16, (size_t)c->Hv, 0.0f, 0.5f);
    dvec norm_w = vec_rand(b, EXO_DTYPE_BF16, (size_t)c->Dv, 1.0f, 0.1f);
    for (int i = 0; i < n_calls; i++) {
        const int T = calls[i];
        char what[96];
        snprintf(what, sizeof what, "Hk %d Hv %d Dk %d Dv %d K %d: call %d, T %d", c->Hk, c->Hv, c->Dk, c->Dv, K,
                 i, T);
        dual x = dual_rand(b, (size_t)T * xs, 1.0f), conv = dual_rand(b, (size_t)T * os, 1.0f);
        ON(b->cpu, conv1d_silu, conv.cpu, os, x.cpu, xs, conv_w.cpu, state.cpu, T, CD, K);
        ON(b->gpu, conv1d_silu, conv.gpu, os, x.gpu, xs, conv_w.gpu, state.gpu, T, CD, K);
        dual_check(b, &conv, "conv1d_silu", NMSE_ELEMENTWISE, "%s", what);
        dual_check_part(b, &state, 0, conv_n, "conv1d_silu state", NMSE_EXACT, "%s", what);
        dual_mirror(b, &conv);

        /* b at column 0 and a at column Hv of packed rows */
        dual ab = dual_rand(b, (size_t)T * ab_stride, 1.0f), out = dual_rand(b, (size_t)T * VD, 1.0f);
        ON(b->cpu, gated_delta, out.cpu, conv.cpu, conv.cpu + KD, os, conv.cpu + 2 * KD, os, ab.cpu + c->Hv, ab.cpu,
           ab_stride, A_log.cpu, dt_bias.cpu, state.cpu + conv_n, T, c->Hk, c->Hv, c->Dk, c->Dv);
        ON(b->gpu, gated_delta, out.gpu, conv.gpu, conv.gpu + KD, os, conv.gpu + 2 * KD, os, ab.gpu + c->Hv, ab.gpu,
           ab_stride, A_log.gpu, dt_bias.gpu, state.gpu + conv_n, T, c->Hk, c->Hv, c->Dk, c->Dv);
        dual_check(b, &out, "gated_delta", NMSE_DELTA, "%s", what);
        dual_check_part(b, &state, conv_n, S_n, "gated_delta state", NMSE_DELTA, "%s", what);
        dual_mirror(b, &out);

        dual z = dual_rand(b, (size_t)T * zs, 1.0f);
        ON(b->cpu, rmsnorm_gated, out.cpu, z.cpu, zs, norm_w.cpu, T, c->Hv, c->Dv, 1e-6f);
        ON(b->gpu, rmsnorm_gated, out.gpu, z.gpu, zs, norm_w.gpu, T, c->Hv, c->Dv, 1e-6f);
        dual_check(b, &out, "rmsnorm_gated", NMSE_ELEMENTWISE, "%s", what);
        dual_free(b, &x);
        dual_free(b, &conv);
        dual_free(b, &ab);
        dual_free(b, &out);
        dual_free(b, &z);
    }
    dual_free(b, &state);
    vec_free(b, &conv_w);
    vec_free(b, &A_log);
    vec_free(b, &dt_bias);
    vec_free(b, &norm_w);
}

Test(backend_ops, linear_attention)
{
    both b = both_open("linear_attention");
    /* Qwen3.5-like (a small one's head counts), decode first from the
     * random state, then prefills and decode */
    const gdn_cfg qwen35 = {2, 4, 128, 128, 4};
    static const int seq[] = {1, 64, 5, 1, 1, 64, 1};
    linear_attn_sequence(&b, &qwen35, seq, (int)(sizeof seq / sizeof seq[0]));
    /* Qwen3-Next's head counts */
    const gdn_cfg next = {16, 32, 128, 128, 4};
    static const int seq2[] = {5, 64, 1, 1};
    linear_attn_sequence(&b, &next, seq2, (int)(sizeof seq2 / sizeof seq2[0]));
    /* the tiny parity fixtures' heads (tests/fixtures/qwen3_5-*: 32 wide),
     * whose logits on the GPU were off where the CPU's are not */
    const gdn_cfg tiny = {2, 4, 32, 32, 4};
    static const int seq3[] = {80, 1, 16, 16, 1, 1};
    linear_attn_sequence(&b, &tiny, seq3, (int)(sizeof seq3 / sizeof seq3[0]));
    both_close(&b);
}

/* Where the plugin was built, it loads, GPU or not: every symbol it takes
 * from the executable resolves and its ABI matches (what a machine without
 * a GPU can check of it). A missing GPU is the only reason left to fail. */
Test(backend_ops, plugin_loads_where_built)
{
    char path[4096];
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 32);
    cr_assert(n > 0);
    path[n] = 0;
    char *slash = strrchr(path, '/');
    strcpy(slash ? slash + 1 : path, "libexo_cuda.so");
    if (access(path, F_OK) || getenv("EXO_CUDA_PLUGIN"))
        cr_skip_test("no plugin beside the test binary (built without nvcc)");
    exo_err err = {0};
    exo_backend *be = exo_backend_cuda_create(0, &err);
    if (be) {
        be->ops->free(be);
        return;
    }
    cr_assert(!strstr(err.msg, "cannot load") && !strstr(err.msg, "another version"), "%s", err.msg);
    cr_log_info("plugin loaded; no GPU here: %s", err.msg);
}

/* ---- where a model's layers run (model.c) -------------------------------- */

#include "engine/model.h"
#include "engine/synthetic.h"

/* A tiny synthetic qwen3 (2 layers, tied embeddings) on `device`. */
static int tiny_model(const char *device, int gpu_layers, exo_synth **syn, exo_model **m, exo_err *err)
{
    exo_synth_quant q;
    cr_assert_eq(exo_synth_quant_parse("q4", &q), 0);
    cr_assert_eq(exo_synth_create("tiny-qwen3", q, 7, syn, err), 0, "%s", err->msg);
    exo_model_opts o = {.n_threads = 1, .device = device, .gpu_layers = gpu_layers};
    return exo_synth_build(*syn, &o, m, err);
}

Test(backend_ops, device_option_without_a_gpu_is_clear)
{
    exo_err err = {0};
    exo_synth *syn = NULL;
    exo_model *m = NULL;
    cr_assert_eq(tiny_model("tpu", 0, &syn, &m, &err), EXO_EINVAL);
    cr_assert(strstr(err.msg, "device 'tpu'"), "%s", err.msg);
    exo_synth_free(syn);
    cr_assert_eq(tiny_model("cpu", 0, &syn, &m, &err), 0, "%s", err.msg);
    cr_assert_eq(exo_model_gpu_layers(m), 0);
    cr_assert_eq(exo_model_gpu_device(m), -1);
    exo_model_free(m);
    exo_synth_free(syn);
    if (exo_backend_cuda_devices() > 0)
        cr_skip_test("this machine has a GPU: see gpu_and_cpu_layers_agree");
    /* "auto" falls back to the CPU; a GPU asked by name is an error that says why */
    cr_assert_eq(tiny_model(NULL, 0, &syn, &m, &err), 0, "%s", err.msg);
    cr_assert_eq(exo_model_gpu_layers(m), 0);
    exo_model_free(m);
    exo_synth_free(syn);
    m = NULL;
    cr_assert_eq(tiny_model("cuda", 0, &syn, &m, &err), EXO_EUNSUPPORTED);
    cr_assert(m == NULL);
    cr_assert(strstr(err.msg, "CUDA"), "%s", err.msg);
    exo_synth_free(syn);
}

/* The same model wholly on the GPU, split (layer 0 on the GPU, layer 1 and
 * the LM head on the CPU: the residual stream crosses over, the tied head
 * is bound again on the CPU) and wholly on the CPU: the same logits, prompt
 * and decode steps, within the GEMV/GEMM paths' rounding. */
Test(backend_ops, gpu_and_cpu_layers_agree)
{
    exo_err err = {0};
    if (exo_backend_cuda_devices() <= 0)
        cr_skip_test("needs a GPU");
    const char *dev[3] = {"cpu", "cuda", "cuda"};
    int gpu_layers[3] = {0, 0, 1}, want_layers[3] = {0, 2, 1};
    float *logits[3];
    int V = 0;
    int32_t prompt[12] = {1, 5, 9, 200, 17, 33, 8, 100, 250, 3, 77, 42};
    for (int k = 0; k < 3; k++) {
        exo_synth *syn = NULL;
        exo_model *m = NULL;
        exo_seq *s = NULL;
        cr_assert_eq(tiny_model(dev[k], gpu_layers[k], &syn, &m, &err), 0, "%s", err.msg);
        cr_assert_eq(exo_model_gpu_layers(m), want_layers[k]);
        cr_assert_eq(exo_model_gpu_device(m), want_layers[k] ? 0 : -1);
        V = exo_model_vocab(m);
        logits[k] = malloc(sizeof(float) * (size_t)V * 4);
        cr_assert_eq(exo_seq_create(m, 64, &s, &err), 0, "%s", err.msg);
        cr_assert_eq(exo_model_forward(m, s, prompt, 12, logits[k], false, &err), 0, "%s", err.msg);
        for (int step = 1; step < 4; step++)
            cr_assert_eq(exo_model_forward(m, s, &prompt[step], 1, logits[k] + (size_t)step * V, false, &err), 0,
                         "%s", err.msg);
        exo_seq_free(s);
        exo_model_free(m);
        exo_synth_free(syn);
    }
    for (int k = 1; k < 3; k++) {
        double num = 0, den = 0;
        for (size_t i = 0; i < (size_t)V * 4; i++) {
            double d = (double)logits[k][i] - logits[0][i];
            num += d * d;
            den += (double)logits[0][i] * logits[0][i];
        }
        cr_log_info("%s, %d GPU layers: logits NMSE %.3e against the CPU", dev[k], want_layers[k], num / den);
        cr_expect(num / den < NMSE_GEMM, "%d GPU layers: NMSE %.3e", want_layers[k], num / den);
    }
    for (int k = 0; k < 3; k++)
        free(logits[k]);
}

/* Decode steps of a model wholly on the GPU replay a recording (a
 * sequence's first step runs op by op, the second is recorded, the rest
 * replay it, reading the token and the position on the device): the
 * logits the op-by-op steps give, for two sequences taking turns, each
 * with its own recording and cache. The recorded attention is split for
 * the whole cache rather than the positions so far, so the sums may
 * round differently: NMSE, not equality. */
static void recorded_against_eager(const char *cache)
{
    exo_err err = {0};
    setenv("EXO_KV_CACHE", cache, 1);
    enum { STEPS = 12 };
    int32_t prompt[2][9] = {{1, 5, 9, 200, 17, 33, 8, 100, 250}, {4, 4, 61, 2, 90, 13, 7, 21, 230}};
    float *out[2][2];
    int V = 0;
    for (int rec = 0; rec < 2; rec++) {
        setenv("EXO_CUDA_GRAPH", rec ? "1" : "0", 1);
        exo_synth *syn = NULL;
        exo_model *m = NULL;
        exo_seq *s[2];
        cr_assert_eq(tiny_model("cuda", 0, &syn, &m, &err), 0, "%s", err.msg);
        V = exo_model_vocab(m);
        for (int q = 0; q < 2; q++) {
            out[rec][q] = malloc(sizeof(float) * (size_t)V * STEPS);
            cr_assert_eq(exo_seq_create(m, 300, &s[q], &err), 0, "%s", err.msg);
            cr_assert_eq(exo_model_forward(m, s[q], prompt[q], 5 + 4 * q, out[rec][q], false, &err), 0, "%s",
                         err.msg);
        }
        for (int step = 0; step < STEPS; step++)
            for (int q = 0; q < 2; q++) {
                int32_t tok = (int32_t)((step * 37 + q * 11) % 250);
                cr_assert_eq(exo_model_forward(m, s[q], &tok, 1, out[rec][q] + (size_t)step * V, false, &err), 0,
                             "%s", err.msg);
            }
        long replayed = exo_model_replayed_steps(m);
        cr_log_info("%s cache, graphs %s: %ld of %d decode steps replayed", cache, rec ? "on" : "off", replayed,
                    2 * STEPS);
        /* a sequence's first step is eager, its second recorded; a recording
         * that had to grow a scratch buffer is thrown away and made again */
        if (rec)
            cr_expect(replayed >= 2 * (STEPS - 3), "replayed %ld", replayed);
        else
            cr_expect_eq(replayed, 0);
        for (int q = 0; q < 2; q++)
            exo_seq_free(s[q]);
        exo_model_free(m);
        exo_synth_free(syn);
    }
    unsetenv("EXO_CUDA_GRAPH");
    unsetenv("EXO_KV_CACHE");
    for (int q = 0; q < 2; q++) {
        double num = 0, den = 0;
        for (size_t i = 0; i < (size_t)V * STEPS; i++) {
            double d = (double)out[1][q][i] - out[0][q][i];
            num += d * d;
            den += (double)out[0][q][i] * out[0][q][i];
        }
        cr_log_info("%s cache, sequence %d: recorded against op-by-op NMSE %.3e", cache, q, num / den);
        cr_expect(num / den < 1e-10, "%s cache, sequence %d: NMSE %.3e", cache, q, num / den);
        free(out[0][q]);
        free(out[1][q]);
    }
}

/* ... with the caches in f32 and in bf16 (EXO_KV_CACHE) */
Test(backend_ops, recorded_decode_steps_match_eager)
{
    if (exo_backend_cuda_devices() <= 0)
        cr_skip_test("needs a GPU");
    recorded_against_eager("f32");
    recorded_against_eager("bf16");
}

/* Decode on the GPU reads a layer's o, gate and up weights into L2 while
 * attention runs (backend.h prefetch, on a stream of its own that a
 * recording forks and joins; here for weights of any size): recorded
 * steps still replay, and the logits are the same bits as with prefetch
 * off (EXO_CUDA_PREFETCH_MB=0). */
Test(backend_ops, prefetch_changes_no_bits)
{
    exo_err err = {0};
    if (exo_backend_cuda_devices() <= 0)
        cr_skip_test("needs a GPU");
    enum { STEPS = 10 };
    const int32_t prompt[7] = {3, 77, 19, 240, 5, 61, 12};
    float *out[2] = {NULL, NULL};
    int V = 0;
    for (int on = 0; on < 2; on++) {
        setenv("EXO_CUDA_PREFETCH_MB", on ? "1000" : "0", 1);
        setenv("EXO_CUDA_PREFETCH_MIN_MB", "0", 1); /* the tiny model's weights too */
        exo_synth *syn = NULL;
        exo_model *m = NULL;
        exo_seq *s = NULL;
        cr_assert_eq(tiny_model("cuda", 0, &syn, &m, &err), 0, "%s", err.msg);
        V = exo_model_vocab(m);
        out[on] = malloc(sizeof(float) * (size_t)V * (STEPS + 1));
        cr_assert_eq(exo_seq_create(m, 64, &s, &err), 0, "%s", err.msg);
        cr_assert_eq(exo_model_forward(m, s, prompt, 7, out[on], false, &err), 0, "%s", err.msg);
        for (int step = 0; step < STEPS; step++) {
            int32_t tok = (int32_t)((step * 53 + 7) % 250);
            cr_assert_eq(exo_model_forward(m, s, &tok, 1, out[on] + (size_t)(step + 1) * V, false, &err), 0, "%s",
                         err.msg);
        }
        long replayed = exo_model_replayed_steps(m), started = exo_model_prefetches(m);
        cr_expect(replayed >= STEPS - 3, "prefetch %s: replayed %ld of %d steps", on ? "on" : "off", replayed, STEPS);
        if (on)
            cr_expect(started > 0, "prefetch on, but none started");
        else
            cr_expect_eq(started, 0, "prefetch off, yet %ld started", started);
        exo_seq_free(s);
        exo_model_free(m);
        exo_synth_free(syn);
    }
    unsetenv("EXO_CUDA_PREFETCH_MB");
    unsetenv("EXO_CUDA_PREFETCH_MIN_MB");
    cr_expect(!memcmp(out[0], out[1], sizeof(float) * (size_t)V * (STEPS + 1)), "prefetch changed the logits");
    free(out[0]);
    free(out[1]);
}

/* gpt-oss decode on the GPU picks its experts there, their biases too
 * (add_picked_bias), so its steps are recorded and replayed like a dense
 * model's: the same logits as routing on the host (EXO_MOE_PATH=host-route,
 * op by op), to the router's rounding (moe_pick's weights). */
Test(backend_ops, gpt_oss_decode_routes_on_the_device)
{
    exo_err err = {0};
    if (exo_backend_cuda_devices() <= 0)
        cr_skip_test("needs a GPU");
    enum { STEPS = 8 };
    int32_t prompt[7] = {1, 5, 9, 200, 17, 33, 8};
    float *out[2];
    long replayed[2];
    int V = 0;
    for (int dev = 0; dev < 2; dev++) {
        if (dev)
            unsetenv("EXO_MOE_PATH");
        else
            setenv("EXO_MOE_PATH", "host-route", 1);
        exo_model *m = NULL;
        exo_seq *s = NULL;
        exo_model_opts o = {.n_threads = 1, .device = "cuda"};
        cr_assert_eq(exo_model_load("tests/fixtures/gpt_oss-mxfp4", &o, &m, &err), 0, "%s", err.msg);
        V = exo_model_vocab(m);
        out[dev] = malloc(sizeof(float) * (size_t)V * STEPS);
        cr_assert_eq(exo_seq_create(m, 64, &s, &err), 0, "%s", err.msg);
        cr_assert_eq(exo_model_forward(m, s, prompt, 7, out[dev], false, &err), 0, "%s", err.msg);
        for (int step = 1; step < STEPS; step++) {
            int32_t tok = (int32_t)((step * 37) % V);
            cr_assert_eq(exo_model_forward(m, s, &tok, 1, out[dev] + (size_t)step * V, false, &err), 0, "%s",
                         err.msg);
        }
        replayed[dev] = exo_model_replayed_steps(m);
        exo_seq_free(s);
        exo_model_free(m);
    }
    unsetenv("EXO_MOE_PATH");
    cr_expect_eq(replayed[0], 0, "routed on the host, no step can be recorded");
    cr_expect_gt(replayed[1], 0, "routed on the device, decode steps replay a recording");
    double num = 0, den = 0;
    for (size_t i = 0; i < (size_t)V * STEPS; i++) {
        double d = (double)out[1][i] - out[0][i];
        num += d * d;
        den += (double)out[0][i] * out[0][i];
    }
    cr_log_info("gpt-oss: %ld of %d steps replayed; device route against host route NMSE %.3e", replayed[1],
                STEPS - 1, num / den);
    cr_expect(num / den < NMSE_GEMV, "NMSE %.3e", num / den);
    free(out[0]);
    free(out[1]);
}

/* Host memory from host_alloc takes to_host's copies (whole, and a piece
 * inside it, large enough that other memory would be staged); host_free
 * gives it back and refuses memory it did not give. */
Test(backend_ops, host_memory_takes_copies)
{
    both b = both_open("host_memory_takes_copies");
    enum { N = 1 << 18 };
    dual x = dual_rand(&b, N, 1.0f);
    float *h = b.gpu->ops->host_alloc(b.gpu, sizeof(float) * N);
    cr_assert(h, "no pinned memory");
    ON(b.gpu, to_host, h, x.gpu, sizeof(float) * N);
    cr_expect(!memcmp(h, x.init, sizeof(float) * N), "the whole copy differs");
    memset(h, 0, sizeof(float) * N);
    ON(b.gpu, to_host, h + 1000, x.gpu + 5, sizeof(float) * (N / 2));
    cr_expect(!memcmp(h + 1000, x.init + 5, sizeof(float) * (N / 2)) && h[999] == 0.0f && h[1000 + N / 2] == 0.0f,
              "a piece copied inside it differs or spilled");
    float other;
    cr_expect(!b.gpu->ops->host_free(b.gpu, &other));
    cr_expect(b.gpu->ops->host_free(b.gpu, h));
    dual_free(&b, &x);
    both_close(&b);
}

/* backend.h pick's answers as ids (-1: not picked) and log-probabilities. */
static int pick_ids(exo_backend *be, float *x, int rows, int n, const exo_pick_rule *rules, int32_t *id, float *lp)
{
    exo_pick got[EXO_PICK_ROWS + 1];
    int rc = be->ops->pick(be, x, rows, n, rules, got);
    for (int r = 0; !rc && r < rows; r++) {
        id[r] = got[r].picked ? got[r].id : -1;
        lp[r] = got[r].logprob;
    }
    return rc;
}

/* Where the host's draw with temperature T and number u lands: the CDF of
 * exp((x - max) / T) in double, in index order; *margin is how far u is
 * from the nearest boundary between two tokens, as a share of the total. */
static int host_draw(const float *x, int n, float T, double u, double *margin)
{
    float mx = x[0];
    for (int i = 1; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    double total = 0, acc = 0;
    for (int i = 0; i < n; i++)
        total += exp((double)(x[i] - mx) / T);
    double r = u * total;
    for (int i = 0; i < n; i++) {
        double w = exp((double)(x[i] - mx) / T);
        if (r < acc + w) {
            *margin = fmin(r - acc, acc + w - r) / total;
            return i;
        }
        acc += w;
    }
    *margin = 0;
    return n - 1;
}

/* The device's pick against the host's. Greedy rows: the lowest index of
 * the largest value (ties, NaN and -inf among the values) and its
 * log-softmax. Rows drawn with a temperature: the token whose span of the
 * CDF holds u (the host's order of sums differs, so u within 1e-5 of a
 * boundary is not checked), and u spread evenly over [0, 1) gives each
 * token its softmax share. Each row of a call of several as alone (the
 * same bits). Then a model's greedy steps, picked in place, against the
 * argmax of the logits the same steps give on another sequence. */
Test(backend_ops, pick_greedy_and_drawn)
{
    both b = both_open("pick_greedy_and_drawn");
    static const int sizes[] = {1, 7, 1000, 128256};
    enum { ROWS = 6 }; /* plain, a tie (the lower index wins), NaN and -inf (never win); then three drawn */
    static const float temps[ROWS] = {0, 0, 0, 1.0f, 0.7f, 1.3f};
    static const double us[ROWS] = {0, 0, 0, 0.1234, 0.5, 0.987};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        int n = sizes[k];
        dual x = dual_rand(&b, (size_t)n * ROWS, 3.0f);
        if (n > 2) {
            x.init[n + n / 3] = x.init[n + n - 1] = 50.0f;
            x.init[2 * n] = NAN;
            x.init[2 * n + 1] = -INFINITY;
        }
        upload(b.gpu, x.gpu, x.init, x.n);
        exo_pick_rule rules[ROWS];
        for (int r = 0; r < ROWS; r++)
            rules[r] = (exo_pick_rule){.temperature = temps[r], .u = us[r]};
        int32_t id[ROWS], alone_id;
        float lp[ROWS], alone_lp;
        ok(b.gpu, pick_ids(b.gpu, x.gpu, ROWS, n, rules, id, lp), "pick");
        for (int r = 0; r < ROWS; r++) {
            const float *h = x.init + (size_t)r * (size_t)n;
            double margin = 1;
            int want = temps[r] > 0 ? host_draw(h, n, temps[r], us[r], &margin) : exo_cpu_argmax_f32(h, n);
            int best = exo_cpu_argmax_f32(h, n);
            double sum = 0;
            for (int i = 0; i < n; i++)
                if (!isnan(h[i]))
                    sum += exp((double)h[i] - h[best]);
            double want_lp = (double)h[want] - h[best] - log(sum);
            if (margin > 1e-5)
                cr_expect_eq(id[r], want, "n %d row %d: %d, not %d", n, r, id[r], want);
            cr_expect(fabs(lp[r] - want_lp) < 1e-5 * (1 + fabs(want_lp)), "n %d row %d: logprob %g, not %g", n, r,
                      lp[r], want_lp);
            ok(b.gpu, pick_ids(b.gpu, x.gpu + (size_t)r * n, 1, n, &rules[r], &alone_id, &alone_lp), "pick");
            cr_expect(alone_id == id[r] && !memcmp(&alone_lp, &lp[r], sizeof alone_lp),
                      "n %d row %d: alone %d %a, beside others %d %a", n, r, alone_id, alone_lp, id[r], lp[r]);
        }
        cr_expect_eq(pick_ids(b.gpu, x.gpu, EXO_PICK_ROWS + 1, 1, rules, id, lp), EXO_EINVAL);
        dual_free(&b, &x);
    }
    { /* 16 rows of one distribution, u spread evenly: each token its share */
        enum { N = 5, CALLS = 64 };
        const float l[N] = {1.0f, 2.5f, 0.0f, 2.5f, -1.0f};
        dual x = dual_rand(&b, (size_t)N * EXO_PICK_ROWS, 1.0f);
        for (int r = 0; r < EXO_PICK_ROWS; r++)
            memcpy(x.init + r * N, l, sizeof l);
        upload(b.gpu, x.gpu, x.init, x.n);
        int count[N] = {0};
        for (int c = 0; c < CALLS; c++) {
            exo_pick_rule rules[EXO_PICK_ROWS];
            int32_t id[EXO_PICK_ROWS];
            float lp[EXO_PICK_ROWS];
            for (int r = 0; r < EXO_PICK_ROWS; r++)
                rules[r] = (exo_pick_rule){.temperature = 0.8f,
                                           .u = ((double)(c * EXO_PICK_ROWS + r) + 0.5) / (CALLS * EXO_PICK_ROWS)};
            ok(b.gpu, pick_ids(b.gpu, x.gpu, EXO_PICK_ROWS, N, rules, id, lp), "pick");
            for (int r = 0; r < EXO_PICK_ROWS; r++)
                count[id[r]]++;
        }
        double z = 0;
        for (int i = 0; i < N; i++)
            z += exp(l[i] / 0.8);
        for (int i = 0; i < N; i++) {
            double share = (double)count[i] / (CALLS * EXO_PICK_ROWS), p = exp(l[i] / 0.8) / z;
            cr_expect(fabs(share - p) < 2.0 / (CALLS * EXO_PICK_ROWS), "token %d: %g of the draws, p %g", i, share, p);
        }
        dual_free(&b, &x);
    }
    both_close(&b);

    exo_err err = {0};
    exo_synth *syn = NULL;
    exo_model *m = NULL;
    exo_seq *s[2];
    cr_assert_eq(tiny_model("cuda", 0, &syn, &m, &err), 0, "%s", err.msg);
    int V = exo_model_vocab(m);
    float *logits = malloc(sizeof(float) * (size_t)V);
    int32_t tok[2] = {3, 3};
    for (int q = 0; q < 2; q++)
        cr_assert_eq(exo_seq_create(m, 64, &s[q], &err), 0, "%s", err.msg);
    for (int step = 0; step < 10; step++) {
        static const exo_pick_rule greedy = {0};
        exo_step g = {.T = 1, .tokens = &tok[0], .logits = logits, .pick = &greedy};
        cr_assert_eq(exo_model_step(m, s[0], &g, &err), 0, "%s", err.msg);
        cr_assert(g.token.picked, "step %d: the GPU did not pick in place", step);
        exo_step l = {.T = 1, .tokens = &tok[1], .logits = logits};
        cr_assert_eq(exo_model_step(m, s[1], &l, &err), 0, "%s", err.msg);
        cr_assert(!l.token.picked);
        int want = exo_cpu_argmax_f32(logits, V);
        cr_expect_eq(g.token.id, want, "step %d: picked %d, the logits say %d", step, g.token.id, want);
        tok[0] = g.token.id;
        tok[1] = want;
    }
    free(logits);
    for (int q = 0; q < 2; q++)
        exo_seq_free(s[q]);
    exo_model_free(m);
    exo_synth_free(syn);
}

/* Rules with filters and penalties, picked on the device against the
 * host's sampler drawing the same row with the same number (the rule's):
 * the same token, and its log-probability within rounding. The rows are
 * Ollama's defaults (top-k 40, top-p 0.9, repetition penalty 1.1), top-k
 * alone (1, and the largest a rule takes, with min-p), top-p alone and
 * min-p alone, greedy after penalties that reorder the head, a top-k
 * among tied values (the lower ids first), and top-p alone over a flat
 * row, whose EXO_PICK_TOP_K most likely do not reach p: not picked there;
 * some with alternatives (the most likely tokens of the penalized logits,
 * as the host's sample reports them). Each row's logits have a head of larger values (as real
 * models' do), some of them in the history the penalties look at. The
 * seeds are fixed, so the draws and cuts fall where they fall every run;
 * none within rounding of a boundary. x comes back as it went; each row
 * alone as beside the others; a rule out of bounds is refused. */
Test(backend_ops, pick_filtered_and_penalized)
{
    both b = both_open("pick_filtered_and_penalized");
    static const int sizes[] = {300, 1000, 128256};
    enum { ROWS = 8, HEAD = 30, HIST = 80 };
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        const int n = sizes[k];
        dual x = dual_rand(&b, (size_t)n * ROWS, 2.0f);
        int32_t hist[HIST];
        for (int r = 0; r < ROWS; r++) {
            float *row = x.init + (size_t)r * (size_t)n;
            for (int j = 0; j < HEAD; j++)
                row[((size_t)r * 7919u + (size_t)j * 104729u) % (size_t)n] = 9.0f + 0.25f * (float)(j % 17);
            if (r == 6) /* flat: any 256 tokens hold 256 / n of it */
                for (int i = 0; i < n; i++)
                    row[i] = 0.5f;
            if (r == 7)
                for (int j = 0; j < 8; j++)
                    row[(j * 31 + 5) % n] = 15.0f; /* 8 tied at the top: top-k 5 keeps the 5 lowest ids */
        }
        for (int i = 0; i < HIST; i++) /* the head of row 0 .. 4, and some others */
            hist[i] = i % 3 ? (int32_t)(((size_t)(i % 5) * 7919u + (size_t)(i % 7) * 104729u) % (size_t)n)
                            : (int32_t)((i * 13) % n);
        upload(b.gpu, x.gpu, x.init, x.n);
        exo_sampler *smp[ROWS];
        exo_pick_rule rules[ROWS];
        for (int r = 0; r < ROWS; r++) {
            exo_sampler_params p = exo_sampler_defaults();
            p.seed = 1000u * (unsigned)k + (unsigned)r;
            p.temperature = r == 4 ? 0.0f : r == 2 ? 0.7f : r == 3 ? 1.2f : r == 0 ? 0.8f : 1.0f;
            p.top_k = r == 0 ? 40 : r == 1 ? 1 : r == 5 ? EXO_PICK_TOP_K : r == 7 ? 5 : 0;
            p.top_p = r == 0 || r == 6 ? 0.9f : r == 2 ? 0.5f : 1.0f;
            p.min_p = r == 3 ? 0.1f : r == 5 ? 0.05f : 0.0f;
            p.repetition_penalty = r == 0 ? 1.1f : r == 4 ? 1.3f : 1.0f;
            p.repetition_context_size = r == 0 ? 64 : 30;
            p.presence_penalty = r == 4 ? 0.4f : 0.0f;
            p.frequency_penalty = r == 4 ? 0.2f : 0.0f;
            p.top_logprobs = r == 0 ? 5 : r == 4 ? EXO_MAX_TOP_LOGPROBS : r == 3 ? 3 : r == 7 ? 8 : 0;
            smp[r] = exo_sampler_create(&p, n);
            cr_assert(!exo_sampler_begin(smp[r], hist, HIST, 4));
            cr_assert(exo_sampler_pick_rule(smp[r], &rules[r]), "row %d: no rule", r);
        }
        cr_assert(rules[0].n_penalized > 0 && rules[4].n_penalized > 0);
        exo_pick got[ROWS], alone;
        ok(b.gpu, b.gpu->ops->pick(b.gpu, x.gpu, ROWS, n, rules, got), "pick");
        float *back = exo_malloc(sizeof(float) * x.n);
        download(b.gpu, back, x.gpu, x.n);
        cr_expect(!memcmp(back, x.init, sizeof(float) * x.n), "n %d: the logits did not come back as they went", n);
        exo_free(back);
        for (int r = 0; r < ROWS; r++) {
            ok(b.gpu, b.gpu->ops->pick(b.gpu, x.gpu + (size_t)r * n, 1, n, &rules[r], &alone), "pick");
            bool same = alone.picked == got[r].picked && alone.n_top == got[r].n_top;
            if (same && alone.picked)
                same = alone.id == got[r].id && !memcmp(&alone.logprob, &got[r].logprob, sizeof(float)) &&
                       !memcmp(alone.top_ids, got[r].top_ids, sizeof(int32_t) * (size_t)alone.n_top) &&
                       !memcmp(alone.top_logprobs, got[r].top_logprobs, sizeof(float) * (size_t)alone.n_top);
            cr_expect(same, "n %d row %d: alone %d %a, beside others %d %a", n, r, alone.id, alone.logprob,
                      got[r].id, got[r].logprob);
        }
        for (int r = 0; r < ROWS; r++) {
            float *row = exo_malloc(sizeof(float) * (size_t)n);
            memcpy(row, x.init + (size_t)r * (size_t)n, sizeof(float) * (size_t)n);
            exo_sample want;
            exo_sampler_next(smp[r], row, &want);
            const exo_pick *g = &got[r];
            if (r == 6) {
                cr_expect(!g->picked, "n %d: top-p over a flat row was picked (%d)", n, g->id);
            } else {
                cr_expect(g->picked && g->id == want.id, "n %d row %d: %d, the host %d", n, r, g->id, want.id);
                cr_expect(fabsf(g->logprob - want.logprob) < 1e-4f * (1 + fabsf(want.logprob)),
                          "n %d row %d: logprob %g, the host %g", n, r, g->logprob, want.logprob);
                cr_expect_eq(g->n_top, want.n_top, "n %d row %d: %d alternatives, the host %d", n, r, g->n_top,
                             want.n_top);
                for (int j = 0; j < want.n_top && j < g->n_top; j++)
                    cr_expect(g->top_ids[j] == want.top_ids[j] &&
                                  fabsf(g->top_logprobs[j] - want.top_logprobs[j]) <
                                      1e-4f * (1 + fabsf(want.top_logprobs[j])),
                              "n %d row %d alternative %d: %d %g, the host %d %g", n, r, j, g->top_ids[j],
                              g->top_logprobs[j], want.top_ids[j], want.top_logprobs[j]);
            }
            if (r == 7)
                cr_expect(want.id <= (4 * 31 + 5) % n || n < 300, "row 7 drew past the 5 lowest tied ids");
            exo_free(row);
            exo_sampler_free(smp[r]);
        }
        exo_pick_rule wide = {.temperature = 1.0f, .top_k = EXO_PICK_TOP_K + 1};
        cr_expect_eq(b.gpu->ops->pick(b.gpu, x.gpu, 1, n, &wide, got), n > EXO_PICK_TOP_K + 1 ? EXO_EINVAL : 0);
        exo_pick_rule many = {.top_logprobs = EXO_MAX_TOP_LOGPROBS + 1};
        cr_expect_eq(b.gpu->ops->pick(b.gpu, x.gpu, 1, n, &many, got), EXO_EINVAL);
        dual_free(&b, &x);
    }
    both_close(&b);
}
