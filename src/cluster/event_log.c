/* Append-only event log with verified recovery (see event_log.h).
 *
 * Locking: one mutex guards the descriptor, the offset index and the flags.
 * Appends and reads hold it for one record; a flush holds it only to dup()
 * the descriptor, so the fdatasync itself (milliseconds) runs without it
 * and never delays the loop thread's appends.
 *
 * In memory we keep only the file offset of every record (8 bytes per
 * event), so read_range is one pread per record and opening a log costs one
 * sequential read of the file. Records are always re-verified on read: the
 * offset index is trusted, the file contents are not. */
#include "cluster/event_log.h"

#include "cluster/crc32c.h"
#include "cluster/state.h"
#include "core/alloc.h"
#include "core/bytes.h"
#include "core/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <zstd.h>

struct exo_event_log {
    pthread_mutex_t mu;
    int       fd;
    char     *path;
    uint64_t *offsets;   /* offsets[i] = file offset of record i */
    uint64_t  n, cap;
    uint64_t  end;       /* file offset after the last record */
    bool      dirty;     /* appended since the last flush */
    bool      broken;    /* a failed append could not be undone */
};

static void index_push(exo_event_log *log, uint64_t off)
{
    if (log->n == log->cap) {
        log->cap = log->cap ? log->cap * 2 : 64;
        log->offsets = exo_realloc(log->offsets, log->cap * sizeof *log->offsets);
    }
    log->offsets[log->n++] = off;
}

static void sync_dir_of(const char *path)
{
    char *copy = exo_strdup(path);
    int dfd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    exo_free(copy);
}

/* Scans the file, filling the offset index; sets *good_end to the end of
 * the intact prefix and describes the first bad record in reason. */
static int scan(exo_event_log *log, uint64_t size, uint64_t *good_end, char *reason, size_t reason_len,
                exo_err *err)
{
    uint64_t off = 0;
    uint8_t hdr[EXO_EVENT_LOG_HEADER];
    uint8_t *buf = NULL;
    size_t buf_cap = 0;
    int rc = 0;
    reason[0] = 0;
    while (off < size) {
        if (size - off < EXO_EVENT_LOG_HEADER) {
            snprintf(reason, reason_len, "record %llu: torn header", (unsigned long long)log->n);
            break;
        }
        if (exo_pread_full(log->fd, hdr, sizeof hdr, off) != (ssize_t)sizeof hdr) {
            rc = exo_err_set(err, EXO_EIO, "%s: read at %llu: %s", log->path, (unsigned long long)off,
                             strerror(errno));
            break;
        }
        uint32_t len = exo_get_le32(hdr), crc = exo_get_le32(hdr + 4);
        if (len == 0 || len > EXO_EVENT_LOG_MAX_RECORD) {
            snprintf(reason, reason_len, "record %llu: bad length %u", (unsigned long long)log->n, len);
            break;
        }
        if (size - off - EXO_EVENT_LOG_HEADER < len) {
            snprintf(reason, reason_len, "record %llu: torn payload", (unsigned long long)log->n);
            break;
        }
        if (len > buf_cap) {
            exo_free(buf);
            buf_cap = len;
            buf = exo_malloc(buf_cap);
        }
        if (exo_pread_full(log->fd, buf, len, off + EXO_EVENT_LOG_HEADER) != (ssize_t)len) {
            rc = exo_err_set(err, EXO_EIO, "%s: read at %llu: %s", log->path, (unsigned long long)off,
                             strerror(errno));
            break;
        }
        if (exo_crc32c(0, buf, len) != crc) {
            snprintf(reason, reason_len, "record %llu: checksum mismatch", (unsigned long long)log->n);
            break;
        }
        index_push(log, off);
        off += EXO_EVENT_LOG_HEADER + (uint64_t)len;
    }
    exo_free(buf);
    *good_end = off;
    return rc;
}

static void archive_leftovers(const char *path);

