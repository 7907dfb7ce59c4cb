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
 * A mixture-of-experts layer (qwen3_moe) replaces the MLP: the router picks
 * k experts per token (softmax, top-k, renormalised), each expert runs the
 * same SwiGLU MLP over the tokens routed to it (gathered into contiguous
 * rows, so prefill is a GEMM per expert and decode reads only the chosen
 * experts' weights), and its output is added into the residual scaled by
 * the token's routing weight.
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
#include "engine/quant.h"
#include "engine/rope.h"
#include "engine/safetensors.h"
#include "proto/shard.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LOGIT_ROWS 16 /* LM-head rows computed per step when all logits are wanted */
#define EXO_MAX_TP     256

typedef struct layer {
    exo_backend *be;
    float *attn_norm, *mlp_norm; /* (dim) */
    float *q_norm, *k_norm;      /* (head_dim) qwen3, else NULL */
    float *bq, *bk, *bv, *bo;    /* (out) biases or NULL */
    exo_linear q, k, v, o;       /* (n_heads*hd, dim) (n_kv*hd, dim) x2, (dim, n_heads*hd) */
    exo_linear gate, up, down;   /* (ffn, dim) x2, (dim, ffn); dense MLP */
    int n_experts;               /* > 0: a mixture-of-experts MLP instead */
    exo_linear router;           /* (n_experts, dim) */
    exo_linear *experts;         /* 3 per expert: gate, up (moe_ffn, dim), down (dim, moe_ffn) */
} layer;

/* Activation buffers of one backend, each sized for max_chunk tokens. */
typedef struct acts {
    exo_backend *be;
    float *x, *h;     /* (chunk, dim) */
    float *q, *att;   /* (chunk, n_heads*hd) */
    float *k, *v;     /* (chunk, n_kv*hd) */
    float *g, *u;     /* (chunk, max(ffn, moe_ffn)) */
    float *logits;    /* (MAX_LOGIT_ROWS, vocab), when the shard has the head */
    float *inv_freq;  /* (hd/2) */
    /* mixture of experts, when the shard has such layers */
    float *router;    /* (chunk, n_experts) */
    float *xe, *ye;   /* (chunk, dim): one expert's gathered inputs and outputs */
    float *moe_out;   /* (chunk, dim): tensor parallel: this rank's partial sum */
    int32_t *top_idx; /* host (chunk, topk) */
    float *top_w;
    int32_t *rows;    /* host (chunk): the tokens routed to one expert, and weights */
    float *row_w;
    const exo_linear **sel_w; /* host (2 topk): decode's chosen experts' gate and up */
    float **sel_y;
} acts;

struct exo_model {
    exo_model_config cfg;
    bool owns_cfg;
    exo_st *st;
    exo_backend *cpu;
    int n_layers;      /* this shard's layers: global indices first_layer.. */
    int first_layer, total_layers;
    int dim, n_heads, n_kv, hd, ffn, vocab, max_chunk; /* n_heads, n_kv, ffn: this rank's */
    int n_experts, topk, moe_ffn; /* 0 when no layer of the shard is sparse */
    bool moe_per_expert; /* EXO_MOE_PATH=per-expert: decode as prefill does (the benchmark's peer) */
    float mscale, eps;
    exo_attn_shape attn;
    bool embeds, has_head;
    exo_allreduce_fn allreduce; /* tensor parallel, else NULL */
    exo_allgather_fn allgather;
    void *allreduce_ctx;
    size_t vocab_bounds[EXO_MAX_TP + 1]; /* tensor parallel: each rank's LM-head rows */
    int tp_rank;
    exo_linear embed;   /* on the first layer's backend (first shard) */
    exo_linear lm_head; /* on the last layer's backend (last shard) */
    float *final_norm;
    layer *layers;
    void **owned;       /* gathered column slices the backend kept using in place */
    size_t n_owned;
    acts act;           /* one backend for now: the CPU */
};

struct exo_seq {
    exo_model *m;
    int capacity, len;
    int alloc_capacity;         /* capacity rounded up to EXO_KV_BLOCK */
    float **k_cache, **v_cache; /* per layer, on that layer's backend (backend.h) */
    void **kv_block;            /* per layer: the block its backend's caches live in,
                                   set on the first layer of each backend */
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
    if (s->prefix[0] && !strcmp(name, "lm_head.weight")) {
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

/* A 2-D module (index < 0), or slab `index` of a stacked 3-D one. */
static int st_linear_at(st_source *s, const char *module, int64_t index, exo_linear *out)
{
    char name[512];
    snprintf(name, sizeof name, "%s.weight", module);
    const exo_st_tensor *w = st_lookup(s, name);
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
    if (t->ndim != 1 || !is_float_dtype(t->dtype))
        return exo_err_set(s->err, EXO_EFORMAT, "%s: %s must be a 1-d float tensor", t->file, name);
    *dtype = t->dtype;
    *data = t->data;
    *n = t->shape[0];
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
    if (w->format == EXO_WFORMAT_DENSE) {
        v.w = (const char *)w->w + (size_t)r0 * (size_t)w->cols * esz;
    } else {
        size_t groups = (size_t)(w->cols / w->group_size);
        v.w = (const uint32_t *)w->w + (size_t)r0 * (size_t)(w->cols * w->bits / 32);
        v.scales = (const char *)w->scales + (size_t)r0 * groups * esz;
        v.biases = (const char *)w->biases + (size_t)r0 * groups * esz;
    }
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
        memcpy(db + r * ng * esz, (const char *)w->biases + (r * groups + g0) * esz, ng * esz);
    }
    out->w = dw;
    out->scales = ds;
    out->biases = db;
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

/* Hands the part of a host weight a shard binds to the backend. */
static int load_part(binder *b, const char *module, exo_linear host, part p, exo_linear *out)
{
    int rc;
    if (p.r1)
        host = linear_rows(&host, p.r0, p.r1);
    void *gathered = NULL;
    if (p.c1 && (rc = linear_cols(&host, p.c0, p.c1, &host, &gathered, b->err)))
        return exo_err_wrap(b->err, "%s", module);
    rc = b->be->ops->load_linear(b->be, &host, b->src->from_file || gathered, out, b->err);
    if (gathered && !rc && out->w == host.w) { /* the backend uses it in place: keep it */
        b->m->owned = exo_realloc(b->m->owned, (b->m->n_owned + 1) * sizeof(void *));
        b->m->owned[b->m->n_owned++] = gathered;
    } else {
        exo_free(gathered);
    }
    return rc;
}

static int bind_linear(binder *b, const char *module, int64_t rows, int64_t cols, bool required,
                       exo_linear *out, bool *found)
{
    return bind_linear_part(b, module, rows, cols, required, (part){0}, out, found);
}

/* Elements [off, off + n) of a vector of `total` (a tensor-parallel
 * rank's share of a bias; off 0 and n == total otherwise). */
static int bind_vector_part(binder *b, const char *name, int64_t total, int64_t off, int64_t n,
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
    data = (const char *)data + (size_t)off * exo_dtype_size(t);
    *out = b->be->ops->load_vector(b->be, t, data, (size_t)n, b->err);
    return *out ? 0 : EXO_ENOMEM;
}

static int bind_vector(binder *b, const char *name, int64_t n, bool required, float **out)
{
    return bind_vector_part(b, name, n, 0, n, required, out);
}

/* A mixture-of-experts MLP: the router (mlp.gate) and each expert's three
 * projections, named per expert (mlp.experts.E.gate_proj: the hub's and
 * save_pretrained's layout) or stacked (mlp.switch_mlp.gate_proj
 * [E, rows, cols]: mlx-lm's). A tensor-parallel rank binds every expert's
 * share of the intermediate dimension (pgu rows, pd columns), as for a
 * dense MLP. */
static int bind_experts(binder *b, int l, layer *L, part pgu, part pd)
{
    const exo_model_config *cfg = &b->m->cfg;
    int64_t E = cfg->n_experts, D = cfg->hidden_size, I = cfg->moe_intermediate_size;
    char name[256];
    snprintf(name, sizeof name, "model.layers.%d.mlp.gate", l);
    int rc = bind_linear(b, name, E, D, true, &L->router, NULL);
    if (rc)
        return rc;
    L->n_experts = (int)E;
    L->experts = exo_calloc((size_t)E * 3, sizeof(exo_linear));
    static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
    for (int64_t e = 0; e < E; e++) {
        for (int p = 0; p < 3; p++) {
            int64_t rows = p == 2 ? D : I, cols = p == 2 ? I : D;
            exo_linear *out = &L->experts[e * 3 + p];
            bool found = false;
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%lld.%s", l, (long long)e, proj[p]);
            part pp = p == 2 ? pd : pgu;
            if ((rc = bind_linear_part(b, name, rows, cols, false, pp, out, &found)))
                return rc;
            if (found)
                continue;
            snprintf(name, sizeof name, "model.layers.%d.mlp.switch_mlp.%s", l, proj[p]);
            exo_linear host;
            rc = b->src->stacked ? b->src->stacked(b->src->ctx, name, e, &host) : EXO_ENOENT;
            if (rc == EXO_ENOENT)
                return exo_err_set(b->err, EXO_EFORMAT, "missing weight model.layers.%d.mlp.experts.%lld.%s "
                                   "(or mlp.switch_mlp.%s)", l, (long long)e, proj[p], proj[p]);
            if (rc)
                return rc;
            if (host.rows != rows || host.cols != cols)
                return exo_err_set(b->err, EXO_EFORMAT, "%s[%lld]: shape [%lld, %lld], config says [%lld, %lld]",
                                   name, (long long)e, (long long)host.rows, (long long)host.cols,
                                   (long long)rows, (long long)cols);
            if ((rc = load_part(b, name, host, pp, out)))
                return rc;
        }
    }
    return 0;
}

static bool arch_supported(const char *mt)
{
    return !strcmp(mt, "llama") || !strcmp(mt, "mistral") || !strcmp(mt, "qwen2") ||
           !strcmp(mt, "qwen3") || !strcmp(mt, "qwen3_moe");
}

static int check_config(const exo_model_config *c, exo_err *err)
{
    if (!arch_supported(c->model_type))
        return exo_err_set(err, EXO_EUNSUPPORTED,
                           "model_type '%s' is not supported (llama, mistral, qwen2, qwen3, qwen3_moe)",
                           c->model_type);
    if (strcmp(c->hidden_act, "silu") && strcmp(c->hidden_act, "swish"))
        return exo_err_set(err, EXO_EUNSUPPORTED, "hidden_act '%s' is not supported (silu)",
                           c->hidden_act);
    if (c->head_dim <= 0 || c->head_dim > 1024 || c->head_dim % 2)
        return exo_err_set(err, EXO_EUNSUPPORTED, "head_dim %lld is not supported",
                           (long long)c->head_dim);
    if (c->num_key_value_heads <= 0 || c->num_attention_heads % c->num_key_value_heads)
        return exo_err_set(err, EXO_EFORMAT, "num_attention_heads %% num_key_value_heads != 0");
    if (c->vocab_size > INT32_MAX || c->hidden_size > INT32_MAX || c->intermediate_size > INT32_MAX)
        return exo_err_set(err, EXO_ERANGE, "model dimensions too large");
    return 0;
}

static void free_acts(acts *a)
{
    if (!a->be)
        return;
    float **bufs[] = {&a->x, &a->h, &a->q, &a->att, &a->k, &a->v, &a->g, &a->u, &a->logits,
                      &a->inv_freq, &a->router, &a->xe, &a->ye, &a->moe_out};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
        a->be->ops->release(a->be, *bufs[i]);
        *bufs[i] = NULL;
    }
    exo_free(a->top_idx);
    exo_free(a->top_w);
    exo_free(a->rows);
    exo_free(a->row_w);
    exo_free(a->sel_w);
    exo_free(a->sel_y);
}

static int alloc_acts(exo_model *m, acts *a, exo_backend *be, exo_err *err)
{
    a->be = be;
    size_t C = (size_t)m->max_chunk, F = (size_t)(m->moe_ffn > m->ffn ? m->moe_ffn : m->ffn);
    size_t E = (size_t)m->n_experts;
    /* decode runs a token's k experts side by side in these */
    size_t CF = C * F > (size_t)m->topk * (size_t)m->moe_ffn ? C * F : (size_t)m->topk * (size_t)m->moe_ffn;
    size_t CD = (C > (size_t)m->topk ? C : (size_t)m->topk) * (size_t)m->dim;
    struct {
        float **p;
        size_t n;
    } want[] = {
        {&a->x, C * m->dim},           {&a->h, C * m->dim},
        {&a->q, C * m->n_heads * m->hd}, {&a->att, C * m->n_heads * m->hd},
        {&a->k, C * m->n_kv * m->hd},  {&a->v, C * m->n_kv * m->hd},
        {&a->g, CF},                   {&a->u, CF},
        {&a->router, C * E},           {&a->xe, E ? C * m->dim : 0},
        {&a->ye, E ? CD : 0},  {&a->moe_out, E && m->allreduce ? C * m->dim : 0},
        {&a->logits, m->has_head ? (size_t)MAX_LOGIT_ROWS * m->vocab : 0},
        {&a->inv_freq, (size_t)m->hd / 2},
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
        a->rows = exo_calloc(C > (size_t)m->topk ? C : (size_t)m->topk, sizeof(int32_t));
        a->row_w = exo_calloc(C, sizeof(float));
        a->sel_w = exo_calloc(2 * (size_t)m->topk, sizeof *a->sel_w);
        a->sel_y = exo_calloc(2 * (size_t)m->topk, sizeof *a->sel_y);
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

int exo_model_build(const exo_model_config *cfg, const exo_weight_source *src,
                    const exo_model_opts *opts, exo_model **out, exo_err *err)
{
    *out = NULL;
    int rc = check_config(cfg, err);
    if (rc)
        return rc;
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
    if (tp > 1 && ((rc = exo_tp_share(KV, 1, tr, tp, &kv0, &kv1, err)) ||
                   (rc = exo_tp_share(F, ffn_unit(cfg, F, tp), tr, tp, &f0, &f1, err)) ||
                   (cfg->n_experts > 0 && (rc = exo_tp_share(I, ffn_unit(cfg, I, tp), tr, tp, &mf0, &mf1, err)))))
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
    m->ffn = (int)(f1 - f0);
    for (int l = first; l < last; l++)
        if (exo_config_layer_moe(cfg, l)) {
            m->n_experts = (int)cfg->n_experts;
            m->topk = (int)cfg->n_experts_per_tok;
            m->moe_ffn = (int)(mf1 - mf0);
        }
    m->vocab = (int)V;
    const char *moe_path = getenv("EXO_MOE_PATH");
    m->moe_per_expert = moe_path && !strcmp(moe_path, "per-expert");
    m->eps = (float)cfg->rms_norm_eps;
    m->max_chunk = o.max_chunk > 0 ? o.max_chunk : 512;
    m->embeds = first == 0;
    m->has_head = last == total;
    m->allreduce = tp > 1 ? o.tp_allreduce : NULL;
    m->allgather = tp > 1 ? o.tp_allgather : NULL;
    m->allreduce_ctx = o.tp_ctx;
    m->tp_rank = tr;
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
    m->attn = (exo_attn_shape){m->n_heads, m->n_kv, m->hd, (int)cfg->sliding_window,
                               1.0f / sqrtf((float)m->hd)};
    m->cpu = exo_backend_cpu_create(o.n_threads, err);
    if (!m->cpu) {
        exo_free(m);
        return err ? err->code : EXO_EINTERNAL;
    }
    m->layers = exo_calloc((size_t)m->n_layers, sizeof(layer));
    binder b = {m, src, m->cpu, err};
    int64_t QD = H * hd, KD = KV * hd;
    /* this rank's rows of q (its KV heads' query groups), k, v; columns of o */
    part pq = {0}, pkv = {0}, po = {0}, pgu = {0}, pd = {0}, pmgu = {0}, pmd = {0};
    if (tp > 1) {
        pq = (part){kv0 * group * hd, kv1 * group * hd, 0, 0};
        pkv = (part){kv0 * hd, kv1 * hd, 0, 0};
        po = (part){0, 0, kv0 * group * hd, kv1 * group * hd};
        pgu = (part){f0, f1, 0, 0};
        pd = (part){0, 0, f0, f1};
        pmgu = (part){mf0, mf1, 0, 0};
        pmd = (part){0, 0, mf0, mf1};
    }
    bool qk_norm = !strcmp(cfg->model_type, "qwen3") || !strcmp(cfg->model_type, "qwen3_moe");
    bool qkv_bias = cfg->attention_bias || !strcmp(cfg->model_type, "qwen2");
    char name[256];
#define TRY(x)              \
    do {                    \
        if ((rc = (x)))     \
            goto fail;      \
    } while (0)
    if (m->embeds)
        TRY(bind_linear(&b, "model.embed_tokens", V, D, true, &m->embed, NULL));
    for (int i = 0; i < m->n_layers; i++) {
        int l = first + i;
        layer *L = &m->layers[i];
        L->be = m->cpu;
        b.be = L->be;
#define P(fmt) (snprintf(name, sizeof name, "model.layers.%d." fmt, l), name)
        TRY(bind_vector(&b, P("input_layernorm.weight"), D, true, &L->attn_norm));
        TRY(bind_vector(&b, P("post_attention_layernorm.weight"), D, true, &L->mlp_norm));
        TRY(bind_linear_part(&b, P("self_attn.q_proj"), QD, D, true, pq, &L->q, NULL));
        TRY(bind_linear_part(&b, P("self_attn.k_proj"), KD, D, true, pkv, &L->k, NULL));
        TRY(bind_linear_part(&b, P("self_attn.v_proj"), KD, D, true, pkv, &L->v, NULL));
        TRY(bind_linear_part(&b, P("self_attn.o_proj"), D, QD, true, po, &L->o, NULL));
        if (exo_config_layer_moe(cfg, l)) {
            TRY(bind_experts(&b, l, L, pmgu, pmd));
        } else {
            TRY(bind_linear_part(&b, P("mlp.gate_proj"), F, D, true, pgu, &L->gate, NULL));
            TRY(bind_linear_part(&b, P("mlp.up_proj"), F, D, true, pgu, &L->up, NULL));
            TRY(bind_linear_part(&b, P("mlp.down_proj"), D, F, true, pd, &L->down, NULL));
        }
        if (qk_norm) {
            TRY(bind_vector(&b, P("self_attn.q_norm.weight"), hd, true, &L->q_norm));
            TRY(bind_vector(&b, P("self_attn.k_norm.weight"), hd, true, &L->k_norm));
        }
        int64_t q0 = kv0 * group * hd, k0 = kv0 * hd;
        TRY(bind_vector_part(&b, P("self_attn.q_proj.bias"), QD, q0, m->n_heads * hd, qkv_bias, &L->bq));
        TRY(bind_vector_part(&b, P("self_attn.k_proj.bias"), KD, k0, m->n_kv * hd, qkv_bias, &L->bk));
        TRY(bind_vector_part(&b, P("self_attn.v_proj.bias"), KD, k0, m->n_kv * hd, qkv_bias, &L->bv));
        TRY(bind_vector(&b, P("self_attn.o_proj.bias"), D, false, &L->bo));
#undef P
        note_layer(&o, i + 1, m->n_layers);
    }
    if (m->has_head) {
        TRY(bind_vector(&b, "model.norm.weight", D, true, &m->final_norm));
        bool has_head = false;
        TRY(bind_linear_part(&b, "lm_head", V, D, !cfg->tie_word_embeddings, phead, &m->lm_head,
                             &has_head));
        if (!has_head && m->embeds && tp == 1)
            m->lm_head = m->embed; /* tied: same backend in a single-backend model */
        else if (!has_head) /* tied, and this shard's head is not its whole embedding */
            TRY(bind_linear_part(&b, "model.embed_tokens", V, D, true, phead, &m->lm_head, NULL));
    }
    TRY(alloc_acts(m, &m->act, m->cpu, err));
    {
        float inv_freq[512];
        exo_rope_scaling rs = cfg->rope;
        if (!rs.original_max_position_embeddings)
            rs.original_max_position_embeddings = cfg->max_position_embeddings;
        TRY(exo_rope_init(&rs, cfg->rope_theta, m->hd, inv_freq, &m->mscale, err));
        TRY(m->cpu->ops->to_device(m->cpu, m->act.inv_freq, inv_freq,
                                   sizeof(float) * (size_t)m->hd / 2));
    }
#undef TRY
    *out = m;
    return 0;
fail:
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
    exo_weight_source src = {&s, st_linear, st_vector, true, st_stacked};
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
            float *vecs[] = {L->attn_norm, L->mlp_norm, L->q_norm, L->k_norm,
                             L->bq,        L->bk,       L->bv,     L->bo};
            for (size_t i = 0; i < sizeof vecs / sizeof *vecs; i++)
                be->ops->release(be, vecs[i]);
            exo_free(L->experts);
        }
    }
    if (m->cpu) {
        m->cpu->ops->release(m->cpu, m->final_norm);
        free_acts(&m->act);
        m->cpu->ops->free(m->cpu);
    }
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

exo_shard_info exo_model_shard(const exo_model *m)
{
    return (exo_shard_info){m->first_layer, m->first_layer + m->n_layers, m->total_layers, m->dim,
                            m->embeds, m->has_head};
}

size_t exo_model_decode_bytes(const exo_model *m)
{
    size_t total = m->has_head ? exo_linear_bytes(&m->lm_head) : 0;
    for (int l = 0; l < m->n_layers; l++) {
        const layer *L = &m->layers[l];
        const exo_linear *ws[] = {&L->q, &L->k, &L->v, &L->o, &L->gate, &L->up, &L->down};
        for (size_t i = 0; i < 7; i++)
            total += exo_linear_bytes(ws[i]);
        if (L->n_experts) { /* the router and, per token, k experts' weights (on average) */
            size_t all = 0;
            for (int i = 0; i < 3 * L->n_experts; i++)
                all += exo_linear_bytes(&L->experts[i]);
            total += exo_linear_bytes(&L->router) + all / (size_t)L->n_experts * (size_t)m->topk;
        }
    }
    return total;
}

/* ---- sequences ---------------------------------------------------------- */

int exo_seq_create(exo_model *m, int capacity, exo_seq **out, exo_err *err)
{
    *out = NULL;
    if (capacity <= 0)
        return exo_err_set(err, EXO_EINVAL, "sequence capacity must be > 0");
    exo_seq *s = exo_calloc(1, sizeof *s);
    s->m = m;
    if (capacity > INT32_MAX - EXO_KV_BLOCK) {
        exo_free(s);
        return exo_err_set(err, EXO_ERANGE, "sequence capacity %d too large", capacity);
    }
    s->capacity = capacity;
    s->alloc_capacity = (capacity + EXO_KV_BLOCK - 1) / EXO_KV_BLOCK * EXO_KV_BLOCK;
    s->k_cache = exo_calloc((size_t)m->n_layers, sizeof(float *));
    s->v_cache = exo_calloc((size_t)m->n_layers, sizeof(float *));
    s->kv_block = exo_calloc((size_t)m->n_layers, sizeof(void *));
    /* One block per backend for all its layers' K and V: decode reads the
     * whole cache every token, and a block of 2 MiB or more gets huge
     * pages (per-layer caches are often smaller; on 4 KiB pages the
     * attention reads stalled at every page, see core/alloc.c) */
    size_t floats = (size_t)s->alloc_capacity * (size_t)m->n_kv * (size_t)m->hd;
    for (int l = 0; l < m->n_layers; l++) {
        exo_backend *be = m->layers[l].be;
        if (s->k_cache[l])
            continue;
        size_t n = 0;
        for (int i = l; i < m->n_layers; i++)
            n += m->layers[i].be == be;
        float *block = be->ops->alloc(be, 2 * n * floats * sizeof(float));
        if (!block) {
            exo_seq_free(s);
            return exo_err_set(err, EXO_ENOMEM, "cannot allocate KV cache for %d tokens", capacity);
        }
        s->kv_block[l] = block;
        for (int i = l; i < m->n_layers; i++)
            if (m->layers[i].be == be) {
                s->k_cache[i] = block;
                s->v_cache[i] = block + floats;
                block += 2 * floats;
            }
    }
    *out = s;
    return 0;
}

void exo_seq_free(exo_seq *s)
{
    if (!s)
        return;
    for (int l = 0; l < s->m->n_layers; l++)
        if (s->kv_block[l]) {
            exo_backend *be = s->m->layers[l].be;
            be->ops->release(be, s->kv_block[l]);
        }
    exo_free(s->kv_block);
    exo_free(s->k_cache);
    exo_free(s->v_cache);
    exo_free(s);
}

int exo_seq_len(const exo_seq *s) { return s->len; }
int exo_seq_capacity(const exo_seq *s) { return s->capacity; }

void exo_seq_truncate(exo_seq *s, int n)
{
    if (n >= 0 && n < s->len)
        s->len = n;
}

/* ---- forward ------------------------------------------------------------ */

#define OK(x)                \
    do {                     \
        int rc_ = (x);       \
        if (rc_)             \
            return rc_;      \
    } while (0)

/* Tensor parallel: sum the ranks' partial products (a no-op otherwise). */
static int reduce(exo_model *m, float *x, int T, exo_err *err)
{
    if (!m->allreduce)
        return 0;
    return m->allreduce(m->allreduce_ctx, x, (size_t)T * (size_t)m->dim, err);
}

/* x += the experts' outputs for the normed rows in a->h (see the top). A
 * tensor-parallel rank sums its share of them apart, for the all-reduce. */
static int moe_forward(exo_model *m, layer *L, int T, exo_err *err)
{
    exo_backend *be = L->be;
    const exo_backend_ops *o = be->ops;
    acts *a = &m->act;
    int E = L->n_experts, k = m->topk, I = m->moe_ffn;
    const exo_linear *r[1] = {&L->router};
    float *const ro[1] = {a->router};
    OK(o->matmul(be, 1, r, a->h, T, ro));
    OK(o->moe_route(be, a->router, T, E, k, m->cfg.norm_topk_prob, a->top_idx, a->top_w));
    float *sum = m->allreduce ? a->moe_out : a->x;
    if (m->allreduce)
        OK(o->zero(be, sum, (size_t)T * (size_t)m->dim));
    bool side_by_side = T == 1 && !m->moe_per_expert;
    if (side_by_side) { /* decode: the k experts side by side, in k + 2 dispatches, not 3k */
        for (int j = 0; j < k; j++) {
            const exo_linear *ex = &L->experts[3 * a->top_idx[j]];
            a->sel_w[2 * j] = &ex[0];
            a->sel_w[2 * j + 1] = &ex[1];
            a->sel_y[2 * j] = a->g + (size_t)j * (size_t)I;
            a->sel_y[2 * j + 1] = a->u + (size_t)j * (size_t)I;
            a->rows[j] = 0;
        }
        OK(o->matmul(be, 2 * k, a->sel_w, a->h, 1, a->sel_y));
        OK(o->silu_mul(be, a->g, a->u, (size_t)k * (size_t)I));
        for (int j = 0; j < k; j++) {
            const exo_linear *wd[1] = {&L->experts[3 * a->top_idx[j] + 2]};
            float *const yo[1] = {a->ye + (size_t)j * (size_t)m->dim};
            OK(o->matmul(be, 1, wd, a->g + (size_t)j * (size_t)I, 1, yo));
        }
        OK(o->scatter_add_rows(be, sum, a->ye, a->rows, a->top_w, k, m->dim));
    }
    for (int e = 0; e < E && !side_by_side; e++) {
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
        OK(o->matmul(be, 2, gu, in, n, gu_out));
        OK(o->silu_mul(be, a->g, a->u, (size_t)n * (size_t)I));
        const exo_linear *wd[1] = {&L->experts[3 * e + 2]};
        float *const yo[1] = {a->ye};
        OK(o->matmul(be, 1, wd, a->g, n, yo));
        OK(o->scatter_add_rows(be, sum, a->ye, a->rows, a->row_w, n, m->dim));
    }
    if (m->allreduce) {
        OK(reduce(m, sum, T, err));
        OK(o->add(be, a->x, sum, (size_t)T * (size_t)m->dim));
    }
    return 0;
}

static int layer_forward(exo_model *m, exo_seq *s, int l, int T, int pos0, exo_err *err)
{
    layer *L = &m->layers[l];
    exo_backend *be = L->be;
    const exo_backend_ops *o = be->ops;
    acts *a = &m->act;
    int QD = m->n_heads * m->hd, KD = m->n_kv * m->hd;

    OK(o->rmsnorm(be, a->h, a->x, L->attn_norm, T, m->dim, m->eps));
    const exo_linear *qkv[3] = {&L->q, &L->k, &L->v};
    float *const qkv_out[3] = {a->q, a->k, a->v};
    OK(o->matmul(be, 3, qkv, a->h, T, qkv_out));
    if (L->bq) {
        OK(o->add_bias(be, a->q, L->bq, T, QD));
        OK(o->add_bias(be, a->k, L->bk, T, KD));
        OK(o->add_bias(be, a->v, L->bv, T, KD));
    }
    if (L->q_norm) {
        OK(o->rmsnorm(be, a->q, a->q, L->q_norm, T * m->n_heads, m->hd, m->eps));
        OK(o->rmsnorm(be, a->k, a->k, L->k_norm, T * m->n_kv, m->hd, m->eps));
    }
    OK(o->rope(be, a->q, T, m->n_heads, m->hd, pos0, a->inv_freq, m->mscale));
    OK(o->rope(be, a->k, T, m->n_kv, m->hd, pos0, a->inv_freq, m->mscale));
    OK(o->attention(be, &m->attn, a->att, a->q, a->k, a->v, s->k_cache[l], s->v_cache[l],
                    s->alloc_capacity, T, pos0));

    const exo_linear *wo[1] = {&L->o};
    float *const ho[1] = {a->h};
    OK(o->matmul(be, 1, wo, a->att, T, ho));
    OK(reduce(m, a->h, T, err));
    if (L->bo)
        OK(o->add_bias(be, a->h, L->bo, T, m->dim));
    OK(o->add(be, a->x, a->h, (size_t)T * (size_t)m->dim));

    OK(o->rmsnorm(be, a->h, a->x, L->mlp_norm, T, m->dim, m->eps));
    if (L->n_experts)
        return moe_forward(m, L, T, err);
    const exo_linear *gu[2] = {&L->gate, &L->up};
    float *const gu_out[2] = {a->g, a->u};
    OK(o->matmul(be, 2, gu, a->h, T, gu_out));
    OK(o->silu_mul(be, a->g, a->u, (size_t)T * (size_t)m->ffn));
    const exo_linear *wd[1] = {&L->down};
    OK(o->matmul(be, 1, wd, a->g, T, ho));
    OK(reduce(m, a->h, T, err));
    OK(o->add(be, a->x, a->h, (size_t)T * (size_t)m->dim));
    return 0;
}

/* Final norm and LM head for `rows` consecutive rows of a->x starting at
 * row r0; logits land in host memory at out. A tensor-parallel rank
 * computes its rows of the vocabulary, one position at a time, and the
 * ranks gather the rest. */
static int head_forward(exo_model *m, int r0, int rows, float *out, exo_err *err)
{
    exo_backend *be = m->layers[m->n_layers - 1].be;
    acts *a = &m->act;
    float *x = a->x + (size_t)r0 * (size_t)m->dim;
    size_t V = (size_t)m->vocab;
    OK(be->ops->rmsnorm(be, a->h, x, m->final_norm, rows, m->dim, m->eps));
    const exo_linear *w[1] = {&m->lm_head};
    if (m->allgather) {
        for (int r = 0; r < rows; r++) {
            float *const y[1] = {a->logits + m->vocab_bounds[m->tp_rank]};
            OK(be->ops->matmul(be, 1, w, a->h + (size_t)r * (size_t)m->dim, 1, y));
            OK(m->allgather(m->allreduce_ctx, a->logits, m->vocab_bounds, err));
            OK(be->ops->to_host(be, out + (size_t)r * V, a->logits, sizeof(float) * V));
        }
        return 0;
    }
    float *const y[1] = {a->logits};
    OK(be->ops->matmul(be, 1, w, a->h, rows, y));
    return be->ops->to_host(be, out, a->logits, sizeof(float) * (size_t)rows * V);
}

static int step_chunk(exo_model *m, exo_seq *s, const exo_step *st, int t0, int n, exo_err *err)
{
    exo_backend *first = m->layers[0].be, *last = m->layers[m->n_layers - 1].be;
    size_t D = (size_t)m->dim;
    int pos0 = s->len;
    if (st->tokens)
        OK(first->ops->embed(first, &m->embed, st->tokens + t0, n, m->act.x));
    else
        OK(first->ops->to_device(first, m->act.x, st->hidden_in + (size_t)t0 * D,
                                 sizeof(float) * (size_t)n * D));
    for (int l = 0; l < m->n_layers; l++)
        OK(layer_forward(m, s, l, n, pos0, err));
    if (st->hidden_out)
        OK(last->ops->to_host(last, st->hidden_out + (size_t)t0 * D, m->act.x,
                              sizeof(float) * (size_t)n * D));
    if (!st->logits)
        return 0;
    size_t V = (size_t)m->vocab;
    if (st->all_logits) {
        for (int r = 0; r < n; r += MAX_LOGIT_ROWS) {
            int rows = n - r < MAX_LOGIT_ROWS ? n - r : MAX_LOGIT_ROWS;
            OK(head_forward(m, r, rows, st->logits + (size_t)(t0 + r) * V, err));
        }
    } else if (t0 + n == st->T) {
        OK(head_forward(m, n - 1, 1, st->logits, err));
    }
    return 0;
}

int exo_model_step(exo_model *m, exo_seq *s, const exo_step *st, exo_err *err)
{
    int T = st->T;
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
    int len0 = s->len;
    for (int t0 = 0; t0 < T; t0 += m->max_chunk) {
        int n = T - t0 < m->max_chunk ? T - t0 : m->max_chunk;
        int rc = step_chunk(m, s, st, t0, n, err);
        if (rc) {
            s->len = len0;
            if (!err || !err->msg[0] || err->code != rc)
                exo_err_set(err, rc, "forward: %s", exo_strerror(rc));
            return rc;
        }
        s->len += n;
    }
    return 0;
}

int exo_model_forward(exo_model *m, exo_seq *s, const int32_t *tokens, int T, float *logits,
                      bool all_logits, exo_err *err)
{
    exo_step st = {.T = T, .tokens = tokens, .logits = logits, .all_logits = all_logits};
    return exo_model_step(m, s, &st, err);
}
