/* Microbenchmark of the CUDA backend's decode products (one token, or a
 * batched step of T tokens).
 *
 * The calls of one decoder layer, as the model makes them (q, k and v in
 * one call; gate and up in one; o; down), at Llama-3.1-8B's and
 * Llama-3.2-1B's shapes, for MLX affine q4 and q8 (group 64, bf16 scales
 * and biases) and bf16 weights. Each call cycles over enough distinct
 * copies of its weights (>= 256 MiB, five times the L2) that they come from HBM, not the
 * 50 MiB L2. Prints GB/s of weight streamed per call kind and for the
 * whole layer, and the ratio to the GPU's device-to-device copy bandwidth
 * measured in the same run (exo_backend_cuda_copy_bandwidth): the
 * physical limit of a memory-bound kernel. Times are wall clock over many
 * queued calls, so launch costs count, as they do in a decode step.
 * With several widths (rows of x a call: a step of that many sequences),
 * each width's layer also prints its time against the one-row layer's in
 * the same run: a step of T sequences reads the weights once, so the ideal
 * is x1.00 until the arithmetic, not the weights, sets the pace.
 *
 * Then a sparse layer's experts as decode runs them (qwen3-30b-a3b: 128
 * experts of 768 x 2048, 8 a row, 4-bit): the router's choice made on the
 * device (moe_pick of uniform random logits, a fresh choice each round so
 * the experts come from HBM), the chosen experts' gate and up in one
 * call, their downs through the activation in another. T rows choose
 * T * 8 experts, some the same: the bytes are those of the distinct
 * experts chosen (each read once however many rows chose it), against
 * the copy's GB/s, and the time against one row's beside the ratio of
 * their distinct experts' bytes (the ideal).
 *
 * Usage: bench_cuda_matmul [device=0] [rounds=10] [widths=1, e.g. 1,4,8,16] [experts: only those]
 * Prints one line saying why and exits 0 where there is no GPU. */
#include "core/clock.h"
#include "core/error.h"
#include "engine/backend.h"
#include "engine/linear.h"

#include "bench_weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A weight format: make_weight_g's bits (16: bf16 dense), group 64. */
typedef struct quant { const char *name; exo_wformat format; int bits; } quant;

/* One call of a layer: n weights sharing one input. */
typedef struct call { const char *name; int n; int64_t rows[3]; int64_t cols; } call;

#define MAX_COPIES 512

typedef struct layer_set {
    int copies;
    exo_linear w[4][MAX_COPIES][3]; /* [call][copy][weight] */
    size_t bytes[4];                /* weight bytes of one call */
} layer_set;

