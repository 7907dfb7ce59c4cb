/* Instance deletions that say why: the reason, model and time of
 * InstanceDeleted and the reason of DeleteInstance through the codec (and
 * the older encodings without them still decoding), the State's bounded
 * list of recent deletions (fold, clone, JSON, rebuilt from
 * exo_state_to_events) and the master's default reason. */
#include "cluster/events.h"
#include "cluster/master.h"
#include "cluster/state.h"
#include "core/alloc.h"
#include "core/json_util.h"
#include "test_cluster_fixtures.h"

#include <criterion/criterion.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static exo_id id_of(const char *s)
{
    exo_id id;
    cr_assert_eq(exo_id_set(&id, s, NULL), 0);
    return id;
}

static char *dump(const exo_state *st)
{
    json_t *j = exo_state_to_json(st);
    json_object_del(j, "lastEventAppliedIdx");
    char *s = exo_json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(j);
    return s;
}

static void apply_next(exo_state *st, exo_event *ev)
{
    exo_err err = {0};
    cr_assert_eq(exo_state_apply(st, exo_state_last_event_applied_idx(st) + 1, ev, &err), 0, "%s", err.msg);
    exo_event_clear(ev);
}

static void deleted_event(exo_event *ev, const char *id, const char *model, const char *reason, int64_t when)
{
    exo_event_init(ev, EXO_EVENT_INSTANCE_DELETED);
    ev->u.instance_deleted.instance_id = id_of(id);
    if (model)
        snprintf(ev->u.instance_deleted.model_id, EXO_MODEL_ID_MAX, "%s", model);
    ev->u.instance_deleted.reason = reason ? exo_strdup(reason) : NULL;
    ev->u.instance_deleted.when_ms = when;
}

/* The bytes a node wrote before the new fields: {v, kind, id, body} with
 * the body's map given as (key, string value) pairs. */
static void old_encoding(const char *kind, const char *const *kv, size_t n, uint8_t **out, size_t *len)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 4);
    const char *head[] = {"kind", kind, "id", "8a4c7d0e-1111-4222-8333-944455556666"};
    msgpack_pack_str_with_body(&pk, "v", 1);
    msgpack_pack_int(&pk, 1);
    for (int i = 0; i < 4; i++)
        msgpack_pack_str_with_body(&pk, head[i], strlen(head[i]));
    msgpack_pack_str_with_body(&pk, "body", 4);
    msgpack_pack_map(&pk, n);
    for (size_t i = 0; i < 2 * n; i++)
        msgpack_pack_str_with_body(&pk, kv[i], strlen(kv[i]));
    *out = exo_malloc(sb.size);
    memcpy(*out, sb.data, sb.size);
    *len = sb.size;
    msgpack_sbuffer_destroy(&sb);
}

Test(cluster_deletion, new_fields_round_trip_and_render)
{
    exo_err err = {0};
    exo_event ev, back;
    deleted_event(&ev, "inst-1", "org/model", "runner for org/model failed 5 times in a row: signal 9 \xe2\x9c\x97",
                  1767225600123);
    uint8_t *buf;
    size_t len;
    cr_assert_eq(exo_event_encode(&ev, &buf, &len, &err), 0, "%s", err.msg);
    cr_assert_eq(exo_event_decode(buf, len, &back, &err), 0, "%s", err.msg);
    cr_assert(exo_event_equal(&ev, &back));
    cr_assert_str_eq(back.u.instance_deleted.reason, ev.u.instance_deleted.reason);
    cr_assert_str_eq(back.u.instance_deleted.model_id, "org/model");
    cr_assert_eq(back.u.instance_deleted.when_ms, 1767225600123);
    json_t *j = exo_event_to_json(&back);
    json_t *body = json_object_get(j, "InstanceDeleted");
    cr_assert_str_eq(json_string_value(json_object_get(body, "reason")), ev.u.instance_deleted.reason);
    cr_assert_str_eq(json_string_value(json_object_get(body, "modelId")), "org/model");
    cr_assert_str_eq(json_string_value(json_object_get(body, "when")), "2026-01-01T00:00:00.123Z");
    json_decref(j);
    exo_free(buf);
    exo_event_clear(&back);
    exo_event_clear(&ev);

    /* without them: encoded without the keys, rendered as null */
    deleted_event(&ev, "inst-2", NULL, NULL, 0);
    cr_assert_eq(exo_event_encode(&ev, &buf, &len, &err), 0, "%s", err.msg);
    cr_assert_null(memmem(buf, len, "reason", 6), "an absent reason is not written");
    cr_assert_eq(exo_event_decode(buf, len, &back, &err), 0, "%s", err.msg);
    cr_assert(exo_event_equal(&ev, &back));
    j = exo_event_to_json(&back);
    cr_assert(json_is_null(json_object_get(json_object_get(j, "InstanceDeleted"), "reason")));
    json_decref(j);
    exo_free(buf);
    exo_event_clear(&back);
    exo_event_clear(&ev);

    /* the command's reason */
    exo_command cmd, cback;
    exo_command_init(&cmd, EXO_COMMAND_DELETE_INSTANCE);
    cmd.u.delete_instance.instance_id = id_of("inst-1");
    cmd.u.delete_instance.reason = exo_strdup("deleted by user");
    cr_assert_eq(exo_command_encode(&cmd, &buf, &len, &err), 0, "%s", err.msg);
    cr_assert_eq(exo_command_decode(buf, len, &cback, &err), 0, "%s", err.msg);
    cr_assert(exo_command_equal(&cmd, &cback));
    cr_assert_str_eq(cback.u.delete_instance.reason, "deleted by user");
    exo_free(buf);
    exo_command_clear(&cback);
    exo_command_clear(&cmd);
}

