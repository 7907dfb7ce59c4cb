/* Shared value types: ids, bounded text, runner statuses (see types.h).
 * The validators run on every decoded record, so they are written for
 * hostile input: no asserts, every bound checked, a message naming the
 * offending field. */
#include "proto/types.h"

#include "core/alloc.h"

#include <jansson.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* ---- ids ---------------------------------------------------------------- */

void exo_id_new(exo_id *out)
{
    uint8_t b[16];
    size_t got = 0;
    while (got < sizeof b) {
        ssize_t n = getrandom(b + got, sizeof b - got, 0);
        if (n <= 0) {
            fprintf(stderr, "exo: getrandom failed\n");
            abort();
        }
        got += (size_t)n;
    }
    b[6] = (uint8_t)((b[6] & 0x0f) | 0x40); /* version 4 */
    b[8] = (uint8_t)((b[8] & 0x3f) | 0x80); /* RFC 4122 variant */
    static const char hex[] = "0123456789abcdef";
    char *p = out->s;
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10)
            *p++ = '-';
        *p++ = hex[b[i] >> 4];
        *p++ = hex[b[i] & 15];
    }
    *p = 0;
}

bool exo_id_valid(const char *s, size_t len)
{
    if (!s || len == 0 || len >= EXO_ID_MAX)
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == ':' || c == '-';
        if (!ok)
            return false;
    }
    return true;
}

int exo_id_set(exo_id *out, const char *s, exo_err *err)
{
    size_t len = s ? strlen(s) : 0;
    if (!exo_id_valid(s, len))
        return exo_err_set(err, EXO_EINVAL, "invalid id \"%.80s\"", s ? s : "(null)");
    memcpy(out->s, s, len + 1);
    return 0;
}

bool exo_id_eq(const exo_id *a, const exo_id *b) { return strcmp(a->s, b->s) == 0; }
bool exo_id_is_empty(const exo_id *id) { return id->s[0] == 0; }

bool exo_model_id_valid(const char *s, size_t len)
{
    if (!s || len == 0 || len >= EXO_MODEL_ID_MAX)
        return false;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f)
            return false;
    return true;
}

bool exo_device_valid(const char *s)
{
    if (!*s || !strcmp(s, "auto") || !strcmp(s, "cpu") || !strcmp(s, "cuda"))
        return true;
    if (strncmp(s, "cuda:", 5) || !s[5] || (s[5] == '0' && s[6]) || strlen(s) > 7)
        return false;
    int n = 0;
    for (const char *c = s + 5; *c; c++) {
        if (*c < '0' || *c > '9')
            return false;
        n = n * 10 + (*c - '0');
    }
    return n < EXO_DEVICE_GPU_MAX;
}

int exo_device_gpu(const char *s)
{
    if (!strcmp(s, "cuda"))
        return 0;
    return exo_device_valid(s) && !strncmp(s, "cuda:", 5) ? atoi(s + 5) : -1;
}

bool exo_text_utf8_valid(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        if (c == 0)
            return false;
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        unsigned cp;
        if ((c & 0xe0) == 0xc0) { n = 1; cp = c & 0x1f; }
        else if ((c & 0xf0) == 0xe0) { n = 2; cp = c & 0x0f; }
        else if ((c & 0xf8) == 0xf0) { n = 3; cp = c & 0x07; }
        else return false;
        if (len - i <= n)
            return false;
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return false;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        /* overlong forms, surrogates, past U+10FFFF */
        if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
            (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
            return false;
        i += n + 1;
    }
    return true;
}

/* ---- runner status names ---------------------------------------------------- */

#define NAME_ITEM(n, s) s,
static const char *const runner_names[] = {EXO_RUNNER_STATUS_MAP(NAME_ITEM)};
#undef NAME_ITEM
_Static_assert(sizeof runner_names / sizeof *runner_names == EXO_RUNNER__COUNT, "table");

const char *exo_runner_status_name(exo_runner_status_kind k)
{
    return (unsigned)k < EXO_RUNNER__COUNT ? runner_names[k] : "?";
}

