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
 * head_dim), qwen3_moe, qwen3_next / qwen3_5 / qwen3_5_moe (Gated DeltaNet),
 * gemma3, gpt_oss, glm4_moe, deepseek_v3 / kimi_k2 (latent attention).
 * Weights: F32/F16/BF16, MLX affine 2..8-bit per module as the
 * checkpoint's quantization block says, or MXFP4.
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
#include "core/threadpool.h"
#include "engine/config.h"
#include "engine/linear.h"
#include "proto/sampling.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct exo_model exo_model;
typedef struct exo_seq exo_seq;

/* Collective of a tensor-parallel group: x (rows x cols floats of host
 * memory, a row a token; a GPU rank's partial sums are copied out and back
 * around it) becomes the element-wise sum of every rank's x, the same bits
 * on every rank, and a row's bits must not depend on the rows beside it (a
 * batched step's rows get what they get alone). Returns 0 or an EXO_E*
 * code (a peer gone, a timeout), which the forward pass returns unchanged. */
typedef int (*exo_allreduce_fn)(void *ctx, float *x, size_t rows, size_t cols, exo_err *err);
/* Rank r holds x[bounds[r] .. bounds[r+1]) (host memory); afterwards
 * every rank holds all of x (bounds: tp_size + 1 entries). */
typedef int (*exo_allgather_fn)(void *ctx, float *x, const size_t *bounds, exo_err *err);

typedef struct exo_model_opts {
    int n_threads;   /* CPU threads; <= 0: all online CPUs */
    /* Where layers run: "cpu", "cuda" (GPU 0), "cuda:N", or NULL / "auto"
     * ($EXO_DEVICE, else a GPU when the CUDA backend finds one). On a GPU,
     * gpu_layers (or $EXO_GPU_LAYERS) layers from the first go there, 0:
     * as many as fit its memory; the rest, and everything when it is < 0,
     * run on the CPU, the residual stream crossing over once. */
    const char *device;
    int gpu_layers;
    int max_chunk;   /* tokens per forward step of a long prompt; <= 0: 512 */
    /* The shard this process holds; zeroes: the whole model.
     * Pipeline: layers [start_layer, end_layer) (end 0 = the last layer);
     * the first shard (start 0) embeds tokens, the last one holds the final
     * norm and LM head; the others take and return hidden states.
     * Tensor parallel: rank tp_rank of tp_size holds the attention heads,
     * MLP columns and LM-head rows (vocabulary) exo_tp_share gives it; the
     * collectives sum the partial products and gather the logits, which
     * every rank then has. A rank's layers go on its device as above. */
    int start_layer, end_layer;
    int tp_rank, tp_size;
    exo_allreduce_fn tp_allreduce;
    exo_allgather_fn tp_allgather;
    void *tp_ctx;
    /* Called after each layer's weights are bound (and, from a checkpoint,
     * read into the backend's memory): progress of a load. */
    void (*on_layer)(void *ctx, int layers_bound, int layers_total);
    void *on_layer_ctx;
} exo_model_opts;

/* Which part of [0, total) rank r of n holds under tensor parallelism:
 * units of `unit` (a KV head's query group, a quantization group of MLP
 * columns) dealt out as evenly as they go, the first ranks taking one more.
 * EXO_EINVAL when total is not a multiple of unit or there are fewer
 * units than ranks. */
int exo_tp_share(int64_t total, int64_t unit, int r, int n, int64_t *lo, int64_t *hi,
                 exo_err *err);

int  exo_model_load(const char *dir, const exo_model_opts *opts, exo_model **out, exo_err *err);
void exo_model_free(exo_model *m);

const exo_model_config *exo_model_get_config(const exo_model *m);
int     exo_model_vocab(const exo_model *m);
/* What one decode step of this shard reads and computes, at a context of
 * ctx positions: the weights' bytes and parameters (a sparse layer: the
 * router, the shared experts and, on average, k experts' share), the LM
 * head's part of them, and the caches' bytes (K and V of every position a
 * layer attends to; a linear-attention layer's state, read and written).
 * prompt_attn_dims: the sum over softmax-attention layers of the query
 * dims scoring each key (for prefill's quadratic FLOPs). kv_layers: the
 * softmax-attention layers, kv_bf16_layers: those whose KV cache is bf16
 * (EXO_KV_CACHE). */
