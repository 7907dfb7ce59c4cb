/* exo_model_step_batch against exo_model_step, on the tiny HF fixtures of
 * every kind of layer (dense, sliding windows, latent attention, Gated
 * DeltaNet state, mixture of experts, sinks): B sequences with prompts of
 * different lengths decode side by side, each batched step's logits
 * against the same sequence stepped alone; a batch mixing a prompt chunk
 * with decode rows; and bad batches refused with every sequence left as it
 * was. Up to GEMV_ROWS rows a product takes the same kernel at any row
 * count (cpu/matmul.c; on a GPU, GEMV launches of 16, 8, 4, 3, 2 or 1
 * rows), so those logits must be the same bits; past that products take the GEMM (bf16
 * activations) and agree to its tolerance. */
#include "core/alloc.h"
#include "engine/model.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define MAX_B 20
#define STEPS 5
#define GEMV_ROWS 16    /* cpu/matmul.c: every format's GEMV up to 16 rows */
#define GEMM_TOL 0.15f  /* the parity tests' prefill tolerance (bf16 activations) */

static exo_model *load(const char *name)
{
    char dir[256];
    snprintf(dir, sizeof dir, "tests/fixtures/%s", name);
    exo_model_opts o = {.n_threads = 2}; /* a GPU where there is one: its products keep rows apart too */
    exo_model *m = NULL;
    exo_err err = {0};
    cr_assert_eq(exo_model_load(dir, &o, &m, &err), 0, "%s: %s", dir, err.msg);
    return m;
}

static exo_seq *seq(exo_model *m)
{
    exo_seq *s = NULL;
    exo_err err = {0};
    cr_assert_eq(exo_seq_create(m, 256, &s, &err), 0, "%s", err.msg);
    return s;
}

static void prompt(const exo_model *m, int i, int32_t *ids, int n)
{
    for (int t = 0; t < n; t++)
        ids[t] = (int32_t)((t * 37 + i * 101 + 11) % exo_model_vocab(m));
}

