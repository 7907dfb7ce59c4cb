/* Hugging Face config.json / generation_config.json parsing (see config.h
 * for the spellings handled and the defaults applied). Every key is read
 * through one typed getter that looks in text_config first and the top
 * level second, treats JSON null as absent, and turns a wrong type into an
 * error that names the file and the key. */
#include "engine/config.h"
#include "core/alloc.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_CONFIG_BYTES ((size_t)64 << 20)
#define MAX_DIM ((int64_t)1 << 31) /* sanity bound on sizes and counts */
/* Layers a config may declare: per-layer tables are allocated before any
 * weight is seen, so a count near MAX_DIM would ask for gigabytes (the
 * config fuzzer found 555 M layers); the deepest checkpoints have ~100. */
#define MAX_LAYERS 4096

typedef struct ctx {
    const char *file;
    json_t     *top;
    json_t     *text; /* text_config or NULL */
    exo_err    *err;
} ctx;

const char *exo_rope_type_name(exo_rope_type t)
{
    switch (t) {
    case EXO_ROPE_DEFAULT: return "default";
    case EXO_ROPE_LINEAR: return "linear";
    case EXO_ROPE_DYNAMIC: return "dynamic";
    case EXO_ROPE_YARN: return "yarn";
    case EXO_ROPE_LLAMA3: return "llama3";
    }
    return "?";
}

static bool prefix(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }

/* Value of key in obj, NULL if absent or null. */
static json_t *obj_get(json_t *obj, const char *key)
{
    json_t *v = obj && json_is_object(obj) ? json_object_get(obj, key) : NULL;
    return v && !json_is_null(v) ? v : NULL;
}

static json_t *get(const ctx *c, const char *key)
{
    json_t *v = obj_get(c->text, key);
    return v ? v : obj_get(c->top, key);
}

/* Typed readers. `where` is the dotted key used in messages. Each returns
 * 1 if the value was present and stored, 0 if absent, or a negative error. */
static int read_int(const ctx *c, json_t *v, const char *where, int64_t *out)
{
    if (!v)
        return 0;
    if (!json_is_integer(v))
        return exo_err_set(c->err, EXO_EFORMAT, "%s: \"%s\" must be an integer", c->file, where);
    *out = json_integer_value(v);
    return 1;
}

static int read_num(const ctx *c, json_t *v, const char *where, double *out)
{
    if (!v)
        return 0;
    if (!json_is_number(v))
        return exo_err_set(c->err, EXO_EFORMAT, "%s: \"%s\" must be a number", c->file, where);
    *out = json_number_value(v);
    if (!isfinite(*out))
        return exo_err_set(c->err, EXO_EFORMAT, "%s: \"%s\" is not finite", c->file, where);
    return 1;
}

static int read_bool(const ctx *c, json_t *v, const char *where, bool *out)
{
    if (!v)
        return 0;
    if (!json_is_boolean(v))
        return exo_err_set(c->err, EXO_EFORMAT, "%s: \"%s\" must be true or false", c->file,
                           where);
    *out = json_is_true(v);
    return 1;
}

static int read_str(const ctx *c, json_t *v, const char *where, char *buf, size_t cap)
{
    if (!v)
        return 0;
    if (!json_is_string(v))
        return exo_err_set(c->err, EXO_EFORMAT, "%s: \"%s\" must be a string", c->file, where);
    snprintf(buf, cap, "%s", json_string_value(v));
    return 1;
}

/* A size that must be in 1..MAX_DIM. */
static int read_size(const ctx *c, const char *key, bool required, int64_t def, int64_t *out)
{
    int rc = read_int(c, get(c, key), key, out);
    if (rc < 0)
        return rc;
    if (rc == 0) {
        if (required)
            return exo_err_set(c->err, EXO_EFORMAT, "%s: missing required key \"%s\"", c->file,
                               key);
        *out = def;
        return 0;
    }
    if (*out <= 0)
        return exo_err_set(c->err, EXO_EFORMAT, "%s: \"%s\" must be positive (got %lld)",
                           c->file, key, (long long)*out);
    if (*out > MAX_DIM)
        return exo_err_set(c->err, EXO_EFORMAT, "%s: \"%s\" is out of range (%lld)", c->file,
                           key, (long long)*out);
    return 0;
}

/* Mixture-of-experts keys (transformers' Qwen3MoeConfig; it saves the
 * expert count as num_local_experts). */
