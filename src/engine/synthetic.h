/* Random-weight models with the exact shapes of real ones, built in memory,
 * so `exo bench` measures real-size speed without downloading anything.
 * Weights are random but well scaled (activations stay finite); codes,
 * scales and biases have exactly the layout a checkpoint would have.
 *
 * Every tensor is generated from its own random stream, seeded by (seed,
 * tensor name), so a tensor's bytes do not depend on the order tensors are
 * asked for: exo_synth_write produces the same weights as exo_synth_build
 * for the same preset, quantization and seed, one tensor at a time. */
#ifndef EXO_ENGINE_SYNTHETIC_H
#define EXO_ENGINE_SYNTHETIC_H

#include "core/error.h"
#include "engine/model.h"

typedef enum exo_synth_quant {
    EXO_SYNTH_BF16 = 0,
    EXO_SYNTH_Q8,   /* MLX affine 8-bit, group 64, bf16 scales/biases */
    EXO_SYNTH_Q4,   /* MLX affine 4-bit, group 64, bf16 scales/biases */
    EXO_SYNTH_MXFP4, /* experts MXFP4 (as gpt-oss ships them), the rest affine 8-bit */
} exo_synth_quant;

/* "bf16", "q8", "q4" -> *out; EXO_EINVAL otherwise. */
int exo_synth_quant_parse(const char *name, exo_synth_quant *out);

typedef struct exo_synth exo_synth;

/* Presets: llama-3.2-1b, llama-3.2-3b, llama-3.1-8b, qwen3-0.6b, qwen3-1.7b,
 * qwen3-4b, qwen3-8b, qwen3-30b-a3b (mixture of experts: 128, 8 per token)
 * (the real models' config.json values: sizes, RoPE, norm eps, tied
 * embeddings, bos/eos ids), and tiny ones for tests: tiny-llama (2 layers,
 * hidden 64, vocab 512, untied), tiny-qwen3 (the same with qk-norm and tied
 * embeddings) and tiny-qwen3-moe (8 experts, 2 per token, untied). The
 * names are listed by exo_synth_presets() (NULL-terminated). */
const char *const *exo_synth_presets(void);
int  exo_synth_create(const char *preset, exo_synth_quant q, uint64_t seed, exo_synth **out,
                      exo_err *err);
void exo_synth_free(exo_synth *s);
/* Keeps the first n layers only (n <= the preset's): the real shapes of a
 * model too big for the machine, measured per layer. */
int  exo_synth_set_layers(exo_synth *s, int n, exo_err *err);
const exo_model_config *exo_synth_config(const exo_synth *s);
/* Builds the model; the exo_synth must outlive it. */
int exo_synth_build(exo_synth *s, const exo_model_opts *opts, exo_model **out, exo_err *err);

/* Writes the model as a Hugging Face directory that exo_model_load reads
 * back to the same weights: `dir`/model.safetensors (MLX layout for q4/q8:
 * <module>.weight U32 codes, .scales, .biases in bf16; bf16 norms), then
 * `dir`/config.json (with the "quantization" block for q4/q8). `dir` must
 * exist. Tensors are produced while the file is written, one at a time, so
 * memory stays at one tensor. Each file goes through a temporary name and a
 * rename; config.json comes last. *bytes (may be NULL) receives the size of
 * model.safetensors' tensor data. Errors: EXO_EIO, EXO_ENOMEM. */
int exo_synth_write(exo_synth *s, const char *dir, size_t *bytes, exo_err *err);

#endif
