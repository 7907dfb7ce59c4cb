/* libFuzzer target for config.json / generation_config.json parsing: the
 * input is parsed as a config.json, and applied as a generation_config.json
 * to a fixed valid config. Parsed configs must satisfy the invariants the
 * engine relies on (positive sizes, heads divisible by kv heads, ...). */
// FUZZ_SOURCES: src/engine/config.c src/core/alloc.c src/core/error.c
#include "engine/config.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char base_json[] =
    "{\"model_type\":\"llama\",\"vocab_size\":1000,\"hidden_size\":64,\"intermediate_size\":128,"
    "\"num_hidden_layers\":2,\"num_attention_heads\":8,\"eos_token_id\":[1,2]}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    exo_model_config c;
    exo_err err = {0};
    if (exo_config_parse((const char *)data, size, "fuzz.json", &c, &err) == 0) {
        if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.intermediate_size < 0 ||
            (c.intermediate_size == 0 && c.n_experts <= 0) ||
            c.num_hidden_layers <= 0 || c.num_attention_heads <= 0 ||
            c.num_key_value_heads <= 0 || c.head_dim <= 0 ||
            c.num_attention_heads % c.num_key_value_heads || !(c.rope_theta > 0) ||
            !(c.rms_norm_eps > 0) || c.n_eos < 0 || c.n_eos > EXO_CONFIG_MAX_EOS)
            abort();
        if (c.rope.type != EXO_ROPE_DEFAULT && !(c.rope.factor > 0))
            abort();
        /* the newer families' fields: every layer has a kind the model can run,
         * routing groups divide the experts, a rotary fraction in (0, 1] */
        for (int64_t l = 0; l < c.num_hidden_layers; l++) {
            exo_layer_kind k = exo_config_layer_kind(&c, l);
            if ((k == EXO_LAYER_SLIDING && c.sliding_window <= 0) ||
                (k == EXO_LAYER_LINEAR && (c.linear_k_heads <= 0 || c.linear_v_heads % c.linear_k_heads)))
                abort();
            (void)exo_config_layer_moe(&c, l);
        }
        if (c.n_experts > 0 && (c.n_group <= 0 || c.n_experts % c.n_group || c.topk_group > c.n_group ||
                                c.n_experts_per_tok > c.n_experts))
            abort();
        if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1))
            abort();
        if (c.kv_lora_rank && (c.qk_rope_head_dim <= 0 || c.qk_rope_head_dim % 2 || c.q_lora_rank < 0))
            abort();
        int bits = 0, gs = 0;
        if (exo_config_quant_for(&c, "model.layers.0.mlp.down_proj", &bits, &gs) &&
            (bits < 2 || bits > 8 || gs < 32 || gs > 128))
            abort();
        for (size_t i = 0; i < c.quant.n_overrides; i++)
            (void)exo_config_quant_for(&c, c.quant.overrides[i].module, &bits, &gs);
        exo_config_free(&c);
    } else if (!strstr(err.msg, "fuzz.json")) {
        abort();
    }

    if (exo_config_parse(base_json, sizeof base_json - 1, "base", &c, &err))
        abort();
    if (exo_config_apply_generation(&c, (const char *)data, size, "gen.json", &err) == 0) {
        if (c.n_eos < 0 || c.n_eos > EXO_CONFIG_MAX_EOS)
            abort();
    } else if (!strstr(err.msg, "gen.json")) {
        abort();
    }
    exo_config_free(&c);
    return 0;
}
