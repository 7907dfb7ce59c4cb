/* Commands (imperative requests to the master) and events (past-tense facts
 * the State is folded from), their msgpack codec and their JSON rendering.
 *
 * Every kind is one row of a table in events.c (its fields, with wire and
 * JSON names, types and bounds); encoding, decoding, validation, copy,
 * clear, equality and JSON are the generic loops of codec.h over that row.
 *
 * Wire/disk format, version 1 (EXO_CODEC_VERSION): one msgpack map
 *   {"v": 1, "kind": "<EventName>", "id": "<event or command id>", "body": {...}}
 * where body is a map with snake_case string keys (the tables in events.c
 * are the documentation of each kind). Decoding is strict about what it reads (types, ranges, ids,
 * UTF-8, sizes, duplicate keys, nesting depth, trailing bytes) because the
 * bytes come from disk or, later, from other nodes; it never asserts and
 * reports EXO_EFORMAT with the offending field. Keys it does not know are
 * skipped, so a later version may add optional fields without bumping "v";
 * a change of meaning bumps "v" and the decoder keeps a branch for every
 * older version, so old logs stay readable. Records with a newer "v" are
 * EXO_EUNSUPPORTED.
 *
 * JSON rendering follows exo's external tagging: {"InstanceCreated":
 * {"eventId": ..., "instance": {...}}} with camelCase keys (for GET /events
 * and GET /state). Nested tagged unions are tagged too: runner statuses
 * ({"RunnerReady": {}}), tasks ({"TextGeneration": {...}}) and instances
 * ({"MlxRingInstance": {...}}).
 *
 * Ownership: an exo_event / exo_command owns its heap members (see types.h);
 * exo_event_clear / exo_command_clear free them. Decoding fills a caller
 * struct; on failure it is left cleared.
 *
 * Example usage:
 *   exo_event ev;
 *   exo_event_init(&ev, EXO_EVENT_TASK_DELETED);
 *   exo_id_set(&ev.u.task_deleted.task_id, task_id, NULL);
 *   uint8_t *buf; size_t len;
 *   exo_event_encode(&ev, &buf, &len, &err);   // buf: exo_free
 *   exo_event back;
 *   if (exo_event_decode(buf, len, &back, &err) < 0) ...
 *   json_t *j = exo_event_to_json(&back);      // json_decref
 *   exo_event_clear(&back); exo_event_clear(&ev); exo_free(buf); */
#ifndef EXO_CLUSTER_EVENTS_H
#define EXO_CLUSTER_EVENTS_H

#include "cluster/types.h"
#include "core/error.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define EXO_CODEC_VERSION 1
/* Largest encoded event or command accepted by the codec (the event log uses
 * the same cap for its records). */
#define EXO_CODEC_MAX_BYTES ((size_t)16 * 1024 * 1024)
/* Longest reason an InstanceDeleted / DeleteInstance carries (bytes). */
#define EXO_DELETE_REASON_MAX 1024

#define EXO_EVENT_KIND_MAP(XX)                                                      \
    XX(INSTANCE_CREATED, "InstanceCreated") XX(INSTANCE_DELETED, "InstanceDeleted") \
    XX(RUNNER_STATUS_UPDATED, "RunnerStatusUpdated")                                \
    XX(RUNNER_DELETED, "RunnerDeleted") XX(TASK_CREATED, "TaskCreated")             \
    XX(TASK_STATUS_UPDATED, "TaskStatusUpdated") XX(TASK_FAILED, "TaskFailed")      \
    XX(TASK_DELETED, "TaskDeleted") XX(NODE_GATHERED_INFO, "NodeGatheredInfo")      \
    XX(NODE_TIMED_OUT, "NodeTimedOut") XX(TOPOLOGY_EDGE_CREATED, "TopologyEdgeCreated") \
    XX(TOPOLOGY_EDGE_DELETED, "TopologyEdgeDeleted")                                \
    XX(NODE_DOWNLOAD_PROGRESS, "NodeDownloadProgress")                              \
    XX(NODE_DOWNLOAD_DELETED, "NodeDownloadDeleted")                                \
    XX(CUSTOM_MODEL_CARD_ADDED, "CustomModelCardAdded")                             \
    XX(CUSTOM_MODEL_CARD_DELETED, "CustomModelCardDeleted")

