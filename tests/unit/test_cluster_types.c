/* Cluster value types: UUID4 ids, id / model id / UTF-8 validation, enum
 * name tables, instance and task invariants, deep copies. */
#include "cluster/types.h"
#include "test_cluster_fixtures.h"

#include <criterion/criterion.h>
#include <string.h>

Test(cluster_types, uuid4_format_and_uniqueness)
{
    exo_id a, b;
    exo_id_new(&a);
    exo_id_new(&b);
    cr_assert_eq(strlen(a.s), 36);
    cr_assert(!exo_id_eq(&a, &b));
    for (int i = 0; i < 36; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23)
            cr_assert_eq(a.s[i], '-');
        else
            cr_assert(strchr("0123456789abcdef", a.s[i]), "char %d of %s", i, a.s);
    }
    cr_assert_eq(a.s[14], '4', "version nibble: %s", a.s);
    cr_assert(strchr("89ab", a.s[19]), "variant nibble: %s", a.s);
    cr_assert(exo_id_valid(a.s, strlen(a.s)));
}

Test(cluster_types, id_validation)
{
    exo_id id;
    exo_err err = {0};
    cr_assert_eq(exo_id_set(&id, "CANCEL_ALL_TASKS", &err), 0);
    cr_assert_eq(exo_id_set(&id, "12D3KooW.abc:def-1", &err), 0);
    cr_assert_eq(exo_id_set(&id, "", &err), EXO_EINVAL);
    cr_assert_eq(exo_id_set(&id, "has space", &err), EXO_EINVAL);
    cr_assert_eq(exo_id_set(&id, "slash/no", &err), EXO_EINVAL);
    cr_assert_eq(exo_id_set(&id, NULL, &err), EXO_EINVAL);
    char longid[EXO_ID_MAX + 1];
    memset(longid, 'a', sizeof longid - 1);
    longid[EXO_ID_MAX] = 0;
    cr_assert_eq(exo_id_set(&id, longid, &err), EXO_EINVAL);
    longid[EXO_ID_MAX - 1] = 0;
    cr_assert_eq(exo_id_set(&id, longid, &err), 0);
    cr_assert(exo_model_id_valid("mlx-community/Llama-3.2-1B", 26));
    cr_assert(!exo_model_id_valid("a b", 3));
    cr_assert(!exo_model_id_valid("", 0));
}

Test(cluster_types, utf8_validation)
{
    cr_assert(exo_text_utf8_valid("plain", 5));
    cr_assert(exo_text_utf8_valid("\xc3\xa9\xe2\x9c\x97\xf0\x9f\x98\x80", 9));
    cr_assert(!exo_text_utf8_valid("\xc3", 1));              /* truncated */
    cr_assert(!exo_text_utf8_valid("\xc0\xaf", 2));          /* overlong */
    cr_assert(!exo_text_utf8_valid("\xed\xa0\x80", 3));      /* surrogate */
    cr_assert(!exo_text_utf8_valid("\xf4\x90\x80\x80", 4));  /* > U+10FFFF */
    cr_assert(!exo_text_utf8_valid("a\0b", 3));              /* NUL */
    cr_assert(!exo_text_utf8_valid("\xff", 1));
}

Test(cluster_types, enum_tables_round_trip)
{
    for (int k = 0; k < EXO_RUNNER__COUNT; k++) {
        const char *n = exo_runner_status_name((exo_runner_status_kind)k);
        cr_assert_eq(exo_runner_status_parse(n, strlen(n)), k);
    }
    for (int k = 0; k < EXO_TASK_STATUS__COUNT; k++) {
        const char *n = exo_task_status_name((exo_task_status)k);
        cr_assert_eq(exo_task_status_parse(n, strlen(n)), k);
    }
    for (int k = 0; k < EXO_TASK_KIND__COUNT; k++) {
        const char *n = exo_task_kind_name((exo_task_kind)k);
        cr_assert_eq(exo_task_kind_parse(n, strlen(n)), k);
    }
    cr_assert_str_eq(exo_runner_status_name(EXO_RUNNER_WARMING_UP), "WarmingUp");
    cr_assert_str_eq(exo_task_status_name(EXO_TASK_TIMED_OUT), "TimedOut");
    cr_assert_str_eq(exo_sharding_name(EXO_SHARDING_TENSOR), "Tensor");
    cr_assert_str_eq(exo_instance_meta_name(EXO_INSTANCE_META_MLX_RING), "MlxRing");
    cr_assert_str_eq(exo_runner_status_name((exo_runner_status_kind)99), "?");
    cr_assert_eq(exo_runner_status_parse("idle", 4), -1);  /* case-sensitive */
    cr_assert_eq(exo_runner_status_parse("Idlex", 4), EXO_RUNNER_IDLE);  /* length-bounded */
    cr_assert_eq(exo_sharding_parse("Pipelin", 7), -1);
}

