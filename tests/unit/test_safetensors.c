/* safetensors reader/writer tests: writer -> reader round trips, sharded and
 * globbed directories, and one test per header validation rule. Inputs are
 * generated into a mkdtemp directory; nothing binary is committed. */
#include "core/alloc.h"
#include "engine/safetensors.h"

#include <criterion/criterion.h>
#include "test_tmpdir.h"
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[64];

static void setup(void)
{
    test_tmpdir_make(tmpdir, "st_test");
}

static void teardown(void) { test_tmpdir_remove(tmpdir); }

TestSuite(safetensors, .init = setup, .fini = teardown);

static char *tpath(const char *name)
{
    static char buf[8][256];
    static int k;
    char *b = buf[k++ % 8];
    snprintf(b, 256, "%s/%s", tmpdir, name);
    return b;
}

static void write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* A file with the given header text (length field = strlen(header) unless
 * hlen_override != 0) followed by `data_len` bytes of 0xAB. */
static void write_raw(const char *path, const char *header, size_t data_len, uint64_t hlen_override)
{
    size_t h = strlen(header);
    uint64_t hl = hlen_override ? hlen_override : h;
    size_t n = 8 + h + data_len;
    uint8_t *buf = malloc(n);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)(hl >> (8 * i));
    memcpy(buf + 8, header, h);
    memset(buf + 8 + h, 0xAB, data_len);
    write_bytes(path, buf, n);
    free(buf);
}

/* Opens a file made from `header` and expects error `code` with a message
 * mentioning the file and `needle`. */
static void expect_bad(const char *header, size_t data_len, int code, const char *needle)
{
    const char *p = tpath("bad.safetensors");
    write_raw(p, header, data_len, 0);
    exo_st *st = NULL;
    exo_err err = {0};
    int rc = exo_st_open(p, &st, &err);
    cr_assert_eq(rc, code, "header %s: rc %s (%s), expected %s", header, exo_err_name(rc), err.msg,
                 exo_err_name(code));
    cr_assert_null(st);
    cr_assert(strstr(err.msg, "bad.safetensors"), "message lacks file name: %s", err.msg);
    if (needle)
        cr_assert(strstr(err.msg, needle), "message lacks '%s': %s", needle, err.msg);
}

