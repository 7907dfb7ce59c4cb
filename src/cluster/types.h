/* The vocabulary of the cluster: ids, lifecycle enums and the records that
 * events carry and the State holds (instances, tasks, runner statuses, node
 * information).
 *
 * These are plain value types so that events, the State and the wire/disk
 * codecs can share them. Ownership is uniform: small bounded strings (ids,
 * model ids, names) are fixed arrays inside the struct; unbounded ones
 * (error messages, request parameters) and arrays (shards) are heap
 * allocated and owned by the struct. Every type with heap members has a
 * `_copy` (deep copy into an uninitialised dst) and a `_clear` (frees the
 * members, leaves the struct zeroed); `_equal` compares deeply (tests, fuzz
 * round trips). Enums are append-only: their values are never stored, only
 * their names (the name tables below), so reordering would still be safe,
 * but renaming a name breaks old logs.
 *
 * Example usage:
 *   exo_instance inst = {0};
 *   exo_id_new(&inst.instance_id);
 *   snprintf(inst.model_id, sizeof inst.model_id, "%s", "org/model");
 *   inst.n_shards = 1;
 *   inst.shards = exo_calloc(1, sizeof *inst.shards);
 *   ...
 *   if (exo_instance_validate(&inst, err) < 0) ...
 *   exo_instance_clear(&inst); */
#ifndef EXO_CLUSTER_TYPES_H
#define EXO_CLUSTER_TYPES_H

#include "core/error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- ids ----------------------------------------------------------------
 * UUID4 strings for instances, runners, tasks, commands and events; node ids
 * are whatever the cluster layer mints (<= 32 hex chars in exo). Allowed
 * characters: [A-Za-z0-9._:-], 1..EXO_ID_MAX-1 of them. */
#define EXO_ID_MAX 64
typedef struct exo_id {
    char s[EXO_ID_MAX];
} exo_id;

/* A fresh random UUID4 (getrandom). Aborts only if the kernel has no
 * randomness at all (never on Linux >= 3.17). */
void exo_id_new(exo_id *out);
/* Copies a string id; EXO_EINVAL if it is not a valid id. */
int  exo_id_set(exo_id *out, const char *s, exo_err *err);
bool exo_id_valid(const char *s, size_t len);
bool exo_id_eq(const exo_id *a, const exo_id *b);
bool exo_id_is_empty(const exo_id *id);

/* Model ids ("org/name"): printable ASCII, 1..EXO_MODEL_ID_MAX-1 bytes. */
#define EXO_MODEL_ID_MAX 256
bool exo_model_id_valid(const char *s, size_t len);
/* Friendly names: UTF-8 without control characters. */
#define EXO_NAME_MAX 128
/* Heap strings carried by events (error messages) and request parameters. */
#define EXO_MESSAGE_MAX ((size_t)64 * 1024)
#define EXO_PARAMS_MAX  ((size_t)8 * 1024 * 1024)
/* Instance size limit: more shards than this is malformed input. */
#define EXO_MAX_SHARDS 256

/* True if s[0..len) is well-formed UTF-8 with no NUL byte. */
bool exo_cluster_utf8_valid(const char *s, size_t len);

/* ---- enums with name tables ---------------------------------------------- */
#define EXO_RUNNER_STATUS_MAP(XX)                                            \
    XX(IDLE, "Idle") XX(CONNECTING, "Connecting") XX(CONNECTED, "Connected") \
    XX(LOADING, "Loading") XX(LOADED, "Loaded") XX(WARMING_UP, "WarmingUp")  \
    XX(READY, "Ready") XX(RUNNING, "Running")                                \
    XX(SHUTTING_DOWN, "ShuttingDown") XX(SHUTDOWN, "Shutdown")               \
    XX(FAILED, "Failed")

#define EXO_TASK_STATUS_MAP(XX)                                              \
    XX(PENDING, "Pending") XX(RUNNING, "Running") XX(COMPLETE, "Complete")   \
    XX(TIMED_OUT, "TimedOut") XX(FAILED, "Failed") XX(CANCELLED, "Cancelled")

