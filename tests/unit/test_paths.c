/* Paths: data/cache resolution from HOME, XDG_*, EXO_HOME and --data-dir;
 * the derived dirs and which of them are created; models dirs in search
 * order with read-only marking, de-duplication (string, trailing slash,
 * symlink) and empty list items; errors leave *out zeroed. Pid file: a
 * second holder (a forked child) gets EXO_EBUSY naming our pid, a stale
 * file is re-locked and rewritten, release unlinks. Every test runs in a
 * fresh mkdtemp tree with the relevant environment cleared. */
#include "core/alloc.h"
#include "core/log.h"
#include "core/paths.h"

#include <criterion/criterion.h>
#include "test_tmpdir.h"
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmpdir[64];

static const char *const env_vars[] = {"EXO_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME",
                                       "EXO_MODELS_DIRS", "EXO_MODELS_READ_ONLY_DIRS", "EXO_DEFAULT_MODELS_DIR"};

/* tmpdir/<rel> in a static rotating buffer (several live at once). */
static const char *tp(const char *rel)
{
    static char bufs[8][PATH_MAX];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, PATH_MAX, "%s/%s", tmpdir, rel);
    return b;
}

static void setup(void)
{
    test_tmpdir_make(tmpdir, "paths");
    for (size_t i = 0; i < sizeof env_vars / sizeof *env_vars; i++)
        unsetenv(env_vars[i]);
    cr_assert_eq(mkdir(tp("home"), 0755), 0);
    setenv("HOME", tp("home"), 1);
    umask(022);
    exo_log_set_level(EXO_LOG_ERROR);
}

static void teardown(void) { test_tmpdir_remove(tmpdir); }

TestSuite(paths, .init = setup, .fini = teardown);

