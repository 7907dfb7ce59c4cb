/* Event log: CRC-32C vectors, append/read/reopen, and crash recovery: the
 * file cut at every byte of the last record and at random offsets, random
 * byte flips, zero-filled tails, oversized lengths. Reopening must keep
 * exactly the intact prefix and appends must continue after it. Also
 * locking, read_range bounds and zstd archiving with the 5-archive cap. */
#include "cluster/crc32c.h"
#include "cluster/event_log.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"
#include "test_cluster_fixtures.h"

#include <criterion/criterion.h>
#include "test_tmpdir.h"
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zstd.h>

static char tmpdir[64];
static char logpath[128];

static void setup(void)
{
    test_tmpdir_make(tmpdir, "evlog");
    snprintf(logpath, sizeof logpath, "%s/events.bin", tmpdir);
    exo_log_set_level(EXO_LOG_ERROR);  /* recovery warnings are expected here */
}

static void teardown(void) { test_tmpdir_remove(tmpdir); }

TestSuite(cluster_event_log, .init = setup, .fini = teardown);

/* ---- CRC-32C ---- */

static uint32_t crc_bitwise(const uint8_t *p, size_t n)
{
    uint32_t c = ~0u;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
    }
    return ~c;
}

Test(cluster_event_log, crc32c_vectors)
{
    cr_assert_eq(exo_crc32c(0, "123456789", 9), 0xE3069283u);
    cr_assert_eq(exo_crc32c(0, "", 0), 0);
    uint8_t b[32];
    memset(b, 0, sizeof b);
    cr_assert_eq(exo_crc32c(0, b, 32), 0x8A9136AAu);  /* RFC 3720 B.4 */
    memset(b, 0xff, sizeof b);
    cr_assert_eq(exo_crc32c(0, b, 32), 0x62A8AB43u);
    for (int i = 0; i < 32; i++)
        b[i] = (uint8_t)i;
    cr_assert_eq(exo_crc32c(0, b, 32), 0x46DD794Eu);
    /* slicing-by-8 == bitwise for every length and alignment; incremental
     * == one shot */
    uint8_t buf[300];
    srand(7);
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (uint8_t)rand();
    for (size_t off = 0; off < 8; off++)
        for (size_t n = 0; n + off <= sizeof buf; n += 7) {
            uint32_t want = crc_bitwise(buf + off, n);
            cr_assert_eq(exo_crc32c(0, buf + off, n), want);
            size_t half = n / 3;
            cr_assert_eq(exo_crc32c(exo_crc32c(0, buf + off, half), buf + off + half, n - half), want);
        }
}

/* ---- helpers ---- */

static exo_event_log *open_log(exo_event_log_recovery *rec)
{
    exo_err err = {0};
    exo_event_log *log;
    cr_assert_eq(exo_event_log_open(logpath, &log, rec, &err), 0, "%s", err.msg);
    return log;
}

static void close_log(exo_event_log *log)
{
    exo_err err = {0};
    cr_assert_eq(exo_event_log_close(log, false, &err), 0, "%s", err.msg);
}

/* Writes n events (of varied kinds); returns the file size and the end
 * offset of every record in ends[]. */
static uint64_t write_events(int n, exo_event *evs, uint64_t *ends)
{
    exo_err err = {0};
    exo_event_log *log = open_log(NULL);
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        fx_event(&evs[i], (exo_event_kind)(i % EXO_EVENT__COUNT), i);
        uint64_t idx;
        cr_assert_eq(exo_event_log_append_event(log, &evs[i], &idx, &err), 0, "%s", err.msg);
        cr_assert_eq(idx, (uint64_t)i);
        uint8_t *buf;
        size_t len;
        cr_assert_eq(exo_event_encode(&evs[i], &buf, &len, &err), 0);
        exo_free(buf);
        off += EXO_EVENT_LOG_HEADER + len;
        ends[i] = off;
    }
    cr_assert_eq(exo_event_log_flush(log, &err), 0);
    cr_assert_eq(exo_event_log_flush(log, &err), 0, "flush with nothing new");
    close_log(log);
    return off;
}

static uint8_t *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = exo_malloc((size_t)n + 1);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void write_file(const char *path, const uint8_t *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(b, 1, n, f), n);
    fclose(f);
}

static uint64_t file_size(const char *path)
{
    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0);
    return (uint64_t)sb.st_size;
}

/* Reopens and checks that exactly the first `keep` events survive, equal to
 * the originals; then appends one more and checks it lands at index keep. */