static int argmax(const float *v, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

static float max_diff(const float *a, const float *b, int n)
{
    float d = 0;
    for (int i = 0; i < n; i++)
        d = fmaxf(d, fabsf(a[i] - b[i]));
    return d;
}

/* B sequences of one model, each twice: one to step alone, one batched,
 * both after the same prompt (3, 7, 11, ... tokens); next holds each
 * one's next token, la and lb a row of logits each. */
typedef struct twins {
    exo_model *m;
    int V, B;
    exo_seq *alone[MAX_B], *batched[MAX_B];
    float *la, *lb;
    int32_t next[MAX_B];
} twins;

static void twins_open(twins *t, const char *name, int B)
{
    t->m = load(name);
    t->V = exo_model_vocab(t->m);
    t->B = B;
    t->la = exo_malloc(sizeof(float) * (size_t)t->V * B);
    t->lb = exo_malloc(sizeof(float) * (size_t)t->V * B);
    int32_t ids[96];
    exo_err err = {0};
    for (int i = 0; i < B; i++) {
        t->alone[i] = seq(t->m);
        t->batched[i] = seq(t->m);
        int n = 3 + 4 * i;
        prompt(t->m, i, ids, n);
        cr_assert_eq(exo_model_forward(t->m, t->alone[i], ids, n, t->la, false, &err), 0, "%s", err.msg);
        cr_assert_eq(exo_model_forward(t->m, t->batched[i], ids, n, t->lb, false, &err), 0, "%s", err.msg);
        t->next[i] = argmax(t->la, t->V);
    }
}

static void twins_close(twins *t)
{
    for (int i = 0; i < t->B; i++) {
        exo_seq_free(t->alone[i]);
        exo_seq_free(t->batched[i]);
    }
    exo_free(t->la);
    exo_free(t->lb);
    exo_model_free(t->m);
}

/* B sequences decode side by side, batched, against twins stepped alone. */
static void decode_side_by_side(const char *name, int B)
{
    twins t;
    twins_open(&t, name, B);
    int V = t.V;
    exo_err err = {0};
    float worst = 0;
    for (int step = 0; step < STEPS; step++) {
        exo_batch_item items[MAX_B];
        for (int i = 0; i < B; i++) {
            cr_assert_eq(exo_model_forward(t.m, t.alone[i], &t.next[i], 1, t.la + (size_t)i * V, false, &err), 0,
                         "%s", err.msg);
            items[i] = (exo_batch_item){.seq = t.batched[i], .tokens = &t.next[i], .T = 1};
        }
        cr_assert_eq(exo_model_step_batch(t.m, items, B, t.lb, NULL, &err), 0, "%s: %s", name, err.msg);
        for (int i = 0; i < B; i++) {
            float d = max_diff(t.la + (size_t)i * V, t.lb + (size_t)i * V, V);
            worst = fmaxf(worst, d);
            cr_assert_eq(exo_seq_len(t.batched[i]), exo_seq_len(t.alone[i]));
            if (B <= GEMV_ROWS)
                cr_expect_eq(d, 0.0f, "%s, B %d, step %d, sequence %d: logits differ by %g from its own step",
                             name, B, step, i, (double)d);
            else
                cr_expect_leq(d, GEMM_TOL, "%s, B %d, step %d, sequence %d: logits differ by %g", name, B, step,
                              i, (double)d);
            t.next[i] = argmax(t.la + (size_t)i * V, V);
        }
    }
    fprintf(stderr, "batch/%s: B %d, %d steps: largest logit difference from stepping alone %g\n", name, B, STEPS,
            (double)worst);
    twins_close(&t);
}

/* A third of the sequences greedy, a third drawn with a temperature (every
 * other one of those with Ollama's filters and a repetition penalty), the
 * rest with no rule: a batched row's pick (exo_pick, made on a GPU, where
 * only its id comes back) is the pick it gets stepped alone, id and
 * log-probability to the bit; where nothing picks (the CPU), its logits
 * come back as the others' do. */
static void picks_side_by_side(const char *name, int B)
{
    twins t;
    twins_open(&t, name, B);
    int V = t.V, picked = 0;
    exo_err err = {0};
    for (int step = 0; step < STEPS; step++) {
        exo_batch_item items[MAX_B];
        exo_pick picks[MAX_B], want[MAX_B];
        exo_pick_rule rules[MAX_B];
        for (int i = 0; i < B; i++) {
            rules[i] = (exo_pick_rule){.temperature = i % 3 == 1 ? 0.9f : 0.0f,
                                       .u = (double)((i * 7 + step * 3) % 10) / 10.0 + 0.05};
            static const int32_t penalized[] = {1, 2, 3, 5, 8};
            static const uint16_t times[] = {1, 2, 1, 3, 1};
            if (i % 6 == 4) {
                rules[i].top_k = 40;
                rules[i].top_p = 0.9f;
                rules[i].repetition_penalty = 1.1f;
                rules[i].n_penalized = 5;
                rules[i].penalized = penalized;
                rules[i].penalized_count = times;
            }
            const exo_pick_rule *rule = i % 3 == 2 ? NULL : &rules[i];
            exo_step st = {.T = 1, .tokens = &t.next[i], .logits = t.la + (size_t)i * V, .pick = rule};
            cr_assert_eq(exo_model_step(t.m, t.alone[i], &st, &err), 0, "%s", err.msg);
            want[i] = st.token;
            items[i] = (exo_batch_item){.seq = t.batched[i], .tokens = &t.next[i], .T = 1, .pick = rule};
        }
        cr_assert_eq(exo_model_step_batch(t.m, items, B, t.lb, picks, &err), 0, "%s: %s", name, err.msg);
        for (int i = 0; i < B; i++) {
            cr_expect_eq(picks[i].picked, want[i].picked, "%s, B %d, step %d, sequence %d: picked %d alone %d",
                         name, B, step, i, picks[i].picked, want[i].picked);
            if (want[i].picked && picks[i].picked) {
                cr_expect(picks[i].id == want[i].id && !memcmp(&picks[i].logprob, &want[i].logprob, sizeof(float)),
                          "%s, B %d, step %d, sequence %d: %d %a, alone %d %a", name, B, step, i, picks[i].id,
                          picks[i].logprob, want[i].id, want[i].logprob);
                t.next[i] = want[i].id;
                picked++;
                continue;
            }
            float d = max_diff(t.la + (size_t)i * V, t.lb + (size_t)i * V, V);
            cr_expect_eq(d, 0.0f, "%s, B %d, step %d, sequence %d: logits differ by %g", name, B, step, i,
                         (double)d);
            t.next[i] = argmax(t.la + (size_t)i * V, V);
        }
    }
    fprintf(stderr, "batch/%s: B %d, %d steps: %d rows picked where the logits are\n", name, B, STEPS, picked);
    twins_close(&t);
}

Test(batch, picked_rows_as_alone, .timeout = 120)
{
    picks_side_by_side("llama-q4g64", 5);
    picks_side_by_side("llama-q4g64", 16);
    picks_side_by_side("qwen3_moe-q4g64", 6);
}

static const char *const FAMILIES[] = {"llama-q4g64", "llama-bf16",   "qwen3-q4g64",     "gemma3-q4g64",
                                       "qwen3_5-q4g64", "deepseek_v3-q4g64", "qwen3_moe-q4g64", "gpt_oss-mxfp4"};

Test(batch, decode_matches_stepping_alone, .timeout = 240)
{
    for (size_t f = 0; f < sizeof FAMILIES / sizeof *FAMILIES; f++) {
        decode_side_by_side(FAMILIES[f], 3);
        decode_side_by_side(FAMILIES[f], 8);
    }
    decode_side_by_side("llama-q4g64", 16);
    decode_side_by_side("llama-q4g64", 20); /* past the GEMV: the GEMM's tolerance */
}

/* A prompt chunk and decode rows in one batch: each as it would be alone. */
Test(batch, a_prompt_chunk_beside_decode_rows, .timeout = 120)
{
    static const char *const names[] = {"llama-q4g64", "qwen3_5-q4g64"};
    for (size_t f = 0; f < 2; f++) {
        exo_model *m = load(names[f]);
        int V = exo_model_vocab(m);
        exo_seq *alone[2] = {seq(m), seq(m)}, *batched[2] = {seq(m), seq(m)};
        float *la = exo_malloc(sizeof(float) * (size_t)V * 2), *lb = exo_malloc(sizeof(float) * (size_t)V * 2);
        int32_t ids[16], chunk[3], tok;
        exo_err err = {0};
        prompt(m, 0, ids, 9);
        cr_assert_eq(exo_model_forward(m, alone[0], ids, 9, la, false, &err), 0, "%s", err.msg);
        cr_assert_eq(exo_model_forward(m, batched[0], ids, 9, lb, false, &err), 0, "%s", err.msg);
        tok = (int32_t)argmax(la, V);
        prompt(m, 1, chunk, 3); /* the second sequence's prompt comes in with the first's next token */
        cr_assert_eq(exo_model_forward(m, alone[0], &tok, 1, la, false, &err), 0, "%s", err.msg);
        cr_assert_eq(exo_model_forward(m, alone[1], chunk, 3, la + V, false, &err), 0, "%s", err.msg);
        exo_batch_item items[2] = {{.seq = batched[0], .tokens = &tok, .T = 1},
                                   {.seq = batched[1], .tokens = chunk, .T = 3}};
        cr_assert_eq(exo_model_step_batch(m, items, 2, lb, NULL, &err), 0, "%s: %s", names[f], err.msg);
        cr_expect_eq(max_diff(la, lb, V), 0.0f, "%s: the decode row's logits moved", names[f]);
        cr_expect_eq(max_diff(la + V, lb + V, V), 0.0f, "%s: the prompt's last logits moved", names[f]);
        cr_expect_eq(exo_seq_len(batched[1]), 3);
        for (int i = 0; i < 2; i++) {
            exo_seq_free(alone[i]);
            exo_seq_free(batched[i]);
        }
        exo_free(la);
        exo_free(lb);
        exo_model_free(m);
    }
}

/* Bad batches: refused before anything runs, every sequence as it was. */
Test(batch, bad_batches_leave_every_sequence_alone)
{
    exo_model *m = load("llama-q4g64");
    int V = exo_model_vocab(m);
    exo_seq *a = seq(m), *b = seq(m);
    float *logits = exo_malloc(sizeof(float) * (size_t)V * 2);
    int32_t ids[4] = {1, 2, 3, 4}, bad = V;
    exo_err err = {0};
    cr_assert_eq(exo_model_forward(m, a, ids, 4, logits, false, &err), 0, "%s", err.msg);
    exo_batch_item twice[2] = {{.seq = a, .tokens = ids, .T = 1}, {.seq = a, .tokens = ids + 1, .T = 1}};
    cr_expect_eq(exo_model_step_batch(m, twice, 2, logits, NULL, &err), EXO_EINVAL);
    exo_batch_item out_of_range[2] = {{.seq = a, .tokens = ids, .T = 1}, {.seq = b, .tokens = &bad, .T = 1}};
    cr_expect_eq(exo_model_step_batch(m, out_of_range, 2, logits, NULL, &err), EXO_ERANGE);
    int rows = exo_model_max_batch_rows(m) + 1;
    int32_t *many = exo_calloc((size_t)rows, sizeof *many);
    exo_batch_item too_many[2] = {{.seq = a, .tokens = ids, .T = 1}, {.seq = b, .tokens = many, .T = rows - 1}};
    cr_expect_eq(exo_model_step_batch(m, too_many, 2, logits, NULL, &err), EXO_ERANGE);
    exo_batch_item empty[2] = {{.seq = a, .tokens = ids, .T = 1}, {.seq = b, .tokens = ids, .T = 0}};
    cr_expect_eq(exo_model_step_batch(m, empty, 2, logits, NULL, &err), EXO_EINVAL);
    cr_expect_eq(exo_seq_len(a), 4);
    cr_expect_eq(exo_seq_len(b), 0);
    exo_free(many);
    exo_free(logits);
    exo_seq_free(a);
    exo_seq_free(b);
    exo_model_free(m);
}

/* A sequence whose caches change size between steps (exo_seq_resize, a
 * runner giving a request the memory it needs) goes on exactly as a twin
 * that never moved: grown from plain caches into a sliding layer's ring,
 * grown with the ring full, shrunk to its length; recurrent state moves
 * along. Chunks of 16 keep the rings small (48 positions). Same bits on
 * the CPU; a GPU plans recorded attention by capacity, so there its sums
 * may split differently. */
static void resized_twin(const char *name, int first_capacity, int n_prompt)
{
    char dir[256];
    snprintf(dir, sizeof dir, "tests/fixtures/%s", name);
    exo_model_opts o = {.n_threads = 2, .max_chunk = 16};
    exo_model *m = NULL;
    exo_err err = {0};
    cr_assert_eq(exo_model_load(dir, &o, &m, &err), 0, "%s: %s", dir, err.msg);
    float tol = exo_model_gpu_layers(m) ? 1e-3f : 0.0f;
    int V = exo_model_vocab(m);
    exo_seq *still = seq(m), *moved = NULL;
    cr_assert_eq(exo_seq_create(m, first_capacity, &moved, &err), 0, "%s", err.msg);
    cr_assert_eq(exo_seq_bytes(moved), exo_model_seq_bytes(m, first_capacity));
    float *la = exo_malloc(sizeof(float) * (size_t)V), *lb = exo_malloc(sizeof(float) * (size_t)V);
    int32_t ids[96], next;
    prompt(m, 0, ids, n_prompt);
    cr_assert_eq(exo_model_forward(m, still, ids, n_prompt, la, false, &err), 0, "%s", err.msg);
    cr_assert_eq(exo_model_forward(m, moved, ids, n_prompt, lb, false, &err), 0, "%s", err.msg);
    next = argmax(la, V);
    for (int phase = 0; phase < 3; phase++) {
        for (int step = 0; step < 5; step++) {
            cr_assert_eq(exo_model_forward(m, still, &next, 1, la, false, &err), 0, "%s", err.msg);
            cr_assert_eq(exo_model_forward(m, moved, &next, 1, lb, false, &err), 0, "%s: phase %d step %d: %s",
                         name, phase, step, err.msg);
            float d = max_diff(la, lb, V);
            cr_expect_leq(d, tol, "%s: phase %d, step %d: logits differ by %g from the twin that never moved",
                          name, phase, step, (double)d);
            next = argmax(la, V);
        }
        int len = exo_seq_len(moved);
        cr_expect_eq(exo_seq_resize(moved, len - 1, &err), EXO_EINVAL, "below its length");
        cr_expect_eq(exo_seq_len(moved), len);
        int cap = phase == 0 ? 200 : len + 6; /* grow, then shrink to what five more steps need */
        cr_assert_eq(exo_seq_resize(moved, cap, &err), 0, "%s: %s", name, err.msg);
        cr_expect_eq(exo_seq_capacity(moved), cap);
        cr_expect_eq(exo_seq_bytes(moved), exo_model_seq_bytes(m, cap));
        cr_expect_eq(exo_seq_len(moved), len);
    }
    exo_seq_free(still);
    exo_seq_free(moved);
    exo_free(la);
    exo_free(lb);
    exo_model_free(m);
}

Test(batch, a_resized_sequence_goes_on_as_one_never_moved, .timeout = 240)
{
    for (size_t f = 0; f < sizeof FAMILIES / sizeof *FAMILIES; f++) {
        resized_twin(FAMILIES[f], 40, 30); /* plain caches, then a ring */
        resized_twin(FAMILIES[f], 70, 60); /* the ring full when it moves */
    }
}

/* A sequence with recurrent state (Gated DeltaNet) goes back to where its
 * last step of several tokens began, its state from the snapshot taken
 * there, and goes on exactly as one that computed the same chunks afresh
 * (a prompt's shared prefix reused); not to any other position but 0. */
Test(batch, a_recurrent_state_returns_to_its_last_chunk_start)
{
    exo_model *m = load("qwen3_5-q4g64");
    int V = exo_model_vocab(m);
    exo_seq *reused = seq(m), *fresh = seq(m);
    float *la = exo_malloc(sizeof(float) * (size_t)V), *lb = exo_malloc(sizeof(float) * (size_t)V);
    int32_t a[40], b[40], tok;
    exo_err err = {0};
    prompt(m, 0, a, 40);
    prompt(m, 0, b, 40);
    for (int t = 32; t < 40; t++) /* b shares a's first 32 tokens */
        b[t] = (a[t] + 1) % V;
    /* a in chunks of 16, 16 and 8, then two decode steps */
    for (int c = 0; c < 40; c += 16)
        cr_assert_eq(exo_model_forward(m, reused, a + c, c + 16 <= 40 ? 16 : 40 - c, la, false, &err), 0, "%s", err.msg);
    tok = argmax(la, V);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(exo_model_forward(m, reused, &tok, 1, la, false, &err), 0, "%s", err.msg);
        tok = argmax(la, V);
    }
    cr_expect(!exo_seq_can_return(reused, 16), "16 is not where the last chunk began");
    cr_expect(!exo_seq_can_return(reused, 33));
    cr_assert(exo_seq_can_return(reused, 32));
    cr_assert(exo_seq_can_return(reused, 0));
    exo_seq_truncate(reused, 32);
    cr_assert_eq(exo_model_forward(m, reused, b + 32, 8, la, false, &err), 0, "%s", err.msg);
    for (int c = 0; c < 40; c += 16)
        cr_assert_eq(exo_model_forward(m, fresh, b + c, c + 16 <= 40 ? 16 : 40 - c, lb, false, &err), 0, "%s", err.msg);
    float d = max_diff(la, lb, V);
    cr_expect_leq(d, exo_model_gpu_layers(m) ? 1e-3f : 0.0f, "logits differ by %g from the fresh prefill", (double)d);
    exo_seq_free(reused);
    exo_seq_free(fresh);
    exo_free(la);
    exo_free(lb);
    exo_model_free(m);
}

