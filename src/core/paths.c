/* Node paths and the pid-file lock (see paths.h).
 *
 * Resolution is built into a local exo_paths and moved to *out only when
 * everything succeeded, so a caller never sees half a result. Environment
 * values are taken as the XDG base-directory spec says: an empty or relative
 * XDG_DATA_HOME / XDG_CACHE_HOME is ignored (the default is used), and an
 * empty EXO_HOME counts as unset. Relative --data-dir, --models-dir and
 * models-list entries are made absolute against the working directory at
 * start-up, so later chdirs cannot move them.
 *
 * Models dirs are collected in search order into one list; a later listing
 * of a directory already in the list (same string after trailing slashes are
 * dropped, or the same realpath when it exists) only adds its read-only
 * flag, so a directory keeps the position of its first listing and becomes
 * read-only if any listing says so.
 *
 * The pid file. flock() locks belong to the open file, not the name, so a
 * classic race exists: we open the file, the holder unlinks it and exits,
 * our lock then succeeds on an orphaned inode while a third process creates
 * and locks a new file under the name. After locking we therefore check that
 * the name still refers to the inode we locked and retry otherwise; release
 * unlinks only a name that still refers to our inode. */
#include "core/paths.h"

#include "core/alloc.h"
#include "core/log.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#define DIR_MODE 0755

/* A heap string from a format; aborts on OOM like every small allocation. */
static char *fmt_path(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *fmt_path(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = exo_malloc((size_t)(n < 0 ? 0 : n) + 1);
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

static const char *env_nonempty(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* An absolute copy of p with repeated and trailing slashes dropped ("/"
 * stays "/"); "." and ".." components are kept as they are. Relative
 * paths are joined to the working directory; NULL if that is unknown. */
static char *absolute(const char *p)
{
    char *s;
    if (p[0] == '/') {
        s = exo_strdup(p);
    } else {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd))
            return NULL;
        s = fmt_path("%s/%s", strcmp(cwd, "/") ? cwd : "", p);
    }
    size_t n = 0; /* collapse "//" and drop trailing slashes */
    for (size_t i = 0; s[i]; i++)
        if (s[i] != '/' || n == 0 || s[n - 1] != '/')
            s[n++] = s[i];
    while (n > 1 && s[n - 1] == '/')
        n--;
    s[n] = 0;
    return s;
}

/* mkdir -p with DIR_MODE; an existing directory is fine, an existing
 * non-directory is an error. */
static int mkdirs(const char *path, exo_err *err)
{
    char *tmp = exo_strdup(path);
    int rc = 0;
    for (char *p = tmp + 1; tmp[1] != 0; p++) { /* "/" needs no mkdir */
        if (*p != '/' && *p != 0)
            continue;
        char c = *p;
        *p = 0;
        if (mkdir(tmp, DIR_MODE) < 0 && errno != EEXIST) {
            rc = exo_err_set(err, EXO_EIO, "cannot create directory %s: %s", tmp, strerror(errno));
            break;
        }
        *p = c;
        if (c == 0)
            break;
    }
    struct stat sb;
    if (rc == 0 && stat(path, &sb) < 0)
        rc = exo_err_set(err, EXO_EIO, "cannot create directory %s: %s", path, strerror(errno));
    else if (rc == 0 && !S_ISDIR(sb.st_mode))
        rc = exo_err_set(err, EXO_EIO, "cannot create directory %s: exists and is not a directory", path);
    exo_free(tmp);
    return rc;
}

/* ---- models dirs ---------------------------------------------------------- */

typedef struct dir_list {
    exo_models_dir *v;
    char          **keys; /* realpath, or the path itself when it does not exist */
    int             n, cap;
} dir_list;

static void dir_list_free(dir_list *l, bool free_paths)
{
    for (int i = 0; i < l->n; i++) {
        if (free_paths)
            exo_free(l->v[i].path);
        exo_free(l->keys[i]);
    }
    if (free_paths)
        exo_free(l->v);
    exo_free(l->keys);
}

static int dir_list_add(dir_list *l, const char *raw, bool read_only, exo_err *err)
{
    char *path = absolute(raw);
    if (!path)
        return exo_err_set(err, EXO_EIO, "models dir %s: cannot resolve the working directory: %s", raw,
                           strerror(errno));
    char real[PATH_MAX];
    char *key = exo_strdup(realpath(path, real) ? real : path);
    for (int i = 0; i < l->n; i++) {
        if (!strcmp(l->v[i].path, path) || !strcmp(l->keys[i], key)) {
            l->v[i].read_only |= read_only;
            exo_free(path);
            exo_free(key);
            return 0;
        }
    }
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 8;
        l->v = exo_realloc(l->v, (size_t)l->cap * sizeof *l->v);
        l->keys = exo_realloc(l->keys, (size_t)l->cap * sizeof *l->keys);
    }
    l->v[l->n] = (exo_models_dir){.path = path, .read_only = read_only};
    l->keys[l->n++] = key;
    return 0;
}