Test(cluster_deletion, old_encodings_still_decode)
{
    exo_err err = {0};
    uint8_t *buf;
    size_t len;
    const char *ev_body[] = {"instance_id", "inst-old"};
    old_encoding("InstanceDeleted", ev_body, 1, &buf, &len);
    exo_event ev;
    cr_assert_eq(exo_event_decode(buf, len, &ev, &err), 0, "%s", err.msg);
    cr_assert_str_eq(ev.u.instance_deleted.instance_id.s, "inst-old");
    cr_assert_null(ev.u.instance_deleted.reason);
    cr_assert_str_eq(ev.u.instance_deleted.model_id, "");
    cr_assert_eq(ev.u.instance_deleted.when_ms, 0);
    exo_free(buf);
    exo_event_clear(&ev);

    old_encoding("DeleteInstance", ev_body, 1, &buf, &len);
    exo_command cmd;
    cr_assert_eq(exo_command_decode(buf, len, &cmd, &err), 0, "%s", err.msg);
    cr_assert_null(cmd.u.delete_instance.reason);
    exo_free(buf);
    exo_command_clear(&cmd);

    /* the new fields are checked like any other */
    const char *bad_model[] = {"instance_id", "inst-old", "model_id", "not a model id"};
    old_encoding("InstanceDeleted", bad_model, 2, &buf, &len);
    cr_assert_eq(exo_event_decode(buf, len, &ev, &err), EXO_EFORMAT);
    exo_free(buf);
    char *long_reason = exo_malloc(EXO_DELETE_REASON_MAX + 2);
    memset(long_reason, 'x', EXO_DELETE_REASON_MAX + 1);
    long_reason[EXO_DELETE_REASON_MAX + 1] = 0;
    const char *too_long[] = {"instance_id", "inst-old", "reason", long_reason};
    old_encoding("InstanceDeleted", too_long, 2, &buf, &len);
    cr_assert_eq(exo_event_decode(buf, len, &ev, &err), EXO_EFORMAT);
    cr_assert(strstr(err.msg, "reason"), "%s", err.msg);
    exo_free(buf);
    exo_event e2;
    deleted_event(&e2, "inst-3", "org/m", long_reason, 0);
    cr_assert_eq(exo_event_encode(&e2, &buf, &len, &err), EXO_EINVAL, "a reason over the bound is refused");
    exo_event_clear(&e2);
    exo_free(long_reason);
}