/* A prompt prefix copied from another sequence (exo_seq_copy_prefix: a
 * request taking what a running one computed): the copy goes on exactly
 * as a sequence that computed the same chunks itself, on every family;
 * what src cannot give is refused with dst left as it was. */
static void copied_prefix(const char *name)
{
    char dir[256];
    snprintf(dir, sizeof dir, "tests/fixtures/%s", name);
    exo_model_opts o = {.n_threads = 2, .max_chunk = 16};
    exo_model *m = NULL;
    exo_err err = {0};
    cr_assert_eq(exo_model_load(dir, &o, &m, &err), 0, "%s: %s", dir, err.msg);
    int V = exo_model_vocab(m);
    exo_seq *src = seq(m), *dst = seq(m), *fresh = seq(m);
    float *la = exo_malloc(sizeof(float) * (size_t)V), *lb = exo_malloc(sizeof(float) * (size_t)V);
    int32_t a[40], b[40], tok;
    prompt(m, 1, a, 40);
    prompt(m, 1, b, 40);
    for (int t = 32; t < 40; t++)
        b[t] = (a[t] + 3) % V;
    for (int c = 0; c < 40; c += 16) /* chunks of 16, 16, 8: the last began at 32 */
        cr_assert_eq(exo_model_forward(m, src, a + c, c + 16 <= 40 ? 16 : 40 - c, la, false, &err), 0, "%s", err.msg);
    tok = argmax(la, V);
    cr_assert_eq(exo_model_forward(m, src, &tok, 1, la, false, &err), 0, "%s", err.msg);
    cr_assert_eq(exo_model_forward(m, dst, b, 5, lb, false, &err), 0, "%s", err.msg);
    if (exo_model_get_config(m)->linear_v_heads > 0) { /* a recurrent state is kept at 32 only */
        cr_expect_eq(exo_seq_copy_prefix(dst, src, 16, &err), EXO_EUNSUPPORTED, "%s", name);
        cr_expect_eq(exo_seq_len(dst), 5, "%s: a refused copy leaves dst alone", name);
    }
    cr_expect_eq(exo_seq_copy_prefix(dst, src, 42, &err), EXO_EINVAL, "past src's length");
    cr_expect_eq(exo_seq_len(dst), 5);
    cr_assert_eq(exo_seq_copy_prefix(dst, src, 32, &err), 0, "%s: %s", name, err.msg);
    cr_assert_eq(exo_seq_len(dst), 32);
    cr_assert_eq(exo_model_forward(m, dst, b + 32, 8, lb, false, &err), 0, "%s", err.msg);
    for (int c = 0; c < 40; c += 16)
        cr_assert_eq(exo_model_forward(m, fresh, b + c, c + 16 <= 40 ? 16 : 40 - c, la, false, &err), 0, "%s", err.msg);
    float d = max_diff(la, lb, V);
    cr_expect_leq(d, exo_model_gpu_layers(m) ? 1e-3f : 0.0f, "%s: logits differ by %g from a fresh prefill", name,
                  (double)d);
    for (int step = 0; step < 3; step++) { /* and decode on alike */
        tok = argmax(la, V);
        cr_assert_eq(exo_model_forward(m, dst, &tok, 1, lb, false, &err), 0, "%s", err.msg);
        cr_assert_eq(exo_model_forward(m, fresh, &tok, 1, la, false, &err), 0, "%s", err.msg);
        d = max_diff(la, lb, V);
        cr_expect_leq(d, exo_model_gpu_layers(m) ? 1e-3f : 0.0f, "%s: step %d: logits differ by %g", name, step,
                      (double)d);
    }
    exo_seq_free(src);
    exo_seq_free(dst);
    exo_seq_free(fresh);
    exo_free(la);
    exo_free(lb);
    exo_model_free(m);
}

