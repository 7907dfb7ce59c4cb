/* Downloads without a network: the hub's file listings, the paths and
 * headers it may send, which files a shard needs, what counts as on disk,
 * and the State's downloads and custom cards (the transfers themselves are
 * tested against a loopback hub in tests/download/). */
#include "cluster/master.h"
#include "cluster/state.h"
#include "core/alloc.h"
#include "download/downloader.h"
#include "download/hub.h"
#include "download/model_store.h"
#include "proto/shard.h"
#include "test_tmpdir.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#define SHA "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define OID "0123456789abcdef0123456789abcdef01234567"

static int parse(const char *json, exo_hub_file_list *l, exo_err *err)
{
    return exo_hub_parse_tree(json, strlen(json), l, err);
}

Test(download, tree_listing)
{
    exo_hub_file_list l;
    exo_err err = {0};
    cr_assert_eq(parse("[{\"type\":\"directory\",\"oid\":\"" OID "\",\"size\":0,\"path\":\"sub\"},"
                       "{\"type\":\"file\",\"oid\":\"" OID "\",\"size\":12,\"path\":\"config.json\"},"
                       "{\"type\":\"file\",\"oid\":\"ffffffffffffffffffffffffffffffffffffffff\",\"size\":134,"
                       "\"path\":\"sub/model.safetensors\",\"lfs\":{\"oid\":\"" SHA "\",\"size\":5000000000,"
                       "\"pointerSize\":134}}]",
                       &l, &err),
                 0, "%s", err.msg);
    cr_assert_eq(l.n, 2, "directories are not files");
    cr_assert_str_eq(l.v[0].path, "config.json");
    cr_assert_eq(l.v[0].size, 12);
    cr_assert_str_eq(l.v[0].git_oid, OID);
    cr_assert_str_eq(l.v[0].sha256, "");
    cr_assert_str_eq(l.v[1].path, "sub/model.safetensors");
    cr_assert_eq(l.v[1].size, 5000000000LL, "an LFS file's size is the content's, not the pointer's");
    cr_assert_str_eq(l.v[1].sha256, SHA);
    exo_hub_file_list_free(&l);
    cr_assert_eq(parse("[]", &l, &err), 0);
    cr_assert_eq(l.n, 0);
}

Test(download, tree_listing_rejects)
{
    static const char *const bad[] = {
        "{}",
        "[1]",
        "[{\"type\":\"file\",\"size\":1}]",
        "[{\"type\":\"file\",\"size\":1,\"path\":\"../etc/passwd\"}]",
        "[{\"type\":\"file\",\"size\":1,\"path\":\"/abs\"}]",
        "[{\"type\":\"file\",\"size\":1,\"path\":\"a//b\"}]",
        "[{\"type\":\"file\",\"size\":1,\"path\":\"a/./b\"}]",
        "[{\"type\":\"file\",\"size\":1,\"path\":\"a\\\\b\"}]",
        "[{\"type\":\"file\",\"size\":1,\"path\":\"a\\nb\"}]",
        "[{\"type\":\"file\",\"size\":-1,\"path\":\"a\"}]",
        "[{\"type\":\"file\",\"size\":\"1\",\"path\":\"a\"}]",
        "[{\"type\":\"file\",\"size\":1,\"path\":\"a\",\"lfs\":{\"oid\":\"xyz\",\"size\":1}}]",
        "[{\"type\":\"file\",\"size\":1,\"path\":\"a\",\"lfs\":{\"oid\":\"" SHA "\"}}]",
        "[{\"type\":\"file\",\"size\":1,\"path\":\"a\",\"path\":\"b\"}]",
        "not json",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        exo_hub_file_list l;
        exo_err err = {0};
        cr_assert_neq(parse(bad[i], &l, &err), 0, "accepted %s", bad[i]);
        cr_assert_eq(l.n, 0);
        cr_assert_null(l.v);
        cr_assert(err.msg[0], "no message for %s", bad[i]);
    }
}

