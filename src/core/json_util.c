/* Strict JSON field readers (see json_util.h). */
#include "core/json_util.h"

#include <math.h>
#include <string.h>

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
    json_t *j = json_loadb(body, len, 0, &je);
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
