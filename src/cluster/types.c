/* Cluster value types: enum name tables, deep copy / clear / equality and
 * invariant checks (see types.h). The validators are what the codecs
 * run on every decoded record, so they are written for hostile input: no
 * asserts, every bound checked, a message naming the offending field. */
#include "cluster/types.h"

#include "cluster/codec.h"
#include "core/alloc.h"

#include <jansson.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- enum tables ----------------------------------------------------------- */

#define NAME_ITEM(n, s) s,
static const char *const task_status_names[] = {EXO_TASK_STATUS_MAP(NAME_ITEM)};
static const char *const task_kind_names[] = {EXO_TASK_KIND_MAP(NAME_ITEM)};
static const char *const sharding_names[] = {EXO_SHARDING_MAP(NAME_ITEM)};
static const char *const meta_names[] = {EXO_INSTANCE_META_MAP(NAME_ITEM)};
static const char *const backend_names[] = {EXO_BACKEND_MAP(NAME_ITEM)};
static const char *const iface_names[] = {EXO_IFACE_KIND_MAP(NAME_ITEM)};
static const char *const download_kind_names[] = {EXO_DOWNLOAD_KIND_MAP(NAME_ITEM)};
#undef NAME_ITEM

static const char *table_name(const char *const *t, size_t n, int v)
{
    return v >= 0 && (size_t)v < n ? t[v] : "?";
}

static int table_parse(const char *const *t, size_t n, const char *s, size_t len)
{
    for (size_t i = 0; i < n; i++)
        if (strlen(t[i]) == len && memcmp(t[i], s, len) == 0)
            return (int)i;
    return -1;
}

#define ENUM_FUNCS(fname, type, table)                                         \
    const char *exo_##fname##_name(type v)                                     \
    {                                                                          \
        return table_name(table, sizeof table / sizeof *table, (int)v);        \
    }                                                                          \
    int exo_##fname##_parse(const char *s, size_t len)                         \
    {                                                                          \
        return table_parse(table, sizeof table / sizeof *table, s, len);       \
    }
ENUM_FUNCS(task_status, exo_task_status, task_status_names)
ENUM_FUNCS(task_kind, exo_task_kind, task_kind_names)
ENUM_FUNCS(sharding, exo_sharding, sharding_names)
ENUM_FUNCS(instance_meta, exo_instance_meta, meta_names)
ENUM_FUNCS(backend, exo_backend_kind, backend_names)
ENUM_FUNCS(iface_kind, exo_iface_kind, iface_names)
ENUM_FUNCS(download_kind, exo_download_kind, download_kind_names)
#undef ENUM_FUNCS

/* The same tables as field-codec enum descriptors (int-typed accessors). */
#define ENUM_DESC(fname, type, count)                                                   \
    static const char *fname##_name_i(int v) { return exo_##fname##_name((type)v); }   \
    const exo_enum_desc exo_##fname##_enum = {fname##_name_i, exo_##fname##_parse, count};
ENUM_DESC(task_status, exo_task_status, EXO_TASK_STATUS__COUNT)
ENUM_DESC(sharding, exo_sharding, EXO_SHARDING__COUNT)
ENUM_DESC(instance_meta, exo_instance_meta, EXO_INSTANCE_META__COUNT)
ENUM_DESC(backend, exo_backend_kind, EXO_BACKEND__COUNT)
ENUM_DESC(iface_kind, exo_iface_kind, EXO_IFACE__COUNT)
ENUM_DESC(download_kind, exo_download_kind, EXO_DOWNLOAD_KIND__COUNT)
#undef ENUM_DESC

_Static_assert(sizeof task_kind_names / sizeof *task_kind_names == EXO_TASK_KIND__COUNT, "table");
_Static_assert(EXO_BACKEND__COUNT <= 32, "backends are a 32-bit set");

static int check_id(const exo_id *id, const char *what, exo_err *err)
{
    size_t len = strnlen(id->s, EXO_ID_MAX);
    if (!exo_id_valid(id->s, len))
        return exo_err_set(err, EXO_EINVAL, "%s: invalid id", what);
    return 0;
}

