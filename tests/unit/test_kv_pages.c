/* The paged KV cache (engine/kv_pool.h, model.c): sequences take pages as
 * they grow and give them back as they shrink and go; a prefix copied from
 * another sequence shares its whole pages (held once, in the memory
 * figures too); a shared page one of them writes is copied first, so the
 * other's cache never changes under it. Every result is checked against a
 * twin sequence that shares nothing: the same bits on the CPU. */
#include "core/alloc.h"
#include "engine/model.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static exo_model *load(const char *name)
{
    char dir[256];
    snprintf(dir, sizeof dir, "tests/fixtures/%s", name);
    exo_model_opts o = {.n_threads = 2, .max_chunk = 64};
    exo_model *m = NULL;
    exo_err err = {0};
    cr_assert_eq(exo_model_load(dir, &o, &m, &err), 0, "%s: %s", dir, err.msg);
    return m;
}

static exo_seq *seq(exo_model *m, int capacity)
{
    exo_seq *s = NULL;
    exo_err err = {0};
    cr_assert_eq(exo_seq_create(m, capacity, &s, &err), 0, "%s", err.msg);
    return s;
}

/* ids[0..n) through s in calls of `chunk`; the last call's logits. */
static void feed(exo_model *m, exo_seq *s, const int32_t *ids, int n, int chunk, float *logits)
{
    exo_err err = {0};
    for (int c = 0; c < n; c += chunk)
        cr_assert_eq(exo_model_forward(m, s, ids + c, n - c < chunk ? n - c : chunk, logits, false, &err), 0, "%s",
                     err.msg);
}

static float max_diff(const float *a, const float *b, int n)
{
    float d = 0;
    for (int i = 0; i < n; i++)
        d = fmaxf(d, fabsf(a[i] - b[i]));
    return d;
}

static exo_kv_page_stats pages(const exo_model *m)
{
    exo_kv_page_stats st;
    exo_model_kv_pages(m, &st);
    return st;
}

Test(kv_pages, pages_come_and_go_with_the_positions)
{
    exo_model *m = load("llama-q4g64");
    exo_kv_page_stats st = pages(m);
    cr_assert_eq(st.page_positions, 64);
    cr_assert_gt(st.page_bytes, 0);
    cr_expect_eq(st.in_use, 0);
    int V = exo_model_vocab(m);
    float *logits = exo_malloc(sizeof(float) * (size_t)V);
    int32_t ids[200];
    for (int t = 0; t < 200; t++)
        ids[t] = (int32_t)((t * 37 + 11) % V);
    exo_seq *s = seq(m, 256);
    /* a sequence of 256 positions reserves 4 pages and holds none yet */
    cr_expect_eq(pages(m).empty_runs, 4);
    cr_expect_eq(exo_model_kv_bytes(m), exo_model_seq_bytes(m, 256));
    feed(m, s, ids, 130, 64, logits);
    cr_expect_eq(pages(m).in_use, 3, "130 positions: 3 pages");
    cr_expect_eq(pages(m).empty_runs, 1);
    cr_expect_eq(exo_model_kv_bytes(m), exo_model_seq_bytes(m, 256), "held or reserved: the same");
    exo_seq_truncate(s, 64);
    cr_expect_eq(pages(m).in_use, 1, "back to 64: the pages past it go");
    exo_err err = {0};
    cr_assert_eq(exo_seq_resize(s, 1000, &err), 0, "%s", err.msg);
    cr_expect_eq(pages(m).in_use, 1, "growing keeps the page, copies nothing");
    cr_expect_eq(pages(m).empty_runs, 15);
    cr_assert_eq(exo_seq_resize(s, 70, &err), 0, "%s", err.msg);
    cr_expect_eq(pages(m).empty_runs, 1);
    exo_seq_free(s);
    cr_expect_eq(pages(m).in_use, 0);
    cr_expect_eq(pages(m).empty_runs, 0);
    cr_expect_eq(exo_model_kv_bytes(m), 0);
    exo_free(logits);
    exo_model_free(m);
}

/* src computes 150 positions; dst takes its first 128 (two whole pages,
 * shared) and goes on with its own tokens; then src goes back to 100,
 * inside the second shared page, and writes there. dst must give what a
 * sequence that computed its tokens itself gives, before and after src's
 * writes; src what a twin that shared nothing gives. */
