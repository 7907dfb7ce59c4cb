/* Event and command codecs (see events.h): the kind tables and the field
 * types of the compound records they carry.
 *
 * A kind's row lists its body fields; everything else (msgpack encode and
 * strict decode, validation, deep copy, clear, equality, JSON) is codec.c's
 * generic loops over it. Compound records (instances, tasks, runner
 * statuses) have shapes of their own and cross-field invariants, so each is
 * one hand-written field type below, used by every kind that carries it. */
#include "cluster/events.h"

#include "cluster/codec.h"
#include "core/alloc.h"

#include <stdio.h>
#include <string.h>

typedef const msgpack_object mobj;

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

static const char *task_kind_name_i(int v) { return exo_task_kind_name((exo_task_kind)v); }
static const exo_enum_desc task_kind_enum = {task_kind_name_i, exo_task_kind_parse, EXO_TASK_KIND__COUNT};
static const char *runner_kind_name_i(int v) { return exo_runner_status_name((exo_runner_status_kind)v); }
static const exo_enum_desc runner_kind_enum = {runner_kind_name_i, exo_runner_status_parse, EXO_RUNNER__COUNT};

/* A field descriptor used on its own to read one member of a hand-written
 * record. */
#define LOCAL_FIELD(key, type, opt, lo, hi, en) {key, key, &(type), 0, opt, lo, hi, en, NULL}

/* ---- instances ---------------------------------------------------------------
 * {instance_id, model_id, sharding, meta, shards: [{runner_id, node_id,
 *  device_rank, world_size, start_layer, end_layer, n_layers, device?}]} */

static const exo_field shard_fields[] = {
    EXO_FIELD(exo_shard, runner_id, "runner_id", "runnerId", exo_ft_id),
    EXO_FIELD(exo_shard, node_id, "node_id", "nodeId", exo_ft_id),
    EXO_FIELD_RANGE(exo_shard, device_rank, "device_rank", "deviceRank", exo_ft_i32, 0, INT32_MAX),
    EXO_FIELD_RANGE(exo_shard, world_size, "world_size", "worldSize", exo_ft_i32, 1, INT32_MAX),
    EXO_FIELD_RANGE(exo_shard, start_layer, "start_layer", "startLayer", exo_ft_i32, 0, INT32_MAX),
    EXO_FIELD_RANGE(exo_shard, end_layer, "end_layer", "endLayer", exo_ft_i32, 0, INT32_MAX),
    EXO_FIELD_RANGE(exo_shard, n_layers, "n_layers", "nLayers", exo_ft_i32, 0, INT32_MAX),
    EXO_FIELD_OPT(exo_shard, device, "device", "device", exo_ft_device),
};
static const exo_record_desc shard_desc = EXO_RECORD("shard", exo_shard, shard_fields);

static const exo_field instance_head_fields[] = {
    EXO_FIELD(exo_instance, instance_id, "instance_id", "instanceId", exo_ft_id),
    EXO_FIELD(exo_instance, model_id, "model_id", "modelId", exo_ft_model_id),
    EXO_FIELD_ENUM(exo_instance, sharding, "sharding", "sharding", exo_sharding_enum),
    EXO_FIELD_ENUM(exo_instance, meta, "meta", "meta", exo_instance_meta_enum),
};

static void instance_pack(msgpack_packer *pk, const exo_field *f, const void *v)
{
    const exo_instance *inst = v;
    msgpack_pack_map(pk, 5);
    for (size_t i = 0; i < 4; i++) {
        exo_mp_str(pk, instance_head_fields[i].key);
        instance_head_fields[i].type->pack(pk, &instance_head_fields[i],
                                           (const char *)inst + instance_head_fields[i].offset);
    }
    exo_mp_str(pk, "shards");
    msgpack_pack_array(pk, inst->n_shards);
    for (size_t i = 0; i < inst->n_shards; i++)
        exo_record_pack(pk, &shard_desc, &inst->shards[i]);
}

static int instance_unpack(mobj *m, const exo_field *f, void *v, exo_err *err)
{
    exo_instance *inst = v;
    exo_instance_clear(inst);
    int rc = exo_mp_check_map(m, "instance", err);
    for (size_t i = 0; i < 4 && rc == 0; i++)
        rc = exo_mp_field(m, &instance_head_fields[i], (char *)inst + instance_head_fields[i].offset, err);
    if (rc < 0)
        return rc;
    mobj *a = exo_mp_get(m, "shards");
    if (!a)
        return exo_err_set(err, EXO_EFORMAT, "field shards: missing");
    if (a->type != MSGPACK_OBJECT_ARRAY || a->via.array.size == 0 || a->via.array.size > EXO_MAX_SHARDS)
        return exo_err_set(err, EXO_EFORMAT, "field shards: not an array of 1..%d shards", EXO_MAX_SHARDS);
    inst->n_shards = a->via.array.size;
    inst->shards = exo_calloc(inst->n_shards, sizeof *inst->shards);
    for (size_t i = 0; i < inst->n_shards; i++)
        if ((rc = exo_record_unpack(&a->via.array.ptr[i], &shard_desc, &inst->shards[i], err)) < 0) {
            exo_err_wrap(err, "shard %zu", i);
            return rc;
        }
    return 0;
}

