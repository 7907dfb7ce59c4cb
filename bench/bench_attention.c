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
 * Then a prompt's attention: a chunk of 128 tokens at the end of each
 * context (exo_cpu_attention_prefill, the tiles of tokens prompts take,
 * after the chunk's append), its useful multiply-adds a second, and
 * against a peer in the same run: oneDNN's f32 GEMMs of the two products
 * per KV head as dense matrices (Q K^T over every position, then P V),
 * which is what the engine ran before the tiles, without the copies that
 * fed them or the softmax between.
 *
 * Usage: bench_attention [threads=2] [ctx,ctx,...=512,2048,8192] [layers=28] */
#include "core/alloc.h"
#include "core/clock.h"
#include "core/threadpool.h"
#include "engine/backend.h"
#include "engine/cpu/matmul.h"
#include "engine/cpu/membw.h"
#include "engine/cpu/ops.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { H = 16, KV = 8, HD = 128, PAGE = 64, ROUNDS = 3, FILL = 256, CHUNK = 128 };

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

/* The peer: per KV head, S = Q K^T (CHUNK * group rows, every position)
 * and O = S V through exo_cpu_matmul's oneDNN f32 GEMM; seconds a layer. */
static double gemm_peer(exo_cpu_matmul_ctx *mm, int ctx, const float *fk)
{
    const int rows = CHUNK * (H / KV);
    size_t sizes[5] = {(size_t)ctx * HD, (size_t)ctx * HD, (size_t)rows * HD, (size_t)rows * HD, (size_t)rows * ctx};
    float *m[5];
    bool ok = true;
    for (int i = 0; i < 5; i++)
        ok &= (m[i] = exo_alloc_aligned(sizeof(float) * sizes[i])) != NULL;
    float *k = m[0], *vt = m[1], *q = m[2], *o = m[3], *sc = m[4];
    double best = ok ? 1e9 : 0;
    for (int r = 0; ok && r < ROUNDS + 1; r++) { /* the first round creates oneDNN's primitives */
        if (!r) {
            for (size_t i = 0; i < (size_t)ctx * HD; i++)
                k[i] = vt[i] = fk[i % ((size_t)FILL * KV * HD)];
            for (int i = 0; i < rows * HD; i++)
                q[i] = frand();
        }
        exo_linear wk = {.format = EXO_WFORMAT_DENSE, .dtype = EXO_DTYPE_F32, .rows = ctx, .cols = HD, .w = k};
        exo_linear wv = {.format = EXO_WFORMAT_DENSE, .dtype = EXO_DTYPE_F32, .rows = HD, .cols = ctx, .w = vt};
        const exo_linear *pk[1] = {&wk}, *pv[1] = {&wv};
        float *const ys[1] = {sc}, *const yo[1] = {o};
        double t0 = exo_clock_seconds();
        for (int h = 0; h < KV; h++) {
            exo_cpu_matmul(mm, 1, pk, q, rows, ys);
            exo_cpu_matmul(mm, 1, pv, sc, rows, yo);
        }
        double dt = exo_clock_seconds() - t0;
        best = r && dt < best ? dt : best;
    }
    for (int i = 0; i < 5; i++)
        exo_free_aligned(m[i]);
    return best;
}

/* A chunk of CHUNK tokens at the end of each context, through the tiles,
 * over `layers` caches in turn, beside gemm_peer. */
static int prefill(exo_pool *pool, const char *ctxs, int layers, const float *fk, const float *fv)
{
    const int threads = exo_pool_size(pool);
    exo_cpu_matmul_ctx *mm = exo_cpu_matmul_ctx_create(pool);
    float *q = exo_malloc(sizeof(float) * CHUNK * H * HD), *o = exo_malloc(sizeof(float) * CHUNK * H * HD);
    float **scratch = exo_calloc((size_t)threads, sizeof(float *));
    if (!mm || !q || !o || !scratch) {
        fprintf(stderr, "bench_attention: setup failed\n");
        return 1;
    }
    for (int i = 0; i < CHUNK * H * HD; i++)
        q[i] = frand();
    printf("prompt attention, %d tokens a call at the context's end, %d layers' caches in turn, %d threads\n",
           CHUNK, layers, threads);
    int rc = 0;
    for (const char *s = ctxs; *s && !rc;) {
        int ctx = atoi(s);
        s = strchr(s, ',') ? strchr(s, ',') + 1 : s + strlen(s);
        if (ctx < CHUNK)
            continue;
        const int pos0 = ctx - CHUNK;
        double useful = 0; /* multiply-adds: each token's heads over its positions, for scores and values */
        for (int t = 0; t < CHUNK; t++)
            useful += 2.0 * H * HD * (pos0 + t + 1);
        double peer = gemm_peer(mm, ctx, fk);
        static const exo_dtype types[2] = {EXO_DTYPE_F32, EXO_DTYPE_BF16};
        for (int t = 0; t < 2 && !rc; t++) {
            exo_attn_shape sh = {.n_heads = H, .n_kv_heads = KV, .head_dim = HD, .scale = 0.088f,
                                 .cache = types[t]};
            layer_cache *caches = exo_calloc((size_t)layers, sizeof(layer_cache));
            for (int l = 0; l < layers && !rc; l++)
                rc = fill(pool, &sh, &caches[l], ctx + 1, exo_dtype_size(types[t]), fk, fv);
            size_t per = exo_cpu_prefill_scratch(&sh, caches[0].view.capacity);
            for (int i = 0; i < threads && !rc; i++) {
                exo_free_aligned(scratch[i]);
                rc = !(scratch[i] = exo_alloc_aligned(sizeof(float) * per));
            }
            double best = 1e9;
            for (int r = 0; r < ROUNDS && !rc; r++) {
                double t0 = exo_clock_seconds();
                for (int l = 0; l < layers; l++) {
                    exo_cpu_kv_append(pool, &sh, fk, fv, &caches[l].view, CHUNK, pos0);
                    exo_cpu_attention_prefill(pool, &sh, o, q, &caches[l].view, CHUNK, pos0, scratch);
                }
                double dt = (exo_clock_seconds() - t0) / layers;
                best = dt < best ? dt : best;
            }
            if (!rc)
                printf("  ctx %5d %-4s %8.1f us a layer  %6.1f G multiply-adds/s  oneDNN's f32 GEMMs of the "
                       "products %8.1f us (%.2fx the tiles' time)\n", ctx, t ? "bf16" : "f32", best * 1e6,
                       useful / best / 1e9, peer * 1e6, peer / best);
            for (int l = 0; l < layers; l++) {
                exo_free_aligned(caches[l].mem);
                exo_free(caches[l].table);
            }
            exo_free(caches);
        }
        if (rc)
            fprintf(stderr, "bench_attention: out of memory for %d layers' caches of %d positions\n", layers, ctx);
    }
    for (int i = 0; i < threads; i++)
        exo_free_aligned(scratch[i]);
    exo_free(scratch);
    exo_free(q);
    exo_free(o);
    exo_cpu_matmul_ctx_free(mm);
    return rc;
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
    int rc = prefill(pool, ctxs, layers, fk, fv);
    exo_free(fk);
    exo_free(fv);
    exo_membw_free(probe);
    exo_pool_free(pool);
    return rc;
}
