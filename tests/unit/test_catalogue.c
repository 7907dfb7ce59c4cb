/* The built-in model catalogue: the table's invariants (sorted, unique,
 * well-formed ids, sane dimensions, known model types and dialects, exo's
 * tensor allowlist agreeing with the cards, more bits costing more bytes),
 * find (every entry, misses, prefixes, case, NULL), and spot checks of values
 * read from exo's TOML cards at the commit named in CATALOGUE.md. */
#include "download/catalogue.h"
#include "download/model_store.h"

#include <criterion/criterion.h>
#include <string.h>

TestSuite(catalogue);

static const exo_catalogue_card *must_find(const char *id)
{
    const exo_catalogue_card *c = exo_catalogue_find(id);
    cr_assert_not_null(c, "%s not in the catalogue", id);
    return c;
}

/* Weight bits per quantization label, 0 for one this test does not know. */
static int quant_bits(const char *q)
{
    static const struct {
        const char *name;
        int         bits;
    } known[] = {{"4bit", 4}, {"5bit", 5}, {"6bit", 6}, {"8bit", 8}, {"bf16", 16}, {"fp16", 16}};
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (!strcmp(q, known[i].name))
            return known[i].bits;
    return 0;
}

Test(catalogue, count_and_bounds)
{
    size_t n = exo_catalogue_count();
    cr_assert_gt(n, 0);
    for (size_t i = 0; i < n; i++)
        cr_assert_not_null(exo_catalogue_at(i));
    cr_assert_null(exo_catalogue_at(n));
    cr_assert_null(exo_catalogue_at((size_t)-1));
}

Test(catalogue, sorted_and_unique)
{
    for (size_t i = 1; i < exo_catalogue_count(); i++)
        cr_assert_lt(strcmp(exo_catalogue_at(i - 1)->model_id, exo_catalogue_at(i)->model_id), 0,
                     "%s must come before %s", exo_catalogue_at(i - 1)->model_id,
                     exo_catalogue_at(i)->model_id);
}

Test(catalogue, ids_are_org_slash_name)
{
    for (size_t i = 0; i < exo_catalogue_count(); i++) {
        const char *id = exo_catalogue_at(i)->model_id;
        cr_assert_not_null(id);
        const char *slash = strchr(id, '/');
        cr_assert(slash && slash != id && slash[1] && !strchr(slash + 1, '/'), "%s", id);
        /* the store's rule for ids: safe characters, no "..", "--" or leading '.' */
        char dir[256];
        cr_assert(exo_model_dir_name(id, dir, sizeof dir), "%s", id);
    }
}

