/* State snapshots and log compaction (cluster/snapshot.h, event_log.h):
 * round trips, redaction of prompts, torn snapshots, compaction with
 * global indices, recovery with fallbacks, a follower's install, and a
 * long run that must stay under the documented bound. */
#include "cluster/event_log.h"
#include "cluster/messages.h"
#include "cluster/replication.h"
#include "cluster/snapshot.h"
#include "cluster/state.h"
#include "core/alloc.h"
#include "core/json_util.h"
#include "core/log.h"
#include "test_cluster_fixtures.h"

#include <criterion/criterion.h>
#include "test_tmpdir.h"
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[64];
static char logpath[128], snappath[160], prevpath[160];

static void setup(void)
{
    test_tmpdir_make(tmpdir, "snap");
    snprintf(logpath, sizeof logpath, "%s/events.bin", tmpdir);
    snprintf(snappath, sizeof snappath, "%s.snap", logpath);
    snprintf(prevpath, sizeof prevpath, "%s.snap.prev", logpath);
    exo_log_set_level(EXO_LOG_ERROR); /* fallbacks warn; expected here */
}

static void teardown(void) { test_tmpdir_remove(tmpdir); }

TestSuite(cluster_snapshot, .init = setup, .fini = teardown);

/* Event i of a realistic stream: requests go through their lifecycle
 * (created with a prompt, running, complete, deleted), nodes report info,
 * runners change status; ids repeat, so the State stays small. */
static void mk_event(exo_event *ev, uint64_t i)
{
    int req = (int)(i / 6);
    switch (i % 6) {
    case 0:
        exo_event_init(ev, EXO_EVENT_TASK_CREATED);
        fx_task(&ev->u.task_created.task, req, 0, EXO_TASK_KIND_TEXT_GENERATION);
        exo_free(ev->u.task_created.task.params_json);
        char p[128];
        snprintf(p, sizeof p, "{\"model\":\"org/m\",\"messages\":[{\"role\":\"user\",\"content\":\"secret prompt %d\"}]}",
                 req);
        ev->u.task_created.task.params_json = exo_strdup(p);
        break;
    case 1:
    case 2:
        exo_event_init(ev, EXO_EVENT_TASK_STATUS_UPDATED);
        fx_id(&ev->u.task_status_updated.task_id, "task", req);
        ev->u.task_status_updated.status = i % 6 == 1 ? EXO_TASK_RUNNING : EXO_TASK_COMPLETE;
        break;
    case 3:
        exo_event_init(ev, EXO_EVENT_TASK_DELETED);
        fx_id(&ev->u.task_deleted.task_id, "task", req);
        break;
    case 4: fx_event(ev, EXO_EVENT_NODE_GATHERED_INFO, req % 4); break;
    default: fx_event(ev, EXO_EVENT_RUNNER_STATUS_UPDATED, req % 8); break;
    }
}

/* What the node writes: the event with its prompt redacted. */
static void append_redacted(exo_event_log *log, const exo_event *ev, uint64_t want_idx)
{
    exo_err err = {0};
    exo_event red;
    bool r = exo_event_redact(ev, &red);
    uint64_t idx;
    cr_assert_eq(exo_event_log_append_event(log, r ? &red : ev, &idx, &err), 0, "%s", err.msg);
    cr_assert_eq(idx, want_idx);
    if (r)
        exo_event_clear(&red);
}

/* Appends events [from, to) to the log and folds their redacted form into st. */
static void feed(exo_event_log *log, exo_state *st, uint64_t from, uint64_t to)
{
    exo_err err = {0};
    for (uint64_t i = from; i < to; i++) {
        exo_event ev, red;
        mk_event(&ev, i);
        append_redacted(log, &ev, i);
        bool r = exo_event_redact(&ev, &red);
        cr_assert_eq(exo_state_apply(st, (int64_t)i, r ? &red : &ev, &err), 0, "%s", err.msg);
        if (r)
            exo_event_clear(&red);
        exo_event_clear(&ev);
    }
}

static void assert_same_state(const exo_state *a, const exo_state *b)
{
    json_t *ja = exo_state_to_json(a), *jb = exo_state_to_json(b);
    char *sa = exo_json_dumps(ja, JSON_SORT_KEYS), *sb = exo_json_dumps(jb, JSON_SORT_KEYS);
    cr_assert(json_equal(ja, jb), "states differ:\n%s\n%s", sa, sb);
    exo_free(sa);
    exo_free(sb);
    json_decref(ja);
    json_decref(jb);
}

