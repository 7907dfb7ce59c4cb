/* Event and command codecs: encode -> decode -> equal for every kind and
 * sub-case, the JSON shapes the API serves, and the decoder's refusals of
 * hostile input (truncations, flips, huge counts, deep nesting, wrong
 * types, unknown versions), none of which may crash or leak. */
#include "cluster/events.h"
#include "core/alloc.h"
#include "test_cluster_fixtures.h"

#include <criterion/criterion.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

static void roundtrip_event(const exo_event *ev)
{
    exo_err err = {0};
    uint8_t *buf;
    size_t len;
    cr_assert_eq(exo_event_encode(ev, &buf, &len, &err), 0, "%s: %s", exo_event_kind_name(ev->kind), err.msg);
    exo_event back;
    cr_assert_eq(exo_event_decode(buf, len, &back, &err), 0, "%s: %s", exo_event_kind_name(ev->kind), err.msg);
    cr_assert(exo_event_equal(ev, &back), "%s differs after round trip", exo_event_kind_name(ev->kind));
    /* Deterministic encoding: the decoded copy encodes to the same bytes. */
    uint8_t *buf2;
    size_t len2;
    cr_assert_eq(exo_event_encode(&back, &buf2, &len2, &err), 0);
    cr_assert_eq(len, len2);
    cr_assert_eq(memcmp(buf, buf2, len), 0);
    exo_event copy;
    exo_event_copy(&copy, &back);
    cr_assert(exo_event_equal(&copy, ev));
    exo_event_clear(&copy);
    exo_event_clear(&back);
    exo_free(buf);
    exo_free(buf2);
}

Test(cluster_events, roundtrip_every_event_kind)
{
    for (int k = 0; k < EXO_EVENT__COUNT; k++) {
        for (int variant = 0; variant < 2 * EXO_RUNNER__COUNT; variant++) {
            exo_event ev;
            fx_event(&ev, (exo_event_kind)k, variant);
            roundtrip_event(&ev);
            exo_event_clear(&ev);
        }
    }
}

Test(cluster_events, roundtrip_every_command_kind)
{
    exo_err err = {0};
    for (int k = 0; k < EXO_COMMAND__COUNT; k++) {
        exo_command cmd, back, copy;
        fx_command(&cmd, (exo_command_kind)k, k);
        uint8_t *buf;
        size_t len;
        cr_assert_eq(exo_command_encode(&cmd, &buf, &len, &err), 0, "%s", err.msg);
        cr_assert_eq(exo_command_decode(buf, len, &back, &err), 0, "%s", err.msg);
        cr_assert(exo_command_equal(&cmd, &back), "%s", exo_command_kind_name(cmd.kind));
        exo_command_copy(&copy, &back);
        cr_assert(exo_command_equal(&copy, &cmd));
        /* An event decoder must not accept a command and vice versa. */
        exo_event ev;
        cr_assert_eq(exo_event_decode(buf, len, &ev, &err), EXO_EFORMAT);
        exo_command_clear(&copy);
        exo_command_clear(&back);
        exo_command_clear(&cmd);
        exo_free(buf);
    }
}

Test(cluster_events, encode_rejects_invalid_events)
{
    exo_err err = {0};
    uint8_t *buf = (uint8_t *)1;
    size_t len = 1;
    exo_event ev;
    fx_event(&ev, EXO_EVENT_TASK_DELETED, 1);
    ev.u.task_deleted.task_id.s[0] = 0;
    cr_assert_eq(exo_event_encode(&ev, &buf, &len, &err), EXO_EINVAL);
    cr_assert_null(buf);
    exo_event_clear(&ev);
    fx_event(&ev, EXO_EVENT_INSTANCE_CREATED, 2);
    ev.u.instance_created.instance.shards[0].end_layer = 99;
    cr_assert_eq(exo_event_encode(&ev, &buf, &len, &err), EXO_EINVAL);
    exo_event_clear(&ev);
    fx_event(&ev, EXO_EVENT_TASK_FAILED, 1);
    exo_free(ev.u.task_failed.error_message);
    ev.u.task_failed.error_message = exo_strdup("bad \xff utf8");
    cr_assert_eq(exo_event_encode(&ev, &buf, &len, &err), EXO_EINVAL);
    exo_event_clear(&ev);
}

/* ---- JSON shapes ---- */