Test(safetensors, roundtrip)
{
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[3] = {0x3f80, 0x4000, 0x4040};
    int64_t c = 42;
    uint8_t u[5] = {1, 2, 3, 4, 5};
    exo_st_writer *w = exo_st_writer_new();
    exo_err err = {0};
    cr_assert_eq(exo_st_writer_add(w, "z.weight", EXO_DTYPE_F32, 2, (int64_t[]){2, 3}, a, sizeof a, &err), 0);
    cr_assert_eq(exo_st_writer_add(w, "a.bf16", EXO_DTYPE_BF16, 1, (int64_t[]){3}, b, sizeof b, &err), 0);
    cr_assert_eq(exo_st_writer_add_copy(w, "scalar", EXO_DTYPE_I64, 0, NULL, &c, sizeof c, &err), 0);
    cr_assert_eq(exo_st_writer_add(w, "bytes", EXO_DTYPE_U8, 1, (int64_t[]){5}, u, sizeof u, &err), 0);
    cr_assert_eq(exo_st_writer_add(w, "empty", EXO_DTYPE_F16, 2, (int64_t[]){0, 4}, NULL, 0, &err), 0);
    void *owned = exo_malloc(8);
    memset(owned, 7, 8);
    cr_assert_eq(exo_st_writer_add_owned(w, "owned", EXO_DTYPE_I32, 1, (int64_t[]){2}, owned, 8, &err), 0);
    exo_st_writer_set_metadata(w, "format", "pt");
    exo_st_writer_set_metadata(w, "note", "x");
    exo_st_writer_set_metadata(w, "note", "y");
    cr_assert_eq(exo_st_writer_count(w), 6);
    const char *p = tpath("rt.safetensors");
    cr_assert_eq(exo_st_writer_write(w, p, &err), 0, "%s", err.msg);
    exo_st_writer_free(w);
    cr_assert_neq(access(tpath("rt.safetensors.tmp"), F_OK), 0, "tmp file left behind");

    /* header: 8-byte aligned, JSON object padded with spaces */
    FILE *f = fopen(p, "rb");
    uint8_t lenb[8];
    cr_assert_eq(fread(lenb, 1, 8, f), 8);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | lenb[i];
    cr_assert_eq(hl % 8, 0);
    char *hdr = calloc(1, hl + 1);
    cr_assert_eq(fread(hdr, 1, hl, f), hl);
    fclose(f);
    cr_assert_eq(hdr[0], '{');
    cr_assert(strstr(hdr, "\"__metadata__\":{\"format\":\"pt\""), "%s", hdr);
    /* widest dtype first, like the reference library */
    cr_assert(strstr(hdr, "\"scalar\"") < strstr(hdr, "\"z.weight\""), "%s", hdr);
    cr_assert(strstr(hdr, "\"z.weight\"") < strstr(hdr, "\"a.bf16\""), "%s", hdr);
    free(hdr);

    exo_st *st = NULL;
    cr_assert_eq(exo_st_open(p, &st, &err), 0, "%s", err.msg);
    cr_assert_eq(exo_st_count(st), 6);
    cr_assert_eq(exo_st_file_count(st), 1);
    cr_assert_str_eq(exo_st_metadata(st, "format"), "pt");
    cr_assert_str_eq(exo_st_metadata(st, "note"), "y");
    cr_assert_null(exo_st_metadata(st, "nope"));

    const exo_st_tensor *t = exo_st_find(st, "z.weight");
    cr_assert_not_null(t);
    cr_assert_eq(t->dtype, EXO_DTYPE_F32);
    cr_assert_eq(t->ndim, 2);
    cr_assert_eq(t->shape[0], 2);
    cr_assert_eq(t->shape[1], 3);
    cr_assert_eq(t->nbytes, sizeof a);
    cr_assert_eq(memcmp(t->data, a, sizeof a), 0);
    cr_assert_str_eq(t->file, p);
    cr_assert_eq((uintptr_t)t->data % 4, 0);

    t = exo_st_find(st, "a.bf16");
    cr_assert_eq(t->dtype, EXO_DTYPE_BF16);
    cr_assert_eq(memcmp(t->data, b, sizeof b), 0);
    t = exo_st_find(st, "scalar");
    cr_assert_eq(t->ndim, 0);
    cr_assert_eq(t->nbytes, 8);
    cr_assert_eq((uintptr_t)t->data % 8, 0);
    cr_assert_eq(memcmp(t->data, &c, 8), 0);
    t = exo_st_find(st, "empty");
    cr_assert_eq(t->nbytes, 0);
    cr_assert_eq(t->shape[0], 0);
    cr_assert_eq(t->shape[1], 4);
    t = exo_st_find(st, "owned");
    cr_assert_eq(((const uint8_t *)t->data)[7], 7);
    cr_assert_eq(memcmp(exo_st_find(st, "bytes")->data, u, 5), 0);
    cr_assert_null(exo_st_find(st, "missing"));

    /* exo_st_at walks every tensor exactly once */
    int seen = 0;
    for (size_t i = 0; i < exo_st_count(st); i++)
        seen += exo_st_find(st, exo_st_at(st, i)->name) == exo_st_at(st, i);
    cr_assert_eq(seen, 6);
    cr_assert_null(exo_st_at(st, 6));
    exo_st_close(st);
}

/* Dropping the mapped pages (after a backend copied the weights) keeps
 * every tensor readable with the same bytes: they fault back in. */
Test(safetensors, dropped_pages_read_back)
{
    float a[1024];
    for (int i = 0; i < 1024; i++)
        a[i] = (float)i * 0.5f;
    exo_st_writer *w = exo_st_writer_new();
    exo_err err = {0};
    cr_assert_eq(exo_st_writer_add(w, "w", EXO_DTYPE_F32, 1, (int64_t[]){1024}, a, sizeof a, &err), 0);
    const char *p = tpath("drop.safetensors");
    cr_assert_eq(exo_st_writer_write(w, p, &err), 0, "%s", err.msg);
    exo_st_writer_free(w);
    exo_st *st = NULL;
    cr_assert_eq(exo_st_open(p, &st, &err), 0, "%s", err.msg);
    const exo_st_tensor *t = exo_st_find(st, "w");
    cr_assert_not_null(t);
    cr_assert_eq(memcmp(t->data, a, sizeof a), 0);
    exo_st_drop_pages(st);
    cr_assert_eq(memcmp(t->data, a, sizeof a), 0);
    exo_st_close(st);
    exo_st_drop_pages(NULL);
}

