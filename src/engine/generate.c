/* Generation loop (see generate.h): one generation is a small state machine
 * (exo_gen_seq) that says what the next forward step runs and takes the
 * samples; exo_generate_with drives one through a stepper. The token history handed to the
 * sampler (for penalties) is the prompt plus what was generated. A chunked
 * prefill runs the chunks before the last without logits (the model then
 * skips the LM head) and rolls the sequence back if a chunk fails, so an
 * error leaves it as a single forward call would. */
#include "engine/generate.h"
#include "core/alloc.h"
#include "core/clock.h"

#include <stdint.h>
#include <string.h>

const char *exo_finish_name(exo_finish f)
{
    switch (f) {
    case EXO_FINISH_STOP:    return "stop";
    case EXO_FINISH_CANCEL:  return "cancel";
    case EXO_FINISH_CONTEXT: return "context";
    default:                 return "length";
    }
}

static bool is_eos(const exo_gen_params *p, int32_t id)
{
    for (int i = 0; i < p->n_eos; i++)
        if (p->eos_ids[i] == id)
            return true;
    return false;
}

/* ---- the local stepper -------------------------------------------------- */

typedef struct local_stepper {
    exo_gen_stepper base;
    exo_model      *m;
    exo_seq        *seq;
    exo_sampler    *smp;
    float          *logits;
} local_stepper;

static int local_start(void *ctx, const exo_sampler_params *sp, const int32_t *prompt, int n_prompt,
                       int max_tokens, exo_err *err)
{
    local_stepper *l = ctx;
    int V = exo_model_vocab(l->m);
    l->logits = exo_try_malloc(sizeof(float) * (size_t)V);
    l->smp = exo_sampler_create(sp, V);
    if (!l->logits || exo_sampler_begin(l->smp, prompt, n_prompt, max_tokens))
        return exo_err_set(err, EXO_ENOMEM, "generate: out of memory");
    return 0;
}

static int local_step(void *ctx, const int32_t *tokens, int T, exo_sample *sample, exo_err *err)
{
    local_stepper *l = ctx;
    exo_pick_rule rule;
    exo_step st = {.T = T, .tokens = tokens, .logits = sample ? l->logits : NULL,
                   .pick = sample && exo_sampler_pick_rule(l->smp, &rule) ? &rule : NULL};
    int rc = exo_model_step(l->m, l->seq, &st, err);
    if (rc || !sample)
        return rc;
    if (st.token.picked) /* the backend found the token where the logits are */
        exo_sampler_take(l->smp, &st.token, sample);
    else /* with the number the rule took, if it took one */
        exo_sampler_next(l->smp, l->logits, sample);
    return 0;
}

static int local_len(void *ctx) { return exo_seq_len(((local_stepper *)ctx)->seq); }
static int local_capacity(void *ctx) { return exo_seq_capacity(((local_stepper *)ctx)->seq); }
static void local_truncate(void *ctx, int n) { exo_seq_truncate(((local_stepper *)ctx)->seq, n); }

static void local_finish(void *ctx)
{
    local_stepper *l = ctx;
    exo_sampler_free(l->smp);
    exo_free(l->logits);
    l->smp = NULL;
    l->logits = NULL;
}

exo_gen_stepper *exo_gen_stepper_local(exo_model *m, exo_seq *seq)
{
    local_stepper *l = exo_calloc(1, sizeof *l);
    l->m = m;
    l->seq = seq;
    l->base = (exo_gen_stepper){l, local_start, local_step, local_len, local_capacity,
                                local_truncate, local_finish};
    return &l->base;
}

void exo_gen_stepper_local_free(exo_gen_stepper *st)
{
    if (st)
        exo_free(st->ctx);
}

/* ---- the loop ------------------------------------------------------------ */

/* ---- one generation, step by step -------------------------------------- */

/* GS_REPLAY: a restarted generation runs the tokens it had decoded again */
typedef enum { GS_PREFILL, GS_WAIT, GS_DECODE, GS_REPLAY, GS_DONE } gs_state;

struct exo_gen_seq {
    exo_gen_params   p;
    const int32_t   *prompt; /* the caller's, valid until the last step */
    int              n_prompt, done, chunk;
    int              slice, exact; /* exo_gen_seq_slice */
    int              pos, capacity;
    int32_t          last;   /* the token the next decode step runs */
    int32_t         *ran;    /* the tokens decode steps have run, in order (a restart runs them again) */
    int              n_ran, cap_ran, replayed;
    bool             restarted; /* its prompt's last chunk wants no sample: that was taken before */
    bool             stepped_last_chunk;
    gs_state         state;
    exo_gen_stats    stats;
    double           t0, t1;
    exo_gen_token_fn on_token;
    void            *ctx;
};

