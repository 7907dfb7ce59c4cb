/* catalogue.h — the model cards built into exo (from exo's resources; see CATALOGUE.md)
 *
 * What: a fixed, read-only table of the models this engine knows before
 * anything is downloaded: exo's own model cards (exo-explore/exo,
 * resources/inference_model_cards/<org>--<name>.toml), restricted to
 * text-generation cards whose architecture this engine runs today (llama,
 * qwen3, qwen3_moe, qwen3_next, qwen3_5(_moe), gpt_oss, glm4_moe,
 * deepseek_v3 / kimi_k2; qwen2, mistral and gemma3 when exo ships such
 * cards). Each entry says how big the
 * model is on disk and how it is shaped, so that placement and the model list
 * can reason about a model that no node has yet.
 *
 * Why built in: exo ships its cards as data files next to the Python code;
 * a single C binary carries them as a static table instead (no files to find
 * at run time, nothing to parse, nothing that can be missing or malformed).
 * The model store (model_store.h) stays the authority for what is on disk;
 * the catalogue only says what could be.
 *
 * Where the values come from: every field is the card's own value, except
 * model_type (the card does not say; decided from family / base_model / name,
 * see CATALOGUE.md) and, where the card lacks them, n_kv_heads and
 * vocab_size (taken from the model's config.json where that could be
 * checked, else 0). CATALOGUE.md lists the source commit, the cards left out
 * and why, and how to refresh the table.
 *
 * Flags:
 *   supports_tensor    the card's supports_tensor;
 *   supports_thinking  the card's capabilities contain "thinking";
 *   supports_tools     the card's capabilities contain "tools". exo's cards
 *                      do not use that word today (its closest, "code", marks
 *                      coding models, not tool calling), so this is false for
 *                      every entry: false means "the card does not say"; the
 *                      downloaded model's chat template
 *                      (exo_model_entry.supports_tools) is the authority. */
#ifndef EXO_DOWNLOAD_CATALOGUE_H
#define EXO_DOWNLOAD_CATALOGUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct exo_catalogue_card {
    const char *model_id;          /* "mlx-community/Llama-3.2-1B-Instruct-4bit" */
    const char *model_type;        /* "llama" | "qwen2" | "qwen3" | "mistral" */
    const char *family;            /* exo's family, e.g. "llama", "qwen" */
    const char *base_model;        /* exo's base_model text */
    const char *quantization;      /* "4bit", "8bit", "bf16", ... as in the card */
    const char *reasoning_dialect; /* NULL when none */
    int32_t     n_layers, hidden_size, n_kv_heads, vocab_size; /* 0: unknown */
    int64_t     context_length;    /* 0: unknown */
    uint64_t    storage_bytes;     /* the card's [storage_size] in_bytes */
    bool        supports_tensor, supports_thinking, supports_tools;
} exo_catalogue_card;

/* The number of cards; constant for the life of the program. */
size_t exo_catalogue_count(void);

/* Card i (0 <= i < count), in strcmp order of model_id; NULL past the end.
 * The pointer is to static storage and stays valid forever. */
const exo_catalogue_card *exo_catalogue_at(size_t i);

/* The card whose model_id is exactly model_id (strcmp: case-sensitive, as
 * exo_model_store_find); NULL if there is none or model_id is NULL. Binary
 * search over the sorted table. */
const exo_catalogue_card *exo_catalogue_find(const char *model_id);

#endif