/* Adds every non-empty item of a colon list. */
static int dir_list_add_env(dir_list *l, const char *list, bool read_only, exo_err *err)
{
    if (!list)
        return 0;
    const char *p = list;
    while (*p) {
        const char *end = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len > 0) {
            char *item = exo_strndup(p, len);
            int rc = dir_list_add(l, item, read_only, err);
            exo_free(item);
            if (rc < 0)
                return rc;
        }
        p += len;
        if (*p == ':')
            p++;
    }
    return 0;
}

/* ---- resolve -------------------------------------------------------------- */

void exo_paths_free(exo_paths *p)
{
    if (!p)
        return;
    exo_free(p->data_dir);
    exo_free(p->cache_dir);
    exo_free(p->log_dir);
    exo_free(p->runner_log_dir);
    exo_free(p->event_log_dir);
    exo_free(p->pid_file);
    for (int i = 0; i < p->n_models_dirs; i++)
        exo_free(p->models_dirs[i].path);
    exo_free(p->models_dirs);
    memset(p, 0, sizeof *p);
}

/* data and cache dirs from the flag or the environment. */
static int resolve_base(const char *data_dir_flag, exo_paths *p, exo_err *err)
{
    if (data_dir_flag && *data_dir_flag) {
        p->data_dir = absolute(data_dir_flag);
        if (!p->data_dir)
            return exo_err_set(err, EXO_EIO, "--data-dir %s: cannot resolve the working directory: %s",
                               data_dir_flag, strerror(errno));
        p->cache_dir = fmt_path("%s/cache", strcmp(p->data_dir, "/") ? p->data_dir : "");
        return 0;
    }
    const char *home = env_nonempty("HOME");
    const char *exo_home = env_nonempty("EXO_HOME");
    if (exo_home && exo_home[0] == '/') {
        p->data_dir = absolute(exo_home);
        p->cache_dir = exo_strdup(p->data_dir);
        return 0;
    }
    if (!home)
        return exo_err_set(err, EXO_EINVAL, "HOME is not set: cannot place the exo data directory "
                                            "(set HOME or EXO_HOME, or pass --data-dir)");
    if (home[0] != '/')
        return exo_err_set(err, EXO_EINVAL, "HOME=%s is not an absolute path", home);
    if (exo_home) {
        char *joined = fmt_path("%s/%s", home, exo_home);
        p->data_dir = absolute(joined);
        exo_free(joined);
        p->cache_dir = exo_strdup(p->data_dir);
        return 0;
    }
    const char *xdg_data = env_nonempty("XDG_DATA_HOME");
    const char *xdg_cache = env_nonempty("XDG_CACHE_HOME");
    char *data = xdg_data && xdg_data[0] == '/' ? fmt_path("%s/exo", xdg_data) : fmt_path("%s/.local/share/exo", home);
    char *cache = xdg_cache && xdg_cache[0] == '/' ? fmt_path("%s/exo", xdg_cache) : fmt_path("%s/.cache/exo", home);
    p->data_dir = absolute(data); /* drops the "//" of a HOME ending in '/' */
    p->cache_dir = absolute(cache);
    exo_free(data);
    exo_free(cache);
    return 0;
}

