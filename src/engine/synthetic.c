/* Synthetic models (see synthetic.h). For exo_synth_build, tensors are
 * generated on first request by the weight source and owned by the
 * exo_synth; exo_synth_write produces the same bytes as deferred tensors of
 * a safetensors writer. Each tensor has its own xorshift stream seeded from
 * (seed, name). Scales are chosen so a random weight row has about unit
 * gain (std ~ 1/sqrt(cols)). */
#include "engine/synthetic.h"
#include "core/json_util.h"
#include "core/alloc.h"
#include "core/arena.h"
#include "engine/safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef struct preset {
    const char *name;
    const char *model_type;
    const char *architecture;
    int dim, ffn, layers, heads, kv, head_dim, vocab;
    bool tied;
    double theta;
    double eps;
    int max_pos;
    double llama3_factor; /* llama3 RoPE scaling factor (low 1, high 4, original 8192); 0: none */
    int bos;              /* -1: none */
    int eos[3];           /* 0-terminated (no preset uses id 0) */
    int experts, topk, moe_ffn; /* mixture of experts in every layer (qwen3_moe); 0: dense */
} preset;

static const preset presets[] = {
    {"llama-3.2-1b", "llama", "LlamaForCausalLM", 2048, 8192, 16, 32, 8, 64, 128256, true, 500000,
     1e-5, 131072, 32, 128000, {128001, 128008, 128009}, 0, 0, 0},
    {"llama-3.2-3b", "llama", "LlamaForCausalLM", 3072, 8192, 28, 24, 8, 128, 128256, true, 500000,
     1e-5, 131072, 32, 128000, {128001, 128008, 128009}, 0, 0, 0},
    {"llama-3.1-8b", "llama", "LlamaForCausalLM", 4096, 14336, 32, 32, 8, 128, 128256, false,
     500000, 1e-5, 131072, 8, 128000, {128001, 128008, 128009}, 0, 0, 0},
    {"qwen3-0.6b", "qwen3", "Qwen3ForCausalLM", 1024, 3072, 28, 16, 8, 128, 151936, true, 1000000,
     1e-6, 40960, 0, 151643, {151645}, 0, 0, 0},
    {"qwen3-1.7b", "qwen3", "Qwen3ForCausalLM", 2048, 6144, 28, 16, 8, 128, 151936, true, 1000000,
     1e-6, 40960, 0, 151643, {151645}, 0, 0, 0},
    {"qwen3-4b", "qwen3", "Qwen3ForCausalLM", 2560, 9728, 36, 32, 8, 128, 151936, true, 1000000,
     1e-6, 40960, 0, 151643, {151645}, 0, 0, 0},
    {"qwen3-8b", "qwen3", "Qwen3ForCausalLM", 4096, 12288, 36, 32, 8, 128, 151936, false, 1000000,
     1e-6, 40960, 0, 151643, {151645}, 0, 0, 0},
    /* Qwen3-30B-A3B: 128 experts, 8 per token, ~3.3B active parameters */
    {"qwen3-30b-a3b", "qwen3_moe", "Qwen3MoeForCausalLM", 2048, 6144, 48, 32, 4, 128, 151936, false,
     1000000, 1e-6, 40960, 0, 151643, {151645}, 128, 8, 768},
    /* test-sized: every linear's input width is a multiple of the group size 64 */
    {"tiny-llama", "llama", "LlamaForCausalLM", 64, 192, 2, 4, 2, 16, 512, false, 10000, 1e-5,
     2048, 0, 1, {2}, 0, 0, 0},
    {"tiny-qwen3", "qwen3", "Qwen3ForCausalLM", 64, 192, 2, 4, 2, 32, 512, true, 1000000, 1e-6,
     2048, 0, 1, {2}, 0, 0, 0},
    {"tiny-qwen3-moe", "qwen3_moe", "Qwen3MoeForCausalLM", 64, 192, 2, 4, 2, 32, 512, false, 1000000,
     1e-6, 2048, 0, 1, {2}, 8, 2, 64},
};
#define N_PRESETS (sizeof presets / sizeof *presets)

#define GROUP_SIZE 64

struct exo_synth {
    exo_model_config cfg;
    const preset *p;
    exo_synth_quant quant;
    uint64_t seed;
    exo_arena *mem; /* every generated tensor */
};

const char *const *exo_synth_presets(void)
{
    static const char *names[N_PRESETS + 1];
    for (size_t i = 0; i < N_PRESETS; i++)
        names[i] = presets[i].name;
    return names;
}