Test(download, safe_paths)
{
    cr_assert(exo_hub_path_safe("config.json"));
    cr_assert(exo_hub_path_safe("a/b/c.safetensors"));
    cr_assert(exo_hub_path_safe("..hidden"), "dots inside a name are fine");
    static const char *const bad[] = {"", "/x", "..", "a/..", "../a", "a/../b", ".", "a/./b", "a/", "a//b",
                                      "a\\b", "a\x01", "a\x7f"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_assert(!exo_hub_path_safe(bad[i]), "'%s'", bad[i]);
}

Test(download, retry_after)
{
    cr_assert_eq(exo_hub_retry_after("7", NULL), 7);
    cr_assert_eq(exo_hub_retry_after("0", ""), 0);
    cr_assert_eq(exo_hub_retry_after("", "\"api\";r=0;t=55"), 55);
    cr_assert_eq(exo_hub_retry_after(NULL, "\"resolvers\";r=0; t=3"), 3);
    cr_assert_eq(exo_hub_retry_after("100000", NULL), 300, "capped at 5 minutes");
    cr_assert_eq(exo_hub_retry_after("soon", "r=0"), -1);
    cr_assert_eq(exo_hub_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", NULL), -1, "dates are not parsed");
    cr_assert_eq(exo_hub_retry_after(NULL, "\"api\";at=5"), -1, "t= must be a parameter of its own");
}

Test(download, next_link)
{
    char url[64];
    cr_assert_eq(exo_hub_next_link("<http://h/a?cursor=x>; rel=\"next\"", url, sizeof url), 1);
    cr_assert_str_eq(url, "http://h/a?cursor=x");
    cr_assert_eq(exo_hub_next_link("<http://h/p>; rel=\"prev\", <http://h/n>; rel=next", url, sizeof url), 1);
    cr_assert_str_eq(url, "http://h/n", "the second link-value, an unquoted relation");
    cr_assert_eq(exo_hub_next_link("<http://h/1>; title=\"a, rel=next\", <http://h/2>; rel=\"last NEXT\"", url,
                                   sizeof url), 1,
              "a comma and rel= inside a quoted parameter belong to it; relation types are a list");
    cr_assert_str_eq(url, "http://h/2");
    cr_assert_eq(exo_hub_next_link("<http://h/l>; rel=\"last\"", url, sizeof url), 0);
    cr_assert_eq(exo_hub_next_link("<http://h/next>; rel=\"nextpage\"", url, sizeof url), 0,
                 "a longer word; \"next\" in a URL means nothing");
    cr_assert_eq(exo_hub_next_link("http://h/l; rel=\"next\"", url, sizeof url), 0, "no brackets: no link");
    cr_assert_eq(exo_hub_next_link("<http://h/l; rel=\"next\"", url, sizeof url), -1, "cut short");
    cr_assert_eq(exo_hub_next_link("<>; rel=\"next\"", url, sizeof url), -1, "empty");
    cr_assert_eq(exo_hub_next_link("<http://h/a-url-longer-than-the-room-given-for-it-here-is-0123456789>; rel=next",
                                   url, sizeof url), -1, "too long for cap: not cut");
    cr_assert_eq(exo_hub_next_link("", url, sizeof url), 0);
}

Test(download, tensor_layers)
{
    cr_assert_eq(exo_tensor_layer("model.layers.12.mlp.down_proj.weight"), 12);
    cr_assert_eq(exo_tensor_layer("language_model.model.layers.0.self_attn.q_proj.scales"), 0);
    cr_assert_eq(exo_tensor_layer("model.embed_tokens.weight"), -1);
    cr_assert_eq(exo_tensor_layer("model.layers.x.weight"), -1);
    cr_assert_eq(exo_tensor_layer("vision.layers.norm.layers.3.weight"), 3, "the first numbered one");
    exo_layer_shard first = {0, 3, 5, false}, last = {3, 5, 5, false}, tied_last = {3, 5, 5, true};
    cr_assert(exo_layer_shard_needs(&first, "model.embed_tokens.weight"));
    cr_assert(!exo_layer_shard_needs(&last, "model.embed_tokens.weight"));
    cr_assert(exo_layer_shard_needs(&tied_last, "model.embed_tokens.weight"), "a tied head is the embedding");
    cr_assert(!exo_layer_shard_needs(&first, "lm_head.weight"));
    cr_assert(exo_layer_shard_needs(&last, "lm_head.weight"));
    cr_assert(exo_layer_shard_needs(&last, "model.norm.weight"));
    cr_assert(exo_layer_shard_needs(&first, "model.layers.2.mlp.up_proj.weight"));
    cr_assert(!exo_layer_shard_needs(&first, "model.layers.3.mlp.up_proj.weight"));
}

static const char INDEX[] = "{\"metadata\":{\"total_size\":10},\"weight_map\":{"
                            "\"model.embed_tokens.weight\":\"m1.safetensors\","
                            "\"model.layers.0.mlp.up_proj.weight\":\"m1.safetensors\","
                            "\"model.layers.1.mlp.up_proj.weight\":\"m2.safetensors\","
                            "\"model.layers.2.mlp.up_proj.weight\":\"m2.safetensors\","
                            "\"model.layers.3.mlp.up_proj.weight\":\"m3.safetensors\","
                            "\"model.norm.weight\":\"m3.safetensors\","
                            "\"lm_head.weight\":\"m4.safetensors\"}}";

Test(download, shard_files_from_index)
{
    const char *names[] = {"m1.safetensors", "m2.safetensors", "m3.safetensors", "m4.safetensors", "other"};
    bool need[5];
    exo_err err = {0};
    exo_layer_shard s = {0, 2, 4, false};
    cr_assert_eq(exo_download_shard_files(INDEX, strlen(INDEX), &s, names, 5, need, &err), 0, "%s", err.msg);
    cr_assert(need[0] && need[1] && !need[2] && !need[3] && !need[4]);
    s = (exo_layer_shard){2, 4, 4, false};
    exo_download_shard_files(INDEX, strlen(INDEX), &s, names, 5, need, &err);
    cr_assert(!need[0] && need[1] && need[2] && need[3], "layer 2 is in m2; the head in m4");
    s = (exo_layer_shard){3, 4, 4, true};
    exo_download_shard_files(INDEX, strlen(INDEX), &s, names, 5, need, &err);
    cr_assert(need[0] && !need[1] && need[2] && need[3], "tied: the last rank reads the embedding");
    cr_assert_eq(exo_download_shard_files("{\"weight_map\":[]}", 17, &s, names, 5, need, &err), EXO_EFORMAT);
    cr_assert_eq(exo_download_shard_files("{\"weight_map\":{\"a\":1}}", 22, &s, names, 5, need, &err),
                 EXO_EFORMAT);
}

static void write_file(const char *dir, const char *name, const char *text)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f, "%s", p);
    fputs(text, f);
    fclose(f);
}

