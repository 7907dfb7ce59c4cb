/* Model downloads (see downloader.h).
 *
 * One thread per download runs the steps; up to `parallel` fetch threads
 * take files from a shared cursor (largest first, so the long transfers
 * start early and the small ones fill in). Progress lives in one struct
 * under a mutex: the fetch threads add byte deltas to it, readers copy it.
 * The file list is kept in the model dir's metadata file so that a
 * download resumed after a crash, or a look at the disk offline, knows
 * what "all the files" means without asking the hub again. */
#include "download/downloader.h"

#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"
#include "download/model_store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define INDEX_FILE "model.safetensors.index.json"
#define SMALL_FILE_MAX ((size_t)64 << 20)

struct exo_download {
    exo_download_opts opts;
    exo_models_dir   *dirs; /* copies: the caller's may go away */
    char              model_id[256];
    exo_layer_shard   shard;
    pthread_t         thread;
    pthread_mutex_t   mu;
    exo_download_progress p;
    uint64_t          session_start_ns;
    volatile int      cancel;
    /* the fetch phase */
    exo_hub_file_list files;
    bool             *wanted;
    size_t           *order, next, n_order;
    exo_err           first_err;
};

static bool is_weight(const char *path)
{
    size_t n = strlen(path);
    return n > 12 && !strcmp(path + n - 12, ".safetensors");
}

static bool ignored(const char *path)
{
    size_t n = strlen(path);
    return !strncmp(path, "original/", 9) || !strncmp(path, "metal/", 6) || !strcmp(path, EXO_DOWNLOAD_META) ||
           (n >= 8 && !strcmp(path + n - 8, ".partial"));
}

/* total < 0: "as many as config.json says" (exo download --layers) */
static bool whole(const exo_layer_shard *s)
{
    return !s || s->total == 0 || (s->first <= 0 && s->total > 0 && s->last >= s->total);
}

/* dir/name into out; false (out empty) if it does not fit. */
static bool join(char *out, size_t cap, const char *dir, const char *name)
{
    int n = snprintf(out, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap) {
        out[0] = 0;
        return false;
    }
    return true;
}

/* ---- metadata ------------------------------------------------------------------ */

static int write_meta(const char *dir, const char *model_id, const exo_hub_file_list *l, bool complete, exo_err *err)
{
    json_t *files = json_array();
    for (size_t i = 0; i < l->n; i++) {
        json_t *f = json_pack("{s:s, s:I}", "path", l->v[i].path, "size", (json_int_t)l->v[i].size);
        if (l->v[i].sha256[0])
            json_object_set_new(f, "sha256", json_string(l->v[i].sha256));
        if (l->v[i].git_oid[0])
            json_object_set_new(f, "git_oid", json_string(l->v[i].git_oid));
        json_array_append_new(files, f);
    }
    json_t *root = json_pack("{s:s, s:b, s:o}", "model_id", model_id, "complete", complete, "files", files);
    char path[4200], tmp[4300];
    join(path, sizeof path, dir, EXO_DOWNLOAD_META);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int rc = json_dump_file(root, tmp, JSON_COMPACT);
    json_decref(root);
    if (rc || rename(tmp, path)) {
        unlink(tmp);
        return exo_err_set(err, errno == ENOSPC ? EXO_ENOSPC : EXO_EIO, "%s: cannot write: %s", path,
                           strerror(errno));
    }
    return 0;
}

/* The file list a model dir's metadata holds; 1 if there is none (a dir
 * put there by hand), 0 if read (complete set), -1 if unreadable. */
static int read_meta(const char *dir, exo_hub_file_list *out, bool *complete)
{
    memset(out, 0, sizeof *out);
    char path[4200];
    join(path, sizeof path, dir, EXO_DOWNLOAD_META);
    if (access(path, F_OK))
        return 1;
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    json_t *files = json_object_get(root, "files");
    if (!root || !json_is_array(files)) {
        json_decref(root);
        return -1;
    }
    *complete = json_is_true(json_object_get(root, "complete"));
    size_t n = json_array_size(files);
    out->v = n ? exo_calloc(n, sizeof *out->v) : NULL;
    for (size_t i = 0; i < n; i++) {
        json_t *f = json_array_get(files, i);
        const char *p = json_string_value(json_object_get(f, "path"));
        json_t *size = json_object_get(f, "size");
        if (!p || !exo_hub_path_safe(p) || !json_is_integer(size))
            continue;
        exo_hub_file *h = &out->v[out->n++];
        h->path = exo_strdup(p);
        h->size = json_integer_value(size);
        const char *sha = json_string_value(json_object_get(f, "sha256"));
        const char *oid = json_string_value(json_object_get(f, "git_oid"));
        if (sha && strlen(sha) == 64)
            memcpy(h->sha256, sha, 65);
        if (oid && strlen(oid) == 40)
            memcpy(h->git_oid, oid, 41);
    }
    json_decref(root);
    return 0;
}

