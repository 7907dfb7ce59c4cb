/* The State fold: index discipline (gaps and replays rejected, State
 * unchanged), every reducer, lookups, clone, and the /state JSON. */
#include "core/json_util.h"
#include "cluster/state.h"
#include "core/alloc.h"
#include "test_cluster_fixtures.h"

#include <criterion/criterion.h>
#include <string.h>

/* Applies ev at the next index and clears it. */
static void apply_next(exo_state *st, exo_event *ev)
{
    exo_err err = {0};
    int64_t idx = exo_state_last_event_applied_idx(st) + 1;
    cr_assert_eq(exo_state_apply(st, idx, ev, &err), 0, "%s", err.msg);
    exo_event_clear(ev);
}

static char *dump(const exo_state *st)
{
    json_t *j = exo_state_to_json(st);
    char *s = exo_json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(j);
    return s;
}

static exo_id id_of(const char *s)
{
    exo_id id;
    cr_assert_eq(exo_id_set(&id, s, NULL), 0);
    return id;
}

Test(cluster_state, index_must_be_next)
{
    exo_err err = {0};
    exo_state *st = exo_state_new();
    cr_assert_eq(exo_state_last_event_applied_idx(st), -1);
    exo_event ev;
    fx_event(&ev, EXO_EVENT_NODE_GATHERED_INFO, 1);
    cr_assert_eq(exo_state_apply(st, 1, &ev, &err), EXO_EINVAL, "gap before the first event");
    cr_assert(strstr(err.msg, "expected 0"), "%s", err.msg);
    cr_assert_eq(exo_state_node_count(st), 0);
    cr_assert_eq(exo_state_apply(st, 0, &ev, &err), 0);
    cr_assert_eq(exo_state_apply(st, 0, &ev, &err), EXO_EINVAL, "replay");
    cr_assert_eq(exo_state_apply(st, 2, &ev, &err), EXO_EINVAL, "gap");
    cr_assert_eq(exo_state_apply(st, -1, &ev, &err), EXO_EINVAL);
    cr_assert_eq(exo_state_last_event_applied_idx(st), 0);
    cr_assert_eq(exo_state_node_count(st), 1);
    exo_event_clear(&ev);

    /* An invalid event is refused and does not consume the index. */
    fx_event(&ev, EXO_EVENT_TASK_DELETED, 1);
    ev.u.task_deleted.task_id.s[0] = 0;
    char *before = dump(st);
    cr_assert_eq(exo_state_apply(st, 1, &ev, &err), EXO_EINVAL);
    char *after = dump(st);
    cr_assert_str_eq(before, after);
    cr_assert_eq(exo_state_last_event_applied_idx(st), 0);
    free(before);
    free(after);
    exo_event_clear(&ev);
    exo_state_free(st);
}

