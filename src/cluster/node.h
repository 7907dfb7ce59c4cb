/* One exo node of a cluster: the libuv loop that owns this node's replica
 * of the State, its links to the other nodes, the election, the master role
 * when elected, and the worker. Other threads (the HTTP API) talk to it
 * through the calls below, which are all thread-safe.
 *
 * The cluster (docs/ARCHITECTURE.md, docs/DAEMON.md):
 *   identity   an Ed25519 key in the data dir; the node id derives from it
 *   discovery  UDP multicast announcements of the namespace (net/discovery.h)
 *              and --bootstrap-peers; found peers are dialled
 *   links      authenticated, encrypted TCP (net/net.h), one per pair of nodes
 *   election   exo's (cluster/election.h), re-run when membership changes
 *   master     the elected node numbers every event of its session: its own,
 *              the followers' (LocalEvent, until echoed), and those its
 *              command processor makes from the commands of every node's API
 *   replicas   every node folds the session's indexed events in order into
 *              its State, asks for missing ranges, and keeps a copy in its
 *              event log; a new master starts a new session from its State,
 *              and followers switch to it once they have caught up
 *   requests   any node's API serves any instance: the master places the
 *              task, the runner's node streams the chunks straight to the
 *              node whose API holds the request
 *
 * Data flow for a generation:
 *   exo_node_generate (API thread, node B) -> TextGeneration command ->
 *   master -> TaskCreated(origin B) -> the worker of the instance's node A
 *   forwards it to its runner -> chunks -> A sends them to B -> sink->on_chunk
 *   ... terminal chunk -> sink->on_end -> TaskFinished -> TaskDeleted.
 * Every accepted generation gets exactly one terminal chunk (FINISH or
 * ERROR) and then on_end, including when it is cancelled before reaching a
 * runner, when its instance is deleted, when the node running it goes away,
 * and when this node stops.
 *
 * The State is folded on the node thread; readers on other threads use
 * exo_node_read_state, which runs a callback under the State's lock (keep
 * it short: it blocks the node loop). */
#ifndef EXO_CLUSTER_NODE_H
#define EXO_CLUSTER_NODE_H

#include "cluster/downloads.h"
#include "cluster/state.h"
#include "core/paths.h"
#include "download/hub.h"
#include "download/model_store.h"
#include "proto/gen_types.h"

#define EXO_DEFAULT_CLUSTER_PORT   52414
#define EXO_DEFAULT_DISCOVERY_PORT 52413
#define EXO_DEFAULT_NAMESPACE      "exo"
#define EXO_MAX_BOOTSTRAP_PEERS    64

typedef struct exo_node exo_node;

typedef struct exo_node_config {
    const exo_paths *paths;   /* event log, runner logs, models dirs, node key */
    bool        worker;       /* run runners here (--no-worker: false) */
    const char *runner_bin;   /* NULL: /proc/self/exe */
    int         runner_threads;
    int         runner_ctx;
    int         warmup_tokens;
    int         ring_timeout_ms; /* split models: receive timeout on the ring; 0: default */
    int         runner_backoff_ms; /* first respawn delay after a runner failure; 0: 500 */
    /* An open request that should be moving and gets no chunk this long
     * ends with an error (504) and is cancelled; 0: 300 s. */
    int         stall_timeout_ms;
    bool        verbose;
    const exo_hub_opts *hub;  /* model downloads (NULL: exo_hub_opts_from_env) */
    /* the cluster */
    const char *namespace_;   /* NULL: EXO_DEFAULT_NAMESPACE */
    const char *secret;       /* NULL: none (the namespace alone keys the links) */
    int         cluster_port; /* -1: EXO_DEFAULT_CLUSTER_PORT, or any free port if it is taken; 0: any */
    int         discovery_port; /* 0: EXO_DEFAULT_DISCOVERY_PORT */
    bool        no_discovery; /* bootstrap peers only */
    const char *bootstrap[EXO_MAX_BOOTSTRAP_PEERS]; /* "host:port" */
    int         n_bootstrap;
    bool        force_master;
    int         api_port;     /* reported in node info (0: no API) */
    const char *listen_host;  /* cluster listener address (NULL: all) */
} exo_node_config;

/* Loads the identity, opens the event log (a log left by a previous run is
 * archived first: a node starts from an empty State, as exo does), starts
 * the links, discovery and the loop thread. */
int  exo_node_start(const exo_node_config *cfg, exo_node **out, exo_err *err);
/* Ends every open generation with an ERROR chunk ("the node is shutting
 * down"), shuts the runners down, closes the links, stops the loop and
 * archives the log. Calls into the node after this are answered
 * EXO_ECANCELED. */