#define EXO_COMMAND_KIND_MAP(XX)                                                    \
    XX(PLACE_INSTANCE, "PlaceInstance") XX(CREATE_INSTANCE, "CreateInstance")       \
    XX(DELETE_INSTANCE, "DeleteInstance") XX(TEXT_GENERATION, "TextGeneration")     \
    XX(TASK_CANCELLED, "TaskCancelled") XX(TASK_FINISHED, "TaskFinished")           \
    XX(ADD_CUSTOM_MODEL_CARD, "AddCustomModelCard")                                 \
    XX(DELETE_CUSTOM_MODEL_CARD, "DeleteCustomModelCard")

#define XX(n, s) EXO__ENUM_ITEM(EXO_EVENT_, n, s)
typedef enum exo_event_kind { EXO_EVENT_KIND_MAP(XX) EXO_EVENT__COUNT } exo_event_kind;
#undef XX
#define XX(n, s) EXO__ENUM_ITEM(EXO_COMMAND_, n, s)
typedef enum exo_command_kind { EXO_COMMAND_KIND_MAP(XX) EXO_COMMAND__COUNT } exo_command_kind;
#undef XX

const char *exo_event_kind_name(exo_event_kind k);
int         exo_event_kind_parse(const char *s, size_t len);
const char *exo_command_kind_name(exo_command_kind k);
int         exo_command_kind_parse(const char *s, size_t len);

typedef struct exo_event {
    exo_event_kind kind;
    exo_id         event_id;
    union {
        struct { exo_instance instance; } instance_created;
        /* why it went ("runner for M failed 5 times in a row: ...", "deleted
         * by user", "node N left") and when (Unix ms, stamped by the master);
         * model_id, reason and when_ms are absent in logs written before them */
        struct {
            exo_id  instance_id;
            char    model_id[EXO_MODEL_ID_MAX];
            char   *reason;
            int64_t when_ms;
        } instance_deleted;
        struct { exo_id runner_id; exo_runner_status status; } runner_status_updated;
        struct { exo_id runner_id; } runner_deleted;
        struct { exo_task task; } task_created;
        struct { exo_id task_id; exo_task_status status; } task_status_updated;
        struct { exo_id task_id; char *error_type; char *error_message; } task_failed;
        struct { exo_id task_id; } task_deleted;
        /* when_ms: wall clock (Unix ms) stamped by the master */
        struct { exo_id node_id; int64_t when_ms; exo_node_info info; } node_gathered_info;
        struct { exo_id node_id; } node_timed_out;
        /* insert or replace the edge with the same (source, sink, address) */
        struct { exo_topology_edge edge; } topology_edge_created;
        struct { exo_id source, sink; char address[EXO_ADDR_MAX]; } topology_edge_deleted;
        /* replaces the (node, model) entry */
        struct { exo_download_status status; } node_download_progress;
        /* the node deleted the model's files: its entry goes */
        struct { exo_id node_id; char model_id[EXO_MODEL_ID_MAX]; } node_download_deleted;
        /* a model added by a user (POST /models/add): listed and placeable everywhere */
        struct { exo_model_card card; } custom_model_card_added;
        struct { char model_id[EXO_MODEL_ID_MAX]; } custom_model_card_deleted;
    } u;
} exo_event;