static void check_prefix(exo_event *evs, uint64_t keep, uint64_t keep_bytes, uint64_t size_before)
{
    exo_err err = {0};
    exo_event_log_recovery rec;
    exo_event_log *log = open_log(&rec);
    cr_assert_eq(exo_event_log_count(log), keep, "kept %llu, want %llu", (unsigned long long)exo_event_log_count(log),
                 (unsigned long long)keep);
    cr_assert_eq(rec.records, keep);
    cr_assert_eq(rec.bytes_kept, keep_bytes);
    cr_assert_eq(rec.bytes_truncated, size_before - keep_bytes);
    cr_assert_eq(rec.reason[0] != 0, size_before != keep_bytes);
    cr_assert_eq(file_size(logpath), keep_bytes, "tail cut on disk");
    exo_event *got;
    size_t n;
    cr_assert_eq(exo_event_log_read_range(log, 0, 1000, &got, &n, &err), 0, "%s", err.msg);
    cr_assert_eq(n, keep);
    for (size_t i = 0; i < n; i++)
        cr_assert(exo_event_equal(&got[i], &evs[i]), "event %zu", i);
    exo_event_log_free_events(got, n);

    exo_event extra;
    fx_event(&extra, EXO_EVENT_NODE_TIMED_OUT, 999);
    uint64_t idx;
    cr_assert_eq(exo_event_log_append_event(log, &extra, &idx, &err), 0, "%s", err.msg);
    cr_assert_eq(idx, keep);
    close_log(log);
    log = open_log(&rec);
    cr_assert_eq(exo_event_log_count(log), keep + 1);
    cr_assert_eq(rec.bytes_truncated, 0);
    cr_assert_eq(exo_event_log_read_range(log, keep, 10, &got, &n, &err), 0);
    cr_assert_eq(n, 1);
    cr_assert(exo_event_equal(&got[0], &extra));
    exo_event_log_free_events(got, n);
    exo_event_clear(&extra);
    close_log(log);
}

/* ---- tests ---- */

Test(cluster_event_log, append_read_reopen)
{
    exo_err err = {0};
    exo_event evs[25];
    uint64_t ends[25];
    write_events(25, evs, ends);
    exo_event_log_recovery rec;
    exo_event_log *log = open_log(&rec);
    cr_assert_eq(exo_event_log_count(log), 25);
    cr_assert_eq(rec.bytes_truncated, 0);
    cr_assert_str_eq(rec.reason, "");
    exo_event *got;
    size_t n;
    cr_assert_eq(exo_event_log_read_range(log, 10, 5, &got, &n, &err), 0);
    cr_assert_eq(n, 5);
    for (size_t i = 0; i < n; i++)
        cr_assert(exo_event_equal(&got[i], &evs[10 + i]));
    exo_event_log_free_events(got, n);
    cr_assert_eq(exo_event_log_read_range(log, 20, 100, &got, &n, &err), 0);
    cr_assert_eq(n, 5);
    exo_event_log_free_events(got, n);
    cr_assert_eq(exo_event_log_read_range(log, 25, 100, &got, &n, &err), 0);
    cr_assert_eq(n, 0);
    cr_assert_null(got);
    cr_assert_eq(exo_event_log_read_range(log, 26, 100, &got, &n, &err), EXO_ERANGE);
    uint8_t *p;
    size_t len;
    cr_assert_eq(exo_event_log_read(log, 25, &p, &len, &err), EXO_ERANGE);
    cr_assert_eq(exo_event_log_read(log, 3, &p, &len, &err), 0);
    cr_assert_eq(len, ends[3] - ends[2] - EXO_EVENT_LOG_HEADER);
    exo_free(p);
    close_log(log);
    for (int i = 0; i < 25; i++)
        exo_event_clear(&evs[i]);
}

Test(cluster_event_log, raw_append_limits_and_lock)
{
    exo_err err = {0};
    exo_event_log *log = open_log(NULL);
    cr_assert_eq(exo_event_log_append(log, "x", 0, NULL, &err), EXO_EINVAL);
    cr_assert_eq(exo_event_log_append(log, "x", EXO_EVENT_LOG_MAX_RECORD + 1, NULL, &err), EXO_ETOOBIG);
    cr_assert_eq(exo_event_log_count(log), 0);
    exo_event_log *second;
    cr_assert_eq(exo_event_log_open(logpath, &second, NULL, &err), EXO_EBUSY);
    /* a non-event payload is stored but read_range refuses to decode it */
    cr_assert_eq(exo_event_log_append(log, "junk", 4, NULL, &err), 0);
    exo_event *got;
    size_t n;
    cr_assert_eq(exo_event_log_read_range(log, 0, 1, &got, &n, &err), EXO_EFORMAT);
    cr_assert_null(got);
    close_log(log);
    char missing[200];
    snprintf(missing, sizeof missing, "%s/no/such/dir/events.bin", tmpdir);
    cr_assert_eq(exo_event_log_open(missing, &second, NULL, &err), EXO_ENOENT);
}

