/* config.json / generation_config.json parsing tests: every spelling the
 * parser accepts (rope_scaling vs rope_parameters, type vs rope_type,
 * per-layer-type rope, text_config nesting, eos int/list, MLX quantization
 * with per-module overrides), the per-model_type defaults, and the errors
 * for broken input. */
#include "engine/config.h"

#include <criterion/criterion.h>
#include "test_tmpdir.h"
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse(const char *json, exo_model_config *c, exo_err *err)
{
    return exo_config_parse(json, strlen(json), "cfg/config.json", c, err);
}

static exo_model_config ok(const char *json)
{
    exo_model_config c;
    exo_err err = {0};
    int rc = parse(json, &c, &err);
    cr_assert_eq(rc, 0, "parse failed: %s", err.msg);
    return c;
}

/* Expects `code` and a message naming the file and containing `needle`. */
static void bad(const char *json, int code, const char *needle)
{
    exo_model_config c;
    exo_err err = {0};
    int rc = parse(json, &c, &err);
    cr_assert_eq(rc, code, "json %s: got %s (%s), want %s", json, exo_err_name(rc), err.msg,
                 exo_err_name(code));
    cr_assert(strstr(err.msg, "cfg/config.json"), "no file name in: %s", err.msg);
    if (needle)
        cr_assert(strstr(err.msg, needle), "'%s' not in: %s", needle, err.msg);
    cr_assert_null(c.quant.overrides);
}

#define SIZES "\"vocab_size\":1000,\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":2,\"num_attention_heads\":8"
/* the same, with the layer count to be given */
#define SIZES_NL "\"vocab_size\":1000,\"hidden_size\":64,\"intermediate_size\":128,\"num_attention_heads\":8"

Test(config, llama31)
{
    exo_model_config c = ok(
        "{\"architectures\":[\"LlamaForCausalLM\"],\"attention_bias\":false,\"bos_token_id\":128000,"
        "\"eos_token_id\":[128001,128008,128009],\"head_dim\":128,\"hidden_act\":\"silu\","
        "\"hidden_size\":4096,\"intermediate_size\":14336,\"max_position_embeddings\":131072,"
        "\"mlp_bias\":false,\"model_type\":\"llama\",\"num_attention_heads\":32,\"num_hidden_layers\":32,"
        "\"num_key_value_heads\":8,\"rms_norm_eps\":1e-05,\"rope_scaling\":{\"factor\":8.0,"
        "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192,"
        "\"rope_type\":\"llama3\"},\"rope_theta\":500000.0,\"tie_word_embeddings\":false,"
        "\"torch_dtype\":\"bfloat16\",\"vocab_size\":128256}");
    cr_assert_str_eq(c.model_type, "llama");
    cr_assert_str_eq(c.architecture, "LlamaForCausalLM");
    cr_assert_eq(c.vocab_size, 128256);
    cr_assert_eq(c.hidden_size, 4096);
    cr_assert_eq(c.intermediate_size, 14336);
    cr_assert_eq(c.num_hidden_layers, 32);
    cr_assert_eq(c.num_attention_heads, 32);
    cr_assert_eq(c.num_key_value_heads, 8);
    cr_assert_eq(c.head_dim, 128);
    cr_assert_float_eq(c.rms_norm_eps, 1e-5, 1e-12);
    cr_assert_float_eq(c.rope_theta, 500000.0, 1e-6);
    cr_assert_eq(c.rope.type, EXO_ROPE_LLAMA3);
    cr_assert_float_eq(c.rope.factor, 8.0, 1e-12);
    cr_assert_float_eq(c.rope.low_freq_factor, 1.0, 1e-12);
    cr_assert_float_eq(c.rope.high_freq_factor, 4.0, 1e-12);
    cr_assert_eq(c.rope.original_max_position_embeddings, 8192);
    cr_assert_eq(c.max_position_embeddings, 131072);
    cr_assert_not(c.tie_word_embeddings);
    cr_assert_not(c.attention_bias);
    cr_assert_not(c.mlp_bias);
    cr_assert_str_eq(c.hidden_act, "silu");
    cr_assert_eq(c.bos_token_id, 128000);
    cr_assert_eq(c.n_eos, 3);
    cr_assert_eq(c.eos_token_ids[2], 128009);
    cr_assert(exo_config_is_eos(&c, 128008));
    cr_assert_not(exo_config_is_eos(&c, 2));
    cr_assert_eq(c.pad_token_id, -1);
    cr_assert_str_eq(c.torch_dtype, "bfloat16");
    cr_assert_eq(c.sliding_window, 0);
    cr_assert_not(c.quant.enabled);
    cr_assert_eq(exo_config_quant_for(&c, "model.layers.0.mlp.up_proj", NULL, NULL), 0);
    cr_assert_str_eq(exo_rope_type_name(c.rope.type), "llama3");
    exo_config_free(&c);
}

Test(config, llama_defaults)
{
    exo_model_config c = ok("{\"model_type\":\"llama\"," SIZES "}");
    cr_assert_eq(c.num_key_value_heads, 8); /* = heads */
    cr_assert_eq(c.head_dim, 8);            /* 64 / 8 */
    cr_assert_float_eq(c.rope_theta, 10000.0, 1e-9);
    cr_assert_eq(c.rope.type, EXO_ROPE_DEFAULT);
    cr_assert_float_eq(c.rope.factor, 1.0, 1e-12);
    cr_assert_float_eq(c.rms_norm_eps, 1e-6, 1e-15);
    cr_assert_eq(c.max_position_embeddings, 2048);
    cr_assert_eq(c.bos_token_id, 1);
    cr_assert_eq(c.n_eos, 1);
    cr_assert_eq(c.eos_token_ids[0], 2);
    cr_assert_str_eq(c.hidden_act, "silu");
    cr_assert_not(c.tie_word_embeddings);
    cr_assert_float_eq(c.generation.temperature, 1.0, 0);
    cr_assert_float_eq(c.generation.top_p, 1.0, 0);
    cr_assert_eq(c.generation.top_k, 50);
    cr_assert_eq(c.generation.set, 0);
    exo_config_free(&c);

    /* null means absent */
    c = ok("{\"model_type\":\"llama\"," SIZES ",\"eos_token_id\":null,\"head_dim\":null,"
           "\"rope_scaling\":null,\"pad_token_id\":null}");
    cr_assert_eq(c.n_eos, 0);
    cr_assert_eq(c.head_dim, 8);
    exo_config_free(&c);
}

