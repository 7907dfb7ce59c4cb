/* The State fold (see state.h for the reducers and ownership rules).
 *
 * Storage is four insertion-ordered arrays searched linearly: a cluster has
 * a handful of nodes and instances, and tasks are deleted when their command
 * finishes, so the sets stay small; ordered arrays also make the JSON
 * rendering deterministic without sorting. If task counts grow into the
 * thousands, an id -> index hash goes in front of `tasks` without changing
 * the API. Removal keeps order (memmove).
 *
 * Atomicity: every reducer validates first and then mutates with operations
 * that cannot fail (allocation failure aborts by policy), so an error return
 * always means "nothing changed". */
#include "cluster/state.h"

#include "cluster/codec.h"
#include "core/alloc.h"

#include <stdio.h>
#include <string.h>

typedef struct runner_entry {
    exo_id            runner_id;
    exo_runner_status status;
} runner_entry;

struct exo_state {
    int64_t         last_idx;
    exo_instance   *instances;
    size_t          n_instances, cap_instances;
    runner_entry   *runners;
    size_t          n_runners, cap_runners;
    exo_task       *tasks;
    size_t          n_tasks, cap_tasks;
    exo_state_node *nodes;
    size_t          n_nodes, cap_nodes;
    exo_topology_edge *edges;
    size_t          n_edges, cap_edges;
    exo_download_status *downloads; /* one per (node, model) */
    size_t          n_downloads, cap_downloads;
    exo_model_card *custom_cards;
    size_t          n_custom_cards, cap_custom_cards;
    exo_deleted_instance deleted[EXO_STATE_DELETED_MAX]; /* oldest first */
    size_t          n_deleted;
};

/* Grows *arr so one more element fits. */
static void *grow(void *arr, size_t n, size_t *cap, size_t elem)
{
    if (n < *cap)
        return arr;
    size_t ncap = *cap ? *cap * 2 : 8;
    *cap = ncap;
    return exo_realloc(arr, ncap * elem);
}

static void remove_at(void *arr, size_t *n, size_t i, size_t elem)
{
    char *base = arr;
    memmove(base + i * elem, base + (i + 1) * elem, (*n - i - 1) * elem);
    (*n)--;
}

exo_state *exo_state_new(void)
{
    exo_state *st = exo_calloc(1, sizeof *st);
    st->last_idx = -1;
    return st;
}

void exo_state_free(exo_state *st)
{
    if (!st)
        return;
    for (size_t i = 0; i < st->n_instances; i++)
        exo_instance_clear(&st->instances[i]);
    for (size_t i = 0; i < st->n_runners; i++)
        exo_runner_status_clear(&st->runners[i].status);
    for (size_t i = 0; i < st->n_tasks; i++)
        exo_task_clear(&st->tasks[i]);
    for (size_t i = 0; i < st->n_nodes; i++)
        exo_node_info_clear(&st->nodes[i].info);
    for (size_t i = 0; i < st->n_downloads; i++)
        exo_download_status_clear(&st->downloads[i]);
    for (size_t i = 0; i < st->n_deleted; i++)
        exo_free(st->deleted[i].reason);
    exo_free(st->downloads);
    exo_free(st->custom_cards);
    exo_free(st->instances);
    exo_free(st->runners);
    exo_free(st->tasks);
    exo_free(st->nodes);
    exo_free(st->edges);
    exo_free(st);
}