/* A forked child shares the log's open file description, so the writer's
 * lock outlives our close until the child exits: the way a process reading
 * /proc/PID/fd briefly keeps a closed log locked. A brief hold is waited
 * out; a writer that keeps it is refused after the bounded wait. */
static void reopen_while_child_holds(int hold_ms, int want_rc)
{
    exo_err err = {0};
    exo_event_log *log = open_log(NULL);
    pid_t child = fork();
    cr_assert_neq(child, -1);
    if (child == 0) {
        usleep((useconds_t)hold_ms * 1000);
        _exit(0);
    }
    cr_assert_eq(exo_event_log_close(log, false, &err), 0);
    double t0 = exo_clock_seconds();
    int rc = exo_event_log_open(logpath, &log, NULL, &err);
    double waited = exo_clock_seconds() - t0;
    cr_assert_eq(rc, want_rc, "hold %d ms: rc %d (%s) after %.3f s", hold_ms, rc, err.msg, waited);
    if (rc == EXO_EBUSY) {
        cr_assert(strstr(err.msg, "held by another writer"), "%s", err.msg);
        cr_assert(waited >= 0.2 && waited < 2.0, "gave up after %.3f s", waited);
    }
    int status;
    cr_assert_eq(waitpid(child, &status, 0), child);
    if (rc == 0)
        close_log(log);
    else
        close_log(open_log(NULL)); /* free once the child is gone */
}

Test(cluster_event_log, lock_survives_a_brief_extra_reference)
{
    reopen_while_child_holds(40, 0);
    reopen_while_child_holds(1500, EXO_EBUSY);
}

Test(cluster_event_log, truncate_at_every_byte_of_last_record)
{
    enum { N = 12 };
    exo_event evs[N];
    uint64_t ends[N];
    uint64_t size = write_events(N, evs, ends);
    size_t len;
    uint8_t *orig = read_file(logpath, &len);
    cr_assert_eq(len, size);
    uint64_t last_start = ends[N - 2];
    for (uint64_t cut = last_start; cut < size; cut++) {
        write_file(logpath, orig, (size_t)cut);
        check_prefix(evs, N - 1, last_start, cut);
    }
    /* the full file is intact */
    write_file(logpath, orig, (size_t)size);
    check_prefix(evs, N, size, size);
    exo_free(orig);
    for (int i = 0; i < N; i++)
        exo_event_clear(&evs[i]);
}

Test(cluster_event_log, truncate_at_random_offsets)
{
    enum { N = 30 };
    exo_event evs[N];
    uint64_t ends[N];
    uint64_t size = write_events(N, evs, ends);
    size_t len;
    uint8_t *orig = read_file(logpath, &len);
    srand(99);
    for (int iter = 0; iter < 60; iter++) {
        uint64_t cut = (uint64_t)rand() % (size + 1);
        uint64_t keep = 0, keep_bytes = 0;
        while (keep < N && ends[keep] <= cut)
            keep_bytes = ends[keep++];
        write_file(logpath, orig, (size_t)cut);
        check_prefix(evs, keep, keep_bytes, cut);
    }
    exo_free(orig);
    for (int i = 0; i < N; i++)
        exo_event_clear(&evs[i]);
}

Test(cluster_event_log, random_byte_flips_keep_prefix)
{
    enum { N = 20 };
    exo_event evs[N];
    uint64_t ends[N];
    uint64_t size = write_events(N, evs, ends);
    size_t len;
    uint8_t *orig = read_file(logpath, &len);
    uint8_t *mut = exo_malloc(len);
    srand(4242);
    for (int iter = 0; iter < 80; iter++) {
        memcpy(mut, orig, len);
        size_t pos = (size_t)rand() % len;
        mut[pos] ^= (uint8_t)(1 + rand() % 255);
        uint64_t keep = 0, keep_bytes = 0;
        while (keep < N && ends[keep] <= pos)
            keep_bytes = ends[keep++];
        write_file(logpath, mut, len);
        check_prefix(evs, keep, keep_bytes, size);
    }
    exo_free(mut);
    exo_free(orig);
    for (int i = 0; i < N; i++)
        exo_event_clear(&evs[i]);
}