static exo_event_log *open_log(void)
{
    exo_err err = {0};
    exo_event_log *log;
    cr_assert_eq(exo_event_log_open(logpath, &log, NULL, &err), 0, "%s", err.msg);
    return log;
}

static void checkpoint(exo_event_log *log, const exo_state *st, bool install, uint64_t *dropped)
{
    exo_err err = {0};
    uint8_t *snap;
    size_t len;
    cr_assert_eq(exo_snapshot_encode(st, true, &snap, &len, &err), 0, "%s", err.msg);
    cr_assert_eq(exo_event_log_checkpoint(log, snap, len, install, exo_event_log_epoch(log), dropped, &err), 0, "%s",
                 err.msg);
    exo_free(snap);
}

static uint64_t fsize(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 ? (uint64_t)sb.st_size : 0;
}

static bool file_contains(const char *p, const char *needle)
{
    FILE *f = fopen(p, "rb");
    if (!f)
        return false;
    size_t cap = fsize(p) + 1, n;
    char *buf = exo_malloc(cap);
    n = fread(buf, 1, cap, f);
    fclose(f);
    bool found = false;
    for (size_t i = 0; !found && i + strlen(needle) <= n; i++)
        found = !memcmp(buf + i, needle, strlen(needle));
    exo_free(buf);
    return found;
}

static void flip_byte(const char *p, uint64_t off)
{
    FILE *f = fopen(p, "r+b");
    cr_assert_not_null(f);
    fseek(f, (long)off, SEEK_SET);
    int c = fgetc(f);
    fseek(f, (long)off, SEEK_SET);
    fputc(c ^ 0x5a, f);
    fclose(f);
}

Test(cluster_snapshot, round_trip_and_redaction)
{
    exo_err err = {0};
    exo_state *st = exo_state_new();
    for (uint64_t i = 0; i < 62; i++) { /* task 10 is still live (created, running) */
        exo_event ev;
        mk_event(&ev, i);
        cr_assert_eq(exo_state_apply(st, (int64_t)i, &ev, &err), 0, "%s", err.msg);
        exo_event_clear(&ev);
    }
    exo_event inst;
    fx_event(&inst, EXO_EVENT_INSTANCE_CREATED, 3);
    cr_assert_eq(exo_state_apply(st, 62, &inst, &err), 0);
    exo_event_clear(&inst);
    cr_assert_eq(exo_state_task_count(st), 1);

    uint8_t *buf;
    size_t len;
    exo_state *back;
    cr_assert_eq(exo_snapshot_encode(st, false, &buf, &len, &err), 0, "%s", err.msg);
    cr_assert_eq(exo_snapshot_decode(buf, len, &back, &err), 0, "%s", err.msg);
    cr_assert_eq(exo_state_last_event_applied_idx(back), 62);
    assert_same_state(st, back);
    exo_state_free(back);
    exo_free(buf);

    /* redacted: the same State but the live task's prompt */
    cr_assert_eq(exo_snapshot_encode(st, true, &buf, &len, &err), 0);
    cr_assert_eq(exo_snapshot_write_file(snappath, buf, len, &err), 0, "%s", err.msg);
    exo_free(buf);
    cr_assert(!file_contains(snappath, "secret prompt"));
    cr_assert_eq(exo_snapshot_load_file(snappath, &back, &err), 0, "%s", err.msg);
    cr_assert_str_eq(exo_state_task_at(back, 0)->params_json, EXO_REDACTED_PARAMS);
    cr_assert_str_neq(exo_state_task_at(st, 0)->params_json, EXO_REDACTED_PARAMS);
    exo_state_free(back);

    /* an empty State has no index to stand at */
    exo_state *empty = exo_state_new();
    cr_assert_eq(exo_snapshot_encode(empty, true, &buf, &len, &err), EXO_EINVAL);
    exo_state_free(empty);
    exo_state_free(st);
    cr_assert_eq(exo_snapshot_load_file(prevpath, &back, &err), EXO_ENOENT);
}

