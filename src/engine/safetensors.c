/* safetensors reader (mmap, strict validation, sharded directories) and
 * writer (atomic tmp + fsync + rename). See safetensors.h for the format and
 * the guarantees; this file is the only place that knows the byte layout. */
#include "engine/safetensors.h"
#include "core/json_util.h"
#include "core/alloc.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* reader state                                                        */

typedef struct st_file {
    char          *path;
    const uint8_t *base;   /* whole file image */
    size_t         size;
    bool           mapped; /* munmap on close */
    json_t        *meta;   /* "__metadata__" object or NULL */
} st_file;

struct exo_st {
    st_file       *files;
    size_t         nfiles, cap_files;
    exo_st_tensor *tensors;
    size_t         n, cap;
    uint32_t      *slots; /* open addressing: tensor index + 1, 0 = empty */
    size_t         nslots; /* power of two */
};

/* dtypes the format defines that exo has no type for: EXO_EUNSUPPORTED
 * rather than EXO_EFORMAT, since the file itself is fine. */
static const char *const known_unsupported_dtypes[] = {
    "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "C64", "I4", "U4",
};

static uint64_t hash_name(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
}

static void hash_insert_index(exo_st *st, uint32_t idx)
{
    size_t mask = st->nslots - 1;
    size_t i = (size_t)hash_name(st->tensors[idx].name) & mask;
    while (st->slots[i])
        i = (i + 1) & mask;
    st->slots[i] = idx + 1;
}

static void hash_grow(exo_st *st)
{
    size_t ns = st->nslots ? st->nslots * 2 : 64;
    exo_free(st->slots);
    st->slots = exo_calloc(ns, sizeof *st->slots);
    st->nslots = ns;
    for (size_t i = 0; i < st->n; i++)
        hash_insert_index(st, (uint32_t)i);
}

const exo_st_tensor *exo_st_find(const exo_st *st, const char *name)
{
    if (!st || !name || !st->nslots)
        return NULL;
    size_t mask = st->nslots - 1;
    size_t i = (size_t)hash_name(name) & mask;
    while (st->slots[i]) {
        const exo_st_tensor *t = &st->tensors[st->slots[i] - 1];
        if (!strcmp(t->name, name))
            return t;
        i = (i + 1) & mask;
    }
    return NULL;
}

size_t exo_st_count(const exo_st *st) { return st ? st->n : 0; }
size_t exo_st_file_count(const exo_st *st) { return st ? st->nfiles : 0; }

const exo_st_tensor *exo_st_at(const exo_st *st, size_t i)
{
    return st && i < st->n ? &st->tensors[i] : NULL;
}

const char *exo_st_metadata(const exo_st *st, const char *key)
{
    if (!st || !key)
        return NULL;
    for (size_t f = 0; f < st->nfiles; f++) {
        json_t *v = st->files[f].meta ? json_object_get(st->files[f].meta, key) : NULL;
        if (v && json_is_string(v))
            return json_string_value(v);
    }
    return NULL;
}

void exo_st_close(exo_st *st)
{
    if (!st)
        return;
    for (size_t i = 0; i < st->n; i++)
        exo_free((char *)st->tensors[i].name);
    for (size_t f = 0; f < st->nfiles; f++) {
        st_file *sf = &st->files[f];
        if (sf->mapped && sf->size)
            munmap((void *)sf->base, sf->size);
        json_decref(sf->meta);
        exo_free(sf->path);
    }
    exo_free(st->files);
    exo_free(st->tensors);
    exo_free(st->slots);
    exo_free(st);
}

void exo_st_drop_pages(exo_st *st)
{
    if (!st)
        return;
    for (size_t f = 0; f < st->nfiles; f++) {
        st_file *sf = &st->files[f];
        if (sf->mapped && sf->size)
            (void)madvise((void *)sf->base, sf->size, MADV_DONTNEED);
    }
}

/* ------------------------------------------------------------------ */
/* header parsing                                                      */

typedef struct range {
    size_t begin, end;
    size_t idx; /* into st->tensors */
} range;