static char *read_small(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n + 65536 + 1 > cap) {
            cap = (n + 65536 + 1) * 2;
            if (cap > SMALL_FILE_MAX + 65536 + 1)
                break;
            buf = exo_realloc(buf, cap);
        }
        size_t r = fread(buf + n, 1, 65536, f);
        n += r;
        if (r < 65536)
            break;
    }
    bool ok = feof(f) && !ferror(f) && n <= SMALL_FILE_MAX;
    fclose(f);
    if (!ok) {
        exo_free(buf);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

/* ---- which files ---------------------------------------------------------------- */

int exo_download_shard_files(const char *index_json, size_t len, const exo_layer_shard *shard,
                             const char *const *names, size_t n_names, bool *needed, exo_err *err)
{
    for (size_t i = 0; i < n_names; i++)
        needed[i] = false;
    json_error_t je;
    json_t *root = json_loadb(index_json, len, 0, &je);
    json_t *map = json_object_get(root, "weight_map");
    if (!root || !json_is_object(map)) {
        json_decref(root);
        return exo_err_set(err, EXO_EFORMAT, INDEX_FILE ": %s", root ? "no weight_map object" : je.text);
    }
    const char *tensor;
    json_t *file;
    int rc = 0;
    json_object_foreach(map, tensor, file) {
        const char *fname = json_string_value(file);
        if (!fname) {
            rc = exo_err_set(err, EXO_EFORMAT, INDEX_FILE ": weight_map[%s] is not a string", tensor);
            break;
        }
        if (!exo_layer_shard_needs(shard, tensor))
            continue;
        for (size_t i = 0; i < n_names; i++)
            if (!strcmp(names[i], fname))
                needed[i] = true;
    }
    json_decref(root);
    return rc;
}

/* config.json's tie_word_embeddings and layer count (top level or text_config). */
static void config_facts(const char *dir, bool *tied, int *n_layers)
{
    char path[4200];
    join(path, sizeof path, dir, "config.json");
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je), *text = json_object_get(root, "text_config");
    json_t *v = json_object_get(root, "tie_word_embeddings");
    if (!v)
        v = json_object_get(text, "tie_word_embeddings");
    *tied = json_is_true(v);
    json_t *n = json_object_get(text, "num_hidden_layers");
    if (!json_is_integer(n))
        n = json_object_get(root, "num_hidden_layers");
    *n_layers = json_is_integer(n) && json_integer_value(n) > 0 && json_integer_value(n) < 100000
                    ? (int)json_integer_value(n) : 0;
    json_decref(root);
}

/* Marks in wanted[] the files of l that the shard needs: every non-weight
 * file, and the weight files through the index (all of them without one).
 * The index and config.json must be on disk in dir already. */
static int select_files(const char *dir, const exo_hub_file_list *l, const exo_layer_shard *shard_in, bool *wanted,
                        exo_err *err)
{
    bool has_index = false;
    for (size_t i = 0; i < l->n; i++) {
        wanted[i] = !ignored(l->v[i].path);
        has_index |= !strcmp(l->v[i].path, INDEX_FILE);
    }
    if (whole(shard_in) || !has_index)
        return 0;
    exo_layer_shard shard = *shard_in;
    int n_layers;
    config_facts(dir, &shard.tied, &n_layers);
    if (shard.total < 0)
        shard.total = n_layers;
    if (shard.last > shard.total)
        return exo_err_set(err, EXO_EINVAL, "layers %d:%d: the model has %d layers", shard.first, shard.last,
                           shard.total);
    char path[4200];
    join(path, sizeof path, dir, INDEX_FILE);
    size_t len;
    char *idx = read_small(path, &len);
    if (!idx)
        return exo_err_set(err, EXO_EIO, "%s: cannot read", path);
    const char **names = exo_calloc(l->n, sizeof *names);
    bool *needed = exo_calloc(l->n, sizeof *needed);
    for (size_t i = 0; i < l->n; i++)
        names[i] = l->v[i].path;
    int rc = exo_download_shard_files(idx, len, &shard, names, l->n, needed, err);
    for (size_t i = 0; !rc && i < l->n; i++)
        if (is_weight(l->v[i].path))
            wanted[i] = needed[i];
    exo_free(names);
    exo_free(needed);
    exo_free(idx);
    return rc;
}