static int parse_moe(const ctx *c, exo_model_config *cfg)
{
    int rc;
    const char *key = get(c, "num_experts")         ? "num_experts"
                      : get(c, "num_local_experts") ? "num_local_experts"
                                                    : "n_routed_experts";
    json_t *ne = get(c, key);
    if (!ne)
        return 0;
    if ((rc = read_int(c, ne, key, &cfg->n_experts)) < 0)
        return rc;
    if (cfg->n_experts < 0 || cfg->n_experts > 4096)
        return exo_err_set(c->err, EXO_EFORMAT, "%s: \"%s\" is out of range (%lld)", c->file, key,
                           (long long)cfg->n_experts);
    if (!cfg->n_experts)
        return 0;
    const char *mt = cfg->model_type;
    bool gpt_oss = !strcmp(mt, "gpt_oss");
    /* gpt_oss: every expert is intermediate_size wide */
    if ((rc = read_size(c, "num_experts_per_tok", true, 0, &cfg->n_experts_per_tok)) ||
        (rc = read_size(c, gpt_oss ? "intermediate_size" : "moe_intermediate_size", true, 0,
                        &cfg->moe_intermediate_size)) ||
        (rc = read_size(c, "decoder_sparse_step", false, 1, &cfg->decoder_sparse_step)) ||
        (rc = read_size(c, "shared_expert_intermediate_size", false, 0,
                        &cfg->shared_expert_intermediate_size)) ||
        (rc = read_size(c, "n_group", false, 1, &cfg->n_group)) ||
        (rc = read_size(c, "topk_group", false, 1, &cfg->topk_group)))
        return rc;
    if ((rc = read_int(c, get(c, "n_shared_experts"), "n_shared_experts", &cfg->n_shared_experts)) < 0 ||
        (rc = read_int(c, get(c, "first_k_dense_replace"), "first_k_dense_replace",
                       &cfg->first_k_dense_replace)) < 0)
        return rc;
    if (cfg->n_shared_experts < 0 || cfg->n_shared_experts > 64 || cfg->first_k_dense_replace < 0 ||
        cfg->first_k_dense_replace > cfg->num_hidden_layers)
        return exo_err_set(c->err, EXO_EFORMAT, "%s: \"n_shared_experts\" or \"first_k_dense_replace\" "
                           "is out of range", c->file);

    cfg->routed_scaling_factor = 1.0;
    if ((rc = read_num(c, get(c, "routed_scaling_factor"), "routed_scaling_factor",
                       &cfg->routed_scaling_factor)) < 0)
        return rc;
    char scoring[16] = "";
    if ((rc = read_str(c, get(c, "scoring_func"), "scoring_func", scoring, sizeof scoring)) < 0)
        return rc;
    cfg->router_sigmoid = !strcmp(scoring, "sigmoid") || !strcmp(mt, "glm4_moe") ||
                          !strcmp(mt, "deepseek_v3") || !strcmp(mt, "kimi_k2");
    if (scoring[0] && strcmp(scoring, "sigmoid") && strcmp(scoring, "softmax"))
        return exo_err_set(c->err, EXO_EUNSUPPORTED, "%s: \"scoring_func\" %s is not supported",
                           c->file, scoring);
    cfg->router_bias = gpt_oss;
    if (gpt_oss) {
        cfg->swiglu_limit = 7.0;
        if ((rc = read_num(c, get(c, "swiglu_limit"), "swiglu_limit", &cfg->swiglu_limit)) < 0)
            return rc;
    }
    if (cfg->n_experts_per_tok > cfg->n_experts)
        return exo_err_set(c->err, EXO_EFORMAT, "%s: \"num_experts_per_tok\" %lld exceeds %lld experts",
                           c->file, (long long)cfg->n_experts_per_tok, (long long)cfg->n_experts);
    if (cfg->n_group > 256 || cfg->n_experts % cfg->n_group || cfg->topk_group > cfg->n_group ||
        cfg->n_experts / cfg->n_group * cfg->topk_group < cfg->n_experts_per_tok)
        return exo_err_set(c->err, EXO_EFORMAT, "%s: %lld experts cannot be split in %lld groups "
                           "with top-%lld groups holding %lld experts", c->file,
                           (long long)cfg->n_experts, (long long)cfg->n_group,
                           (long long)cfg->topk_group, (long long)cfg->n_experts_per_tok);
    /* transformers: Qwen3Next and GLM default to renormalising; Qwen3.5's
     * router and gpt-oss's (softmax over the top-k) always do */
    cfg->norm_topk_prob = !strcmp(mt, "qwen3_next") || !strcmp(mt, "glm4_moe") || !strcmp(mt, "deepseek_v3");
    if ((rc = read_bool(c, get(c, "norm_topk_prob"), "norm_topk_prob", &cfg->norm_topk_prob)) < 0)
        return rc;
    if (!strcmp(mt, "qwen3_5_moe") || gpt_oss)
        cfg->norm_topk_prob = true;
    json_t *only = get(c, "mlp_only_layers");
    if (!only)
        return 0;
    if (!json_is_array(only) || json_array_size(only) > (size_t)cfg->num_hidden_layers)
        return exo_err_set(c->err, EXO_EFORMAT, "%s: \"mlp_only_layers\" must be a list of layer indices",
                           c->file);
    cfg->mlp_only_layers = exo_calloc(json_array_size(only) + 1, sizeof(int64_t));
    size_t i;
    json_t *v;
    json_array_foreach(only, i, v) {
        int64_t l = -1;
        if ((rc = read_int(c, v, "mlp_only_layers[]", &l)) < 0)
            return rc;
        if (l < 0 || l >= cfg->num_hidden_layers)
            return exo_err_set(c->err, EXO_EFORMAT, "%s: \"mlp_only_layers\" has layer %lld of %lld",
                               c->file, (long long)l, (long long)cfg->num_hidden_layers);
        cfg->mlp_only_layers[cfg->n_mlp_only_layers++] = l;
    }
    return 0;
}

exo_layer_kind exo_config_layer_kind(const exo_model_config *cfg, int64_t l)
{
    if (cfg->layer_kinds && l >= 0 && l < cfg->num_hidden_layers)
        return cfg->layer_kinds[l];
    return cfg->sliding_window > 0 ? EXO_LAYER_SLIDING : EXO_LAYER_FULL;
}

bool exo_config_layer_moe(const exo_model_config *cfg, int64_t l)
{
    if (cfg->n_experts <= 0 || l < cfg->first_k_dense_replace)
        return false;
    for (size_t i = 0; i < cfg->n_mlp_only_layers; i++)
        if (cfg->mlp_only_layers[i] == l)
            return false;
    int64_t step = cfg->decoder_sparse_step > 0 ? cfg->decoder_sparse_step : 1;
    return (l + 1) % step == 0;
}

static int read_token(const ctx *c, json_t *v, const char *where, int64_t *out)
{
    int64_t x = 0;
    int rc = read_int(c, v, where, &x);
    if (rc <= 0)
        return rc;
    if (x < 0 || x > MAX_DIM)
        return exo_err_set(c->err, EXO_EFORMAT, "%s: \"%s\" is not a valid token id (%lld)",
                           c->file, where, (long long)x);
    *out = x;
    return 1;
}

/* eos_token_id: an int or a list of ints. */
static int read_eos(const ctx *c, json_t *v, int64_t *ids, int *n)
{
    *n = 0;
    if (!v)
        return 0;
    if (json_is_array(v)) {
        if (json_array_size(v) > EXO_CONFIG_MAX_EOS)
            return exo_err_set(c->err, EXO_EFORMAT, "%s: \"eos_token_id\" lists more than %d ids",
                               c->file, EXO_CONFIG_MAX_EOS);
        for (size_t i = 0; i < json_array_size(v); i++) {
            int rc = read_token(c, json_array_get(v, i), "eos_token_id[]", &ids[*n]);
            if (rc < 0)
                return rc;
            if (rc == 0)
                return exo_err_set(c->err, EXO_EFORMAT, "%s: \"eos_token_id\" has a null entry",
                                   c->file);
            (*n)++;
        }
        return 1;
    }
    if (!json_is_integer(v))
        return exo_err_set(c->err, EXO_EFORMAT,
                           "%s: \"eos_token_id\" must be an integer or a list of integers",
                           c->file);
    int rc = read_token(c, v, "eos_token_id", &ids[0]);
    if (rc == 1)
        *n = 1;
    return rc;
}