Test(config, qwen2_defaults)
{
    exo_model_config c = ok("{\"model_type\":\"qwen2\"," SIZES ",\"num_key_value_heads\":2,"
                            "\"sliding_window\":32768,\"use_sliding_window\":false,"
                            "\"rope_theta\":1000000.0,\"tie_word_embeddings\":true,"
                            "\"eos_token_id\":151645,\"bos_token_id\":151643}");
    cr_assert(c.attention_bias); /* qwen2 q/k/v always have bias */
    cr_assert_eq(c.sliding_window, 0);
    cr_assert_float_eq(c.rope_theta, 1e6, 1e-6);
    cr_assert(c.tie_word_embeddings);
    cr_assert_eq(c.n_eos, 1);
    cr_assert_eq(c.eos_token_ids[0], 151645);
    cr_assert_eq(c.max_position_embeddings, 32768);
    exo_config_free(&c);

    c = ok("{\"model_type\":\"qwen2\"," SIZES ",\"use_sliding_window\":true,\"sliding_window\":4096}");
    cr_assert_eq(c.sliding_window, 4096);
    cr_assert_eq(c.bos_token_id, -1);
    cr_assert_eq(c.n_eos, 0);
    cr_assert_float_eq(c.rope_theta, 10000.0, 1e-9); /* transformers' default, no key */
    exo_config_free(&c);
}

Test(config, qwen3_defaults)
{
    exo_model_config c = ok("{\"model_type\":\"qwen3\"," SIZES "}");
    cr_assert_eq(c.head_dim, 128); /* Qwen3Config default, not hidden/heads */
    cr_assert_not(c.attention_bias);
    exo_config_free(&c);
    c = ok("{\"model_type\":\"qwen3\"," SIZES ",\"attention_bias\":true,\"head_dim\":16}");
    cr_assert(c.attention_bias);
    cr_assert_eq(c.head_dim, 16);
    exo_config_free(&c);
    /* explicit head_dim lifts the divisibility requirement */
    c = ok("{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":100,\"intermediate_size\":8,"
           "\"num_hidden_layers\":1,\"num_attention_heads\":3,\"num_key_value_heads\":1,\"head_dim\":32}");
    cr_assert_eq(c.head_dim, 32);
    exo_config_free(&c);
}

Test(config, qwen3_moe_experts)
{
    /* the hub's key (num_experts) and transformers 5's saved one (num_local_experts) */
    exo_model_config c = ok("{\"model_type\":\"qwen3_moe\"," SIZES ",\"num_experts\":128,\"num_experts_per_tok\":8,"
                            "\"moe_intermediate_size\":768,\"norm_topk_prob\":true}");
    cr_assert_eq(c.n_experts, 128);
    cr_assert_eq(c.n_experts_per_tok, 8);
    cr_assert_eq(c.moe_intermediate_size, 768);
    cr_assert(c.norm_topk_prob);
    cr_assert_eq(c.decoder_sparse_step, 1);
    cr_assert_eq(c.head_dim, 128, "qwen3's head_dim default holds");
    cr_assert(exo_config_layer_moe(&c, 0) && exo_config_layer_moe(&c, 1));
    exo_config_free(&c);
    c = ok("{\"model_type\":\"qwen3_moe\",\"vocab_size\":10,\"hidden_size\":64,\"intermediate_size\":128,"
           "\"num_hidden_layers\":6,\"num_attention_heads\":8,\"num_local_experts\":4,\"num_experts_per_tok\":2,"
           "\"moe_intermediate_size\":16,\"decoder_sparse_step\":2,\"mlp_only_layers\":[3]}");
    cr_assert_eq(c.n_experts, 4);
    cr_assert_not(c.norm_topk_prob, "transformers' default");
    bool want[6] = {false, true, false, false, false, true}; /* (l+1) % 2 == 0, not layer 3 */
    for (int l = 0; l < 6; l++)
        cr_assert_eq(exo_config_layer_moe(&c, l), want[l], "layer %d", l);
    exo_config_free(&c);
    c = ok("{\"model_type\":\"qwen3\"," SIZES "}");
    cr_assert_eq(c.n_experts, 0);
    cr_assert_not(exo_config_layer_moe(&c, 0));
    exo_config_free(&c);
    bad("{\"model_type\":\"qwen3_moe\"," SIZES ",\"num_experts\":8,\"moe_intermediate_size\":16}", EXO_EFORMAT,
        "num_experts_per_tok");
    bad("{\"model_type\":\"qwen3_moe\"," SIZES ",\"num_experts\":8,\"num_experts_per_tok\":9,"
        "\"moe_intermediate_size\":16}", EXO_EFORMAT, "exceeds");
    bad("{\"model_type\":\"qwen3_moe\"," SIZES ",\"num_experts\":8,\"num_experts_per_tok\":2,"
        "\"moe_intermediate_size\":16,\"mlp_only_layers\":[2]}", EXO_EFORMAT, "mlp_only_layers");
    bad("{\"model_type\":\"qwen3_moe\"," SIZES ",\"num_experts\":8,\"num_experts_per_tok\":2,"
        "\"moe_intermediate_size\":16,\"mlp_only_layers\":{}}", EXO_EFORMAT, "mlp_only_layers");
    bad("{\"model_type\":\"qwen3_moe\"," SIZES ",\"num_experts\":-1}", EXO_EFORMAT, "num_experts");
}

