/* CPU attention through the backend op, against a naive double-precision
 * causal softmax attention: token-by-token decode (the per-KV-head kernel
 * over the blocked K cache) and prompts in tiles of tokens (which must
 * give the same bits as a token at a time), with grouped-query heads, a
 * sliding window, a capacity that is not a multiple of the kernel's 16-key
 * block, and head sizes from 8 to 256; each case again over a paged cache
 * (pages of 16 and 32 slots, in scrambled order), which must give the same
 * bits; and every case again over a bf16 cache, against the naive
 * attention of keys and values rounded to bf16 (what such a cache holds)
 * to the same tolerance. */
#include "core/alloc.h"
#include "engine/backend.h"
#include "engine/cpu/ops.h"
#include "engine/dtype.h"

#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

static float frand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* out[t][h] for queries at positions 0..T-1 over all keys 0..T-1 */
static void naive(int T, int H, int KV, int hd, int window, const float *q, const float *k,
                  const float *v, const float *sinks, double *out)
{
    int group = H / KV;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            int kvh = h / group, lo = window > 0 && t - window + 1 > 0 ? t - window + 1 : 0;
            double sc[256], mx = -1e300, sum = 0;
            for (int s = lo; s <= t; s++) {
                double d = 0;
                for (int i = 0; i < hd; i++)
                    d += (double)q[((size_t)t * H + h) * hd + i] * k[((size_t)s * KV + kvh) * hd + i];
                sc[s] = d / sqrt((double)hd);
                mx = sc[s] > mx ? sc[s] : mx;
            }
            for (int s = lo; s <= t; s++)
                sum += (sc[s] = exp(sc[s] - mx));
            if (sinks) /* gpt-oss: one more logit in the denominator, attending to nothing */
                sum += exp((double)sinks[h] - mx);
            for (int i = 0; i < hd; i++) {
                double o = 0;
                for (int s = lo; s <= t; s++)
                    o += sc[s] / sum * v[((size_t)s * KV + kvh) * hd + i];
                out[((size_t)t * H + h) * hd + i] = o;
            }
        }
}

static bool with_sinks; /* check() with a sink logit per query head */
static bool with_ring;  /* check() with a sliding window's cache kept as a ring */
static bool with_bf16;  /* check() with a bf16 cache */

/* The cache of `capacity` slots for run_attention: one run, or pages of
 * `page` slots (0: one run) scattered in reverse order through one
 * allocation, as a pool hands them out. */
typedef struct test_cache {
    exo_kv_view view;
    char *mem;
    void **table;
} test_cache;

/* values of `bytes` each (the shape's cache type) */
static void cache_make(exo_backend *be, test_cache *c, int capacity, int KV, int hd, int page, size_t bytes)
{
    memset(c, 0, sizeof *c);
    if (!page) {
        c->mem = be->ops->alloc(be, 2 * (size_t)capacity * KV * hd * bytes);
        c->view = (exo_kv_view){.k = c->mem, .v = c->mem + (size_t)capacity * KV * hd * bytes,
                                .capacity = capacity, .page = capacity};
        return;
    }
    int runs = (capacity + page - 1) / page;
    size_t run = 2 * (size_t)page * KV * hd * bytes;
    c->mem = be->ops->alloc(be, (size_t)runs * run);
    c->table = exo_calloc((size_t)runs, sizeof(void *));
    for (int i = 0; i < runs; i++)
        c->table[i] = c->mem + (size_t)(runs - 1 - i) * run;
    c->view = (exo_kv_view){.pages = c->table, .k_off = 0, .v_off = (size_t)page * KV * hd, .capacity = capacity,
                            .page = page};
}

static void cache_free(exo_backend *be, test_cache *c)
{
    be->ops->release(be, c->mem);
    exo_free(c->table);
}

/* All T tokens through the op in calls of prefill_chunk into out. */
static void run_attention(exo_backend *be, const exo_attn_shape *sh, int T, int prefill_chunk, const float *q,
                          const float *k, const float *v, const exo_kv_view *cache, float *out)
{
    int H = sh->n_heads, KV = sh->n_kv_heads, hd = sh->head_dim;
    for (int t0 = 0; t0 < T; t0 += prefill_chunk) {
        int n = T - t0 < prefill_chunk ? T - t0 : prefill_chunk;
        int rc = be->ops->attention(be, sh, out + (size_t)t0 * H * hd, q + (size_t)t0 * H * hd,
                                    k + (size_t)t0 * KV * hd, v + (size_t)t0 * KV * hd, cache, n, t0);
        cr_assert_eq(rc, 0);
    }
}

