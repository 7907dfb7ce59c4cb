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
     * per forward call, cut at its multiples counted from position 0 (a
     * prompt after a reused prefix: a shorter first call); <= 0: the whole
     * prompt in one call. on_prefill
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

/* Where the forward passes and the sampling of a generation happen. One
 * process holding the whole model is exo_gen_stepper_local; a model split
 * over runner processes brings its own (runner/dist.c), whose step may
 * send the tokens on and wait for the sample from the rank with the head.
 *   start: a new generation; the sampler gets its parameters and the
 *          history so far (the prompt), for its penalties.
 *   step:  runs T tokens at the sequence's next positions; with `sample`,
 *          samples the token after the last one (and adds it to the
 *          history); without, nothing is sampled (a prompt chunk).
 *   len / capacity / truncate: the sequence's positions (an error during
 *          the prefill puts it back where it was). */
typedef struct exo_gen_stepper {
    void *ctx;
    int (*start)(void *ctx, const exo_sampler_params *sp, const int32_t *prompt, int n_prompt,
                 int max_tokens, exo_err *err);
    int (*step)(void *ctx, const int32_t *tokens, int T, exo_sample *sample, exo_err *err);
    int (*len)(void *ctx);
    int (*capacity)(void *ctx);
    void (*truncate)(void *ctx, int n);
    void (*finish)(void *ctx); /* after start, whatever happened */
} exo_gen_stepper;

/* The stepper of one process: forward on (m, seq), sampling here. Free
 * with exo_gen_stepper_local_free. */
exo_gen_stepper *exo_gen_stepper_local(exo_model *m, exo_seq *seq);
void             exo_gen_stepper_local_free(exo_gen_stepper *st);

/* Generates from `prompt` appended to the stepper's sequence (which may
 * already hold a prefix). Errors are those of the stepper (for the local
 * one, exo_model_forward's); an error during the prefill leaves the
 * sequence at its length before the call. */
int exo_generate_with(exo_gen_stepper *st, const int32_t *prompt, int n_prompt,
                      const exo_gen_params *p, exo_gen_token_fn on_token, void *ctx,
                      exo_gen_stats *stats, exo_err *err);

/* One generation as a state machine, for callers that interleave several
 * (a pipeline's rank 0 keeps one per request in flight): it says what the
 * next forward step runs, and takes the sample the step produced.
 *   exo_gen_seq_new: the prompt (the caller's, valid until the last step)
 *     goes in at position `pos` of a sequence of `capacity` positions.
 *   exo_gen_seq_next: the step to run now (tokens, T, whether it wants a
 *     sample); false when the generation waits for a sample or is done.
 *   exo_gen_seq_stepped: that step ran (on_prefill is called between
 *     prompt chunks, and may end the generation: finish CANCEL).
 *   exo_gen_seq_sampled: the sample of the last step: on_token, stop
 *     conditions; true when another step follows.
 * Stats as exo_generate's. */
typedef struct exo_gen_seq exo_gen_seq;
exo_gen_seq *exo_gen_seq_new(const int32_t *prompt, int n_prompt, int pos, int capacity,
                             const exo_gen_params *p, exo_gen_token_fn on_token, void *ctx);
void exo_gen_seq_free(exo_gen_seq *g);
bool exo_gen_seq_next(exo_gen_seq *g, const int32_t **tokens, int *T, bool *want_sample);
void exo_gen_seq_stepped(exo_gen_seq *g);
bool exo_gen_seq_sampled(exo_gen_seq *g, const exo_sample *s);
bool exo_gen_seq_done(const exo_gen_seq *g);
/* The prompt's next calls take about `rows` tokens (0: whole chunks
 * again), on a model whose calls of exact_rows or more rows give each row
 * the same bits however a prompt is cut (model.h exo_model_exact_rows;
 * without that, 0, chunks stay whole): each chunk is cut in slices of
 * `rows`, where the rest of the chunk after a slice would be fewer than
 * exact_rows it goes with the slice. A runner whose decoding streams wait
 * on a prompt's calls cuts them shorter this way without changing any
 * bits. Only between steps (not between next and stepped). */
void exo_gen_seq_slice(exo_gen_seq *g, int rows, int exact_rows);

/* A generation whose caches were given up (a batch preempts a request when
 * cache memory runs out) computes them again on a sequence that holds the
 * first `pos` positions of its prompt: the rest of the prompt (its last
 * `n_prompt` tokens, in chunks as before, no sample), then every token its
 * decode steps ran, one decode step each (no sample: the same rows it ran
 * then, so the same bits), then it goes on from the token it sampled last,
 * its stats and stop conditions as they were. Only between steps (not
 * while a sample is out); on_prefill is not called again. */
void exo_gen_seq_restart(exo_gen_seq *g, const int32_t *prompt, int n_prompt, int pos);
/* Positions a restart needs beyond the prompt: the tokens its decode steps ran. */
int exo_gen_seq_decoded(const exo_gen_seq *g);
bool exo_gen_seq_in_prefill(const exo_gen_seq *g); /* no sample yet */
void exo_gen_seq_stats(const exo_gen_seq *g, exo_gen_stats *out);

/* exo_generate_with on the local stepper of (m, seq). */
int exo_generate(exo_model *m, exo_seq *seq, const int32_t *prompt, int n_prompt,
                 const exo_gen_params *p, exo_gen_token_fn on_token, void *ctx,
                 exo_gen_stats *stats, exo_err *err);

#endif
