/* Decode attention on the GPU (the CUDA backend's attention op, one token
 * a call) over f32 and bf16 caches, against the device-to-device copy
 * bandwidth measured in the same run (exo_backend_cuda_copy_bandwidth):
 * the physical limit of a kernel that reads the cache once.
 *
 * Llama-3.1-8B's heads (32 query heads, 8 KV heads of 128) and
 * Llama-3.2-1B's (32, 8 of 64), a token at position ctx - 1 of a paged
 * cache (pages of 64, as model.c keeps them) whose other positions hold
 * random keys and values. Calls cycle over `layers` caches (the model's
 * layers, each read once a token), so a call's cache comes from HBM, not
 * from L2, as in a decode step. Prints per shape, type and context the
 * time a call, its cache's bytes a second and that against the copy
 * bandwidth. Times are wall clock over many queued calls, so launch costs
 * count, as they do in a decode step that is not recorded.
 *
 * Usage: bench_cuda_attention [device=0] [ctx,ctx,...=512,4096,16384] [layers=16]
 * Prints one line saying why and exits 0 where there is no GPU. */
#include "core/clock.h"
#include "core/error.h"
#include "engine/backend.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PAGE = 64, ROUNDS = 5 };

static unsigned seed = 12345;
static float frand(void)
{
    seed = seed * 1103515245u + 12345u;
    return (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* f32 to bf16, nearest even (the values here are finite) */
static uint16_t bf16_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* One layer's cache of `runs` pages on the device and its page table. */
typedef struct layer_cache {
    void *mem;
    void **table;
    exo_kv_view view;
} layer_cache;

static int run(exo_backend *be, const char *model, int kv_heads, int hd, exo_dtype type, int ctx, int layers,
               double copy_bw)
{
    const exo_backend_ops *o = be->ops;
    const int heads = 32, runs = (ctx + PAGE - 1) / PAGE;
    const size_t value = type == EXO_DTYPE_BF16 ? 2 : 4, row = (size_t)kv_heads * hd;
    const size_t page_bytes = 2 * (size_t)PAGE * row * value; /* a page's K then V */
    exo_attn_shape sh = {.n_heads = heads, .n_kv_heads = kv_heads, .head_dim = hd,
                         .scale = 1.0f / (float)hd, .cache = type};
    /* one host page of random values, uploaded into every page */
    char *host = malloc(page_bytes);
    for (size_t i = 0; i < page_bytes / value; i++) {
        float f = frand();
        if (value == 2) {
            uint16_t b = bf16_of(f);
            memcpy(host + 2 * i, &b, 2);
        } else {
            memcpy(host + 4 * i, &f, 4);
        }
    }
    layer_cache *c = calloc((size_t)layers, sizeof *c);
    void **ptrs = malloc(sizeof(void *) * (size_t)runs);
    int rc = 0;
    for (int l = 0; l < layers && !rc; l++) {
        c[l].mem = o->alloc(be, page_bytes * (size_t)runs);
        c[l].table = o->alloc(be, sizeof(void *) * (size_t)runs);
        if (!c[l].mem || !c[l].table) {
            fprintf(stderr, "bench_cuda_attention: out of device memory at %d positions\n", ctx);
            rc = 1;
            break;
        }
        for (int p = 0; p < runs && !rc; p++) {
            ptrs[p] = (char *)c[l].mem + (size_t)p * page_bytes;
            rc = o->to_device(be, ptrs[p], host, page_bytes);
        }
        rc = rc ? rc : o->to_device(be, c[l].table, ptrs, sizeof(void *) * (size_t)runs);
        c[l].view = (exo_kv_view){.pages = c[l].table, .v_off = (size_t)PAGE * row, .capacity = runs * PAGE,
                                  .page = PAGE};
    }
    /* q, the new key and value, then the output */
    const size_t qn = (size_t)heads * hd, in = qn + 2 * row;
    float *q = o->alloc(be, sizeof(float) * (in + qn)), *qh = malloc(sizeof(float) * in);
    for (size_t i = 0; i < in; i++)
        qh[i] = frand();
    if (!rc)
        rc = q ? o->to_device(be, q, qh, sizeof(float) * in) : 1;
    float *k = q ? q + qn : NULL, *v = q ? k + row : NULL, *out = q ? v + row : NULL;
    double best = 0;
    for (int r = 0; r <= ROUNDS && !rc; r++) { /* round 0 warms up */
        double t0 = exo_clock_seconds();
        for (int l = 0; l < layers && !rc; l++)
            rc = o->attention(be, &sh, out, q, k, v, &c[l].view, 1, ctx - 1);
        rc = rc ? rc : o->sync(be);
        double dt = exo_clock_seconds() - t0;
        if (r && (best == 0 || dt < best))
            best = dt;
    }
    if (!rc) {
        double bytes = 2.0 * ctx * (double)row * (double)value * layers, us = best / layers * 1e6;
        printf("%-13s %-4s %6d positions  %7.1f us a layer  %7.1f GB/s  %5.1f%% of copy\n", model,
               type == EXO_DTYPE_BF16 ? "bf16" : "f32", ctx, us, bytes / best / 1e9,
               100.0 * bytes / best / copy_bw);
    } else {
        fprintf(stderr, "bench_cuda_attention: %s at %d positions failed (%d)\n", model, ctx, rc);
    }
    for (int l = 0; l < layers; l++) {
        o->release(be, c[l].mem);
        o->release(be, c[l].table);
    }
    o->release(be, q);
    free(c);
    free(ptrs);
    free(host);
    free(qh);
    return rc;
}

int main(int argc, char **argv)
{
    int device = argc > 1 ? atoi(argv[1]) : 0;
    const char *ctxs = argc > 2 ? argv[2] : "512,4096,16384";
    int layers = argc > 3 ? atoi(argv[3]) : 16;
    exo_err err = {0};
    exo_backend *be = exo_backend_cuda_create(device, &err);
    if (!be) {
        printf("bench_cuda_attention: %s\n", err.msg);
        return 0;
    }
    if (layers < 1) {
        fprintf(stderr, "usage: bench_cuda_attention [device] [ctx,ctx,...] [layers >= 1]\n");
        return 2;
    }
    double copy_bw = exo_backend_cuda_copy_bandwidth(device);
    printf("device-to-device copy: %.0f GB/s (read + write), the limit below\n", copy_bw / 1e9);
    static const struct { const char *name; int kv, hd; } shapes[] = {{"llama-3.1-8b", 8, 128},
                                                                       {"llama-3.2-1b", 8, 64}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (const char *p = ctxs; *p;) {
            int ctx = atoi(p);
            if (ctx < 2) {
                fprintf(stderr, "bench_cuda_attention: a context is at least 2 positions\n");
                return 2;
            }
            for (int t = 0; t < 2; t++) /* f32 and bf16 in turn */
                if (run(be, shapes[s].name, shapes[s].kv, shapes[s].hd, t ? EXO_DTYPE_BF16 : EXO_DTYPE_F32, ctx,
                        layers, copy_bw))
                    return 1;
            p = strchr(p, ',');
            p = p ? p + 1 : "";
        }
    be->ops->free(be);
    return 0;
}