static int cmp_range(const void *a, const void *b)
{
    const range *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static int parse_dtype(const char *file, const char *name, json_t *v, exo_dtype *out,
                       exo_err *err)
{
    if (!v)
        return exo_err_set(err, EXO_EFORMAT, "%s: tensor '%.200s': missing \"dtype\"", file,
                           name);
    if (!json_is_string(v))
        return exo_err_set(err, EXO_EFORMAT, "%s: tensor '%.200s': \"dtype\" is not a string",
                           file, name);
    const char *s = json_string_value(v);
    if (exo_dtype_parse(s, out) == 0)
        return 0;
    for (size_t i = 0; i < sizeof known_unsupported_dtypes / sizeof *known_unsupported_dtypes; i++)
        if (!strcmp(s, known_unsupported_dtypes[i]))
            return exo_err_set(err, EXO_EUNSUPPORTED,
                               "%s: tensor '%.200s': dtype %s is not supported", file, name, s);
    return exo_err_set(err, EXO_EFORMAT, "%s: tensor '%.200s': unknown dtype \"%.40s\"", file,
                       name, s);
}

static int parse_shape(const char *file, const char *name, json_t *v, exo_st_tensor *t,
                       size_t *nelem, exo_err *err)
{
    if (!v)
        return exo_err_set(err, EXO_EFORMAT, "%s: tensor '%.200s': missing \"shape\"", file,
                           name);
    if (!json_is_array(v))
        return exo_err_set(err, EXO_EFORMAT, "%s: tensor '%.200s': \"shape\" is not an array",
                           file, name);
    size_t nd = json_array_size(v);
    if (nd > EXO_ST_MAX_DIMS)
        return exo_err_set(err, EXO_EUNSUPPORTED,
                           "%s: tensor '%.200s': %zu dimensions, at most %d are supported", file,
                           name, nd, EXO_ST_MAX_DIMS);
    size_t count = 1;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(v, i);
        if (!json_is_integer(d))
            return exo_err_set(err, EXO_EFORMAT,
                               "%s: tensor '%.200s': shape[%zu] is not an integer", file, name, i);
        json_int_t x = json_integer_value(d);
        if (x < 0)
            return exo_err_set(err, EXO_EFORMAT, "%s: tensor '%.200s': shape[%zu] is negative",
                               file, name, i);
        if (exo_size_mul(count, (size_t)x, &count))
            return exo_err_set(err, EXO_EFORMAT,
                               "%s: tensor '%.200s': shape overflows (element count too large)",
                               file, name);
        t->shape[i] = (int64_t)x;
    }
    t->ndim = (int)nd;
    *nelem = count;
    return 0;
}

static int parse_offsets(const char *file, const char *name, json_t *v, size_t data_len,
                         size_t *begin, size_t *end, exo_err *err)
{
    if (!v)
        return exo_err_set(err, EXO_EFORMAT, "%s: tensor '%.200s': missing \"data_offsets\"",
                           file, name);
    if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_integer(json_array_get(v, 0)) ||
        !json_is_integer(json_array_get(v, 1)))
        return exo_err_set(err, EXO_EFORMAT,
                           "%s: tensor '%.200s': \"data_offsets\" is not [begin, end] integers",
                           file, name);
    json_int_t b = json_integer_value(json_array_get(v, 0));
    json_int_t e = json_integer_value(json_array_get(v, 1));
    if (b < 0 || e < 0)
        return exo_err_set(err, EXO_EFORMAT, "%s: tensor '%.200s': negative data_offsets", file,
                           name);
    if (b > e)
        return exo_err_set(err, EXO_EFORMAT,
                           "%s: tensor '%.200s': data_offsets begin %lld > end %lld", file, name,
                           (long long)b, (long long)e);
    if ((unsigned long long)e > data_len)
        return exo_err_set(err, EXO_EFORMAT,
                           "%s: tensor '%.200s': data_offsets end %lld is past the data section "
                           "(%zu bytes)",
                           file, name, (long long)e, data_len);
    *begin = (size_t)b;
    *end = (size_t)e;
    return 0;
}