static void check(int T, int H, int KV, int hd, int window, int prefill_chunk)
{
    exo_err err = {0};
    exo_backend *be = exo_backend_cpu_create(2, &err);
    cr_assert(be);
    unsigned seed = (unsigned)(T * 131 + H * 17 + hd + window);
    size_t nq = (size_t)T * H * hd, nk = (size_t)T * KV * hd;
    float *q = exo_malloc(nq * 4), *k = exo_malloc(nk * 4), *v = exo_malloc(nk * 4);
    float *out = exo_calloc(nq, 4), *paged = exo_calloc(nq, 4);
    double *want = exo_malloc(nq * 8);
    for (size_t i = 0; i < nq; i++)
        q[i] = 2 * frand(&seed);
    for (size_t i = 0; i < nk; i++) {
        k[i] = 2 * frand(&seed);
        v[i] = frand(&seed);
    }
    float sinks[64];
    for (int h = 0; h < H && h < 64; h++) /* around the scores, and one far above them */
        sinks[h] = h == 1 ? 6.0f : 2 * frand(&seed);
    if (with_bf16) { /* the reference reads what the cache holds */
        float *kr = exo_malloc(nk * 4), *vr = exo_malloc(nk * 4);
        for (size_t i = 0; i < nk; i++) {
            kr[i] = exo_bf16_to_f32(exo_f32_to_bf16(k[i]));
            vr[i] = exo_bf16_to_f32(exo_f32_to_bf16(v[i]));
        }
        naive(T, H, KV, hd, window, q, kr, vr, with_sinks ? sinks : NULL, want);
        exo_free(kr);
        exo_free(vr);
    } else {
        naive(T, H, KV, hd, window, q, k, v, with_sinks ? sinks : NULL, want);
    }
    int capacity = (T + 15) / 16 * 16 + 16; /* what model.c allocates for T + a few */
    int ring = 0;
    if (with_ring) { /* the window plus a call's tokens, rounded up to a block: model.c's rule */
        ring = (window + prefill_chunk + 31) / 16 * 16;
        cr_assert(window > 0 && ring < T, "a ring test needs a window and positions that wrap around");
        capacity = ring;
    }
    exo_attn_shape sh = {.n_heads = H, .n_kv_heads = KV, .head_dim = hd, .sliding_window = window,
                         .scale = 1.0f / sqrtf((float)hd), .sinks = with_sinks ? sinks : NULL, .ring = ring,
                         .cache = with_bf16 ? EXO_DTYPE_BF16 : EXO_DTYPE_F32};
    const size_t bytes = with_bf16 ? 2 : 4;
    test_cache whole;
    cache_make(be, &whole, capacity, KV, hd, 0, bytes);
    run_attention(be, &sh, T, prefill_chunk, q, k, v, &whole.view, out);
    double max_err = 0;
    for (size_t i = 0; i < nq; i++)
        max_err = fmax(max_err, fabs(out[i] - want[i]));
    cr_expect(max_err < 2e-5, "T %d H %d KV %d hd %d window %d chunk %d%s: max err %g", T, H, KV, hd,
              window, prefill_chunk, with_bf16 ? " bf16" : "", max_err);
    /* a token a call (the decode kernel): the same bits, whatever kernel
     * and chunks the prompt took */
    if (prefill_chunk > 1) {
        test_cache one;
        cache_make(be, &one, capacity, KV, hd, 0, bytes);
        run_attention(be, &sh, T, 1, q, k, v, &one.view, paged);
        size_t i = 0;
        while (i < nq && !memcmp(&paged[i], &out[i], 4))
            i++;
        cr_expect(i == nq, "T %d H %d KV %d hd %d window %d chunk %d%s: token %zu head %zu column %zu is %a in "
                  "chunks, %a a token at a time", T, H, KV, hd, window, prefill_chunk, with_bf16 ? " bf16" : "",
                  i / ((size_t)H * hd), i / hd % H, i % hd, i < nq ? out[i] : 0.0, i < nq ? paged[i] : 0.0);
        cache_free(be, &one);
    }
    /* the same cache in pages of 16 and 32 slots (a ring stays one run):
     * the same bits */
    for (int page = 16; page <= 32 && !ring; page *= 2) {
        test_cache pc;
        cache_make(be, &pc, capacity, KV, hd, page, bytes);
        run_attention(be, &sh, T, prefill_chunk, q, k, v, &pc.view, paged);
        cr_expect(!memcmp(paged, out, nq * 4), "T %d H %d KV %d hd %d window %d chunk %d: pages of %d differ from "
                  "one run", T, H, KV, hd, window, prefill_chunk, page);
        cache_free(be, &pc);
    }
    cache_free(be, &whole);
    be->ops->free(be);
    exo_free(q);
    exo_free(k);
    exo_free(v);
    exo_free(out);
    exo_free(paged);
    exo_free(want);
}

