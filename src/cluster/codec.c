/* The record codec (see codec.h): scalar field types, the generic loops
 * over field tables, envelopes and the msgpack pre-scan. */
#include "cluster/codec.h"

#include "core/alloc.h"
#include "proto/types.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

typedef const msgpack_object mobj;

#define AT(v, T) (*(T *)(v))
#define CAT(v, T) (*(const T *)(v))

/* ---- structural pre-scan ---------------------------------------------------- */

static uint64_t be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

int exo_mp_scan(const uint8_t *buf, size_t len, size_t *pos, int depth)
{
    if (depth > EXO_MP_MAX_DEPTH || *pos >= len)
        return -1;
    uint8_t c = buf[(*pos)++];
    size_t left = len - *pos;
    uint64_t skip = 0, items = 0;
    int hdr = 0;
    if (c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3)
        return 0;
    if (c >= 0x80 && c <= 0x8f) items = 2u * (c & 0x0fu);
    else if (c >= 0x90 && c <= 0x9f) items = c & 0x0fu;
    else if (c >= 0xa0 && c <= 0xbf) skip = c & 0x1fu;
    else {
        switch (c) {
        case 0xc4: case 0xd9: hdr = 1; break;  /* bin8 / str8 */
        case 0xc5: case 0xda: hdr = 2; break;
        case 0xc6: case 0xdb: hdr = 4; break;
        case 0xca: skip = 4; break;
        case 0xcb: skip = 8; break;
        case 0xcc: case 0xd0: skip = 1; break;
        case 0xcd: case 0xd1: skip = 2; break;
        case 0xce: case 0xd2: skip = 4; break;
        case 0xcf: case 0xd3: skip = 8; break;
        case 0xdc: case 0xdd: case 0xde: case 0xdf: {
            int n = (c == 0xdc || c == 0xde) ? 2 : 4;
            if (left < (size_t)n)
                return -1;
            items = be(buf + *pos, n) * ((c == 0xde || c == 0xdf) ? 2 : 1);
            *pos += (size_t)n;
            left -= (size_t)n;
            break;
        }
        default: return -1;  /* 0xc1, ext types */
        }
        if (hdr) {
            if (left < (size_t)hdr)
                return -1;
            skip = be(buf + *pos, hdr);
            *pos += (size_t)hdr;
            left -= (size_t)hdr;
        }
    }
    if (skip) {
        if (skip > left)
            return -1;
        *pos += (size_t)skip;
        return 0;
    }
    if (items > left)
        return -1;
    for (uint64_t i = 0; i < items; i++)
        if (exo_mp_scan(buf, len, pos, depth + 1) < 0)
            return -1;
    return 0;
}

/* ---- object access -------------------------------------------------------------- */

static bool key_is(mobj *k, const char *key)
{
    size_t n = strlen(key);
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n && memcmp(k->via.str.ptr, key, n) == 0;
}

int exo_mp_check_map(mobj *o, const char *what, exo_err *err)
{
    if (!o || o->type != MSGPACK_OBJECT_MAP)
        return exo_err_set(err, EXO_EFORMAT, "%s: not a map", what);
    uint32_t n = o->via.map.size;
    if (n > EXO_MP_MAX_KEYS)
        return exo_err_set(err, EXO_EFORMAT, "%s: %u keys", what, n);
    for (uint32_t i = 0; i < n; i++) {
        mobj *k = &o->via.map.ptr[i].key;
        if (k->type != MSGPACK_OBJECT_STR)
            return exo_err_set(err, EXO_EFORMAT, "%s: non-string key", what);
        for (uint32_t j = 0; j < i; j++) {
            mobj *q = &o->via.map.ptr[j].key;
            if (q->via.str.size == k->via.str.size && (k->via.str.size == 0 ||
                memcmp(q->via.str.ptr, k->via.str.ptr, k->via.str.size) == 0))
                return exo_err_set(err, EXO_EFORMAT, "%s: duplicate key \"%.*s\"", what,
                                   (int)(k->via.str.size > 64 ? 64 : k->via.str.size),
                                   k->via.str.ptr ? k->via.str.ptr : "");
        }
    }
    return 0;
}

mobj *exo_mp_get(mobj *map, const char *key)
{
    for (uint32_t i = 0; i < map->via.map.size; i++)
        if (key_is(&map->via.map.ptr[i].key, key))
            return &map->via.map.ptr[i].val;
    return NULL;
}

int exo_mp_field(mobj *map, const exo_field *f, void *v, exo_err *err)
{
    mobj *o = exo_mp_get(map, f->key);
    if (!o) {
        if (f->optional)
            return 0; /* stays as init left it: empty */
        return exo_err_set(err, EXO_EFORMAT, "field %s: missing", f->key);
    }
    return f->type->unpack(o, f, v, err);
}