Test(cluster_snapshot, torn_or_corrupt_snapshot_is_refused_whole)
{
    exo_err err = {0};
    exo_state *st = exo_state_new();
    for (uint64_t i = 0; i < 40; i++) {
        exo_event ev;
        mk_event(&ev, i);
        cr_assert_eq(exo_state_apply(st, (int64_t)i, &ev, &err), 0);
        exo_event_clear(&ev);
    }
    uint8_t *buf;
    size_t len;
    cr_assert_eq(exo_snapshot_encode(st, true, &buf, &len, &err), 0);
    exo_state *back;
    for (size_t cut = 0; cut < len; cut += 1 + cut / 7) { /* every prefix shape, header ones included */
        cr_assert_eq(exo_snapshot_decode(buf, cut, &back, &err), EXO_EFORMAT, "cut at %zu", cut);
        cr_assert_null(back);
    }
    for (size_t at = 0; at < len; at += 13) {
        buf[at] ^= 0x40;
        cr_assert_eq(exo_snapshot_decode(buf, len, &back, &err), EXO_EFORMAT, "flip at %zu", at);
        buf[at] ^= 0x40;
    }
    cr_assert_eq(exo_snapshot_decode(buf, len, &back, &err), 0);
    exo_state_free(back);
    /* a torn file on disk: the load refuses it */
    cr_assert_eq(exo_snapshot_write_file(snappath, buf, len / 2, &err), 0);
    cr_assert_eq(exo_snapshot_load_file(snappath, &back, &err), EXO_EFORMAT);
    exo_free(buf);
    exo_state_free(st);
}

Test(cluster_snapshot, checkpoints_compact_and_indices_stay_global)
{
    exo_err err = {0};
    exo_event_log *log = open_log();
    exo_state *st = exo_state_new();
    feed(log, st, 0, 50);
    uint64_t dropped = 99;
    checkpoint(log, st, false, &dropped); /* the first: nothing older covers anything, nothing dropped */
    cr_assert_eq(dropped, 0);
    cr_assert_eq(exo_event_log_first(log), 0);
    feed(log, st, 50, 120);
    checkpoint(log, st, false, &dropped); /* drops what the previous snapshot (at 49) covers */
    cr_assert_eq(dropped, 50);
    cr_assert_eq(exo_event_log_first(log), 50);
    cr_assert_eq(exo_event_log_count(log), 120);
    feed(log, st, 120, 130);

    exo_event *evs;
    size_t n;
    cr_assert_eq(exo_event_log_read_range(log, 10, 5, &evs, &n, &err), EXO_ENOENT);
    cr_assert_eq(exo_event_log_read_range(log, 131, 5, &evs, &n, &err), EXO_ERANGE);
    cr_assert_eq(exo_event_log_read_range(log, 130, 5, &evs, &n, &err), 0);
    cr_assert_eq(n, 0);
    cr_assert_eq(exo_event_log_read_range(log, 50, 1000, &evs, &n, &err), 0, "%s", err.msg);
    cr_assert_eq(n, 80);
    for (size_t i = 0; i < n; i++) { /* global index i + 50 is event i + 50 */
        exo_event want, red;
        mk_event(&want, 50 + i);
        want.event_id = evs[i].event_id; /* ids are fresh per build */
        bool r = exo_event_redact(&want, &red);
        cr_assert(exo_event_equal(&evs[i], r ? &red : &want), "event %zu", 50 + i);
        if (r)
            exo_event_clear(&red);
        exo_event_clear(&want);
    }
    exo_event_log_free_events(evs, n);
    uint8_t *raw;
    size_t rawlen;
    cr_assert_eq(exo_event_log_read(log, 49, &raw, &rawlen, &err), EXO_ENOENT);
    cr_assert_eq(exo_event_log_read(log, 50, &raw, &rawlen, &err), 0, "%s", err.msg);
    exo_free(raw);
    cr_assert_eq(exo_event_log_flush(log, &err), 0);
    cr_assert_eq(exo_event_log_close(log, false, &err), 0);

    /* reopen: the header keeps the first index, appends continue */
    exo_event_log_recovery rec;
    cr_assert_eq(exo_event_log_open(logpath, &log, &rec, &err), 0, "%s", err.msg);
    cr_assert_eq(rec.first, 50);
    cr_assert_eq(rec.records, 80);
    cr_assert_eq(exo_event_log_count(log), 130);
    feed(log, st, 130, 131);
    exo_state *got;
    exo_event_log_snapshot_info info;
    cr_assert_eq(exo_event_log_recover(log, &got, &info, &err), 0, "%s", err.msg);
    cr_assert_eq(info.snapshot_idx, 119);
    cr_assert_eq(info.replayed, 11);
    cr_assert(!info.used_previous);
    assert_same_state(st, got);
    exo_state_free(got);
    /* a snapshot ahead of the log is refused; a stale epoch is cancelled */
    exo_state *ahead = exo_state_clone(st);
    exo_event ev;
    mk_event(&ev, 131);
    cr_assert_eq(exo_state_apply(ahead, 131, &ev, &err), 0);
    exo_event_clear(&ev);
    uint8_t *snap;
    size_t len;
    cr_assert_eq(exo_snapshot_encode(ahead, true, &snap, &len, &err), 0);
    cr_assert_eq(exo_event_log_checkpoint(log, snap, len, false, exo_event_log_epoch(log), NULL, &err), EXO_EINVAL);
    cr_assert_eq(exo_event_log_checkpoint(log, snap, len, false, exo_event_log_epoch(log) + 1, NULL, &err),
                 EXO_ECANCELED);
    exo_free(snap);
    exo_state_free(ahead);
    exo_event_log_close(log, false, &err);
    exo_state_free(st);
}

