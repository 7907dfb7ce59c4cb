/* The CPU backend's ops for the newer architectures, each against a plain
 * double-precision reference written independently here: MoE routing
 * (softmax top-k, and DeepSeek/GLM's sigmoid scores with a correction
 * bias and group-limited choice), the gated activations (SiLU, Gemma's
 * tanh GELU, gpt-oss's clamped SwiGLU), partial RoPE, the sigmoid gate,
 * and the per-head products of latent attention. */
#include "core/alloc.h"
#include "engine/backend.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static float frand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static exo_backend *backend(void)
{
    exo_err err = {0};
    exo_backend *be = exo_backend_cpu_create(2, &err);
    cr_assert(be, "%s", err.msg);
    return be;
}

static int cmp_desc(const void *a, const void *b)
{
    double x = ((const double *)a)[0], y = ((const double *)b)[0];
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Reference router: sort (value, index) pairs. */
static void ref_route(const exo_moe_router *r, const float *l, int32_t *idx, double *w)
{
    int E = r->n_experts;
    double pairs[512][2], s[512], choice[512];
    double mx = -1e300, sum = 0;
    for (int e = 0; e < E; e++)
        mx = fmax(mx, l[e]);
    for (int e = 0; e < E; e++) {
        s[e] = r->sigmoid ? 1 / (1 + exp(-(double)l[e])) : exp((double)l[e] - mx);
        sum += r->sigmoid ? 0 : s[e];
        choice[e] = r->sigmoid ? s[e] + (r->bias ? r->bias[e] : 0) : l[e];
    }
    if (r->sigmoid && r->n_group > 1) {
        int per = E / r->n_group;
        double g[64][2];
        for (int gi = 0; gi < r->n_group; gi++) {
            double top[64];
            for (int i = 0; i < per; i++)
                top[i] = choice[gi * per + i];
            qsort(top, (size_t)per, sizeof(double), cmp_desc); /* one double per "pair": fine */
            g[gi][0] = top[0] + top[1];
            g[gi][1] = gi;
        }
        qsort(g, (size_t)r->n_group, sizeof g[0], cmp_desc);
        for (int gi = r->topk_group; gi < r->n_group; gi++)
            for (int i = 0; i < per; i++)
                choice[(int)g[gi][1] * per + i] = -INFINITY;
    }
    for (int e = 0; e < E; e++) {
        pairs[e][0] = choice[e];
        pairs[e][1] = e;
    }
    qsort(pairs, (size_t)E, sizeof pairs[0], cmp_desc);
    double picked = 0;
    for (int j = 0; j < r->k; j++) {
        idx[j] = (int32_t)pairs[j][1];
        w[j] = r->sigmoid ? s[idx[j]] : s[idx[j]] / sum;
        picked += w[j];
    }
    for (int j = 0; j < r->k; j++)
        w[j] = (r->norm ? w[j] / picked : w[j]) * r->scale;
}

static void check_route(exo_moe_router r, unsigned seed)
{
    exo_backend *be = backend();
    enum { T = 5 };
    int E = r.n_experts;
    float *l = exo_malloc(sizeof(float) * (size_t)(T * E)), bias[512];
    for (int i = 0; i < T * E; i++)
        l[i] = 3 * frand(&seed);
    for (int e = 0; e < E; e++)
        bias[e] = 0.5f * frand(&seed);
    if (r.sigmoid)
        r.bias = bias;
    int32_t idx[T * 16], want_idx[16];
    float w[T * 16];
    double want_w[16];
    cr_assert_eq(be->ops->moe_route(be, &r, l, T, idx, w), 0);
    for (int t = 0; t < T; t++) {
        ref_route(&r, l + t * E, want_idx, want_w);
        for (int j = 0; j < r.k; j++) {
            cr_expect_eq(idx[t * r.k + j], want_idx[j], "token %d choice %d", t, j);
            cr_expect(fabs(w[t * r.k + j] - want_w[j]) < 1e-6 * (1 + fabs(want_w[j])), "token %d weight %d: %g vs %g",
                      t, j, w[t * r.k + j], want_w[j]);
        }
    }
    exo_free(l);
    be->ops->free(be);
}

Test(block_ops, moe_route)
{
    /* Qwen3-MoE / gpt-oss: softmax over all, top-k, renormalised or not */
    check_route((exo_moe_router){16, 4, false, true, NULL, 1, 1, 1.0f}, 1);
    check_route((exo_moe_router){64, 8, false, false, NULL, 1, 1, 1.0f}, 2);
    /* GLM-4.5: sigmoid + correction bias, no groups, scaled */
    check_route((exo_moe_router){32, 4, true, true, NULL, 1, 1, 2.5f}, 3);
    /* DeepSeek-V3: 4 of 8 groups kept */
    check_route((exo_moe_router){64, 8, true, true, NULL, 8, 4, 2.5f}, 4);
    check_route((exo_moe_router){16, 4, true, true, NULL, 4, 2, 1.0f}, 5);
}

Test(block_ops, glu_kinds)
{
    exo_backend *be = backend();
    enum { N = 1000 };
    float g[N], u[N], g0[N];
    unsigned seed = 7;
    for (int i = 0; i < N; i++) {
        g0[i] = 12 * frand(&seed); /* past gpt-oss's clamp at 7 on both sides */
        u[i] = 12 * frand(&seed);
    }
    for (int kind = 0; kind < 3; kind++) {
        memcpy(g, g0, sizeof g);
        cr_assert_eq(be->ops->glu(be, (exo_glu_kind)kind, g, u, N, 7.0f), 0);
        for (int i = 0; i < N; i++) {
            double x = g0[i], y = u[i], want;
            if (kind == EXO_GLU_SILU) {
                want = x / (1 + exp(-x)) * y;
            } else if (kind == EXO_GLU_GELU_TANH) {
                want = 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))) * y;
            } else {
                double gc = fmin(x, 7.0), uc = fmax(-7.0, fmin(y, 7.0));
                want = (uc + 1) * gc / (1 + exp(-1.702 * gc));
            }
            cr_expect(fabs(g[i] - want) < 2e-5 * (1 + fabs(want)), "kind %d x %g y %g: %g vs %g", kind, x, y, g[i],
                      want);
        }
    }
    be->ops->free(be);
}