static int run(exo_backend *be, const char *model, const call *calls, int dim, int ffn, const quant *q,
               int rounds, const int *widths, int nwidths, double copy_bw)
{
    const exo_backend_ops *o = be->ops;
    exo_err err = {0};
    static layer_set set;
    memset(&set, 0, sizeof set);
    size_t layer_bytes = 0;
    for (int c = 0; c < 4; c++)
        for (int j = 0; j < calls[c].n; j++) {
            exo_linear probe = {.format = q->format, .dtype = EXO_DTYPE_BF16, .rows = calls[c].rows[j],
                                .cols = calls[c].cols, .bits = q->bits, .group_size = 64};
            set.bytes[c] += exo_linear_bytes(&probe);
        }
    for (int c = 0; c < 4; c++)
        layer_bytes += set.bytes[c];
    set.copies = (int)(((size_t)256 << 20) / layer_bytes) + 1;
    if (set.copies > MAX_COPIES)
        set.copies = MAX_COPIES;
    /* one host weight per shape, uploaded as many times as there are copies */
    for (int c = 0; c < 4; c++)
        for (int j = 0; j < calls[c].n; j++) {
            exo_linear h = make_weight_g(q->bits, 64, calls[c].rows[j], calls[c].cols);
            for (int k = 0; k < set.copies; k++)
                if (o->load_linear(be, &h, false, &set.w[c][k][j], &err)) {
                    fprintf(stderr, "load: %s\n", err.msg);
                    return 1;
                }
            free_weight(&h);
        }
    int big = ffn > dim ? ffn : dim, most = 1;
    for (int i = 0; i < nwidths; i++)
        most = widths[i] > most ? widths[i] : most;
    size_t xn = (size_t)big * (size_t)most;
    float *x = o->alloc(be, sizeof(float) * xn), *y[3];
    for (int j = 0; j < 3; j++)
        y[j] = o->alloc(be, sizeof(float) * xn);
    float *xh = malloc(sizeof(float) * xn);
    for (size_t i = 0; i < xn; i++)
        xh[i] = (float)((int)(next_u64() % 2001) - 1000) / 1000.0f;
    o->to_device(be, x, xh, sizeof(float) * xn);
    free(xh);
    double one_row_us = 0;
    for (int wi = 0; wi < nwidths; wi++) {
        const int T = widths[wi];
        /* per call kind: every copy in turn, `rounds` times; then the layer
         * (at T > 1 only the layer) */
        for (int c = T > 1 ? 4 : 0; c < 5; c++) {
            for (int warm = 0; warm < 2; warm++) {
                int reps = warm ? rounds : 1;
                double t0 = exo_clock_seconds();
                for (int r = 0; r < reps; r++)
                    for (int k = 0; k < set.copies; k++)
                        for (int cc = c == 4 ? 0 : c; cc <= (c == 4 ? 3 : c); cc++) {
                            const exo_linear *ws[3] = {&set.w[cc][k][0], &set.w[cc][k][1], &set.w[cc][k][2]};
                            if (o->matmul(be, calls[cc].n, ws, x, T, y)) {
                                fprintf(stderr, "matmul failed\n");
                                return 1;
                            }
                        }
                o->sync(be);
                double dt = exo_clock_seconds() - t0;
                if (!warm)
                    continue;
                size_t bytes = (c == 4 ? layer_bytes : set.bytes[c]) * (size_t)set.copies * (size_t)rounds;
                double gbs = (double)bytes / dt / 1e9, us = dt / ((double)set.copies * rounds) * 1e6;
                if (T == 1) {
                    printf("%-13s %-4s %-8s %6.2f MB  %7.1f us  %7.1f GB/s  %5.1f%% of copy\n", model, q->name,
                           c == 4 ? "layer" : calls[c].name,
                           (double)(c == 4 ? layer_bytes : set.bytes[c]) / 1e6, us, gbs,
                           100.0 * (double)bytes / dt / copy_bw);
                    if (c == 4)
                        one_row_us = us;
                } else {
                    printf("%-13s %-4s layer x%-2d %6.2f MB  %7.1f us  %7.1f GB/s  %5.1f%% of copy", model, q->name, T,
                           (double)layer_bytes / 1e6, us, gbs, 100.0 * (double)bytes / dt / copy_bw);
                    if (one_row_us > 0)
                        printf("  x%.2f of one row's time (ideal x1.00)", us / one_row_us);
                    printf("\n");
                }
            }
        }
    }
    o->release(be, x);
    for (int j = 0; j < 3; j++)
        o->release(be, y[j]);
    return 0;
}

/* Seconds a round of choice and products, the mean of `rounds` (logits:
 * a round's T rows each), after one round to warm up. */
static double expert_layer_s(exo_backend *be, const exo_moe_router *router, const float *logits, int32_t *idx,
                             float *pick_w, const exo_linear *const *gu, const exo_linear *const *down, int k,
                             const float *x, int T, float **gu_y, float **g, float **u, float **y, int rounds)
{
    const exo_backend_ops *o = be->ops;
    double t0 = 0;
    for (int r = -1; r < rounds; r++) {
        if (r == 0) {
            o->sync(be);
            t0 = exo_clock_seconds();
        }
        const float *round_logits = logits + (size_t)(r < 0 ? 0 : r) * T * router->n_experts;
        if (o->moe_pick(be, router, round_logits, T, idx, pick_w) || o->matmul(be, 2 * k, gu, x, T, gu_y) ||
            o->matmul_glu(be, k, down, EXO_GLU_SILU, g, (const float *const *)u, 0, false, T, y))
            return -1;
    }
    o->sync(be);
    return (exo_clock_seconds() - t0) / rounds;
}

