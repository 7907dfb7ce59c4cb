/* The cluster State: a pure fold of indexed events.
 *
 * exo_state_apply(state, idx, event) is the only mutator. It requires idx ==
 * last applied index + 1 (the first event has idx 0) and leaves the State
 * untouched on any error, so a master, a worker and an API replica that
 * apply the same event sequence hold equal States (checked by comparing
 * exo_state_to_json outputs). Events are copied in: the caller keeps
 * ownership of the event it passes.
 *
 * Reducers (as exo's shared/apply.py, adapted where the brief says so):
 *   InstanceCreated      insert or replace the instance
 *   InstanceDeleted      remove the instance and the runner statuses of its
 *                        runners, and remember it with the event's reason
 *                        and time among the last EXO_STATE_DELETED_MAX
 *                        deleted instances (unknown id: only remembered
 *                        when the event names a model, as the events of
 *                        exo_state_to_events do; else a no-op)
 *   InstanceCreated also forgets a remembered deletion of the same id.
 *   RunnerStatusUpdated  set the runner's status; Shutdown removes the entry
 *   RunnerDeleted        remove the runner's status
 *   TaskCreated          insert or replace the task
 *   TaskStatusUpdated    set the status; any status but Failed clears the
 *                        task's error fields (unknown task: no-op)
 *   TaskFailed           set error_type / error_message (status unchanged,
 *                        a TaskStatusUpdated(Failed) says that)
 *   TaskDeleted          remove the task
 *   NodeGatheredInfo     set the node's info and last_seen = when_ms
 *   NodeTimedOut         remove the node's info, last_seen and every
 *                        topology edge that touches it
 *   TopologyEdgeCreated  insert or replace the edge (same source, sink,
 *                        address)
 *   TopologyEdgeDeleted  remove that edge (unknown: no-op)
 * A task in a final status (Complete, TimedOut, Failed, Cancelled) keeps
 * it: later TaskStatusUpdated events for it are no-ops (in a cluster, a
 * worker's "Running" may reach the master after "Cancelled").
 *
 * Lookups return pointers into the State (const, borrowed): they stay valid
 * until the next exo_state_apply or exo_state_free. Callers that need to
 * keep data across applies copy it (exo_instance_copy, exo_task_copy...).
 * Iteration order is insertion order, so JSON output is deterministic.
 *
 * Threading: none inside. The node loop thread owns the State; other
 * threads get JSON snapshots or copies.
 *
 * Example usage:
 *   exo_state *st = exo_state_new();
 *   for (each indexed event (idx, ev))
 *       if (exo_state_apply(st, idx, &ev, &err) < 0) ...   // gap: ask for a resend
 *   const exo_instance *insts[8];
 *   size_t n = exo_state_instances_for_model(st, "org/model", insts, 8);
 *   json_t *j = exo_state_to_json(st);                       // GET /state
 *   exo_state_free(st); */
#ifndef EXO_CLUSTER_STATE_H
#define EXO_CLUSTER_STATE_H

#include "cluster/events.h"
#include "cluster/types.h"
#include "core/error.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef struct exo_state exo_state;

/* A node as the State knows it (from its last NodeGatheredInfo). */
typedef struct exo_state_node {
    exo_id        node_id;
    exo_node_info info;
    int64_t       last_seen_ms;   /* master-stamped Unix ms */
} exo_state_node;

/* An instance deleted recently, and why (GET /instance/{id}, the
 * dashboard). The State keeps the last EXO_STATE_DELETED_MAX, oldest
 * first. */
#define EXO_STATE_DELETED_MAX 16
typedef struct exo_deleted_instance {
    exo_id  instance_id;
    char    model_id[EXO_MODEL_ID_MAX]; /* "" when unknown */
    char   *reason;                     /* heap; NULL: the event had none (older logs) */
    int64_t when_ms;                    /* Unix ms; 0: unknown */
} exo_deleted_instance;

exo_state *exo_state_new(void);
void       exo_state_free(exo_state *st);
/* A deep copy (for a component that folds on its own). */
exo_state *exo_state_clone(const exo_state *st);

/* Applies event number idx. Errors: EXO_EINVAL when idx != last + 1 or the
 * event fails exo_event_validate; the State is unchanged then. */
int exo_state_apply(exo_state *st, int64_t idx, const exo_event *ev, exo_err *err);

/* -1 before the first event. */
int64_t exo_state_last_event_applied_idx(const exo_state *st);