Test(catalogue, fields_sane)
{
    static const char *const types[] = {"llama",      "qwen2",   "qwen3",       "mistral", "gemma3",
                                        "qwen3_moe",  "gpt_oss", "glm4_moe",    "qwen3_next",
                                        "qwen3_5",    "qwen3_5_moe", "deepseek_v3", "kimi_k2"};
    static const char *const dialects[] = {"post_last_user", "suffix", "channel", "tool_conditional"};
    for (size_t i = 0; i < exo_catalogue_count(); i++) {
        const exo_catalogue_card *c = exo_catalogue_at(i);
        const char *id = c->model_id;

        bool type_ok = false;
        for (size_t t = 0; t < sizeof types / sizeof *types; t++)
            type_ok |= c->model_type && !strcmp(c->model_type, types[t]);
        cr_assert(type_ok, "%s: model_type %s", id, c->model_type ? c->model_type : "(null)");
        cr_assert(c->family && c->family[0], "%s: family", id);
        cr_assert(c->base_model && c->base_model[0], "%s: base_model", id);
        /* "" only where exo's card says so: Moonshot's native INT4 Kimi releases */
        cr_assert(c->quantization && (c->quantization[0] || !strcmp(c->family, "kimi")), "%s: quantization",
                  id);
        if (c->reasoning_dialect) {
            bool ok = false;
            for (size_t d = 0; d < sizeof dialects / sizeof *dialects; d++)
                ok |= !strcmp(c->reasoning_dialect, dialects[d]);
            cr_assert(ok, "%s: reasoning_dialect %s", id, c->reasoning_dialect);
        }

        cr_assert_gt(c->n_layers, 0, "%s", id);
        cr_assert_leq(c->n_layers, 1024, "%s", id);
        cr_assert_gt(c->hidden_size, 0, "%s", id);
        cr_assert_leq(c->hidden_size, 65536, "%s", id);
        /* Not an architectural law, a typo catcher: in every model here the
         * KV heads split hidden_size evenly (for the MLA models, DeepSeek and
         * Kimi, num_key_value_heads is the attention head count). */
        cr_assert_geq(c->n_kv_heads, 0, "%s", id);
        if (c->n_kv_heads)
            cr_assert(c->n_kv_heads <= c->hidden_size && c->hidden_size % c->n_kv_heads == 0,
                      "%s: %d kv heads, hidden %d", id, c->n_kv_heads, c->hidden_size);
        cr_assert(c->vocab_size == 0 || c->vocab_size >= 256, "%s: vocab %d", id, c->vocab_size);
        cr_assert_geq(c->context_length, 0, "%s", id);
        cr_assert_gt(c->storage_bytes, 0, "%s", id);
        /* at least one hidden-by-hidden matrix per layer at 4 bits */
        cr_assert_geq(c->storage_bytes, (uint64_t)c->n_layers * c->hidden_size * c->hidden_size / 2, "%s",
                      id);

        /* exo's cards and exo's tensor-parallel allowlist (by architecture)
         * agree for every model here but two families (CATALOGUE.md): GLM 4.x
         * (glm4_moe is not on the allowlist; the cards say true, except
         * GLM-4.5-Air-8bit) and Kimi K2 (kimi_k2 is DeepseekV3ForCausalLM,
         * which is on it, but the allowlist here is by model_type). */
        if (strcmp(c->model_type, "glm4_moe") && strcmp(c->model_type, "kimi_k2"))
            cr_assert_eq(c->supports_tensor, exo_model_type_supports_tensor(c->model_type), "%s", id);
    }
}

/* Two quantizations of one base model: the one with more bits is bigger. */
Test(catalogue, more_bits_more_bytes)
{
    size_t pairs = 0;
    for (size_t i = 0; i < exo_catalogue_count(); i++)
        for (size_t j = 0; j < exo_catalogue_count(); j++) {
            const exo_catalogue_card *a = exo_catalogue_at(i), *b = exo_catalogue_at(j);
            if (strcmp(a->base_model, b->base_model))
                continue;
            int ba = quant_bits(a->quantization), bb = quant_bits(b->quantization);
            if (ba && bb && ba < bb) {
                cr_assert_lt(a->storage_bytes, b->storage_bytes, "%s vs %s", a->model_id, b->model_id);
                pairs++;
            }
        }
    cr_assert_gt(pairs, 0);
}

Test(catalogue, find_hits_every_entry)
{
    for (size_t i = 0; i < exo_catalogue_count(); i++) {
        const exo_catalogue_card *c = exo_catalogue_at(i);
        cr_assert_eq(exo_catalogue_find(c->model_id), c, "%s", c->model_id);
        /* a copy of the id, not the table's own pointer */
        char copy[256];
        snprintf(copy, sizeof copy, "%s", c->model_id);
        cr_assert_eq(exo_catalogue_find(copy), c, "%s", c->model_id);
    }
}

