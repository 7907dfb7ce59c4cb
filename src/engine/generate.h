/* The generation loop: prefill a prompt, then sample and decode one token at
 * a time until an end-of-sequence id, max_tokens, or the caller says stop.
 * Each generated token is handed to a callback as soon as it exists, so the
 * CLI prints and the API streams without buffering.
 *
 * A long prompt can be prefilled in chunks (prefill_chunk tokens per
 * forward call, only the last one computing logits), with a progress
 * callback between chunks that can also cancel: that is how the runner
 * reports prefill progress and honours a Cancel before the first token. */
#ifndef EXO_ENGINE_GENERATE_H
#define EXO_ENGINE_GENERATE_H

#include "engine/model.h"
#include "engine/sampler.h"

typedef enum exo_finish {
    EXO_FINISH_LENGTH = 0, /* max_tokens reached */
    EXO_FINISH_STOP,       /* an eos id was sampled */
    EXO_FINISH_CANCEL,     /* the callback asked to stop */
    EXO_FINISH_CONTEXT,    /* the sequence's KV cache is full */
} exo_finish;

const char *exo_finish_name(exo_finish f);

typedef struct exo_gen_params {
    exo_sampler_params sampling;
    int            max_tokens;  /* > 0 */
    const int64_t *eos_ids;     /* generation stops at any of these (not reported) */
    int            n_eos;
    /* Optional (zero = off). prefill_chunk: at most this many prompt tokens
     * per forward call; <= 0: the whole prompt in one call. on_prefill
     * (with the ctx passed to exo_generate): called after every prefill
     * chunk but the last with the prompt tokens processed so far (< total);
     * nonzero stops before any token is sampled (finish = CANCEL,
     * generated_tokens = 0; the sequence keeps the processed tokens). */
    int            prefill_chunk;
    int          (*on_prefill)(void *ctx, int processed, int total);
} exo_gen_params;

typedef struct exo_gen_stats {
    int        prompt_tokens, generated_tokens;
    double     prefill_seconds; /* prompt forward, up to the first sampled token */
    double     decode_seconds;  /* the remaining tokens */
    exo_finish finish;
} exo_gen_stats;

/* Returns nonzero to stop generation (finish = CANCEL). */
typedef int (*exo_gen_token_fn)(void *ctx, const exo_sample *tok);

/* Generates from `prompt` appended to `seq` (which may already hold a
 * prefix). Errors are those of exo_model_forward; an error during the
 * prefill leaves `seq` at its length before the call. */
int exo_generate(exo_model *m, exo_seq *seq, const int32_t *prompt, int n_prompt,
                 const exo_gen_params *p, exo_gen_token_fn on_token, void *ctx,
                 exo_gen_stats *stats, exo_err *err);

#endif