Test(download, on_disk_means_complete)
{
    char root[64], dir[256];
    test_tmpdir_make(root, "dl_disk");
    snprintf(dir, sizeof dir, "%s/org--m", root);
    mkdir(dir, 0755);
    write_file(dir, "config.json", "{\"model_type\":\"llama\",\"num_hidden_layers\":4,\"hidden_size\":8}");
    write_file(dir, "model.safetensors.index.json", INDEX);
    write_file(dir, "m1.safetensors", "1");
    write_file(dir, "m2.safetensors", "2");
    /* a download that fetched layers 0..2: m1 + m2 of m1..m4 */
    char cfg[300];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    struct stat sb;
    stat(cfg, &sb);
    char idx[300];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    struct stat si;
    stat(idx, &si);
    char meta[1024];
    snprintf(meta, sizeof meta,
             "{\"model_id\":\"org/m\",\"complete\":false,\"files\":["
             "{\"path\":\"config.json\",\"size\":%lld},{\"path\":\"model.safetensors.index.json\",\"size\":%lld},"
             "{\"path\":\"m1.safetensors\",\"size\":1},{\"path\":\"m2.safetensors\",\"size\":1},"
             "{\"path\":\"m3.safetensors\",\"size\":1},{\"path\":\"m4.safetensors\",\"size\":1}]}",
             (long long)sb.st_size, (long long)si.st_size);
    write_file(dir, EXO_DOWNLOAD_META, meta);

    exo_models_dir dirs[1] = {{root, false}};
    exo_model_store *store = exo_model_store_scan(dirs, 1);
    cr_assert_null(exo_model_store_find(store, "org/m"), "an incomplete download is not a model on disk");
    exo_model_store_free(store);

    char found[4096];
    exo_layer_shard first = {0, 2, 4, false}, last = {2, 4, 4, false};
    cr_assert_eq(exo_download_locate(dirs, 1, "org/m", &first, found, sizeof found, NULL), 0,
                 "layers 0..2 are all there");
    cr_assert_str_eq(found, dir);
    cr_assert_eq(exo_download_locate(dirs, 1, "org/m", &last, found, sizeof found, NULL), EXO_ENOENT);
    cr_assert_eq(exo_download_locate(dirs, 1, "org/m", NULL, found, sizeof found, NULL), EXO_ENOENT);

    write_file(dir, "m3.safetensors", "3");
    write_file(dir, "m4.safetensors", "44"); /* the wrong size: not the listed file */
    cr_assert_eq(exo_download_locate(dirs, 1, "org/m", &last, found, sizeof found, NULL), EXO_ENOENT);
    write_file(dir, "m4.safetensors", "4");
    write_file(dir, "m3.safetensors.partial", "");
    cr_assert_eq(exo_download_locate(dirs, 1, "org/m", &last, found, sizeof found, NULL), 0);

    /* marked complete: listed; put there by hand (no metadata): listed */
    char *c = strstr(meta, "\"complete\":false");
    memcpy(c, "\"complete\":true ", 16);
    write_file(dir, EXO_DOWNLOAD_META, meta);
    store = exo_model_store_scan(dirs, 1);
    cr_assert_not_null(exo_model_store_find(store, "org/m"));
    exo_model_store_free(store);

    /* delete: gone from a writable dir, refused in a read-only one */
    exo_err err = {0};
    exo_models_dir ro[1] = {{root, true}};
    cr_assert_eq(exo_download_delete(ro, 1, "org/m", &err), EXO_EPERM);
    cr_assert(stat(dir, &sb) == 0, "still there");
    cr_assert_eq(exo_download_delete(dirs, 1, "org/m", &err), 0, "%s", err.msg);
    cr_assert(stat(dir, &sb) != 0, "deleted");
    cr_assert_eq(exo_download_delete(dirs, 1, "org/m", &err), EXO_ENOENT);
    cr_assert_eq(exo_download_delete(dirs, 1, "../etc", &err), EXO_EINVAL);
    test_tmpdir_remove(root);
}