int exo_event_log_open(const char *path, exo_event_log **out, exo_event_log_recovery *rec, exo_err *err)
{
    *out = NULL;
    if (rec)
        memset(rec, 0, sizeof *rec);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return exo_err_set(err, errno == ENOENT ? EXO_ENOENT : EXO_EIO, "%s: open: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        int e = errno;
        close(fd);
        return exo_err_set(err, e == EWOULDBLOCK ? EXO_EBUSY : EXO_EIO, "%s: lock: %s", path,
                           e == EWOULDBLOCK ? "held by another writer" : strerror(e));
    }
    struct stat sb;
    if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return exo_err_set(err, EXO_EIO, "%s: not a regular file", path);
    }
    archive_leftovers(path);
    exo_event_log *log = exo_calloc(1, sizeof *log);
    pthread_mutex_init(&log->mu, NULL);
    log->fd = fd;
    log->path = exo_strdup(path);
    uint64_t size = (uint64_t)sb.st_size, good = 0;
    char reason[128];
    int rc = scan(log, size, &good, reason, sizeof reason, err);
    if (rc == 0 && good < size) {
        EXO_LOG_WARN("event log %s: %s; truncating %llu bytes at offset %llu (%llu intact records kept)", path,
                     reason, (unsigned long long)(size - good), (unsigned long long)good,
                     (unsigned long long)log->n);
        if (ftruncate(fd, (off_t)good) < 0 || fdatasync(fd) < 0)
            rc = exo_err_set(err, EXO_EIO, "%s: truncate to %llu: %s", path, (unsigned long long)good,
                             strerror(errno));
    }
    if (rc < 0) {
        exo_free(log->offsets);
        exo_free(log->path);
        close(fd);
        pthread_mutex_destroy(&log->mu);
        exo_free(log);
        return rc;
    }
    log->end = good;
    sync_dir_of(path);
    if (rec) {
        rec->records = log->n;
        rec->bytes_kept = good;
        rec->bytes_truncated = size - good;
        snprintf(rec->reason, sizeof rec->reason, "%s", good < size ? reason : "");
    }
    *out = log;
    return 0;
}

uint64_t exo_event_log_count(exo_event_log *log)
{
    pthread_mutex_lock(&log->mu);
    uint64_t n = log->n;
    pthread_mutex_unlock(&log->mu);
    return n;
}

static int append_locked(exo_event_log *log, const void *payload, size_t len, uint64_t *idx, exo_err *err)
{
    if (log->broken)
        return exo_err_set(err, EXO_EIO, "%s: log is unusable after a failed write or sync", log->path);
    if (len == 0)
        return exo_err_set(err, EXO_EINVAL, "%s: empty record", log->path);
    if (len > EXO_EVENT_LOG_MAX_RECORD)
        return exo_err_set(err, EXO_ETOOBIG, "%s: record of %zu bytes (max %zu)", log->path, len,
                           (size_t)EXO_EVENT_LOG_MAX_RECORD);
    /* One buffer, one pwrite: a crash tears at most this record. */
    uint8_t *rec = exo_try_malloc(EXO_EVENT_LOG_HEADER + len);
    if (!rec)
        return exo_err_set(err, EXO_ENOMEM, "%s: record buffer", log->path);
    exo_put_le32(rec, (uint32_t)len);
    exo_put_le32(rec + 4, exo_crc32c(0, payload, len));
    memcpy(rec + EXO_EVENT_LOG_HEADER, payload, len);
    int w = exo_pwrite_full(log->fd, rec, EXO_EVENT_LOG_HEADER + len, log->end);
    int e = errno;
    exo_free(rec);
    if (w < 0) {
        if (ftruncate(log->fd, (off_t)log->end) < 0)
            log->broken = true;
        return exo_err_set(err, EXO_EIO, "%s: append: %s", log->path, strerror(e));
    }
    index_push(log, log->end);
    log->end += EXO_EVENT_LOG_HEADER + (uint64_t)len;
    log->dirty = true;
    if (idx)
        *idx = log->n - 1;
    return 0;
}

