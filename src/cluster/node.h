/* One exo node: the libuv loop that owns the State, with the master (the
 * node is its own master until the cluster layer elects one), the event
 * log, and the worker. Other threads (the HTTP API) talk to it through the
 * calls below, which are all thread-safe.
 *
 * Data flow for a generation (docs/ARCHITECTURE.md):
 *   exo_node_generate (API thread) -> inbox -> TextGeneration command ->
 *   master -> TaskCreated -> worker forwards it to its runner -> runner
 *   chunks -> sink->on_chunk (node thread) ... terminal chunk ->
 *   sink->on_end -> TaskFinished -> TaskDeleted.
 * Every accepted generation gets exactly one terminal chunk (FINISH or
 * ERROR) and then on_end, including when it is cancelled before reaching
 * a runner, when its instance is deleted, and when the node stops.
 *
 * The State is folded on the node thread; readers on other threads use
 * exo_node_read_state, which runs a callback under the State's lock (keep
 * it short: it blocks the node loop). */
#ifndef EXO_CLUSTER_NODE_H
#define EXO_CLUSTER_NODE_H

#include "proto/gen_types.h"
#include "cluster/state.h"
#include "core/paths.h"
#include "download/model_store.h"

typedef struct exo_node exo_node;

typedef struct exo_node_config {
    const exo_paths *paths;   /* event log, runner logs, models dirs, node id file */
    bool        worker;       /* run runners here (--no-worker: false) */
    const char *runner_bin;   /* NULL: /proc/self/exe */
    int         runner_threads;
    int         runner_ctx;
    int         warmup_tokens;
    bool        verbose;
} exo_node_config;

/* Opens the event log (a log left by a previous run is archived first: a
 * node starts from an empty State, as exo does), starts the loop thread
 * and, with a worker, publishes this node's info. */
int  exo_node_start(const exo_node_config *cfg, exo_node **out, exo_err *err);
/* Ends every open generation with an ERROR chunk ("the node is shutting
 * down"), shuts the runners down, stops the loop and archives the log.
 * Calls into the node after this are answered EXO_ECANCELED. */
void exo_node_stop(exo_node *n);
/* Frees a stopped node. */
void exo_node_free(exo_node *n);

const char *exo_node_id(const exo_node *n);

/* ---- generation ---- */
typedef struct exo_gen_sink {
    void *ctx;
    void (*on_chunk)(void *ctx, const exo_chunk *c); /* node thread; borrowed */
    void (*on_end)(void *ctx);                       /* node thread; the sink is never used again */
} exo_gen_sink;

/* Whether an instance of the model exists now. */
bool exo_node_serves_model(exo_node *n, const char *model_id);
/* Submits a generation of req (copied) under command_id (the caller's fresh
 * exo_id_new, so it can name the response before the first chunk).
 * EXO_ENOENT ("No instance found for model X") when nothing serves
 * req->model, EXO_ECANCELED when stopping: then the sink is never called. */
int exo_node_generate(exo_node *n, const exo_gen_request *req, const exo_gen_sink *sink,
                      const exo_id *command_id, exo_err *err);
/* Cancels a generation that has not ended. EXO_ENOENT when the command is
 * unknown or already finished. Its stream then ends within a token. */
int exo_node_cancel(exo_node *n, const char *command_id);

/* ---- instances ---- */
/* Validates the placement now (EXO_ENOENT unknown model, EXO_EINVAL no fit;
 * *preview, if not NULL, receives it) and submits PlaceInstance. */
int exo_node_place_instance(exo_node *n, const char *model_id, exo_sharding sharding,
                            exo_instance_meta meta, int min_nodes, exo_instance *preview,
                            exo_id *command_id, exo_err *err);
/* The placement the master would compute now, without submitting it. */
int exo_node_preview_placement(exo_node *n, const char *model_id, exo_sharding sharding,
                               exo_instance_meta meta, int min_nodes, exo_instance *out, exo_err *err);
int exo_node_create_instance(exo_node *n, const exo_instance *inst, exo_id *command_id, exo_err *err);
/* EXO_ENOENT when no such instance. */
int exo_node_delete_instance(exo_node *n, const exo_id *instance_id, exo_id *command_id, exo_err *err);

/* ---- reading ---- */
void exo_node_read_state(exo_node *n, void (*fn)(void *ctx, const exo_state *st), void *ctx);
/* Events from index `since` on, as a JSON array of {"<Kind>": {...}}; NULL
 * with err on a log read error. */
json_t *exo_node_events_json(exo_node *n, int64_t since, exo_err *err);
/* A fresh scan of the models dirs (free with exo_model_store_free). */
exo_model_store *exo_node_models(exo_node *n);
/* Generations currently open (tests, logs). */
int exo_node_open_generations(exo_node *n);

#endif