static json_t *body_of(json_t *j, const char *tag)
{
    cr_assert_eq(json_object_size(j), 1, "tagged union has one key");
    json_t *b = json_object_get(j, tag);
    cr_assert_not_null(b, "missing tag %s", tag);
    return b;
}

Test(cluster_events, json_tagging_and_camel_case)
{
    for (int k = 0; k < EXO_EVENT__COUNT; k++) {
        exo_event ev;
        fx_event(&ev, (exo_event_kind)k, 3);
        json_t *j = exo_event_to_json(&ev);
        json_t *b = body_of(j, exo_event_kind_name(ev.kind));
        cr_assert_str_eq(json_string_value(json_object_get(b, "eventId")), ev.event_id.s);
        const char *key;
        json_t *v;
        json_object_foreach(b, key, v) {
            cr_assert_null(strchr(key, '_'), "snake_case key %s in %s", key, exo_event_kind_name(ev.kind));
        }
        json_decref(j);
        exo_event_clear(&ev);
    }
}

Test(cluster_events, json_instance_created)
{
    exo_event ev;
    fx_event(&ev, EXO_EVENT_INSTANCE_CREATED, 2);  /* 3 shards, pipeline */
    json_t *j = exo_event_to_json(&ev);
    json_t *inst = body_of(json_object_get(body_of(j, "InstanceCreated"), "instance"), "MlxRingInstance");
    cr_assert_str_eq(json_string_value(json_object_get(inst, "instanceId")), "inst-2");
    json_t *sa = json_object_get(inst, "shardAssignments");
    cr_assert_str_eq(json_string_value(json_object_get(sa, "modelId")), "mlx-community/Llama-3.2-1B-Instruct-4bit");
    json_t *r2s = json_object_get(sa, "runnerToShard");
    cr_assert_eq(json_object_size(r2s), 3);
    json_t *shard = body_of(json_object_get(r2s, "runner-2-1"), "PipelineShardMetadata");
    cr_assert_eq(json_integer_value(json_object_get(shard, "deviceRank")), 1);
    cr_assert_eq(json_integer_value(json_object_get(shard, "worldSize")), 3);
    cr_assert_eq(json_integer_value(json_object_get(shard, "startLayer")), 8);
    cr_assert_eq(json_integer_value(json_object_get(shard, "endLayer")), 16);
    cr_assert_eq(json_integer_value(json_object_get(shard, "nLayers")), 24);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(sa, "nodeToRunner"), "node-1")),
                     "runner-2-1");
    cr_assert_str_eq(json_string_value(json_object_get(shard, "nodeId")), "node-1");
    cr_assert_null(json_object_get(shard, "device"), "the node's default device is not written");
    json_decref(j);
    exo_event_clear(&ev);
}

/* A node with a rank per GPU: nodeToRunner (exo's, a function) names the
 * node's first rank; each shard says its node and device, and the JSON
 * reads back to the same instance. exo's form (no nodeId in the shards)
 * still reads; a nodeToRunner that disagrees with the shards does not. */