Test(safetensors, exact_bytes_of_reference_layout)
{
    /* What the reference library writes for {"a": f32[2]} with format=pt. */
    float a[2] = {1, 2};
    exo_st_writer *w = exo_st_writer_new();
    exo_st_writer_set_metadata(w, "format", "pt");
    cr_assert_eq(exo_st_writer_add(w, "a", EXO_DTYPE_F32, 1, (int64_t[]){2}, a, 8, NULL), 0);
    const char *p = tpath("ref.safetensors");
    cr_assert_eq(exo_st_writer_write(w, p, NULL), 0);
    exo_st_writer_free(w);
    const char *want = "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
                       "\"data_offsets\":[0,8]}}";
    size_t wl = strlen(want), padded = (wl + 7) & ~(size_t)7;
    uint8_t buf[256];
    FILE *f = fopen(p, "rb");
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    cr_assert_eq(n, 8 + padded + 8);
    cr_assert_eq(buf[0], (uint8_t)padded);
    cr_assert_eq(memcmp(buf + 8, want, wl), 0);
    for (size_t i = wl; i < padded; i++)
        cr_assert_eq(buf[8 + i], ' ');
    cr_assert_eq(memcmp(buf + 8 + padded, a, 8), 0);
}

Test(safetensors, writer_rejects_bad_entries)
{
    float a[4] = {0};
    exo_st_writer *w = exo_st_writer_new();
    exo_err err = {0};
    cr_assert_eq(exo_st_writer_add(w, "x", EXO_DTYPE_F32, 1, (int64_t[]){4}, a, sizeof a, &err), 0);
    cr_assert_eq(exo_st_writer_add(w, "x", EXO_DTYPE_F32, 1, (int64_t[]){4}, a, sizeof a, &err), EXO_EINVAL);
    cr_assert(strstr(err.msg, "duplicate"));
    cr_assert_eq(exo_st_writer_add(w, "y", EXO_DTYPE_F32, 1, (int64_t[]){5}, a, sizeof a, &err), EXO_EINVAL);
    cr_assert_eq(exo_st_writer_add(w, "__metadata__", EXO_DTYPE_F32, 1, (int64_t[]){4}, a, sizeof a, &err), EXO_EINVAL);
    cr_assert_eq(exo_st_writer_add(w, "n", EXO_DTYPE_F32, 1, (int64_t[]){-4}, a, sizeof a, &err), EXO_EINVAL);
    cr_assert_eq(exo_st_writer_add(w, "d", EXO_DTYPE_F32, 9, (int64_t[]){1, 1, 1, 1, 1, 1, 1, 1, 1}, a, 4, &err), EXO_EINVAL);
    void *owned = exo_malloc(3); /* freed by the failing call */
    cr_assert_eq(exo_st_writer_add_owned(w, "o", EXO_DTYPE_F32, 1, (int64_t[]){1}, owned, 3, &err), EXO_EINVAL);
    cr_assert_eq(exo_st_writer_count(w), 1);
    /* unwritable destination: error, and no file under either name */
    cr_assert_eq(exo_st_writer_write(w, tpath("nodir/x.safetensors"), &err), EXO_EIO);
    cr_assert(strstr(err.msg, "nodir"));
    exo_st_writer_free(w);
}

Test(safetensors, rewrite_replaces_atomically)
{
    float a = 1, b = 2;
    const char *p = tpath("m.safetensors");
    exo_st_writer *w = exo_st_writer_new();
    exo_st_writer_add(w, "v", EXO_DTYPE_F32, 0, NULL, &a, 4, NULL);
    cr_assert_eq(exo_st_writer_write(w, p, NULL), 0);
    exo_st_writer_free(w);
    exo_st *st;
    cr_assert_eq(exo_st_open(p, &st, NULL), 0);
    w = exo_st_writer_new();
    exo_st_writer_add(w, "v", EXO_DTYPE_F32, 0, NULL, &b, 4, NULL);
    cr_assert_eq(exo_st_writer_write(w, p, NULL), 0);
    exo_st_writer_free(w);
    /* the old mapping still sees the old file (rename, not overwrite) */
    float got;
    memcpy(&got, exo_st_find(st, "v")->data, 4);
    cr_assert_eq(got, 1.0f);
    exo_st_close(st);
    cr_assert_eq(exo_st_open(p, &st, NULL), 0);
    memcpy(&got, exo_st_find(st, "v")->data, 4);
    cr_assert_eq(got, 2.0f);
    exo_st_close(st);
}