static uint64_t next(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* The random stream of one tensor: FNV-1a of its name mixed with the seed
 * (splitmix64 finaliser); xorshift needs a nonzero state. */
static uint64_t tensor_rng(const exo_synth *s, const char *name)
{
    uint64_t h = 14695981039346656037ull;
    for (const unsigned char *c = (const unsigned char *)name; *c; c++)
        h = (h ^ *c) * 1099511628211ull;
    h ^= s->seed;
    h += 0x9e3779b97f4a7c15ull;
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    h ^= h >> 31;
    return h | 1;
}

static void *keep(exo_synth *s, size_t bytes)
{
    if (!s->mem)
        s->mem = exo_arena_new(0);
    return exo_arena_alloc(s->mem, bytes);
}

static void fill_random(uint64_t *rng, void *p, size_t bytes)
{
    uint64_t *w = p;
    size_t n = bytes / 8;
    for (size_t i = 0; i < n; i++)
        w[i] = next(rng);
    for (size_t i = n * 8; i < bytes; i++)
        ((unsigned char *)p)[i] = (unsigned char)next(rng);
}

/* Uniform in [-a, a) as bf16. */
static void fill_bf16(uint64_t *rng, uint16_t *p, size_t n, float a)
{
    for (size_t i = 0; i < n; i++) {
        float u = (float)(next(rng) >> 40) * (1.0f / 16777216.0f);
        p[i] = exo_f32_to_bf16((2 * u - 1) * a);
    }
}

static void fill_const_bf16(uint16_t *p, size_t n, float v)
{
    uint16_t h = exo_f32_to_bf16(v);
    for (size_t i = 0; i < n; i++)
        p[i] = h;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* Shape of a linear module (path without ".weight"); EXO_ENOENT for
 * anything else, and for lm_head when the embeddings are tied. */
static int linear_shape(const exo_model_config *c, const char *module, int64_t *rows,
                        int64_t *cols)
{
    int64_t D = c->hidden_size, F = c->intermediate_size, V = c->vocab_size;
    int64_t QD = c->num_attention_heads * c->head_dim, KD = c->num_key_value_heads * c->head_dim;
    if (strstr(module, ".mlp.experts."))
        F = c->moe_intermediate_size;
    if (c->n_experts && ends_with(module, ".mlp.gate")) { /* the router */
        *rows = c->n_experts, *cols = D;
        return 0;
    }
    if (!strcmp(module, "model.embed_tokens") || !strcmp(module, "lm_head")) {
        if (!strcmp(module, "lm_head") && c->tie_word_embeddings)
            return EXO_ENOENT;
        *rows = V, *cols = D;
    } else if (ends_with(module, ".q_proj")) {
        *rows = QD, *cols = D;
    } else if (ends_with(module, ".k_proj") || ends_with(module, ".v_proj")) {
        *rows = KD, *cols = D;
    } else if (ends_with(module, ".o_proj")) {
        *rows = D, *cols = QD;
    } else if (ends_with(module, ".gate_proj") || ends_with(module, ".up_proj")) {
        *rows = F, *cols = D;
    } else if (ends_with(module, ".down_proj")) {
        *rows = D, *cols = F;
    } else {
        return EXO_ENOENT;
    }
    return 0;
}

static int quant_bits(const exo_synth *s) { return s->quant == EXO_SYNTH_Q4 ? 4 : 8; }

/* Weights are scaled so a random row has about unit gain (std ~ 1/sqrt(cols)):
 * bf16 uniform in +-a, affine codes uniform over the levels spanning +-a. */
static float linear_amplitude(int64_t cols) { return 1.0f / sqrtf((float)cols) * 1.73f; }

static float affine_scale(const exo_synth *s, int64_t cols)
{
    return linear_amplitude(cols) * 2 / (float)((1 << quant_bits(s)) - 1);
}

static float affine_bias(const exo_synth *s, int64_t cols)
{
    return -affine_scale(s, cols) * (float)((1 << quant_bits(s)) - 1) / 2;
}

static int synth_linear(void *ctx, const char *module, exo_linear *out)
{
    exo_synth *s = ctx;
    int64_t rows, cols;
    int rc = linear_shape(&s->cfg, module, &rows, &cols);
    if (rc)
        return rc;
    memset(out, 0, sizeof *out);
    out->rows = rows;
    out->cols = cols;
    uint64_t rng = tensor_rng(s, module);
    if (s->quant == EXO_SYNTH_BF16) {
        uint16_t *w = keep(s, sizeof(uint16_t) * (size_t)(rows * cols));
        if (!w)
            return EXO_ENOMEM;
        fill_bf16(&rng, w, (size_t)(rows * cols), linear_amplitude(cols));
        out->format = EXO_WFORMAT_DENSE;
        out->dtype = EXO_DTYPE_BF16;
        out->w = w;
        return 0;
    }
    int bits = quant_bits(s);
    int64_t groups = cols / GROUP_SIZE;
    void *codes = keep(s, (size_t)(rows * cols * bits / 8));
    uint16_t *sc = keep(s, sizeof(uint16_t) * (size_t)(rows * groups));
    uint16_t *bi = keep(s, sizeof(uint16_t) * (size_t)(rows * groups));
    if (!codes || !sc || !bi)
        return EXO_ENOMEM;
    fill_random(&rng, codes, (size_t)(rows * cols * bits / 8));
    fill_const_bf16(sc, (size_t)(rows * groups), affine_scale(s, cols));
    fill_const_bf16(bi, (size_t)(rows * groups), affine_bias(s, cols));
    out->format = EXO_WFORMAT_AFFINE;
    out->dtype = EXO_DTYPE_BF16;
    out->w = codes;
    out->scales = sc;
    out->biases = bi;
    out->bits = bits;
    out->group_size = GROUP_SIZE;
    return 0;
}

/* Length of a norm vector; EXO_ENOENT for anything else (no biases in
 * these presets). Norm weights are all ones. */
static int vector_len(const exo_model_config *c, const char *name, int64_t *len)
{
    if (ends_with(name, "layernorm.weight") || !strcmp(name, "model.norm.weight"))
        *len = c->hidden_size;
    else if (!strncmp(c->model_type, "qwen3", 5) &&
             (ends_with(name, ".q_norm.weight") || ends_with(name, ".k_norm.weight")))
        *len = c->head_dim;
    else
        return EXO_ENOENT;
    return 0;
}

static int synth_vector(void *ctx, const char *name, exo_dtype *dtype, const void **data, int64_t *n)
{
    exo_synth *s = ctx;
    int64_t len;
    int rc = vector_len(&s->cfg, name, &len);
    if (rc)
        return rc;
    float *v = keep(s, sizeof(float) * (size_t)len);
    if (!v)
        return EXO_ENOMEM;
    for (int64_t i = 0; i < len; i++)
        v[i] = 1.0f;
    *dtype = EXO_DTYPE_F32;
    *data = v;
    *n = len;
    return 0;
}

int exo_synth_create(const char *name, exo_synth_quant q, uint64_t seed, exo_synth **out,
                     exo_err *err)
{
    *out = NULL;
    const preset *p = NULL;
    for (size_t i = 0; i < N_PRESETS; i++)
        if (!strcmp(presets[i].name, name))
            p = &presets[i];
    if (!p) {
        char list[512] = "";
        for (size_t i = 0; i < N_PRESETS; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                     presets[i].name);
        return exo_err_set(err, EXO_EINVAL, "unknown synthetic preset '%s' (known: %s)", name, list);
    }
    exo_synth *s = exo_calloc(1, sizeof *s);
    s->p = p;
    s->quant = q;
    s->seed = seed;
    exo_model_config *c = &s->cfg;
    snprintf(c->model_type, sizeof c->model_type, "%s", p->model_type);
    snprintf(c->architecture, sizeof c->architecture, "%s", p->architecture);
    snprintf(c->hidden_act, sizeof c->hidden_act, "silu");
    snprintf(c->torch_dtype, sizeof c->torch_dtype, "bfloat16");
    c->vocab_size = p->vocab;
    c->hidden_size = p->dim;
    c->intermediate_size = p->ffn;
    c->num_hidden_layers = p->layers;
    c->num_attention_heads = p->heads;
    c->num_key_value_heads = p->kv;
    c->head_dim = p->head_dim;
    c->rms_norm_eps = p->eps;
    c->rope_theta = p->theta;
    c->rope.type = EXO_ROPE_DEFAULT;
    c->rope.factor = 1;
    c->rope.beta_fast = 32;
    c->rope.beta_slow = 1;
    if (p->llama3_factor > 0) {
        c->rope.type = EXO_ROPE_LLAMA3;
        c->rope.factor = p->llama3_factor;
        c->rope.low_freq_factor = 1;
        c->rope.high_freq_factor = 4;
        c->rope.original_max_position_embeddings = 8192;
    }
    c->max_position_embeddings = p->max_pos;
    c->tie_word_embeddings = p->tied;
    c->bos_token_id = p->bos;
    c->pad_token_id = -1;
    for (int i = 0; i < 3 && p->eos[i]; i++)
        c->eos_token_ids[c->n_eos++] = p->eos[i];
    if (p->experts) {
        c->n_experts = p->experts;
        c->n_experts_per_tok = p->topk;
        c->moe_intermediate_size = p->moe_ffn;
        c->norm_topk_prob = true;
        c->decoder_sparse_step = 1;
    }
    if (q != EXO_SYNTH_BF16) {
        c->quant.enabled = true;
        c->quant.bits = quant_bits(s);
        c->quant.group_size = GROUP_SIZE;
        snprintf(c->quant.mode, sizeof c->quant.mode, "affine");
    }
    *out = s;
    return 0;
}

void exo_synth_free(exo_synth *s)
{
    if (!s)
        return;
    exo_arena_free(s->mem);
    exo_free(s);
}

const exo_model_config *exo_synth_config(const exo_synth *s) { return &s->cfg; }

int exo_synth_set_layers(exo_synth *s, int n, exo_err *err)
{
    if (n < 1 || n > s->p->layers)
        return exo_err_set(err, EXO_EINVAL, "%s has %d layers, not %d", s->p->name, s->p->layers, n);
    s->cfg.num_hidden_layers = n;
    return 0;
}

int exo_synth_build(exo_synth *s, const exo_model_opts *opts, exo_model **out, exo_err *err)
{
    exo_weight_source src = {s, synth_linear, synth_vector, false, NULL};
    return exo_model_build(&s->cfg, &src, opts, out, err);
}

/* ---- writing a model directory ----------------------------------------- */

/* Deferred fill of one tensor of model.safetensors, from its name alone. */
static int fill_tensor(void *ctx, const char *name, void *dst, size_t nbytes, exo_err *err)
{
    exo_synth *s = ctx;
    char module[256];
    const char *dot = strrchr(name, '.');
    if (!dot || (size_t)(dot - name) >= sizeof module)
        return exo_err_set(err, EXO_EINTERNAL, "synthetic tensor '%s'", name);
    snprintf(module, sizeof module, "%.*s", (int)(dot - name), name);
    int64_t rows, cols, len;
    if (!linear_shape(&s->cfg, module, &rows, &cols)) {
        size_t n = nbytes / sizeof(uint16_t);
        if (!strcmp(dot, ".scales")) {
            fill_const_bf16(dst, n, affine_scale(s, cols));
        } else if (!strcmp(dot, ".biases")) {
            fill_const_bf16(dst, n, affine_bias(s, cols));
        } else {
            uint64_t rng = tensor_rng(s, module);
            if (s->quant == EXO_SYNTH_BF16)
                fill_bf16(&rng, dst, n, linear_amplitude(cols));
            else
                fill_random(&rng, dst, nbytes);
        }
        return 0;
    }
    if (!vector_len(&s->cfg, name, &len)) {
        fill_const_bf16(dst, nbytes / sizeof(uint16_t), 1.0f);
        return 0;
    }
    return exo_err_set(err, EXO_EINTERNAL, "synthetic tensor '%s' has no generator", name);
}

static int add_tensor(exo_st_writer *w, exo_synth *s, const char *name, exo_dtype dt, int64_t rows,
                      int64_t cols, size_t *bytes, exo_err *err)
{
    int64_t shape[2] = {rows, cols};
    int ndim = cols ? 2 : 1;
    size_t nbytes = (size_t)rows * (size_t)(cols ? cols : 1) * exo_dtype_size(dt);
    *bytes += nbytes;
    return exo_st_writer_add_deferred(w, name, dt, ndim, shape, nbytes, fill_tensor, s, err);
}

static int add_linear(exo_st_writer *w, exo_synth *s, const char *module, size_t *bytes,
                      exo_err *err)
{
    int64_t rows, cols;
    if (linear_shape(&s->cfg, module, &rows, &cols))
        return 0; /* tied lm_head */
    char name[300];
    snprintf(name, sizeof name, "%s.weight", module);
    if (s->quant == EXO_SYNTH_BF16)
        return add_tensor(w, s, name, EXO_DTYPE_BF16, rows, cols, bytes, err);
    int rc = add_tensor(w, s, name, EXO_DTYPE_U32, rows, cols * quant_bits(s) / 32, bytes, err);
    snprintf(name, sizeof name, "%s.scales", module);
    if (!rc)
        rc = add_tensor(w, s, name, EXO_DTYPE_BF16, rows, cols / GROUP_SIZE, bytes, err);
    snprintf(name, sizeof name, "%s.biases", module);
    if (!rc)
        rc = add_tensor(w, s, name, EXO_DTYPE_BF16, rows, cols / GROUP_SIZE, bytes, err);
    return rc;
}

static int add_vector(exo_st_writer *w, exo_synth *s, const char *name, size_t *bytes,
                      exo_err *err)
{
    int64_t len;
    if (vector_len(&s->cfg, name, &len))
        return exo_err_set(err, EXO_EINTERNAL, "synthetic vector '%s'", name);
    return add_tensor(w, s, name, EXO_DTYPE_BF16, len, 0, bytes, err);
}

/* Every tensor exo_model_build binds for these architectures. */
static int add_all(exo_st_writer *w, exo_synth *s, size_t *bytes, exo_err *err)
{
    static const char *const linears[] = {"self_attn.q_proj", "self_attn.k_proj",
                                          "self_attn.v_proj", "self_attn.o_proj",
                                          "mlp.gate_proj",    "mlp.up_proj",
                                          "mlp.down_proj"};
    static const char *const norms[] = {"input_layernorm.weight",
                                        "post_attention_layernorm.weight",
                                        "self_attn.q_norm.weight", "self_attn.k_norm.weight"};
    bool qk_norm = !strncmp(s->cfg.model_type, "qwen3", 5);
    char name[256];
    int rc = add_linear(w, s, "model.embed_tokens", bytes, err);
    for (int64_t l = 0; !rc && l < s->cfg.num_hidden_layers; l++) {
        bool moe = exo_config_layer_moe(&s->cfg, l);
        for (size_t i = 0; !rc && i < (moe ? 4u : sizeof linears / sizeof *linears); i++) {
            snprintf(name, sizeof name, "model.layers.%lld.%s", (long long)l, linears[i]);
            rc = add_linear(w, s, name, bytes, err);
        }
        if (moe && !rc) { /* the router and each expert's projections, one tensor each (the hub's layout) */
            snprintf(name, sizeof name, "model.layers.%lld.mlp.gate", (long long)l);
            rc = add_linear(w, s, name, bytes, err);
            for (int64_t e = 0; !rc && e < s->cfg.n_experts; e++)
                for (size_t i = 4; !rc && i < 7; i++) {
                    snprintf(name, sizeof name, "model.layers.%lld.mlp.experts.%lld.%s", (long long)l,
                             (long long)e, linears[i] + 4);
                    rc = add_linear(w, s, name, bytes, err);
                }
        }
        for (size_t i = 0; !rc && i < (qk_norm ? 4u : 2u); i++) {
            snprintf(name, sizeof name, "model.layers.%lld.%s", (long long)l, norms[i]);
            rc = add_vector(w, s, name, bytes, err);
        }
    }
    if (!rc)
        rc = add_vector(w, s, "model.norm.weight", bytes, err);
    if (!rc)
        rc = add_linear(w, s, "lm_head", bytes, err);
    return rc;
}

/* config.json as the real model's (the fields exo and transformers read). */
static json_t *config_json(const exo_synth *s)
{
    const exo_model_config *c = &s->cfg;
    const preset *p = s->p;
    bool qwen3 = !strncmp(c->model_type, "qwen3", 5);
    json_t *j = json_object();
    json_object_set_new(j, "architectures", json_pack("[s]", p->architecture));
    json_object_set_new(j, "model_type", json_string(c->model_type));
    json_object_set_new(j, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(j, "hidden_size", json_integer(c->hidden_size));
    json_object_set_new(j, "intermediate_size", json_integer(c->intermediate_size));
    json_object_set_new(j, "num_hidden_layers", json_integer(c->num_hidden_layers));
    json_object_set_new(j, "num_attention_heads", json_integer(c->num_attention_heads));
    json_object_set_new(j, "num_key_value_heads", json_integer(c->num_key_value_heads));
    json_object_set_new(j, "head_dim", json_integer(c->head_dim));
    json_object_set_new(j, "hidden_act", json_string(c->hidden_act));
    json_object_set_new(j, "rms_norm_eps", json_real(c->rms_norm_eps));
    json_object_set_new(j, "rope_theta", json_real(c->rope_theta));
    if (c->rope.type == EXO_ROPE_LLAMA3)
        json_object_set_new(j, "rope_scaling",
                            json_pack("{s:f,s:f,s:f,s:I,s:s}", "factor", c->rope.factor,
                                      "low_freq_factor", c->rope.low_freq_factor,
                                      "high_freq_factor", c->rope.high_freq_factor,
                                      "original_max_position_embeddings",
                                      (json_int_t)c->rope.original_max_position_embeddings,
                                      "rope_type", "llama3"));
    else
        json_object_set_new(j, "rope_scaling", json_null());
    json_object_set_new(j, "max_position_embeddings", json_integer(c->max_position_embeddings));
    json_object_set_new(j, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
    json_object_set_new(j, "attention_bias", json_false());
    if (qwen3) {
        json_object_set_new(j, "use_sliding_window", json_false());
        json_object_set_new(j, "sliding_window", json_null());
    } else {
        json_object_set_new(j, "mlp_bias", json_false());
    }
    if (c->n_experts) {
        json_object_set_new(j, "num_experts", json_integer(c->n_experts));
        json_object_set_new(j, "num_experts_per_tok", json_integer(c->n_experts_per_tok));
        json_object_set_new(j, "moe_intermediate_size", json_integer(c->moe_intermediate_size));
        json_object_set_new(j, "norm_topk_prob", json_boolean(c->norm_topk_prob));
        json_object_set_new(j, "decoder_sparse_step", json_integer(c->decoder_sparse_step));
        json_object_set_new(j, "mlp_only_layers", json_array());
    }
    json_object_set_new(j, "attention_dropout", json_real(0));
    json_object_set_new(j, "initializer_range", json_real(0.02));
    json_object_set_new(j, "use_cache", json_true());
    if (c->bos_token_id >= 0)
        json_object_set_new(j, "bos_token_id", json_integer(c->bos_token_id));
    if (c->n_eos == 1) {
        json_object_set_new(j, "eos_token_id", json_integer(c->eos_token_ids[0]));
    } else if (c->n_eos > 1) {
        json_t *a = json_array();
        for (int i = 0; i < c->n_eos; i++)
            json_array_append_new(a, json_integer(c->eos_token_ids[i]));
        json_object_set_new(j, "eos_token_id", a);
    }
    json_object_set_new(j, "torch_dtype", json_string("bfloat16"));
    if (c->quant.enabled) {
        json_t *q = json_pack("{s:i,s:i,s:s}", "group_size", c->quant.group_size, "bits",
                              c->quant.bits, "mode", "affine");
        json_object_set(j, "quantization", q);
        json_object_set_new(j, "quantization_config", q);
    }
    return j;
}

static int write_text(const char *path, const char *text, exo_err *err)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    size_t n = strlen(text);
    bool ok = f && fwrite(text, 1, n, f) == n && fputc('\n', f) != EOF && !fflush(f) &&
              !fsync(fileno(f));
    int saved = errno;
    if (f && fclose(f))
        ok = false;
    if (!ok || rename(tmp, path)) {
        unlink(tmp);
        return exo_err_set(err, EXO_EIO, "cannot write %s: %s", path, strerror(ok ? errno : saved));
    }
    return 0;
}

int exo_synth_write(exo_synth *s, const char *dir, size_t *bytes, exo_err *err)
{
    size_t total = 0;
    char path[4096];
    exo_st_writer *w = exo_st_writer_new();
    exo_st_writer_set_metadata(w, "format", s->quant == EXO_SYNTH_BF16 ? "pt" : "mlx");
    int rc = add_all(w, s, &total, err);
    if (!rc) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        rc = exo_st_writer_write(w, path, err);
    }
    exo_st_writer_free(w);
    if (rc)
        return rc;
    /* config.json last: a directory without it is not a loadable model */
    json_t *cfg = config_json(s);
    char *text = exo_json_dumps(cfg, JSON_INDENT(2) | JSON_REAL_PRECISION(15));
    json_decref(cfg);
    if (!text)
        return exo_err_set(err, EXO_ENOMEM, "cannot serialise config.json");
    snprintf(path, sizeof path, "%s/config.json", dir);
    rc = write_text(path, text, err);
    exo_free(text);
    if (!rc && bytes)
        *bytes = total;
    return rc;
}

int exo_synth_quant_parse(const char *name, exo_synth_quant *out)
{
    static const struct { const char *name; exo_synth_quant q; } names[] = {
        {"bf16", EXO_SYNTH_BF16}, {"q8", EXO_SYNTH_Q8}, {"q4", EXO_SYNTH_Q4}};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strcmp(name, names[i].name)) {
            *out = names[i].q;
            return 0;
        }
    return EXO_EINVAL;
}
