/* libFuzzer target for everything that reads untrusted cluster bytes: the
 * event and command decoders, event log recovery, and the State fold fed
 * with whatever decodes. The first input byte picks the mode:
 *   0: bytes -> exo_event_decode; a decoded event must validate, re-encode,
 *      decode to an equal event, render as JSON and apply to a State
 *   1: bytes -> exo_command_decode, same properties
 *   2: bytes -> raw log file (memfd) -> open/recover, replay, append, reopen
 *   3: bytes split into payloads (1-byte length prefixes) and framed with
 *      valid CRCs, so recovery accepts them and decoding/folding of log
 *      records is exercised past the checksum
 *   4: bytes -> JSON -> exo_instance_from_json (POST /instance bodies); an
 *      accepted instance validates and survives to_json -> from_json equal
 *   8: bytes -> exo_snapshot_decode (a State snapshot file); an accepted
 *      one re-encodes and decodes to an equal State
 * Invariants are checked with abort(), which libFuzzer reports as a crash. */
// FUZZ_SOURCES: src/proto/types.c src/cluster/types.c src/cluster/codec.c src/cluster/events.c src/cluster/state.c src/cluster/event_log.c src/cluster/snapshot.c src/cluster/crc32c.c src/core/bytes.c src/core/alloc.c src/core/error.c src/core/log.c src/core/clock.c src/core/json_util.c src/core/budget.c src/core/paths.c
// FUZZ_LIBS: -lmsgpackc -lzstd
#include "core/json_util.h"
#include "cluster/crc32c.h"
#include "cluster/event_log.h"
#include "cluster/events.h"
#include "cluster/snapshot.h"
#include "cluster/state.h"
#include "core/alloc.h"
#include "core/log.h"
#include "fuzz_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_event(const exo_event *ev, exo_state *st)
{
    exo_err err = {0};
    CHECK(exo_event_validate(ev, &err) == 0);
    uint8_t *buf;
    size_t len;
    CHECK(exo_event_encode(ev, &buf, &len, &err) == 0);
    exo_event back;
    CHECK(exo_event_decode(buf, len, &back, &err) == 0);
    CHECK(exo_event_equal(ev, &back));
    json_t *j = exo_event_to_json(&back);
    char *s = exo_json_dumps(j, JSON_COMPACT);
    CHECK(s != NULL);
    free(s);
    json_decref(j);
    if (st) {
        int64_t next = exo_state_last_event_applied_idx(st) + 1;
        CHECK(exo_state_apply(st, next + 1, &back, &err) == EXO_EINVAL);  /* gap refused */
        CHECK(exo_state_apply(st, next, &back, &err) == 0);
        CHECK(exo_state_last_event_applied_idx(st) == next);
    }
    exo_event_clear(&back);
    exo_free(buf);
}

static void fuzz_event(const uint8_t *data, size_t size)
{
    exo_event ev;
    exo_err err = {0};
    if (exo_event_decode(data, size, &ev, &err) == 0) {
        exo_state *st = exo_state_new();
        check_event(&ev, st);
        json_t *j = exo_state_to_json(st);
        json_decref(j);
        exo_state_free(st);
        exo_event_clear(&ev);
    } else {
        CHECK(err.code < 0 && err.msg[0]);
    }
}

static void fuzz_command(const uint8_t *data, size_t size)
{
    exo_command cmd, back;
    exo_err err = {0};
    if (exo_command_decode(data, size, &cmd, &err) != 0)
        return;
    uint8_t *buf;
    size_t len;
    CHECK(exo_command_encode(&cmd, &buf, &len, &err) == 0);
    CHECK(exo_command_decode(buf, len, &back, &err) == 0);
    CHECK(exo_command_equal(&cmd, &back));
    json_decref(exo_command_to_json(&back));
    exo_command_clear(&back);
    exo_command_clear(&cmd);
    exo_free(buf);
}

static void fuzz_log_file_inner(const uint8_t *data, size_t size);

/* Opens the log through /proc/self/fd so no file lands on disk. */
/* The lowest free descriptor number: equal before and after an input
 * unless the code under test leaked one (a daemon would run out). */
static int lowest_free_fd(void)
{
    int fd = dup(0);
    if (fd >= 0)
        close(fd);
    return fd;
}

static void fuzz_log_file(const uint8_t *data, size_t size)
{
    int fd_mark = lowest_free_fd();
    fuzz_log_file_inner(data, size);
    if (lowest_free_fd() != fd_mark) {
        fprintf(stderr, "descriptor leak: lowest free fd %d before, %d after\n", fd_mark, lowest_free_fd());
        abort();
    }
}