Test(batch, a_copied_prefix_goes_on_as_one_computed_in_place, .timeout = 240)
{
    for (size_t f = 0; f < sizeof FAMILIES / sizeof *FAMILIES; f++)
        copied_prefix(FAMILIES[f]);
}

/* Where a model promises exact rows (exo_model_exact_rows: the runner
 * then takes a computed prefix up to any position), a prompt cut in calls
 * of at least that many rows, wherever the cuts fall, gives the bits of
 * one cut at the multiples of 128 from 0: at its last position, and in
 * its caches (the decode steps after it). Dense families, sliding windows,
 * and experts (whose rows per call follow the routing of the others).
 * Models that cannot promise it say 0. */
static void cuts_agree(const char *name)
{
    enum { N = 250, STEPS_AFTER = 4, MAX_CUTS = 5 };
    exo_model *m = load(name);
    int E = exo_model_exact_rows(m);
    if (!E) {
        fprintf(stderr, "batch/%s: no exact rows here (on a GPU, or the GEMM's rows differ): skipped\n", name);
        exo_model_free(m);
        return;
    }
    cr_assert(E <= 28, "%s: exact from %d rows, more than the cuts below allow", name, E);
    const int cuts[][MAX_CUTS] = {{128, 122}, {E, 128 - E, 122}, {100, 28, 122}, {45, 83, 61, 61}, {250},
                                  {128, E, 122 - E}};
    int V = exo_model_vocab(m);
    float *want = exo_malloc(sizeof(float) * (size_t)V * (STEPS_AFTER + 1)), *got = exo_malloc(sizeof(float) * V);
    int32_t ids[N], next[STEPS_AFTER];
    prompt(m, 5, ids, N);
    exo_err err = {0};
    for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
        exo_seq *s = seq(m);
        int at = 0;
        for (int k = 0; k < MAX_CUTS && cuts[c][k]; k++) {
            cr_assert_geq(cuts[c][k], E);
            float *lg = at + cuts[c][k] == N ? (c ? got : want) : NULL;
            cr_assert_eq(exo_model_forward(m, s, ids + at, cuts[c][k], lg, false, &err), 0, "%s", err.msg);
            at += cuts[c][k];
        }
        cr_assert_eq(at, N);
        for (int t = 0; t <= STEPS_AFTER; t++) {
            float *w = want + (size_t)t * V;
            if (c == 0 && t < STEPS_AFTER)
                next[t] = argmax(w, V);
            if (c > 0)
                cr_expect_eq(memcmp(got, w, sizeof(float) * V), 0, "%s: cuts %zu, %s: logits differ by %g", name, c,
                             t ? "a decode step after" : "the prompt's last position", (double)max_diff(got, w, V));
            if (t < STEPS_AFTER)
                cr_assert_eq(exo_model_forward(m, s, &next[t], 1, c ? got : w + V, false, &err), 0, "%s", err.msg);
        }
        exo_seq_free(s);
    }
    fprintf(stderr, "batch/%s: exact from %d rows; %zu cuts of a %d-token prompt agree\n", name, E,
            sizeof cuts / sizeof cuts[0], N);
    exo_free(want);
    exo_free(got);
    exo_model_free(m);
}

Test(batch, prompt_cuts_of_exact_rows_agree, .timeout = 240)
{
    static const char *const exact[] = {"llama-q4g64", "llama-bf16", "llama-f32",    "qwen3-q4g64",
                                        "gemma3-q4g64", "qwen3_moe-q4g64", "gpt_oss-mxfp4"};
    for (size_t f = 0; f < sizeof exact / sizeof *exact; f++)
        cuts_agree(exact[f]);
    static const char *const other[] = {"qwen3_5-q4g64", "deepseek_v3-q4g64"};
    for (size_t f = 0; f < sizeof other / sizeof *other; f++) {
        exo_model *m = load(other[f]);
        cr_expect_eq(exo_model_exact_rows(m), 0, "%s: recurrent states or latent attention promise no exact rows",
                     other[f]);
        exo_model_free(m);
    }
}
