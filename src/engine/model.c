/* Model loading and the forward pass (see model.h).
 *
 * Loading binds every tensor the architecture needs to an exo_linear or a
 * vector through an exo_weight_source (a checkpoint, or in-memory synthetic
 * weights), checks every shape against the config, and hands each layer's
 * weights to the backend that layer is assigned to.
 *
 * The forward pass is llama2.c's, written against the backend vtable:
 *   x = embed(tokens)
 *   per layer: h = rmsnorm(x); q,k,v = h Wq,Wk,Wv (+bias); [q,k = rmsnorm per
 *              head]; rope(q,k); a = attention(q, cache+k, cache+v);
 *              x += a Wo; h = rmsnorm(x); x += (silu(h Wg) * h Wu) Wd
 *   logits = rmsnorm(x) Wlm
 * The families (the table `families`) differ in a few switches on that
 * skeleton, not in code paths of their own: (1 + w) norms (folded into the
 * vectors at load), q/k norms, a sigmoid output gate per head, sandwich
 * norms, sinks, partial RoPE, the gated activation (SiLU, tanh GELU,
 * gpt-oss's clamp). Per layer, the token mixer is softmax attention (full,
 * or a sliding window whose cache is a ring), Gated DeltaNet (linear
 * attention: a causal conv and a recurrent state that live in the
 * sequence), or latent attention (deepseek_v3, absorbed: the cache holds
 * one latent key per position).
 * A mixture-of-experts MLP replaces the dense one: the router picks k
 * experts per token (softmax or sigmoid with groups, renormalised, scaled),
 * each expert runs the gated MLP over the tokens routed to it (gathered
 * into contiguous rows, so prefill is a GEMM per expert), shared experts run
 * on every token, and the outputs are added into the residual by their
 * weights. Decode reads only the chosen experts' weights, in six
 * dispatches (moe_decode).
 * Checkpoint layouts differ more than the math: the hub's, transformers 5's
 * fused and transposed tensors and mlx-lm's stacked ones are all taken,
 * with interleaved rows (q and its gate, gpt-oss's gate and up, Qwen3-Next's
 * per-key-head groups) gathered apart at load.
 * Long prompts are processed in chunks of max_chunk tokens so activation
 * buffers stay bounded; nothing is allocated per token.
 *
 * Shards: a pipeline shard binds only its layer range (plus the embedding
 * on the first, the final norm and head on the last) and takes / gives
 * hidden states at its edges. A tensor-parallel rank binds its KV heads'
 * rows of q/k/v and columns of o, and its share of the MLP's gate/up rows
 * and down columns; the partial sums after o and after down are
 * all-reduced (the rank's collective), then the bias and residual follow,
 * so every rank carries the same residual stream. Row slices point into
 * the checkpoint; column slices are gathered into a buffer first. */
#include "engine/model.h"
#include "core/alloc.h"
#include "core/log.h"
#include "engine/backend.h"
#include "engine/kv_pool.h"
#include "engine/quant.h"
#include "engine/rope.h"
#include "engine/router.h"
#include "engine/safetensors.h"
#include "proto/shard.h"
#include "proto/types.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LOGIT_ROWS EXO_PICK_ROWS /* LM-head rows computed at once: a pick call takes as many */
#define EXO_MAX_TP     256

typedef struct layer {
    exo_backend *be;
    exo_layer_kind kind;
    exo_attn_shape attn;         /* softmax attention layers: window, sinks */
    const float *inv_freq;       /* its RoPE table (acts: global or local) */
    float mscale;
    float *attn_norm, *mlp_norm; /* (dim) */
    float *post_attn_norm, *post_mlp_norm; /* gemma3's sandwich norms, else NULL */
    float *q_norm, *k_norm;      /* (head_dim) qwen3 and later, gemma3, glm4, else NULL */
    float *bq, *bk, *bv, *bo;    /* (out) biases or NULL */
    float *sinks;                /* (n_heads) gpt-oss, else NULL */
    exo_linear q, k, v, o;       /* (n_heads*hd, dim) (n_kv*hd, dim) x2, (dim, n_heads*hd) */
    exo_linear q_gate;           /* gated attention (qwen3_next, qwen3_5): (n_heads*hd, dim) */
    /* Gated DeltaNet (kind EXO_LAYER_LINEAR) */
    exo_linear in_qkv, in_z, in_b, in_a, out_proj; /* (conv_dim, dim) (vd, dim) (Hv, dim) x2 (dim, vd) */
    float *conv_w;               /* (conv_dim, K) */
    float *A_log, *dt_bias;      /* (Hv) */
    float *lin_norm;             /* (Dv) */
    /* Multi-head latent attention (deepseek_v3): q through a low-rank
     * q_a/q_b (or q alone), each head's rows [rope | nope]; kv_a's rows as
     * the latent (kv_c) and the shared rope key (kv_rope); per head, the
     * absorbed W_UK^T (r, dn) and W_UV (dv, r). */
    exo_linear q_a, kv_c, kv_rope;
    float *q_a_norm, *kv_a_norm;
    exo_linear *absorb, *unabsorb;
    exo_linear gate, up, down;   /* (ffn, dim) x2, (dim, ffn); dense MLP */
    int n_experts;               /* > 0: a mixture-of-experts MLP instead */
    exo_linear router;           /* (n_experts, dim) */
    float *router_bias;          /* gpt-oss: added to the logits */
    float *e_score_bias;         /* glm4_moe, deepseek: picks experts, not weighs them */
    exo_linear *experts;         /* 3 per expert: gate, up (moe_ffn, dim), down (dim, moe_ffn) */
    float *expert_bias;          /* gpt-oss: per expert gate (moe_ffn), up (moe_ffn), down (dim) */
    void *pick_table;            /* backend.h moe_pick_table: decode picks experts on the device */
    bool has_shared;             /* shared expert(s) on every token */
    exo_linear sh_gate, sh_up, sh_down;
    exo_linear sh_router;        /* (1, dim) its sigmoid gate (qwen3_next); rows 0: ungated */
} layer;

/* Activation buffers of one backend, each sized for max_chunk tokens. */
typedef struct acts {
    exo_backend *be;
    float *x, *h;     /* (chunk, dim) */
    float *q, *att;   /* (chunk, max(n_heads*hd, linear value dim)) */
    float *qg;        /* (chunk, n_heads*hd): gated attention's gate */
    float *k, *v;     /* (chunk, n_kv*hd) */
    float *g, *u;     /* (chunk, max(ffn, moe_ffn, shared ffn)) */
    float *logits;    /* (MAX_LOGIT_ROWS, vocab), when the shard has the head */
    float *inv_freq;  /* (rot/2) */
    float *inv_freq_local; /* (rot/2) gemma3's sliding layers */
    /* Gated DeltaNet */
    float *lqkv, *lconv; /* (chunk, conv_dim): projections, and after the conv */
    float *lz;        /* (chunk, value dim) */
    float *la, *lb;   /* (chunk, Hv) */
    float *sg;        /* (chunk): the shared expert's gate */
    /* latent attention */
    float *mq;        /* (chunk, q_lora_rank) */
    float *mc, *mr;   /* (chunk, kv_lora_rank), (chunk, rope dims) */
    float *mqa;       /* (chunk, n_heads * (rope + latent)): absorbed queries */
    /* mixture of experts, when the shard has such layers */
    float *router;    /* (chunk, n_experts) */
    float *xe, *ye;   /* (chunk, dim): one expert's gathered inputs and outputs */
    float *moe_out;   /* (chunk, dim): tensor parallel: this rank's partial sum */
    int32_t *top_idx; /* host (chunk, topk) */
    float *top_w;
    int32_t *pick_idx; /* backend memory (chunk, topk): experts chosen on the device */
    float *pick_w;
    exo_linear *picked; /* host (3 topk): weights naming pick_idx's slots (moe_decode_picked) */
    int32_t *rows;    /* host (chunk): the tokens routed to one expert, and weights */
    float *row_w;
    const exo_linear **sel_w; /* host (2 topk + 1): decode's chosen experts' weights */
    const float **sel_x;      /* host (topk + 1): the down projections' inputs (host route) */
    float **sel_g;            /* host (topk + 1): the down projections' gate rows and */
    const float **sel_u;      /* their up rows (the device route: matmul_glu) */
    float **sel_y;
} acts;

struct exo_model {
    exo_model_config cfg;
    bool owns_cfg;
    exo_st *st;
    exo_backend *cpu;
    exo_backend *gpu;  /* NULL: every layer on the CPU */
    int gpu_layers;    /* the first gpu_layers layers run on the GPU, the rest on the CPU */
    int gpu_device;    /* the GPU's CUDA index, -1: none */
    float *bounce;     /* host copy of the residual stream where it crosses backends */
    int n_layers;      /* this shard's layers: global indices first_layer.. */
    int first_layer, total_layers;
    int dim, n_heads, n_kv, hd, ffn, vocab, max_chunk; /* n_heads, n_kv, ffn: this rank's */
    int rot_dim;       /* dims of a head that RoPE rotates */
    int n_experts, topk, moe_ffn; /* 0 when no layer of the shard is sparse */
    int sh_ffn;        /* the shared experts' width (this rank's), 0: none */
    exo_moe_router router;
    exo_glu_kind glu;
    float glu_limit;
    float embed_scale; /* gemma3: sqrt(dim); else 1 */
    bool attn_gated;   /* qwen3_next, qwen3_5: q_proj also gives a sigmoid output gate */
    /* latent attention (mla): q/k dims without and with RoPE, v dims, latent
     * rank, q rank; hd is then rope + latent, the width of a cached key */
    bool mla;
    int mla_dn, mla_dr, mla_dv, mla_r, mla_rq;
    /* Gated DeltaNet: this rank's heads; n_linear: the shard's linear layers */
    int lin_hk, lin_hv, lin_dk, lin_dv, lin_k, conv_dim, n_linear;
    bool moe_per_expert; /* EXO_MOE_PATH=per-expert: decode as prefill does (the benchmark's peer) */
    bool moe_host_route; /* EXO_MOE_PATH=host-route: decode routes on the host even where the
                            backend could pick experts on the device (a peer to measure against) */
    bool moe_picked;     /* every sparse layer has a pick_table: decode needs no host routing */
    float mscale, eps;
    exo_attn_shape attn;
    bool embeds, has_head;
    exo_allreduce_fn allreduce; /* tensor parallel, else NULL */
    exo_allgather_fn allgather;
    void *allreduce_ctx;
    size_t vocab_bounds[EXO_MAX_TP + 1]; /* tensor parallel: each rank's LM-head rows */
    int tp_rank, tp_size;
    int group; /* tensor parallel: 0 undecided, 1 sums among the GPUs (decide_group), -1 on the host */
    exo_linear embed;   /* on the first layer's backend (first shard) */
    exo_linear lm_head; /* on the last layer's backend (last shard) */
    float *final_norm;
    layer *layers;
    void **owned;       /* gathered column slices the backend kept using in place */
    size_t n_owned;
    acts act;           /* the CPU's activations */
    acts gpu_act;       /* the GPU's */
    int exact_rows;      /* exo_model_exact_rows, once exact_checked */
    bool exact_checked;
    long replayed_steps; /* decode steps run from a recording */
    long prefetches;     /* backend prefetches started (issued ops; a replay issues none) */
    /* The paged KV cache (kv_pool.h): full-attention layers keep their
     * caches in pages, on page_be[b] for the layers there; layer l's K and
     * V start page_k_off[l] and page_v_off[l] values (of the layer's cache
     * type) into its backend's piece of a page. NULL pool: no such layer.
     * kv_own_bytes: the
     * sequences' own caches (rings, states) together; kv_empty_runs: runs
     * of their page tables without a page yet, which they may still take. */
    exo_kv_pool *kv_pool;
    exo_backend *page_be[2];
    int n_page_be;
    size_t *page_k_off, *page_v_off;
    int64_t kv_own_bytes, kv_empty_runs;
};

static acts *acts_of(exo_model *m, const exo_backend *be) { return be == m->gpu ? &m->gpu_act : &m->act; }
static int kv_pages_plan(exo_model *m);

struct exo_seq {
    exo_model *m;
    uint64_t id;                /* unique in the process: names its recorded decode steps */
    int capacity, len;
    int alloc_capacity;         /* capacity rounded up to EXO_KV_BLOCK */
    void **k_cache, **v_cache;  /* per attention layer, on that layer's backend (backend.h) */
    int *slots;                 /* per attention layer: positions its cache holds; less than
                                   alloc_capacity for a sliding layer's ring (backend.h) */
    /* Per linear-attention layer: its conv inputs (K-1, conv_dim) then its
     * recurrent state (Hv, Dk, Dv), one contiguous run of state_floats */
    float **state;
    size_t state_floats;
    /* A recurrent state cannot be trimmed: a copy of every layer's, taken
     * before each multi-token step, lets the sequence go back to snap_len
     * (an error mid-prompt, a cancelled prefill); going back anywhere else
     * but 0 loses the state (state_lost) until the sequence restarts. */
    float *snap;                /* host memory, n_linear * state_floats */
    int snap_len;               /* -1: no snapshot */
    bool state_lost;
    void **kv_block;            /* per layer: the block its backend's caches live in,
                                   set on the first layer of each backend */
    /* Paged layers (model's kv_pool): positions [i * EXO_KV_PAGE, ..) of
     * every one in page page_id[i] (-1: none yet); table[b]: the host's
     * list of those pages' memory on page backend b, table_dev[b] the copy
     * the ops read (backend.h exo_kv_view), stale until pushed. */
    int n_runs;
    int32_t *page_id;
    void **table[2], **table_dev[2];
    bool table_stale;
};

/* ---- weight sources ---------------------------------------------------- */

typedef struct st_source {
    exo_st *st;
    const exo_model_config *cfg;
    char prefix[64];    /* replaces a leading "model." (multimodal wrappers) */
    exo_err *err;
} st_source;

static const exo_st_tensor *st_lookup(st_source *s, const char *name)
{
    char buf[512];
    if (s->prefix[0] && !strncmp(name, "model.", 6)) {
        snprintf(buf, sizeof buf, "%s%s", s->prefix, name + 6);
        return exo_st_find(s->st, buf);
    }
    if (s->prefix[0] && !strncmp(name, "lm_head.", 8)) { /* .weight, .scales, .biases */
        const exo_st_tensor *t = exo_st_find(s->st, name);
        if (t)
            return t;
        snprintf(buf, sizeof buf, "language_model.%s", name);
        return exo_st_find(s->st, buf);
    }
    return exo_st_find(s->st, name);
}

static bool is_float_dtype(exo_dtype t)
{
    return t == EXO_DTYPE_F32 || t == EXO_DTYPE_F16 || t == EXO_DTYPE_BF16;
}

/* MXFP4 (gpt-oss's experts, linear.h): mlx's form, uint32 codes
 * [.., rows, cols/8] and uint8 scales [.., rows, cols/32]. */
static int st_mxfp4(st_source *s, const char *module, const exo_st_tensor *w, const exo_st_tensor *sc,
                    int nd, size_t slab, exo_linear *out)
{
    int d0 = nd - 2;
    int64_t rows = w->shape[d0], cols = w->shape[d0 + 1] * 8;
    if (w->dtype != EXO_DTYPE_U32 || sc->ndim != nd || sc->shape[d0] != rows || sc->shape[d0 + 1] * 32 != cols ||
        (nd == 3 && sc->shape[0] != w->shape[0]))
        return exo_err_set(s->err, EXO_EFORMAT, "%s: %s: an MXFP4 weight needs U32 codes [.., rows, cols/8] "
                           "and U8 scales [.., rows, cols/32]", w->file, module);
    *out = (exo_linear){.format = EXO_WFORMAT_MXFP4, .dtype = EXO_DTYPE_U8, .rows = rows, .cols = cols,
                        .bits = 4, .group_size = 32};
    out->w = (const char *)w->data + slab * (size_t)(rows * cols / 2);
    out->scales = (const char *)sc->data + slab * (size_t)(rows * cols / 32);
    return 0;
}

/* MXFP4 in the hub's form: `<module>_blocks` [E, rows, cols/32, 16] and
 * `<module>_scales` [E, rows, cols/32], both uint8 (gpt-oss's experts). */
static int st_mxfp4_blocks(st_source *s, const char *module, int64_t index, exo_linear *out)
{
    char name[512];
    snprintf(name, sizeof name, "%s_blocks", module);
    const exo_st_tensor *bl = st_lookup(s, name);
    snprintf(name, sizeof name, "%s_scales", module);
    const exo_st_tensor *sc = st_lookup(s, name);
    if (!bl)
        return EXO_ENOENT;
    if (!sc || bl->dtype != EXO_DTYPE_U8 || sc->dtype != EXO_DTYPE_U8 || bl->ndim != 4 || sc->ndim != 3 ||
        bl->shape[3] != 16 || sc->shape[0] != bl->shape[0] || sc->shape[1] != bl->shape[1] ||
        sc->shape[2] != bl->shape[2])
        return exo_err_set(s->err, EXO_EFORMAT, "%s: %s_blocks / _scales: MXFP4 needs uint8 blocks "
                           "[E, rows, groups, 16] and scales [E, rows, groups]", bl->file, module);
    if (index >= bl->shape[0])
        return exo_err_set(s->err, EXO_EFORMAT, "%s: %s_blocks stacks %lld, not %lld", bl->file, module,
                           (long long)bl->shape[0], (long long)index + 1);
    int64_t rows = bl->shape[1], cols = bl->shape[2] * 32;
    *out = (exo_linear){.format = EXO_WFORMAT_MXFP4, .dtype = EXO_DTYPE_U8, .rows = rows, .cols = cols,
                        .bits = 4, .group_size = 32};
    out->w = (const char *)bl->data + (size_t)index * (size_t)(rows * cols / 2);
    out->scales = (const char *)sc->data + (size_t)index * (size_t)(rows * cols / 32);
    return 0;
}

/* A 2-D module (index < 0), or slab `index` of a stacked 3-D one. */
static int st_linear_at(st_source *s, const char *module, int64_t index, exo_linear *out)
{
    char name[512];
    snprintf(name, sizeof name, "%s.weight", module);
    const exo_st_tensor *w = st_lookup(s, name);
    if (!w && index >= 0) /* transformers 5's fused experts: "mlp.experts.down_proj", no .weight */
        w = st_lookup(s, module);
    if (!w && index >= 0)
        return st_mxfp4_blocks(s, module, index, out);
    if (!w)
        return EXO_ENOENT;
    snprintf(name, sizeof name, "%s.scales", module);
    const exo_st_tensor *sc = st_lookup(s, name);
    snprintf(name, sizeof name, "%s.biases", module);
    const exo_st_tensor *bi = st_lookup(s, name);
    memset(out, 0, sizeof *out);
    int nd = index < 0 ? 2 : 3, d0 = nd - 2; /* the [rows, cols] dims */
    if (w->ndim != nd)
        return exo_err_set(s->err, EXO_EFORMAT, "%s: %s.weight has %d dims, expected %d", w->file,
                           module, w->ndim, nd);
    if (index >= 0 && index >= w->shape[0])
        return exo_err_set(s->err, EXO_EFORMAT, "%s: %s.weight stacks %lld, not %lld", w->file, module,
                           (long long)w->shape[0], (long long)index + 1);
    size_t slab = index < 0 ? 0 : (size_t)index; /* elements of one slab: rows * cols */
    if (!sc) {
        if (!is_float_dtype(w->dtype))
            return exo_err_set(s->err, EXO_EFORMAT, "%s: %s.weight has dtype %s and no scales",
                               w->file, module, exo_dtype_name(w->dtype));
        out->format = EXO_WFORMAT_DENSE;
        out->dtype = w->dtype;
        out->rows = w->shape[d0];
        out->cols = w->shape[d0 + 1];
        out->w = (const char *)w->data + slab * (size_t)(out->rows * out->cols) * exo_dtype_size(w->dtype);
        return 0;
    }
    if (sc->dtype == EXO_DTYPE_U8 && !bi) /* mlx's "mxfp4" mode: E8M0 scales, no biases */
        return st_mxfp4(s, module, w, sc, nd, slab, out);
    int bits = 0, gs = 0;
    if (!exo_config_quant_for(s->cfg, module, &bits, &gs))
        return exo_err_set(s->err, EXO_EFORMAT,
                           "%s: %s has quantization scales but config.json has no quantization "
                           "settings for it", w->file, module);
    if (!bi || w->dtype != EXO_DTYPE_U32 || sc->ndim != nd || bi->ndim != nd ||
        !is_float_dtype(sc->dtype) || sc->dtype != bi->dtype || (index >= 0 && (sc->shape[0] != w->shape[0] ||
                                                                               bi->shape[0] != w->shape[0])))
        return exo_err_set(s->err, EXO_EFORMAT,
                           "%s: %s: quantized weight needs U32 weight and matching float "
                           "scales/biases", w->file, module);
    int64_t rows = w->shape[d0], cols = w->shape[d0 + 1] * 32 / bits;
    if (w->shape[d0 + 1] * 32 % bits || sc->shape[d0] != rows || bi->shape[d0] != rows ||
        sc->shape[d0 + 1] * gs != cols || bi->shape[d0 + 1] != sc->shape[d0 + 1])
        return exo_err_set(s->err, EXO_EFORMAT,
                           "%s: %s: shapes weight [%lld,%lld] scales [%lld,%lld] do not match "
                           "bits=%d group_size=%d", w->file, module, (long long)w->shape[d0],
                           (long long)w->shape[d0 + 1], (long long)sc->shape[d0],
                           (long long)sc->shape[d0 + 1], bits, gs);
    int rc = exo_affine_check(bits, gs, cols, s->err);
    if (rc)
        return exo_err_wrap(s->err, "%s: %s", w->file, module);
    size_t words = (size_t)w->shape[d0 + 1], groups = (size_t)sc->shape[d0 + 1], esz = exo_dtype_size(sc->dtype);
    out->format = EXO_WFORMAT_AFFINE;
    out->dtype = sc->dtype;
    out->rows = rows;
    out->cols = cols;
    out->w = (const uint32_t *)w->data + slab * (size_t)rows * words;
    out->scales = (const char *)sc->data + slab * (size_t)rows * groups * esz;
    out->biases = (const char *)bi->data + slab * (size_t)rows * groups * esz;
    out->bits = bits;
    out->group_size = gs;
    return 0;
}

static int st_linear(void *ctx, const char *module, exo_linear *out)
{
    return st_linear_at(ctx, module, -1, out);
}

static int st_stacked(void *ctx, const char *module, int64_t index, exo_linear *out)
{
    return st_linear_at(ctx, module, index < 0 ? 0 : index, out);
}

static int st_vector(void *ctx, const char *name, exo_dtype *dtype, const void **data, int64_t *n)
{
    st_source *s = ctx;
    const exo_st_tensor *t = st_lookup(s, name);
    if (!t)
        return EXO_ENOENT;
    if (t->ndim < 1 || !is_float_dtype(t->dtype))
        return exo_err_set(s->err, EXO_EFORMAT, "%s: %s must be a float tensor", t->file, name);
    *dtype = t->dtype;
    *data = t->data;
    *n = 1;
    for (int i = 0; i < t->ndim; i++) /* conv taps (C, 1, K), stacked biases (E, n): all values */
        *n *= t->shape[i];
    return 0;
}

/* ---- binding ------------------------------------------------------------ */

typedef struct binder {
    exo_model *m;
    const exo_weight_source *src;
    exo_backend *be;
    exo_err *err;
} binder;

/* The rows [r0, r1) of w: a view, nothing copied (rows are contiguous). */
static exo_linear linear_rows(const exo_linear *w, int64_t r0, int64_t r1)
{
    exo_linear v = *w;
    size_t esz = exo_dtype_size(w->dtype);
    v.rows = r1 - r0;
    (void)esz;
    size_t wb, sb, bb;
    exo_linear_part_bytes(w, &wb, &sb, &bb); /* per row: the totals over rows */
    size_t R = (size_t)w->rows;
    v.w = (const char *)w->w + wb / R * (size_t)r0;
    v.scales = sb ? (const char *)w->scales + sb / R * (size_t)r0 : NULL;
    v.biases = bb ? (const char *)w->biases + bb / R * (size_t)r0 : NULL;
    return v;
}

