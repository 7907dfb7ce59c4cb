/* The master's command processor: commands in, events out.
 *
 * exo_master_handle is a pure function of the State (and the node's model
 * list for placement): it never applies what it returns, so the caller
 * (the node loop) indexes, logs and folds the events in order, and replay
 * or a second master reaches the same State. Rules (exo-reference §2.5):
 *   PlaceInstance    placement (placement.h) -> InstanceCreated
 *   CreateInstance   validated instance -> InstanceCreated
 *   DeleteInstance   TaskStatusUpdated(Cancelled) for its Pending/Running
 *                    tasks, then InstanceDeleted
 *   TextGeneration   the model's instance with the fewest Pending/Running
 *                    tasks (ties: first created) -> TaskCreated(Pending)
 *   TaskCancelled    the command's task, if Pending/Running ->
 *                    TaskStatusUpdated(Cancelled)
 *   TaskFinished     the command's task -> TaskDeleted
 * Errors (nothing emitted): EXO_ENOENT for an unknown model, instance or
 * command; EXO_EINVAL for a placement that does not fit or a bad instance. */
#ifndef EXO_CLUSTER_MASTER_H
#define EXO_CLUSTER_MASTER_H

#include "cluster/events.h"
#include "cluster/state.h"
#include "download/model_store.h"

/* The events a command produced, in order (grows as needed). */
typedef struct exo_event_list {
    exo_event *v;
    size_t     n, cap;
} exo_event_list;

/* Appends a zero-initialised event of kind (fresh event id) and returns it. */
exo_event *exo_event_list_add(exo_event_list *l, exo_event_kind kind);
void       exo_event_list_clear(exo_event_list *l); /* frees the events, keeps nothing */

int exo_master_handle(const exo_state *st, const exo_command *cmd, const exo_model_store *models,
                      exo_event_list *out, exo_err *err);

#endif