/* ---- instances -------------------------------------------------------------------- */

void exo_instance_copy(exo_instance *dst, const exo_instance *src)
{
    *dst = *src;
    dst->shards = NULL;
    if (src->n_shards) {
        dst->shards = exo_calloc(src->n_shards, sizeof *dst->shards);
        memcpy(dst->shards, src->shards, src->n_shards * sizeof *dst->shards);
    }
}

void exo_instance_clear(exo_instance *inst)
{
    exo_free(inst->shards);
    memset(inst, 0, sizeof *inst);
}

bool exo_instance_equal(const exo_instance *a, const exo_instance *b)
{
    if (!exo_id_eq(&a->instance_id, &b->instance_id) || strcmp(a->model_id, b->model_id) != 0 ||
        a->sharding != b->sharding || a->meta != b->meta || a->n_shards != b->n_shards)
        return false;
    for (size_t i = 0; i < a->n_shards; i++) {
        const exo_shard *x = &a->shards[i], *y = &b->shards[i];
        if (!exo_id_eq(&x->runner_id, &y->runner_id) || !exo_id_eq(&x->node_id, &y->node_id) ||
            x->device_rank != y->device_rank || x->world_size != y->world_size ||
            x->start_layer != y->start_layer || x->end_layer != y->end_layer ||
            x->n_layers != y->n_layers || strcmp(x->device, y->device))
            return false;
    }
    return true;
}

/* Two ranks on one node must say where each runs, and never on one GPU
 * (NCCL takes a GPU per rank, and two processes on one GPU take turns). */
static bool shards_can_share_node(const exo_shard *a, const exo_shard *b)
{
    const char *x = a->device, *y = b->device;
    if (!*x || !*y || !strcmp(x, "auto") || !strcmp(y, "auto"))
        return false;
    int gx = exo_device_gpu(x), gy = exo_device_gpu(y);
    return gx < 0 || gy < 0 || gx != gy;
}

int exo_instance_validate(const exo_instance *inst, exo_err *err)
{
    int rc;
    if ((rc = check_id(&inst->instance_id, "instance id", err)) < 0)
        return rc;
    if (!exo_model_id_valid(inst->model_id, strnlen(inst->model_id, EXO_MODEL_ID_MAX)))
        return exo_err_set(err, EXO_EINVAL, "instance %s: invalid model id", inst->instance_id.s);
    if ((unsigned)inst->sharding >= EXO_SHARDING__COUNT || (unsigned)inst->meta >= EXO_INSTANCE_META__COUNT)
        return exo_err_set(err, EXO_EINVAL, "instance %s: bad sharding or meta", inst->instance_id.s);
    if (inst->n_shards == 0 || inst->n_shards > EXO_MAX_SHARDS || !inst->shards)
        return exo_err_set(err, EXO_EINVAL, "instance %s: %zu shards (1..%d allowed)",
                           inst->instance_id.s, inst->n_shards, EXO_MAX_SHARDS);
    for (size_t i = 0; i < inst->n_shards; i++) {
        const exo_shard *s = &inst->shards[i];
        if ((rc = check_id(&s->runner_id, "shard runner id", err)) < 0 ||
            (rc = check_id(&s->node_id, "shard node id", err)) < 0)
            return exo_err_wrap(err, "instance %s", inst->instance_id.s);
        if (s->device_rank != (int32_t)i || s->world_size != (int32_t)inst->n_shards)
            return exo_err_set(err, EXO_EINVAL, "instance %s: shard %zu has rank %d of %d",
                               inst->instance_id.s, i, (int)s->device_rank, (int)s->world_size);
        if (s->n_layers < 1 || s->start_layer < 0 || s->start_layer >= s->end_layer ||
            s->end_layer > s->n_layers || s->n_layers != inst->shards[0].n_layers)
            return exo_err_set(err, EXO_EINVAL, "instance %s: shard %zu layers [%d, %d) of %d",
                               inst->instance_id.s, i, (int)s->start_layer, (int)s->end_layer,
                               (int)s->n_layers);
        if (strnlen(s->device, sizeof s->device) == sizeof s->device || !exo_device_valid(s->device))
            return exo_err_set(err, EXO_EINVAL, "instance %s: shard %zu: device is not one of auto, cpu, "
                               "cuda, cuda:N", inst->instance_id.s, i);
        for (size_t j = 0; j < i; j++) {
            const exo_shard *o = &inst->shards[j];
            if (exo_id_eq(&s->runner_id, &o->runner_id))
                return exo_err_set(err, EXO_EINVAL, "instance %s: shards %zu and %zu share a runner",
                                   inst->instance_id.s, j, i);
            if (exo_id_eq(&s->node_id, &o->node_id) && !shards_can_share_node(o, s))
                return exo_err_set(err, EXO_EINVAL, "instance %s: shards %zu and %zu share node %s without "
                                   "a device each (cpu, or a GPU of its own)", inst->instance_id.s, j, i,
                                   s->node_id.s);
        }
    }
    return 0;
}