static int instance_validate(const exo_field *f, const void *v, exo_err *err) { return exo_instance_validate(v, err); }
static void instance_copy(const exo_field *f, void *dst, const void *src) { exo_instance_copy(dst, src); }
static void instance_clear(const exo_field *f, void *v) { exo_instance_clear(v); }
static bool instance_equal(const exo_field *f, const void *a, const void *b) { return exo_instance_equal(a, b); }
static json_t *instance_json(const exo_field *f, const void *v) { return exo_instance_to_json(v); }
static const exo_field_type ft_instance = {"instance", NULL, instance_pack, instance_unpack, instance_validate,
                                           instance_copy, instance_clear, instance_equal, instance_json, NULL,
                                           NULL, sizeof(exo_instance)};

/* ---- runner statuses --------------------------------------------------------------
 * {kind, [layers_loaded, total_layers], [prefill_server_port], [ring_port], [error_message]} */

static void status_init(const exo_field *f, void *v) { exo_runner_status_init(v, EXO_RUNNER_IDLE); }

static void status_pack(msgpack_packer *pk, const exo_field *f, const void *v)
{
    const exo_runner_status *st = v;
    bool loading = st->kind == EXO_RUNNER_LOADING;
    bool port = st->prefill_server_port != -1, ring = st->ring_port != -1;
    msgpack_pack_map(pk, 1 + (loading ? 2 : 0) + port + ring + (st->error_message != NULL));
    exo_mp_kstr(pk, "kind", exo_runner_status_name(st->kind));
    if (loading) {
        exo_mp_kint(pk, "layers_loaded", st->layers_loaded);
        exo_mp_kint(pk, "total_layers", st->total_layers);
    }
    if (port)
        exo_mp_kint(pk, "prefill_server_port", st->prefill_server_port);
    if (ring)
        exo_mp_kint(pk, "ring_port", st->ring_port);
    if (st->error_message)
        exo_mp_kstr(pk, "error_message", st->error_message);
}

static int status_unpack(mobj *m, const exo_field *f, void *v, exo_err *err)
{
    exo_runner_status *st = v;
    exo_runner_status_clear(st);
    exo_runner_status_init(st, EXO_RUNNER_IDLE);
    int rc = exo_mp_check_map(m, "status", err), kind = 0;
    static const exo_field kind_f = LOCAL_FIELD("kind", exo_ft_enum, false, 0, 0, &runner_kind_enum);
    if (rc < 0 || (rc = exo_mp_field(m, &kind_f, &kind, err)) < 0)
        return rc;
    st->kind = (exo_runner_status_kind)kind;
    bool loading = st->kind == EXO_RUNNER_LOADING;
    const exo_field loaded_f = LOCAL_FIELD("layers_loaded", exo_ft_i32, !loading, 0, INT32_MAX, NULL);
    const exo_field total_f = LOCAL_FIELD("total_layers", exo_ft_i32, !loading, 0, INT32_MAX, NULL);
    static const exo_field port_f = LOCAL_FIELD("prefill_server_port", exo_ft_i32, true, 1, 65535, NULL);
    static const exo_field ring_f = LOCAL_FIELD("ring_port", exo_ft_i32, true, 1, 65535, NULL);
    static const exo_field msg_f = LOCAL_FIELD("error_message", exo_ft_text, true, 0, 0, NULL);
    if ((rc = exo_mp_field(m, &loaded_f, &st->layers_loaded, err)) < 0 ||
        (rc = exo_mp_field(m, &total_f, &st->total_layers, err)) < 0 ||
        (rc = exo_mp_field(m, &port_f, &st->prefill_server_port, err)) < 0 ||
        (rc = exo_mp_field(m, &ring_f, &st->ring_port, err)) < 0 ||
        (rc = exo_mp_field(m, &msg_f, &st->error_message, err)) < 0)
        return rc;
    return 0;
}

static int status_validate(const exo_field *f, const void *v, exo_err *err) { return exo_runner_status_validate(v, err); }
static void status_copy(const exo_field *f, void *dst, const void *src) { exo_runner_status_copy(dst, src); }
static void status_clear(const exo_field *f, void *v) { exo_runner_status_clear(v); }
static bool status_equal(const exo_field *f, const void *a, const void *b) { return exo_runner_status_equal(a, b); }
static json_t *status_json(const exo_field *f, const void *v) { return exo_runner_status_to_json(v); }
static const exo_field_type ft_status = {"runner status", status_init, status_pack, status_unpack,
                                         status_validate, status_copy, status_clear, status_equal, status_json,
                                         NULL, NULL, sizeof(exo_runner_status)};

/* ---- tasks -----------------------------------------------------------------------
 * {task_id, kind, status, instance_id, [command_id], [runner_id], [node_id],
 *  [cancelled_task_id], [params_json], [error_type], [error_message]};
 * which optional fields a kind uses is exo_task_validate's business. */

static const exo_field task_fields[] = {
    EXO_FIELD(exo_task, task_id, "task_id", "taskId", exo_ft_id),
    EXO_FIELD_ENUM(exo_task, kind, "kind", "kind", task_kind_enum),
    EXO_FIELD_ENUM(exo_task, status, "status", "taskStatus", exo_task_status_enum),
    EXO_FIELD(exo_task, instance_id, "instance_id", "instanceId", exo_ft_id),
    EXO_FIELD_OPT(exo_task, command_id, "command_id", "commandId", exo_ft_id),
    EXO_FIELD_OPT(exo_task, runner_id, "runner_id", "runnerId", exo_ft_id),
    EXO_FIELD_OPT(exo_task, node_id, "node_id", "nodeId", exo_ft_id),
    EXO_FIELD_OPT(exo_task, cancelled_task_id, "cancelled_task_id", "cancelledTaskId", exo_ft_id),
    EXO_FIELD_OPT(exo_task, params_json, "params_json", "taskParams", exo_ft_params),
    EXO_FIELD_OPT(exo_task, error_type, "error_type", "errorType", exo_ft_text),
    EXO_FIELD_OPT(exo_task, error_message, "error_message", "errorMessage", exo_ft_text),
};
static const exo_record_desc task_desc = EXO_RECORD("task", exo_task, task_fields);