exo_state *exo_state_clone(const exo_state *src)
{
    exo_state *st = exo_state_new();
    st->last_idx = src->last_idx;
#define CLONE_ARRAY(field, n, cap)                                                   \
    st->cap = src->n ? src->n : 0;                                                   \
    st->n = src->n;                                                                  \
    st->field = src->n ? exo_calloc(src->n, sizeof *st->field) : NULL;
    CLONE_ARRAY(instances, n_instances, cap_instances)
    CLONE_ARRAY(runners, n_runners, cap_runners)
    CLONE_ARRAY(tasks, n_tasks, cap_tasks)
    CLONE_ARRAY(nodes, n_nodes, cap_nodes)
    CLONE_ARRAY(edges, n_edges, cap_edges)
    CLONE_ARRAY(downloads, n_downloads, cap_downloads)
    CLONE_ARRAY(custom_cards, n_custom_cards, cap_custom_cards)
#undef CLONE_ARRAY
    for (size_t i = 0; i < src->n_downloads; i++)
        exo_download_status_copy(&st->downloads[i], &src->downloads[i]);
    if (src->n_custom_cards)
        memcpy(st->custom_cards, src->custom_cards, src->n_custom_cards * sizeof *st->custom_cards);
    for (size_t i = 0; i < src->n_instances; i++)
        exo_instance_copy(&st->instances[i], &src->instances[i]);
    for (size_t i = 0; i < src->n_runners; i++) {
        st->runners[i].runner_id = src->runners[i].runner_id;
        exo_runner_status_copy(&st->runners[i].status, &src->runners[i].status);
    }
    for (size_t i = 0; i < src->n_tasks; i++)
        exo_task_copy(&st->tasks[i], &src->tasks[i]);
    for (size_t i = 0; i < src->n_nodes; i++) {
        st->nodes[i] = src->nodes[i];
        exo_node_info_copy(&st->nodes[i].info, &src->nodes[i].info);
    }
    if (src->n_edges)
        memcpy(st->edges, src->edges, src->n_edges * sizeof *st->edges);
    for (size_t i = 0; i < src->n_deleted; i++) {
        st->deleted[i] = src->deleted[i];
        st->deleted[i].reason = src->deleted[i].reason ? exo_strdup(src->deleted[i].reason) : NULL;
    }
    st->n_deleted = src->n_deleted;
    return st;
}

int64_t exo_state_last_event_applied_idx(const exo_state *st) { return st->last_idx; }

/* ---- index lookups ---- */

static ptrdiff_t find_instance(const exo_state *st, const exo_id *id)
{
    for (size_t i = 0; i < st->n_instances; i++)
        if (exo_id_eq(&st->instances[i].instance_id, id))
            return (ptrdiff_t)i;
    return -1;
}

static ptrdiff_t find_runner(const exo_state *st, const exo_id *id)
{
    for (size_t i = 0; i < st->n_runners; i++)
        if (exo_id_eq(&st->runners[i].runner_id, id))
            return (ptrdiff_t)i;
    return -1;
}

static ptrdiff_t find_task(const exo_state *st, const exo_id *id)
{
    for (size_t i = 0; i < st->n_tasks; i++)
        if (exo_id_eq(&st->tasks[i].task_id, id))
            return (ptrdiff_t)i;
    return -1;
}

static ptrdiff_t find_node(const exo_state *st, const exo_id *id)
{
    for (size_t i = 0; i < st->n_nodes; i++)
        if (exo_id_eq(&st->nodes[i].node_id, id))
            return (ptrdiff_t)i;
    return -1;
}

/* ---- reducers ---- */

static void remove_runner(exo_state *st, const exo_id *runner_id)
{
    ptrdiff_t r = find_runner(st, runner_id);
    if (r < 0)
        return;
    exo_runner_status_clear(&st->runners[r].status);
    remove_at(st->runners, &st->n_runners, (size_t)r, sizeof *st->runners);
}

static ptrdiff_t find_deleted(const exo_state *st, const exo_id *id)
{
    for (size_t i = 0; i < st->n_deleted; i++)
        if (exo_id_eq(&st->deleted[i].instance_id, id))
            return (ptrdiff_t)i;
    return -1;
}

static void forget_deleted(exo_state *st, const exo_id *id)
{
    ptrdiff_t i = find_deleted(st, id);
    if (i < 0)
        return;
    exo_free(st->deleted[i].reason);
    remove_at(st->deleted, &st->n_deleted, (size_t)i, sizeof *st->deleted);
}

/* Remembers a deletion as the newest; the oldest goes when the list is full. */
static void remember_deleted(exo_state *st, const exo_id *id, const char *model_id, const char *reason,
                             int64_t when_ms)
{
    forget_deleted(st, id);
    if (st->n_deleted == EXO_STATE_DELETED_MAX) {
        exo_free(st->deleted[0].reason);
        remove_at(st->deleted, &st->n_deleted, 0, sizeof *st->deleted);
    }
    exo_deleted_instance *d = &st->deleted[st->n_deleted++];
    memset(d, 0, sizeof *d);
    d->instance_id = *id;
    snprintf(d->model_id, sizeof d->model_id, "%s", model_id);
    d->reason = reason ? exo_strdup(reason) : NULL;
    d->when_ms = when_ms;
}