/* The columns [c0, c1) of w gathered into one new buffer (*buf, which the
 * result points into). Quantized weights split only at group edges. */
static int linear_cols(const exo_linear *src, int64_t c0, int64_t c1, exo_linear *out, void **buf,
                       exo_err *err)
{
    const exo_linear whole = *src, *w = &whole; /* out may be src */
    *out = whole;
    *buf = NULL;
    size_t esz = exo_dtype_size(w->dtype), rows = (size_t)w->rows, n = (size_t)(c1 - c0);
    out->cols = c1 - c0;
    if (w->format == EXO_WFORMAT_DENSE) {
        char *d = exo_try_malloc(rows * n * esz);
        if (!d)
            return exo_err_set(err, EXO_ENOMEM, "cannot gather a weight slice");
        for (size_t r = 0; r < rows; r++)
            memcpy(d + r * n * esz, (const char *)w->w + (r * (size_t)w->cols + (size_t)c0) * esz,
                   n * esz);
        out->w = *buf = d;
        return 0;
    }
    int64_t gs = w->group_size;
    if (c0 % gs || c1 % gs)
        return exo_err_set(err, EXO_EUNSUPPORTED,
                           "tensor parallel split at column %lld is not on a quantization group "
                           "edge (group size %lld)", (long long)(c0 % gs ? c0 : c1), (long long)gs);
    size_t words = (size_t)(w->cols * w->bits / 32), nw = n * (size_t)w->bits / 32;
    size_t groups = (size_t)(w->cols / gs), ng = n / (size_t)gs;
    char *d = exo_try_malloc(rows * (nw * 4 + 2 * ng * esz));
    if (!d)
        return exo_err_set(err, EXO_ENOMEM, "cannot gather a weight slice");
    uint32_t *dw = (uint32_t *)d;
    char *ds = d + rows * nw * 4, *db = ds + rows * ng * esz;
    size_t w0 = (size_t)c0 * (size_t)w->bits / 32, g0 = (size_t)(c0 / gs);
    for (size_t r = 0; r < rows; r++) {
        memcpy(dw + r * nw, (const uint32_t *)w->w + r * words + w0, nw * 4);
        memcpy(ds + r * ng * esz, (const char *)w->scales + (r * groups + g0) * esz, ng * esz);
        if (w->biases) /* MXFP4 has none */
            memcpy(db + r * ng * esz, (const char *)w->biases + (r * groups + g0) * esz, ng * esz);
    }
    out->w = dw;
    out->scales = ds;
    out->biases = w->biases ? db : NULL;
    *buf = d;
    return 0;
}

/* Which part of a weight a shard binds: rows [r0, r1) and columns
 * [c0, c1); r1 == 0 / c1 == 0 mean all of them. */
typedef struct part {
    int64_t r0, r1, c0, c1;
} part;

static int load_part(binder *b, const char *module, exo_linear host, part p, exo_linear *out);

static int bind_linear_part(binder *b, const char *module, int64_t rows, int64_t cols, bool required,
                            part p, exo_linear *out, bool *found)
{
    exo_linear host;
    int rc = b->src->linear(b->src->ctx, module, &host);
    if (found)
        *found = rc == 0;
    if (rc == EXO_ENOENT) {
        if (!required)
            return 0;
        return exo_err_set(b->err, EXO_EFORMAT, "missing weight %s.weight", module);
    }
    if (rc)
        return rc;
    if (host.rows != rows || host.cols != cols)
        return exo_err_set(b->err, EXO_EFORMAT, "%s: shape [%lld, %lld], config says [%lld, %lld]",
                           module, (long long)host.rows, (long long)host.cols, (long long)rows,
                           (long long)cols);
    return load_part(b, module, host, p, out);
}

/* Hands the part of a host weight a shard binds to the backend. `owned`:
 * a buffer host already points into (gathered rows, a transpose), which
 * this takes over. */
static int load_part_owned(binder *b, const char *module, exo_linear host, part p, void *owned,
                           exo_linear *out)
{
    int rc;
    if (p.r1)
        host = linear_rows(&host, p.r0, p.r1);
    void *gathered = NULL;
    if (p.c1 && (rc = linear_cols(&host, p.c0, p.c1, &host, &gathered, b->err))) {
        exo_free(owned);
        return exo_err_wrap(b->err, "%s", module);
    }
    if (gathered) { /* the column copy replaces the earlier one */
        exo_free(owned);
        owned = gathered;
    }
    rc = b->be->ops->load_linear(b->be, &host, b->src->from_file || owned, out, b->err);
    if (owned && !rc && out->w == host.w) { /* the backend uses it in place: keep it */
        b->m->owned = exo_realloc(b->m->owned, (b->m->n_owned + 1) * sizeof(void *));
        b->m->owned[b->m->n_owned++] = owned;
    } else {
        exo_free(owned);
    }
    return rc;
}

static int load_part(binder *b, const char *module, exo_linear host, part p, exo_linear *out)
{
    return load_part_owned(b, module, host, p, NULL, out);
}

/* Bytes of one row of w, of its scales and of its biases. */
static void row_bytes(const exo_linear *w, size_t *wb, size_t *sb, size_t *bb)
{
    exo_linear_part_bytes(w, wb, sb, bb);
    size_t R = w->rows > 0 ? (size_t)w->rows : 1;
    *wb /= R;
    *sb /= R;
    *bb /= R;
}

/* Rows rows[0..n) of w, in that order, gathered into one new buffer (*buf,
 * which the result points into): de-interleaving (a q_proj that holds
 * each head's gate after its queries, gpt-oss's alternating gate/up rows,
 * Qwen3-Next's per-key-head groups) and tensor-parallel shares that are
 * not one run of rows. */
static int linear_gather(const exo_linear *w, const int64_t *rows, int64_t n, exo_linear *out,
                         void **buf, exo_err *err)
{
    size_t wb, sb, bb;
    row_bytes(w, &wb, &sb, &bb);
    for (int64_t i = 0; i < n; i++)
        if (rows[i] < 0 || rows[i] >= w->rows)
            return exo_err_set(err, EXO_EINTERNAL, "row %lld of a %lld-row weight", (long long)rows[i],
                               (long long)w->rows);
    char *d = exo_try_malloc((size_t)n * (wb + sb + bb) + 1);
    if (!d)
        return exo_err_set(err, EXO_ENOMEM, "cannot gather %lld weight rows", (long long)n);
    *out = *w;
    out->rows = n;
    char *dw = d, *ds = d + (size_t)n * wb, *db = ds + (size_t)n * sb;
    for (int64_t i = 0; i < n; i++) {
        size_t r = (size_t)rows[i];
        memcpy(dw + (size_t)i * wb, (const char *)w->w + r * wb, wb);
        if (sb)
            memcpy(ds + (size_t)i * sb, (const char *)w->scales + r * sb, sb);
        if (bb)
            memcpy(db + (size_t)i * bb, (const char *)w->biases + r * bb, bb);
    }
    out->w = dw;
    out->scales = sb ? ds : NULL;
    out->biases = bb ? db : NULL;
    *buf = d;
    return 0;
}

/* A dense weight stored (in, out), as gpt-oss's experts are in transformers,
 * turned into the (out, in) of every other linear. */
static int linear_transpose(const exo_linear *w, exo_linear *out, void **buf, exo_err *err)
{
    if (w->format != EXO_WFORMAT_DENSE)
        return exo_err_set(err, EXO_EUNSUPPORTED, "a quantized weight stored transposed");
    size_t esz = exo_dtype_size(w->dtype), R = (size_t)w->rows, C = (size_t)w->cols;
    char *d = exo_try_malloc(R * C * esz);
    if (!d)
        return exo_err_set(err, EXO_ENOMEM, "cannot transpose a weight");
    for (size_t r = 0; r < R; r++)
        for (size_t c = 0; c < C; c++)
            memcpy(d + (c * R + r) * esz, (const char *)w->w + (r * C + c) * esz, esz);
    *out = *w;
    out->rows = (int64_t)C;
    out->cols = (int64_t)R;
    out->w = d;
    *buf = d;
    return 0;
}

/* Binds module (rows, cols) keeping rows[0..n) of it (then part p). */
static int bind_linear_rows(binder *b, const char *module, int64_t rows, int64_t cols,
                            const int64_t *pick, int64_t n, part p, exo_linear *out)
{
    exo_linear host, g;
    int rc = b->src->linear(b->src->ctx, module, &host);
    if (rc == EXO_ENOENT)
        return exo_err_set(b->err, EXO_EFORMAT, "missing weight %s.weight", module);
    if (rc)
        return rc;
    if (host.rows != rows || host.cols != cols)
        return exo_err_set(b->err, EXO_EFORMAT, "%s: shape [%lld, %lld], config says [%lld, %lld]",
                           module, (long long)host.rows, (long long)host.cols, (long long)rows,
                           (long long)cols);
    void *buf;
    if ((rc = linear_gather(&host, pick, n, &g, &buf, b->err)))
        return rc;
    return load_part_owned(b, module, g, p, buf, out);
}

static int bind_linear(binder *b, const char *module, int64_t rows, int64_t cols, bool required,
                       exo_linear *out, bool *found)
{
    return bind_linear_part(b, module, rows, cols, required, (part){0}, out, found);
}

/* Elements [off, off + n) of a vector of `total` (a tensor-parallel
 * rank's share of a bias; off 0 and n == total otherwise). */
/* Picks from a vector: elements pick[0..n) (NULL: [off, off + n)), each
 * times mul plus add ((1 + w) norms, a bias shared out by ranks). */
typedef struct vec_pick {
    int64_t off;
    const int64_t *pick;
    float mul, add;
} vec_pick;

static int bind_vector_pick(binder *b, const char *name, int64_t total, int64_t n, vec_pick vp,
                            bool required, float **out)
{
    exo_dtype t;
    const void *data;
    int64_t len;
    *out = NULL;
    int rc = b->src->vector(b->src->ctx, name, &t, &data, &len);
    if (rc == EXO_ENOENT)
        return required ? exo_err_set(b->err, EXO_EFORMAT, "missing tensor %s", name) : 0;
    if (rc)
        return rc;
    if (len != total)
        return exo_err_set(b->err, EXO_EFORMAT, "%s: length %lld, expected %lld", name,
                           (long long)len, (long long)total);
    size_t esz = exo_dtype_size(t);
    if (!vp.pick && vp.mul == 1 && vp.add == 0) {
        *out = b->be->ops->load_vector(b->be, t, (const char *)data + (size_t)vp.off * esz, (size_t)n,
                                       b->err);
        return *out ? 0 : EXO_ENOMEM;
    }
    float *v = exo_try_malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (!v)
        return exo_err_set(b->err, EXO_ENOMEM, "cannot read %s", name);
    for (int64_t i = 0; i < n; i++) {
        int64_t src = vp.pick ? vp.pick[i] : vp.off + i;
        exo_convert_to_f32(t, (const char *)data + (size_t)src * esz, v + i, 1);
        v[i] = v[i] * vp.mul + vp.add;
    }
    *out = b->be->ops->load_vector(b->be, EXO_DTYPE_F32, v, (size_t)n, b->err);
    exo_free(v);
    return *out ? 0 : EXO_ENOMEM;
}

static int bind_vector_part(binder *b, const char *name, int64_t total, int64_t off, int64_t n,
                            bool required, float **out)
{
    return bind_vector_pick(b, name, total, n, (vec_pick){off, NULL, 1, 0}, required, out);
}

static int bind_vector(binder *b, const char *name, int64_t n, bool required, float **out)
{
    return bind_vector_part(b, name, n, 0, n, required, out);
}

/* One projection of expert e (0 gate, 1 up, 2 down) as an (out, in)
 * linear, from whichever layout the checkpoint has:
 *   mlp.experts.E.gate_proj               one tensor per expert (the hub, save_pretrained)
 *   mlp.switch_mlp.gate_proj, mlp.experts.gate_proj
 *                                         [E, out, in] stacked (mlx-lm; gpt-oss's MLX copies)
 *   mlp.experts.gate_up_proj              [E, 2I, H] fused, gate rows first (transformers 5,
 *                                         the Qwen3.5 hub); gpt-oss: [E, H, 2I], (in, out)
 *                                         with gate and up in alternate columns
 * Returns the host linear and, when rows had to be copied, the buffer. */
static int expert_host(binder *b, int l, int64_t e, int p, int64_t rows, int64_t cols,
                       exo_linear *host, void **owned)
{
    static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
    const exo_weight_source *src = b->src;
    bool gpt_oss = !strcmp(b->m->cfg.model_type, "gpt_oss");
    char name[256];
    *owned = NULL;
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%lld.%s", l, (long long)e, proj[p]);
    int rc = src->linear(src->ctx, name, host);
    if (rc != EXO_ENOENT)
        return rc;
    static const char *const stacks[2] = {"switch_mlp", "experts"};
    for (int k = 0; k < 2 && src->stacked; k++) {
        snprintf(name, sizeof name, "model.layers.%d.mlp.%s.%s", l, stacks[k], proj[p]);
        rc = src->stacked(src->ctx, name, e, host);
        if (rc == EXO_ENOENT)
            continue;
        if (rc)
            return rc;
        if (gpt_oss && host->format == EXO_WFORMAT_DENSE) /* transformers keeps them (in, out) */
            return linear_transpose(host, host, owned, b->err);
        return 0;
    }
    if (p == 2 || !src->stacked)
        return EXO_ENOENT;
    exo_linear both;
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj", l);
    if ((rc = src->stacked(src->ctx, name, e, &both)))
        return rc;
    void *t = NULL;
    if (gpt_oss && both.format == EXO_WFORMAT_DENSE && (rc = linear_transpose(&both, &both, &t, b->err)))
        return rc;
    if (both.rows != 2 * rows || both.cols != cols) {
        exo_free(t);
        return exo_err_set(b->err, EXO_EFORMAT, "%s[%lld]: shape [%lld, %lld], expected [%lld, %lld]",
                           name, (long long)e, (long long)both.rows, (long long)both.cols,
                           (long long)(2 * rows), (long long)cols);
    }
    if (!gpt_oss) { /* halves: a view of the slab (or of its copy) */
        *host = linear_rows(&both, p ? rows : 0, p ? 2 * rows : rows);
        *owned = t;
        return 0;
    }
    int64_t *pick = exo_try_malloc(sizeof(int64_t) * (size_t)rows);
    if (!pick) {
        exo_free(t);
        return exo_err_set(b->err, EXO_ENOMEM, "cannot split %s", name);
    }
    for (int64_t r = 0; r < rows; r++)
        pick[r] = 2 * r + p; /* gate: even rows, up: odd */
    rc = linear_gather(&both, pick, rows, host, owned, b->err);
    exo_free(pick);
    exo_free(t);
    return rc;
}

/* gpt-oss's expert biases, per expert [gate (I) | up (I) | down (D)] of
 * this rank (I: its share [i0, i1)); the down bias is divided among the
 * ranks, whose partial sums the all-reduce adds. From gate_up_proj_bias
 * [E, 2I] (alternating) and down_proj_bias [E, D], or MLX's
 * experts.{gate,up,down}_proj.bias. */
static int bind_expert_biases(binder *b, int l, layer *L, int64_t i0, int64_t i1, int tp)
{
    const exo_model_config *cfg = &b->m->cfg;
    int64_t E = cfg->n_experts, D = cfg->hidden_size, I = cfg->moe_intermediate_size, In = i1 - i0;
    size_t per = (size_t)(2 * In + D);
    float *all = exo_try_malloc(sizeof(float) * (size_t)E * per);
    int64_t *pick = exo_try_malloc(sizeof(int64_t) * (size_t)(In ? In : 1));
    if (!all || !pick) {
        exo_free(all);
        exo_free(pick);
        return exo_err_set(b->err, EXO_ENOMEM, "cannot hold expert biases");
    }
    char gu[160], gname[160], uname[160], dname[160];
    snprintf(gu, sizeof gu, "model.layers.%d.mlp.experts.gate_up_proj_bias", l);
    snprintf(gname, sizeof gname, "model.layers.%d.mlp.experts.gate_proj.bias", l);
    snprintf(uname, sizeof uname, "model.layers.%d.mlp.experts.up_proj.bias", l);
    snprintf(dname, sizeof dname, "model.layers.%d.mlp.experts.down_proj_bias", l);
    exo_dtype t;
    const void *data;
    int64_t len;
    bool fused = b->src->vector(b->src->ctx, gu, &t, &data, &len) == 0;
    if (b->src->vector(b->src->ctx, dname, &t, &data, &len) == EXO_ENOENT)
        snprintf(dname, sizeof dname, "model.layers.%d.mlp.experts.down_proj.bias", l);
    int rc = 0;
    for (int64_t e = 0; e < E && !rc; e++) {
        float *dst = all + (size_t)e * per;
        float *v = NULL;
        for (int p = 0; p < 2 && !rc; p++) {
            for (int64_t r = 0; r < In; r++)
                pick[r] = fused ? e * 2 * I + 2 * (i0 + r) + p : e * I + i0 + r;
            vec_pick vp = {0, pick, 1, 0};
            rc = bind_vector_pick(b, fused ? gu : p ? uname : gname, E * I * (fused ? 2 : 1), In, vp,
                                  true, &v);
            if (!rc) {
                rc = b->be->ops->to_host(b->be, dst + p * In, v, sizeof(float) * (size_t)In);
                b->be->ops->release(b->be, v);
            }
        }
        if (!rc)
            rc = bind_vector_pick(b, dname, E * D, D, (vec_pick){e * D, NULL, 1.0f / (float)tp, 0}, true, &v);
        if (!rc) {
            rc = b->be->ops->to_host(b->be, dst + 2 * In, v, sizeof(float) * (size_t)D);
            b->be->ops->release(b->be, v);
        }
    }
    if (!rc) {
        L->expert_bias = b->be->ops->load_vector(b->be, EXO_DTYPE_F32, all, (size_t)E * per, b->err);
        rc = L->expert_bias ? 0 : EXO_ENOMEM;
    }
    exo_free(all);
    exo_free(pick);
    return rc;
}

/* A mixture-of-experts MLP: the router (mlp.gate, or gpt-oss's mlp.router
 * with a bias; glm4/deepseek's correction bias), each expert's three
 * projections (expert_host's layouts), and the shared experts. A
 * tensor-parallel rank binds every expert's share of the intermediate
 * dimension (pgu rows, pd columns), as for a dense MLP, and its share of
 * the shared experts' (psgu, psd). */
static int bind_experts(binder *b, int l, layer *L, part pgu, part pd, part psgu, part psd, int tp)
{
    const exo_model_config *cfg = &b->m->cfg;
    int64_t E = cfg->n_experts, D = cfg->hidden_size, I = cfg->moe_intermediate_size;
    bool gpt_oss = !strcmp(cfg->model_type, "gpt_oss");
    char name[256];
    snprintf(name, sizeof name, "model.layers.%d.mlp.%s", l, gpt_oss ? "router" : "gate");
    int rc = bind_linear(b, name, E, D, true, &L->router, NULL);
    if (rc)
        return rc;
    if (cfg->router_bias) {
        snprintf(name, sizeof name, "model.layers.%d.mlp.router.bias", l);
        if ((rc = bind_vector(b, name, E, true, &L->router_bias)))
            return rc;
        L->router.out_bias = L->router_bias; /* the logits' bias, added by the product */
    }
    if (cfg->router_sigmoid) {
        snprintf(name, sizeof name, "model.layers.%d.mlp.gate.e_score_correction_bias", l);
        if ((rc = bind_vector(b, name, E, false, &L->e_score_bias)))
            return rc;
    }
    L->n_experts = (int)E;
    L->experts = exo_calloc((size_t)E * 3, sizeof(exo_linear));
    static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
    for (int64_t e = 0; e < E; e++) {
        for (int p = 0; p < 3; p++) {
            int64_t rows = p == 2 ? D : I, cols = p == 2 ? I : D;
            exo_linear host;
            void *owned = NULL;
            rc = expert_host(b, l, e, p, rows, cols, &host, &owned);
            if (rc == EXO_ENOENT)
                return exo_err_set(b->err, EXO_EFORMAT, "missing weight model.layers.%d.mlp.experts.%lld.%s "
                                   "(or a stacked or fused form of it)", l, (long long)e, proj[p]);
            if (rc)
                return rc;
            if (host.rows != rows || host.cols != cols) {
                exo_free(owned);
                return exo_err_set(b->err, EXO_EFORMAT, "layer %d expert %lld %s: shape [%lld, %lld], "
                                   "config says [%lld, %lld]", l, (long long)e, proj[p],
                                   (long long)host.rows, (long long)host.cols, (long long)rows,
                                   (long long)cols);
            }
            if ((rc = load_part_owned(b, proj[p], host, p == 2 ? pd : pgu, owned, &L->experts[e * 3 + p])))
                return rc;
        }
    }
    if (gpt_oss && (rc = bind_expert_biases(b, l, L, pgu.r1 ? pgu.r0 : 0, pgu.r1 ? pgu.r1 : I, tp)))
        return rc;
    int64_t S = cfg->shared_expert_intermediate_size ? cfg->shared_expert_intermediate_size
                                                     : cfg->n_shared_experts * I;
    if (!S)
        return 0;
    const char *sh = cfg->shared_expert_intermediate_size ? "shared_expert" : "shared_experts";
    L->has_shared = true;
    for (int p = 0; p < 3; p++) {
        snprintf(name, sizeof name, "model.layers.%d.mlp.%s.%s", l, sh, proj[p]);
        exo_linear *out = p == 0 ? &L->sh_gate : p == 1 ? &L->sh_up : &L->sh_down;
        if ((rc = bind_linear_part(b, name, p == 2 ? D : S, p == 2 ? S : D, true, p == 2 ? psd : psgu, out,
                                   NULL)))
            return rc;
    }
    if (cfg->shared_expert_intermediate_size) {
        snprintf(name, sizeof name, "model.layers.%d.mlp.shared_expert_gate", l);
        rc = bind_linear(b, name, 1, D, true, &L->sh_router, NULL);
    }
    return rc;
}

/* Decode of a sparse layer picks its experts on the device where the
 * backend can (backend.h moe_pick_table), so the step never waits for the
 * host; gpt-oss's per-expert biases are then looked up by the choice on
 * the device too (add_picked_bias). Not for tensor-parallel ranks (whose
 * choices must agree bit for bit: the host router makes them so). A
 * backend that cannot read these experts so leaves the host route in
 * place, which is no error. */
static void pick_on_device(binder *b, layer *L, int tp)
{
    const exo_backend_ops *o = b->be->ops;
    if (!o->moe_pick_table || !o->moe_pick || !o->add_weighted_rows || (L->expert_bias && !o->add_picked_bias) ||
        tp > 1)
        return;
    exo_err why = {0};
    L->pick_table = o->moe_pick_table(b->be, L->experts, L->n_experts, &why);
    if (!L->pick_table)
        EXO_LOG_DEBUG("experts routed on the host: %s", why.msg);
}

/* The families the forward pass implements, and what sets each apart
 * (config.h has the per-layer kinds and the MoE routing). */
typedef struct family {
    const char *model_type;
    bool qk_norm;      /* per-head RMSNorm of q and k before RoPE */
    bool norm_offset;  /* RMSNorm weights stored as w, applied as (1 + w) */
    bool attn_gate;    /* q_proj also gives each head a sigmoid output gate */
    bool sandwich;     /* norms after attention and after the MLP too (gemma3) */
    bool sinks;        /* a learned sink logit per query head (gpt-oss) */
} family;

static const family families[] = {
    {"llama", false, false, false, false, false},
    {"mistral", false, false, false, false, false},
    {"qwen2", false, false, false, false, false},
    {"qwen3", true, false, false, false, false},
    {"qwen3_moe", true, false, false, false, false},
    {"qwen3_next", true, true, true, false, false},
    {"qwen3_5", true, true, true, false, false},
    {"qwen3_5_moe", true, true, true, false, false},
    {"gemma3", true, true, false, true, false},
    {"gpt_oss", false, false, false, false, true},
    {"glm4_moe", false, false, false, false, false}, /* q/k norm: use_qk_norm, read at bind */
    {"deepseek_v3", false, false, false, false, false},
};