static void task_pack(msgpack_packer *pk, const exo_field *f, const void *v) { exo_record_pack(pk, &task_desc, v); }
static int task_unpack(mobj *m, const exo_field *f, void *v, exo_err *err)
{
    exo_task_clear(v);
    return exo_record_unpack(m, &task_desc, v, err);
}
static int task_validate(const exo_field *f, const void *v, exo_err *err) { return exo_task_validate(v, err); }
static void task_copy(const exo_field *f, void *dst, const void *src) { exo_task_copy(dst, src); }
static void task_clear(const exo_field *f, void *v) { exo_task_clear(v); }
static bool task_equal(const exo_field *f, const void *a, const void *b) { return exo_task_equal(a, b); }
static json_t *task_json(const exo_field *f, const void *v) { return exo_task_to_json(v); }
/* exo's TaskCreated carries the task id next to the task. */
static void task_json_set(json_t *obj, const exo_field *f, const void *v)
{
    json_object_set_new(obj, "taskId", json_string(((const exo_task *)v)->task_id.s));
    json_object_set_new(obj, f->json, exo_task_to_json(v));
}
static const exo_field_type ft_task = {"task", NULL, task_pack, task_unpack, task_validate, task_copy,
                                       task_clear, task_equal, task_json, NULL, task_json_set, sizeof(exo_task)};

/* ---- node info: the generic record, rendered in exo's shape -------------------- */

static void info_init(const exo_field *f, void *v) { exo_record_init(&exo_node_info_desc, v); }
static void info_pack(msgpack_packer *pk, const exo_field *f, const void *v) { exo_record_pack(pk, &exo_node_info_desc, v); }
static int info_unpack(mobj *m, const exo_field *f, void *v, exo_err *err)
{
    exo_node_info_clear(v);
    return exo_record_unpack(m, &exo_node_info_desc, v, err);
}
static int info_validate(const exo_field *f, const void *v, exo_err *err) { return exo_node_info_validate(v, err); }
static void info_copy(const exo_field *f, void *dst, const void *src) { exo_node_info_copy(dst, src); }
static void info_clear(const exo_field *f, void *v) { exo_node_info_clear(v); }
static bool info_equal(const exo_field *f, const void *a, const void *b) { return exo_node_info_equal(a, b); }
static json_t *info_json(const exo_field *f, const void *v) { return exo_node_info_to_json(v); }
static const exo_field_type ft_node_info = {"node info", info_init, info_pack, info_unpack, info_validate,
                                            info_copy, info_clear, info_equal, info_json, NULL, NULL,
                                            sizeof(exo_node_info)};

json_t *exo_node_info_to_json(const exo_node_info *info)
{
    json_t *o = json_object();
    exo_record_to_json(&exo_node_info_desc, info, o);
    /* exo's Memory values: {"inBytes": n} */
    json_object_del(o, "memoryTotal");
    json_object_del(o, "memoryAvailable");
    json_object_set_new(o, "ramTotal", json_pack("{s:I}", "inBytes", (json_int_t)info->memory_total));
    json_object_set_new(o, "ramAvailable", json_pack("{s:I}", "inBytes", (json_int_t)info->memory_available));
    return o;
}

/* ---- the kind tables ------------------------------------------------------------------ */

#define EF(member, key, json, type) {key, json, &(type), offsetof(exo_event, u.member), false, 0, 0, NULL, NULL}
#define EF_ENUM(member, key, json, desc) \
    {key, json, &exo_ft_enum, offsetof(exo_event, u.member), false, 0, 0, &(desc), NULL}
#define EF_RANGE(member, key, json, type, lo, hi) \
    {key, json, &(type), offsetof(exo_event, u.member), false, (lo), (hi), NULL, NULL}
#define EF_RECORD(member, key, json, desc) \
    {key, json, &exo_ft_record, offsetof(exo_event, u.member), false, 0, 0, NULL, &(desc)}

static const exo_field ev_instance_created[] = {EF(instance_created.instance, "instance", "instance", ft_instance)};
#define EF_OPT(member, key, json, type, hi) \
    {key, json, &(type), offsetof(exo_event, u.member), true, 0, (hi), NULL, NULL}