static int check_metadata(const char *file, json_t *v, exo_err *err)
{
    if (!json_is_object(v))
        return exo_err_set(err, EXO_EFORMAT, "%s: \"__metadata__\" is not an object", file);
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x)
    {
        if (!json_is_string(x))
            return exo_err_set(err, EXO_EFORMAT,
                               "%s: \"__metadata__\" value for '%.200s' is not a string", file, k);
    }
    return 0;
}

/* Parses and validates the header of st->files[fi] and appends its tensors.
 * On error the tensors appended so far are left for exo_st_close. */
static int parse_file(exo_st *st, size_t fi, exo_err *err)
{
    st_file *sf = &st->files[fi];
    const char *file = sf->path;
    if (sf->size < 8)
        return exo_err_set(err, EXO_EFORMAT,
                           "%s: file is %zu bytes, shorter than the 8-byte header length", file,
                           sf->size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | sf->base[i];
    if (hlen > EXO_ST_MAX_HEADER)
        return exo_err_set(err, EXO_ETOOBIG,
                           "%s: header length %llu exceeds the %zu byte limit", file,
                           (unsigned long long)hlen, EXO_ST_MAX_HEADER);
    if (hlen > sf->size - 8)
        return exo_err_set(err, EXO_EFORMAT,
                           "%s: header length %llu is larger than the file (%zu bytes)", file,
                           (unsigned long long)hlen, sf->size);
    const char *hdr = (const char *)sf->base + 8;
    size_t data_len = sf->size - 8 - (size_t)hlen;
    const uint8_t *data = sf->base + 8 + hlen;

    json_error_t jerr;
    json_t *root = json_loadb(hdr, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return exo_err_set(err, EXO_EFORMAT, "%s: header is not valid JSON: %s (at byte %d)",
                           file, jerr.text, jerr.position);
    int rc = 0;
    range *ranges = NULL;
    size_t nr = 0;
    if (!json_is_object(root)) {
        rc = exo_err_set(err, EXO_EFORMAT, "%s: header is not a JSON object", file);
        goto out;
    }
    ranges = exo_malloc((json_object_size(root) + 1) * sizeof *ranges);
    const char *name;
    json_t *v;
    json_object_foreach(root, name, v)
    {
        if (!strcmp(name, "__metadata__")) {
            if ((rc = check_metadata(file, v, err)))
                goto out;
            sf->meta = json_incref(v);
            continue;
        }
        if (!json_is_object(v)) {
            rc = exo_err_set(err, EXO_EFORMAT, "%s: tensor '%.200s': entry is not an object",
                             file, name);
            goto out;
        }
        exo_st_tensor t;
        memset(&t, 0, sizeof t);
        size_t nelem = 0, nbytes = 0, begin = 0, end = 0;
        if ((rc = parse_dtype(file, name, json_object_get(v, "dtype"), &t.dtype, err)) ||
            (rc = parse_shape(file, name, json_object_get(v, "shape"), &t, &nelem, err)) ||
            (rc = parse_offsets(file, name, json_object_get(v, "data_offsets"), data_len, &begin,
                                &end, err)))
            goto out;
        if (exo_size_mul(nelem, exo_dtype_size(t.dtype), &nbytes)) {
            rc = exo_err_set(err, EXO_EFORMAT, "%s: tensor '%.200s': byte size overflows", file,
                             name);
            goto out;
        }
        if (nbytes != end - begin) {
            rc = exo_err_set(err, EXO_EFORMAT,
                             "%s: tensor '%.200s': data_offsets span %zu bytes but shape and "
                             "dtype %s need %zu",
                             file, name, end - begin, exo_dtype_name(t.dtype), nbytes);
            goto out;
        }
        if (exo_st_find(st, name)) {
            const exo_st_tensor *o = exo_st_find(st, name);
            rc = exo_err_set(err, EXO_EFORMAT, "%s: tensor '%.200s': duplicate name (also in %s)",
                             file, name, o->file);
            goto out;
        }
        if (st->n >= UINT32_MAX - 1) {
            rc = exo_err_set(err, EXO_ETOOBIG, "%s: too many tensors", file);
            goto out;
        }
        t.name = exo_strdup(name);
        t.data = data + begin;
        t.nbytes = nbytes;
        t.file = sf->path;
        if (st->n == st->cap) {
            st->cap = st->cap ? st->cap * 2 : 64;
            st->tensors = exo_realloc(st->tensors, st->cap * sizeof *st->tensors);
        }
        ranges[nr++] = (range){begin, end, st->n};
        st->tensors[st->n++] = t;
        if (st->n * 2 > st->nslots)
            hash_grow(st);
        else
            hash_insert_index(st, (uint32_t)(st->n - 1));
    }

    /* Overlap check, and put this file's tensors in offset order. */
    qsort(ranges, nr, sizeof *ranges, cmp_range);
    size_t prev_end = 0;
    const char *prev_name = NULL;
    for (size_t i = 0; i < nr; i++) {
        if (ranges[i].begin == ranges[i].end)
            continue; /* empty tensors occupy nothing */
        if (prev_name && ranges[i].begin < prev_end) {
            rc = exo_err_set(err, EXO_EFORMAT,
                             "%s: tensor '%.200s': data overlaps tensor '%.200s'", file,
                             st->tensors[ranges[i].idx].name, prev_name);
            goto out;
        }
        prev_end = ranges[i].end;
        prev_name = st->tensors[ranges[i].idx].name;
    }
    if (nr) {
        size_t first = st->n - nr;
        exo_st_tensor *tmp = exo_malloc(nr * sizeof *tmp);
        for (size_t i = 0; i < nr; i++)
            tmp[i] = st->tensors[ranges[i].idx];
        memcpy(st->tensors + first, tmp, nr * sizeof *tmp);
        exo_free(tmp);
        memset(st->slots, 0, st->nslots * sizeof *st->slots);
        for (size_t i = 0; i < st->n; i++)
            hash_insert_index(st, (uint32_t)i);
    }
out:
    exo_free(ranges);
    json_decref(root);
    return rc;
}

static size_t add_file(exo_st *st, const char *path)
{
    if (st->nfiles == st->cap_files) {
        st->cap_files = st->cap_files ? st->cap_files * 2 : 4;
        st->files = exo_realloc(st->files, st->cap_files * sizeof *st->files);
    }
    st_file *sf = &st->files[st->nfiles];
    memset(sf, 0, sizeof *sf);
    sf->path = exo_strdup(path);
    return st->nfiles++;
}

static int map_file(exo_st *st, const char *path, exo_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return exo_err_set(err, errno == ENOENT ? EXO_ENOENT : EXO_EIO, "%s: %s", path,
                           strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return exo_err_set(err, EXO_EIO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return exo_err_set(err, EXO_EIO, "%s: not a regular file", path);
    }
    size_t fi = add_file(st, path);
    st_file *sf = &st->files[fi];
    sf->size = (size_t)sb.st_size;
    if (sf->size >= 8) {
        void *p = mmap(NULL, sf->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            sf->size = 0;
            return exo_err_set(err, e == ENOMEM ? EXO_ENOMEM : EXO_EIO, "%s: mmap: %s", path,
                               strerror(e));
        }
        sf->base = p;
        sf->mapped = true;
    } else {
        sf->base = (const uint8_t *)"";
    }
    close(fd);
    return parse_file(st, fi, err);
}

int exo_st_open_memory(const void *data, size_t len, const char *name, exo_st **out,
                       exo_err *err)
{
    *out = NULL;
    if (!data && len)
        return exo_err_set(err, EXO_EINVAL, "%s: NULL buffer", name ? name : "<memory>");
    exo_st *st = exo_calloc(1, sizeof *st);
    size_t fi = add_file(st, name ? name : "<memory>");
    st->files[fi].base = data ? data : (const void *)"";
    st->files[fi].size = len;
    int rc = parse_file(st, fi, err);
    if (rc) {
        exo_st_close(st);
        return rc;
    }
    *out = st;
    return 0;
}

/* ------------------------------------------------------------------ */
/* directories                                                         */

static char *path_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    while (a > 1 && dir[a - 1] == '/')
        a--;
    char *p = exo_malloc(a + 1 + b + 1);
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static bool is_regular(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static bool safe_relpath(const char *s)
{
    if (!*s || s[0] == '/')
        return false;
    for (const char *p = s; *p;) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        if (n == 0 || (n == 2 && p[0] == '.' && p[1] == '.'))
            return false;
        p += n + (slash ? 1 : 0);
    }
    return true;
}

static int open_index(exo_st *st, const char *dir, const char *index_path, exo_st_keep_fn keep,
                      void *keep_ctx, exo_err *err)
{
    json_error_t jerr;
    json_t *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return exo_err_set(err, EXO_EFORMAT, "%s: not valid JSON: %s (line %d)", index_path,
                           jerr.text, jerr.line);
    int rc = 0;
    const char **files = NULL;
    size_t nfiles = 0;
    json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(wm)) {
        rc = exo_err_set(err, EXO_EFORMAT, "%s: missing \"weight_map\" object", index_path);
        goto out;
    }
    files = exo_malloc((json_object_size(wm) + 1) * sizeof *files);
    const char *name;
    json_t *v;
    json_object_foreach(wm, name, v)
    {
        if (!json_is_string(v) || !safe_relpath(json_string_value(v))) {
            rc = exo_err_set(err, EXO_EFORMAT,
                             "%s: weight_map entry for tensor '%.200s' is not a relative file "
                             "name",
                             index_path, name);
            goto out;
        }
        if (!keep || keep(keep_ctx, name))
            files[nfiles++] = json_string_value(v);
    }
    if (!nfiles) {
        rc = exo_err_set(err, EXO_EFORMAT, "%s: \"weight_map\" %s", index_path,
                         json_object_size(wm) ? "lists none of the tensors wanted" : "is empty");
        goto out;
    }
    qsort(files, nfiles, sizeof *files, cmp_str);
    for (size_t i = 0; i < nfiles; i++) {
        if (i && !strcmp(files[i], files[i - 1]))
            continue;
        char *p = path_join(dir, files[i]);
        rc = map_file(st, p, err);
        exo_free(p);
        if (rc) {
            exo_err_wrap(err, "%s", index_path);
            goto out;
        }
    }
    json_object_foreach(wm, name, v)
    {
        if (keep && !keep(keep_ctx, name))
            continue;
        const exo_st_tensor *t = exo_st_find(st, name);
        char *p = path_join(dir, json_string_value(v));
        bool ok = t && !strcmp(t->file, p);
        exo_free(p);
        if (!ok) {
            rc = exo_err_set(err, EXO_EFORMAT,
                             "%s: tensor '%.200s' is listed in %s but %s", index_path, name,
                             json_string_value(v), t ? "found in another file" : "is not there");
            goto out;
        }
    }
out:
    exo_free(files);
    json_decref(root);
    return rc;
}

static bool has_suffix(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static int open_glob(exo_st *st, const char *dir, exo_err *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return exo_err_set(err, EXO_EIO, "%s: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.' || !has_suffix(de->d_name, ".safetensors"))
            continue;
        char *p = path_join(dir, de->d_name);
        if (!is_regular(p)) {
            exo_free(p);
            continue;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            names = exo_realloc(names, cap * sizeof *names);
        }
        names[n++] = p;
    }
    closedir(d);
    int rc = 0;
    if (!n)
        rc = exo_err_set(err, EXO_ENOENT, "%s: no .safetensors files in directory", dir);
    if (n)
        qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n && !rc; i++)
        rc = map_file(st, names[i], err);
    for (size_t i = 0; i < n; i++)
        exo_free(names[i]);
    exo_free(names);
    return rc;
}

int exo_st_open(const char *path, exo_st **out, exo_err *err)
{
    return exo_st_open_filtered(path, NULL, NULL, out, err);
}

int exo_st_open_filtered(const char *path, exo_st_keep_fn keep, void *keep_ctx, exo_st **out,
                         exo_err *err)
{
    *out = NULL;
    struct stat sb;
    if (!path || stat(path, &sb) != 0)
        return exo_err_set(err, errno == ENOENT || !path ? EXO_ENOENT : EXO_EIO, "%s: %s",
                           path ? path : "(null)", path ? strerror(errno) : "no path");
    exo_st *st = exo_calloc(1, sizeof *st);
    int rc;
    if (S_ISDIR(sb.st_mode)) {
        char *index = path_join(path, "model.safetensors.index.json");
        char *single = path_join(path, "model.safetensors");
        if (is_regular(index))
            rc = open_index(st, path, index, keep, keep_ctx, err);
        else if (is_regular(single))
            rc = map_file(st, single, err);
        else
            rc = open_glob(st, path, err);
        exo_free(index);
        exo_free(single);
    } else {
        rc = map_file(st, path, err);
    }
    if (rc) {
        exo_st_close(st);
        return rc;
    }
    *out = st;
    return 0;
}

/* ------------------------------------------------------------------ */
/* writer                                                              */

typedef struct st_entry {
    char       *name;
    exo_dtype   dtype;
    int         ndim;
    int64_t     shape[EXO_ST_MAX_DIMS];
    const void *data;
    size_t      nbytes;
    void       *owned;
    exo_st_fill_fn fill; /* deferred: produces the bytes at write time */
    void       *fill_ctx;
} st_entry;

struct exo_st_writer {
    st_entry *e;
    size_t    n, cap;
    char    **meta_k, **meta_v;
    size_t    nmeta;
};

exo_st_writer *exo_st_writer_new(void) { return exo_calloc(1, sizeof(exo_st_writer)); }

void exo_st_writer_free(exo_st_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n; i++) {
        exo_free(w->e[i].name);
        exo_free(w->e[i].owned);
    }
    for (size_t i = 0; i < w->nmeta; i++) {
        exo_free(w->meta_k[i]);
        exo_free(w->meta_v[i]);
    }
    exo_free(w->meta_k);
    exo_free(w->meta_v);
    exo_free(w->e);
    exo_free(w);
}

size_t exo_st_writer_count(const exo_st_writer *w) { return w ? w->n : 0; }

void exo_st_writer_set_metadata(exo_st_writer *w, const char *key, const char *value)
{
    for (size_t i = 0; i < w->nmeta; i++) {
        if (!strcmp(w->meta_k[i], key)) {
            exo_free(w->meta_v[i]);
            w->meta_v[i] = exo_strdup(value);
            return;
        }
    }
    w->meta_k = exo_realloc(w->meta_k, (w->nmeta + 1) * sizeof *w->meta_k);
    w->meta_v = exo_realloc(w->meta_v, (w->nmeta + 1) * sizeof *w->meta_v);
    w->meta_k[w->nmeta] = exo_strdup(key);
    w->meta_v[w->nmeta] = exo_strdup(value);
    w->nmeta++;
}

/* Marks an entry whose bytes come from a fill callback. */
static const char deferred_mark;
#define DEFERRED ((const void *)&deferred_mark)

static int writer_add(exo_st_writer *w, const char *name, exo_dtype dtype, int ndim,
                      const int64_t *shape, const void *data, size_t nbytes, void *owned,
                      exo_err *err)
{
    int rc = 0;
    size_t count = 1, need;
    if (!name || !strcmp(name, "__metadata__")) {
        rc = exo_err_set(err, EXO_EINVAL, "safetensors writer: invalid tensor name '%s'",
                         name ? name : "(null)");
        goto fail;
    }
    if ((unsigned)dtype >= EXO_DTYPE_COUNT || ndim < 0 || ndim > EXO_ST_MAX_DIMS ||
        (ndim && !shape)) {
        rc = exo_err_set(err, EXO_EINVAL, "safetensors writer: tensor '%.200s': bad dtype or rank",
                         name);
        goto fail;
    }
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || exo_size_mul(count, (size_t)shape[i], &count)) {
            rc = exo_err_set(err, EXO_EINVAL, "safetensors writer: tensor '%.200s': bad shape",
                             name);
            goto fail;
        }
    }
    if (exo_size_mul(count, exo_dtype_size(dtype), &need) || need != nbytes ||
        (nbytes && !data && data != DEFERRED)) {
        rc = exo_err_set(err, EXO_EINVAL,
                         "safetensors writer: tensor '%.200s': %zu bytes given, shape needs %zu",
                         name, nbytes, need);
        goto fail;
    }
    for (size_t i = 0; i < w->n; i++) {
        if (!strcmp(w->e[i].name, name)) {
            rc = exo_err_set(err, EXO_EINVAL, "safetensors writer: duplicate tensor '%.200s'",
                             name);
            goto fail;
        }
    }
    if (w->n == w->cap) {
        w->cap = w->cap ? w->cap * 2 : 32;
        w->e = exo_realloc(w->e, w->cap * sizeof *w->e);
    }
    st_entry *e = &w->e[w->n++];
    memset(e, 0, sizeof *e);
    e->name = exo_strdup(name);
    e->dtype = dtype;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        e->shape[i] = shape[i];
    e->data = data;
    e->nbytes = nbytes;
    e->owned = owned;
    return 0;