/* The chunk a prompt is cut in, 0: one call (also when it must fail
 * anyway, no room, so the error is the model's, found before any work). */
static int prefill_chunk(const exo_gen_seq *g)
{
    int c = g->p.prefill_chunk;
    return c > 0 && g->n_prompt <= g->capacity - g->pos ? c : 0;
}

/* The next prefill call's tokens: up to the next multiple of the chunk
 * counted from position 0, so a prompt taken up after a reused prefix is
 * cut where it is when computed from 0; or a slice of that where the rest
 * of the chunk keeps exact rows or more (else the rest goes with it). A
 * short last chunk, under exact rows, is under the slice too: it goes
 * whole. */
static int prefill_rows(const exo_gen_seq *g)
{
    int left = g->n_prompt - g->done;
    int n = g->chunk ? g->chunk - g->pos % g->chunk : left;
    n = n < left ? n : left;
    int S = g->slice, E = g->exact;
    if (g->chunk && S && E && S >= E && n > S) /* no chunks (one call, or one that must fail): as is */
        n = n - S >= E ? S : n;
    return n;
}

exo_gen_seq *exo_gen_seq_new(const int32_t *prompt, int n_prompt, int pos, int capacity,
                             const exo_gen_params *p, exo_gen_token_fn on_token, void *ctx)
{
    exo_gen_seq *g = exo_calloc(1, sizeof *g);
    g->p = *p;
    g->prompt = prompt;
    g->n_prompt = n_prompt;
    g->pos = pos;
    g->capacity = capacity;
    g->chunk = prefill_chunk(g);
    g->on_token = on_token;
    g->ctx = ctx;
    g->stats.prompt_tokens = n_prompt;
    g->t0 = exo_clock_seconds();
    g->state = p->max_tokens > 0 ? GS_PREFILL : GS_DONE;
    return g;
}

void exo_gen_seq_free(exo_gen_seq *g)
{
    if (g)
        exo_free(g->ran);
    exo_free(g);
}

bool exo_gen_seq_next(exo_gen_seq *g, const int32_t **tokens, int *T, bool *want_sample)
{
    if (g->state == GS_PREFILL) {
        int n = prefill_rows(g);
        *tokens = g->prompt + g->done;
        *T = n;
        *want_sample = g->done + n == g->n_prompt && !g->restarted;
        return true;
    }
    if (g->state == GS_REPLAY) {
        *tokens = &g->ran[g->replayed];
        *T = 1;
        *want_sample = false;
        return true;
    }
    if (g->state == GS_DECODE) {
        *tokens = &g->last;
        *T = 1;
        *want_sample = true;
        return true;
    }
    return false;
}

void exo_gen_seq_stepped(exo_gen_seq *g)
{
    int T = g->state == GS_PREFILL ? prefill_rows(g) : 1;
    g->pos += T;
    if (g->state == GS_REPLAY) {
        if (++g->replayed == g->n_ran)
            g->state = GS_DECODE;
        return;
    }
    if (g->state == GS_DECODE) {
        if (g->n_ran == g->cap_ran) {
            g->cap_ran = g->cap_ran ? 2 * g->cap_ran : 64;
            g->ran = exo_realloc(g->ran, sizeof *g->ran * (size_t)g->cap_ran);
        }
        g->ran[g->n_ran++] = g->last;
        g->state = GS_WAIT;
        return;
    }
    g->done += T;
    if (g->done == g->n_prompt) {
        g->state = !g->restarted ? GS_WAIT : g->n_ran ? GS_REPLAY : GS_DECODE;
        return;
    }
    if (g->restarted)
        return;
    if (g->p.on_prefill && g->p.on_prefill(g->ctx, g->done, g->n_prompt)) {
        g->stats.finish = EXO_FINISH_CANCEL;
        g->state = GS_DONE;
    }
}

