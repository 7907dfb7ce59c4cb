/* Synthetic models (see synthetic.h). Tensors are generated on first
 * request by the weight source and owned by the exo_synth. Scales are
 * chosen so a random weight row has about unit gain (std ~ 1/sqrt(cols)). */
#include "engine/synthetic.h"
#include "core/alloc.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct preset {
    const char *name;
    const char *model_type;
    int dim, ffn, layers, heads, kv, head_dim, vocab;
    bool tied;
    double theta;
} preset;

static const preset presets[] = {
    {"llama-3.2-1b", "llama", 2048, 8192, 16, 32, 8, 64, 128256, true, 500000},
    {"llama-3.2-3b", "llama", 3072, 8192, 28, 24, 8, 128, 128256, true, 500000},
    {"llama-3.1-8b", "llama", 4096, 14336, 32, 32, 8, 128, 128256, false, 500000},
    {"qwen3-0.6b", "qwen3", 1024, 3072, 28, 16, 8, 128, 151936, true, 1000000},
    {"qwen3-1.7b", "qwen3", 2048, 6144, 28, 16, 8, 128, 151936, true, 1000000},
    {"qwen3-4b", "qwen3", 2560, 9728, 36, 32, 8, 128, 151936, true, 1000000},
    {"qwen3-8b", "qwen3", 4096, 12288, 36, 32, 8, 128, 151936, false, 1000000},
};
#define N_PRESETS (sizeof presets / sizeof *presets)

struct exo_synth {
    exo_model_config cfg;
    exo_synth_quant quant;
    uint64_t rng;
    void **blocks;
    size_t n_blocks, cap_blocks;
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

static void *keep(exo_synth *s, size_t bytes)
{
    void *p = exo_alloc_aligned(bytes);
    if (!p)
        return NULL;
    if (s->n_blocks == s->cap_blocks) {
        s->cap_blocks = s->cap_blocks ? s->cap_blocks * 2 : 64;
        s->blocks = exo_realloc(s->blocks, s->cap_blocks * sizeof(void *));
    }
    s->blocks[s->n_blocks++] = p;
    return p;
}

static void fill_random(exo_synth *s, void *p, size_t bytes)
{
    uint64_t *w = p;
    size_t n = bytes / 8;
    for (size_t i = 0; i < n; i++)
        w[i] = next(&s->rng);
    for (size_t i = n * 8; i < bytes; i++)
        ((unsigned char *)p)[i] = (unsigned char)next(&s->rng);
}

/* Uniform in [-a, a) as bf16. */
static void fill_bf16(exo_synth *s, uint16_t *p, size_t n, float a)
{
    for (size_t i = 0; i < n; i++) {
        float u = (float)(next(&s->rng) >> 40) * (1.0f / 16777216.0f);
        p[i] = exo_f32_to_bf16((2 * u - 1) * a);
    }
}

static int synth_linear(void *ctx, const char *module, exo_linear *out)
{
    exo_synth *s = ctx;
    const exo_model_config *c = &s->cfg;
    int64_t D = c->hidden_size, F = c->intermediate_size, V = c->vocab_size;
    int64_t QD = c->num_attention_heads * c->head_dim, KD = c->num_key_value_heads * c->head_dim;
    int64_t rows, cols;
    if (!strcmp(module, "model.embed_tokens") || !strcmp(module, "lm_head")) {
        if (!strcmp(module, "lm_head") && c->tie_word_embeddings)
            return EXO_ENOENT;
        rows = V, cols = D;
    } else if (strstr(module, "q_proj")) {
        rows = QD, cols = D;
    } else if (strstr(module, "k_proj") || strstr(module, "v_proj")) {
        rows = KD, cols = D;
    } else if (strstr(module, "o_proj")) {
        rows = D, cols = QD;
    } else if (strstr(module, "gate_proj") || strstr(module, "up_proj")) {
        rows = F, cols = D;
    } else if (strstr(module, "down_proj")) {
        rows = D, cols = F;
    } else {
        return EXO_ENOENT;
    }
    memset(out, 0, sizeof *out);
    out->rows = rows;
    out->cols = cols;
    float gain = 1.0f / sqrtf((float)cols);
    if (s->quant == EXO_SYNTH_BF16) {
        uint16_t *w = keep(s, sizeof(uint16_t) * (size_t)(rows * cols));
        if (!w)
            return EXO_ENOMEM;
        fill_bf16(s, w, (size_t)(rows * cols), gain * 1.73f);
        out->format = EXO_WFORMAT_DENSE;
        out->dtype = EXO_DTYPE_BF16;
        out->w = w;
        return 0;
    }
    int bits = s->quant == EXO_SYNTH_Q4 ? 4 : 8, gs = 64;
    int64_t groups = cols / gs, levels = (1 << bits) - 1;
    void *codes = keep(s, (size_t)(rows * cols * bits / 8));
    uint16_t *sc = keep(s, sizeof(uint16_t) * (size_t)(rows * groups));
    uint16_t *bi = keep(s, sizeof(uint16_t) * (size_t)(rows * groups));
    if (!codes || !sc || !bi)
        return EXO_ENOMEM;
    fill_random(s, codes, (size_t)(rows * cols * bits / 8));
    float scale = gain * 1.73f * 2 / (float)levels;
    for (int64_t i = 0; i < rows * groups; i++) {
        sc[i] = exo_f32_to_bf16(scale);
        bi[i] = exo_f32_to_bf16(-scale * (float)levels / 2);
    }
    out->format = EXO_WFORMAT_AFFINE;
    out->dtype = EXO_DTYPE_BF16;
    out->w = codes;
    out->scales = sc;
    out->biases = bi;
    out->bits = bits;
    out->group_size = gs;
    return 0;
}

static int synth_vector(void *ctx, const char *name, exo_dtype *dtype, const void **data, int64_t *n)
{
    exo_synth *s = ctx;
    const exo_model_config *c = &s->cfg;
    int64_t len;
    if (strstr(name, "layernorm") || !strcmp(name, "model.norm.weight"))
        len = c->hidden_size;
    else if (strstr(name, "q_norm") || strstr(name, "k_norm"))
        len = c->head_dim;
    else
        return EXO_ENOENT; /* no biases in these presets */
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
    s->quant = q;
    s->rng = seed | 1;
    exo_model_config *c = &s->cfg;
    snprintf(c->model_type, sizeof c->model_type, "%s", p->model_type);
    snprintf(c->hidden_act, sizeof c->hidden_act, "silu");
    c->vocab_size = p->vocab;
    c->hidden_size = p->dim;
    c->intermediate_size = p->ffn;
    c->num_hidden_layers = p->layers;
    c->num_attention_heads = p->heads;
    c->num_key_value_heads = p->kv;
    c->head_dim = p->head_dim;
    c->rms_norm_eps = 1e-5;
    c->rope_theta = p->theta;
    c->rope.type = EXO_ROPE_DEFAULT;
    c->rope.factor = 1;
    c->max_position_embeddings = 131072;
    c->tie_word_embeddings = p->tied;
    c->bos_token_id = -1;
    c->pad_token_id = -1;
    *out = s;
    return 0;
}

void exo_synth_free(exo_synth *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n_blocks; i++)
        exo_free_aligned(s->blocks[i]);
    exo_free(s->blocks);
    exo_free(s);
}

const exo_model_config *exo_synth_config(const exo_synth *s) { return &s->cfg; }

int exo_synth_build(exo_synth *s, const exo_model_opts *opts, exo_model **out, exo_err *err)
{
    exo_weight_source src = {s, synth_linear, synth_vector};
    return exo_model_build(&s->cfg, &src, opts, out, err);
}