fail:
    exo_free(owned);
    return rc;
}

int exo_st_writer_add(exo_st_writer *w, const char *name, exo_dtype dtype, int ndim,
                      const int64_t *shape, const void *data, size_t nbytes, exo_err *err)
{
    return writer_add(w, name, dtype, ndim, shape, data, nbytes, NULL, err);
}

int exo_st_writer_add_deferred(exo_st_writer *w, const char *name, exo_dtype dtype, int ndim,
                               const int64_t *shape, size_t nbytes, exo_st_fill_fn fill,
                               void *ctx, exo_err *err)
{
    if (!fill)
        return exo_err_set(err, EXO_EINVAL, "safetensors writer: tensor '%.200s': no fill function",
                           name ? name : "(null)");
    int rc = writer_add(w, name, dtype, ndim, shape, DEFERRED, nbytes, NULL, err);
    if (rc == 0) {
        w->e[w->n - 1].fill = fill;
        w->e[w->n - 1].fill_ctx = ctx;
    }
    return rc;
}

int exo_st_writer_add_copy(exo_st_writer *w, const char *name, exo_dtype dtype, int ndim,
                           const int64_t *shape, const void *data, size_t nbytes, exo_err *err)
{
    void *copy = exo_try_malloc(nbytes);
    if (!copy)
        return exo_err_set(err, EXO_ENOMEM, "safetensors writer: tensor '%.200s': %zu bytes",
                           name ? name : "(null)", nbytes);
    if (nbytes)
        memcpy(copy, data, nbytes);
    return writer_add(w, name, dtype, ndim, shape, copy, nbytes, copy, err);
}