typedef struct exo_decode_cost {
    double weight_bytes, head_bytes;
    double params, head_params;
    double cache_bytes;
    double prompt_attn_dims;
    int    layers;
    int    kv_layers, kv_bf16_layers;
} exo_decode_cost;

void exo_model_decode_cost(const exo_model *m, int ctx, exo_decode_cost *out);

/* Decode a mixture-of-experts layer fused (the default, six dispatches)
 * or expert by expert as prefill does (the benchmark's peer; also
 * EXO_MOE_PATH=per-expert). */
void exo_model_set_moe_fused(exo_model *m, bool fused);

/* What a model keeps free on a GPU of total_bytes for its caches and
 * activations (the LM head apart) when it decides how many layers fit:
 * placement counts a GPU's memory less this too. */
size_t exo_model_gpu_reserve(size_t total_bytes);

/* Layers of this shard on the GPU (0: all on the CPU), and which GPU
 * (its CUDA index; -1: none). */
int exo_model_gpu_layers(const exo_model *m);
int exo_model_gpu_device(const exo_model *m);
/* Tensor parallel: whether this rank's partial sums run among the group's
 * GPUs (backend.h group_*; decided at the first sum), not through the
 * host's ring. */
bool exo_model_sums_on_gpus(const exo_model *m);
/* Decode steps run from a recording (backend.h step_begin) so far. */
long exo_model_replayed_steps(const exo_model *m);
/* Weights' prefetches the backend started (backend.h prefetch) in the ops
 * issued so far (a replayed recording issues none). */
long exo_model_prefetches(const exo_model *m);

/* The fewest rows from which a prompt chunk's keys, values and logits do
 * not depend on where chunks begin or end: computing a prompt in chunks of
 * at least this many rows (each up to 256) gives every position the bits
 * it gets in any other such chunking, so a computed prefix can be taken
 * up to any position. 0: no such count (a GPU's library kernels picked by
 * shape, experts on a backend without products that give a row its bits at
 * any count (backend.h matmul_rows: an expert's rows depend on the chunk's
 * other rows), recurrent states stepped chunk by chunk, latent attention's
 * small chunks, a tensor-parallel group). Where the backend promises it
 * (backend.h exact_rows), the first call checks it on this model's own
 * weights at several row counts and offsets. */
int exo_model_exact_rows(exo_model *m);

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
    /* Slab `index` of a stacked 3-D module [n, rows, cols] (mlx-lm keeps a
     * layer's experts so: mlp.switch_mlp.gate_proj); 0, or EXO_ENOENT.
     * NULL: the source has no stacked modules. */
    int (*stacked)(void *ctx, const char *module, int64_t index, exo_linear *out);
    /* The family applies its RMSNorms as (1 + w) (qwen3_next, qwen3_5,
     * gemma3) but the norm vectors already hold 1 + w (mlx-lm's copies of
     * the Qwen hybrids add the 1 when converting). */
    bool norms_hold_offset;
} exo_weight_source;

int exo_model_build(const exo_model_config *cfg, const exo_weight_source *src,
                    const exo_model_opts *opts, exo_model **out, exo_err *err);

int  exo_seq_create(exo_model *m, int capacity, exo_seq **out, exo_err *err);
void exo_seq_free(exo_seq *s);
/* Gives s caches of `capacity` positions (at least its length), its
 * positions and state moved into them: a sequence holds the memory its
 * request needs, not a whole context. On an error s is as it was. */
int  exo_seq_resize(exo_seq *s, int capacity, exo_err *err);
/* Makes dst hold the first n positions of src (a prompt prefix another
 * request computed), as if dst had computed them: dst's positions and state
 * go. Whole pages of the prefix are shared, not copied. EXO_EUNSUPPORTED (nothing changed) where src cannot give them: a
 * recurrent state is kept only where its last step of several tokens
 * began, and a prefix that wraps a sliding layer's ring (in either) is not
 * copied; EXO_EINVAL for n past src's length or dst's capacity. */
