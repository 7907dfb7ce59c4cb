/* Strict JSON field readers and jansson's allocator (see json_util.h). */
#include "core/json_util.h"

#include "core/alloc.h"
#include "core/budget.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- jansson's allocator ---------------------------------------------------------- */

/* 16 bytes keep malloc's alignment for what follows the header. */
typedef struct json_block {
    size_t      size;   /* header included */
    exo_budget *budget; /* charged to, or NULL */
} json_block;

_Static_assert(sizeof(json_block) == 16, "the header must keep 16-byte alignment");

static _Thread_local exo_budget *parse_budget;
static _Thread_local size_t      parse_cap;
static _Thread_local bool        parsing;     /* charge only the tree of a body */
static _Thread_local size_t      parse_used;
static _Thread_local int         parse_refusal; /* 0, EXO_ETOOBIG or EXO_EBUSY */

static void *json_block_alloc(size_t n)
{
    size_t total = n + sizeof(json_block);
    if (total < n)
        return NULL;
    exo_budget *b = parsing ? parse_budget : NULL;
    if (b) {
        if (parse_used + total > parse_cap) {
            parse_refusal = EXO_ETOOBIG;
            return NULL;
        }
        if (!exo_budget_charge(b, total)) {
            parse_refusal = EXO_EBUSY;
            return NULL;
        }
        parse_used += total;
    }
    json_block *h = malloc(total);
    if (!h) {
        if (b)
            exo_budget_release(b, total);
        return NULL;
    }
    h->size = total;
    h->budget = b;
    return h + 1;
}

static void json_block_free(void *p)
{
    if (!p)
        return;
    json_block *h = (json_block *)p - 1;
    if (h->budget)
        exo_budget_release(h->budget, h->size);
    free(h);
}

/* jansson requires its allocator before its first allocation, and the unit
 * tests have no common main(): a constructor runs before either. */
__attribute__((constructor)) static void install_json_allocator(void)
{
    json_set_alloc_funcs(json_block_alloc, json_block_free);
}

char *exo_json_dumps(const json_t *j, size_t flags)
{
    char *s = json_dumps(j, flags);
    if (!s)
        return NULL;
    char *copy = exo_strdup(s);
    json_block_free(s);
    return copy;
}

void exo_ju_set_parse_budget(exo_budget *budget, size_t cap)
{
    parse_budget = budget;
    parse_cap = cap;
}

json_t *exo_ju_get(const json_t *obj, const char *key)
{
    json_t *v = json_is_object(obj) ? json_object_get(obj, key) : NULL;
    return v && !json_is_null(v) ? v : NULL;
}

int exo_ju_str(const json_t *obj, const char *key, const char **out, bool required, exo_err *err)
{
    json_t *v = exo_ju_get(obj, key);
    if (!v) {
        if (required)
            return exo_err_set(err, EXO_EINVAL, "'%s' is required", key);
        return 0;
    }
    if (!json_is_string(v))
        return exo_err_set(err, EXO_EINVAL, "'%s' must be a string", key);
    if (strlen(json_string_value(v)) != json_string_length(v))
        return exo_err_set(err, EXO_EINVAL, "'%s' must not contain NUL characters", key);
    *out = json_string_value(v);
    return 0;
}

int exo_ju_num(const json_t *obj, const char *key, double *out, bool *present, exo_err *err)
{
    json_t *v = exo_ju_get(obj, key);
    if (present)
        *present = v != NULL;
    if (!v)
        return 0;
    if (!json_is_number(v) || json_is_boolean(v))
        return exo_err_set(err, EXO_EINVAL, "'%s' must be a number", key);
    double d = json_number_value(v);
    if (!isfinite(d))
        return exo_err_set(err, EXO_EINVAL, "'%s' must be finite", key);
    *out = d;
    return 0;
}

int exo_ju_int(const json_t *obj, const char *key, int64_t *out, bool *present, exo_err *err)
{
    json_t *v = exo_ju_get(obj, key);
    if (present)
        *present = v != NULL;
    if (!v)
        return 0;
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return 0;
    }
    /* 5.0 is an integer to Python clients' JSON encoders. */
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (isfinite(d) && d == floor(d) && fabs(d) < 9e15) {
            *out = (int64_t)d;
            return 0;
        }
    }
    return exo_err_set(err, EXO_EINVAL, "'%s' must be an integer", key);
}

int exo_ju_bool(const json_t *obj, const char *key, bool *out, bool *present, exo_err *err)
{
    json_t *v = exo_ju_get(obj, key);
    if (present)
        *present = v != NULL;
    if (!v)
        return 0;
    if (!json_is_boolean(v))
        return exo_err_set(err, EXO_EINVAL, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

int exo_ju_array(const json_t *obj, const char *key, json_t **out, bool required, exo_err *err)
{
    json_t *v = exo_ju_get(obj, key);
    *out = NULL;
    if (!v)
        return required ? exo_err_set(err, EXO_EINVAL, "'%s' is required", key) : 0;
    if (!json_is_array(v))
        return exo_err_set(err, EXO_EINVAL, "'%s' must be an array", key);
    *out = v;
    return 0;
}

int exo_ju_object(const json_t *obj, const char *key, json_t **out, bool required, exo_err *err)
{
    json_t *v = exo_ju_get(obj, key);
    *out = NULL;
    if (!v)
        return required ? exo_err_set(err, EXO_EINVAL, "'%s' is required", key) : 0;
    if (!json_is_object(v))
        return exo_err_set(err, EXO_EINVAL, "'%s' must be an object", key);
    *out = v;
    return 0;
}

int exo_ju_only_keys(const json_t *obj, const char *const *allowed, const char *what, exo_err *err)
{
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)obj, k, v) {
        bool ok = false;
        for (const char *const *a = allowed; *a && !ok; a++)
            ok = strcmp(*a, k) == 0;
        if (!ok)
            return exo_err_set(err, EXO_EINVAL, "%s: unknown field '%.64s'", what, k);
    }
    return 0;
}

int exo_ju_parse_body(const char *body, size_t len, json_t **out, exo_err *err)
{
    json_error_t je;
    *out = NULL;
    parsing = true;
    parse_used = 0;
    parse_refusal = 0;
    json_t *j = json_loadb(body, len, 0, &je);
    parsing = false;
    if (!j && parse_refusal == EXO_ETOOBIG)
        return exo_err_set(err, EXO_ETOOBIG,
                           "the request body is too complex: parsing it would take more than %zu MiB",
                           parse_cap >> 20);
    if (!j && parse_refusal == EXO_EBUSY)
        return exo_err_set(err, EXO_EBUSY, "the server is short of request memory; retry shortly");
    if (!j)
        return exo_err_set(err, EXO_EFORMAT, "invalid JSON body: %s (line %d, column %d)", je.text,
                           je.line, je.column);
    if (!json_is_object(j)) {
        json_decref(j);
        return exo_err_set(err, EXO_EFORMAT, "request body must be a JSON object");
    }
    *out = j;
    return 0;
}