/* CreateRunner/DownloadModel/ConnectToGroup/LoadModel/StartWarmup/CancelTask/
 * Shutdown are planned by the worker, TextGeneration by the master. */
#define EXO_TASK_KIND_MAP(XX)                                                \
    XX(CREATE_RUNNER, "CreateRunner") XX(DOWNLOAD_MODEL, "DownloadModel")    \
    XX(CONNECT_TO_GROUP, "ConnectToGroup") XX(LOAD_MODEL, "LoadModel")       \
    XX(START_WARMUP, "StartWarmup") XX(TEXT_GENERATION, "TextGeneration")    \
    XX(CANCEL_TASK, "CancelTask") XX(SHUTDOWN, "Shutdown")

#define EXO_SHARDING_MAP(XX) XX(PIPELINE, "Pipeline") XX(TENSOR, "Tensor")

/* How the ranks of an instance talk to each other. The names are exo's, so
 * API clients that send instance_meta keep working. */
#define EXO_INSTANCE_META_MAP(XX) XX(MLX_RING, "MlxRing") XX(MLX_JACCL, "MlxJaccl")

/* Compute backends a node offers (a bit set in exo_node_info.backends). */
#define EXO_BACKEND_MAP(XX) XX(CPU, "Cpu") XX(CUDA, "Cuda")

#define EXO__ENUM_ITEM(prefix, name, str) prefix##name,
#define XX(n, s) EXO__ENUM_ITEM(EXO_RUNNER_, n, s)
typedef enum exo_runner_status_kind { EXO_RUNNER_STATUS_MAP(XX) EXO_RUNNER__COUNT } exo_runner_status_kind;
#undef XX
#define XX(n, s) EXO__ENUM_ITEM(EXO_TASK_, n, s)
typedef enum exo_task_status { EXO_TASK_STATUS_MAP(XX) EXO_TASK_STATUS__COUNT } exo_task_status;
#undef XX
#define XX(n, s) EXO__ENUM_ITEM(EXO_TASK_KIND_, n, s)
typedef enum exo_task_kind { EXO_TASK_KIND_MAP(XX) EXO_TASK_KIND__COUNT } exo_task_kind;
#undef XX
#define XX(n, s) EXO__ENUM_ITEM(EXO_SHARDING_, n, s)
typedef enum exo_sharding { EXO_SHARDING_MAP(XX) EXO_SHARDING__COUNT } exo_sharding;
#undef XX
#define XX(n, s) EXO__ENUM_ITEM(EXO_INSTANCE_META_, n, s)
typedef enum exo_instance_meta { EXO_INSTANCE_META_MAP(XX) EXO_INSTANCE_META__COUNT } exo_instance_meta;
#undef XX
#define XX(n, s) EXO__ENUM_ITEM(EXO_BACKEND_, n, s)
typedef enum exo_backend_kind { EXO_BACKEND_MAP(XX) EXO_BACKEND__COUNT } exo_backend_kind;
#undef XX

/* name(value) returns the table name ("?" when out of range); parse(name)
 * returns the value or -1 (exact, case-sensitive match of len bytes). */
const char *exo_runner_status_name(exo_runner_status_kind k);
const char *exo_task_status_name(exo_task_status s);
const char *exo_task_kind_name(exo_task_kind k);
const char *exo_sharding_name(exo_sharding s);
const char *exo_instance_meta_name(exo_instance_meta m);
const char *exo_backend_name(exo_backend_kind b);
int exo_runner_status_parse(const char *s, size_t len);
int exo_task_status_parse(const char *s, size_t len);
int exo_task_kind_parse(const char *s, size_t len);
int exo_sharding_parse(const char *s, size_t len);
int exo_instance_meta_parse(const char *s, size_t len);
int exo_backend_parse(const char *s, size_t len);

/* ---- runner status --------------------------------------------------------
 * Tagged: layers_* only for LOADING, prefill_server_port for READY (-1 =
 * none), error_message (heap, may be NULL) for FAILED. */