/* Partial RoPE: the first rot dims of each head rotate (pairs i, i + rot/2),
 * the rest pass through untouched. */
Test(block_ops, partial_rope)
{
    exo_backend *be = backend();
    enum { T = 3, H = 2, HD = 32, ROT = 8 };
    float x[T * H * HD], x0[T * H * HD], inv[ROT / 2];
    unsigned seed = 11;
    for (int i = 0; i < T * H * HD; i++)
        x0[i] = x[i] = frand(&seed);
    for (int i = 0; i < ROT / 2; i++)
        inv[i] = powf(10000.0f, -2.0f * (float)i / ROT);
    cr_assert_eq(be->ops->rope(be, x, T, H, HD, ROT, 5, inv, 1.0f), 0);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            const float *a = x0 + (t * H + h) * HD, *b = x + (t * H + h) * HD;
            for (int i = 0; i < ROT / 2; i++) {
                double ang = (5 + t) * (double)inv[i];
                double w0 = a[i] * cos(ang) - a[i + ROT / 2] * sin(ang);
                double w1 = a[i + ROT / 2] * cos(ang) + a[i] * sin(ang);
                cr_expect(fabs(b[i] - w0) < 1e-5 && fabs(b[i + ROT / 2] - w1) < 1e-5, "t %d h %d pair %d", t, h, i);
            }
            for (int i = ROT; i < HD; i++)
                cr_expect_eq(b[i], a[i], "dim %d must pass through", i);
        }
    be->ops->free(be);
}

Test(block_ops, sigmoid_mul)
{
    exo_backend *be = backend();
    float x[12], gate[12], x0[12];
    unsigned seed = 3;
    for (int i = 0; i < 12; i++) {
        x0[i] = x[i] = frand(&seed);
        gate[i] = 4 * frand(&seed);
    }
    cr_assert_eq(be->ops->sigmoid_mul(be, x, gate, 3, 4, 4), 0); /* element-wise */
    for (int i = 0; i < 12; i++)
        cr_expect(fabs(x[i] - x0[i] / (1 + exp(-(double)gate[i]))) < 1e-6);
    memcpy(x, x0, sizeof x);
    cr_assert_eq(be->ops->sigmoid_mul(be, x, gate, 3, 4, 1), 0); /* one gate per row */
    for (int i = 0; i < 12; i++)
        cr_expect(fabs(x[i] - x0[i] / (1 + exp(-(double)gate[i / 4]))) < 1e-6);
    be->ops->free(be);
}

/* head_matmul: a different (rows, cols) weight per head, strided heads;
 * a prompt (T = 4) and decode (T = 1: one dispatch for every head). */
static void check_head_matmul(int T);

Test(block_ops, head_matmul)
{
    check_head_matmul(4);
    check_head_matmul(1);
}

static void check_head_matmul(int T)
{
    exo_backend *be = backend();
    enum { H = 3, R = 5, C = 7, XH = 9, YH = 6, TMAX = 4 };
    float w[H][R * C], x[TMAX * H * XH], y[TMAX * H * YH];
    unsigned seed = 9;
    exo_linear lin[H];
    for (int h = 0; h < H; h++) {
        for (int i = 0; i < R * C; i++)
            w[h][i] = frand(&seed);
        lin[h] = (exo_linear){.format = EXO_WFORMAT_DENSE, .dtype = EXO_DTYPE_F32, .rows = R, .cols = C, .w = w[h]};
    }
    for (int i = 0; i < T * H * XH; i++)
        x[i] = frand(&seed);
    memset(y, 0, sizeof y);
    cr_assert_eq(be->ops->head_matmul(be, H, lin, x + 1, XH, H * XH, y, YH, H * YH, T), 0);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int r = 0; r < R; r++) {
                double want = 0;
                for (int c = 0; c < C; c++)
                    want += (double)w[h][r * C + c] * x[1 + t * H * XH + h * XH + c];
                cr_expect(fabs(y[t * H * YH + h * YH + r] - want) < 1e-5, "t %d h %d r %d", t, h, r);
            }
    be->ops->free(be);
}
