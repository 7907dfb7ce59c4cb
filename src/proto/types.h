/* The vocabulary that the API, the cluster and the runner processes share:
 * ids, bounded text, and a runner's status (the one cluster record a runner
 * reports itself). Cluster-only records (instances, tasks, node info) are in
 * cluster/types.h, which builds on this.
 *
 * Ownership: small bounded strings are fixed arrays inside the structs;
 * unbounded ones (error messages) are heap allocated and owned by the
 * struct, with a `_copy` (deep copy into an uninitialised dst), a `_clear`
 * (frees, leaves the struct zeroed) and an `_equal`. Enums are append-only:
 * only their names are ever stored or sent (the name tables below).
 *
 * Example usage:
 *   exo_id id;
 *   exo_id_new(&id);                       // a fresh UUID4
 *   exo_runner_status st;
 *   exo_runner_status_init(&st, EXO_RUNNER_LOADING);
 *   st.layers_loaded = 3; st.total_layers = 16;
 *   if (exo_runner_status_validate(&st, &err) < 0) ...
 *   exo_runner_status_clear(&st); */
#ifndef EXO_PROTO_TYPES_H
#define EXO_PROTO_TYPES_H

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
/* Network addresses as text: "192.168.1.2:52414", "[fe80::1%eth0]:52414",
 * or a bare numeric IP. Printable ASCII, no spaces. */
#define EXO_ADDR_MAX 80
/* Friendly names: UTF-8 without control characters. */
#define EXO_NAME_MAX 128
/* Heap strings carried by events (error messages) and request parameters. */
#define EXO_MESSAGE_MAX ((size_t)64 * 1024)
#define EXO_PARAMS_MAX  ((size_t)8 * 1024 * 1024)

/* Device names, where a runner puts its layers: "" or "auto" (a GPU when
 * the node has one, else the CPU), "cpu", "cuda" (the first GPU) or
 * "cuda:N" (N a CUDA ordinal below EXO_DEVICE_GPU_MAX, no sign or leading
 * zero). The placement names the GPU of each rank on a node with several;
 * one rank a GPU, as NCCL wants. */
#define EXO_DEVICE_MAX     16
#define EXO_DEVICE_GPU_MAX 64
bool exo_device_valid(const char *s);
/* The GPU a valid device name names: N for "cuda:N", 0 for "cuda", -1 for
 * the others. */
int  exo_device_gpu(const char *s);

/* True if s[0..len) is well-formed UTF-8 with no NUL byte. */
bool exo_text_utf8_valid(const char *s, size_t len);

/* ---- runner status --------------------------------------------------------
 * Tagged: layers_* only for LOADING, prefill_server_port for READY (-1 =
 * none), ring_port for CONNECTING (-1 = none), error_message (heap, may be NULL) for FAILED. */
#define EXO_RUNNER_STATUS_MAP(XX)                                            \
    XX(IDLE, "Idle") XX(CONNECTING, "Connecting") XX(CONNECTED, "Connected") \
    XX(LOADING, "Loading") XX(LOADED, "Loaded") XX(WARMING_UP, "WarmingUp")  \
    XX(READY, "Ready") XX(RUNNING, "Running")                                \
    XX(SHUTTING_DOWN, "ShuttingDown") XX(SHUTDOWN, "Shutdown")               \
    XX(FAILED, "Failed")

#define EXO__ENUM_ITEM(prefix, name, str) prefix##name,
#define XX(n, s) EXO__ENUM_ITEM(EXO_RUNNER_, n, s)
typedef enum exo_runner_status_kind { EXO_RUNNER_STATUS_MAP(XX) EXO_RUNNER__COUNT } exo_runner_status_kind;
#undef XX

const char *exo_runner_status_name(exo_runner_status_kind k);
int exo_runner_status_parse(const char *s, size_t len);

typedef struct exo_runner_status {
    exo_runner_status_kind kind;
    int32_t layers_loaded, total_layers;
    int32_t prefill_server_port;
    int32_t ring_port;           /* CONNECTING: the runner's ring listener, -1 = none */
    char   *error_message;
} exo_runner_status;

void exo_runner_status_init(exo_runner_status *st, exo_runner_status_kind kind);
void exo_runner_status_copy(exo_runner_status *dst, const exo_runner_status *src);
void exo_runner_status_clear(exo_runner_status *st);
bool exo_runner_status_equal(const exo_runner_status *a, const exo_runner_status *b);
int  exo_runner_status_validate(const exo_runner_status *st, exo_err *err);

/* Heap string helpers: NULL-safe equality and duplication. */
bool  exo__str_eq_null(const char *a, const char *b);
char *exo__strdup_null(const char *s);
/* Request parameters: UTF-8, <= EXO_PARAMS_MAX bytes, a JSON object. */
int   exo__check_params_json(const char *s, exo_err *err);

/* NULL, or UTF-8 of at most max bytes; EXO_EINVAL naming `what` otherwise. */
int   exo__check_text(const char *s, size_t max, const char *what, exo_err *err);

#endif