int  exo_seq_copy_prefix(exo_seq *dst, exo_seq *src, int n, exo_err *err);
/* A prompt prefix kept apart from any sequence (a prefix cache): the
 * pages of a sequence's first n positions (the last may be part full:
 * whichever sharer writes into it copies it first), shared, held until
 * freed, and copies of what the sequence holds itself there (sliding
 * layers' rings, recurrent states at n), counted in exo_model_kv_bytes.
 * keep: n at most s's length; EXO_EUNSUPPORTED where s cannot go back to n
 * (exo_seq_can_return: a ring that no longer holds n's window, a
 * recurrent state without a snapshot at n). can_take: whether n
 * positions of p can be taken (a recurrent state only at p's length).
 * take: dst holds the first n positions of p (at most p's and dst's
 * capacity), as if it had computed them; its own
 * positions go; EXO_EUNSUPPORTED (dst unchanged) where p cannot give n or
 * a ring does not fit dst's. */
typedef struct exo_kv_prefix exo_kv_prefix;
int  exo_seq_keep_prefix(exo_seq *s, int n, exo_kv_prefix **out, exo_err *err);
int  exo_seq_take_prefix(exo_seq *dst, const exo_kv_prefix *p, int n, exo_err *err);
bool exo_kv_prefix_can_take(const exo_kv_prefix *p, int n);
int  exo_kv_prefix_len(const exo_kv_prefix *p);
void exo_kv_prefix_free(exo_kv_prefix *p);
/* Bytes of caches and state a sequence of `capacity` positions holds, on
 * every backend together; and those s holds. */
size_t exo_model_seq_bytes(const exo_model *m, int capacity);
size_t exo_seq_bytes(const exo_seq *s);
/* Bytes of caches the model's sequences hold or may still take, together:
 * their own (rings, recurrent states), the pages in use (a page several
 * sequences share counted once) and a page for every run of positions
 * their capacities reserve that has none yet. exo_seq_bytes(s) counts what
 * s would hold alone; this is what all of them do. */
size_t exo_model_kv_bytes(const exo_model *m);
/* Bytes of the pages a prefix of n positions copied from another sequence
 * shares with it rather than holds (its whole pages). */
size_t exo_model_shared_prefix_bytes(const exo_model *m, int n);
/* The paged KV cache: full-attention layers keep their caches in pages of
 * page_positions positions (every such layer's K and V), which sequences
 * take as they grow, give back as they shrink, and share where one copies
 * another's prefix (exo_seq_copy_prefix): a page a sequence is about to
 * write while another holds it is copied first. All zero: no paged layer. */
typedef struct exo_kv_page_stats {
    int    page_positions;
    size_t page_bytes;
    int    in_use;      /* pages some sequence holds */
    int    made;        /* pages the pool has memory for */
    long   empty_runs;  /* runs sequences reserve without a page yet */
} exo_kv_page_stats;
void exo_model_kv_pages(const exo_model *m, exo_kv_page_stats *st);
int  exo_seq_len(const exo_seq *s);
int  exo_seq_capacity(const exo_seq *s);
/* Forgets positions >= n (n <= len): the next forward continues from n. */
void exo_seq_truncate(exo_seq *s, int n);
/* Whether s can go back to n (< len) with every cache as it was there: not
 * where a recurrent state would be lost (it goes back to 0, and to where
 * the last step of several tokens began, whose state is kept), nor where a
 * sliding layer's ring has overwritten positions the next ones attend to.
 * n >= len: true. */
bool exo_seq_can_return(const exo_seq *s, int n);

/* What one forward step of a shard takes and gives (host memory).
 * Input: `tokens` when the shard starts at layer 0, else `hidden_in`
 * (T x hidden_size f32, the previous shard's output). Output: `hidden_out`
 * (T x hidden_size, for the next shard) and/or `logits` (last shard: the
 * last position's vocab floats, or T x vocab with all_logits); either may
 * be NULL (a warm-up, or a prompt chunk whose logits nobody needs). */