int exo_paths_resolve(const char *data_dir_flag, const char *const *models_dir_flags, int n_models_dir_flags,
                      exo_paths *out, exo_err *err)
{
    memset(out, 0, sizeof *out);
    exo_paths p = {0};
    dir_list dirs = {0};
    int rc = resolve_base(data_dir_flag, &p, err);
    if (rc < 0)
        goto fail;

    p.log_dir = fmt_path("%s/exo_log", p.cache_dir);
    p.runner_log_dir = fmt_path("%s/runner_log", p.log_dir);
    p.event_log_dir = fmt_path("%s/event_log/master", p.data_dir);
    p.pid_file = fmt_path("%s/exo.pid", p.data_dir);

    for (int i = 0; i < n_models_dir_flags; i++)
        if (models_dir_flags[i] && *models_dir_flags[i] &&
            (rc = dir_list_add(&dirs, models_dir_flags[i], false, err)) < 0)
            goto fail;
    if ((rc = dir_list_add_env(&dirs, getenv("EXO_MODELS_DIRS"), false, err)) < 0)
        goto fail;
    const char *def_env = env_nonempty("EXO_DEFAULT_MODELS_DIR");
    char *def = def_env ? exo_strdup(def_env) : fmt_path("%s/models", p.data_dir);
    rc = dir_list_add(&dirs, def, false, err);
    char *def_abs = rc == 0 ? absolute(def) : NULL;
    exo_free(def);
    if (rc < 0)
        goto fail;
    if ((rc = dir_list_add_env(&dirs, getenv("EXO_MODELS_READ_ONLY_DIRS"), true, err)) < 0) {
        exo_free(def_abs);
        goto fail;
    }

    const char *create[] = {p.data_dir, p.cache_dir, p.log_dir, p.runner_log_dir, p.event_log_dir};
    for (size_t i = 0; i < sizeof create / sizeof *create; i++)
        if ((rc = mkdirs(create[i], err)) < 0) {
            exo_free(def_abs);
            goto fail;
        }
    /* The default models dir is where downloads go; it is created unless it
     * was also listed read-only (then it is someone else's to provide). */
    for (int i = 0; def_abs && i < dirs.n; i++) {
        if (strcmp(dirs.v[i].path, def_abs) != 0)
            continue;
        if (!dirs.v[i].read_only && (rc = mkdirs(def_abs, err)) < 0) {
            exo_free(def_abs);
            goto fail;
        }
        break;
    }
    exo_free(def_abs);

    p.models_dirs = dirs.v;
    p.n_models_dirs = dirs.n;
    dir_list_free(&dirs, false);
    *out = p;
    return 0;

fail:
    dir_list_free(&dirs, true);
    exo_paths_free(&p);
    return rc;
}

/* ---- pid file ------------------------------------------------------------- */

/* The pid written in the file, or 0 if it holds none (yet). */
static long read_pid(int fd)
{
    char buf[32];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    char *end;
    long pid = strtol(buf, &end, 10);
    return end != buf && pid > 0 ? pid : 0;
}

int exo_flock_exclusive(int fd)
{
    for (int waited_ms = 0;; waited_ms++) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0)
            return 0;
        if ((errno != EWOULDBLOCK && errno != EINTR) || waited_ms >= EXO_FLOCK_WAIT_MS)
            return -1;
        nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
    }
}

int exo_pidfile_acquire(const char *path, int *fd_out, exo_err *err)
{
    *fd_out = -1;
    for (int attempt = 0; attempt < 16; attempt++) {
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0)
            return exo_err_set(err, EXO_EIO, "pid file %s: open: %s", path, strerror(errno));
        if (exo_flock_exclusive(fd) < 0) {
            int e = errno;
            if (e == EWOULDBLOCK) {
                long pid = read_pid(fd);
                close(fd);
                if (pid > 0)
                    return exo_err_set(err, EXO_EBUSY,
                                       "pid file %s is locked by pid %ld: another exo is using this data dir",
                                       path, pid);
                return exo_err_set(err, EXO_EBUSY,
                                   "pid file %s is locked by another process: another exo is using this data dir",
                                   path);
            }
            close(fd);
            return exo_err_set(err, EXO_EIO, "pid file %s: lock: %s", path, strerror(e));
        }
        /* Locked; is it still the file the name refers to? */
        struct stat fsb, psb;
        if (fstat(fd, &fsb) < 0) {
            int e = errno;
            close(fd);
            return exo_err_set(err, EXO_EIO, "pid file %s: fstat: %s", path, strerror(e));
        }
        if (stat(path, &psb) < 0 || psb.st_dev != fsb.st_dev || psb.st_ino != fsb.st_ino) {
            close(fd); /* unlinked or replaced by its previous holder: retry */
            continue;
        }
        if (!S_ISREG(fsb.st_mode)) {
            close(fd);
            return exo_err_set(err, EXO_EIO, "pid file %s: not a regular file", path);
        }
        long old = read_pid(fd);
        if (old > 0)
            EXO_LOG_DEBUG("pid file %s: taking over from pid %ld, which no longer holds it", path, old);
        char buf[32];
        int n = snprintf(buf, sizeof buf, "%ld\n", (long)getpid());
        if (ftruncate(fd, 0) < 0 || pwrite(fd, buf, (size_t)n, 0) != n) {
            int e = errno;
            close(fd);
            return exo_err_set(err, EXO_EIO, "pid file %s: write: %s", path, strerror(e));
        }
        *fd_out = fd;
        return 0;
    }
    return exo_err_set(err, EXO_EBUSY, "pid file %s keeps being replaced by another process", path);
}

void exo_pidfile_release(int fd, const char *path)
{
    if (fd < 0)
        return;
    struct stat fsb, psb;
    if (path && fstat(fd, &fsb) == 0 && stat(path, &psb) == 0 && psb.st_dev == fsb.st_dev &&
        psb.st_ino == fsb.st_ino)
        unlink(path); /* still holding the lock, so nobody else owns this name */
    close(fd);
}