static int64_t file_size(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode) ? (int64_t)sb.st_size : -1;
}

/* ---- on disk ---------------------------------------------------------------------- */

/* Whether dir holds what the shard needs. */
static bool dir_satisfies(const char *dir, const exo_layer_shard *shard)
{
    exo_hub_file_list l;
    bool complete = false;
    int m = read_meta(dir, &l, &complete);
    if (m < 0)
        return false;
    if (m == 1) { /* put there by hand: the model store's rule */
        char cfg[4200];
        join(cfg, sizeof cfg, dir, "config.json");
        if (file_size(cfg) < 0)
            return false;
        DIR *d = opendir(dir);
        bool weights = false;
        for (struct dirent *e; d && (e = readdir(d));)
            weights |= is_weight(e->d_name);
        if (d)
            closedir(d);
        return weights;
    }
    bool *wanted = l.n ? exo_calloc(l.n, sizeof *wanted) : NULL;
    exo_err err;
    /* complete or not, the files must still be there: a file deleted or
     * cut short since is fetched again */
    bool ok = complete || select_files(dir, &l, shard, wanted, &err) == 0;
    for (size_t i = 0; complete && i < l.n; i++)
        wanted[i] = !ignored(l.v[i].path);
    for (size_t i = 0; ok && i < l.n; i++) {
        if (!wanted[i])
            continue;
        char p[4200];
        join(p, sizeof p, dir, l.v[i].path);
        ok = file_size(p) == l.v[i].size;
    }
    exo_free(wanted);
    exo_hub_file_list_free(&l);
    return ok;
}

int exo_download_locate(const exo_models_dir *dirs, int n_dirs, const char *model_id, const exo_layer_shard *shard,
                        char *dir, size_t cap, bool *read_only)
{
    char name[300];
    if (!exo_model_dir_name(model_id, name, sizeof name))
        return EXO_EINVAL;
    for (int i = 0; i < n_dirs; i++) {
        char p[4200];
        join(p, sizeof p, dirs[i].path, name);
        if (dir_satisfies(p, shard)) {
            if (snprintf(dir, cap, "%s", p) >= (int)cap)
                continue;
            if (read_only)
                *read_only = dirs[i].read_only;
            return 0;
        }
    }
    return EXO_ENOENT;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(path);
}

int exo_download_delete(const exo_models_dir *dirs, int n_dirs, const char *model_id, exo_err *err)
{
    char name[300];
    if (!exo_model_dir_name(model_id, name, sizeof name))
        return exo_err_set(err, EXO_EINVAL, "'%s' is not a model id (org/name)", model_id);
    bool found = false, read_only = false;
    for (int i = 0; i < n_dirs; i++) {
        char p[4200];
        join(p, sizeof p, dirs[i].path, name);
        struct stat sb;
        if (lstat(p, &sb) || !S_ISDIR(sb.st_mode))
            continue;
        if (dirs[i].read_only) {
            read_only = true;
            continue;
        }
        found = true;
        /* FTW_PHYS: a symlink inside is removed, never followed */
        if (nftw(p, rm_entry, 16, FTW_DEPTH | FTW_PHYS))
            return exo_err_set(err, EXO_EIO, "deleting %s: %s", p, strerror(errno));
        EXO_LOG_INFO("download: deleted %s", p);
    }
    if (found)
        return 0;
    if (read_only)
        return exo_err_set(err, EXO_EPERM, "%s is in a read-only models directory: not deleted", model_id);
    return exo_err_set(err, EXO_ENOENT, "%s is not on disk", model_id);
}