const exo_shard *exo_instance_shard_of_runner(const exo_instance *inst, const exo_id *runner_id)
{
    for (size_t i = 0; i < inst->n_shards; i++)
        if (exo_id_eq(&inst->shards[i].runner_id, runner_id))
            return &inst->shards[i];
    return NULL;
}

const exo_shard *exo_instance_shard_of_node(const exo_instance *inst, const exo_id *node_id)
{
    for (size_t i = 0; i < inst->n_shards; i++)
        if (exo_id_eq(&inst->shards[i].node_id, node_id))
            return &inst->shards[i];
    return NULL;
}

/* ---- tasks --------------------------------------------------------------------------- */

void exo_task_copy(exo_task *dst, const exo_task *src)
{
    *dst = *src;
    dst->params_json = exo__strdup_null(src->params_json);
    dst->error_type = exo__strdup_null(src->error_type);
    dst->error_message = exo__strdup_null(src->error_message);
}

void exo_task_clear(exo_task *t)
{
    exo_free(t->params_json);
    exo_free(t->error_type);
    exo_free(t->error_message);
    memset(t, 0, sizeof *t);
}

bool exo_task_equal(const exo_task *a, const exo_task *b)
{
    return exo_id_eq(&a->task_id, &b->task_id) && a->kind == b->kind && a->status == b->status &&
           exo_id_eq(&a->instance_id, &b->instance_id) && exo_id_eq(&a->command_id, &b->command_id) &&
           exo_id_eq(&a->runner_id, &b->runner_id) && exo_id_eq(&a->node_id, &b->node_id) &&
           exo_id_eq(&a->cancelled_task_id, &b->cancelled_task_id) &&
           exo__str_eq_null(a->params_json, b->params_json) &&
           exo__str_eq_null(a->error_type, b->error_type) &&
           exo__str_eq_null(a->error_message, b->error_message);
}

/* An optional id is either empty or valid. */
static int check_opt_id(const exo_id *id, bool required, bool allowed, const char *what, exo_err *err)
{
    if (exo_id_is_empty(id)) {
        if (required)
            return exo_err_set(err, EXO_EINVAL, "%s: missing", what);
        return 0;
    }
    if (!allowed)
        return exo_err_set(err, EXO_EINVAL, "%s: not used by this task kind", what);
    return check_id(id, what, err);
}

