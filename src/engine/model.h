/* A loaded decoder-only transformer and the sequences that run through it.
 *
 * exo_model holds what is shared and read-only: the parsed config, the
 * mmapped checkpoint, the weights bound to the backends their layers are
 * assigned to, and the scratch activations of one forward call.
 * exo_seq holds one sequence's state: its KV cache and length. Several
 * sequences can share one model, one forward call at a time.
 *
 * Architectures: llama (incl. llama3 RoPE scaling, tied embeddings),
 * mistral, qwen2 (q/k/v bias), qwen3 (per-head q/k RMSNorm, explicit
 * head_dim). Weights: F32/F16/BF16, or MLX affine 2..8-bit per module as
 * the checkpoint's quantization block says.
 *
 * Example:
 *   exo_model *m; exo_seq *s; exo_err err;
 *   exo_model_load("models/Qwen3-0.6B", NULL, &m, &err);
 *   exo_seq_create(m, 4096, &s, &err);
 *   float *logits = malloc(sizeof(float) * exo_model_vocab(m));
 *   exo_model_forward(m, s, prompt, n_prompt, logits, false, &err);  // prefill
 *   ... sample, then exo_model_forward(m, s, &tok, 1, logits, false, &err);
 */
#ifndef EXO_ENGINE_MODEL_H
#define EXO_ENGINE_MODEL_H

#include "core/error.h"
#include "engine/config.h"
#include "engine/linear.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct exo_model exo_model;
typedef struct exo_seq exo_seq;

typedef struct exo_model_opts {
    int n_threads;   /* CPU threads; <= 0: all online CPUs */
    int max_chunk;   /* tokens per forward step of a long prompt; <= 0: 512 */
} exo_model_opts;

int  exo_model_load(const char *dir, const exo_model_opts *opts, exo_model **out, exo_err *err);
void exo_model_free(exo_model *m);

const exo_model_config *exo_model_get_config(const exo_model *m);
int     exo_model_vocab(const exo_model *m);
/* Bytes of weights one decode step reads (every layer + LM head). */
size_t  exo_model_decode_bytes(const exo_model *m);

/* A model built from weights already in memory (the synthetic benchmark
 * models): `weights` supplies each named linear/vector exactly as a
 * checkpoint would. The model keeps pointers into the caller's memory,
 * which must outlive it. */
typedef struct exo_weight_source {
    void *ctx;
    /* Fills *out for a linear module path (no ".weight"); 0, or EXO_ENOENT. */
    int (*linear)(void *ctx, const char *module, exo_linear *out);
    /* Vector tensor by full name; 0, or EXO_ENOENT. */
    int (*vector)(void *ctx, const char *name, exo_dtype *dtype, const void **data, int64_t *n);
    /* The data points into file mappings (a checkpoint), not memory that
     * outlives the model: backends copy the weights (see backend.h). */
    bool from_file;
} exo_weight_source;

int exo_model_build(const exo_model_config *cfg, const exo_weight_source *src,
                    const exo_model_opts *opts, exo_model **out, exo_err *err);

int  exo_seq_create(exo_model *m, int capacity, exo_seq **out, exo_err *err);
void exo_seq_free(exo_seq *s);
int  exo_seq_len(const exo_seq *s);
int  exo_seq_capacity(const exo_seq *s);
/* Forgets positions >= n (n <= len): the next forward continues from n. */
void exo_seq_truncate(exo_seq *s, int n);

/* Runs T tokens through the model at positions len..len+T-1 and appends
 * them to the sequence. logits (host memory) receives the last position's
 * logits (vocab floats), or every position's (T x vocab) when all_logits.
 * logits may be NULL when nothing is wanted (e.g. a warm-up).
 * Errors: EXO_ERANGE (token id out of range, context full), EXO_EINVAL. */
int exo_model_forward(exo_model *m, exo_seq *s, const int32_t *tokens, int T, float *logits,
                      bool all_logits, exo_err *err);

#endif
