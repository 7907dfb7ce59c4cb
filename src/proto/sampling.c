/* Sampling parameter defaults (see sampling.h). */
#include "proto/sampling.h"

exo_sampler_params exo_sampler_defaults(void)
{
    return (exo_sampler_params){.temperature = 0, .top_k = 0, .top_p = 1, .min_p = 0,
                                .repetition_penalty = 1, .repetition_context_size = 20,
                                .presence_penalty = 0, .frequency_penalty = 0, .seed = 42,
                                .top_logprobs = 0};
}
