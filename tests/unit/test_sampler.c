/* Sampler: each filter and penalty against its definition, the sampled
 * distribution against softmax(logits / T), seeds, and log probabilities. */
#include "engine/sampler.h"
#include "core/alloc.h"
#include "engine/cpu/ops.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static exo_sample sample_once(exo_sampler_params p, const float *logits, int V,
                              const int32_t *hist, int n_hist)
{
    float l[64];
    memcpy(l, logits, sizeof(float) * (size_t)V);
    exo_sampler *s = exo_sampler_create(&p, V);
    exo_sample out;
    exo_sampler_sample(s, l, hist, n_hist, &out);
    exo_sampler_free(s);
    return out;
}

/* One token drawn from a copy of logits (the sampler modifies what it
 * samples), with no history. */
static int32_t draw(exo_sampler *s, const float *logits, float *scratch, int V)
{
    memcpy(scratch, logits, sizeof(float) * (size_t)V);
    exo_sample out;
    exo_sampler_sample(s, scratch, NULL, 0, &out);
    return out.id;
}

Test(sampler, greedy_is_argmax_lowest_id_on_ties)
{
    float l[5] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
    exo_sample s = sample_once(exo_sampler_defaults(), l, 5, NULL, 0);
    cr_expect_eq(s.id, 1);
}

static void histogram(exo_sampler_params p, const float *logits, int V, int n, int *counts)
{
    exo_sampler *s = exo_sampler_create(&p, V);
    memset(counts, 0, sizeof(int) * (size_t)V);
    for (int i = 0; i < n; i++) {
        float l[64];
        memcpy(l, logits, sizeof(float) * (size_t)V);
        exo_sample out;
        exo_sampler_sample(s, l, NULL, 0, &out);
        counts[out.id]++;
    }
    exo_sampler_free(s);
}

Test(sampler, temperature_matches_softmax)
{
    float l[4] = {1.0f, 0.0f, -0.5f, 2.0f};
    exo_sampler_params p = exo_sampler_defaults();
    p.temperature = 0.7f;
    int counts[4], n = 40000;
    histogram(p, l, 4, n, counts);
    double z = 0, prob[4];
    for (int i = 0; i < 4; i++)
        z += exp(l[i] / 0.7);
    for (int i = 0; i < 4; i++) {
        prob[i] = exp(l[i] / 0.7) / z;
        double sd = sqrt(prob[i] * (1 - prob[i]) / n);
        /* 5 standard deviations: fails by chance about once in 10^6 runs,
         * but the seed is fixed so the outcome is deterministic anyway */
        cr_expect(fabs(counts[i] / (double)n - prob[i]) < 5 * sd + 1e-9, "token %d: %f vs %f", i,
                  counts[i] / (double)n, prob[i]);
    }
}

Test(sampler, same_seed_same_tokens_other_seed_other_tokens)
{
    float l[8] = {0, 0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f};
    exo_sampler_params p = exo_sampler_defaults();
    p.temperature = 1.0f;
    int a[200], b[200], c[200];
    for (int run = 0; run < 3; run++) {
        p.seed = run == 2 ? 43 : 42;
        exo_sampler *s = exo_sampler_create(&p, 8);
        for (int i = 0; i < 200; i++) {
            float x[8];
            memcpy(x, l, sizeof x);
            exo_sample out;
            exo_sampler_sample(s, x, NULL, 0, &out);
            (run == 0 ? a : run == 1 ? b : c)[i] = out.id;
        }
        exo_sampler_free(s);
    }
    cr_expect(memcmp(a, b, sizeof a) == 0);
    cr_expect(memcmp(a, c, sizeof a) != 0);
}

Test(sampler, top_k_keeps_k_most_likely)
{
    float l[6] = {3, 2.9f, 2.8f, 0, 0, 0};
    exo_sampler_params p = exo_sampler_defaults();
    p.temperature = 5.0f; /* flat: every token would appear without top-k */
    p.top_k = 2;
    int counts[6];
    histogram(p, l, 6, 5000, counts);
    cr_expect(counts[0] > 0 && counts[1] > 0);
    for (int i = 2; i < 6; i++)
        cr_expect_eq(counts[i], 0, "token %d sampled %d times", i, counts[i]);
}