static void apply_instance_created(exo_state *st, const exo_instance *inst)
{
    forget_deleted(st, &inst->instance_id);
    ptrdiff_t i = find_instance(st, &inst->instance_id);
    if (i >= 0) {
        exo_instance_clear(&st->instances[i]);
        exo_instance_copy(&st->instances[i], inst);
        return;
    }
    st->instances = grow(st->instances, st->n_instances, &st->cap_instances, sizeof *st->instances);
    exo_instance_copy(&st->instances[st->n_instances++], inst);
}

static void apply_instance_deleted(exo_state *st, const exo_id *id, const char *model_id, const char *reason,
                                   int64_t when_ms)
{
    ptrdiff_t i = find_instance(st, id);
    if (i < 0) {
        if (model_id[0]) /* a remembered deletion carried into a new session */
            remember_deleted(st, id, model_id, reason, when_ms);
        return;
    }
    exo_instance *inst = &st->instances[i];
    remember_deleted(st, id, model_id[0] ? model_id : inst->model_id, reason, when_ms);
    for (size_t s = 0; s < inst->n_shards; s++)
        remove_runner(st, &inst->shards[s].runner_id);
    exo_instance_clear(inst);
    remove_at(st->instances, &st->n_instances, (size_t)i, sizeof *st->instances);
}

static void apply_runner_status(exo_state *st, const exo_id *runner_id, const exo_runner_status *status)
{
    if (status->kind == EXO_RUNNER_SHUTDOWN) {
        remove_runner(st, runner_id);
        return;
    }
    ptrdiff_t r = find_runner(st, runner_id);
    if (r < 0) {
        st->runners = grow(st->runners, st->n_runners, &st->cap_runners, sizeof *st->runners);
        r = (ptrdiff_t)st->n_runners++;
        st->runners[r].runner_id = *runner_id;
    } else {
        exo_runner_status_clear(&st->runners[r].status);
    }
    exo_runner_status_copy(&st->runners[r].status, status);
}

static void apply_task_created(exo_state *st, const exo_task *t)
{
    ptrdiff_t i = find_task(st, &t->task_id);
    if (i >= 0) {
        exo_task_clear(&st->tasks[i]);
        exo_task_copy(&st->tasks[i], t);
        return;
    }
    st->tasks = grow(st->tasks, st->n_tasks, &st->cap_tasks, sizeof *st->tasks);
    exo_task_copy(&st->tasks[st->n_tasks++], t);
}

static bool task_status_final(exo_task_status s)
{
    return s == EXO_TASK_COMPLETE || s == EXO_TASK_TIMED_OUT || s == EXO_TASK_FAILED || s == EXO_TASK_CANCELLED;
}

static void apply_task_status(exo_state *st, const exo_id *id, exo_task_status status)
{
    ptrdiff_t i = find_task(st, id);
    if (i < 0)
        return;
    exo_task *t = &st->tasks[i];
    /* A final status is final: in a cluster a worker's "Running" can reach
     * the master after the API's "Cancelled" for the same task. */
    if (task_status_final(t->status))
        return;
    t->status = status;
    if (status != EXO_TASK_FAILED) {
        exo_free(t->error_type);
        exo_free(t->error_message);
        t->error_type = t->error_message = NULL;
    }
}

static void apply_task_failed(exo_state *st, const exo_id *id, const char *type, const char *msg)
{
    ptrdiff_t i = find_task(st, id);
    if (i < 0)
        return;
    exo_task *t = &st->tasks[i];
    exo_free(t->error_type);
    exo_free(t->error_message);
    t->error_type = exo__strdup_null(type);
    t->error_message = exo__strdup_null(msg);
}

static void apply_task_deleted(exo_state *st, const exo_id *id)
{
    ptrdiff_t i = find_task(st, id);
    if (i < 0)
        return;
    exo_task_clear(&st->tasks[i]);
    remove_at(st->tasks, &st->n_tasks, (size_t)i, sizeof *st->tasks);
}

static void apply_node_info(exo_state *st, const exo_id *id, int64_t when_ms, const exo_node_info *info)
{
    ptrdiff_t i = find_node(st, id);
    if (i < 0) {
        st->nodes = grow(st->nodes, st->n_nodes, &st->cap_nodes, sizeof *st->nodes);
        i = (ptrdiff_t)st->n_nodes++;
        memset(&st->nodes[i], 0, sizeof st->nodes[i]);
        st->nodes[i].node_id = *id;
    } else {
        exo_node_info_clear(&st->nodes[i].info);
    }
    exo_node_info_copy(&st->nodes[i].info, info);
    st->nodes[i].last_seen_ms = when_ms;
}