/* A string value: pointer and length (never NULL). */
static int str_of(mobj *o, const exo_field *f, const char **s, size_t *len, exo_err *err)
{
    if (o->type != MSGPACK_OBJECT_STR)
        return exo_err_set(err, EXO_EFORMAT, "field %s: not a string", f->key);
    *s = o->via.str.ptr ? o->via.str.ptr : "";
    *len = o->via.str.size;
    return 0;
}

static int int_of(mobj *o, const exo_field *f, int64_t lo, int64_t hi, int64_t *out, exo_err *err)
{
    int64_t x;
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (o->via.u64 > (uint64_t)INT64_MAX)
            return exo_err_set(err, EXO_EFORMAT, "field %s: out of range", f->key);
        x = (int64_t)o->via.u64;
    } else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        x = o->via.i64;
    } else {
        return exo_err_set(err, EXO_EFORMAT, "field %s: not an integer", f->key);
    }
    if (x < lo || x > hi)
        return exo_err_set(err, EXO_EFORMAT, "field %s: %lld out of range [%lld, %lld]", f->key,
                           (long long)x, (long long)lo, (long long)hi);
    *out = x;
    return 0;
}

/* ---- packing helpers ------------------------------------------------------------- */

void exo_mp_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

void exo_mp_kstr(msgpack_packer *pk, const char *k, const char *v)
{
    exo_mp_str(pk, k);
    exo_mp_str(pk, v);
}

void exo_mp_kint(msgpack_packer *pk, const char *k, int64_t v)
{
    exo_mp_str(pk, k);
    msgpack_pack_int64(pk, v);
}

int exo_mp_finish(msgpack_sbuffer *sb, size_t max, uint8_t **out, size_t *out_len, const char *what,
                  exo_err *err)
{
    if (sb->size > max) {
        size_t n = sb->size;
        msgpack_sbuffer_destroy(sb);
        return exo_err_set(err, EXO_ETOOBIG, "%s: encodes to %zu bytes (max %zu)", what, n, max);
    }
    *out = exo_malloc(sb->size ? sb->size : 1);
    memcpy(*out, sb->data, sb->size);
    *out_len = sb->size;
    msgpack_sbuffer_destroy(sb);
    return 0;
}

/* ---- JSON helpers --------------------------------------------------------------------- */

json_t *exo_json_str_or_null(const char *s)
{
    json_t *j = s ? json_string(s) : NULL; /* strings were validated as UTF-8 on the way in */
    return j ? j : json_null();
}

json_t *exo_json_tagged(const char *tag, json_t *body)
{
    json_t *o = json_object();
    json_object_set_new(o, tag, body);
    return o;
}

json_t *exo__time_ms_to_json(int64_t unix_ms)
{
    if (unix_ms < 0 || unix_ms > EXO_MAX_UNIX_MS)
        return json_null();
    time_t secs = (time_t)(unix_ms / 1000);
    struct tm tm;
    if (!gmtime_r(&secs, &tm))
        return json_null();
    char buf[64];
    size_t n = strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, sizeof buf - n, ".%03dZ", (int)(unix_ms % 1000));
    return json_string(buf);
}

/* ---- scalar types ------------------------------------------------------------------------ */

/* ids */
static void id_pack(msgpack_packer *pk, const exo_field *f, const void *v) { exo_mp_str(pk, CAT(v, exo_id).s); }
static int id_unpack(mobj *o, const exo_field *f, void *v, exo_err *err)
{
    const char *s = "";
    size_t len = 0;
    int rc = str_of(o, f, &s, &len, err);
    if (rc < 0)
        return rc;
    if (!exo_id_valid(s, len))
        return exo_err_set(err, EXO_EFORMAT, "field %s: invalid id", f->key);
    memset(v, 0, sizeof(exo_id));
    memcpy(AT(v, exo_id).s, s, len);
    return 0;
}
static int id_validate(const exo_field *f, const void *v, exo_err *err)
{
    const exo_id *id = v;
    if (!exo_id_valid(id->s, strnlen(id->s, EXO_ID_MAX)))
        return exo_err_set(err, EXO_EINVAL, "%s: invalid id", f->key);
    return 0;
}
static bool id_equal(const exo_field *f, const void *a, const void *b) { return exo_id_eq(a, b); }
static json_t *id_json(const exo_field *f, const void *v) { return json_string(CAT(v, exo_id).s); }
static bool id_empty(const exo_field *f, const void *v) { return exo_id_is_empty(v); }
const exo_field_type exo_ft_id = {"id", NULL, id_pack, id_unpack, id_validate, NULL, NULL, id_equal,
                                  id_json, id_empty, NULL, sizeof(exo_id)};

