/* exo_generate's chunked prefill on the tiny HF fixtures (llama f32, qwen3
 * q4): greedy tokens with prefill_chunk = 3 (also with no callback, and
 * with a chunk as long as the prompt) equal those of a single-call
 * prefill, from an empty sequence and after a prefix; the progress
 * callback sees 3, 6, ... < total; a nonzero return from it cancels before
 * any token (finish CANCEL, no on_token calls); a failing chunk leaves the
 * sequence as it was. */
#include "core/alloc.h"
#include "engine/generate.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define N_PROMPT 20
#define N_GEN    12
#define MAX_CALLS 64

typedef struct rec {
    int     n_tok;
    int32_t ids[N_GEN];
    float   logprobs[N_GEN];
    int     n_prefill;
    int     processed[MAX_CALLS], total[MAX_CALLS];
    int     cancel_at; /* on_prefill returns nonzero on this call (1-based); 0: never */
} rec;

static int on_token(void *ctx, const exo_sample *s)
{
    rec *r = ctx;
    cr_assert_lt(r->n_tok, N_GEN);
    r->ids[r->n_tok] = s->id;
    r->logprobs[r->n_tok++] = s->logprob;
    return 0;
}

static int on_prefill(void *ctx, int processed, int total)
{
    rec *r = ctx;
    cr_assert_lt(r->n_prefill, MAX_CALLS);
    cr_assert_eq(r->n_tok, 0, "progress after a token");
    r->processed[r->n_prefill] = processed;
    r->total[r->n_prefill++] = total;
    return r->cancel_at == r->n_prefill;
}

static exo_model *load(const char *name)
{
    char dir[256];
    snprintf(dir, sizeof dir, "tests/fixtures/%s", name);
    exo_model_opts o = {.n_threads = 1};
    exo_model *m = NULL;
    exo_err err = {0};
    cr_assert_eq(exo_model_load(dir, &o, &m, &err), 0, "%s: %s", dir, err.msg);
    return m;
}

static void prompt_ids(const exo_model *m, int32_t *ids, int n)
{
    int V = exo_model_vocab(m);
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)((i * 37 + 11) % V);
}

static exo_gen_params params(int chunk, int (*cb)(void *, int, int))
{
    exo_gen_params p = {.sampling = exo_sampler_defaults(), .max_tokens = N_GEN,
                        .prefill_chunk = chunk, .on_prefill = cb};
    p.sampling.temperature = 0;
    return p;
}

/* Generates N_GEN greedy tokens from a fresh sequence (after `prefix`
 * prompt tokens already in it, when prefix > 0). */
static void run(exo_model *m, int prefix, const exo_gen_params *p, rec *r, exo_gen_stats *st)
{
    int32_t ids[N_PROMPT];
    prompt_ids(m, ids, N_PROMPT);
    exo_seq *s;
    exo_err err = {0};
    cr_assert_eq(exo_seq_create(m, 128, &s, &err), 0, "%s", err.msg);
    if (prefix)
        cr_assert_eq(exo_model_forward(m, s, ids, prefix, NULL, false, &err), 0, "%s", err.msg);
    cr_assert_eq(exo_generate(m, s, ids + prefix, N_PROMPT - prefix, p, on_token, r, st, &err), 0,
                 "%s", err.msg);
    if (st->finish != EXO_FINISH_CANCEL)
        cr_assert_eq(exo_seq_len(s), N_PROMPT + N_GEN - 1);
    exo_seq_free(s);
}