Test(download, state_keeps_the_latest_per_node_and_model)
{
    exo_state *st = exo_state_new();
    exo_err err = {0};
    int64_t idx = 0;
    exo_event ev;
    exo_id a, b;
    exo_id_set(&a, "node-a", NULL);
    exo_id_set(&b, "node-b", NULL);
    const exo_id *nodes[3] = {&a, &a, &b};
    const exo_download_kind kinds[3] = {EXO_DOWNLOAD_KIND_ONGOING, EXO_DOWNLOAD_KIND_COMPLETED,
                                        EXO_DOWNLOAD_KIND_FAILED};
    for (int i = 0; i < 3; i++) {
        exo_event_init(&ev, EXO_EVENT_NODE_DOWNLOAD_PROGRESS);
        exo_download_status *d = &ev.u.node_download_progress.status;
        d->node_id = *nodes[i];
        snprintf(d->model_id, EXO_MODEL_ID_MAX, "org/m");
        d->kind = kinds[i];
        d->total = 100;
        d->downloaded = 50u * (unsigned)i;
        if (d->kind == EXO_DOWNLOAD_KIND_FAILED)
            d->error_message = exo_strdup("disk full");
        cr_assert_eq(exo_state_apply(st, idx++, &ev, &err), 0, "%s", err.msg);
        exo_event_clear(&ev);
    }
    cr_assert_eq(exo_state_download_count(st), 2, "node a's second status replaced its first");
    cr_assert_eq(exo_state_download(st, &a, "org/m")->kind, EXO_DOWNLOAD_KIND_COMPLETED);
    json_t *j = exo_state_to_json(st);
    json_t *failed = json_object_get(json_array_get(json_object_get(json_object_get(j, "downloads"), "node-b"), 0),
                                     "DownloadFailed");
    cr_assert_not_null(failed, "tagged by kind");
    cr_assert_str_eq(json_string_value(json_object_get(failed, "errorMessage")), "disk full");
    cr_assert_eq(json_integer_value(json_object_get(failed, "downloaded")), 100);
    json_decref(j);

    /* a snapshot rebuilds it */
    exo_event_list evs = {0};
    exo_state_to_events(st, &evs);
    exo_state *copy = exo_state_new();
    for (size_t i = 0; i < evs.n; i++)
        cr_assert_eq(exo_state_apply(copy, (int64_t)i, &evs.v[i], &err), 0, "%s", err.msg);
    cr_assert_eq(exo_state_download_count(copy), 2);
    exo_event_list_clear(&evs);
    exo_state_free(copy);

    exo_event_init(&ev, EXO_EVENT_NODE_DOWNLOAD_DELETED);
    ev.u.node_download_deleted.node_id = a;
    snprintf(ev.u.node_download_deleted.model_id, EXO_MODEL_ID_MAX, "org/m");
    cr_assert_eq(exo_state_apply(st, idx++, &ev, &err), 0);
    exo_event_clear(&ev);
    cr_assert_null(exo_state_download(st, &a, "org/m"));
    exo_event_init(&ev, EXO_EVENT_NODE_TIMED_OUT);
    ev.u.node_timed_out.node_id = b;
    cr_assert_eq(exo_state_apply(st, idx++, &ev, &err), 0);
    exo_event_clear(&ev);
    cr_assert_eq(exo_state_download_count(st), 0, "a node that left takes its downloads along");
    exo_state_free(st);
}

