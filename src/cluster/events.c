/* Event and command codecs: msgpack for disk and wire, JSON for the API.
 *
 * Encoding uses msgpack-c's packer. Decoding first walks the raw bytes with
 * a small structural scanner (mp_scan) before handing them to msgpack-c:
 * msgpack-c sizes its object arrays from the element counts in the input,
 * so a 5-byte "array of 4 billion" would make it allocate ~100 GB. The
 * scanner rejects any container whose count exceeds the bytes left (every
 * element needs at least one byte), nesting deeper than MP_MAX_DEPTH,
 * ext types, the reserved byte 0xc1 and trailing bytes; after it, msgpack-c
 * allocates at most a small multiple of the input size.
 *
 * Body layouts (version 1; all keys snake_case strings):
 *   instance  {instance_id, model_id, sharding, meta, shards: [{runner_id,
 *              node_id, device_rank, world_size, start_layer, end_layer,
 *              n_layers}]}
 *   status    {kind, [layers_loaded, total_layers], [prefill_server_port],
 *              [error_message]}
 *   task      {task_id, kind, status, instance_id, [command_id], [runner_id],
 *              [node_id], [cancelled_task_id], [params_json], [error_type],
 *              [error_message]}
 *   node info {memory_total, memory_available, cpu_count, friendly_name,
 *              backends: [name]}
 *   events    InstanceCreated {instance} | InstanceDeleted {instance_id} |
 *             RunnerStatusUpdated {runner_id, status} | RunnerDeleted
 *             {runner_id} | TaskCreated {task} | TaskStatusUpdated {task_id,
 *             status} | TaskFailed {task_id, error_type, error_message} |
 *             TaskDeleted {task_id} | NodeGatheredInfo {node_id, when_ms,
 *             info} | NodeTimedOut {node_id}
 *   commands  PlaceInstance {model_id, sharding, meta, min_nodes} |
 *             CreateInstance {instance} | DeleteInstance {instance_id} |
 *             TextGeneration {model_id, params_json} | TaskCancelled
 *             {cancelled_command_id} | TaskFinished {finished_command_id}
 * Optional fields ([...]) are omitted when empty. */
#include "cluster/events.h"

#include "core/alloc.h"

#include <msgpack.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define MP_MAX_DEPTH 16
#define MP_MAX_MAP_KEYS 64
/* Latest representable time (9999-12-31T23:59:59.999Z). */
#define MAX_UNIX_MS 253402300799999LL

/* ---- names ---------------------------------------------------------------- */

#define NAME_ITEM(n, s) s,
static const char *const event_names[] = {EXO_EVENT_KIND_MAP(NAME_ITEM)};
static const char *const command_names[] = {EXO_COMMAND_KIND_MAP(NAME_ITEM)};
#undef NAME_ITEM

const char *exo_event_kind_name(exo_event_kind k)
{
    return (unsigned)k < EXO_EVENT__COUNT ? event_names[k] : "?";
}

const char *exo_command_kind_name(exo_command_kind k)
{
    return (unsigned)k < EXO_COMMAND__COUNT ? command_names[k] : "?";
}

static int parse_name(const char *const *t, int n, const char *s, size_t len)
{
    for (int i = 0; i < n; i++)
        if (strlen(t[i]) == len && memcmp(t[i], s, len) == 0)
            return i;
    return -1;
}

int exo_event_kind_parse(const char *s, size_t len) { return parse_name(event_names, EXO_EVENT__COUNT, s, len); }
int exo_command_kind_parse(const char *s, size_t len)
{
    return parse_name(command_names, EXO_COMMAND__COUNT, s, len);
}

/* ---- structural pre-scan ---------------------------------------------------- */

static uint64_t be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/* Skips one object at buf[*pos]; 0 or -1 (malformed). */
static int mp_scan(const uint8_t *buf, size_t len, size_t *pos, int depth)
{
    if (depth > MP_MAX_DEPTH || *pos >= len)
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
        if (mp_scan(buf, len, pos, depth + 1) < 0)
            return -1;
    return 0;
}

/* ---- object access -------------------------------------------------------------- */

typedef const msgpack_object mobj;

static bool key_is(mobj *k, const char *key)
{
    size_t n = strlen(key);
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n && memcmp(k->via.str.ptr, key, n) == 0;
}

/* A struct-like map: string keys, no duplicates, bounded size. */
static int check_map(mobj *o, const char *what, exo_err *err)
{
    if (!o || o->type != MSGPACK_OBJECT_MAP)
        return exo_err_set(err, EXO_EFORMAT, "%s: not a map", what);
    uint32_t n = o->via.map.size;
    if (n > MP_MAX_MAP_KEYS)
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

static mobj *mget(mobj *map, const char *key)
{
    for (uint32_t i = 0; i < map->via.map.size; i++)
        if (key_is(&map->via.map.ptr[i].key, key))
            return &map->via.map.ptr[i].val;
    return NULL;
}

static int missing(const char *key, exo_err *err)
{
    return exo_err_set(err, EXO_EFORMAT, "field %s: missing", key);
}

static int get_str(mobj *m, const char *key, const char **s, size_t *len, bool required, exo_err *err)
{
    mobj *v = mget(m, key);
    *s = NULL;
    *len = 0;
    if (!v)
        return required ? missing(key, err) : 0;
    if (v->type != MSGPACK_OBJECT_STR)
        return exo_err_set(err, EXO_EFORMAT, "field %s: not a string", key);
    *s = v->via.str.ptr ? v->via.str.ptr : "";
    *len = v->via.str.size;
    return 0;
}

static int get_id(mobj *m, const char *key, exo_id *out, bool required, exo_err *err)
{
    const char *s;
    size_t len;
    int rc = get_str(m, key, &s, &len, required, err);
    memset(out, 0, sizeof *out);
    if (rc < 0 || !s)
        return rc;
    if (!exo_id_valid(s, len))
        return exo_err_set(err, EXO_EFORMAT, "field %s: invalid id", key);
    memcpy(out->s, s, len);
    return 0;
}

static int get_model_id(mobj *m, const char *key, char out[EXO_MODEL_ID_MAX], exo_err *err)
{
    const char *s;
    size_t len;
    int rc = get_str(m, key, &s, &len, true, err);
    if (rc < 0)
        return rc;
    if (!exo_model_id_valid(s, len))
        return exo_err_set(err, EXO_EFORMAT, "field %s: invalid model id", key);
    memcpy(out, s, len);
    out[len] = 0;
    return 0;
}

/* Heap UTF-8 string of at most max bytes; absent -> NULL when optional. */
static int get_text(mobj *m, const char *key, size_t max, char **out, bool required, exo_err *err)
{
    const char *s;
    size_t len;
    int rc = get_str(m, key, &s, &len, required, err);
    *out = NULL;
    if (rc < 0 || !s)
        return rc;
    if (len > max)
        return exo_err_set(err, EXO_EFORMAT, "field %s: %zu bytes (max %zu)", key, len, max);
    if (!exo_text_utf8_valid(s, len))
        return exo_err_set(err, EXO_EFORMAT, "field %s: not valid UTF-8", key);
    *out = exo_strndup(s, len);
    return 0;
}

static int get_int(mobj *m, const char *key, int64_t lo, int64_t hi, int64_t *out, bool required, exo_err *err)
{
    mobj *v = mget(m, key);
    if (!v)
        return required ? missing(key, err) : 0;
    int64_t x;
    if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (v->via.u64 > (uint64_t)INT64_MAX)
            return exo_err_set(err, EXO_EFORMAT, "field %s: out of range", key);
        x = (int64_t)v->via.u64;
    } else if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        x = v->via.i64;
    } else {
        return exo_err_set(err, EXO_EFORMAT, "field %s: not an integer", key);
    }
    if (x < lo || x > hi)
        return exo_err_set(err, EXO_EFORMAT, "field %s: %lld out of range [%lld, %lld]", key,
                           (long long)x, (long long)lo, (long long)hi);
    *out = x;
    return 0;
}