/* model_id, reason and when_ms came later: optional, so older logs decode */
static const exo_field ev_instance_deleted[] = {
    EF(instance_deleted.instance_id, "instance_id", "instanceId", exo_ft_id),
    EF_OPT(instance_deleted.model_id, "model_id", "modelId", exo_ft_model_id, 0),
    EF_OPT(instance_deleted.reason, "reason", "reason", exo_ft_text, EXO_DELETE_REASON_MAX),
    EF_OPT(instance_deleted.when_ms, "when_ms", "when", exo_ft_time_ms, 0),
};
static const exo_field ev_runner_status_updated[] = {
    EF(runner_status_updated.runner_id, "runner_id", "runnerId", exo_ft_id),
    EF(runner_status_updated.status, "status", "runnerStatus", ft_status),
};
static const exo_field ev_runner_deleted[] = {EF(runner_deleted.runner_id, "runner_id", "runnerId", exo_ft_id)};
static const exo_field ev_task_created[] = {EF(task_created.task, "task", "task", ft_task)};
static const exo_field ev_task_status_updated[] = {
    EF(task_status_updated.task_id, "task_id", "taskId", exo_ft_id),
    EF_ENUM(task_status_updated.status, "status", "taskStatus", exo_task_status_enum),
};
static const exo_field ev_task_failed[] = {
    EF(task_failed.task_id, "task_id", "taskId", exo_ft_id),
    EF(task_failed.error_type, "error_type", "errorType", exo_ft_text),
    EF(task_failed.error_message, "error_message", "errorMessage", exo_ft_text),
};
static const exo_field ev_task_deleted[] = {EF(task_deleted.task_id, "task_id", "taskId", exo_ft_id)};
static const exo_field ev_node_gathered_info[] = {
    EF(node_gathered_info.node_id, "node_id", "nodeId", exo_ft_id),
    EF(node_gathered_info.when_ms, "when_ms", "when", exo_ft_time_ms),
    EF(node_gathered_info.info, "info", "info", ft_node_info),
};
static const exo_field ev_node_timed_out[] = {EF(node_timed_out.node_id, "node_id", "nodeId", exo_ft_id)};
static const exo_field ev_topology_edge_created[] = {
    EF_RECORD(topology_edge_created.edge, "edge", "edge", exo_topology_edge_desc)};
static const exo_field ev_topology_edge_deleted[] = {
    EF(topology_edge_deleted.source, "source", "source", exo_ft_id),
    EF(topology_edge_deleted.sink, "sink", "sink", exo_ft_id),
    EF(topology_edge_deleted.address, "address", "address", exo_ft_addr),
};

static const exo_field ev_node_download_progress[] = {
    EF_RECORD(node_download_progress.status, "status", "downloadProgress", exo_download_status_desc)};
static const exo_field ev_node_download_deleted[] = {
    EF(node_download_deleted.node_id, "node_id", "nodeId", exo_ft_id),
    EF(node_download_deleted.model_id, "model_id", "modelId", exo_ft_model_id),
};
static const exo_field ev_custom_model_card_added[] = {
    EF_RECORD(custom_model_card_added.card, "model_card", "modelCard", exo_model_card_desc)};
static const exo_field ev_custom_model_card_deleted[] = {
    EF(custom_model_card_deleted.model_id, "model_id", "modelId", exo_ft_model_id)};

#define KIND(name, fields) {name, fields, sizeof fields / sizeof *fields, sizeof(exo_event)}
static const exo_record_desc event_kinds[EXO_EVENT__COUNT] = {
    [EXO_EVENT_INSTANCE_CREATED] = KIND("InstanceCreated", ev_instance_created),
    [EXO_EVENT_INSTANCE_DELETED] = KIND("InstanceDeleted", ev_instance_deleted),
    [EXO_EVENT_RUNNER_STATUS_UPDATED] = KIND("RunnerStatusUpdated", ev_runner_status_updated),
    [EXO_EVENT_RUNNER_DELETED] = KIND("RunnerDeleted", ev_runner_deleted),
    [EXO_EVENT_TASK_CREATED] = KIND("TaskCreated", ev_task_created),
    [EXO_EVENT_TASK_STATUS_UPDATED] = KIND("TaskStatusUpdated", ev_task_status_updated),
    [EXO_EVENT_TASK_FAILED] = KIND("TaskFailed", ev_task_failed),
    [EXO_EVENT_TASK_DELETED] = KIND("TaskDeleted", ev_task_deleted),
    [EXO_EVENT_NODE_GATHERED_INFO] = KIND("NodeGatheredInfo", ev_node_gathered_info),
    [EXO_EVENT_NODE_TIMED_OUT] = KIND("NodeTimedOut", ev_node_timed_out),
    [EXO_EVENT_TOPOLOGY_EDGE_CREATED] = KIND("TopologyEdgeCreated", ev_topology_edge_created),
    [EXO_EVENT_TOPOLOGY_EDGE_DELETED] = KIND("TopologyEdgeDeleted", ev_topology_edge_deleted),
    [EXO_EVENT_NODE_DOWNLOAD_PROGRESS] = KIND("NodeDownloadProgress", ev_node_download_progress),
    [EXO_EVENT_NODE_DOWNLOAD_DELETED] = KIND("NodeDownloadDeleted", ev_node_download_deleted),
    [EXO_EVENT_CUSTOM_MODEL_CARD_ADDED] = KIND("CustomModelCardAdded", ev_custom_model_card_added),
    [EXO_EVENT_CUSTOM_MODEL_CARD_DELETED] = KIND("CustomModelCardDeleted", ev_custom_model_card_deleted),
};
#undef KIND

#define CF(member, key, json, type) {key, json, &(type), offsetof(exo_command, u.member), false, 0, 0, NULL, NULL}
#define CF_ENUM(member, key, json, desc) \
    {key, json, &exo_ft_enum, offsetof(exo_command, u.member), false, 0, 0, &(desc), NULL}

