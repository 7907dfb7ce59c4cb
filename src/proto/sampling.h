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
 * exo_sampler_pick_rule): the largest logit (temperature 0; lowest id on
 * ties), or a draw from softmax(logits / temperature) over the whole
 * vocabulary with the uniform number u in [0, 1). */
typedef struct exo_pick_rule {
    float  temperature;
    double u;
} exo_pick_rule;

/* A token a backend picked by its rule: the id and its log-probability
 * (engine/model.h exo_model_step_batch). Not picked: the logits came to
 * the host instead. */
typedef struct exo_pick {
    bool    picked;
    int32_t id;
    float   logprob;
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