typedef struct exo_step {
    int            T;
    const int32_t *tokens;
    const float   *hidden_in;
    float         *hidden_out;
    float         *logits;
    bool           all_logits;
    /* pick (NULL: none): the caller's sampler picks by this rule
     * (exo_sampler_pick_rule). Where the backend picks in place (backend.h
     * pick), token is that pick and logits is left alone; else
     * token.picked is false and the logits are written as usual. */
    const exo_pick_rule *pick;
    exo_pick             token;
} exo_step;

typedef struct exo_shard_info {
    int  start_layer, end_layer, n_layers; /* [start, end) of n */
    int  hidden_size;
    bool embeds;   /* takes tokens */
    bool has_head; /* gives logits */
} exo_shard_info;

exo_shard_info exo_model_shard(const exo_model *m);

/* Runs T positions through this shard's layers at positions
 * len..len+T-1 of s and appends them to s's cache. Errors: EXO_ERANGE
 * (token id out of range, context full), EXO_EINVAL (an input or output
 * the shard cannot take or give), or what an op or the collective
 * returned (the sequence keeps its length then). */
int exo_model_step(exo_model *m, exo_seq *s, exo_step *step, exo_err *err);

/* One sequence's part of a batched step: T tokens (host memory) appended
 * at its end. pick: as exo_step's (see exo_pick). */
typedef struct exo_batch_item {
    exo_seq             *seq;
    const int32_t       *tokens;
    int                  T;
    const exo_pick_rule *pick;
} exo_batch_item;

/* An item's token picked by its rule where its logits are (backend.h
 * pick; proto/sampling.h exo_pick), as exo_step's token: then its logits
 * row is left alone. Not picked: its logits
 * are written as usual. */

/* Several sequences through a whole model in one pass: every weight is
 * read once for all their rows, so decoding B sequences costs about one
 * sequence's weight traffic, not B. Each item's last position's logits go
 * to logits + i * vocab (NULL: none wanted). The items' rows together are
 * at most exo_model_max_batch_rows; each sequence appears once. Errors as
 * exo_model_step's (and EXO_EUNSUPPORTED for a pipeline shard, which
 * exo_model_step_batch_shard takes); picks (NULL: none) gets n answers
 * for the items with a pick rule;
 * after one, every sequence is back at its length before the call. An
 * item's logits are those exo_model_step would give it alone up to the
 * rounding of products that take another kernel at more rows. */
int exo_model_step_batch(exo_model *m, const exo_batch_item *items, int n, float *logits, exo_pick *picks,
                         exo_err *err);
/* The same through a pipeline shard: its input is the items' tokens where
 * it embeds, else hidden_in (their rows in item order, each hidden_size
 * f32; items' tokens unused); hidden_out (NULL: not wanted) gets the rows'
 * output in the same order, for the next shard; logits only on the last
 * shard. A row gets the bits exo_model_step gives it alone, as above. */
int exo_model_step_batch_shard(exo_model *m, const exo_batch_item *items, int n, const float *hidden_in,
                               float *hidden_out, float *logits, exo_pick *picks, exo_err *err);
int exo_model_max_batch_rows(const exo_model *m);
/* Host memory for `rows` rows of logits (exo_model_step_batch's), where a
 * GPU's copies of the head's logits land directly (no staging copy: 8 MB
 * a step at 16 rows of a 128k vocabulary), else plain memory (aborts when
 * there is none, as exo_malloc). Given back with exo_model_logits_free,
 * before the model is freed. */
float *exo_model_logits_alloc(exo_model *m, int rows);
void   exo_model_logits_free(exo_model *m, float *logits);
/* The threads the model computes with on the CPU. Between its calls they
 * idle: the thread that calls the model may run its own work on them
 * (sampling a batched step's rows; a model on a GPU leaves them all idle). */
exo_pool *exo_model_host_pool(exo_model *m);

/* A whole model's step: tokens in, logits out (see exo_model_step).
 * logits may be NULL when nothing is wanted (e.g. a warm-up). */
int exo_model_forward(exo_model *m, exo_seq *s, const int32_t *tokens, int T, float *logits,
                      bool all_logits, exo_err *err);

#endif