/* fixed-size strings: model ids and names */
static void fixstr_pack(msgpack_packer *pk, const exo_field *f, const void *v) { exo_mp_str(pk, v); }
static int fixstr_unpack(mobj *o, const exo_field *f, void *v, exo_err *err, size_t cap)
{
    const char *s = "";
    size_t len = 0;
    int rc = str_of(o, f, &s, &len, err);
    if (rc < 0)
        return rc;
    if (len >= cap || memchr(s, 0, len))
        return exo_err_set(err, EXO_EFORMAT, "field %s: too long or contains NUL", f->key);
    memset(v, 0, cap);
    memcpy(v, s, len);
    return 0;
}
static bool fixstr_equal(const exo_field *f, const void *a, const void *b) { return strcmp(a, b) == 0; }
static json_t *fixstr_json(const exo_field *f, const void *v) { return exo_json_str_or_null(v); }
static bool fixstr_empty(const exo_field *f, const void *v) { return *(const char *)v == 0; }

static int model_id_unpack(mobj *o, const exo_field *f, void *v, exo_err *err)
{
    int rc = fixstr_unpack(o, f, v, err, EXO_MODEL_ID_MAX);
    if (rc == 0 && !exo_model_id_valid(v, strlen(v)))
        return exo_err_set(err, EXO_EFORMAT, "field %s: invalid model id", f->key);
    return rc;
}
static int model_id_validate(const exo_field *f, const void *v, exo_err *err)
{
    if (!exo_model_id_valid(v, strnlen(v, EXO_MODEL_ID_MAX)))
        return exo_err_set(err, EXO_EINVAL, "%s: invalid model id", f->key);
    return 0;
}
const exo_field_type exo_ft_model_id = {"model id", NULL, fixstr_pack, model_id_unpack, model_id_validate,
                                        NULL, NULL, fixstr_equal, fixstr_json, fixstr_empty, NULL,
                                        EXO_MODEL_ID_MAX};

static int name_unpack(mobj *o, const exo_field *f, void *v, exo_err *err)
{
    return fixstr_unpack(o, f, v, err, EXO_NAME_MAX);
}
static int name_validate(const exo_field *f, const void *v, exo_err *err)
{
    const char *s = v;
    size_t len = strnlen(s, EXO_NAME_MAX);
    if (len == EXO_NAME_MAX || !exo_text_utf8_valid(s, len))
        return exo_err_set(err, EXO_EINVAL, "%s: not UTF-8 or too long", f->key);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return exo_err_set(err, EXO_EINVAL, "%s: control character", f->key);
    return 0;
}
const exo_field_type exo_ft_name = {"name", NULL, fixstr_pack, name_unpack, name_validate, NULL, NULL,
                                    fixstr_equal, fixstr_json, fixstr_empty, NULL, EXO_NAME_MAX};

/* heap text */
static size_t text_max(const exo_field *f) { return f->hi > 0 ? (size_t)f->hi : EXO_MESSAGE_MAX; }
static void text_pack(msgpack_packer *pk, const exo_field *f, const void *v) { exo_mp_str(pk, CAT(v, char *)); }
static int text_unpack_max(mobj *o, const exo_field *f, void *v, size_t max, exo_err *err)
{
    const char *s = "";
    size_t len = 0;
    int rc = str_of(o, f, &s, &len, err);
    if (rc < 0)
        return rc;
    if (len > max)
        return exo_err_set(err, EXO_EFORMAT, "field %s: %zu bytes (max %zu)", f->key, len, max);
    if (!exo_text_utf8_valid(s, len))
        return exo_err_set(err, EXO_EFORMAT, "field %s: not valid UTF-8", f->key);
    exo_free(AT(v, char *));
    AT(v, char *) = exo_strndup(s, len);
    return 0;
}
static int text_unpack(mobj *o, const exo_field *f, void *v, exo_err *err)
{
    return text_unpack_max(o, f, v, text_max(f), err);
}
static int text_validate(const exo_field *f, const void *v, exo_err *err)
{
    if (!CAT(v, char *))
        return exo_err_set(err, EXO_EINVAL, "%s: missing", f->key);
    return exo__check_text(CAT(v, char *), text_max(f), f->key, err);
}
static void text_copy(const exo_field *f, void *dst, const void *src)
{
    AT(dst, char *) = exo__strdup_null(CAT(src, char *));
}
static void text_clear(const exo_field *f, void *v)
{
    exo_free(AT(v, char *));
    AT(v, char *) = NULL;
}
static bool text_equal(const exo_field *f, const void *a, const void *b)
{
    return exo__str_eq_null(CAT(a, char *), CAT(b, char *));
}
static json_t *text_json(const exo_field *f, const void *v) { return exo_json_str_or_null(CAT(v, char *)); }
static bool text_empty(const exo_field *f, const void *v) { return CAT(v, char *) == NULL; }
const exo_field_type exo_ft_text = {"text", NULL, text_pack, text_unpack, text_validate, text_copy,
                                    text_clear, text_equal, text_json, text_empty, NULL, sizeof(char *)};