static void write_shard(const char *name, const char *const *tensors, int n, float base)
{
    exo_st_writer *w = exo_st_writer_new();
    for (int i = 0; i < n; i++) {
        float v[2] = {base + (float)i, -base};
        cr_assert_eq(exo_st_writer_add_copy(w, tensors[i], EXO_DTYPE_F32, 1, (int64_t[]){2}, v, 8, NULL), 0);
    }
    exo_st_writer_set_metadata(w, "format", "pt");
    cr_assert_eq(exo_st_writer_write(w, tpath(name), NULL), 0);
    exo_st_writer_free(w);
}

static void write_text(const char *name, const char *text) { write_bytes(tpath(name), text, strlen(text)); }

Test(safetensors, sharded_with_index)
{
    const char *s1[] = {"model.embed_tokens.weight", "model.layers.0.w"};
    const char *s2[] = {"model.layers.1.w", "lm_head.weight"};
    write_shard("model-00001-of-00002.safetensors", s1, 2, 10);
    write_shard("model-00002-of-00002.safetensors", s2, 2, 20);
    /* a stray file the index does not name must be ignored */
    const char *stray[] = {"stray"};
    write_shard("other.safetensors", stray, 1, 0);
    write_text("model.safetensors.index.json",
               "{\"metadata\":{\"total_size\":32},\"weight_map\":{"
               "\"model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\","
               "\"model.layers.0.w\":\"model-00001-of-00002.safetensors\","
               "\"model.layers.1.w\":\"model-00002-of-00002.safetensors\","
               "\"lm_head.weight\":\"model-00002-of-00002.safetensors\"}}");
    exo_st *st;
    exo_err err = {0};
    cr_assert_eq(exo_st_open(tmpdir, &st, &err), 0, "%s", err.msg);
    cr_assert_eq(exo_st_count(st), 4);
    cr_assert_eq(exo_st_file_count(st), 2);
    cr_assert_null(exo_st_find(st, "stray"));
    const exo_st_tensor *t = exo_st_find(st, "lm_head.weight");
    cr_assert_not_null(t);
    cr_assert(strstr(t->file, "model-00002-of-00002.safetensors"));
    float v;
    memcpy(&v, t->data, 4);
    cr_assert_eq(v, 21.0f);
    t = exo_st_find(st, "model.layers.0.w");
    memcpy(&v, t->data, 4);
    cr_assert_eq(v, 11.0f);
    cr_assert_str_eq(exo_st_metadata(st, "format"), "pt");
    exo_st_close(st);
}

Test(safetensors, index_errors)
{
    const char *s1[] = {"a", "b"};
    write_shard("s1.safetensors", s1, 2, 1);
    exo_st *st;
    exo_err err = {0};

    write_text("model.safetensors.index.json", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"c\":\"s1.safetensors\"}}");
    cr_assert_eq(exo_st_open(tmpdir, &st, &err), EXO_EFORMAT);
    cr_assert(strstr(err.msg, "model.safetensors.index.json") && strstr(err.msg, "'c'"), "%s", err.msg);

    write_text("model.safetensors.index.json", "{\"weight_map\":{\"a\":\"missing.safetensors\"}}");
    cr_assert_eq(exo_st_open(tmpdir, &st, &err), EXO_ENOENT);
    cr_assert(strstr(err.msg, "missing.safetensors"), "%s", err.msg);

    write_text("model.safetensors.index.json", "{\"weight_map\":{\"a\":\"../etc/passwd\"}}");
    cr_assert_eq(exo_st_open(tmpdir, &st, &err), EXO_EFORMAT);

    write_text("model.safetensors.index.json", "{\"weight_map\":[1]}");
    cr_assert_eq(exo_st_open(tmpdir, &st, &err), EXO_EFORMAT);
    cr_assert(strstr(err.msg, "weight_map"), "%s", err.msg);

    write_text("model.safetensors.index.json", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"a\":\"s1.safetensors\"}}");
    cr_assert_eq(exo_st_open(tmpdir, &st, &err), EXO_EFORMAT);

    write_text("model.safetensors.index.json", "not json");
    cr_assert_eq(exo_st_open(tmpdir, &st, &err), EXO_EFORMAT);
    cr_assert(strstr(err.msg, "index.json"), "%s", err.msg);
}