/* ---- lookups (borrowed pointers, see above) ---- */
size_t              exo_state_instance_count(const exo_state *st);
const exo_instance *exo_state_instance_at(const exo_state *st, size_t i);
const exo_instance *exo_state_instance(const exo_state *st, const exo_id *instance_id);
/* Instances serving model_id: writes up to max pointers, returns how many
 * exist (may exceed max). */
size_t exo_state_instances_for_model(const exo_state *st, const char *model_id,
                                     const exo_instance **out, size_t max);
/* The instance a runner belongs to, or NULL. */
const exo_instance *exo_state_instance_of_runner(const exo_state *st, const exo_id *runner_id);

/* NULL when the runner has no status (not created yet, or gone). */
const exo_runner_status *exo_state_runner_status(const exo_state *st, const exo_id *runner_id);

size_t          exo_state_task_count(const exo_state *st);
const exo_task *exo_state_task_at(const exo_state *st, size_t i);
const exo_task *exo_state_task(const exo_state *st, const exo_id *task_id);
/* The TextGeneration task created for a command, or NULL. */
const exo_task *exo_state_task_for_command(const exo_state *st, const exo_id *command_id);
/* Tasks of an instance (same max/return convention as above). */
size_t exo_state_tasks_of_instance(const exo_state *st, const exo_id *instance_id,
                                   const exo_task **out, size_t max);
/* Number of an instance's tasks that are Pending or Running (the master's
 * load measure when choosing an instance for a request). */
size_t exo_state_active_task_count(const exo_state *st, const exo_id *instance_id);

size_t                   exo_state_edge_count(const exo_state *st);
const exo_topology_edge *exo_state_edge_at(const exo_state *st, size_t i);

size_t                exo_state_node_count(const exo_state *st);
const exo_state_node *exo_state_node_at(const exo_state *st, size_t i);
const exo_state_node *exo_state_node_find(const exo_state *st, const exo_id *node_id);

size_t                      exo_state_deleted_count(const exo_state *st);
const exo_deleted_instance *exo_state_deleted_at(const exo_state *st, size_t i);
/* NULL unless the instance is among the remembered deletions. */
const exo_deleted_instance *exo_state_deleted_instance(const exo_state *st, const exo_id *instance_id);
/* {"instanceId", "modelId", "reason", "deletedAt"} (null where unknown). */
json_t *exo_deleted_instance_to_json(const exo_deleted_instance *d);

/* Downloads: the latest status of each (node, model). */
size_t                     exo_state_download_count(const exo_state *st);
const exo_download_status *exo_state_download_at(const exo_state *st, size_t i);
const exo_download_status *exo_state_download(const exo_state *st, const exo_id *node_id, const char *model_id);

/* Model cards users added (POST /models/add), by model id. */
size_t                exo_state_custom_card_count(const exo_state *st);
const exo_model_card *exo_state_custom_card_at(const exo_state *st, size_t i);
const exo_model_card *exo_state_custom_card(const exo_state *st, const char *model_id);

/* Events that rebuild st from an empty State (a new master's session
 * starts with them): folding them in order gives a State whose JSON equals
 * st's, except lastEventAppliedIdx. Appended to out. */
void exo_state_to_events(const exo_state *st, exo_event_list *out);
/* The inverse, for a snapshot (cluster/snapshot.h): a fresh State folded
 * from evs (exo_state_to_events output) that stands at event last_idx.
 * Errors: EXO_EINVAL (last_idx < 0, or an event the fold refuses). */
int exo_state_from_events(const exo_event *evs, size_t n, int64_t last_idx, exo_state **out, exo_err *err);

/* GET /state body: {"instances", "runners", "tasks", "lastSeen",
 * "nodeIdentities" ({friendlyName, cpuCount}), "nodeMemory" ({ramTotal,
 * ramAvailable: {inBytes}}), "nodeDisk", "nodeSystem", "nodeNetwork",
 * "nodeGpus", "nodeBackends", "nodeModels", "topology" ({nodes,
 * connections: [{source, sink, address, latencyUs, bandwidthBps}]}),
 * "downloads" (node id -> [tagged download status]), "customModelCards"
 * (model id -> card), "deletedInstances" (instance id ->
 * exo_deleted_instance_to_json, oldest first), "lastEventAppliedIdx"},
 * camelCase, maps keyed by id in insertion order. Never NULL. */
json_t *exo_state_to_json(const exo_state *st);

#endif