static const exo_field cmd_place_instance[] = {
    {"model_card", "modelCard", &exo_ft_record, offsetof(exo_command, u.place_instance.card), false, 0, 0, NULL,
     &exo_model_card_desc},
    CF_ENUM(place_instance.sharding, "sharding", "sharding", exo_sharding_enum),
    CF_ENUM(place_instance.meta, "meta", "instanceMeta", exo_instance_meta_enum),
    {"min_nodes", "minNodes", &exo_ft_i32, offsetof(exo_command, u.place_instance.min_nodes), false, 1,
     EXO_MAX_SHARDS, NULL, NULL},
};
static const exo_field cmd_create_instance[] = {CF(create_instance.instance, "instance", "instance", ft_instance)};
static const exo_field cmd_delete_instance[] = {
    CF(delete_instance.instance_id, "instance_id", "instanceId", exo_ft_id),
    {"reason", "reason", &exo_ft_text, offsetof(exo_command, u.delete_instance.reason), true, 0,
     EXO_DELETE_REASON_MAX, NULL, NULL},
};
static const exo_field cmd_text_generation[] = {
    CF(text_generation.model_id, "model_id", "modelId", exo_ft_model_id),
    CF(text_generation.params_json, "params_json", "taskParams", exo_ft_params),
    {"origin", "originNodeId", &exo_ft_id, offsetof(exo_command, u.text_generation.origin), true, 0, 0, NULL,
     NULL},
};
static const exo_field cmd_task_cancelled[] = {
    CF(task_cancelled.cancelled_command_id, "cancelled_command_id", "cancelledCommandId", exo_ft_id)};
static const exo_field cmd_task_finished[] = {
    CF(task_finished.finished_command_id, "finished_command_id", "finishedCommandId", exo_ft_id)};
static const exo_field cmd_add_custom_model_card[] = {
    {"model_card", "modelCard", &exo_ft_record, offsetof(exo_command, u.add_custom_model_card.card), false, 0, 0,
     NULL, &exo_model_card_desc}};
static const exo_field cmd_delete_custom_model_card[] = {
    CF(delete_custom_model_card.model_id, "model_id", "modelId", exo_ft_model_id)};

#define KIND(name, fields) {name, fields, sizeof fields / sizeof *fields, sizeof(exo_command)}
static const exo_record_desc command_kinds[EXO_COMMAND__COUNT] = {
    [EXO_COMMAND_PLACE_INSTANCE] = KIND("PlaceInstance", cmd_place_instance),
    [EXO_COMMAND_CREATE_INSTANCE] = KIND("CreateInstance", cmd_create_instance),
    [EXO_COMMAND_DELETE_INSTANCE] = KIND("DeleteInstance", cmd_delete_instance),
    [EXO_COMMAND_TEXT_GENERATION] = KIND("TextGeneration", cmd_text_generation),
    [EXO_COMMAND_TASK_CANCELLED] = KIND("TaskCancelled", cmd_task_cancelled),
    [EXO_COMMAND_TASK_FINISHED] = KIND("TaskFinished", cmd_task_finished),
    [EXO_COMMAND_ADD_CUSTOM_MODEL_CARD] = KIND("AddCustomModelCard", cmd_add_custom_model_card),
    [EXO_COMMAND_DELETE_CUSTOM_MODEL_CARD] = KIND("DeleteCustomModelCard", cmd_delete_custom_model_card),
};
#undef KIND

/* The table row of a kind, NULL when the kind is out of range. */
static const exo_record_desc *event_desc(exo_event_kind k)
{
    return (unsigned)k < EXO_EVENT__COUNT ? &event_kinds[k] : NULL;
}

static const exo_record_desc *command_desc(exo_command_kind k)
{
    return (unsigned)k < EXO_COMMAND__COUNT ? &command_kinds[k] : NULL;
}

/* ---- the generic operations, for events and commands alike ------------------------------- */

/* What an event and a command have in common: a kind, an id and a body. */
typedef struct message_ops {
    const char            *what;
    const exo_record_desc *(*desc)(int kind);
    const char            *(*kind_name)(int kind);
    int                    (*kind_parse)(const char *, size_t);
    size_t                 id_offset, kind_offset;
} message_ops;

static const exo_record_desc *event_desc_i(int k) { return event_desc((exo_event_kind)k); }
static const exo_record_desc *command_desc_i(int k) { return command_desc((exo_command_kind)k); }
static const char *event_name_i(int k) { return exo_event_kind_name((exo_event_kind)k); }
static const char *command_name_i(int k) { return exo_command_kind_name((exo_command_kind)k); }

static const message_ops EVENT_OPS = {"event", event_desc_i, event_name_i, exo_event_kind_parse,
                                      offsetof(exo_event, event_id), offsetof(exo_event, kind)};
static const message_ops COMMAND_OPS = {"command", command_desc_i, command_name_i, exo_command_kind_parse,
                                        offsetof(exo_command, command_id), offsetof(exo_command, kind)};

#define MSG_KIND(ops, m) (*(const int *)((const char *)(m) + (ops)->kind_offset))
#define MSG_ID(ops, m) ((const exo_id *)((const char *)(m) + (ops)->id_offset))

static void msg_init(const message_ops *ops, void *m, size_t size, int kind)
{
    memset(m, 0, size);
    *(int *)((char *)m + ops->kind_offset) = kind;
    exo_id_new((exo_id *)((char *)m + ops->id_offset));
    const exo_record_desc *d = ops->desc(kind);
    if (d)
        exo_record_init(d, m);
}

static void msg_copy(const message_ops *ops, void *dst, const void *src, size_t size)
{
    memcpy(dst, src, size);
    const exo_record_desc *d = ops->desc(MSG_KIND(ops, src));
    if (d)
        exo_record_copy(d, dst, src);
}

static void msg_clear(const message_ops *ops, void *m, size_t size)
{
    const exo_record_desc *d = ops->desc(MSG_KIND(ops, m));
    if (d)
        exo_record_clear(d, m);
    memset(m, 0, size);
}

