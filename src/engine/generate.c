/* Generation loop (see generate.h). The token history handed to the
 * sampler (for penalties) is the prompt plus what was generated. A chunked
 * prefill runs the chunks before the last without logits (the model then
 * skips the LM head) and rolls the sequence back if a chunk fails, so an
 * error leaves it as a single forward call would. */
#include "engine/generate.h"
#include "core/alloc.h"
#include "core/clock.h"

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

/* Runs the prompt through the model, in chunks of p->prefill_chunk tokens
 * when that is set; logits receive the last position's. Sets finish =
 * CANCEL when on_prefill asks to stop. */
static int prefill(exo_model *m, exo_seq *seq, const int32_t *prompt, int n_prompt,
                   const exo_gen_params *p, void *ctx, float *logits, exo_gen_stats *stats,
                   exo_err *err)
{
    int chunk = p->prefill_chunk > 0 && p->prefill_chunk < n_prompt ? p->prefill_chunk : n_prompt;
    int len0 = exo_seq_len(seq);
    /* One call, also when it must fail (no tokens, no room): the error is
     * then the model's, found before any work. */
    if (chunk == n_prompt || n_prompt > exo_seq_capacity(seq) - len0)
        return exo_model_forward(m, seq, prompt, n_prompt, logits, false, err);
    for (int done = 0; done < n_prompt;) {
        int n = n_prompt - done < chunk ? n_prompt - done : chunk;
        bool last = done + n == n_prompt;
        int rc = exo_model_forward(m, seq, prompt + done, n, last ? logits : NULL, false, err);
        if (rc) {
            exo_seq_truncate(seq, len0);
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

int exo_generate(exo_model *m, exo_seq *seq, const int32_t *prompt, int n_prompt,
                 const exo_gen_params *p, exo_gen_token_fn on_token, void *ctx,
                 exo_gen_stats *stats, exo_err *err)
{
    memset(stats, 0, sizeof *stats);
    if (p->max_tokens <= 0)
        return exo_err_set(err, EXO_EINVAL, "max_tokens must be > 0");
    int V = exo_model_vocab(m);
    float *logits = exo_try_malloc(sizeof(float) * (size_t)V);
    int32_t *hist = exo_try_malloc(sizeof(int32_t) * ((size_t)n_prompt + (size_t)p->max_tokens));
    exo_sampler *smp = exo_sampler_create(&p->sampling, V);
    int rc = 0;
    if (!logits || !hist) {
        rc = exo_err_set(err, EXO_ENOMEM, "generate: out of memory");
        goto done;
    }
    memcpy(hist, prompt, sizeof(int32_t) * (size_t)n_prompt);
    int n_hist = n_prompt;
    stats->prompt_tokens = n_prompt;
    double t0 = exo_clock_seconds();
    rc = prefill(m, seq, prompt, n_prompt, p, ctx, logits, stats, err);
    double t1 = exo_clock_seconds();
    stats->prefill_seconds = t1 - t0;
    if (rc || stats->finish == EXO_FINISH_CANCEL)
        goto done;
    stats->finish = EXO_FINISH_LENGTH;
    for (int i = 0; i < p->max_tokens; i++) {
        exo_sample s;
        exo_sampler_sample(smp, logits, hist, n_hist, &s);
        if (is_eos(p, s.id)) {
            stats->finish = EXO_FINISH_STOP;
            break;
        }
        hist[n_hist++] = s.id;
        stats->generated_tokens++;
        if (on_token && on_token(ctx, &s)) {
            stats->finish = EXO_FINISH_CANCEL;
            break;
        }
        if (i + 1 == p->max_tokens)
            break;
        if (exo_seq_len(seq) >= exo_seq_capacity(seq)) {
            stats->finish = EXO_FINISH_CONTEXT;
            break;
        }
        rc = exo_model_forward(m, seq, &s.id, 1, logits, false, err);
        if (rc)
            goto done;
    }
    stats->decode_seconds = exo_clock_seconds() - t1;
done:
    exo_sampler_free(smp);
    exo_free(hist);
    exo_free(logits);
    return rc;
}