/* request parameters: JSON object text */
static int params_unpack(mobj *o, const exo_field *f, void *v, exo_err *err)
{
    return text_unpack_max(o, f, v, EXO_PARAMS_MAX, err);
}
static int params_validate(const exo_field *f, const void *v, exo_err *err)
{
    if (!CAT(v, char *))
        return exo_err_set(err, EXO_EINVAL, "%s: missing", f->key);
    return exo__check_params_json(CAT(v, char *), err);
}
static json_t *params_json(const exo_field *f, const void *v)
{
    const char *s = CAT(v, char *);
    if (!s)
        return json_null();
    json_t *j = json_loads(s, 0, NULL);
    return j ? j : exo_json_str_or_null(s);
}
const exo_field_type exo_ft_params = {"params", NULL, text_pack, params_unpack, params_validate, text_copy,
                                      text_clear, text_equal, params_json, text_empty, NULL, sizeof(char *)};

/* integers */
static void i32_pack(msgpack_packer *pk, const exo_field *f, const void *v) { msgpack_pack_int64(pk, CAT(v, int32_t)); }
static int i32_unpack(mobj *o, const exo_field *f, void *v, exo_err *err)
{
    int64_t x = 0;
    int rc = int_of(o, f, f->lo, f->hi, &x, err);
    if (rc == 0)
        AT(v, int32_t) = (int32_t)x;
    return rc;
}
static int i32_validate(const exo_field *f, const void *v, exo_err *err)
{
    int32_t x = CAT(v, int32_t);
    if (x < f->lo || x > f->hi)
        return exo_err_set(err, EXO_EINVAL, "%s: %d out of range [%lld, %lld]", f->key, (int)x,
                           (long long)f->lo, (long long)f->hi);
    return 0;
}
static bool i32_equal(const exo_field *f, const void *a, const void *b) { return CAT(a, int32_t) == CAT(b, int32_t); }
static json_t *i32_json(const exo_field *f, const void *v) { return json_integer(CAT(v, int32_t)); }
const exo_field_type exo_ft_i32 = {"int32", NULL, i32_pack, i32_unpack, i32_validate, NULL, NULL, i32_equal,
                                   i32_json, NULL, NULL, sizeof(int32_t)};

static void i64_pack(msgpack_packer *pk, const exo_field *f, const void *v) { msgpack_pack_int64(pk, CAT(v, int64_t)); }
static int i64_unpack(mobj *o, const exo_field *f, void *v, exo_err *err)
{
    return int_of(o, f, f->lo, f->hi, (int64_t *)v, err);
}
static int i64_validate(const exo_field *f, const void *v, exo_err *err)
{
    int64_t x = CAT(v, int64_t);
    if (x < f->lo || x > f->hi)
        return exo_err_set(err, EXO_EINVAL, "%s: %lld out of range", f->key, (long long)x);
    return 0;
}
static bool i64_equal(const exo_field *f, const void *a, const void *b) { return CAT(a, int64_t) == CAT(b, int64_t); }
static json_t *i64_json(const exo_field *f, const void *v) { return json_integer(CAT(v, int64_t)); }
const exo_field_type exo_ft_i64 = {"int64", NULL, i64_pack, i64_unpack, i64_validate, NULL, NULL, i64_equal,
                                   i64_json, NULL, NULL, sizeof(int64_t)};

static void u64_pack(msgpack_packer *pk, const exo_field *f, const void *v) { msgpack_pack_uint64(pk, CAT(v, uint64_t)); }
static int u64_unpack(mobj *o, const exo_field *f, void *v, exo_err *err)
{
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return exo_err_set(err, EXO_EFORMAT, "field %s: not a non-negative integer", f->key);
    AT(v, uint64_t) = o->via.u64;
    return 0;
}
static int any_valid(const exo_field *f, const void *v, exo_err *err) { return 0; }
static bool u64_equal(const exo_field *f, const void *a, const void *b) { return CAT(a, uint64_t) == CAT(b, uint64_t); }
/* JSON integers are signed 64-bit; no counter here gets near 2^63. */
static json_t *u64_json(const exo_field *f, const void *v) { return json_integer((json_int_t)CAT(v, uint64_t)); }
const exo_field_type exo_ft_u64 = {"uint64", NULL, u64_pack, u64_unpack, any_valid, NULL, NULL, u64_equal,
                                   u64_json, NULL, NULL, sizeof(uint64_t)};

static void bool_pack(msgpack_packer *pk, const exo_field *f, const void *v)
{
    if (CAT(v, bool))
        msgpack_pack_true(pk);
    else
        msgpack_pack_false(pk);
}
static int bool_unpack(mobj *o, const exo_field *f, void *v, exo_err *err)
{
    if (o->type != MSGPACK_OBJECT_BOOLEAN)
        return exo_err_set(err, EXO_EFORMAT, "field %s: not a boolean", f->key);
    AT(v, bool) = o->via.boolean;
    return 0;
}
static bool bool_equal(const exo_field *f, const void *a, const void *b) { return CAT(a, bool) == CAT(b, bool); }
static json_t *bool_json(const exo_field *f, const void *v) { return json_boolean(CAT(v, bool)); }
const exo_field_type exo_ft_bool = {"bool", NULL, bool_pack, bool_unpack, any_valid, NULL, NULL, bool_equal,
                                    bool_json, NULL, NULL, sizeof(bool)};

