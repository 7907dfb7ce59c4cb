/* Generation loop (see generate.h). The token history handed to the
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
    int32_t        *hist;
    int             n_hist, cap_hist;
} local_stepper;

static int local_start(void *ctx, const exo_sampler_params *sp, const int32_t *prompt, int n_prompt,
                       int max_tokens, exo_err *err)
{
    local_stepper *l = ctx;
    int V = exo_model_vocab(l->m);
    l->logits = exo_try_malloc(sizeof(float) * (size_t)V);
    l->cap_hist = n_prompt + max_tokens;
    l->hist = exo_try_malloc(sizeof(int32_t) * (size_t)l->cap_hist);
    if (!l->logits || !l->hist)
        return exo_err_set(err, EXO_ENOMEM, "generate: out of memory");
    memcpy(l->hist, prompt, sizeof(int32_t) * (size_t)n_prompt);
    l->n_hist = n_prompt;
    l->smp = exo_sampler_create(sp, V);
    return 0;
}

static int local_step(void *ctx, const int32_t *tokens, int T, exo_sample *sample, exo_err *err)
{
    local_stepper *l = ctx;
    int rc = exo_model_forward(l->m, l->seq, tokens, T, sample ? l->logits : NULL, false, err);
    if (rc || !sample)
        return rc;
    exo_sampler_sample(l->smp, l->logits, l->hist, l->n_hist, sample);
    if (l->n_hist < l->cap_hist)
        l->hist[l->n_hist++] = sample->id;
    return 0;
}

static int local_len(void *ctx) { return exo_seq_len(((local_stepper *)ctx)->seq); }
static int local_capacity(void *ctx) { return exo_seq_capacity(((local_stepper *)ctx)->seq); }
static void local_truncate(void *ctx, int n) { exo_seq_truncate(((local_stepper *)ctx)->seq, n); }

static void local_finish(void *ctx)
{
    local_stepper *l = ctx;
    exo_sampler_free(l->smp);
    exo_free(l->hist);
    exo_free(l->logits);
    l->smp = NULL;
    l->hist = NULL;
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

/* Runs the prompt through the stepper, in chunks of p->prefill_chunk tokens
 * when that is set; the last chunk samples the first token into *first.
 * Sets finish = CANCEL when on_prefill asks to stop. */
static int prefill(exo_gen_stepper *g, const int32_t *prompt, int n_prompt, const exo_gen_params *p,
                   void *ctx, exo_sample *first, exo_gen_stats *stats, exo_err *err)
{
    int chunk = p->prefill_chunk > 0 && p->prefill_chunk < n_prompt ? p->prefill_chunk : n_prompt;
    int len0 = g->len(g->ctx);
    /* One call, also when it must fail (no tokens, no room): the error is
     * then the model's, found before any work. */
    if (chunk == n_prompt || n_prompt > g->capacity(g->ctx) - len0)
        return g->step(g->ctx, prompt, n_prompt, first, err);
    for (int done = 0; done < n_prompt;) {
        int n = n_prompt - done < chunk ? n_prompt - done : chunk;
        bool last = done + n == n_prompt;
        int rc = g->step(g->ctx, prompt + done, n, last ? first : NULL, err);
        if (rc) {
            g->truncate(g->ctx, len0);
            return rc;
        }
        done += n;
        if (!last && p->on_prefill && p->on_prefill(ctx, done, n_prompt)) {
            stats->finish = EXO_FINISH_CANCEL;
            return 0;
        }
    }
    return 0;
}

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
    if (rc)
        goto done;
    stats->prompt_tokens = n_prompt;
    double t0 = exo_clock_seconds();
    exo_sample s;
    rc = prefill(g, prompt, n_prompt, p, ctx, &s, stats, err);
    double t1 = exo_clock_seconds();
    stats->prefill_seconds = t1 - t0;
    if (rc || stats->finish == EXO_FINISH_CANCEL)
        goto done;
    stats->finish = EXO_FINISH_LENGTH;
    for (int i = 0; i < p->max_tokens; i++) {
        if (is_eos(p, s.id)) {
            stats->finish = EXO_FINISH_STOP;
            break;
        }
        stats->generated_tokens++;
        if (on_token && on_token(ctx, &s)) {
            stats->finish = EXO_FINISH_CANCEL;
            break;
        }
        if (i + 1 == p->max_tokens)
            break;
        if (g->len(g->ctx) >= g->capacity(g->ctx)) {
            stats->finish = EXO_FINISH_CONTEXT;
            break;
        }
        int32_t id = s.id;
        rc = g->step(g->ctx, &id, 1, &s, err);
        if (rc)
            goto done;
    }
    stats->decode_seconds = exo_clock_seconds() - t1;
done:
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