static void shared_then_written(const char *name)
{
    exo_model *m = load(name);
    float tol = exo_model_gpu_layers(m) ? 1e-3f : 0.0f;
    int V = exo_model_vocab(m);
    size_t page = pages(m).page_bytes;
    float *la = exo_malloc(sizeof(float) * (size_t)V), *lb = exo_malloc(sizeof(float) * (size_t)V);
    int32_t a[170], b[150], tok;
    for (int t = 0; t < 170; t++)
        a[t] = (int32_t)((t * 37 + 5) % V);
    for (int t = 0; t < 150; t++)
        b[t] = t < 128 ? a[t] : (int32_t)((a[t] + 7) % V);
    exo_seq *src = seq(m, 256), *twin = seq(m, 256), *dst = seq(m, 256), *fresh = seq(m, 256);
    feed(m, src, a, 150, 64, la);
    feed(m, twin, a, 150, 64, la);
    int before = pages(m).in_use;
    size_t bytes = exo_model_kv_bytes(m);
    exo_err err = {0};
    cr_assert_eq(exo_seq_copy_prefix(dst, src, 128, &err), 0, "%s: %s", name, err.msg);
    cr_expect_eq(pages(m).in_use, before, "%s: the prefix's two pages are shared, not copied", name);
    cr_expect_eq(exo_model_kv_bytes(m), bytes - 2 * page, "%s: and counted once", name);
    feed(m, dst, b + 128, 22, 64, lb);
    feed(m, fresh, b, 150, 64, la);
    float d = max_diff(la, lb, V);
    cr_expect_leq(d, tol, "%s: dst's logits differ by %g from a fresh prefill", name, (double)d);
    /* src writes into the second shared page: it gets a copy of its own */
    exo_seq_truncate(src, 100);
    exo_seq_truncate(twin, 100);
    int in_use = pages(m).in_use;
    feed(m, src, a + 150, 20, 64, la);
    cr_expect_eq(pages(m).in_use, in_use + 1, "%s: the written shared page is copied", name);
    feed(m, twin, a + 150, 20, 64, lb);
    d = max_diff(la, lb, V);
    cr_expect_leq(d, tol, "%s: src's logits differ by %g from its twin's after the copy", name, (double)d);
    for (int step = 0; step < 3; step++) { /* dst decodes on as fresh does */
        tok = (int32_t)((step * 13 + 1) % V);
        cr_assert_eq(exo_model_forward(m, dst, &tok, 1, lb, false, &err), 0, "%s", err.msg);
        cr_assert_eq(exo_model_forward(m, fresh, &tok, 1, la, false, &err), 0, "%s", err.msg);
        d = max_diff(la, lb, V);
        cr_expect_leq(d, tol, "%s: step %d after src's writes: dst differs by %g", name, step, (double)d);
    }
    exo_seq_free(src);
    exo_seq_free(twin);
    exo_seq_free(dst);
    exo_seq_free(fresh);
    cr_expect_eq(pages(m).in_use, 0, "%s: every page back", name);
    exo_free(la);
    exo_free(lb);
    exo_model_free(m);
}

/* dense, q/k norms, latent attention, and sliding layers whose rings of
 * 112 slots (window 8 + chunk 64 + blocks) the 128 positions wrap: the
 * ring goes over whole, each position in its slot */
Test(kv_pages, a_shared_prefix_is_copied_before_it_is_written, .timeout = 240)
{
    shared_then_written("llama-q4g64");
    shared_then_written("deepseek_v3-q4g64");
    shared_then_written("qwen3-q4g64");
    shared_then_written("gemma3-q4g64");
    shared_then_written("gpt_oss-q4g64");
}

/* A prefix kept apart from its sequence (the runner's prefix cache)
 * outlives it: a new sequence takes its pages and goes on as one that
 * computed them. Its last page part full (100 positions): the sequence
 * that kept it writes there first, so copies it, and the prefix's page
 * keeps what it held. On the CPU the taker's 58-row call after 100 gives
 * the bits of a prefill cut at 128 (model.h exo_model_exact_rows). */