int exo_download_card(const exo_hub_opts *hub, const char *model_id, exo_model_entry *out, exo_err *err)
{
    memset(out, 0, sizeof *out);
    char name[300];
    if (!exo_model_dir_name(model_id, name, sizeof name))
        return exo_err_set(err, EXO_EINVAL, "'%s' is not a model id (org/name)", model_id);
    char *body;
    size_t len;
    int rc = exo_hub_get_file(hub, model_id, "config.json", 4u << 20, &body, &len, err);
    if (rc)
        return rc;
    json_error_t je;
    json_t *cfg = json_loadb(body, len, 0, &je);
    exo_free(body);
    if (!json_is_object(cfg)) {
        json_decref(cfg);
        return exo_err_set(err, EXO_EFORMAT, "%s: config.json is not a JSON object", model_id);
    }
    snprintf(out->id, sizeof out->id, "%s", model_id);
    exo_model_entry_from_config(cfg, out);
    json_decref(cfg);
    if (out->n_layers <= 0)
        return exo_err_set(err, EXO_EINVAL, "%s: config.json gives no layer count: not a model exo can run", model_id);
    exo_hub_file_list l;
    if ((rc = exo_hub_list_files(hub, model_id, &l, err)))
        return rc;
    for (size_t i = 0; i < l.n; i++)
        if (is_weight(l.v[i].path) && !ignored(l.v[i].path))
            out->storage_bytes += l.v[i].size;
    exo_hub_file_list_free(&l);
    if (!out->storage_bytes)
        return exo_err_set(err, EXO_EUNSUPPORTED, "%s has no .safetensors weights", model_id);
    return 0;
}

/* ---- the download thread ------------------------------------------------------------ */

static void set_phase(exo_download *d, exo_download_phase ph, const exo_err *err)
{
    pthread_mutex_lock(&d->mu);
    d->p.phase = ph;
    if (err)
        d->p.err = *err;
    pthread_mutex_unlock(&d->mu);
    if (d->opts.on_change)
        d->opts.on_change(d->opts.ctx);
}

static bool on_bytes(void *ctx, int64_t delta)
{
    exo_download *d = ctx;
    if (delta) {
        pthread_mutex_lock(&d->mu);
        d->p.downloaded += delta;
        d->p.downloaded_this_session += delta;
        pthread_mutex_unlock(&d->mu);
    }
    return !__atomic_load_n(&d->cancel, __ATOMIC_RELAXED);
}

static void *fetch_worker(void *arg)
{
    exo_download *d = arg;
    for (;;) {
        pthread_mutex_lock(&d->mu);
        bool stop = d->next >= d->n_order || d->first_err.code;
        size_t i = stop ? 0 : d->order[d->next++];
        pthread_mutex_unlock(&d->mu);
        if (stop)
            return NULL;
        const exo_hub_file *f = &d->files.v[i];
        char dest[4200];
        join(dest, sizeof dest, d->p.dir, f->path);
        exo_err err = {0};
        int rc = exo_hub_fetch(&d->opts.hub, d->model_id, f, dest, on_bytes, d, &err);
        pthread_mutex_lock(&d->mu);
        if (rc && !d->first_err.code)
            d->first_err = err;
        if (!rc)
            d->p.completed_files++;
        pthread_mutex_unlock(&d->mu);
    }
}

/* Fetches the files marked in d->wanted that are not on disk. */
static int fetch_all(exo_download *d, bool count_only, exo_err *err)
{
    exo_free(d->order);
    d->order = exo_calloc(d->files.n ? d->files.n : 1, sizeof *d->order);
    d->n_order = d->next = 0;
    int64_t total = 0, have = 0;
    int32_t n_total = 0, n_done = 0;
    for (size_t i = 0; i < d->files.n; i++) {
        if (!d->wanted[i])
            continue;
        const exo_hub_file *f = &d->files.v[i];
        char p[4200];
        join(p, sizeof p, d->p.dir, f->path);
        total += f->size;
        n_total++;
        if (file_size(p) == f->size) {
            have += f->size;
            n_done++;
            continue;
        }
        char partial[4300];
        snprintf(partial, sizeof partial, "%s.partial", p);
        int64_t ps = file_size(partial);
        if (ps > 0 && ps <= f->size)
            have += ps;
        d->order[d->n_order++] = i;
    }
    /* largest first */
    for (size_t a = 1; a < d->n_order; a++)
        for (size_t b = a; b > 0 && d->files.v[d->order[b]].size > d->files.v[d->order[b - 1]].size; b--) {
            size_t t = d->order[b];
            d->order[b] = d->order[b - 1];
            d->order[b - 1] = t;
        }
    pthread_mutex_lock(&d->mu);
    d->p.total = total;
    d->p.downloaded = have;
    d->p.total_files = n_total;
    d->p.completed_files = n_done;
    pthread_mutex_unlock(&d->mu);
    if (count_only || !d->n_order)
        return 0;

    struct statvfs vfs;
    int64_t missing = total - have;
    if (statvfs(d->p.dir, &vfs) == 0) {
        int64_t avail = (int64_t)vfs.f_bavail * (int64_t)vfs.f_frsize;
        if (avail < missing)
            return exo_err_set(err, EXO_ENOSPC,
                               "not enough disk space for %s in %s: %lld MiB still to download, %lld MiB free",
                               d->model_id, d->p.dir, (long long)(missing >> 20), (long long)(avail >> 20));
    }
    int n_threads = d->opts.parallel > 0 ? d->opts.parallel : 8;
    if ((size_t)n_threads > d->n_order)
        n_threads = (int)d->n_order;
    pthread_t th[64];
    if (n_threads > 64)
        n_threads = 64;
    memset(&d->first_err, 0, sizeof d->first_err);
    int started = 0;
    for (; started < n_threads; started++)
        if (pthread_create(&th[started], NULL, fetch_worker, d))
            break;
    if (!started)
        fetch_worker(d);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    if (d->first_err.code) {
        *err = d->first_err;
        return err->code;
    }
    return 0;
}