Test(catalogue, find_misses)
{
    const char *misses[] = {
        "",
        "/",
        "mlx-community",
        "mlx-community/",
        "mlx-community/Qwen3-0.6B",                  /* a prefix of two ids */
        "mlx-community/Qwen3-0.6B-4bi",              /* a prefix of one */
        "mlx-community/Qwen3-0.6B-4bitx",            /* an id plus more */
        "mlx-community/qwen3-0.6b-4bit",             /* case matters */
        "MLX-COMMUNITY/Llama-3.2-1B-Instruct-4bit",
        "mlx-community/Llama-3.3-70B-Instruct-fp16", /* only the lower-case one exists */
        "Qwen/Qwen3-0.6B",                           /* the upstream repo, not the card */
        "mlx-community/GLM-4.7-Flash-4bit",          /* glm4_moe_lite (MLA): left out */
        "mlx-community/Kimi-K2.5",                   /* kimi_k25 (vision wrapper): left out */
        "mlx-community/DeepSeek-V3.2-4bit",          /* deepseek_v32: left out */
        "mlx-community/gemma-4-31b-it-4bit",         /* gemma4: left out */
        "mlx-community/gpt-oss-20b",                 /* a prefix of a kept id */
        "mlx-community/Qwen3.5-35B-A3B-bf16",        /* exo has no such card */
        "aaa/first",
        "zzz/last",
        " mlx-community/Qwen3-0.6B-4bit",
    };
    for (size_t i = 0; i < sizeof misses / sizeof *misses; i++)
        cr_assert_null(exo_catalogue_find(misses[i]), "'%s' should miss", misses[i]);
    cr_assert_null(exo_catalogue_find(NULL));
}

/* Values read from exo's cards (resources/inference_model_cards/<org>--<name>.toml). */
Test(catalogue, spot_checks)
{
    const exo_catalogue_card *c = must_find("mlx-community/Llama-3.2-1B-Instruct-4bit");
    cr_assert_str_eq(c->model_type, "llama");
    cr_assert_str_eq(c->family, "llama");
    cr_assert_str_eq(c->base_model, "Llama 3.2 1B");
    cr_assert_str_eq(c->quantization, "4bit");
    cr_assert_null(c->reasoning_dialect);
    cr_assert_eq(c->n_layers, 16);
    cr_assert_eq(c->hidden_size, 2048);
    cr_assert_eq(c->n_kv_heads, 8);
    cr_assert_eq(c->vocab_size, 128256); /* config.json */
    cr_assert_eq(c->context_length, 131072);
    cr_assert_eq(c->storage_bytes, 729808896);
    cr_assert(c->supports_tensor);
    cr_assert_not(c->supports_thinking);
    cr_assert_not(c->supports_tools);

    c = must_find("mlx-community/Qwen3-0.6B-8bit");
    cr_assert_str_eq(c->model_type, "qwen3");
    cr_assert_str_eq(c->family, "qwen");
    cr_assert_str_eq(c->base_model, "Qwen3 0.6B");
    cr_assert_str_eq(c->quantization, "8bit");
    cr_assert_null(c->reasoning_dialect); /* this card names none */
    cr_assert_eq(c->n_layers, 28);
    cr_assert_eq(c->hidden_size, 1024);
    cr_assert_eq(c->n_kv_heads, 8);
    cr_assert_eq(c->vocab_size, 151936); /* config.json */
    cr_assert_eq(c->context_length, 32768);
    cr_assert_eq(c->storage_bytes, 698351616);
    cr_assert_not(c->supports_tensor);
    cr_assert(c->supports_thinking);

    c = must_find("mlx-community/Qwen3-30B-A3B-4bit");
    cr_assert_str_eq(c->model_type, "qwen3_moe");
    cr_assert_eq(c->n_layers, 48);
    cr_assert_eq(c->n_kv_heads, 4);
    cr_assert_eq(c->storage_bytes, 17612931072ull);
    cr_assert(c->supports_tensor);
    cr_assert(c->supports_thinking);

    c = must_find("mlx-community/llama-3.3-70b-instruct-fp16");
    cr_assert_str_eq(c->quantization, "fp16");
    cr_assert_eq(c->n_layers, 80);
    cr_assert_eq(c->hidden_size, 8192);
    cr_assert_eq(c->storage_bytes, 144383672320ULL);

    /* a card without num_key_value_heads whose config.json was checked */
    c = must_find("mlx-community/Llama-3.1-Nemotron-70B-Instruct-HF-4bit");
    cr_assert_eq(c->n_kv_heads, 8);
    cr_assert_eq(c->storage_bytes, 39688355840ULL);
    /* a card whose dimensions could not be verified is left out, not guessed */
    cr_assert_null(exo_catalogue_find("mlx-community/Llama-3.1-Nemotron-Nano-4B-v1.1-bf16"));
}