/* Qwen3.5-MoE's hub config: the text model under text_config (its
 * model_type "..._text"), layer_types, rope_parameters with the partial
 * rotary factor, no intermediate_size, the router always renormalised. */
Test(config, qwen3_5_moe_wrapper)
{
    exo_model_config c = ok(
        "{\"model_type\":\"qwen3_5_moe\",\"architectures\":[\"Qwen3_5MoeForConditionalGeneration\"],"
        "\"text_config\":{\"model_type\":\"qwen3_5_moe_text\",\"vocab_size\":1000,\"hidden_size\":64,"
        "\"num_hidden_layers\":4,\"num_attention_heads\":8,\"num_key_value_heads\":2,\"head_dim\":32,"
        "\"layer_types\":[\"linear_attention\",\"linear_attention\",\"linear_attention\",\"full_attention\"],"
        "\"linear_num_key_heads\":2,\"linear_num_value_heads\":4,\"linear_key_head_dim\":16,"
        "\"linear_value_head_dim\":16,\"num_experts\":8,\"num_experts_per_tok\":2,\"moe_intermediate_size\":32,"
        "\"shared_expert_intermediate_size\":48,\"rope_parameters\":{\"rope_type\":\"default\","
        "\"rope_theta\":10000000,\"partial_rotary_factor\":0.25,\"mrope_section\":[11,11,10]}},"
        "\"vision_config\":{\"depth\":2}}");
    cr_assert_str_eq(c.model_type, "qwen3_5_moe");
    cr_assert_eq(c.intermediate_size, 0);
    cr_assert(c.norm_topk_prob, "Qwen3.5's router always renormalises");
    cr_assert_float_eq(c.partial_rotary_factor, 0.25, 1e-12);
    cr_assert_float_eq(c.rope_theta, 1e7, 1);
    cr_assert_eq(c.linear_k_heads, 2);
    cr_assert_eq(c.linear_v_heads, 4);
    cr_assert_eq(c.linear_k_dim, 16);
    cr_assert_eq(c.linear_conv_kernel, 4, "the default kernel");
    cr_assert_eq(c.shared_expert_intermediate_size, 48);
    for (int l = 0; l < 4; l++)
        cr_assert_eq(exo_config_layer_kind(&c, l), l == 3 ? EXO_LAYER_FULL : EXO_LAYER_LINEAR, "layer %d", l);
    exo_config_free(&c);
    /* qwen3_next without layer_types: every 4th layer is full attention */
    c = ok("{\"model_type\":\"qwen3_next\"," SIZES_NL ",\"num_hidden_layers\":8,\"num_experts\":4,"
           "\"num_experts_per_tok\":2,\"moe_intermediate_size\":16}");
    for (int l = 0; l < 8; l++)
        cr_assert_eq(exo_config_layer_kind(&c, l), (l + 1) % 4 ? EXO_LAYER_LINEAR : EXO_LAYER_FULL);
    cr_assert_eq(c.head_dim, 256);
    cr_assert_float_eq(c.partial_rotary_factor, 0.25, 1e-12);
    cr_assert(c.norm_topk_prob, "Qwen3NextConfig's default");
    exo_config_free(&c);
    bad("{\"model_type\":\"qwen3_next\"," SIZES ",\"layer_types\":[\"full_attention\"]}", EXO_EFORMAT,
        "layer_types");
    bad("{\"model_type\":\"qwen3_5_moe\",\"vocab_size\":1000,\"hidden_size\":64,\"num_hidden_layers\":2,"
        "\"num_attention_heads\":8}", EXO_EFORMAT, "no MLP"); /* found by fuzz_config */
    bad("{\"model_type\":\"qwen3_next\"," SIZES ",\"layer_types\":[\"full_attention\",\"cross\"]}",
        EXO_EUNSUPPORTED, "cross");
    bad("{\"model_type\":\"llama\"," SIZES ",\"layer_types\":[\"full_attention\",\"linear_attention\"]}",
        EXO_EFORMAT, "linear attention");
    bad("{\"model_type\":\"qwen3_next\"," SIZES ",\"linear_num_key_heads\":3,\"linear_num_value_heads\":4}",
        EXO_EFORMAT, "multiple");
}

/* Gemma 3: per-layer-type rope_parameters (local base for sliding layers),
 * the sliding pattern, hidden_activation, tied embeddings, its scalar. */
Test(config, gemma3)
{
    exo_model_config c = ok(
        "{\"model_type\":\"gemma3_text\"," SIZES_NL ",\"num_hidden_layers\":7,\"hidden_activation\":"
        "\"gelu_pytorch_tanh\",\"query_pre_attn_scalar\":24,\"sliding_window\":512,\"rope_parameters\":{"
        "\"sliding_attention\":{\"rope_type\":\"default\",\"rope_theta\":10000.0},\"full_attention\":{"
        "\"rope_type\":\"linear\",\"factor\":8.0,\"rope_theta\":1000000.0}}}");
    cr_assert_str_eq(c.model_type, "gemma3");
    cr_assert_str_eq(c.hidden_act, "gelu_pytorch_tanh");
    cr_assert(c.tie_word_embeddings);
    cr_assert_eq(c.head_dim, 256);
    cr_assert_float_eq(c.query_pre_attn_scalar, 24, 1e-12);
    cr_assert_float_eq(c.rope_theta, 1e6, 1e-6);
    cr_assert_float_eq(c.rope_local_theta, 1e4, 1e-6);
    cr_assert_eq(c.rope.type, EXO_ROPE_LINEAR);
    for (int l = 0; l < 7; l++)
        cr_assert_eq(exo_config_layer_kind(&c, l), l == 5 ? EXO_LAYER_FULL : EXO_LAYER_SLIDING, "layer %d", l);
    exo_config_free(&c);
    c = ok("{\"model_type\":\"gemma3_text\"," SIZES ",\"rope_local_base_freq\":20000,\"rope_theta\":5e5}");
    cr_assert_float_eq(c.rope_local_theta, 2e4, 1e-6);
    cr_assert_eq(c.sliding_window, 4096);
    cr_assert_float_eq(c.query_pre_attn_scalar, 256, 1e-12);
    exo_config_free(&c);
    bad("{\"model_type\":\"gemma3_text\"," SIZES ",\"attn_logit_softcapping\":50}", EXO_EUNSUPPORTED,
        "softcapping");
}