static bool msg_equal(const message_ops *ops, const void *a, const void *b)
{
    const exo_record_desc *d = ops->desc(MSG_KIND(ops, a));
    return d && MSG_KIND(ops, a) == MSG_KIND(ops, b) && exo_id_eq(MSG_ID(ops, a), MSG_ID(ops, b)) &&
           exo_record_equal(d, a, b);
}

static int msg_validate(const message_ops *ops, const void *m, exo_err *err)
{
    const exo_id *id = MSG_ID(ops, m);
    if (!exo_id_valid(id->s, strnlen(id->s, EXO_ID_MAX)))
        return exo_err_set(err, EXO_EINVAL, "%s id: invalid id", ops->what);
    const exo_record_desc *d = ops->desc(MSG_KIND(ops, m));
    if (!d)
        return exo_err_set(err, EXO_EINVAL, "unknown %s kind %d", ops->what, MSG_KIND(ops, m));
    int rc = exo_record_validate(d, m, err);
    if (rc < 0)
        exo_err_wrap(err, "%s %s %s", d->name, ops->what, id->s);
    return rc;
}

static void msg_pack(msgpack_packer *pk, const message_ops *ops, const void *m)
{
    const exo_record_desc *d = ops->desc(MSG_KIND(ops, m));
    exo_envelope_pack(pk, EXO_CODEC_VERSION, d->name, MSG_ID(ops, m)->s);
    exo_record_pack(pk, d, m);
}

static int msg_encode(const message_ops *ops, const void *m, uint8_t **out, size_t *out_len, exo_err *err)
{
    *out = NULL;
    *out_len = 0;
    int rc = msg_validate(ops, m, err);
    if (rc < 0)
        return rc;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msg_pack(&pk, ops, m);
    return exo_mp_finish(&sb, EXO_CODEC_MAX_BYTES, out, out_len, ops->what, err);
}

/* Fills m (zeroed, size bytes) from an envelope's kind, id and body; then
 * validates. Every failure is EXO_EFORMAT (the bytes are at fault). */
static int msg_from_envelope(const message_ops *ops, int kind, const char *id, mobj *body, void *m, size_t size,
                             exo_err *err)
{
    memset(m, 0, size);
    *(int *)((char *)m + ops->kind_offset) = kind;
    memcpy((char *)m + ops->id_offset, id, strlen(id) + 1);
    const exo_record_desc *d = ops->desc(kind);
    int rc = exo_record_unpack(body, d, m, err);
    if (rc < 0)
        exo_err_wrap(err, "%s %s", d->name, ops->what);
    else
        rc = msg_validate(ops, m, err);
    if (rc < 0) {
        rc = EXO_EFORMAT;
        if (err)
            err->code = rc;
        msg_clear(ops, m, size);
    }
    return rc;
}

static int msg_decode(const message_ops *ops, const uint8_t *buf, size_t len, void *m, size_t size, exo_err *err)
{
    exo_envelope env;
    memset(m, 0, size);
    int rc = exo_envelope_unpack(buf, len, EXO_CODEC_MAX_BYTES, EXO_CODEC_VERSION, ops->kind_parse, ops->what,
                                 &env, err);
    if (rc == 0)
        rc = msg_from_envelope(ops, env.kind, env.id, env.body, m, size, err);
    exo_envelope_free(&env);
    return rc;
}

static json_t *msg_to_json(const message_ops *ops, const void *m, const char *id_key)
{
    const exo_record_desc *d = ops->desc(MSG_KIND(ops, m));
    json_t *b = json_object();
    json_object_set_new(b, id_key, json_string(MSG_ID(ops, m)->s));
    if (d)
        exo_record_to_json(d, m, b);
    return exo_json_tagged(d ? d->name : "?", b);
}

/* Nested in other records (cluster messages): the envelope map inline. */
static int msg_unpack_nested(const message_ops *ops, mobj *o, void *m, size_t size, exo_err *err)
{
    int rc = exo_mp_check_map(o, ops->what, err);
    if (rc < 0)
        return rc;
    static const exo_field v_f = LOCAL_FIELD("v", exo_ft_i64, false, 1, EXO_CODEC_VERSION, NULL);
    static const exo_field id_f = LOCAL_FIELD("id", exo_ft_id, false, 0, 0, NULL);
    int64_t v;
    exo_id id;
    mobj *kind = exo_mp_get(o, "kind"), *body = exo_mp_get(o, "body");
    if ((rc = exo_mp_field(o, &v_f, &v, err)) < 0 || (rc = exo_mp_field(o, &id_f, &id, err)) < 0) {
        exo_err_wrap(err, "%s", ops->what);
        return rc;
    }
    int k = kind && kind->type == MSGPACK_OBJECT_STR
                ? ops->kind_parse(kind->via.str.ptr ? kind->via.str.ptr : "", kind->via.str.size) : -1;
    if (k < 0)
        return exo_err_set(err, EXO_EFORMAT, "%s: missing or unknown kind", ops->what);
    if (!body || (rc = exo_mp_check_map(body, "body", err)) < 0)
        return body ? rc : exo_err_set(err, EXO_EFORMAT, "%s: field body: missing", ops->what);
    return msg_from_envelope(ops, k, id.s, body, m, size, err);
}

/* ---- events ------------------------------------------------------------------------------ */