int exo_runner_status_parse(const char *s, size_t len)
{
    for (int i = 0; i < EXO_RUNNER__COUNT; i++)
        if (strlen(runner_names[i]) == len && memcmp(runner_names[i], s, len) == 0)
            return i;
    return -1;
}

/* ---- string helpers --------------------------------------------------------- */

bool exo__str_eq_null(const char *a, const char *b)
{
    if (!a || !b)
        return a == b;
    return strcmp(a, b) == 0;
}

char *exo__strdup_null(const char *s) { return s ? exo_strdup(s) : NULL; }

int exo__check_text(const char *s, size_t max, const char *what, exo_err *err)
{
    if (!s)
        return 0;
    size_t len = strlen(s);
    if (len > max)
        return exo_err_set(err, EXO_EINVAL, "%s: longer than %zu bytes", what, max);
    if (!exo_text_utf8_valid(s, len))
        return exo_err_set(err, EXO_EINVAL, "%s: not valid UTF-8", what);
    return 0;
}

int exo__check_params_json(const char *s, exo_err *err)
{
    int rc = exo__check_text(s, EXO_PARAMS_MAX, "params", err);
    if (rc < 0)
        return rc;
    json_error_t jerr;
    json_t *j = json_loads(s, JSON_REJECT_DUPLICATES, &jerr);
    bool obj = json_is_object(j);
    json_decref(j);
    if (!obj)
        return exo_err_set(err, EXO_EINVAL, "params are not a JSON object");
    return 0;
}

/* ---- runner status ------------------------------------------------------------ */

void exo_runner_status_init(exo_runner_status *st, exo_runner_status_kind kind)
{
    memset(st, 0, sizeof *st);
    st->kind = kind;
    st->prefill_server_port = -1;
    st->ring_port = -1;
}

void exo_runner_status_copy(exo_runner_status *dst, const exo_runner_status *src)
{
    *dst = *src;
    dst->error_message = exo__strdup_null(src->error_message);
}

void exo_runner_status_clear(exo_runner_status *st)
{
    exo_free(st->error_message);
    memset(st, 0, sizeof *st);
}

bool exo_runner_status_equal(const exo_runner_status *a, const exo_runner_status *b)
{
    return a->kind == b->kind && a->layers_loaded == b->layers_loaded &&
           a->total_layers == b->total_layers && a->prefill_server_port == b->prefill_server_port &&
           a->ring_port == b->ring_port &&
           exo__str_eq_null(a->error_message, b->error_message);
}

int exo_runner_status_validate(const exo_runner_status *st, exo_err *err)
{
    if ((unsigned)st->kind >= EXO_RUNNER__COUNT)
        return exo_err_set(err, EXO_EINVAL, "runner status: unknown kind %d", (int)st->kind);
    if (st->kind == EXO_RUNNER_LOADING) {
        if (st->layers_loaded < 0 || st->total_layers < 0 || st->layers_loaded > st->total_layers)
            return exo_err_set(err, EXO_EINVAL, "runner status Loading: %d of %d layers",
                               (int)st->layers_loaded, (int)st->total_layers);
    } else if (st->layers_loaded != 0 || st->total_layers != 0) {
        return exo_err_set(err, EXO_EINVAL, "runner status %s: layer counts set",
                           exo_runner_status_name(st->kind));
    }
    if (st->prefill_server_port != -1 &&
        (st->kind != EXO_RUNNER_READY || st->prefill_server_port < 1 || st->prefill_server_port > 65535))
        return exo_err_set(err, EXO_EINVAL, "runner status %s: bad prefill server port %d",
                           exo_runner_status_name(st->kind), (int)st->prefill_server_port);
    if (st->ring_port != -1 &&
        (st->kind != EXO_RUNNER_CONNECTING || st->ring_port < 1 || st->ring_port > 65535))
        return exo_err_set(err, EXO_EINVAL, "runner status %s: bad ring port %d",
                           exo_runner_status_name(st->kind), (int)st->ring_port);
    if (st->error_message && st->kind != EXO_RUNNER_FAILED)
        return exo_err_set(err, EXO_EINVAL, "runner status %s: error message set",
                           exo_runner_status_name(st->kind));
    return exo__check_text(st->error_message, EXO_MESSAGE_MAX, "runner status error message", err);
}

