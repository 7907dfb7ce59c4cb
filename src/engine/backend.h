/* The compute backend interface: what the forward pass asks of a device.
 *
 * The model's forward pass (model.c) is written once against this vtable.
 * A backend owns its memory: activations, KV cache and the weights of the
 * layers assigned to it. All float pointers passed to an op are memory of
 * that backend (host memory for the CPU backend, device memory for CUDA);
 * crossing from one backend to the next copies the residual stream through
 * to_host/to_device. Each model layer is assigned to one backend (or, later,
 * to a remote node), so CPU+GPU splits and pipeline shards are the same
 * mechanism.
 *
 * Ops are synchronous from the caller's point of view on CPU; a GPU backend
 * may queue them and only synchronise in `sync` and `to_host`. Every op and
 * copy returns 0 or an EXO_E* code (a device fault, memory it could not get),
 * which the forward pass hands up unchanged; an error a queued op meets
 * surfaces at the next call that synchronises.
 *
 * Shapes: activations are row-major (T, dim) f32 with T tokens per call.
 * q is (T, n_heads, head_dim), k and v are (T, n_kv_heads, head_dim). The KV
 * cache of one layer is an exo_kv_view: runs of slots, each run of `page`
 * slots holding page * n_kv_heads * head_dim values for K and as many for
 * V (f32, or bf16 where the shape says so), laid out as the backend likes (the CPU keeps each KV head's keys in
 * blocks of EXO_KV_BLOCK positions stored transposed, so decode scores 16
 * keys per vector instruction, and its values as rows; see cpu/ops.h; the
 * GPU keeps rows by position). */
#ifndef EXO_ENGINE_BACKEND_H
#define EXO_ENGINE_BACKEND_H

#include "core/error.h"
#include "core/threadpool.h"
#include "engine/linear.h"
#include "proto/sampling.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct exo_backend exo_backend;

#define EXO_KV_BLOCK 16
#define EXO_PICK_ROWS 16 /* rows a pick call takes at most */

/* A layer's rotary embedding as an attention call may apply it itself
 * (attention_rotates): each head of q and k through its RMSNorm (q_norm,
 * k_norm: head_dim weights, or NULL for none) and then rope's rotation of
 * its first rot_dim dims at the token's position, as qk_norm_rope does. */
typedef struct exo_attn_rope {
    int rot_dim;
    const float *inv_freq; /* rot_dim / 2 values (backend memory) */
    float mscale;
    const float *q_norm, *k_norm;
    float eps;
} exo_attn_rope;

typedef struct exo_attn_shape {
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int sliding_window; /* 0 = none: attend to every earlier position */
    float scale;        /* usually 1/sqrt(head_dim) */
    /* gpt-oss: one logit per query head (backend memory, n_heads) that
     * joins every softmax's denominator and attends to nothing; NULL: none */
    const float *sinks;
    /* > 0 (sliding layers): the cache is a ring of this many positions (the
     * capacity passed, a multiple of EXO_KV_BLOCK, at least the window plus
     * the most tokens one call appends plus EXO_KV_BLOCK): position p lives in slot p % ring
     * and overwrites a key no query can see any more. 0: slot p. */
    int ring;
    /* Set only where attention_rotates says the call takes it: q and k
     * are not yet rotated, and the call rotates them on the way (q and k
     * themselves are left as they are; the cache gets the rotated key).
     * NULL: q and k come rotated. */
    const exo_attn_rope *rope;
    /* The cache's values: EXO_DTYPE_F32 (0), or EXO_DTYPE_BF16 on a backend
     * with bf16_cache (keys and values rounded to nearest even as they are
     * written; the scores and sums stay f32). */
    exo_dtype cache;
} exo_attn_shape;

/* One layer's KV cache of one sequence as the attention ops address it:
 * `capacity` slots in runs of `page` slots (multiples of EXO_KV_BLOCK), of
 * values of the shape's cache type. pages NULL: one run (page == capacity)
 * at k and v, a ring or a cache a sequence holds whole. Else a paged cache
 * (engine/kv_pool.h): slot s is slot s % page of run s / page, whose K
 * starts k_off values into pages[s / page] and V v_off values into it; page
 * is a power of two and `pages` is
 * backend memory (on a GPU the device's copy of the sequence's page table),
 * read when the op runs, so a recorded step follows the pages a sequence
 * gains. The runs a call reads or writes exist. */