/* gpt-oss: alternating sliding/full layers, the expert width is
 * intermediate_size, yarn with truncate false, biases and the clamp. */
Test(config, gpt_oss)
{
    exo_model_config c = ok(
        "{\"model_type\":\"gpt_oss\"," SIZES_NL ",\"num_hidden_layers\":4,\"num_local_experts\":32,"
        "\"num_experts_per_tok\":4,\"head_dim\":64,\"rope_theta\":150000,\"rope_scaling\":{\"rope_type\":\"yarn\","
        "\"factor\":32.0,\"beta_fast\":32.0,\"beta_slow\":1.0,\"truncate\":false,"
        "\"original_max_position_embeddings\":4096}}");
    cr_assert_eq(c.n_experts, 32);
    cr_assert_eq(c.moe_intermediate_size, 128, "the experts are intermediate_size wide");
    cr_assert(c.norm_topk_prob && c.router_bias && c.attention_bias);
    cr_assert_float_eq(c.swiglu_limit, 7.0, 1e-12);
    cr_assert_eq(c.sliding_window, 128);
    cr_assert(c.rope.yarn_no_truncate);
    cr_assert_not(c.quant.enabled);
    for (int l = 0; l < 4; l++)
        cr_assert_eq(exo_config_layer_kind(&c, l), l % 2 ? EXO_LAYER_FULL : EXO_LAYER_SLIDING, "layer %d", l);
    exo_config_free(&c);
    /* the hub's MXFP4 experts (their tensors say so), and mlx-community's
     * MXFP4-Q8 (experts by default, per-module affine 8-bit for the rest) */
    c = ok("{\"model_type\":\"gpt_oss\"," SIZES ",\"num_local_experts\":4,\"num_experts_per_tok\":2,"
           "\"quantization_config\":{\"quant_method\":\"mxfp4\",\"modules_to_not_convert\":[\"lm_head\"]}}");
    cr_assert_not(c.quant.enabled);
    exo_config_free(&c);
    c = ok("{\"model_type\":\"gpt_oss\"," SIZES ",\"num_local_experts\":4,\"num_experts_per_tok\":2,"
           "\"quantization\":{\"group_size\":32,\"bits\":4,\"mode\":\"mxfp4\",\"model.layers.0.self_attn.q_proj\":"
           "{\"group_size\":64,\"bits\":8,\"mode\":\"affine\"}}}");
    int bits = 0, gs = 0;
    cr_assert(exo_config_quant_for(&c, "model.layers.0.self_attn.q_proj", &bits, &gs));
    cr_assert_eq(bits, 8);
    cr_assert_eq(gs, 64);
    exo_config_free(&c);
}

/* GLM-4.5 and DeepSeek-V3 / Kimi K2: sigmoid routing with groups, scaling,
 * dense first layers, shared experts; MLA sizes. */
Test(config, sigmoid_routers_and_mla)
{
    exo_model_config c = ok(
        "{\"model_type\":\"glm4_moe\"," SIZES_NL ",\"num_hidden_layers\":3,\"n_routed_experts\":8,"
        "\"num_experts_per_tok\":2,\"moe_intermediate_size\":16,\"first_k_dense_replace\":1,"
        "\"n_shared_experts\":1,\"routed_scaling_factor\":2.5,\"n_group\":1,\"topk_group\":1,\"head_dim\":32}");
    cr_assert(c.router_sigmoid && c.norm_topk_prob);
    cr_assert_eq(c.n_experts, 8);
    cr_assert_eq(c.n_shared_experts, 1);
    cr_assert_float_eq(c.routed_scaling_factor, 2.5, 1e-12);
    cr_assert_float_eq(c.partial_rotary_factor, 0.5, 1e-12);
    cr_assert_not(exo_config_layer_moe(&c, 0));
    cr_assert(exo_config_layer_moe(&c, 1) && exo_config_layer_moe(&c, 2));
    exo_config_free(&c);
    c = ok("{\"model_type\":\"kimi_k2\",\"architectures\":[\"DeepseekV3ForCausalLM\"]," SIZES
           ",\"n_routed_experts\":16,\"num_experts_per_tok\":4,\"moe_intermediate_size\":16,\"n_group\":4,"
           "\"topk_group\":2,\"q_lora_rank\":null,\"kv_lora_rank\":32,\"qk_nope_head_dim\":16,"
           "\"qk_rope_head_dim\":8,\"v_head_dim\":16}");
    cr_assert_str_eq(c.model_type, "deepseek_v3");
    cr_assert_eq(c.q_lora_rank, 0, "null: a plain q_proj");
    cr_assert_eq(c.kv_lora_rank, 32);
    cr_assert_eq(c.head_dim, 8, "RoPE dims");
    cr_assert_eq(c.num_key_value_heads, 8);
    cr_assert(c.rope_interleave);
    cr_assert_eq(c.n_group, 4);
    cr_assert_eq(c.topk_group, 2);
    exo_config_free(&c);
    c = ok("{\"model_type\":\"deepseek_v3\"," SIZES ",\"n_routed_experts\":16,\"num_experts_per_tok\":4,"
           "\"moe_intermediate_size\":16}");
    cr_assert_eq(c.q_lora_rank, 1536, "absent: the class default");
    exo_config_free(&c);
    bad("{\"model_type\":\"deepseek_v3\"," SIZES ",\"n_routed_experts\":16,\"num_experts_per_tok\":4,"
        "\"moe_intermediate_size\":16,\"n_group\":3}", EXO_EFORMAT, "groups");
    bad("{\"model_type\":\"deepseek_v3\"," SIZES ",\"n_routed_experts\":16,\"num_experts_per_tok\":8,"
        "\"moe_intermediate_size\":16,\"n_group\":4,\"topk_group\":1}", EXO_EFORMAT, "groups");
}