Test(kv_pages, a_kept_prefix_outlives_its_sequence)
{
    exo_model *m = load("llama-q4g64");
    float tol = exo_model_gpu_layers(m) ? 1e-3f : 0.0f;
    int V = exo_model_vocab(m);
    float *la = exo_malloc(sizeof(float) * (size_t)V), *lb = exo_malloc(sizeof(float) * (size_t)V);
    int32_t a[160];
    for (int t = 0; t < 160; t++)
        a[t] = (int32_t)((t * 29 + 3) % V);
    exo_seq *src = seq(m, 256);
    feed(m, src, a, 150, 64, la);
    exo_kv_prefix *p = NULL;
    exo_err err = {0};
    cr_expect_eq(exo_seq_keep_prefix(src, 192, &p, &err), EXO_EINVAL, "past the length");
    cr_assert_eq(exo_seq_keep_prefix(src, 100, &p, &err), 0, "%s", err.msg);
    cr_expect_eq(exo_kv_prefix_len(p), 100);
    exo_seq_truncate(src, 100);
    exo_seq *dst = seq(m, 256), *fresh = seq(m, 256);
    cr_expect_eq(exo_seq_take_prefix(dst, p, 192, &err), EXO_EINVAL, "more than it holds");
    cr_assert_eq(exo_seq_take_prefix(dst, p, 100, &err), 0, "%s", err.msg);
    cr_expect_eq(exo_seq_len(dst), 100);
    feed(m, dst, a + 100, 58, 64, lb);
    feed(m, fresh, a, 158, 64, la);
    float d = max_diff(la, lb, V);
    cr_expect_leq(d, tol, "logits differ by %g from a fresh prefill", (double)d);
    /* the sequence that kept it writes other tokens after 100: into its own
     * copy of the page, not the taker's positions */
    int32_t other[40];
    for (int t = 0; t < 40; t++)
        other[t] = (int32_t)((t * 31 + 7) % V);
    feed(m, src, other, 40, 64, NULL);
    exo_seq_free(src);
    /* the prefix's two (the first shared with the taker), the taker's two
     * past it, the fresh one's three */
    cr_expect_eq(pages(m).in_use, 7, "%d pages in use", pages(m).in_use);
    feed(m, dst, a + 158, 1, 1, lb);
    feed(m, fresh, a + 158, 1, 1, la);
    d = max_diff(la, lb, V);
    cr_expect_leq(d, tol, "after the other's writes, logits differ by %g from a fresh prefill", (double)d);
    exo_kv_prefix_free(p);
    exo_seq_free(dst);
    exo_seq_free(fresh);
    cr_expect_eq(pages(m).in_use, 0);
    exo_model_free(m);
    exo_free(la);
    exo_free(lb);
}

/* Models that hold caches outside pages keep copies of them with the
 * prefix: sliding layers' rings (the 150 positions wrapped the rings of
 * 112 slots; the window of the 128th is still there) and Gated DeltaNet's
 * recurrent state at 128 (the snapshot taken where the last chunk began).
 * The taker goes on as a fresh prefill, bit for bit on the CPU; the copies
 * count in the cache bytes while kept. A ring that no longer holds the
 * window, or a state kept at another length, is refused. */
