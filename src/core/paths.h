/* Where a node keeps its files, resolved once at start-up the way exo does on
 * Linux (exo-reference §1 "Paths/env"):
 *
 *   EXO_HOME set     everything under $HOME/$EXO_HOME (absolute EXO_HOME: as is)
 *   otherwise        data  $XDG_DATA_HOME/exo  (~/.local/share/exo)
 *                    cache $XDG_CACHE_HOME/exo (~/.cache/exo)
 *                    (empty EXO_HOME, empty or relative XDG_* count as unset)
 *   --data-dir DIR   data dir = DIR (and cache = DIR/cache), overriding both
 *
 * Derived: event log <data>/event_log/master, logs <cache>/exo_log, runner
 * logs <cache>/exo_log/runner_log, pid file <data>/exo.pid.
 *
 * Model directories, searched in this order (first hit wins):
 *   every --models-dir flag (writable), EXO_MODELS_DIRS (colon list,
 *   writable), EXO_DEFAULT_MODELS_DIR or <data>/models (writable),
 *   EXO_MODELS_READ_ONLY_DIRS (colon list, read-only). A directory listed as
 *   both writable and read-only is read-only; duplicates (same realpath or
 *   same string, trailing slashes ignored) are listed once, at the position
 *   of their first listing; empty list items are skipped. Relative paths
 *   are made absolute against the working directory.
 *
 * exo_paths_resolve creates the data, cache, log, runner-log, event-log and
 * default models directories (mode 0755; the default models dir not if it
 * is also listed read-only); other models dirs are not created (a missing
 * one is simply empty). */
#ifndef EXO_CORE_PATHS_H
#define EXO_CORE_PATHS_H

#include "core/error.h"

#include <stdbool.h>

typedef struct exo_models_dir {
    char *path;      /* owned, absolute */
    bool  read_only;
} exo_models_dir;

typedef struct exo_paths {
    char *data_dir, *cache_dir, *log_dir, *runner_log_dir, *event_log_dir, *pid_file; /* owned */
    exo_models_dir *models_dirs; /* owned array */
    int             n_models_dirs;
} exo_paths;

/* data_dir_flag: --data-dir or NULL; models_dir_flags: the --models-dir values.
 * Errors: EXO_EINVAL (no $HOME and no flag), EXO_EIO (a directory cannot be
 * created; the message names it). On error *out is left zeroed. */
int  exo_paths_resolve(const char *data_dir_flag, const char *const *models_dir_flags,
                       int n_models_dir_flags, exo_paths *out, exo_err *err);
void exo_paths_free(exo_paths *p);

/* An exclusive flock on fd without blocking on a real holder. A flock
 * belongs to an open file description and goes when its last reference
 * does, and the last one is not always its owner's: a process resolving
 * /proc/PID/fd or reading fdinfo (lsof, a monitor) holds one for
 * microseconds, so a file closed and at once reopened (a log, a restarted
 * daemon's pid file) can find the old lock still there. A holder that
 * means it holds the lock for its lifetime, so a short bounded wait
 * (EXO_FLOCK_WAIT_MS) tells the two apart. Returns 0, or -1 with errno
 * (EWOULDBLOCK: held). */
#define EXO_FLOCK_WAIT_MS 250
int  exo_flock_exclusive(int fd);

/* Takes an exclusive lock on the pid file (flock, created 0644) and writes
 * our pid into it. *fd_out keeps the lock until exo_pidfile_release.
 * EXO_EBUSY when another live process holds it (the message says which pid
 * and that another exo uses this data dir); EXO_EIO otherwise. A stale file
 * left by a dead process is simply re-locked. */
int  exo_pidfile_acquire(const char *path, int *fd_out, exo_err *err);
/* Unlinks the file and closes the fd (releasing the lock). fd < 0: no-op. */
void exo_pidfile_release(int fd, const char *path);

#endif
