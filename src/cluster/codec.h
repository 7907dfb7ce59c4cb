/* Records described by field tables: one generic codec for every event,
 * command and cluster message.
 *
 * Why: each message kind used to carry seven hand-written switches (encode,
 * decode, validate, copy, clear, equal, JSON) that had to agree with each
 * other. Now a kind is one row of a table (exo_record_desc: its fields, each
 * with a wire key, a JSON key, a type, an offset and bounds), and the seven
 * operations are loops over the fields here. A field type is a small vtable
 * (exo_field_type); scalars (ids, text, integers, enums, times) live here,
 * compound records with their own shape (instances, tasks, runner statuses,
 * node info) implement the same vtable next to their definition.
 *
 * Wire form: msgpack. A record is a map with snake_case string keys, in
 * table order; optional fields are omitted when empty. Decoding is strict
 * (types, ranges, ids, UTF-8, sizes, duplicate keys) and skips unknown keys,
 * so a later version may add optional fields. Envelopes wrap a record as
 *   {"v": version, "kind": "<Name>", "id": "<id>", "body": {...}}.
 * Before msgpack-c sees any bytes, exo_mp_scan walks them: msgpack-c sizes
 * its arrays from the counts in the input, so a 5-byte "array of 4 billion"
 * would make it allocate ~100 GB; the scan rejects counts larger than the
 * bytes left, nesting deeper than EXO_MP_MAX_DEPTH, ext types and trailing
 * bytes.
 *
 * JSON form (GET /events, /state): exo's camelCase keys, as each field's
 * `json` name says.
 *
 * Example usage (a record kind with two fields):
 *   typedef struct ping { exo_id node_id; int64_t sent_ms; } ping;
 *   static const exo_field ping_fields[] = {
 *       EXO_FIELD(ping, node_id, "node_id", "nodeId", exo_ft_id),
 *       EXO_FIELD_RANGE(ping, sent_ms, "sent_ms", "sentMs", exo_ft_i64, 0, INT64_MAX),
 *   };
 *   static const exo_record_desc ping_desc = EXO_RECORD("Ping", ping, ping_fields);
 *   exo_record_pack(&pk, &ping_desc, &p);                    // into a msgpack packer
 *   if (exo_record_unpack(map, &ping_desc, &back, &err) < 0) ...
 */
#ifndef EXO_CLUSTER_CODEC_H
#define EXO_CLUSTER_CODEC_H

#include "core/error.h"
#include "proto/types.h"

#include <jansson.h>
#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EXO_MP_MAX_DEPTH   16
#define EXO_MP_MAX_KEYS    64
/* Latest representable time (9999-12-31T23:59:59.999Z). */
#define EXO_MAX_UNIX_MS    253402300799999LL

typedef struct exo_field exo_field;

/* How one field type is handled. `v` points at the field inside a record. */
typedef struct exo_field_type {
    const char *name;
    void    (*init)(const exo_field *f, void *v);             /* NULL: zero bytes */
    void    (*pack)(msgpack_packer *pk, const exo_field *f, const void *v);
    int     (*unpack)(const msgpack_object *o, const exo_field *f, void *v, exo_err *err);
    int     (*validate)(const exo_field *f, const void *v, exo_err *err);
    void    (*copy)(const exo_field *f, void *dst, const void *src); /* NULL: byte copy */
    void    (*clear)(const exo_field *f, void *v);            /* NULL: nothing owned */
    bool    (*equal)(const exo_field *f, const void *a, const void *b);
    json_t *(*to_json)(const exo_field *f, const void *v);
    bool    (*is_empty)(const exo_field *f, const void *v);   /* optional fields only */
    /* Sets the field in a JSON object; NULL: obj[f->json] = to_json(v). */
    void    (*json_set)(json_t *obj, const exo_field *f, const void *v);
    size_t  size;                                             /* bytes of the C value */
} exo_field_type;

/* An enum's name table, for exo_ft_enum fields (the C value is an int). */
typedef struct exo_enum_desc {
    const char *(*name)(int v);
    int         (*parse)(const char *s, size_t len);
    int         count;
} exo_enum_desc;

struct exo_field {
    const char            *key;      /* msgpack key */
    const char            *json;     /* JSON key */
    const exo_field_type  *type;
    size_t                 offset;   /* in the record */
    bool                   optional; /* may be absent (then empty) */
    int64_t                lo, hi;   /* integers: range; text: hi = max bytes */
    const exo_enum_desc   *en;       /* exo_ft_enum, exo_ft_bitset */
    const struct exo_record_desc *sub; /* exo_ft_record, exo_ft_array */
};

typedef struct exo_record_desc {
    const char      *name;
    const exo_field *fields;
    size_t           n_fields;
    size_t           size;     /* sizeof the C struct (records nested in others) */
} exo_record_desc;

/* The C layout of an exo_ft_array field: a heap array and its length. */
#define EXO_ARRAY(T) struct { T *v; size_t n; }

#define EXO_FIELD(rec, member, key, json, type) \
    {key, json, &(type), offsetof(rec, member), false, 0, 0, NULL, NULL}
#define EXO_FIELD_OPT(rec, member, key, json, type) \
    {key, json, &(type), offsetof(rec, member), true, 0, 0, NULL, NULL}
#define EXO_FIELD_RANGE(rec, member, key, json, type, lo, hi) \
    {key, json, &(type), offsetof(rec, member), false, (lo), (hi), NULL, NULL}
#define EXO_FIELD_ENUM(rec, member, key, json, desc) \
    {key, json, &exo_ft_enum, offsetof(rec, member), false, 0, 0, &(desc), NULL}