Test(cluster_types, instance_invariants)
{
    exo_instance inst;
    exo_err err = {0};
    fx_instance(&inst, 1, "org/m", 3, EXO_SHARDING_PIPELINE);
    cr_assert_eq(exo_instance_validate(&inst, &err), 0, "%s", err.msg);
    cr_assert_eq(inst.shards[2].end_layer, 24);
    exo_id node1 = inst.shards[1].node_id;
    cr_assert_eq(exo_instance_shard_of_node(&inst, &node1), &inst.shards[1]);
    cr_assert_eq(exo_instance_shard_of_runner(&inst, &inst.shards[2].runner_id), &inst.shards[2]);

    exo_instance c;
    exo_instance_copy(&c, &inst);
    cr_assert(exo_instance_equal(&c, &inst));
    cr_assert_neq(c.shards, inst.shards);
    c.shards[1].device_rank = 2;
    cr_assert(!exo_instance_equal(&c, &inst));
    cr_assert_eq(exo_instance_validate(&c, &err), EXO_EINVAL);
    c.shards[1].device_rank = 1;
    c.shards[1].node_id = c.shards[0].node_id;  /* two runners on one node */
    cr_assert_eq(exo_instance_validate(&c, &err), EXO_EINVAL);
    /* ... which may share it with a device each, never one GPU twice */
    static const struct { const char *a, *b; bool ok; } pairs[] = {
        {"cuda:0", "cuda:1", true}, {"cpu", "cpu", true},       {"cpu", "cuda:3", true},
        {"cuda:0", "cuda:0", false}, {"cuda", "cuda:0", false}, {"", "cuda:1", false},
        {"auto", "cuda:1", false},   {"", "", false},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
        snprintf(c.shards[0].device, sizeof c.shards[0].device, "%s", pairs[i].a);
        snprintf(c.shards[1].device, sizeof c.shards[1].device, "%s", pairs[i].b);
        cr_assert_eq(exo_instance_validate(&c, &err), pairs[i].ok ? 0 : EXO_EINVAL, "%s + %s: %s", pairs[i].a,
                     pairs[i].b, err.msg);
    }
    cr_assert_eq(exo_instance_shard_of_node(&c, &c.shards[0].node_id), &c.shards[0], "a node's first rank");
    snprintf(c.shards[1].device, sizeof c.shards[1].device, "gpu1");
    cr_assert_eq(exo_instance_validate(&c, &err), EXO_EINVAL);
    cr_assert(strstr(err.msg, "device"), "%s", err.msg);
    c.shards[0].device[0] = c.shards[1].device[0] = 0;
    c.shards[1].node_id = node1;
    c.shards[1].start_layer = c.shards[1].end_layer;  /* empty range */
    cr_assert_eq(exo_instance_validate(&c, &err), EXO_EINVAL);
    c.shards[1].start_layer = 8;
    c.shards[1].world_size = 4;
    cr_assert_eq(exo_instance_validate(&c, &err), EXO_EINVAL);
    c.shards[1].world_size = 3;
    cr_assert_eq(exo_instance_validate(&c, &err), 0, "%s", err.msg);
    c.model_id[0] = 0;
    cr_assert_eq(exo_instance_validate(&c, &err), EXO_EINVAL);
    exo_instance_clear(&c);
    exo_instance_clear(&inst);
    cr_assert_null(inst.shards);
}

Test(cluster_types, task_invariants)
{
    exo_err err = {0};
    for (int k = 0; k < EXO_TASK_KIND__COUNT; k++) {
        exo_task t, c;
        fx_task(&t, k, 0, (exo_task_kind)k);
        cr_assert_eq(exo_task_validate(&t, &err), 0, "%s: %s", exo_task_kind_name(t.kind), err.msg);
        exo_task_copy(&c, &t);
        cr_assert(exo_task_equal(&c, &t));
        exo_task_clear(&c);
        exo_task_clear(&t);
    }
    exo_task t;
    fx_task(&t, 1, 0, EXO_TASK_KIND_TEXT_GENERATION);
    exo_free(t.params_json);
    t.params_json = exo_strdup("[1,2]");  /* not an object */
    cr_assert_eq(exo_task_validate(&t, &err), EXO_EINVAL);
    exo_free(t.params_json);
    t.params_json = NULL;  /* required for TextGeneration */
    cr_assert_eq(exo_task_validate(&t, &err), EXO_EINVAL);
    exo_task_clear(&t);
    fx_task(&t, 1, 0, EXO_TASK_KIND_LOAD_MODEL);
    fx_id(&t.runner_id, "runner", 1);  /* not used by LoadModel */
    cr_assert_eq(exo_task_validate(&t, &err), EXO_EINVAL);
    exo_task_clear(&t);
}

Test(cluster_types, runner_status_invariants)
{
    exo_err err = {0};
    exo_runner_status st;
    exo_runner_status_init(&st, EXO_RUNNER_LOADING);
    st.layers_loaded = 5;
    st.total_layers = 4;
    cr_assert_eq(exo_runner_status_validate(&st, &err), EXO_EINVAL);
    st.total_layers = 5;
    cr_assert_eq(exo_runner_status_validate(&st, &err), 0);
    exo_runner_status_init(&st, EXO_RUNNER_IDLE);
    st.prefill_server_port = 80;  /* only Ready has a port */
    cr_assert_eq(exo_runner_status_validate(&st, &err), EXO_EINVAL);
    st.kind = EXO_RUNNER_READY;
    cr_assert_eq(exo_runner_status_validate(&st, &err), 0);
    st.prefill_server_port = 70000;
    cr_assert_eq(exo_runner_status_validate(&st, &err), EXO_EINVAL);
}

Test(cluster_types, device_names)
{
    static const char *const good[] = {"", "auto", "cpu", "cuda", "cuda:0", "cuda:7", "cuda:63"};
    static const char *const bad[] = {"gpu", "CPU", "cuda:", "cuda:-1", "cuda:+1", "cuda:01", "cuda:64",
                                      "cuda:1x", "cuda:99999999999", "cuda0", " cpu", "cuda:1 "};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        cr_assert(exo_device_valid(good[i]), "%s", good[i]);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_assert(!exo_device_valid(bad[i]), "%s", bad[i]);
    cr_assert_eq(exo_device_gpu("cuda"), 0);
    cr_assert_eq(exo_device_gpu("cuda:12"), 12);
    cr_assert_eq(exo_device_gpu("cpu"), -1);
    cr_assert_eq(exo_device_gpu(""), -1);
    cr_assert_eq(exo_device_gpu("cuda:64"), -1);
}