static void decode_token_by_token_cases(void)
{
    check(37, 8, 2, 64, 0, 1);
    check(21, 4, 4, 8, 0, 1);
    check(50, 6, 3, 32, 0, 1);
    /* passes of 4 query heads and a remainder of 1, 2 or 3 (groups of 5, 6
     * and 7), groups of exactly 2 and 3 (qwen3-0.6b, 3:1 models), head
     * sizes with a 64-wide, 16-wide and scalar part, one KV head (whole
     * group on one thread) */
    check(40, 10, 2, 128, 0, 1);
    check(35, 8, 8, 80, 0, 1);
    check(33, 4, 1, 24, 0, 1);
    check(20, 12, 2, 64, 0, 1);
    check(29, 14, 2, 64, 0, 1);
    check(31, 16, 8, 128, 0, 1);
    check(26, 9, 3, 80, 0, 1);
    /* groups of 1 and 2 take V 128 columns a pass: heads of 256 (two
     * passes) and 192 (one, then a 64-wide one) */
    check(30, 4, 2, 256, 0, 1);
    check(27, 2, 1, 192, 0, 1);
}

Test(attention, decode_token_by_token) { decode_token_by_token_cases(); }

/* Short prompts (2..7 tokens a call) take the decode kernel with T > 1:
 * later tokens of a call attend to keys appended in the same call. */
static void decode_several_tokens_per_call_cases(void)
{
    check(37, 8, 2, 64, 0, 3);
    check(30, 5, 1, 24, 0, 7);
    check(41, 8, 4, 32, 9, 5);
}

Test(attention, decode_several_tokens_per_call) { decode_several_tokens_per_call_cases(); }

/* Prompts of 8 tokens a call and more take tiles of tokens (16 query
 * rows, or one token's group where that is larger): tiles of 8 tokens of
 * 2 heads, 4 of 4, 5 of 3 (15 rows), 2 of 6, 1 of 24 (rows past 16); a
 * last tile cut short; head sizes with 64-wide, 16-wide and scalar parts;
 * a span of V cut at a page's end (pages of 16 and 32 in check). */
static void prefill_tiles_cases(void)
{
    check(37, 8, 2, 64, 0, 37);
    check(40, 4, 1, 8, 0, 16);
    check(70, 16, 8, 128, 0, 70);
    check(61, 16, 4, 80, 0, 24);
    check(45, 9, 3, 24, 0, 13);
    check(33, 12, 2, 64, 0, 9);
    check(29, 24, 1, 32, 0, 10);
    check(100, 4, 2, 192, 0, 100);
}

Test(attention, prefill_tiles) { prefill_tiles_cases(); }

static void sliding_window_cases(void)
{
    check(45, 8, 2, 64, 7, 1);
    check(45, 8, 2, 64, 7, 45);
    check(45, 4, 2, 16, 16, 9);
}

Test(attention, sliding_window) { sliding_window_cases(); }

/* Sinks (gpt-oss) on both kernels, with a window, GQA groups of 1 to 8. */
static void sinks_cases(void)
{
    with_sinks = true;
    check(37, 8, 2, 64, 0, 1);
    check(37, 8, 2, 64, 0, 37);
    check(45, 8, 1, 32, 7, 1);
    check(45, 8, 1, 32, 7, 45);
    check(30, 4, 4, 16, 5, 3);
    with_sinks = false;
}

Test(attention, sinks) { sinks_cases(); }

/* A sliding window's cache as a ring of window + chunk positions (rounded
 * to 16): positions wrap around it several times, on the decode kernel, the
 * several-tokens-per-call one and the tiles; with sinks too. */
static void sliding_window_ring_cases(void)
{
    with_ring = true;
    check(100, 8, 2, 64, 7, 1);
    check(90, 4, 2, 16, 16, 5);
    check(120, 8, 2, 64, 20, 16);
    check(150, 4, 1, 32, 9, 40);
    with_sinks = true;
    check(100, 8, 2, 64, 7, 1);
    check(130, 8, 2, 32, 24, 32);
    with_sinks = false;
    with_ring = false;
}

Test(attention, sliding_window_ring) { sliding_window_ring_cases(); }

/* Every case above again over a bf16 cache. */
Test(attention, bf16_cache)
{
    with_bf16 = true;
    decode_token_by_token_cases();
    decode_several_tokens_per_call_cases();
    prefill_tiles_cases();
    sliding_window_cases();
    sinks_cases();
    sliding_window_ring_cases();
    with_bf16 = false;
}

/* The vectorisable expf of the softmax and SiLU against libm: relative
 * error within 2e-7 over the whole non-underflowing range, exact 0 below
 * it, and monotone on a fine grid. */
Test(attention, fast_expf_matches_libm)
{
    float prev = 0.0f;
    double worst = 0;
    for (float x = -87.0f; x <= 88.0f; x += 0.0007f) {
        float got = exo_fast_expf(x), want = expf(x);
        double rel = fabs((double)got - (double)want) / (double)want;
        if (rel > worst)
            worst = rel;
        cr_assert(got >= prev, "not monotone at %g", (double)x);
        prev = got;
    }
    cr_assert(worst < 2e-7, "max relative error %g", worst);
    cr_assert_eq(exo_fast_expf(-88.0f), 0.0f);
    cr_assert_eq(exo_fast_expf(-1e30f), 0.0f);
    cr_assert_float_eq(exo_fast_expf(0.0f), 1.0f, 0.0f);
    cr_assert(exo_fast_expf(100.0f) > 1e38f);
}