int exo_task_validate(const exo_task *t, exo_err *err)
{
    int rc;
    if ((rc = check_id(&t->task_id, "task id", err)) < 0)
        return rc;
    if ((unsigned)t->kind >= EXO_TASK_KIND__COUNT || (unsigned)t->status >= EXO_TASK_STATUS__COUNT)
        return exo_err_set(err, EXO_EINVAL, "task %s: bad kind or status", t->task_id.s);
    bool gen = t->kind == EXO_TASK_KIND_TEXT_GENERATION;
    bool create = t->kind == EXO_TASK_KIND_CREATE_RUNNER;
    bool cancel = t->kind == EXO_TASK_KIND_CANCEL_TASK;
    bool shutdown = t->kind == EXO_TASK_KIND_SHUTDOWN;
    if ((rc = check_id(&t->instance_id, "task instance id", err)) < 0 ||
        (rc = check_opt_id(&t->command_id, gen, gen, "task command id", err)) < 0 ||
        (rc = check_opt_id(&t->runner_id, create || cancel || shutdown, create || cancel || shutdown,
                           "task runner id", err)) < 0 ||
        (rc = check_opt_id(&t->node_id, create, create || gen, "task node id", err)) < 0 ||
        (rc = check_opt_id(&t->cancelled_task_id, cancel, cancel, "task cancelled task id", err)) < 0)
        return exo_err_wrap(err, "task %s", t->task_id.s);
    if (gen != (t->params_json != NULL))
        return exo_err_set(err, EXO_EINVAL, "task %s: params are for TextGeneration tasks only "
                           "and required there", t->task_id.s);
    if ((t->params_json && (rc = exo__check_params_json(t->params_json, err)) < 0) ||
        (rc = exo__check_text(t->error_type, EXO_MESSAGE_MAX, "task error type", err)) < 0 ||
        (rc = exo__check_text(t->error_message, EXO_MESSAGE_MAX, "task error message", err)) < 0)
        return exo_err_wrap(err, "task %s", t->task_id.s);
    return 0;
}

/* ---- model cards ----------------------------------------------------------------------------- */

static const exo_field card_fields[] = {
    EXO_FIELD(exo_model_card, model_id, "model_id", "modelId", exo_ft_model_id),
    EXO_FIELD_RANGE(exo_model_card, n_layers, "n_layers", "nLayers", exo_ft_i32, 1, 1 << 20),
    EXO_FIELD_RANGE(exo_model_card, hidden_size, "hidden_size", "hiddenSize", exo_ft_i32, 0, 1 << 24),
    EXO_FIELD_RANGE(exo_model_card, n_kv_heads, "n_kv_heads", "numKeyValueHeads", exo_ft_i32, 0, 1 << 16),
    EXO_FIELD(exo_model_card, storage_bytes, "storage_bytes", "storageSize", exo_ft_u64),
    {"vocab_size", "vocabSize", &exo_ft_i32, offsetof(exo_model_card, vocab_size), true, 0, 1 << 26, NULL, NULL},
    EXO_FIELD(exo_model_card, supports_tensor, "supports_tensor", "supportsTensor", exo_ft_bool),
    EXO_FIELD_OPT(exo_model_card, model_type, "model_type", "modelType", exo_ft_name),
    EXO_FIELD_OPT(exo_model_card, quantization, "quantization", "quantization", exo_ft_name),
    {"context_length", "contextLength", &exo_ft_i64, offsetof(exo_model_card, context_length), true, 0,
     INT64_MAX, NULL, NULL},
    {"supports_tools", "supportsTools", &exo_ft_bool, offsetof(exo_model_card, supports_tools), true, 0, 0, NULL,
     NULL},
    {"supports_thinking", "supportsThinking", &exo_ft_bool, offsetof(exo_model_card, supports_thinking), true, 0, 0,
     NULL, NULL},
};
const exo_record_desc exo_model_card_desc = EXO_RECORD("model card", exo_model_card, card_fields);

int exo_model_card_validate(const exo_model_card *c, exo_err *err)
{
    return exo_record_validate(&exo_model_card_desc, c, err);
}

/* ---- downloads ------------------------------------------------------------------------------ */

#define DF(member, key, json, type) EXO_FIELD(exo_download_status, member, key, json, type)
#define DF_OPT(member, key, json, type, lo, hi) \
    {key, json, &(type), offsetof(exo_download_status, member), true, (lo), (hi), NULL, NULL}