static const family *family_of(const char *mt)
{
    for (size_t i = 0; i < sizeof families / sizeof *families; i++)
        if (!strcmp(families[i].model_type, mt))
            return &families[i];
    return NULL;
}

static int check_config(const exo_model_config *c, exo_err *err)
{
    if (!family_of(c->model_type))
        return exo_err_set(err, EXO_EUNSUPPORTED,
                           "model_type '%s' is not supported (llama, mistral, qwen2, qwen3, qwen3_moe, "
                           "qwen3_next, qwen3_5, qwen3_5_moe, gemma3, gpt_oss, glm4_moe, deepseek_v3)",
                           c->model_type);
    if (strcmp(c->hidden_act, "silu") && strcmp(c->hidden_act, "swish") &&
        strcmp(c->hidden_act, "gelu_pytorch_tanh"))
        return exo_err_set(err, EXO_EUNSUPPORTED, "hidden_act '%s' is not supported (silu, "
                           "gelu_pytorch_tanh)", c->hidden_act);
    if (c->head_dim <= 0 || c->head_dim > 1024 || c->head_dim % 2)
        return exo_err_set(err, EXO_EUNSUPPORTED, "head_dim %lld is not supported",
                           (long long)c->head_dim);
    if (c->num_key_value_heads <= 0 || c->num_attention_heads % c->num_key_value_heads)
        return exo_err_set(err, EXO_EFORMAT, "num_attention_heads %% num_key_value_heads != 0");
    if (c->vocab_size > INT32_MAX || c->hidden_size > INT32_MAX || c->intermediate_size > INT32_MAX)
        return exo_err_set(err, EXO_ERANGE, "model dimensions too large");
    if (c->final_logit_softcapping > 0)
        return exo_err_set(err, EXO_EUNSUPPORTED, "final logit softcapping is not supported");
    double prf = c->partial_rotary_factor > 0 ? c->partial_rotary_factor : 1;
    int64_t rot = (int64_t)(c->head_dim * prf);
    if (rot < 2 || rot % 2)
        return exo_err_set(err, EXO_EUNSUPPORTED, "a rotary dimension of %lld is not supported",
                           (long long)rot);
    return 0;
}

static void free_acts(acts *a)
{
    if (!a->be)
        return;
    float **bufs[] = {&a->x,     &a->h,    &a->q,          &a->att,    &a->qg,    &a->k,
                      &a->v,     &a->g,    &a->u,          &a->logits, &a->inv_freq,
                      &a->inv_freq_local,  &a->lqkv,       &a->lconv,  &a->lz,    &a->la,
                      &a->lb,    &a->sg,   &a->router,     &a->xe,     &a->ye,    &a->moe_out,
                      &a->mq,    &a->mc,   &a->mr,         &a->mqa};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
        a->be->ops->release(a->be, *bufs[i]);
        *bufs[i] = NULL;
    }
    a->be->ops->release(a->be, a->pick_idx);
    a->be->ops->release(a->be, a->pick_w);
    a->pick_idx = NULL;
    a->pick_w = NULL;
    exo_free(a->picked);
    exo_free(a->top_idx);
    exo_free(a->top_w);
    exo_free(a->rows);
    exo_free(a->row_w);
    exo_free(a->sel_w);
    exo_free(a->sel_x);
    exo_free(a->sel_g);
    exo_free(a->sel_u);
    exo_free(a->sel_y);
}

/* Decode rows one moe_decode takes: the GEMV's widest launch (the CUDA
 * backend quantizes and norms x in its products up to 16 rows; past that
 * it norms apart, and a row's bits would differ from its own alone). */
static int moe_decode_rows(const exo_model *m) { return m->max_chunk < 16 ? m->max_chunk : 16; }