/* Every field of c against an expected card (strings by value). */
static void expect_card(const exo_catalogue_card *want)
{
    const exo_catalogue_card *c = must_find(want->model_id);
    const char *id = want->model_id;
    cr_assert_str_eq(c->model_type, want->model_type, "%s", id);
    cr_assert_str_eq(c->family, want->family, "%s", id);
    cr_assert_str_eq(c->base_model, want->base_model, "%s", id);
    cr_assert_str_eq(c->quantization, want->quantization, "%s", id);
    if (want->reasoning_dialect)
        cr_assert(c->reasoning_dialect && !strcmp(c->reasoning_dialect, want->reasoning_dialect), "%s", id);
    else
        cr_assert_null(c->reasoning_dialect, "%s", id);
    cr_assert_eq(c->n_layers, want->n_layers, "%s", id);
    cr_assert_eq(c->hidden_size, want->hidden_size, "%s", id);
    cr_assert_eq(c->n_kv_heads, want->n_kv_heads, "%s", id);
    cr_assert_eq(c->vocab_size, want->vocab_size, "%s", id);
    cr_assert_eq(c->context_length, want->context_length, "%s", id);
    cr_assert_eq(c->storage_bytes, want->storage_bytes, "%s", id);
    cr_assert_eq(c->supports_tensor, want->supports_tensor, "%s", id);
    cr_assert_eq(c->supports_thinking, want->supports_thinking, "%s", id);
    cr_assert_eq(c->supports_tools, want->supports_tools, "%s", id);
}

/* One or two cards per architecture added after the dense / qwen3_moe ones:
 * every value as exo's TOML card says (vocab_size: the model's config.json,
 * CATALOGUE.md), model_type as the checkpoint's config.json says. */