typedef struct exo_runner_status {
    exo_runner_status_kind kind;
    int32_t layers_loaded, total_layers;
    int32_t prefill_server_port;
    char   *error_message;
} exo_runner_status;

void exo_runner_status_init(exo_runner_status *st, exo_runner_status_kind kind);
void exo_runner_status_copy(exo_runner_status *dst, const exo_runner_status *src);
void exo_runner_status_clear(exo_runner_status *st);
bool exo_runner_status_equal(const exo_runner_status *a, const exo_runner_status *b);
int  exo_runner_status_validate(const exo_runner_status *st, exo_err *err);

/* ---- instances ------------------------------------------------------------
 * One shard per runner; shards[i].device_rank == i, world_size == n_shards,
 * layers are the half-open range [start_layer, end_layer) of n_layers.
 * A runner id and a node id appear at most once per instance, so node ->
 * runner is a function (exo's node_to_runner). */
typedef struct exo_shard {
    exo_id  runner_id;
    exo_id  node_id;
    int32_t device_rank, world_size;
    int32_t start_layer, end_layer, n_layers;
} exo_shard;

typedef struct exo_instance {
    exo_id            instance_id;
    char              model_id[EXO_MODEL_ID_MAX];
    exo_sharding      sharding;
    exo_instance_meta meta;
    size_t            n_shards;
    exo_shard        *shards;   /* heap, n_shards entries */
} exo_instance;

void exo_instance_copy(exo_instance *dst, const exo_instance *src);
void exo_instance_clear(exo_instance *inst);
bool exo_instance_equal(const exo_instance *a, const exo_instance *b);
/* Checks the invariants above; EXO_EINVAL with the reason otherwise. */
int  exo_instance_validate(const exo_instance *inst, exo_err *err);
/* The shard of a runner / of a node, or NULL. */
const exo_shard *exo_instance_shard_of_runner(const exo_instance *inst, const exo_id *runner_id);
const exo_shard *exo_instance_shard_of_node(const exo_instance *inst, const exo_id *node_id);

/* ---- tasks ------------------------------------------------------------------
 * Which optional fields a kind uses (others are empty / NULL):
 *   TEXT_GENERATION: command_id, params_json (the API layer's request as
 *                    JSON text, opaque here but valid JSON)
 *   CREATE_RUNNER:   runner_id, node_id (the runner to bind on that node)
 *   CANCEL_TASK:     cancelled_task_id, runner_id
 *   SHUTDOWN:        runner_id
 * error_type/error_message (heap, NULL = none) are set by TaskFailed. */
typedef struct exo_task {
    exo_id          task_id;
    exo_task_kind   kind;
    exo_task_status status;
    exo_id          instance_id;
    exo_id          command_id;
    exo_id          runner_id;
    exo_id          node_id;
    exo_id          cancelled_task_id;
    char           *params_json;
    char           *error_type;
    char           *error_message;
} exo_task;

void exo_task_copy(exo_task *dst, const exo_task *src);
void exo_task_clear(exo_task *t);
bool exo_task_equal(const exo_task *a, const exo_task *b);
int  exo_task_validate(const exo_task *t, exo_err *err);

/* ---- node information (NodeGatheredInfo) ---------------------------------- */
typedef struct exo_node_info {
    uint64_t memory_total;      /* bytes */
    uint64_t memory_available;  /* bytes */
    int32_t  cpu_count;
    char     friendly_name[EXO_NAME_MAX];
    uint32_t backends;          /* bit (1u << exo_backend_kind) */
} exo_node_info;

bool exo_node_info_equal(const exo_node_info *a, const exo_node_info *b);
int  exo_node_info_validate(const exo_node_info *info, exo_err *err);

/* Heap string helpers shared by the cluster modules: NULL-safe equality and
 * duplication. */
bool  exo__str_eq_null(const char *a, const char *b);
char *exo__strdup_null(const char *s);
/* Request parameters: UTF-8, <= EXO_PARAMS_MAX bytes, a JSON object. */
int   exo__check_params_json(const char *s, exo_err *err);

#endif