static void mkdir_p(const char *path)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return;
    for (char *s = buf + 1;; s++) {
        if (*s == '/' || !*s) {
            char c = *s;
            *s = 0;
            mkdir(buf, 0755);
            if (!(*s = c))
                break;
        }
    }
}

/* The models dir to download into: one that already holds (part of) the
 * model, else the first writable one with room for `bytes`. */
static int choose_dir(exo_download *d, const char *name, int64_t bytes, char *out, size_t cap, exo_err *err)
{
    for (int i = 0; i < d->opts.n_dirs; i++) {
        char p[4200];
        join(p, sizeof p, d->dirs[i].path, name);
        struct stat sb;
        if (!d->dirs[i].read_only && !stat(p, &sb) && S_ISDIR(sb.st_mode)) {
            if (snprintf(out, cap, "%s", p) >= (int)cap)
                continue;
            return 0;
        }
    }
    int64_t best = -1;
    for (int i = 0; i < d->opts.n_dirs; i++) {
        if (d->dirs[i].read_only)
            continue;
        mkdir_p(d->dirs[i].path); /* a --models-dir that does not exist yet */
        struct statvfs vfs;
        int64_t avail = statvfs(d->dirs[i].path, &vfs) ? 0 : (int64_t)vfs.f_bavail * (int64_t)vfs.f_frsize;
        if (avail >= bytes || best < 0) {
            snprintf(out, cap, "%s/%s", d->dirs[i].path, name);
            best = avail;
            if (avail >= bytes)
                break;
        }
    }
    if (best < 0)
        return exo_err_set(err, EXO_EPERM, "no writable models directory to download %s into", d->model_id);
    if (mkdir(out, 0755) && errno != EEXIST)
        return exo_err_set(err, errno == ENOSPC ? EXO_ENOSPC : EXO_EIO, "mkdir %s: %s", out, strerror(errno));
    return 0;
}

static int run(exo_download *d, exo_err *err)
{
    char dir[4096];
    bool ro = false;
    if (!exo_download_locate(d->dirs, d->opts.n_dirs, d->model_id, &d->shard, dir, sizeof dir, &ro)) {
        pthread_mutex_lock(&d->mu);
        snprintf(d->p.dir, sizeof d->p.dir, "%s", dir);
        d->p.read_only = ro;
        pthread_mutex_unlock(&d->mu);
        exo_hub_file_list l;
        bool complete;
        if (read_meta(dir, &l, &complete) == 0) { /* sizes for the record */
            d->files = l;
            d->wanted = exo_calloc(l.n ? l.n : 1, sizeof *d->wanted);
            if (select_files(dir, &l, &d->shard, d->wanted, err) == 0)
                fetch_all(d, true, err);
        }
        return 0;
    }
    if (d->opts.hub.offline)
        return exo_err_set(err, EXO_ENOENT, "Model files not found locally in offline mode (%s)", d->model_id);
    int rc = exo_hub_list_files(&d->opts.hub, d->model_id, &d->files, err);
    if (rc)
        return rc;
    char name[300];
    exo_model_dir_name(d->model_id, name, sizeof name);
    int64_t all = 0;
    for (size_t i = 0; i < d->files.n; i++)
        all += d->files.v[i].size;
    if ((rc = choose_dir(d, name, all, dir, sizeof dir, err)))
        return rc;
    pthread_mutex_lock(&d->mu);
    snprintf(d->p.dir, sizeof d->p.dir, "%s", dir);
    pthread_mutex_unlock(&d->mu);
    if ((rc = write_meta(d->p.dir, d->model_id, &d->files, false, err)))
        return rc;
    set_phase(d, EXO_DOWNLOAD_ONGOING, NULL);
    d->session_start_ns = exo_clock_ns();
    /* the small files first: the index and config decide the weight files */
    d->wanted = exo_calloc(d->files.n ? d->files.n : 1, sizeof *d->wanted);
    for (size_t i = 0; i < d->files.n; i++)
        d->wanted[i] = !ignored(d->files.v[i].path) && !is_weight(d->files.v[i].path);
    if ((rc = fetch_all(d, false, err)))
        return rc;
    if ((rc = select_files(d->p.dir, &d->files, &d->shard, d->wanted, err)) || (rc = fetch_all(d, false, err)))
        return rc;
    /* complete when every file of the list is here (a whole model, or the
     * last of several shards' downloads into one dir) */
    bool complete = true;
    for (size_t i = 0; i < d->files.n && complete; i++) {
        char p[4200];
        join(p, sizeof p, d->p.dir, d->files.v[i].path);
        complete = ignored(d->files.v[i].path) || file_size(p) == d->files.v[i].size;
    }
    return write_meta(d->p.dir, d->model_id, &d->files, complete, err);
}