int exo_event_log_append(exo_event_log *log, const void *payload, size_t len, uint64_t *idx, exo_err *err)
{
    pthread_mutex_lock(&log->mu);
    int rc = append_locked(log, payload, len, idx, err);
    pthread_mutex_unlock(&log->mu);
    return rc;
}

int exo_event_log_append_event(exo_event_log *log, const exo_event *ev, uint64_t *idx, exo_err *err)
{
    uint8_t *buf;
    size_t len;
    int rc = exo_event_encode(ev, &buf, &len, err);
    if (rc < 0)
        return rc;
    rc = exo_event_log_append(log, buf, len, idx, err);
    exo_free(buf);
    return rc;
}

static int read_locked(exo_event_log *log, uint64_t idx, uint8_t **payload, size_t *len, exo_err *err);

static int flush_locked(exo_event_log *log, exo_err *err)
{
    if (log->broken)
        return exo_err_set(err, EXO_EIO, "%s: log is unusable after a failed write or sync", log->path);
    if (!log->dirty)
        return 0;
    if (fdatasync(log->fd) < 0) {
        log->broken = true;
        return exo_err_set(err, EXO_EIO, "%s: fdatasync: %s", log->path, strerror(errno));
    }
    log->dirty = false;
    return 0;
}

int exo_event_log_flush(exo_event_log *log, exo_err *err)
{
    pthread_mutex_lock(&log->mu);
    if (log->broken || !log->dirty) {
        int rc = flush_locked(log, err);
        pthread_mutex_unlock(&log->mu);
        return rc;
    }
    /* Sync a duplicate of the descriptor outside the lock: appends go on
     * meanwhile (and mark the log dirty again), and a rotation that closes
     * the original does not pull the file from under the sync. */
    int fd = dup(log->fd);
    log->dirty = false;
    pthread_mutex_unlock(&log->mu);
    int rc = 0;
    if (fd < 0 || fdatasync(fd) < 0) {
        int e = errno;
        pthread_mutex_lock(&log->mu);
        log->broken = true;
        rc = exo_err_set(err, EXO_EIO, "%s: fdatasync: %s", log->path, strerror(e));
        pthread_mutex_unlock(&log->mu);
    }
    if (fd >= 0)
        close(fd);
    return rc;
}

int exo_event_log_read(exo_event_log *log, uint64_t idx, uint8_t **payload, size_t *len, exo_err *err)
{
    pthread_mutex_lock(&log->mu);
    int rc = read_locked(log, idx, payload, len, err);
    pthread_mutex_unlock(&log->mu);
    return rc;
}

static int read_locked(exo_event_log *log, uint64_t idx, uint8_t **payload, size_t *len, exo_err *err)
{
    *payload = NULL;
    *len = 0;
    if (idx >= log->n)
        return exo_err_set(err, EXO_ERANGE, "%s: record %llu of %llu", log->path, (unsigned long long)idx,
                           (unsigned long long)log->n);
    uint64_t off = log->offsets[idx];
    uint64_t next = idx + 1 < log->n ? log->offsets[idx + 1] : log->end;
    uint8_t hdr[EXO_EVENT_LOG_HEADER];
    if (exo_pread_full(log->fd, hdr, sizeof hdr, off) != (ssize_t)sizeof hdr)
        return exo_err_set(err, EXO_EIO, "%s: record %llu: short read", log->path, (unsigned long long)idx);
    uint32_t n = exo_get_le32(hdr), crc = exo_get_le32(hdr + 4);
    if (n == 0 || n > EXO_EVENT_LOG_MAX_RECORD || off + EXO_EVENT_LOG_HEADER + n != next)
        return exo_err_set(err, EXO_EFORMAT, "%s: record %llu: length changed on disk", log->path,
                           (unsigned long long)idx);
    uint8_t *buf = exo_malloc(n);
    if (exo_pread_full(log->fd, buf, n, off + EXO_EVENT_LOG_HEADER) != (ssize_t)n) {
        exo_free(buf);
        return exo_err_set(err, EXO_EIO, "%s: record %llu: short read", log->path, (unsigned long long)idx);
    }
    if (exo_crc32c(0, buf, n) != crc) {
        exo_free(buf);
        return exo_err_set(err, EXO_EFORMAT, "%s: record %llu: checksum mismatch", log->path,
                           (unsigned long long)idx);
    }
    *payload = buf;
    *len = n;
    return 0;
}

