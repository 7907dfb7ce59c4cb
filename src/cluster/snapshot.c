/* State snapshot files (see snapshot.h). */
#include "cluster/snapshot.h"

#include "cluster/crc32c.h"
#include "core/alloc.h"
#include "core/bytes.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char MAGIC[8] = {'E', 'X', 'O', 'S', 'N', 'A', 'P', '1'};

bool exo_event_redact(const exo_event *ev, exo_event *out)
{
    if (ev->kind != EXO_EVENT_TASK_CREATED)
        return false;
    const exo_task *t = &ev->u.task_created.task;
    if (!t->params_json || !strcmp(t->params_json, EXO_REDACTED_PARAMS))
        return false;
    exo_event_copy(out, ev);
    exo_free(out->u.task_created.task.params_json);
    out->u.task_created.task.params_json = exo_strdup(EXO_REDACTED_PARAMS);
    return true;
}

int exo_snapshot_encode(const exo_state *st, bool redact, uint8_t **out, size_t *len, exo_err *err)
{
    *out = NULL;
    *len = 0;
    int64_t idx = exo_state_last_event_applied_idx(st);
    if (idx < 0)
        return exo_err_set(err, EXO_EINVAL, "snapshot of a State that holds no event");
    exo_event_list evs = {0};
    exo_state_to_events(st, &evs);
    size_t cap = EXO_SNAPSHOT_HEADER + 4096, used = EXO_SNAPSHOT_HEADER;
    uint8_t *buf = exo_malloc(cap);
    int rc = 0;
    for (size_t i = 0; i < evs.n && rc == 0; i++) {
        exo_event red;
        bool r = redact && exo_event_redact(&evs.v[i], &red);
        uint8_t *e;
        size_t elen;
        rc = exo_event_encode(r ? &red : &evs.v[i], &e, &elen, err);
        if (r)
            exo_event_clear(&red);
        if (rc < 0)
            break;
        if (used + 4 + elen > EXO_SNAPSHOT_MAX_BYTES) {
            exo_free(e);
            rc = exo_err_set(err, EXO_ETOOBIG, "snapshot over %llu bytes",
                             (unsigned long long)EXO_SNAPSHOT_MAX_BYTES);
            break;
        }
        while (used + 4 + elen > cap)
            cap *= 2;
        buf = exo_realloc(buf, cap);
        exo_put_le32(buf + used, (uint32_t)elen);
        memcpy(buf + used + 4, e, elen);
        used += 4 + elen;
        exo_free(e);
    }
    if (rc < 0) {
        exo_free(buf);
        exo_event_list_clear(&evs);
        return exo_err_wrap(err, "snapshot");
    }
    memcpy(buf, MAGIC, 8);
    exo_put_le64(buf + 8, (uint64_t)idx);
    exo_put_le64(buf + 16, (uint64_t)(used - EXO_SNAPSHOT_HEADER));
    exo_put_le32(buf + 24, (uint32_t)evs.n);
    uint32_t crc = exo_crc32c(exo_crc32c(0, buf, 28), buf + EXO_SNAPSHOT_HEADER, used - EXO_SNAPSHOT_HEADER);
    exo_put_le32(buf + 28, crc);
    exo_event_list_clear(&evs);
    *out = buf;
    *len = used;
    return 0;
}

int exo_snapshot_check(const uint8_t *buf, size_t len, int64_t *last_idx, exo_err *err)
{
    if (len < EXO_SNAPSHOT_HEADER || memcmp(buf, MAGIC, 8) != 0)
        return exo_err_set(err, EXO_EFORMAT, "snapshot: no header");
    uint64_t idx = exo_get_le64(buf + 8), payload = exo_get_le64(buf + 16);
    if (payload != len - EXO_SNAPSHOT_HEADER)
        return exo_err_set(err, EXO_EFORMAT, "snapshot: %zu payload bytes, header says %llu (torn?)",
                           len - EXO_SNAPSHOT_HEADER, (unsigned long long)payload);
    uint32_t crc = exo_crc32c(exo_crc32c(0, buf, 28), buf + EXO_SNAPSHOT_HEADER, len - EXO_SNAPSHOT_HEADER);
    if (crc != exo_get_le32(buf + 28))
        return exo_err_set(err, EXO_EFORMAT, "snapshot: checksum mismatch");
    if (idx > (uint64_t)INT64_MAX)
        return exo_err_set(err, EXO_EFORMAT, "snapshot: bad index");
    if (last_idx)
        *last_idx = (int64_t)idx;
    return 0;
}