static int alloc_acts(exo_model *m, acts *a, exo_backend *be, exo_err *err)
{
    a->be = be;
    size_t C = (size_t)m->max_chunk, F = (size_t)(m->moe_ffn > m->ffn ? m->moe_ffn : m->ffn);
    F = F > (size_t)m->sh_ffn ? F : (size_t)m->sh_ffn;
    size_t E = (size_t)m->n_experts;
    size_t QD = (size_t)m->n_heads * (size_t)m->hd, VD = (size_t)m->lin_hv * (size_t)m->lin_dv;
    size_t L = m->n_linear ? 1 : 0, CV = (size_t)m->conv_dim;
    /* decode runs its tokens' k experts and the shared ones side by side
     * in these (moe_decode: up to moe_decode_rows tokens) */
    size_t R = (size_t)moe_decode_rows(m);
    size_t KF = R * ((size_t)m->topk * (size_t)m->moe_ffn + (size_t)m->sh_ffn), K1 = (size_t)m->topk + 1;
    size_t CF = C * F > KF ? C * F : KF;
    size_t CD = (C > R * K1 ? C : R * K1) * (size_t)m->dim;
    struct {
        float **p;
        size_t n;
    } want[] = {
        {&a->x, C * m->dim},           {&a->h, C * m->dim},
        {&a->q, C * QD},               {&a->att, C * (QD > VD ? QD : VD)},
        {&a->qg, m->attn_gated ? C * QD : 0},
        {&a->lqkv, L * C * CV},        {&a->lconv, L * C * CV},
        {&a->lz, L * C * VD},          {&a->la, L * C * m->lin_hv},
        {&a->lb, L * C * m->lin_hv},   {&a->sg, m->sh_ffn ? C : 0},
        {&a->mq, m->mla ? C * (size_t)m->mla_rq : 0}, {&a->mc, m->mla ? C * (size_t)m->mla_r : 0},
        {&a->mr, m->mla ? C * (size_t)m->mla_dr : 0}, {&a->mqa, m->mla ? C * QD : 0},
        {&a->k, C * m->n_kv * m->hd},  {&a->v, C * m->n_kv * m->hd},
        {&a->g, CF},                   {&a->u, CF},
        {&a->router, C * E},           {&a->xe, E ? C * m->dim : 0},
        {&a->ye, E ? CD : 0},  {&a->moe_out, E && m->allreduce ? C * m->dim : 0},
        {&a->logits, m->has_head ? (size_t)MAX_LOGIT_ROWS * m->vocab : 0},
        {&a->inv_freq, (size_t)m->rot_dim / 2},
        {&a->inv_freq_local, m->cfg.rope_local_theta > 0 ? (size_t)m->rot_dim / 2 : 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        if (!want[i].n)
            continue;
        *want[i].p = be->ops->alloc(be, want[i].n * sizeof(float));
        if (!*want[i].p)
            return exo_err_set(err, EXO_ENOMEM, "cannot allocate activations for %zu tokens", C);
    }
    if (E) {
        a->top_idx = exo_calloc(C * (size_t)m->topk, sizeof(int32_t));
        a->top_w = exo_calloc(C * (size_t)m->topk, sizeof(float));
        a->rows = exo_calloc(C > K1 ? C : K1, sizeof(int32_t));
        a->row_w = exo_calloc(C > K1 ? C : K1, sizeof(float));
        a->sel_w = exo_calloc(2 * K1, sizeof *a->sel_w);
        a->sel_x = exo_calloc(2 * K1, sizeof *a->sel_x);
        a->sel_g = exo_calloc(2 * K1, sizeof *a->sel_g);
        a->sel_u = exo_calloc(2 * K1, sizeof *a->sel_u);
        a->sel_y = exo_calloc(2 * K1, sizeof *a->sel_y);
        if (be->ops->moe_pick) {
            a->pick_idx = be->ops->alloc(be, sizeof(int32_t) * C * (size_t)m->topk);
            a->pick_w = be->ops->alloc(be, sizeof(float) * C * (size_t)m->topk);
            a->picked = exo_calloc(3 * (size_t)m->topk, sizeof *a->picked);
            if (!a->pick_idx || !a->pick_w)
                return exo_err_set(err, EXO_ENOMEM, "cannot allocate the experts' choice");
        }
    }
    return 0;
}

int exo_tp_share(int64_t total, int64_t unit, int r, int n, int64_t *lo, int64_t *hi,
                 exo_err *err)
{
    if (n <= 0 || r < 0 || r >= n || unit <= 0 || total % unit || total / unit < n)
        return exo_err_set(err, EXO_EINVAL, "cannot split %lld into %d shares of whole %lld-units",
                           (long long)total, n, (long long)unit);
    int64_t units = total / unit, base = units / n, extra = units % n;
    int64_t u0 = r * base + (r < extra ? r : extra);
    *lo = u0 * unit;
    *hi = (u0 + base + (r < extra)) * unit;
    return 0;
}

/* The unit the MLP columns split by: a quantization group of down_proj when
 * the checkpoint's groups allow it, so every rank's slice starts on one. */
static int64_t ffn_unit(const exo_model_config *cfg, int64_t ffn, int tp)
{
    static const int64_t units[] = {128, 64, 32, 16, 8, 1};
    for (size_t i = 0; i < sizeof units / sizeof *units; i++)
        if (ffn % units[i] == 0 && ffn / units[i] >= tp)
            return units[i];
    (void)cfg;
    return 1;
}

static void note_layer(const exo_model_opts *opts, int done, int total)
{
    if (opts && opts->on_layer)
        opts->on_layer(opts->on_layer_ctx, done, total);
}

/* A Gated DeltaNet layer's weights. Its key heads [g0, g1) (tensor
 * parallel: a share; their value heads follow) keep, in conv channel order
 * [q | k | v], their rows of the projections and conv taps. Qwen3.5 has
 * in_proj_qkv (flat [q | k | v]), in_proj_z, in_proj_b, in_proj_a;
 * Qwen3-Next groups in_proj_qkvz and in_proj_ba per key head ([q k v z],
 * [b a]), which the row picks undo. */
static int bind_linear_attn(binder *b, int l, layer *L, int64_t g0, int64_t g1)
{
    const exo_model_config *cfg = &b->m->cfg;
    int64_t D = cfg->hidden_size, Hk = cfg->linear_k_heads, Hv = cfg->linear_v_heads;
    int64_t Dk = cfg->linear_k_dim, Dv = cfg->linear_v_dim, K = cfg->linear_conv_kernel, r = Hv / Hk;
    int64_t KD = Hk * Dk, VD = Hv * Dv, CD = 2 * KD + VD;
    int64_t nk = g1 - g0, ncd = 2 * nk * Dk + nk * r * Dv, nvd = nk * r * Dv;
    int64_t *qkv = exo_calloc((size_t)(ncd + nvd + 2 * nk * r), sizeof(int64_t));
    int64_t *z = qkv + ncd, *bb = z + nvd, *aa = bb + nk * r;
    char name[256];
    int rc;
    bool grouped = false;
    snprintf(name, sizeof name, "model.layers.%d.linear_attn.in_proj_qkvz", l);
    exo_linear probe;
    if (b->src->linear(b->src->ctx, name, &probe) == 0)
        grouped = true;
    /* conv channels (and flat in_proj_qkv rows) of this share */
    int64_t n = 0;
    for (int64_t c = g0 * Dk; c < g1 * Dk; c++)
        qkv[n++] = c;
    for (int64_t c = g0 * Dk; c < g1 * Dk; c++)
        qkv[n++] = KD + c;
    for (int64_t c = g0 * r * Dv; c < g1 * r * Dv; c++)
        qkv[n++] = 2 * KD + c;
    int64_t *chan = exo_calloc((size_t)ncd, sizeof(int64_t));
    memcpy(chan, qkv, sizeof(int64_t) * (size_t)ncd);
    if (grouped) { /* per key head g: [q (Dk) | k (Dk) | v (r Dv) | z (r Dv)], and [b (r) | a (r)] */
        int64_t G = 2 * Dk + 2 * r * Dv;
        n = 0;
        for (int64_t g = g0; g < g1; g++)
            for (int64_t d = 0; d < Dk; d++)
                qkv[n++] = g * G + d;
        for (int64_t g = g0; g < g1; g++)
            for (int64_t d = 0; d < Dk; d++)
                qkv[n++] = g * G + Dk + d;
        for (int64_t g = g0; g < g1; g++)
            for (int64_t d = 0; d < r * Dv; d++)
                qkv[n++] = g * G + 2 * Dk + d;
        for (int64_t g = g0, m = 0; g < g1; g++)
            for (int64_t d = 0; d < r * Dv; d++)
                z[m++] = g * G + 2 * Dk + r * Dv + d;
        for (int64_t g = g0, m = 0; g < g1; g++)
            for (int64_t j = 0; j < r; j++, m++) {
                bb[m] = g * 2 * r + j;
                aa[m] = g * 2 * r + r + j;
            }
        snprintf(name, sizeof name, "model.layers.%d.linear_attn.in_proj_qkvz", l);
        if (!(rc = bind_linear_rows(b, name, CD + VD, D, qkv, ncd, (part){0}, &L->in_qkv)))
            rc = bind_linear_rows(b, name, CD + VD, D, z, nvd, (part){0}, &L->in_z);
        snprintf(name, sizeof name, "model.layers.%d.linear_attn.in_proj_ba", l);
        if (!rc && !(rc = bind_linear_rows(b, name, 2 * Hv, D, bb, nk * r, (part){0}, &L->in_b)))
            rc = bind_linear_rows(b, name, 2 * Hv, D, aa, nk * r, (part){0}, &L->in_a);
    } else {
        part pz = {g0 * r * Dv, g1 * r * Dv, 0, 0}, pba = {g0 * r, g1 * r, 0, 0};
        snprintf(name, sizeof name, "model.layers.%d.linear_attn.in_proj_qkv", l);
        rc = bind_linear_rows(b, name, CD, D, qkv, ncd, (part){0}, &L->in_qkv);
        snprintf(name, sizeof name, "model.layers.%d.linear_attn.in_proj_z", l);
        if (!rc)
            rc = bind_linear_part(b, name, VD, D, true, pz, &L->in_z, NULL);
        snprintf(name, sizeof name, "model.layers.%d.linear_attn.in_proj_b", l);
        if (!rc)
            rc = bind_linear_part(b, name, Hv, D, true, pba, &L->in_b, NULL);
        snprintf(name, sizeof name, "model.layers.%d.linear_attn.in_proj_a", l);
        if (!rc)
            rc = bind_linear_part(b, name, Hv, D, true, pba, &L->in_a, NULL);
    }
    /* conv taps (C, K) of the picked channels: channel c's K taps are contiguous */
    int64_t *taps = exo_calloc((size_t)(ncd * K), sizeof(int64_t));
    for (int64_t i = 0; i < ncd; i++)
        for (int64_t k = 0; k < K; k++)
            taps[i * K + k] = chan[i] * K + k;
    snprintf(name, sizeof name, "model.layers.%d.linear_attn.conv1d.weight", l);
    if (!rc)
        rc = bind_vector_pick(b, name, CD * K, ncd * K, (vec_pick){0, taps, 1, 0}, true, &L->conv_w);
    exo_free(taps);
    exo_free(chan);
    exo_free(qkv);
    snprintf(name, sizeof name, "model.layers.%d.linear_attn.A_log", l);
    if (!rc)
        rc = bind_vector_part(b, name, Hv, g0 * r, nk * r, true, &L->A_log);
    snprintf(name, sizeof name, "model.layers.%d.linear_attn.dt_bias", l);
    if (!rc)
        rc = bind_vector_part(b, name, Hv, g0 * r, nk * r, true, &L->dt_bias);
    snprintf(name, sizeof name, "model.layers.%d.linear_attn.norm.weight", l);
    if (!rc)
        rc = bind_vector(b, name, Dv, true, &L->lin_norm);
    snprintf(name, sizeof name, "model.layers.%d.linear_attn.out_proj", l);
    part po = {0, 0, g0 * r * Dv, g1 * r * Dv};
    if (!rc)
        rc = bind_linear_part(b, name, D, VD, true, b->m->allreduce ? po : (part){0}, &L->out_proj, NULL);
    return rc;
}

/* Row order of a latent-attention q projection for heads [h0, h1): each
 * head's RoPE dims first, their adjacent pairs (2i, 2i+1) split into
 * halves (i, i + dr/2) so the rotate-half kernel applies, then its nope
 * dims. The same permutation of q's and k's rope dims leaves every score
 * as it was. */
static void mla_q_rows(const exo_model *m, int64_t h0, int64_t h1, int64_t *rows)
{
    int64_t dn = m->mla_dn, dr = m->mla_dr, n = 0;
    for (int64_t h = h0; h < h1; h++) {
        int64_t base = h * (dn + dr);
        for (int64_t i = 0; i < dr; i++)
            rows[n++] = base + dn + (m->cfg.rope_interleave ? (i < dr / 2 ? 2 * i : 2 * (i - dr / 2) + 1) : i);
        for (int64_t i = 0; i < dn; i++)
            rows[n++] = base + i;
    }
}

/* The per-head absorbed projections of kv_b_proj [H (dn + dv), r], or of
 * mlx-lm's embed_q [H, r, dn] / unembed_out [H, dv, r]. */
static int bind_mla_heads(binder *b, int l, layer *L, int64_t h0, int64_t h1)
{
    exo_model *m = b->m;
    int64_t dn = m->mla_dn, dv = m->mla_dv, r = m->mla_r, H = m->cfg.num_attention_heads;
    char name[256], uname[256];
    L->absorb = exo_calloc((size_t)(h1 - h0), sizeof(exo_linear));
    L->unabsorb = exo_calloc((size_t)(h1 - h0), sizeof(exo_linear));
    snprintf(name, sizeof name, "model.layers.%d.self_attn.embed_q", l);
    snprintf(uname, sizeof uname, "model.layers.%d.self_attn.unembed_out", l);
    exo_linear probe;
    int rc;
    if (b->src->stacked && b->src->stacked(b->src->ctx, name, 0, &probe) == 0) {
        for (int64_t h = h0; h < h1; h++) {
            exo_linear wk, wv;
            if ((rc = b->src->stacked(b->src->ctx, name, h, &wk)) ||
                (rc = b->src->stacked(b->src->ctx, uname, h, &wv)))
                return rc == EXO_ENOENT ? exo_err_set(b->err, EXO_EFORMAT, "missing %s", uname) : rc;
            if (wk.rows != r || wk.cols != dn || wv.rows != dv || wv.cols != r)
                return exo_err_set(b->err, EXO_EFORMAT, "%s: shapes do not match the config", name);
            if ((rc = load_part(b, name, wk, (part){0}, &L->absorb[h - h0])) ||
                (rc = load_part(b, uname, wv, (part){0}, &L->unabsorb[h - h0])))
                return rc;
        }
        return 0;
    }
    snprintf(name, sizeof name, "model.layers.%d.self_attn.kv_b_proj", l);
    exo_linear kvb;
    rc = b->src->linear(b->src->ctx, name, &kvb);
    if (rc)
        return rc == EXO_ENOENT ? exo_err_set(b->err, EXO_EFORMAT, "missing weight %s.weight", name) : rc;
    if (kvb.rows != H * (dn + dv) || kvb.cols != r)
        return exo_err_set(b->err, EXO_EFORMAT, "%s: shape [%lld, %lld], config says [%lld, %lld]", name,
                           (long long)kvb.rows, (long long)kvb.cols, (long long)(H * (dn + dv)), (long long)r);
    for (int64_t h = h0; h < h1; h++) {
        exo_linear wk = linear_rows(&kvb, h * (dn + dv), h * (dn + dv) + dn), wt;
        void *deq = NULL, *t = NULL;
        if (wk.format != EXO_WFORMAT_DENSE) { /* quantized along r: dequantize, then transpose */
            float *d = exo_try_malloc(sizeof(float) * (size_t)(dn * r));
            if (!d)
                return exo_err_set(b->err, EXO_ENOMEM, "cannot dequantize %s", name);
            for (int64_t i = 0; i < dn; i++)
                exo_linear_row_f32(&wk, i, d + i * r);
            wk = (exo_linear){.format = EXO_WFORMAT_DENSE, .dtype = EXO_DTYPE_F32, .rows = dn, .cols = r, .w = d};
            deq = d;
        }
        rc = linear_transpose(&wk, &wt, &t, b->err);
        exo_free(deq);
        if (rc || (rc = load_part_owned(b, name, wt, (part){0}, t, &L->absorb[h - h0])))
            return rc;
        exo_linear wv = linear_rows(&kvb, h * (dn + dv) + dn, (h + 1) * (dn + dv));
        if ((rc = load_part(b, name, wv, (part){0}, &L->unabsorb[h - h0])))
            return rc;
    }
    return 0;
}

/* A latent-attention layer's weights for heads [h0, h1) (kv_a and its
 * norm are every rank's). */
static int bind_mla(binder *b, int l, layer *L, int64_t h0, int64_t h1, part po)
{
    exo_model *m = b->m;
    const exo_model_config *cfg = &m->cfg;
    int64_t D = cfg->hidden_size, H = cfg->num_attention_heads, dn = m->mla_dn, dr = m->mla_dr;
    int64_t dv = m->mla_dv, r = m->mla_r, rq = m->mla_rq, nq = (h1 - h0) * (dn + dr);
    char name[256];
    int64_t *rows = exo_calloc((size_t)(nq > r + dr ? nq : r + dr), sizeof(int64_t));
    mla_q_rows(m, h0, h1, rows);
    int rc;
#define P(fmt) (snprintf(name, sizeof name, "model.layers.%d.self_attn." fmt, l), name)
    if (rq) {
        if (!(rc = bind_linear(b, P("q_a_proj"), rq, D, true, &L->q_a, NULL)) &&
            !(rc = bind_vector(b, P("q_a_layernorm.weight"), rq, true, &L->q_a_norm)))
            rc = bind_linear_rows(b, P("q_b_proj"), H * (dn + dr), rq, rows, nq, (part){0}, &L->q);
    } else {
        rc = bind_linear_rows(b, P("q_proj"), H * (dn + dr), D, rows, nq, (part){0}, &L->q);
    }
    for (int64_t i = 0; i < r; i++)
        rows[i] = i;
    if (!rc)
        rc = bind_linear_rows(b, P("kv_a_proj_with_mqa"), r + dr, D, rows, r, (part){0}, &L->kv_c);
    for (int64_t i = 0; i < dr; i++)
        rows[i] = r + (cfg->rope_interleave ? (i < dr / 2 ? 2 * i : 2 * (i - dr / 2) + 1) : i);
    if (!rc)
        rc = bind_linear_rows(b, P("kv_a_proj_with_mqa"), r + dr, D, rows, dr, (part){0}, &L->kv_rope);
    exo_free(rows);
    if (!rc)
        rc = bind_vector(b, P("kv_a_layernorm.weight"), r, true, &L->kv_a_norm);
    if (!rc)
        rc = bind_linear_part(b, P("o_proj"), D, H * dv, true, po, &L->o, NULL);
#undef P
    if (!rc)
        rc = bind_mla_heads(b, l, L, h0, h1);
    return rc;
}

/* ---- which layers run on the GPU ------------------------------------------- */

/* The device opts (or EXO_DEVICE) names: "auto" (a GPU when there is
 * one), "cpu", "cuda" or "cuda:N". */
static const char *device_name(const exo_model_opts *o)
{
    const char *d = o->device && *o->device ? o->device : getenv("EXO_DEVICE");
    return d && *d ? d : "auto";
}

static int device_index(const exo_model_opts *o)
{
    int gpu = exo_device_gpu(device_name(o));
    return gpu > 0 ? gpu : 0;
}

static int gpu_layers_wanted(const exo_model_opts *o)
{
    const char *e = getenv("EXO_GPU_LAYERS");
    return o->gpu_layers ? o->gpu_layers : e && *e ? atoi(e) : 0;
}

/* Opens the GPU the options ask for. Asked by name, a GPU that cannot be
 * had is an error; "auto" falls back to the CPU. */
static int open_gpu(exo_model *m, const exo_model_opts *o, exo_err *err)
{
    const char *d = device_name(o);
    if (!exo_device_valid(d))
        return exo_err_set(err, EXO_EINVAL, "device '%s' is not one of auto, cpu, cuda, cuda:N", d);
    bool named = exo_device_gpu(d) >= 0;
    if (!strcmp(d, "cpu") || gpu_layers_wanted(o) < 0)
        return 0;
    if (!named && exo_backend_cuda_devices() == 0)
        return 0;
    exo_err e = {0};
    m->gpu = exo_backend_cuda_create(device_index(o), &e);
    if (!m->gpu && named)
        return exo_err_set(err, e.code ? e.code : EXO_EUNSUPPORTED, "%s", e.msg);
    if (!m->gpu)
        EXO_LOG_INFO("model: on the CPU (%s)", e.msg);
    return 0;
}

/* Whether layer i goes on the GPU: the first gpu_layers when asked, else
 * layers while they fit, keeping back room for the KV cache, activations
 * and the LM head (head_bytes); once one layer goes to the CPU, the rest
 * follow, so the residual stream crosses over once. */
static bool layer_on_gpu(exo_model *m, const exo_model_opts *o, int i, int device, size_t free0, size_t total,
                         size_t head_bytes)
{
    if (!m->gpu)
        return false;
    int want = gpu_layers_wanted(o);
    if (want > 0)
        return i < want;
    if (i > 0 && m->layers[i - 1].be != m->gpu)
        return false;
    size_t free_now, total_now;
    if (exo_backend_cuda_memory(device, &free_now, &total_now, NULL))
        return false;
    size_t per_layer = i && free0 > free_now ? (free0 - free_now) / (size_t)i : 0;
    size_t reserve = exo_model_gpu_reserve(total) + head_bytes;
    return free_now > per_layer + reserve;
}

/* The type of a layer's KV cache on backend be: bf16 where EXO_KV_CACHE=bf16
 * asks for it and the backend's attention takes it (half the bytes a decode
 * step reads from the caches, and half their memory; keys and values
 * rounded as transformers' and MLX's bf16 runs keep them), else f32. */
static exo_dtype cache_type(const exo_backend *be, int head_dim)
{
    const char *e = getenv("EXO_KV_CACHE");
    bool bf16 = e && !strcmp(e, "bf16") && be->ops->bf16_cache && head_dim % 2 == 0; /* bf16 keys go in dim pairs */
    return bf16 ? EXO_DTYPE_BF16 : EXO_DTYPE_F32;
}

int exo_model_build(const exo_model_config *cfg, const exo_weight_source *src,
                    const exo_model_opts *opts, exo_model **out, exo_err *err)
{
    *out = NULL;
    int rc = check_config(cfg, err);
    if (rc)
        return rc;
    const char *kv_env = getenv("EXO_KV_CACHE");
    if (kv_env && *kv_env && strcmp(kv_env, "f32") && strcmp(kv_env, "bf16"))
        return exo_err_set(err, EXO_EINVAL, "EXO_KV_CACHE is '%s': f32 or bf16", kv_env);
    const family *fam = family_of(cfg->model_type);
    exo_model_opts o = opts ? *opts : (exo_model_opts){0};
    int total = (int)cfg->num_hidden_layers;
    int first = o.start_layer, last = o.end_layer ? o.end_layer : total;
    int tp = o.tp_size > 1 ? o.tp_size : 1, tr = tp > 1 ? o.tp_rank : 0;
    if (first < 0 || first >= last || last > total)
        return exo_err_set(err, EXO_EINVAL, "layer range [%d, %d) is not within the model's %d layers",
                           first, last, total);
    if (tp > 1 && (tr < 0 || tr >= tp || tp > EXO_MAX_TP || !o.tp_allreduce || !o.tp_allgather))
        return exo_err_set(err, EXO_EINVAL, "tensor parallel rank %d of %d needs a collective", tr, tp);
    if (tp > 1 && (first != 0 || last != total))
        return exo_err_set(err, EXO_EUNSUPPORTED, "a tensor-parallel rank holds every layer");
    int64_t D = cfg->hidden_size, V = cfg->vocab_size, hd = cfg->head_dim;
    int64_t H = cfg->num_attention_heads, KV = cfg->num_key_value_heads, F = cfg->intermediate_size;
    int64_t group = H / KV;
    int64_t kv0 = 0, kv1 = KV, f0 = 0, f1 = F, I = cfg->moe_intermediate_size, mf0 = 0, mf1 = I;
    int64_t S = cfg->shared_expert_intermediate_size ? cfg->shared_expert_intermediate_size
                                                     : cfg->n_shared_experts * I;
    int64_t s0 = 0, s1 = S, g0 = 0, g1 = cfg->linear_k_heads;
    bool any_linear = false, any_dense = false;
    for (int l = first; l < last; l++) {
        any_linear |= exo_config_layer_kind(cfg, l) == EXO_LAYER_LINEAR;
        any_dense |= !exo_config_layer_moe(cfg, l);
    }
    if (tp > 1 && ((rc = exo_tp_share(KV, 1, tr, tp, &kv0, &kv1, err)) ||
                   (any_dense && F && (rc = exo_tp_share(F, ffn_unit(cfg, F, tp), tr, tp, &f0, &f1, err))) ||
                   (cfg->n_experts > 0 && (rc = exo_tp_share(I, ffn_unit(cfg, I, tp), tr, tp, &mf0, &mf1, err))) ||
                   (S && (rc = exo_tp_share(S, ffn_unit(cfg, S, tp), tr, tp, &s0, &s1, err))) ||
                   (any_linear && (rc = exo_tp_share(cfg->linear_k_heads, 1, tr, tp, &g0, &g1, err)))))
        return exo_err_wrap(err, "tensor parallel over %d ranks", tp);
    exo_model *m = exo_calloc(1, sizeof *m);
    m->cfg = *cfg;
    m->n_layers = last - first;
    m->first_layer = first;
    m->total_layers = total;
    m->dim = (int)D;
    m->n_kv = (int)(kv1 - kv0);
    m->n_heads = (int)(m->n_kv * group);
    m->hd = (int)hd;
    m->rot_dim = (int)(hd * (cfg->partial_rotary_factor > 0 ? cfg->partial_rotary_factor : 1));
    m->ffn = (int)(f1 - f0);
    m->attn_gated = fam->attn_gate;
    m->glu = cfg->swiglu_limit > 0                               ? EXO_GLU_OAI
             : !strcmp(cfg->hidden_act, "gelu_pytorch_tanh") ? EXO_GLU_GELU_TANH
                                                             : EXO_GLU_SILU;
    m->embed_scale = !strcmp(cfg->model_type, "gemma3") ? sqrtf((float)D) : 1.0f;
    for (int l = first; l < last; l++)
        if (exo_config_layer_moe(cfg, l)) {
            m->n_experts = (int)cfg->n_experts;
            m->topk = (int)cfg->n_experts_per_tok;
            m->moe_ffn = (int)(mf1 - mf0);
            m->sh_ffn = (int)(s1 - s0);
        }
    m->router = (exo_moe_router){m->n_experts, m->topk, cfg->router_sigmoid, cfg->norm_topk_prob, NULL,
                                 (int)(cfg->n_group > 0 ? cfg->n_group : 1),
                                 (int)(cfg->topk_group > 0 ? cfg->topk_group : 1),
                                 (float)(cfg->routed_scaling_factor > 0 ? cfg->routed_scaling_factor : 1)};
    m->glu_limit = (float)cfg->swiglu_limit;
    if (any_linear) {
        m->lin_hk = (int)(g1 - g0);
        m->lin_hv = (int)(m->lin_hk * (cfg->linear_v_heads / cfg->linear_k_heads));
        m->lin_dk = (int)cfg->linear_k_dim;
        m->lin_dv = (int)cfg->linear_v_dim;
        m->lin_k = (int)cfg->linear_conv_kernel;
        m->conv_dim = 2 * m->lin_hk * m->lin_dk + m->lin_hv * m->lin_dv;
    }
    m->mla = cfg->kv_lora_rank > 0;
    double scalar = cfg->query_pre_attn_scalar > 0 ? cfg->query_pre_attn_scalar : (double)hd;
    if (m->mla) { /* one latent "KV head" [rope | latent] that every query head reads */
        m->mla_dn = (int)cfg->qk_nope_head_dim;
        m->mla_dr = (int)cfg->qk_rope_head_dim;
        m->mla_dv = (int)cfg->v_head_dim;
        m->mla_r = (int)cfg->kv_lora_rank;
        m->mla_rq = (int)cfg->q_lora_rank;
        m->n_heads = m->n_kv; /* this rank's heads */
        m->n_kv = 1;
        m->hd = m->mla_dr + m->mla_r;
        m->rot_dim = m->mla_dr;
        scalar = (double)(m->mla_dn + m->mla_dr);
    }
    m->vocab = (int)V;
    const char *moe_path = getenv("EXO_MOE_PATH");
    m->moe_per_expert = moe_path && !strcmp(moe_path, "per-expert");
    m->moe_host_route = moe_path && !strcmp(moe_path, "host-route");
    m->eps = (float)cfg->rms_norm_eps;
    m->max_chunk = o.max_chunk > 0 ? o.max_chunk : 512;
    if (m->mla && m->max_chunk > 64) /* absorbed queries and outputs: chunk x heads x (latent + rope) */
        m->max_chunk = 64;
    m->embeds = first == 0;
    m->has_head = last == total;
    m->allreduce = tp > 1 ? o.tp_allreduce : NULL;
    m->allgather = tp > 1 ? o.tp_allgather : NULL;
    m->allreduce_ctx = o.tp_ctx;
    m->tp_rank = tr;
    m->tp_size = tp;
    part phead = {0};
    if (tp > 1) {
        for (int r = 0; r < tp; r++) {
            int64_t lo, hi;
            if ((rc = exo_tp_share(V, 1, r, tp, &lo, &hi, err)))
                goto fail_early;
            m->vocab_bounds[r] = (size_t)lo;
            m->vocab_bounds[r + 1] = (size_t)hi;
        }
        phead = (part){(int64_t)m->vocab_bounds[tr], (int64_t)m->vocab_bounds[tr + 1], 0, 0};
    }
    double attn_scale = 1.0 / sqrt(scalar);
    if (m->mla && cfg->rope.type != EXO_ROPE_DEFAULT && cfg->rope.mscale_all_dim != 0 &&
        cfg->rope.factor > 1) { /* yarn's mscale, squared, on every score */
        double ms = 0.1 * cfg->rope.mscale_all_dim * log(cfg->rope.factor) + 1.0;
        attn_scale *= ms * ms;
    }
    m->attn = (exo_attn_shape){.n_heads = m->n_heads, .n_kv_heads = m->n_kv, .head_dim = m->hd,
                               .scale = (float)attn_scale};
    m->cpu = exo_backend_cpu_create(o.n_threads, err);
    if (!m->cpu) {
        exo_free(m);
        return err ? err->code : EXO_EINTERNAL;
    }
    m->layers = exo_calloc((size_t)m->n_layers, sizeof(layer));
    if ((rc = open_gpu(m, &o, err))) {
        m->cpu->ops->free(m->cpu);
        exo_free(m->layers);
        goto fail_early;
    }
    binder b = {m, src, m->cpu, err};
    int gpu_device = m->gpu_device = m->gpu ? device_index(&o) : -1;
    int64_t QD = H * hd, KD = KV * hd;
    /* this rank's rows of q (its KV heads' query groups), k, v; columns of o */
    part pq = {0}, pkv = {0}, po = {0}, pgu = {0}, pd = {0}, pmgu = {0}, pmd = {0}, psgu = {0}, psd = {0};
    if (tp > 1) {
        pq = (part){kv0 * group * hd, kv1 * group * hd, 0, 0};
        pkv = (part){kv0 * hd, kv1 * hd, 0, 0};
        po = (part){0, 0, kv0 * group * hd, kv1 * group * hd};
        pgu = (part){f0, f1, 0, 0};
        pd = (part){0, 0, f0, f1};
        pmgu = (part){mf0, mf1, 0, 0};
        pmd = (part){0, 0, mf0, mf1};
        psgu = (part){s0, s1, 0, 0};
        psd = (part){0, 0, s0, s1};
    }
    bool qk_norm = fam->qk_norm;
    if (!strcmp(cfg->model_type, "glm4_moe")) /* GLM-4.5 has them, Air not: the checkpoint says */
        qk_norm = src->vector(src->ctx, "model.layers.0.self_attn.q_norm.weight", &(exo_dtype){0},
                              &(const void *){0}, &(int64_t){0}) == 0;
    bool qkv_bias = cfg->attention_bias || !strcmp(cfg->model_type, "qwen2");
    /* (1 + w) norms, unless the checkpoint already holds 1 + w (mlx-lm's
     * qwen3_next / qwen3_5 copies; see exo_weight_source) */
    float norm_add = fam->norm_offset && !src->norms_hold_offset ? 1.0f : 0.0f;
    vec_pick nv = {0, NULL, 1, norm_add};
    /* the heads of a q_proj that interleaves each head's queries and gate */
    int64_t *qpick = NULL, *gpick = NULL;
    if (m->attn_gated) {
        qpick = exo_calloc((size_t)(m->n_heads * hd), sizeof(int64_t));
        gpick = exo_calloc((size_t)(m->n_heads * hd), sizeof(int64_t));
        for (int64_t h = 0; h < m->n_heads; h++)
            for (int64_t d = 0; d < hd; d++) {
                int64_t gh = kv0 * group + h; /* the global head */
                qpick[h * hd + d] = gh * 2 * hd + d;
                gpick[h * hd + d] = gh * 2 * hd + hd + d;
            }
    }
    char name[256];
#define TRY(x)              \
    do {                    \
        if ((rc = (x)))     \
            goto fail;      \
    } while (0)
    size_t gpu_free0 = 0, gpu_total = 0;
    if (m->gpu)
        exo_backend_cuda_memory(gpu_device, &gpu_free0, &gpu_total, NULL);
    for (int i = 0; i < m->n_layers; i++) {
        int l = first + i;
        layer *L = &m->layers[i];
        L->be = layer_on_gpu(m, &o, i, gpu_device, gpu_free0, gpu_total, m->has_head ? (size_t)(V * D * 2) : 0)
                    ? m->gpu : m->cpu;
        if (L->be == m->gpu)
            m->gpu_layers = i + 1;
        L->kind = exo_config_layer_kind(cfg, l);
        b.be = L->be;
        if (i == 0 && m->embeds) /* the embedding lives with the first layer */
            TRY(bind_linear(&b, "model.embed_tokens", V, D, true, &m->embed, NULL));
#define P(fmt) (snprintf(name, sizeof name, "model.layers.%d." fmt, l), name)
        TRY(bind_vector_pick(&b, P("input_layernorm.weight"), D, D, nv, true, &L->attn_norm));
        if (fam->sandwich) {
            TRY(bind_vector_pick(&b, P("post_attention_layernorm.weight"), D, D, nv, true, &L->post_attn_norm));
            TRY(bind_vector_pick(&b, P("pre_feedforward_layernorm.weight"), D, D, nv, true, &L->mlp_norm));
            TRY(bind_vector_pick(&b, P("post_feedforward_layernorm.weight"), D, D, nv, true, &L->post_mlp_norm));
        } else {
            TRY(bind_vector_pick(&b, P("post_attention_layernorm.weight"), D, D, nv, true, &L->mlp_norm));
        }
        if (L->kind == EXO_LAYER_LINEAR) {
            TRY(bind_linear_attn(&b, l, L, g0, g1));
        } else if (m->mla) {
            L->attn = m->attn;
            L->attn.cache = cache_type(L->be, m->hd);
            part pmo = {0, 0, kv0 * cfg->v_head_dim, kv1 * cfg->v_head_dim};
            TRY(bind_mla(&b, l, L, kv0, kv1, tp > 1 ? pmo : (part){0}));
        } else {
            L->attn = m->attn;
            L->attn.cache = cache_type(L->be, m->hd);
            L->attn.sliding_window = L->kind == EXO_LAYER_SLIDING ? (int)cfg->sliding_window : 0;
            if (m->attn_gated) {
                TRY(bind_linear_rows(&b, P("self_attn.q_proj"), 2 * QD, D, qpick, m->n_heads * hd, (part){0},
                                     &L->q));
                TRY(bind_linear_rows(&b, P("self_attn.q_proj"), 2 * QD, D, gpick, m->n_heads * hd, (part){0},
                                     &L->q_gate));
            } else {
                TRY(bind_linear_part(&b, P("self_attn.q_proj"), QD, D, true, pq, &L->q, NULL));
            }
            TRY(bind_linear_part(&b, P("self_attn.k_proj"), KD, D, true, pkv, &L->k, NULL));
            TRY(bind_linear_part(&b, P("self_attn.v_proj"), KD, D, true, pkv, &L->v, NULL));
            TRY(bind_linear_part(&b, P("self_attn.o_proj"), D, QD, true, po, &L->o, NULL));
            if (qk_norm) {
                TRY(bind_vector_pick(&b, P("self_attn.q_norm.weight"), hd, hd, nv, true, &L->q_norm));
                TRY(bind_vector_pick(&b, P("self_attn.k_norm.weight"), hd, hd, nv, true, &L->k_norm));
            }
            int64_t q0 = kv0 * group * hd, k0 = kv0 * hd;
            TRY(bind_vector_part(&b, P("self_attn.q_proj.bias"), QD, q0, m->n_heads * hd, qkv_bias, &L->bq));
            TRY(bind_vector_part(&b, P("self_attn.k_proj.bias"), KD, k0, m->n_kv * hd, qkv_bias, &L->bk));
            TRY(bind_vector_part(&b, P("self_attn.v_proj.bias"), KD, k0, m->n_kv * hd, qkv_bias, &L->bv));
            TRY(bind_vector(&b, P("self_attn.o_proj.bias"), D, false, &L->bo)); /* added after the sum */
            /* the products add their biases (out_bias), a tensor-parallel
             * rank's o_proj excepted: its bias goes on once, after the sum */
            L->q.out_bias = L->bq;
            L->k.out_bias = L->bk;
            L->v.out_bias = L->bv;
            L->o.out_bias = tp > 1 ? NULL : L->bo;
            if (fam->sinks) {
                TRY(bind_vector_part(&b, P("self_attn.sinks"), H, kv0 * group, m->n_heads, true, &L->sinks));
                L->attn.sinks = L->sinks;
            }
        }
        if (exo_config_layer_moe(cfg, l)) {
            TRY(bind_experts(&b, l, L, pmgu, pmd, psgu, psd, tp));
            pick_on_device(&b, L, tp);
        } else {
            TRY(bind_linear_part(&b, P("mlp.gate_proj"), F, D, true, pgu, &L->gate, NULL));
            TRY(bind_linear_part(&b, P("mlp.up_proj"), F, D, true, pgu, &L->up, NULL));
            TRY(bind_linear_part(&b, P("mlp.down_proj"), D, F, true, pd, &L->down, NULL));
        }
#undef P
        if (L->kind == EXO_LAYER_LINEAR)
            m->n_linear++;
        note_layer(&o, i + 1, m->n_layers);
    }
    m->moe_picked = m->n_experts > 0;
    for (int i = 0; i < m->n_layers; i++)
        m->moe_picked &= !m->layers[i].n_experts || m->layers[i].pick_table;
    if (m->has_head) { /* the final norm and the head live with the last layer */
        b.be = m->layers[m->n_layers - 1].be;
        TRY(bind_vector_pick(&b, "model.norm.weight", D, D, nv, true, &m->final_norm));
        bool has_head = false;
        TRY(bind_linear_part(&b, "lm_head", V, D, !cfg->tie_word_embeddings, phead, &m->lm_head,
                             &has_head));
        if (!has_head && m->embeds && tp == 1 && m->layers[0].be == b.be)
            m->lm_head = m->embed; /* tied, and on the same backend */
        else if (!has_head) /* tied, and this shard's head is not its whole embedding */
            TRY(bind_linear_part(&b, "model.embed_tokens", V, D, true, phead, &m->lm_head, NULL));
    }
    if (m->gpu)
        EXO_LOG_INFO("model: %d of %d layers on GPU %d, the rest on the CPU", m->gpu_layers, m->n_layers,
                     gpu_device);
    if (m->gpu && !m->gpu_layers) { /* nothing fitted: no device context held for nothing */
        m->gpu->ops->free(m->gpu);
        m->gpu = NULL;
        m->gpu_device = -1;
    }
    if (m->gpu_layers < m->n_layers)
        TRY(alloc_acts(m, &m->act, m->cpu, err));
    if (m->gpu_layers)
        TRY(alloc_acts(m, &m->gpu_act, m->gpu, err));
    if (m->gpu && (m->gpu_layers < m->n_layers || m->allreduce))
        m->bounce = exo_calloc((size_t)m->max_chunk * (size_t)m->dim, sizeof(float));
    {
        float inv_freq[512], local_freq[512];
        exo_rope_scaling rs = cfg->rope;
        if (!rs.original_max_position_embeddings)
            rs.original_max_position_embeddings = cfg->max_position_embeddings;
        TRY(exo_rope_init(&rs, cfg->rope_theta, m->rot_dim, inv_freq, &m->mscale, err));
        float local_mscale = 1;
        if (cfg->rope_local_theta > 0) { /* gemma3's sliding layers: plain RoPE of their own base */
            exo_rope_scaling plain = {.type = EXO_ROPE_DEFAULT, .factor = 1};
            TRY(exo_rope_init(&plain, cfg->rope_local_theta, m->rot_dim, local_freq, &local_mscale, err));
        }
        acts *sets[2] = {&m->act, &m->gpu_act};
        for (int k = 0; k < 2; k++) {
            acts *a = sets[k];
            if (!a->be)
                continue;
            TRY(a->be->ops->to_device(a->be, a->inv_freq, inv_freq, sizeof(float) * (size_t)m->rot_dim / 2));
            if (a->inv_freq_local)
                TRY(a->be->ops->to_device(a->be, a->inv_freq_local, local_freq,
                                          sizeof(float) * (size_t)m->rot_dim / 2));
        }
        for (int i = 0; i < m->n_layers; i++) {
            layer *L = &m->layers[i];
            acts *a = acts_of(m, L->be);
            bool local = L->kind == EXO_LAYER_SLIDING && a->inv_freq_local;
            L->inv_freq = local ? a->inv_freq_local : a->inv_freq;
            L->mscale = local ? local_mscale : m->mscale;
        }
    }
    TRY(kv_pages_plan(m));
#undef TRY
    exo_free(qpick);
    exo_free(gpick);
    *out = m;
    return 0;
fail:
    exo_free(qpick);
    exo_free(gpick);
    exo_model_free(m);
    return rc;
fail_early: /* nothing bound or allocated yet */
    exo_free(m);
    return rc;
}

static bool shard_keeps(void *ctx, const char *name)
{
    return exo_layer_shard_needs(ctx, name);
}

int exo_model_load(const char *dir, const exo_model_opts *opts, exo_model **out, exo_err *err)
{
    *out = NULL;
    exo_model_config cfg;
    int rc = exo_config_load(dir, &cfg, err);
    if (rc)
        return rc;
    exo_st *st = NULL;
    int total = (int)cfg.num_hidden_layers;
    exo_layer_shard f = {opts ? opts->start_layer : 0, opts && opts->end_layer ? opts->end_layer : total,
                         total, cfg.tie_word_embeddings};
    rc = exo_st_open_filtered(dir, shard_keeps, &f, &st, err);
    if (rc) {
        exo_config_free(&cfg);
        return rc;
    }
    /* multimodal wrappers keep the text model under another prefix: look
     * for this shard's first layer (a middle shard has no embedding) */
    st_source s = {st, &cfg, "", err};
    char probe[160];
    snprintf(probe, sizeof probe, "model.layers.%d.input_layernorm.weight", f.first);
    if (!exo_st_find(st, "model.embed_tokens.weight") && !exo_st_find(st, probe)) {
        static const char *const prefixes[] = {"language_model.model.", "model.language_model."};
        for (size_t i = 0; i < 2; i++) {
            char a[160], b[160];
            snprintf(a, sizeof a, "%sembed_tokens.weight", prefixes[i]);
            snprintf(b, sizeof b, "%slayers.%d.input_layernorm.weight", prefixes[i], f.first);
            if (exo_st_find(st, a) || exo_st_find(st, b))
                snprintf(s.prefix, sizeof s.prefix, "%s", prefixes[i]);
        }
    }
    /* mlx-lm's copies of the Qwen hybrids hold 1 + w in their norms; they
     * are the ones whose conv taps are stored (C, K, 1), not (C, 1, K) */
    bool norms_hold_offset = false;
    for (int l = f.first; l < f.last; l++) {
        char conv[160];
        snprintf(conv, sizeof conv, "model.layers.%d.linear_attn.conv1d.weight", l);
        const exo_st_tensor *t = st_lookup(&s, conv);
        if (t) {
            norms_hold_offset = t->ndim == 3 && t->shape[2] == 1 && t->shape[1] != 1;
            break;
        }
    }
    exo_weight_source src = {&s, st_linear, st_vector, true, st_stacked, norms_hold_offset};
    exo_model *m;
    rc = exo_model_build(&cfg, &src, opts, &m, err);
    if (rc) {
        exo_err_wrap(err, "loading %s", dir);
        exo_st_close(st);
        exo_config_free(&cfg);
        return rc;
    }
    /* the backends hold their own copies now: the mapped pages leave this
     * process (they stay in the page cache, clean and reclaimable) */
    exo_st_drop_pages(st);
    m->st = st;
    m->owns_cfg = true;
    *out = m;
    return 0;
}

void exo_model_free(exo_model *m)
{
    if (!m)
        return;
    if (m->layers) {
        for (int l = 0; l < m->n_layers; l++) {
            layer *L = &m->layers[l];
            exo_backend *be = L->be;
            if (!be)
                continue;
            float *vecs[] = {L->attn_norm, L->mlp_norm,   L->post_attn_norm, L->post_mlp_norm,
                             L->q_norm,    L->k_norm,     L->bq,             L->bk,
                             L->bv,        L->bo,         L->sinks,          L->conv_w,
                             L->A_log,     L->dt_bias,    L->lin_norm,       L->router_bias,
                             L->e_score_bias, L->expert_bias};
            for (size_t i = 0; i < sizeof vecs / sizeof *vecs; i++)
                be->ops->release(be, vecs[i]);
            be->ops->release(be, L->pick_table);
            exo_free(L->experts);
            exo_free(L->absorb);
            exo_free(L->unabsorb);
            be->ops->release(be, L->q_a_norm);
            be->ops->release(be, L->kv_a_norm);
        }
    }
    if (m->final_norm) {
        exo_backend *last = m->layers[m->n_layers - 1].be;
        last->ops->release(last, m->final_norm);
    }
    exo_kv_pool_free(m->kv_pool);
    exo_free(m->page_k_off);
    exo_free(m->page_v_off);
    free_acts(&m->act);
    free_acts(&m->gpu_act);
    exo_free(m->bounce);
    if (m->gpu)
        m->gpu->ops->free(m->gpu);
    if (m->cpu)
        m->cpu->ops->free(m->cpu);
    exo_free(m->layers);
    for (size_t i = 0; i < m->n_owned; i++)
        exo_free(m->owned[i]);
    exo_free(m->owned);
    exo_st_close(m->st);
    if (m->owns_cfg)
        exo_config_free(&m->cfg);
    exo_free(m);
}

const exo_model_config *exo_model_get_config(const exo_model *m) { return &m->cfg; }
int exo_model_vocab(const exo_model *m) { return m->vocab; }

/* Whether w gives rows of x the same bits at each of a few row counts from
 * e and offsets as in one call of them all: where a row sits in a call,
 * and how many rows the call has, must not matter. */
static bool rows_agree(exo_backend *be, const exo_linear *w, int e, bool rows_op)
{
    enum { ALL = 152 };
    /* rows_op: an expert's products, at any row count */
    const int calls[][2] = {{e, 0}, {e, 37}, {40, 100}, {128, 23}, {rows_op ? 1 : e, 5}, {rows_op ? 5 : e, 60}};
    exo_matmul_fn *mm = rows_op ? be->ops->matmul_rows : be->ops->matmul;
    size_t K = (size_t)w->cols, N = (size_t)w->rows;
    float *hx = exo_malloc(sizeof(float) * ALL * K), *all = exo_malloc(sizeof(float) * ALL * N);
    float *some = exo_malloc(sizeof(float) * ALL * N);
    float *x = be->ops->alloc(be, sizeof(float) * ALL * K), *y = be->ops->alloc(be, sizeof(float) * ALL * N);
    bool ok = x && y;
    uint32_t r = 12345;
    for (size_t i = 0; i < ALL * K; i++) {
        r = r * 1664525u + 1013904223u;
        hx[i] = (float)(int32_t)r / 2147483648.0f;
    }
    ok = ok && !be->ops->to_device(be, x, hx, sizeof(float) * ALL * K) &&
         !mm(be, 1, &w, x, ALL, &y) && !be->ops->to_host(be, all, y, sizeof(float) * ALL * N);
    for (size_t c = 0; ok && c < sizeof calls / sizeof calls[0]; c++) {
        size_t T = (size_t)calls[c][0], at = (size_t)calls[c][1];
        float *xo = x + at * K;
        ok = !mm(be, 1, &w, xo, (int)T, &y) &&
             !be->ops->to_host(be, some, y, sizeof(float) * T * N) &&
             !memcmp(some, all + at * N, sizeof(float) * T * N);
    }
    be->ops->release(be, x);
    be->ops->release(be, y);
    exo_free(hx);
    exo_free(all);
    exo_free(some);
    return ok;
}

int exo_model_exact_rows(exo_model *m)
{
    if (m->exact_checked)
        return m->exact_rows;
    m->exact_checked = true;
    m->exact_rows = 0;
    int e = m->n_layers ? m->layers[0].be->ops->exact_rows : 0;
    if (e <= 0 || m->n_linear || m->mla || m->allreduce || m->max_chunk < 256)
        return 0;
    for (int l = 1; l < m->n_layers; l++)
        if (m->layers[l].be->ops->exact_rows != e || (m->n_experts && !m->layers[l].be->ops->matmul_rows))
            return 0;
    /* the first layer's products of each width of input (k and gate read
     * what q reads), the first sparse layer's router, shared expert and
     * experts (each at any row count). Other layers' weights of other
     * affine formats take the same products (the GEMM expands every one
     * to bf16; the GEMV keeps rows apart by design); attention is ours,
     * the same bits at any cut by design (tests/unit/test_batch.c) */
    layer *L = &m->layers[0], *S = L;
    for (int l = 1; l < m->n_layers && !S->n_experts; l++)
        S = &m->layers[l];
    const exo_linear *ws[] = {&L->q, &L->o, &L->down, &S->router, &S->sh_down, NULL, NULL};
    if (S->n_experts) {
        ws[5] = &S->experts[0];
        ws[6] = &S->experts[2];
    }
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
        if (ws[i] && ws[i]->rows > 0 && !rows_agree(L->be, ws[i], e, i >= 5)) {
            EXO_LOG_INFO("model: products of %d+ rows differ with the row count here: "
                         "prefixes are taken in whole prompt chunks only", e);
            return 0;
        }
    m->exact_rows = e;
    return e;
}
size_t exo_model_gpu_reserve(size_t total_bytes) { return total_bytes / 16 + ((size_t)1 << 30); }
int exo_model_gpu_layers(const exo_model *m) { return m->gpu_layers; }
int exo_model_gpu_device(const exo_model *m) { return m->gpu_device; }
bool exo_model_sums_on_gpus(const exo_model *m) { return m->group > 0; }
long exo_model_replayed_steps(const exo_model *m) { return m->replayed_steps; }
long exo_model_prefetches(const exo_model *m) { return m->prefetches; }

exo_shard_info exo_model_shard(const exo_model *m)
{
    return (exo_shard_info){m->first_layer, m->first_layer + m->n_layers, m->total_layers, m->dim,
                            m->embeds, m->has_head};
}

/* Bytes (or, params, parameters) of one weight. */
static double wcost(const exo_linear *w, bool params)
{
    if (!w->w)
        return 0;
    return params ? (double)w->rows * (double)w->cols : (double)exo_linear_bytes(w);
}

static double layer_weights(const exo_model *m, const layer *L, bool params)
{
    const exo_linear *ws[] = {&L->q,    &L->k,      &L->v,    &L->o,    &L->q_gate, &L->in_qkv,
                              &L->in_z, &L->in_b,   &L->in_a, &L->out_proj, &L->gate, &L->up,
                              &L->down, &L->sh_gate, &L->sh_up, &L->sh_down, &L->sh_router,
                              &L->q_a,  &L->kv_c,   &L->kv_rope, &L->router};
    double total = 0;
    for (size_t i = 0; i < sizeof ws / sizeof *ws; i++)
        total += wcost(ws[i], params);
    for (int h = 0; L->absorb && h < m->n_heads; h++)
        total += wcost(&L->absorb[h], params) + wcost(&L->unabsorb[h], params);
    if (L->n_experts) { /* per token, k experts' weights (on average) */
        double all = 0;
        for (int i = 0; i < 3 * L->n_experts; i++)
            all += wcost(&L->experts[i], params);
        total += all / L->n_experts * m->topk;
    }
    return total;
}

void exo_model_decode_cost(const exo_model *m, int ctx, exo_decode_cost *c)
{
    memset(c, 0, sizeof *c);
    c->layers = m->n_layers;
    if (m->has_head) {
        c->head_bytes = wcost(&m->lm_head, false);
        c->head_params = wcost(&m->lm_head, true);
    }
    c->weight_bytes = c->head_bytes;
    c->params = c->head_params;
    for (int l = 0; l < m->n_layers; l++) {
        const layer *L = &m->layers[l];
        c->weight_bytes += layer_weights(m, L, false);
        c->params += layer_weights(m, L, true);
        if (L->kind == EXO_LAYER_LINEAR) { /* the state, read and written; the conv inputs */
            c->cache_bytes += 2.0 * sizeof(float) * ((double)m->lin_hv * m->lin_dk * m->lin_dv +
                                                     (double)(m->lin_k - 1) * m->conv_dim);
            continue;
        }
        int seen = L->attn.sliding_window > 0 && L->attn.sliding_window < ctx ? L->attn.sliding_window : ctx;
        c->cache_bytes += 2.0 * (double)exo_dtype_size(L->attn.cache) * m->n_kv * m->hd * seen;
        c->prompt_attn_dims += (double)m->n_heads * m->hd;
        c->kv_layers++;
        c->kv_bf16_layers += L->attn.cache == EXO_DTYPE_BF16;
    }
}

void exo_model_set_moe_fused(exo_model *m, bool fused) { m->moe_per_expert = !fused; }

size_t exo_model_decode_bytes(const exo_model *m)
{
    exo_decode_cost c;
    exo_model_decode_cost(m, 0, &c);
    return (size_t)c.weight_bytes;
}

/* ---- sequences ---------------------------------------------------------- */

/* A linear-attention layer's conv inputs (K-1, conv_dim) and recurrent
 * state (Hv, Dk, Dv). */
static size_t linear_state_floats(const exo_model *m)
{
    return (size_t)(m->lin_k - 1) * (size_t)m->conv_dim + (size_t)m->lin_hv * (size_t)m->lin_dk * (size_t)m->lin_dv;
}

/* Bytes of layer l's per-sequence memory at `slots` positions (layer_slots):
 * K and V for attention (values of the layer's cache type), the conv
 * inputs and recurrent state (f32) for linear attention. */
static size_t layer_bytes(const exo_model *m, int l, int slots)
{
    if (m->layers[l].kind == EXO_LAYER_LINEAR)
        return linear_state_floats(m) * sizeof(float);
    return 2 * (size_t)slots * (size_t)m->n_kv * (size_t)m->hd * exo_dtype_size(m->layers[l].attn.cache);
}

/* Whether layer l's caches live in pages (full attention, latent
 * included); a sliding layer's ring and a linear layer's state are the
 * sequence's own. */
static bool layer_paged(const exo_model *m, int l)
{
    const layer *L = &m->layers[l];
    return L->kind != EXO_LAYER_LINEAR && !(L->kind == EXO_LAYER_SLIDING && L->attn.sliding_window > 0);
}

/* Bytes of layer l's caches a sequence holds itself (none for a paged
 * layer). */
static size_t seq_own_bytes(const exo_model *m, const exo_seq *s, int l)
{
    return layer_paged(m, l) ? 0 : layer_bytes(m, l, s->slots[l]);
}

static int runs_of(int alloc_capacity) { return (alloc_capacity + EXO_KV_PAGE - 1) / EXO_KV_PAGE; }

static int page_backend(const exo_model *m, const exo_backend *be) { return be == m->page_be[0] ? 0 : 1; }

/* Lays out a page: every paged layer's K then V of EXO_KV_PAGE positions,
 * in its backend's piece. */
static int kv_pages_plan(exo_model *m)
{
    size_t bytes[2] = {0, 0};
    m->page_k_off = exo_calloc((size_t)m->n_layers, sizeof(size_t));
    m->page_v_off = exo_calloc((size_t)m->n_layers, sizeof(size_t));
    for (int l = 0; l < m->n_layers; l++) {
        if (!layer_paged(m, l))
            continue;
        exo_backend *be = m->layers[l].be;
        if (!m->n_page_be || (m->n_page_be == 1 && be != m->page_be[0]))
            m->page_be[m->n_page_be++] = be;
        int b = page_backend(m, be);
        /* a backend's layers share one cache type (cache_type), so every
         * offset is a whole number of its values */
        size_t value = exo_dtype_size(m->layers[l].attn.cache), run = (size_t)EXO_KV_PAGE * (size_t)m->n_kv * (size_t)m->hd;
        m->page_k_off[l] = bytes[b] / value;
        m->page_v_off[l] = bytes[b] / value + run;
        bytes[b] += 2 * run * value;
    }
    if (!m->n_page_be)
        return 0;
    m->kv_pool = exo_kv_pool_new(m->n_page_be, m->page_be, bytes);
    return m->kv_pool ? 0 : EXO_EINVAL;
}

/* Positions a layer's cache holds in a sequence of alloc_capacity: all of
 * them, or for a sliding layer a ring of its window plus the longest call
 * (a chunk) plus a block (the decode kernel scores whole blocks from the
 * one holding a window's first key), when that is less. */
static int layer_slots(const exo_model *m, int alloc_capacity, int l)
{
    const layer *L = &m->layers[l];
    if (L->kind != EXO_LAYER_SLIDING || L->attn.sliding_window <= 0)
        return alloc_capacity;
    int64_t ring = ((int64_t)L->attn.sliding_window + m->max_chunk + 2 * EXO_KV_BLOCK - 1) / EXO_KV_BLOCK *
                   EXO_KV_BLOCK;
    return ring < alloc_capacity ? (int)ring : alloc_capacity;
}

static int round_to_block(int capacity) { return (capacity + EXO_KV_BLOCK - 1) / EXO_KV_BLOCK * EXO_KV_BLOCK; }

size_t exo_model_seq_bytes(const exo_model *m, int capacity)
{
    int alloc = round_to_block(capacity > 0 ? capacity : 1);
    size_t n = 0;
    for (int l = 0; l < m->n_layers; l++)
        if (!layer_paged(m, l))
            n += layer_bytes(m, l, layer_slots(m, alloc, l));
    return m->kv_pool ? n + (size_t)runs_of(alloc) * exo_kv_pool_page_bytes(m->kv_pool) : n;
}

size_t exo_seq_bytes(const exo_seq *s) { return exo_model_seq_bytes(s->m, s->alloc_capacity); }

size_t exo_model_kv_bytes(const exo_model *m)
{
    size_t n = (size_t)m->kv_own_bytes;
    if (m->kv_pool)
        n += ((size_t)exo_kv_pool_in_use(m->kv_pool) + (size_t)m->kv_empty_runs) * exo_kv_pool_page_bytes(m->kv_pool);
    return n;
}

size_t exo_model_shared_prefix_bytes(const exo_model *m, int n)
{
    return m->kv_pool && n > 0 ? (size_t)(n / EXO_KV_PAGE) * exo_kv_pool_page_bytes(m->kv_pool) : 0;
}

void exo_model_kv_pages(const exo_model *m, exo_kv_page_stats *st)
{
    *st = (exo_kv_page_stats){0};
    if (!m->kv_pool)
        return;
    st->page_positions = EXO_KV_PAGE;
    st->page_bytes = exo_kv_pool_page_bytes(m->kv_pool);
    st->in_use = exo_kv_pool_in_use(m->kv_pool);
    st->made = exo_kv_pool_made(m->kv_pool);
    st->empty_runs = m->kv_empty_runs;
}

/* Run i of s now in page id (-1: none); its old page is the caller's. */
static void seq_set_run(exo_seq *s, int i, int32_t id)
{
    exo_model *m = s->m;
    m->kv_empty_runs += (id < 0) - (s->page_id[i] < 0);
    s->page_id[i] = id;
    for (int b = 0; b < m->n_page_be; b++)
        s->table[b][i] = id < 0 ? NULL : exo_kv_pool_page(m->kv_pool, b, id);
    s->table_stale = true;
}

/* Drops the pages of runs [from, n_runs). */
static void seq_drop_runs(exo_seq *s, int from)
{
    for (int i = from < 0 ? 0 : from; i < s->n_runs; i++)
        if (s->page_id[i] >= 0) {
            exo_kv_pool_drop(s->m->kv_pool, s->page_id[i]);
            seq_set_run(s, i, -1);
        }
}

/* s starts over from position 0 holding pages ids[0..count) (shared: each
 * gains a holder) as its first runs; its length is the caller's to set. */
static void seq_restart_on(exo_seq *s, const int32_t *ids, int count)
{
    exo_seq_truncate(s, 0);
    if (!s->page_id)
        return;
    seq_drop_runs(s, 0);
    for (int i = 0; i < count; i++) {
        exo_kv_pool_hold(s->m->kv_pool, ids[i]);
        seq_set_run(s, i, ids[i]);
    }
}

/* The first n positions of page src copied into page dst, every paged
 * layer's. */
static int page_copy(exo_model *m, int32_t dst, int32_t src, int n)
{
    for (int l = 0; l < m->n_layers; l++) {
        if (!layer_paged(m, l))
            continue;
        exo_backend *be = m->layers[l].be;
        int b = page_backend(m, be);
        exo_attn_shape shape = {.n_heads = m->n_kv, .n_kv_heads = m->n_kv, .head_dim = m->hd,
                                .cache = m->layers[l].attn.cache};
        size_t value = exo_dtype_size(shape.cache);
        char *d = exo_kv_pool_page(m->kv_pool, b, dst), *sp = exo_kv_pool_page(m->kv_pool, b, src);
        int rc = be->ops->kv_copy(be, &shape, d + m->page_k_off[l] * value, d + m->page_v_off[l] * value,
                                  EXO_KV_PAGE, sp + m->page_k_off[l] * value, sp + m->page_v_off[l] * value,
                                  EXO_KV_PAGE, n);
        if (rc)
            return rc;
    }
    return 0;
}

/* Before a step writes positions [from, from + T) of s: a page of its own
 * for each run they fall in (a page another sequence shares is copied
 * first, up to from), and the tables the ops read brought up to date. */
static int seq_own_pages(exo_seq *s, int from, int T)
{
    exo_model *m = s->m;
    if (!m->kv_pool || T <= 0)
        return 0;
    for (int i = from / EXO_KV_PAGE; i <= (from + T - 1) / EXO_KV_PAGE; i++) {
        int32_t id = s->page_id[i], fresh;
        if (id >= 0 && exo_kv_pool_refs(m->kv_pool, id) == 1)
            continue;
        int rc = exo_kv_pool_take(m->kv_pool, &fresh);
        if (rc)
            return rc;
        int held = from - i * EXO_KV_PAGE; /* positions of the run before from */
        if (id >= 0 && held > 0 && (rc = page_copy(m, fresh, id, held < EXO_KV_PAGE ? held : EXO_KV_PAGE))) {
            exo_kv_pool_drop(m->kv_pool, fresh);
            return rc;
        }
        if (id >= 0)
            exo_kv_pool_drop(m->kv_pool, id);
        seq_set_run(s, i, fresh);
    }
    if (!s->table_stale)
        return 0;
    for (int b = 0; b < m->n_page_be; b++) {
        int rc = m->page_be[b]->ops->to_device(m->page_be[b], s->table_dev[b], s->table[b],
                                               sizeof(void *) * (size_t)s->n_runs);
        if (rc)
            return rc;
    }
    s->table_stale = false;
    return 0;
}

/* Layer l's cache of s as the attention ops take it. */
static exo_kv_view seq_view(const exo_seq *s, int l)
{
    const exo_model *m = s->m;
    if (layer_paged(m, l))
        return (exo_kv_view){.pages = s->table_dev[page_backend(m, m->layers[l].be)], .k_off = m->page_k_off[l],
                             .v_off = m->page_v_off[l], .capacity = s->alloc_capacity, .page = EXO_KV_PAGE};
    return (exo_kv_view){.k = s->k_cache[l], .v = s->v_cache[l], .capacity = s->slots[l], .page = s->slots[l]};
}

int exo_seq_create(exo_model *m, int capacity, exo_seq **out, exo_err *err)
{
    *out = NULL;
    if (capacity <= 0)
        return exo_err_set(err, EXO_EINVAL, "sequence capacity must be > 0");
    static _Atomic uint64_t next_id = 1;
    exo_seq *s = exo_calloc(1, sizeof *s);
    s->m = m;
    s->id = next_id++;
    if (capacity > INT32_MAX - EXO_KV_BLOCK) {
        exo_free(s);
        return exo_err_set(err, EXO_ERANGE, "sequence capacity %d too large", capacity);
    }
    s->capacity = capacity;
    s->alloc_capacity = round_to_block(capacity);
    s->snap_len = -1;
    s->state_floats = linear_state_floats(m);
    s->k_cache = exo_calloc((size_t)m->n_layers, sizeof(void *));
    s->v_cache = exo_calloc((size_t)m->n_layers, sizeof(void *));
    s->state = exo_calloc((size_t)m->n_layers, sizeof(float *));
    s->kv_block = exo_calloc((size_t)m->n_layers, sizeof(void *));
    s->slots = exo_calloc((size_t)m->n_layers, sizeof(int));
    for (int l = 0; l < m->n_layers; l++)
        s->slots[l] = layer_slots(m, s->alloc_capacity, l);
    if (m->kv_pool) {
        s->n_runs = runs_of(s->alloc_capacity);
        s->page_id = exo_malloc(sizeof(int32_t) * (size_t)s->n_runs);
        for (int i = 0; i < s->n_runs; i++)
            s->page_id[i] = -1;
        m->kv_empty_runs += s->n_runs;
        for (int b = 0; b < m->n_page_be; b++) {
            s->table[b] = exo_calloc((size_t)s->n_runs, sizeof(void *));
            s->table_dev[b] = m->page_be[b]->ops->alloc(m->page_be[b], sizeof(void *) * (size_t)s->n_runs);
            if (!s->table_dev[b]) {
                exo_seq_free(s);
                return exo_err_set(err, EXO_ENOMEM, "cannot allocate a page table for %d tokens", capacity);
            }
        }
    }
    /* One block per backend for all its layers' K and V: decode reads the
     * whole cache every token, and a block of 2 MiB or more gets huge
     * pages (per-layer caches are often smaller; on 4 KiB pages the
     * attention reads stalled at every page, see core/alloc.c) */
    for (int l = 0; l < m->n_layers; l++) {
        exo_backend *be = m->layers[l].be;
        if (s->k_cache[l] || s->state[l] || layer_paged(m, l))
            continue;
        size_t n = 0;
        for (int i = l; i < m->n_layers; i++)
            if (m->layers[i].be == be)
                n += seq_own_bytes(m, s, i);
        char *block = be->ops->alloc(be, n);
        if (!block) {
            exo_seq_free(s);
            return exo_err_set(err, EXO_ENOMEM, "cannot allocate KV cache for %d tokens", capacity);
        }
        s->kv_block[l] = block;
        m->kv_own_bytes += (int64_t)n;
        for (int i = l; i < m->n_layers; i++)
            if (m->layers[i].be == be && !layer_paged(m, i)) {
                if (m->layers[i].kind == EXO_LAYER_LINEAR) {
                    s->state[i] = (float *)block;
                } else {
                    s->k_cache[i] = block;
                    s->v_cache[i] = block + seq_own_bytes(m, s, i) / 2;
                }
                block += seq_own_bytes(m, s, i);
            }
    }
    *out = s;
    return 0;
}

void exo_seq_free(exo_seq *s)
{
    if (!s)
        return;
    exo_model *m = s->m;
    for (int l = 0; l < m->n_layers; l++)
        if (s->kv_block[l]) {
            exo_backend *be = m->layers[l].be;
            be->ops->release(be, s->kv_block[l]);
            for (int i = l; i < m->n_layers; i++)
                if (m->layers[i].be == be)
                    m->kv_own_bytes -= (int64_t)seq_own_bytes(m, s, i);
        }
    if (s->page_id) {
        seq_drop_runs(s, 0);
        m->kv_empty_runs -= s->n_runs;
    }
    for (int b = 0; b < m->n_page_be; b++) {
        if (s->table_dev[b])
            m->page_be[b]->ops->release(m->page_be[b], s->table_dev[b]);
        exo_free(s->table[b]);
    }
    exo_free(s->page_id);
    exo_free(s->kv_block);
    exo_free(s->k_cache);
    exo_free(s->v_cache);
    exo_free(s->state);
    exo_free(s->slots);
    exo_free(s->snap);
    exo_free(s);
}

int exo_seq_resize(exo_seq *s, int capacity, exo_err *err)
{
    if (capacity < s->len || capacity <= 0)
        return exo_err_set(err, EXO_EINVAL, "a sequence of %d positions cannot shrink to %d", s->len, capacity);
    if (round_to_block(capacity) == s->alloc_capacity) {
        s->capacity = capacity;
        return 0;
    }
    exo_model *m = s->m;
    exo_seq *n;
    int rc = exo_seq_create(m, capacity, &n, err);
    if (rc)
        return rc;
    for (int l = 0; l < m->n_layers && !rc; l++) {
        exo_backend *be = m->layers[l].be;
        if (layer_paged(m, l))
            continue;
        if (m->layers[l].kind == EXO_LAYER_LINEAR) {
            rc = be->ops->copy2d(be, n->state[l], s->state_floats, s->state[l], s->state_floats, 1,
                                 (int)s->state_floats);
            continue;
        }
        /* the positions s holds: all of them, or a ring's worth, which
         * both then have (n's capacity is at least s's length) */
        int held = s->len <= s->slots[l] && s->len <= n->slots[l] ? s->len : s->slots[l];
        exo_attn_shape shape = {.n_heads = m->n_kv, .n_kv_heads = m->n_kv, .head_dim = m->hd,
                                .cache = m->layers[l].attn.cache};
        rc = be->ops->kv_copy(be, &shape, n->k_cache[l], n->v_cache[l], n->slots[l], s->k_cache[l], s->v_cache[l],
                              s->slots[l], held);
    }
    /* the old caches and page tables go once the work queued on them is
     * done */
    for (int l = 0; l < m->n_layers && !rc; l++)
        if (n->kv_block[l])
            rc = m->layers[l].be->ops->sync(m->layers[l].be);
    for (int b = 0; b < m->n_page_be && !rc; b++)
        rc = m->page_be[b]->ops->sync(m->page_be[b]);
    if (rc) {
        exo_seq_free(n);
        return exo_err_set(err, rc, "moving a sequence's caches to %d positions failed", capacity);
    }
    /* n's table takes s's pages of the runs both have */
    for (int i = 0; i < s->n_runs && i < n->n_runs; i++)
        if (s->page_id[i] >= 0) {
            int32_t id = s->page_id[i];
            seq_set_run(s, i, -1);
            seq_set_run(n, i, id);
        }
    /* s takes n's caches, capacity and id (its recorded steps named the old
     * caches); n takes s's old caches and frees them */
    exo_seq old = *s;
    s->id = n->id;
    s->capacity = n->capacity;
    s->alloc_capacity = n->alloc_capacity;
    s->k_cache = n->k_cache;
    s->v_cache = n->v_cache;
    s->slots = n->slots;
    s->state = n->state;
    s->kv_block = n->kv_block;
    n->k_cache = old.k_cache;
    n->v_cache = old.v_cache;
    n->slots = old.slots;
    n->state = old.state;
    n->kv_block = old.kv_block;
    s->n_runs = n->n_runs;
    s->page_id = n->page_id;
    s->table_stale = n->table_stale;
    n->n_runs = old.n_runs;
    n->page_id = old.page_id;
    for (int b = 0; b < 2; b++) {
        s->table[b] = n->table[b];
        s->table_dev[b] = n->table_dev[b];
        n->table[b] = old.table[b];
        n->table_dev[b] = old.table_dev[b];
    }
    exo_seq_free(n);
    return 0;
}

int exo_seq_len(const exo_seq *s) { return s->len; }
int exo_seq_capacity(const exo_seq *s) { return s->capacity; }

/* Copies every linear layer's state to (save) or from the snapshot. */
static int seq_snapshot(exo_seq *s, bool save)
{
    exo_model *m = s->m;
    size_t bytes = s->state_floats * sizeof(float);
    if (save && !s->snap) {
        s->snap = exo_try_malloc(bytes * (size_t)m->n_linear);
        if (!s->snap)
            return EXO_ENOMEM;
    }
    for (int l = 0, i = 0; l < m->n_layers; l++) {
        if (m->layers[l].kind != EXO_LAYER_LINEAR)
            continue;
        exo_backend *be = m->layers[l].be;
        float *host = s->snap + (size_t)i++ * s->state_floats;
        int rc = save ? be->ops->to_host(be, host, s->state[l], bytes)
                      : be->ops->to_device(be, s->state[l], host, bytes);
        if (rc)
            return rc;
    }
    return 0;
}

/* Before a multi-token step of a sequence with recurrent state: its state
 * now, to go back to if the step fails. */
static int seq_keep_start(exo_seq *s)
{
    if (seq_snapshot(s, true))
        return EXO_ENOMEM;
    s->snap_len = s->len;
    return 0;
}

static void seq_reset_state(exo_seq *s);

/* A step of s that began at len0 failed: the sequence goes back to len0,
 * its recurrent state to the snapshot taken there, or from scratch at 0;
 * else the state is lost. */
static void seq_step_failed(exo_seq *s, int len0)
{
    s->len = len0;
    if (s->m->n_linear) {
        if (len0 == 0)
            seq_reset_state(s);
        else if (s->snap_len != len0 || seq_snapshot(s, false))
            s->state_lost = true;
    }
}

static void seq_reset_state(exo_seq *s)
{
    exo_model *m = s->m;
    for (int l = 0; l < m->n_layers; l++)
        if (m->layers[l].kind == EXO_LAYER_LINEAR)
            m->layers[l].be->ops->zero(m->layers[l].be, s->state[l], s->state_floats);
    s->state_lost = false;
    s->snap_len = -1;
}

bool exo_seq_can_return(const exo_seq *s, int n)
{
    if (n >= s->len)
        return true;
    /* a recurrent state goes back only to the start or to its snapshot
     * (taken where the last multi-token step began) */
    if (n < 0 || (s->m->n_linear && n != 0 && n != s->snap_len))
        return false;
    for (int l = 0; l < s->m->n_layers; l++) {
        /* a ring of `slots` holds positions len - slots .. len - 1; the next
         * query at n needs n - window + 1 .. */
        int window = s->m->layers[l].attn.sliding_window;
        if (s->slots && s->slots[l] < s->alloc_capacity && window > 0 && n - window + 1 < s->len - s->slots[l])
            return false;
    }
    return true;
}

void exo_seq_truncate(exo_seq *s, int n)
{
    if (n < 0 || n >= s->len)
        return;
    s->len = n;
    if (s->page_id) /* the runs wholly past n hold nothing now */
        seq_drop_runs(s, (n + EXO_KV_PAGE - 1) / EXO_KV_PAGE);
    if (!s->m->n_linear)
        return;
    if (n == 0)
        seq_reset_state(s);
    else if (n == s->snap_len && !seq_snapshot(s, false))
        s->state_lost = false;
    else
        s->state_lost = true;
}

/* Whether a ring of `slots` that has held `len` positions still holds what
 * a query at position n reads before n (from n - window + 1): a ring keeps
 * positions len - slots .. len - 1. */
static bool ring_holds(int window, int len, int slots, int n)
{
    return window <= 0 || n - window + 1 >= len - slots;
}

/* Copies what a query at n reads of positions < n from layer l's ring (or
 * unwrapped run) of src_slots into one of dst_slots: the first n slots
 * where n fits in both (positions below n sit in slot = position there),
 * every slot where both rings have as many (a position keeps its slot);
 * else EXO_EUNSUPPORTED. The caller checked that the ring still holds
 * them (ring_holds). */
static int ring_copy(exo_model *m, int l, void *dk, void *dv, int dst_slots, const void *sk, const void *sv,
                     int src_slots, int n, bool dry_run)
{
    int count = n <= src_slots && n <= dst_slots ? n : src_slots == dst_slots ? src_slots : -1;
    if (count < 0)
        return EXO_EUNSUPPORTED;
    if (dry_run)
        return 0;
    exo_backend *be = m->layers[l].be;
    exo_attn_shape shape = {.n_heads = m->n_kv, .n_kv_heads = m->n_kv, .head_dim = m->hd,
                            .cache = m->layers[l].attn.cache};
    return be->ops->kv_copy(be, &shape, dk, dv, dst_slots, sk, sv, src_slots, count);
}

/* Whether a ring layer: a sliding layer's cache a sequence holds itself
 * (not a linear layer's state, not pages). */
static bool layer_ring(const exo_model *m, int l)
{
    return !layer_paged(m, l) && m->layers[l].kind != EXO_LAYER_LINEAR;
}

/* The first ring layer whose ring of src_slots cannot go into dst's at n
 * (ring_copy), or -1. */
static int ring_misfit(const exo_model *m, const int *dst_slots, const int *src_slots, int n)
{
    for (int l = 0; l < m->n_layers; l++)
        if (layer_ring(m, l) && ring_copy((exo_model *)m, l, NULL, NULL, dst_slots[l], NULL, NULL, src_slots[l], n,
                                          true))
            return l;
    return -1;
}

/* dst, its pages already in place, takes the caches it holds itself from
 * a sequence's or a kept prefix's at n (per layer: rings k, v of slots;
 * the linear layers' states one after another), and is then n long and
 * can go back to n; on failure it starts over empty. */
static int seq_own_from(exo_seq *dst, int n, void *const *k, void *const *v, const int *slots,
                        const float *states, size_t state_floats)
{
    exo_model *m = dst->m;
    int rc = 0;
    for (int l = 0, i = 0; l < m->n_layers && !rc; l++) {
        exo_backend *be = m->layers[l].be;
        if (m->layers[l].kind == EXO_LAYER_LINEAR)
            rc = be->ops->to_device(be, dst->state[l], states + (size_t)i++ * state_floats,
                                    state_floats * sizeof(float));
        else if (layer_ring(m, l))
            rc = ring_copy(m, l, dst->k_cache[l], dst->v_cache[l], dst->slots[l], k[l], v[l], slots[l], n, false);
    }
    if (!rc) {
        dst->len = n;
        if (m->n_linear && seq_keep_start(dst))
            rc = EXO_ENOMEM;
    }
    if (rc)
        seq_restart_on(dst, NULL, 0);
    return rc;
}

int exo_seq_copy_prefix(exo_seq *dst, exo_seq *src, int n, exo_err *err)
{
    exo_model *m = dst->m;
    if (src->m != m || src == dst)
        return exo_err_set(err, EXO_EINVAL, "copy_prefix: sequences of different models, or the same one");
    if (n <= 0 || n > src->len || n > dst->capacity)
        return exo_err_set(err, EXO_EINVAL, "copy_prefix: %d positions of a sequence of %d", n, src->len);
    if ((m->n_linear && n != src->snap_len) || src->state_lost || !exo_seq_can_return(src, n))
        return exo_err_set(err, EXO_EUNSUPPORTED, "copy_prefix: the sequence keeps no state at %d", n);
    int l = ring_misfit(m, dst->slots, src->slots, n);
    if (l >= 0)
        return exo_err_set(err, EXO_EUNSUPPORTED, "copy_prefix: %d positions wrap a sliding layer's ring of %d slots, "
                           "the other's has %d", n, src->slots[l], dst->slots[l]);
    for (int i = 0; i < n / EXO_KV_PAGE && src->page_id; i++)
        if (src->page_id[i] < 0)
            return exo_err_set(err, EXO_EINVAL, "copy_prefix: the sequence has no page for positions %d..",
                               i * EXO_KV_PAGE);
    /* whole pages shared, the rest copied into a page of dst's own */
    int whole = n / EXO_KV_PAGE, rc = 0;
    seq_restart_on(dst, src->page_id, m->kv_pool ? whole : 0);
    if (m->kv_pool) {
        int32_t id;
        if (n % EXO_KV_PAGE && !(rc = exo_kv_pool_take(m->kv_pool, &id))) {
            seq_set_run(dst, whole, id);
            rc = page_copy(m, id, src->page_id[whole], n % EXO_KV_PAGE);
        }
    }
    if (rc)
        seq_restart_on(dst, NULL, 0);
    else
        rc = seq_own_from(dst, n, src->k_cache, src->v_cache, src->slots, src->snap, src->state_floats);
    if (rc)
        return exo_err_set(err, rc, "copy_prefix: copying %d positions failed: %s", n, exo_strerror(rc));
    return 0;
}

/* A kept prefix: the pages of its first n positions, and what the
 * sequence held itself at that point: each ring layer's ring as it was
 * (holding positions len - slots .. len - 1), the linear layers' states
 * at n. */
struct exo_kv_prefix {
    exo_model *m;
    int n;          /* positions, in prefix_pages(n) pages (the last may be part full) */
    int len;        /* the sequence's length when kept */
    int32_t *pages;
    void **k, **v;  /* per layer: a ring layer's ring as it was (k[l] the allocation), else NULL */
    int *slots;
    float *states;  /* host: n_linear * state_floats */
    size_t state_floats;
    int64_t own_bytes;  /* counted in the model's kv_own_bytes while kept */
};

/* The pages holding n positions. A prefix shares a last page it fills
 * only in part too: a sequence that writes into a shared page copies the
 * positions before its write first (seq_own_pages), whichever of the
 * sharers it is. */
static int prefix_pages(int n) { return (n + EXO_KV_PAGE - 1) / EXO_KV_PAGE; }

void exo_kv_prefix_free(exo_kv_prefix *p)
{
    if (!p)
        return;
    exo_model *m = p->m;
    for (int i = 0; p->pages && i < prefix_pages(p->n); i++)
        exo_kv_pool_drop(m->kv_pool, p->pages[i]);
    for (int l = 0; p->k && l < m->n_layers; l++)
        if (p->k[l])
            m->layers[l].be->ops->release(m->layers[l].be, p->k[l]);
    m->kv_own_bytes -= p->own_bytes;
    exo_free(p->pages);
    exo_free(p->k);
    exo_free(p->v);
    exo_free(p->slots);
    exo_free(p->states);
    exo_free(p);
}

int exo_seq_keep_prefix(exo_seq *s, int n, exo_kv_prefix **out, exo_err *err)
{
    exo_model *m = s->m;
    *out = NULL;
    if (n <= 0 || n > s->len)
        return exo_err_set(err, EXO_EINVAL, "keep_prefix: %d positions of a sequence of %d", n, s->len);
    if ((m->n_linear && n != s->snap_len) || s->state_lost || !exo_seq_can_return(s, n))
        return exo_err_set(err, EXO_EUNSUPPORTED, "keep_prefix: the sequence keeps no state at %d", n);
    exo_kv_prefix *p = exo_calloc(1, sizeof *p);
    p->m = m;
    p->n = n;
    p->len = s->len;
    p->k = exo_calloc((size_t)m->n_layers, sizeof *p->k);
    p->v = exo_calloc((size_t)m->n_layers, sizeof *p->v);
    p->slots = exo_calloc((size_t)m->n_layers, sizeof *p->slots);
    int rc = 0;
    if (m->kv_pool) {
        p->pages = exo_malloc(sizeof(int32_t) * (size_t)prefix_pages(n));
        for (int i = 0; i < prefix_pages(n); i++) {
            p->pages[i] = s->page_id[i];
            exo_kv_pool_hold(m->kv_pool, p->pages[i]);
        }
    }
    for (int l = 0; l < m->n_layers && !rc; l++) {
        if (!layer_ring(m, l))
            continue;
        exo_backend *be = m->layers[l].be;
        size_t bytes = layer_bytes(m, l, s->slots[l]);
        p->k[l] = be->ops->alloc(be, bytes);
        if (!p->k[l]) {
            rc = EXO_ENOMEM;
            break;
        }
        p->v[l] = (char *)p->k[l] + bytes / 2;
        p->slots[l] = s->slots[l];
        p->own_bytes += (int64_t)bytes;
        m->kv_own_bytes += (int64_t)bytes;
        rc = ring_copy(m, l, p->k[l], p->v[l], p->slots[l], s->k_cache[l], s->v_cache[l], s->slots[l], s->slots[l],
                       false);
    }
    if (!rc && m->n_linear) {
        p->state_floats = s->state_floats;
        size_t floats = s->state_floats * (size_t)m->n_linear;
        p->states = exo_try_malloc(floats * sizeof(float));
        if (p->states) {
            memcpy(p->states, s->snap, floats * sizeof(float));
            p->own_bytes += (int64_t)(floats * sizeof(float));
            m->kv_own_bytes += (int64_t)(floats * sizeof(float));
        } else {
            rc = EXO_ENOMEM;
        }
    }
    if (rc) {
        exo_kv_prefix_free(p);
        return exo_err_set(err, rc, "keep_prefix: cannot keep the caches of %d positions", n);
    }
    *out = p;
    return 0;
}

bool exo_kv_prefix_can_take(const exo_kv_prefix *p, int n)
{
    const exo_model *m = p->m;
    if (n <= 0 || n > p->n || (m->n_linear && n != p->n))
        return false;
    for (int l = 0; l < m->n_layers; l++)
        if (p->k[l] && !ring_holds(m->layers[l].attn.sliding_window, p->len, p->slots[l], n))
            return false;
    return true;
}

int exo_seq_take_prefix(exo_seq *dst, const exo_kv_prefix *p, int n, exo_err *err)
{
    exo_model *m = dst->m;
    if (p->m != m || n <= 0 || n > p->n || n > dst->capacity)
        return exo_err_set(err, EXO_EINVAL, "take_prefix: %d positions of a prefix of %d into a sequence of %d", n,
                           p->n, dst->capacity);
    if (!exo_kv_prefix_can_take(p, n))
        return exo_err_set(err, EXO_EUNSUPPORTED, "take_prefix: the prefix keeps no state at %d", n);
    int l = ring_misfit(m, dst->slots, p->slots, n);
    if (l >= 0)
        return exo_err_set(err, EXO_EUNSUPPORTED, "take_prefix: a ring of %d slots into one of %d", p->slots[l],
                           dst->slots[l]);
    seq_restart_on(dst, p->pages, p->pages ? prefix_pages(n) : 0);
    int rc = seq_own_from(dst, n, p->k, p->v, p->slots, p->states, p->state_floats);
    if (rc)
        return exo_err_set(err, rc, "take_prefix: copying %d positions failed: %s", n, exo_strerror(rc));
    return 0;
}

int exo_kv_prefix_len(const exo_kv_prefix *p) { return p->n; }

/* ---- forward ------------------------------------------------------------ */

#define OK(x)                \
    do {                     \
        int rc_ = (x);       \
        if (rc_)             \
            return rc_;      \
    } while (0)

/* Whether the group's sums run among its GPUs (backend.h group_*), asked
 * at the first sum, where every rank is at the same call: each rank says
 * whether it can (its whole shard on a GPU whose backend joins groups, a
 * library that loads; EXO_TP_SUMS=host says no), in one sum over the ring
 * that also carries rank 0's name for the group (bytes as floats, which
 * add exactly to themselves); if all can, all join, and a second sum says
 * whether all did. Any no: every rank sums on the host, as before. */
static int decide_group(exo_model *m, exo_err *err)
{
    const char *env = getenv("EXO_TP_SUMS");
    exo_backend *g = m->gpu;
    bool able = g && m->gpu_layers == m->n_layers && g->ops->group_join && !(env && !strcmp(env, "host"));
    float say[1 + EXO_GROUP_ID_BYTES] = {0};
    uint8_t id[EXO_GROUP_ID_BYTES];
    exo_err why = {0};
    if (able && g->ops->group_new_id(g, m->tp_rank == 0 ? id : NULL, &why)) {
        EXO_LOG_INFO("tensor parallel: partial sums through the host: %s", why.msg);
        able = false;
    }
    say[0] = able;
    if (able && m->tp_rank == 0)
        for (int i = 0; i < EXO_GROUP_ID_BYTES; i++)
            say[1 + i] = id[i];
    OK(m->allreduce(m->allreduce_ctx, say, 1, 1 + EXO_GROUP_ID_BYTES, err));
    m->group = -1;
    if ((int)say[0] != m->tp_size)
        return 0;
    for (int i = 0; i < EXO_GROUP_ID_BYTES; i++)
        id[i] = (uint8_t)say[1 + i];
    bool joined = !g->ops->group_join(g, id, m->tp_size, m->tp_rank, 60000, &why);
    if (!joined)
        EXO_LOG_WARN("tensor parallel: cannot join the GPUs' group: %s", why.msg);
    float all[1] = {joined};
    OK(m->allreduce(m->allreduce_ctx, all, 1, 1, err));
    if ((int)all[0] != m->tp_size) {
        if (joined)
            g->ops->group_leave(g);
        return 0;
    }
    EXO_LOG_INFO("tensor parallel: rank %d of %d sums among the GPUs", m->tp_rank, m->tp_size);
    m->group = 1;
    return 0;
}

/* Tensor parallel: sum the ranks' partial products (a no-op otherwise).
 * Among the GPUs where the group can (decide_group), else through the
 * host's ring (a TCP ring between nodes): a GPU rank's rows go through
 * the bounce buffer and back, two copies of T x dim floats. */
static int reduce(exo_model *m, exo_backend *be, float *x, int T, exo_err *err)
{
    if (!m->allreduce)
        return 0;
    size_t n = (size_t)T * (size_t)m->dim;
    if (!m->group)
        OK(decide_group(m, err));
    if (m->group > 0 && be != m->cpu) {
        int rc = be->ops->group_allreduce(be, x, n);
        if (rc)
            return exo_err_set(err, rc, "tensor parallel: the GPUs' sum failed");
        return 0;
    }
    if (be == m->cpu)
        return m->allreduce(m->allreduce_ctx, x, (size_t)T, (size_t)m->dim, err);
    OK(be->ops->to_host(be, m->bounce, x, sizeof(float) * n));
    OK(m->allreduce(m->allreduce_ctx, m->bounce, (size_t)T, (size_t)m->dim, err));
    return be->ops->to_device(be, x, m->bounce, sizeof(float) * n);
}

/* Per-expert biases (gpt-oss): gate, up and down of expert e. */
static const float *expert_bias(const exo_model *m, const layer *L, int e, int p)
{
    if (!L->expert_bias)
        return NULL;
    return L->expert_bias + (size_t)e * (size_t)(2 * m->moe_ffn + m->dim) + (size_t)p * (size_t)m->moe_ffn;
}

/* The shared experts of the normed rows in a->h, into sum: one SwiGLU MLP
 * on every token, times the sigmoid of its own gate (qwen3_next). */
static int shared_forward(exo_model *m, layer *L, int T, float *sum)
{
    exo_backend *be = L->be;
    const exo_backend_ops *o = be->ops;
    acts *a = acts_of(m, be);
    const exo_linear *gu[2] = {&L->sh_gate, &L->sh_up};
    float *const gu_out[2] = {a->g, a->u};
    OK(o->matmul(be, 2, gu, a->h, T, gu_out));
    OK(o->glu(be, m->glu, a->g, a->u, (size_t)T * (size_t)m->sh_ffn, m->glu_limit));
    const exo_linear *wd[1] = {&L->sh_down};
    float *const yo[1] = {a->ye};
    OK(o->matmul(be, 1, wd, a->g, T, yo));
    if (L->sh_router.rows) {
        const exo_linear *r[1] = {&L->sh_router};
        float *const ro[1] = {a->sg};
        OK(o->matmul(be, 1, r, a->h, T, ro));
        OK(o->sigmoid_mul(be, a->ye, a->sg, T, m->dim, 1));
    }
    return o->add(be, sum, a->ye, (size_t)T * (size_t)m->dim);
}

/* y[i] = x' W[i]^T with x' = rmsnorm(x, norm) folded into the products
 * where norm is set (backend.h matmul_fused), else x' = x. */
static int normed_products(exo_model *m, exo_backend *be, int n, const exo_linear *const *w, const float *x,
                           const float *norm, int T, float *const *y)
{
    if (norm)
        return be->ops->matmul_fused(be, n, w, x, norm, m->eps, false, T, y);
    return be->ops->matmul(be, n, w, x, T, y);
}

/* Whether a decode step of this sparse layer picks its experts on the
 * device (and folds the MLP norm and the activation into its products). */
static bool decodes_picked(const exo_model *m, const layer *L)
{
    /* (a tensor-parallel rank has no pick_table: pick_on_device) */
    return L->pick_table && !m->moe_host_route && !m->moe_per_expert && L->be->ops->matmul_fused &&
           L->be->ops->matmul_glu;
}

/* moe_decode's second half with the router's choice left on the device:
 * each chosen expert's weights are an exo_linear naming its slot of
 * pick_idx (increasing expert order, backend.h moe_pick), which the
 * products read when they run, each of the T rows its own. The same
 * dispatches as the host route but the activation, which the down
 * products apply as they read their inputs (matmul_glu), and the same
 * order of the sum; T rows take them once for all (slot-major, backend.h
 * add_weighted_rows), each row's arithmetic that of the row alone. */
static int moe_decode_picked(exo_model *m, layer *L, const exo_moe_router *rt, int T, float *sum, const float *x,
                             const float *norm)
{
    exo_backend *be = L->be;
    const exo_backend_ops *o = be->ops;
    acts *a = acts_of(m, be);
    int k = m->topk, I = m->moe_ffn, D = m->dim, sh = L->has_shared, S = sh ? m->sh_ffn : 0;
    size_t TI = (size_t)T * (size_t)I, TD = (size_t)T * (size_t)D;
    OK(o->moe_pick(be, rt, a->router, T, a->pick_idx, a->pick_w));
    exo_linear *chosen = a->picked;
    exo_linear_pick_slots(chosen, k, L->experts, L->pick_table, L->n_experts, a->pick_idx, k);
    for (int j = 0; j < k; j++) {
        a->sel_w[2 * j] = &chosen[3 * j];
        a->sel_w[2 * j + 1] = &chosen[3 * j + 1];
        a->sel_y[2 * j] = a->g + (size_t)j * TI;
        a->sel_y[2 * j + 1] = a->u + (size_t)j * TI;
    }
    OK(normed_products(m, be, 2 * k, a->sel_w, x, norm, T, a->sel_y));
    size_t per = (size_t)(2 * I + D); /* an expert's biases: gate, up, down (expert_bias) */
    if (L->expert_bias) {
        OK(o->add_picked_bias(be, a->g, L->expert_bias, per, a->pick_idx, T, k, I));
        OK(o->add_picked_bias(be, a->u, L->expert_bias + I, per, a->pick_idx, T, k, I));
    }
    /* output rows: the shared expert's first; its input rows are S apart,
     * so it joins the routed ones' call only where that is their stride.
     * The activation is applied as the products read their inputs. */
    int n = k;
    for (int j = 0; j < k + sh; j++) {
        a->sel_w[j] = j < k ? &chosen[3 * j + 2] : &L->sh_down;
        a->sel_g[j] = a->g + (size_t)j * TI;
        a->sel_u[j] = a->u + (size_t)j * TI;
        a->sel_y[j] = j < k ? a->ye + (size_t)(sh + j) * TD : a->ye;
    }
    bool shared_apart = sh && T > 1 && S != I;
    n += sh && !shared_apart;
    OK(o->matmul_glu(be, n, a->sel_w, m->glu, a->sel_g, a->sel_u, m->glu_limit, false, T, a->sel_y));
    if (shared_apart)
        OK(o->matmul_glu(be, 1, a->sel_w + k, m->glu, a->sel_g + k, a->sel_u + k, m->glu_limit, false, T,
                         a->sel_y + k));
    if (L->expert_bias)
        OK(o->add_picked_bias(be, a->ye + (size_t)sh * TD, L->expert_bias + 2 * I, per, a->pick_idx, T, k, D));
    if (L->sh_router.rows)
        OK(o->sigmoid_mul(be, a->ye, a->sg, T, D, 1));
    return o->add_weighted_rows(be, sum, a->ye, a->pick_w, T, k, sh, D);
}

/* Decode (a token; on the device route up to moe_decode_rows) through a
 * mixture-of-experts MLP in six dispatches, whatever k is, the seeds'
 * fusions in CPU form:
 *   1. the router, and the shared experts' gate and up (and gate logit),
 *      one pass over the normed activations;
 *   2. the k chosen experts' gate and up, one dispatch (2k weights);
 *   3. the activation of all of them, routed and shared, at once (on
 *      the device route, by the down projections as they read them);
 *   4. every down projection, routed and shared, one dispatch with each
 *      weight reading its own input (matmul_each): both threads work through
 *      all k + 1 experts' rows, however few they are;
 *   5. the shared expert's sigmoid gate (qwen3_next);
 *   6. the weighted sum of the k + 1 outputs added into the residual.
 * Only the chosen experts' bytes are read. The sum takes the shared
 * expert first and then the chosen ones in increasing expert order, as a
 * prompt's rows take them (moe_forward), so a token decoded alone and in a
 * batch of rows adds the same numbers in the same order. x' is x through
 * norm when it is set, else x (the normed rows in a->h); sum is added to.
 * T tokens at once (rows of x and sum, at most moe_decode_rows) where the
 * experts are picked on the device (decodes_picked), else one. */
static int moe_decode(exo_model *m, layer *L, int T, float *sum, const float *x, const float *norm, exo_err *err)
{
    exo_backend *be = L->be;
    const exo_backend_ops *o = be->ops;
    acts *a = acts_of(m, be);
    int k = m->topk, I = m->moe_ffn, D = m->dim, S = L->has_shared ? m->sh_ffn : 0, sh = L->has_shared;
    size_t kTI = (size_t)k * (size_t)T * (size_t)I;
    const exo_linear *first[4] = {&L->router, &L->sh_gate, &L->sh_up, &L->sh_router};
    float *const first_out[4] = {a->router, a->g + kTI, a->u + kTI, a->sg};
    int nfirst = !L->has_shared ? 1 : L->sh_router.rows ? 4 : 3;
    if (T > 1 && !decodes_picked(m, L))
        return exo_err_set(err, EXO_EINTERNAL, "moe_decode: %d rows on the host route", T);
    OK(normed_products(m, be, nfirst, first, x, norm, T, first_out));
    exo_moe_router rt = m->router;
    rt.bias = L->e_score_bias;
    if (decodes_picked(m, L))
        return moe_decode_picked(m, L, &rt, T, sum, x, norm);
    OK(o->moe_route(be, &rt, a->router, 1, a->top_idx, a->top_w));
    exo_moe_by_expert(a->top_idx, a->top_w, k);
    for (int j = 0; j < k; j++) {
        const exo_linear *ex = &L->experts[3 * a->top_idx[j]];
        a->sel_w[2 * j] = &ex[0];
        a->sel_w[2 * j + 1] = &ex[1];
        a->sel_y[2 * j] = a->g + (size_t)j * (size_t)I;
        a->sel_y[2 * j + 1] = a->u + (size_t)j * (size_t)I;
    }
    OK(normed_products(m, be, 2 * k, a->sel_w, x, norm, 1, a->sel_y));
    for (int j = 0; j < k && L->expert_bias; j++) {
        OK(o->add_bias(be, a->g + (size_t)j * (size_t)I, expert_bias(m, L, a->top_idx[j], 0), 1, I));
        OK(o->add_bias(be, a->u + (size_t)j * (size_t)I, expert_bias(m, L, a->top_idx[j], 1), 1, I));
    }
    OK(o->glu(be, m->glu, a->g, a->u, (size_t)k * (size_t)I + (size_t)S, m->glu_limit));
    /* output rows: the shared expert's first, then the chosen in expert order */
    for (int j = 0; j < k; j++) {
        a->sel_w[j] = &L->experts[3 * a->top_idx[j] + 2];
        a->sel_x[j] = a->g + (size_t)j * (size_t)I;
        a->sel_y[j] = a->ye + (size_t)(sh + j) * (size_t)D;
        a->rows[sh + j] = 0;
        a->row_w[sh + j] = a->top_w[j];
    }
    if (sh) {
        a->sel_w[k] = &L->sh_down;
        a->sel_x[k] = a->g + (size_t)k * (size_t)I;
        a->sel_y[k] = a->ye;
        a->rows[0] = 0;
        a->row_w[0] = 1.0f;
    }
    OK(o->matmul_each(be, k + sh, a->sel_w, a->sel_x, 1, a->sel_y));
    for (int j = 0; j < k && L->expert_bias; j++)
        OK(o->add_bias(be, a->ye + (size_t)(sh + j) * (size_t)D, expert_bias(m, L, a->top_idx[j], 2), 1, D));
    if (L->sh_router.rows)
        OK(o->sigmoid_mul(be, a->ye, a->sg, 1, D, 1));
    OK(o->scatter_add_rows(be, sum, a->ye, a->rows, a->row_w, k + sh, D));
    if (m->allreduce) {
        OK(reduce(m, be, sum, 1, err));
        OK(o->add(be, a->x, sum, (size_t)D));
    }
    return 0;
}

/* x += the experts' outputs for the normed rows in a->h (see the top). A
 * tensor-parallel rank sums its share of them apart, for the all-reduce. */
static int moe_forward(exo_model *m, layer *L, int T, exo_err *err)
{
    exo_backend *be = L->be;
    const exo_backend_ops *o = be->ops;
    acts *a = acts_of(m, be);
    int E = L->n_experts, k = m->topk, I = m->moe_ffn;
    if (T == 1 && !m->moe_per_expert) {
        float *sum = m->allreduce ? a->moe_out : a->x;
        if (m->allreduce)
            OK(o->zero(be, sum, (size_t)m->dim));
        return moe_decode(m, L, 1, sum, a->h, NULL, err);
    }
    const exo_linear *r[1] = {&L->router};
    float *const ro[1] = {a->router};
    OK(o->matmul(be, 1, r, a->h, T, ro));
    exo_moe_router rt = m->router;
    rt.bias = L->e_score_bias;
    if (decodes_picked(m, L)) { /* the device's router, as decode's: a row's choice and weights the same bits */
        OK(o->moe_pick(be, &rt, a->router, T, a->pick_idx, a->pick_w));
        OK(o->to_host(be, a->top_idx, a->pick_idx, sizeof(int32_t) * (size_t)T * (size_t)k));
        OK(o->to_host(be, a->top_w, a->pick_w, sizeof(float) * (size_t)T * (size_t)k));
    } else {
        OK(o->moe_route(be, &rt, a->router, T, a->top_idx, a->top_w));
    }
    float *sum = m->allreduce ? a->moe_out : a->x;
    if (m->allreduce)
        OK(o->zero(be, sum, (size_t)T * (size_t)m->dim));
    if (L->has_shared)
        OK(shared_forward(m, L, T, sum));
    /* an expert's rows: as many as the call's other rows leave it, so
     * products that give each row its own bits where the backend has them */
    exo_matmul_fn *rows_mm = o->matmul_rows ? o->matmul_rows : o->matmul;
    for (int e = 0; e < E; e++) {
        int n = 0;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < k; j++)
                if (a->top_idx[t * k + j] == e) {
                    a->rows[n] = t;
                    a->row_w[n++] = a->top_w[t * k + j];
                }
        if (!n)
            continue;
        const float *in = a->h;
        if (T > 1) {
            OK(o->gather_rows(be, a->xe, a->h, a->rows, n, m->dim));
            in = a->xe;
        }
        const exo_linear *gu[2] = {&L->experts[3 * e], &L->experts[3 * e + 1]};
        float *const gu_out[2] = {a->g, a->u};
        OK(rows_mm(be, 2, gu, in, n, gu_out));
        if (L->expert_bias) {
            OK(o->add_bias(be, a->g, expert_bias(m, L, e, 0), n, I));
            OK(o->add_bias(be, a->u, expert_bias(m, L, e, 1), n, I));
        }
        OK(o->glu(be, m->glu, a->g, a->u, (size_t)n * (size_t)I, m->glu_limit));
        const exo_linear *wd[1] = {&L->experts[3 * e + 2]};
        float *const yo[1] = {a->ye};
        OK(rows_mm(be, 1, wd, a->g, n, yo));
        if (L->expert_bias)
            OK(o->add_bias(be, a->ye, expert_bias(m, L, e, 2), n, m->dim));
        OK(o->scatter_add_rows(be, sum, a->ye, a->rows, a->row_w, n, m->dim));
    }
    if (m->allreduce) {
        OK(reduce(m, be, sum, T, err));
        OK(o->add(be, a->x, sum, (size_t)T * (size_t)m->dim));
    }
    return 0;
}