static int get_i32(mobj *m, const char *key, int32_t lo, int32_t hi, int32_t *out, bool required, exo_err *err)
{
    int64_t x = *out;
    int rc = get_int(m, key, lo, hi, &x, required, err);
    if (rc == 0)
        *out = (int32_t)x;
    return rc;
}

static int get_u64(mobj *m, const char *key, uint64_t *out, exo_err *err)
{
    mobj *v = mget(m, key);
    if (!v)
        return missing(key, err);
    if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return exo_err_set(err, EXO_EFORMAT, "field %s: not a non-negative integer", key);
    *out = v->via.u64;
    return 0;
}

static int get_enum(mobj *m, const char *key, int (*parse)(const char *, size_t), int *out, exo_err *err)
{
    const char *s;
    size_t len;
    int rc = get_str(m, key, &s, &len, true, err);
    if (rc < 0)
        return rc;
    int v = parse(s, len);
    if (v < 0)
        return exo_err_set(err, EXO_EFORMAT, "field %s: unknown value \"%.*s\"", key,
                           (int)(len > 64 ? 64 : len), s);
    *out = v;
    return 0;
}

static int get_map(mobj *m, const char *key, mobj **out, exo_err *err)
{
    mobj *v = mget(m, key);
    if (!v)
        return missing(key, err);
    *out = v;
    return check_map(v, key, err);
}

/* ---- decoders of the shared types ------------------------------------------------- */

static int dec_instance(mobj *m, exo_instance *inst, exo_err *err)
{
    int rc, sh = 0, meta = 0;
    memset(inst, 0, sizeof *inst);
    if ((rc = get_id(m, "instance_id", &inst->instance_id, true, err)) < 0 ||
        (rc = get_model_id(m, "model_id", inst->model_id, err)) < 0 ||
        (rc = get_enum(m, "sharding", exo_sharding_parse, &sh, err)) < 0 ||
        (rc = get_enum(m, "meta", exo_instance_meta_parse, &meta, err)) < 0)
        return rc;
    inst->sharding = (exo_sharding)sh;
    inst->meta = (exo_instance_meta)meta;
    mobj *a = mget(m, "shards");
    if (!a)
        return missing("shards", err);
    if (a->type != MSGPACK_OBJECT_ARRAY || a->via.array.size == 0 || a->via.array.size > EXO_MAX_SHARDS)
        return exo_err_set(err, EXO_EFORMAT, "field shards: not an array of 1..%d shards", EXO_MAX_SHARDS);
    inst->n_shards = a->via.array.size;
    inst->shards = exo_calloc(inst->n_shards, sizeof *inst->shards);
    for (size_t i = 0; i < inst->n_shards; i++) {
        mobj *s = &a->via.array.ptr[i];
        exo_shard *d = &inst->shards[i];
        if ((rc = check_map(s, "shard", err)) < 0 ||
            (rc = get_id(s, "runner_id", &d->runner_id, true, err)) < 0 ||
            (rc = get_id(s, "node_id", &d->node_id, true, err)) < 0 ||
            (rc = get_i32(s, "device_rank", 0, INT32_MAX, &d->device_rank, true, err)) < 0 ||
            (rc = get_i32(s, "world_size", 1, INT32_MAX, &d->world_size, true, err)) < 0 ||
            (rc = get_i32(s, "start_layer", 0, INT32_MAX, &d->start_layer, true, err)) < 0 ||
            (rc = get_i32(s, "end_layer", 0, INT32_MAX, &d->end_layer, true, err)) < 0 ||
            (rc = get_i32(s, "n_layers", 0, INT32_MAX, &d->n_layers, true, err)) < 0)
            return exo_err_wrap(err, "shard %zu", i);
    }
    return 0;
}

static int dec_status(mobj *m, exo_runner_status *st, exo_err *err)
{
    int rc, kind = 0;
    exo_runner_status_init(st, EXO_RUNNER_IDLE);
    if ((rc = get_enum(m, "kind", exo_runner_status_parse, &kind, err)) < 0)
        return rc;
    st->kind = (exo_runner_status_kind)kind;
    bool loading = st->kind == EXO_RUNNER_LOADING;
    if ((rc = get_i32(m, "layers_loaded", 0, INT32_MAX, &st->layers_loaded, loading, err)) < 0 ||
        (rc = get_i32(m, "total_layers", 0, INT32_MAX, &st->total_layers, loading, err)) < 0 ||
        (rc = get_i32(m, "prefill_server_port", 1, 65535, &st->prefill_server_port, false, err)) < 0 ||
        (rc = get_text(m, "error_message", EXO_MESSAGE_MAX, &st->error_message, false, err)) < 0)
        return rc;
    return 0;
}

static int dec_task(mobj *m, exo_task *t, exo_err *err)
{
    int rc, kind = 0, status = 0;
    memset(t, 0, sizeof *t);
    if ((rc = get_id(m, "task_id", &t->task_id, true, err)) < 0 ||
        (rc = get_enum(m, "kind", exo_task_kind_parse, &kind, err)) < 0 ||
        (rc = get_enum(m, "status", exo_task_status_parse, &status, err)) < 0 ||
        (rc = get_id(m, "instance_id", &t->instance_id, true, err)) < 0 ||
        (rc = get_id(m, "command_id", &t->command_id, false, err)) < 0 ||
        (rc = get_id(m, "runner_id", &t->runner_id, false, err)) < 0 ||
        (rc = get_id(m, "node_id", &t->node_id, false, err)) < 0 ||
        (rc = get_id(m, "cancelled_task_id", &t->cancelled_task_id, false, err)) < 0 ||
        (rc = get_text(m, "params_json", EXO_PARAMS_MAX, &t->params_json, false, err)) < 0 ||
        (rc = get_text(m, "error_type", EXO_MESSAGE_MAX, &t->error_type, false, err)) < 0 ||
        (rc = get_text(m, "error_message", EXO_MESSAGE_MAX, &t->error_message, false, err)) < 0)
        return rc;
    t->kind = (exo_task_kind)kind;
    t->status = (exo_task_status)status;
    return 0;
}

static int dec_node_info(mobj *m, exo_node_info *info, exo_err *err)
{
    int rc;
    const char *s;
    size_t len;
    memset(info, 0, sizeof *info);
    if ((rc = get_u64(m, "memory_total", &info->memory_total, err)) < 0 ||
        (rc = get_u64(m, "memory_available", &info->memory_available, err)) < 0 ||
        (rc = get_i32(m, "cpu_count", 0, INT32_MAX, &info->cpu_count, true, err)) < 0 ||
        (rc = get_str(m, "friendly_name", &s, &len, true, err)) < 0)
        return rc;
    if (len >= EXO_NAME_MAX || memchr(s, 0, len))
        return exo_err_set(err, EXO_EFORMAT, "field friendly_name: too long or contains NUL");
    memcpy(info->friendly_name, s, len);
    mobj *a = mget(m, "backends");
    if (!a)
        return missing("backends", err);
    if (a->type != MSGPACK_OBJECT_ARRAY || a->via.array.size > EXO_BACKEND__COUNT)
        return exo_err_set(err, EXO_EFORMAT, "field backends: not an array of backend names");
    for (uint32_t i = 0; i < a->via.array.size; i++) {
        mobj *b = &a->via.array.ptr[i];
        int k = b->type == MSGPACK_OBJECT_STR ? exo_backend_parse(b->via.str.ptr, b->via.str.size) : -1;
        if (k < 0 || (info->backends & (1u << k)))
            return exo_err_set(err, EXO_EFORMAT, "field backends: unknown or repeated backend");
        info->backends |= 1u << k;
    }
    return 0;
}

/* ---- envelope --------------------------------------------------------------------------- */

typedef struct envelope {
    msgpack_unpacked up;
    int              kind;
    exo_id           id;
    mobj            *body;
} envelope;