Test(cluster_snapshot, recovery_falls_back_and_never_loses_events)
{
    exo_err err = {0};
    exo_event_log *log = open_log();
    exo_state *st = exo_state_new();
    exo_state *got;
    exo_event_log_snapshot_info info;
    /* no snapshot, nothing compacted: a full replay */
    feed(log, st, 0, 30);
    cr_assert_eq(exo_event_log_recover(log, &got, &info, &err), 0, "%s", err.msg);
    cr_assert_eq(info.snapshot_idx, -1);
    cr_assert_eq(info.replayed, 30);
    assert_same_state(st, got);
    exo_state_free(got);

    /* a crash between snapshot and compaction: a snapshot, the full log */
    uint8_t *snap;
    size_t len;
    cr_assert_eq(exo_snapshot_encode(st, true, &snap, &len, &err), 0);
    cr_assert_eq(exo_snapshot_write_file(snappath, snap, len, &err), 0);
    exo_free(snap);
    feed(log, st, 30, 40);
    cr_assert_eq(exo_event_log_recover(log, &got, &info, &err), 0, "%s", err.msg);
    cr_assert_eq(info.snapshot_idx, 29);
    cr_assert_eq(info.replayed, 10);
    assert_same_state(st, got);
    exo_state_free(got);

    checkpoint(log, st, false, NULL); /* snapshot at 39, the one at 29 becomes previous; log from 30 */
    cr_assert_eq(exo_event_log_first(log), 30);
    feed(log, st, 40, 45);
    /* the newest torn: the previous one and a longer tail */
    flip_byte(snappath, fsize(snappath) - 3);
    cr_assert_eq(exo_event_log_recover(log, &got, &info, &err), 0, "%s", err.msg);
    cr_assert(info.used_previous);
    cr_assert_eq(info.snapshot_idx, 29);
    cr_assert_eq(info.replayed, 15);
    cr_assert_neq(info.reason[0], 0);
    assert_same_state(st, got);
    exo_state_free(got);
    /* both gone bad and events compacted: a clear error, no half State */
    truncate(prevpath, 10);
    cr_assert_eq(exo_event_log_recover(log, &got, &info, &err), EXO_EFORMAT);
    cr_assert_null(got);
    cr_assert(strstr(err.msg, "compacted"), "%s", err.msg);
    exo_event_log_close(log, false, &err);
    exo_state_free(st);
}

