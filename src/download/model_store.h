/* The models this node has on disk: a scan of the models directories in
 * exo's layout, where <models_dir>/<org>--<name>/ holds the Hugging Face
 * repository org/name (config.json, *.safetensors, tokenizer files). A
 * directory without a readable config.json (a JSON object) is not a model
 * (skipped, logged at debug level), nor is a name that is not the
 * exo_model_dir_name of a valid id; the first models dir that has a model
 * id wins (a broken copy in an earlier dir does not hide a good one).
 *
 * A store is an immutable snapshot: rescan to see changes. Scans are cheap
 * (readdir, stat and one small config.json parse per model), so the node
 * rescans whenever it needs a fresh view (GET /models, placement).
 *
 * What is read per model (missing fields stay 0 / empty / false):
 *   config.json: dimensions from "text_config" first, then the top level:
 *     num_hidden_layers (or num_layers, n_layer, n_layers,
 *     num_decoder_layers, decoder_layers), hidden_size (d_model, n_embd),
 *     num_key_value_heads (default num_attention_heads / n_head),
 *     max_position_embeddings (n_positions) -> context_length;
 *     model_type from the top level first (a VL wrapper's "qwen3_vl", not
 *     its text model's), kept only if it is [A-Za-z0-9._-];
 *     "quantization" or "quantization_config" {bits} -> "4bit"/"8bit"...,
 *     or a short quant_method ("fp8", "mxfp4"); else torch_dtype / dtype ->
 *     "bf16", "fp16", "fp32";
 *   storage_bytes: the sum of the sizes of *.safetensors files in the dir;
 *   has_tokenizer: tokenizer.json exists; chat template: chat_template.jinja
 *     exists or tokenizer_config.json has "chat_template";
 *     supports_tools: that template text mentions "tools";
 *     supports_thinking: it mentions "enable_thinking" or "<think>";
 *   created: the directory's mtime (Unix seconds). */
#ifndef EXO_DOWNLOAD_MODEL_STORE_H
#define EXO_DOWNLOAD_MODEL_STORE_H

#include "core/error.h"
#include "core/paths.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct exo_model_entry {
    char    id[256];           /* "org/name" */
    char   *dir;               /* owned, absolute path of the model dir */
    bool    read_only;         /* found in a read-only models dir */
    char    model_type[64];    /* config.json model_type */
    char    quantization[16];  /* "4bit", "8bit", "bf16", "fp16", "fp32", "" */
    int64_t storage_bytes;
    int     n_layers, hidden_size, n_kv_heads, vocab_size;
    int64_t context_length;
    bool    has_tokenizer, has_chat_template, supports_tools, supports_thinking;
    int64_t created;
} exo_model_entry;

typedef struct exo_model_store exo_model_store;

/* Scans the dirs in order. Never fails on bad model dirs (they are skipped);
 * errors only for OOM-like conditions (none today): always returns a store. */
exo_model_store *exo_model_store_scan(const exo_models_dir *dirs, int n_dirs);
void             exo_model_store_free(exo_model_store *s);

size_t                 exo_model_store_count(const exo_model_store *s);
const exo_model_entry *exo_model_store_at(const exo_model_store *s, size_t i); /* sorted by id */
const exo_model_entry *exo_model_store_find(const exo_model_store *s, const char *model_id);

/* Fills the config.json fields of m (the list at the top of this file)
 * from a parsed config.json; the rest of m is left as it is. */
void exo_model_entry_from_config(const json_t *config, exo_model_entry *m);

/* exo's tensor-parallel allowlist (by architecture class, as model_type). */
bool exo_model_type_supports_tensor(const char *model_type);

/* The directory name for a model id ("org/name" -> "org--name"); false if
 * the id is not of the form org/name with both parts non-empty and of safe
 * characters ([A-Za-z0-9._-], no "..", no leading '.'), if a part contains
 * "--" (the dir name would not map back to one id; the Hugging Face hub
 * forbids it too), if it is longer than exo_model_entry.id holds, or if the
 * name does not fit in cap bytes. */
bool exo_model_dir_name(const char *model_id, char *out, size_t cap);

/* One /v1/models entry, exo's shape: {id, object:"model", created,
 * owned_by:"exo", hugging_face_id (= id), name (the part after '/'),
 * description:"", context_length, tags:[], storage_size_megabytes (MiB,
 * rounded to nearest, as exo's Memory.in_mb), supports_tensor (model_type
 * in exo's tensor-parallel architecture allowlist), tasks:["TextGeneration"],
 * is_custom:false, family (model_type up to its first '_', digits kept:
 * "qwen3_moe" -> "qwen3", "llama" -> "llama"), quantization, base_model
 * (= name; there is no model card to say better), capabilities (["text"] +
 * "thinking" + "tools" as supported), reasoning_dialect:null}. */
json_t *exo_model_entry_to_json(const exo_model_entry *m);

#endif