static void remove_edges_where(exo_state *st, bool (*match)(const exo_topology_edge *, const void *),
                               const void *arg)
{
    for (size_t i = 0; i < st->n_edges;) {
        if (match(&st->edges[i], arg))
            remove_at(st->edges, &st->n_edges, i, sizeof *st->edges);
        else
            i++;
    }
}

static bool edge_touches(const exo_topology_edge *e, const void *node)
{
    return exo_id_eq(&e->source, node) || exo_id_eq(&e->sink, node);
}

static bool edge_same(const exo_topology_edge *e, const void *other) { return exo_topology_edge_same(e, other); }

/* A node that timed out leaves the topology with every edge that touches it. */
static void apply_node_timed_out(exo_state *st, const exo_id *id)
{
    ptrdiff_t i = find_node(st, id);
    if (i >= 0) {
        exo_node_info_clear(&st->nodes[i].info);
        remove_at(st->nodes, &st->n_nodes, (size_t)i, sizeof *st->nodes);
    }
    remove_edges_where(st, edge_touches, id);
    for (size_t d = 0; d < st->n_downloads;) {
        if (exo_id_eq(&st->downloads[d].node_id, id)) {
            exo_download_status_clear(&st->downloads[d]);
            remove_at(st->downloads, &st->n_downloads, d, sizeof *st->downloads);
        } else {
            d++;
        }
    }
}

static ptrdiff_t find_download(const exo_state *st, const exo_id *node, const char *model_id)
{
    for (size_t i = 0; i < st->n_downloads; i++)
        if (exo_id_eq(&st->downloads[i].node_id, node) && !strcmp(st->downloads[i].model_id, model_id))
            return (ptrdiff_t)i;
    return -1;
}

static void apply_download(exo_state *st, const exo_download_status *d)
{
    ptrdiff_t i = find_download(st, &d->node_id, d->model_id);
    if (i < 0) {
        st->downloads = grow(st->downloads, st->n_downloads, &st->cap_downloads, sizeof *st->downloads);
        i = (ptrdiff_t)st->n_downloads++;
    } else {
        exo_download_status_clear(&st->downloads[i]);
    }
    exo_download_status_copy(&st->downloads[i], d);
}

static void apply_download_deleted(exo_state *st, const exo_id *node, const char *model_id)
{
    ptrdiff_t i = find_download(st, node, model_id);
    if (i >= 0) {
        exo_download_status_clear(&st->downloads[i]);
        remove_at(st->downloads, &st->n_downloads, (size_t)i, sizeof *st->downloads);
    }
}

static ptrdiff_t find_custom_card(const exo_state *st, const char *model_id)
{
    for (size_t i = 0; i < st->n_custom_cards; i++)
        if (!strcmp(st->custom_cards[i].model_id, model_id))
            return (ptrdiff_t)i;
    return -1;
}

static void apply_custom_card(exo_state *st, const exo_model_card *c)
{
    ptrdiff_t i = find_custom_card(st, c->model_id);
    if (i < 0) {
        st->custom_cards = grow(st->custom_cards, st->n_custom_cards, &st->cap_custom_cards, sizeof *st->custom_cards);
        i = (ptrdiff_t)st->n_custom_cards++;
    }
    st->custom_cards[i] = *c;
}

static void apply_edge_created(exo_state *st, const exo_topology_edge *e)
{
    for (size_t i = 0; i < st->n_edges; i++)
        if (exo_topology_edge_same(&st->edges[i], e)) {
            st->edges[i] = *e;
            return;
        }
    st->edges = grow(st->edges, st->n_edges, &st->cap_edges, sizeof *st->edges);
    st->edges[st->n_edges++] = *e;
}