Test(cluster_event_log, zero_tail_and_oversized_length)
{
    enum { N = 5 };
    exo_event evs[N];
    uint64_t ends[N];
    uint64_t size = write_events(N, evs, ends);
    size_t len;
    uint8_t *orig = read_file(logpath, &len);
    /* a zero-filled tail (delayed allocation after a crash) */
    uint8_t *z = exo_calloc(len + 4096, 1);
    memcpy(z, orig, len);
    write_file(logpath, z, len + 4096);
    check_prefix(evs, N, size, size + 4096);
    /* a header claiming more than the record cap, with the bytes present */
    memcpy(z, orig, len);
    uint32_t big = (uint32_t)EXO_EVENT_LOG_MAX_RECORD + 1;
    memcpy(z + len, &big, 4);
    write_file(logpath, z, len + 4096);
    check_prefix(evs, N, size, size + 4096);
    /* a header alone */
    memcpy(z, orig, len);
    uint32_t small = 4;
    memcpy(z + len, &small, 4);
    write_file(logpath, z, len + 7);
    check_prefix(evs, N, size, size + 7);
    exo_free(z);
    exo_free(orig);
    for (int i = 0; i < N; i++)
        exo_event_clear(&evs[i]);
}

static int count_archives(char names[][256], int max)
{
    DIR *d = opendir(tmpdir);
    cr_assert_not_null(d);
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d)))
        if (strncmp(de->d_name, "events.", 7) == 0 && strstr(de->d_name, ".bin.zst")) {
            if (n < max)
                snprintf(names[n], 256, "%s", de->d_name);
            n++;
        }
    closedir(d);
    return n;
}

Test(cluster_event_log, archive_on_close)
{
    exo_err err = {0};
    enum { N = 8 };
    exo_event evs[N];
    uint64_t ends[N];
    write_events(N, evs, ends);
    size_t len;
    uint8_t *orig = read_file(logpath, &len);
    exo_event_log *log = open_log(NULL);
    cr_assert_eq(exo_event_log_close(log, true, &err), 0, "%s", err.msg);
    cr_assert_neq(access(logpath, F_OK), 0, "events.bin removed");
    char names[8][256];
    cr_assert_eq(count_archives(names, 8), 1);
    char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, names[0]);
    size_t zlen;
    uint8_t *z = read_file(path, &zlen);
    unsigned long long raw = ZSTD_getFrameContentSize(z, zlen);
    uint8_t *out = exo_malloc(len + 1);
    size_t got = ZSTD_decompress(out, len + 1, z, zlen);
    cr_assert(!ZSTD_isError(got), "%s", ZSTD_getErrorName(got));
    cr_assert_eq(got, len);
    cr_assert(raw == len || raw == ZSTD_CONTENTSIZE_UNKNOWN);
    cr_assert_eq(memcmp(out, orig, len), 0);
    exo_free(out);
    exo_free(z);
    exo_free(orig);

    /* an empty log is not archived */
    log = open_log(NULL);
    cr_assert_eq(exo_event_log_close(log, true, &err), 0);
    cr_assert_eq(count_archives(names, 8), 1);

    /* at most 5 archives are kept, the newest */
    for (int round = 0; round < 6; round++) {
        log = open_log(NULL);
        cr_assert_eq(exo_event_log_append_event(log, &evs[round], NULL, &err), 0);
        cr_assert_eq(exo_event_log_close(log, true, &err), 0, "%s", err.msg);
    }
    cr_assert_eq(count_archives(names, 8), EXO_EVENT_LOG_MAX_ARCHIVES);
    for (int i = 0; i < N; i++)
        exo_event_clear(&evs[i]);
}

/* A new session: the log is sealed by a rename (the same object appends to
 * a fresh file at once), the sealed file is archived apart, and a sealed
 * file a crash left behind is archived by the next open. */
