/* Hugging Face `tokenizer.json` tokenization, exact.
 *
 * Loads a model directory's tokenizer.json (+ tokenizer_config.json) and
 * encodes/decodes with the same results as HF's Rust `tokenizers` library for
 * the BPE families we ship tests for (Qwen2.5/3, Llama 3/3.x, DeepSeek-V3,
 * GPT-OSS, Mistral Nemo: byte-level BPE; Gemma 3, Mistral v1/Llama 2 style:
 * SentencePiece-style BPE with byte fallback).
 *
 * Input text that is not valid UTF-8 is first converted the way Rust's
 * String::from_utf8_lossy does (every maximal invalid subpart becomes one
 * U+FFFD), so encode(bytes) == HF encode(from_utf8_lossy(bytes)).
 *
 * `add_special` applies the post-processor (e.g. BOS). Special tokens written
 * in the text ("<|im_start|>") are always recognised, as in HF. For tokenizer
 * classes whose transformers implementation rebuilds the post-processor from
 * tokenizer_config (LlamaTokenizer[Fast], GemmaTokenizer[Fast],
 * CodeLlamaTokenizer[Fast]) add_bos_token/add_eos_token decide, as in
 * transformers; otherwise tokenizer.json's post-processor decides.
 *
 * A tokenizer is immutable after load: encode/decode may run on many threads.
 *
 * Example usage:
 *   exo_tokenizer *tok; exo_err err;
 *   if (exo_tokenizer_load("/models/Qwen3-0.6B", &tok, &err)) die(err.msg);
 *   int32_t *ids; size_t n;
 *   exo_tokenizer_encode(tok, "Hello", 5, true, &ids, &n, &err);
 *   char *text = exo_tokenizer_decode(tok, ids, n, false, NULL);
 *   exo_free(ids); exo_free(text); exo_tokenizer_free(tok);
 *
 *   exo_detok_stream *ds = exo_detok_stream_new(tok, true);
 *   for each generated id:
 *       size_t len; const char *piece = exo_detok_stream_push(ds, id, &len);
 *       fwrite(piece, 1, len, stdout);        // always whole UTF-8 chars
 *   piece = exo_detok_stream_flush(ds, &len); // whatever was held back
 *   exo_detok_stream_free(ds);
 */
#ifndef EXO_TOKENIZER_TOKENIZER_H
#define EXO_TOKENIZER_TOKENIZER_H

#include "core/error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct exo_tokenizer exo_tokenizer;

/* dir holds tokenizer.json and optionally tokenizer_config.json. */
int  exo_tokenizer_load(const char *dir, exo_tokenizer **out, exo_err *err);
/* The same from memory; config may be NULL. Used by tests and the fuzzer. */
int  exo_tokenizer_load_mem(const char *json, size_t json_len, const char *config,
                            size_t config_len, exo_tokenizer **out, exo_err *err);
void exo_tokenizer_free(exo_tokenizer *tok);

/* Longest text encode accepts (EXO_ETOOBIG past it). Every buffer of an
 * encode grows by a bounded factor of its text, so this caps them all;
 * chat templates render at most 32 MiB (jinja.h). */
#define EXO_TOKENIZER_MAX_INPUT ((size_t)64 << 20)

/* *ids is allocated with exo_malloc (free with exo_free), even when *n == 0. */
int exo_tokenizer_encode(const exo_tokenizer *tok, const char *text, size_t len,
                         bool add_special, int32_t **ids, size_t *n, exo_err *err);

/* Returns a NUL-terminated exo_malloc'd string (valid UTF-8; may contain NUL
 * bytes, so *out_len, if given, is its length). Unknown ids are skipped, as
 * in HF. skip_special drops added tokens marked special. */
char *exo_tokenizer_decode(const exo_tokenizer *tok, const int32_t *ids, size_t n,
                           bool skip_special, size_t *out_len);

/* -1 if the token is not in the vocabulary (model vocab or added tokens). */
int32_t exo_tokenizer_token_to_id(const exo_tokenizer *tok, const char *token, size_t len);
/* The token's string as written in tokenizer.json ("Ġhello"), or NULL.
 * Not NUL-terminated in general: use *len. */
const char *exo_tokenizer_id_to_token(const exo_tokenizer *tok, int32_t id, size_t *len);
/* Highest id + 1 over the model vocab and the added tokens. */
size_t  exo_tokenizer_vocab_size(const exo_tokenizer *tok);
/* tokenizer_config's bos_token, or -1 when there is none. */
int32_t exo_tokenizer_bos_id(const exo_tokenizer *tok);
/* tokenizer_config's eos_token (0 or 1 ids; generation_config is the
 * engine's business). Returns the count; *ids points into the tokenizer. */
size_t  exo_tokenizer_eos_ids(const exo_tokenizer *tok, const int32_t **ids);
bool    exo_tokenizer_is_special(const exo_tokenizer *tok, int32_t id);

/* Streaming detokenizer: feed generated ids one at a time. Each push returns
 * the new text (possibly empty) in a buffer owned by the stream, valid until
 * the next call. Pieces are always valid UTF-8: a token that ends inside a
 * multi-byte character is held back until the character completes. The
 * concatenation of all pieces plus the flush equals decode(all ids). */
typedef struct exo_detok_stream exo_detok_stream;
exo_detok_stream *exo_detok_stream_new(const exo_tokenizer *tok, bool skip_special);
const char *exo_detok_stream_push(exo_detok_stream *ds, int32_t id, size_t *len);
const char *exo_detok_stream_flush(exo_detok_stream *ds, size_t *len);
void        exo_detok_stream_free(exo_detok_stream *ds);

#endif