#define EXO_FIELD_BITSET(rec, member, key, json, desc) \
    {key, json, &exo_ft_bitset, offsetof(rec, member), false, 0, 0, &(desc), NULL}
#define EXO_FIELD_RECORD(rec, member, key, json, desc) \
    {key, json, &exo_ft_record, offsetof(rec, member), false, 0, 0, NULL, &(desc)}
/* An array of at most max records (the C member is an EXO_ARRAY). */
#define EXO_FIELD_ARRAY(rec, member, key, json, desc, max) \
    {key, json, &exo_ft_array, offsetof(rec, member), false, 0, (max), NULL, &(desc)}
#define EXO_RECORD(name, type, fields) {name, fields, sizeof fields / sizeof *fields, sizeof(type)}

/* Scalar field types. */
extern const exo_field_type exo_ft_id;       /* exo_id; optional: may be empty */
extern const exo_field_type exo_ft_model_id; /* char[EXO_MODEL_ID_MAX] */
extern const exo_field_type exo_ft_name;     /* char[EXO_NAME_MAX], UTF-8, no control chars */
extern const exo_field_type exo_ft_text;     /* char * (heap), UTF-8, <= hi bytes (0: EXO_MESSAGE_MAX) */
extern const exo_field_type exo_ft_params;   /* char * (heap): JSON object text; JSON: embedded */
extern const exo_field_type exo_ft_i32;      /* int32_t in [lo, hi] */
extern const exo_field_type exo_ft_i64;      /* int64_t in [lo, hi] */
extern const exo_field_type exo_ft_u64;      /* uint64_t */
extern const exo_field_type exo_ft_bool;     /* bool */
extern const exo_field_type exo_ft_enum;     /* int in [0, en->count) */
extern const exo_field_type exo_ft_time_ms;  /* int64_t Unix ms; JSON: RFC 3339 */
extern const exo_field_type exo_ft_addr;     /* char[EXO_ADDR_MAX]: printable ASCII, no spaces */
extern const exo_field_type exo_ft_device;   /* char[EXO_DEVICE_MAX]: a device name (proto/types.h) */
extern const exo_field_type exo_ft_bitset;   /* uint32_t set of en's values; wire: array of names */
extern const exo_field_type exo_ft_record;   /* an embedded struct described by sub */
extern const exo_field_type exo_ft_array;    /* EXO_ARRAY of sub records, at most hi */

/* ---- records -------------------------------------------------------------- */
void    exo_record_init(const exo_record_desc *d, void *rec);
void    exo_record_pack(msgpack_packer *pk, const exo_record_desc *d, const void *rec);
/* map must be a msgpack map; rec is initialised first. */
int     exo_record_unpack(const msgpack_object *map, const exo_record_desc *d, void *rec, exo_err *err);
int     exo_record_validate(const exo_record_desc *d, const void *rec, exo_err *err);
void    exo_record_copy(const exo_record_desc *d, void *dst, const void *src);
void    exo_record_clear(const exo_record_desc *d, void *rec);
bool    exo_record_equal(const exo_record_desc *d, const void *a, const void *b);
/* Adds the record's fields to a JSON object. */
void    exo_record_to_json(const exo_record_desc *d, const void *rec, json_t *obj);

/* ---- envelopes -------------------------------------------------------------- */
typedef struct exo_envelope {
    msgpack_unpacked      up;    /* owns the objects below: exo_envelope_free */
    int                   kind;
    char                  id[64];
    const msgpack_object *body;
} exo_envelope;

void exo_envelope_pack(msgpack_packer *pk, int version, const char *kind, const char *id);
/* Scans and unpacks buf as an envelope of a version <= max_version (newer:
 * EXO_EUNSUPPORTED) whose kind `parse` knows. Free with exo_envelope_free
 * whatever the result. */
int  exo_envelope_unpack(const uint8_t *buf, size_t len, size_t max_len, int max_version,
                         int (*parse)(const char *, size_t), const char *what, exo_envelope *env,
                         exo_err *err);
void exo_envelope_free(exo_envelope *env);

/* ---- helpers for hand-written compound types -------------------------------- */
/* Structural pre-scan of one object at buf[*pos]: 0 or -1. */
int  exo_mp_scan(const uint8_t *buf, size_t len, size_t *pos, int depth);
/* A struct-like map: string keys, no duplicates, at most EXO_MP_MAX_KEYS. */
int  exo_mp_check_map(const msgpack_object *o, const char *what, exo_err *err);
const msgpack_object *exo_mp_get(const msgpack_object *map, const char *key);
/* Decodes map[key] with a field type (absent: required error, or the field's
 * empty value when f->optional). */
int  exo_mp_field(const msgpack_object *map, const exo_field *f, void *v, exo_err *err);
void exo_mp_str(msgpack_packer *pk, const char *s);
void exo_mp_kstr(msgpack_packer *pk, const char *k, const char *v);
void exo_mp_kint(msgpack_packer *pk, const char *k, int64_t v);
/* Moves a packed buffer into exo_malloc memory (callers free with
 * exo_free); EXO_ETOOBIG beyond max. Destroys sb. */
int  exo_mp_finish(msgpack_sbuffer *sb, size_t max, uint8_t **out, size_t *out_len, const char *what,
                   exo_err *err);

/* JSON helpers. */
json_t *exo_json_str_or_null(const char *s);
json_t *exo_json_tagged(const char *tag, json_t *body);
/* RFC 3339 UTC with milliseconds ("2026-01-02T03:04:05.678Z"); null out of range. */
json_t *exo__time_ms_to_json(int64_t unix_ms);

#endif