static int run_experts(int device, int rounds, const int *widths, int nwidths, double copy_bw)
{
    enum { E = 128, K = 8, D = 2048, I = 768, MOST = 16 };
    rounds = rounds < 1 ? 20 : 20 * rounds; /* a round is one layer's experts: some hundred us */
    exo_err err = {0};
    exo_backend *be = exo_backend_cuda_create(device, &err);
    if (!be) {
        printf("bench_cuda_matmul: %s\n", err.msg);
        return 0;
    }
    const exo_backend_ops *o = be->ops;
    if (!o->moe_pick || !o->matmul_glu) {
        printf("experts: this backend picks no experts on the device\n");
        be->ops->free(be);
        return 0;
    }
    static exo_linear experts[3 * E];
    exo_linear host[3];
    for (int p = 0; p < 3; p++)
        host[p] = make_weight_g(4, 64, p == 2 ? D : I, p == 2 ? I : D);
    int rc = 0;
    for (int e = 0; e < 3 * E && !rc; e++)
        rc = o->load_linear(be, &host[e % 3], false, &experts[e], &err);
    size_t expert_bytes = exo_linear_bytes(&host[0]) + exo_linear_bytes(&host[1]) + exo_linear_bytes(&host[2]);
    for (int p = 0; p < 3; p++)
        free_weight(&host[p]);
    void *table = rc ? NULL : o->moe_pick_table(be, experts, E, &err);
    if (!table) {
        fprintf(stderr, "experts: %s\n", err.msg);
        be->ops->free(be);
        return 1;
    }
    const exo_moe_router router = {E, K, false, true, NULL, 1, 1, 1.0f};
    float *logits = o->alloc(be, sizeof(float) * (size_t)rounds * MOST * E);
    float *pick_w = o->alloc(be, sizeof(float) * MOST * K);
    int32_t *idx = o->alloc(be, sizeof(int32_t) * MOST * K);
    float *x = o->alloc(be, sizeof(float) * MOST * D), *gu = o->alloc(be, sizeof(float) * 2 * K * MOST * I);
    float *out = o->alloc(be, sizeof(float) * K * MOST * D);
    size_t host_n = (size_t)rounds * MOST * E > MOST * D ? (size_t)rounds * MOST * E : MOST * D;
    float *host_x = exo_malloc(sizeof(float) * host_n);
    for (size_t i = 0; i < host_n; i++)
        host_x[i] = (float)((int)(next_u64() % 2001) - 1000) / 1000.0f;
    rc = !logits || !pick_w || !idx || !x || !gu || !out || o->to_device(be, x, host_x, sizeof(float) * MOST * D);
    exo_linear picked[3 * K];
    exo_linear_pick_slots(picked, K, experts, table, E, idx, K);
    const exo_linear *gu_w[2 * K], *down_w[K];
    float *gu_y[2 * K], *g[K], *u[K], *y[K];
    double one_row_us = 0;
    for (int wi = 0; wi < nwidths && !rc; wi++) {
        const int T = widths[wi];
        const size_t TI = (size_t)T * I;
        for (int j = 0; j < K; j++) {
            gu_w[2 * j] = &picked[3 * j];
            gu_w[2 * j + 1] = &picked[3 * j + 1];
            down_w[j] = &picked[3 * j + 2];
            gu_y[2 * j] = g[j] = gu + (size_t)j * TI;
            gu_y[2 * j + 1] = u[j] = gu + (size_t)(K + j) * TI;
            y[j] = out + (size_t)j * T * D;
        }
        for (size_t i = 0; i < (size_t)rounds * T * E; i++) /* a fresh choice each round and width */
            host_x[i] = (float)((int)(next_u64() % 2001) - 1000) / 500.0f;
        if (o->to_device(be, logits, host_x, sizeof(float) * (size_t)rounds * T * E)) {
            rc = 1;
            break;
        }
        double distinct = 0; /* a round's, on average */
        for (int r = 0; r < rounds && !rc; r++) {
            int32_t chosen[MOST * K];
            bool seen[E] = {0};
            rc = o->moe_pick(be, &router, logits + (size_t)r * T * E, T, idx, pick_w) ||
                 o->to_host(be, chosen, idx, sizeof chosen[0] * T * K);
            for (int i = 0; i < T * K && !rc; i++) {
                distinct += !seen[chosen[i]];
                seen[chosen[i]] = true;
            }
        }
        distinct /= rounds;
        double s = rc ? -1 : expert_layer_s(be, &router, logits, idx, pick_w, gu_w, down_w, K, x, T, gu_y, g, u, y,
                                            rounds);
        if (s < 0) {
            rc = 1;
            break;
        }
        double bytes = distinct * (double)expert_bytes, us = s * 1e6;
        printf("qwen3-30b-a3b q4  experts x%-2d %5.1f of %3d chosen distinct %6.2f MB %7.1f us %7.1f GB/s %5.1f%% of copy",
               T, distinct, T * K, bytes / 1e6, us, bytes / s / 1e9, 100.0 * bytes / s / copy_bw);
        if (T == 1)
            one_row_us = us;
        else if (one_row_us > 0)
            printf("  x%.2f of one row's time (ideal x%.2f)", us / one_row_us, distinct / K);
        printf("\n");
    }
    if (rc)
        fprintf(stderr, "experts: a call failed\n");
    exo_free(host_x);
    o->release(be, table);
    be->ops->free(be);
    return rc;
}