bool exo_gen_seq_sampled(exo_gen_seq *g, const exo_sample *s)
{
    if (g->state != GS_WAIT)
        return false;
    double now = exo_clock_seconds();
    if (!g->t1) {
        g->t1 = now;
        g->stats.prefill_seconds = now - g->t0;
        g->stats.finish = EXO_FINISH_LENGTH;
    }
    g->state = GS_DONE;
    if (is_eos(&g->p, s->id))
        g->stats.finish = EXO_FINISH_STOP;
    else if (g->stats.generated_tokens++, g->on_token && g->on_token(g->ctx, s))
        g->stats.finish = EXO_FINISH_CANCEL;
    else if (g->stats.generated_tokens == g->p.max_tokens)
        g->stats.finish = EXO_FINISH_LENGTH;
    else if (g->pos >= g->capacity)
        g->stats.finish = EXO_FINISH_CONTEXT;
    else {
        g->last = s->id;
        g->state = GS_DECODE;
    }
    if (g->state == GS_DONE)
        g->stats.decode_seconds = now - g->t1;
    return g->state == GS_DECODE;
}

bool exo_gen_seq_done(const exo_gen_seq *g) { return g->state == GS_DONE; }

void exo_gen_seq_slice(exo_gen_seq *g, int rows, int exact_rows)
{
    g->slice = rows > 0 ? rows : 0;
    g->exact = exact_rows > 0 ? exact_rows : 0;
}

void exo_gen_seq_restart(exo_gen_seq *g, const int32_t *prompt, int n_prompt, int pos)
{
    if (g->state != GS_PREFILL && g->state != GS_DECODE && g->state != GS_REPLAY)
        return; /* done, or a sample is out */
    g->prompt = prompt;
    g->n_prompt = n_prompt;
    g->done = 0;
    g->pos = pos;
    g->chunk = prefill_chunk(g);
    if (!g->t1) { /* its prompt was not through: it starts again */
        g->state = GS_PREFILL;
        return;
    }
    g->replayed = 0;
    g->restarted = true;
    g->state = n_prompt > 0 ? GS_PREFILL : g->n_ran ? GS_REPLAY : GS_DECODE;
}

int exo_gen_seq_decoded(const exo_gen_seq *g) { return g->n_ran; }
bool exo_gen_seq_in_prefill(const exo_gen_seq *g) { return g->state == GS_PREFILL || !g->t1; }
void exo_gen_seq_stats(const exo_gen_seq *g, exo_gen_stats *out) { *out = g->stats; }

int exo_generate_with(exo_gen_stepper *g, const int32_t *prompt, int n_prompt,
                      const exo_gen_params *p, exo_gen_token_fn on_token, void *ctx,
                      exo_gen_stats *stats, exo_err *err)
{
    memset(stats, 0, sizeof *stats);
    if (p->max_tokens <= 0)
        return exo_err_set(err, EXO_EINVAL, "max_tokens must be > 0");
    if (n_prompt < 0 || n_prompt > INT32_MAX - p->max_tokens)
        return exo_err_set(err, EXO_ERANGE, "generate: prompt too long");
    int rc = g->start(g->ctx, &p->sampling, prompt, n_prompt, p->max_tokens, err);
    if (rc) {
        g->finish(g->ctx);
        return rc;
    }
    int len0 = g->len(g->ctx);
    exo_gen_params q = *p;
    exo_gen_seq *s = exo_gen_seq_new(prompt, n_prompt, len0, g->capacity(g->ctx), &q, on_token, ctx);
    const int32_t *tokens;
    int T;
    bool want;
    while (exo_gen_seq_next(s, &tokens, &T, &want)) {
        exo_sample smp;
        bool prefilling = exo_gen_seq_in_prefill(s);
        if ((rc = g->step(g->ctx, tokens, T, want ? &smp : NULL, err))) {
            if (prefilling) /* an error during the prefill leaves the sequence as it was */
                g->truncate(g->ctx, len0);
            break;
        }
        exo_gen_seq_stepped(s);
        if (want)
            exo_gen_seq_sampled(s, &smp);
    }
    exo_gen_seq_stats(s, stats);
    exo_gen_seq_free(s);
    g->finish(g->ctx);
    return rc;
}

int exo_generate(exo_model *m, exo_seq *seq, const int32_t *prompt, int n_prompt,
                 const exo_gen_params *p, exo_gen_token_fn on_token, void *ctx,
                 exo_gen_stats *stats, exo_err *err)
{
    exo_gen_stepper *g = exo_gen_stepper_local(m, seq);
    int rc = exo_generate_with(g, prompt, n_prompt, p, on_token, ctx, stats, err);
    exo_gen_stepper_local_free(g);
    return rc;
}