static void same_tokens(const char *fixture, float lp_tol)
{
    exo_model *m = load(fixture);
    for (int prefix = 0; prefix <= 4; prefix += 4) {
        int n = N_PROMPT - prefix;
        rec whole = {0}, chunked = {0}, silent = {0}, big = {0};
        exo_gen_stats sw, sc, ss, sb;
        exo_gen_params pw = params(0, on_prefill), pc = params(3, on_prefill),
                       ps = params(3, NULL), pb = params(n, on_prefill);
        run(m, prefix, &pw, &whole, &sw);
        run(m, prefix, &pc, &chunked, &sc);
        run(m, prefix, &ps, &silent, &ss);
        run(m, prefix, &pb, &big, &sb);
        cr_assert_eq(sw.finish, EXO_FINISH_LENGTH);
        cr_assert_eq(sw.generated_tokens, N_GEN);
        cr_assert_eq(whole.n_tok, N_GEN);
        const rec *other[] = {&chunked, &silent, &big};
        const exo_gen_stats *ost[] = {&sc, &ss, &sb};
        for (int k = 0; k < 3; k++) {
            cr_assert_eq(ost[k]->finish, EXO_FINISH_LENGTH);
            cr_assert_eq(ost[k]->generated_tokens, N_GEN);
            cr_assert_eq(ost[k]->prompt_tokens, n);
            cr_assert_eq(other[k]->n_tok, N_GEN);
            for (int i = 0; i < N_GEN; i++) {
                cr_assert_eq(other[k]->ids[i], whole.ids[i], "%s prefix %d case %d token %d",
                             fixture, prefix, k, i);
                cr_assert_lt(fabsf(other[k]->logprobs[i] - whole.logprobs[i]), lp_tol, "lp %g vs %g", other[k]->logprobs[i], whole.logprobs[i]);
            }
        }
        /* progress: after every chunk but the last, never when off; chunks
         * end at multiples of their size from position 0, where a prompt
         * computed from 0 has its cuts (after a prefix: a shorter first) */
        cr_assert_eq(whole.n_prefill, 0);
        const rec *cut[] = {&chunked, &big};
        const int size[] = {3, n};
        for (int k = 0; k < 2; k++) {
            int calls = 0;
            for (int at = prefix; at < prefix + n; calls++) {
                int end = (at / size[k] + 1) * size[k];
                at = end < prefix + n ? end : prefix + n;
                if (at < prefix + n) {
                    cr_assert_gt(cut[k]->n_prefill, calls);
                    cr_assert_eq(cut[k]->processed[calls], at - prefix, "chunks of %d, call %d", size[k], calls);
                    cr_assert_eq(cut[k]->total[calls], n);
                }
            }
            cr_assert_eq(cut[k]->n_prefill, calls - 1, "chunks of %d after %d", size[k], prefix);
        }
    }
    exo_model_free(m);
}

Test(generate, chunked_prefill_gives_the_same_tokens_llama) { same_tokens("llama-f32", 1e-3f); }

/* Quantized weights: the CPU matmul picks its path by the row count (GEMV
 * for a few rows, a bf16 GEMM for more), so 3-token chunks and a 20-token
 * prompt differ by more than rounding; the tokens do not. */
Test(generate, chunked_prefill_gives_the_same_tokens_qwen3_q4) { same_tokens("qwen3-q4g64", 5e-2f); }

Test(generate, prefill_callback_cancels_before_any_token)
{
    exo_model *m = load("llama-f32");
    for (int at = 1; at <= 6; at += 5) { /* the first and the last progress call */
        rec r = {.cancel_at = at};
        exo_gen_stats st;
        exo_gen_params p = params(3, on_prefill);
        int32_t ids[N_PROMPT];
        prompt_ids(m, ids, N_PROMPT);
        exo_seq *s;
        exo_err err = {0};
        cr_assert_eq(exo_seq_create(m, 128, &s, &err), 0);
        cr_assert_eq(exo_generate(m, s, ids, N_PROMPT, &p, on_token, &r, &st, &err), 0, "%s",
                     err.msg);
        cr_assert_eq(st.finish, EXO_FINISH_CANCEL);
        cr_assert_eq(st.generated_tokens, 0);
        cr_assert_eq(st.prompt_tokens, N_PROMPT);
        cr_assert_eq(r.n_tok, 0);
        cr_assert_eq(r.n_prefill, at);
        cr_assert_eq(r.processed[at - 1], 3 * at);
        cr_assert_eq(exo_seq_len(s), 3 * at); /* the processed tokens stay */
        exo_seq_free(s);
    }
    exo_model_free(m);
}