int exo_state_apply(exo_state *st, int64_t idx, const exo_event *ev, exo_err *err)
{
    if (idx != st->last_idx + 1)
        return exo_err_set(err, EXO_EINVAL, "event index %lld applied to a state at %lld (expected %lld)",
                           (long long)idx, (long long)st->last_idx, (long long)st->last_idx + 1);
    int rc = exo_event_validate(ev, err);
    if (rc < 0)
        return exo_err_wrap(err, "event %lld", (long long)idx);
    switch (ev->kind) {
    case EXO_EVENT_INSTANCE_CREATED: apply_instance_created(st, &ev->u.instance_created.instance); break;
    case EXO_EVENT_INSTANCE_DELETED:
        apply_instance_deleted(st, &ev->u.instance_deleted.instance_id, ev->u.instance_deleted.model_id,
                               ev->u.instance_deleted.reason, ev->u.instance_deleted.when_ms);
        break;
    case EXO_EVENT_RUNNER_STATUS_UPDATED:
        apply_runner_status(st, &ev->u.runner_status_updated.runner_id, &ev->u.runner_status_updated.status);
        break;
    case EXO_EVENT_RUNNER_DELETED: remove_runner(st, &ev->u.runner_deleted.runner_id); break;
    case EXO_EVENT_TASK_CREATED: apply_task_created(st, &ev->u.task_created.task); break;
    case EXO_EVENT_TASK_STATUS_UPDATED:
        apply_task_status(st, &ev->u.task_status_updated.task_id, ev->u.task_status_updated.status);
        break;
    case EXO_EVENT_TASK_FAILED:
        apply_task_failed(st, &ev->u.task_failed.task_id, ev->u.task_failed.error_type,
                          ev->u.task_failed.error_message);
        break;
    case EXO_EVENT_TASK_DELETED: apply_task_deleted(st, &ev->u.task_deleted.task_id); break;
    case EXO_EVENT_NODE_GATHERED_INFO:
        apply_node_info(st, &ev->u.node_gathered_info.node_id, ev->u.node_gathered_info.when_ms,
                        &ev->u.node_gathered_info.info);
        break;
    case EXO_EVENT_NODE_TIMED_OUT: apply_node_timed_out(st, &ev->u.node_timed_out.node_id); break;
    case EXO_EVENT_TOPOLOGY_EDGE_CREATED:
        if ((rc = exo_topology_edge_validate(&ev->u.topology_edge_created.edge, err)) < 0)
            return rc;
        apply_edge_created(st, &ev->u.topology_edge_created.edge);
        break;
    case EXO_EVENT_TOPOLOGY_EDGE_DELETED: {
        exo_topology_edge key = {0};
        key.source = ev->u.topology_edge_deleted.source;
        key.sink = ev->u.topology_edge_deleted.sink;
        memcpy(key.address, ev->u.topology_edge_deleted.address, sizeof key.address);
        remove_edges_where(st, edge_same, &key);
        break;
    }
    case EXO_EVENT_NODE_DOWNLOAD_PROGRESS: apply_download(st, &ev->u.node_download_progress.status); break;
    case EXO_EVENT_NODE_DOWNLOAD_DELETED:
        apply_download_deleted(st, &ev->u.node_download_deleted.node_id, ev->u.node_download_deleted.model_id);
        break;
    case EXO_EVENT_CUSTOM_MODEL_CARD_ADDED: apply_custom_card(st, &ev->u.custom_model_card_added.card); break;
    case EXO_EVENT_CUSTOM_MODEL_CARD_DELETED: {
        ptrdiff_t i = find_custom_card(st, ev->u.custom_model_card_deleted.model_id);
        if (i >= 0)
            remove_at(st->custom_cards, &st->n_custom_cards, (size_t)i, sizeof *st->custom_cards);
        break;
    }
    default: return exo_err_set(err, EXO_EINTERNAL, "unhandled event kind %d", (int)ev->kind);
    }
    st->last_idx = idx;
    return 0;
}

/* ---- lookups ---- */

size_t exo_state_download_count(const exo_state *st) { return st->n_downloads; }

const exo_download_status *exo_state_download_at(const exo_state *st, size_t i)
{
    return i < st->n_downloads ? &st->downloads[i] : NULL;
}

const exo_download_status *exo_state_download(const exo_state *st, const exo_id *node_id, const char *model_id)
{
    ptrdiff_t i = find_download(st, node_id, model_id);
    return i >= 0 ? &st->downloads[i] : NULL;
}

size_t exo_state_custom_card_count(const exo_state *st) { return st->n_custom_cards; }

const exo_model_card *exo_state_custom_card_at(const exo_state *st, size_t i)
{
    return i < st->n_custom_cards ? &st->custom_cards[i] : NULL;
}

const exo_model_card *exo_state_custom_card(const exo_state *st, const char *model_id)
{
    ptrdiff_t i = find_custom_card(st, model_id);
    return i >= 0 ? &st->custom_cards[i] : NULL;
}

size_t exo_state_deleted_count(const exo_state *st) { return st->n_deleted; }

const exo_deleted_instance *exo_state_deleted_at(const exo_state *st, size_t i)
{
    return i < st->n_deleted ? &st->deleted[i] : NULL;
}