static int dec_envelope(const uint8_t *buf, size_t len, int (*parse)(const char *, size_t),
                        const char *what, envelope *env, exo_err *err)
{
    msgpack_unpacked_init(&env->up);
    if (!buf || len == 0)
        return exo_err_set(err, EXO_EFORMAT, "%s: empty", what);
    if (len > EXO_CODEC_MAX_BYTES)
        return exo_err_set(err, EXO_ETOOBIG, "%s: %zu bytes (max %zu)", what, len, EXO_CODEC_MAX_BYTES);
    size_t pos = 0;
    if (mp_scan(buf, len, &pos, 0) < 0)
        return exo_err_set(err, EXO_EFORMAT, "%s: malformed msgpack", what);
    if (pos != len)
        return exo_err_set(err, EXO_EFORMAT, "%s: %zu trailing bytes", what, len - pos);
    size_t off = 0;
    if (msgpack_unpack_next(&env->up, (const char *)buf, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len)
        return exo_err_set(err, EXO_EFORMAT, "%s: malformed msgpack", what);
    mobj *root = &env->up.data;
    int rc;
    int64_t v = 0;
    if ((rc = check_map(root, what, err)) < 0)
        return rc;
    if ((rc = get_int(root, "v", 1, INT64_MAX, &v, true, err)) < 0)
        return exo_err_wrap(err, "%s", what);
    if (v > EXO_CODEC_VERSION)
        return exo_err_set(err, EXO_EUNSUPPORTED, "%s: format version %lld (this build reads <= %d)",
                           what, (long long)v, EXO_CODEC_VERSION);
    if ((rc = get_enum(root, "kind", parse, &env->kind, err)) < 0 ||
        (rc = get_id(root, "id", &env->id, true, err)) < 0 ||
        (rc = get_map(root, "body", &env->body, err)) < 0)
        return exo_err_wrap(err, "%s", what);
    return 0;
}

/* ---- msgpack packing helpers ---------------------------------------------------------------- */

static void pk_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pk_kstr(msgpack_packer *pk, const char *k, const char *v)
{
    pk_str(pk, k);
    pk_str(pk, v);
}

static void pk_kint(msgpack_packer *pk, const char *k, int64_t v)
{
    pk_str(pk, k);
    msgpack_pack_int64(pk, v);
}

static int nz_id(const exo_id *id) { return id->s[0] != 0; }

static void pk_instance(msgpack_packer *pk, const exo_instance *inst)
{
    msgpack_pack_map(pk, 5);
    pk_kstr(pk, "instance_id", inst->instance_id.s);
    pk_kstr(pk, "model_id", inst->model_id);
    pk_kstr(pk, "sharding", exo_sharding_name(inst->sharding));
    pk_kstr(pk, "meta", exo_instance_meta_name(inst->meta));
    pk_str(pk, "shards");
    msgpack_pack_array(pk, inst->n_shards);
    for (size_t i = 0; i < inst->n_shards; i++) {
        const exo_shard *s = &inst->shards[i];
        msgpack_pack_map(pk, 7);
        pk_kstr(pk, "runner_id", s->runner_id.s);
        pk_kstr(pk, "node_id", s->node_id.s);
        pk_kint(pk, "device_rank", s->device_rank);
        pk_kint(pk, "world_size", s->world_size);
        pk_kint(pk, "start_layer", s->start_layer);
        pk_kint(pk, "end_layer", s->end_layer);
        pk_kint(pk, "n_layers", s->n_layers);
    }
}

static void pk_status(msgpack_packer *pk, const exo_runner_status *st)
{
    bool loading = st->kind == EXO_RUNNER_LOADING;
    bool port = st->prefill_server_port != -1;
    msgpack_pack_map(pk, 1 + (loading ? 2 : 0) + port + (st->error_message != NULL));
    pk_kstr(pk, "kind", exo_runner_status_name(st->kind));
    if (loading) {
        pk_kint(pk, "layers_loaded", st->layers_loaded);
        pk_kint(pk, "total_layers", st->total_layers);
    }
    if (port)
        pk_kint(pk, "prefill_server_port", st->prefill_server_port);
    if (st->error_message)
        pk_kstr(pk, "error_message", st->error_message);
}

static void pk_task(msgpack_packer *pk, const exo_task *t)
{
    int n = 4 + nz_id(&t->command_id) + nz_id(&t->runner_id) + nz_id(&t->node_id) +
            nz_id(&t->cancelled_task_id) + (t->params_json != NULL) + (t->error_type != NULL) +
            (t->error_message != NULL);
    msgpack_pack_map(pk, (size_t)n);
    pk_kstr(pk, "task_id", t->task_id.s);
    pk_kstr(pk, "kind", exo_task_kind_name(t->kind));
    pk_kstr(pk, "status", exo_task_status_name(t->status));
    pk_kstr(pk, "instance_id", t->instance_id.s);
    if (nz_id(&t->command_id)) pk_kstr(pk, "command_id", t->command_id.s);
    if (nz_id(&t->runner_id)) pk_kstr(pk, "runner_id", t->runner_id.s);
    if (nz_id(&t->node_id)) pk_kstr(pk, "node_id", t->node_id.s);
    if (nz_id(&t->cancelled_task_id)) pk_kstr(pk, "cancelled_task_id", t->cancelled_task_id.s);
    if (t->params_json) pk_kstr(pk, "params_json", t->params_json);
    if (t->error_type) pk_kstr(pk, "error_type", t->error_type);
    if (t->error_message) pk_kstr(pk, "error_message", t->error_message);
}

static void pk_node_info(msgpack_packer *pk, const exo_node_info *info)
{
    msgpack_pack_map(pk, 5);
    pk_str(pk, "memory_total");
    msgpack_pack_uint64(pk, info->memory_total);
    pk_str(pk, "memory_available");
    msgpack_pack_uint64(pk, info->memory_available);
    pk_kint(pk, "cpu_count", info->cpu_count);
    pk_kstr(pk, "friendly_name", info->friendly_name);
    pk_str(pk, "backends");
    msgpack_pack_array(pk, (size_t)__builtin_popcount(info->backends));
    for (int b = 0; b < EXO_BACKEND__COUNT; b++)
        if (info->backends & (1u << b))
            pk_str(pk, exo_backend_name((exo_backend_kind)b));
}

static void pk_envelope(msgpack_packer *pk, const char *kind, const exo_id *id)
{
    msgpack_pack_map(pk, 4);
    pk_kint(pk, "v", EXO_CODEC_VERSION);
    pk_kstr(pk, "kind", kind);
    pk_kstr(pk, "id", id->s);
    pk_str(pk, "body");
}

static int finish_buffer(msgpack_sbuffer *sb, uint8_t **out, size_t *out_len, const char *what, exo_err *err)
{
    if (sb->size > EXO_CODEC_MAX_BYTES) {
        size_t n = sb->size;
        msgpack_sbuffer_destroy(sb);
        return exo_err_set(err, EXO_ETOOBIG, "%s: encodes to %zu bytes (max %zu)", what, n, EXO_CODEC_MAX_BYTES);
    }
    /* Copy into exo_malloc memory so callers free with exo_free. */
    *out = exo_malloc(sb->size);
    memcpy(*out, sb->data, sb->size);
    *out_len = sb->size;
    msgpack_sbuffer_destroy(sb);
    return 0;
}

/* ---- events ------------------------------------------------------------------------------------- */

void exo_event_init(exo_event *ev, exo_event_kind kind)
{
    memset(ev, 0, sizeof *ev);
    ev->kind = kind;
    exo_id_new(&ev->event_id);
    if (kind == EXO_EVENT_RUNNER_STATUS_UPDATED)
        exo_runner_status_init(&ev->u.runner_status_updated.status, EXO_RUNNER_IDLE);
}

void exo_event_copy(exo_event *dst, const exo_event *src)
{
    *dst = *src;
    switch (src->kind) {
    case EXO_EVENT_INSTANCE_CREATED:
        exo_instance_copy(&dst->u.instance_created.instance, &src->u.instance_created.instance);
        break;
    case EXO_EVENT_RUNNER_STATUS_UPDATED:
        exo_runner_status_copy(&dst->u.runner_status_updated.status, &src->u.runner_status_updated.status);
        break;
    case EXO_EVENT_TASK_CREATED:
        exo_task_copy(&dst->u.task_created.task, &src->u.task_created.task);
        break;
    case EXO_EVENT_TASK_FAILED:
        dst->u.task_failed.error_type = exo__strdup_null(src->u.task_failed.error_type);
        dst->u.task_failed.error_message = exo__strdup_null(src->u.task_failed.error_message);
        break;
    default: break;
    }
}

void exo_event_clear(exo_event *ev)
{
    switch (ev->kind) {
    case EXO_EVENT_INSTANCE_CREATED: exo_instance_clear(&ev->u.instance_created.instance); break;
    case EXO_EVENT_RUNNER_STATUS_UPDATED: exo_runner_status_clear(&ev->u.runner_status_updated.status); break;
    case EXO_EVENT_TASK_CREATED: exo_task_clear(&ev->u.task_created.task); break;
    case EXO_EVENT_TASK_FAILED:
        exo_free(ev->u.task_failed.error_type);
        exo_free(ev->u.task_failed.error_message);
        break;
    default: break;
    }
    memset(ev, 0, sizeof *ev);
}

bool exo_event_equal(const exo_event *a, const exo_event *b)
{
    if (a->kind != b->kind || !exo_id_eq(&a->event_id, &b->event_id))
        return false;
    switch (a->kind) {
    case EXO_EVENT_INSTANCE_CREATED:
        return exo_instance_equal(&a->u.instance_created.instance, &b->u.instance_created.instance);
    case EXO_EVENT_INSTANCE_DELETED:
        return exo_id_eq(&a->u.instance_deleted.instance_id, &b->u.instance_deleted.instance_id);
    case EXO_EVENT_RUNNER_STATUS_UPDATED:
        return exo_id_eq(&a->u.runner_status_updated.runner_id, &b->u.runner_status_updated.runner_id) &&
               exo_runner_status_equal(&a->u.runner_status_updated.status, &b->u.runner_status_updated.status);
    case EXO_EVENT_RUNNER_DELETED:
        return exo_id_eq(&a->u.runner_deleted.runner_id, &b->u.runner_deleted.runner_id);
    case EXO_EVENT_TASK_CREATED:
        return exo_task_equal(&a->u.task_created.task, &b->u.task_created.task);
    case EXO_EVENT_TASK_STATUS_UPDATED:
        return exo_id_eq(&a->u.task_status_updated.task_id, &b->u.task_status_updated.task_id) &&
               a->u.task_status_updated.status == b->u.task_status_updated.status;
    case EXO_EVENT_TASK_FAILED:
        return exo_id_eq(&a->u.task_failed.task_id, &b->u.task_failed.task_id) &&
               exo__str_eq_null(a->u.task_failed.error_type, b->u.task_failed.error_type) &&
               exo__str_eq_null(a->u.task_failed.error_message, b->u.task_failed.error_message);
    case EXO_EVENT_TASK_DELETED:
        return exo_id_eq(&a->u.task_deleted.task_id, &b->u.task_deleted.task_id);
    case EXO_EVENT_NODE_GATHERED_INFO:
        return exo_id_eq(&a->u.node_gathered_info.node_id, &b->u.node_gathered_info.node_id) &&
               a->u.node_gathered_info.when_ms == b->u.node_gathered_info.when_ms &&
               exo_node_info_equal(&a->u.node_gathered_info.info, &b->u.node_gathered_info.info);
    case EXO_EVENT_NODE_TIMED_OUT:
        return exo_id_eq(&a->u.node_timed_out.node_id, &b->u.node_timed_out.node_id);
    default: return false;
    }
}

static int valid_id(const exo_id *id, const char *what, exo_err *err)
{
    if (!exo_id_valid(id->s, strnlen(id->s, EXO_ID_MAX)))
        return exo_err_set(err, EXO_EINVAL, "%s: invalid id", what);
    return 0;
}

static int valid_text(const char *s, const char *what, exo_err *err)
{
    if (!s)
        return exo_err_set(err, EXO_EINVAL, "%s: missing", what);
    size_t len = strlen(s);
    if (len > EXO_MESSAGE_MAX || !exo_text_utf8_valid(s, len))
        return exo_err_set(err, EXO_EINVAL, "%s: too long or not UTF-8", what);
    return 0;
}

int exo_event_validate(const exo_event *ev, exo_err *err)
{
    int rc = valid_id(&ev->event_id, "event id", err);
    if (rc < 0)
        return rc;
    switch (ev->kind) {
    case EXO_EVENT_INSTANCE_CREATED: rc = exo_instance_validate(&ev->u.instance_created.instance, err); break;
    case EXO_EVENT_INSTANCE_DELETED: rc = valid_id(&ev->u.instance_deleted.instance_id, "instance id", err); break;
    case EXO_EVENT_RUNNER_STATUS_UPDATED:
        if ((rc = valid_id(&ev->u.runner_status_updated.runner_id, "runner id", err)) == 0)
            rc = exo_runner_status_validate(&ev->u.runner_status_updated.status, err);
        break;
    case EXO_EVENT_RUNNER_DELETED: rc = valid_id(&ev->u.runner_deleted.runner_id, "runner id", err); break;
    case EXO_EVENT_TASK_CREATED: rc = exo_task_validate(&ev->u.task_created.task, err); break;
    case EXO_EVENT_TASK_STATUS_UPDATED:
        if ((rc = valid_id(&ev->u.task_status_updated.task_id, "task id", err)) == 0 &&
            (unsigned)ev->u.task_status_updated.status >= EXO_TASK_STATUS__COUNT)
            rc = exo_err_set(err, EXO_EINVAL, "bad task status");
        break;
    case EXO_EVENT_TASK_FAILED:
        if ((rc = valid_id(&ev->u.task_failed.task_id, "task id", err)) == 0 &&
            (rc = valid_text(ev->u.task_failed.error_type, "error type", err)) == 0)
            rc = valid_text(ev->u.task_failed.error_message, "error message", err);
        break;
    case EXO_EVENT_TASK_DELETED: rc = valid_id(&ev->u.task_deleted.task_id, "task id", err); break;
    case EXO_EVENT_NODE_GATHERED_INFO:
        if ((rc = valid_id(&ev->u.node_gathered_info.node_id, "node id", err)) == 0 &&
            (ev->u.node_gathered_info.when_ms < 0 || ev->u.node_gathered_info.when_ms > MAX_UNIX_MS))
            rc = exo_err_set(err, EXO_EINVAL, "time out of range");
        if (rc == 0)
            rc = exo_node_info_validate(&ev->u.node_gathered_info.info, err);
        break;
    case EXO_EVENT_NODE_TIMED_OUT: rc = valid_id(&ev->u.node_timed_out.node_id, "node id", err); break;
    default: return exo_err_set(err, EXO_EINVAL, "unknown event kind %d", (int)ev->kind);
    }
    if (rc < 0)
        return exo_err_wrap(err, "%s event %s", exo_event_kind_name(ev->kind), ev->event_id.s);
    return 0;
}

int exo_event_encode(const exo_event *ev, uint8_t **out, size_t *out_len, exo_err *err)
{
    *out = NULL;
    *out_len = 0;
    int rc = exo_event_validate(ev, err);
    if (rc < 0)
        return rc;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    pk_envelope(&pk, exo_event_kind_name(ev->kind), &ev->event_id);
    switch (ev->kind) {
    case EXO_EVENT_INSTANCE_CREATED:
        msgpack_pack_map(&pk, 1);
        pk_str(&pk, "instance");
        pk_instance(&pk, &ev->u.instance_created.instance);
        break;
    case EXO_EVENT_INSTANCE_DELETED:
        msgpack_pack_map(&pk, 1);
        pk_kstr(&pk, "instance_id", ev->u.instance_deleted.instance_id.s);
        break;
    case EXO_EVENT_RUNNER_STATUS_UPDATED:
        msgpack_pack_map(&pk, 2);
        pk_kstr(&pk, "runner_id", ev->u.runner_status_updated.runner_id.s);
        pk_str(&pk, "status");
        pk_status(&pk, &ev->u.runner_status_updated.status);
        break;
    case EXO_EVENT_RUNNER_DELETED:
        msgpack_pack_map(&pk, 1);
        pk_kstr(&pk, "runner_id", ev->u.runner_deleted.runner_id.s);
        break;
    case EXO_EVENT_TASK_CREATED:
        msgpack_pack_map(&pk, 1);
        pk_str(&pk, "task");
        pk_task(&pk, &ev->u.task_created.task);
        break;
    case EXO_EVENT_TASK_STATUS_UPDATED:
        msgpack_pack_map(&pk, 2);
        pk_kstr(&pk, "task_id", ev->u.task_status_updated.task_id.s);
        pk_kstr(&pk, "status", exo_task_status_name(ev->u.task_status_updated.status));
        break;
    case EXO_EVENT_TASK_FAILED:
        msgpack_pack_map(&pk, 3);
        pk_kstr(&pk, "task_id", ev->u.task_failed.task_id.s);
        pk_kstr(&pk, "error_type", ev->u.task_failed.error_type);
        pk_kstr(&pk, "error_message", ev->u.task_failed.error_message);
        break;
    case EXO_EVENT_TASK_DELETED:
        msgpack_pack_map(&pk, 1);
        pk_kstr(&pk, "task_id", ev->u.task_deleted.task_id.s);
        break;
    case EXO_EVENT_NODE_GATHERED_INFO:
        msgpack_pack_map(&pk, 3);
        pk_kstr(&pk, "node_id", ev->u.node_gathered_info.node_id.s);
        pk_kint(&pk, "when_ms", ev->u.node_gathered_info.when_ms);
        pk_str(&pk, "info");
        pk_node_info(&pk, &ev->u.node_gathered_info.info);
        break;
    case EXO_EVENT_NODE_TIMED_OUT:
        msgpack_pack_map(&pk, 1);
        pk_kstr(&pk, "node_id", ev->u.node_timed_out.node_id.s);
        break;
    default: break; /* rejected by validate */
    }
    return finish_buffer(&sb, out, out_len, "event", err);
}

static int dec_event_body(exo_event *ev, mobj *b, exo_err *err)
{
    mobj *sub = NULL;
    int rc, status = 0;
    switch (ev->kind) {
    case EXO_EVENT_INSTANCE_CREATED:
        if ((rc = get_map(b, "instance", &sub, err)) < 0)
            return rc;
        return dec_instance(sub, &ev->u.instance_created.instance, err);
    case EXO_EVENT_INSTANCE_DELETED:
        return get_id(b, "instance_id", &ev->u.instance_deleted.instance_id, true, err);
    case EXO_EVENT_RUNNER_STATUS_UPDATED:
        if ((rc = get_id(b, "runner_id", &ev->u.runner_status_updated.runner_id, true, err)) < 0 ||
            (rc = get_map(b, "status", &sub, err)) < 0)
            return rc;
        return dec_status(sub, &ev->u.runner_status_updated.status, err);
    case EXO_EVENT_RUNNER_DELETED:
        return get_id(b, "runner_id", &ev->u.runner_deleted.runner_id, true, err);
    case EXO_EVENT_TASK_CREATED:
        if ((rc = get_map(b, "task", &sub, err)) < 0)
            return rc;
        return dec_task(sub, &ev->u.task_created.task, err);
    case EXO_EVENT_TASK_STATUS_UPDATED:
        if ((rc = get_id(b, "task_id", &ev->u.task_status_updated.task_id, true, err)) < 0 ||
            (rc = get_enum(b, "status", exo_task_status_parse, &status, err)) < 0)
            return rc;
        ev->u.task_status_updated.status = (exo_task_status)status;
        return 0;
    case EXO_EVENT_TASK_FAILED:
        if ((rc = get_id(b, "task_id", &ev->u.task_failed.task_id, true, err)) < 0 ||
            (rc = get_text(b, "error_type", EXO_MESSAGE_MAX, &ev->u.task_failed.error_type, true, err)) < 0)
            return rc;
        return get_text(b, "error_message", EXO_MESSAGE_MAX, &ev->u.task_failed.error_message, true, err);
    case EXO_EVENT_TASK_DELETED:
        return get_id(b, "task_id", &ev->u.task_deleted.task_id, true, err);
    case EXO_EVENT_NODE_GATHERED_INFO:
        if ((rc = get_id(b, "node_id", &ev->u.node_gathered_info.node_id, true, err)) < 0 ||
            (rc = get_int(b, "when_ms", 0, MAX_UNIX_MS, &ev->u.node_gathered_info.when_ms, true, err)) < 0 ||
            (rc = get_map(b, "info", &sub, err)) < 0)
            return rc;
        return dec_node_info(sub, &ev->u.node_gathered_info.info, err);
    case EXO_EVENT_NODE_TIMED_OUT:
        return get_id(b, "node_id", &ev->u.node_timed_out.node_id, true, err);
    default: return exo_err_set(err, EXO_EINTERNAL, "unknown event kind");
    }
}

int exo_event_decode(const uint8_t *buf, size_t len, exo_event *ev, exo_err *err)
{
    envelope env;
    memset(ev, 0, sizeof *ev);
    int rc = dec_envelope(buf, len, exo_event_kind_parse, "event", &env, err);
    if (rc == 0) {
        ev->kind = (exo_event_kind)env.kind;
        ev->event_id = env.id;
        if (ev->kind == EXO_EVENT_RUNNER_STATUS_UPDATED)
            exo_runner_status_init(&ev->u.runner_status_updated.status, EXO_RUNNER_IDLE);
        rc = dec_event_body(ev, env.body, err);
        if (rc < 0)
            exo_err_wrap(err, "%s event", exo_event_kind_name(ev->kind));
        else
            rc = exo_event_validate(ev, err);
        if (rc < 0) {
            rc = EXO_EFORMAT;
            if (err)
                err->code = rc;
        }
    }
    msgpack_unpacked_destroy(&env.up);
    if (rc < 0)
        exo_event_clear(ev);
    return rc;
}

/* ---- commands -------------------------------------------------------------------------------------- */

void exo_command_init(exo_command *cmd, exo_command_kind kind)
{
    memset(cmd, 0, sizeof *cmd);
    cmd->kind = kind;
    exo_id_new(&cmd->command_id);
    if (kind == EXO_COMMAND_PLACE_INSTANCE)
        cmd->u.place_instance.min_nodes = 1;
}

void exo_command_copy(exo_command *dst, const exo_command *src)
{
    *dst = *src;
    if (src->kind == EXO_COMMAND_CREATE_INSTANCE)
        exo_instance_copy(&dst->u.create_instance.instance, &src->u.create_instance.instance);
    else if (src->kind == EXO_COMMAND_TEXT_GENERATION)
        dst->u.text_generation.params_json = exo__strdup_null(src->u.text_generation.params_json);
}

void exo_command_clear(exo_command *cmd)
{
    if (cmd->kind == EXO_COMMAND_CREATE_INSTANCE)
        exo_instance_clear(&cmd->u.create_instance.instance);
    else if (cmd->kind == EXO_COMMAND_TEXT_GENERATION)
        exo_free(cmd->u.text_generation.params_json);
    memset(cmd, 0, sizeof *cmd);
}

bool exo_command_equal(const exo_command *a, const exo_command *b)
{
    if (a->kind != b->kind || !exo_id_eq(&a->command_id, &b->command_id))
        return false;
    switch (a->kind) {
    case EXO_COMMAND_PLACE_INSTANCE:
        return strcmp(a->u.place_instance.model_id, b->u.place_instance.model_id) == 0 &&
               a->u.place_instance.sharding == b->u.place_instance.sharding &&
               a->u.place_instance.meta == b->u.place_instance.meta &&
               a->u.place_instance.min_nodes == b->u.place_instance.min_nodes;
    case EXO_COMMAND_CREATE_INSTANCE:
        return exo_instance_equal(&a->u.create_instance.instance, &b->u.create_instance.instance);
    case EXO_COMMAND_DELETE_INSTANCE:
        return exo_id_eq(&a->u.delete_instance.instance_id, &b->u.delete_instance.instance_id);
    case EXO_COMMAND_TEXT_GENERATION:
        return strcmp(a->u.text_generation.model_id, b->u.text_generation.model_id) == 0 &&
               exo__str_eq_null(a->u.text_generation.params_json, b->u.text_generation.params_json);
    case EXO_COMMAND_TASK_CANCELLED:
        return exo_id_eq(&a->u.task_cancelled.cancelled_command_id, &b->u.task_cancelled.cancelled_command_id);
    case EXO_COMMAND_TASK_FINISHED:
        return exo_id_eq(&a->u.task_finished.finished_command_id, &b->u.task_finished.finished_command_id);
    default: return false;
    }
}

int exo_command_validate(const exo_command *cmd, exo_err *err)
{
    int rc = valid_id(&cmd->command_id, "command id", err);
    if (rc < 0)
        return rc;
    switch (cmd->kind) {
    case EXO_COMMAND_PLACE_INSTANCE: {
        const char *m = cmd->u.place_instance.model_id;
        if (!exo_model_id_valid(m, strnlen(m, EXO_MODEL_ID_MAX)))
            rc = exo_err_set(err, EXO_EINVAL, "invalid model id");
        else if ((unsigned)cmd->u.place_instance.sharding >= EXO_SHARDING__COUNT ||
                 (unsigned)cmd->u.place_instance.meta >= EXO_INSTANCE_META__COUNT)
            rc = exo_err_set(err, EXO_EINVAL, "bad sharding or instance meta");
        else if (cmd->u.place_instance.min_nodes < 1 || cmd->u.place_instance.min_nodes > EXO_MAX_SHARDS)
            rc = exo_err_set(err, EXO_EINVAL, "min_nodes %d out of range [1, %d]",
                             (int)cmd->u.place_instance.min_nodes, EXO_MAX_SHARDS);
        break;
    }
    case EXO_COMMAND_CREATE_INSTANCE: rc = exo_instance_validate(&cmd->u.create_instance.instance, err); break;
    case EXO_COMMAND_DELETE_INSTANCE: rc = valid_id(&cmd->u.delete_instance.instance_id, "instance id", err); break;
    case EXO_COMMAND_TEXT_GENERATION: {
        const char *m = cmd->u.text_generation.model_id;
        if (!exo_model_id_valid(m, strnlen(m, EXO_MODEL_ID_MAX)))
            rc = exo_err_set(err, EXO_EINVAL, "invalid model id");
        else if (!cmd->u.text_generation.params_json)
            rc = exo_err_set(err, EXO_EINVAL, "params missing");
        else
            rc = exo__check_params_json(cmd->u.text_generation.params_json, err);
        break;
    }
    case EXO_COMMAND_TASK_CANCELLED:
        rc = valid_id(&cmd->u.task_cancelled.cancelled_command_id, "cancelled command id", err);
        break;
    case EXO_COMMAND_TASK_FINISHED:
        rc = valid_id(&cmd->u.task_finished.finished_command_id, "finished command id", err);
        break;
    default: return exo_err_set(err, EXO_EINVAL, "unknown command kind %d", (int)cmd->kind);
    }
    if (rc < 0)
        return exo_err_wrap(err, "%s command %s", exo_command_kind_name(cmd->kind), cmd->command_id.s);
    return 0;
}

int exo_command_encode(const exo_command *cmd, uint8_t **out, size_t *out_len, exo_err *err)
{
    *out = NULL;
    *out_len = 0;
    int rc = exo_command_validate(cmd, err);
    if (rc < 0)
        return rc;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    pk_envelope(&pk, exo_command_kind_name(cmd->kind), &cmd->command_id);
    switch (cmd->kind) {
    case EXO_COMMAND_PLACE_INSTANCE:
        msgpack_pack_map(&pk, 4);
        pk_kstr(&pk, "model_id", cmd->u.place_instance.model_id);
        pk_kstr(&pk, "sharding", exo_sharding_name(cmd->u.place_instance.sharding));
        pk_kstr(&pk, "meta", exo_instance_meta_name(cmd->u.place_instance.meta));
        pk_kint(&pk, "min_nodes", cmd->u.place_instance.min_nodes);
        break;
    case EXO_COMMAND_CREATE_INSTANCE:
        msgpack_pack_map(&pk, 1);
        pk_str(&pk, "instance");
        pk_instance(&pk, &cmd->u.create_instance.instance);
        break;
    case EXO_COMMAND_DELETE_INSTANCE:
        msgpack_pack_map(&pk, 1);
        pk_kstr(&pk, "instance_id", cmd->u.delete_instance.instance_id.s);
        break;
    case EXO_COMMAND_TEXT_GENERATION:
        msgpack_pack_map(&pk, 2);
        pk_kstr(&pk, "model_id", cmd->u.text_generation.model_id);
        pk_kstr(&pk, "params_json", cmd->u.text_generation.params_json);
        break;
    case EXO_COMMAND_TASK_CANCELLED:
        msgpack_pack_map(&pk, 1);
        pk_kstr(&pk, "cancelled_command_id", cmd->u.task_cancelled.cancelled_command_id.s);
        break;
    case EXO_COMMAND_TASK_FINISHED:
        msgpack_pack_map(&pk, 1);
        pk_kstr(&pk, "finished_command_id", cmd->u.task_finished.finished_command_id.s);
        break;
    default: break;
    }
    return finish_buffer(&sb, out, out_len, "command", err);
}

static int dec_command_body(exo_command *cmd, mobj *b, exo_err *err)
{
    mobj *sub = NULL;
    int rc, sh = 0, meta = 0;
    switch (cmd->kind) {
    case EXO_COMMAND_PLACE_INSTANCE:
        if ((rc = get_model_id(b, "model_id", cmd->u.place_instance.model_id, err)) < 0 ||
            (rc = get_enum(b, "sharding", exo_sharding_parse, &sh, err)) < 0 ||
            (rc = get_enum(b, "meta", exo_instance_meta_parse, &meta, err)) < 0 ||
            (rc = get_i32(b, "min_nodes", 1, EXO_MAX_SHARDS, &cmd->u.place_instance.min_nodes, true, err)) < 0)
            return rc;
        cmd->u.place_instance.sharding = (exo_sharding)sh;
        cmd->u.place_instance.meta = (exo_instance_meta)meta;
        return 0;
    case EXO_COMMAND_CREATE_INSTANCE:
        if ((rc = get_map(b, "instance", &sub, err)) < 0)
            return rc;
        return dec_instance(sub, &cmd->u.create_instance.instance, err);
    case EXO_COMMAND_DELETE_INSTANCE:
        return get_id(b, "instance_id", &cmd->u.delete_instance.instance_id, true, err);
    case EXO_COMMAND_TEXT_GENERATION:
        if ((rc = get_model_id(b, "model_id", cmd->u.text_generation.model_id, err)) < 0)
            return rc;
        return get_text(b, "params_json", EXO_PARAMS_MAX, &cmd->u.text_generation.params_json, true, err);
    case EXO_COMMAND_TASK_CANCELLED:
        return get_id(b, "cancelled_command_id", &cmd->u.task_cancelled.cancelled_command_id, true, err);
    case EXO_COMMAND_TASK_FINISHED:
        return get_id(b, "finished_command_id", &cmd->u.task_finished.finished_command_id, true, err);
    default: return exo_err_set(err, EXO_EINTERNAL, "unknown command kind");
    }
}

int exo_command_decode(const uint8_t *buf, size_t len, exo_command *cmd, exo_err *err)
{
    envelope env;
    memset(cmd, 0, sizeof *cmd);
    int rc = dec_envelope(buf, len, exo_command_kind_parse, "command", &env, err);
    if (rc == 0) {
        cmd->kind = (exo_command_kind)env.kind;
        cmd->command_id = env.id;
        rc = dec_command_body(cmd, env.body, err);
        if (rc < 0)
            exo_err_wrap(err, "%s command", exo_command_kind_name(cmd->kind));
        else
            rc = exo_command_validate(cmd, err);
        if (rc < 0) {
            rc = EXO_EFORMAT;
            if (err)
                err->code = rc;
        }
    }
    msgpack_unpacked_destroy(&env.up);
    if (rc < 0)
        exo_command_clear(cmd);
    return rc;
}

/* ---- JSON rendering ------------------------------------------------------------------------------------ */

/* Strings were validated as UTF-8 on the way in; null covers the rest. */
static json_t *jstr(const char *s)
{
    json_t *j = s ? json_string(s) : NULL;
    return j ? j : json_null();
}

static json_t *tagged(const char *tag, json_t *body)
{
    json_t *o = json_object();
    json_object_set_new(o, tag, body);
    return o;
}

static void set_str(json_t *o, const char *key, const char *s) { json_object_set_new(o, key, jstr(s)); }
static void set_int(json_t *o, const char *key, json_int_t v) { json_object_set_new(o, key, json_integer(v)); }

/* params are JSON text; embed them as JSON (a string if somehow invalid). */
static json_t *params_json(const char *s)
{
    if (!s)
        return json_null();
    json_t *j = json_loads(s, 0, NULL);
    return j ? j : jstr(s);
}

json_t *exo__time_ms_to_json(int64_t unix_ms)
{
    if (unix_ms < 0 || unix_ms > MAX_UNIX_MS)
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

json_t *exo_instance_to_json(const exo_instance *inst)
{
    const char *shard_tag = inst->sharding == EXO_SHARDING_TENSOR ? "TensorShardMetadata" : "PipelineShardMetadata";
    json_t *r2s = json_object(), *n2r = json_object();
    for (size_t i = 0; i < inst->n_shards; i++) {
        const exo_shard *s = &inst->shards[i];
        json_t *sj = json_object();
        json_t *card = json_object();
        set_str(card, "modelId", inst->model_id);
        json_object_set_new(sj, "modelCard", card);
        set_int(sj, "deviceRank", s->device_rank);
        set_int(sj, "worldSize", s->world_size);
        set_int(sj, "startLayer", s->start_layer);
        set_int(sj, "endLayer", s->end_layer);
        set_int(sj, "nLayers", s->n_layers);
        json_object_set_new(r2s, s->runner_id.s, tagged(shard_tag, sj));
        set_str(n2r, s->node_id.s, s->runner_id.s);
    }
    json_t *sa = json_object();
    set_str(sa, "modelId", inst->model_id);
    json_object_set_new(sa, "runnerToShard", r2s);
    json_object_set_new(sa, "nodeToRunner", n2r);
    json_t *body = json_object();
    set_str(body, "instanceId", inst->instance_id.s);
    json_object_set_new(body, "shardAssignments", sa);
    set_str(body, "sharding", exo_sharding_name(inst->sharding));
    char tag[64];
    snprintf(tag, sizeof tag, "%sInstance", exo_instance_meta_name(inst->meta));
    return tagged(tag, body);
}

json_t *exo_runner_status_to_json(const exo_runner_status *st)
{
    json_t *body = json_object();
    if (st->kind == EXO_RUNNER_LOADING) {
        set_int(body, "layersLoaded", st->layers_loaded);
        set_int(body, "totalLayers", st->total_layers);
    } else if (st->kind == EXO_RUNNER_READY) {
        json_object_set_new(body, "prefillServerPort",
                            st->prefill_server_port >= 0 ? json_integer(st->prefill_server_port) : json_null());
    } else if (st->kind == EXO_RUNNER_FAILED) {
        set_str(body, "errorMessage", st->error_message);
    }
    char tag[64];
    snprintf(tag, sizeof tag, "Runner%s", exo_runner_status_name(st->kind));
    return tagged(tag, body);
}

json_t *exo_task_to_json(const exo_task *t)
{
    json_t *body = json_object();
    set_str(body, "taskId", t->task_id.s);
    set_str(body, "taskStatus", exo_task_status_name(t->status));
    set_str(body, "instanceId", t->instance_id.s);
    switch (t->kind) {
    case EXO_TASK_KIND_TEXT_GENERATION:
        set_str(body, "commandId", t->command_id.s);
        json_object_set_new(body, "taskParams", params_json(t->params_json));
        set_str(body, "errorType", t->error_type);
        set_str(body, "errorMessage", t->error_message);
        break;
    case EXO_TASK_KIND_CREATE_RUNNER:
        set_str(body, "boundRunnerId", t->runner_id.s);
        set_str(body, "boundNodeId", t->node_id.s);
        break;
    case EXO_TASK_KIND_CANCEL_TASK:
        set_str(body, "cancelledTaskId", t->cancelled_task_id.s);
        set_str(body, "runnerId", t->runner_id.s);
        break;
    case EXO_TASK_KIND_SHUTDOWN:
        set_str(body, "runnerId", t->runner_id.s);
        break;
    default: break;
    }
    if (t->kind != EXO_TASK_KIND_TEXT_GENERATION && (t->error_type || t->error_message)) {
        set_str(body, "errorType", t->error_type);
        set_str(body, "errorMessage", t->error_message);
    }
    return tagged(exo_task_kind_name(t->kind), body);
}

static json_t *node_info_json(const exo_node_info *info)
{
    json_t *o = json_object();
    json_t *tot = json_object(), *avail = json_object();
    set_int(tot, "inBytes", (json_int_t)info->memory_total);
    set_int(avail, "inBytes", (json_int_t)info->memory_available);
    json_object_set_new(o, "ramTotal", tot);
    json_object_set_new(o, "ramAvailable", avail);
    set_int(o, "cpuCount", info->cpu_count);
    set_str(o, "friendlyName", info->friendly_name);
    json_t *b = json_array();
    for (int k = 0; k < EXO_BACKEND__COUNT; k++)
        if (info->backends & (1u << k))
            json_array_append_new(b, json_string(exo_backend_name((exo_backend_kind)k)));
    json_object_set_new(o, "backends", b);
    return o;
}

json_t *exo_event_to_json(const exo_event *ev)
{
    json_t *b = json_object();
    set_str(b, "eventId", ev->event_id.s);
    switch (ev->kind) {
    case EXO_EVENT_INSTANCE_CREATED:
        json_object_set_new(b, "instance", exo_instance_to_json(&ev->u.instance_created.instance));
        break;
    case EXO_EVENT_INSTANCE_DELETED: set_str(b, "instanceId", ev->u.instance_deleted.instance_id.s); break;
    case EXO_EVENT_RUNNER_STATUS_UPDATED:
        set_str(b, "runnerId", ev->u.runner_status_updated.runner_id.s);
        json_object_set_new(b, "runnerStatus", exo_runner_status_to_json(&ev->u.runner_status_updated.status));
        break;
    case EXO_EVENT_RUNNER_DELETED: set_str(b, "runnerId", ev->u.runner_deleted.runner_id.s); break;
    case EXO_EVENT_TASK_CREATED:
        set_str(b, "taskId", ev->u.task_created.task.task_id.s);
        json_object_set_new(b, "task", exo_task_to_json(&ev->u.task_created.task));
        break;
    case EXO_EVENT_TASK_STATUS_UPDATED:
        set_str(b, "taskId", ev->u.task_status_updated.task_id.s);
        set_str(b, "taskStatus", exo_task_status_name(ev->u.task_status_updated.status));
        break;
    case EXO_EVENT_TASK_FAILED:
        set_str(b, "taskId", ev->u.task_failed.task_id.s);
        set_str(b, "errorType", ev->u.task_failed.error_type);
        set_str(b, "errorMessage", ev->u.task_failed.error_message);
        break;
    case EXO_EVENT_TASK_DELETED: set_str(b, "taskId", ev->u.task_deleted.task_id.s); break;
    case EXO_EVENT_NODE_GATHERED_INFO:
        set_str(b, "nodeId", ev->u.node_gathered_info.node_id.s);
        json_object_set_new(b, "when", exo__time_ms_to_json(ev->u.node_gathered_info.when_ms));
        json_object_set_new(b, "info", node_info_json(&ev->u.node_gathered_info.info));
        break;
    case EXO_EVENT_NODE_TIMED_OUT: set_str(b, "nodeId", ev->u.node_timed_out.node_id.s); break;
    default: break;
    }
    return tagged(exo_event_kind_name(ev->kind), b);
}

json_t *exo_command_to_json(const exo_command *cmd)
{
    json_t *b = json_object();
    set_str(b, "commandId", cmd->command_id.s);
    switch (cmd->kind) {
    case EXO_COMMAND_PLACE_INSTANCE:
        set_str(b, "modelId", cmd->u.place_instance.model_id);
        set_str(b, "sharding", exo_sharding_name(cmd->u.place_instance.sharding));
        set_str(b, "instanceMeta", exo_instance_meta_name(cmd->u.place_instance.meta));
        set_int(b, "minNodes", cmd->u.place_instance.min_nodes);
        break;
    case EXO_COMMAND_CREATE_INSTANCE:
        json_object_set_new(b, "instance", exo_instance_to_json(&cmd->u.create_instance.instance));
        break;
    case EXO_COMMAND_DELETE_INSTANCE: set_str(b, "instanceId", cmd->u.delete_instance.instance_id.s); break;
    case EXO_COMMAND_TEXT_GENERATION:
        set_str(b, "modelId", cmd->u.text_generation.model_id);
        json_object_set_new(b, "taskParams", params_json(cmd->u.text_generation.params_json));
        break;
    case EXO_COMMAND_TASK_CANCELLED:
        set_str(b, "cancelledCommandId", cmd->u.task_cancelled.cancelled_command_id.s);
        break;
    case EXO_COMMAND_TASK_FINISHED:
        set_str(b, "finishedCommandId", cmd->u.task_finished.finished_command_id.s);
        break;
    default: break;
    }
    return tagged(exo_command_kind_name(cmd->kind), b);
}

/* ---- instance from JSON (POST /instance) ---------------------------------- */

/* camelCase or snake_case member */
static json_t *member(const json_t *o, const char *camel, const char *snake)
{
    json_t *v = json_object_get(o, camel);
    return v ? v : json_object_get(o, snake);
}

/* {"Tag": body}: the tag (one key) and its body object. */
static const char *untag(const json_t *j, json_t **body)
{
    if (!json_is_object(j) || json_object_size(j) != 1)
        return NULL;
    const char *tag = json_object_iter_key(json_object_iter((json_t *)j));
    *body = json_object_iter_value(json_object_iter((json_t *)j));
    return json_is_object(*body) ? tag : NULL;
}

static int int_member(const json_t *o, const char *camel, const char *snake, int32_t *out, exo_err *err)
{
    json_t *v = member(o, camel, snake);
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
        return exo_err_set(err, EXO_EINVAL, "instance: %s must be a non-negative integer", camel);
    *out = (int32_t)json_integer_value(v);
    return 0;
}

int exo_instance_from_json(const json_t *j, exo_instance *out, exo_err *err)
{
    memset(out, 0, sizeof *out);
    json_t *body;
    const char *tag = untag(j, &body);
    if (!tag)
        return exo_err_set(err, EXO_EINVAL, "instance: expected {\"MlxRingInstance\": {...}}");
    size_t tl = strlen(tag);
    int meta = tl > 8 && !strcmp(tag + tl - 8, "Instance") ? exo_instance_meta_parse(tag, tl - 8) : -1;
    if (meta < 0)
        return exo_err_set(err, EXO_EINVAL, "instance: unknown instance type %.64s", tag);
    out->meta = (exo_instance_meta)meta;
    const char *id = json_string_value(member(body, "instanceId", "instance_id"));
    json_t *sa = member(body, "shardAssignments", "shard_assignments");
    json_t *r2s = member(sa, "runnerToShard", "runner_to_shard");
    json_t *n2r = member(sa, "nodeToRunner", "node_to_runner");
    const char *model = json_string_value(member(sa, "modelId", "model_id"));
    int rc = 0;
    if (!id || exo_id_set(&out->instance_id, id, NULL))
        return exo_err_set(err, EXO_EINVAL, "instance: instanceId must be an id string");
    if (!model || !exo_model_id_valid(model, strlen(model)))
        return exo_err_set(err, EXO_EINVAL, "instance: shardAssignments.modelId must be a model id");
    snprintf(out->model_id, sizeof out->model_id, "%s", model);
    if (!json_is_object(r2s) || !json_is_object(n2r) || !json_object_size(r2s) ||
        json_object_size(r2s) > EXO_MAX_SHARDS || json_object_size(n2r) != json_object_size(r2s))
        return exo_err_set(err, EXO_EINVAL,
                           "instance: runnerToShard and nodeToRunner must be non-empty objects of equal size");
    out->n_shards = json_object_size(r2s);
    out->shards = exo_calloc(out->n_shards, sizeof *out->shards);
    const char *rid;
    json_t *tagged_shard;
    size_t i = 0;
    int sharding = -1;
    json_object_foreach(r2s, rid, tagged_shard) {
        json_t *sb;
        const char *st = untag(tagged_shard, &sb);
        int sk = !st ? -1 : !strcmp(st, "PipelineShardMetadata") ? EXO_SHARDING_PIPELINE
                          : !strcmp(st, "TensorShardMetadata")   ? EXO_SHARDING_TENSOR : -1;
        if (sk < 0 || (sharding >= 0 && sk != sharding)) {
            rc = exo_err_set(err, EXO_EINVAL, "instance: shard of runner %.64s: expected one kind of "
                             "{\"PipelineShardMetadata\"|\"TensorShardMetadata\": {...}}", rid);
            break;
        }
        sharding = sk;
        exo_shard *s = &out->shards[i++];
        if ((rc = exo_id_set(&s->runner_id, rid, err)) ||
            (rc = int_member(sb, "deviceRank", "device_rank", &s->device_rank, err)) ||
            (rc = int_member(sb, "worldSize", "world_size", &s->world_size, err)) ||
            (rc = int_member(sb, "startLayer", "start_layer", &s->start_layer, err)) ||
            (rc = int_member(sb, "endLayer", "end_layer", &s->end_layer, err)) ||
            (rc = int_member(sb, "nLayers", "n_layers", &s->n_layers, err)))
            break;
        const char *nid;
        json_t *rv;
        bool found = false;
        json_object_foreach(n2r, nid, rv) {
            if (json_is_string(rv) && !strcmp(json_string_value(rv), rid)) {
                if ((rc = exo_id_set(&s->node_id, nid, err)))
                    break;
                found = true;
            }
        }
        if (!rc && !found)
            rc = exo_err_set(err, EXO_EINVAL, "instance: runner %.64s has no node in nodeToRunner", rid);
        if (rc)
            break;
    }
    if (!rc) {
        out->sharding = (exo_sharding)sharding;
        /* shards are ordered by rank, as exo_instance_validate expects */
        for (size_t a = 1; a < out->n_shards; a++)
            for (size_t b = a; b > 0 && out->shards[b - 1].device_rank > out->shards[b].device_rank; b--) {
                exo_shard t = out->shards[b];
                out->shards[b] = out->shards[b - 1];
                out->shards[b - 1] = t;
            }
        rc = exo_instance_validate(out, err);
    }
    if (rc)
        exo_instance_clear(out);
    return rc;
}