int exo_st_writer_add_owned(exo_st_writer *w, const char *name, exo_dtype dtype, int ndim,
                            const int64_t *shape, void *data, size_t nbytes, exo_err *err)
{
    return writer_add(w, name, dtype, ndim, shape, data, nbytes, data, err);
}

/* Position of each dtype in the reference library's Dtype enum; tensors are
 * laid out in descending order of it (widest first), then by name. */
static int dtype_rank(exo_dtype t)
{
    switch (t) {
    case EXO_DTYPE_BOOL: return 0;
    case EXO_DTYPE_U8: return 4;
    case EXO_DTYPE_I8: return 5;
    case EXO_DTYPE_I16: return 9;
    case EXO_DTYPE_U16: return 10;
    case EXO_DTYPE_F16: return 11;
    case EXO_DTYPE_BF16: return 12;
    case EXO_DTYPE_I32: return 13;
    case EXO_DTYPE_U32: return 14;
    case EXO_DTYPE_F32: return 15;
    case EXO_DTYPE_F64: return 17;
    case EXO_DTYPE_I64: return 18;
    case EXO_DTYPE_U64: return 19;
    default: return -1;
    }
}

static int cmp_entry(const void *a, const void *b)
{
    const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
    int rx = dtype_rank(x->dtype), ry = dtype_rank(y->dtype);
    if (rx != ry)
        return rx > ry ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        size_t chunk = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
        ssize_t k = write(fd, p, chunk);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static void fsync_parent(const char *path)
{
    const char *slash = strrchr(path, '/');
    char *dir = slash ? exo_strndup(path, slash == path ? 1 : (size_t)(slash - path))
                      : exo_strdup(".");
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd); /* best effort: some file systems refuse */
        close(fd);
    }
    exo_free(dir);
}

