/* A model's architecture as described by its Hugging Face config.json (and
 * generation_config.json), reduced to the fields the engine needs.
 *
 * Why a parser of our own rather than "read keys where needed": HF configs
 * come in several spellings (transformers 4.x rope_theta + rope_scaling with
 * "type" or "rope_type", 5.x rope_parameters, possibly per layer type;
 * multimodal wrappers that nest the language model under text_config;
 * eos_token_id as int or list; MLX quantization blocks with per-module
 * overrides), and missing keys mean the per-model_type transformers
 * defaults. All of that is resolved here, once, into one flat struct, and
 * broken input is rejected with an error naming the file and the key.
 *
 * Defaults follow transformers 5.x (configuration_llama/mistral/qwen2/qwen3
 * and modeling_rope_utils): rope_theta 10000 when absent (also for qwen2/3:
 * transformers has no other default; every real Qwen config sets it),
 * rms_norm_eps 1e-6, hidden_act "silu", tie_word_embeddings false,
 * head_dim = hidden/heads except qwen3 (128), num_key_value_heads = heads,
 * attention_bias false except qwen2 (its q/k/v projections always have
 * bias), sliding_window 4096 for mistral, for qwen2/3 only when
 * use_sliding_window is true; bos/eos 1/2 for llama and mistral. The sizes
 * (vocab, hidden, intermediate, layers, heads) are required. */
#ifndef EXO_ENGINE_CONFIG_H
#define EXO_ENGINE_CONFIG_H

#include "core/error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum exo_rope_type {
    EXO_ROPE_DEFAULT = 0, /* plain RoPE, no scaling ("default" or absent) */
    EXO_ROPE_LINEAR,
    EXO_ROPE_DYNAMIC,
    EXO_ROPE_YARN,
    EXO_ROPE_LLAMA3,
} exo_rope_type;

const char *exo_rope_type_name(exo_rope_type t);

typedef struct exo_rope_scaling {
    exo_rope_type type;
    double  factor;                           /* 1 when absent */
    /* llama3 (required for it) */
    double  low_freq_factor;
    double  high_freq_factor;
    int64_t original_max_position_embeddings; /* 0 when absent; yarn: max_position_embeddings */
    /* yarn; beta_fast/beta_slow default to 32/1. The others are 0 when
     * absent: attention_factor 0 means "derive it" (0.1 ln(factor) + 1, or
     * from mscale/mscale_all_dim when those are set). */
    double  beta_fast;
    double  beta_slow;
    double  attention_factor;
    double  mscale;
    double  mscale_all_dim;
    bool    yarn_no_truncate; /* yarn "truncate": false (gpt-oss): fractional correction range */
} exo_rope_scaling;

/* What a layer's token mixer is. */
typedef enum exo_layer_kind {
    EXO_LAYER_FULL = 0, /* softmax attention over every earlier position */
    EXO_LAYER_SLIDING,  /* softmax attention over the last sliding_window positions */
    EXO_LAYER_LINEAR,   /* Gated DeltaNet linear attention (qwen3_next, qwen3_5) */
} exo_layer_kind;

#define EXO_CONFIG_MAX_EOS 16

/* Which generation defaults generation_config.json actually set. */
enum {
    EXO_GEN_TEMPERATURE = 1 << 0,
    EXO_GEN_TOP_P = 1 << 1,
    EXO_GEN_TOP_K = 1 << 2,
    EXO_GEN_MIN_P = 1 << 3,
    EXO_GEN_REPETITION_PENALTY = 1 << 4,
    EXO_GEN_DO_SAMPLE = 1 << 5,
};

typedef struct exo_generation_defaults {
    unsigned set;              /* EXO_GEN_* bits */
    double   temperature;      /* 1.0 when not set (transformers defaults) */
    double   top_p;            /* 1.0 */
    int64_t  top_k;            /* 50 */
    double   min_p;            /* 0 = off */
    double   repetition_penalty; /* 1.0 */
    bool     do_sample;        /* false */
} exo_generation_defaults;

/* One per-module entry of an MLX quantization block. */
typedef struct exo_quant_override {
    char *module;    /* e.g. "model.layers.0.mlp.down_proj" */
    bool  quantized; /* false: the config said `false` for this module */
    int   bits;
    int   group_size;
} exo_quant_override;

typedef struct exo_quant_config {
    bool                enabled; /* a quantization block was present */
    int                 bits;
    int                 group_size;
    char                mode[16]; /* "affine" (the only mode accepted) */
    size_t              n_overrides;
    exo_quant_override *overrides;
} exo_quant_config;