Test(safetensors, duplicate_across_shards)
{
    const char *s1[] = {"a", "dup"};
    const char *s2[] = {"dup", "z"};
    write_shard("p1.safetensors", s1, 2, 1);
    write_shard("p2.safetensors", s2, 2, 2);
    exo_st *st;
    exo_err err = {0};
    cr_assert_eq(exo_st_open(tmpdir, &st, &err), EXO_EFORMAT);
    cr_assert(strstr(err.msg, "'dup'") && strstr(err.msg, "duplicate") &&
                  strstr(err.msg, "p1.safetensors") && strstr(err.msg, "p2.safetensors"),
              "%s", err.msg);
}

Test(safetensors, glob_directory_and_single_file_dir)
{
    const char *s1[] = {"a"};
    const char *s2[] = {"b"};
    write_shard("p1.safetensors", s1, 1, 1);
    write_shard("p2.safetensors", s2, 1, 2);
    write_text("README.md", "hi");
    exo_st *st;
    exo_err err = {0};
    cr_assert_eq(exo_st_open(tmpdir, &st, &err), 0, "%s", err.msg);
    cr_assert_eq(exo_st_count(st), 2);
    cr_assert_eq(exo_st_file_count(st), 2);
    exo_st_close(st);

    /* model.safetensors takes precedence over other files */
    const char *s3[] = {"only"};
    write_shard("model.safetensors", s3, 1, 3);
    cr_assert_eq(exo_st_open(tmpdir, &st, &err), 0, "%s", err.msg);
    cr_assert_eq(exo_st_count(st), 1);
    cr_assert_not_null(exo_st_find(st, "only"));
    exo_st_close(st);
}

Test(safetensors, missing_paths)
{
    exo_st *st;
    exo_err err = {0};
    cr_assert_eq(exo_st_open(tpath("nope.safetensors"), &st, &err), EXO_ENOENT);
    cr_assert(strstr(err.msg, "nope.safetensors"));
    cr_assert_eq(exo_st_open(tmpdir, &st, &err), EXO_ENOENT); /* empty directory */
    cr_assert(strstr(err.msg, tmpdir));
}

Test(safetensors, many_tensors_lookup)
{
    exo_st_writer *w = exo_st_writer_new();
    static uint16_t v[3000];
    char name[64];
    for (int i = 0; i < 3000; i++) {
        v[i] = (uint16_t)i;
        snprintf(name, sizeof name, "model.layers.%d.weight", i);
        cr_assert_eq(exo_st_writer_add(w, name, EXO_DTYPE_U16, 1, (int64_t[]){1}, &v[i], 2, NULL), 0);
    }
    cr_assert_eq(exo_st_writer_write(w, tpath("big.safetensors"), NULL), 0);
    exo_st_writer_free(w);
    exo_st *st;
    cr_assert_eq(exo_st_open(tpath("big.safetensors"), &st, NULL), 0);
    cr_assert_eq(exo_st_count(st), 3000);
    for (int i = 0; i < 3000; i++) {
        snprintf(name, sizeof name, "model.layers.%d.weight", i);
        const exo_st_tensor *t = exo_st_find(st, name);
        cr_assert_not_null(t, "%s", name);
        uint16_t got;
        memcpy(&got, t->data, 2);
        cr_assert_eq(got, i);
    }
    exo_st_close(st);
}

Test(safetensors, open_memory)
{
    const char hdr[] = "{\"t\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}";
    size_t h = strlen(hdr);
    uint8_t buf[128] = {0};
    buf[0] = (uint8_t)h;
    memcpy(buf + 8, hdr, h);
    buf[8 + h] = 9;
    buf[8 + h + 1] = 8;
    buf[8 + h + 2] = 7;
    exo_st *st;
    exo_err err = {0};
    cr_assert_eq(exo_st_open_memory(buf, 8 + h + 3, "mem", &st, &err), 0, "%s", err.msg);
    const exo_st_tensor *t = exo_st_find(st, "t");
    cr_assert_eq(((const uint8_t *)t->data)[2], 7);
    cr_assert_str_eq(t->file, "mem");
    exo_st_close(st);
    /* data section one byte short */
    cr_assert_eq(exo_st_open_memory(buf, 8 + h + 2, "mem", &st, &err), EXO_EFORMAT);
    cr_assert(strstr(err.msg, "mem") && strstr(err.msg, "'t'"), "%s", err.msg);
}

/* ---- header validation ---- */