int exo_snapshot_decode(const uint8_t *buf, size_t len, exo_state **out, exo_err *err)
{
    *out = NULL;
    int64_t idx;
    int rc = exo_snapshot_check(buf, len, &idx, err);
    if (rc < 0)
        return rc;
    uint32_t n = exo_get_le32(buf + 24);
    exo_event *evs = exo_calloc(n ? n : 1, sizeof *evs);
    size_t off = EXO_SNAPSHOT_HEADER;
    uint32_t got = 0;
    for (; got < n; got++) {
        if (len - off < 4 || len - off - 4 < exo_get_le32(buf + off)) {
            rc = exo_err_set(err, EXO_EFORMAT, "snapshot: event %u overruns the file", got);
            break;
        }
        uint32_t elen = exo_get_le32(buf + off);
        if ((rc = exo_event_decode(buf + off + 4, elen, &evs[got], err)) < 0) {
            exo_err_wrap(err, "snapshot: event %u", got);
            break;
        }
        off += 4 + (size_t)elen;
    }
    if (rc == 0 && off != len)
        rc = exo_err_set(err, EXO_EFORMAT, "snapshot: %zu trailing bytes", len - off);
    if (rc == 0 && (rc = exo_state_from_events(evs, n, idx, out, err)) < 0)
        exo_err_wrap(err, "snapshot");
    for (uint32_t i = 0; i < got; i++)
        exo_event_clear(&evs[i]);
    exo_free(evs);
    if (rc < 0 && rc != EXO_ENOMEM) { /* whatever failed inside, the file is what is wrong */
        rc = EXO_EFORMAT;
        if (err)
            err->code = rc;
    }
    return rc;
}

int exo_snapshot_write_file(const char *path, const uint8_t *buf, size_t len, exo_err *err)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return exo_err_set(err, EXO_EIO, "%s: create: %s", tmp, strerror(errno));
    int rc = 0;
    if (exo_write_full(fd, buf, len) < 0)
        rc = exo_err_set(err, errno == ENOSPC ? EXO_ENOSPC : EXO_EIO, "%s: write: %s", tmp, strerror(errno));
    else if (fsync(fd) < 0)
        rc = exo_err_set(err, EXO_EIO, "%s: fsync: %s", tmp, strerror(errno));
    close(fd);
    if (rc == 0 && rename(tmp, path) < 0)
        rc = exo_err_set(err, EXO_EIO, "%s: rename to %s: %s", tmp, path, strerror(errno));
    if (rc < 0) {
        unlink(tmp);
        return rc;
    }
    exo_fsync_dir_of(path);
    return 0;
}

int exo_snapshot_read_file(const char *path, uint8_t **buf, size_t *len, int64_t *last_idx, exo_err *err)
{
    *buf = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return exo_err_set(err, errno == ENOENT ? EXO_ENOENT : EXO_EIO, "%s: open: %s", path, strerror(errno));
    struct stat sb;
    int rc = 0;
    if (fstat(fd, &sb) < 0)
        rc = exo_err_set(err, EXO_EIO, "%s: stat: %s", path, strerror(errno));
    else if ((uint64_t)sb.st_size > EXO_SNAPSHOT_MAX_BYTES + EXO_SNAPSHOT_HEADER)
        rc = exo_err_set(err, EXO_EFORMAT, "%s: %lld bytes, too large for a snapshot", path, (long long)sb.st_size);
    uint8_t *b = NULL;
    size_t n = rc == 0 ? (size_t)sb.st_size : 0;
    if (rc == 0) {
        b = exo_try_malloc(n ? n : 1);
        if (!b)
            rc = exo_err_set(err, EXO_ENOMEM, "%s: %zu bytes", path, n);
        else if (exo_pread_full(fd, b, n, 0) != (ssize_t)n)
            rc = exo_err_set(err, EXO_EIO, "%s: short read", path);
    }
    close(fd);
    if (rc == 0 && (rc = exo_snapshot_check(b, n, last_idx, err)) < 0)
        exo_err_wrap(err, "%s", path);
    if (rc < 0) {
        exo_free(b);
        return rc;
    }
    *buf = b;
    *len = n;
    return 0;
}

int exo_snapshot_load_file(const char *path, exo_state **out, exo_err *err)
{
    *out = NULL;
    uint8_t *buf;
    size_t len;
    int rc = exo_snapshot_read_file(path, &buf, &len, NULL, err);
    if (rc < 0)
        return rc;
    if ((rc = exo_snapshot_decode(buf, len, out, err)) < 0)
        exo_err_wrap(err, "%s", path);
    exo_free(buf);
    return rc;
}