Test(cluster_events, json_instance_with_ranks_sharing_a_node)
{
    exo_event ev;
    fx_event(&ev, EXO_EVENT_INSTANCE_CREATED, 3); /* 4 tensor ranks on node-0, cuda:0..3 */
    const exo_instance *want = &ev.u.instance_created.instance;
    json_t *j = exo_instance_to_json(want);
    json_t *sa = json_object_get(body_of(j, "MlxRingInstance"), "shardAssignments");
    json_t *n2r = json_object_get(sa, "nodeToRunner");
    cr_assert_eq(json_object_size(n2r), 1);
    cr_assert_str_eq(json_string_value(json_object_get(n2r, "node-0")), "runner-3-0");
    json_t *shard = body_of(json_object_get(json_object_get(sa, "runnerToShard"), "runner-3-2"), "TensorShardMetadata");
    cr_assert_str_eq(json_string_value(json_object_get(shard, "device")), "cuda:2");
    exo_instance back;
    exo_err err = {0};
    cr_assert_eq(exo_instance_from_json(j, &back, &err), 0, "%s", err.msg);
    cr_assert(exo_instance_equal(&back, want));
    exo_instance_clear(&back);

    json_object_set_new(shard, "device", json_string("cuda:0")); /* GPU 0 twice */
    cr_assert_eq(exo_instance_from_json(j, &back, &err), EXO_EINVAL);
    cr_assert(strstr(err.msg, "share node"), "%s", err.msg);
    json_object_set_new(shard, "device", json_string("cuda:x"));
    cr_assert_eq(exo_instance_from_json(j, &back, &err), EXO_EINVAL);
    cr_assert(strstr(err.msg, "device"), "%s", err.msg);
    json_object_set_new(shard, "device", json_string("cuda:2"));
    json_object_set_new(n2r, "node-0", json_string("runner-3-1")); /* any of the node's runners */
    cr_assert_eq(exo_instance_from_json(j, &back, &err), 0, "%s", err.msg);
    exo_instance_clear(&back);
    json_object_set_new(n2r, "node-9", json_string("runner-3-1")); /* not that runner's node */
    cr_assert_eq(exo_instance_from_json(j, &back, &err), EXO_EINVAL);
    json_decref(j);

    /* exo's form: the nodes only in nodeToRunner, which must name each */
    exo_event two;
    fx_event(&two, EXO_EVENT_INSTANCE_CREATED, 2);
    j = exo_instance_to_json(&two.u.instance_created.instance);
    sa = json_object_get(body_of(j, "MlxRingInstance"), "shardAssignments");
    const char *rid;
    json_t *v;
    json_object_foreach(json_object_get(sa, "runnerToShard"), rid, v)
        json_object_del(body_of(v, "PipelineShardMetadata"), "nodeId");
    cr_assert_eq(exo_instance_from_json(j, &back, &err), 0, "%s", err.msg);
    cr_assert(exo_instance_equal(&back, &two.u.instance_created.instance));
    exo_instance_clear(&back);
    json_object_del(json_object_get(sa, "nodeToRunner"), "node-2");
    cr_assert_eq(exo_instance_from_json(j, &back, &err), EXO_EINVAL);
    json_decref(j);
    exo_event_clear(&two);
    exo_event_clear(&ev);
}

Test(cluster_events, json_runner_status_task_and_node_info)
{
    exo_event ev;
    fx_event(&ev, EXO_EVENT_RUNNER_STATUS_UPDATED, EXO_RUNNER_LOADING);
    json_t *j = exo_event_to_json(&ev);
    json_t *b = body_of(j, "RunnerStatusUpdated");
    json_t *st = body_of(json_object_get(b, "runnerStatus"), "RunnerLoading");
    cr_assert_eq(json_integer_value(json_object_get(st, "layersLoaded")), 3);
    cr_assert_eq(json_integer_value(json_object_get(st, "totalLayers")), 24);
    json_decref(j);
    exo_event_clear(&ev);

    fx_event(&ev, EXO_EVENT_RUNNER_STATUS_UPDATED, EXO_RUNNER_READY);
    j = exo_event_to_json(&ev);
    st = body_of(json_object_get(body_of(j, "RunnerStatusUpdated"), "runnerStatus"), "RunnerReady");
    cr_assert(json_is_null(json_object_get(st, "prefillServerPort")));
    json_decref(j);
    exo_event_clear(&ev);

    fx_event(&ev, EXO_EVENT_TASK_CREATED, EXO_TASK_KIND_TEXT_GENERATION);
    j = exo_event_to_json(&ev);
    b = body_of(j, "TaskCreated");
    json_t *task = body_of(json_object_get(b, "task"), "TextGeneration");
    cr_assert_str_eq(json_string_value(json_object_get(task, "taskStatus")), "Pending");
    json_t *params = json_object_get(task, "taskParams");
    cr_assert(json_is_object(params), "params embedded as JSON");
    cr_assert_str_eq(json_string_value(json_object_get(params, "model")), "org/m");
    cr_assert(json_is_null(json_object_get(task, "errorMessage")));
    json_decref(j);
    exo_event_clear(&ev);

    fx_event(&ev, EXO_EVENT_NODE_GATHERED_INFO, 0);
    j = exo_event_to_json(&ev);
    b = body_of(j, "NodeGatheredInfo");
    cr_assert_str_eq(json_string_value(json_object_get(b, "when")), "2026-01-01T00:00:00.123Z");
    json_t *info = json_object_get(b, "info");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(info, "ramTotal"), "inBytes")),
                 (json_int_t)(512ull << 30));
    cr_assert_str_eq(json_string_value(json_object_get(info, "friendlyName")), "box-0 \xc3\xa9");
    cr_assert_eq(json_array_size(json_object_get(info, "backends")), 1);
    json_decref(j);
    exo_event_clear(&ev);
}