Test(safetensors, bad_short_file)
{
    write_bytes(tpath("bad.safetensors"), "\x01\x02\x03", 3);
    exo_st *st;
    exo_err err = {0};
    cr_assert_eq(exo_st_open(tpath("bad.safetensors"), &st, &err), EXO_EFORMAT);
    cr_assert(strstr(err.msg, "bad.safetensors") && strstr(err.msg, "shorter"), "%s", err.msg);
    write_bytes(tpath("bad.safetensors"), "", 0);
    cr_assert_eq(exo_st_open(tpath("bad.safetensors"), &st, &err), EXO_EFORMAT);
}

Test(safetensors, bad_header_length)
{
    exo_st *st;
    exo_err err = {0};
    write_raw(tpath("bad.safetensors"), "{}", 0, 200u * 1000 * 1000);
    cr_assert_eq(exo_st_open(tpath("bad.safetensors"), &st, &err), EXO_ETOOBIG);
    cr_assert(strstr(err.msg, "bad.safetensors"), "%s", err.msg);
    write_raw(tpath("bad.safetensors"), "{}", 0, 1000);
    cr_assert_eq(exo_st_open(tpath("bad.safetensors"), &st, &err), EXO_EFORMAT);
    cr_assert(strstr(err.msg, "larger than the file"), "%s", err.msg);
    write_raw(tpath("bad.safetensors"), "{}", 0, UINT64_MAX);
    cr_assert_eq(exo_st_open(tpath("bad.safetensors"), &st, &err), EXO_ETOOBIG);
}

Test(safetensors, empty_header_object_is_valid)
{
    write_raw(tpath("ok.safetensors"), "{}      ", 0, 0);
    exo_st *st;
    cr_assert_eq(exo_st_open(tpath("ok.safetensors"), &st, NULL), 0);
    cr_assert_eq(exo_st_count(st), 0);
    exo_st_close(st);
}

Test(safetensors, bad_json)
{
    expect_bad("{\"a\":", 0, EXO_EFORMAT, "JSON");
    expect_bad("", 0, EXO_EFORMAT, "JSON");
    expect_bad("[1,2]", 0, EXO_EFORMAT, "not a JSON object");
    expect_bad("\"str\"", 0, EXO_EFORMAT, NULL);
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
               "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
               2, EXO_EFORMAT, "JSON");
    expect_bad("{\"a\":1}", 0, EXO_EFORMAT, "'a'");
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[99999999999999999999999],\"data_offsets\":[0,1]}}", 1,
               EXO_EFORMAT, NULL);
}

Test(safetensors, bad_dtype)
{
    expect_bad("{\"w\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, EXO_EFORMAT, "missing \"dtype\"");
    expect_bad("{\"w\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,1]}}", 1, EXO_EFORMAT, "'w'");
    expect_bad("{\"w\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, EXO_EFORMAT, "unknown dtype");
    expect_bad("{\"w\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, EXO_EFORMAT, "'w'");
    expect_bad("{\"w\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, EXO_EUNSUPPORTED, "F8_E4M3");
}

Test(safetensors, bad_shape)
{
    expect_bad("{\"w\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, EXO_EFORMAT, "missing \"shape\"");
    expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", 1, EXO_EFORMAT, "'w'");
    expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1, EXO_EFORMAT, "negative");
    expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", 1, EXO_EFORMAT, "not an integer");
    expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[1.0],\"data_offsets\":[0,1]}}", 1, EXO_EFORMAT, "not an integer");
    expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[\"1\"],\"data_offsets\":[0,1]}}", 1, EXO_EFORMAT, "'w'");
    expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,1]}}", 1,
               EXO_EFORMAT, "overflow");
    expect_bad("{\"w\":{\"dtype\":\"F64\",\"shape\":[2305843009213693952],\"data_offsets\":[0,1]}}", 1,
               EXO_EFORMAT, "overflow");
    expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
               EXO_EUNSUPPORTED, "dimensions");
}

Test(safetensors, bad_offsets)
{
    expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, EXO_EFORMAT, "missing \"data_offsets\"");
    expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1, EXO_EFORMAT, "[begin, end]");
    expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 2, EXO_EFORMAT, "[begin, end]");
    expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[\"0\",1]}}", 1, EXO_EFORMAT, "'w'");
    expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":{}}}", 1, EXO_EFORMAT, "'w'");
    expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,1]}}", 2, EXO_EFORMAT, "begin");
    expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 1, EXO_EFORMAT, "negative");
    expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 3, EXO_EFORMAT, "past the data");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 8, EXO_EFORMAT, "need 8");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,8]}}", 8, EXO_EFORMAT, "need 4");
}