Test(sampler, top_p_keeps_the_nucleus)
{
    /* probabilities 0.5, 0.3, 0.15, 0.05 */
    float l[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    exo_sampler_params p = exo_sampler_defaults();
    p.temperature = 1.0f;
    p.top_p = 0.7f; /* 0.5 < 0.7 <= 0.8: tokens 0 and 1 */
    int counts[4];
    histogram(p, l, 4, 5000, counts);
    cr_expect(counts[0] > 0 && counts[1] > 0);
    cr_expect_eq(counts[2] + counts[3], 0);
}

/* A nucleus that reaches past the tokens near the top: 100 tokens at logit
 * 0 hold 97.6% of the mass, 19,900 tied at -9 the rest, so top-p 0.99
 * keeps all 100 and the lowest ids of the tied group (ties go by id). The
 * sampler sorts the head first and widens it; its picks must lie in the
 * set a full sort keeps, and reach into the tied group. */
Test(sampler, top_p_past_the_head_is_the_full_sorts_cut)
{
    enum { V = 20000, N = 10000 };
    float *logits = malloc(sizeof(float) * V), *l = malloc(sizeof(float) * V);
    bool *top = calloc(V, 1);
    for (int i = 0; i < V; i++)
        logits[i] = -9.0f;
    for (int i = 0; i < 100; i++) { /* scattered ids */
        int id = (i * 7919) % V;
        logits[id] = 0.0f;
        top[id] = true;
    }
    /* the reference cut: the top 100, then tied ids in order until 0.99 */
    double lse = log(100.0 + (V - 100) * exp(-9.0)), cum = 100 * exp(0.0 - lse);
    int last_tied = -1;
    for (int id = 0; id < V && cum < 0.99; id++)
        if (!top[id]) {
            cum += exp(-9.0 - lse);
            last_tied = id;
        }
    cr_assert(last_tied > 0);
    exo_sampler_params p = exo_sampler_defaults();
    p.temperature = 1.0f;
    p.top_p = 0.99f;
    exo_sampler *s = exo_sampler_create(&p, V);
    int tied = 0;
    for (int n = 0; n < N; n++) {
        int32_t id = draw(s, logits, l, V);
        cr_assert(top[id] || id <= last_tied, "token %d is outside the nucleus (last tied id %d)",
                  id, last_tied);
        tied += !top[id];
    }
    cr_expect(tied > N / 200, "the tied group was sampled %d times of %d", tied, N);
    exo_sampler_free(s);
    free(logits);
    free(l);
    free(top);
}

/* A small top-k over a flat vocabulary (a random model's logits) is
 * selected, not sorted: 10 scattered tokens at logit 1, the rest tied at
 * 0, so top-k 40 keeps the 10 and the 30 lowest ids of the tie, as a full
 * sort (ties by id) does; with top-p 0.0001 only the first of the 10 (each
 * holds 0.000136). */
Test(sampler, small_top_k_on_a_flat_vocabulary_is_the_full_sorts_prefix)
{
    enum { V = 20000, N = 4000 };
    float *logits = calloc(V, sizeof(float)), *l = malloc(sizeof(float) * V);
    bool *kept = calloc(V, 1);
    int first_top = V;
    for (int i = 0; i < 10; i++) {
        int id = 5000 + i * 1499;
        logits[id] = 1.0f;
        kept[id] = true;
        first_top = id < first_top ? id : first_top;
    }
    for (int id = 0, tied = 0; tied < 30; id++)
        if (!kept[id]) {
            kept[id] = true;
            tied++;
        }
    exo_sampler_params p = exo_sampler_defaults();
    p.temperature = 1.0f;
    p.top_k = 40;
    exo_sampler *s = exo_sampler_create(&p, V);
    int from_tie = 0;
    for (int n = 0; n < N; n++) {
        int32_t id = draw(s, logits, l, V);
        cr_assert(kept[id], "token %d is not among the 40 most likely", id);
        from_tie += logits[id] == 0.0f;
    }
    cr_expect(from_tie > N / 10, "the tied part was sampled %d times of %d", from_tie, N);
    exo_sampler_free(s);
    p.top_p = 0.0001f;
    s = exo_sampler_create(&p, V);
    for (int n = 0; n < 50; n++) {
        int32_t id = draw(s, logits, l, V);
        cr_assert_eq(id, first_top);
    }
    exo_sampler_free(s);
    free(logits);
    free(l);
    free(kept);
}

/* A batch's rows (exo_sampler_rows): those drawn side by side on a pool's
 * threads draw what each sampler draws alone (samplers share nothing, the
 * sort's comparator included), a picked row takes its pick into its
 * history, a row without a sampler is left alone. */
Test(sampler, rows_side_by_side_as_alone)
{
    enum { V = 3000, ROWS = 8, STEPS = 20 };
    exo_pool *pool = exo_pool_create(4);
    exo_sampler *par[ROWS], *seq[ROWS];
    float *logits = malloc(sizeof(float) * V * ROWS), *copy = malloc(sizeof(float) * V * ROWS);
    exo_sample out[ROWS];
    exo_pick picks[ROWS] = {{0}};
    srand(7);
    for (int r = 0; r < ROWS; r++) {
        exo_sampler_params p = exo_sampler_defaults();
        p.temperature = 0.8f;
        p.top_k = r % 2 ? 300 : 0; /* past the selection: sorted */
        p.top_p = 0.95f;
        p.seed = (uint64_t)r;
        par[r] = exo_sampler_create(&p, V);
        seq[r] = exo_sampler_create(&p, V);
    }
    picks[3] = (exo_pick){.picked = true, .id = 17, .logprob = -2.5f};
    exo_sampler *with_none[ROWS];
    memcpy(with_none, par, sizeof par);
    with_none[5] = NULL;
    for (int step = 0; step < STEPS; step++) {
        for (int i = 0; i < V * ROWS; i++)
            logits[i] = copy[i] = (float)(rand() % 1000) / 100.0f;
        out[5].id = -7;
        exo_sampler_rows(pool, with_none, picks, logits, out, ROWS);
        cr_assert(out[3].id == 17 && out[3].logprob == -2.5f, "the picked row: %d %g", out[3].id, out[3].logprob);
        cr_assert_eq(out[5].id, -7, "a row without a sampler was sampled");
        for (int r = 0; r < ROWS; r++) {
            if (r == 3 || r == 5)
                continue;
            exo_sample alone;
            exo_sampler_next(seq[r], copy + (size_t)r * V, &alone);
            cr_assert_eq(out[r].id, alone.id, "step %d row %d: %d beside others, %d alone", step, r, out[r].id,
                         alone.id);
        }
    }
    for (int r = 0; r < ROWS; r++) {
        exo_sampler_free(par[r]);
        exo_sampler_free(seq[r]);
    }
    free(logits);
    free(copy);
    exo_pool_free(pool);
}

Test(sampler, pick_rule_takes_the_draws_own_number)
{
    enum { V = 50, N = 40 };
    float logits[V], l[V];
    for (int i = 0; i < V; i++)
        logits[i] = (float)((i * 37) % 11) * 0.3f;
    exo_sampler_params p = exo_sampler_defaults();
    exo_pick_rule rule = {.temperature = -1, .u = -1};
    exo_sampler *g = exo_sampler_create(&p, V);
    cr_expect(exo_sampler_pick_rule(g, &rule) && rule.temperature == 0);
    exo_sampler_free(g);
    p.temperature = 0.8f;
    p.seed = 9;
    exo_sampler *a = exo_sampler_create(&p, V), *twin = exo_sampler_create(&p, V);
    double last_u = -1;
    for (int t = 0; t < N; t++) {
        exo_sample x, y;
        cr_assert(exo_sampler_pick_rule(a, &rule) && rule.temperature == 0.8f && rule.u >= 0 && rule.u < 1);
        exo_pick_rule again;
        cr_assert(exo_sampler_pick_rule(a, &again) && again.u == rule.u, "a token's number changed");
        cr_expect(rule.u != last_u);
        last_u = rule.u;
        if (t % 2) { /* the backend drew: the twin draws its own, and they go on in step */
            exo_sampler_take(a, &(exo_pick){.picked = true, .id = 3, .logprob = -1.0f}, &x);
            memcpy(l, logits, sizeof l);
            exo_sampler_next(twin, l, &y);
            continue;
        }
        memcpy(l, logits, sizeof l);
        exo_sampler_next(a, l, &x);
        memcpy(l, logits, sizeof l);
        exo_sampler_next(twin, l, &y);
        cr_expect_eq(x.id, y.id, "token %d: %d with the rule's number, %d without", t, x.id, y.id);
    }
    exo_sampler_free(a);
    exo_sampler_free(twin);
    /* filters and penalties go into the rule: the window's tokens, each once (first seen first), with
     * their counts; making it leaves the host's penalties as they were */
    p.top_k = 40;
    p.top_p = 0.5f;
    p.min_p = 0.05f;
    p.repetition_penalty = 1.1f;
    p.repetition_context_size = 6;
    p.presence_penalty = 0.5f;
    static const int32_t prompt[] = {9, 1, 4, 1, 5, 9, 2, 1}, want_id[] = {4, 1, 5, 9, 2};
    static const uint16_t want_n[] = {1, 2, 1, 1, 1};
    exo_sampler *f = exo_sampler_create(&p, V), *ftwin = exo_sampler_create(&p, V);
    cr_assert(!exo_sampler_begin(f, prompt, 8, 4) && !exo_sampler_begin(ftwin, prompt, 8, 4));
    cr_assert(exo_sampler_pick_rule(f, &rule));
    cr_expect(rule.top_k == 40 && rule.top_p == 0.5f && rule.min_p == 0.05f && rule.repetition_penalty == 1.1f &&
              rule.presence_penalty == 0.5f && rule.frequency_penalty == 0);
    cr_assert_eq(rule.n_penalized, 5);
    for (int i = 0; i < 5; i++)
        cr_expect(rule.penalized[i] == want_id[i] && rule.penalized_count[i] == want_n[i], "token %d: %d x%d", i,
                  rule.penalized[i], rule.penalized_count[i]);
    exo_sample x, y;
    memcpy(l, logits, sizeof l);
    exo_sampler_next(f, l, &x);
    memcpy(l, logits, sizeof l);
    exo_sampler_next(ftwin, l, &y);
    cr_expect(x.id == y.id && x.logprob == y.logprob, "%d %g with a rule made, %d %g without", x.id, x.logprob, y.id,
              y.logprob);
    exo_sampler_free(f);
    exo_sampler_free(ftwin);
    /* alternatives go into the rule, and a pick's come out as the sample's; what a rule cannot carry: a
     * top-k past EXO_PICK_TOP_K (at or past the vocabulary it is off), a window past EXO_PICK_PENALIZED */
    exo_sampler_params q = p;
    q.top_logprobs = 2;
    exo_sampler *r = exo_sampler_create(&q, V);
    cr_expect(exo_sampler_pick_rule(r, &rule) && rule.top_logprobs == 2);
    exo_pick three = {.picked = true, .id = 7, .logprob = -0.5f, .n_top = 3, .top_ids = {7, 1, 2},
                      .top_logprobs = {-0.5f, -1.0f, -2.0f}};
    exo_sampler_take(r, &three, &x);
    cr_expect(x.id == 7 && x.n_top == 2 && x.top_ids[1] == 1 && x.top_logprobs[1] == -1.0f,
              "the sample: %d, %d alternatives", x.id, x.n_top);
    exo_sampler_free(r);
    q = p;
    q.top_k = EXO_PICK_TOP_K + 1;
    r = exo_sampler_create(&q, 4 * EXO_PICK_TOP_K);
    cr_expect(!exo_sampler_pick_rule(r, &rule), "a top-k past the device's");
    exo_sampler_free(r);
    r = exo_sampler_create(&q, V);
    cr_expect(exo_sampler_pick_rule(r, &rule) && rule.top_k == 0, "a top-k past the vocabulary is off");
    exo_sampler_free(r);
    q = p;
    q.repetition_context_size = EXO_PICK_PENALIZED + 1;
    r = exo_sampler_create(&q, V);
    cr_expect(!exo_sampler_pick_rule(r, &rule), "a window past the device's");
    exo_sampler_free(r);
}

Test(sampler, min_p_drops_tokens_below_fraction_of_max)
{
    float l[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    exo_sampler_params p = exo_sampler_defaults();
    p.temperature = 1.0f;
    p.min_p = 0.5f; /* keep p >= 0.25: tokens 0 and 1 */
    int counts[4];
    histogram(p, l, 4, 5000, counts);
    cr_expect(counts[0] > 0 && counts[1] > 0);
    cr_expect_eq(counts[2] + counts[3], 0);
}

Test(sampler, repetition_penalty_divides_positive_multiplies_negative_within_window)
{
    exo_sampler_params p = exo_sampler_defaults();
    p.repetition_penalty = 2.0f;
    p.repetition_context_size = 3;
    float l[5] = {4, -4, 4, 4, 1};
    int32_t hist[5] = {2, 0, 1, 0, 0}; /* window = last 3: {1, 0, 0}; token 2 is outside */
    exo_sampler *s = exo_sampler_create(&p, 5);
    exo_sample out;
    exo_sampler_sample(s, l, hist, 5, &out);
    exo_sampler_free(s);
    cr_expect_float_eq(l[0], 2.0f, 1e-6);
    cr_expect_float_eq(l[1], -8.0f, 1e-6);
    cr_expect_float_eq(l[2], 4.0f, 1e-6);
    cr_expect_eq(out.id, 2); /* ties 2 and 3 at 4.0: lowest id */
}

Test(sampler, presence_and_frequency_penalties)
{
    exo_sampler_params p = exo_sampler_defaults();
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    float l[3] = {1, 1, 1};
    int32_t hist[4] = {0, 0, 0, 1};
    exo_sampler *s = exo_sampler_create(&p, 3);
    exo_sample out;
    exo_sampler_sample(s, l, hist, 4, &out);
    exo_sampler_sample(s, (float[3]){1, 1, 1}, hist, 4, &out); /* counts reset between calls */
    exo_sampler_free(s);
    cr_expect_float_eq(l[0], 1 - 0.5f - 0.75f, 1e-6);
    cr_expect_float_eq(l[1], 1 - 0.5f - 0.25f, 1e-6);
    cr_expect_float_eq(l[2], 1.0f, 1e-6);
    cr_expect_eq(out.id, 2);
}

Test(sampler, logprobs_are_log_softmax_with_sorted_alternatives)
{
    float l[6] = {0.1f, 2.0f, -1.0f, 1.5f, 0.3f, 1.9f};
    exo_sampler_params p = exo_sampler_defaults();
    p.top_logprobs = 3;
    exo_sample s = sample_once(p, l, 6, NULL, 0);
    double z = 0;
    for (int i = 0; i < 6; i++)
        z += exp(l[i]);
    cr_expect_eq(s.id, 1);
    cr_expect_float_eq(s.logprob, (float)(2.0 - log(z)), 1e-5);
    cr_assert_eq(s.n_top, 3);
    int want[3] = {1, 5, 3};
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(s.top_ids[i], want[i]);
        cr_expect_float_eq(s.top_logprobs[i], (float)(l[want[i]] - log(z)), 1e-5);
    }
}

/* The vectorised reductions the sampler runs over the vocabulary, against
 * plain loops: every length up to a few vectors (tails), ties (lowest
 * index wins), NaN (never wins) and -inf. */
static int argmax_ref(const float *x, int n)
{
    int b = -1;
    for (int i = 0; i < n; i++)
        if (!isnan(x[i]) && (b < 0 || x[i] > x[b]))
            b = i;
    return b < 0 || x[b] == -INFINITY ? 0 : b;
}

Test(sampler, vocabulary_reductions_match_plain_loops)
{
    float x[80];
    unsigned seed = 7;
    for (int n = 1; n <= 80; n++) {
        for (int trial = 0; trial < 20; trial++) {
            for (int i = 0; i < n; i++) {
                seed = seed * 1103515245u + 12345u;
                x[i] = (float)((seed >> 16) % 9) - 4.0f; /* few values: many ties */
            }
            if (trial % 4 == 1)
                x[(seed >> 8) % (unsigned)n] = NAN;
            if (trial % 4 == 2)
                x[(seed >> 9) % (unsigned)n] = -INFINITY;
            cr_assert_eq(exo_cpu_argmax_f32(x, n), argmax_ref(x, n), "n %d trial %d", n, trial);
            float mx = -INFINITY;
            double want = 0;
            for (int i = 0; i < n; i++)
                if (x[i] > mx)
                    mx = x[i];
            cr_assert_eq(exo_cpu_max_f32(x, n), mx, "n %d trial %d", n, trial);
            if (trial % 4 == 1 || mx == -INFINITY)
                continue; /* NaN either way */
            for (int i = 0; i < n; i++)
                want += exp((double)x[i] - (double)mx);
            double got = exo_cpu_exp_sum_f32(x, n, mx, NULL);
            cr_assert(fabs(got - want) <= 1e-6 * want, "n %d: %g vs %g", n, got, want);
            /* the terms written out, in place (how softmax uses it) */
            float terms[80];
            memcpy(terms, x, sizeof(float) * (size_t)n);
            cr_assert_eq(exo_cpu_exp_sum_f32(terms, n, mx, terms), got);
            for (int i = 0; i < n; i++)
                cr_assert(fabs(terms[i] - exp((double)x[i] - mx)) <= 2e-7 * exp((double)x[i] - mx),
                          "n %d term %d", n, i);
        }
    }
    float all_nan[20];
    for (int i = 0; i < 20; i++)
        all_nan[i] = NAN;
    cr_assert_eq(exo_cpu_argmax_f32(all_nan, 20), 0);
}

/* A whole vocabulary: the sum over 150k terms stays within 1e-6 of a
 * double-precision libm sum, so logprobs keep ~6 digits. */
Test(sampler, sum_exp_over_a_vocabulary)
{
    enum { N = 151936 };
    float *x = exo_malloc(N * sizeof(float));
    unsigned seed = 3;
    for (int i = 0; i < N; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = (float)((seed >> 8) & 0xffff) / 2048.0f - 20.0f;
    }
    x[123457] = 25.0f;
    float mx = exo_cpu_max_f32(x, N);
    cr_assert_eq(mx, 25.0f);
    cr_assert_eq(exo_cpu_argmax_f32(x, N), 123457);
    double want = 0;
    for (int i = 0; i < N; i++)
        want += exp((double)x[i] - 25.0);
    double got = exo_cpu_exp_sum_f32(x, N, mx, NULL);
    cr_assert(fabs(got - want) <= 1e-6 * want, "%.9g vs %.9g", got, want);
    exo_free(x);
}

/* exo_sampler_next keeps the history itself: the prompt, then its own picks,
 * which the penalties then see (here a repeated pick is penalised away). */
Test(sampler, next_penalises_its_own_picks)
{
    exo_sampler_params p = exo_sampler_defaults();
    p.temperature = 0;
    p.repetition_penalty = 4.0f;
    exo_sampler *s = exo_sampler_create(&p, 3);
    int32_t prompt[1] = {0};
    cr_assert_eq(exo_sampler_begin(s, prompt, 1, 4), 0);
    exo_sample out;
    exo_sampler_next(s, (float[3]){8, 3, 2.5f}, &out); /* token 0 is in the prompt: 8 / 4 = 2 */
    cr_expect_eq(out.id, 1);
    exo_sampler_next(s, (float[3]){1, 3, 2.5f}, &out); /* 1 was just picked: 3 / 4 */
    cr_expect_eq(out.id, 2);
    exo_sampler_free(s);
}