Test(catalogue, spot_checks_newer_architectures)
{
    static const exo_catalogue_card want[] = {
        /* qwen3_next: Instruct has no "thinking", Thinking has; the two 8-bit cards share a size */
        {.model_id = "mlx-community/Qwen3-Next-80B-A3B-Instruct-4bit", .model_type = "qwen3_next",
         .family = "qwen", .base_model = "Qwen3 Next 80B", .quantization = "4bit", .n_layers = 48,
         .hidden_size = 2048, .n_kv_heads = 2, .vocab_size = 151936, .context_length = 262144,
         .storage_bytes = 46976204800ULL, .supports_tensor = true},
        {.model_id = "mlx-community/Qwen3-Next-80B-A3B-Thinking-8bit", .model_type = "qwen3_next",
         .family = "qwen", .base_model = "Qwen3 Next 80B", .quantization = "8bit",
         .reasoning_dialect = "post_last_user", .n_layers = 48, .hidden_size = 2048, .n_kv_heads = 2,
         .vocab_size = 151936, .context_length = 262144, .storage_bytes = 88814387200ULL,
         .supports_tensor = true, .supports_thinking = true},
        /* Qwen3-Coder-Next is Qwen3-Next's architecture; "code" is not "tools";
         * no copy of its config.json could be read: vocab_size 0 (unknown) */
        {.model_id = "mlx-community/Qwen3-Coder-Next-6bit", .model_type = "qwen3_next", .family = "qwen",
         .base_model = "Qwen3 Coder Next", .quantization = "6bit", .n_layers = 48, .hidden_size = 2048,
         .n_kv_heads = 2, .vocab_size = 0, .context_length = 262144, .storage_bytes = 68899327465ULL,
         .supports_tensor = true},
        /* qwen3_5 (dense) */
        {.model_id = "mlx-community/Qwen3.5-2B-MLX-8bit", .model_type = "qwen3_5", .family = "qwen",
         .base_model = "Qwen3.5 2B", .quantization = "8bit", .reasoning_dialect = "post_last_user",
         .n_layers = 24, .hidden_size = 2048, .n_kv_heads = 2, .vocab_size = 248320, .context_length = 262144,
         .storage_bytes = 2662787264ULL, .supports_tensor = true, .supports_thinking = true},
        {.model_id = "mlx-community/Qwen3.5-9B-4bit", .model_type = "qwen3_5", .family = "qwen",
         .base_model = "Qwen3.5 9B", .quantization = "4bit", .reasoning_dialect = "post_last_user",
         .n_layers = 32, .hidden_size = 4096, .n_kv_heads = 4, .vocab_size = 248320, .context_length = 262144,
         .storage_bytes = 5950062560ULL, .supports_tensor = true, .supports_thinking = true},
        {.model_id = "mlx-community/Qwen3.5-27B-8bit", .model_type = "qwen3_5", .family = "qwen",
         .base_model = "Qwen3.5 27B", .quantization = "8bit", .reasoning_dialect = "post_last_user",
         .n_layers = 64, .hidden_size = 5120, .n_kv_heads = 4, .vocab_size = 248320, .context_length = 262144,
         .storage_bytes = 29500943328ULL, .supports_tensor = true, .supports_thinking = true},
        /* qwen3_5_moe, Qwen3.5 and Qwen3.6 */
        {.model_id = "mlx-community/Qwen3.5-35B-A3B-4bit", .model_type = "qwen3_5_moe", .family = "qwen",
         .base_model = "Qwen3.5 35B A3B", .quantization = "4bit", .reasoning_dialect = "post_last_user",
         .n_layers = 40, .hidden_size = 2048, .n_kv_heads = 2, .vocab_size = 248320, .context_length = 262144,
         .storage_bytes = 20391405152ULL, .supports_tensor = true, .supports_thinking = true},
        {.model_id = "mlx-community/Qwen3.5-35B-A3B-8bit", .model_type = "qwen3_5_moe", .family = "qwen",
         .base_model = "Qwen3.5 35B A3B", .quantization = "8bit", .reasoning_dialect = "post_last_user",
         .n_layers = 40, .hidden_size = 2048, .n_kv_heads = 2, .vocab_size = 248320, .context_length = 262144,
         .storage_bytes = 37721130592ULL, .supports_tensor = true, .supports_thinking = true},
        {.model_id = "mlx-community/Qwen3.6-35B-A3B-5bit", .model_type = "qwen3_5_moe", .family = "qwen",
         .base_model = "Qwen3.6 35B A3B", .quantization = "5bit", .reasoning_dialect = "post_last_user",
         .n_layers = 40, .hidden_size = 2048, .n_kv_heads = 2, .vocab_size = 248320, .context_length = 262144,
         .storage_bytes = 24731729632ULL, .supports_tensor = true, .supports_thinking = true},
        /* gpt_oss */
        {.model_id = "mlx-community/gpt-oss-20b-MXFP4-Q8", .model_type = "gpt_oss", .family = "gpt-oss",
         .base_model = "GPT-OSS 20B", .quantization = "MXFP4-Q8", .reasoning_dialect = "channel",
         .n_layers = 24, .hidden_size = 2880, .n_kv_heads = 8, .vocab_size = 201088, .context_length = 131072,
         .storage_bytes = 12025908224ULL, .supports_tensor = true, .supports_thinking = true},
        {.model_id = "mlx-community/gpt-oss-120b-MXFP4-Q8", .model_type = "gpt_oss", .family = "gpt-oss",
         .base_model = "GPT-OSS 120B", .quantization = "MXFP4-Q8", .reasoning_dialect = "channel",
         .n_layers = 36, .hidden_size = 2880, .n_kv_heads = 8, .vocab_size = 201088, .context_length = 131072,
         .storage_bytes = 70652212224ULL, .supports_tensor = true, .supports_thinking = true},
        /* glm4_moe: the Air 8-bit card is exo's one without tensor parallelism */
        {.model_id = "mlx-community/GLM-4.5-Air-8bit", .model_type = "glm4_moe", .family = "glm",
         .base_model = "GLM 4.5 Air", .quantization = "8bit", .reasoning_dialect = "post_last_user",
         .n_layers = 46, .hidden_size = 4096, .n_kv_heads = 8, .vocab_size = 151552, .context_length = 131072,
         .storage_bytes = 122406567936ULL, .supports_tensor = false, .supports_thinking = true},
        {.model_id = "mlx-community/GLM-4.5-Air-bf16", .model_type = "glm4_moe", .family = "glm",
         .base_model = "GLM 4.5 Air", .quantization = "bf16", .reasoning_dialect = "post_last_user",
         .n_layers = 46, .hidden_size = 4096, .n_kv_heads = 8, .vocab_size = 151552, .context_length = 131072,
         .storage_bytes = 229780750336ULL, .supports_tensor = true, .supports_thinking = true},
        /* the card's n_layers is 91 (config.json: 92; CATALOGUE.md); 8bit-gs32 is "8bit" */
        {.model_id = "mlx-community/GLM-4.7-8bit-gs32", .model_type = "glm4_moe", .family = "glm",
         .base_model = "GLM 4.7", .quantization = "8bit", .reasoning_dialect = "post_last_user",
         .n_layers = 91, .hidden_size = 5120, .n_kv_heads = 8, .vocab_size = 151552, .context_length = 202752,
         .storage_bytes = 396963397248ULL, .supports_tensor = true, .supports_thinking = true},
        /* deepseek_v3: num_key_value_heads 128 (MLA: the head count) */
        {.model_id = "mlx-community/DeepSeek-V3.1-4bit", .model_type = "deepseek_v3", .family = "deepseek",
         .base_model = "DeepSeek V3.1", .quantization = "4bit", .reasoning_dialect = "post_last_user",
         .n_layers = 61, .hidden_size = 7168, .n_kv_heads = 128, .vocab_size = 129280, .context_length = 131072,
         .storage_bytes = 405874409472ULL, .supports_tensor = true, .supports_thinking = true},
        {.model_id = "mlx-community/DeepSeek-V3.1-8bit", .model_type = "deepseek_v3", .family = "deepseek",
         .base_model = "DeepSeek V3.1", .quantization = "8bit", .reasoning_dialect = "post_last_user",
         .n_layers = 61, .hidden_size = 7168, .n_kv_heads = 128, .vocab_size = 129280, .context_length = 131072,
         .storage_bytes = 765577920512ULL, .supports_tensor = true, .supports_thinking = true},
        /* kimi_k2 (DeepSeek-V3's architecture) */
        {.model_id = "mlx-community/Kimi-K2-Instruct-4bit", .model_type = "kimi_k2", .family = "kimi",
         .base_model = "Kimi K2", .quantization = "4bit", .n_layers = 61, .hidden_size = 7168, .n_kv_heads = 64,
         .vocab_size = 163840, .context_length = 131072, .storage_bytes = 620622774272ULL,
         .supports_tensor = true},
        {.model_id = "mlx-community/Kimi-K2-Thinking", .model_type = "kimi_k2", .family = "kimi",
         .base_model = "Kimi K2", .quantization = "", .reasoning_dialect = "suffix", .n_layers = 61,
         .hidden_size = 7168, .n_kv_heads = 64, .vocab_size = 163840, .context_length = 262144,
         .storage_bytes = 706522120192ULL, .supports_tensor = true, .supports_thinking = true},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        expect_card(&want[i]);
}

/* The cards this catalogue takes from exo for each newer architecture, by
 * count, so that a refresh that drops or adds one is noticed. */
Test(catalogue, newer_architectures_counts)
{
    static const struct {
        const char *model_type;
        size_t      n;
    } want[] = {{"qwen3_next", 9}, {"qwen3_5", 8},     {"qwen3_5_moe", 13}, {"gpt_oss", 2},
                {"glm4_moe", 5},   {"deepseek_v3", 2}, {"kimi_k2", 2},      {"gemma3", 0}};
    for (size_t t = 0; t < sizeof want / sizeof *want; t++) {
        size_t n = 0;
        for (size_t i = 0; i < exo_catalogue_count(); i++)
            n += !strcmp(exo_catalogue_at(i)->model_type, want[t].model_type);
        cr_assert_eq(n, want[t].n, "%s: %zu cards, expected %zu", want[t].model_type, n, want[t].n);
    }
    cr_assert_eq(exo_catalogue_count(), 58);
}