/* The rows of one forward call, as runs of one sequence each: rows r0 ..
 * r0 + rows - 1 of the activations are that sequence's positions pos0 ..
 * A prompt chunk is one span; a batched decode step one span a sequence.
 * Everything but attention and recurrent state is row by row, so only
 * those loop over the spans. */
typedef struct span {
    exo_seq *s;
    int r0, rows, pos0;
} span;

/* Products the backend runs fused (backend.h matmul_fused): y = norm(x)
 * W^T, or y += x W^T into the residual stream, in one pass. */
static bool fuses(const exo_model *m, const exo_backend *be) { return be->ops->matmul_fused && !m->allreduce; }

/* Decode rows of consecutive activation rows from r0 on, one token of a
 * sequence each, gathered for one qk_norm_rope_rows and one
 * attention_rows call (backend.h). */
#define ROWS_MAX 16
typedef struct decode_rows {
    int n, r0;
    exo_kv_view cache[ROWS_MAX];
    int ring[ROWS_MAX], pos[ROWS_MAX];
} decode_rows;

/* The layer's q/k norms and rotation, for a backend that applies them in
 * its attention call (backend.h attention_rotates). */
static exo_attn_rope layer_rope(const exo_model *m, const layer *L)
{
    return (exo_attn_rope){m->rot_dim, L->inv_freq, L->mscale, L->q_norm, L->k_norm, m->eps};
}

