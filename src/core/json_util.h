/* Strict field readers for untrusted JSON bodies, shared by the adapters and
 * the gen_types decoders. Every reader distinguishes "absent or null" (not an
 * error; *present = false) from "present with the wrong type" (EXO_EINVAL
 * with a message naming the field), so each API can answer 400 precisely.
 *
 * Memory. jansson's allocator is ours (installed before main): every block
 * carries a small header saying how big it is and which budget paid for it.
 * A parse tree of untrusted JSON costs up to ~20x its text (an object of one
 * short string is ~300 bytes), so the HTTP layer sets a parse budget for its
 * thread (exo_ju_set_parse_budget) and exo_ju_parse_body charges the tree to
 * it: a body whose tree would not fit is refused, and the tree is paid back
 * when it is freed, on whatever thread. Strings that jansson returns
 * (json_dumps) must be freed with exo_json_free, the allocator that made them. */
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

/* Parses a request body: object required; invalid JSON / UTF-8 -> EXO_EFORMAT.
 * Under a parse budget (below): EXO_ETOOBIG when the tree would exceed the
 * per-parse cap, EXO_EBUSY when the shared budget is spent right now. */
int exo_ju_parse_body(const char *body, size_t len, json_t **out, exo_err *err);

/* Parse trees built on this thread by exo_ju_parse_body are charged to
 * budget (NULL: not charged), and one tree may use at most cap bytes. */
struct exo_budget;
void exo_ju_set_parse_budget(struct exo_budget *budget, size_t cap);

/* json_dumps into exo_malloc memory (free with exo_free); NULL when j is not
 * encodable. Use it instead of json_dumps, whose string belongs to jansson's
 * allocator. */
char *exo_json_dumps(const json_t *j, size_t flags);

#endif
