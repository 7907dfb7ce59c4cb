/* Strict field readers for untrusted JSON bodies, shared by the adapters and
 * the gen_types decoders. Every reader distinguishes "absent or null" (not an
 * error; *present = false) from "present with the wrong type" (EXO_EINVAL
 * with a message naming the field), so each API can answer 400 precisely. */
#ifndef EXO_CORE_JSON_UTIL_H
#define EXO_CORE_JSON_UTIL_H

#include "core/error.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

/* The value at key, NULL when absent or JSON null. */
json_t *exo_ju_get(const json_t *obj, const char *key);

int exo_ju_str(const json_t *obj, const char *key, const char **out, bool required, exo_err *err);
int exo_ju_num(const json_t *obj, const char *key, double *out, bool *present, exo_err *err);
int exo_ju_int(const json_t *obj, const char *key, int64_t *out, bool *present, exo_err *err);
int exo_ju_bool(const json_t *obj, const char *key, bool *out, bool *present, exo_err *err);
/* Type-checked container getters: NULL + 0 when absent. */
int exo_ju_array(const json_t *obj, const char *key, json_t **out, bool required, exo_err *err);
int exo_ju_object(const json_t *obj, const char *key, json_t **out, bool required, exo_err *err);
/* Rejects keys outside `allowed` (NULL-terminated). */
int exo_ju_only_keys(const json_t *obj, const char *const *allowed, const char *what, exo_err *err);

/* Parses a request body: object required; invalid JSON / UTF-8 -> EXO_EFORMAT. */
int exo_ju_parse_body(const char *body, size_t len, json_t **out, exo_err *err);

#endif