/* Whether the backend's attention of T tokens a sequence rotates q and k
 * itself: sh->rope is then set to rope, else left NULL. */
static bool rotates(exo_backend *be, exo_attn_shape *sh, const exo_attn_rope *rope, int T)
{
    sh->rope = rope;
    if (be->ops->attention_rotates && be->ops->attention_rotates(be, sh, T))
        return true;
    sh->rope = NULL;
    return false;
}

static int attention_rows_flush(exo_model *m, int l, decode_rows *rows)
{
    layer *L = &m->layers[l];
    exo_backend *be = L->be;
    acts *a = acts_of(m, be);
    size_t QD = (size_t)m->n_heads * (size_t)m->hd, KD = (size_t)m->n_kv * (size_t)m->hd, r0 = (size_t)rows->r0;
    int n = rows->n, rc = 0;
    rows->n = 0;
    exo_attn_shape sh = L->attn;
    exo_attn_rope rope = layer_rope(m, L);
    if (!rotates(be, &sh, &rope, 1))
        rc = be->ops->qk_norm_rope_rows(be, a->q + r0 * QD, a->k + r0 * KD, n, m->n_heads, m->n_kv, m->hd, m->rot_dim,
                                        rows->pos, L->inv_freq, L->mscale, L->q_norm, L->k_norm, m->eps);
    return rc ? rc
              : be->ops->attention_rows(be, &sh, n, a->att + r0 * QD, a->q + r0 * QD, a->k + r0 * KD, a->v + r0 * KD,
                                        rows->cache, rows->ring, rows->pos);
}