static void *download_thread(void *arg)
{
    exo_download *d = arg;
    exo_err err = {0};
    int rc = run(d, &err);
    if (rc && __atomic_load_n(&d->cancel, __ATOMIC_RELAXED))
        exo_err_set(&err, EXO_ECANCELED, "download of %s cancelled", d->model_id);
    if (rc)
        EXO_LOG_WARN("download: %s: %s", d->model_id, err.msg);
    else
        EXO_LOG_INFO("download: %s complete in %s", d->model_id, d->p.dir);
    set_phase(d, rc ? EXO_DOWNLOAD_FAILED : EXO_DOWNLOAD_COMPLETED, rc ? &err : NULL);
    return NULL;
}

exo_download *exo_download_start(const exo_download_opts *o, const char *model_id, const exo_layer_shard *shard)
{
    exo_download *d = exo_calloc(1, sizeof *d);
    d->opts = *o;
    d->dirs = exo_calloc(o->n_dirs ? (size_t)o->n_dirs : 1, sizeof *d->dirs);
    for (int i = 0; i < o->n_dirs; i++) {
        d->dirs[i].path = exo_strdup(o->dirs[i].path);
        d->dirs[i].read_only = o->dirs[i].read_only;
    }
    d->opts.dirs = d->dirs;
    d->opts.hub.cancel = &d->cancel;
    snprintf(d->model_id, sizeof d->model_id, "%s", model_id);
    if (shard && !whole(shard))
        d->shard = *shard;
    pthread_mutex_init(&d->mu, NULL);
    d->p.phase = EXO_DOWNLOAD_PENDING;
    if (pthread_create(&d->thread, NULL, download_thread, d)) {
        exo_err_set(&d->p.err, EXO_ENOMEM, "cannot start a download thread");
        d->p.phase = EXO_DOWNLOAD_FAILED;
        d->thread = 0;
    }
    return d;
}

void exo_download_get(exo_download *d, exo_download_progress *out)
{
    pthread_mutex_lock(&d->mu);
    *out = d->p;
    pthread_mutex_unlock(&d->mu);
    if (out->phase == EXO_DOWNLOAD_ONGOING && d->session_start_ns) {
        double secs = (double)(exo_clock_ns() - d->session_start_ns) / 1e9;
        out->speed = secs > 0.2 && out->downloaded_this_session > 0 ? out->downloaded_this_session / secs : 0;
        int64_t left = out->total - out->downloaded;
        out->eta_ms = out->speed > 0 && left > 0 ? (int64_t)(left / out->speed * 1000) : 0;
    }
}

void exo_download_cancel(exo_download *d) { __atomic_store_n(&d->cancel, 1, __ATOMIC_RELAXED); }

void exo_download_free(exo_download *d)
{
    if (!d)
        return;
    exo_download_cancel(d);
    if (d->thread)
        pthread_join(d->thread, NULL);
    for (int i = 0; i < d->opts.n_dirs; i++)
        exo_free(d->dirs[i].path);
    exo_free(d->dirs);
    exo_hub_file_list_free(&d->files);
    exo_free(d->wanted);
    exo_free(d->order);
    pthread_mutex_destroy(&d->mu);
    exo_free(d);
}