Test(cluster_state, instance_lifecycle_removes_runners)
{
    exo_state *st = exo_state_new();
    exo_event ev;
    fx_event(&ev, EXO_EVENT_INSTANCE_CREATED, 1);  /* inst-1, 2 shards, org model */
    exo_id r0 = ev.u.instance_created.instance.shards[0].runner_id;
    exo_id r1 = ev.u.instance_created.instance.shards[1].runner_id;
    apply_next(st, &ev);
    fx_event(&ev, EXO_EVENT_INSTANCE_CREATED, 2);  /* inst-2, 3 shards */
    apply_next(st, &ev);
    cr_assert_eq(exo_state_instance_count(st), 2);

    const exo_instance *found[4];
    cr_assert_eq(exo_state_instances_for_model(st, "mlx-community/Llama-3.2-1B-Instruct-4bit", found, 4), 2);
    cr_assert_eq(exo_state_instances_for_model(st, "mlx-community/Llama-3.2-1B-Instruct-4bit", found, 1), 2,
                 "count exceeds max");
    cr_assert_eq(exo_state_instances_for_model(st, "other/model", found, 4), 0);
    exo_id i1 = id_of("inst-1");
    cr_assert_eq(exo_state_instance_of_runner(st, &r1), exo_state_instance(st, &i1));

    exo_event_init(&ev, EXO_EVENT_RUNNER_STATUS_UPDATED);
    ev.u.runner_status_updated.runner_id = r0;
    ev.u.runner_status_updated.status.kind = EXO_RUNNER_LOADING;
    ev.u.runner_status_updated.status.layers_loaded = 1;
    ev.u.runner_status_updated.status.total_layers = 12;
    apply_next(st, &ev);
    exo_event_init(&ev, EXO_EVENT_RUNNER_STATUS_UPDATED);
    ev.u.runner_status_updated.runner_id = r1;
    ev.u.runner_status_updated.status.kind = EXO_RUNNER_READY;
    apply_next(st, &ev);
    const exo_runner_status *rs = exo_state_runner_status(st, &r0);
    cr_assert_not_null(rs);
    cr_assert_eq(rs->kind, EXO_RUNNER_LOADING);
    cr_assert_eq(rs->layers_loaded, 1);

    /* status replaced in place */
    exo_event_init(&ev, EXO_EVENT_RUNNER_STATUS_UPDATED);
    ev.u.runner_status_updated.runner_id = r0;
    ev.u.runner_status_updated.status.kind = EXO_RUNNER_FAILED;
    ev.u.runner_status_updated.status.error_message = exo_strdup("boom");
    apply_next(st, &ev);
    rs = exo_state_runner_status(st, &r0);
    cr_assert_str_eq(rs->error_message, "boom");

    /* InstanceDeleted drops the instance and its runners, not others' */
    exo_id r2 = id_of("runner-x");
    exo_event_init(&ev, EXO_EVENT_RUNNER_STATUS_UPDATED);
    ev.u.runner_status_updated.runner_id = r2;
    apply_next(st, &ev);
    fx_event(&ev, EXO_EVENT_INSTANCE_DELETED, 1);
    apply_next(st, &ev);
    cr_assert_null(exo_state_instance(st, &i1));
    cr_assert_eq(exo_state_instance_count(st), 1);
    cr_assert_null(exo_state_runner_status(st, &r0));
    cr_assert_null(exo_state_runner_status(st, &r1));
    cr_assert_not_null(exo_state_runner_status(st, &r2));

    /* deleting an unknown instance is a no-op that still advances the index */
    fx_event(&ev, EXO_EVENT_INSTANCE_DELETED, 99);
    apply_next(st, &ev);
    cr_assert_eq(exo_state_last_event_applied_idx(st), 7);

    /* Shutdown status and RunnerDeleted both remove the runner */
    exo_event_init(&ev, EXO_EVENT_RUNNER_STATUS_UPDATED);
    ev.u.runner_status_updated.runner_id = r2;
    ev.u.runner_status_updated.status.kind = EXO_RUNNER_SHUTDOWN;
    apply_next(st, &ev);
    cr_assert_null(exo_state_runner_status(st, &r2));
    exo_event_init(&ev, EXO_EVENT_RUNNER_STATUS_UPDATED);
    ev.u.runner_status_updated.runner_id = r2;
    apply_next(st, &ev);
    exo_event_init(&ev, EXO_EVENT_RUNNER_DELETED);
    ev.u.runner_deleted.runner_id = r2;
    apply_next(st, &ev);
    cr_assert_null(exo_state_runner_status(st, &r2));
    exo_state_free(st);
}

