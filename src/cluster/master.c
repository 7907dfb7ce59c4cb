/* The master's command processor (see master.h). */
#include "cluster/master.h"

#include "cluster/placement.h"
#include "core/alloc.h"

#include <string.h>

static bool task_active(const exo_task *t)
{
    return t->status == EXO_TASK_PENDING || t->status == EXO_TASK_RUNNING;
}

static void cancel_task(exo_event_list *out, const exo_task *t)
{
    exo_event *ev = exo_event_list_add(out, EXO_EVENT_TASK_STATUS_UPDATED);
    ev->u.task_status_updated.task_id = t->task_id;
    ev->u.task_status_updated.status = EXO_TASK_CANCELLED;
}

static int place(const exo_state *st, const exo_command *cmd, exo_event_list *out, exo_err *err)
{
    exo_placement_request req = {&cmd->u.place_instance.card, cmd->u.place_instance.sharding,
                                 cmd->u.place_instance.meta, cmd->u.place_instance.min_nodes, 0};
    exo_instance inst;
    int rc = exo_placement_place(st, &req, &inst, err);
    if (rc)
        return rc;
    exo_event *ev = exo_event_list_add(out, EXO_EVENT_INSTANCE_CREATED);
    ev->u.instance_created.instance = inst; /* moved */
    return 0;
}

static int text_generation(const exo_state *st, const exo_command *cmd, exo_event_list *out,
                           exo_err *err)
{
    const char *model = cmd->u.text_generation.model_id;
    size_t n = exo_state_instances_for_model(st, model, NULL, 0);
    if (!n)
        return exo_err_set(err, EXO_ENOENT, "No instance found for model %s", model);
    const exo_instance **insts = exo_calloc(n, sizeof *insts);
    exo_state_instances_for_model(st, model, insts, n);
    const exo_instance *best = insts[0];
    size_t best_load = exo_state_active_task_count(st, &best->instance_id);
    for (size_t i = 1; i < n; i++) {
        size_t load = exo_state_active_task_count(st, &insts[i]->instance_id);
        if (load < best_load) {
            best = insts[i];
            best_load = load;
        }
    }
    exo_event *ev = exo_event_list_add(out, EXO_EVENT_TASK_CREATED);
    exo_task *t = &ev->u.task_created.task;
    exo_id_new(&t->task_id);
    t->kind = EXO_TASK_KIND_TEXT_GENERATION;
    t->status = EXO_TASK_PENDING;
    t->instance_id = best->instance_id;
    t->command_id = cmd->command_id;
    t->node_id = cmd->u.text_generation.origin;
    t->params_json = exo_strdup(cmd->u.text_generation.params_json);
    exo_free(insts);
    return 0;
}

int exo_master_handle(const exo_state *st, const exo_command *cmd, exo_event_list *out, exo_err *err)
{
    size_t start = out->n;
    int rc = 0;
    switch (cmd->kind) {
    case EXO_COMMAND_PLACE_INSTANCE:
        rc = place(st, cmd, out, err);
        break;
    case EXO_COMMAND_CREATE_INSTANCE:
        if ((rc = exo_instance_validate(&cmd->u.create_instance.instance, err)))
            break;
        exo_instance_copy(&exo_event_list_add(out, EXO_EVENT_INSTANCE_CREATED)->u.instance_created.instance,
                          &cmd->u.create_instance.instance);
        break;
    case EXO_COMMAND_DELETE_INSTANCE: {
        const exo_id *id = &cmd->u.delete_instance.instance_id;
        const exo_instance *inst = exo_state_instance(st, id);
        if (!inst) {
            rc = exo_err_set(err, EXO_ENOENT, "instance %s not found", id->s);
            break;
        }
        /* the deletion first: nodes end the instance's open requests with
         * its reason, before the cancellations would end them quietly */
        exo_event *ev = exo_event_list_add(out, EXO_EVENT_INSTANCE_DELETED);
        ev->u.instance_deleted.instance_id = *id;
        memcpy(ev->u.instance_deleted.model_id, inst->model_id, EXO_MODEL_ID_MAX);
        ev->u.instance_deleted.reason = exo_strdup(cmd->u.delete_instance.reason ? cmd->u.delete_instance.reason
                                                                                 : "deleted");
        for (size_t i = 0; i < exo_state_task_count(st); i++) {
            const exo_task *t = exo_state_task_at(st, i);
            if (exo_id_eq(&t->instance_id, id) && task_active(t))
                cancel_task(out, t);
        }
        break;
    }
    case EXO_COMMAND_TEXT_GENERATION:
        rc = text_generation(st, cmd, out, err);
        break;
    case EXO_COMMAND_TASK_CANCELLED: {
        const exo_task *t = exo_state_task_for_command(st, &cmd->u.task_cancelled.cancelled_command_id);
        if (!t)
            rc = exo_err_set(err, EXO_ENOENT, "command %s not found",
                             cmd->u.task_cancelled.cancelled_command_id.s);
        else if (task_active(t))
            cancel_task(out, t);
        break;
    }
    case EXO_COMMAND_TASK_FINISHED: {
        const exo_task *t = exo_state_task_for_command(st, &cmd->u.task_finished.finished_command_id);
        if (!t)
            rc = exo_err_set(err, EXO_ENOENT, "command %s not found",
                             cmd->u.task_finished.finished_command_id.s);
        else
            exo_event_list_add(out, EXO_EVENT_TASK_DELETED)->u.task_deleted.task_id = t->task_id;
        break;
    }
    case EXO_COMMAND_ADD_CUSTOM_MODEL_CARD:
        if ((rc = exo_model_card_validate(&cmd->u.add_custom_model_card.card, err)))
            break;
        exo_event_list_add(out, EXO_EVENT_CUSTOM_MODEL_CARD_ADDED)->u.custom_model_card_added.card =
            cmd->u.add_custom_model_card.card;
        break;
    case EXO_COMMAND_DELETE_CUSTOM_MODEL_CARD: {
        const char *id = cmd->u.delete_custom_model_card.model_id;
        if (!exo_state_custom_card(st, id)) {
            rc = exo_err_set(err, EXO_ENOENT, "%s is not a custom model", id);
            break;
        }
        memcpy(exo_event_list_add(out, EXO_EVENT_CUSTOM_MODEL_CARD_DELETED)->u.custom_model_card_deleted.model_id, id,
               EXO_MODEL_ID_MAX);
        break;
    }
    default:
        rc = exo_err_set(err, EXO_EINVAL, "unknown command kind %d", (int)cmd->kind);
    }
    if (rc) { /* all or nothing */
        for (size_t i = start; i < out->n; i++)
            exo_event_clear(&out->v[i]);
        out->n = start;
    }
    return rc;
}