Test(cluster_events, json_commands)
{
    exo_command cmd;
    fx_command(&cmd, EXO_COMMAND_PLACE_INSTANCE, 7);
    json_t *j = exo_command_to_json(&cmd);
    json_t *b = body_of(j, "PlaceInstance");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(b, "modelCard"), "modelId")), "org/model-7");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(b, "modelCard"), "nLayers")), 24);
    cr_assert_str_eq(json_string_value(json_object_get(b, "sharding")), "Tensor");
    cr_assert_str_eq(json_string_value(json_object_get(b, "instanceMeta")), "MlxJaccl");
    cr_assert_eq(json_integer_value(json_object_get(b, "minNodes")), 2);
    json_decref(j);
    exo_command_clear(&cmd);
    fx_command(&cmd, EXO_COMMAND_TEXT_GENERATION, 1);
    j = exo_command_to_json(&cmd);
    b = body_of(j, "TextGeneration");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(b, "taskParams"), "max_tokens")), 16);
    json_decref(j);
    exo_command_clear(&cmd);
}

/* ---- hostile input ---- */

static void ps(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

/* {"v": v, "kind": kind, "id": "ev-1", "body": {"task_id": <task_id>, extra...}} */
typedef enum { BODY_OK, BODY_INT_ID, BODY_EXTRA_KEY, BODY_DUP_KEY, BODY_MISSING } body_mode;

static int decode_crafted(int64_t v, const char *kind, body_mode mode, exo_err *err)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 4);
    ps(&pk, "v");
    msgpack_pack_int64(&pk, v);
    ps(&pk, "kind");
    ps(&pk, kind);
    ps(&pk, "id");
    ps(&pk, "ev-1");
    ps(&pk, "body");
    switch (mode) {
    case BODY_OK: msgpack_pack_map(&pk, 1); ps(&pk, "task_id"); ps(&pk, "t-1"); break;
    case BODY_INT_ID: msgpack_pack_map(&pk, 1); ps(&pk, "task_id"); msgpack_pack_int(&pk, 5); break;
    case BODY_EXTRA_KEY:
        msgpack_pack_map(&pk, 2);
        ps(&pk, "future_field");
        msgpack_pack_array(&pk, 2);
        msgpack_pack_double(&pk, 1.5);
        msgpack_pack_nil(&pk);
        ps(&pk, "task_id");
        ps(&pk, "t-1");
        break;
    case BODY_DUP_KEY:
        msgpack_pack_map(&pk, 2);
        ps(&pk, "task_id");
        ps(&pk, "t-1");
        ps(&pk, "task_id");
        ps(&pk, "t-2");
        break;
    case BODY_MISSING: msgpack_pack_map(&pk, 0); break;
    }
    exo_event ev;
    int rc = exo_event_decode((const uint8_t *)sb.data, sb.size, &ev, err);
    if (rc == 0) {
        cr_assert_str_eq(ev.u.task_deleted.task_id.s, "t-1");
        exo_event_clear(&ev);
    }
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

Test(cluster_events, decode_versions_and_fields)
{
    exo_err err = {0};
    cr_assert_eq(decode_crafted(1, "TaskDeleted", BODY_OK, &err), 0, "%s", err.msg);
    cr_assert_eq(decode_crafted(1, "TaskDeleted", BODY_EXTRA_KEY, &err), 0, "unknown keys are skipped: %s", err.msg);
    cr_assert_eq(decode_crafted(2, "TaskDeleted", BODY_OK, &err), EXO_EUNSUPPORTED);
    cr_assert_eq(decode_crafted(0, "TaskDeleted", BODY_OK, &err), EXO_EFORMAT);
    cr_assert_eq(decode_crafted(-1, "TaskDeleted", BODY_OK, &err), EXO_EFORMAT);
    cr_assert_eq(decode_crafted(1, "TaskExploded", BODY_OK, &err), EXO_EFORMAT);
    cr_assert_eq(decode_crafted(1, "TaskDeleted", BODY_INT_ID, &err), EXO_EFORMAT);
    cr_assert(strstr(err.msg, "task_id"), "error names the field: %s", err.msg);
    cr_assert_eq(decode_crafted(1, "TaskDeleted", BODY_DUP_KEY, &err), EXO_EFORMAT);
    cr_assert_eq(decode_crafted(1, "TaskDeleted", BODY_MISSING, &err), EXO_EFORMAT);
}