const exo_deleted_instance *exo_state_deleted_instance(const exo_state *st, const exo_id *instance_id)
{
    ptrdiff_t i = find_deleted(st, instance_id);
    return i >= 0 ? &st->deleted[i] : NULL;
}

json_t *exo_deleted_instance_to_json(const exo_deleted_instance *d)
{
    return json_pack("{s:s, s:o, s:o, s:o}", "instanceId", d->instance_id.s, "modelId",
                     exo_json_str_or_null(d->model_id[0] ? d->model_id : NULL), "reason",
                     exo_json_str_or_null(d->reason), "deletedAt",
                     d->when_ms ? exo__time_ms_to_json(d->when_ms) : json_null());
}

size_t exo_state_instance_count(const exo_state *st) { return st->n_instances; }

const exo_instance *exo_state_instance_at(const exo_state *st, size_t i)
{
    return i < st->n_instances ? &st->instances[i] : NULL;
}

const exo_instance *exo_state_instance(const exo_state *st, const exo_id *instance_id)
{
    ptrdiff_t i = find_instance(st, instance_id);
    return i >= 0 ? &st->instances[i] : NULL;
}

size_t exo_state_instances_for_model(const exo_state *st, const char *model_id,
                                     const exo_instance **out, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < st->n_instances; i++) {
        if (strcmp(st->instances[i].model_id, model_id) != 0)
            continue;
        if (n < max)
            out[n] = &st->instances[i];
        n++;
    }
    return n;
}

const exo_instance *exo_state_instance_of_runner(const exo_state *st, const exo_id *runner_id)
{
    for (size_t i = 0; i < st->n_instances; i++)
        if (exo_instance_shard_of_runner(&st->instances[i], runner_id))
            return &st->instances[i];
    return NULL;
}

const exo_runner_status *exo_state_runner_status(const exo_state *st, const exo_id *runner_id)
{
    ptrdiff_t r = find_runner(st, runner_id);
    return r >= 0 ? &st->runners[r].status : NULL;
}

size_t exo_state_task_count(const exo_state *st) { return st->n_tasks; }

const exo_task *exo_state_task_at(const exo_state *st, size_t i)
{
    return i < st->n_tasks ? &st->tasks[i] : NULL;
}

const exo_task *exo_state_task(const exo_state *st, const exo_id *task_id)
{
    ptrdiff_t i = find_task(st, task_id);
    return i >= 0 ? &st->tasks[i] : NULL;
}

const exo_task *exo_state_task_for_command(const exo_state *st, const exo_id *command_id)
{
    for (size_t i = 0; i < st->n_tasks; i++)
        if (st->tasks[i].kind == EXO_TASK_KIND_TEXT_GENERATION && exo_id_eq(&st->tasks[i].command_id, command_id))
            return &st->tasks[i];
    return NULL;
}

size_t exo_state_tasks_of_instance(const exo_state *st, const exo_id *instance_id,
                                   const exo_task **out, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < st->n_tasks; i++) {
        if (!exo_id_eq(&st->tasks[i].instance_id, instance_id))
            continue;
        if (n < max)
            out[n] = &st->tasks[i];
        n++;
    }
    return n;
}

size_t exo_state_active_task_count(const exo_state *st, const exo_id *instance_id)
{
    size_t n = 0;
    for (size_t i = 0; i < st->n_tasks; i++)
        if (exo_id_eq(&st->tasks[i].instance_id, instance_id) &&
            (st->tasks[i].status == EXO_TASK_PENDING || st->tasks[i].status == EXO_TASK_RUNNING))
            n++;
    return n;
}

size_t exo_state_edge_count(const exo_state *st) { return st->n_edges; }

const exo_topology_edge *exo_state_edge_at(const exo_state *st, size_t i)
{
    return i < st->n_edges ? &st->edges[i] : NULL;
}

size_t exo_state_node_count(const exo_state *st) { return st->n_nodes; }

const exo_state_node *exo_state_node_at(const exo_state *st, size_t i)
{
    return i < st->n_nodes ? &st->nodes[i] : NULL;
}

const exo_state_node *exo_state_node_find(const exo_state *st, const exo_id *node_id)
{
    ptrdiff_t i = find_node(st, node_id);
    return i >= 0 ? &st->nodes[i] : NULL;
}

/* ---- snapshot ---- */