/* enums: stored as their names */
static void enum_pack(msgpack_packer *pk, const exo_field *f, const void *v) { exo_mp_str(pk, f->en->name(CAT(v, int))); }
static int enum_unpack(mobj *o, const exo_field *f, void *v, exo_err *err)
{
    const char *s = "";
    size_t len = 0;
    int rc = str_of(o, f, &s, &len, err);
    if (rc < 0)
        return rc;
    int x = f->en->parse(s, len);
    if (x < 0)
        return exo_err_set(err, EXO_EFORMAT, "field %s: unknown value \"%.*s\"", f->key,
                           (int)(len > 64 ? 64 : len), s);
    AT(v, int) = x;
    return 0;
}
static int enum_validate(const exo_field *f, const void *v, exo_err *err)
{
    if ((unsigned)CAT(v, int) >= (unsigned)f->en->count)
        return exo_err_set(err, EXO_EINVAL, "%s: bad value %d", f->key, CAT(v, int));
    return 0;
}
static bool enum_equal(const exo_field *f, const void *a, const void *b) { return CAT(a, int) == CAT(b, int); }
static json_t *enum_json(const exo_field *f, const void *v) { return json_string(f->en->name(CAT(v, int))); }
const exo_field_type exo_ft_enum = {"enum", NULL, enum_pack, enum_unpack, enum_validate, NULL, NULL, enum_equal,
                                    enum_json, NULL, NULL, sizeof(int)};

/* Unix milliseconds */
static int time_unpack(mobj *o, const exo_field *f, void *v, exo_err *err)
{
    return int_of(o, f, 0, EXO_MAX_UNIX_MS, (int64_t *)v, err);
}
static int time_validate(const exo_field *f, const void *v, exo_err *err)
{
    if (CAT(v, int64_t) < 0 || CAT(v, int64_t) > EXO_MAX_UNIX_MS)
        return exo_err_set(err, EXO_EINVAL, "%s: time out of range", f->key);
    return 0;
}
static json_t *time_json(const exo_field *f, const void *v) { return exo__time_ms_to_json(CAT(v, int64_t)); }
/* an optional time is absent as 0 (the epoch is never a real stamp) */
static bool time_empty(const exo_field *f, const void *v) { return CAT(v, int64_t) == 0; }
const exo_field_type exo_ft_time_ms = {"time", NULL, i64_pack, time_unpack, time_validate, NULL, NULL,
                                       i64_equal, time_json, time_empty, NULL, sizeof(int64_t)};

/* addresses */
static int addr_unpack(mobj *o, const exo_field *f, void *v, exo_err *err)
{
    return fixstr_unpack(o, f, v, err, EXO_ADDR_MAX);
}
static int addr_validate(const exo_field *f, const void *v, exo_err *err)
{
    const char *s = v;
    size_t len = strnlen(s, EXO_ADDR_MAX);
    if (len == 0 || len == EXO_ADDR_MAX)
        return exo_err_set(err, EXO_EINVAL, "%s: empty or too long", f->key);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f)
            return exo_err_set(err, EXO_EINVAL, "%s: not printable ASCII", f->key);
    return 0;
}
const exo_field_type exo_ft_addr = {"address", NULL, fixstr_pack, addr_unpack, addr_validate, NULL, NULL,
                                    fixstr_equal, fixstr_json, fixstr_empty, NULL, EXO_ADDR_MAX};

/* device names (proto/types.h) */
static int device_unpack(mobj *o, const exo_field *f, void *v, exo_err *err)
{
    int rc = fixstr_unpack(o, f, v, err, EXO_DEVICE_MAX);
    if (rc == 0 && !exo_device_valid(v))
        return exo_err_set(err, EXO_EFORMAT, "field %s: not one of auto, cpu, cuda, cuda:N", f->key);
    return rc;
}
static int device_validate(const exo_field *f, const void *v, exo_err *err)
{
    if (strnlen(v, EXO_DEVICE_MAX) == EXO_DEVICE_MAX || !exo_device_valid(v))
        return exo_err_set(err, EXO_EINVAL, "%s: not one of auto, cpu, cuda, cuda:N", f->key);
    return 0;
}
const exo_field_type exo_ft_device = {"device", NULL, fixstr_pack, device_unpack, device_validate, NULL, NULL,
                                      fixstr_equal, fixstr_json, fixstr_empty, NULL, EXO_DEVICE_MAX};