Test(generate, failing_chunk_leaves_the_sequence_as_it_was)
{
    exo_model *m = load("llama-f32");
    int32_t ids[N_PROMPT];
    prompt_ids(m, ids, N_PROMPT);
    exo_seq *s;
    exo_err err = {0};
    cr_assert_eq(exo_seq_create(m, 24, &s, &err), 0);
    cr_assert_eq(exo_model_forward(m, s, ids, 2, NULL, false, &err), 0);
    rec r = {0};
    exo_gen_stats st;
    exo_gen_params p = params(3, on_prefill);
    /* a bad id in the fourth chunk: three chunks ran, then rolled back */
    ids[10] = exo_model_vocab(m);
    cr_assert_eq(exo_generate(m, s, ids, N_PROMPT, &p, on_token, &r, &st, &err), EXO_ERANGE);
    cr_assert(strstr(err.msg, "out of range"), "%s", err.msg);
    cr_assert_eq(exo_seq_len(s), 2);
    cr_assert_eq(r.n_tok, 0);
    /* no room for the prompt: refused before any chunk runs */
    prompt_ids(m, ids, N_PROMPT);
    memset(&r, 0, sizeof r);
    cr_assert_eq(exo_model_forward(m, s, ids, 3, NULL, false, &err), 0);
    cr_assert_eq(exo_generate(m, s, ids, N_PROMPT, &p, on_token, &r, &st, &err), EXO_ERANGE);
    cr_assert(strstr(err.msg, "context full"), "%s", err.msg);
    cr_assert_eq(r.n_prefill, 0);
    cr_assert_eq(exo_seq_len(s), 5);
    exo_seq_free(s);
    exo_model_free(m);
}

/* ---- a generation that gives its caches back and computes them again ---- */

/* One generation driven step by step (as the runner's batch does), with
 * seeded sampling: at each step index in `preempt` (once each) the
 * sequence goes back to `keep` positions and the generation restarts
 * there (exo_gen_seq_restart); rec gets the tokens. */
static void drive(exo_model *m, int chunk, const int *preempt, int n_preempt, int keep, rec *r,
                  exo_gen_stats *st)
{
    int32_t ids[N_PROMPT];
    prompt_ids(m, ids, N_PROMPT);
    exo_seq *s;
    exo_err err = {0};
    cr_assert_eq(exo_seq_create(m, 128, &s, &err), 0, "%s", err.msg);
    exo_gen_params p = params(chunk, on_prefill);
    p.sampling.temperature = 0.9f;
    p.sampling.seed = 1234;
    p.sampling.repetition_penalty = 1.3f; /* the sampler's history counts: it must go on as it was */
    const int V = exo_model_vocab(m);
    exo_sampler *smp = exo_sampler_create(&p.sampling, V);
    cr_assert_eq(exo_sampler_begin(smp, ids, N_PROMPT, N_GEN), 0);
    float *logits = exo_malloc(sizeof(float) * (size_t)V);
    exo_gen_seq *g = exo_gen_seq_new(ids, N_PROMPT, 0, 128, &p, on_token, r);
    const int32_t *tokens;
    int T, step = 0, next = 0;
    bool want;
    while (exo_gen_seq_next(g, &tokens, &T, &want)) {
        if (next < n_preempt && step == preempt[next]) {
            next++;
            int back = exo_seq_len(s) < keep ? 0 : keep;
            exo_seq_truncate(s, back);
            exo_gen_seq_restart(g, ids + back, N_PROMPT - back, back);
            continue;
        }
        step++;
        exo_step one = {.T = T, .tokens = tokens, .logits = want ? logits : NULL};
        cr_assert_eq(exo_model_step(m, s, &one, &err), 0, "%s", err.msg);
        exo_gen_seq_stepped(g);
        if (want) {
            exo_sample smp_out;
            exo_sampler_next(smp, logits, &smp_out);
            exo_gen_seq_sampled(g, &smp_out);
        }
    }
    cr_assert_eq(next, n_preempt, "every preemption point was reached");
    exo_gen_seq_stats(g, st);
    exo_gen_seq_free(g);
    exo_sampler_free(smp);
    exo_free(logits);
    exo_seq_free(s);
}

/* Preempted during the prefill, right after the first token, and twice
 * while decoding (once in the middle of a replay), going back to nothing
 * or to the first whole chunk: the same tokens and log probabilities, bit
 * for bit, the same stats, and no progress call after the first token. */