Test(cluster_snapshot, install_moves_an_empty_log_forward)
{
    exo_err err = {0};
    exo_event_log *log = open_log();
    exo_state *mine = exo_state_new();
    feed(log, mine, 0, 12);
    /* the master's State is at 499: the follower adopts it */
    exo_state *master = exo_state_new();
    exo_event_log *mlog;
    char mpath[160];
    snprintf(mpath, sizeof mpath, "%s/master.bin", tmpdir);
    cr_assert_eq(exo_event_log_open(mpath, &mlog, NULL, &err), 0);
    feed(mlog, master, 0, 500);
    exo_event_log_close(mlog, false, &err);
    checkpoint(log, master, true, NULL);
    cr_assert_eq(exo_event_log_first(log), 500);
    cr_assert_eq(exo_event_log_count(log), 500);
    cr_assert_eq(exo_event_log_bytes(log), EXO_EVENT_LOG_FILE_HEADER);
    feed(log, master, 500, 510); /* appends continue at the master's index */
    exo_state *got;
    cr_assert_eq(exo_event_log_recover(log, &got, NULL, &err), 0, "%s", err.msg);
    assert_same_state(master, got);
    exo_state_free(got);

    /* a rotation (new session) starts at 0 and forgets the snapshots */
    char sealed[4200];
    cr_assert_eq(exo_event_log_rotate(log, sealed, sizeof sealed, &err), 0, "%s", err.msg);
    cr_assert_eq(exo_event_log_count(log), 0);
    cr_assert_eq(exo_event_log_first(log), 0);
    cr_assert_eq(access(snappath, F_OK), -1);
    cr_assert_eq(exo_event_log_archive(sealed, &err), 0, "%s", err.msg);
    exo_state *fresh = exo_state_new();
    feed(log, fresh, 0, 3);
    cr_assert_eq(exo_event_log_recover(log, &got, NULL, &err), 0, "%s", err.msg);
    assert_same_state(fresh, got);
    exo_state_free(got);
    exo_event_log_close(log, false, &err);
    exo_state_free(fresh);
    exo_state_free(master);
    exo_state_free(mine);
}

/* Months of uptime in small: 100,000 events with a checkpoint every 10,000
 * (the node's interval) keep the log under two intervals of events, no
 * prompt reaches any file, and a reopen recovers the same State. */
Test(cluster_snapshot, hundred_thousand_events_stay_bounded, .timeout = 120)
{
    enum { TOTAL = 100000, EVERY = 10000 };
    exo_err err = {0};
    exo_event_log *log = open_log();
    exo_state *st = exo_state_new();
    /* the largest record this stream writes, for the bound */
    uint64_t max_rec = 0;
    for (uint64_t i = 0; i < 12; i++) {
        exo_event ev, red;
        mk_event(&ev, i);
        bool r = exo_event_redact(&ev, &red);
        uint8_t *b;
        size_t l;
        cr_assert_eq(exo_event_encode(r ? &red : &ev, &b, &l, &err), 0);
        exo_free(b);
        if (l + EXO_EVENT_LOG_HEADER > max_rec)
            max_rec = l + EXO_EVENT_LOG_HEADER;
        if (r)
            exo_event_clear(&red);
        exo_event_clear(&ev);
    }
    uint64_t bound = EXO_EVENT_LOG_FILE_HEADER + 2 * (uint64_t)EVERY * max_rec, peak = 0;
    for (uint64_t at = 0; at < TOTAL; at += EVERY) {
        feed(log, st, at, at + EVERY);
        if (exo_event_log_bytes(log) > peak)
            peak = exo_event_log_bytes(log);
        checkpoint(log, st, false, NULL);
        cr_assert_leq(exo_event_log_bytes(log), bound);
        cr_assert_leq(exo_event_log_count(log) - exo_event_log_first(log), (uint64_t)EVERY);
    }
    cr_assert_leq(peak, bound, "peak %llu > bound %llu", (unsigned long long)peak, (unsigned long long)bound);
    feed(log, st, TOTAL, TOTAL + 777);
    cr_assert_eq(exo_event_log_flush(log, &err), 0);
    cr_assert_eq(exo_event_log_close(log, false, &err), 0);
    cr_assert_leq(fsize(logpath), bound);
    cr_assert_lt(fsize(snappath), 64 * 1024, "a snapshot is the State's size, not the history's");
    const char *files[] = {logpath, snappath, prevpath};
    for (int i = 0; i < 3; i++)
        cr_assert(!file_contains(files[i], "secret prompt"), "%s holds a prompt", files[i]);

    exo_event_log_recovery rec;
    cr_assert_eq(exo_event_log_open(logpath, &log, &rec, &err), 0, "%s", err.msg);
    cr_assert_eq(rec.bytes_truncated, 0);
    exo_state *got;
    exo_event_log_snapshot_info info;
    cr_assert_eq(exo_event_log_recover(log, &got, &info, &err), 0, "%s", err.msg);
    cr_assert_eq(info.snapshot_idx, TOTAL - 1);
    cr_assert_eq(info.replayed, 777);
    cr_assert_eq(exo_state_last_event_applied_idx(got), TOTAL + 776);
    assert_same_state(st, got);
    exo_state_free(got);
    exo_event_log_close(log, false, &err);
    exo_state_free(st);
}

