/* Append-only event log with verified recovery, snapshots and compaction
 * (see event_log.h).
 *
 * Locking: `mu` guards the descriptor, the offset index and the flags, and
 * is held only for bookkeeping. Appends hold it for one pwrite; reads copy
 * the offsets they need and dup() the descriptor under it, then read and
 * decode without it (records never change once written, and a compaction
 * or rotation replaces the file by a rename, so a dup'd descriptor keeps
 * reading the file its offsets belong to). A flush holds it only to dup()
 * the descriptor, so the fdatasync itself runs without it. `maint`
 * serialises checkpoints and rotations (taken before `mu`, never after).
 *
 * In memory we keep only the file offset of every kept record (8 bytes per
 * event), so a range read is one pread and opening a log costs one
 * sequential read of the file. Records are always re-verified on read: the
 * offset index is trusted, the file contents are not. */
#include "cluster/event_log.h"

#include "cluster/crc32c.h"
#include "cluster/snapshot.h"
#include "cluster/state.h"
#include "core/alloc.h"
#include "core/bytes.h"
#include "core/log.h"
#include "core/paths.h"

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

#define RANGE_READ_MAX (4u << 20) /* one pread for a range up to this; per record beyond */

static const char FILE_MAGIC[8] = {'E', 'X', 'O', 'L', 'O', 'G', 'B', '1'};

struct exo_event_log {
    pthread_mutex_t mu;
    pthread_mutex_t maint;
    int       fd;
    char     *path;
    uint64_t  first;     /* global index of the first kept record */
    uint64_t  hdr;       /* bytes of file header: 0 or EXO_EVENT_LOG_FILE_HEADER */
    uint64_t *offsets;   /* offsets[i] = file offset of record first + i */
    uint64_t  n, cap;    /* kept records */
    uint64_t  end;       /* file offset after the last record */
    uint64_t  epoch;     /* rotations so far */
    bool      dirty;     /* appended since the last flush */
    bool      broken;    /* a failed append could not be undone */
};

static void side_path(const exo_event_log *log, const char *suffix, char *out, size_t cap)
{
    snprintf(out, cap, "%s%s", log->path, suffix);
}

static void index_push(exo_event_log *log, uint64_t off)
{
    if (log->n == log->cap) {
        log->cap = log->cap ? log->cap * 2 : 64;
        log->offsets = exo_realloc(log->offsets, log->cap * sizeof *log->offsets);
    }
    log->offsets[log->n++] = off;
}

/* Scans the file, filling the offset index; sets *good_end to the end of
 * the intact prefix and describes the first bad record in reason. */