static void fuzz_log_file_inner(const uint8_t *data, size_t size)
{
    int fd = memfd_create("fuzz_event_log", MFD_CLOEXEC);
    if (fd < 0)
        return;
    size_t put = 0;
    while (put < size) {
        ssize_t w = write(fd, data + put, size - put);
        if (w <= 0)
            break;
        put += (size_t)w;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    exo_err err = {0};
    exo_event_log *log;
    exo_event_log_recovery rec;
    if (exo_event_log_open(path, &log, &rec, &err) != 0) {
        close(fd);
        return;
    }
    CHECK(rec.bytes_kept + rec.bytes_truncated == size);
    CHECK((uint64_t)lseek(fd, 0, SEEK_END) == rec.bytes_kept);
    uint64_t n = exo_event_log_count(log), first = exo_event_log_first(log);
    CHECK(n == rec.first + rec.records && first == rec.first); /* a compacted file's header sets first */
    exo_state *st = exo_state_new();
    for (uint64_t i = first; i < n; i++) {
        uint8_t *p;
        size_t len;
        CHECK(exo_event_log_read(log, i, &p, &len, &err) == 0);  /* recovered records re-verify */
        exo_event ev;
        if (exo_event_decode(p, len, &ev, &err) == 0) {
            check_event(&ev, st);
            exo_event_clear(&ev);
        }
        exo_free(p);
    }
    exo_event *evs;
    size_t got;
    if (exo_event_log_read_range(log, first, 64, &evs, &got, &err) == 0) {
        CHECK(got == (n - first < 64 ? n - first : 64));
        exo_event_log_free_events(evs, got);
    }
    exo_event extra;
    exo_event_init(&extra, EXO_EVENT_NODE_TIMED_OUT);
    snprintf(extra.u.node_timed_out.node_id.s, EXO_ID_MAX, "node-x");
    uint64_t idx;
    CHECK(exo_event_log_append_event(log, &extra, &idx, &err) == 0);
    CHECK(idx == n);
    CHECK(exo_event_log_close(log, false, &err) == 0);
    if (exo_event_log_open(path, &log, &rec, &err) != 0) {
        fprintf(stderr, "reopen failed: %s\n", err.msg);
        abort();
    }
    CHECK(exo_event_log_count(log) == n + 1 && rec.bytes_truncated == 0);
    CHECK(exo_event_log_read_range(log, n, 1, &evs, &got, &err) == 0 && got == 1);
    CHECK(exo_event_equal(&evs[0], &extra));
    exo_event_log_free_events(evs, got);
    exo_event_clear(&extra);
    exo_event_log_close(log, false, &err);
    exo_state_free(st);
    close(fd);
}

/* Frames payloads with correct headers, then runs the log path on them. */
static void fuzz_framed(const uint8_t *data, size_t size)
{
    uint8_t *out = exo_malloc(size * 9 + 16);
    size_t o = 0, i = 0;
    while (i < size) {
        size_t len = data[i++];
        if (len > size - i)
            len = size - i;
        uint32_t l = (uint32_t)len, c = exo_crc32c(0, data + i, len);
        memcpy(out + o, &l, 4);
        memcpy(out + o + 4, &c, 4);
        memcpy(out + o + 8, data + i, len);
        o += 8 + len;
        i += len;
    }
    fuzz_log_file(out, o);
    exo_free(out);
}

static void fuzz_snapshot(const uint8_t *data, size_t size)
{
    exo_err err = {0};
    exo_state *st;
    if (exo_snapshot_decode(data, size, &st, &err) != 0) {
        CHECK(st == NULL);
        return;
    }
    uint8_t *buf;
    size_t len;
    exo_state *back;
    CHECK(exo_snapshot_encode(st, false, &buf, &len, &err) == 0);
    CHECK(exo_snapshot_decode(buf, len, &back, &err) == 0);
    json_t *a = exo_state_to_json(st), *b = exo_state_to_json(back);
    CHECK(json_equal(a, b));
    json_decref(a);
    json_decref(b);
    exo_state_free(back);
    exo_state_free(st);
    exo_free(buf);
}

static void fuzz_instance_json(const uint8_t *data, size_t size)
{
    json_t *j = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
    if (!j)
        return;
    exo_instance inst, back;
    exo_err err;
    if (exo_instance_from_json(j, &inst, &err) == 0) {
        CHECK(exo_instance_validate(&inst, &err) == 0);
        json_t *again = exo_instance_to_json(&inst);
        CHECK(exo_instance_from_json(again, &back, &err) == 0);
        CHECK(exo_instance_equal(&inst, &back));
        exo_instance_clear(&back);
        json_decref(again);
        exo_instance_clear(&inst);
    }
    json_decref(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;
    if (!quiet) {
        exo_log_set_level(EXO_LOG_ERROR);
        quiet = 1;
    }
    if (size == 0)
        return 0;
    if (data[0] & 8) {
        fuzz_snapshot(data + 1, size - 1);
        return 0;
    }
    if (data[0] & 4) {
        fuzz_instance_json(data + 1, size - 1);
        return 0;
    }
    switch (data[0] & 3) {
    case 0: fuzz_event(data + 1, size - 1); break;
    case 1: fuzz_command(data + 1, size - 1); break;
    case 2: fuzz_log_file(data + 1, size - 1); break;
    case 3: fuzz_framed(data + 1, size - 1); break;
    }
    return 0;
}