typedef struct exo_kv_view {
    void *k, *v;
    void *const *pages;
    size_t k_off, v_off;
    int capacity, page;
} exo_kv_view;

/* The activation of a gated MLP: g = act(g) * u (see glu). */
typedef enum exo_glu_kind {
    EXO_GLU_SILU = 0,   /* silu(g) * u */
    EXO_GLU_GELU_TANH,  /* gelu (tanh approximation) of g, times u: Gemma */
    EXO_GLU_OAI,        /* gpt-oss: g = min(g, L), u = clamp(u, -L, L),
                           (u + 1) * g * sigmoid(1.702 g) */
} exo_glu_kind;

/* How a router turns logits into k experts and their weights. */
typedef struct exo_moe_router {
    int  n_experts, k;
    bool sigmoid;      /* false: softmax over all experts (f32), top-k of it;
                          true: sigmoid scores, top-k of score + bias (the
                          correction bias only picks; the weights are the
                          scores), first within the topk_group groups whose
                          two best biased scores sum highest */
    bool norm;         /* renormalise the k weights to sum to 1 */
    const float *bias; /* sigmoid: e_score_correction_bias (backend memory, n_experts) or NULL */
    int  n_group, topk_group;
    float scale;       /* the weights are finally multiplied by this */
} exo_moe_router;

/* Bytes that name a device group (group_new_id). */
#define EXO_GROUP_ID_BYTES 128

/* y[i] = x W[i]^T for n weights sharing x, T rows of x (exo_backend_ops). */
typedef int exo_matmul_fn(exo_backend *be, int n, const exo_linear *const *w, const float *x, int T,
                          float *const *y);