void exo_node_stop(exo_node *n);
/* Frees a stopped node. */
void exo_node_free(exo_node *n);

const char *exo_node_id(const exo_node *n);
/* The API's real port (once it listens: --api-port 0 picks one), for the
 * node info this node reports. */
void exo_node_set_api_port(exo_node *n, int port);

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

/* ---- models ---- */
/* The card of a model: from this node's models dirs, else any node's report
 * in the State, else the State's custom cards, else the built-in catalogue.
 * EXO_ENOENT when none knows it. */
int exo_node_model_card(exo_node *n, const char *model_id, exo_model_card *out, exo_err *err);
/* A user's download start / cancel / delete on node target (NULL or "":
 * this node), done there by its worker (downloads.h); the outcome shows in
 * the State's downloads. EXO_EINVAL bad id or no worker, EXO_ENOENT unknown
 * node, EXO_EPERM deleting a model of this node's read-only dirs. */
int exo_node_download(exo_node *n, exo_download_action action, const char *target, const char *model_id,
                      exo_id *command_id, exo_err *err);
/* Adds card as a custom model (card != NULL) or deletes the custom model
 * delete_id (EXO_ENOENT if it is not one), through the master. */
int exo_node_custom_model(exo_node *n, const exo_model_card *card, const char *delete_id, exo_id *command_id,
                          exo_err *err);

/* ---- instances ---- */
/* Validates the placement now (EXO_ENOENT unknown model, EXO_EINVAL no fit
 * or one that needs several nodes; *preview, if not NULL, receives it) and
 * submits PlaceInstance. */
int exo_node_place_instance(exo_node *n, const char *model_id, exo_sharding sharding,
                            exo_instance_meta meta, int min_nodes, exo_instance *preview,
                            exo_id *command_id, exo_err *err);
/* The placement the master would compute now, without submitting it. */
int exo_node_preview_placement(exo_node *n, const char *model_id, exo_sharding sharding,
                               exo_instance_meta meta, int min_nodes, exo_instance *out, exo_err *err);
/* Every option (placement.h: exo_placement_previews) as a JSON array; NULL
 * with err when the model is unknown. */
json_t *exo_node_previews(exo_node *n, const char *model_id, exo_err *err);
int exo_node_create_instance(exo_node *n, const exo_instance *inst, exo_id *command_id, exo_err *err);
/* A user's deletion (the reason is "deleted by user"); EXO_ENOENT when no
 * such instance. */
int exo_node_delete_instance(exo_node *n, const exo_id *instance_id, exo_id *command_id, exo_err *err);

/* ---- reading ---- */
void exo_node_read_state(exo_node *n, void (*fn)(void *ctx, const exo_state *st), void *ctx);
/* One page of the current session's event log (GET /events). */
#define EXO_EVENTS_PAGE_MAX 1000
typedef struct exo_events_page {
    json_t  *events;  /* array of {"<Kind>": {...}} (generation tasks' params redacted) */
    uint64_t first;   /* the oldest event still kept (older ones were compacted) */
    uint64_t since;   /* index of events[0] */
    uint64_t next;    /* where the next page starts (since + its length) */
    uint64_t count;   /* events in the session so far */
} exo_events_page;
/* Events from index `since` on (-1: the oldest kept), at most `limit`
 * (0: EXO_EVENTS_PAGE_MAX; larger is capped to it). `since` past the end
 * gives an empty page at count. EXO_ENOENT (page->first says where the log
 * starts) when `since` is before the oldest kept event; other errors are
 * log read errors. Reads and decodes only the page, without the node's
 * lock and off the node's loop thread. On success free page->events
 * (json_decref). */
int exo_node_events_page(exo_node *n, int64_t since, int64_t limit, exo_events_page *page, exo_err *err);
/* This node's view of the cluster: {nodeId, namespace, masterNodeId,
 * sessionClock, isMaster, electionInProgress, caughtUp, clusterPort,
 * peers: [{nodeId, remote, dialed, rttUs}]}. */
json_t *exo_node_cluster_json(exo_node *n);
/* The hub this node downloads from (its config, or the environment's). */
const exo_hub_opts *exo_node_hub(exo_node *n);
/* A fresh scan of the models dirs (free with exo_model_store_free). */
exo_model_store *exo_node_models(exo_node *n);
/* Generations currently open (tests, logs). */
int exo_node_open_generations(exo_node *n);

#endif
