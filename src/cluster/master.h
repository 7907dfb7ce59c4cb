/* The master's command processor: commands in, events out.
 *
 * exo_master_handle is a pure function of the State: it never applies what it returns, so the caller
 * (the node loop) indexes, logs and folds the events in order, and replay
 * or a second master reaches the same State. Rules (exo-reference §2.5):
 *   PlaceInstance    placement (placement.h) of the command's model card ->
 *                    InstanceCreated
 *   CreateInstance   validated instance -> InstanceCreated
 *                    (both refuse instances of several nodes until
 *                    distributed inference exists)
 *   DeleteInstance   InstanceDeleted (its model, the command's reason or
 *                    "deleted"), then TaskStatusUpdated(Cancelled) for its
 *                    Pending/Running tasks
 *   TextGeneration   the model's instance with the fewest Pending/Running
 *                    tasks (ties: first created) -> TaskCreated(Pending),
 *                    whose node_id is the origin (the node whose API holds
 *                    the request: chunks go there)
 *   TaskCancelled    the command's task, if Pending/Running ->
 *                    TaskStatusUpdated(Cancelled)
 *   TaskFinished     the command's task -> TaskDeleted
 * Errors (nothing emitted): EXO_ENOENT for an unknown model, instance or
 * command; EXO_EINVAL for a placement that does not fit or a bad instance. */
#ifndef EXO_CLUSTER_MASTER_H
#define EXO_CLUSTER_MASTER_H

#include "cluster/events.h"
#include "cluster/state.h"


int exo_master_handle(const exo_state *st, const exo_command *cmd, exo_event_list *out, exo_err *err);

#endif