typedef struct exo_model_config {
    char    model_type[64];    /* text model's type ("llama", "qwen3", ...) */
    char    architecture[128]; /* architectures[0], "" if absent */
    int64_t vocab_size;
    int64_t hidden_size;
    int64_t intermediate_size;
    int64_t num_hidden_layers;
    int64_t num_attention_heads;
    int64_t num_key_value_heads;
    int64_t head_dim;
    double  rms_norm_eps;
    double  rope_theta;
    exo_rope_scaling rope;
    int64_t max_position_embeddings;
    bool    tie_word_embeddings;
    bool    attention_bias;
    bool    mlp_bias;
    char    hidden_act[32];
    int64_t bos_token_id;      /* -1 when none */
    int64_t pad_token_id;      /* -1 when none */
    int     n_eos;             /* 0..EXO_CONFIG_MAX_EOS */
    int64_t eos_token_ids[EXO_CONFIG_MAX_EOS];
    char    torch_dtype[16];   /* "bfloat16", "float16", "float32" or "" */
    int64_t sliding_window;    /* 0 when none */
    /* Mixture of experts (qwen3_moe); n_experts 0: every MLP is dense. A
     * layer is sparse unless listed in mlp_only_layers, and only every
     * decoder_sparse_step-th ((l + 1) % step == 0): exo_config_layer_moe. */
    int64_t n_experts;          /* num_experts, or num_local_experts as transformers 5 saves it */
    int64_t n_experts_per_tok;  /* top-k */
    int64_t moe_intermediate_size;
    bool    norm_topk_prob;     /* renormalise the top-k probabilities (default false) */
    int64_t decoder_sparse_step;
    int64_t *mlp_only_layers;   /* owned */
    size_t  n_mlp_only_layers;
    int64_t first_k_dense_replace; /* glm4_moe, deepseek: the first k layers are dense */
    int64_t shared_expert_intermediate_size; /* qwen3_next, qwen3_5_moe: one sigmoid-gated shared expert */
    int64_t n_shared_experts;   /* glm4_moe, deepseek: ungated shared experts, moe_intermediate each */
    bool    router_sigmoid;     /* glm4_moe, deepseek: sigmoid scores, e_score_correction_bias picks */
    int64_t n_group, topk_group; /* group-limited top-k (1, 1: no grouping) */
    double  routed_scaling_factor; /* 1 when absent */
    bool    router_bias;        /* gpt_oss: router has a bias; top-k of logits, softmax over the k */
    double  swiglu_limit;       /* gpt_oss clamped SwiGLU (0: plain) */
    /* Per layer (owned, num_hidden_layers entries): the token mixer. From
     * layer_types, else the family's rule (qwen3_next/qwen3_5: every
     * full_attention_interval-th layer full, the rest linear; gemma3: every
     * sliding_window_pattern-th full, the rest sliding; gpt_oss: odd layers
     * full, even sliding; others: all full, or all sliding with a window). */
    exo_layer_kind *layer_kinds;
    double  partial_rotary_factor; /* fraction of head_dim that rotates (1 when absent) */
    double  rope_local_theta;   /* gemma3 sliding layers' RoPE base (0: rope_theta) */
    double  query_pre_attn_scalar; /* gemma3: scores scale by its -1/2 power (0: head_dim) */
    double  final_logit_softcapping; /* 0: none */
    /* Multi-head latent attention (deepseek_v3, kimi_k2): kv_lora_rank > 0.
     * q_lora_rank 0: a plain q_proj. RoPE on qk_rope_head_dim dims, in
     * adjacent pairs unless rope_interleave is false. */
    int64_t q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    bool    rope_interleave;
    /* Gated DeltaNet (layers of kind EXO_LAYER_LINEAR) */
    int64_t linear_k_heads, linear_v_heads, linear_k_dim, linear_v_dim, linear_conv_kernel;
    exo_generation_defaults generation;
    exo_quant_config quant;
} exo_model_config;

/* Loads `path`/config.json and, if present, `path`/generation_config.json.
 * `path` may also be a config.json file itself (then generation_config.json
 * is looked for next to it). On success *out owns memory: release it with
 * exo_config_free. On error *out is left freed/zeroed.
 * Errors: EXO_ENOENT (no config.json), EXO_EIO, EXO_EFORMAT (not JSON,
 * wrong types, missing or invalid values), EXO_EUNSUPPORTED (a rope type or
 * quantization mode exo does not implement). */
int exo_config_load(const char *path, exo_model_config *out, exo_err *err);

/* Layer l's token mixer (layer_kinds, or when that is NULL: sliding for
 * every layer of a model with a sliding_window, else full). */
exo_layer_kind exo_config_layer_kind(const exo_model_config *cfg, int64_t l);

/* True if layer l's MLP is a mixture of experts. */
bool exo_config_layer_moe(const exo_model_config *cfg, int64_t l);

/* Parses config.json text; `name` names the file in error messages. */
int exo_config_parse(const char *json, size_t len, const char *name, exo_model_config *out,
                     exo_err *err);

/* Applies generation_config.json text to a parsed config: eos_token_id
 * (its ids come first, then the config's that are not already listed),
 * bos/pad_token_id and the sampling defaults. On error cfg is unchanged. */
int exo_config_apply_generation(exo_model_config *cfg, const char *json, size_t len,
                                const char *name, exo_err *err);

void exo_config_free(exo_model_config *cfg);

/* Whether the linear layer at `module_path` (e.g.
 * "model.layers.0.self_attn.q_proj", no ".weight") is quantized according
 * to the config: 1 and *bits and *group_size set (either may be NULL), or 0.
 * A per-module override wins over the block's defaults; an override key
 * matches exactly, or else when one of the two paths is a dot-separated
 * suffix of the other ("language_model.model.layers.0.mlp.up_proj" vs
 * "model.layers.0.mlp.up_proj"), for multimodal wrappers. */
int exo_config_quant_for(const exo_model_config *cfg, const char *module_path, int *bits,
                         int *group_size);

/* True if id is one of cfg's eos tokens. */
bool exo_config_is_eos(const exo_model_config *cfg, int64_t id);

#endif
