/* Token sampling: logits processors, then a sampler, with mlx-lm's semantics
 * (what exo's users get from the original exo).
 *
 * Order: repetition penalty (over the last repetition_context_size tokens:
 * positive logits divided by the penalty, negative multiplied), presence and
 * frequency penalties (OpenAI: minus presence once, minus frequency * count,
 * over the same window), then log-softmax. temperature == 0 is greedy
 * (argmax, lowest id on ties). Otherwise top-k, top-p (nucleus) and min-p
 * filter the distribution of the processed logits, and a token is drawn
 * from softmax(logits / temperature) over what remains. The random stream
 * is a per-sampler xoshiro256** seeded from `seed`, so the same seed gives
 * the same tokens.
 *
 * Log probabilities are those of the processed distribution before
 * temperature (log-softmax of the penalised logits), as mlx-lm reports them.
 *
 * Samplers share nothing: different ones may sample on different threads
 * at once (a batched step's rows, exo_model_host_pool). */
#ifndef EXO_ENGINE_SAMPLER_H
#define EXO_ENGINE_SAMPLER_H

#include "core/threadpool.h"
#include "proto/sampling.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct exo_sampler exo_sampler;

exo_sampler *exo_sampler_create(const exo_sampler_params *p, int vocab);
void         exo_sampler_free(exo_sampler *s);

typedef struct exo_sample {
    int32_t id;
    float   logprob;                           /* of id */
    int     n_top;
    int32_t top_ids[EXO_MAX_TOP_LOGPROBS];     /* most likely first */
    float   top_logprobs[EXO_MAX_TOP_LOGPROBS];
} exo_sample;

/* Picks the next token from logits (vocab floats, modified in place) given
 * the tokens so far (history, for the penalties). */
void exo_sampler_sample(exo_sampler *s, float *logits, const int32_t *history, int n_history,
                        exo_sample *out);

/* The sampler of one generation keeps its own history: begin with the
 * prompt (room for max_tokens more; 0 or EXO_ENOMEM), then each
 * exo_sampler_next picks a token and adds it. */
int  exo_sampler_begin(exo_sampler *s, const int32_t *prompt, int n, int max_tokens);
void exo_sampler_next(exo_sampler *s, float *logits, exo_sample *out);
/* The samples of a batched step's n rows, each with its own sampler
 * (s[i] NULL: row i wants none): a row its backend picked (picks: NULL,
 * or a row each) is taken as picked (exo_sampler_take), the others drawn
 * from their logits (row i at logits + i * vocab, modified) with
 * exo_sampler_next, side by side on pool's threads (a row of a 128k
 * vocabulary takes 0.1-0.3 ms: more than a GPU's whole batched step of a
 * small model). */
void exo_sampler_rows(exo_pool *pool, exo_sampler *const *s, const exo_pick *picks, float *logits, exo_sample *out,
                      int n);
/* Whether this token's pick may be made where the logits are (exo_step.pick,
 * a GPU's), and by what rule (proto/sampling.h): any sampling but a top-k
 * past EXO_PICK_TOP_K or a penalty window past EXO_PICK_PENALIZED tokens.
 * The rule names the window's tokens from the sampler's memory: use it
 * before the sampler's next call. A draw's
 * uniform number is the sampler's next, which it keeps for this token:
 * exo_sampler_take records the backend's pick, or, where the backend made
 * none, exo_sampler_next draws the logits with that same number. */
bool exo_sampler_pick_rule(exo_sampler *s, exo_pick_rule *rule);
void exo_sampler_take(exo_sampler *s, const exo_pick *pick, exo_sample *out);

#endif
