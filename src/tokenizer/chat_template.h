/* Chat templates of Hugging Face model directories.
 *
 * Loads the template the way transformers does (chat_template.jinja wins
 * over tokenizer_config.json's chat_template, which is a string or a list
 * of {name, template}) and renders it with the variables transformers
 * passes: messages, tools (None when absent), documents (None),
 * add_generation_prompt, the special tokens bos/eos/unk/pad_token, extra
 * kwargs such as enable_thinking, and the globals raise_exception and
 * strftime_now. */
#ifndef EXO_TOKENIZER_CHAT_TEMPLATE_H
#define EXO_TOKENIZER_CHAT_TEMPLATE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"

typedef struct exo_chat_template exo_chat_template;

/* Environment variable that pins strftime_now()'s clock for tests:
 * seconds since the epoch, or "YYYY-MM-DD[THH:MM[:SS]]" (UTC). */
#define EXO_CHAT_TEMPLATE_NOW_ENV "EXO_CHAT_TEMPLATE_NOW"

/* Loads from a model directory. EXO_ENOENT when the directory has no
 * template at all. */
int exo_chat_template_load(const char *model_dir, exo_chat_template **out, exo_err *err);

/* From template text and special tokens (either may be NULL). */
int exo_chat_template_from_string(const char *source, const char *bos_token, const char *eos_token,
                                  exo_chat_template **out, exo_err *err);

/* Renders the prompt. tools and extra_kwargs may be NULL; extra_kwargs is a
 * JSON object whose keys become template variables (they override the
 * defaults). *out is NUL-terminated, freed with exo_free. Template errors
 * (including raise_exception) return a negative code with "line N: ..." */
int exo_chat_template_render(const exo_chat_template *t, const json_t *messages, const json_t *tools,
                             bool add_generation_prompt, const json_t *extra_kwargs, char **out,
                             exo_err *err);

/* Pins strftime_now() to `epoch` seconds (UTC); < 0 restores the clock. */
void exo_chat_template_set_now(exo_chat_template *t, int64_t epoch);
/* Renders earlier tool calls' arguments exactly as the messages give them.
 * By default a template that cannot take them as an object (it fails, or
 * writes a Python dict) gets their JSON text instead, found at load. */
void exo_chat_template_keep_arguments(exo_chat_template *t);

/* Parses the EXO_CHAT_TEMPLATE_NOW formats; returns 0 and *epoch or EXO_EINVAL. */
int exo_chat_template_parse_now(const char *s, int64_t *epoch);

const char *exo_chat_template_bos(const exo_chat_template *t);
const char *exo_chat_template_eos(const exo_chat_template *t);

void exo_chat_template_free(exo_chat_template *t);

#endif
