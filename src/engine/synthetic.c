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
    const struct family_extra *x; /* the newer families' own sizes, or NULL */
} preset;

/* What qwen3_5_moe and gpt_oss add to a preset. */
typedef struct family_extra {
    int lin_k_heads, lin_v_heads, lin_dim; /* Gated DeltaNet (every 4th layer is full attention) */
    int shared_ffn;                        /* the shared expert's width */
    int window;                            /* sliding window of alternate layers (gpt-oss) */
} family_extra;

static const family_extra qwen35_35b = {16, 32, 128, 512, 0};
static const family_extra qwen35_tiny = {2, 4, 32, 64, 0};
static const family_extra gpt_oss_20b = {0, 0, 0, 0, 128};
static const family_extra gpt_oss_tiny = {0, 0, 0, 0, 8};

static const preset presets[] = {
    {"llama-3.2-1b", "llama", "LlamaForCausalLM", 2048, 8192, 16, 32, 8, 64, 128256, true, 500000,
     1e-5, 131072, 32, 128000, {128001, 128008, 128009}, 0, 0, 0, NULL},
    {"llama-3.2-3b", "llama", "LlamaForCausalLM", 3072, 8192, 28, 24, 8, 128, 128256, true, 500000,
     1e-5, 131072, 32, 128000, {128001, 128008, 128009}, 0, 0, 0, NULL},
    {"llama-3.1-8b", "llama", "LlamaForCausalLM", 4096, 14336, 32, 32, 8, 128, 128256, false,
     500000, 1e-5, 131072, 8, 128000, {128001, 128008, 128009}, 0, 0, 0, NULL},
    {"qwen3-0.6b", "qwen3", "Qwen3ForCausalLM", 1024, 3072, 28, 16, 8, 128, 151936, true, 1000000,
     1e-6, 40960, 0, 151643, {151645}, 0, 0, 0, NULL},
    {"qwen3-1.7b", "qwen3", "Qwen3ForCausalLM", 2048, 6144, 28, 16, 8, 128, 151936, true, 1000000,
     1e-6, 40960, 0, 151643, {151645}, 0, 0, 0, NULL},
    {"qwen3-4b", "qwen3", "Qwen3ForCausalLM", 2560, 9728, 36, 32, 8, 128, 151936, true, 1000000,
     1e-6, 40960, 0, 151643, {151645}, 0, 0, 0, NULL},
    {"qwen3-8b", "qwen3", "Qwen3ForCausalLM", 4096, 12288, 36, 32, 8, 128, 151936, false, 1000000,
     1e-6, 40960, 0, 151643, {151645}, 0, 0, 0, NULL},
    /* Qwen3-30B-A3B: 128 experts, 8 per token, ~3.3B active parameters */
    {"qwen3-30b-a3b", "qwen3_moe", "Qwen3MoeForCausalLM", 2048, 6144, 48, 32, 4, 128, 151936, false,
     1000000, 1e-6, 40960, 0, 151643, {151645}, 128, 8, 768, NULL},
    /* test-sized: every linear's input width is a multiple of the group size 64 */
    {"tiny-llama", "llama", "LlamaForCausalLM", 64, 192, 2, 4, 2, 16, 512, false, 10000, 1e-5,
     2048, 0, 1, {2}, 0, 0, 0, NULL},
    {"tiny-qwen3", "qwen3", "Qwen3ForCausalLM", 64, 192, 2, 4, 2, 32, 512, true, 1000000, 1e-6,
     2048, 0, 1, {2}, 0, 0, 0, NULL},
    {"tiny-qwen3-moe", "qwen3_moe", "Qwen3MoeForCausalLM", 64, 192, 2, 4, 2, 32, 512, false, 1000000,
     1e-6, 2048, 0, 1, {2}, 8, 2, 64, NULL},
    /* Qwen3.5-35B-A3B: 30 Gated DeltaNet + 10 gated-attention layers, 256
     * experts, 8 per token + a shared expert, ~3B active parameters */
    {"qwen3.5-35b-a3b", "qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration", 2048, 0, 40, 16, 2, 256,
     248320, false, 10000000, 1e-6, 262144, 0, -1, {248046, 248044}, 256, 8, 512, &qwen35_35b},
    /* gpt-oss-20b: 24 layers alternating sliding (128) and full attention
     * with sinks, 32 experts, 4 per token, ~3.6B active parameters */
    {"gpt-oss-20b", "gpt_oss", "GptOssForCausalLM", 2880, 2880, 24, 64, 8, 64, 201088, false, 150000,
     1e-5, 131072, 0, 199998, {200002, 199999}, 32, 4, 2880, &gpt_oss_20b},
    {"tiny-qwen3.5-moe", "qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration", 64, 0, 4, 4, 2, 32, 512,
     false, 10000000, 1e-6, 2048, 0, 1, {2}, 8, 2, 64, &qwen35_tiny},
    {"tiny-gpt-oss", "gpt_oss", "GptOssForCausalLM", 64, 64, 2, 4, 2, 16, 512, false, 150000, 1e-5,
     2048, 0, 1, {2}, 8, 2, 64, &gpt_oss_tiny},
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
    int64_t LK = c->linear_k_heads * c->linear_k_dim, LV = c->linear_v_heads * c->linear_v_dim;
    bool gated = !strcmp(c->model_type, "qwen3_5_moe");
    if (strstr(module, ".mlp.experts."))
        F = c->moe_intermediate_size;
    if (strstr(module, ".mlp.shared_expert."))
        F = c->shared_expert_intermediate_size;
    if (c->n_experts && (ends_with(module, ".mlp.gate") || ends_with(module, ".mlp.router"))) {
        *rows = c->n_experts, *cols = D;
        return 0;
    }
    if (ends_with(module, ".mlp.shared_expert_gate")) {
        *rows = 1, *cols = D;
        return 0;
    }
    if (strstr(module, ".linear_attn.")) {
        if (ends_with(module, ".in_proj_qkv"))
            *rows = 2 * LK + LV, *cols = D;
        else if (ends_with(module, ".in_proj_z"))
            *rows = LV, *cols = D;
        else if (ends_with(module, ".in_proj_b") || ends_with(module, ".in_proj_a"))
            *rows = c->linear_v_heads, *cols = D;
        else if (ends_with(module, ".out_proj"))
            *rows = D, *cols = LV;
        else
            return EXO_ENOENT;
        return 0;
    }
    if (gated && ends_with(module, ".q_proj")) { /* each head's queries, then its gate */
        *rows = 2 * QD, *cols = D;
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

/* Per-group scales and biases that vary as a real checkpoint's do (each
 * group's min and max differ): scale = the nominal one times [0.5, 1.5),
 * bias = -scale * levels / 2 times [0.9, 1.1). One constant for every
 * group made all groups' bytes alike: pages a host can merge and caches
 * can hold, unlike the weights decode of a real model streams (issue 16).
 * Both come from a stream of their own, so the model built in memory and
 * the one written to disk (which fills .scales and .biases apart) agree. */
static void fill_affine_params(const exo_synth *s, const char *module, int64_t cols, uint16_t *sc, uint16_t *bi,
                               size_t n)
{
    uint64_t rng = tensor_rng(s, module) ^ 0x5ca1ab1e00000000ull;
    float base = affine_scale(s, cols), half = (float)((1 << quant_bits(s)) - 1) / 2;
    for (size_t i = 0; i < n; i++) {
        float u = (float)(next(&rng) >> 40) * (1.0f / 16777216.0f);
        float v = (float)(next(&rng) >> 40) * (1.0f / 16777216.0f);
        float scale = base * (0.5f + u);
        if (sc)
            sc[i] = exo_f32_to_bf16(scale);
        if (bi)
            bi[i] = exo_f32_to_bf16(-scale * half * (0.9f + 0.2f * v));
    }
}

/* MXFP4 for the experts of an "mxfp4" model. */
static bool is_mxfp4(const exo_synth *s, const char *module)
{
    return s->quant == EXO_SYNTH_MXFP4 && strstr(module, ".mlp.experts.");
}

/* The E8M0 scale byte that puts MXFP4's largest value (6) near the
 * amplitude of a random row. */
static uint8_t mxfp4_scale(int64_t cols)
{
    return (uint8_t)(127 + (int)lrintf(log2f(linear_amplitude(cols) / 6.0f)));
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
    if (is_mxfp4(s, module)) {
        void *codes = keep(s, (size_t)(rows * cols / 2));
        uint8_t *sc = keep(s, (size_t)(rows * cols / 32));
        if (!codes || !sc)
            return EXO_ENOMEM;
        fill_random(&rng, codes, (size_t)(rows * cols / 2));
        memset(sc, mxfp4_scale(cols), (size_t)(rows * cols / 32));
        out->format = EXO_WFORMAT_MXFP4;
        out->dtype = EXO_DTYPE_U8;
        out->w = codes;
        out->scales = sc;
        out->bits = 4;
        out->group_size = 32;
        return 0;
    }
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
    fill_affine_params(s, module, cols, sc, bi, (size_t)(rows * groups));
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
    int64_t CD = 2 * c->linear_k_heads * c->linear_k_dim + c->linear_v_heads * c->linear_v_dim;
    bool gpt_oss = !strcmp(c->model_type, "gpt_oss");
    if (ends_with(name, "layernorm.weight") || !strcmp(name, "model.norm.weight"))
        *len = c->hidden_size;
    else if (!strncmp(c->model_type, "qwen3", 5) &&
             (ends_with(name, ".q_norm.weight") || ends_with(name, ".k_norm.weight")))
        *len = c->head_dim;
    else if (ends_with(name, ".linear_attn.conv1d.weight"))
        *len = CD * c->linear_conv_kernel;
    else if (ends_with(name, ".linear_attn.A_log") || ends_with(name, ".linear_attn.dt_bias"))
        *len = c->linear_v_heads;
    else if (ends_with(name, ".linear_attn.norm.weight"))
        *len = c->linear_v_dim;
    else if (gpt_oss && (ends_with(name, ".q_proj.bias") || ends_with(name, ".self_attn.sinks")))
        *len = ends_with(name, ".sinks") ? c->num_attention_heads
                                         : c->num_attention_heads * c->head_dim;
    else if (gpt_oss && (ends_with(name, ".k_proj.bias") || ends_with(name, ".v_proj.bias")))
        *len = c->num_key_value_heads * c->head_dim;
    else if (gpt_oss && ends_with(name, ".o_proj.bias"))
        *len = c->hidden_size;
    else if (gpt_oss && ends_with(name, ".mlp.router.bias"))
        *len = c->n_experts;
    else if (gpt_oss && ends_with(name, ".mlp.experts.gate_up_proj_bias"))
        *len = c->n_experts * 2 * c->moe_intermediate_size;
    else if (gpt_oss && ends_with(name, ".mlp.experts.down_proj_bias"))
        *len = c->n_experts * c->hidden_size;
    else
        return EXO_ENOENT;
    return 0;
}

/* The value a synthetic vector holds: norms 1, A_log 0 (decay e^-softplus),
 * biases and sinks 0, conv taps 1/K (an average). */
static float vector_value(const exo_model_config *c, const char *name)
{
    bool offset = !strncmp(c->model_type, "qwen3_5", 7); /* applied as 1 + w */
    if (ends_with(name, "norm.weight"))
        return offset && !ends_with(name, ".linear_attn.norm.weight") ? 0.0f : 1.0f;
    if (ends_with(name, ".conv1d.weight"))
        return 1.0f / (float)c->linear_conv_kernel;
    return 0.0f;
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
        v[i] = vector_value(&s->cfg, name);
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
    const family_extra *x = p->x;
    if (x && x->lin_k_heads) { /* qwen3_5_moe: hybrid layers, partial RoPE, a shared expert */
        c->layer_kinds = exo_calloc((size_t)p->layers, sizeof *c->layer_kinds);
        for (int l = 0; l < p->layers; l++)
            c->layer_kinds[l] = (l + 1) % 4 ? EXO_LAYER_LINEAR : EXO_LAYER_FULL;
        c->partial_rotary_factor = 0.25;
        c->linear_k_heads = x->lin_k_heads;
        c->linear_v_heads = x->lin_v_heads;
        c->linear_k_dim = c->linear_v_dim = x->lin_dim;
        c->linear_conv_kernel = 4;
        c->shared_expert_intermediate_size = x->shared_ffn;
    }
    if (x && x->window) { /* gpt_oss: alternate sliding layers, sinks, biases, YaRN */
        c->layer_kinds = exo_calloc((size_t)p->layers, sizeof *c->layer_kinds);
        for (int l = 0; l < p->layers; l++)
            c->layer_kinds[l] = l % 2 ? EXO_LAYER_FULL : EXO_LAYER_SLIDING;
        c->sliding_window = x->window;
        c->attention_bias = true;
        c->router_bias = true;
        c->swiglu_limit = 7.0;
        c->rope.type = EXO_ROPE_YARN;
        c->rope.factor = 32;
        c->rope.original_max_position_embeddings = 4096;
        c->rope.yarn_no_truncate = true;
    }
    c->partial_rotary_factor = c->partial_rotary_factor > 0 ? c->partial_rotary_factor : 1;
    c->routed_scaling_factor = 1;
    c->n_group = c->topk_group = 1;
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
    exo_free(s->cfg.layer_kinds);
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
    exo_weight_source src = {s, synth_linear, synth_vector, false, NULL, false};
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
    if (!vector_len(&s->cfg, name, &len)) { /* first: "q_proj.bias" is not q_proj's weight */
        fill_const_bf16(dst, nbytes / sizeof(uint16_t), vector_value(&s->cfg, name));
        return 0;
    }
    if (!linear_shape(&s->cfg, module, &rows, &cols)) {
        size_t n = nbytes / sizeof(uint16_t);
        if (is_mxfp4(s, module)) {
            uint64_t rng = tensor_rng(s, module);
            if (!strcmp(dot, ".scales"))
                memset(dst, mxfp4_scale(cols), nbytes);
            else
                fill_random(&rng, dst, nbytes);
            return 0;
        }
        if (!strcmp(dot, ".scales")) {
            fill_affine_params(s, module, cols, dst, NULL, n);
        } else if (!strcmp(dot, ".biases")) {
            fill_affine_params(s, module, cols, NULL, dst, n);
        } else {
            uint64_t rng = tensor_rng(s, module);
            if (s->quant == EXO_SYNTH_BF16)
                fill_bf16(&rng, dst, n, linear_amplitude(cols));
            else
                fill_random(&rng, dst, nbytes);
        }
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
    if (is_mxfp4(s, module)) { /* mlx's mxfp4 mode: uint32 codes, uint8 scales, no biases */
        int rc = add_tensor(w, s, name, EXO_DTYPE_U32, rows, cols / 8, bytes, err);
        snprintf(name, sizeof name, "%s.scales", module);
        return rc ? rc : add_tensor(w, s, name, EXO_DTYPE_U8, rows, cols / 32, bytes, err);
    }
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
    static const char *const attn[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                       "self_attn.o_proj"};
    static const char *const lin[] = {"linear_attn.in_proj_qkv", "linear_attn.in_proj_z",
                                      "linear_attn.in_proj_b", "linear_attn.in_proj_a",
                                      "linear_attn.out_proj"};
    static const char *const lin_vecs[] = {"linear_attn.conv1d.weight", "linear_attn.A_log",
                                           "linear_attn.dt_bias", "linear_attn.norm.weight"};
    static const char *const mlp[] = {"gate_proj", "up_proj", "down_proj"};
    static const char *const oss_vecs[] = {"self_attn.q_proj.bias", "self_attn.k_proj.bias",
                                           "self_attn.v_proj.bias", "self_attn.o_proj.bias",
                                           "self_attn.sinks", "mlp.router.bias",
                                           "mlp.experts.gate_up_proj_bias", "mlp.experts.down_proj_bias"};
    const exo_model_config *c = &s->cfg;
    bool qk_norm = !strncmp(c->model_type, "qwen3", 5), gpt_oss = !strcmp(c->model_type, "gpt_oss");
    char name[256];
#define ADD(fn, ...)                                                        \
    do {                                                                    \
        snprintf(name, sizeof name, __VA_ARGS__);                           \
        if ((rc = fn(w, s, name, bytes, err)))                              \
            return rc;                                                      \
    } while (0)
    int rc;
    ADD(add_linear, "model.embed_tokens");
    for (long long l = 0; l < c->num_hidden_layers; l++) {
        bool linear = exo_config_layer_kind(c, l) == EXO_LAYER_LINEAR;
        ADD(add_vector, "model.layers.%lld.input_layernorm.weight", l);
        ADD(add_vector, "model.layers.%lld.post_attention_layernorm.weight", l);
        for (size_t i = 0; linear && i < 5; i++)
            ADD(add_linear, "model.layers.%lld.%s", l, lin[i]);
        for (size_t i = 0; linear && i < 4; i++)
            ADD(add_vector, "model.layers.%lld.%s", l, lin_vecs[i]);
        for (size_t i = 0; !linear && i < 4; i++)
            ADD(add_linear, "model.layers.%lld.%s", l, attn[i]);
        if (!linear && qk_norm) {
            ADD(add_vector, "model.layers.%lld.self_attn.q_norm.weight", l);
            ADD(add_vector, "model.layers.%lld.self_attn.k_norm.weight", l);
        }
        for (size_t i = 0; gpt_oss && i < sizeof oss_vecs / sizeof *oss_vecs; i++)
            ADD(add_vector, "model.layers.%lld.%s", l, oss_vecs[i]);
        if (!exo_config_layer_moe(c, l)) {
            for (size_t i = 0; i < 3; i++)
                ADD(add_linear, "model.layers.%lld.mlp.%s", l, mlp[i]);
            continue;
        }
        /* the router and each expert's projections, one tensor each (the hub's layout) */
        ADD(add_linear, "model.layers.%lld.mlp.%s", l, gpt_oss ? "router" : "gate");
        for (long long e = 0; e < c->n_experts; e++)
            for (size_t i = 0; i < 3; i++)
                ADD(add_linear, "model.layers.%lld.mlp.experts.%lld.%s", l, e, mlp[i]);
        if (c->shared_expert_intermediate_size) {
            for (size_t i = 0; i < 3; i++)
                ADD(add_linear, "model.layers.%lld.mlp.shared_expert.%s", l, mlp[i]);
            ADD(add_linear, "model.layers.%lld.mlp.shared_expert_gate", l);
        }
    }
    ADD(add_vector, "model.norm.weight");
    ADD(add_linear, "lm_head");
#undef ADD
    return 0;
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
    if (c->intermediate_size) /* Qwen3.5-MoE has no dense MLP */
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
    if (c->layer_kinds) {
        static const char *const kinds[] = {"full_attention", "sliding_attention", "linear_attention"};
        json_t *types = json_array();
        for (int64_t l = 0; l < c->num_hidden_layers; l++)
            json_array_append_new(types, json_string(kinds[c->layer_kinds[l]]));
        json_object_set_new(j, "layer_types", types);
    }
    if (c->linear_k_heads) {
        json_object_set_new(j, "partial_rotary_factor", json_real(c->partial_rotary_factor));
        json_object_set_new(j, "linear_num_key_heads", json_integer(c->linear_k_heads));
        json_object_set_new(j, "linear_num_value_heads", json_integer(c->linear_v_heads));
        json_object_set_new(j, "linear_key_head_dim", json_integer(c->linear_k_dim));
        json_object_set_new(j, "linear_value_head_dim", json_integer(c->linear_v_dim));
        json_object_set_new(j, "linear_conv_kernel_dim", json_integer(c->linear_conv_kernel));
        json_object_set_new(j, "shared_expert_intermediate_size",
                            json_integer(c->shared_expert_intermediate_size));
    }
    if (!strcmp(c->model_type, "gpt_oss")) {
        json_object_set_new(j, "sliding_window", json_integer(c->sliding_window));
        json_object_set_new(j, "attention_bias", json_true());
        json_object_set_new(j, "swiglu_limit", json_real(c->swiglu_limit));
        json_object_set_new(j, "rope_scaling",
                            json_pack("{s:s,s:f,s:f,s:f,s:b,s:I}", "rope_type", "yarn", "factor",
                                      c->rope.factor, "beta_fast", 32.0, "beta_slow", 1.0, "truncate", 0,
                                      "original_max_position_embeddings",
                                      (json_int_t)c->rope.original_max_position_embeddings));
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
        {"bf16", EXO_SYNTH_BF16}, {"q8", EXO_SYNTH_Q8}, {"q4", EXO_SYNTH_Q4}, {"mxfp4", EXO_SYNTH_MXFP4}};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strcmp(name, names[i].name)) {
            *out = names[i].q;
            return 0;
        }
    return EXO_EINVAL;
}