void exo_event_init(exo_event *ev, exo_event_kind kind) { msg_init(&EVENT_OPS, ev, sizeof *ev, (int)kind); }
void exo_event_copy(exo_event *dst, const exo_event *src) { msg_copy(&EVENT_OPS, dst, src, sizeof *dst); }
void exo_event_clear(exo_event *ev) { msg_clear(&EVENT_OPS, ev, sizeof *ev); }
bool exo_event_equal(const exo_event *a, const exo_event *b) { return msg_equal(&EVENT_OPS, a, b); }
int exo_event_validate(const exo_event *ev, exo_err *err) { return msg_validate(&EVENT_OPS, ev, err); }
int exo_event_encode(const exo_event *ev, uint8_t **out, size_t *out_len, exo_err *err)
{
    return msg_encode(&EVENT_OPS, ev, out, out_len, err);
}
int exo_event_decode(const uint8_t *buf, size_t len, exo_event *ev, exo_err *err)
{
    return msg_decode(&EVENT_OPS, buf, len, ev, sizeof *ev, err);
}
json_t *exo_event_to_json(const exo_event *ev) { return msg_to_json(&EVENT_OPS, ev, "eventId"); }

/* ---- commands ---------------------------------------------------------------------------- */

void exo_command_init(exo_command *cmd, exo_command_kind kind)
{
    msg_init(&COMMAND_OPS, cmd, sizeof *cmd, (int)kind);
    if (kind == EXO_COMMAND_PLACE_INSTANCE)
        cmd->u.place_instance.min_nodes = 1;
}
void exo_command_copy(exo_command *dst, const exo_command *src) { msg_copy(&COMMAND_OPS, dst, src, sizeof *dst); }
void exo_command_clear(exo_command *cmd) { msg_clear(&COMMAND_OPS, cmd, sizeof *cmd); }
bool exo_command_equal(const exo_command *a, const exo_command *b) { return msg_equal(&COMMAND_OPS, a, b); }
int exo_command_validate(const exo_command *cmd, exo_err *err) { return msg_validate(&COMMAND_OPS, cmd, err); }
int exo_command_encode(const exo_command *cmd, uint8_t **out, size_t *out_len, exo_err *err)
{
    return msg_encode(&COMMAND_OPS, cmd, out, out_len, err);
}
int exo_command_decode(const uint8_t *buf, size_t len, exo_command *cmd, exo_err *err)
{
    return msg_decode(&COMMAND_OPS, buf, len, cmd, sizeof *cmd, err);
}
json_t *exo_command_to_json(const exo_command *cmd) { return msg_to_json(&COMMAND_OPS, cmd, "commandId"); }

/* ---- whole events and commands as field types --------------------------------------------- */

static void event_ft_pack(msgpack_packer *pk, const exo_field *f, const void *v) { msg_pack(pk, &EVENT_OPS, v); }
static int event_ft_unpack(mobj *o, const exo_field *f, void *v, exo_err *err)
{
    exo_event_clear(v);
    return msg_unpack_nested(&EVENT_OPS, o, v, sizeof(exo_event), err);
}
static int event_ft_validate(const exo_field *f, const void *v, exo_err *err) { return exo_event_validate(v, err); }
static void event_ft_copy(const exo_field *f, void *dst, const void *src) { exo_event_copy(dst, src); }
static void event_ft_clear(const exo_field *f, void *v) { exo_event_clear(v); }
static bool event_ft_equal(const exo_field *f, const void *a, const void *b) { return exo_event_equal(a, b); }
static json_t *event_ft_json(const exo_field *f, const void *v) { return exo_event_to_json(v); }
const exo_field_type exo_ft_event = {"event", NULL, event_ft_pack, event_ft_unpack, event_ft_validate,
                                     event_ft_copy, event_ft_clear, event_ft_equal, event_ft_json, NULL, NULL,
                                     sizeof(exo_event)};

static void command_ft_pack(msgpack_packer *pk, const exo_field *f, const void *v) { msg_pack(pk, &COMMAND_OPS, v); }
static int command_ft_unpack(mobj *o, const exo_field *f, void *v, exo_err *err)
{
    exo_command_clear(v);
    return msg_unpack_nested(&COMMAND_OPS, o, v, sizeof(exo_command), err);
}
static int command_ft_validate(const exo_field *f, const void *v, exo_err *err) { return exo_command_validate(v, err); }
static void command_ft_copy(const exo_field *f, void *dst, const void *src) { exo_command_copy(dst, src); }
static void command_ft_clear(const exo_field *f, void *v) { exo_command_clear(v); }
static bool command_ft_equal(const exo_field *f, const void *a, const void *b) { return exo_command_equal(a, b); }
static json_t *command_ft_json(const exo_field *f, const void *v) { return exo_command_to_json(v); }
const exo_field_type exo_ft_command = {"command", NULL, command_ft_pack, command_ft_unpack, command_ft_validate,
                                       command_ft_copy, command_ft_clear, command_ft_equal, command_ft_json, NULL,
                                       NULL, sizeof(exo_command)};

/* ---- event lists ---------------------------------------------------------------------------- */

exo_event *exo_event_list_add(exo_event_list *l, exo_event_kind kind)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 4;
        l->v = exo_realloc(l->v, l->cap * sizeof *l->v);
    }
    exo_event *ev = &l->v[l->n++];
    exo_event_init(ev, kind);
    return ev;
}

void exo_event_list_clear(exo_event_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        exo_event_clear(&l->v[i]);
    exo_free(l->v);
    memset(l, 0, sizeof *l);
}

/* ---- JSON of the compound records ------------------------------------------------------------ */