void exo_state_to_events(const exo_state *st, exo_event_list *out)
{
    for (size_t i = 0; i < st->n_nodes; i++) {
        exo_event *ev = exo_event_list_add(out, EXO_EVENT_NODE_GATHERED_INFO);
        ev->u.node_gathered_info.node_id = st->nodes[i].node_id;
        ev->u.node_gathered_info.when_ms = st->nodes[i].last_seen_ms;
        exo_node_info_clear(&ev->u.node_gathered_info.info);
        exo_node_info_copy(&ev->u.node_gathered_info.info, &st->nodes[i].info);
    }
    for (size_t i = 0; i < st->n_edges; i++)
        exo_event_list_add(out, EXO_EVENT_TOPOLOGY_EDGE_CREATED)->u.topology_edge_created.edge = st->edges[i];
    /* remembered deletions before the instances: a re-created id forgets its own */
    for (size_t i = 0; i < st->n_deleted; i++) {
        const exo_deleted_instance *d = &st->deleted[i];
        exo_event *ev = exo_event_list_add(out, EXO_EVENT_INSTANCE_DELETED);
        ev->u.instance_deleted.instance_id = d->instance_id;
        /* its model id (never empty here) makes the fold remember it */
        memcpy(ev->u.instance_deleted.model_id, d->model_id, EXO_MODEL_ID_MAX);
        ev->u.instance_deleted.reason = d->reason ? exo_strdup(d->reason) : NULL;
        ev->u.instance_deleted.when_ms = d->when_ms;
    }
    for (size_t i = 0; i < st->n_instances; i++)
        exo_instance_copy(&exo_event_list_add(out, EXO_EVENT_INSTANCE_CREATED)->u.instance_created.instance,
                          &st->instances[i]);
    for (size_t i = 0; i < st->n_runners; i++) {
        exo_event *ev = exo_event_list_add(out, EXO_EVENT_RUNNER_STATUS_UPDATED);
        ev->u.runner_status_updated.runner_id = st->runners[i].runner_id;
        exo_runner_status_clear(&ev->u.runner_status_updated.status);
        exo_runner_status_copy(&ev->u.runner_status_updated.status, &st->runners[i].status);
    }
    for (size_t i = 0; i < st->n_tasks; i++)
        exo_task_copy(&exo_event_list_add(out, EXO_EVENT_TASK_CREATED)->u.task_created.task, &st->tasks[i]);
    for (size_t i = 0; i < st->n_downloads; i++) {
        exo_event *ev = exo_event_list_add(out, EXO_EVENT_NODE_DOWNLOAD_PROGRESS);
        exo_download_status_copy(&ev->u.node_download_progress.status, &st->downloads[i]);
    }
    for (size_t i = 0; i < st->n_custom_cards; i++)
        exo_event_list_add(out, EXO_EVENT_CUSTOM_MODEL_CARD_ADDED)->u.custom_model_card_added.card =
            st->custom_cards[i];
}

int exo_state_from_events(const exo_event *evs, size_t n, int64_t last_idx, exo_state **out, exo_err *err)
{
    *out = NULL;
    if (last_idx < 0)
        return exo_err_set(err, EXO_EINVAL, "a State rebuilt from events stands at index %lld", (long long)last_idx);
    exo_state *st = exo_state_new();
    for (size_t i = 0; i < n; i++) {
        int rc = exo_state_apply(st, (int64_t)i, &evs[i], err);
        if (rc < 0) {
            exo_state_free(st);
            return rc;
        }
    }
    st->last_idx = last_idx; /* the rebuilding events stand for events 0..last_idx */
    *out = st;
    return 0;
}

/* ---- JSON ---- */

static json_t *in_bytes(uint64_t n) { return json_pack("{s:I}", "inBytes", (json_int_t)n); }