void exo_event_log_free_events(exo_event *events, size_t n)
{
    if (!events)
        return;
    for (size_t i = 0; i < n; i++)
        exo_event_clear(&events[i]);
    exo_free(events);
}

int exo_event_log_read_range(exo_event_log *log, uint64_t from_idx, size_t max, exo_event **events,
                             size_t *n, exo_err *err)
{
    *events = NULL;
    *n = 0;
    uint64_t count = exo_event_log_count(log);
    if (from_idx > count)
        return exo_err_set(err, EXO_ERANGE, "%s: read from %llu of %llu records", log->path,
                           (unsigned long long)from_idx, (unsigned long long)count);
    uint64_t avail = count - from_idx;
    size_t want = avail < (uint64_t)max ? (size_t)avail : max;
    if (want == 0)
        return 0;
    exo_event *evs = exo_calloc(want, sizeof *evs);
    for (size_t i = 0; i < want; i++) {
        uint8_t *buf;
        size_t len;
        int rc = exo_event_log_read(log, from_idx + i, &buf, &len, err);
        if (rc == 0) {
            rc = exo_event_decode(buf, len, &evs[i], err);
            exo_free(buf);
            if (rc < 0)
                exo_err_wrap(err, "%s: record %llu", log->path, (unsigned long long)(from_idx + i));
        }
        if (rc < 0) {
            exo_event_log_free_events(evs, i);
            return rc;
        }
    }
    *events = evs;
    *n = want;
    return 0;
}

int exo_event_log_replay(exo_event_log *log, exo_state *st, exo_err *err)
{
    int64_t next = exo_state_last_event_applied_idx(st) + 1;
    uint64_t count = exo_event_log_count(log);
    if ((uint64_t)next > count)
        return exo_err_set(err, EXO_ERANGE, "%s: state is at event %lld but the log has %llu", log->path,
                           (long long)next - 1, (unsigned long long)count);
    for (; (uint64_t)next < count; next++) {
        uint8_t *buf;
        size_t len;
        exo_event ev;
        int rc = exo_event_log_read(log, (uint64_t)next, &buf, &len, err);
        if (rc == 0) {
            rc = exo_event_decode(buf, len, &ev, err);
            exo_free(buf);
            if (rc == 0) {
                rc = exo_state_apply(st, next, &ev, err);
                exo_event_clear(&ev);
            }
        }
        if (rc < 0)
            return exo_err_wrap(err, "%s: replay of record %lld", log->path, (long long)next);
    }
    return 0;
}

/* ---- archiving ---- */