static const exo_field download_fields[] = {
    DF(node_id, "node_id", "nodeId", exo_ft_id),
    DF(model_id, "model_id", "modelId", exo_ft_model_id),
    EXO_FIELD_ENUM(exo_download_status, kind, "kind", "kind", exo_download_kind_enum),
    DF_OPT(start_layer, "start_layer", "startLayer", exo_ft_i32, 0, 1 << 20),
    DF_OPT(end_layer, "end_layer", "endLayer", exo_ft_i32, 0, 1 << 20),
    DF_OPT(n_layers, "n_layers", "nLayers", exo_ft_i32, 0, 1 << 20),
    DF_OPT(model_directory, "model_directory", "modelDirectory", exo_ft_text, 0, 4096),
    DF_OPT(total, "total", "total", exo_ft_u64, 0, 0),
    DF_OPT(downloaded, "downloaded", "downloaded", exo_ft_u64, 0, 0),
    DF_OPT(downloaded_this_session, "downloaded_this_session", "downloadedThisSession", exo_ft_u64, 0, 0),
    DF_OPT(completed_files, "completed_files", "completedFiles", exo_ft_i32, 0, 1 << 20),
    DF_OPT(total_files, "total_files", "totalFiles", exo_ft_i32, 0, 1 << 20),
    DF_OPT(speed, "speed", "speed", exo_ft_u64, 0, 0),
    DF_OPT(eta_ms, "eta_ms", "etaMs", exo_ft_i64, 0, INT64_MAX),
    DF_OPT(read_only, "read_only", "readOnly", exo_ft_bool, 0, 0),
    DF_OPT(error_message, "error_message", "errorMessage", exo_ft_text, 0, 0),
};
#undef DF
#undef DF_OPT
const exo_record_desc exo_download_status_desc = EXO_RECORD("download", exo_download_status, download_fields);

void exo_download_status_copy(exo_download_status *dst, const exo_download_status *src)
{
    exo_record_copy(&exo_download_status_desc, dst, src);
}

void exo_download_status_clear(exo_download_status *st) { exo_record_clear(&exo_download_status_desc, st); }

/* ---- node info ------------------------------------------------------------------------------ */

static const exo_field gpu_fields[] = {
    EXO_FIELD_RANGE(exo_gpu_info, index, "index", "index", exo_ft_i32, 0, 1024),
    EXO_FIELD(exo_gpu_info, name, "name", "name", exo_ft_name),
    EXO_FIELD(exo_gpu_info, memory_total, "memory_total", "memoryTotal", exo_ft_u64),
    EXO_FIELD(exo_gpu_info, memory_used, "memory_used", "memoryUsed", exo_ft_u64),
    EXO_FIELD_OPT(exo_gpu_info, memory_read_bps, "memory_read_bps", "memoryReadBps", exo_ft_u64),
};
static const exo_record_desc gpu_desc = EXO_RECORD("gpu", exo_gpu_info, gpu_fields);

static const exo_field iface_fields[] = {
    EXO_FIELD(exo_net_iface, name, "name", "name", exo_ft_name),
    EXO_FIELD(exo_net_iface, ip, "ip", "ip", exo_ft_addr),
    EXO_FIELD_ENUM(exo_net_iface, kind, "kind", "kind", exo_iface_kind_enum),
};
static const exo_record_desc iface_desc = EXO_RECORD("interface", exo_net_iface, iface_fields);