typedef struct exo_command {
    exo_command_kind kind;
    exo_id           command_id;
    union {
        /* the card comes from the node that asked (its model files), so
         * the master can place a model it has never seen */
        struct {
            exo_model_card card;
            exo_sharding sharding;
            exo_instance_meta meta;
            int32_t min_nodes;
        } place_instance;
        struct { exo_instance instance; } create_instance;
        /* reason: why (heap, optional; the master says "deleted" without one) */
        struct { exo_id instance_id; char *reason; } delete_instance;
        /* command_id above identifies the request; params_json is the API
         * layer's canonical request as JSON text (heap, required); origin
         * is the node whose API holds the request (empty: the master's) */
        struct { char model_id[EXO_MODEL_ID_MAX]; char *params_json; exo_id origin; } text_generation;
        struct { exo_id cancelled_command_id; } task_cancelled;
        struct { exo_id finished_command_id; } task_finished;
        struct { exo_model_card card; } add_custom_model_card;
        struct { char model_id[EXO_MODEL_ID_MAX]; } delete_custom_model_card;
    } u;
} exo_command;

/* Zeroes ev, sets kind and a fresh event id (and the kind's defaults:
 * runner status Idle with port -1). */
void exo_event_init(exo_event *ev, exo_event_kind kind);
void exo_event_copy(exo_event *dst, const exo_event *src);
void exo_event_clear(exo_event *ev);
bool exo_event_equal(const exo_event *a, const exo_event *b);
/* The invariants the decoder enforces, for events built in memory. */
int  exo_event_validate(const exo_event *ev, exo_err *err);

/* Encodes a valid event (EXO_EINVAL if not, see exo_event_validate) into a
 * fresh heap buffer (*out, free with exo_free). */
int exo_event_encode(const exo_event *ev, uint8_t **out, size_t *out_len, exo_err *err);
/* Decodes exactly len bytes into *ev (cleared on failure). */
int exo_event_decode(const uint8_t *buf, size_t len, exo_event *ev, exo_err *err);
/* {"<Kind>": {...}}; never NULL. */
json_t *exo_event_to_json(const exo_event *ev);

void exo_command_init(exo_command *cmd, exo_command_kind kind);
void exo_command_copy(exo_command *dst, const exo_command *src);
void exo_command_clear(exo_command *cmd);
bool exo_command_equal(const exo_command *a, const exo_command *b);
int  exo_command_validate(const exo_command *cmd, exo_err *err);
int  exo_command_encode(const exo_command *cmd, uint8_t **out, size_t *out_len, exo_err *err);
int  exo_command_decode(const uint8_t *buf, size_t len, exo_command *cmd, exo_err *err);
json_t *exo_command_to_json(const exo_command *cmd);

/* A growable list of events, in order. */
typedef struct exo_event_list {
    exo_event *v;
    size_t     n, cap;
} exo_event_list;

/* Appends a zero-initialised event of kind (fresh event id) and returns it. */
exo_event *exo_event_list_add(exo_event_list *l, exo_event_kind kind);
void       exo_event_list_clear(exo_event_list *l); /* frees the events, keeps nothing */

/* JSON pieces the State rendering shares (tagged, camelCase). */
json_t *exo_node_info_to_json(const exo_node_info *info);
json_t *exo_instance_to_json(const exo_instance *inst);
/* The inverse, for POST /instance: a tagged instance as exo_instance_to_json
 * writes it (snake_case keys are accepted too, as exo's models do). The
 * result is validated (exo_instance_validate); EXO_EINVAL naming the field
 * otherwise, *out left zeroed. */
int     exo_instance_from_json(const json_t *j, exo_instance *out, exo_err *err);
json_t *exo_task_to_json(const exo_task *t);
json_t *exo_runner_status_to_json(const exo_runner_status *st);
/* {"DownloadOngoing": {nodeId, modelId, ...camelCase}}, every field present */
json_t *exo_download_status_to_json(const exo_download_status *st);

/* Field types of the compound records, for other field tables (cluster
 * messages embed whole events and commands). */
struct exo_field_type;
extern const struct exo_field_type exo_ft_event, exo_ft_command;

#endif