Test(kv_pages, a_kept_prefix_carries_rings_and_states, .timeout = 240)
{
    static const char *const names[] = {"gemma3-q4g64", "gpt_oss-q4g64", "qwen3_5-q4g64"};
    int32_t a[260];
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        exo_model *m = load(names[k]);
        const bool recurrent = k == 2;
        float tol = exo_model_gpu_layers(m) ? 1e-3f : 0.0f;
        int V = exo_model_vocab(m);
        float *la = exo_malloc(sizeof(float) * (size_t)V), *lb = exo_malloc(sizeof(float) * (size_t)V);
        for (int t = 0; t < 260; t++)
            a[t] = (int32_t)((t * 29 + 3) % V);
        exo_err err = {0};
        exo_kv_prefix *p = NULL;
        exo_seq *src = seq(m, 256);
        feed(m, src, a, 150, 64, la);
        size_t held = exo_model_kv_bytes(m);
        cr_assert_eq(exo_seq_keep_prefix(src, 128, &p, &err), 0, "%s: %s", names[k], err.msg);
        cr_expect_gt(exo_model_kv_bytes(m), held + 0, "%s: the copies count", names[k]);
        exo_seq_free(src);
        cr_expect_eq(exo_kv_prefix_can_take(p, 64), !recurrent, "%s: 64 of 128", names[k]);
        exo_seq *dst = seq(m, 256), *fresh = seq(m, 256);
        if (recurrent)
            cr_expect_eq(exo_seq_take_prefix(dst, p, 64, &err), EXO_EUNSUPPORTED, "%s: a state at 128 only", names[k]);
        cr_assert_eq(exo_seq_take_prefix(dst, p, 128, &err), 0, "%s: %s", names[k], err.msg);
        cr_expect_eq(exo_seq_len(dst), 128);
        feed(m, dst, a + 128, 30, 64, lb);
        feed(m, fresh, a, 158, 64, la);
        float d = max_diff(la, lb, V);
        cr_expect_leq(d, tol, "%s: logits differ by %g from a fresh prefill", names[k], (double)d);
        for (int step = 0; step < 3; step++) { /* and decodes on as it does */
            int32_t tok = (int32_t)((step * 13 + 1) % V);
            cr_assert_eq(exo_model_forward(m, dst, &tok, 1, lb, false, &err), 0, "%s", err.msg);
            cr_assert_eq(exo_model_forward(m, fresh, &tok, 1, la, false, &err), 0, "%s", err.msg);
            d = max_diff(la, lb, V);
            cr_expect_leq(d, tol, "%s: step %d differs by %g", names[k], step, (double)d);
        }
        exo_kv_prefix_free(p);
        exo_seq_free(dst);
        exo_seq_free(fresh);
        cr_expect_eq(exo_model_kv_bytes(m), 0, "%s: everything given back", names[k]);
        /* too late: the ring moved past 128's window, the state past 128 */
        src = seq(m, 256);
        feed(m, src, a, 250, 64, la);
        cr_expect_eq(exo_seq_keep_prefix(src, 128, &p, &err), EXO_EUNSUPPORTED, "%s", names[k]);
        exo_seq_free(src);
        exo_free(la);
        exo_free(lb);
        exo_model_free(m);
    }
}

/* What a decode step reads from the caches (exo_model_decode_cost) counts
 * each softmax-attention layer's cache in its own type: with EXO_KV_CACHE=
 * bf16 every such layer's is bf16 and half the bytes, a linear-attention
 * layer's state stays f32 (qwen3_5: three linear layers to one full). */
Test(kv_pages, the_decode_cost_counts_bf16_caches)
{
    static const char *models[] = {"llama-q4g64", "qwen3_5-q4g64"};
    for (int i = 0; i < 2; i++) {
        exo_decode_cost c[2];
        for (int bf16 = 0; bf16 < 2; bf16++) {
            if (bf16)
                setenv("EXO_KV_CACHE", "bf16", 1);
            exo_model *m = load(models[i]);
            exo_model_decode_cost(m, 1000, &c[bf16]);
            exo_model_free(m);
            unsetenv("EXO_KV_CACHE");
        }
        cr_expect(c[0].kv_layers > 0 && c[0].kv_bf16_layers == 0, "%s: %d layers, %d bf16", models[i],
                  c[0].kv_layers, c[0].kv_bf16_layers);
        cr_expect(c[1].kv_layers == c[0].kv_layers && c[1].kv_bf16_layers == c[1].kv_layers, "%s: %d of %d bf16",
                  models[i], c[1].kv_bf16_layers, c[1].kv_layers);
        if (c[0].kv_layers == c[0].layers) /* attention only: the caches' bytes halve */
            cr_expect(fabs(c[1].cache_bytes * 2 - c[0].cache_bytes) < 1e-6 * c[0].cache_bytes, "%s: %.0f against %.0f",
                      models[i], c[1].cache_bytes, c[0].cache_bytes);
        else /* linear layers' states are as they were */
            cr_expect(c[1].cache_bytes > c[0].cache_bytes / 2 && c[1].cache_bytes < c[0].cache_bytes,
                      "%s: %.0f against %.0f", models[i], c[1].cache_bytes, c[0].cache_bytes);
    }
}