Test(cluster_events, decode_rejects_malformed_msgpack)
{
    exo_err err = {0};
    exo_event ev;
    cr_assert_eq(exo_event_decode(NULL, 0, &ev, &err), EXO_EFORMAT);
    /* array32 claiming 4 billion elements: refused before any allocation */
    const uint8_t huge_array[] = {0xdd, 0xff, 0xff, 0xff, 0xff, 0x01};
    cr_assert_eq(exo_event_decode(huge_array, sizeof huge_array, &ev, &err), EXO_EFORMAT);
    const uint8_t huge_map[] = {0xdf, 0x7f, 0xff, 0xff, 0xff};
    cr_assert_eq(exo_event_decode(huge_map, sizeof huge_map, &ev, &err), EXO_EFORMAT);
    const uint8_t huge_str[] = {0xdb, 0xff, 0xff, 0xff, 0xff, 'a'};
    cr_assert_eq(exo_event_decode(huge_str, sizeof huge_str, &ev, &err), EXO_EFORMAT);
    uint8_t deep[200];
    memset(deep, 0x91, sizeof deep);
    deep[sizeof deep - 1] = 0x01;
    cr_assert_eq(exo_event_decode(deep, sizeof deep, &ev, &err), EXO_EFORMAT);
    const uint8_t ext[] = {0xd4, 0x01, 0x00};
    cr_assert_eq(exo_event_decode(ext, sizeof ext, &ev, &err), EXO_EFORMAT);
    const uint8_t reserved[] = {0xc1};
    cr_assert_eq(exo_event_decode(reserved, 1, &ev, &err), EXO_EFORMAT);
    const uint8_t not_map[] = {0x93, 0x01, 0x02, 0x03};
    cr_assert_eq(exo_event_decode(not_map, sizeof not_map, &ev, &err), EXO_EFORMAT);
}

Test(cluster_events, decode_every_truncation_and_trailing_bytes)
{
    exo_err err = {0};
    for (int k = 0; k < EXO_EVENT__COUNT; k++) {
        exo_event ev, back;
        fx_event(&ev, (exo_event_kind)k, 5);
        uint8_t *buf;
        size_t len;
        cr_assert_eq(exo_event_encode(&ev, &buf, &len, &err), 0);
        for (size_t cut = 0; cut < len; cut++)
            cr_assert_eq(exo_event_decode(buf, cut, &back, &err), EXO_EFORMAT, "%s cut at %zu",
                         exo_event_kind_name(ev.kind), cut);
        uint8_t *longer = exo_malloc(len + 1);
        memcpy(longer, buf, len);
        longer[len] = 0xc0;
        cr_assert_eq(exo_event_decode(longer, len + 1, &back, &err), EXO_EFORMAT);
        cr_assert(strstr(err.msg, "trailing"), "%s", err.msg);
        exo_free(longer);
        exo_free(buf);
        exo_event_clear(&ev);
    }
}

/* Flip random bytes of valid encodings: decode either fails cleanly or
 * yields an event that is itself valid and round-trips. */
Test(cluster_events, decode_random_mutations)
{
    exo_err err = {0};
    srand(12345);
    for (int k = 0; k < EXO_EVENT__COUNT; k++) {
        exo_event ev;
        fx_event(&ev, (exo_event_kind)k, 7);
        uint8_t *buf;
        size_t len;
        cr_assert_eq(exo_event_encode(&ev, &buf, &len, &err), 0);
        for (int iter = 0; iter < 400; iter++) {
            uint8_t *m = exo_malloc(len);
            memcpy(m, buf, len);
            int flips = 1 + rand() % 3;
            for (int f = 0; f < flips; f++)
                m[(size_t)rand() % len] ^= (uint8_t)(1 + rand() % 255);
            exo_event back;
            int rc = exo_event_decode(m, len, &back, &err);
            if (rc == 0) {
                cr_assert_eq(exo_event_validate(&back, &err), 0, "%s", err.msg);
                roundtrip_event(&back);
                exo_event_clear(&back);
            } else {
                cr_assert(rc == EXO_EFORMAT || rc == EXO_EUNSUPPORTED, "rc %d", rc);
                cr_assert_neq(err.msg[0], 0);
            }
            exo_free(m);
        }
        exo_free(buf);
        exo_event_clear(&ev);
    }
}
