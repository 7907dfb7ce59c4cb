/* Decode attention on the CPU (exo_cpu_attention, the CPU backend's kernel
 * for a token a call) over f32 and bf16 caches, against the read bandwidth probed in the
 * same run with the same threads.
 *
 * A qwen3-0.6b layer's shape (16 query heads, 8 KV heads of 128), one
 * token at position ctx - 1 of a paged cache (pages of 64, as model.c
 * keeps them). Calls cycle over `layers` caches (28 by default: the model's
 * layers, each read once a token), so each call's cache comes from DRAM as
 * in a real decode step, where the weight stream evicts it. Prints, per
 * type and context, the time a call and its caches' bytes a second, and
 * that against the probe (best of three rounds each; the types and the
 * probe alternate within a round, so a host's drift hits them alike).
 *
 * Usage: bench_attention [threads=2] [ctx,ctx,...=512,2048,8192] [layers=28] */
#include "core/alloc.h"
#include "core/clock.h"
#include "core/threadpool.h"
#include "engine/backend.h"
#include "engine/cpu/membw.h"
#include "engine/cpu/ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { H = 16, KV = 8, HD = 128, PAGE = 64, ROUNDS = 3, FILL = 256 };

static unsigned seed = 12345;
static float frand(void)
{
    seed = seed * 1103515245u + 12345u;
    return (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* One layer's cache of ctx positions in pages. */
typedef struct layer_cache {
    char *mem;
    void **table;
    exo_kv_view view;
} layer_cache;

/* The cache's first ctx - 1 positions appended (the timed call writes the
 * last); random keys and values, the same for every layer. */
static int fill(exo_pool *pool, const exo_attn_shape *sh, layer_cache *c, int ctx, size_t value, const float *k,
                const float *v)
{
    int runs = (ctx + PAGE - 1) / PAGE;
    size_t run = 2 * (size_t)PAGE * KV * HD * value;
    c->mem = exo_alloc_aligned((size_t)runs * run);
    c->table = exo_calloc((size_t)runs, sizeof(void *));
    if (!c->mem)
        return -1;
    for (int i = 0; i < runs; i++)
        c->table[i] = c->mem + (size_t)i * run;
    c->view = (exo_kv_view){.pages = c->table, .v_off = (size_t)PAGE * KV * HD, .capacity = runs * PAGE,
                            .page = PAGE};
    for (int p = 0; p < ctx - 1; p += FILL)
        exo_cpu_kv_append(pool, sh, k, v, &c->view, ctx - 1 - p < FILL ? ctx - 1 - p : FILL, p);
    return 0;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    const char *ctxs = argc > 2 ? argv[2] : "512,2048,8192";
    int layers = argc > 3 ? atoi(argv[3]) : 28;
    if (threads < 1 || layers < 1) {
        fprintf(stderr, "usage: bench_attention [threads] [ctx,ctx,...] [layers]\n");
        return 2;
    }
    exo_pool *pool = exo_pool_create(threads);
    exo_membw *probe = exo_membw_create((size_t)256 << 20);
    float *fk = exo_malloc(sizeof(float) * FILL * KV * HD), *fv = exo_malloc(sizeof(float) * FILL * KV * HD);
    if (!pool || !probe) {
        fprintf(stderr, "bench_attention: setup failed\n");
        return 1;
    }
    for (size_t i = 0; i < (size_t)FILL * KV * HD; i++) {
        fk[i] = frand();
        fv[i] = frand();
    }
    printf("decode attention, %d query heads, %d KV heads of %d, %d layers' caches in turn, %d threads\n", H, KV, HD,
           layers, threads);
    float q[H * HD], k[KV * HD], v[KV * HD], o[H * HD];
    for (int i = 0; i < H * HD; i++)
        q[i] = frand();
    for (int i = 0; i < KV * HD; i++) {
        k[i] = frand();
        v[i] = frand();
    }
    for (const char *s = ctxs; *s;) {
        int ctx = atoi(s);
        s = strchr(s, ',') ? strchr(s, ',') + 1 : s + strlen(s);
        if (ctx < 2)
            continue;
        static const exo_dtype types[2] = {EXO_DTYPE_F32, EXO_DTYPE_BF16};
        layer_cache *caches[2];
        exo_attn_shape sh[2];
        double best[2] = {1e9, 1e9}, bw = 0;
        int rc = 0;
        /* the kernel's scores: 4 rows of the capacity a thread */
        float **scratch = exo_calloc((size_t)threads, sizeof(float *));
        for (int i = 0; i < threads; i++)
            scratch[i] = exo_alloc_aligned(sizeof(float) * 4 * (size_t)(ctx + PAGE));
        for (int t = 0; t < 2 && !rc; t++) {
            sh[t] = (exo_attn_shape){.n_heads = H, .n_kv_heads = KV, .head_dim = HD, .scale = 0.088f,
                                     .cache = types[t]};
            caches[t] = exo_calloc((size_t)layers, sizeof(layer_cache));
            for (int l = 0; l < layers && !rc; l++)
                rc = fill(pool, &sh[t], &caches[t][l], ctx, exo_dtype_size(types[t]), fk, fv);
        }
        if (rc) {
            fprintf(stderr, "bench_attention: out of memory for %d layers' caches of %d positions\n", layers, ctx);
            return 1;
        }
        for (int r = 0; r < ROUNDS; r++) {
            double b = exo_membw_read(probe, pool, 1);
            bw = b > bw ? b : bw;
            for (int t = 0; t < 2; t++) {
                double t0 = exo_clock_seconds();
                for (int l = 0; l < layers; l++) /* position ctx - 1, written again each round */
                    exo_cpu_attention(pool, &sh[t], o, q, k, v, &caches[t][l].view, 1, ctx - 1, scratch);
                double dt = (exo_clock_seconds() - t0) / layers;
                best[t] = dt < best[t] ? dt : best[t];
            }
        }
        for (int i = 0; i < threads; i++)
            exo_free_aligned(scratch[i]);
        exo_free(scratch);
        for (int t = 0; t < 2; t++) {
            double bytes = 2.0 * ctx * KV * HD * (double)exo_dtype_size(types[t]);
            printf("  ctx %5d %-4s %8.1f us a layer  %6.2f MB  %6.1f GB/s = %5.1f%% of the read probe (%.1f GB/s)\n",
                   ctx, t ? "bf16" : "f32", best[t] * 1e6, bytes / 1e6, bytes / best[t] / 1e9,
                   100 * bytes / best[t] / bw, bw / 1e9);
            for (int l = 0; l < layers; l++) {
                exo_free_aligned(caches[t][l].mem);
                exo_free(caches[t][l].table);
            }
            exo_free(caches[t]);
        }
        printf("  ctx %5d bf16 a layer in %.2fx the f32 time\n", ctx, best[1] / best[0]);
    }
    exo_free(fk);
    exo_free(fv);
    exo_membw_free(probe);
    exo_pool_free(pool);
    return 0;
}
