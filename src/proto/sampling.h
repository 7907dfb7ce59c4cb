/* Sampling parameters: what a request asks of the sampler. A plain value
 * type, shared by the canonical request (proto/gen_types.h), which travels
 * between nodes and runners, and the engine's sampler (engine/sampler.h),
 * which implements them; and the rule a backend picks a token by where
 * the logits are, and its pick, which the sampler and the model share. */
#ifndef EXO_PROTO_SAMPLING_H
#define EXO_PROTO_SAMPLING_H

#include <stdbool.h>
#include <stdint.h>

#define EXO_MAX_TOP_LOGPROBS 20

/* A token picked where the logits are (a GPU, engine/sampler.h
 * exo_sampler_pick_rule), with the host sampler's semantics: the
 * penalties change the logits first (the named tokens': repetition,
 * then presence and frequency, engine/sampler.h); then the largest logit
 * (temperature 0; lowest id on ties; filters ignored), or a draw with the
 * uniform number u in [0, 1) from softmax(logits / temperature) over what
 * top-k, top-p (of the temperature-1 distribution, most likely first) and
 * min-p keep: the whole vocabulary when none is on; and the top_logprobs
 * most likely tokens of the penalized logits (ties: lower ids), with
 * their log-softmax. Zero in every field but temperature and u: a plain
 * draw. */
#define EXO_PICK_TOP_K     256  /* the largest top-k a rule takes, and top-p's candidates without one */
#define EXO_PICK_PENALIZED 1024 /* the most tokens a rule's penalties name */
typedef struct exo_pick_rule {
    float  temperature;
    double u;
    int    top_k;              /* 0: off; else 1 .. EXO_PICK_TOP_K */
    float  top_p;              /* on in (0, 1) */
    float  min_p;              /* on above 0 */
    float  repetition_penalty; /* on above 0 but 1 */
    float  presence_penalty;   /* on where either is not 0 */
    float  frequency_penalty;
    int    top_logprobs;       /* alternatives to report, 0 .. EXO_MAX_TOP_LOGPROBS */
    int    n_penalized;              /* tokens the penalties name: */
    const int32_t  *penalized;       /* distinct ids */
    const uint16_t *penalized_count; /* each one's count in the window */
} exo_pick_rule;

/* A token a backend picked by its rule: the id, its log-probability and
 * the alternatives the rule asked for (engine/model.h exo_step,
 * exo_model_step_batch). Not picked: the logits came to the host
 * instead. */
typedef struct exo_pick {
    bool    picked;
    int32_t id;
    float   logprob;
    int     n_top; /* the most likely, as the rule asked (exo_sample's) */
    int32_t top_ids[EXO_MAX_TOP_LOGPROBS];
    float   top_logprobs[EXO_MAX_TOP_LOGPROBS];
} exo_pick;

typedef struct exo_sampler_params {
    float    temperature;             /* 0 = greedy */
    int      top_k;                   /* 0 = off */
    float    top_p;                   /* 1 = off */
    float    min_p;                   /* 0 = off */
    float    repetition_penalty;      /* 1 = off */
    int      repetition_context_size; /* tokens looked back; 0 = 20 */
    float    presence_penalty;        /* 0 = off */
    float    frequency_penalty;       /* 0 = off */
    uint64_t seed;
    int      top_logprobs;            /* alternatives to report, 0..EXO_MAX_TOP_LOGPROBS */
} exo_sampler_params;

/* The defaults of exo_sampler_params: greedy, no penalties, seed 42. */
exo_sampler_params exo_sampler_defaults(void);

#endif