Test(download, custom_cards_through_the_master)
{
    exo_state *st = exo_state_new();
    exo_err err = {0};
    exo_event_list out = {0};
    exo_command cmd;
    exo_command_init(&cmd, EXO_COMMAND_DELETE_CUSTOM_MODEL_CARD);
    snprintf(cmd.u.delete_custom_model_card.model_id, EXO_MODEL_ID_MAX, "user/m");
    cr_assert_eq(exo_master_handle(st, &cmd, &out, &err), EXO_ENOENT);
    cr_assert_eq(out.n, 0);

    exo_command add;
    exo_command_init(&add, EXO_COMMAND_ADD_CUSTOM_MODEL_CARD);
    cr_assert_eq(exo_master_handle(st, &add, &out, &err), EXO_EINVAL, "an empty card is refused");
    snprintf(add.u.add_custom_model_card.card.model_id, EXO_MODEL_ID_MAX, "user/m");
    add.u.add_custom_model_card.card.n_layers = 2;
    add.u.add_custom_model_card.card.storage_bytes = 1000;
    cr_assert_eq(exo_master_handle(st, &add, &out, &err), 0, "%s", err.msg);
    cr_assert_eq(out.n, 1);
    cr_assert_eq(exo_state_apply(st, 0, &out.v[0], &err), 0, "%s", err.msg);
    cr_assert_not_null(exo_state_custom_card(st, "user/m"));
    json_t *j = exo_state_to_json(st);
    cr_assert_not_null(json_object_get(json_object_get(j, "customModelCards"), "user/m"));
    json_decref(j);
    exo_event_list_clear(&out);
    cr_assert_eq(exo_master_handle(st, &cmd, &out, &err), 0, "%s", err.msg);
    cr_assert_eq(exo_state_apply(st, 1, &out.v[0], &err), 0, "%s", err.msg);
    cr_assert_null(exo_state_custom_card(st, "user/m"));
    exo_event_list_clear(&out);
    exo_command_clear(&cmd);
    exo_command_clear(&add);
    exo_state_free(st);
}