/* bit sets of an enum, as an array of names */
static void bitset_pack(msgpack_packer *pk, const exo_field *f, const void *v)
{
    uint32_t bits = CAT(v, uint32_t);
    msgpack_pack_array(pk, (size_t)__builtin_popcount(bits));
    for (int b = 0; b < f->en->count; b++)
        if (bits & (1u << b))
            exo_mp_str(pk, f->en->name(b));
}
static int bitset_unpack(mobj *o, const exo_field *f, void *v, exo_err *err)
{
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size > (uint32_t)f->en->count)
        return exo_err_set(err, EXO_EFORMAT, "field %s: not an array of names", f->key);
    uint32_t bits = 0;
    for (uint32_t i = 0; i < o->via.array.size; i++) {
        mobj *b = &o->via.array.ptr[i];
        int k = b->type == MSGPACK_OBJECT_STR ? f->en->parse(b->via.str.ptr ? b->via.str.ptr : "", b->via.str.size)
                                              : -1;
        if (k < 0 || (bits & (1u << k)))
            return exo_err_set(err, EXO_EFORMAT, "field %s: unknown or repeated name", f->key);
        bits |= 1u << k;
    }
    AT(v, uint32_t) = bits;
    return 0;
}
static int bitset_validate(const exo_field *f, const void *v, exo_err *err)
{
    if (f->en->count < 32 && (CAT(v, uint32_t) >> f->en->count))
        return exo_err_set(err, EXO_EINVAL, "%s: unknown bits", f->key);
    return 0;
}
static bool u32_equal(const exo_field *f, const void *a, const void *b) { return CAT(a, uint32_t) == CAT(b, uint32_t); }
static json_t *bitset_json(const exo_field *f, const void *v)
{
    json_t *a = json_array();
    for (int b = 0; b < f->en->count; b++)
        if (CAT(v, uint32_t) & (1u << b))
            json_array_append_new(a, json_string(f->en->name(b)));
    return a;
}
const exo_field_type exo_ft_bitset = {"bit set", NULL, bitset_pack, bitset_unpack, bitset_validate, NULL, NULL,
                                      u32_equal, bitset_json, NULL, NULL, sizeof(uint32_t)};

/* embedded records */
static void rec_init(const exo_field *f, void *v) { exo_record_init(f->sub, v); }
static void rec_pack(msgpack_packer *pk, const exo_field *f, const void *v) { exo_record_pack(pk, f->sub, v); }
static int rec_unpack(mobj *o, const exo_field *f, void *v, exo_err *err)
{
    exo_record_clear(f->sub, v);
    int rc = exo_record_unpack(o, f->sub, v, err);
    if (rc < 0)
        exo_err_wrap(err, "field %s", f->key);
    return rc;
}
static int rec_validate(const exo_field *f, const void *v, exo_err *err)
{
    int rc = exo_record_validate(f->sub, v, err);
    if (rc < 0)
        exo_err_wrap(err, "%s", f->key);
    return rc;
}
static void rec_copy(const exo_field *f, void *dst, const void *src) { exo_record_copy(f->sub, dst, src); }
static void rec_clear(const exo_field *f, void *v) { exo_record_clear(f->sub, v); }
static bool rec_equal(const exo_field *f, const void *a, const void *b) { return exo_record_equal(f->sub, a, b); }
static json_t *rec_json(const exo_field *f, const void *v)
{
    json_t *o = json_object();
    exo_record_to_json(f->sub, v, o);
    return o;
}
/* Sized per field (f->sub->size): the generic loops use the type's size only
 * for types without copy/clear, which records always have. */
const exo_field_type exo_ft_record = {"record", rec_init, rec_pack, rec_unpack, rec_validate, rec_copy,
                                      rec_clear, rec_equal, rec_json, NULL, NULL, 0};