static bool is_dir(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static void resolve_ok(const char *flag, const char *const *mflags, int n, exo_paths *p)
{
    exo_err err = {0};
    cr_assert_eq(exo_paths_resolve(flag, mflags, n, p, &err), 0, "%s", err.msg);
}

static void assert_zeroed(const exo_paths *p)
{
    cr_assert_null(p->data_dir);
    cr_assert_null(p->cache_dir);
    cr_assert_null(p->log_dir);
    cr_assert_null(p->pid_file);
    cr_assert_null(p->models_dirs);
    cr_assert_eq(p->n_models_dirs, 0);
}

/* The models dirs as "path:rw|ro,..." with tmpdir replaced by "T". */
static void models_str(const exo_paths *p, char *out, size_t cap)
{
    size_t t = strlen(tmpdir), len = 0;
    out[0] = 0;
    for (int i = 0; i < p->n_models_dirs; i++) {
        const char *s = p->models_dirs[i].path;
        cr_assert_eq(s[0], '/', "not absolute: %s", s);
        len += (size_t)snprintf(out + len, cap - len, "%s%s%s:%s", i ? "," : "", strncmp(s, tmpdir, t) ? "" : "T",
                                strncmp(s, tmpdir, t) ? s : s + t, p->models_dirs[i].read_only ? "ro" : "rw");
    }
}

Test(paths, xdg_defaults_and_created_dirs)
{
    exo_paths p;
    resolve_ok(NULL, NULL, 0, &p);
    cr_assert_str_eq(p.data_dir, tp("home/.local/share/exo"));
    cr_assert_str_eq(p.cache_dir, tp("home/.cache/exo"));
    cr_assert_str_eq(p.log_dir, tp("home/.cache/exo/exo_log"));
    cr_assert_str_eq(p.runner_log_dir, tp("home/.cache/exo/exo_log/runner_log"));
    cr_assert_str_eq(p.event_log_dir, tp("home/.local/share/exo/event_log/master"));
    cr_assert_str_eq(p.pid_file, tp("home/.local/share/exo/exo.pid"));
    cr_assert_eq(p.n_models_dirs, 1);
    cr_assert_str_eq(p.models_dirs[0].path, tp("home/.local/share/exo/models"));
    cr_assert_not(p.models_dirs[0].read_only);
    const char *made[] = {p.data_dir, p.cache_dir, p.log_dir, p.runner_log_dir, p.event_log_dir,
                          p.models_dirs[0].path};
    for (size_t i = 0; i < sizeof made / sizeof *made; i++) {
        cr_assert(is_dir(made[i]), "%s not created", made[i]);
        struct stat sb;
        cr_assert_eq(stat(made[i], &sb), 0);
        cr_assert_eq(sb.st_mode & 0022, 0, "%s is group/other writable", made[i]);
    }
    cr_assert_eq(access(p.pid_file, F_OK), -1, "the pid file is not resolve's to create");
    exo_paths_free(&p);
    cr_assert_null(p.data_dir);
    exo_paths_free(&p); /* twice is harmless */

    /* a trailing slash on HOME does not leave "//" */
    char home[PATH_MAX];
    snprintf(home, sizeof home, "%s/", tp("home"));
    setenv("HOME", home, 1);
    resolve_ok(NULL, NULL, 0, &p);
    cr_assert_str_eq(p.data_dir, tp("home/.local/share/exo"));
    exo_paths_free(&p);
}

Test(paths, xdg_env)
{
    setenv("XDG_DATA_HOME", tp("xd"), 1);
    setenv("XDG_CACHE_HOME", tp("xc"), 1);
    exo_paths p;
    resolve_ok(NULL, NULL, 0, &p);
    cr_assert_str_eq(p.data_dir, tp("xd/exo"));
    cr_assert_str_eq(p.cache_dir, tp("xc/exo"));
    cr_assert_str_eq(p.log_dir, tp("xc/exo/exo_log"));
    cr_assert_str_eq(p.pid_file, tp("xd/exo/exo.pid"));
    cr_assert_str_eq(p.models_dirs[0].path, tp("xd/exo/models"));
    cr_assert(is_dir(tp("xc/exo/exo_log/runner_log")));
    exo_paths_free(&p);

    /* empty or relative XDG values are ignored, as the XDG spec says */
    setenv("XDG_DATA_HOME", "", 1);
    setenv("XDG_CACHE_HOME", "relative/cache", 1);
    resolve_ok(NULL, NULL, 0, &p);
    cr_assert_str_eq(p.data_dir, tp("home/.local/share/exo"));
    cr_assert_str_eq(p.cache_dir, tp("home/.cache/exo"));
    exo_paths_free(&p);
}

Test(paths, exo_home_overrides_xdg)
{
    setenv("XDG_DATA_HOME", tp("xd"), 1);
    setenv("XDG_CACHE_HOME", tp("xc"), 1);
    setenv("EXO_HOME", ".exo-test", 1);
    exo_paths p;
    resolve_ok(NULL, NULL, 0, &p);
    cr_assert_str_eq(p.data_dir, tp("home/.exo-test"));
    cr_assert_str_eq(p.cache_dir, tp("home/.exo-test"));
    cr_assert_str_eq(p.log_dir, tp("home/.exo-test/exo_log"));
    cr_assert_str_eq(p.event_log_dir, tp("home/.exo-test/event_log/master"));
    cr_assert_str_eq(p.pid_file, tp("home/.exo-test/exo.pid"));
    cr_assert_str_eq(p.models_dirs[0].path, tp("home/.exo-test/models"));
    cr_assert_not(is_dir(tp("xd/exo")));
    exo_paths_free(&p);

    /* absolute EXO_HOME is taken as is (and needs no HOME) */
    setenv("EXO_HOME", tp("abs-home/"), 1);
    unsetenv("HOME");
    resolve_ok(NULL, NULL, 0, &p);
    cr_assert_str_eq(p.data_dir, tp("abs-home"));
    cr_assert_str_eq(p.cache_dir, tp("abs-home"));
    cr_assert(is_dir(tp("abs-home/exo_log/runner_log")));
    exo_paths_free(&p);

    /* empty EXO_HOME counts as unset */
    setenv("HOME", tp("home"), 1);
    setenv("EXO_HOME", "", 1);
    resolve_ok(NULL, NULL, 0, &p);
    cr_assert_str_eq(p.data_dir, tp("xd/exo"));
    exo_paths_free(&p);
}

Test(paths, data_dir_flag_overrides_everything)
{
    setenv("EXO_HOME", tp("abs-home"), 1);
    setenv("XDG_DATA_HOME", tp("xd"), 1);
    exo_paths p;
    resolve_ok(tp("dd"), NULL, 0, &p);
    cr_assert_str_eq(p.data_dir, tp("dd"));
    cr_assert_str_eq(p.cache_dir, tp("dd/cache"));
    cr_assert_str_eq(p.log_dir, tp("dd/cache/exo_log"));
    cr_assert_str_eq(p.runner_log_dir, tp("dd/cache/exo_log/runner_log"));
    cr_assert_str_eq(p.event_log_dir, tp("dd/event_log/master"));
    cr_assert_str_eq(p.pid_file, tp("dd/exo.pid"));
    cr_assert_str_eq(p.models_dirs[0].path, tp("dd/models"));
    cr_assert_not(is_dir(tp("abs-home")));
    exo_paths_free(&p);

    /* a relative flag is made absolute against the working directory */
    cr_assert_eq(chdir(tmpdir), 0);
    resolve_ok("rel//dd/", NULL, 0, &p);
    cr_assert_str_eq(p.data_dir, tp("rel/dd"));
    cr_assert_str_eq(p.cache_dir, tp("rel/dd/cache"));
    cr_assert(is_dir(tp("rel/dd/cache/exo_log")));
    exo_paths_free(&p);
}

Test(paths, no_home_is_einval)
{
    unsetenv("HOME");
    exo_paths p;
    memset(&p, 0xab, sizeof p);
    exo_err err = {0};
    cr_assert_eq(exo_paths_resolve(NULL, NULL, 0, &p, &err), EXO_EINVAL);
    cr_assert(strstr(err.msg, "HOME"), "%s", err.msg);
    assert_zeroed(&p);

    setenv("HOME", "", 1);
    memset(&p, 0xab, sizeof p);
    cr_assert_eq(exo_paths_resolve(NULL, NULL, 0, &p, &err), EXO_EINVAL);
    assert_zeroed(&p);

    /* relative EXO_HOME still needs HOME; --data-dir does not */
    setenv("EXO_HOME", ".exo", 1);
    cr_assert_eq(exo_paths_resolve(NULL, NULL, 0, &p, &err), EXO_EINVAL);
    resolve_ok(tp("dd"), NULL, 0, &p);
    cr_assert_str_eq(p.data_dir, tp("dd"));
    exo_paths_free(&p);
}

Test(paths, unmakeable_dir_is_eio_naming_it)
{
    FILE *f = fopen(tp("file"), "w");
    cr_assert_not_null(f);
    fclose(f);
    exo_paths p;
    memset(&p, 0xab, sizeof p);
    exo_err err = {0};
    cr_assert_eq(exo_paths_resolve(tp("file/dd"), NULL, 0, &p, &err), EXO_EIO);
    cr_assert(strstr(err.msg, tp("file/dd")), "%s", err.msg);
    assert_zeroed(&p);

    /* an existing non-directory at a dir's place */
    cr_assert_eq(mkdir(tp("dd"), 0755), 0);
    f = fopen(tp("dd/cache"), "w");
    cr_assert_not_null(f);
    fclose(f);
    cr_assert_eq(exo_paths_resolve(tp("dd"), NULL, 0, &p, &err), EXO_EIO);
    cr_assert(strstr(err.msg, tp("dd/cache")), "%s", err.msg);
    assert_zeroed(&p);

    /* the default models dir can be unmakeable too */
    setenv("EXO_DEFAULT_MODELS_DIR", tp("file/models"), 1);
    cr_assert_eq(exo_paths_resolve(tp("dd2"), NULL, 0, &p, &err), EXO_EIO);
    cr_assert(strstr(err.msg, tp("file/models")), "%s", err.msg);
    assert_zeroed(&p);
}

Test(paths, models_dirs_order)
{
    char list[4 * PATH_MAX];
    snprintf(list, sizeof list, "%s::%s:", tp("C"), tp("D"));
    setenv("EXO_MODELS_DIRS", list, 1);
    setenv("EXO_DEFAULT_MODELS_DIR", tp("E"), 1);
    snprintf(list, sizeof list, ":%s:%s", tp("F"), tp("G"));
    setenv("EXO_MODELS_READ_ONLY_DIRS", list, 1);
    const char *flags[] = {tp("A"), "", tp("B")};
    exo_paths p;
    resolve_ok(tp("dd"), flags, 3, &p);
    char got[4096];
    models_str(&p, got, sizeof got);
    cr_assert_str_eq(got, "T/A:rw,T/B:rw,T/C:rw,T/D:rw,T/E:rw,T/F:ro,T/G:ro");
    /* only the default models dir is created */
    cr_assert(is_dir(tp("E")));
    cr_assert_not(is_dir(tp("dd/models")));
    const char *absent[] = {"A", "B", "C", "D", "F", "G"};
    for (size_t i = 0; i < sizeof absent / sizeof *absent; i++)
        cr_assert_not(is_dir(tp(absent[i])), "%s created", absent[i]);
    exo_paths_free(&p);
}

Test(paths, models_dirs_dedup_and_read_only_wins)
{
    cr_assert_eq(mkdir(tp("B"), 0755), 0);
    cr_assert_eq(symlink(tp("B"), tp("linkB")), 0);
    char list[4 * PATH_MAX];
    /* A again (trailing slash), B through a symlink, C writable here ... */
    snprintf(list, sizeof list, "%s/:%s:%s", tp("A"), tp("linkB"), tp("C"));
    setenv("EXO_MODELS_DIRS", list, 1);
    /* ... and read-only here; the default dir is read-only too */
    snprintf(list, sizeof list, "%s:%s/:%s", tp("C"), tp("dd/models"), tp("H"));
    setenv("EXO_MODELS_READ_ONLY_DIRS", list, 1);
    const char *flags[] = {tp("A"), tp("B"), tp("A")};
    exo_paths p;
    resolve_ok(tp("dd"), flags, 3, &p);
    char got[4096];
    models_str(&p, got, sizeof got);
    cr_assert_str_eq(got, "T/A:rw,T/B:rw,T/C:ro,T/dd/models:ro,T/H:ro");
    cr_assert_not(is_dir(tp("dd/models")), "a read-only default models dir is not created");
    exo_paths_free(&p);

    /* relative list items are absolute in the result and dedup with their
     * absolute spelling */
    cr_assert_eq(chdir(tmpdir), 0);
    setenv("EXO_MODELS_DIRS", "B:./B:X", 1);
    unsetenv("EXO_MODELS_READ_ONLY_DIRS");
    resolve_ok(tp("dd"), NULL, 0, &p);
    models_str(&p, got, sizeof got);
    cr_assert_str_eq(got, "T/B:rw,T/X:rw,T/dd/models:rw");
    exo_paths_free(&p);
}

/* ---- pid file ---- */

/* In a child: tries to take the lock; exit 0 iff it got EXO_EBUSY with a
 * message naming want_pid, 1 iff it got the lock. */
static int child_try(const char *path, pid_t want_pid)
{
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        int fd;
        exo_err err = {0};
        int rc = exo_pidfile_acquire(path, &fd, &err);
        if (rc == 0) {
            exo_pidfile_release(fd, path);
            _exit(1);
        }
        char want[32];
        snprintf(want, sizeof want, "pid %ld", (long)want_pid);
        _exit(rc == EXO_EBUSY && fd == -1 && strstr(err.msg, want) && strstr(err.msg, "data dir") ? 0 : 2);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status));
    return WEXITSTATUS(status);
}