static int scan(exo_event_log *log, uint64_t size, uint64_t *good_end, char *reason, size_t reason_len,
                exo_err *err)
{
    uint64_t off = log->hdr;
    uint8_t hdr[EXO_EVENT_LOG_HEADER];
    uint8_t *buf = NULL;
    size_t buf_cap = 0;
    int rc = 0;
    reason[0] = 0;
    while (off < size) {
        if (size - off < EXO_EVENT_LOG_HEADER) {
            snprintf(reason, reason_len, "record %llu: torn header", (unsigned long long)(log->first + log->n));
            break;
        }
        if (exo_pread_full(log->fd, hdr, sizeof hdr, off) != (ssize_t)sizeof hdr) {
            rc = exo_err_set(err, EXO_EIO, "%s: read at %llu: %s", log->path, (unsigned long long)off,
                             strerror(errno));
            break;
        }
        uint32_t len = exo_get_le32(hdr), crc = exo_get_le32(hdr + 4);
        if (len == 0 || len > EXO_EVENT_LOG_MAX_RECORD) {
            snprintf(reason, reason_len, "record %llu: bad length %u", (unsigned long long)(log->first + log->n),
                     len);
            break;
        }
        if (size - off - EXO_EVENT_LOG_HEADER < len) {
            snprintf(reason, reason_len, "record %llu: torn payload", (unsigned long long)(log->first + log->n));
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
            snprintf(reason, reason_len, "record %llu: checksum mismatch",
                     (unsigned long long)(log->first + log->n));
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

static void put_file_header(uint8_t *h, uint64_t first)
{
    memcpy(h, FILE_MAGIC, 8);
    exo_put_le64(h + 8, first);
    exo_put_le32(h + 16, exo_crc32c(0, h, 16));
    exo_put_le32(h + 20, 0);
}

/* Reads the compaction header if the file has one (log->first, log->hdr). */
static int read_file_header(exo_event_log *log, uint64_t size, exo_err *err)
{
    uint8_t h[EXO_EVENT_LOG_FILE_HEADER];
    size_t got = size < sizeof h ? (size_t)size : sizeof h;
    if (got < 8 || exo_pread_full(log->fd, h, got, 0) != (ssize_t)got || memcmp(h, FILE_MAGIC, 8) != 0)
        return 0; /* a first record's length is never this large: no header */
    if (got < sizeof h || exo_get_le32(h + 16) != exo_crc32c(0, h, 16))
        return exo_err_set(err, EXO_EFORMAT, "%s: damaged file header", log->path);
    log->first = exo_get_le64(h + 8);
    if (log->first > (UINT64_C(1) << 62)) /* indices must not wrap: no log lives that long */
        return exo_err_set(err, EXO_EFORMAT, "%s: first index %llu in the header is out of range", log->path,
                           (unsigned long long)log->first);
    log->hdr = EXO_EVENT_LOG_FILE_HEADER;
    return 0;
}

int exo_event_log_open(const char *path, exo_event_log **out, exo_event_log_recovery *rec, exo_err *err)
{
    *out = NULL;
    if (rec)
        memset(rec, 0, sizeof *rec);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return exo_err_set(err, errno == ENOENT ? EXO_ENOENT : EXO_EIO, "%s: open: %s", path, strerror(errno));
    if (exo_flock_exclusive(fd) < 0) {
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
    pthread_mutex_init(&log->maint, NULL);
    log->fd = fd;
    log->path = exo_strdup(path);
    char side[PATH_MAX + 32]; /* what a crash mid-compaction or mid-snapshot left (we hold the lock) */
    side_path(log, ".compact", side, sizeof side);
    unlink(side);
    side_path(log, ".snap.tmp", side, sizeof side);
    unlink(side);
    uint64_t size = (uint64_t)sb.st_size, good = 0;
    char reason[128];
    int rc = read_file_header(log, size, err);
    if (rc == 0)
        rc = scan(log, size, &good, reason, sizeof reason, err);
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
        pthread_mutex_destroy(&log->maint);
        exo_free(log);
        return rc;
    }
    log->end = good;
    exo_fsync_dir_of(path);
    if (rec) {
        rec->records = log->n;
        rec->first = log->first;
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
    uint64_t n = log->first + log->n;
    pthread_mutex_unlock(&log->mu);
    return n;
}

uint64_t exo_event_log_first(exo_event_log *log)
{
    pthread_mutex_lock(&log->mu);
    uint64_t f = log->first;
    pthread_mutex_unlock(&log->mu);
    return f;
}

uint64_t exo_event_log_bytes(exo_event_log *log)
{
    pthread_mutex_lock(&log->mu);
    uint64_t b = log->end;
    pthread_mutex_unlock(&log->mu);
    return b;
}

uint64_t exo_event_log_epoch(exo_event_log *log)
{
    pthread_mutex_lock(&log->mu);
    uint64_t e = log->epoch;
    pthread_mutex_unlock(&log->mu);
    return e;
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
        *idx = log->first + log->n - 1;
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

/* A consistent view of records [from, from + want) for reading without the
 * lock: their offsets (want + 1 entries, the last one where the range
 * ends) and a descriptor of the file they are in (close it). */
typedef struct range_view {
    int       fd;
    uint64_t *offs;
    size_t    want;
} range_view;

static int view_range(exo_event_log *log, uint64_t from, size_t max, range_view *v, exo_err *err)
{
    memset(v, 0, sizeof *v);
    v->fd = -1;
    pthread_mutex_lock(&log->mu);
    uint64_t count = log->first + log->n;
    int rc = 0;
    if (from < log->first)
        rc = exo_err_set(err, EXO_ENOENT, "%s: event %llu was compacted away (the oldest kept is %llu)", log->path,
                         (unsigned long long)from, (unsigned long long)log->first);
    else if (from > count)
        rc = exo_err_set(err, EXO_ERANGE, "%s: read from %llu of %llu records", log->path,
                         (unsigned long long)from, (unsigned long long)count);
    if (rc == 0) {
        uint64_t avail = count - from;
        v->want = avail < (uint64_t)max ? (size_t)avail : max;
    }
    if (rc == 0 && v->want) {
        uint64_t k = from - log->first;
        v->offs = exo_malloc((v->want + 1) * sizeof *v->offs);
        memcpy(v->offs, log->offsets + k, v->want * sizeof *v->offs);
        v->offs[v->want] = k + v->want < log->n ? log->offsets[k + v->want] : log->end;
        if ((v->fd = dup(log->fd)) < 0) {
            rc = exo_err_set(err, EXO_EIO, "%s: dup: %s", log->path, strerror(errno));
            exo_free(v->offs);
            v->offs = NULL;
        }
    }
    pthread_mutex_unlock(&log->mu);
    return rc;
}

static void view_free(range_view *v)
{
    if (v->fd >= 0)
        close(v->fd);
    exo_free(v->offs);
}

/* Checks one record read from the file into rec (its header + payload). */
static int check_record(const char *path, uint64_t idx, const uint8_t *rec, uint64_t span, exo_err *err)
{
    uint32_t n = exo_get_le32(rec), crc = exo_get_le32(rec + 4);
    if (n == 0 || n > EXO_EVENT_LOG_MAX_RECORD || EXO_EVENT_LOG_HEADER + (uint64_t)n != span)
        return exo_err_set(err, EXO_EFORMAT, "%s: record %llu: length changed on disk", path,
                           (unsigned long long)idx);
    if (exo_crc32c(0, rec + EXO_EVENT_LOG_HEADER, n) != crc)
        return exo_err_set(err, EXO_EFORMAT, "%s: record %llu: checksum mismatch", path, (unsigned long long)idx);
    return 0;
}

/* Reads and checks record i of a view into a fresh buffer (the record
 * with its header). */
static int view_read(const char *path, const range_view *v, uint64_t from, size_t i, uint8_t **rec, exo_err *err)
{
    uint64_t span = v->offs[i + 1] - v->offs[i];
    *rec = NULL;
    if (span < EXO_EVENT_LOG_HEADER || span > EXO_EVENT_LOG_HEADER + (uint64_t)EXO_EVENT_LOG_MAX_RECORD)
        return exo_err_set(err, EXO_EFORMAT, "%s: record %llu: bad span", path, (unsigned long long)(from + i));
    uint8_t *b = exo_malloc((size_t)span);
    int rc = 0;
    if (exo_pread_full(v->fd, b, (size_t)span, v->offs[i]) != (ssize_t)span)
        rc = exo_err_set(err, EXO_EIO, "%s: record %llu: short read", path, (unsigned long long)(from + i));
    else
        rc = check_record(path, from + i, b, span, err);
    if (rc < 0)
        exo_free(b);
    else
        *rec = b;
    return rc;
}

int exo_event_log_read(exo_event_log *log, uint64_t idx, uint8_t **payload, size_t *len, exo_err *err)
{
    *payload = NULL;
    *len = 0;
    range_view v;
    int rc = view_range(log, idx, 1, &v, err);
    if (rc == 0 && v.want == 0)
        rc = exo_err_set(err, EXO_ERANGE, "%s: record %llu of %llu", log->path, (unsigned long long)idx,
                         (unsigned long long)idx);
    uint8_t *rec = NULL;
    if (rc == 0)
        rc = view_read(log->path, &v, idx, 0, &rec, err);
    view_free(&v);
    if (rc < 0)
        return rc;
    size_t n = exo_get_le32(rec);
    memmove(rec, rec + EXO_EVENT_LOG_HEADER, n);
    *payload = rec;
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

/* Decodes records from from_idx on; on a failure, *n says how many before
 * the bad one were decoded (and handed out). */
static int read_range_partial(exo_event_log *log, uint64_t from_idx, size_t max, exo_event **events, size_t *n,
                              exo_err *err)
{
    *events = NULL;
    *n = 0;
    range_view v;
    int rc = view_range(log, from_idx, max, &v, err);
    if (rc < 0 || v.want == 0) {
        view_free(&v);
        return rc;
    }
    /* small ranges (the common case: a page of /events, a catch-up batch)
     * in one pread; large records one at a time */
    uint64_t span = v.offs[v.want] - v.offs[0];
    uint8_t *all = NULL;
    if (span <= RANGE_READ_MAX) {
        all = exo_malloc(span ? (size_t)span : 1);
        if (exo_pread_full(v.fd, all, (size_t)span, v.offs[0]) != (ssize_t)span)
            rc = exo_err_set(err, EXO_EIO, "%s: records %llu..: short read", log->path, (unsigned long long)from_idx);
    }
    exo_event *evs = exo_calloc(v.want, sizeof *evs);
    size_t i = 0;
    for (; rc == 0 && i < v.want; i++) {
        uint8_t *one = NULL;
        const uint8_t *rec;
        if (all) {
            rec = all + (v.offs[i] - v.offs[0]);
            rc = check_record(log->path, from_idx + i, rec, v.offs[i + 1] - v.offs[i], err);
        } else {
            rc = view_read(log->path, &v, from_idx, i, &one, err);
            rec = one;
        }
        if (rc == 0 && (rc = exo_event_decode(rec + EXO_EVENT_LOG_HEADER, exo_get_le32(rec), &evs[i], err)) < 0)
            exo_err_wrap(err, "%s: record %llu", log->path, (unsigned long long)(from_idx + i));
        exo_free(one);
        if (rc < 0)
            break;
    }
    exo_free(all);
    view_free(&v);
    *events = evs;
    *n = rc < 0 ? i : v.want;
    return rc;
}

int exo_event_log_read_range(exo_event_log *log, uint64_t from_idx, size_t max, exo_event **events,
                             size_t *n, exo_err *err)
{
    int rc = read_range_partial(log, from_idx, max, events, n, err);
    if (rc < 0) {
        exo_event_log_free_events(*events, *n);
        *events = NULL;
        *n = 0;
    }
    return rc;
}

int exo_event_log_replay(exo_event_log *log, exo_state *st, exo_err *err)
{
    int64_t next = exo_state_last_event_applied_idx(st) + 1;
    uint64_t count = exo_event_log_count(log), first = exo_event_log_first(log);
    if ((uint64_t)next > count)
        return exo_err_set(err, EXO_ERANGE, "%s: state is at event %lld but the log has %llu", log->path,
                           (long long)next - 1, (unsigned long long)count);
    if ((uint64_t)next < first)
        return exo_err_set(err, EXO_ENOENT, "%s: state is at event %lld but events before %llu were compacted",
                           log->path, (long long)next - 1, (unsigned long long)first);
    while ((uint64_t)next < count) {
        exo_event *evs;
        size_t got;
        int rd = read_range_partial(log, (uint64_t)next, 256, &evs, &got, err), rc = 0;
        for (size_t i = 0; i < got && rc == 0; i++, next++)
            if ((rc = exo_state_apply(st, next, &evs[i], err)) < 0)
                exo_err_wrap(err, "%s: replay of record %lld", log->path, (long long)next);
        exo_event_log_free_events(evs, got);
        if (rc < 0)
            return rc;
        if (rd < 0) /* the records before the bad one are folded */
            return exo_err_wrap(err, "%s: replay of record %lld", log->path, (long long)next);
        if (!got)
            break;
    }
    return 0;
}

/* ---- snapshots and compaction ---- */

/* Copies bytes [from, to) of src to dst at dst_off. */
static int copy_bytes(int src, uint64_t from, uint64_t to, int dst, uint64_t dst_off)
{
    size_t cap = 1u << 20;
    uint8_t *buf = exo_malloc(cap);
    int rc = 0;
    while (from < to) {
        size_t k = to - from < cap ? (size_t)(to - from) : cap;
        if (exo_pread_full(src, buf, k, from) != (ssize_t)k || exo_pwrite_full(dst, buf, k, dst_off) < 0) {
            rc = -1;
            break;
        }
        from += k;
        dst_off += k;
    }
    exo_free(buf);
    return rc;
}

/* Drops the records before keep_from (keep_from may be past the end: the
 * log becomes empty and continues there). Caller holds maint. The bulk of
 * the copy runs without mu; only what was appended meanwhile is copied
 * under it, with the swap. */
static int compact_to(exo_event_log *log, uint64_t keep_from, uint64_t *dropped, exo_err *err)
{
    if (dropped)
        *dropped = 0;
    pthread_mutex_lock(&log->mu);
    if (log->broken) {
        pthread_mutex_unlock(&log->mu);
        return exo_err_set(err, EXO_EIO, "%s: log is unusable after a failed write or sync", log->path);
    }
    if (keep_from <= log->first) {
        pthread_mutex_unlock(&log->mu);
        return 0;
    }
    uint64_t count = log->first + log->n;
    uint64_t from_off = keep_from < count ? log->offsets[keep_from - log->first] : log->end;
    uint64_t end0 = log->end;
    int src = dup(log->fd);
    pthread_mutex_unlock(&log->mu);
    char tmp[PATH_MAX + 32];
    side_path(log, ".compact", tmp, sizeof tmp);
    if (src < 0)
        return exo_err_set(err, EXO_EIO, "%s: dup: %s", log->path, strerror(errno));
    int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        close(src);
        return exo_err_set(err, EXO_EIO, "%s: create: %s", tmp, strerror(e));
    }
    uint8_t h[EXO_EVENT_LOG_FILE_HEADER];
    put_file_header(h, keep_from);
    int rc = 0;
    if (exo_pwrite_full(fd, h, sizeof h, 0) < 0 || copy_bytes(src, from_off, end0, fd, sizeof h) < 0 ||
        fdatasync(fd) < 0)
        rc = exo_err_set(err, EXO_EIO, "%s: writing the compacted log: %s", tmp, strerror(errno));
    close(src);
    if (rc == 0) {
        pthread_mutex_lock(&log->mu);
        uint64_t delta = from_off - sizeof h; /* old offset - delta = new offset */
        if (log->broken)
            rc = exo_err_set(err, EXO_EIO, "%s: log is unusable after a failed write or sync", log->path);
        else if (copy_bytes(log->fd, end0, log->end, fd, end0 - delta) < 0 || fdatasync(fd) < 0)
            rc = exo_err_set(err, EXO_EIO, "%s: writing the compacted log: %s", tmp, strerror(errno));
        else if (flock(fd, LOCK_EX | LOCK_NB) < 0)
            rc = exo_err_set(err, EXO_EIO, "%s: lock: %s", tmp, strerror(errno));
        else if (rename(tmp, log->path) < 0)
            rc = exo_err_set(err, EXO_EIO, "%s: rename over %s: %s", tmp, log->path, strerror(errno));
        if (rc == 0) {
            exo_fsync_dir_of(log->path); /* the new file must be the log before anything is acked from it */
            uint64_t keep_k = keep_from < count ? keep_from - log->first : log->n;
            uint64_t kept = log->n - keep_k;
            for (uint64_t i = 0; i < kept; i++)
                log->offsets[i] = log->offsets[keep_k + i] - delta;
            if (dropped)
                *dropped = keep_k;
            log->n = kept;
            log->first = keep_from;
            log->end -= delta;
            log->hdr = sizeof h;
            log->dirty = false; /* everything in the new file was synced above */
            close(log->fd);
            log->fd = fd;
            fd = -1;
        }
        pthread_mutex_unlock(&log->mu);
    }
    if (fd >= 0) {
        close(fd);
        unlink(tmp);
    }
    return rc;
}

int exo_event_log_checkpoint(exo_event_log *log, const uint8_t *snapshot, size_t len, bool install, uint64_t epoch,
                             uint64_t *dropped, exo_err *err)
{
    if (dropped)
        *dropped = 0;
    int64_t idx;
    int rc = exo_snapshot_check(snapshot, len, &idx, err);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&log->maint);
    uint64_t count = exo_event_log_count(log);
    char cur[PATH_MAX + 32], prev[PATH_MAX + 32];
    side_path(log, ".snap", cur, sizeof cur);
    side_path(log, ".snap.prev", prev, sizeof prev);
    if (exo_event_log_epoch(log) != epoch)
        rc = exo_err_set(err, EXO_ECANCELED, "%s: rotated since the snapshot was taken", log->path);
    else if (!install && (uint64_t)idx >= count)
        rc = exo_err_set(err, EXO_EINVAL, "%s: snapshot at event %lld, but the log has %llu", log->path,
                         (long long)idx, (unsigned long long)count);
    uint64_t keep_from = exo_event_log_first(log);
    if (rc == 0) {
        /* the current snapshot, if sound, becomes the previous one and the
         * log keeps what follows it */
        uint8_t *old;
        size_t old_len;
        int64_t old_idx;
        exo_err e2;
        if (!install && exo_snapshot_read_file(cur, &old, &old_len, &old_idx, &e2) == 0) {
            exo_free(old);
            if (old_idx < idx && rename(cur, prev) == 0 && (uint64_t)old_idx + 1 > keep_from)
                keep_from = (uint64_t)old_idx + 1;
        }
        if (install) {
            unlink(prev); /* older than anything the log will hold */
            keep_from = (uint64_t)idx + 1;
        }
        rc = exo_snapshot_write_file(cur, snapshot, len, err);
    }
    if (rc == 0)
        rc = compact_to(log, keep_from, dropped, err);
    pthread_mutex_unlock(&log->maint);
    return rc;
}

int exo_event_log_recover(exo_event_log *log, exo_state **out, exo_event_log_snapshot_info *info, exo_err *err)
{
    *out = NULL;
    exo_event_log_snapshot_info local;
    if (!info)
        info = &local;
    memset(info, 0, sizeof *info);
    info->snapshot_idx = -1;
    pthread_mutex_lock(&log->maint);
    uint64_t first = exo_event_log_first(log), count = exo_event_log_count(log);
    const char *suffix[2] = {".snap", ".snap.prev"};
    exo_state *st = NULL;
    for (int k = 0; k < 2 && !st; k++) {
        char p[PATH_MAX + 32];
        side_path(log, suffix[k], p, sizeof p);
        exo_err e2 = {0};
        uint8_t *buf = NULL;
        size_t len;
        int64_t idx;
        int r = exo_snapshot_read_file(p, &buf, &len, &idx, &e2);
        if (r == 0 && ((uint64_t)idx + 1 < first || (uint64_t)idx >= count))
            r = exo_err_set(&e2, EXO_ERANGE, "%s covers events to %lld, the log holds %llu..%llu", p, (long long)idx,
                            (unsigned long long)first, (unsigned long long)count);
        if (r == 0)
            r = exo_snapshot_decode(buf, len, &st, &e2);
        exo_free(buf);
        if (r == 0) {
            info->snapshot_idx = idx;
            info->used_previous = k == 1;
        } else if (r != EXO_ENOENT) {
            size_t at = strlen(info->reason);
            snprintf(info->reason + at, sizeof info->reason - at, "%s%s", at ? "; " : "", e2.msg);
        }
    }
    pthread_mutex_unlock(&log->maint);
    if (!st && first > 0)
        return exo_err_set(err, EXO_EFORMAT, "%s: events before %llu were compacted and no snapshot covers them (%s)",
                           log->path, (unsigned long long)first, info->reason);
    if (!st)
        st = exo_state_new();
    int64_t start = exo_state_last_event_applied_idx(st);
    int rc = exo_event_log_replay(log, st, err);
    info->replayed = (uint64_t)(exo_state_last_event_applied_idx(st) - start);
    if (rc < 0) {
        exo_state_free(st);
        return rc;
    }
    if (info->reason[0])
        EXO_LOG_WARN("event log %s: snapshot skipped: %s", log->path, info->reason);
    *out = st;
    return 0;
}

static void remove_snapshots(exo_event_log *log)
{
    char p[PATH_MAX + 32];
    side_path(log, ".snap", p, sizeof p);
    unlink(p);
    side_path(log, ".snap.prev", p, sizeof p);
    unlink(p);
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
    exo_fsync_dir_of(log->path);
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
    exo_fsync_dir_of(sealed);
    dir_of(sealed, dir, sizeof dir);
    prune_archives(dir, EXO_EVENT_LOG_MAX_ARCHIVES);
    EXO_LOG_INFO("event log: %s archived", dst);
    return 0;
}

int exo_event_log_rotate(exo_event_log *log, char *sealed, size_t cap, exo_err *err)
{
    if (cap)
        sealed[0] = 0;
    pthread_mutex_lock(&log->maint);
    pthread_mutex_lock(&log->mu);
    int rc = flush_locked(log, err);
    log->epoch++; /* whatever happens below, a checkpoint of the old State must not land here */
    if (rc == 0 && log->n == 0 && log->first > 0) {
        /* compacted to nothing: the next session starts at index 0 in a plain file */
        if (ftruncate(log->fd, 0) < 0 || fdatasync(log->fd) < 0)
            rc = exo_err_set(err, EXO_EIO, "%s: truncate after rotating: %s", log->path, strerror(errno));
        if (rc == 0) {
            log->first = 0;
            log->hdr = 0;
            log->end = 0;
        }
    }
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
            log->first = 0;
            log->hdr = 0;
            log->end = 0;
            log->dirty = false;
            exo_fsync_dir_of(log->path);
            snprintf(sealed, cap, "%s", name);
        }
    }
    pthread_mutex_unlock(&log->mu);
    if (rc == 0)
        remove_snapshots(log); /* they describe the sealed log */
    pthread_mutex_unlock(&log->maint);
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
    pthread_mutex_lock(&log->maint);
    pthread_mutex_lock(&log->mu);
    int rc = flush_locked(log, err);
    if (rc == 0 && archive_it && log->n > 0) {
        rc = archive(log, err);
        if (rc == 0)
            remove_snapshots(log);
    }
    pthread_mutex_unlock(&log->mu);
    pthread_mutex_unlock(&log->maint);
    close(log->fd);
    pthread_mutex_destroy(&log->mu);
    pthread_mutex_destroy(&log->maint);
    exo_free(log->offsets);
    exo_free(log->path);
    exo_free(log);
    return rc;
}
