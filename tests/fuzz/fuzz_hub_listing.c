/* libFuzzer target for what a hub (or a model dir's metadata) says about a
 * repository's files: the tree listing parser must either refuse the input
 * or give files whose paths are safe to join under a model directory, with
 * sizes >= 0 and well-formed hashes; the same bytes as a safetensors index
 * must pick files only among the names given; the same bytes as rate-limit
 * headers give a wait in [-1, 300]; as a Link header, a next page whose URL
 * fits the room given and is a part of the header; as a model search's
 * answer, at most the limit of models, each with an id, counts and string
 * tags. */
// FUZZ_SOURCES: src/download/hub.c src/download/downloader.c src/download/model_store.c src/proto/shard.c src/core/*.c
// FUZZ_LIBS: -lcurl -lcrypto
#include "download/downloader.h"
#include "download/hub.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool lower_hex(const char *s, size_t n)
{
    if (strlen(s) != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    exo_hub_file_list l;
    exo_err err = {0};
    if (exo_hub_parse_tree((const char *)data, size, &l, &err) == 0) {
        for (size_t i = 0; i < l.n; i++) {
            const exo_hub_file *f = &l.v[i];
            if (!exo_hub_path_safe(f->path) || f->size < 0 ||
                (f->sha256[0] && !lower_hex(f->sha256, 64)) || (f->git_oid[0] && !lower_hex(f->git_oid, 40)))
                abort();
        }
        exo_hub_file_list_free(&l);
    } else if (l.n || l.v || !err.msg[0]) {
        abort();
    }

    const char *names[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    bool need[2];
    exo_layer_shard s = {1, 3, 4, size % 2 == 0};
    if (exo_download_shard_files((const char *)data, size, &s, names, 2, need, &err) != 0 && !err.msg[0])
        abort();

    char a[64] = "", b[128] = "";
    size_t half = size / 2;
    memcpy(a, data, half < sizeof a - 1 ? half : sizeof a - 1);
    memcpy(b, data + half, size - half < sizeof b - 1 ? size - half : sizeof b - 1);
    int w = exo_hub_retry_after(a, b);
    if (w < -1 || w > 300)
        abort();

    char *link = malloc(size + 1), url[48];
    memcpy(link, data, size);
    link[size] = 0;
    memset(url, 'x', sizeof url);
    int linked = exo_hub_next_link(link, url, sizeof url);
    if (linked < -1 || linked > 1)
        abort();
    if (linked == 1) {
        size_t n = strnlen(url, sizeof url);
        if (n == 0 || n == sizeof url || !strstr(link, url))
            abort();
    }
    free(link);

    json_t *found;
    err = (exo_err){0};
    if (exo_hub_parse_search((const char *)data, size, 20, &found, &err) == 0) {
        if (!json_is_array(found) || json_array_size(found) > 20)
            abort();
        size_t i;
        json_t *m;
        json_array_foreach(found, i, m) {
            const char *id = json_string_value(json_object_get(m, "id"));
            json_t *tags = json_object_get(m, "tags"), *author = json_object_get(m, "author");
            if (!id || !*id || !json_is_integer(json_object_get(m, "downloads")) ||
                !json_is_integer(json_object_get(m, "likes")) || !json_is_array(tags) ||
                !(json_is_string(author) || json_is_null(author)))
                abort();
            for (size_t k = 0; k < json_array_size(tags); k++)
                if (!json_is_string(json_array_get(tags, k)))
                    abort();
        }
        json_decref(found);
    } else if (found || !err.msg[0]) {
        abort();
    }
    return 0;
}