json_t *exo_state_to_json(const exo_state *st)
{
    json_t *root = json_object();
    json_t *instances = json_object(), *runners = json_object(), *tasks = json_object();
    json_t *last_seen = json_object(), *ident = json_object(), *mem = json_object(), *backends = json_object();
    json_t *disk = json_object(), *sys = json_object(), *net = json_object(), *gpus = json_object();
    json_t *models = json_object(), *topo_nodes = json_array(), *conns = json_array();
    for (size_t i = 0; i < st->n_instances; i++)
        json_object_set_new(instances, st->instances[i].instance_id.s, exo_instance_to_json(&st->instances[i]));
    for (size_t i = 0; i < st->n_runners; i++)
        json_object_set_new(runners, st->runners[i].runner_id.s, exo_runner_status_to_json(&st->runners[i].status));
    for (size_t i = 0; i < st->n_tasks; i++)
        json_object_set_new(tasks, st->tasks[i].task_id.s, exo_task_to_json(&st->tasks[i]));
    for (size_t i = 0; i < st->n_nodes; i++) {
        const exo_state_node *n = &st->nodes[i];
        const exo_node_info *in = &n->info;
        const char *id = n->node_id.s;
        json_array_append_new(topo_nodes, json_string(id));
        json_object_set_new(last_seen, id, exo__time_ms_to_json(n->last_seen_ms));
        json_t *name = json_string(in->friendly_name);
        json_object_set_new(ident, id, json_pack("{s:o, s:i}", "friendlyName", name ? name : json_null(),
                                                 "cpuCount", in->cpu_count));
        json_object_set_new(mem, id, json_pack("{s:o, s:o}", "ramTotal", in_bytes(in->memory_total),
                                               "ramAvailable", in_bytes(in->memory_available)));
        json_object_set_new(disk, id, json_pack("{s:o, s:o}", "total", in_bytes(in->disk_total),
                                                "available", in_bytes(in->disk_available)));
        json_t *info = exo_node_info_to_json(in);
        json_object_set_new(backends, id, json_incref(json_object_get(info, "backends")));
        json_object_set_new(net, id, json_pack("{s:O, s:i, s:i}", "interfaces", json_object_get(info, "interfaces"),
                                               "apiPort", in->api_port, "clusterPort", in->cluster_port));
        json_object_set_new(gpus, id, json_incref(json_object_get(info, "gpus")));
        json_object_set_new(sys, id, json_pack("{s:O, s:O, s:i}", "cpuModel", json_object_get(info, "cpuModel"),
                                               "os", json_object_get(info, "os"), "cpuCount", in->cpu_count));
        json_t *ids = json_array();
        for (size_t m = 0; m < in->models.n; m++)
            json_array_append_new(ids, json_string(in->models.v[m].model_id));
        json_object_set_new(models, id, ids);
        json_decref(info);
    }
    for (size_t i = 0; i < st->n_edges; i++) {
        const exo_topology_edge *e = &st->edges[i];
        json_array_append_new(conns, json_pack("{s:s, s:s, s:s, s:I, s:I}", "source", e->source.s, "sink",
                                               e->sink.s, "address", e->address, "latencyUs",
                                               (json_int_t)e->latency_us, "bandwidthBps",
                                               (json_int_t)e->bandwidth_bps));
    }
    json_object_set_new(root, "instances", instances);
    json_object_set_new(root, "runners", runners);
    json_object_set_new(root, "tasks", tasks);
    json_object_set_new(root, "lastSeen", last_seen);
    json_object_set_new(root, "nodeIdentities", ident);
    json_object_set_new(root, "nodeMemory", mem);
    json_object_set_new(root, "nodeDisk", disk);
    json_object_set_new(root, "nodeSystem", sys);
    json_object_set_new(root, "nodeNetwork", net);
    json_object_set_new(root, "nodeGpus", gpus);
    json_object_set_new(root, "nodeBackends", backends);
    json_object_set_new(root, "nodeModels", models);
    json_object_set_new(root, "topology", json_pack("{s:o, s:o}", "nodes", topo_nodes, "connections", conns));
    json_t *downloads = json_object(), *custom = json_object();
    for (size_t i = 0; i < st->n_downloads; i++) {
        const char *node = st->downloads[i].node_id.s;
        json_t *list = json_object_get(downloads, node);
        if (!list) {
            list = json_array();
            json_object_set_new(downloads, node, list);
        }
        json_array_append_new(list, exo_download_status_to_json(&st->downloads[i]));
    }
    for (size_t i = 0; i < st->n_custom_cards; i++) {
        json_t *card = json_object();
        exo_record_to_json(&exo_model_card_desc, &st->custom_cards[i], card);
        json_object_set_new(custom, st->custom_cards[i].model_id, card);
    }
    json_object_set_new(root, "downloads", downloads);
    json_object_set_new(root, "customModelCards", custom);
    json_t *deleted = json_object();
    for (size_t i = 0; i < st->n_deleted; i++)
        json_object_set_new(deleted, st->deleted[i].instance_id.s, exo_deleted_instance_to_json(&st->deleted[i]));
    json_object_set_new(root, "deletedInstances", deleted);
    json_object_set_new(root, "lastEventAppliedIdx", json_integer(st->last_idx));
    return root;
}