Test(cluster_state, task_lifecycle)
{
    exo_state *st = exo_state_new();
    exo_event ev;
    fx_event(&ev, EXO_EVENT_TASK_CREATED, EXO_TASK_KIND_TEXT_GENERATION);  /* task-5 cmd-5, inst-0 */
    exo_id tid = ev.u.task_created.task.task_id, cmd = ev.u.task_created.task.command_id;
    apply_next(st, &ev);
    fx_event(&ev, EXO_EVENT_TASK_CREATED, EXO_TASK_KIND_LOAD_MODEL);
    apply_next(st, &ev);
    exo_id inst0 = id_of("inst-0");
    cr_assert_eq(exo_state_task_count(st), 2);
    cr_assert_eq(exo_state_active_task_count(st, &inst0), 2);
    const exo_task *tasks[4];
    cr_assert_eq(exo_state_tasks_of_instance(st, &inst0, tasks, 4), 2);
    cr_assert_eq(exo_state_task_for_command(st, &cmd), exo_state_task(st, &tid));

    fx_event(&ev, EXO_EVENT_TASK_FAILED, 5);
    apply_next(st, &ev);
    const exo_task *t = exo_state_task(st, &tid);
    cr_assert_str_eq(t->error_type, "RunnerError");
    cr_assert_eq(t->status, EXO_TASK_PENDING, "TaskFailed sets the error only");

    exo_event_init(&ev, EXO_EVENT_TASK_STATUS_UPDATED);
    ev.u.task_status_updated.task_id = tid;
    ev.u.task_status_updated.status = EXO_TASK_FAILED;
    apply_next(st, &ev);
    t = exo_state_task(st, &tid);
    cr_assert_eq(t->status, EXO_TASK_FAILED);
    cr_assert_not_null(t->error_message, "Failed keeps the error");
    cr_assert_eq(exo_state_active_task_count(st, &inst0), 1);

    /* a final status is final: a late Running (a worker's, in a cluster)
     * changes nothing */
    exo_event_init(&ev, EXO_EVENT_TASK_STATUS_UPDATED);
    ev.u.task_status_updated.task_id = tid;
    ev.u.task_status_updated.status = EXO_TASK_RUNNING;
    apply_next(st, &ev);
    t = exo_state_task(st, &tid);
    cr_assert_eq(t->status, EXO_TASK_FAILED);
    cr_assert_not_null(t->error_message);

    /* a non-Failed status clears an error that was set before it */
    exo_id other = id_of("task-1001");
    exo_event_init(&ev, EXO_EVENT_TASK_CREATED);
    fx_task(&ev.u.task_created.task, 1001, 0, EXO_TASK_KIND_TEXT_GENERATION);
    apply_next(st, &ev);
    exo_event_init(&ev, EXO_EVENT_TASK_FAILED);
    ev.u.task_failed.task_id = other;
    ev.u.task_failed.error_type = exo_strdup("RunnerError");
    ev.u.task_failed.error_message = exo_strdup("x");
    apply_next(st, &ev);
    exo_event_init(&ev, EXO_EVENT_TASK_STATUS_UPDATED);
    ev.u.task_status_updated.task_id = other;
    ev.u.task_status_updated.status = EXO_TASK_RUNNING;
    apply_next(st, &ev);
    t = exo_state_task(st, &other);
    cr_assert_eq(t->status, EXO_TASK_RUNNING);
    cr_assert_null(t->error_type, "non-Failed status clears the error");
    cr_assert_null(t->error_message);
    exo_event_init(&ev, EXO_EVENT_TASK_DELETED);
    ev.u.task_deleted.task_id = other;
    apply_next(st, &ev);

    /* unknown task: no-op */
    fx_event(&ev, EXO_EVENT_TASK_STATUS_UPDATED, 77);
    apply_next(st, &ev);
    fx_event(&ev, EXO_EVENT_TASK_FAILED, 77);
    apply_next(st, &ev);
    cr_assert_eq(exo_state_task_count(st), 2);

    fx_event(&ev, EXO_EVENT_TASK_DELETED, 5);
    apply_next(st, &ev);
    cr_assert_null(exo_state_task(st, &tid));
    cr_assert_null(exo_state_task_for_command(st, &cmd));
    cr_assert_eq(exo_state_task_count(st), 1);
    exo_state_free(st);
}

