/* Random weights for the matmul micro-benchmarks (bench_matmul.c,
 * bench_cuda_matmul.c): a reproducible xorshift stream, and host weights
 * of each format with values of a real checkpoint's magnitudes. Header
 * only: each bench is one translation unit. */
#ifndef EXO_BENCH_WEIGHTS_H
#define EXO_BENCH_WEIGHTS_H

#include "core/alloc.h"
#include "engine/dtype.h"
#include "engine/linear.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BENCH_MXFP4 = -4 }; /* make_weight_g's bits for an MXFP4 weight */

static uint64_t rng = 88172645463325252ull;
static uint64_t next_u64(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
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


/* bits 16: bf16 dense; 2..8: affine with group G; MXFP4: E2M1 codes and
 * E8M0 scales in 118..124 (gpt-oss-like magnitudes). */
static exo_linear make_weight_g(int bits, int G, int64_t rows, int64_t cols)
{
    exo_linear l = {.dtype = EXO_DTYPE_BF16, .rows = rows, .cols = cols};
    if (bits == BENCH_MXFP4) {
        l.format = EXO_WFORMAT_MXFP4;
        l.dtype = EXO_DTYPE_U8;
        l.bits = 4;
        l.group_size = 32;
        size_t cb = (size_t)(rows * cols / 2), ng = (size_t)(rows * cols / 32);
        unsigned char *codes = exo_alloc_aligned(cb), *s = exo_alloc_aligned(ng);
        if (!codes || !s) {
            fprintf(stderr, "out of memory\n");
            exit(1);
        }
        fill_bytes(codes, cb);
        for (size_t i = 0; i < ng; i++)
            s[i] = (unsigned char)(118 + next_u64() % 7);
        l.w = codes;
        l.scales = s;
        return l;
    }
    if (bits == 16) {
        l.format = EXO_WFORMAT_DENSE;
        uint16_t *w = exo_alloc_aligned((size_t)(rows * cols) * 2);
        fill_bf16(w, (size_t)(rows * cols), 0.05f);
        l.w = w;
        return l;
    }
    l.format = EXO_WFORMAT_AFFINE;
    l.bits = bits;
    l.group_size = G;
    size_t cb = (size_t)(rows * cols * bits / 8), ng = (size_t)(rows * cols / G);
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

#endif