Test(config, mistral_defaults)
{
    exo_model_config c = ok("{\"model_type\":\"mistral\"," SIZES "}");
    cr_assert_eq(c.sliding_window, 4096);
    cr_assert_eq(c.max_position_embeddings, 131072);
    cr_assert_eq(c.bos_token_id, 1);
    cr_assert_eq(c.eos_token_ids[0], 2);
    exo_config_free(&c);
    c = ok("{\"model_type\":\"mistral\"," SIZES ",\"sliding_window\":null}");
    cr_assert_eq(c.sliding_window, 0);
    exo_config_free(&c);
    c = ok("{\"model_type\":\"mistral\"," SIZES ",\"sliding_window\":1024}");
    cr_assert_eq(c.sliding_window, 1024);
    exo_config_free(&c);
}

Test(config, rope_scaling_old_type_key)
{
    exo_model_config c = ok("{\"model_type\":\"llama\"," SIZES ",\"rope_scaling\":{\"type\":\"linear\",\"factor\":2}}");
    cr_assert_eq(c.rope.type, EXO_ROPE_LINEAR);
    cr_assert_float_eq(c.rope.factor, 2.0, 0);
    exo_config_free(&c);
    c = ok("{\"model_type\":\"llama\"," SIZES ",\"rope_scaling\":{\"type\":\"dynamic\",\"factor\":4.0}}");
    cr_assert_eq(c.rope.type, EXO_ROPE_DYNAMIC);
    exo_config_free(&c);
    c = ok("{\"model_type\":\"llama\"," SIZES ",\"rope_scaling\":{\"rope_type\":\"default\"}}");
    cr_assert_eq(c.rope.type, EXO_ROPE_DEFAULT);
    exo_config_free(&c);
}

Test(config, rope_parameters_5x)
{
    exo_model_config c = ok(
        "{\"model_type\":\"qwen3\"," SIZES ",\"max_position_embeddings\":131072,"
        "\"rope_parameters\":{\"rope_type\":\"yarn\",\"rope_theta\":1000000.0,\"factor\":4.0,"
        "\"original_max_position_embeddings\":32768,\"beta_fast\":16,\"attention_factor\":1.2,"
        "\"mscale\":0.707,\"mscale_all_dim\":1.0}}");
    cr_assert_eq(c.rope.type, EXO_ROPE_YARN);
    cr_assert_float_eq(c.rope_theta, 1e6, 1e-6);
    cr_assert_float_eq(c.rope.factor, 4.0, 0);
    cr_assert_eq(c.rope.original_max_position_embeddings, 32768);
    cr_assert_float_eq(c.rope.beta_fast, 16.0, 0);
    cr_assert_float_eq(c.rope.beta_slow, 1.0, 0); /* default */
    cr_assert_float_eq(c.rope.attention_factor, 1.2, 1e-12);
    cr_assert_float_eq(c.rope.mscale, 0.707, 1e-12);
    cr_assert_float_eq(c.rope.mscale_all_dim, 1.0, 1e-12);
    exo_config_free(&c);

    /* yarn without original_max_position_embeddings: max_position_embeddings */
    c = ok("{\"model_type\":\"qwen3\"," SIZES ",\"max_position_embeddings\":40960,"
           "\"rope_parameters\":{\"rope_type\":\"yarn\",\"rope_theta\":5e5,\"factor\":2}}");
    cr_assert_eq(c.rope.original_max_position_embeddings, 40960);
    cr_assert_float_eq(c.rope.beta_fast, 32.0, 0);
    cr_assert_float_eq(c.rope.attention_factor, 0.0, 0);
    exo_config_free(&c);

    /* plain default with theta only */
    c = ok("{\"model_type\":\"llama\"," SIZES ",\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":250000}}");
    cr_assert_eq(c.rope.type, EXO_ROPE_DEFAULT);
    cr_assert_float_eq(c.rope_theta, 250000.0, 0);
    exo_config_free(&c);

    /* rope_parameters without theta: top-level rope_theta */
    c = ok("{\"model_type\":\"llama\"," SIZES ",\"rope_theta\":77.0,\"rope_parameters\":{\"rope_type\":\"linear\",\"factor\":2}}");
    cr_assert_float_eq(c.rope_theta, 77.0, 0);
    cr_assert_eq(c.rope.type, EXO_ROPE_LINEAR);
    exo_config_free(&c);
}

Test(config, rope_parameters_per_layer_type)
{
    exo_model_config c = ok(
        "{\"model_type\":\"llama\"," SIZES ",\"rope_parameters\":{"
        "\"sliding_attention\":{\"rope_type\":\"default\",\"rope_theta\":10000.0},"
        "\"full_attention\":{\"rope_type\":\"linear\",\"factor\":8.0,\"rope_theta\":1000000.0}}}");
    cr_assert_eq(c.rope.type, EXO_ROPE_LINEAR);
    cr_assert_float_eq(c.rope_theta, 1e6, 0);
    cr_assert_float_eq(c.rope.factor, 8.0, 0);
    exo_config_free(&c);
    c = ok("{\"model_type\":\"llama\"," SIZES ",\"rope_parameters\":{"
           "\"only\":{\"rope_type\":\"default\",\"rope_theta\":1234.0}}}");
    cr_assert_float_eq(c.rope_theta, 1234.0, 0);
    exo_config_free(&c);
    bad("{\"model_type\":\"llama\"," SIZES ",\"rope_parameters\":{"
        "\"a\":{\"rope_theta\":1.0},\"b\":{\"rope_theta\":2.0}}}",
        EXO_EFORMAT, "full_attention");
}

