/* The vocabulary of the cluster: lifecycle enums and the records that
 * events carry and the State holds (instances, tasks, node information).
 * Ids, bounded text and runner statuses, which the runner processes share,
 * are in proto/types.h.
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
#include "proto/types.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Instance size limit: more shards than this is malformed input. */
#define EXO_MAX_SHARDS 256

/* ---- enums with name tables ---------------------------------------------- */
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
const char *exo_task_status_name(exo_task_status s);
const char *exo_task_kind_name(exo_task_kind k);
const char *exo_sharding_name(exo_sharding s);
const char *exo_instance_meta_name(exo_instance_meta m);
const char *exo_backend_name(exo_backend_kind b);
int exo_task_status_parse(const char *s, size_t len);
int exo_task_kind_parse(const char *s, size_t len);
int exo_sharding_parse(const char *s, size_t len);
int exo_instance_meta_parse(const char *s, size_t len);
int exo_backend_parse(const char *s, size_t len);

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

#endif
