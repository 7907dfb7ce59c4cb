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
/* Where a node's download of a model stands (exo's DownloadPending /
 * Ongoing / Completed / Failed). */
#define EXO_DOWNLOAD_KIND_MAP(XX) XX(PENDING, "DownloadPending") XX(ONGOING, "DownloadOngoing") \
    XX(COMPLETED, "DownloadCompleted") XX(FAILED, "DownloadFailed")
#define XX(n, s) EXO__ENUM_ITEM(EXO_DOWNLOAD_KIND_, n, s)
typedef enum exo_download_kind { EXO_DOWNLOAD_KIND_MAP(XX) EXO_DOWNLOAD_KIND__COUNT } exo_download_kind;
#undef XX

/* name(value) returns the table name ("?" when out of range); parse(name)
 * returns the value or -1 (exact, case-sensitive match of len bytes). */
const char *exo_task_status_name(exo_task_status s);
const char *exo_download_kind_name(exo_download_kind k);
int exo_download_kind_parse(const char *s, size_t len);
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
 * A runner id appears once per instance; a node holds several of its
 * shards only when each names its device and no GPU twice (a rank per GPU
 * of a node with several; "cpu" may repeat), so exo's node_to_runner, a
 * function, names a node's first rank. */
typedef struct exo_shard {
    exo_id  runner_id;
    exo_id  node_id;
    int32_t device_rank, world_size;
    int32_t start_layer, end_layer, n_layers;
    char    device[EXO_DEVICE_MAX]; /* proto/types.h device name; "": the node's default */
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
/* The shard of a runner / a node's first shard (lowest rank), or NULL. */
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

/* ---- model cards --------------------------------------------------------------
 * What placement needs to know about a model (from its config.json and
 * files on the node that asked; exo's ModelCard, trimmed). */
typedef struct exo_model_card {
    char     model_id[EXO_MODEL_ID_MAX];
    int32_t  n_layers;
    int32_t  hidden_size;
    int32_t  n_kv_heads;
    int32_t  vocab_size;        /* 0: unknown */
    uint64_t storage_bytes;
    bool     supports_tensor;
    /* for listing the model on any node (/v1/models, Ollama tags) */
    char     model_type[EXO_NAME_MAX];   /* config.json model_type */
    char     quantization[EXO_NAME_MAX]; /* "4bit", "bf16", ... */
    int64_t  context_length;
    bool     supports_tools, supports_thinking;
} exo_model_card;

int exo_model_card_validate(const exo_model_card *c, exo_err *err);

/* ---- downloads (NodeDownloadProgress) ----------------------------------------
 * One node's download of one model (or of a pipeline shard's layers of it:
 * [start_layer, end_layer) of n_layers; 0, 0, 0 for the whole model). The
 * State keeps the latest per (node, model). */
typedef struct exo_download_status {
    exo_id            node_id;
    char              model_id[EXO_MODEL_ID_MAX];
    exo_download_kind kind;
    int32_t           start_layer, end_layer, n_layers;
    char             *model_directory; /* heap; may be NULL */
    uint64_t          total, downloaded, downloaded_this_session; /* bytes */
    int32_t           completed_files, total_files;
    uint64_t          speed;   /* bytes/s */
    int64_t           eta_ms;
    bool              read_only;
    char             *error_message; /* heap; Failed only */
} exo_download_status;

void exo_download_status_copy(exo_download_status *dst, const exo_download_status *src);
void exo_download_status_clear(exo_download_status *st);

/* ---- node information (NodeGatheredInfo) ----------------------------------
 * What a node reports about itself. Records with heap arrays: copy/clear/
 * equal/validate go through the record descriptors (codec.h) below, the
 * same tables the wire and JSON codecs use. */
#define EXO_NODE_MAX_GPUS       64
#define EXO_NODE_MAX_INTERFACES 64
#define EXO_NODE_MAX_MODELS     256

#define EXO_IFACE_KIND_MAP(XX) XX(ETHERNET, "ethernet") XX(WIFI, "wifi") XX(LOOPBACK, "loopback") \
    XX(VIRTUAL, "virtual") XX(UNKNOWN, "unknown")
#define XX(n, s) EXO__ENUM_ITEM(EXO_IFACE_, n, s)
typedef enum exo_iface_kind { EXO_IFACE_KIND_MAP(XX) EXO_IFACE__COUNT } exo_iface_kind;
#undef XX
const char *exo_iface_kind_name(exo_iface_kind k);
int exo_iface_kind_parse(const char *s, size_t len);

typedef struct exo_gpu_info {
    int32_t  index;                  /* the CUDA ordinal a runner opens (cuda:N) */
    char     name[EXO_NAME_MAX];     /* "NVIDIA H200" */
    uint64_t memory_total;           /* bytes */
    uint64_t memory_used;            /* bytes */
    uint64_t memory_read_bps;        /* peak memory bandwidth, bytes/s (NVML: clock x bus width); 0: unknown */
} exo_gpu_info;

typedef struct exo_net_iface {
    char           name[EXO_NAME_MAX]; /* "eth0" */
    char           ip[EXO_ADDR_MAX];   /* one address of it, numeric (link-local: with %scope) */
    exo_iface_kind kind;
} exo_net_iface;

#define EXO__ARRAY(T) struct { T *v; size_t n; }
typedef struct exo_node_info {
    uint64_t memory_total;      /* bytes */
    uint64_t memory_available;  /* bytes */
    int32_t  cpu_count;
    char     friendly_name[EXO_NAME_MAX];
    uint32_t backends;          /* bit (1u << exo_backend_kind) */
    char     cpu_model[EXO_NAME_MAX];
    char     os[EXO_NAME_MAX];  /* "Linux 6.1.0 x86_64" */
    uint64_t disk_total;        /* bytes of the first writable models dir's filesystem */
    uint64_t disk_available;
    int32_t  api_port;          /* 0: no API on this node */
    int32_t  cluster_port;      /* 0: not in a cluster */
    uint64_t mem_read_bps;      /* memory read bandwidth, bytes/s, measured once (0: unknown):
                                   what bounds decode, for placement's speed predictions */
    EXO__ARRAY(exo_gpu_info)  gpus;
    EXO__ARRAY(exo_net_iface) interfaces;
    EXO__ARRAY(exo_model_card) models;  /* complete on disk here */
} exo_node_info;

void exo_node_info_copy(exo_node_info *dst, const exo_node_info *src);
void exo_node_info_clear(exo_node_info *info);
bool exo_node_info_equal(const exo_node_info *a, const exo_node_info *b);
int  exo_node_info_validate(const exo_node_info *info, exo_err *err);
/* The card of model_id if the node has it on disk, else NULL. */
const exo_model_card *exo_node_info_model(const exo_node_info *info, const char *model_id);

/* ---- topology ---------------------------------------------------------------
 * A directed edge: `source` reached `sink` at `address` (the sink's cluster
 * listener, "ip:port"), measured by the source. One edge per (source, sink,
 * address); latency and bandwidth are the source's last measurement. */
typedef struct exo_topology_edge {
    exo_id   source, sink;
    char     address[EXO_ADDR_MAX];
    int64_t  latency_us;        /* round trip, microseconds */
    uint64_t bandwidth_bps;     /* bits per second, 0 = not measured */
} exo_topology_edge;

bool exo_topology_edge_same(const exo_topology_edge *a, const exo_topology_edge *b); /* same key */
int  exo_topology_edge_validate(const exo_topology_edge *e, exo_err *err);

/* Record descriptors of the above (codec.h), for the codecs that embed them. */
struct exo_record_desc;
extern const struct exo_record_desc exo_node_info_desc;
extern const struct exo_record_desc exo_topology_edge_desc;
extern const struct exo_record_desc exo_model_card_desc;
extern const struct exo_record_desc exo_download_status_desc;
/* Enum descriptors for field tables. */
struct exo_enum_desc;
extern const struct exo_enum_desc exo_task_status_enum, exo_sharding_enum, exo_instance_meta_enum,
    exo_backend_enum, exo_iface_kind_enum, exo_download_kind_enum;

#endif
