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
    } known[] = {{"4bit", 4}, {"8bit", 8}, {"bf16", 16}, {"fp16", 16}};
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
    static const char *const types[] = {"llama", "qwen2", "qwen3", "mistral", "qwen3_moe"};
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
        cr_assert(c->quantization && c->quantization[0], "%s: quantization", id);
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
        /* Not an architectural law, a typo catcher: in every dense model here
         * the KV heads split hidden_size evenly. */
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
         * agree for every model here */
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
        "mlx-community/Qwen3-Next-80B-A3B-Instruct-4bit", /* a hybrid card left out */
        "mlx-community/gpt-oss-20b-MXFP4-Q8",
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