/* arrays of records */
typedef EXO_ARRAY(char) any_array;
static void arr_pack(msgpack_packer *pk, const exo_field *f, const void *v)
{
    const any_array *a = v;
    msgpack_pack_array(pk, a->n);
    for (size_t i = 0; i < a->n; i++)
        exo_record_pack(pk, f->sub, a->v + i * f->sub->size);
}
static void arr_clear(const exo_field *f, void *v)
{
    any_array *a = v;
    for (size_t i = 0; i < a->n; i++)
        exo_record_clear(f->sub, a->v + i * f->sub->size);
    exo_free(a->v);
    a->v = NULL;
    a->n = 0;
}
static int arr_unpack(mobj *o, const exo_field *f, void *v, exo_err *err)
{
    arr_clear(f, v);
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size > (uint64_t)f->hi)
        return exo_err_set(err, EXO_EFORMAT, "field %s: not an array of at most %lld", f->key, (long long)f->hi);
    any_array *a = v;
    size_t n = o->via.array.size;
    a->v = n ? exo_calloc(n, f->sub->size) : NULL;
    for (size_t i = 0; i < n; i++) {
        a->n = i + 1; /* cleared on failure, including the element that failed */
        int rc = exo_record_unpack(&o->via.array.ptr[i], f->sub, a->v + i * f->sub->size, err);
        if (rc < 0) {
            exo_err_wrap(err, "field %s[%zu]", f->key, i);
            return rc;
        }
    }
    return 0;
}
static int arr_validate(const exo_field *f, const void *v, exo_err *err)
{
    const any_array *a = v;
    if (a->n > (uint64_t)f->hi || (a->n && !a->v))
        return exo_err_set(err, EXO_EINVAL, "%s: %zu entries (max %lld)", f->key, a->n, (long long)f->hi);
    for (size_t i = 0; i < a->n; i++) {
        int rc = exo_record_validate(f->sub, a->v + i * f->sub->size, err);
        if (rc < 0) {
            exo_err_wrap(err, "%s[%zu]", f->key, i);
            return rc;
        }
    }
    return 0;
}
static void arr_copy(const exo_field *f, void *dst, const void *src)
{
    const any_array *s = src;
    any_array *d = dst;
    d->n = s->n;
    d->v = s->n ? exo_calloc(s->n, f->sub->size) : NULL;
    for (size_t i = 0; i < s->n; i++)
        exo_record_copy(f->sub, d->v + i * f->sub->size, s->v + i * f->sub->size);
}
static bool arr_equal(const exo_field *f, const void *a, const void *b)
{
    const any_array *x = a, *y = b;
    if (x->n != y->n)
        return false;
    for (size_t i = 0; i < x->n; i++)
        if (!exo_record_equal(f->sub, x->v + i * f->sub->size, y->v + i * f->sub->size))
            return false;
    return true;
}
static json_t *arr_json(const exo_field *f, const void *v)
{
    const any_array *a = v;
    json_t *j = json_array();
    for (size_t i = 0; i < a->n; i++) {
        json_t *o = json_object();
        exo_record_to_json(f->sub, a->v + i * f->sub->size, o);
        json_array_append_new(j, o);
    }
    return j;
}
static bool arr_empty(const exo_field *f, const void *v) { return ((const any_array *)v)->n == 0; }
const exo_field_type exo_ft_array = {"array", NULL, arr_pack, arr_unpack, arr_validate, arr_copy, arr_clear,
                                     arr_equal, arr_json, arr_empty, NULL, sizeof(any_array)};

/* ---- records ---------------------------------------------------------------------------- */

/* Bytes of a field's C value. */
static size_t field_size(const exo_field *f) { return f->sub && f->type == &exo_ft_record ? f->sub->size : f->type->size; }

#define FIELD_PTR(rec, f) ((char *)(rec) + (f)->offset)
#define CFIELD_PTR(rec, f) ((const char *)(rec) + (f)->offset)

static bool field_empty(const exo_field *f, const void *v)
{
    return f->optional && f->type->is_empty && f->type->is_empty(f, v);
}

void exo_record_init(const exo_record_desc *d, void *rec)
{
    for (size_t i = 0; i < d->n_fields; i++) {
        const exo_field *f = &d->fields[i];
        if (f->type->init)
            f->type->init(f, FIELD_PTR(rec, f));
        else
            memset(FIELD_PTR(rec, f), 0, field_size(f));
    }
}

void exo_record_pack(msgpack_packer *pk, const exo_record_desc *d, const void *rec)
{
    size_t n = 0;
    for (size_t i = 0; i < d->n_fields; i++)
        n += !field_empty(&d->fields[i], CFIELD_PTR(rec, &d->fields[i]));
    msgpack_pack_map(pk, n);
    for (size_t i = 0; i < d->n_fields; i++) {
        const exo_field *f = &d->fields[i];
        if (field_empty(f, CFIELD_PTR(rec, f)))
            continue;
        exo_mp_str(pk, f->key);
        f->type->pack(pk, f, CFIELD_PTR(rec, f));
    }
}

int exo_record_unpack(mobj *map, const exo_record_desc *d, void *rec, exo_err *err)
{
    exo_record_init(d, rec);
    int rc = exo_mp_check_map(map, d->name, err);
    for (size_t i = 0; i < d->n_fields && rc == 0; i++)
        rc = exo_mp_field(map, &d->fields[i], FIELD_PTR(rec, &d->fields[i]), err);
    return rc;
}