Test(cluster_event_log, rotate_seals_and_archives_apart)
{
    exo_err err = {0};
    enum { N = 4 };
    exo_event evs[N];
    uint64_t ends[N];
    write_events(N, evs, ends);
    size_t len;
    uint8_t *orig = read_file(logpath, &len);
    exo_event_log *log = open_log(NULL);
    char sealed[512];
    cr_assert_eq(exo_event_log_rotate(log, sealed, sizeof sealed, &err), 0, "%s", err.msg);
    cr_assert(strstr(sealed, "/events.") && !strcmp(sealed + strlen(sealed) - 4, ".bin"), "%s", sealed);
    cr_assert_eq(exo_event_log_count(log), 0, "a fresh log");
    size_t slen;
    uint8_t *s = read_file(sealed, &slen);
    cr_assert_eq(slen, len);
    cr_assert_eq(memcmp(s, orig, len), 0, "the sealed file is the old log, byte for byte");
    exo_free(s);
    uint64_t idx;
    cr_assert_eq(exo_event_log_append_event(log, &evs[0], &idx, &err), 0, "%s", err.msg);
    cr_assert_eq(idx, 0, "the new session's first event");
    char empty[512];
    exo_event_log *other = NULL;
    cr_assert_eq(exo_event_log_open(logpath, &other, NULL, &err), EXO_EBUSY, "still one writer");
    cr_assert_eq(exo_event_log_archive(sealed, &err), 0, "%s", err.msg);
    cr_assert_neq(access(sealed, F_OK), 0, "the sealed file is gone");
    char names[8][256];
    cr_assert_eq(count_archives(names, 8), 1);

    /* a crash between sealing and archiving: the next open archives it */
    cr_assert_eq(exo_event_log_rotate(log, sealed, sizeof sealed, &err), 0, "%s", err.msg);
    cr_assert(sealed[0]);
    cr_assert_eq(exo_event_log_close(log, false, &err), 0);
    log = open_log(NULL);
    cr_assert_neq(access(sealed, F_OK), 0, "archived at open");
    cr_assert_eq(count_archives(names, 8), 2);
    cr_assert_eq(exo_event_log_rotate(log, empty, sizeof empty, &err), 0);
    cr_assert_str_eq(empty, "", "an empty log is not sealed");
    cr_assert_eq(exo_event_log_close(log, false, &err), 0);
    exo_free(orig);
    for (int i = 0; i < N; i++)
        exo_event_clear(&evs[i]);
}

Test(cluster_event_log, replay_into_state)
{
    exo_err err = {0};
    enum { N = 23 };
    exo_event evs[N];
    uint64_t ends[N];
    write_events(N, evs, ends);
    exo_state *direct = exo_state_new();
    for (int i = 0; i < N; i++)
        cr_assert_eq(exo_state_apply(direct, i, &evs[i], &err), 0, "%s", err.msg);

    exo_event_log *log = open_log(NULL);
    exo_state *st = exo_state_new();
    cr_assert_eq(exo_event_log_replay(log, st, &err), 0, "%s", err.msg);
    cr_assert_eq(exo_state_last_event_applied_idx(st), N - 1);
    json_t *a = exo_state_to_json(st), *b = exo_state_to_json(direct);
    cr_assert(json_equal(a, b));
    json_decref(a);
    json_decref(b);
    cr_assert_eq(exo_event_log_replay(log, st, &err), 0, "nothing new: no-op");
    cr_assert_eq(exo_state_last_event_applied_idx(st), N - 1);

    /* a State ahead of the log is an error */
    exo_event ev;
    fx_event(&ev, EXO_EVENT_NODE_TIMED_OUT, 1);
    cr_assert_eq(exo_state_apply(direct, N, &ev, &err), 0);
    cr_assert_eq(exo_event_log_replay(log, direct, &err), EXO_ERANGE);

    /* an undecodable record stops the replay; the State keeps the prefix */
    cr_assert_eq(exo_event_log_append_event(log, &ev, NULL, &err), 0);
    cr_assert_eq(exo_event_log_append(log, "junk", 4, NULL, &err), 0);
    cr_assert_eq(exo_event_log_replay(log, st, &err), EXO_EFORMAT);
    cr_assert_eq(exo_state_last_event_applied_idx(st), N);
    exo_event_clear(&ev);
    close_log(log);
    exo_state_free(st);
    exo_state_free(direct);
    for (int i = 0; i < N; i++)
        exo_event_clear(&evs[i]);
}

Test(cluster_event_log, largest_record_round_trips)
{
    exo_err err = {0};
    exo_event_log *log = open_log(NULL);
    size_t n = EXO_EVENT_LOG_MAX_RECORD;
    uint8_t *big = exo_malloc(n);
    for (size_t i = 0; i < n; i++)
        big[i] = (uint8_t)(i * 31 + 7);
    cr_assert_eq(exo_event_log_append(log, big, n, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(exo_event_log_append(log, "tail", 4, NULL, &err), 0);
    close_log(log);
    exo_event_log_recovery rec;
    log = open_log(&rec);
    cr_assert_eq(exo_event_log_count(log), 2);
    cr_assert_eq(rec.bytes_kept, 2 * EXO_EVENT_LOG_HEADER + n + 4);
    uint8_t *p;
    size_t len;
    cr_assert_eq(exo_event_log_read(log, 0, &p, &len, &err), 0);
    cr_assert_eq(len, n);
    cr_assert_eq(memcmp(p, big, n), 0);
    exo_free(p);
    close_log(log);
    exo_free(big);
}