/* Calls of up to this many rows (decode: the GEMV's widths) ask the
 * backend to prefetch the products that follow attention. */
#define EXO_PREFETCH_MAX_T 16

/* Softmax attention of the normed rows in a->h into a->h (before the
 * residual add): projections, q/k norms, (partial) RoPE, the layer's
 * window and sinks, gpt-oss/gated variants, output projection. Where the
 * backend fuses, the projections norm a->x themselves and the output
 * projection adds into a->x (*added). */
static int attention_forward(exo_model *m, const span *sp, int nsp, int l, int T, bool *added, exo_err *err)
{
    layer *L = &m->layers[l];
    exo_backend *be = L->be;
    const exo_backend_ops *o = be->ops;
    acts *a = acts_of(m, be);
    int QD = m->n_heads * m->hd, KD = m->n_kv * m->hd;
    decode_rows rows = {0};
    const exo_linear *qkv[4] = {&L->q, &L->k, &L->v, &L->q_gate};
    float *const qkv_out[4] = {a->q, a->k, a->v, a->qg};
    if (fuses(m, be)) /* the attention norm taken on the way in */
        OK(o->matmul_fused(be, m->attn_gated ? 4 : 3, qkv, a->x, L->attn_norm, m->eps, false, T, qkv_out));
    else
        OK(o->matmul(be, m->attn_gated ? 4 : 3, qkv, a->h, T, qkv_out));
    if (o->prefetch && T <= EXO_PREFETCH_MAX_T && !L->n_experts) { /* read in while attention runs */
        const exo_linear *next[3] = {&L->o, &L->gate, &L->up};
        int started = o->prefetch(be, 3, next);
        if (started < 0)
            return started;
        m->prefetches += started;
    }
    const exo_attn_rope rope = layer_rope(m, L);
    if (L->q_norm && !o->qk_norm_rope) {
        OK(o->rmsnorm(be, a->q, a->q, L->q_norm, T * m->n_heads, m->hd, m->eps));
        OK(o->rmsnorm(be, a->k, a->k, L->k_norm, T * m->n_kv, m->hd, m->eps));
    }
    /* decode rows of several sequences: their rotations and attention a
     * call each for all of them, where the backend takes them so */
    const bool by_rows = o->attention_rows && o->qk_norm_rope_rows && nsp > 1;
    for (int i = 0; i < nsp; i++) {
        exo_seq *s = sp[i].s;
        int n = sp[i].rows, pos0 = sp[i].pos0;
        float *q = a->q + (size_t)sp[i].r0 * (size_t)QD, *k = a->k + (size_t)sp[i].r0 * (size_t)KD;
        exo_attn_shape sh = L->attn;
        sh.ring = s->slots[l] < s->alloc_capacity ? s->slots[l] : 0;
        if (by_rows && n == 1) {
            if (rows.n && (rows.n == ROWS_MAX || sp[i].r0 != rows.r0 + rows.n))
                OK(attention_rows_flush(m, l, &rows));
            if (!rows.n)
                rows.r0 = sp[i].r0;
            rows.cache[rows.n] = seq_view(s, l);
            rows.ring[rows.n] = sh.ring;
            rows.pos[rows.n++] = pos0;
            continue;
        }
        if (rotates(be, &sh, &rope, n)) {
            /* q and k rotated in the attention call */
        } else if (o->qk_norm_rope) {
            OK(o->qk_norm_rope(be, q, k, n, m->n_heads, m->n_kv, m->hd, m->rot_dim, pos0, L->inv_freq, L->mscale,
                               L->q_norm, L->k_norm, m->eps));
        } else {
            OK(o->rope(be, q, n, m->n_heads, m->hd, m->rot_dim, pos0, L->inv_freq, L->mscale));
            OK(o->rope(be, k, n, m->n_kv, m->hd, m->rot_dim, pos0, L->inv_freq, L->mscale));
        }
        exo_kv_view kv = seq_view(s, l);
        OK(o->attention(be, &sh, a->att + (size_t)sp[i].r0 * (size_t)QD, q, k, a->v + (size_t)sp[i].r0 * (size_t)KD,
                        &kv, n, pos0));
    }
    if (rows.n)
        OK(attention_rows_flush(m, l, &rows));
    if (m->attn_gated)
        OK(o->sigmoid_mul(be, a->att, a->qg, T, QD, QD));
    const exo_linear *wo[1] = {&L->o};
    if (fuses(m, be) && !(L->bo && !L->o.out_bias) && !L->post_attn_norm) { /* straight into the residual stream */
        float *const xo[1] = {a->x};
        *added = true;
        return o->matmul_fused(be, 1, wo, a->att, NULL, 0, true, T, xo);
    }
    float *const ho[1] = {a->h};
    OK(o->matmul(be, 1, wo, a->att, T, ho));
    OK(reduce(m, be, a->h, T, err));
    if (L->bo && !L->o.out_bias)
        OK(o->add_bias(be, a->h, L->bo, T, m->dim));
    return 0;
}

/* Multi-head latent attention of the normed rows in a->h into a->h, in
 * the absorbed form for prompts and decode alike: each head's query is
 * taken into the latent space (W_UK^T q_nope), so the cache holds one
 * latent key per position, [rope key | normed latent], which is also the
 * value; every head attends over it, and its latent output goes back out
 * through W_UV before o_proj. */
static int mla_forward(exo_model *m, const span *sp, int nsp, int l, int T, exo_err *err)
{
    layer *L = &m->layers[l];
    exo_backend *be = L->be;
    const exo_backend_ops *o = be->ops;
    acts *a = acts_of(m, be);
    int H = m->n_heads, dn = m->mla_dn, dr = m->mla_dr, dv = m->mla_dv, r = m->mla_r, W = dr + r;
    const exo_linear *first[3] = {m->mla_rq ? &L->q_a : &L->q, &L->kv_c, &L->kv_rope};
    float *const first_out[3] = {m->mla_rq ? a->mq : a->q, a->mc, a->mr};
    OK(o->matmul(be, 3, first, a->h, T, first_out));
    if (m->mla_rq) {
        OK(o->rmsnorm(be, a->mq, a->mq, L->q_a_norm, T, m->mla_rq, 1e-6f));
        const exo_linear *qb[1] = {&L->q};
        float *const qo[1] = {a->q};
        OK(o->matmul(be, 1, qb, a->mq, T, qo));
    }
    OK(o->rmsnorm(be, a->mc, a->mc, L->kv_a_norm, T, r, 1e-6f)); /* the latent norms' eps is fixed */
    for (int i = 0; i < nsp; i++) {
        size_t r0 = (size_t)sp[i].r0;
        OK(o->rope(be, a->q + r0 * H * (dr + dn), sp[i].rows, H, dr + dn, dr, sp[i].pos0, L->inv_freq, L->mscale));
        OK(o->rope(be, a->mr + r0 * dr, sp[i].rows, 1, dr, dr, sp[i].pos0, L->inv_freq, L->mscale));
    }
    /* queries [rope | W_UK^T nope], the key [rope | latent] */
    OK(o->copy2d(be, a->mqa, (size_t)W, a->q, (size_t)(dr + dn), T * H, dr));
    OK(o->head_matmul(be, H, L->absorb, a->q + dr, (size_t)(dr + dn), (size_t)H * (dr + dn), a->mqa + dr,
                      (size_t)W, (size_t)H * W, T));
    OK(o->copy2d(be, a->k, (size_t)W, a->mr, (size_t)dr, T, dr));
    OK(o->copy2d(be, a->k + dr, (size_t)W, a->mc, (size_t)r, T, r));
    for (int i = 0; i < nsp; i++) {
        exo_seq *s = sp[i].s;
        size_t r0 = (size_t)sp[i].r0;
        exo_kv_view kv = seq_view(s, l);
        OK(o->attention(be, &L->attn, a->att + r0 * H * W, a->mqa + r0 * H * W, a->k + r0 * W, a->k + r0 * W,
                        &kv, sp[i].rows, sp[i].pos0));
    }
    OK(o->head_matmul(be, H, L->unabsorb, a->att + dr, (size_t)W, (size_t)H * W, a->q, (size_t)dv,
                      (size_t)H * dv, T));
    const exo_linear *wo[1] = {&L->o};
    float *const ho[1] = {a->h};
    OK(o->matmul(be, 1, wo, a->q, T, ho));
    return reduce(m, be, a->h, T, err);
}

/* Gated DeltaNet of the normed rows in a->h into a->h: projections, the
 * causal conv (continuing the sequence's conv inputs), the delta rule
 * (continuing its state), the gated norm, the output projection. */