static void restart_same_tokens(const char *fixture)
{
    exo_model *m = load(fixture);
    rec want = {0};
    exo_gen_stats sw;
    drive(m, 8, NULL, 0, 0, &want, &sw);
    cr_assert_eq(want.n_tok, N_GEN);
    /* steps: 0-2 the prompt's chunks (8, 8, 4), then one a token */
    static const int points[][3] = {{1, 3, 9}, {3, 4, 8}, {2, 10, 12}};
    for (int keep = 0; keep <= 8; keep += 8)
        for (size_t c = 0; c < sizeof points / sizeof *points; c++) {
            rec got = {0};
            exo_gen_stats sg;
            drive(m, 8, points[c], 3, keep, &got, &sg);
            cr_assert_eq(got.n_tok, N_GEN, "%s case %zu keep %d", fixture, c, keep);
            for (int i = 0; i < N_GEN; i++) {
                cr_assert_eq(got.ids[i], want.ids[i], "%s case %zu keep %d token %d", fixture, c, keep, i);
                cr_assert(got.logprobs[i] == want.logprobs[i], "%s case %zu keep %d token %d: lp %g vs %g",
                          fixture, c, keep, i, got.logprobs[i], want.logprobs[i]);
            }
            cr_assert_eq(sg.generated_tokens, sw.generated_tokens);
            cr_assert_eq(sg.finish, sw.finish);
            cr_assert_eq(sg.prompt_tokens, sw.prompt_tokens);
        }
    exo_model_free(m);
}

Test(generate, a_restarted_generation_gives_the_same_tokens_llama) { restart_same_tokens("llama-f32"); }
Test(generate, a_restarted_generation_gives_the_same_tokens_qwen3_q4) { restart_same_tokens("qwen3-q4g64"); }

/* The calls a prompt of n tokens at position pos takes, in chunks of 128,
 * with `slice` set (exact rows 17) before every call from call `from` on. */
static int slice_calls(int n, int pos, int slice, int exact, int from, int *T, int max)
{
    static int32_t prompt[1024];
    exo_gen_params p = params(128, NULL);
    exo_gen_seq *g = exo_gen_seq_new(prompt, n, pos, 2048, &p, NULL, NULL);
    int calls = 0, done = 0;
    const int32_t *tokens;
    bool want;
    for (;;) {
        exo_gen_seq_slice(g, calls >= from ? slice : 0, exact);
        if (!exo_gen_seq_next(g, &tokens, &T[calls], &want) || !exo_gen_seq_in_prefill(g))
            break;
        cr_assert_eq(tokens, prompt + done);
        cr_assert_lt(calls, max);
        exo_gen_seq_stepped(g);
        done += T[calls++];
        if (want)
            break;
    }
    exo_gen_seq_free(g);
    return calls;
}

/* Slices of a prompt's chunks (a runner whose streams decode beside it):
 * every call is of 17 rows or more but a short last chunk, which goes
 * whole, and none crosses a multiple of 128 from position 0, so the calls
 * are cuts whose bits equal whole chunks' on an exact-rows model (the
 * batch test prompt_cuts_of_exact_rows_agree); a rest of a chunk under 17
 * rows goes with the slice before it; no exact rows, or a slice under
 * them, leaves chunks whole. */
Test(generate, slices_keep_exact_rows_and_the_chunk_grid)
{
    static const struct {
        int n, pos, slice, exact, from;
        int want[16];
    } cases[] = {
        {300, 0, 50, 17, 0, {50, 50, 28, 50, 50, 28, 44}},
        {300, 0, 60, 17, 0, {60, 68, 60, 68, 44}},
        {260, 0, 50, 17, 0, {50, 50, 28, 50, 50, 28, 4}},  /* a short last chunk: whole */
        {150, 100, 50, 17, 0, {28, 50, 50, 22}},           /* after a prefix: to the chunk's end first */
        {150, 100, 20, 17, 0, {28, 20, 20, 20, 20, 20, 22}},
        {300, 0, 50, 0, 0, {128, 128, 44}},                /* no exact rows: whole chunks */
        {300, 0, 16, 17, 0, {128, 128, 44}},               /* a slice under exact rows: whole chunks */
        {300, 0, 50, 17, 2, {128, 128, 44}},               /* from the third call: a 44-row last chunk */
        {300, 0, 32, 17, 1, {128, 32, 32, 32, 32, 44}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int T[64], n = slice_calls(cases[c].n, cases[c].pos, cases[c].slice, cases[c].exact, cases[c].from, T, 64);
        int sum = 0, k = 0;
        for (; k < n; k++) {
            cr_assert_eq(T[k], cases[c].want[k], "case %zu call %d: %d rows, want %d", c, k, T[k], cases[c].want[k]);
            sum += T[k];
        }
        cr_assert_eq(cases[c].want[k], 0, "case %zu: %d calls", c, n);
        cr_assert_eq(sum, cases[c].n);
    }
}
