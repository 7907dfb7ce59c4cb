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
 * Usage: bench_cuda_matmul [device=0] [rounds=10] [widths=1, e.g. 1,4,8,16]
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
    for (size_t m = 0; m < sizeof models / sizeof *models; m++)
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
    return 0;
}
