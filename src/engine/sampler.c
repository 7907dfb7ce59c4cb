/* Sampling (see sampler.h). Filters work on a candidate list sorted by
 * logit only when a filter needs order (top-k, top-p); greedy and min-p
 * alone never sort the vocabulary. */
#include "engine/sampler.h"
#include "core/alloc.h"
#include "core/error.h"
#include "engine/cpu/ops.h"
#include "engine/order.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct exo_sampler {
    exo_sampler_params p;
    int vocab;
    uint64_t rng[4];
    int32_t *cand;    /* (vocab) candidate ids */
    float *prob;      /* (vocab) */
    uint16_t *count;  /* (vocab) occurrences in the penalty window */
    int32_t *hist;    /* exo_sampler_next's history: the prompt, then its picks */
    int n_hist, cap_hist;
    bool held;        /* held_u is the number exo_sampler_pick_rule took for this token */
    double held_u;
    int32_t *penalized;        /* window_tokens': the penalty window's distinct tokens, */
    uint16_t *penalized_count; /* with their counts */
};

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(uint64_t *s)
{
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

static double next_unit(uint64_t *s) { return (double)(next_u64(s) >> 11) * 0x1.0p-53; }

/* A draw's uniform number: the one exo_sampler_pick_rule took for this
 * token, else the stream's next. */
static double draw_unit(exo_sampler *s)
{
    if (!s->held)
        return next_unit(s->rng);
    s->held = false;
    return s->held_u;
}

exo_sampler *exo_sampler_create(const exo_sampler_params *p, int vocab)
{
    exo_sampler *s = exo_calloc(1, sizeof *s);
    s->p = *p;
    if (s->p.repetition_context_size <= 0)
        s->p.repetition_context_size = 20;
    if (s->p.top_logprobs < 0)
        s->p.top_logprobs = 0;
    if (s->p.top_logprobs > EXO_MAX_TOP_LOGPROBS)
        s->p.top_logprobs = EXO_MAX_TOP_LOGPROBS;
    if (s->p.top_logprobs > vocab)
        s->p.top_logprobs = vocab;
    s->vocab = vocab;
    uint64_t seed = p->seed;
    for (int i = 0; i < 4; i++)
        s->rng[i] = splitmix64(&seed);
    s->cand = exo_malloc(sizeof(int32_t) * (size_t)vocab);
    s->prob = exo_malloc(sizeof(float) * (size_t)vocab);
    s->count = exo_calloc((size_t)vocab, sizeof(uint16_t));
    size_t distinct = (size_t)(s->p.repetition_context_size < vocab ? s->p.repetition_context_size : vocab);
    s->penalized = exo_malloc(sizeof(int32_t) * (distinct ? distinct : 1));
    s->penalized_count = exo_malloc(sizeof(uint16_t) * (distinct ? distinct : 1));
    return s;
}

void exo_sampler_free(exo_sampler *s)
{
    if (!s)
        return;
    exo_free(s->cand);
    exo_free(s->prob);
    exo_free(s->count);
    exo_free(s->hist);
    exo_free(s->penalized);
    exo_free(s->penalized_count);
    exo_free(s);
}

int exo_sampler_begin(exo_sampler *s, const int32_t *prompt, int n, int max_tokens)
{
    int cap = n + (max_tokens > 0 ? max_tokens : 0);
    int32_t *h = exo_try_malloc(sizeof(int32_t) * (size_t)(cap > 0 ? cap : 1));
    if (!h)
        return EXO_ENOMEM;
    memcpy(h, prompt, sizeof(int32_t) * (size_t)n);
    exo_free(s->hist);
    s->hist = h;
    s->n_hist = n;
    s->cap_hist = cap;
    return 0;
}

void exo_sampler_next(exo_sampler *s, float *logits, exo_sample *out)
{
    exo_sampler_sample(s, logits, s->hist, s->n_hist, out);
    if (s->n_hist < s->cap_hist)
        s->hist[s->n_hist++] = out->id;
}

typedef struct rows_job {
    exo_sampler *const *s;
    const exo_pick *picks;
    float *logits;
    exo_sample *out;
    int n;
} rows_job;

static bool drawn_here(const rows_job *j, int i) { return j->s[i] && !(j->picks && j->picks[i].picked); }

static void next_rows(void *ctx, int ith, int nth)
{
    const rows_job *j = ctx;
    for (int i = 0, k = 0; i < j->n; i++) /* the k-th row drawn here goes to share k % nth */
        if (drawn_here(j, i) && k++ % nth == ith)
            exo_sampler_next(j->s[i], j->logits + (size_t)i * (size_t)j->s[i]->vocab, &j->out[i]);
}

void exo_sampler_rows(exo_pool *pool, exo_sampler *const *s, const exo_pick *picks, float *logits, exo_sample *out,
                      int n)
{
    rows_job j = {s, picks, logits, out, n};
    int here = 0;
    for (int i = 0; i < n; i++) {
        if (s[i] && picks && picks[i].picked)
            exo_sampler_take(s[i], &picks[i], &out[i]);
        here += drawn_here(&j, i);
    }
    if (here > 1 && pool)
        exo_pool_run(pool, next_rows, &j);
    else if (here)
        next_rows(&j, 0, 1);
}

/* The distinct tokens of the penalty window, the last
 * repetition_context_size of hist[0 .. n) (first seen first), and their
 * counts, into s->penalized; how many. The host's penalties and the rule
 * a backend picks by (exo_sampler_pick_rule) both take them from here. */
static int window_tokens(exo_sampler *s, const int32_t *hist, int n)
{
    int start = n > s->p.repetition_context_size ? n - s->p.repetition_context_size : 0, k = 0;
    for (int i = start; i < n; i++) {
        int32_t t = hist[i];
        if (t < 0 || t >= s->vocab)
            continue;
        if (!s->count[t])
            s->penalized[k++] = t;
        if (s->count[t] < UINT16_MAX)
            s->count[t]++;
    }
    for (int i = 0; i < k; i++) {
        s->penalized_count[i] = s->count[s->penalized[i]];
        s->count[s->penalized[i]] = 0;
    }
    return k;
}

bool exo_sampler_pick_rule(exo_sampler *s, exo_pick_rule *rule)
{
    const exo_sampler_params *p = &s->p;
    bool rep = p->repetition_penalty != 1.0f && p->repetition_penalty > 0;
    bool pres = p->presence_penalty != 0 || p->frequency_penalty != 0;
    bool drawn = p->temperature > 0;
    int top_k = drawn && p->top_k > 0 && p->top_k < s->vocab ? p->top_k : 0;
    if (top_k > EXO_PICK_TOP_K ||
        ((rep || pres) && p->repetition_context_size > EXO_PICK_PENALIZED))
        return false;
    *rule = (exo_pick_rule){.temperature = drawn ? p->temperature : 0, .top_logprobs = p->top_logprobs};
    if (drawn) {
        rule->top_k = top_k;
        rule->top_p = p->top_p > 0 && p->top_p < 1 ? p->top_p : 0;
        rule->min_p = p->min_p > 0 ? p->min_p : 0;
        if (!s->held) {
            s->held_u = next_unit(s->rng);
            s->held = true;
        }
        rule->u = s->held_u;
    }
    if ((rep || pres) && s->n_hist > 0) {
        rule->repetition_penalty = rep ? p->repetition_penalty : 1.0f;
        rule->presence_penalty = pres ? p->presence_penalty : 0;
        rule->frequency_penalty = pres ? p->frequency_penalty : 0;
        rule->n_penalized = window_tokens(s, s->hist, s->n_hist);
        rule->penalized = s->penalized;
        rule->penalized_count = s->penalized_count;
    }
    return true;
}

void exo_sampler_take(exo_sampler *s, const exo_pick *pick, exo_sample *out)
{
    memset(out, 0, sizeof *out);
    out->id = pick->id;
    out->logprob = pick->logprob;
    out->n_top = pick->n_top < s->p.top_logprobs ? pick->n_top : s->p.top_logprobs;
    memcpy(out->top_ids, pick->top_ids, sizeof(int32_t) * (size_t)out->n_top);
    memcpy(out->top_logprobs, pick->top_logprobs, sizeof(float) * (size_t)out->n_top);
    s->held = false; /* the backend drew with it */
    if (s->n_hist < s->cap_hist)
        s->hist[s->n_hist++] = pick->id;
}

static void apply_penalties(exo_sampler *s, float *logits, const int32_t *hist, int n)
{
    const exo_sampler_params *p = &s->p;
    bool rep = p->repetition_penalty != 1.0f && p->repetition_penalty > 0;
    bool pres = p->presence_penalty != 0 || p->frequency_penalty != 0;
    if ((!rep && !pres) || n <= 0)
        return;
    for (int j = 0, k = window_tokens(s, hist, n); j < k; j++) {
        float l = logits[s->penalized[j]];
        if (rep)
            l = l < 0 ? l * p->repetition_penalty : l / p->repetition_penalty;
        if (pres)
            l -= p->presence_penalty + p->frequency_penalty * (float)s->penalized_count[j];
        logits[s->penalized[j]] = l;
    }
}

/* Runs once per token over the whole vocabulary: vectorised (with a scalar
 * double exp, 128k logits took 0.45 ms, and the scalar argmax 0.37 ms:
 * together ~3% of a 1B model's token). */
static float log_sum_exp(const float *x, int n, float *max_out)
{
    float mx = exo_cpu_max_f32(x, n);
    *max_out = mx;
    return mx + (float)log(exo_cpu_exp_sum_f32(x, n, mx, NULL));
}

/* Top-n (n small) by partial selection, most likely first, ties by id. */
static int top_n(const float *x, int vocab, int n, int32_t *ids)
{
    int k = 0;
    for (int i = 0; i < vocab; i++) {
        if (isnan(x[i]))
            continue;
        if (k < n) {
            ids[k++] = i;
        } else if (x[i] > x[ids[k - 1]]) {
            ids[k - 1] = i;
        } else {
            continue;
        }
        for (int j = k - 1; j > 0 && x[ids[j]] > x[ids[j - 1]]; j--) {
            int32_t t = ids[j];
            ids[j] = ids[j - 1];
            ids[j - 1] = t;
        }
    }
    return k;
}

/* The chosen token's log-probability and the most likely alternatives. */
static void finish_sample(exo_sampler *s, const float *logits, float lse, int32_t chosen, exo_sample *out)
{
    out->id = chosen;
    out->logprob = logits[chosen] - lse;
    if (s->p.top_logprobs > 0) {
        out->n_top = top_n(logits, s->vocab, s->p.top_logprobs, out->top_ids);
        for (int i = 0; i < out->n_top; i++)
            out->top_logprobs[i] = logits[out->top_ids[i]] - lse;
    }
}

/* How many of the n candidates (sorted by logit) top-p keeps: the first
 * whose cumulative probability reaches top_p; 0 where they never do. */
static int top_p_cut(const exo_sampler *s, const float *logits, float lse, int n)
{
    double cum = 0;
    for (int i = 0; i < n; i++) {
        cum += exp((double)(logits[s->cand[i]] - lse));
        if (cum >= s->p.top_p)
            return i + 1;
    }
    return 0;
}

/* s->cand's first k ids (ascending, as the scan made them) by logit, most
 * likely first, ties by id (qsort_r through the index took 18 ms over a
 * flat 128k vocabulary; this orders it in about 1). */
static void order_candidates(const float *logits, int32_t *cand, int k)
{
    uint64_t *scratch = exo_malloc(2 * sizeof(uint64_t) * (size_t)(k > 0 ? k : 1));
    exo_order_desc(logits, cand, k, scratch);
    exo_free(scratch);
}

/* The prefix of the vocabulary sorted by logit that top-k and top-p keep,
 * into s->cand; returns its length. Ordering all of a 128k vocabulary is
 * the costly case (about 1 ms; 22 with qsort). The tokens within a span
 * of the largest logit are sorted first, and since ties go by id their
 * order is the full order's prefix: when the kept prefix ends inside
 * them, it is exactly the one a full sort keeps. Else the span widens, up
 * to the whole vocabulary (a flat distribution, a top-k past the head). A
 * top-k of up to TOP_K_SELECT is selected instead (top_n, the same prefix)
 * where a span holds more than TOP_K_SORT_MAX tokens: a flat distribution
 * sorts nothing then. */
#define TOP_K_SELECT   256
#define TOP_K_SORT_MAX 4096
static int kept_prefix(exo_sampler *s, const float *logits, float lse, float mx)
{
    static const float spans[] = {8.0f, 16.0f, 32.0f, INFINITY};
    const exo_sampler_params *p = &s->p;
    int V = s->vocab, limit = p->top_k > 0 && p->top_k < V ? p->top_k : V;
    bool by_p = p->top_p > 0 && p->top_p < 1;
    for (int pass = 0; pass < 4; pass++) {
        int k = 0;
        for (int i = 0; i < V; i++)
            if (pass == 3 || logits[i] >= mx - spans[pass])
                s->cand[k++] = i;
        int picked = limit <= TOP_K_SELECT && k > TOP_K_SORT_MAX ? top_n(logits, V, limit, s->cand) : 0;
        if (picked) { /* 0: every logit NaN */
            int cut = by_p ? top_p_cut(s, logits, lse, picked) : 0;
            return cut ? cut : picked;
        }
        order_candidates(logits, s->cand, k);
        int n = limit < k ? limit : k, cut = by_p ? top_p_cut(s, logits, lse, n) : 0;
        if (cut)
            return cut;
        if (limit <= k || k == V) /* the cut fell inside what was sorted */
            return n;
    }
    return limit; /* not reached: the last pass sorts all V */
}

/* Temperature sampling over every token: the weights in one vectorised
 * pass (a scalar double exp a token took 1.4 ms a token over 128k). */
static void draw_whole_vocabulary(exo_sampler *s, const float *logits, float lse, float mx, exo_sample *out)
{
    int V = s->vocab;
    float inv_t = 1.0f / s->p.temperature;
    for (int i = 0; i < V; i++)
        s->prob[i] = (logits[i] - mx) * inv_t;
    double total = exo_cpu_exp_sum_f32(s->prob, V, 0.0f, s->prob);
    double r = draw_unit(s) * total, acc = 0;
    int32_t chosen = V - 1;
    for (int i = 0; i < V; i++) {
        acc += s->prob[i];
        if (r < acc) {
            chosen = i;
            break;
        }
    }
    finish_sample(s, logits, lse, chosen, out);
}

void exo_sampler_sample(exo_sampler *s, float *logits, const int32_t *history, int n_history,
                        exo_sample *out)
{
    const exo_sampler_params *p = &s->p;
    int V = s->vocab;
    apply_penalties(s, logits, history, n_history);
    float mx;
    float lse = log_sum_exp(logits, V, &mx);
    memset(out, 0, sizeof *out);

    int32_t chosen = -1;
    if (p->temperature <= 0) {
        chosen = exo_cpu_argmax_f32(logits, V);
    } else {
        /* Candidates: everything, or the sorted prefix top-k/top-p keep. */
        int n = V;
        bool need_sort = (p->top_k > 0 && p->top_k < V) || (p->top_p > 0 && p->top_p < 1);
        if (need_sort)
            n = kept_prefix(s, logits, lse, mx);
        else if (!(p->min_p > 0)) {
            draw_whole_vocabulary(s, logits, lse, mx, out);
            return;
        } else {
            for (int i = 0; i < V; i++)
                s->cand[i] = i;
        }
        if (p->min_p > 0) {
            /* keep tokens with prob >= min_p * max prob */
            float cut = mx + logf(p->min_p);
            int m = 0;
            for (int i = 0; i < n; i++)
                if (logits[s->cand[i]] >= cut)
                    s->cand[m++] = s->cand[i];
            n = m > 0 ? m : 1;
        }
        double total = 0;
        float inv_t = 1.0f / p->temperature;
        for (int i = 0; i < n; i++) {
            double w = exp((double)((logits[s->cand[i]] - mx) * inv_t));
            s->prob[i] = (float)w;
            total += w;
        }
        double r = draw_unit(s) * total, acc = 0;
        chosen = s->cand[n - 1];
        for (int i = 0; i < n; i++) {
            acc += s->prob[i];
            if (r < acc) {
                chosen = s->cand[i];
                break;
            }
        }
    }
    finish_sample(s, logits, lse, chosen, out);
}