static int linear_forward(exo_model *m, const span *sp, int nsp, int l, int T, exo_err *err)
{
    layer *L = &m->layers[l];
    exo_backend *be = L->be;
    const exo_backend_ops *o = be->ops;
    acts *a = acts_of(m, be);
    int CD = m->conv_dim, KD = m->lin_hk * m->lin_dk, VD = m->lin_hv * m->lin_dv, Hv = m->lin_hv;
    const exo_linear *in[4] = {&L->in_qkv, &L->in_z, &L->in_b, &L->in_a};
    float *const in_out[4] = {a->lqkv, a->lz, a->lb, a->la};
    OK(o->matmul(be, 4, in, a->h, T, in_out));
    for (int i = 0; i < nsp; i++) {
        float *conv_state = sp[i].s->state[l], *S = conv_state + (size_t)(m->lin_k - 1) * (size_t)CD;
        size_t r0 = (size_t)sp[i].r0;
        float *conv = a->lconv + r0 * CD;
        OK(o->conv1d_silu(be, conv, CD, a->lqkv + r0 * CD, CD, L->conv_w, conv_state, sp[i].rows, CD, m->lin_k));
        OK(o->gated_delta(be, a->att + r0 * VD, conv, conv + KD, CD, conv + 2 * KD, CD, a->la + r0 * Hv,
                          a->lb + r0 * Hv, Hv, L->A_log, L->dt_bias, S, sp[i].rows, m->lin_hk, Hv, m->lin_dk,
                          m->lin_dv));
    }
    OK(o->rmsnorm_gated(be, a->att, a->lz, VD, L->lin_norm, T, Hv, m->lin_dv, m->eps));
    const exo_linear *wo[1] = {&L->out_proj};
    float *const ho[1] = {a->h};
    OK(o->matmul(be, 1, wo, a->att, T, ho));
    return reduce(m, be, a->h, T, err);
}

static int layer_forward(exo_model *m, const span *sp, int nsp, int l, int T, exo_err *err)
{
    layer *L = &m->layers[l];
    exo_backend *be = L->be;
    const exo_backend_ops *o = be->ops;
    acts *a = acts_of(m, be);

    bool plain_attention = L->kind != EXO_LAYER_LINEAR && !m->mla, added = false;
    if (!plain_attention || !fuses(m, be))
        OK(o->rmsnorm(be, a->h, a->x, L->attn_norm, T, m->dim, m->eps));
    if (L->kind == EXO_LAYER_LINEAR)
        OK(linear_forward(m, sp, nsp, l, T, err));
    else if (m->mla)
        OK(mla_forward(m, sp, nsp, l, T, err));
    else
        OK(attention_forward(m, sp, nsp, l, T, &added, err));
    if (!added) {
        if (L->post_attn_norm)
            OK(o->rmsnorm(be, a->h, a->h, L->post_attn_norm, T, m->dim, m->eps));
        OK(o->add(be, a->x, a->h, (size_t)T * (size_t)m->dim));
    }

    const exo_linear *gu[2] = {&L->gate, &L->up};
    float *const gu_out[2] = {a->g, a->u};
    if (L->n_experts && nsp == T && decodes_picked(m, L)) {
        /* decode rows (one a sequence) take decode's picked experts
         * together, the norm folded into their products, each row's
         * products its own (the GEMV runs a row a product where rows
         * pick apart), none waiting for the host: grouping the rows by
         * expert would copy the choice to the host and launch a gather,
         * two products and a scatter for every expert some row chose (a
         * step of 8 gpt-oss-20b streams took longer than 8 steps of
         * one). Every row gets the bits it gets alone (test_batch). */
        for (int t = 0, n; t < T; t += n) {
            float *rows = a->x + (size_t)t * (size_t)m->dim;
            n = T - t < moe_decode_rows(m) ? T - t : moe_decode_rows(m);
            OK(moe_decode(m, L, n, rows, rows, L->mlp_norm, err));
        }
        return 0;
    }
    if (L->n_experts || !fuses(m, be)) {
        OK(o->rmsnorm(be, a->h, a->x, L->mlp_norm, T, m->dim, m->eps));
        if (L->n_experts)
            return moe_forward(m, L, T, err);
        OK(o->matmul(be, 2, gu, a->h, T, gu_out));
    } else {
        OK(o->matmul_fused(be, 2, gu, a->x, L->mlp_norm, m->eps, false, T, gu_out));
    }
    const exo_linear *wd[1] = {&L->down};
    if (fuses(m, be) && !L->post_mlp_norm && o->matmul_glu) {
        float *const g[1] = {a->g}, *const xo[1] = {a->x};
        const float *const u[1] = {a->u};
        return o->matmul_glu(be, 1, wd, m->glu, g, u, m->glu_limit, true, T, xo);
    }
    OK(o->glu(be, m->glu, a->g, a->u, (size_t)T * (size_t)m->ffn, m->glu_limit));
    if (fuses(m, be) && !L->post_mlp_norm) {
        float *const xo[1] = {a->x};
        return o->matmul_fused(be, 1, wd, a->g, NULL, 0, true, T, xo);
    }
    float *const ho[1] = {a->h};
    OK(o->matmul(be, 1, wd, a->g, T, ho));
    OK(reduce(m, be, a->h, T, err));
    if (L->post_mlp_norm)
        OK(o->rmsnorm(be, a->h, a->h, L->post_mlp_norm, T, m->dim, m->eps));
    OK(o->add(be, a->x, a->h, (size_t)T * (size_t)m->dim));
    return 0;
}

/* The final norm and LM head of `rows` rows of a->x from r0, into a->logits
 * on the last layer's backend (not tensor parallel). */
static int head_logits(exo_model *m, int r0, int rows)
{
    exo_backend *be = m->layers[m->n_layers - 1].be;
    acts *a = acts_of(m, be);
    const exo_linear *w[1] = {&m->lm_head};
    float *const y[1] = {a->logits};
    const float *x = a->x + (size_t)r0 * (size_t)m->dim;
    if (fuses(m, be))
        return normed_products(m, be, 1, w, x, m->final_norm, rows, y);
    OK(be->ops->rmsnorm(be, a->h, x, m->final_norm, rows, m->dim, m->eps));
    return be->ops->matmul(be, 1, w, a->h, rows, y);
}

/* Final norm and LM head for `rows` consecutive rows of a->x starting at
 * row r0; logits land in host memory at out. A tensor-parallel rank
 * computes its rows of the vocabulary, one position at a time, and the
 * ranks gather the rest. */
static int head_forward(exo_model *m, int r0, int rows, float *out, exo_err *err)
{
    exo_backend *be = m->layers[m->n_layers - 1].be;
    acts *a = acts_of(m, be);
    float *x = a->x + (size_t)r0 * (size_t)m->dim;
    size_t V = (size_t)m->vocab;
    if (!m->allgather) {
        OK(head_logits(m, r0, rows));
        return be->ops->to_host(be, out, a->logits, sizeof(float) * (size_t)rows * V);
    }
    OK(be->ops->rmsnorm(be, a->h, x, m->final_norm, rows, m->dim, m->eps));
    const exo_linear *w[1] = {&m->lm_head};
    size_t lo = (size_t)m->vocab_bounds[m->tp_rank], mine = (size_t)m->vocab_bounds[m->tp_rank + 1] - lo;
    for (int r = 0; r < rows; r++) { /* the gather fills the rest of the host row around this rank's share */
        float *const y[1] = {a->logits + lo};
        OK(be->ops->matmul(be, 1, w, a->h + (size_t)r * (size_t)m->dim, 1, y));
        OK(be->ops->to_host(be, out + (size_t)r * V + lo, a->logits + lo, sizeof(float) * mine));
        OK(m->allgather(m->allreduce_ctx, out + (size_t)r * V, m->vocab_bounds, err));
    }
    return 0;
}

/* head_forward for the rows of items[0 .. rows), where those with a pick
 * rule take their token on the device (exo_pick) when the backend picks
 * there, and only the others' logits come to the host (picks: NULL, or an
 * answer a row). One pick launch takes every row: a row's pick does not
 * depend on the others. */
static int head_picks(exo_model *m, int r0, int rows, float *out, const exo_batch_item *items, exo_pick *picks,
                      exo_err *err)
{
    exo_backend *be = m->layers[m->n_layers - 1].be;
    exo_pick_rule rules[EXO_PICK_ROWS] = {{0}}; /* rows without one: the argmax, unused */
    bool any = false;
    for (int r = 0; picks && r < rows; r++) {
        picks[r].picked = false;
        if (items[r].pick)
            rules[r] = *items[r].pick;
        any |= items[r].pick != NULL;
    }
    if (!any || m->allgather || !be->ops->pick)
        return head_forward(m, r0, rows, out, err);
    OK(head_logits(m, r0, rows));
    float *logits = acts_of(m, be)->logits;
    exo_pick got[EXO_PICK_ROWS];
    bool found = !be->ops->pick(be, logits, rows, m->vocab, rules, got);
    for (int r = 0; r < rows; r++)
        if (found && items[r].pick && got[r].picked)
            picks[r] = got[r];
    size_t V = (size_t)m->vocab;
    for (int r = 0, run; r < rows; r += run) { /* the others' logits, a run of rows a copy */
        for (run = 0; r + run < rows && !picks[r + run].picked; run++)
            ;
        if (run)
            OK(be->ops->to_host(be, out + (size_t)r * V, logits + (size_t)r * V, sizeof(float) * (size_t)run * V));
        else
            run = 1;
    }
    return 0;
}

/* The embedding (or the hidden states coming in) and the layers of n
 * tokens from t0. */
/* The n rows of the spans through every layer: tokens (host, n) when the
 * shard embeds, else hidden_in (host, n x dim). */
static int step_layers(exo_model *m, const int32_t *tokens, const float *hidden_in, const span *sp, int nsp, int n,
                       exo_err *err)
{
    exo_backend *first = m->layers[0].be;
    size_t D = (size_t)m->dim, bytes = sizeof(float) * (size_t)n * D;
    float *x0 = acts_of(m, first)->x;
    if (tokens) {
        OK(first->ops->embed(first, &m->embed, tokens, n, x0));
        if (m->embed_scale != 1.0f)
            OK(first->ops->scale(first, x0, m->embed_scale, (size_t)n * D));
    } else
        OK(first->ops->to_device(first, x0, hidden_in, bytes));
    for (int l = 0; l < m->n_layers; l++) {
        exo_backend *from = m->layers[l ? l - 1 : 0].be, *to = m->layers[l].be;
        if (from != to) { /* the residual stream crosses from GPU to CPU (or back) */
            OK(from->ops->to_host(from, m->bounce, acts_of(m, from)->x, bytes));
            OK(to->ops->to_device(to, acts_of(m, to)->x, m->bounce, bytes));
        }
        OK(layer_forward(m, sp, nsp, l, n, err));
    }
    return 0;
}

/* One sequence's rows t0 .. t0 + n - 1 of a step, at positions pos0 .. */
static int step_one(exo_model *m, exo_seq *s, const exo_step *st, int t0, int n, int pos0, exo_err *err)
{
    span one = {s, 0, n, pos0};
    return step_layers(m, st->tokens ? st->tokens + t0 : NULL,
                       st->tokens ? NULL : st->hidden_in + (size_t)t0 * (size_t)m->dim, &one, 1, n, err);
}

/* A step's token picked by its rule where the logits are (backend.h
 * pick): true when it was, and the logits stay there. */
static bool pick_in_place(exo_model *m, exo_step *st)
{
    exo_backend *be = m->layers[m->n_layers - 1].be;
    if (!st->pick || st->all_logits || !be->ops->pick || m->allgather)
        return false;
    if (be->ops->pick(be, acts_of(m, be)->logits, 1, m->vocab, st->pick, &st->token))
        st->token.picked = false;
    return st->token.picked;
}

/* A decode step of a model wholly on one GPU goes as one recorded unit
 * (backend.h step_begin): its hundreds of kernel launches cost the host
 * more than the GPU takes to run them. A tensor-parallel rank records its
 * layers too once its partial sums go among the GPUs (decide_group: NCCL's
 * all-reduces are recorded with the kernels, and every rank runs its
 * step's sums in the same order whether it replays or launches; the
 * head's gather through the ring runs after). A step that needs the host
 * inside it (mixture-of-experts routing on the host, sums through the
 * host's ring, hidden states coming in) launches its ops one by one. */
static bool step_recordable(const exo_model *m, const exo_step *st, int n)
{
    return n == 1 && st->T == 1 && st->tokens && m->gpu && m->gpu_layers == m->n_layers &&
           m->gpu->ops->step_begin && (!m->n_experts || (m->moe_picked && !m->moe_host_route && !m->moe_per_expert)) &&
           (!m->allreduce || m->group > 0);
}

static int step_recorded(exo_model *m, exo_seq *s, const exo_step *st, int t0, int pos0, exo_err *err)
{
    exo_backend *be = m->gpu;
    uint64_t key = s->id << 2 | (uint64_t)(st->logits != NULL) << 1 | (uint64_t)(st->hidden_out != NULL);
    int r = be->ops->step_begin(be, key, st->tokens + t0, 1, pos0);
    if (r > 0)
        m->replayed_steps++;
    if (r)
        return r < 0 ? r : 0;
    for (int eager = 0; eager < 2; eager++) {
        int rc = step_one(m, s, st, t0, 1, pos0, err);
        if (!rc && st->logits && !m->allgather)
            rc = head_logits(m, 0, 1);
        if (eager)
            return rc;
        r = be->ops->step_end(be);
        if (r <= 0)
            return r < 0 ? r : rc;
    }
    return 0;
}

static int step_chunk(exo_model *m, exo_seq *s, exo_step *st, int t0, int n, exo_err *err)
{
    exo_backend *last = m->layers[m->n_layers - 1].be;
    size_t D = (size_t)m->dim, bytes = sizeof(float) * (size_t)n * D;
    int pos0 = s->len;
    if (step_recordable(m, st, n)) {
        OK(step_recorded(m, s, st, t0, pos0, err));
        if (st->hidden_out)
            OK(last->ops->to_host(last, st->hidden_out + (size_t)t0 * D, acts_of(m, last)->x, bytes));
        if (st->logits && m->allgather) /* a tensor-parallel head: this rank's share, then the gather */
            return head_forward(m, 0, 1, st->logits, err);
        if (st->logits && t0 + n == st->T && !pick_in_place(m, st))
            OK(last->ops->to_host(last, st->all_logits ? st->logits + (size_t)t0 * (size_t)m->vocab : st->logits,
                                  acts_of(m, last)->logits, sizeof(float) * (size_t)m->vocab));
        return 0;
    }
    OK(step_one(m, s, st, t0, n, pos0, err));
    if (st->hidden_out)
        OK(last->ops->to_host(last, st->hidden_out + (size_t)t0 * D, acts_of(m, last)->x, bytes));
    if (!st->logits)
        return 0;
    size_t V = (size_t)m->vocab;
    if (st->all_logits) {
        for (int r = 0; r < n; r += MAX_LOGIT_ROWS) {
            int rows = n - r < MAX_LOGIT_ROWS ? n - r : MAX_LOGIT_ROWS;
            OK(head_forward(m, r, rows, st->logits + (size_t)(t0 + r) * V, err));
        }
    } else if (t0 + n == st->T) {
        if (st->pick && !m->allgather) {
            OK(head_logits(m, n - 1, 1));
            if (!pick_in_place(m, st))
                OK(last->ops->to_host(last, st->logits, acts_of(m, last)->logits, sizeof(float) * V));
        } else {
            OK(head_forward(m, n - 1, 1, st->logits, err));
        }
    }
    return 0;
}

int exo_model_step(exo_model *m, exo_seq *s, exo_step *st, exo_err *err)
{
    int T = st->T;
    st->token.picked = false;
    if (T <= 0)
        return exo_err_set(err, EXO_EINVAL, "forward: no tokens");
    if (s->m != m)
        return exo_err_set(err, EXO_EINVAL, "forward: sequence belongs to another model");
    if (m->embeds != (st->tokens != NULL) || (!m->embeds && !st->hidden_in))
        return exo_err_set(err, EXO_EINVAL, "forward: this shard takes %s",
                           m->embeds ? "token ids" : "hidden states");
    if (st->logits && !m->has_head)
        return exo_err_set(err, EXO_EINVAL, "forward: this shard has no LM head");
    if (T > s->capacity - s->len)
        return exo_err_set(err, EXO_ERANGE, "context full: %d + %d tokens > capacity %d", s->len,
                           T, s->capacity);
    if (st->tokens)
        for (int t = 0; t < T; t++)
            if (st->tokens[t] < 0 || st->tokens[t] >= m->vocab)
                return exo_err_set(err, EXO_ERANGE, "token id %d out of range [0, %d)",
                                   st->tokens[t], m->vocab);
    if (s->state_lost)
        return exo_err_set(err, EXO_EINVAL, "forward: the sequence went back to position %d, which "
                           "its linear-attention state cannot (restart it from 0)", s->len);
    int len0 = s->len;
    int rc0 = seq_own_pages(s, s->len, T);
    if (rc0)
        return exo_err_set(err, rc0, "forward: no KV cache page for positions %d..%d: %s", s->len, s->len + T - 1,
                           exo_strerror(rc0));
    if (m->n_linear && T > 1 && seq_keep_start(s))
        return exo_err_set(err, EXO_ENOMEM, "forward: cannot snapshot the recurrent state");
    for (int t0 = 0; t0 < T; t0 += m->max_chunk) {
        int n = T - t0 < m->max_chunk ? T - t0 : m->max_chunk;
        int rc = step_chunk(m, s, st, t0, n, err);
        if (rc) {
            seq_step_failed(s, len0);
            if (!err || !err->msg[0] || err->code != rc)
                exo_err_set(err, rc, "forward: %s", exo_strerror(rc));
            return rc;
        }
        s->len += n;
    }
    return 0;
}

int exo_model_max_batch_rows(const exo_model *m) { return m->max_chunk; }
exo_pool *exo_model_host_pool(exo_model *m) { return exo_backend_cpu_pool(m->cpu); }

float *exo_model_logits_alloc(exo_model *m, int rows)
{
    size_t bytes = sizeof(float) * (size_t)(rows > 0 ? rows : 1) * (size_t)m->vocab;
    exo_backend *be = m->n_layers ? m->layers[m->n_layers - 1].be : m->cpu;
    void *p = be->ops->host_alloc ? be->ops->host_alloc(be, bytes) : NULL;
    return p ? p : exo_malloc(bytes);
}

void exo_model_logits_free(exo_model *m, float *logits)
{
    exo_backend *be = m->n_layers ? m->layers[m->n_layers - 1].be : m->cpu;
    if (!be->ops->host_free || !be->ops->host_free(be, logits))
        exo_free(logits);
}

int exo_model_step_batch_shard(exo_model *m, const exo_batch_item *items, int n, const float *hidden_in,
                               float *hidden_out, float *logits, exo_pick *picks, exo_err *err)
{
    if (n <= 0)
        return exo_err_set(err, EXO_EINVAL, "batch: no sequences");
    if (m->embeds == (hidden_in != NULL))
        return exo_err_set(err, EXO_EINVAL, "batch: this shard takes %s", m->embeds ? "token ids" : "hidden states");
    if (logits && !m->has_head)
        return exo_err_set(err, EXO_EINVAL, "batch: this shard has no LM head");
    for (int i = 0; picks && i < n; i++)
        picks[i].picked = false;
    if (n == 1) { /* the single-sequence step (chunked prompts, recorded decode) */
        exo_step st = {.T = items[0].T, .tokens = items[0].tokens, .hidden_in = hidden_in,
                       .hidden_out = hidden_out, .logits = logits, .pick = picks ? items[0].pick : NULL};
        int rc = exo_model_step(m, items[0].seq, &st, err);
        if (picks)
            picks[0] = st.token;
        return rc;
    }
    int T = 0;
    for (int i = 0; i < n; i++) {
        const exo_batch_item *it = &items[i];
        exo_seq *s = it->seq;
        if (!s || s->m != m || it->T <= 0 || (m->embeds && !it->tokens))
            return exo_err_set(err, EXO_EINVAL, "batch: item %d has no tokens or another model's sequence", i);
        for (int j = 0; j < i; j++)
            if (items[j].seq == s)
                return exo_err_set(err, EXO_EINVAL, "batch: a sequence appears twice (items %d and %d)", j, i);
        if (it->T > s->capacity - s->len)
            return exo_err_set(err, EXO_ERANGE, "batch: item %d: context full: %d + %d tokens > capacity %d", i,
                               s->len, it->T, s->capacity);
        for (int t = 0; m->embeds && t < it->T; t++)
            if (it->tokens[t] < 0 || it->tokens[t] >= m->vocab)
                return exo_err_set(err, EXO_ERANGE, "batch: item %d: token id %d out of range [0, %d)", i,
                                   it->tokens[t], m->vocab);
        if (s->state_lost)
            return exo_err_set(err, EXO_EINVAL, "batch: item %d: the sequence lost its linear-attention state", i);
        T += it->T;
    }
    if (T > m->max_chunk)
        return exo_err_set(err, EXO_ERANGE, "batch: %d rows, more than the %d a step takes", T, m->max_chunk);
    for (int i = 0; i < n; i++) {
        exo_seq *s = items[i].seq;
        int rc = seq_own_pages(s, s->len, items[i].T);
        if (rc)
            return exo_err_set(err, rc, "batch: item %d: no KV cache page for positions %d..%d: %s", i, s->len,
                               s->len + items[i].T - 1, exo_strerror(rc));
    }
    span *sp = exo_malloc(sizeof *sp * (size_t)n);
    int32_t *tokens = m->embeds ? exo_malloc(sizeof *tokens * (size_t)T) : NULL;
    int rc = 0;
    for (int i = 0, r0 = 0; i < n; r0 += items[i++].T) {
        sp[i] = (span){items[i].seq, r0, items[i].T, items[i].seq->len};
        if (tokens)
            memcpy(tokens + r0, items[i].tokens, sizeof *tokens * (size_t)items[i].T);
        if (m->n_linear && items[i].T > 1 && !rc && seq_keep_start(items[i].seq))
            rc = exo_err_set(err, EXO_ENOMEM, "batch: cannot snapshot the recurrent state");
    }
    if (!rc)
        rc = step_layers(m, tokens, hidden_in, sp, n, T, err);
    if (!rc && hidden_out) {
        exo_backend *last = m->layers[m->n_layers - 1].be;
        rc = last->ops->to_host(last, hidden_out, acts_of(m, last)->x, sizeof(float) * (size_t)T * (size_t)m->dim);
    }
    bool decode = T == n; /* one row each: their logits are consecutive rows */
    size_t V = (size_t)m->vocab;
    for (int i = 0; !rc && logits && i < n; i += decode ? MAX_LOGIT_ROWS : 1) {
        int rows = decode ? (n - i < MAX_LOGIT_ROWS ? n - i : MAX_LOGIT_ROWS) : 1;
        rc = head_picks(m, decode ? i : sp[i].r0 + sp[i].rows - 1, rows, logits + (size_t)i * V, items + i,
                        picks ? picks + i : NULL, err);
    }
    for (int i = 0; i < n; i++) {
        if (rc)
            seq_step_failed(sp[i].s, sp[i].pos0);
        else
            sp[i].s->len += sp[i].rows;
    }
    exo_free(sp);
    exo_free(tokens);
    if (rc && (!err || !err->msg[0] || err->code != rc))
        exo_err_set(err, rc, "batch: %s", exo_strerror(rc));
    return rc;
}

int exo_model_step_batch(exo_model *m, const exo_batch_item *items, int n, float *logits, exo_pick *picks,
                         exo_err *err)
{
    if (!m->embeds || !m->has_head)
        return exo_err_set(err, EXO_EUNSUPPORTED, "batch: a batched step needs the whole model (tokens in, "
                           "logits out)");
    return exo_model_step_batch_shard(m, items, n, NULL, NULL, logits, picks, err);
}

int exo_model_forward(exo_model *m, exo_seq *s, const int32_t *tokens, int T, float *logits,
                      bool all_logits, exo_err *err)
{
    exo_step st = {.T = T, .tokens = tokens, .logits = logits, .all_logits = all_logits};
    return exo_model_step(m, s, &st, err);
}