/* ------------------------------------------------------------------ */
/* rope                                                                */

static int parse_rope(const ctx *c, exo_model_config *cfg)
{
    json_t *rp = get(c, "rope_parameters");
    json_t *rs = get(c, "rope_scaling");
    if (rp && !json_is_object(rp))
        return exo_err_set(c->err, EXO_EFORMAT, "%s: \"rope_parameters\" must be an object",
                           c->file);
    if (rs && !json_is_object(rs))
        return exo_err_set(c->err, EXO_EFORMAT, "%s: \"rope_scaling\" must be an object or null",
                           c->file);
    const char *rname = "rope_parameters";
    if (rp && !obj_get(rp, "rope_type") && !obj_get(rp, "type") && !obj_get(rp, "rope_theta") &&
        json_object_size(rp) > 0) {
        /* per layer type: {"full_attention": {...}, "sliding_attention": {...}} */
        json_t *full = obj_get(rp, "full_attention");
        if (!full && json_object_size(rp) == 1) {
            void *it = json_object_iter(rp);
            full = json_object_iter_value(it);
        }
        if (!full || !json_is_object(full))
            return exo_err_set(c->err, EXO_EFORMAT,
                               "%s: \"rope_parameters\" has no rope_type/rope_theta and no "
                               "\"full_attention\" entry",
                               c->file);
        rp = full;
        rname = "rope_parameters.full_attention";
    }
    json_t *src = rp ? rp : rs;
    const char *sname = rp ? rname : "rope_scaling";

    cfg->rope_theta = 10000.0;
    int rc = read_num(c, obj_get(rp, "rope_theta"), "rope_parameters.rope_theta", &cfg->rope_theta);
    if (rc == 0)
        rc = read_num(c, get(c, "rope_theta"), "rope_theta", &cfg->rope_theta);
    if (rc < 0)
        return rc;
    if (!(cfg->rope_theta > 0))
        return exo_err_set(c->err, EXO_EFORMAT, "%s: \"rope_theta\" must be positive", c->file);

    exo_rope_scaling *r = &cfg->rope;
    memset(r, 0, sizeof *r);
    r->factor = 1.0;
    r->beta_fast = 32;
    r->beta_slow = 1;
    if (!src)
        return 0;

    char type[32] = "";
    char where[96];
    json_t *tv = obj_get(src, "rope_type");
    snprintf(where, sizeof where, "%s.rope_type", sname);
    if (!tv) {
        tv = obj_get(src, "type");
        snprintf(where, sizeof where, "%s.type", sname);
    }
    if ((rc = read_str(c, tv, where, type, sizeof type)) < 0)
        return rc;
    if (!type[0] || !strcmp(type, "default"))
        r->type = EXO_ROPE_DEFAULT;
    else if (!strcmp(type, "linear"))
        r->type = EXO_ROPE_LINEAR;
    else if (!strcmp(type, "dynamic"))
        r->type = EXO_ROPE_DYNAMIC;
    else if (!strcmp(type, "yarn"))
        r->type = EXO_ROPE_YARN;
    else if (!strcmp(type, "llama3"))
        r->type = EXO_ROPE_LLAMA3;
    else
        return exo_err_set(c->err, EXO_EUNSUPPORTED, "%s: \"%s\": rope type \"%s\" is not supported",
                           c->file, where, type);

#define NUM(field, key)                                                                        \
    do {                                                                                       \
        snprintf(where, sizeof where, "%s.%s", sname, key);                                    \
        if ((rc = read_num(c, obj_get(src, key), where, &r->field)) < 0)                       \
            return rc;                                                                         \
    } while (0)
    NUM(factor, "factor");
    bool has_factor = rc == 1;
    NUM(low_freq_factor, "low_freq_factor");
    bool has_low = rc == 1;
    NUM(high_freq_factor, "high_freq_factor");
    bool has_high = rc == 1;
    NUM(beta_fast, "beta_fast");
    NUM(beta_slow, "beta_slow");
    NUM(attention_factor, "attention_factor");
    NUM(mscale, "mscale");
    NUM(mscale_all_dim, "mscale_all_dim");
#undef NUM
    bool truncate = true;
    snprintf(where, sizeof where, "%s.truncate", sname);
    if ((rc = read_bool(c, obj_get(src, "truncate"), where, &truncate)) < 0)
        return rc;
    r->yarn_no_truncate = !truncate;
    snprintf(where, sizeof where, "%s.original_max_position_embeddings", sname);
    rc = read_int(c, obj_get(src, "original_max_position_embeddings"), where,
                  &r->original_max_position_embeddings);
    if (rc < 0)
        return rc;
    if (rc == 0 && r->type == EXO_ROPE_YARN) /* 5.x may keep it at top level */
        if ((rc = read_int(c, get(c, "original_max_position_embeddings"),
                           "original_max_position_embeddings",
                           &r->original_max_position_embeddings)) < 0)
            return rc;
    if (rc == 0 && r->type == EXO_ROPE_YARN) /* transformers: else max_position_embeddings */
        r->original_max_position_embeddings = cfg->max_position_embeddings;
    if (r->original_max_position_embeddings < 0 || r->original_max_position_embeddings > MAX_DIM)
        return exo_err_set(c->err, EXO_EFORMAT,
                           "%s: \"%s.original_max_position_embeddings\" is out of range", c->file,
                           sname);

    if (r->type != EXO_ROPE_DEFAULT) {
        if (!has_factor)
            return exo_err_set(c->err, EXO_EFORMAT, "%s: \"%s\": rope type %s needs \"factor\"",
                               c->file, sname, type);
        if (!(r->factor > 0))
            return exo_err_set(c->err, EXO_EFORMAT, "%s: \"%s.factor\" must be positive",
                               c->file, sname);
    }
    if (r->type == EXO_ROPE_DEFAULT)
        r->factor = 1.0;
    if (r->type == EXO_ROPE_LLAMA3) {
        if (!has_low || !has_high || r->original_max_position_embeddings <= 0)
            return exo_err_set(c->err, EXO_EFORMAT,
                               "%s: \"%s\": llama3 rope needs low_freq_factor, high_freq_factor "
                               "and original_max_position_embeddings",
                               c->file, sname);
        if (!(r->high_freq_factor > r->low_freq_factor) || !(r->low_freq_factor > 0))
            return exo_err_set(c->err, EXO_EFORMAT,
                               "%s: \"%s\": need 0 < low_freq_factor < high_freq_factor", c->file,
                               sname);
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* quantization                                                        */

static int valid_bits(int64_t b) { return b == 2 || b == 3 || b == 4 || b == 5 || b == 6 || b == 8; }
static int valid_group(int64_t g) { return g == 32 || g == 64 || g == 128; }

static int cmp_override(const void *a, const void *b)
{
    return strcmp(((const exo_quant_override *)a)->module, ((const exo_quant_override *)b)->module);
}

static int parse_quant(const ctx *c, exo_model_config *cfg)
{
    const char *qname = "quantization";
    json_t *q = get(c, "quantization");
    if (!q) {
        q = get(c, "quantization_config");
        qname = "quantization_config";
    }
    if (!q)
        return 0;
    if (!json_is_object(q))
        return exo_err_set(c->err, EXO_EFORMAT, "%s: \"%s\" must be an object", c->file, qname);
    exo_quant_config *qc = &cfg->quant;
    char where[160];
    int64_t bits = 0, gs = 0;
    int rc;
    snprintf(where, sizeof where, "%s.bits", qname);
    if ((rc = read_int(c, obj_get(q, "bits"), where, &bits)) < 0)
        return rc;
    bool has_bits = rc == 1;
    snprintf(where, sizeof where, "%s.group_size", qname);
    if ((rc = read_int(c, obj_get(q, "group_size"), where, &gs)) < 0)
        return rc;
    bool has_gs = rc == 1;
    if (!has_bits || !has_gs) {
        json_t *m = obj_get(q, "quant_method");
        /* the gpt-oss hub checkpoints: MXFP4 experts (their tensors say
         * so, see model.c), everything else unquantized */
        if (m && json_is_string(m) && !strcmp(json_string_value(m), "mxfp4"))
            return 0;
        if (m && json_is_string(m))
            return exo_err_set(c->err, EXO_EUNSUPPORTED,
                               "%s: \"%s\": quant_method \"%.40s\" is not supported", c->file,
                               qname, json_string_value(m));
        return exo_err_set(c->err, EXO_EFORMAT, "%s: \"%s\" needs \"bits\" and \"group_size\"",
                           c->file, qname);
    }
    snprintf(qc->mode, sizeof qc->mode, "affine");
    snprintf(where, sizeof where, "%s.mode", qname);
    if ((rc = read_str(c, obj_get(q, "mode"), where, qc->mode, sizeof qc->mode)) < 0)
        return rc;
    bool mxfp4 = !strcmp(qc->mode, "mxfp4");
    if (mxfp4 && (bits != 4 || gs != 32)) /* as mlx defines the mode */
        return exo_err_set(c->err, EXO_EUNSUPPORTED, "%s: \"%s\": mode mxfp4 is 4 bits in groups of 32, "
                           "not bits=%lld group_size=%lld", c->file, qname, (long long)bits, (long long)gs);
    if (strcmp(qc->mode, "affine") && !mxfp4)
        return exo_err_set(c->err, EXO_EUNSUPPORTED,
                           "%s: \"%s.mode\": quantization mode \"%s\" is not supported", c->file,
                           qname, qc->mode);
    if (!valid_bits(bits) || !valid_group(gs))
        return exo_err_set(c->err, EXO_EUNSUPPORTED,
                           "%s: \"%s\": bits=%lld group_size=%lld not supported (bits 2,3,4,5,6,8; "
                           "group_size 32,64,128)",
                           c->file, qname, (long long)bits, (long long)gs);
    qc->enabled = true;
    qc->bits = (int)bits;
    qc->group_size = (int)gs;

    size_t cap = json_object_size(q);
    qc->overrides = exo_calloc(cap ? cap : 1, sizeof *qc->overrides);
    const char *key;
    json_t *v;
    json_object_foreach(q, key, v)
    {
        if (!strcmp(key, "bits") || !strcmp(key, "group_size") || !strcmp(key, "mode"))
            continue;
        exo_quant_override o = {NULL, true, qc->bits, qc->group_size};
        if (json_is_boolean(v)) {
            o.quantized = json_is_true(v);
        } else if (json_is_object(v)) {
            int64_t b = qc->bits, g = qc->group_size;
            snprintf(where, sizeof where, "%s.%.100s.bits", qname, key);
            if ((rc = read_int(c, obj_get(v, "bits"), where, &b)) < 0)
                return rc;
            snprintf(where, sizeof where, "%s.%.100s.group_size", qname, key);
            if ((rc = read_int(c, obj_get(v, "group_size"), where, &g)) < 0)
                return rc;
            if (!valid_bits(b) || !valid_group(g))
                return exo_err_set(c->err, EXO_EUNSUPPORTED,
                                   "%s: \"%s.%.100s\": bits=%lld group_size=%lld not supported",
                                   c->file, qname, key, (long long)b, (long long)g);
            json_t *mv = obj_get(v, "mode");
            if (mv && (!json_is_string(mv) || (strcmp(json_string_value(mv), "affine") &&
                                               strcmp(json_string_value(mv), "mxfp4"))))
                return exo_err_set(c->err, EXO_EUNSUPPORTED,
                                   "%s: \"%s.%.100s.mode\": only \"affine\" and \"mxfp4\" are "
                                   "supported", c->file, qname, key);
            o.bits = (int)b;
            o.group_size = (int)g;
        } else {
            continue; /* other scalar settings (quant_method, ...) */
        }
        o.module = exo_strdup(key);
        qc->overrides[qc->n_overrides++] = o;
    }
    qsort(qc->overrides, qc->n_overrides, sizeof *qc->overrides, cmp_override);
    return 0;
}

int exo_config_quant_for(const exo_model_config *cfg, const char *module_path, int *bits,
                         int *group_size)
{
    const exo_quant_config *qc = &cfg->quant;
    if (!qc->enabled || !module_path)
        return 0;
    exo_quant_override key = {(char *)module_path, false, 0, 0};
    const exo_quant_override *o =
        qc->n_overrides ? bsearch(&key, qc->overrides, qc->n_overrides, sizeof *qc->overrides,
                                  cmp_override)
                        : NULL;
    if (!o) {
        /* Wrapped models: the config may say "language_model.model.layers.0.x"
         * where the caller asks for "model.layers.0.x", or the reverse. */
        size_t n = strlen(module_path);
        for (size_t i = 0; i < qc->n_overrides && !o; i++) {
            const char *k = qc->overrides[i].module;
            size_t kn = strlen(k);
            if ((kn > n && k[kn - n - 1] == '.' && !strcmp(k + kn - n, module_path)) ||
                (n > kn && module_path[n - kn - 1] == '.' && !strcmp(module_path + n - kn, k)))
                o = &qc->overrides[i];
        }
    }
    int b = qc->bits, g = qc->group_size;
    if (o) {
        if (!o->quantized)
            return 0;
        b = o->bits;
        g = o->group_size;
    }
    if (bits)
        *bits = b;
    if (group_size)
        *group_size = g;
    return 1;
}

bool exo_config_is_eos(const exo_model_config *cfg, int64_t id)
{
    for (int i = 0; i < cfg->n_eos; i++)
        if (cfg->eos_token_ids[i] == id)
            return true;
    return false;
}

/* ------------------------------------------------------------------ */
/* per-layer kinds and the newer families' keys                        */

/* A key of rope_parameters (5.x, maybe per layer type) or the top level. */
static int read_rope_num(const ctx *c, const char *layer_type, const char *key, double *out)
{
    json_t *rp = get(c, "rope_parameters");
    json_t *sub = obj_get(rp, layer_type);
    char where[96];
    snprintf(where, sizeof where, "rope_parameters.%s.%s", layer_type, key);
    int rc = read_num(c, obj_get(sub, key), where, out);
    if (rc)
        return rc;
    snprintf(where, sizeof where, "rope_parameters.%s", key);
    if ((rc = read_num(c, obj_get(rp, key), where, out)))
        return rc;
    return read_num(c, get(c, key), key, out);
}

static int parse_layers(const ctx *c, exo_model_config *cfg)
{
    const char *mt = cfg->model_type;
    bool hybrid = !strcmp(mt, "qwen3_next") || prefix(mt, "qwen3_5"), gemma3 = !strcmp(mt, "gemma3"),
         gpt_oss = !strcmp(mt, "gpt_oss");
    int64_t n = cfg->num_hidden_layers;
    int rc;
    cfg->layer_kinds = exo_calloc((size_t)n, sizeof *cfg->layer_kinds);
    json_t *types = get(c, "layer_types");
    if (types) {
        if (!json_is_array(types) || (int64_t)json_array_size(types) < n)
            return exo_err_set(c->err, EXO_EFORMAT, "%s: \"layer_types\" must list %lld layers",
                               c->file, (long long)n);
        for (int64_t i = 0; i < n; i++) {
            json_t *v = json_array_get(types, (size_t)i);
            const char *t = json_is_string(v) ? json_string_value(v) : "";
            if (!strcmp(t, "full_attention"))
                cfg->layer_kinds[i] = EXO_LAYER_FULL;
            else if (!strcmp(t, "sliding_attention"))
                cfg->layer_kinds[i] = EXO_LAYER_SLIDING;
            else if (!strcmp(t, "linear_attention"))
                cfg->layer_kinds[i] = EXO_LAYER_LINEAR;
            else
                return exo_err_set(c->err, EXO_EUNSUPPORTED, "%s: layer_types[%lld] \"%s\" is not "
                                   "supported", c->file, (long long)i, t);
        }
    } else {
        int64_t every = 0;
        const char *key = hybrid ? "full_attention_interval" : "sliding_window_pattern";
        if ((hybrid || gemma3) && (rc = read_size(c, key, false, hybrid ? 4 : 6, &every)))
            return rc;
        for (int64_t i = 0; i < n; i++) {
            exo_layer_kind other = hybrid ? EXO_LAYER_LINEAR : EXO_LAYER_SLIDING;
            if (hybrid || gemma3)
                cfg->layer_kinds[i] = (i + 1) % every ? other : EXO_LAYER_FULL;
            else if (gpt_oss)
                cfg->layer_kinds[i] = i % 2 ? EXO_LAYER_FULL : EXO_LAYER_SLIDING;
            else
                cfg->layer_kinds[i] = cfg->sliding_window ? EXO_LAYER_SLIDING : EXO_LAYER_FULL;
        }
    }
    for (int64_t i = 0; i < n; i++)
        if ((cfg->layer_kinds[i] == EXO_LAYER_SLIDING && cfg->sliding_window <= 0) ||
            (cfg->layer_kinds[i] == EXO_LAYER_LINEAR && !hybrid))
            return exo_err_set(c->err, EXO_EFORMAT, "%s: layer %lld is %s but the model has %s",
                               c->file, (long long)i,
                               cfg->layer_kinds[i] == EXO_LAYER_LINEAR ? "linear attention" : "sliding",
                               cfg->layer_kinds[i] == EXO_LAYER_LINEAR ? "no linear attention" :
                               "no sliding_window");

    cfg->partial_rotary_factor = hybrid ? 0.25 : !strcmp(mt, "glm4_moe") ? 0.5 : 1.0;
    if ((rc = read_rope_num(c, "full_attention", "partial_rotary_factor", &cfg->partial_rotary_factor)) < 0)
        return rc;
    if (!(cfg->partial_rotary_factor > 0 && cfg->partial_rotary_factor <= 1))
        return exo_err_set(c->err, EXO_EFORMAT, "%s: \"partial_rotary_factor\" must be in (0, 1]", c->file);
    if (gemma3) {
        cfg->rope_local_theta = 10000.0;
        cfg->query_pre_attn_scalar = 256;
        json_t *local = obj_get(obj_get(get(c, "rope_parameters"), "sliding_attention"), "rope_theta");
        if ((rc = read_num(c, local ? local : get(c, "rope_local_base_freq"),
                           local ? "rope_parameters.sliding_attention.rope_theta" : "rope_local_base_freq",
                           &cfg->rope_local_theta)) < 0 ||
            (rc = read_num(c, get(c, "query_pre_attn_scalar"), "query_pre_attn_scalar",
                           &cfg->query_pre_attn_scalar)) < 0)
            return rc;
        if (!(cfg->rope_local_theta > 0) || !(cfg->query_pre_attn_scalar > 0))
            return exo_err_set(c->err, EXO_EFORMAT, "%s: rope_local_base_freq and "
                               "query_pre_attn_scalar must be positive", c->file);
    }
    if ((rc = read_num(c, get(c, "final_logit_softcapping"), "final_logit_softcapping",
                       &cfg->final_logit_softcapping)) < 0)
        return rc;
    double attn_cap = 0;
    if ((rc = read_num(c, get(c, "attn_logit_softcapping"), "attn_logit_softcapping", &attn_cap)) < 0)
        return rc;
    if (attn_cap != 0 || cfg->final_logit_softcapping < 0)
        return exo_err_set(c->err, EXO_EUNSUPPORTED, "%s: attention logit softcapping is not "
                           "supported", c->file);
    if (!strcmp(mt, "deepseek_v3") || !strcmp(mt, "kimi_k2")) {
        if ((rc = read_int(c, get(c, "q_lora_rank"), "q_lora_rank", &cfg->q_lora_rank)) < 0 ||
            (rc = read_size(c, "kv_lora_rank", false, 512, &cfg->kv_lora_rank)) ||
            (rc = read_size(c, "qk_nope_head_dim", false, 128, &cfg->qk_nope_head_dim)) ||
            (rc = read_size(c, "qk_rope_head_dim", false, 64, &cfg->qk_rope_head_dim)) ||
            (rc = read_size(c, "v_head_dim", false, 128, &cfg->v_head_dim)))
            return rc;
        if (!get(c, "q_lora_rank") && !json_object_get(c->text ? c->text : c->top, "q_lora_rank"))
            cfg->q_lora_rank = 1536; /* the class default; null means none */
        cfg->rope_interleave = true;
        if ((rc = read_bool(c, get(c, "rope_interleave"), "rope_interleave", &cfg->rope_interleave)) < 0)
            return rc;
        if (cfg->q_lora_rank < 0 || cfg->q_lora_rank > MAX_DIM || cfg->qk_rope_head_dim % 2 ||
            cfg->kv_lora_rank + cfg->qk_rope_head_dim > 4096)
            return exo_err_set(c->err, EXO_EFORMAT, "%s: latent attention sizes out of range", c->file);
        cfg->head_dim = cfg->qk_rope_head_dim; /* what RoPE rotates; see qk_nope_head_dim */
        cfg->num_key_value_heads = cfg->num_attention_heads;
    }
    if (hybrid &&
        ((rc = read_size(c, "linear_num_key_heads", false, 16, &cfg->linear_k_heads)) ||
         (rc = read_size(c, "linear_num_value_heads", false, 32, &cfg->linear_v_heads)) ||
         (rc = read_size(c, "linear_key_head_dim", false, 128, &cfg->linear_k_dim)) ||
         (rc = read_size(c, "linear_value_head_dim", false, 128, &cfg->linear_v_dim)) ||
         (rc = read_size(c, "linear_conv_kernel_dim", false, 4, &cfg->linear_conv_kernel))))
        return rc;
    if (hybrid && (cfg->linear_v_heads % cfg->linear_k_heads || cfg->linear_conv_kernel > 16))
        return exo_err_set(c->err, EXO_EFORMAT, "%s: linear_num_value_heads must be a multiple of "
                           "linear_num_key_heads, and the conv kernel at most 16", c->file);
    return 0;
}

/* ------------------------------------------------------------------ */
/* config.json                                                         */

static int parse_config(const ctx *c, exo_model_config *cfg)
{
    int rc;
    /* model_type: the text model's, falling back to the wrapper's */
    if ((rc = read_str(c, get(c, "model_type"), "model_type", cfg->model_type,
                       sizeof cfg->model_type)) < 0)
        return rc;
    json_t *arch = obj_get(c->top, "architectures");
    if (!arch)
        arch = obj_get(c->text, "architectures");
    if (arch) {
        if (!json_is_array(arch))
            return exo_err_set(c->err, EXO_EFORMAT, "%s: \"architectures\" must be a list",
                               c->file);
        if (json_array_size(arch) &&
            (rc = read_str(c, json_array_get(arch, 0), "architectures[0]", cfg->architecture,
                           sizeof cfg->architecture)) < 0)
            return rc;
    }
    /* the text model of a multimodal wrapper says "qwen3_5_moe_text",
     * "gemma3_text": one family either way */
    size_t mtlen = strlen(cfg->model_type);
    if (mtlen > 5 && !strcmp(cfg->model_type + mtlen - 5, "_text"))
        cfg->model_type[mtlen - 5] = 0;
    if (!strcmp(cfg->model_type, "kimi_k2")) /* DeepSeek-V3's architecture under another name */
        snprintf(cfg->model_type, sizeof cfg->model_type, "deepseek_v3");
    const char *mt = cfg->model_type;
    bool qwen2 = !strcmp(mt, "qwen2"), qwen3 = prefix(mt, "qwen3"),
         mistral = !strcmp(mt, "mistral"), llama_like = !strcmp(mt, "llama") || mistral;
    bool hybrid = !strcmp(mt, "qwen3_next") || prefix(mt, "qwen3_5"), gemma3 = !strcmp(mt, "gemma3"),
         gpt_oss = !strcmp(mt, "gpt_oss");

    if ((rc = read_size(c, "vocab_size", true, 0, &cfg->vocab_size)) ||
        (rc = read_size(c, "hidden_size", true, 0, &cfg->hidden_size)) ||
        /* Qwen3.5-MoE has no dense MLP and no intermediate_size */
        (rc = read_size(c, "intermediate_size", strcmp(mt, "qwen3_5_moe") != 0, 0,
                        &cfg->intermediate_size)) ||
        (rc = read_size(c, "num_hidden_layers", true, 0, &cfg->num_hidden_layers)) ||
        (cfg->num_hidden_layers > MAX_LAYERS &&
         (rc = exo_err_set(c->err, EXO_EFORMAT, "%s: \"num_hidden_layers\" %lld is more than %d",
                           c->file, (long long)cfg->num_hidden_layers, MAX_LAYERS))) ||
        (rc = read_size(c, "num_attention_heads", true, 0, &cfg->num_attention_heads)) ||
        (rc = read_size(c, "num_key_value_heads", false, cfg->num_attention_heads,
                        &cfg->num_key_value_heads)) ||
        (rc = read_size(c, "max_position_embeddings", false,
                        qwen2 || qwen3 ? 32768 : mistral ? 4096 * 32 : 2048,
                        &cfg->max_position_embeddings)))
        return rc;

    bool explicit_hd = get(c, "head_dim") != NULL;
    if ((rc = read_size(c, "head_dim", false, 0, &cfg->head_dim)))
        return rc;
    if (!explicit_hd) {
        if (hybrid || gemma3) {
            cfg->head_dim = 256;
        } else if (gpt_oss) {
            cfg->head_dim = 64;
        } else if (qwen3) {
            cfg->head_dim = 128;
        } else {
            if (cfg->hidden_size % cfg->num_attention_heads)
                return exo_err_set(c->err, EXO_EFORMAT,
                                   "%s: \"hidden_size\" %lld is not divisible by "
                                   "\"num_attention_heads\" %lld and there is no \"head_dim\"",
                                   c->file, (long long)cfg->hidden_size,
                                   (long long)cfg->num_attention_heads);
            cfg->head_dim = cfg->hidden_size / cfg->num_attention_heads;
        }
    }
    if (cfg->num_attention_heads % cfg->num_key_value_heads)
        return exo_err_set(c->err, EXO_EFORMAT,
                           "%s: \"num_attention_heads\" %lld is not a multiple of "
                           "\"num_key_value_heads\" %lld",
                           c->file, (long long)cfg->num_attention_heads,
                           (long long)cfg->num_key_value_heads);

    cfg->rms_norm_eps = 1e-6;
    if ((rc = read_num(c, get(c, "rms_norm_eps"), "rms_norm_eps", &cfg->rms_norm_eps)) < 0)
        return rc;
    if (!(cfg->rms_norm_eps > 0) || cfg->rms_norm_eps >= 1)
        return exo_err_set(c->err, EXO_EFORMAT, "%s: \"rms_norm_eps\" must be in (0, 1)", c->file);

    if ((rc = parse_rope(c, cfg)))
        return rc;

    cfg->tie_word_embeddings = gemma3;
    if ((rc = read_bool(c, get(c, "tie_word_embeddings"), "tie_word_embeddings",
                        &cfg->tie_word_embeddings)) < 0)
        return rc;
    cfg->attention_bias = gpt_oss;
    if ((rc = read_bool(c, get(c, "attention_bias"), "attention_bias", &cfg->attention_bias)) < 0)
        return rc;
    if (qwen2)
        cfg->attention_bias = true; /* Qwen2 q/k/v always have bias */
    cfg->mlp_bias = false;
    if ((rc = read_bool(c, get(c, "mlp_bias"), "mlp_bias", &cfg->mlp_bias)) < 0)
        return rc;
    snprintf(cfg->hidden_act, sizeof cfg->hidden_act, "%s", gemma3 ? "gelu_pytorch_tanh" : "silu");
    const char *act_key = get(c, "hidden_activation") ? "hidden_activation" : "hidden_act";
    if ((rc = read_str(c, get(c, act_key), act_key, cfg->hidden_act, sizeof cfg->hidden_act)) < 0)
        return rc;

    cfg->bos_token_id = llama_like ? 1 : -1;
    cfg->pad_token_id = -1;
    if ((rc = read_token(c, get(c, "bos_token_id"), "bos_token_id", &cfg->bos_token_id)) < 0 ||
        (rc = read_token(c, get(c, "pad_token_id"), "pad_token_id", &cfg->pad_token_id)) < 0)
        return rc;
    json_t *eos = get(c, "eos_token_id");
    if (eos) {
        if ((rc = read_eos(c, eos, cfg->eos_token_ids, &cfg->n_eos)) < 0)
            return rc;
    } else if (llama_like && !json_object_get(c->top, "eos_token_id") &&
               !obj_get(c->text, "eos_token_id")) {
        cfg->eos_token_ids[0] = 2; /* key absent (not null): the class default */
        cfg->n_eos = 1;
    }

    json_t *dt = get(c, "torch_dtype");
    if ((rc = read_str(c, dt ? dt : get(c, "dtype"), dt ? "torch_dtype" : "dtype",
                       cfg->torch_dtype, sizeof cfg->torch_dtype)) < 0)
        return rc;

    cfg->sliding_window = 0;
    json_t *sw = get(c, "sliding_window");
    if (qwen2 || qwen3) {
        bool use = false;
        if ((rc = read_bool(c, get(c, "use_sliding_window"), "use_sliding_window", &use)) < 0)
            return rc;
        if (use && (rc = read_size(c, "sliding_window", false, 4096, &cfg->sliding_window)))
            return rc;
    } else if (mistral && !json_object_get(c->top, "sliding_window") &&
               !(c->text && json_object_get(c->text, "sliding_window"))) {
        cfg->sliding_window = 4096;
    } else if (sw && (rc = read_size(c, "sliding_window", false, 0, &cfg->sliding_window))) {
        return rc;
    } else if (!sw && (gemma3 || gpt_oss)) {
        cfg->sliding_window = gemma3 ? 4096 : 128;
    }

    if ((rc = parse_moe(c, cfg)) || (rc = parse_layers(c, cfg)))
        return rc;
    if (!cfg->intermediate_size && cfg->n_experts <= 0) /* Qwen3.5-MoE's config without its experts */
        return exo_err_set(c->err, EXO_EFORMAT, "%s: no \"intermediate_size\" and no experts: the model "
                           "has no MLP", c->file);

    cfg->generation.temperature = 1.0;
    cfg->generation.top_p = 1.0;
    cfg->generation.top_k = 50;
    cfg->generation.min_p = 0.0;
    cfg->generation.repetition_penalty = 1.0;
    cfg->generation.do_sample = false;

    return parse_quant(c, cfg);
}

static json_t *load_json(const char *json, size_t len, const char *name, exo_err *err)
{
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        exo_err_set(err, EXO_EFORMAT, "%s: not valid JSON: %s (line %d, column %d)", name,
                    jerr.text, jerr.line, jerr.column);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        exo_err_set(err, EXO_EFORMAT, "%s: not a JSON object", name);
        return NULL;
    }
    return root;
}

void exo_config_free(exo_model_config *cfg)
{
    if (!cfg)
        return;
    for (size_t i = 0; i < cfg->quant.n_overrides; i++)
        exo_free(cfg->quant.overrides[i].module);
    exo_free(cfg->quant.overrides);
    exo_free(cfg->mlp_only_layers);
    exo_free(cfg->layer_kinds);
    memset(cfg, 0, sizeof *cfg);
}

int exo_config_parse(const char *json, size_t len, const char *name, exo_model_config *out,
                     exo_err *err)
{
    memset(out, 0, sizeof *out);
    if (!name)
        name = "config.json";
    json_t *root = load_json(json, len, name, err);
    if (!root)
        return EXO_EFORMAT;
    ctx c = {name, root, NULL, err};
    json_t *tc = json_object_get(root, "text_config");
    int rc = 0;
    if (tc && !json_is_null(tc)) {
        if (!json_is_object(tc))
            rc = exo_err_set(err, EXO_EFORMAT, "%s: \"text_config\" must be an object", name);
        c.text = tc;
    }
    if (!rc)
        rc = parse_config(&c, out);
    json_decref(root);
    if (rc)
        exo_config_free(out);
    return rc;
}

int exo_config_apply_generation(exo_model_config *cfg, const char *json, size_t len,
                                const char *name, exo_err *err)
{
    if (!name)
        name = "generation_config.json";
    json_t *root = load_json(json, len, name, err);
    if (!root)
        return EXO_EFORMAT;
    ctx c = {name, root, NULL, err};
    exo_model_config n = *cfg; /* shares quant.overrides; only plain fields change */
    exo_generation_defaults *g = &n.generation;
    int rc;
    int64_t ids[EXO_CONFIG_MAX_EOS];
    int nids = 0;
    if ((rc = read_eos(&c, obj_get(root, "eos_token_id"), ids, &nids)) < 0)
        goto out;
    if (rc == 1) {
        for (int i = 0; i < cfg->n_eos && nids < EXO_CONFIG_MAX_EOS; i++) {
            bool dup = false;
            for (int j = 0; j < nids; j++)
                dup |= ids[j] == cfg->eos_token_ids[i];
            if (!dup)
                ids[nids++] = cfg->eos_token_ids[i];
        }
        memcpy(n.eos_token_ids, ids, sizeof ids);
        n.n_eos = nids;
    }
    if ((rc = read_token(&c, obj_get(root, "bos_token_id"), "bos_token_id", &n.bos_token_id)) < 0 ||
        (rc = read_token(&c, obj_get(root, "pad_token_id"), "pad_token_id", &n.pad_token_id)) < 0)
        goto out;

#define GEN(reader, key, field, bit)                                                           \
    do {                                                                                       \
        if ((rc = reader(&c, obj_get(root, key), key, &g->field)) < 0)                         \
            goto out;                                                                          \
        if (rc == 1)                                                                           \
            g->set |= (bit);                                                                   \
    } while (0)
    GEN(read_num, "temperature", temperature, EXO_GEN_TEMPERATURE);
    GEN(read_num, "top_p", top_p, EXO_GEN_TOP_P);
    GEN(read_int, "top_k", top_k, EXO_GEN_TOP_K);
    GEN(read_num, "min_p", min_p, EXO_GEN_MIN_P);
    GEN(read_num, "repetition_penalty", repetition_penalty, EXO_GEN_REPETITION_PENALTY);
    GEN(read_bool, "do_sample", do_sample, EXO_GEN_DO_SAMPLE);
#undef GEN
    rc = 0;
    if (g->temperature < 0 || g->top_p < 0 || g->top_p > 1 || g->top_k < 0 || g->min_p < 0 ||
        g->min_p > 1 || !(g->repetition_penalty > 0))
        rc = exo_err_set(err, EXO_EFORMAT, "%s: a sampling default is out of range", name);
out:
    json_decref(root);
    if (!rc)
        *cfg = n;
    return rc;
}

/* Reads a whole small file. 1 = read, 0 = does not exist, <0 = error. */
static int read_file(const char *path, char **buf, size_t *len, exo_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return errno == ENOENT ? 0 : exo_err_set(err, EXO_EIO, "%s: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *b = exo_malloc(cap);
    for (;;) {
        if (n == cap) {
            if (cap >= MAX_CONFIG_BYTES) {
                fclose(f);
                exo_free(b);
                return exo_err_set(err, EXO_ETOOBIG, "%s: larger than %zu bytes", path,
                                   MAX_CONFIG_BYTES);
            }
            cap *= 2;
            b = exo_realloc(b, cap);
        }
        size_t k = fread(b + n, 1, cap - n, f);
        n += k;
        if (k == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        exo_free(b);
        return exo_err_set(err, EXO_EIO, "%s: read error", path);
    }
    *buf = b;
    *len = n;
    return 1;
}

int exo_config_load(const char *path, exo_model_config *out, exo_err *err)
{
    memset(out, 0, sizeof *out);
    struct stat sb;
    if (stat(path, &sb) != 0)
        return exo_err_set(err, errno == ENOENT ? EXO_ENOENT : EXO_EIO, "%s: %s", path,
                           strerror(errno));
    char *cfg_path, *gen_path;
    if (S_ISDIR(sb.st_mode)) {
        size_t n = strlen(path);
        cfg_path = exo_malloc(n + 16);
        gen_path = exo_malloc(n + 32);
        snprintf(cfg_path, n + 16, "%s/config.json", path);
        snprintf(gen_path, n + 32, "%s/generation_config.json", path);
    } else {
        cfg_path = exo_strdup(path);
        const char *slash = strrchr(path, '/');
        size_t d = slash ? (size_t)(slash - path) + 1 : 0;
        gen_path = exo_malloc(d + 32);
        memcpy(gen_path, path, d);
        snprintf(gen_path + d, 32, "generation_config.json");
    }
    char *buf = NULL;
    size_t len = 0;
    int rc = read_file(cfg_path, &buf, &len, err);
    if (rc == 0)
        rc = exo_err_set(err, EXO_ENOENT, "%s: no such file", cfg_path);
    if (rc < 0)
        goto out;
    rc = exo_config_parse(buf, len, cfg_path, out, err);
    exo_free(buf);
    buf = NULL;
    if (rc)
        goto out;
    rc = read_file(gen_path, &buf, &len, err);
    if (rc == 1)
        rc = exo_config_apply_generation(out, buf, len, gen_path, err);
    if (rc < 0)
        exo_config_free(out);
    else
        rc = 0;
out:
    exo_free(buf);
    exo_free(cfg_path);
    exo_free(gen_path);
    return rc;
}