static int compress_file(int in_fd, uint64_t size, const char *dst, exo_err *err)
{
    int out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (out < 0)
        return exo_err_set(err, EXO_EIO, "%s: create: %s", dst, strerror(errno));
    ZSTD_CCtx *cctx = ZSTD_createCCtx();
    size_t in_cap = ZSTD_CStreamInSize(), out_cap = ZSTD_CStreamOutSize();
    uint8_t *in_buf = exo_malloc(in_cap), *out_buf = exo_malloc(out_cap);
    int rc = cctx ? 0 : exo_err_set(err, EXO_ENOMEM, "zstd context");
    if (rc == 0)
        ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, 3);
    uint64_t off = 0;
    bool last = false;
    while (rc == 0 && !last) {
        size_t want = size - off < in_cap ? (size_t)(size - off) : in_cap;
        ssize_t got = exo_pread_full(in_fd, in_buf, want, off);
        if (got != (ssize_t)want) {
            rc = exo_err_set(err, EXO_EIO, "archive: read failed");
            break;
        }
        off += want;
        last = off == size;
        ZSTD_inBuffer ib = {in_buf, want, 0};
        ZSTD_EndDirective mode = last ? ZSTD_e_end : ZSTD_e_continue;
        bool done = false;
        while (!done) {
            ZSTD_outBuffer ob = {out_buf, out_cap, 0};
            size_t remaining = ZSTD_compressStream2(cctx, &ob, &ib, mode);
            if (ZSTD_isError(remaining)) {
                rc = exo_err_set(err, EXO_EIO, "archive: zstd: %s", ZSTD_getErrorName(remaining));
                break;
            }
            if (ob.pos && write(out, out_buf, ob.pos) != (ssize_t)ob.pos) {
                rc = exo_err_set(err, EXO_EIO, "%s: write: %s", dst, strerror(errno));
                break;
            }
            done = last ? remaining == 0 : ib.pos == ib.size;
        }
    }
    if (rc == 0 && fsync(out) < 0)
        rc = exo_err_set(err, EXO_EIO, "%s: fsync: %s", dst, strerror(errno));
    close(out);
    if (rc < 0)
        unlink(dst);
    ZSTD_freeCCtx(cctx);
    exo_free(in_buf);
    exo_free(out_buf);
    return rc;
}

static bool is_archive_name(const char *name)
{
    size_t n = strlen(name);
    return n > strlen("events.") + strlen(".bin.zst") && strncmp(name, "events.", 7) == 0 &&
           strcmp(name + n - 8, ".bin.zst") == 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Deletes all but the newest `keep` archives (names sort by time). */
static void prune_archives(const char *dir, int keep)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!is_archive_name(de->d_name))
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            names = exo_realloc(names, cap * sizeof *names);
        }
        names[n++] = exo_strdup(de->d_name);
    }
    closedir(d);
    if (n)
        qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n; i++) {
        if (n - i > (size_t)keep) {
            char p[PATH_MAX + 512];
            snprintf(p, sizeof p, "%s/%s", dir, names[i]);
            unlink(p);
        }
        exo_free(names[i]);
    }
    exo_free(names);
}

/* A fresh "events.<UTC stamp>.<usec>[-N]<suffix>" path in dir (neither it
 * nor its .zst exists yet). */
static int fresh_name(const char *dir, const char *suffix, char *out, size_t cap, exo_err *err)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    char stamp[64];
    strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%S", &tm);
    for (int attempt = 0; attempt < 100; attempt++) {
        char zst[PATH_MAX + 160];
        if (attempt == 0)
            snprintf(out, cap, "%s/events.%s.%06ld%s", dir, stamp, (long)tv.tv_usec, suffix);
        else
            snprintf(out, cap, "%s/events.%s.%06ld-%02d%s", dir, stamp, (long)tv.tv_usec, attempt, suffix);
        snprintf(zst, sizeof zst, "%s.zst", out);
        if (access(out, F_OK) != 0 && access(zst, F_OK) != 0)
            return 0;
    }
    return exo_err_set(err, EXO_EIO, "%s: no free archive name", dir);
}

static void dir_of(const char *path, char *out, size_t cap)
{
    char *copy = exo_strdup(path);
    snprintf(out, cap, "%s", dirname(copy));
    exo_free(copy);
}

/* The close path: compress the open file itself, then drop it. */
static int archive(exo_event_log *log, exo_err *err)
{
    char dir[PATH_MAX], dst[PATH_MAX + 128];
    dir_of(log->path, dir, sizeof dir);
    int rc = fresh_name(dir, ".bin.zst", dst, sizeof dst, err);
    if (rc == 0)
        rc = compress_file(log->fd, log->end, dst, err);
    if (rc < 0)
        return rc;
    if (unlink(log->path) < 0)
        return exo_err_set(err, EXO_EIO, "%s: unlink after archiving: %s", log->path, strerror(errno));
    sync_dir_of(log->path);
    prune_archives(dir, EXO_EVENT_LOG_MAX_ARCHIVES);
    EXO_LOG_INFO("event log %s: %llu events archived to %s", log->path, (unsigned long long)log->n, dst);
    return 0;
}