Test(config, text_config_nesting)
{
    exo_model_config c = ok(
        "{\"architectures\":[\"Qwen2_5_VLForConditionalGeneration\"],\"model_type\":\"qwen2_5_vl\","
        "\"tie_word_embeddings\":true,\"vocab_size\":5,\"eos_token_id\":7,"
        "\"vision_config\":{\"hidden_size\":1280},"
        "\"text_config\":{\"model_type\":\"qwen3\",\"vocab_size\":1000,\"hidden_size\":64,"
        "\"intermediate_size\":128,\"num_hidden_layers\":2,\"num_attention_heads\":8,"
        "\"num_key_value_heads\":4,\"head_dim\":8,\"rope_theta\":1000000.0,\"rms_norm_eps\":null}}");
    cr_assert_str_eq(c.model_type, "qwen3");
    cr_assert_str_eq(c.architecture, "Qwen2_5_VLForConditionalGeneration");
    cr_assert_eq(c.vocab_size, 1000); /* text_config wins */
    cr_assert_eq(c.num_key_value_heads, 4);
    cr_assert(c.tie_word_embeddings); /* falls back to the top level */
    cr_assert_eq(c.eos_token_ids[0], 7);
    cr_assert_float_eq(c.rms_norm_eps, 1e-6, 1e-15);
    exo_config_free(&c);
    bad("{\"text_config\":[]," SIZES "}", EXO_EFORMAT, "text_config");
}

Test(config, torch_dtype_spellings)
{
    exo_model_config c = ok("{\"model_type\":\"llama\"," SIZES ",\"dtype\":\"float16\"}");
    cr_assert_str_eq(c.torch_dtype, "float16");
    exo_config_free(&c);
}

Test(config, mlx_quantization)
{
    exo_model_config c = ok(
        "{\"model_type\":\"llama\"," SIZES ",\"quantization\":{\"group_size\":64,\"bits\":4,"
        "\"mode\":\"affine\",\"model.layers.0.mlp.down_proj\":{\"group_size\":32,\"bits\":8},"
        "\"model.layers.1.mlp.gate\":false,\"lm_head\":{\"bits\":6}},"
        "\"quantization_config\":{\"group_size\":64,\"bits\":4}}");
    cr_assert(c.quant.enabled);
    cr_assert_eq(c.quant.bits, 4);
    cr_assert_eq(c.quant.group_size, 64);
    cr_assert_str_eq(c.quant.mode, "affine");
    cr_assert_eq(c.quant.n_overrides, 3);
    int bits = 0, gs = 0;
    cr_assert_eq(exo_config_quant_for(&c, "model.layers.0.self_attn.q_proj", &bits, &gs), 1);
    cr_assert_eq(bits, 4);
    cr_assert_eq(gs, 64);
    cr_assert_eq(exo_config_quant_for(&c, "model.layers.0.mlp.down_proj", &bits, &gs), 1);
    cr_assert_eq(bits, 8);
    cr_assert_eq(gs, 32);
    cr_assert_eq(exo_config_quant_for(&c, "model.layers.1.mlp.gate", &bits, &gs), 0);
    cr_assert_eq(exo_config_quant_for(&c, "lm_head", &bits, &gs), 1);
    cr_assert_eq(bits, 6);
    cr_assert_eq(gs, 64); /* inherits the block's group size */
    exo_config_free(&c);

    /* wrapper prefixes on either side */
    c = ok("{\"model_type\":\"llama\"," SIZES ",\"quantization\":{\"group_size\":64,\"bits\":4,"
           "\"language_model.model.layers.0.mlp.up_proj\":false,\"layers.1.mlp.up_proj\":{\"bits\":8}}}");
    cr_assert_eq(exo_config_quant_for(&c, "model.layers.0.mlp.up_proj", &bits, &gs), 0);
    cr_assert_eq(exo_config_quant_for(&c, "model.layers.1.mlp.up_proj", &bits, &gs), 1);
    cr_assert_eq(bits, 8);
    cr_assert_eq(exo_config_quant_for(&c, "model.layers.11.mlp.up_proj", &bits, &gs), 1);
    cr_assert_eq(bits, 4);
    cr_assert_eq(exo_config_quant_for(&c, "xmodel.layers.0.mlp.up_proj", &bits, &gs), 1);
    exo_config_free(&c);

    c = ok("{\"model_type\":\"qwen3\"," SIZES ",\"quantization_config\":{\"group_size\":128,\"bits\":3}}");
    cr_assert(c.quant.enabled);
    cr_assert_eq(exo_config_quant_for(&c, "x", &bits, NULL), 1);
    cr_assert_eq(bits, 3);
    exo_config_free(&c);

    bad("{\"model_type\":\"llama\"," SIZES ",\"quantization\":{\"group_size\":64,\"bits\":4,\"mode\":\"mxfp4\"}}",
        EXO_EUNSUPPORTED, "mxfp4");
    bad("{\"model_type\":\"llama\"," SIZES ",\"quantization\":{\"group_size\":64,\"bits\":7}}",
        EXO_EUNSUPPORTED, "quantization");
    bad("{\"model_type\":\"llama\"," SIZES ",\"quantization\":{\"group_size\":64,\"bits\":4,\"m\":{\"bits\":1}}}",
        EXO_EUNSUPPORTED, "quantization.m");
    bad("{\"model_type\":\"llama\"," SIZES ",\"quantization\":{\"group_size\":\"64\",\"bits\":4}}",
        EXO_EFORMAT, "quantization.group_size");
    bad("{\"model_type\":\"llama\"," SIZES ",\"quantization\":{\"bits\":4}}", EXO_EFORMAT, "group_size");
    bad("{\"model_type\":\"llama\"," SIZES ",\"quantization\":4}", EXO_EFORMAT, "quantization");
    bad("{\"model_type\":\"llama\"," SIZES ",\"quantization_config\":{\"quant_method\":\"gptq\"}}",
        EXO_EUNSUPPORTED, "gptq");
}