int exo_st_writer_write(exo_st_writer *w, const char *path, exo_err *err)
{
    int rc = 0, fd = -1;
    char *hdr = NULL, *tmp = NULL;
    const st_entry **order = exo_malloc((w->n + 1) * sizeof *order);
    for (size_t i = 0; i < w->n; i++)
        order[i] = &w->e[i];
    qsort(order, w->n, sizeof *order, cmp_entry);

    json_t *root = json_object();
    if (w->nmeta) {
        json_t *m = json_object();
        for (size_t i = 0; i < w->nmeta; i++) {
            json_t *s = json_string(w->meta_v[i]);
            if (!s || json_object_set_new(m, w->meta_k[i], s)) {
                json_decref(m);
                rc = exo_err_set(err, EXO_EINVAL, "%s: metadata '%.200s' is not valid UTF-8",
                                 path, w->meta_k[i]);
                goto out;
            }
        }
        json_object_set_new(root, "__metadata__", m);
    }
    size_t off = 0;
    for (size_t i = 0; i < w->n; i++) {
        const st_entry *e = order[i];
        json_t *t = json_object(), *shape = json_array();
        json_object_set_new(t, "dtype", json_string(exo_dtype_name(e->dtype)));
        for (int d = 0; d < e->ndim; d++)
            json_array_append_new(shape, json_integer(e->shape[d]));
        json_object_set_new(t, "shape", shape);
        json_t *offs = json_array();
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_array_append_new(offs, json_integer((json_int_t)(off + e->nbytes)));
        json_object_set_new(t, "data_offsets", offs);
        off += e->nbytes;
        if (json_object_set_new(root, e->name, t)) {
            rc = exo_err_set(err, EXO_EINVAL, "%s: tensor name '%.200s' is not valid UTF-8",
                             path, e->name);
            goto out;
        }
    }
    hdr = exo_json_dumps(root, JSON_COMPACT);
    if (!hdr) {
        rc = exo_err_set(err, EXO_ENOMEM, "%s: cannot serialise header", path);
        goto out;
    }
    size_t hlen = strlen(hdr), padded = (hlen + 7) & ~(size_t)7;
    uint8_t lenbuf[8];
    for (int i = 0; i < 8; i++)
        lenbuf[i] = (uint8_t)((uint64_t)padded >> (8 * i));

    size_t plen = strlen(path);
    tmp = exo_malloc(plen + 5);
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = exo_err_set(err, EXO_EIO, "%s: %s", tmp, strerror(errno));
        goto out;
    }
    static const char spaces[8] = "        ";
    bool ok = !write_all(fd, lenbuf, 8) && !write_all(fd, hdr, hlen) &&
              !write_all(fd, spaces, padded - hlen);
    for (size_t i = 0; ok && i < w->n; i++) {
        const st_entry *e = order[i];
        if (!e->fill) {
            ok = !write_all(fd, e->data, e->nbytes);
            continue;
        }
        void *buf = exo_try_malloc(e->nbytes);
        if (!buf) {
            rc = exo_err_set(err, EXO_ENOMEM, "%s: tensor '%.200s': cannot allocate %zu bytes",
                             path, e->name, e->nbytes);
            goto out;
        }
        rc = e->fill(e->fill_ctx, e->name, buf, e->nbytes, err);
        if (rc) {
            exo_free(buf);
            if (rc > 0)
                rc = exo_err_set(err, EXO_EINTERNAL, "tensor '%.200s': fill returned %d",
                                 e->name, rc);
            exo_err_wrap(err, "%s", path);
            goto out;
        }
        ok = !write_all(fd, buf, e->nbytes);
        exo_free(buf);
    }
    if (!ok || fsync(fd) != 0) {
        rc = exo_err_set(err, EXO_EIO, "%s: write: %s", tmp, strerror(errno));
        goto out;
    }
    if (close(fd) != 0) {
        fd = -1;
        rc = exo_err_set(err, EXO_EIO, "%s: close: %s", tmp, strerror(errno));
        goto out;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        rc = exo_err_set(err, EXO_EIO, "%s: rename to %s: %s", tmp, path, strerror(errno));
        goto out;
    }
    fsync_parent(path);
out:
    if (fd >= 0)
        close(fd);
    if (rc && tmp)
        unlink(tmp);
    exo_free(hdr);
    exo_free(tmp);
    json_decref(root);
    exo_free(order);
    return rc;
}