int exo_event_log_archive(const char *sealed, exo_err *err)
{
    int fd = open(sealed, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return exo_err_set(err, EXO_EIO, "%s: open: %s", sealed, strerror(errno));
    struct stat sb;
    char dst[PATH_MAX + 8], dir[PATH_MAX];
    snprintf(dst, sizeof dst, "%s.zst", sealed);
    int rc = fstat(fd, &sb) < 0 ? exo_err_set(err, EXO_EIO, "%s: stat: %s", sealed, strerror(errno))
                                : compress_file(fd, (uint64_t)sb.st_size, dst, err);
    close(fd);
    if (rc < 0)
        return rc;
    if (unlink(sealed) < 0)
        return exo_err_set(err, EXO_EIO, "%s: unlink after archiving: %s", sealed, strerror(errno));
    sync_dir_of(sealed);
    dir_of(sealed, dir, sizeof dir);
    prune_archives(dir, EXO_EVENT_LOG_MAX_ARCHIVES);
    EXO_LOG_INFO("event log: %s archived", dst);
    return 0;
}

int exo_event_log_rotate(exo_event_log *log, char *sealed, size_t cap, exo_err *err)
{
    if (cap)
        sealed[0] = 0;
    pthread_mutex_lock(&log->mu);
    int rc = flush_locked(log, err);
    if (rc == 0 && log->n > 0) {
        char dir[PATH_MAX], name[PATH_MAX + 128];
        dir_of(log->path, dir, sizeof dir);
        if ((rc = fresh_name(dir, ".bin", name, sizeof name, err)) == 0 && rename(log->path, name) < 0)
            rc = exo_err_set(err, EXO_EIO, "%s: rename to %s: %s", log->path, name, strerror(errno));
        int fd = -1;
        if (rc == 0 && ((fd = open(log->path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0 ||
                        flock(fd, LOCK_EX | LOCK_NB) < 0)) {
            rc = exo_err_set(err, EXO_EIO, "%s: reopen after rotating: %s", log->path, strerror(errno));
            if (fd >= 0)
                close(fd);
            log->broken = true;
        } else if (rc == 0) {
            close(log->fd);
            log->fd = fd;
            log->n = 0;
            log->end = 0;
            log->dirty = false;
            sync_dir_of(log->path);
            snprintf(sealed, cap, "%s", name);
        }
    }
    pthread_mutex_unlock(&log->mu);
    return rc;
}

/* Sealed logs a crash left uncompressed ("events.<stamp>.bin"). */
static void archive_leftovers(const char *path)
{
    char dir[PATH_MAX];
    dir_of(path, dir, sizeof dir);
    DIR *d = opendir(dir);
    if (!d)
        return;
    char found[16][PATH_MAX + 300];
    int k = 0;
    struct dirent *de;
    while ((de = readdir(d)) && k < 16) {
        size_t n = strlen(de->d_name);
        if (n > 11 && !strncmp(de->d_name, "events.", 7) && !strcmp(de->d_name + n - 4, ".bin") &&
            strcmp(de->d_name, "events.bin"))
            snprintf(found[k++], sizeof found[0], "%s/%s", dir, de->d_name);
    }
    closedir(d);
    for (int i = 0; i < k; i++) {
        exo_err err;
        if (exo_event_log_archive(found[i], &err))
            EXO_LOG_WARN("event log: %s", err.msg);
    }
}

int exo_event_log_close(exo_event_log *log, bool archive_it, exo_err *err)
{
    if (!log)
        return 0;
    pthread_mutex_lock(&log->mu);
    int rc = flush_locked(log, err);
    if (rc == 0 && archive_it && log->n > 0)
        rc = archive(log, err);
    pthread_mutex_unlock(&log->mu);
    close(log->fd);
    pthread_mutex_destroy(&log->mu);
    exo_free(log->offsets);
    exo_free(log->path);
    exo_free(log);
    return rc;
}