Test(config, generation_config)
{
    exo_model_config c = ok("{\"model_type\":\"llama\"," SIZES ",\"eos_token_id\":2}");
    exo_err err = {0};
    const char *g = "{\"bos_token_id\":1,\"eos_token_id\":[7,2],\"pad_token_id\":0,\"temperature\":0.6,"
                    "\"top_p\":0.9,\"top_k\":20,\"min_p\":0.05,\"repetition_penalty\":1.1,\"do_sample\":true,"
                    "\"transformers_version\":\"4.51.0\"}";
    cr_assert_eq(exo_config_apply_generation(&c, g, strlen(g), "gen.json", &err), 0, "%s", err.msg);
    cr_assert_eq(c.n_eos, 2);
    cr_assert_eq(c.eos_token_ids[0], 7);
    cr_assert_eq(c.eos_token_ids[1], 2);
    cr_assert_eq(c.pad_token_id, 0);
    cr_assert_float_eq(c.generation.temperature, 0.6, 1e-12);
    cr_assert_float_eq(c.generation.top_p, 0.9, 1e-12);
    cr_assert_eq(c.generation.top_k, 20);
    cr_assert_float_eq(c.generation.min_p, 0.05, 1e-12);
    cr_assert_float_eq(c.generation.repetition_penalty, 1.1, 1e-12);
    cr_assert(c.generation.do_sample);
    cr_assert_eq(c.generation.set, EXO_GEN_TEMPERATURE | EXO_GEN_TOP_P | EXO_GEN_TOP_K | EXO_GEN_MIN_P |
                                       EXO_GEN_REPETITION_PENALTY | EXO_GEN_DO_SAMPLE);

    /* merge: generation_config's ids first, then the config's others */
    const char *g2 = "{\"eos_token_id\":9}";
    cr_assert_eq(exo_config_apply_generation(&c, g2, strlen(g2), "gen.json", &err), 0);
    cr_assert_eq(c.n_eos, 3);
    cr_assert_eq(c.eos_token_ids[0], 9);
    cr_assert_eq(c.eos_token_ids[1], 7);

    /* errors leave the config unchanged */
    const char *g3 = "{\"temperature\":0.1,\"top_k\":\"x\"}";
    cr_assert_eq(exo_config_apply_generation(&c, g3, strlen(g3), "gen.json", &err), EXO_EFORMAT);
    cr_assert(strstr(err.msg, "gen.json") && strstr(err.msg, "top_k"), "%s", err.msg);
    cr_assert_float_eq(c.generation.temperature, 0.6, 1e-12);
    const char *g4 = "{\"top_p\":2}";
    cr_assert_eq(exo_config_apply_generation(&c, g4, strlen(g4), "gen.json", &err), EXO_EFORMAT);
    cr_assert_eq(exo_config_apply_generation(&c, "[", 1, "gen.json", &err), EXO_EFORMAT);
    cr_assert(strstr(err.msg, "gen.json"));
    exo_config_free(&c);
}