Test(safetensors, bad_overlap)
{
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
               "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}",
               6, EXO_EFORMAT, "overlaps");
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
               "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
               4, EXO_EFORMAT, "overlaps");
    /* adjacent is fine, and empty tensors may sit anywhere */
    const char *ok = "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                     "\"e\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,2]},"
                     "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}}";
    write_raw(tpath("ok.safetensors"), ok, 8, 0);
    exo_st *st;
    exo_err err = {0};
    cr_assert_eq(exo_st_open(tpath("ok.safetensors"), &st, &err), 0, "%s", err.msg);
    cr_assert_eq(exo_st_count(st), 3);
    exo_st_close(st);
}

Test(safetensors, bad_metadata)
{
    expect_bad("{\"__metadata__\":[1]}", 0, EXO_EFORMAT, "__metadata__");
    expect_bad("{\"__metadata__\":{\"format\":1}}", 0, EXO_EFORMAT, "format");
    write_raw(tpath("ok.safetensors"), "{\"__metadata__\":{\"format\":\"mlx\"}}", 0, 0);
    exo_st *st;
    cr_assert_eq(exo_st_open(tpath("ok.safetensors"), &st, NULL), 0);
    cr_assert_str_eq(exo_st_metadata(st, "format"), "mlx");
    exo_st_close(st);
}

Test(safetensors, unaligned_data_is_allowed)
{
    /* header of odd length: the data section is not aligned */
    const char *h = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[1,5]}}";
    write_raw(tpath("u.safetensors"), h, 5, 0);
    exo_st *st;
    exo_err err = {0};
    cr_assert_eq(exo_st_open(tpath("u.safetensors"), &st, &err), 0, "%s", err.msg);
    cr_assert_eq(exo_st_find(st, "w")->nbytes, 4);
    exo_st_close(st);
}

static int fill_iota(void *ctx, const char *name, void *dst, size_t nbytes, exo_err *err)
{
    int *calls = ctx;
    (*calls)++;
    if (!strcmp(name, "fail"))
        return exo_err_set(err, EXO_EIO, "cannot produce %s", name);
    for (size_t i = 0; i < nbytes; i++)
        ((uint8_t *)dst)[i] = (uint8_t)i;
    return 0;
}

Test(safetensors, deferred_tensors)
{
    int calls = 0;
    exo_err err = {0};
    exo_st_writer *w = exo_st_writer_new();
    cr_assert_eq(exo_st_writer_add_deferred(w, "d", EXO_DTYPE_U8, 2, (int64_t[]){4, 5}, 20, fill_iota, &calls, &err), 0);
    cr_assert_eq(exo_st_writer_add_deferred(w, "bad", EXO_DTYPE_U8, 1, (int64_t[]){4}, 5, fill_iota, &calls, &err), EXO_EINVAL);
    cr_assert_eq(exo_st_writer_add_deferred(w, "nofill", EXO_DTYPE_U8, 1, (int64_t[]){4}, 4, NULL, NULL, &err), EXO_EINVAL);
    const char *p = tpath("d.safetensors");
    cr_assert_eq(exo_st_writer_write(w, p, &err), 0, "%s", err.msg);
    cr_assert_eq(calls, 1);
    exo_st *st;
    cr_assert_eq(exo_st_open(p, &st, &err), 0);
    const exo_st_tensor *t = exo_st_find(st, "d");
    cr_assert_eq(((const uint8_t *)t->data)[19], 19);
    exo_st_close(st);

    /* a failing fill aborts the write: no file, no tmp */
    cr_assert_eq(exo_st_writer_add_deferred(w, "fail", EXO_DTYPE_U8, 1, (int64_t[]){4}, 4, fill_iota, &calls, &err), 0);
    const char *q = tpath("f.safetensors");
    cr_assert_eq(exo_st_writer_write(w, q, &err), EXO_EIO);
    cr_assert(strstr(err.msg, "f.safetensors") && strstr(err.msg, "cannot produce fail"), "%s", err.msg);
    cr_assert_neq(access(q, F_OK), 0);
    cr_assert_neq(access(tpath("f.safetensors.tmp"), F_OK), 0);
    exo_st_writer_free(w);
}
