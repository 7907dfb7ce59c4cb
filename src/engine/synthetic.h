/* Random-weight models with the exact shapes of real ones, built in memory,
 * so `exo bench` measures real-size speed without downloading anything.
 * Weights are random but well scaled (activations stay finite); codes,
 * scales and biases have exactly the layout a checkpoint would have. */
#ifndef EXO_ENGINE_SYNTHETIC_H
#define EXO_ENGINE_SYNTHETIC_H

#include "core/error.h"
#include "engine/model.h"

typedef enum exo_synth_quant {
    EXO_SYNTH_BF16 = 0,
    EXO_SYNTH_Q8,   /* MLX affine 8-bit, group 64, bf16 scales/biases */
    EXO_SYNTH_Q4,   /* MLX affine 4-bit, group 64, bf16 scales/biases */
} exo_synth_quant;

typedef struct exo_synth exo_synth;

/* Presets: llama-3.2-1b, llama-3.2-3b, llama-3.1-8b, qwen3-0.6b, qwen3-1.7b,
 * qwen3-4b, qwen3-8b. The names are listed by exo_synth_presets(). */
const char *const *exo_synth_presets(void);
int  exo_synth_create(const char *preset, exo_synth_quant q, uint64_t seed, exo_synth **out,
                      exo_err *err);
void exo_synth_free(exo_synth *s);
const exo_model_config *exo_synth_config(const exo_synth *s);
/* Builds the model; the exo_synth must outlive it. */
int exo_synth_build(exo_synth *s, const exo_model_opts *opts, exo_model **out, exo_err *err);

#endif