Test(config, broken_input)
{
    bad("{", EXO_EFORMAT, "JSON");
    bad("", EXO_EFORMAT, "JSON");
    bad("[1]", EXO_EFORMAT, "object");
    bad("{\"model_type\":\"llama\"," SIZES ",\"vocab_size\":1}", EXO_EFORMAT, NULL); /* duplicate key */
    bad("{\"model_type\":\"llama\",\"vocab_size\":1000}", EXO_EFORMAT, "hidden_size");
    bad("{\"model_type\":\"llama\",\"hidden_size\":\"64\",\"vocab_size\":1000,\"intermediate_size\":128,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":8}",
        EXO_EFORMAT, "hidden_size");
    bad("{\"model_type\":\"llama\",\"hidden_size\":64.0,\"vocab_size\":1000,\"intermediate_size\":128,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":8}",
        EXO_EFORMAT, "hidden_size");
    bad("{\"model_type\":\"llama\",\"hidden_size\":0,\"vocab_size\":1000,\"intermediate_size\":128,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":8}",
        EXO_EFORMAT, "hidden_size");
    bad("{\"model_type\":\"llama\",\"hidden_size\":64,\"vocab_size\":-5,\"intermediate_size\":128,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":8}",
        EXO_EFORMAT, "vocab_size");
    bad("{\"model_type\":\"llama\",\"hidden_size\":64,\"vocab_size\":99999999999,\"intermediate_size\":128,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":8}",
        EXO_EFORMAT, "vocab_size");
    bad("{\"model_type\":\"llama\",\"hidden_size\":64,\"vocab_size\":1000,\"intermediate_size\":128,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":6}",
        EXO_EFORMAT, "divisible");
    bad("{\"model_type\":\"llama\"," SIZES ",\"num_key_value_heads\":3}", EXO_EFORMAT, "num_key_value_heads");
    bad("{\"model_type\":\"llama\"," SIZES ",\"num_key_value_heads\":16}", EXO_EFORMAT, "num_key_value_heads");
    bad("{\"model_type\":\"llama\"," SIZES ",\"num_key_value_heads\":0}", EXO_EFORMAT, "num_key_value_heads");
    bad("{\"model_type\":\"llama\"," SIZES ",\"head_dim\":-1}", EXO_EFORMAT, "head_dim");
    bad("{\"model_type\":7," SIZES "}", EXO_EFORMAT, "model_type");
    bad("{\"architectures\":\"X\"," SIZES "}", EXO_EFORMAT, "architectures");
    bad("{\"model_type\":\"llama\"," SIZES ",\"rms_norm_eps\":\"1e-6\"}", EXO_EFORMAT, "rms_norm_eps");
    bad("{\"model_type\":\"llama\"," SIZES ",\"rms_norm_eps\":0}", EXO_EFORMAT, "rms_norm_eps");
    bad("{\"model_type\":\"llama\"," SIZES ",\"rope_theta\":-1}", EXO_EFORMAT, "rope_theta");
    bad("{\"model_type\":\"llama\"," SIZES ",\"rope_theta\":\"big\"}", EXO_EFORMAT, "rope_theta");
    bad("{\"model_type\":\"llama\"," SIZES ",\"tie_word_embeddings\":1}", EXO_EFORMAT, "tie_word_embeddings");
    bad("{\"model_type\":\"llama\"," SIZES ",\"eos_token_id\":\"2\"}", EXO_EFORMAT, "eos_token_id");
    bad("{\"model_type\":\"llama\"," SIZES ",\"eos_token_id\":[1,\"2\"]}", EXO_EFORMAT, "eos_token_id");
    bad("{\"model_type\":\"llama\"," SIZES ",\"eos_token_id\":-1}", EXO_EFORMAT, "eos_token_id");
    bad("{\"model_type\":\"llama\"," SIZES ",\"bos_token_id\":1.5}", EXO_EFORMAT, "bos_token_id");
    bad("{\"model_type\":\"llama\"," SIZES ",\"rope_scaling\":\"linear\"}", EXO_EFORMAT, "rope_scaling");
    bad("{\"model_type\":\"llama\"," SIZES ",\"rope_parameters\":[]}", EXO_EFORMAT, "rope_parameters");
    bad("{\"model_type\":\"llama\"," SIZES ",\"rope_scaling\":{\"type\":\"longrope\",\"factor\":2}}",
        EXO_EUNSUPPORTED, "longrope");
    bad("{\"model_type\":\"llama\"," SIZES ",\"rope_scaling\":{\"type\":\"linear\"}}", EXO_EFORMAT, "factor");
    bad("{\"model_type\":\"llama\"," SIZES ",\"rope_scaling\":{\"type\":\"linear\",\"factor\":\"2\"}}",
        EXO_EFORMAT, "rope_scaling.factor");
    bad("{\"model_type\":\"llama\"," SIZES ",\"rope_scaling\":{\"type\":\"linear\",\"factor\":-2}}",
        EXO_EFORMAT, "factor");
    bad("{\"model_type\":\"llama\"," SIZES ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8}}",
        EXO_EFORMAT, "llama3");
    bad("{\"model_type\":\"llama\"," SIZES ",\"rope_parameters\":{\"rope_type\":3}}", EXO_EFORMAT,
        "rope_parameters.rope_type");
    bad("{\"model_type\":\"qwen2\"," SIZES ",\"use_sliding_window\":true,\"sliding_window\":-3}", EXO_EFORMAT,
        "sliding_window");
}

/* ---- loading from disk ---- */

static char tmpdir[64];

static void write_text(const char *name, const char *text)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
}

Test(config, load_dir)
{
    test_tmpdir_make(tmpdir, "cfg_test");
    exo_model_config c;
    exo_err err = {0};
    cr_assert_eq(exo_config_load(tmpdir, &c, &err), EXO_ENOENT);
    cr_assert(strstr(err.msg, "config.json"), "%s", err.msg);

    write_text("config.json", "{\"model_type\":\"qwen3\"," SIZES ",\"eos_token_id\":151645,"
                              "\"quantization\":{\"group_size\":64,\"bits\":4,\"a.b\":false}}");
    cr_assert_eq(exo_config_load(tmpdir, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(c.n_eos, 1);
    cr_assert_eq(c.generation.set, 0);
    exo_config_free(&c);

    write_text("generation_config.json", "{\"eos_token_id\":[151645,151643],\"temperature\":0.7}");
    cr_assert_eq(exo_config_load(tmpdir, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(c.n_eos, 2);
    cr_assert_eq(c.eos_token_ids[1], 151643);
    cr_assert_float_eq(c.generation.temperature, 0.7, 1e-12);
    cr_assert_eq(exo_config_quant_for(&c, "a.b", NULL, NULL), 0);
    exo_config_free(&c);

    /* path to config.json itself */
    char p[256];
    snprintf(p, sizeof p, "%s/config.json", tmpdir);
    cr_assert_eq(exo_config_load(p, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(c.n_eos, 2);
    exo_config_free(&c);

    write_text("generation_config.json", "{\"temperature\":\"hot\"}");
    cr_assert_eq(exo_config_load(tmpdir, &c, &err), EXO_EFORMAT);
    cr_assert(strstr(err.msg, "generation_config.json") && strstr(err.msg, "temperature"), "%s", err.msg);
    cr_assert_null(c.quant.overrides);

    write_text("config.json", "{\"model_type\":\"llama\"");
    cr_assert_eq(exo_config_load(tmpdir, &c, &err), EXO_EFORMAT);
    cr_assert(strstr(err.msg, tmpdir) && strstr(err.msg, "config.json"), "%s", err.msg);
    test_tmpdir_remove(tmpdir);
}

/* Per-layer tables are allocated from the declared layer count before any
 * weight exists: a huge count is refused, not allocated (the config
 * fuzzer's out-of-memory case: 555 M layers). */
Test(config, layer_count_is_bounded)
{
    bad("{\"model_type\":\"llama\"," SIZES_NL ",\"num_hidden_layers\":555555553}", EXO_EFORMAT,
        "\"num_hidden_layers\" 555555553 is more than 4096");
    exo_model_config c = ok("{\"model_type\":\"llama\"," SIZES_NL ",\"num_hidden_layers\":4096}");
    cr_assert_eq(c.num_hidden_layers, 4096);
    exo_config_free(&c);
}