Test(cluster_deletion, state_remembers_recent_deletions)
{
    exo_state *st = exo_state_new();
    exo_event ev;
    /* an instance, deleted by an old-style event: remembered with its model, no reason */
    fx_event(&ev, EXO_EVENT_INSTANCE_CREATED, 1);
    exo_id first = ev.u.instance_created.instance.instance_id;
    char model[EXO_MODEL_ID_MAX];
    snprintf(model, sizeof model, "%s", ev.u.instance_created.instance.model_id);
    apply_next(st, &ev);
    exo_event_init(&ev, EXO_EVENT_INSTANCE_DELETED);
    ev.u.instance_deleted.instance_id = first;
    apply_next(st, &ev);
    const exo_deleted_instance *d = exo_state_deleted_instance(st, &first);
    cr_assert_not_null(d);
    cr_assert_str_eq(d->model_id, model);
    cr_assert_null(d->reason);
    cr_assert_eq(d->when_ms, 0);

    /* an unknown id without a model: a no-op, as before */
    deleted_event(&ev, "never-was", NULL, "x", 5);
    apply_next(st, &ev);
    cr_assert_null(exo_state_deleted_instance(st, &(exo_id){"never-was"}));

    /* more than the bound: the oldest go */
    for (int i = 0; i < EXO_STATE_DELETED_MAX + 3; i++) {
        fx_event(&ev, EXO_EVENT_INSTANCE_CREATED, 100 + i);
        exo_id id = ev.u.instance_created.instance.instance_id;
        apply_next(st, &ev);
        char why[64];
        snprintf(why, sizeof why, "reason %d", i);
        exo_event_init(&ev, EXO_EVENT_INSTANCE_DELETED);
        ev.u.instance_deleted.instance_id = id;
        ev.u.instance_deleted.reason = exo_strdup(why);
        ev.u.instance_deleted.when_ms = 1767225600000 + i;
        apply_next(st, &ev);
    }
    cr_assert_eq(exo_state_deleted_count(st), EXO_STATE_DELETED_MAX);
    cr_assert_null(exo_state_deleted_instance(st, &first), "the oldest was dropped");
    cr_assert_str_eq(exo_state_deleted_at(st, 0)->reason, "reason 3");
    cr_assert_str_eq(exo_state_deleted_at(st, EXO_STATE_DELETED_MAX - 1)->reason, "reason 18");

    /* JSON: id -> {instanceId, modelId, reason, deletedAt}, oldest first */
    json_t *j = exo_state_to_json(st);
    json_t *del = json_object_get(j, "deletedInstances");
    cr_assert_eq(json_object_size(del), EXO_STATE_DELETED_MAX);
    const char *k0 = json_object_iter_key(json_object_iter(del));
    json_t *e0 = json_object_get(del, k0);
    cr_assert_str_eq(json_string_value(json_object_get(e0, "reason")), "reason 3");
    cr_assert_str_eq(json_string_value(json_object_get(e0, "deletedAt")), "2026-01-01T00:00:00.003Z");
    cr_assert_str_eq(json_string_value(json_object_get(e0, "instanceId")), k0);
    json_decref(j);

    /* re-created with the same id: the deletion is forgotten */
    exo_id last = exo_state_deleted_at(st, EXO_STATE_DELETED_MAX - 1)->instance_id;
    fx_event(&ev, EXO_EVENT_INSTANCE_CREATED, 100 + EXO_STATE_DELETED_MAX + 2);
    cr_assert(exo_id_eq(&ev.u.instance_created.instance.instance_id, &last));
    apply_next(st, &ev);
    cr_assert_null(exo_state_deleted_instance(st, &last));
    cr_assert_eq(exo_state_deleted_count(st), EXO_STATE_DELETED_MAX - 1);

    /* a clone and the State rebuilt from its events (a new session) hold the same */
    exo_state *c = exo_state_clone(st);
    exo_event_list evs = {0};
    exo_state_to_events(st, &evs);
    exo_state *re = exo_state_new();
    for (size_t i = 0; i < evs.n; i++) {
        exo_err err = {0};
        cr_assert_eq(exo_state_apply(re, (int64_t)i, &evs.v[i], &err), 0, "%s", err.msg);
    }
    exo_event_list_clear(&evs);
    char *a = dump(st), *b = dump(c), *r = dump(re);
    cr_assert_str_eq(a, b);
    cr_assert_str_eq(a, r);
    exo_free(a);
    exo_free(b);
    exo_free(r);
    exo_state_free(re);
    exo_state_free(c);
    exo_state_free(st);
}

Test(cluster_deletion, master_default_reason)
{
    exo_state *st = exo_state_new();
    exo_event ev;
    fx_event(&ev, EXO_EVENT_INSTANCE_CREATED, 2);
    exo_id id = ev.u.instance_created.instance.instance_id;
    apply_next(st, &ev);
    exo_command cmd;
    exo_command_init(&cmd, EXO_COMMAND_DELETE_INSTANCE);
    cmd.u.delete_instance.instance_id = id;
    exo_event_list out = {0};
    exo_err err = {0};
    cr_assert_eq(exo_master_handle(st, &cmd, &out, &err), 0, "%s", err.msg);
    cr_assert_eq(out.n, 1);
    cr_assert_str_eq(out.v[0].u.instance_deleted.reason, "deleted", "a command without a reason");
    cr_assert_str_eq(out.v[0].u.instance_deleted.model_id, "mlx-community/Llama-3.2-1B-Instruct-4bit");
    exo_event_list_clear(&out);
    exo_command_clear(&cmd);
    exo_state_free(st);
}