static const exo_field node_info_fields[] = {
    EXO_FIELD(exo_node_info, memory_total, "memory_total", "memoryTotal", exo_ft_u64),
    EXO_FIELD(exo_node_info, memory_available, "memory_available", "memoryAvailable", exo_ft_u64),
    EXO_FIELD_RANGE(exo_node_info, cpu_count, "cpu_count", "cpuCount", exo_ft_i32, 0, INT32_MAX),
    EXO_FIELD(exo_node_info, friendly_name, "friendly_name", "friendlyName", exo_ft_name),
    EXO_FIELD_BITSET(exo_node_info, backends, "backends", "backends", exo_backend_enum),
    EXO_FIELD_OPT(exo_node_info, cpu_model, "cpu_model", "cpuModel", exo_ft_name),
    EXO_FIELD_OPT(exo_node_info, os, "os", "os", exo_ft_name),
    EXO_FIELD_OPT(exo_node_info, disk_total, "disk_total", "diskTotal", exo_ft_u64),
    EXO_FIELD_OPT(exo_node_info, disk_available, "disk_available", "diskAvailable", exo_ft_u64),
    EXO_FIELD_OPT(exo_node_info, mem_read_bps, "mem_read_bps", "memReadBps", exo_ft_u64),
    {"api_port", "apiPort", &exo_ft_i32, offsetof(exo_node_info, api_port), true, 0, 65535, NULL, NULL},
    {"cluster_port", "clusterPort", &exo_ft_i32, offsetof(exo_node_info, cluster_port), true, 0, 65535, NULL, NULL},
    {"gpus", "gpus", &exo_ft_array, offsetof(exo_node_info, gpus), true, 0, EXO_NODE_MAX_GPUS, NULL, &gpu_desc},
    {"interfaces", "interfaces", &exo_ft_array, offsetof(exo_node_info, interfaces), true, 0,
     EXO_NODE_MAX_INTERFACES, NULL, &iface_desc},
    {"models", "models", &exo_ft_array, offsetof(exo_node_info, models), true, 0, EXO_NODE_MAX_MODELS, NULL,
     &exo_model_card_desc},
};
const exo_record_desc exo_node_info_desc = EXO_RECORD("node info", exo_node_info, node_info_fields);

_Static_assert(sizeof(((exo_node_info *)0)->gpus) == 2 * sizeof(void *), "EXO__ARRAY is codec.h's EXO_ARRAY");

void exo_node_info_copy(exo_node_info *dst, const exo_node_info *src) { exo_record_copy(&exo_node_info_desc, dst, src); }
void exo_node_info_clear(exo_node_info *info) { exo_record_clear(&exo_node_info_desc, info); }
bool exo_node_info_equal(const exo_node_info *a, const exo_node_info *b)
{
    return exo_record_equal(&exo_node_info_desc, a, b);
}

int exo_node_info_validate(const exo_node_info *info, exo_err *err)
{
    int rc = exo_record_validate(&exo_node_info_desc, info, err);
    if (rc < 0)
        exo_err_wrap(err, "node info");
    return rc;
}

const exo_model_card *exo_node_info_model(const exo_node_info *info, const char *model_id)
{
    for (size_t i = 0; i < info->models.n; i++)
        if (!strcmp(info->models.v[i].model_id, model_id))
            return &info->models.v[i];
    return NULL;
}

/* ---- topology ------------------------------------------------------------------------------ */

static const exo_field edge_fields[] = {
    EXO_FIELD(exo_topology_edge, source, "source", "source", exo_ft_id),
    EXO_FIELD(exo_topology_edge, sink, "sink", "sink", exo_ft_id),
    EXO_FIELD(exo_topology_edge, address, "address", "address", exo_ft_addr),
    EXO_FIELD_RANGE(exo_topology_edge, latency_us, "latency_us", "latencyUs", exo_ft_i64, 0, INT64_MAX),
    EXO_FIELD(exo_topology_edge, bandwidth_bps, "bandwidth_bps", "bandwidthBps", exo_ft_u64),
};
const exo_record_desc exo_topology_edge_desc = EXO_RECORD("edge", exo_topology_edge, edge_fields);

bool exo_topology_edge_same(const exo_topology_edge *a, const exo_topology_edge *b)
{
    return exo_id_eq(&a->source, &b->source) && exo_id_eq(&a->sink, &b->sink) &&
           strcmp(a->address, b->address) == 0;
}

int exo_topology_edge_validate(const exo_topology_edge *e, exo_err *err)
{
    int rc = exo_record_validate(&exo_topology_edge_desc, e, err);
    if (rc == 0 && exo_id_eq(&e->source, &e->sink))
        rc = exo_err_set(err, EXO_EINVAL, "edge from %s to itself", e->source.s);
    return rc;
}