static void set_str(json_t *o, const char *key, const char *s) { json_object_set_new(o, key, exo_json_str_or_null(s)); }
static void set_int(json_t *o, const char *key, json_int_t v) { json_object_set_new(o, key, json_integer(v)); }

static json_t *params_json(const char *s)
{
    if (!s)
        return json_null();
    json_t *j = json_loads(s, 0, NULL);
    return j ? j : exo_json_str_or_null(s);
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
        /* ours: a node may hold several ranks (a GPU each), which exo's
         * nodeToRunner, a node's one runner, cannot say; it names the
         * node's first rank */
        set_str(sj, "nodeId", s->node_id.s);
        if (s->device[0])
            set_str(sj, "device", s->device);
        json_object_set_new(r2s, s->runner_id.s, exo_json_tagged(shard_tag, sj));
        if (!json_object_get(n2r, s->node_id.s))
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
    return exo_json_tagged(tag, body);
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
    } else if (st->kind == EXO_RUNNER_CONNECTING && st->ring_port != -1) {
        set_int(body, "ringPort", st->ring_port);
    } else if (st->kind == EXO_RUNNER_FAILED) {
        set_str(body, "errorMessage", st->error_message);
    }
    char tag[64];
    snprintf(tag, sizeof tag, "Runner%s", exo_runner_status_name(st->kind));
    return exo_json_tagged(tag, body);
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
        if (!exo_id_is_empty(&t->node_id))
            set_str(body, "originNodeId", t->node_id.s);
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
    return exo_json_tagged(exo_task_kind_name(t->kind), body);
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
    if (!json_is_object(r2s) || !json_is_object(n2r) || !json_object_size(r2s) || !json_object_size(n2r) ||
        json_object_size(r2s) > EXO_MAX_SHARDS || json_object_size(n2r) > json_object_size(r2s))
        return exo_err_set(err, EXO_EINVAL, "instance: runnerToShard and nodeToRunner must be non-empty "
                           "objects, nodeToRunner no larger");
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
        json_t *dev = json_object_get(sb, "device");
        if (dev && (!json_is_string(dev) || json_string_length(dev) >= sizeof s->device ||
                    !exo_device_valid(json_string_value(dev)))) {
            rc = exo_err_set(err, EXO_EINVAL, "instance: shard of runner %.64s: device is not one of auto, "
                             "cpu, cuda, cuda:N", rid);
            break;
        }
        if (dev)
            snprintf(s->device, sizeof s->device, "%s", json_string_value(dev));
        const char *nid;
        json_t *rv, *own = json_object_get(sb, "nodeId");
        bool found = false;
        if (own) { /* ours; exo's form has only nodeToRunner */
            if (!json_is_string(own) || (rc = exo_id_set(&s->node_id, json_string_value(own), err)))
                rc = rc ? rc : exo_err_set(err, EXO_EINVAL, "instance: shard of runner %.64s: bad nodeId", rid);
            found = true;
        } else {
            json_object_foreach(n2r, nid, rv) {
                if (json_is_string(rv) && !strcmp(json_string_value(rv), rid)) {
                    if ((rc = exo_id_set(&s->node_id, nid, err)))
                        break;
                    found = true;
                }
            }
        }
        if (!rc && !found)
            rc = exo_err_set(err, EXO_EINVAL, "instance: runner %.64s has no node in nodeToRunner", rid);
        if (rc)
            break;
    }
    /* nodeToRunner names, for every node of the instance, one of its runners */
    const char *nid;
    json_t *rv;
    size_t nodes = 0;
    for (size_t a = 0; !rc && a < i; a++) {
        bool first = true;
        for (size_t b = 0; b < a && first; b++)
            first = !exo_id_eq(&out->shards[a].node_id, &out->shards[b].node_id);
        nodes += first;
    }
    json_object_foreach(n2r, nid, rv) {
        if (rc)
            break;
        bool ok = false;
        for (size_t a = 0; a < i && json_is_string(rv); a++)
            ok |= !strcmp(out->shards[a].node_id.s, nid) && !strcmp(out->shards[a].runner_id.s, json_string_value(rv));
        if (!ok)
            rc = exo_err_set(err, EXO_EINVAL, "instance: nodeToRunner: node %.64s is not that runner's node", nid);
    }
    if (!rc && nodes != json_object_size(n2r))
        rc = exo_err_set(err, EXO_EINVAL, "instance: nodeToRunner must name every node of the instance once");
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

json_t *exo_download_status_to_json(const exo_download_status *st)
{
    json_t *body = json_object();
    exo_record_to_json(&exo_download_status_desc, st, body);
    json_object_del(body, "kind"); /* the tag says it */
    if (!json_object_get(body, "errorMessage"))
        json_object_set_new(body, "errorMessage", json_string(""));
    static const char *const always[] = {"startLayer", "endLayer", "nLayers", "total", "downloaded",
                                         "downloadedThisSession", "completedFiles", "totalFiles", "speed", "etaMs"};
    for (size_t i = 0; i < sizeof always / sizeof *always; i++)
        if (!json_object_get(body, always[i]))
            json_object_set_new(body, always[i], json_integer(0));
    if (!json_object_get(body, "readOnly"))
        json_object_set_new(body, "readOnly", json_false());
    if (!json_object_get(body, "modelDirectory"))
        json_object_set_new(body, "modelDirectory", json_string(""));
    json_t *root = json_object();
    json_object_set_new(root, exo_download_kind_name(st->kind), body);
    return root;
}