static uint64_t applied[64];
static size_t n_applied;
static void note_apply(void *ctx, uint64_t idx, exo_event *ev)
{
    (void)ctx;
    applied[n_applied++] = idx;
    exo_event_clear(ev);
}

/* A follower behind the master's compaction: the Snapshot message carries
 * the State (prompts of live tasks included), and the replica continues
 * after it with what was waiting. */
Test(cluster_snapshot, snapshot_message_and_replica_skip)
{
    exo_err err = {0};
    exo_state *st = exo_state_new();
    for (uint64_t i = 0; i < 62; i++) {
        exo_event ev;
        mk_event(&ev, i);
        cr_assert_eq(exo_state_apply(st, (int64_t)i, &ev, &err), 0);
        exo_event_clear(&ev);
    }
    exo_event_list evs = {0};
    exo_state_to_events(st, &evs);
    exo_msg_snapshot m;
    memset(&m, 0, sizeof m);
    exo_id_new(&m.session.master);
    m.session.clock = 3;
    m.count = 62;
    m.events.n = evs.n;
    m.events.v = exo_calloc(evs.n, sizeof *m.events.v);
    for (size_t i = 0; i < evs.n; i++)
        m.events.v[i].event = evs.v[i];
    uint8_t *buf;
    size_t len;
    cr_assert_eq(exo_msg_encode(EXO_MSG_SNAPSHOT, &m, &buf, &len, &err), 0, "%s", err.msg);
    exo_msg_snapshot back;
    cr_assert_eq(exo_msg_decode(EXO_MSG_SNAPSHOT, buf, len, &back, &err), 0, "%s", err.msg);
    cr_assert(exo_msg_equal(EXO_MSG_SNAPSHOT, &m, &back));
    for (size_t cut = 0; cut < len; cut += 7) {
        exo_msg_snapshot t;
        cr_assert_neq(exo_msg_decode(EXO_MSG_SNAPSHOT, buf, cut, &t, NULL), 0);
    }
    exo_free(buf);
    exo_event *flat = exo_calloc(back.events.n, sizeof *flat);
    for (size_t i = 0; i < back.events.n; i++)
        flat[i] = back.events.v[i].event;
    exo_state *rebuilt;
    cr_assert_eq(exo_state_from_events(flat, back.events.n, (int64_t)back.count - 1, &rebuilt, &err), 0, "%s",
                 err.msg);
    exo_free(flat);
    assert_same_state(st, rebuilt); /* the live task's prompt too */
    cr_assert_str_neq(exo_state_task_at(rebuilt, 0)->params_json, EXO_REDACTED_PARAMS);
    exo_state_free(rebuilt);
    exo_msg_clear(EXO_MSG_SNAPSHOT, &back);
    m.count = 0;
    cr_assert_eq(exo_msg_encode(EXO_MSG_SNAPSHOT, &m, &buf, &len, &err), EXO_EINVAL);
    exo_free(m.events.v);
    exo_event_list_clear(&evs);
    exo_state_free(st);

    /* the replica: events 3 and 70..71 wait; a snapshot up to 70 drops 3,
     * releases 70 and 71, and the next expected is 72 */
    exo_replica *r = exo_replica_new();
    n_applied = 0;
    uint64_t early[] = {3, 70, 71};
    for (int i = 0; i < 3; i++) {
        exo_event ev;
        mk_event(&ev, early[i]);
        cr_assert_eq(exo_replica_offer(r, early[i], &ev, note_apply, NULL), 0);
    }
    cr_assert_eq(n_applied, 0);
    exo_replica_skip_to(r, 70, note_apply, NULL);
    cr_assert_eq(n_applied, 2);
    cr_assert_eq(applied[0], 70);
    cr_assert_eq(applied[1], 71);
    cr_assert_eq(exo_replica_next(r), 72);
    exo_replica_skip_to(r, 10, note_apply, NULL); /* backwards: nothing */
    cr_assert_eq(exo_replica_next(r), 72);
    exo_replica_free(r);
}