int exo_record_validate(const exo_record_desc *d, const void *rec, exo_err *err)
{
    for (size_t i = 0; i < d->n_fields; i++) {
        const exo_field *f = &d->fields[i];
        if (field_empty(f, CFIELD_PTR(rec, f)))
            continue;
        int rc = f->type->validate(f, CFIELD_PTR(rec, f), err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

void exo_record_copy(const exo_record_desc *d, void *dst, const void *src)
{
    for (size_t i = 0; i < d->n_fields; i++) {
        const exo_field *f = &d->fields[i];
        if (f->type->copy)
            f->type->copy(f, FIELD_PTR(dst, f), CFIELD_PTR(src, f));
        else
            memcpy(FIELD_PTR(dst, f), CFIELD_PTR(src, f), field_size(f));
    }
}

void exo_record_clear(const exo_record_desc *d, void *rec)
{
    for (size_t i = 0; i < d->n_fields; i++) {
        const exo_field *f = &d->fields[i];
        if (f->type->clear)
            f->type->clear(f, FIELD_PTR(rec, f));
        memset(FIELD_PTR(rec, f), 0, field_size(f));
    }
}

bool exo_record_equal(const exo_record_desc *d, const void *a, const void *b)
{
    for (size_t i = 0; i < d->n_fields; i++) {
        const exo_field *f = &d->fields[i];
        if (!f->type->equal(f, CFIELD_PTR(a, f), CFIELD_PTR(b, f)))
            return false;
    }
    return true;
}

void exo_record_to_json(const exo_record_desc *d, const void *rec, json_t *obj)
{
    for (size_t i = 0; i < d->n_fields; i++) {
        const exo_field *f = &d->fields[i];
        const void *v = CFIELD_PTR(rec, f);
        if (field_empty(f, v) && f->type != &exo_ft_array)
            json_object_set_new(obj, f->json, json_null());
        else if (f->type->json_set)
            f->type->json_set(obj, f, v);
        else
            json_object_set_new(obj, f->json, f->type->to_json(f, v));
    }
}

/* ---- envelopes --------------------------------------------------------------------------- */

void exo_envelope_pack(msgpack_packer *pk, int version, const char *kind, const char *id)
{
    msgpack_pack_map(pk, 4);
    exo_mp_kint(pk, "v", version);
    exo_mp_kstr(pk, "kind", kind);
    exo_mp_kstr(pk, "id", id);
    exo_mp_str(pk, "body");
}

int exo_envelope_unpack(const uint8_t *buf, size_t len, size_t max_len, int max_version,
                        int (*parse)(const char *, size_t), const char *what, exo_envelope *env,
                        exo_err *err)
{
    memset(env, 0, sizeof *env);
    msgpack_unpacked_init(&env->up);
    if (!buf || len == 0)
        return exo_err_set(err, EXO_EFORMAT, "%s: empty", what);
    if (len > max_len)
        return exo_err_set(err, EXO_ETOOBIG, "%s: %zu bytes (max %zu)", what, len, max_len);
    size_t pos = 0;
    if (exo_mp_scan(buf, len, &pos, 0) < 0)
        return exo_err_set(err, EXO_EFORMAT, "%s: malformed msgpack", what);
    if (pos != len)
        return exo_err_set(err, EXO_EFORMAT, "%s: %zu trailing bytes", what, len - pos);
    size_t off = 0;
    if (msgpack_unpack_next(&env->up, (const char *)buf, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len)
        return exo_err_set(err, EXO_EFORMAT, "%s: malformed msgpack", what);
    mobj *root = &env->up.data;
    int rc = exo_mp_check_map(root, what, err);
    if (rc < 0)
        return rc;
    static const exo_field version_f = {"v", "v", &exo_ft_i64, 0, false, 1, INT64_MAX, NULL, NULL};
    int64_t v = 0;
    if ((rc = exo_mp_field(root, &version_f, &v, err)) < 0) {
        exo_err_wrap(err, "%s", what);
        return rc;
    }
    if (v > max_version)
        return exo_err_set(err, EXO_EUNSUPPORTED, "%s: format version %lld (this build reads <= %d)",
                           what, (long long)v, max_version);
    mobj *kind = exo_mp_get(root, "kind"), *id = exo_mp_get(root, "id");
    if (!kind || kind->type != MSGPACK_OBJECT_STR)
        return exo_err_set(err, EXO_EFORMAT, "%s: field kind: missing or not a string", what);
    env->kind = parse(kind->via.str.ptr ? kind->via.str.ptr : "", kind->via.str.size);
    if (env->kind < 0)
        return exo_err_set(err, EXO_EFORMAT, "%s: field kind: unknown value \"%.*s\"", what,
                           (int)(kind->via.str.size > 64 ? 64 : kind->via.str.size),
                           kind->via.str.ptr ? kind->via.str.ptr : "");
    if (!id || id->type != MSGPACK_OBJECT_STR || !exo_id_valid(id->via.str.ptr, id->via.str.size))
        return exo_err_set(err, EXO_EFORMAT, "%s: field id: missing or invalid", what);
    memcpy(env->id, id->via.str.ptr, id->via.str.size);
    env->body = exo_mp_get(root, "body");
    if (!env->body)
        return exo_err_set(err, EXO_EFORMAT, "%s: field body: missing", what);
    return exo_mp_check_map(env->body, "body", err);
}

void exo_envelope_free(exo_envelope *env) { msgpack_unpacked_destroy(&env->up); }
