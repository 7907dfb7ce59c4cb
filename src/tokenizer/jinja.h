/* A Jinja2 interpreter for Hugging Face chat templates.
 *
 * Chat templates are Jinja2 programs that turn a list of messages into the
 * exact prompt text a model was trained on. Getting one byte wrong changes
 * the tokens the model sees, so this implements the subset of Jinja2 that
 * real templates use with Python Jinja2's semantics (as configured by
 * transformers: trim_blocks, lstrip_blocks, loopcontrols, HF's tojson),
 * checked differentially against Python jinja2 and @huggingface/jinja.
 *
 * Usage: parse once, render many times with a JSON context object whose
 * keys become template variables. Rendering is bounded (output size,
 * recursion depth, evaluation steps) so hostile templates cannot hang or
 * exhaust memory; errors name the template line. */
#ifndef EXO_TOKENIZER_JINJA_H
#define EXO_TOKENIZER_JINJA_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

typedef struct exo_jinja_template exo_jinja_template;

typedef struct exo_jinja_opts {
    /* Seconds since the epoch that strftime_now() formats (local time as
     * UTC); < 0 means the real clock. */
    int64_t now;
    size_t  max_output;     /* bytes; 0 = default (32 MiB) */
    int     max_depth;      /* macro/call nesting; 0 = default (64) */
    uint64_t max_steps;     /* evaluation steps; 0 = default (50M) */
    /* bytes of values (strings, lists, dicts) a render may produce in
     * total, which bounds its memory; 0 = default (8 x max_output) */
    size_t  max_values;
} exo_jinja_opts;

/* Parses template text (trim_blocks and lstrip_blocks on, like HF).
 * Syntax errors return EXO_EFORMAT with "line N: ..." in err. */
int exo_jinja_parse(const char *src, size_t len, exo_jinja_template **out, exo_err *err);

/* Renders with the keys of `context` (a JSON object) as variables. The
 * globals range, namespace, dict, raise_exception and strftime_now are
 * always present. *out is NUL-terminated and owned by the caller
 * (exo_free); *out_len may be NULL. raise_exception() gives EXO_EINVAL
 * with the template's own message. opts may be NULL. */
int exo_jinja_render(const exo_jinja_template *tpl, const json_t *context,
                     const exo_jinja_opts *opts, char **out, size_t *out_len, exo_err *err);

void exo_jinja_free(exo_jinja_template *tpl);

#endif