typedef struct exo_backend_ops {
    const char *name;
    void (*free)(exo_backend *be);
    /* Whether attention, attention_rows and kv_copy take caches of bf16
     * (exo_attn_shape's cache); without it every cache is f32. */
    bool bf16_cache;
    /* From how many rows of X a product (matmul and its fused kinds) may
     * give every row the bits it gets at any other such row count, called
     * on any rows of the same input (0: never): a prompt's keys and values
     * are then the same however its chunks are cut, past a chunk of fewer
     * rows. Shape-picked library kernels may break it: the model checks it
     * on its own weights before relying on it (model.h exo_model_exact_rows). */
    int  exact_rows;

    /* Memory. alloc returns zeroed memory or NULL. */
    void *(*alloc)(exo_backend *be, size_t bytes);
    void  (*release)(exo_backend *be, void *p);
    int   (*to_device)(exo_backend *be, void *dst, const void *host_src, size_t bytes);
    int   (*to_host)(exo_backend *be, void *host_dst, const void *src, size_t bytes);
    /* Optional (NULL: plain host memory will do): host memory that to_host
     * copies land in directly (a GPU's pinned memory; NULL where none is
     * left). host_free gives it back: false where p is not such memory. */
    void *(*host_alloc)(exo_backend *be, size_t bytes);
    bool  (*host_free)(exo_backend *be, void *p);

    /* Weights. load_linear makes `dev` a backend-resident view or copy of a
     * host weight. from_file: host points into a file mapping (page cache),
     * which the CPU backend copies into its own huge-page memory (streaming
     * reads are ~15% faster there, see cpu/backend_cpu.c); other host
     * memory outlives the model and the CPU backend uses it in place, or
     * a repacked copy of it (affine panels) where there is room for one.
     * load_vector returns backend memory holding n f32 values converted from
     * a host vector of type t (norm weights, biases). */
    int    (*load_linear)(exo_backend *be, const exo_linear *host, bool from_file, exo_linear *dev,
                          exo_err *err);
    float *(*load_vector)(exo_backend *be, exo_dtype t, const void *host, size_t n, exo_err *err);

    /* Ops. */
    /* out[t] = row tokens[t] of table (tokens are host memory). */
    int  (*embed)(exo_backend *be, const exo_linear *table, const int32_t *tokens, int T, float *out);
    /* out = x / rms(x) * w over rows of `dim`; out may equal x. */
    int  (*rmsnorm)(exo_backend *be, float *out, const float *x, const float *w, int rows, int dim,
                    float eps);
    /* y[i] = x W[i]^T for n weights sharing x (see cpu/matmul.h). */
    exo_matmul_fn *matmul;
    /* Optional (NULL: matmul): the same, each row of x getting the bits it
     * gets alone at any T, for the rows a prompt chunk routes to an expert,
     * whose count depends on the chunk's other rows (a model's exact_rows
     * then holds for its experts too; model.h exo_model_exact_rows). */
    exo_matmul_fn *matmul_rows;
    /* y[i] = xs[i] W[i]^T: n weights, each with its own input (same cols) */
    int  (*matmul_each)(exo_backend *be, int n, const exo_linear *const *w, const float *const *xs, int T,
                        float *const *y);
    /* y[t][j] += b[j] */
    int  (*add_bias)(exo_backend *be, float *y, const float *b, int T, int dim);
    /* Rotary embedding, rotate-half convention, in place on (T, n_heads,
     * head_dim) at positions pos0..pos0+T-1, on the first rot_dim dims of
     * each head (the rest pass through: partial RoPE). inv_freq has
     * rot_dim/2 values (backend memory); cos/sin are multiplied by mscale. */
    int  (*rope)(exo_backend *be, float *x, int T, int n_heads, int head_dim, int rot_dim, int pos0,
                 const float *inv_freq, float mscale);
    /* Appends k, v (T tokens at pos0) to the layer's cache and computes
     * causal attention of q over cache positions [0, pos0+T) (a ring's
     * capacity is shape's ring). */
    int  (*attention)(exo_backend *be, const exo_attn_shape *shape, float *out, const float *q,
                      const float *k, const float *v, const exo_kv_view *cache, int T, int pos0);
    /* Optional (NULL: one attention call a sequence): decode attention of
     * n sequences of one token each, as n attention calls with T = 1 would
     * do it (the same bits): sequence i's rows of q, k, v and out are row i,
     * its cache caches[i], a ring where rings[i] > 0 (shape's ring is not
     * used), its token at position pos[i] (the arrays are host memory). */
    int  (*attention_rows)(exo_backend *be, const exo_attn_shape *shape, int n, float *out, const float *q,
                           const float *k, const float *v, const exo_kv_view *caches, const int *rings,
                           const int *pos);
    /* Optional (NULL: never): whether attention of T tokens a sequence
     * (attention_rows: T = 1) of this shape takes shape->rope, saving the
     * qk_norm_rope call before it (the GPU's decode kernel rotates q and
     * the new key as it loads them). A backend with it has qk_norm_rope,
     * which it stands in for. */
    bool (*attention_rotates)(exo_backend *be, const exo_attn_shape *shape, int T);
    /* Copies the positions one run of a layer's cache holds in slots [0, n)
     * (K and V of shape's KV heads, values of its cache type) from a run of
     * src_capacity slots into one of dst_capacity slots (n <= both): a
     * sequence's caches changing size, a page copied before it is written. */
    int  (*kv_copy)(exo_backend *be, const exo_attn_shape *shape, void *dst_k, void *dst_v, int dst_capacity,
                    const void *src_k, const void *src_v, int src_capacity, int n);
    /* g = act(g) * u (limit: EXO_GLU_OAI's clamp) */
    int  (*glu)(exo_backend *be, exo_glu_kind kind, float *g, const float *u, size_t n, float limit);
    /* x[r][j] *= sigmoid(gate[r][j]) over rows of dim; gate_dim 1: one gate
     * per row (gate[r]) instead */
    int  (*sigmoid_mul)(exo_backend *be, float *x, const float *gate, int rows, int dim, int gate_dim);
    /* x *= s */
    int  (*scale)(exo_backend *be, float *x, float s, size_t n);
    /* x += y */
    int  (*add)(exo_backend *be, float *x, const float *y, size_t n);
    /* x = 0 */
    int  (*zero)(exo_backend *be, float *x, size_t n);

    /* Mixture of experts. moe_route: for each of T rows of router logits
     * (T, E), the router's k experts, best first, with their weights (see
     * exo_moe_router); idx and w (T * k each) are host memory, since the
     * host picks which experts' weights run. */
    int  (*moe_route)(exo_backend *be, const exo_moe_router *r, const float *logits, int T,
                      int32_t *idx, float *w);
    /* dst row i = src row rows[i], for n rows of dim floats (rows: host). */
    int  (*gather_rows)(exo_backend *be, float *dst, const float *src, const int32_t *rows, int n,
                        int dim);
    /* dst row rows[i] += scale[i] * src row i (rows, scale: host). */
    int  (*scatter_add_rows)(exo_backend *be, float *dst, const float *src, const int32_t *rows,
                             const float *scale, int n, int dim);
    /* Gated DeltaNet linear attention (qwen3_next, qwen3_5), one layer's
     * pieces; the layer's state lives in the sequence (backend memory).
     * conv1d_silu: causal depthwise conv of T rows of C channels (x, row
     * stride x_stride) with taps w (C, K), continuing from state (K-1, C),
     * then SiLU, into out (row stride out_stride); state keeps the last K-1
     * inputs. gated_delta: the delta rule over T tokens (q, k: Hk heads of
     * Dk at row stride qk_stride; v: Hv heads of Dv at v_stride; a, b: Hv
     * gate inputs at ab_stride), from and into S (Hv, Dk, Dv); out is
     * (T, Hv*Dv). rmsnorm_gated: x = rmsnorm(x per head of dim) * w *
     * silu(z) (z rows at z_stride). */
    int  (*conv1d_silu)(exo_backend *be, float *out, int out_stride, const float *x, int x_stride,
                        const float *w, float *state, int T, int C, int K);
    int  (*gated_delta)(exo_backend *be, float *out, const float *q, const float *k, int qk_stride,
                        const float *v, int v_stride, const float *a, const float *b, int ab_stride,
                        const float *A_log, const float *dt_bias, float *S, int T, int Hk, int Hv,
                        int Dk, int Dv);
    int  (*rmsnorm_gated)(exo_backend *be, float *x, const float *z, int z_stride, const float *w,
                          int T, int n_heads, int dim, float eps);
    /* dst row r = src row r's first cols floats, for rows of strides
     * dst_ld / src_ld (assembling heads out of parts) */
    int  (*copy2d)(exo_backend *be, float *dst, size_t dst_ld, const float *src, size_t src_ld,
                   int rows, int cols);
    /* A different weight per head (latent attention's absorbed
     * projections): for tokens t < T and heads h < H,
     * y[t*y_tok + h*y_head ..] = w[h] x[t*x_tok + h*x_head ..]. */
    int  (*head_matmul)(exo_backend *be, int H, const exo_linear *w, const float *x, size_t x_head,
                        size_t x_tok, float *y, size_t y_head, size_t y_tok, int T);
    /* Waits for queued work. */
    int  (*sync)(exo_backend *be);

    /* Decode steps replayed as a unit (optional: NULL where a backend
     * launches nothing, as the CPU's). The caller brackets the ops of one
     * step of T tokens at pos0 with step_begin and step_end. key names what
     * the step touches: equal keys promise the same ops on the same memory,
     * apart from the token ids and the position, which the replay takes
     * anew. step_begin returns 1 when it ran a recorded step with this key
     * (the caller issues no ops and calls no step_end), 0 when the caller
     * issues them (the backend may be recording them), or an error. After
     * issuing them, step_end returns 0, 1 when the recording could not be
     * kept and nothing ran (the caller issues the ops again, unrecorded;
     * the return codes of those issued while recording are moot), or an
     * error. Inside a step no op may read or write host memory. */
    int  (*step_begin)(exo_backend *be, uint64_t key, const int32_t *tokens, int T, int pos0);
    int  (*step_end)(exo_backend *be);

    /* Optional (NULL: a tensor-parallel group's partial sums go through
     * the host's ring): the sums added among the ranks' devices themselves
     * (NCCL). EXO_GROUP_ID_BYTES name one group: group_new_id makes a name
     * (id NULL: only says whether this backend can join groups at all, a
     * library that loads); one rank's name reaches the others over the
     * ring.
     * group_join makes this backend rank `rank` of `world` in it, waiting
     * at most timeout_ms for the others; then group_allreduce sums n
     * floats of x in place across the ranks, queued like any op, until
     * group_leave (or free). */
    int  (*group_new_id)(exo_backend *be, uint8_t id[EXO_GROUP_ID_BYTES], exo_err *err);
    int  (*group_join)(exo_backend *be, const uint8_t id[EXO_GROUP_ID_BYTES], int world, int rank,
                       int timeout_ms, exo_err *err);
    int  (*group_allreduce)(exo_backend *be, float *x, size_t n);
    void (*group_leave)(exo_backend *be);

    /* Optional (NULL: the caller runs rmsnorm, matmul and add): y[i] =
     * x' W[i]^T for n weights sharing x, x' = x / rms(x) * norm over rows
     * of the weights' width when norm is not NULL (eps as in rmsnorm), else
     * x; accumulate adds the products to y instead of storing them. For a
     * backend that can fold the norm into its pass over x and the residual
     * add into its last write of y: two kernels and two trips through
     * memory fewer a product. */
    int  (*matmul_fused)(exo_backend *be, int n, const exo_linear *const *w, const float *x, const float *norm,
                         float eps, bool accumulate, int T, float *const *y);

    /* Optional (NULL: the caller runs glu, then matmul_each or
     * matmul_fused): y[i] = (act(g[i]) * u[i]) W[i]^T for n weights of one
     * width, g[i] and u[i] (T, cols), as glu's kind and limit; accumulate
     * adds to y. Each g[i] may be left as glu leaves it or untouched. For
     * a backend that can apply the activation as it reads the product's
     * input: a kernel and a trip through memory fewer (a dense MLP's down
     * projection; every expert's of a sparse one, in one call). */
    int  (*matmul_glu)(exo_backend *be, int n, const exo_linear *const *w, exo_glu_kind kind, float *const *g,
                       const float *const *u, float limit, bool accumulate, int T, float *const *y);

    /* Optional (NULL: nothing to do): a hint that the products queued
     * after the ops to come will read these n weights. A backend with a
     * cache that holds them all may start reading them in now, beside the
     * queued ops, so that memory works while those ops wait on each other.
     * Never changes a result; may be called inside a step. Returns 1 when
     * it started reading them, 0 when it did not, or an error. */
    int  (*prefetch)(exo_backend *be, int n, const exo_linear *const *w);

    /* Optional (NULL: the caller copies x to the host and picks there): for
     * each of rows (1..EXO_PICK_ROWS) consecutive rows of n logits, the
     * token its rule picks (proto/sampling.h: penalties, then the largest,
     * the lowest index on ties, NaN never winning; or a draw with the
     * rule's u from softmax(x / temperature) over what its filters keep)
     * and its log-softmax, x[id] - log(sum exp x) of the penalized x, and
     * the alternatives the rule asks for, into out (host memory); not
     * picked where the rule cannot be decided there (top-p reaching past
     * EXO_PICK_TOP_K tokens): that row's logits go to the host. x is
     * changed during the call and as it came after. A row's answer is the
     * same whatever rows are beside it. Decoding then takes token ids, not
     * the vocabulary's logits, off the device. EXO_EINVAL: a rule past
     * EXO_PICK_TOP_K, EXO_PICK_PENALIZED or EXO_MAX_TOP_LOGPROBS. */
    int  (*pick)(exo_backend *be, float *x, int rows, int n, const exo_pick_rule *rules, exo_pick *out);

    /* Optional (NULL: decode routes on the host through moe_route): the
     * router's choice made and used on the device, so a mixture-of-experts
     * decode step never waits for the host and can be recorded.
     * moe_pick_table returns backend memory naming every expert's weights
     * (experts: 3 per expert, gate, up and down, as moe_route's users index
     * them) for exo_linear.pick_table: part p's table starts at entry
     * 3 * n_experts * p. NULL with EXO_EUNSUPPORTED where the backend's
     * products cannot take such weights; release frees it. moe_pick is
     * moe_route with idx and w (T * k each) left in backend memory, each
     * token's k in increasing expert order (the order decode sums them).
     * Decode of T tokens keeps the rows of slot j (or of a plain output)
     * together: slot j's row for token t is row j * T + t ("slot-major").
     * add_weighted_rows: dst row t (T rows of dim) += src rows p * T + t
     * for p < n_plain unweighted, then w[t * n + i] * src row
     * (n_plain + i) * T + t for i < n, added in that order (w: backend
     * memory). */
    void *(*moe_pick_table)(exo_backend *be, const exo_linear *experts, int n_experts, exo_err *err);
    int  (*moe_pick)(exo_backend *be, const exo_moe_router *r, const float *logits, int T, int32_t *idx,
                     float *w);
    int  (*add_weighted_rows)(exo_backend *be, float *dst, const float *src, const float *w, int T, int n,
                              int n_plain, int dim);
    /* Optional with the three above (NULL: experts with biases route on the
     * host): row j * T + t of y (k * T rows of dim, slot-major) += bias +
     * idx[t * k + j] * stride, the bias of the expert moe_pick chose for
     * token t's slot j (idx, bias: backend memory), as add_bias adds it. */
    int  (*add_picked_bias)(exo_backend *be, float *y, const float *bias, size_t stride, const int32_t *idx, int T,
                            int k, int dim);

    /* Optional (NULL: the caller runs rmsnorm and rope on each): q's
     * n_q heads and k's n_k heads, T tokens each, through their per-head
     * RMSNorm (q_norm, k_norm: head_dim weights, or NULL for none) and
     * then rope's rotation, in one pass. */
    int  (*qk_norm_rope)(exo_backend *be, float *q, float *k, int T, int n_q, int n_k, int head_dim, int rot_dim,
                         int pos0, const float *inv_freq, float mscale, const float *q_norm, const float *k_norm,
                         float eps);

    /* Optional (NULL: qk_norm_rope a sequence): qk_norm_rope of n rows of
     * q (n_q heads) and k (n_k heads), row i at position pos[i] (host
     * memory): the decode rows of several sequences in one call, each as
     * qk_norm_rope would rotate it alone. */
    int  (*qk_norm_rope_rows)(exo_backend *be, float *q, float *k, int n, int n_q, int n_k, int head_dim, int rot_dim,
                              const int *pos, const float *inv_freq, float mscale, const float *q_norm,
                              const float *k_norm, float eps);
} exo_backend_ops;

struct exo_backend {
    const exo_backend_ops *ops;
};

/* The CPU backend: n_threads <= 0 uses every online CPU. */
exo_backend *exo_backend_cpu_create(int n_threads, exo_err *err);
/* Its threads, idle between its ops (exo_model_host_pool). */
exo_pool *exo_backend_cpu_pool(exo_backend *cpu);

/* The CUDA backend on GPU `device` (cuda/plugin.c): NULL, with
 * EXO_EUNSUPPORTED and why, where the plugin (libexo_cuda.so, built when
 * nvcc is there), the driver or the device is missing. */
exo_backend *exo_backend_cuda_create(int device, exo_err *err);
/* GPUs the CUDA backend can use (0 where it cannot load), and one's free
 * and total memory in bytes (0, or EXO_EUNSUPPORTED / EXO_EINVAL). */
int exo_backend_cuda_devices(void);
int exo_backend_cuda_memory(int device, size_t *free_bytes, size_t *total_bytes, exo_err *err);
/* The physical limit of a memory-bound kernel on that GPU, measured now:
 * bytes read plus written per second by a 2 GiB device-to-device copy
 * (best of several); 0 where it cannot be measured. */
double exo_backend_cuda_copy_bandwidth(int device);

#endif