Test(cluster_state, nodes_and_json)
{
    exo_state *st = exo_state_new();
    exo_event ev;
    fx_event(&ev, EXO_EVENT_NODE_GATHERED_INFO, 0);
    apply_next(st, &ev);
    fx_event(&ev, EXO_EVENT_NODE_GATHERED_INFO, 1);
    apply_next(st, &ev);
    fx_event(&ev, EXO_EVENT_NODE_GATHERED_INFO, 0);  /* update replaces */
    ev.u.node_gathered_info.when_ms += 5000;
    ev.u.node_gathered_info.info.memory_available = 42;
    apply_next(st, &ev);
    exo_id n0 = id_of("node-0"), n1 = id_of("node-1");
    cr_assert_eq(exo_state_node_count(st), 2);
    const exo_state_node *node = exo_state_node_find(st, &n0);
    cr_assert_eq(node->info.memory_available, 42);
    cr_assert_eq(node->last_seen_ms, 1767225605123LL);

    fx_event(&ev, EXO_EVENT_INSTANCE_CREATED, 1);
    apply_next(st, &ev);
    fx_event(&ev, EXO_EVENT_RUNNER_STATUS_UPDATED, EXO_RUNNER_RUNNING);
    apply_next(st, &ev);
    fx_event(&ev, EXO_EVENT_TASK_CREATED, EXO_TASK_KIND_TEXT_GENERATION);
    apply_next(st, &ev);

    json_t *j = exo_state_to_json(st);
    cr_assert_eq(json_integer_value(json_object_get(j, "lastEventAppliedIdx")), 5);
    cr_assert_eq(json_object_size(json_object_get(j, "instances")), 1);
    cr_assert_not_null(json_object_get(json_object_get(json_object_get(j, "instances"), "inst-1"), "MlxRingInstance"));
    json_t *runner = json_object_get(json_object_get(j, "runners"), "runner-7");
    cr_assert_not_null(json_object_get(runner, "RunnerRunning"));
    json_t *task = json_object_get(json_object_get(j, "tasks"), "task-5");
    cr_assert_not_null(json_object_get(task, "TextGeneration"));
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "lastSeen"), "node-0")),
                     "2026-01-01T00:00:05.123Z");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(json_object_get(j, "nodeIdentities"),
                                                                       "node-1"), "friendlyName")),
                     "box-1 \xc3\xa9");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(json_object_get(json_object_get(j,
                     "nodeMemory"), "node-0"), "ramAvailable"), "inBytes")), 42);
    cr_assert_eq(json_array_size(json_object_get(json_object_get(j, "nodeBackends"), "node-1")), 2);
    json_decref(j);

    fx_event(&ev, EXO_EVENT_NODE_TIMED_OUT, 0);
    apply_next(st, &ev);
    cr_assert_null(exo_state_node_find(st, &n0));
    cr_assert_not_null(exo_state_node_find(st, &n1));
    j = exo_state_to_json(st);
    cr_assert_null(json_object_get(json_object_get(j, "lastSeen"), "node-0"));
    cr_assert_null(json_object_get(json_object_get(j, "nodeMemory"), "node-0"));
    json_decref(j);
    exo_state_free(st);
}

/* Two replicas folding the same sequence (one through encode/decode, one
 * starting from a clone midway) end up identical. */
Test(cluster_state, replicas_converge)
{
    exo_err err = {0};
    exo_state *a = exo_state_new(), *b = exo_state_new(), *c = NULL;
    int step = 0;
    for (int round = 0; round < 6; round++) {
        for (int k = 0; k < EXO_EVENT__COUNT; k++, step++) {
            exo_event ev, wire;
            fx_event(&ev, (exo_event_kind)k, round * 3 + k);
            uint8_t *buf;
            size_t len;
            cr_assert_eq(exo_event_encode(&ev, &buf, &len, &err), 0);
            cr_assert_eq(exo_event_decode(buf, len, &wire, &err), 0);
            cr_assert_eq(exo_state_apply(a, step, &ev, &err), 0, "%s", err.msg);
            cr_assert_eq(exo_state_apply(b, step, &wire, &err), 0, "%s", err.msg);
            if (c)
                cr_assert_eq(exo_state_apply(c, step, &ev, &err), 0);
            if (round == 2 && k == 4)
                c = exo_state_clone(a);
            exo_free(buf);
            exo_event_clear(&ev);
            exo_event_clear(&wire);
        }
    }
    char *sa = dump(a), *sb = dump(b), *sc = dump(c);
    cr_assert_str_eq(sa, sb);
    cr_assert_str_eq(sa, sc);
    free(sa);
    free(sb);
    free(sc);
    exo_state_free(a);
    exo_state_free(b);
    exo_state_free(c);
}