static long file_pid(const char *path)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    long pid = 0;
    cr_assert_eq(fscanf(f, "%ld", &pid), 1);
    fclose(f);
    return pid;
}

Test(paths, pidfile_contention)
{
    const char *path = tp("exo.pid");
    int fd = -1;
    exo_err err = {0};
    cr_assert_eq(exo_pidfile_acquire(path, &fd, &err), 0, "%s", err.msg);
    cr_assert_geq(fd, 0);
    cr_assert_eq(file_pid(path), (long)getpid());
    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0);
    cr_assert_eq(sb.st_mode & 0777, 0644);

    cr_assert_eq(child_try(path, getpid()), 0, "a second process must get EXO_EBUSY naming our pid");
    cr_assert_eq(file_pid(path), (long)getpid(), "the loser must not touch the file");

    exo_pidfile_release(fd, path);
    cr_assert_eq(access(path, F_OK), -1, "release unlinks the pid file");
    cr_assert_eq(child_try(path, getpid()), 1, "free again after release");
    exo_pidfile_release(-1, path); /* no-op */
}

Test(paths, pidfile_stale_is_relocked)
{
    const char *path = tp("exo.pid");
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs("2147483646\nleftover garbage that is longer than a pid\n", f);
    fclose(f);
    int fd;
    exo_err err = {0};
    cr_assert_eq(exo_pidfile_acquire(path, &fd, &err), 0, "%s", err.msg);
    f = fopen(path, "r");
    char buf[128] = {0};
    cr_assert_gt(fread(buf, 1, sizeof buf - 1, f), 0);
    fclose(f);
    char want[32];
    snprintf(want, sizeof want, "%ld\n", (long)getpid());
    cr_assert_str_eq(buf, want, "the file holds exactly our pid");
    exo_pidfile_release(fd, path);
}

Test(paths, pidfile_release_keeps_a_replaced_file)
{
    const char *path = tp("exo.pid");
    int fd;
    exo_err err = {0};
    cr_assert_eq(exo_pidfile_acquire(path, &fd, &err), 0, "%s", err.msg);
    /* someone replaced the name; our release must not delete their file */
    cr_assert_eq(unlink(path), 0);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs("1\n", f);
    fclose(f);
    exo_pidfile_release(fd, path);
    cr_assert_eq(access(path, F_OK), 0);
}

Test(paths, pidfile_open_error_is_eio)
{
    int fd = 7;
    exo_err err = {0};
    cr_assert_eq(exo_pidfile_acquire(tp("missing/exo.pid"), &fd, &err), EXO_EIO);
    cr_assert_eq(fd, -1);
    cr_assert(strstr(err.msg, tp("missing/exo.pid")), "%s", err.msg);
}