int main(int argc, char **argv)
{
    int device = argc > 1 ? atoi(argv[1]) : 0;
    int rounds = argc > 2 ? atoi(argv[2]) : 10;
    int widths[8] = {1}, nwidths = 1;
    if (argc > 3) {
        nwidths = 0;
        for (char *p = argv[3]; *p && nwidths < 8;) {
            long v = strtol(p, &p, 10);
            if (v < 1 || v > 16) {
                fprintf(stderr, "bench_cuda_matmul: widths are 1 to 16 rows of x\n");
                return 2;
            }
            widths[nwidths++] = (int)v;
            if (*p == ',')
                p++;
            else if (*p) {
                fprintf(stderr, "bench_cuda_matmul: widths: a comma-separated list\n");
                return 2;
            }
        }
    }
    exo_err err = {0};
    exo_backend *probe = exo_backend_cuda_create(device, &err);
    if (!probe) {
        printf("bench_cuda_matmul: %s\n", err.msg);
        return 0;
    }
    probe->ops->free(probe);
    double copy_bw = exo_backend_cuda_copy_bandwidth(device);
    printf("device-to-device copy: %.0f GB/s (read + write), the limit below\n", copy_bw / 1e9);
    static const quant quants[] = {{"q4", EXO_WFORMAT_AFFINE, 4},
                                   {"q8", EXO_WFORMAT_AFFINE, 8},
                                   {"bf16", EXO_WFORMAT_DENSE, 16}};
    static const struct { const char *name; int dim, kv, ffn; } models[] = {
        {"llama-3.1-8b", 4096, 1024, 14336}, {"llama-3.2-1b", 2048, 512, 8192}};
    bool dense = !(argc > 4 && !strcmp(argv[4], "experts"));
    for (size_t m = 0; dense && m < sizeof models / sizeof *models; m++)
        for (size_t qi = 0; qi < sizeof quants / sizeof *quants; qi++) {
            /* a fresh backend each time: the weight arena goes with it */
            exo_backend *be = exo_backend_cuda_create(device, &err);
            if (!be) {
                printf("bench_cuda_matmul: %s\n", err.msg);
                return 0;
            }
            int d = models[m].dim, kv = models[m].kv, f = models[m].ffn;
            call calls[4] = {{"qkv", 3, {d, kv, kv}, d},
                             {"o", 1, {d, 0}, d},
                             {"gate_up", 2, {f, f}, d},
                             {"down", 1, {d, 0}, f}};
            int rc = run(be, models[m].name, calls, d, f, &quants[qi], rounds, widths, nwidths, copy_bw);
            be->ops->free(be);
            if (rc)
                return 1;
        }
    return run_experts(device, rounds, widths, nwidths, copy_bw);
}
